"""The server's fair micro-batcher and answer encoder, without HTTP."""

from __future__ import annotations

import json
import threading

import pytest

from searchr1.retrieval.base import Hit, Retriever
from searchr1.retrieval.batcher import FairBatcher, fair_shares
from searchr1.retrieval.wire import HitEncoder, assemble


@pytest.mark.parametrize(
    "remaining, budget, expected",
    [
        ([1, 100, 3], 10, [1, 6, 3]),  # the small ones get all they need, the big one the rest
        ([5, 5, 5], 10, [3, 3, 4]),  # equal needs: equal shares (the remainder to the last)
        ([2, 2], 10, [2, 2]),  # budget left over: nobody gets more than it needs
        ([50, 50, 50, 50], 4, [1, 1, 1, 1]),  # as many requests as the budget: one query each
        ([7], 3, [3]),
    ],
)
def test_fair_shares_water_filling(remaining, budget, expected):
    assert fair_shares(remaining, budget) == expected


class Recorder(Retriever):
    """Answers ``q`` with one hit whose id is ``q`` and whose score is ``topk``; records the calls.
    Each call waits for ``gate`` (when given), so tests can queue requests behind a running call."""

    name = "recorder"

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[list[str]] = []
        self.gate = gate
        self.entered = threading.Semaphore(0)

    def search(self, queries, topk):
        self.calls.append(list(queries))
        self.entered.release()
        if self.gate is not None:
            self.gate.wait(30)
        return [[Hit(q, "T", "text", float(topk))] for q in queries]


def ids(body: bytes) -> list[str]:
    return [hits[0]["document"]["id"] for hits in json.loads(body)["result"]]


def test_large_request_is_split_and_small_ones_go_first_after_the_running_call():
    gate = threading.Event()
    backend = Recorder(gate)
    batcher = FairBatcher(backend, max_batch_queries=4)
    batcher.start()
    try:
        big = batcher.submit([f"b{i}" for i in range(10)], 3, True)
        assert backend.entered.acquire(timeout=30)  # call 1 (b0-b3) is running
        small = batcher.submit(["s0"], 5, True)  # another topk, arrived meanwhile
        small2 = batcher.submit(["t0", "t1"], 3, True)
        gate.set()
        answers = big.result(30), small.result(30), small2.result(30)
    finally:
        batcher.stop()
    assert backend.calls[0] == ["b0", "b1", "b2", "b3"]
    # the two requests that waited through call 1 are served before the big one continues
    assert backend.calls[1] == ["s0"]
    assert backend.calls[2][:2] == ["t0", "t1"] and len(backend.calls[2]) == 4
    assert all(len(c) <= 4 for c in backend.calls)
    assert ids(answers[0].body) == [f"b{i}" for i in range(10)]  # reassembled in order
    assert ids(answers[1].body) == ["s0"] and ids(answers[2].body) == ["t0", "t1"]
    assert answers[0].backend_calls == 3  # b0-b3, then b4-b5 beside t0-t1, then b6-b9
    assert json.loads(answers[1].body)["result"][0][0]["score"] == 5.0


def test_backend_failure_fails_only_the_requests_of_that_call():
    class Flaky(Retriever):
        name = "flaky"

        def search(self, queries, topk):
            if "boom" in queries:
                raise RuntimeError("disk gone")
            return [[Hit(q, "", "", 1.0)] for q in queries]

    batcher = FairBatcher(Flaky(), max_batch_queries=1)
    batcher.start()
    try:
        bad, good = batcher.submit(["boom", "x"], 3, False), batcher.submit(["ok"], 3, False)
        with pytest.raises(RuntimeError, match="disk gone"):
            bad.result(30)
        assert json.loads(good.result(30).body) == {"result": [[{"id": "ok", "contents": '""\n'}]]}
    finally:
        batcher.stop()


def test_hit_encoder_matches_json_dumps_and_turns_non_finite_scores_into_null():
    hits = [
        Hit("1", 'Say "hi"', "line\nbreak \\ tab\t é ü 漢字 \u2028", 0.5),
        Hit("2", "Plain", "text", 1e-7),
        Hit("3", "Nan", "score", float("nan")),
        Hit("1", 'Say "hi"', "line\nbreak \\ tab\t é ü 漢字 \u2028", 2.0),  # cached document, new score
    ]
    enc = HitEncoder(cache_size=2)
    scored = json.loads(enc.encode(hits, scores=True))
    want = [{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in hits]
    want[2]["score"] = None
    assert scored == want
    assert json.loads(enc.encode(hits, scores=False)) == [{"id": h.id, "contents": h.contents} for h in hits]
    body = assemble([enc.encode(hits[:1], True), enc.encode([], True)])
    assert json.loads(body)["result"] == [[want[0]], []]  # UTF-8 on the wire; equal once decoded
    odd = Hit("4", "lone \ud800 surrogate", "text", 1.0)  # orjson refuses it: the stdlib's \u escape
    assert json.loads(enc.encode([odd], scores=False)) == [{"id": "4", "contents": odd.contents}]
