"""What a damaged BM25 index raises, and the one command that repairs it."""

from __future__ import annotations

REBUILD = "rebuild it with `searchr1 index build --corpus CORPUS --out FOLDER`"
"""The end of every message that refuses an index: how to get a good one."""


class DamagedIndex(ValueError):
    """An index file whose bytes are not those the build wrote (truncated, corrupted, missing)."""


class CorruptIndex(ValueError):
    """A block of postings that cannot be what the build wrote (found while searching)."""
