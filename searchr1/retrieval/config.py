"""Configuration of the search backend (section ``retrieval``)."""

from __future__ import annotations

from dataclasses import dataclass, field

DENSE_INDEX_TYPES = ("flat", "hnsw", "ivf", "ivfpq", "opq-ivfpq", "ivfpq-rerank", "hnsw-sq8")
"""FAISS index kinds of ``searchr1 index build --retriever dense`` (see ``retrieval.dense_build``)."""


@dataclass
class RetrievalConfig:
    backend: str = "bm25"
    """Search backend by registered name: bm25 | dense | hybrid | rerank | http | a web API (serpapi, google, serper, brave, bing) | a plugin's."""
    index: str | None = None
    """Index folder written by `searchr1 index build` (bm25 / dense)."""
    corpus: str | None = None
    """Corpus jsonl indexed in memory by bm25 when no `index` is given (small corpora); with an index, checked against its manifest."""
    url: str | None = None
    """Retrieval server URL(s) for backend=http, comma-separated for round-robin."""
    topk: int = 3
    """Documents returned per query."""
    cache_size: int = 0
    """LRU cache entries for repeated queries (0 = off)."""

    bm25_preset: str = "pyserini"
    """BM25 settings to start from: pyserini (Search-R1's retriever: k1 0.9, b 0.4, Lucene's English
    analyzer and document lengths) | bm25s (earlier versions: k1 1.5, b 0.75, regex tokens, Snowball)."""
    bm25_k1: float | None = None
    """BM25 term-frequency saturation k1 (null: the preset's; used when indexing)."""
    bm25_b: float | None = None
    """BM25 length normalisation b (null: the preset's; used when indexing)."""
    bm25_method: str | None = None
    """BM25 variant: lucene | robertson | atire | bm25l | bm25+ (null: lucene)."""
    bm25_analyzer: str | None = None
    """BM25 text analysis: lucene-english | regex (null: the preset's)."""
    bm25_stemmer: str | None = None
    """Stemmer: porter, or a PyStemmer language (english, ...); "none": no stemming; null: the preset's."""
    bm25_stopwords: str | None = None
    """Stop words: lucene, or a bm25s list (en, de, ...); "none": keep all; null: the preset's."""

    dense_model: str | None = None
    """Sentence-transformers encoder: local folder or hub id (null: the bundled all-MiniLM-L6-v2)."""
    dense_index_type: str = "flat"
    """FAISS index built by `index build --retriever dense`: flat | hnsw | ivf | ivfpq | opq-ivfpq | ivfpq-rerank | hnsw-sq8."""
    dense_nprobe: int = 16
    """IVF lists visited per query (recall vs speed)."""
    dense_ef_search: int = 64
    """HNSW candidate-list size at query time (recall vs speed)."""
    dense_batch_size: int = 64
    """Encoder batch size for queries and passages."""
    dense_device: str | None = None
    """Torch device for the encoder (null: cuda when available, else cpu)."""

    hybrid_indexes: list[str] = field(default_factory=list)
    """backend=hybrid: the two index folders whose rankings are fused (e.g. a bm25 and a dense index)."""
    rrf_k: int = 60
    """Reciprocal-rank-fusion constant k in 1/(k + rank)."""
    candidates: int = 20
    """Candidates fetched from each underlying backend by hybrid and rerank before cutting to topk."""
    rerank_base: str = "bm25"
    """backend=rerank: the backend whose top `candidates` are reordered (built from this same section)."""
    rerank_model: str | None = None
    """Cross-encoder (sentence-transformers CrossEncoder) folder or hub id for backend=rerank."""

    web_base_url: str | None = None
    """Override the web-search API's base URL (a proxy, or a local test server)."""
    web_max_concurrency: int = 4
    """Parallel requests a web backend sends for one batch of queries."""

    timeout_s: float = 10.0
    """HTTP timeout per request (backend=http and web APIs)."""
    retries: int = 3
    """Retries after a failed request (5xx, 429, connection error, timeout) before SearchError."""
    backoff_s: float = 0.5
    """First retry delay; doubles on each retry."""
    api_key: str | None = None
    """Bearer token sent to the retrieval server (null: env SEARCHR1_API_KEY)."""

    def validate(self, root: object) -> None:
        if self.topk < 1:
            raise ValueError("retrieval.topk must be >= 1")
        if self.cache_size < 0:
            raise ValueError("retrieval.cache_size must be >= 0")
        if self.bm25_preset not in ("pyserini", "bm25s"):
            raise ValueError("retrieval.bm25_preset must be pyserini or bm25s")
        if self.dense_index_type not in DENSE_INDEX_TYPES:
            raise ValueError(f"retrieval.dense_index_type must be one of {', '.join(DENSE_INDEX_TYPES)}")
        if self.backend == "hybrid" and len(self.hybrid_indexes) != 2:
            raise ValueError(
                "retrieval.hybrid_indexes must name exactly two index folders for backend=hybrid"
            )
        if self.backend == "http" and not self.url:
            raise ValueError("retrieval.url is required for backend=http")
        if self.backend == "rerank" and self.rerank_base == "rerank":
            raise ValueError("retrieval.rerank_base cannot be 'rerank'")
        if self.retries < 0 or self.timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError("retrieval.retries/backoff_s must be >= 0 and retrieval.timeout_s > 0")
