"""Search backends behind one interface: ``search(queries, topk) -> list[list[Hit]]``.

BM25, dense (sentence-transformers + FAISS), hybrid (RRF), cross-encoder rerank, web-search APIs,
the HTTP retrieval server and its client, an LRU cache, index folders. Exports load lazily so that
``import searchr1.retrieval`` stays cheap.

    from searchr1.retrieval import BM25Retriever, read_corpus
    bm25 = BM25Retriever.from_documents(read_corpus("corpus.jsonl"))
"""

from __future__ import annotations

import importlib
from typing import Any

from searchr1.retrieval.base import RETRIEVERS, Hit, Retriever, SearchError, register_retriever

_LAZY = {
    "Document": "corpus",
    "CorpusError": "corpus",
    "read_corpus": "corpus",
    "write_corpus": "corpus",
    "chunk_document": "corpus",
    "BM25Retriever": "bm25",
    "BM25Params": "bm25",
    "DenseRetriever": "dense",
    "Encoder": "dense",
    "HybridRetriever": "hybrid",
    "reciprocal_rank_fusion": "hybrid",
    "RerankRetriever": "rerank",
    "RetrievalClient": "client",
    "CachedRetriever": "cache",
    "build_retriever": "factory",
    "build_index": "index",
    "load_index": "index",
    "IndexLoadError": "index",
    "IndexMismatchError": "index",
    "Manifest": "index",
    "create_app": "server",
    "serve_in_thread": "server",
    "ServerLimits": "server",
    "WEB_APIS": "web",
}

__all__ = ["RETRIEVERS", "Hit", "Retriever", "SearchError", "register_retriever", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'searchr1.retrieval' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"searchr1.retrieval.{module}"), name)
    globals()[name] = value
    return value
