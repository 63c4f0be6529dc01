"""The dotted overrides of a tiny `searchr1 train` run (BM25, GRPO, exact-match reward, CPU) that
takes well under a second a step; shared by the trainer tests (``rlworld``) and the evaluation
tests (``trained_run``). Importable in the pytest process (``tests/`` holds the root conftest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_overrides(
    model_dir: Path, out_dir: Path, train: list[Path], val: list[Path], corpus: Path, **extra: Any
) -> list[str]:
    """``key=value`` arguments (``extra`` uses ``__`` for dots: ``trainer__total_steps=3``)."""
    base: dict[str, Any] = {
        "model.path": str(model_dir),
        "data.train_files": [str(p) for p in train],
        "data.val_files": [str(p) for p in val],
        "retrieval.backend": "bm25",
        "retrieval.corpus": str(corpus),
        "retrieval.topk": 1,
        "rollout.n": 2,
        "rollout.dtype": "model",  # the same float32 numbers on every machine
        "model.bf16_autocast": False,
        "rollout.max_turns": 1,
        "rollout.max_turn_tokens": 6,
        "rollout.max_obs_tokens": 12,
        "rollout.max_response_tokens": 40,
        "rollout.search_workers": 1,
        "reward.components": {"exact_match": 1.0},
        "algorithm.advantage": "grpo",
        "trainer.total_steps": 2,
        "trainer.batch_size": 2,
        "trainer.mini_batch_size": 2,
        "trainer.micro_batch_size": 4,
        "trainer.save_every": 0,
        "trainer.val_every": 0,
        "trainer.progress_bar": False,
        "trainer.log_backends": ["jsonl"],
        "trainer.trajectory_samples": 0,
        "trainer.plot_at_end": False,
        "trainer.device": "cpu",
        "trainer.out_dir": str(out_dir),
    }
    base.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in base.items()]
