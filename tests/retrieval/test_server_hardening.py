"""The retrieval server against malformed, oversized, stalled and maximal requests (issue 23).

A real uvicorn server on loopback; the framing cases are written byte by byte on raw sockets. After
each case the server must still answer a normal request correctly.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from searchr1.retrieval.base import Retriever
from searchr1.retrieval.server import ServerLimits, create_app, serve_in_thread

LIMITS = ServerLimits(
    max_queries=64,
    max_topk=20,
    max_query_chars=500,
    max_hits=640,
    max_body_bytes=256 << 10,
    body_timeout_s=1.0,
)


@pytest.fixture(scope="module")
def server(bm25):
    with serve_in_thread(create_app(bm25, LIMITS)) as (url, _):
        yield url, int(url.rsplit(":", 1)[1])


def head(length: int | None = None, chunked: bool = False, path: str = "/retrieve") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response (Content-Length framing, as uvicorn answers)."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError(f"connection closed before a response; got {data!r}")
        data += got
    raw_head, body = data.split(b"\r\n\r\n", 1)
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        got = sock.recv(65536)
        if not got:
            break
        body += got
    return int(lines[0].split()[1]), headers, body[:length]


def exchange(port: int, payload: bytes, timeout: float = 20.0) -> tuple[int, dict[str, str], bytes]:
    """Send a whole request on a fresh connection and read its response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        return read_response(sock)


def closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the server ends the connection (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def assert_serving(url: str, bm25, docs) -> None:
    """The server still answers a normal request with the in-process result."""
    query = docs[7].title
    body = httpx.post(f"{url}/retrieve", json={"queries": [query], "topk": 2}, timeout=30).json()
    assert [h["id"] for h in body["result"][0]] == [h.id for h in bm25.search([query], 2)[0]]


# -- malformed bodies -----------------------------------------------------------------------------

NON_FINITE = [
    ("topk NaN", b'{"queries": ["x"], "topk": NaN}', "NaN"),
    ("topk Infinity", b'{"queries": ["x"], "topk": Infinity}', "Infinity"),
    ("topk -Infinity", b'{"queries": ["x"], "topk": -Infinity}', "-Infinity"),
    ("extra field NaN", b'{"queries": ["x"], "weight": NaN}', "NaN"),
    ("nested NaN", b'{"queries": ["x"], "meta": {"w": [1, -Infinity]}}', "-Infinity"),
    ("overflowing float", b'{"queries": ["x"], "topk": 1e999}', "1e999"),
]


@pytest.mark.parametrize("name, body, literal", NON_FINITE, ids=[c[0] for c in NON_FINITE])
def test_non_finite_numbers_are_422_naming_the_number(server, bm25, docs, name, body, literal):
    url, port = server
    status, _headers, raw = exchange(port, head(len(body)) + body)
    assert status == 422
    detail = json.loads(raw)["detail"]
    assert "non-finite" in detail and literal in detail
    assert_serving(url, bm25, docs)


def test_deeply_nested_json_is_400_saying_so(server, bm25, docs):
    url, port = server
    body = b"[" * 100_000 + b"]" * 100_000
    status, _, raw = exchange(port, head(len(body)) + body)
    assert status == 400
    assert "nested too deeply" in json.loads(raw)["detail"]
    assert_serving(url, bm25, docs)


def test_schema_errors_name_the_field_and_never_echo_the_text(server):
    _url, port = server
    body = json.dumps({"queries": ["my private question", 5]}).encode()
    status, _, raw = exchange(port, head(len(body)) + body)
    detail = json.loads(raw)["detail"]
    assert status == 422 and "queries.1" in detail and "string" in detail
    assert "private" not in detail


def test_more_hits_than_the_cap_is_413(server):
    _url, port = server
    body = json.dumps({"queries": ["a"] * 40, "topk": 20}).encode()  # 800 hits > 640
    status, _, raw = exchange(port, head(len(body)) + body)
    detail = json.loads(raw)["detail"]
    assert status == 413 and "800 hits" in detail and "640" in detail
    ok = json.dumps({"queries": ["a"] * 32, "topk": 20}).encode()  # 640 hits: at the cap
    assert exchange(port, head(len(ok)) + ok)[0] == 200


# -- framing: body size and time --------------------------------------------------------------------


def test_legal_chunked_request_is_answered(server, bm25, docs):
    _, port = server
    body = json.dumps({"queries": [docs[4].title], "topk": 1}).encode()
    status, _, raw = exchange(port, head(chunked=True) + chunk(body[:10]) + chunk(body[10:]) + b"0\r\n\r\n")
    assert status == 200 and json.loads(raw)["result"][0][0]["id"] == docs[4].id


def test_announced_oversize_body_is_413_before_it_is_sent(server, bm25, docs):
    url, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(LIMITS.max_body_bytes + 1))  # headers only: nothing of the body yet
        status, _, raw = read_response(sock)
    assert status == 413 and "exceeds the limit" in json.loads(raw)["detail"]
    assert_serving(url, bm25, docs)


