"""The HF engine against the real search backends: in-process BM25 and the HTTP retrieval server
(uvicorn on loopback) through its client — the same hits either way, failures as observations."""

from __future__ import annotations

import pytest
from scripted_turns import ScriptedTurns

from searchr1.data.prompts import format_observation_docs, wrap_information
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.corpus import Document
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.episode import SEARCH_FAILED_TEXT
from searchr1.rollout.hf import HFRolloutEngine
from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.types import Role

DOCS = [
    Document("0", "Alice Verdan", "Alice Verdan was born in Borvik in 1901. She founded the Quillon Press."),
    Document("1", "Borvik", "Borvik is a city in Tarnland, on the river Sel."),
    Document("2", "Quillon Press", "The Quillon Press is a publisher based in Borvik."),
    Document("3", "Tarnland", "Tarnland is a country whose capital is Ostra."),
]
SCRIPT = [
    {"action": "search", "think": 3, "text": "Alice Verdan born"},
    {"action": "search", "think": 2, "text": "capital of Tarnland"},
    {"action": "answer", "think": 2, "text": "Borvik"},
]


@pytest.fixture(scope="module")
def bm25():
    return BM25Retriever.from_documents(DOCS)


def _rollout(tiny, retriever, **cfg):
    model, tok = tiny
    prompts = [tok.encode("Question: where was Alice Verdan born?", add_special_tokens=False)] * 2
    config = RolloutConfig(max_turn_tokens=48, dtype="model", **cfg)
    with HFRolloutEngine(model, tok, retriever, config, topk=2, steer=ScriptedTurns(tok)) as eng:
        return eng.generate(prompts, [{"script": SCRIPT}] * 2, sampling=SamplingParams(), seed=0)


def _observations(traj):
    out, cur = [], []
    for t, r in zip(traj.response_ids, traj.roles, strict=True):
        if r == Role.OBSERVATION:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out


def test_in_process_bm25(tiny, bm25):
    _, tok = tiny
    trajs = _rollout(tiny, bm25)
    for t in trajs:
        assert t.queries == ["Alice Verdan born", "capital of Tarnland"]
        assert t.finish_reason == "answer" and "<answer> Borvik </answer>" in t.response_text
        expected = bm25.search(t.queries, 2)
        assert t.documents == [[h.to_dict() for h in hits] for hits in expected]
        assert t.documents[0][0]["title"] == "Alice Verdan" and t.documents[1][0]["title"] == "Tarnland"
        blocks = [
            tok.encode(wrap_information(format_observation_docs(h)), add_special_tokens=False)
            for h in expected
        ]
        assert _observations(t) == blocks


def test_http_server_and_client_give_the_same_trajectories(tiny, bm25):
    from searchr1.retrieval.client import RetrievalClient
    from searchr1.retrieval.server import create_app, serve_in_thread

    local = _rollout(tiny, bm25)
    with serve_in_thread(create_app(bm25)) as (url, stop):
        client = RetrievalClient(url, timeout_s=5, retries=0)
        remote = _rollout(tiny, client)
        stop()  # the server goes away: searches fail, trajectories go on
        down = _rollout(tiny, RetrievalClient(url, timeout_s=1, retries=0), search_retries=0)
    assert [t.response_ids for t in remote] == [t.response_ids for t in local]
    assert [t.documents for t in remote] == [t.documents for t in local]
    _, tok = tiny
    failed = tok.encode(wrap_information(SEARCH_FAILED_TEXT), add_special_tokens=False)
    for t in down:
        assert (t.search_failures, t.finish_reason) == (2, "answer")
        assert _observations(t) == [failed, failed]
