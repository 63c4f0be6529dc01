"""Configuration of the model and of the training loop (sections ``model`` and ``trainer``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    path: str = "tiny"
    """Hugging Face hub id or local folder; `tiny` builds the tiny CPU model of the demo."""
    dtype: str = "float32"
    """Parameter dtype: float32 | bfloat16 | float16."""


@dataclass
class TrainerConfig:
    total_steps: int = 100
    """Training steps (one step = one rollout batch and its policy update)."""
    out_dir: str = "runs/default"
    """Run folder: checkpoints, metrics.jsonl, plots, report."""
