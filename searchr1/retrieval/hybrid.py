"""Hybrid search: reciprocal-rank fusion of two backends.

RRF (Cormack, Clarke & Büttcher, SIGIR 2009, "Reciprocal Rank Fusion outperforms Condorcet and
individual Rank Learning Methods"):

    score(d) = sum_{r in rankings} 1 / (k + rank_r(d))       (rank starts at 1; k = 60)

Each backend contributes its top ``candidates``; a document missing from a ranking adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchr1.retrieval.base import Hit, Retriever


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], topk: int, k: int = 60) -> list[Hit]:
    """Fuse rankings of one query; the fused hits carry the RRF score, ties keep first-seen order."""
    fused: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.id] = fused.get(hit.id, 0.0) + 1.0 / (k + rank)
            first.setdefault(hit.id, hit)
    order = sorted(fused, key=lambda d: -fused[d])[:topk]
    return [Hit(d, first[d].title, first[d].text, fused[d]) for d in order]


class HybridRetriever(Retriever):
    """Reciprocal-rank fusion of two retrievers (e.g. BM25 + dense)."""

    name = "hybrid"

    def __init__(self, first: Retriever, second: Retriever, k: int = 60, candidates: int = 20):
        self.retrievers = (first, second)
        self.k = k
        self.candidates = candidates

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        n = max(topk, self.candidates)
        a, b = (r.search(list(queries), n) for r in self.retrievers)
        return [reciprocal_rank_fusion([ha, hb], topk, self.k) for ha, hb in zip(a, b, strict=True)]

    def warm_up(self) -> str | None:
        done = [w for w in (r.warm_up() for r in self.retrievers) if w]
        return "; ".join(done) or None

    def close(self) -> None:
        for r in self.retrievers:
            r.close()
