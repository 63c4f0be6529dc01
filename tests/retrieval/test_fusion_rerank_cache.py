"""Hybrid RRF, cross-encoder rerank (a tiny cross-encoder built here), LRU cache, backend registry."""

from __future__ import annotations

import dataclasses

import pytest

from searchr1.retrieval.base import Hit, Retriever
from searchr1.retrieval.cache import CachedRetriever
from searchr1.retrieval.config import RetrievalConfig
from searchr1.retrieval.factory import build_retriever
from searchr1.retrieval.hybrid import HybridRetriever, reciprocal_rank_fusion


def hit(i: str) -> Hit:
    return Hit(i, f"T{i}", f"text {i}", 0.0)


def test_rrf_formula():
    fused = reciprocal_rank_fusion([[hit("a"), hit("b"), hit("c")], [hit("c"), hit("a")]], topk=3, k=60)
    assert [h.id for h in fused] == ["a", "c", "b"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert fused[1].score == pytest.approx(1 / 63 + 1 / 61)
    assert fused[2].score == pytest.approx(1 / 62)


def test_hybrid_bm25_plus_dense(bm25, dense, docs):
    hybrid = HybridRetriever(bm25, dense, k=60, candidates=10)
    queries = [d.title for d in docs[:20]]
    results = hybrid.search(queries, 3)
    assert [r[0].id for r in results] == [d.id for d in docs[:20]]  # both rankings agree on the name
    b, d = bm25.search(queries, 10), dense.search(queries, 10)
    for fused, rb, rd in zip(results, b, d, strict=True):
        expected = reciprocal_rank_fusion([rb, rd], 3, 60)
        assert [h.id for h in fused] == [h.id for h in expected]


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    """A tiny BERT cross-encoder (fresh regression head) with the bundled MiniLM tokenizer.

    No cross-encoder weights exist offline, so the real CrossEncoder loading path is exercised
    with a folder written here by save_pretrained.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from searchr1.retrieval.dense import default_model_path

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("cross-encoder")
    tok = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def test_rerank_orders_each_query_by_its_own_cross_encoder_scores(bm25, docs, cross_encoder_dir):
    from searchr1.retrieval.rerank import RerankRetriever

    rr = RerankRetriever(bm25, cross_encoder_dir, candidates=8, device="cpu")
    queries = ["river", "castle founded", docs[0].title + " river"]
    reranked = rr.search(queries, 3)
    base = bm25.search(queries, 8)
    moved = False
    for q, got, cands in zip(queries, reranked, base, strict=True):
        assert len(got) == min(3, len(cands))
        # score this query alone, against its own candidates only
        alone = rr.score_pairs([(q, f"{h.title}. {h.text}") for h in cands])
        order = sorted(range(len(cands)), key=lambda i: -alone[i])[:3]
        assert [h.id for h in got] == [cands[i].id for i in order]
        assert [h.score for h in got] == pytest.approx([alone[i] for i in order], abs=1e-5)
        moved |= [h.id for h in got] != [h.id for h in cands[:3]]
    assert moved  # the cross-encoder changed at least one ranking


def test_build_retriever_by_name(corpus_file, docs, cross_encoder_dir, tmp_path):
    from searchr1.retrieval.bm25 import BM25Retriever
    from searchr1.retrieval.index import build_index

    cfg = RetrievalConfig(backend="bm25", corpus=str(corpus_file))
    r = build_retriever(cfg)
    assert isinstance(r, BM25Retriever) and r.search([docs[4].title], 1)[0][0].id == docs[4].id
    cached = build_retriever(dataclasses.replace(cfg, cache_size=10))
    assert isinstance(cached, CachedRetriever)
    build_index(corpus_file, tmp_path / "idx", show_progress=False)
    assert (
        build_retriever(RetrievalConfig(index=str(tmp_path / "idx"))).search([docs[9].title], 1)[0][0].id
        == docs[9].id
    )
    rerank = build_retriever(
        dataclasses.replace(cfg, backend="rerank", rerank_model=cross_encoder_dir, candidates=5)
    )
    assert len(rerank.search(["river"], 2)[0]) == 2
    with pytest.raises(ValueError, match=r"retrieval\.backend: unknown search backend 'nope'; known: .*bm25"):
        build_retriever(dataclasses.replace(cfg, backend="nope"))
    with pytest.raises(ValueError, match="rerank_model"):
        build_retriever(dataclasses.replace(cfg, backend="rerank"))


class Counting(Retriever):
    name = "counting"

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def search(self, queries, topk):
        self.seen.append(list(queries))
        return self.inner.search(queries, topk)


def test_lru_cache(bm25, docs):
    inner = Counting(bm25)
    cache = CachedRetriever(inner, size=3)
    a, b, c, d = (x.title for x in docs[:4])
    first = cache.search([a, b, a], 2)
    assert inner.seen == [[a, b]] and first[0] == first[2] == bm25.search([a], 2)[0]
    assert cache.search([b, a], 2) == bm25.search([b, a], 2) and len(inner.seen) == 1
    cache.search([a], 5)  # different topk is a different entry
    assert inner.seen[-1] == [a]
    cache.search([c, d], 2)  # evicts the least recently used entries
    assert len(cache) == 3
    cache.search([b], 2)
    assert inner.seen[-1] == [b]
    assert cache.hits == 3 and cache.misses == 6
