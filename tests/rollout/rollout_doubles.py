"""Test doubles of the rollout tests: a scripted search backend (stands in for the retriever)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from searchr1.retrieval.base import Hit, Retriever


class ScriptedRetriever(Retriever):
    """Answers every query with ``topk`` made-up hits that name the query; records every call.

    ``fail(query, call_number) -> Exception | None`` makes chosen calls raise; ``delay_s`` sleeps
    in every call (a slow backend); ``docs_text`` overrides the text of every hit.
    """

    name = "scripted"

    def __init__(
        self,
        fail: Callable[[str, int], Exception | None] | None = None,
        delay_s: float = 0.0,
        docs_text: str | None = None,
    ) -> None:
        self.fail = fail
        self.delay_s = delay_s
        self.docs_text = docs_text
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        with self._lock:
            self.calls.append(list(queries))
            call = len(self.calls)
        if self.delay_s:
            time.sleep(self.delay_s)
        for q in queries:
            exc = self.fail(q, call) if self.fail else None
            if exc is not None:
                raise exc
        return [
            [
                Hit(
                    f"{q}-{j}", f"Title {j} of {q}", self.docs_text or f"passage {j} about {q}", 1.0 / (j + 1)
                )
                for j in range(topk)
            ]
            for q in queries
        ]
