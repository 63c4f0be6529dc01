"""Backend selection by name: ``build_retriever(cfg)`` looks ``cfg.backend`` up in ``RETRIEVERS``.

The local backends and the HTTP client are registered here, the web APIs in ``web.py``. Each factory
takes the ``RetrievalConfig`` and returns a ``Retriever``; a user adds a backend with

    @register_retriever("mine")
    def _mine(cfg): return MyRetriever(...)
"""

from __future__ import annotations

import dataclasses

from searchr1.retrieval.base import RETRIEVERS, Retriever, register_retriever
from searchr1.retrieval.cache import CachedRetriever
from searchr1.retrieval.config import RetrievalConfig
from searchr1.retrieval.hybrid import HybridRetriever
from searchr1.retrieval.rerank import RerankRetriever


def build_retriever(cfg: RetrievalConfig) -> Retriever:
    """The backend named by ``cfg.backend``, wrapped in an LRU cache when ``cfg.cache_size > 0``."""
    retriever = RETRIEVERS.lookup(cfg.backend)(cfg)
    if cfg.cache_size > 0:
        retriever = CachedRetriever(retriever, cfg.cache_size)
    return retriever


def _local(cfg: RetrievalConfig, index: str | None, kind: str) -> Retriever:
    from searchr1.retrieval.index import load_index

    if index is None:
        if kind == "bm25" and cfg.corpus:
            from searchr1.retrieval.bm25 import BM25Retriever

            return BM25Retriever.from_corpus(
                cfg.corpus,
                preset=cfg.bm25_preset,
                analyzer=cfg.bm25_analyzer,
                k1=cfg.bm25_k1,
                b=cfg.bm25_b,
                method=cfg.bm25_method,
                stemmer=cfg.bm25_stemmer,
                stopwords=cfg.bm25_stopwords,
            )
        raise ValueError(f"retrieval.index is required for backend={kind} (or retrieval.corpus for bm25)")
    return load_index(
        index,
        corpus=cfg.corpus,
        model=cfg.dense_model if kind == "dense" else None,
        nprobe=cfg.dense_nprobe,
        ef_search=cfg.dense_ef_search,
        device=cfg.dense_device,
    )


@register_retriever("bm25")
def _bm25(cfg: RetrievalConfig) -> Retriever:
    return _local(cfg, cfg.index, "bm25")


@register_retriever("dense")
def _dense(cfg: RetrievalConfig) -> Retriever:
    return _local(cfg, cfg.index, "dense")


@register_retriever("hybrid")
def _hybrid(cfg: RetrievalConfig) -> Retriever:
    from searchr1.retrieval.index import load_index

    if len(cfg.hybrid_indexes) != 2:
        raise ValueError("retrieval.hybrid_indexes must name exactly two index folders")
    first, second = (
        load_index(p, nprobe=cfg.dense_nprobe, ef_search=cfg.dense_ef_search) for p in cfg.hybrid_indexes
    )
    return HybridRetriever(first, second, k=cfg.rrf_k, candidates=cfg.candidates)


@register_retriever("rerank")
def _rerank(cfg: RetrievalConfig) -> Retriever:
    if not cfg.rerank_model:
        raise ValueError(
            "retrieval.rerank_model is required for backend=rerank (a cross-encoder folder or hub id)"
        )
    base = build_retriever(dataclasses.replace(cfg, backend=cfg.rerank_base, cache_size=0))
    return RerankRetriever(base, cfg.rerank_model, candidates=cfg.candidates, device=cfg.dense_device)


@register_retriever("http")
def _http(cfg: RetrievalConfig) -> Retriever:
    from searchr1.retrieval.client import RetrievalClient

    if not cfg.url:
        raise ValueError("retrieval.url is required for backend=http")
    return RetrievalClient(cfg.url, cfg.timeout_s, cfg.retries, cfg.backoff_s, api_key=cfg.api_key)
