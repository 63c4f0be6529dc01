"""Cross-encoder reranking of any backend's top-N candidates.

A cross-encoder reads the query and a passage together and outputs one relevance score
(Nogueira & Cho, 2019, "Passage Re-ranking with BERT"): score(q, d) = head(BERT([CLS] q [SEP] d)).
It is far slower than a bi-encoder, so it only reorders the ``candidates`` hits of a first-stage
retriever; every query is scored only against its own candidates, all pairs of a batch in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchr1.retrieval.base import Hit, Retriever


class RerankRetriever(Retriever):
    """First stage ``base`` (top ``candidates``) -> cross-encoder scores -> top ``topk``."""

    name = "rerank"

    def __init__(
        self,
        base: Retriever,
        model: str | object,
        candidates: int = 20,
        batch_size: int = 32,
        device: str | None = None,
    ):
        self.base = base
        self.candidates = candidates
        self.batch_size = batch_size
        if isinstance(model, str):
            from sentence_transformers import CrossEncoder

            try:
                self.model = CrossEncoder(model, device=device, num_labels=1)
            except (OSError, ValueError) as exc:
                raise ValueError(f"cannot load cross-encoder {model!r}: {exc}") from exc
        else:
            self.model = model  # an already loaded CrossEncoder

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Cross-encoder relevance of each (query, passage text) pair."""
        if not pairs:
            return []
        scores = self.model.predict(
            [list(p) for p in pairs], batch_size=self.batch_size, show_progress_bar=False
        )
        return [float(s) for s in scores]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        first = self.base.search(list(queries), max(topk, self.candidates))
        pairs = [
            (q, f"{h.title}. {h.text}" if h.title else h.text)
            for q, hits in zip(queries, first, strict=True)
            for h in hits
        ]
        scores = iter(self.score_pairs(pairs))
        out = []
        for hits in first:
            rescored = [Hit(h.id, h.title, h.text, next(scores)) for h in hits]
            rescored.sort(key=lambda h: -h.score)
            out.append(rescored[:topk])
        return out

    def warm_up(self) -> str | None:
        return self.base.warm_up()

    def close(self) -> None:
        self.base.close()
