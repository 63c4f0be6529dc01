"""What a damaged BM25 index raises, and the one command that repairs it."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

REBUILD = "rebuild it with `searchr1 index build --corpus CORPUS --out FOLDER`"
"""The end of every message that refuses an index: how to get a good one."""


class DamagedIndex(ValueError):
    """An index file whose bytes are not those the build wrote (truncated, corrupted, missing)."""


class CorruptIndex(ValueError):
    """A block of postings that cannot be what the build wrote (found while searching)."""


class BoundsError(ValueError):
    """The build's own check of the bounds it is about to write failed (a bug, never the input)."""


REBUILD_BM25 = "rebuild it with `searchr1 index build --retriever bm25 --corpus CORPUS --out FOLDER`"


def rebuild_bm25(folder: Path) -> str:
    """``REBUILD_BM25`` for the index folder ``folder``, with the corpus its manifest names (if it can
    be read)."""
    corpus = "CORPUS"
    with contextlib.suppress(OSError, ValueError):
        corpus = json.loads((folder / "manifest.json").read_text()).get("corpus") or corpus
    return REBUILD_BM25.replace("CORPUS", str(corpus)).replace("FOLDER", str(folder))
