"""The retrieval server over real HTTP on loopback: Search-R1 wire format, limits, auth, micro-batching."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from searchr1.retrieval.base import Retriever
from searchr1.retrieval.client import RetrievalClient
from searchr1.retrieval.server import ServerLimits, create_app, serve_in_thread

HTTP = httpx.Client(timeout=30)


@pytest.fixture(scope="module")
def server(bm25):
    with serve_in_thread(
        create_app(bm25, ServerLimits(max_queries=64, max_topk=20, max_query_chars=500))
    ) as (url, _):
        yield url


def test_search_r1_wire_format(server, bm25, docs):
    queries = [docs[3].title, docs[10].title]
    resp = HTTP.post(f"{server}/retrieve", json={"queries": queries, "topk": 2, "return_scores": True})
    assert resp.headers["server-timing"].startswith("search;dur=")
    body = resp.json()
    expected = bm25.search(queries, 2)
    assert len(body["result"]) == 2
    for hits, want in zip(body["result"], expected, strict=True):
        assert [h["document"]["id"] for h in hits] == [w.id for w in want]
        assert [h["document"]["contents"] for h in hits] == [w.contents for w in want]
        assert [h["score"] for h in hits] == pytest.approx([w.score for w in want])
    assert body["result"][0][0]["document"]["contents"].startswith(f'"{docs[3].title}"\n')


def test_bare_documents_without_scores(server, docs):
    for payload in (
        {"queries": [docs[5].title], "topk": 1, "return_scores": False},
        {"queries": [docs[5].title]},
    ):
        body = HTTP.post(f"{server}/retrieve", json=payload).json()
        first = body["result"][0][0]
        assert set(first) == {"id", "contents"} and first["id"] == docs[5].id
    assert len(body["result"][0]) == 3  # server default topk


def test_client_round_trip_equals_in_process(server, bm25, docs):
    client = RetrievalClient(server)
    queries = [d.title for d in docs[:20]] + ["castle river", "nothing matches zzzz"]
    assert client.search(queries, 4) == bm25.search(queries, 4)
    assert client.search([], 4) == []
    assert client.health()["documents"] == len(docs)


BAD_REQUESTS = [
    ("malformed json", b'{"queries": [', 422),
    ("not an object", b"[1, 2]", 422),
    ("missing queries", b'{"topk": 3}', 422),
    ("queries not a list", b'{"queries": "who"}', 422),
    ("query not a string", b'{"queries": [1]}', 422),
    ("topk wrong type", b'{"queries": ["a"], "topk": "3"}', 422),
    ("return_scores wrong type", b'{"queries": ["a"], "return_scores": "yes"}', 422),
    ("empty query list", b'{"queries": []}', 422),
    ("topk zero", b'{"queries": ["a"], "topk": 0}', 422),
    ("topk huge", b'{"queries": ["a"], "topk": 1000000}', 422),
    ("100k-char query", json.dumps({"queries": ["a" * 100_000]}).encode(), 413),
    ("too many queries", json.dumps({"queries": ["a"] * 65}).encode(), 413),
    ("invalid utf-8", b'{"queries": ["\xff\xfe\xfa"]}', 400),
    ("lone surrogate", b'{"queries": ["\\ud800"]}', 422),
    ("empty body", b"", 422),
]


@pytest.mark.parametrize("name, body, status", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_answer_4xx_and_server_keeps_serving(server, docs, name, body, status):
    resp = HTTP.post(f"{server}/retrieve", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status
    assert resp.json()["detail"]  # a message for the caller
    if name == "invalid utf-8":
        assert "UTF-8" in resp.json()["detail"]
    ok = HTTP.post(f"{server}/retrieve", json={"queries": [docs[0].title], "topk": 1})
    assert ok.status_code == 200 and ok.json()["result"][0][0]["id"] == docs[0].id


def test_oversized_body_is_413(bm25):
    app = create_app(bm25, ServerLimits(max_body_bytes=1000))
    with serve_in_thread(app) as (url, _):
        resp = HTTP.post(f"{url}/retrieve", json={"queries": ["x" * 2000]})
        assert resp.status_code == 413 and "exceeds" in resp.json()["detail"]


def test_health_and_openapi(server):
    assert HTTP.get(f"{server}/health").json()["status"] == "ok"
    spec = HTTP.get(f"{server}/openapi.json").json()
    assert "/retrieve" in spec["paths"]


def test_bearer_token(bm25, docs):
    with serve_in_thread(create_app(bm25, api_key="s3cret")) as (url, _):
        payload = {"queries": [docs[1].title], "topk": 1}
        assert HTTP.post(f"{url}/retrieve", json=payload).status_code == 401
        wrong = HTTP.post(f"{url}/retrieve", json=payload, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "invalid" in wrong.json()["detail"]
        assert RetrievalClient(url, api_key="s3cret").search([docs[1].title], 1)[0][0].id == docs[1].id
        with pytest.raises(Exception, match="401"):
            RetrievalClient(url, retries=0).search(["x"], 1)


class SlowRecorder(Retriever):
    """Wraps a real retriever; each backend call takes a while and its batch size is recorded."""

    name = "recorder"

    def __init__(self, inner: Retriever, delay_s: float):
        self.inner, self.delay_s, self.calls = inner, delay_s, []

    def search(self, queries, topk):
        self.calls.append((len(queries), topk))
        time.sleep(self.delay_s)
        return self.inner.search(queries, topk)


def test_concurrent_requests_are_micro_batched(bm25, docs):
    recorder = SlowRecorder(bm25, 0.05)
    with serve_in_thread(create_app(recorder)) as (url, _):
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            topk = 2 if i % 2 else 3
            hits = HTTP.post(
                f"{url}/retrieve", json={"queries": [docs[i].title], "topk": topk}, timeout=30
            ).json()
            answers[i] = [h["id"] for h in hits["result"][0]]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    expected = {i: [h.id for h in bm25.search([docs[i].title], 2 if i % 2 else 3)[0]] for i in range(40)}
    assert answers == expected
    assert all(answers[i][0] == docs[i].id for i in range(40))
    assert sum(n for n, _ in recorder.calls) == 40
    assert len(recorder.calls) < 40  # several requests shared a backend call
    assert max(n for n, _ in recorder.calls) > 1


def test_backend_failure_is_503_and_server_recovers(docs, bm25):
    class Flaky(Retriever):
        name = "flaky"
        fail = True

        def search(self, queries, topk):
            if self.fail:
                raise RuntimeError("index on fire")
            return bm25.search(queries, topk)

    flaky = Flaky()
    with serve_in_thread(create_app(flaky)) as (url, _):
        resp = HTTP.post(f"{url}/retrieve", json={"queries": ["a"]})
        assert resp.status_code == 503 and "index on fire" in resp.json()["detail"]
        flaky.fail = False
        assert (
            HTTP.post(f"{url}/retrieve", json={"queries": [docs[2].title]}).json()["result"][0][0]["id"]
            == docs[2].id
        )


def test_the_server_answers_its_first_query_with_the_kernel_already_compiled(tmp_path, corpus_file, docs, caplog):
    from searchr1.retrieval.bm25.kernel import top_k_batch
    from searchr1.retrieval.index import build_index, load_index

    build_index(corpus_file, tmp_path / "idx", show_progress=False)
    retriever = load_index(tmp_path / "idx")
    assert not retriever.kernel_ready  # loading compiles nothing
    with caplog.at_level("INFO", logger="searchr1.server"):
        app = create_app(retriever)
    assert retriever.kernel_ready  # the warm-up ran the kernel on this index's arrays
    assert any(r.getMessage().startswith("warm-up: BM25 kernel ") for r in caplog.records)
    compiled = len(top_k_batch.signatures)
    with serve_in_thread(app) as (url, _):
        first = HTTP.post(f"{url}/retrieve", json={"queries": [docs[7].title], "topk": 1}).json()
    assert first["result"][0][0]["id"] == docs[7].id
    assert len(top_k_batch.signatures) == compiled  # the first query compiled nothing new
    retriever.close()
    cold = load_index(tmp_path / "idx")
    create_app(cold, warm_up=False)
    assert not cold.kernel_ready
    cold.close()