def test_chunked_body_over_the_limit_is_413_as_soon_as_the_limit_is_passed(server, bm25, docs):
    """A legal request padded with white space, sent chunked (no Content-Length): the server counts
    bytes as they arrive and answers 413 once past the limit, without waiting for the body's end (the
    final chunk is never sent), and closes the connection."""
    url, port = server
    body = json.dumps({"queries": ["castle"], "topk": 1}).encode()
    padding = b" " * (64 << 10)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(chunked=True) + chunk(body))
        for _ in range(LIMITS.max_body_bytes // len(padding) + 1):  # limit + one chunk, no last chunk
            sock.sendall(chunk(padding))
        assert_serving(url, bm25, docs)  # another client is served meanwhile
        status, headers, raw = read_response(sock)
        assert status == 413 and "exceeds the limit" in json.loads(raw)["detail"]
        assert headers.get("connection") == "close"
        assert closed_by_server(sock)
    assert_serving(url, bm25, docs)


def test_stalled_body_is_408_and_the_connection_closed_while_others_are_served(server, bm25, docs):
    url, port = server
    body = json.dumps({"queries": ["castle river"], "topk": 2}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(len(body)) + body[: len(body) // 2])  # then nothing
        assert_serving(url, bm25, docs)  # the stalled connection holds no one up
        status, headers, raw = read_response(sock)  # after body_timeout_s = 1 s
        detail = json.loads(raw)["detail"]
        assert status == 408 and "not complete after 1s" in detail
        assert headers.get("connection") == "close"
        assert closed_by_server(sock)
    assert_serving(url, bm25, docs)


# -- a maximal request beside a small one ---------------------------------------------------------


class SlowBackend(Retriever):
    """A real retriever whose every call takes ``delay_s`` longer (a big corpus); records call sizes."""

    name = "slow"

    def __init__(self, inner: Retriever, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.calls: list[tuple[int, int]] = []
        self.started = threading.Event()

    def search(self, queries, topk):
        self.calls.append((len(queries), topk))
        self.started.set()
        time.sleep(self.delay_s)
        return self.inner.search(queries, topk)


def test_small_request_is_answered_before_a_maximal_one_sent_earlier(bm25, docs):
    limits = ServerLimits(max_queries=64, max_topk=20, max_hits=64 * 10, max_batch_queries=16)
    backend = SlowBackend(bm25, delay_s=0.05)
    big_queries = [d.title for d in docs[:64]]
    finished: list[str] = []
    answers: dict[str, dict] = {}
    with serve_in_thread(create_app(backend, limits)) as (url, _):

        def ask(name: str, queries: list[str], topk: int) -> None:
            resp = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": topk}, timeout=60)
            answers[name] = resp.json()
            finished.append(name)

        big = threading.Thread(target=ask, args=("maximal", big_queries, 10))
        big.start()
        assert backend.started.wait(30)  # the maximal request is being searched
        ask("small", [docs[100].title], 3)
        big.join(60)
    assert finished == ["small", "maximal"]
    assert [h["id"] for h in answers["small"]["result"][0]] == [
        h.id for h in bm25.search([docs[100].title], 3)[0]
    ]
    expected = bm25.search(big_queries, 10)
    assert [[h["id"] for h in hits] for hits in answers["maximal"]["result"]] == [
        [h.id for h in hits] for hits in expected
    ]
    assert max(n for n, _ in backend.calls) <= 16  # the maximal request was split into bounded calls
    assert (1, 3) in backend.calls  # the small one had a call of its own topk in between


# -- access log ------------------------------------------------------------------------------------


def test_access_log_has_one_line_per_request_with_causes_and_no_query_text(bm25, caplog):
    class Failing(Retriever):
        name = "failing"

        def search(self, queries, topk):
            raise RuntimeError("index file unreadable")

    caplog.set_level(logging.INFO, logger="searchr1.server")
    with serve_in_thread(create_app(bm25, LIMITS)) as (url, _):
        httpx.post(f"{url}/retrieve", json={"queries": ["zebra secret", "castle"], "topk": 2}, timeout=30)
        httpx.post(f"{url}/retrieve", content=b'{"queries": ["zebra secret"], "topk": NaN}', timeout=30)
    with serve_in_thread(create_app(Failing(), access_log=False)) as (url, _):
        httpx.post(f"{url}/retrieve", json={"queries": ["zebra secret"]}, timeout=30)
        httpx.get(f"{url}/health", timeout=30)
    # the access lines (the server's start-up line of the kernel warm-up is not one)
    lines = [r for r in caplog.records if r.name.startswith("searchr1.server") and "/retrieve" in r.getMessage()]
    assert len(lines) == 3  # the 200 and the 422; with access_log=False only the 503
    ok, bad, failed = (r.getMessage() for r in lines)
    assert '"POST /retrieve" 200 queries=2 topk=2' in ok and ok.endswith("ms")
    assert '"POST /retrieve" 422' in bad and 'error="request body holds the non-finite number NaN' in bad
    assert lines[2].levelno == logging.WARNING
    assert '"POST /retrieve" 503' in failed and "index file unreadable" in failed
    assert all("zebra" not in r.getMessage() for r in caplog.records)


def test_serve_refuses_bad_limits_in_one_line(corpus_file, capsys):
    from searchr1.cli import main

    code = main(["serve", "--corpus", str(corpus_file), "--max-batch-queries", "0"])
    assert code == 2 and "max_batch_queries must be >= 1" in capsys.readouterr().err
    code = main(["serve", "--corpus", str(corpus_file), "--body-timeout", "0"])
    assert code == 2 and "body timeout must be > 0" in capsys.readouterr().err
