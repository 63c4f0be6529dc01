"""A stand-in for a trainer that uses the vLLM engine, for the tests that kill it: it makes a weights folder
as the engine does (``make_weights_dir(guard=True)``) and starts a server as the engine does
(``start_server``), with ``stand_in_server.py`` as the server; then it waits to be killed.

    python stand_in_trainer.py WEIGHTS_ROOT STATUS_FILE [--thread] [--loading] [--stuck | --reloading]

``--thread``: the server is started on a worker thread, which then ends. It prints one JSON line with the
weights folder before starting the server, and ``ready`` once the server answers (never with ``--loading``).
The grace period before SIGKILL is 2 s here (15 s in the engine).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from searchr1.rollout import vllm_server
from searchr1.rollout.scratch import make_weights_dir

SERVER = Path(__file__).with_name("stand_in_server.py")


class StandInLaunch(vllm_server.Launch):
    """The engine's launch with the stand-in's command line."""

    def __init__(self, status: Path, flags: list[str]) -> None:
        super().__init__(python=sys.executable, model="stand-in", tokenizer="", dtype="float32",
                         max_model_len=1, max_num_seqs=1, start_timeout_s=600)  # fmt: skip
        self.status, self.flags = status, flags

    def command(self, port: int) -> list[str]:
        return [sys.executable, str(SERVER), str(port), str(self.status), *self.flags]


def main(argv: list[str]) -> None:
    root, status, flags = Path(argv[0]), Path(argv[1]), argv[2:]
    vllm_server.STOP_GRACE_S = 2.0
    folder = make_weights_dir(2_000_000, [root], guard=True, quiet=True)
    (folder / "model.safetensors").write_bytes(b"x" * 2_000_000)
    print(json.dumps({"folder": str(folder)}), flush=True)
    launch = StandInLaunch(status, [f for f in flags if f in ("--loading", "--stuck", "--reloading")])
    if "--thread" in flags:
        worker = threading.Thread(target=vllm_server.start_server, args=(launch,))
        worker.start()
        worker.join()
    else:
        vllm_server.start_server(launch)
    print("ready", flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main(sys.argv[1:])
