"""Where the shared FlashRAG sample lies (wiki-18 corpus and NQ questions), found relative to the
repository: ``shared/data/flashrag-sample`` in the repository root or in a folder above it. Tests that
read it skip when it is absent (a checkout elsewhere); no test names an absolute path."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def flashrag_sample() -> Path | None:
    """The ``flashrag-sample`` folder next to the repository, or None."""
    for folder in (REPO, *REPO.parents):
        candidate = folder / "shared" / "data" / "flashrag-sample"
        if candidate.is_dir():
            return candidate
    return None


def sample_file(name: str) -> Path:
    """A file of the sample; skips the calling test when the sample is not there."""
    folder = flashrag_sample()
    if folder is None or not (folder / name).is_file():
        pytest.skip(f"shared FlashRAG sample not present ({name})")
    return folder / name
