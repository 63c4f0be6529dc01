"""A stand-in for vLLM's API server (standard library only), for the tests of the server's lifetime: it
starts a child process in its own process group (as vLLM starts its engine core), both map a segment of
shared memory in /dev/shm (as vLLM's engine core and worker do), it answers ``GET /health`` unless told it
is still loading, and it can be stuck: deaf to SIGTERM, it and its child, as a server in the middle of
loading weights may be; or reloading: on SIGTERM it kills its child at once with SIGKILL (the child alone
maps the segment then, and cannot remove it) and stays, deaf to more SIGTERM, as vLLM's server does when
stopped in the middle of a weight reload.

    python stand_in_server.py PORT STATUS_FILE [--loading] [--stuck | --reloading]

It writes one line to STATUS_FILE once its child runs: ``<pid> <child pid> <death signal> <segment>``, where
the death signal is the one the kernel will send it when the thread that started it ends
(``PR_GET_PDEATHSIG``; 0: none). On SIGTERM (when not stuck) it stops its child, removes its segment and
exits, as vLLM's server does.
"""

from __future__ import annotations

import ctypes
import http.server
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def death_signal() -> int:
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
    return value.value


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


SEGMENT_BYTES = 1_000_000
KEPT: list[mmap.mmap] = []
"""The server's own mapping of the segment (none while reloading: then its child alone maps it)."""


def mapped(path: Path) -> mmap.mmap:
    with path.open("r+b") as f:
        return mmap.mmap(f.fileno(), SEGMENT_BYTES)


def child(segment: Path, stuck: bool) -> None:
    """The stand-in for vLLM's engine core: it maps the segment and waits, in its parent's process group."""
    if stuck:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held = mapped(segment)
    while held:
        time.sleep(1)


def main(argv: list[str]) -> None:
    port, status = int(argv[0]), Path(argv[1])
    loading, stuck, reloading = "--loading" in argv, "--stuck" in argv, "--reloading" in argv
    segment = Path(f"/dev/shm/searchr1-stand-in-{os.getpid()}")
    segment.write_bytes(b"\0" * SEGMENT_BYTES)
    if not reloading:
        KEPT.append(mapped(segment))
    core = subprocess.Popen(
        [sys.executable, __file__, "child", str(segment), *(["--stuck"] if stuck else [])]
    )
    if stuck:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif reloading:

        def interrupted(*_):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            core.kill()
            core.wait()

        signal.signal(signal.SIGTERM, interrupted)
    else:

        def stop(*_):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the kernel's and the watchdog's may both come
            core.terminate()
            core.wait()
            segment.unlink()
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
    status.write_text(f"{os.getpid()} {core.pid} {death_signal()} {segment}\n")
    if loading:
        while True:
            time.sleep(1)
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(Path(sys.argv[2]), "--stuck" in sys.argv)
    main(sys.argv[1:])
