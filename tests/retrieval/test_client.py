"""Client retry behaviour against real local servers: down, slow, flaky, round-robin."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchr1.retrieval.base import SearchError
from searchr1.retrieval.client import RetrievalClient
from searchr1.retrieval.server import create_app, serve_in_thread

ANSWER = {"result": [[{"document": {"id": "7", "contents": '"Borvik"\na city in Tarnland'}, "score": 1.5}]]}


def scripted_app(statuses: list[int], delay_s: float = 0.0, delays: list[float] | None = None) -> FastAPI:
    """A server answering the n-th request with ``statuses[n]`` (the last one repeats), counting requests."""
    app = FastAPI()
    app.state.count = 0

    @app.post("/retrieve")
    async def retrieve(request: Request):
        n = app.state.count
        app.state.count += 1
        wait = delays[min(n, len(delays) - 1)] if delays else delay_s
        if wait:
            await asyncio.sleep(wait)
        status = statuses[min(n, len(statuses) - 1)]
        if status == 200:
            return ANSWER
        headers = {"Retry-After": "0"} if status == 429 else {}
        return JSONResponse({"detail": f"scripted {status}"}, status_code=status, headers=headers)

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_500s_then_success_retries_and_returns():
    app = scripted_app([500, 502, 200])
    with serve_in_thread(app) as (url, _):
        hits = RetrievalClient(url, retries=3, backoff_s=0.01).search(["Borvik"], 1)
        assert (
            hits[0][0].title == "Borvik"
            and hits[0][0].text == "a city in Tarnland"
            and hits[0][0].score == 1.5
        )
        assert app.state.count == 3


def test_gives_up_after_configured_retries():
    app = scripted_app([503])
    with serve_in_thread(app) as (url, _):
        with pytest.raises(SearchError, match=r"all 3 attempts failed; last: HTTP 503"):
            RetrievalClient(url, retries=2, backoff_s=0.01).search(["q"], 1)
        assert app.state.count == 3


def test_429_is_retried_other_4xx_is_not():
    app = scripted_app([429, 200])
    with serve_in_thread(app) as (url, _):
        assert RetrievalClient(url, retries=1, backoff_s=0.01).search(["q"], 1)[0][0].id == "7"
        assert app.state.count == 2
    app = scripted_app([422])
    with serve_in_thread(app) as (url, _):
        with pytest.raises(SearchError, match="HTTP 422: scripted 422"):
            RetrievalClient(url, retries=5, backoff_s=0.01).search(["q"], 1)
        assert app.state.count == 1


def test_server_down_raises_typed_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SearchError, match="all 3 attempts failed; last: connection error"):
        RetrievalClient(url, retries=2, backoff_s=0.01).search(["q"], 1)


def test_slow_server_beyond_timeout():
    app = scripted_app([200], delay_s=1.0)
    with serve_in_thread(app) as (url, _):
        with pytest.raises(SearchError, match="timeout"):
            RetrievalClient(url, timeout_s=0.2, retries=1, backoff_s=0.01).search(["q"], 1)
        assert app.state.count == 2


def test_slow_once_then_fast_succeeds_on_retry():
    app = scripted_app([200], delays=[1.0, 0.0])
    with serve_in_thread(app) as (url, _):
        assert RetrievalClient(url, timeout_s=0.3, retries=1, backoff_s=0.01).search(["q"], 1)[0][0].id == "7"
        assert app.state.count == 2


def test_round_robin_and_failover(bm25, docs):
    a, b = scripted_app([200]), scripted_app([200])
    with serve_in_thread(a) as (url_a, _), serve_in_thread(b) as (url_b, _):
        client = RetrievalClient(f"{url_a},{url_b}")
        for _ in range(6):
            client.search(["q"], 1)
        assert (a.state.count, b.state.count) == (3, 3)
    with serve_in_thread(create_app(bm25)) as (url, _):
        down = f"http://127.0.0.1:{free_port()}"
        client = RetrievalClient([down, url], retries=1, backoff_s=0.01)
        for d in docs[:4]:
            assert client.search([d.title], 1)[0][0].id == d.id


def test_server_stopped_midway_turns_into_search_error(bm25, docs):
    with serve_in_thread(create_app(bm25)) as (url, stop):
        client = RetrievalClient(url, retries=1, backoff_s=0.01)
        assert client.search([docs[0].title], 1)[0][0].id == docs[0].id
        stop()
        with pytest.raises(SearchError):
            client.search([docs[0].title], 1)


def test_answers_decode_whether_scored_bare_or_with_a_null_score():
    import math

    from searchr1.retrieval.client import hits_from_response

    body = {"result": [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": 2.5},
                        {"document": {"id": 2, "contents": '"U"\ny'}, "score": None}],
                       [{"id": "3", "contents": "no title line"}]]}  # fmt: skip
    (a, b), (c,) = hits_from_response(body)
    assert (a.id, a.title, a.text, a.score) == ("1", "T", "x", 2.5)
    assert b.id == "2" and math.isnan(b.score)  # the server sends a non-finite score as null
    assert (c.id, c.title, c.text, c.score) == ("3", "", "no title line", 0.0)
