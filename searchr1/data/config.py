"""Configuration of datasets and prompts (section ``data``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    train_files: list[str] | None = None
    """Training data: Search-R1 parquet or FlashRAG jsonl files (None = the embedded synthetic world)."""
    val_files: list[str] | None = None
    """Validation data, evaluated greedily every `trainer.val_every` steps."""
    template: str = "base"
    """Prompt template: base | instruct (through the chat template) | path to a file with a {question} slot."""
