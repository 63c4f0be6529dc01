"""``searchr1 serve`` started the way a user starts it (the installed command, default flags) writes one
access line per request on stderr: the default the README promises, not one a test switched on."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ACCESS = re.compile(r' INFO [\d.]+:\d+ "(GET|POST) (/\S*)" (\d{3}) queries=')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_logs_one_access_line_per_request(corpus_file, docs):
    command = Path(sys.executable).with_name("searchr1")
    if not command.is_file():
        pytest.skip("the searchr1 command is not installed next to this Python")
    port = _free_port()
    proc = subprocess.Popen(
        [str(command), "serve", "--corpus", str(corpus_file), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # refused connections never reach the server: only the first answered probe is logged
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        with httpx.Client() as client:
            assert (
                client.post(f"{url}/retrieve", json={"queries": [docs[3].title], "topk": 1}).status_code
                == 200
            )
            assert client.post(f"{url}/retrieve", json={"queries": ["a", "b"], "topk": 2}).status_code == 200
            assert client.post(f"{url}/retrieve", json={"topk": 2}).status_code == 422
            assert client.get(f"{url}/health").status_code == 200
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    lines = [m.groups() for m in map(ACCESS.search, stderr.splitlines()) if m]
    assert lines == [
        ("GET", "/health", "200"),
        ("POST", "/retrieve", "200"),
        ("POST", "/retrieve", "200"),
        ("POST", "/retrieve", "422"),
        ("GET", "/health", "200"),
    ], stderr
    assert "queries=2 topk=2" in stderr and docs[3].title not in stderr  # counts, never the query text
