"""Configuration of the search backend (section ``retrieval``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RetrievalConfig:
    backend: str = "bm25"
    """Search backend by name: bm25 | dense | hybrid | rerank | http | serpapi | google | serper | brave | bing."""
    index: str | None = None
    """Index folder written by `searchr1 index build` (bm25 / dense)."""
    url: str | None = None
    """Retrieval server URL(s) for backend=http, comma-separated for round-robin."""
    topk: int = 3
    """Documents returned per query."""
    cache_size: int = 0
    """LRU cache entries for repeated queries (0 = off)."""
