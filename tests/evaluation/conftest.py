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


@pytest.fixture(scope="session")
def trained_run(tiny_model_dir, tmp_path_factory):
    """A real 3-step `searchr1 train` run (GRPO, BM25, validation every step) on the handmade world."""
    import json

    from searchr1.cli import main

    folder = tmp_path_factory.mktemp("trained")
    world = write_world(folder / "world")
    out = folder / "run"
    overrides = {
        "model.path": str(tiny_model_dir),
        "data.train_files": [str(world["synth"]), str(world["nq"])],
        "data.val_files": [str(world["nq"])],
        "retrieval.backend": "bm25",
        "retrieval.corpus": str(world["corpus"]),
        "retrieval.topk": 1,
        "rollout.n": 2,
        "rollout.max_turns": 1,
        "rollout.max_turn_tokens": 6,
        "rollout.max_obs_tokens": 12,
        "rollout.max_response_tokens": 40,
        "rollout.search_workers": 1,
        "reward.components": {"exact_match": 1.0},
        "algorithm.advantage": "grpo",
        "trainer.total_steps": 3,
        "trainer.batch_size": 2,
        "trainer.mini_batch_size": 2,
        "trainer.micro_batch_size": 4,
        "trainer.save_every": 0,
        "trainer.val_every": 1,
        "trainer.progress_bar": False,
        "trainer.log_backends": ["jsonl"],
        "trainer.trajectory_samples": 2,
        "trainer.plot_at_end": False,
        "trainer.device": "cpu",
        "trainer.out_dir": str(out),
    }
    argv = ["train"] + [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    assert main(argv) == 0
    return out
