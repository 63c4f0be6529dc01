"""Checkpoint files: atomic writes (a half-written one never counts), keep-last pruning, resume
resolution; metric sinks and plots."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from searchr1.trainer import checkpoint
from searchr1.trainer.plots import write_plots
from searchr1.trainer.tracking import MetricsLogger, read_metrics


def _write(out, step, keep_last=2, fail=False):
    def write_model(folder):
        (folder / "model").mkdir()
        (folder / "model" / "weights.bin").write_bytes(b"x" * 10)
        if fail:
            raise RuntimeError("killed while writing")

    return checkpoint.save_checkpoint(
        out, step, write_model, {"step": step}, "seed: 0\n", keep_last=keep_last
    )


def test_keep_last_and_resume_resolution(tmp_path):
    for step in (10, 20, 30):
        _write(tmp_path, step)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [20, 30]
    assert checkpoint.resolve_resume("auto", tmp_path).name == "step_000030"
    assert checkpoint.resolve_resume("never", tmp_path) is None
    assert checkpoint.load_trainer_state(checkpoint.latest_checkpoint(tmp_path))["step"] == 30
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        checkpoint.resolve_resume(str(tmp_path / "nowhere"), tmp_path)


def test_interrupted_write_leaves_previous_checkpoint(tmp_path):
    _write(tmp_path, 1)
    with pytest.raises(RuntimeError):
        _write(tmp_path, 2, fail=True)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [1]
    assert checkpoint.resolve_resume("auto", tmp_path).name == "step_000001"
    _write(tmp_path, 3)  # the next save clears the leftover
    assert not any(p.name.startswith(".tmp-") for p in checkpoint.checkpoint_dir(tmp_path).iterdir())
    # rewriting the same step replaces it completely
    _write(tmp_path, 3)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [1, 3]


def test_rng_state_round_trip():
    state = checkpoint.rng_state()
    a = (random.random(), float(np.random.rand()), float(torch.rand(())))
    checkpoint.set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == a


def test_metrics_logger_truncates_on_resume_and_plots(tmp_path):
    log = MetricsLogger(tmp_path, ["jsonl", "tensorboard"])
    for step in range(1, 6):
        log.log(step, {"reward/mean": step / 10, "val/tiny/em": 0.1 * step, "actor/kl": float("nan")})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["actor/kl"] == "nan"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    MetricsLogger(tmp_path, ["jsonl"], resume_step=3).close()  # resumed from step 3: 4, 5 come again
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    paths = write_plots(tmp_path)
    assert {p.name for p in paths} >= {"overview.png", "reward.png", "validation.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_wandb_backend_needs_the_package(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(RuntimeError, match=r"searchr1\[wandb\]"):
        MetricsLogger(tmp_path, ["wandb"])


def test_wandb_backend_logs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    log = MetricsLogger(tmp_path / "run", ["jsonl", "wandb"], run_config={"seed": 3})
    for step in range(1, 4):
        log.log(step, {"reward/mean": step / 10})
    log.close()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    assert list(runs[0].glob("*.wandb")), "the offline run holds no history file"
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
