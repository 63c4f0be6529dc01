"""searchr1: train language models to reason and search with reinforcement learning (Search-R1)."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "SearchR1Trainer": "searchr1.api",
    "Agent": "searchr1.evaluation.agent",
}


def __getattr__(name: str) -> Any:
    """Import heavy public objects on first use so `import searchr1` stays fast."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'searchr1' has no attribute {name!r}")
