"""Configuration of datasets and prompts (section ``data``)."""

from __future__ import annotations

from dataclasses import dataclass

from searchr1.data.prompts import AUTO, load_template


@dataclass
class DataConfig:
    train_files: list[str] | None = None
    """Training data: Search-R1 parquet or FlashRAG jsonl files (None = the embedded synthetic world)."""
    val_files: list[str] | None = None
    """Validation data, evaluated greedily every `trainer.val_every` steps."""
    max_train_samples: int = 0
    """Train on the first N training questions only (0 = all of them): a small pool brings each question back
    several times in a short run (``replay`` mixes a question's earlier successes into its later groups)."""
    template: str = "auto"
    """Prompt template: auto (instruct when the tokenizer has a chat template, else base; the choice is
    printed) | base (Search-R1's instruction as plain text) | instruct (through the chat template) |
    instruct_1shot / instruct_2shot / instruct_2hop (the instruction as the system message and worked examples, through
    the chat template) | a path to a .json / .yaml list of chat messages or a text file, with a {question} slot."""

    def validate(self, root: object) -> None:
        if self.max_train_samples < 0:
            raise ValueError(f"data.max_train_samples: must be >= 0 (0 = all), got {self.max_train_samples}")
        if self.template == AUTO:
            return
        try:
            load_template(self.template)
        except ValueError as exc:
            raise ValueError(f"data.template: {exc}") from None
