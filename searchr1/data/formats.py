"""Dataset formats: FlashRAG jsonl, Search-R1 / veRL parquet and Hugging Face hub datasets, all
read into one in-memory type, ``Sample``.

FlashRAG jsonl row::

    {"id": "test_0", "question": "...", "golden_answers": ["..."], "metadata": {...}}

Search-R1 / veRL parquet row (the FlashRAG columns are kept next to these, as Search-R1 does)::

    {"data_source": "nq", "prompt": [{"role": "user", "content": "<instruction> Question: ...?\\n"}],
     "ability": "fact-reasoning", "reward_model": {"style": "rule", "ground_truth": {"target": [...]}},
     "extra_info": {"split": "train", "index": 0}}

``load_samples`` is the one entry point of the trainer and the evaluation:

    samples = load_samples("data/nq_test.jsonl", split="test")          # FlashRAG jsonl
    samples = load_samples("data/train.parquet")                         # Search-R1 parquet
    samples = load_samples("RUC-NLPIR/FlashRAG_datasets:nq", split="test")  # hub (datasets.load_dataset)

Bad rows (missing / empty question, missing or empty answers, wrong types, broken JSON) raise
``DataError`` naming the file and row, or with ``skip_bad=True`` are skipped and counted in a
``LoadStats``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from searchr1.data.prompts import build_prompt, prompt_messages, render_messages, resolve_template
from searchr1.data.supporting import question_kind, supporting_meta

BENCHMARK_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
"""The seven QA benchmarks of the Search-R1 paper (names as in FlashRAG_datasets)."""
ABILITY = "fact-reasoning"
SPLITS = ("train", "val", "dev", "test")


class DataError(ValueError):
    """A dataset row or file is unusable; the message names the file and the row."""


@dataclass
class LoadStats:
    """What a load saw: rows read, rows skipped and why (with ``skip_bad=True``)."""

    rows: int = 0
    skipped: int = 0
    messages: list[str] = field(default_factory=list)


@dataclass
class Sample:
    """One question with its golden answers, wherever it came from."""

    id: str
    question: str
    golden_answers: list[str]
    data_source: str = "custom"
    group_index: int = 0
    """Unique per question within a dataset (merged datasets included): the GRPO group id."""
    split: str = "train"
    prompt_messages: list[dict[str, str]] | None = None
    """Chat messages of the prompt when the file stored them (parquet); else built from the template."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def messages(self, template: str = "base") -> list[dict[str, str]]:
        """The stored prompt messages, or the template's messages for this question."""
        return self.prompt_messages or prompt_messages(self.question, template)

    def prompt(self, template: str = "base", tokenizer: Any = None) -> str:
        """The prompt text for the policy (see ``searchr1.data.prompts.build_prompt``)."""
        template = resolve_template(template, tokenizer)
        return render_messages(self.messages(template), template, tokenizer)

    def meta(self) -> dict[str, Any]:
        """What the rollout carries in ``Trajectory.meta`` (the reward reads ``golden_answers``; the step
        reward the gold passages, ``supporting_ids`` / ``supporting_titles``, where the row names them)."""
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "data_source": self.data_source,
            "group_index": self.group_index,
            "index": self.group_index,
            "split": self.split,
            **supporting_meta(self.metadata, self.data_source),
        }

    def to_flashrag(self) -> dict[str, Any]:
        meta = {**self.metadata}
        meta.setdefault("data_source", self.data_source)
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "metadata": meta,
        }

    def to_parquet_row(self, template: str = "base") -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "data_source": self.data_source,
            "prompt": [dict(m) for m in self.messages(template)],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": {"target": list(self.golden_answers)}},
            "extra_info": {"split": self.split, "index": int(self.group_index)},
            "metadata": json.dumps(self.metadata, ensure_ascii=False, sort_keys=True),
        }


# ---------------------------------------------------------------------------------------------
# row parsing
# ---------------------------------------------------------------------------------------------


