"""Fixtures of the evaluation and report tests (helpers live in evalworld.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from evalworld import write_world
from tinyrun import run_overrides


@pytest.fixture
def world_files(tmp_path: Path) -> dict[str, Path]:
    return write_world(tmp_path / "world")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from searchr1.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def trained_run(tiny_model_dir, tmp_path_factory):
    """A real 3-step `searchr1 train` run (GRPO, BM25, validation every step) on the handmade world."""
    from searchr1.cli import main

    folder = tmp_path_factory.mktemp("trained")
    world = write_world(folder / "world")
    out = folder / "run"
    train, val = [world["synth"], world["nq"]], [world["nq"]]
    steps = {"trainer__total_steps": 3, "trainer__val_every": 1, "trainer__trajectory_samples": 2}
    argv = run_overrides(tiny_model_dir, out, train, val, world["corpus"], **steps)
    assert main(["train", *argv]) == 0
    return out
