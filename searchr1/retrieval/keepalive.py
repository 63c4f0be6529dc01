"""A lean HTTP/1.1 keep-alive transport for the retrieval client (``http.client``, one connection per
thread and server), raising httpx's exception types so the client's retry policy is unchanged.

Why not httpx here: on the batch-128 path of ``searchr1 bench retrieval`` over the wiki-18 sample, the
request machinery of httpx cost as much as a third of the server path's overhead (server / in-process
queries/s 0.61 through httpx, 0.73 through ``http.client``, same server, interleaved). The web-search
backends keep httpx.

A kept-alive connection that the server closed meanwhile (uvicorn drops idle ones after 5 s) is
reopened and the request sent again once, without counting as a failed attempt; any other failure is
``httpx.TimeoutException`` (the socket timed out) or ``httpx.TransportError`` (refused, reset, bad
HTTP), which the caller retries.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson


@dataclass
class Reply:
    """The parts of a response the client reads (the names match ``httpx.Response``)."""

    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    """Lower-case names."""

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class KeepAlive:
    """Thread-safe: each thread keeps its own connection to each server."""

    def __init__(self, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self._local = threading.local()
        self._opened: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self, scheme: str, netloc: str) -> tuple[http.client.HTTPConnection, bool]:
        conns: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "conns", {}
        )
        conn = conns.get((scheme, netloc))
        if conn is not None:
            return conn, False
        if scheme == "https":
            conn = http.client.HTTPSConnection(netloc, timeout=self.timeout_s)
        elif scheme == "http":
            conn = http.client.HTTPConnection(netloc, timeout=self.timeout_s)
        else:
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r} (http or https)")
        conns[(scheme, netloc)] = conn
        with self._lock:
            self._opened.append(conn)
        return conn, True

    def request(self, method: str, url: str, body: bytes | None = None) -> Reply:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {**self.headers, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn, fresh = self._connection(parts.scheme, parts.netloc)
        while True:
            reused = conn.sock is not None  # kept alive from an earlier request
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                content = resp.read()
                return Reply(resp.status, content, {k.lower(): v for k, v in resp.getheaders()})
            except TimeoutError as exc:
                conn.close()
                raise httpx.ReadTimeout(f"no answer from {parts.netloc} within {self.timeout_s:g}s") from exc
            except _STALE as exc:
                conn.close()
                if reused and not fresh:
                    fresh = True  # the server had closed the idle connection: once more, on a new one
                    continue
                raise httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()
