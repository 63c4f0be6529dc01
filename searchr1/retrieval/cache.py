"""An LRU cache in front of any retriever: repeated (query, topk) pairs skip the backend."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from searchr1.retrieval.base import Hit, Retriever


class CachedRetriever(Retriever):
    """Answers cached queries from memory and sends only the misses, as one batch, to ``inner``."""

    def __init__(self, inner: Retriever, size: int = 10_000):
        if size < 1:
            raise ValueError("cache size must be >= 1")
        self.inner = inner
        self.size = size
        self.name = f"cached({inner.name})"
        self._entries: OrderedDict[tuple[str, int], list[Hit]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        results: list[list[Hit] | None] = [None] * len(queries)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, q in enumerate(queries):
                cached = self._entries.get((q, topk))
                if cached is not None:
                    self._entries.move_to_end((q, topk))
                    results[i] = cached
                    self.hits += 1
                elif q in missing:  # a repeat inside this batch: answered by the same backend row
                    missing[q].append(i)
                    self.hits += 1
                else:
                    missing[q] = [i]
                    self.misses += 1
        if missing:
            fresh = self.inner.search(list(missing), topk)
            with self._lock:
                for (q, positions), hits in zip(missing.items(), fresh, strict=True):
                    for i in positions:
                        results[i] = hits
                    self._entries[(q, topk)] = hits
                    self._entries.move_to_end((q, topk))
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
        return [list(r) for r in results]  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._entries)

    def warm_up(self) -> str | None:
        return self.inner.warm_up()

    def close(self) -> None:
        self.inner.close()
