"""The HotpotQA demo's data: a split of the shared sample and one corpus of all its paragraphs.

The sample (``shared/data/hotpotqa-sample``: ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` in HotpotQA's
row format) is split so that the test questions are read only for the final table:

    test    test.jsonl (its first ``test_questions``; 0: all)                       the final rows only
    val     a fixed slice of dev.jsonl: ``val_questions``, half bridge and half      RL's validation
            comparison (the first of each type in file order; the other type fills a short half)
    train   train.jsonl, then the rest of dev.jsonl (the first ``train_questions``;   warm start and RL
            0: all)

A training or validation row whose id or question (case and spaces aside) is also a test row's is left
out and counted (``HotpotQAData.dropped``; the shared sample has none), and so is a training row that
repeats a validation row. The corpus is every distinct ``(title, text)`` context paragraph of the three
files, each once (``searchr1.data.hotpotqa.hotpotqa_corpus``): retrieval must find a question's two
paragraphs among all the others, not among its own ten. ``missing_gold_line`` names, in one line, the
gold paragraphs the corpus lacks.

    data = load_demo_data(find_hotpotqa_sample("auto"), val_questions=64)
    data.train, data.val, data.test, data.corpus
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.data.hotpotqa import flashrag_row, hotpotqa_corpus, missing_gold, read_raw
from searchr1.retrieval.corpus import Document, split_contents

SPLIT_FILES = ("train.jsonl", "dev.jsonl", "test.jsonl")
"""The files a sample folder must hold."""
TYPES = ("bridge", "comparison")
"""HotpotQA's two kinds of question (``metadata.type``)."""


@dataclass
class HotpotQAData:
    """The demo's rows (FlashRAG dicts) and corpus (``{"id", "contents"}`` passages)."""

    folder: Path
    train: list[dict[str, Any]]
    val: list[dict[str, Any]]
    test: list[dict[str, Any]]
    corpus: list[dict[str, str]]
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows left out because a test (or, for training, a validation) row has the same id or question."""
    missing: list[tuple[str, str]] = field(default_factory=list)
    """``(row id, title)`` of the gold paragraphs of train / val / test rows that the corpus lacks."""

    def counts(self) -> dict[str, Any]:
        """Questions per part and per type, passages, rows left out and gold paragraphs missing."""
        return {
            "train": len(self.train),
            "val": len(self.val),
            "test": len(self.test),
            "by_type": {name: type_counts(rows) for name, rows in self.parts().items()},
            "corpus": len(self.corpus),
            "dropped": dict(self.dropped),
            "missing_gold": len(self.missing),
        }

    def parts(self) -> dict[str, list[dict[str, Any]]]:
        return {"train": self.train, "val": self.val, "test": self.test}

    def write(self, folder: Path) -> dict[str, Path]:
        """``train.jsonl``, ``val.jsonl``, ``test.jsonl`` and ``corpus.jsonl`` in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        out = {}
        for name, rows in (*self.parts().items(), ("corpus", self.corpus)):
            path = folder / f"{name}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
            out[name] = path
        return out

    def retriever(self) -> Any:
        """BM25 (the project's ``bm25`` backend, its default settings) over the corpus, in memory."""
        from searchr1.retrieval.bm25 import BM25Retriever

        return BM25Retriever.from_documents(
            Document(p["id"], *split_contents(p["contents"])) for p in self.corpus
        )


def type_of(row: Mapping[str, Any]) -> str:
    """A FlashRAG row's HotpotQA type (``bridge`` / ``comparison``; ``""`` when absent)."""
    return str((row.get("metadata") or {}).get("type") or "")


def type_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        out[type_of(row)] = out.get(type_of(row), 0) + 1
    return out


def question_key(question: Any) -> str:
    """A question as compared across splits: spaces collapsed, case-folded."""
    return " ".join(str(question).split()).casefold()


def balanced_slice(rows: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` rows, half of each type in ``TYPES`` (the first ones in file order; when one type has too few,
    the other fills its place), kept in file order."""
    by_type = {t: [i for i, r in enumerate(rows) if type_of(r) == t] for t in TYPES}
    share = {t: n // len(TYPES) + (1 if k < n % len(TYPES) else 0) for k, t in enumerate(TYPES)}
    short = sum(max(0, share[t] - len(by_type[t])) for t in TYPES)
    chosen: list[int] = []
    for t in TYPES:
        take = min(share[t], len(by_type[t]))
        spare = len(by_type[t]) - take
        extra = min(spare, short)
        short -= extra
        chosen.extend(by_type[t][: take + extra])
    others = [i for i, r in enumerate(rows) if type_of(r) not in TYPES]  # rows of no known type come last
    chosen.extend(others[: max(0, n - len(chosen))])
    return [rows[i] for i in sorted(chosen)]


def _without(
    rows: Sequence[dict[str, Any]], seen: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], int]:
    """``rows`` less those whose id or question is one of ``seen``'s; and how many were left out."""
    ids = {str(r["id"]) for r in seen}
    questions = {question_key(r["question"]) for r in seen}
    kept = [r for r in rows if str(r["id"]) not in ids and question_key(r["question"]) not in questions]
    return kept, len(rows) - len(kept)


def check_sample_folder(folder: Path) -> None:
    """A ``ValueError`` naming the folder and the files it lacks."""
    missing = [name for name in SPLIT_FILES if not (folder / name).is_file()]
    if missing:
        raise ValueError(
            f"HotpotQA sample {folder}: no {', '.join(missing)} (it needs {', '.join(SPLIT_FILES)})"
        )


def load_demo_data(
    folder: str | Path, *, val_questions: int = 64, train_questions: int = 0, test_questions: int = 0
) -> HotpotQAData:
    """The split of the module docstring and the corpus of every paragraph of the sample in ``folder``."""
    folder = Path(folder)
    check_sample_folder(folder)
    raw = {name.removesuffix(".jsonl"): read_raw(folder / name) for name in SPLIT_FILES}
    rows = {name: [flashrag_row(r) for r in part] for name, part in raw.items()}
    test = rows["test"][: test_questions or None]
    dropped: dict[str, int] = {}
    # every test row, not only those evaluated, stays out of training and validation
    dev, dropped["dev"] = _without(rows["dev"], rows["test"])
    train, dropped["train"] = _without(rows["train"], rows["test"])
    val = balanced_slice(dev, val_questions)
    val_ids = {id(r) for r in val}
    train, dropped["train_as_val"] = _without(train + [r for r in dev if id(r) not in val_ids], val)
    train = train[: train_questions or None]
    corpus = hotpotqa_corpus(r for part in raw.values() for r in part)
    missing = missing_gold([*train, *val, *test], corpus)
    return HotpotQAData(folder, train, val, test, corpus, dropped, missing)


__all__ = [
    "SPLIT_FILES",
    "TYPES",
    "HotpotQAData",
    "balanced_slice",
    "check_sample_folder",
    "load_demo_data",
    "question_key",
    "type_counts",
    "type_of",
]