def _to_python(value: Any) -> Any:
    """numpy arrays / scalars from pyarrow or datasets -> plain Python."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _answers(value: Any, where: str) -> list[str]:
    value = _to_python(value)
    if value is None:
        raise DataError(f"{where}: missing golden answers")
    if not isinstance(value, list):
        raise DataError(f"{where}: golden answers must be a list of strings, got {type(value).__name__}")
    out = []
    for i, a in enumerate(value):
        if isinstance(a, bool) or not isinstance(a, str | int | float):
            raise DataError(f"{where}: golden answer {i} must be a string, got {type(a).__name__}")
        if str(a).strip():
            out.append(str(a))
    if not out:
        raise DataError(f"{where}: empty golden answers")
    return out


def _question_from_prompt(messages: list[dict[str, str]]) -> str:
    content = next(
        (m["content"] for m in reversed(messages) if m.get("role") == "user"), messages[-1]["content"]
    )
    marker = "Question:"
    if marker in content:
        return content.rsplit(marker, 1)[1].strip()
    return content.strip()


def parse_row(
    obj: Any, where: str, source: str | None = None, split: str = "train", index: int = 0
) -> Sample:
    """A ``Sample`` from a FlashRAG row or a Search-R1 parquet row (detected by its keys)."""
    if not isinstance(obj, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    messages = None
    if obj.get("prompt") is not None:
        messages = _to_python(obj["prompt"])
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in messages)
        ):
            raise DataError(f"{where}: 'prompt' must be a non-empty list of chat messages")
        messages = [{"role": str(m.get("role", "user")), "content": m["content"]} for m in messages]
    question = obj.get("question")
    if question is None and messages:
        question = _question_from_prompt(messages)
    if question is None:
        raise DataError(f"{where}: missing 'question'")
    if not isinstance(question, str):
        raise DataError(f"{where}: 'question' must be a string, got {type(question).__name__}")
    if not question.strip():
        raise DataError(f"{where}: empty 'question'")
    if obj.get("golden_answers") is not None:
        answers = _answers(obj["golden_answers"], where)
    elif isinstance(obj.get("reward_model"), Mapping):
        truth = obj["reward_model"].get("ground_truth") or {}
        target = truth.get("target") if isinstance(truth, Mapping) else truth
        target = _to_python(target)
        answers = _answers([target] if isinstance(target, str) else target, where)
    else:
        raise DataError(f"{where}: missing 'golden_answers'")
    metadata = obj.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata else {}
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: 'metadata' is not valid JSON: {exc}") from exc
    metadata = dict(metadata or {}) if isinstance(metadata, Mapping) else {}
    extra = obj.get("extra_info") if isinstance(obj.get("extra_info"), Mapping) else {}
    data_source = source or obj.get("data_source") or metadata.get("data_source") or "custom"
    group_index = extra.get("index", index)
    return Sample(
        id=str(obj.get("id") if obj.get("id") is not None else f"{data_source}_{split}_{index}"),
        question=question.strip(),
        golden_answers=answers,
        data_source=str(data_source),
        group_index=int(group_index) if group_index is not None else index,
        split=str(extra.get("split") or split),
        prompt_messages=messages,
        metadata=metadata,
    )


def _collect(
    rows: Iterable[tuple[str, Any]], source: str | None, split: str, skip_bad: bool, stats: LoadStats | None
) -> list[Sample]:
    stats = stats if stats is not None else LoadStats()
    out: list[Sample] = []
    for where, obj in rows:
        stats.rows += 1
        try:
            if isinstance(obj, DataError):
                raise obj
            out.append(parse_row(obj, where, source, split, index=len(out)))
        except DataError as exc:
            if not skip_bad:
                raise
            stats.skipped += 1
            stats.messages.append(str(exc))
    return out


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------


def infer_source(path: str | Path) -> str:
    """The benchmark a file belongs to from its name (``nq_test.jsonl`` -> ``nq``), else its stem."""
    stem = Path(path).name.split(".")[0].lower()
    for name in sorted(BENCHMARK_SOURCES, key=len, reverse=True):
        if stem == name or stem.startswith((name + "_", name + "-")):
            return name
    return stem


def jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, DataError(f"{where}: invalid JSON: {exc.msg}")


def read_flashrag_jsonl(
    path: str | Path,
    source: str | None = None,
    split: str = "train",
    skip_bad: bool = False,
    stats: LoadStats | None = None,
) -> list[Sample]:
    """Read a FlashRAG-style jsonl file (also the synthetic world's question files)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    return _collect(jsonl_rows(path), source, split, skip_bad, stats)


def write_flashrag_jsonl(samples: Iterable[Sample], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for s in samples:
            f.write(json.dumps(s.to_flashrag(), ensure_ascii=False) + "\n")
    return path


def read_parquet(
    path: str | Path,
    source: str | None = None,
    split: str = "train",
    skip_bad: bool = False,
    stats: LoadStats | None = None,
) -> list[Sample]:
    """Read a Search-R1 / veRL training parquet (or any parquet with FlashRAG columns)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise DataError(f"dataset file not found: {path}")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a broken file
        raise DataError(f"{path}: not a readable parquet file: {exc}") from exc
    return _collect(((f"{path}:row {i}", r) for i, r in enumerate(rows)), source, split, skip_bad, stats)


def write_parquet(samples: Iterable[Sample], path: str | Path, template: str = "base") -> Path:
    """Write the Search-R1 / veRL training parquet (pyarrow)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [s.to_parquet_row(template) for s in samples]
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("question", pa.string()),
            ("golden_answers", pa.list_(pa.string())),
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            (
                "reward_model",
                pa.struct(
                    [("style", pa.string()), ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))]
                ),
            ),
            ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
            ("metadata", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def write_samples(samples: list[Sample], path: str | Path, template: str = "base") -> Path:
    """Write ``.parquet`` (Search-R1) or ``.jsonl`` (FlashRAG) by the file's extension."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return write_parquet(samples, path, template)
    if suffix in (".jsonl", ".json"):
        return write_flashrag_jsonl(samples, path)
    raise DataError(f"{path}: output must end with .parquet or .jsonl")


# ---------------------------------------------------------------------------------------------
# the one entry point
# ---------------------------------------------------------------------------------------------


def load_hub_dataset(
    name: str,
    split: str = "train",
    config: str | None = None,
    source: str | None = None,
    skip_bad: bool = False,
    stats: LoadStats | None = None,
    **load_kwargs: Any,
) -> list[Sample]:
    """Load through ``datasets.load_dataset(name, config, split=split)`` (a hub id, a local dataset
    folder, or a builder such as ``json`` with ``data_files=``). FlashRAG_datasets uses the
    benchmark name as config: ``load_hub_dataset("RUC-NLPIR/FlashRAG_datasets", "test", "nq")``."""
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=split, **load_kwargs)
    except Exception as exc:  # network, missing config, unknown split...
        raise DataError(f"cannot load dataset {name!r} (config {config!r}, split {split!r}): {exc}") from exc
    src = source or (config if config in BENCHMARK_SOURCES else None)
    label = f"{name}{':' + config if config else ''}[{split}]"
    return _collect(((f"{label}:row {i}", row) for i, row in enumerate(ds)), src, split, skip_bad, stats)


def sample_meta(sample: Sample | Mapping[str, Any], index: int) -> dict[str, Any]:
    """What travels with a trajectory (``Trajectory.meta``) for a ``Sample`` or a FlashRAG-style dict:
    question, golden answers, source, ids, the gold passages where the row names them
    (``searchr1.data.supporting``), and ``sample_index`` (its position in the training data)."""
    if isinstance(sample, Sample):
        meta = sample.meta()
    else:
        meta = {
            "id": sample.get("id", str(index)),
            "question": sample.get("question", ""),
            "golden_answers": list(sample.get("golden_answers", []) or []),
            "data_source": sample.get("data_source"),
            **supporting_meta(sample.get("metadata"), str(sample.get("data_source") or "")),
        }
    meta["data_source"] = meta.get("data_source") or "default"
    meta["sample_index"] = index
    return meta


def sample_kind(sample: Sample | Mapping[str, Any]) -> str:
    """``single-hop`` or ``multi-hop`` (``searchr1.data.supporting.question_kind``) of a ``Sample`` or a
    FlashRAG-style dict."""
    if isinstance(sample, Sample):
        return question_kind(sample.metadata, sample.data_source)
    metadata = sample.get("metadata") or {}
    return question_kind(metadata, str(sample.get("data_source") or metadata.get("data_source") or ""))


def sample_prompt(sample: Sample | Mapping[str, Any], template: str, tokenizer: Any) -> str:
    """The prompt the policy continues: a ``Sample``'s (its stored chat messages, else the template),
    or the template over a dict's question."""
    if isinstance(sample, Sample):
        return sample.prompt(template, tokenizer)
    return build_prompt(str(sample.get("question", "")), template, tokenizer)


def load_samples(
    path_or_name: str | Path,
    split: str = "train",
    source: str | None = None,
    skip_bad: bool = False,
    stats: LoadStats | None = None,
    limit: int | None = None,
    **hub_kwargs: Any,
) -> list[Sample]:
    """Samples from a ``.jsonl`` / ``.parquet`` file, or else a hub dataset ``name[:config]``.

    ``source`` overrides the data source (default: the row's ``data_source`` / metadata, else the
    benchmark named by the file name, else ``custom``). ``limit`` keeps the first rows.
    """
    path = Path(path_or_name)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            samples = read_parquet(path, source, split, skip_bad, stats)
        elif suffix in (".jsonl", ".json"):
            src = source or (infer_source(path) if infer_source(path) in BENCHMARK_SOURCES else None)
            samples = read_flashrag_jsonl(path, src, split, skip_bad, stats)
        else:
            raise DataError(f"{path}: unknown dataset format (expected .jsonl or .parquet)")
    elif path.suffix.lower() in (".jsonl", ".json", ".parquet"):
        raise DataError(f"dataset file not found: {path}")
    else:  # a hub id (optionally ``name:config``) or a local dataset folder
        name, config = str(path_or_name), None
        if ":" in name and not path.exists():
            name, config = name.rsplit(":", 1)
        samples = load_hub_dataset(name, split, config, source, skip_bad, stats, **hub_kwargs)
    return samples[:limit] if limit is not None else samples


def merge_samples(groups: Iterable[list[Sample]], shuffle: bool = False, seed: int = 0) -> list[Sample]:
    """Concatenate several sources with ``group_index`` renumbered 0..N-1 over the whole result
    (Search-R1's merge restarts the index per source, so GRPO groups would mix questions) and ids
    made unique (prefixed with the source when two sources share an id)."""
    merged = [s for group in groups for s in group]
    if shuffle:
        random.Random(seed).shuffle(merged)
    seen: set[str] = set()
    out = []
    for i, s in enumerate(merged):
        new_id = s.id
        if new_id in seen:
            new_id = f"{s.data_source}/{s.id}"
        k = 1
        while new_id in seen:
            k += 1
            new_id = f"{s.data_source}/{s.id}#{k}"
        seen.add(new_id)
        out.append(replace(s, id=new_id, group_index=i))
    return out
