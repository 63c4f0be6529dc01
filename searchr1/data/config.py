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

    def validate(self, root: object) -> None:
        from pathlib import Path

        from searchr1.data.prompts import TEMPLATES

        if self.template not in TEMPLATES and not Path(self.template).is_file():
            raise ValueError(
                f"data.template: {self.template!r} is neither one of {', '.join(TEMPLATES)} nor an existing file"
            )
        if self.template not in TEMPLATES and "{question}" not in Path(self.template).read_text(
            encoding="utf-8"
        ):
            raise ValueError(f"data.template: the template file {self.template} has no {{question}} slot")
