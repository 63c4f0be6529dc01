"""Fixtures of the evaluation and report tests (helpers live in evalworld.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from evalworld import write_world


@pytest.fixture
def world_files(tmp_path: Path) -> dict[str, Path]:
    return write_world(tmp_path / "world")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from searchr1.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)
