"""A stand-in for vLLM's API server (standard library only), for the tests of the server's lifetime: it
starts a child process in its own process group (as vLLM starts its engine core), answers ``GET /health``
unless told it is still loading, and can be stuck: deaf to SIGTERM, it and its child, as a server in the
middle of loading or reloading weights may be.

    python stand_in_server.py PORT STATUS_FILE [--loading] [--stuck]

It writes one line to STATUS_FILE once its child runs: ``<pid> <child pid> <death signal>``, where the death
signal is the one the kernel will send it when the thread that started it ends (``PR_GET_PDEATHSIG``; 0:
none). On SIGTERM (when not stuck) it stops its child and exits, as vLLM's server does.
"""

from __future__ import annotations

import ctypes
import http.server
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


def child(stuck: bool) -> None:
    """The stand-in for vLLM's engine core: it waits, in its parent's process group."""
    if stuck:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


def main(argv: list[str]) -> None:
    port, status = int(argv[0]), Path(argv[1])
    loading, stuck = "--loading" in argv, "--stuck" in argv
    core = subprocess.Popen([sys.executable, __file__, "child", *(["--stuck"] if stuck else [])])
    if stuck:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:

        def stop(*_):
            core.terminate()
            core.wait()
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
    status.write_text(f"{os.getpid()} {core.pid} {death_signal()}\n")
    if loading:
        while True:
            time.sleep(1)
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child("--stuck" in sys.argv)
    main(sys.argv[1:])
