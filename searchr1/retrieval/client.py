"""HTTP client of the retrieval server (and the retry policy shared with the web-search backends).

    client = RetrievalClient("http://127.0.0.1:8000,http://127.0.0.1:8001", timeout_s=5, retries=3)
    client.search(["who founded Acme"], topk=3)   # -> list[list[Hit]]; SearchError once every retry failed

Retry policy: 5xx, 429, connection errors and timeouts are retried up to ``retries`` times with
exponential backoff ``backoff_s * 2**attempt`` (capped at ``max_backoff_s``; a 429's Retry-After is
honoured up to the same cap), moving to the next server URL round-robin. Other 4xx answers are the
caller's fault and raise ``SearchError`` at once. Requests go over kept-alive ``http.client``
connections (:mod:`searchr1.retrieval.keepalive`), one per thread and server.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from searchr1.retrieval.base import Hit, Retriever, SearchError
from searchr1.retrieval.corpus import split_contents
from searchr1.retrieval.keepalive import KeepAlive, Reply

API_KEY_ENV = "SEARCHR1_API_KEY"


def _detail(resp: httpx.Response | Reply) -> str:
    try:
        body = resp.json()
        detail = body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        detail = resp.text
    return str(detail)[:300]


def _retry_after(resp: httpx.Response | Reply) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def send_with_retries(
    send: Callable[[int], Any],
    what: str,
    retries: int,
    backoff_s: float,
    max_backoff_s: float = 8.0,
    sleep: Callable[[float], None] = time.sleep,
    auth_hint: str = "",
) -> Any:
    """Call ``send(attempt)`` until it returns a 2xx response (``httpx.Response`` or
    :class:`~searchr1.retrieval.keepalive.Reply`); raise ``SearchError`` otherwise.

    Retried: 5xx, 429 (Retry-After honoured), connection errors, timeouts. Not retried: other 4xx.
    """
    failures: list[str] = []
    for attempt in range(retries + 1):
        delay = min(backoff_s * (2**attempt), max_backoff_s)
        try:
            resp = send(attempt)
        except httpx.TimeoutException as exc:
            failures.append(f"timeout ({type(exc).__name__})")
        except httpx.TransportError as exc:
            failures.append(f"connection error ({type(exc).__name__}: {exc})")
        else:
            if resp.is_success:
                return resp
            status = resp.status_code
            if status in (401, 403):
                raise SearchError(f"{what}: HTTP {status} (not authorised{auth_hint}): {_detail(resp)}")
            if 400 <= status < 500 and status != 429:
                raise SearchError(f"{what}: HTTP {status}: {_detail(resp)}")
            failures.append(f"HTTP {status}: {_detail(resp)}")
            if status == 429 and (after := _retry_after(resp)) is not None:
                delay = min(max(after, delay), max_backoff_s)
        if attempt < retries:
            sleep(delay)
    raise SearchError(f"{what}: all {retries + 1} attempts failed; last: {failures[-1]}")


def hits_from_response(body: Any) -> list[list[Hit]]:
    """Parse a Search-R1 ``/retrieve`` answer (scored or bare documents) into hits."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise SearchError("bad response from retrieval server: no 'result' list")
    out = []
    for hits in body["result"]:
        parsed = []
        for item in hits:
            doc = item.get("document")
            score = item.get("score", 0.0) if doc is not None else 0.0
            if doc is None:
                doc = item
            contents = doc.get("contents")
            if contents is not None:
                title, text = split_contents(contents)
            else:
                title, text = doc.get("title", ""), doc.get("text", "")
            doc_id = doc.get("id", "")
            if type(doc_id) is not str:
                doc_id = str(doc_id)
            if type(score) is not float:
                score = float("nan") if score is None else float(score)  # null: a non-finite score
            parsed.append(Hit(doc_id, title, text, score))
        out.append(parsed)
    return out


class RetrievalClient(Retriever):
    """A ``Retriever`` that asks one or more retrieval servers (round-robin) over HTTP."""

    name = "http"

    def __init__(
        self,
        urls: str | Sequence[str],
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        api_key: str | None = None,
    ):
        if isinstance(urls, str):
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("RetrievalClient needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        api_key = api_key or os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = KeepAlive(timeout_s, headers)
        self._next = itertools.count()

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()

        def send(attempt: int) -> Reply:
            url = self.urls[next(self._next) % len(self.urls)]
            return self._http.request("POST", f"{url}/retrieve", body)

        resp = send_with_retries(
            send, f"retrieval server {','.join(self.urls)}", self.retries, self.backoff_s, self.max_backoff_s
        )
        try:
            hits = hits_from_response(resp.json())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SearchError(f"bad response from retrieval server: {exc}") from exc
        if len(hits) != len(queries):
            raise SearchError(f"retrieval server answered {len(hits)} results for {len(queries)} queries")
        return hits

    def health(self) -> dict:
        """``GET /health`` of the first server."""
        return self._http.request("GET", f"{self.urls[0]}/health").json()

    def close(self) -> None:
        self._http.close()
