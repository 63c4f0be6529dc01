"""The one search interface every backend implements.

hits = retriever.search(["who founded Acme", "where is Borvik"], topk=3)
hits[0][0].title, hits[0][0].text, hits[0][0].score
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from searchr1.registry import Registry


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    id: str
    title: str
    text: str
    score: float
    wire: bytes | None = field(default=None, compare=False, repr=False)
    """The document as the retrieval server sends it (``{"id","contents"}`` JSON), where the passage
    store keeps it (``bm25.store``): sent as it is, not encoded again. Not part of equality."""

    @property
    def contents(self) -> str:
        """The wiki-18 / FlashRAG form: the quoted title on the first line, then the text."""
        return f'"{self.title}"\n{self.text}'

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text, "score": self.score}


class SearchError(RuntimeError):
    """A search could not be answered (backend down, timeout after retries, bad response).

    The rollout turns it into an observation that says the search failed; it never ends a run.
    """


class Retriever(ABC):
    """Batch-first search: one call answers many queries."""

    name: str = "retriever"

    @abstractmethod
    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Return, for every query, up to ``topk`` hits sorted by decreasing score."""

    def warm_up(self) -> str | None:
        """Prepare for the first query (compile, load) before any arrives; returns what was done, for
        the server's log, or None when there is nothing to prepare."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (threads, connections, memory maps)."""


RETRIEVERS: Registry[Callable[..., Retriever]] = Registry(
    "search backend",
    "retrieval.backend",
    builtins=("searchr1.retrieval.factory", "searchr1.retrieval.web"),
)
"""Backend name -> factory ``(RetrievalConfig) -> Retriever``; ``build_retriever`` looks names up here.
The built-ins register themselves in ``factory.py`` (local indexes, the HTTP client) and ``web.py``."""

register_retriever = RETRIEVERS.register
"""Decorator: make a backend factory selectable by ``retrieval.backend=name``."""
