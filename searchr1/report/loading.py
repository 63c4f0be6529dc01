"""What the report reads from a run folder or an ``eval`` output folder.

A training run folder holds ``metrics.jsonl`` (one JSON object per step with namespaced keys),
possibly ``validation/step_N/{summary.json,trajectories.jsonl}`` (written by ``evaluate``), and the
trainer's own ``trajectories.jsonl`` (a few rollouts per step: question, golden answers, response
text). An eval folder holds ``summary.json`` and ``trajectories.jsonl``. Whatever is missing is left
out of the page. The trainer's records carry text, not token roles: their roles are recovered from
the text (``<information>`` blocks and the invalid-action message are the masked observations).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.data.prompts import INFO_CLOSE, INFO_OPEN, INVALID_ACTION_MESSAGE
from searchr1.evaluation import STATE_FILE, SUMMARY_FILE, TRAJECTORIES_FILE, read_trajectories

METRICS_FILE = "metrics.jsonl"
VALIDATION_DIR = "validation"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class ReportError(ValueError):
    """The folder is not a run or eval folder; the message says what was expected."""


@dataclass
class Evaluation:
    """One evaluation: a validation step of a run, or an eval folder (step None)."""

    folder: Path
    step: int | None
    summary: dict[str, Any]


@dataclass
class RunData:
    folder: Path
    kind: str
    """run | eval"""
    metrics: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[Evaluation] = field(default_factory=list)
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    trajectories_from: Path | None = None
    trajectories_total: int = 0


def as_number(value: Any) -> float | None:
    """A metric value as float: numbers, booleans and the strings "nan"/"inf" that loggers write."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def read_metrics(path: Path) -> list[dict[str, float]]:
    """Numeric columns of each metrics.jsonl row (a truncated last line is skipped); ``step`` defaults
    to the row number."""
    rows = []
    if not path.is_file():
        return rows
    lines = path.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                continue  # a write in progress
            raise ReportError(f"{path}:{lineno}: not a JSON object ({exc.msg})") from exc
        if not isinstance(raw, dict):
            raise ReportError(f"{path}:{lineno}: expected a JSON object, got {type(raw).__name__}")
        row = {k: v for k, v in ((k, as_number(v)) for k, v in raw.items()) if v is not None}
        row.setdefault("step", float(len(rows)))
        rows.append(row)
    return rows


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(summary, dict) or "sources" not in summary:
        raise ReportError(f"{path}: not an evaluation summary (no 'sources')")
    return summary


def load_run(folder: str | Path, max_trajectories: int = 1000) -> RunData:
    """Read a run or eval folder. Trajectories come from the eval folder itself, or from the latest
    validation step that has them; at most ``max_trajectories`` are kept (the first ones)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReportError(f"run folder not found: {folder}")
    data = RunData(folder=folder, kind="run", metrics=read_metrics(folder / METRICS_FILE))
    is_eval = (folder / SUMMARY_FILE).is_file() or (folder / STATE_FILE).is_file()
    if is_eval:
        data.kind = "eval"
        if (folder / SUMMARY_FILE).is_file():
            data.evaluations.append(Evaluation(folder, None, _read_summary(folder / SUMMARY_FILE)))
        traj_dirs = [folder]
    else:
        steps = []
        val = folder / VALIDATION_DIR
        if val.is_dir():
            for sub in val.iterdir():
                m = _STEP_DIR.match(sub.name)
                if m and sub.is_dir():
                    steps.append((int(m.group(1)), sub))
        steps.sort()
        for step, sub in steps:
            if (sub / SUMMARY_FILE).is_file():
                data.evaluations.append(Evaluation(sub, step, _read_summary(sub / SUMMARY_FILE)))
        traj_dirs = [sub for _, sub in reversed(steps)] + [folder]  # the trainer's samples come last
    for sub in traj_dirs:
        if (sub / TRAJECTORIES_FILE).is_file():
            records = [as_eval_record(r) for r in read_trajectories(sub / TRAJECTORIES_FILE)]
            if sub == folder and not is_eval:  # training samples: the latest steps are the interesting ones
                records = records[-max_trajectories:]
            else:
                records = records[:max_trajectories]
            data.trajectories = records
            data.trajectories_total = sum(1 for _ in _lines(sub / TRAJECTORIES_FILE))
            data.trajectories_from = sub / TRAJECTORIES_FILE
            break
    if not data.metrics and not data.evaluations and not data.trajectories:
        raise ReportError(
            f"{folder} has nothing to report: expected {METRICS_FILE} and/or {VALIDATION_DIR}/step_N/ "
            f"(a training run) or {SUMMARY_FILE} + {TRAJECTORIES_FILE} (an eval output folder)"
        )
    return data


def _lines(path: Path) -> Iterable[str]:
    with open(path, encoding="utf-8") as fh:
        yield from (line for line in fh if line.strip())


_OBSERVATION = re.compile(
    r"(\n*"
    + re.escape(INFO_OPEN)
    + ".*?(?:"
    + re.escape(INFO_CLOSE)
    + r"\n*|\Z)|\n*"
    + re.escape(INVALID_ACTION_MESSAGE.strip())
    + r"\n*)",
    flags=re.DOTALL,
)


_DOC_LINE = re.compile(r"Doc \d+\(Title: (.*?)\) ?(.*)")


def text_segments(response: str) -> list[dict[str, Any]]:
    """Role segments of a response known only as text: observation blocks vs the model's own text."""
    segments = []
    for i, part in enumerate(_OBSERVATION.split(response)):
        if part:
            segments.append({"role": "observation" if i % 2 else "generated", "text": part, "tokens": 0})
    return segments


def as_eval_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A record in the ``evaluate`` layout; the trainer's per-step samples (``response`` text) are
    scored and split into role segments here."""
    if "segments" in rec:
        return rec
    from searchr1.evaluation import extract_answer, is_valid_format, score_answer

    response = str(rec.get("response", ""))
    golden = [str(g) for g in rec.get("golden_answers") or []]
    answer = extract_answer(response)
    scores = score_answer(answer, golden)
    scores["valid_format"] = float(is_valid_format(response))
    segments = text_segments(response)
    documents = [
        [{"title": t.strip(), "text": x.strip(), "score": None} for t, x in _DOC_LINE.findall(s["text"])]
        for s in segments
        if s["role"] == "observation" and INFO_OPEN in s["text"]
    ]
    queries = re.findall(
        r"<search>(.*?)</search>",
        "".join(s["text"] for s in segments if s["role"] == "generated"),
        flags=re.DOTALL,
    )
    return {
        "id": f"step {rec.get('step', '?')}",
        "step": rec.get("step"),
        "question": rec.get("question") or "",
        "golden_answers": golden,
        "data_source": rec.get("data_source") or "train",
        "answer": answer,
        "scores": scores,
        "correct": scores["em"] == 1.0,
        "searches": int(rec.get("searches", len(queries))),
        "turns": int(rec.get("turns", 0)),
        "truncated": rec.get("finish_reason") in ("truncated", "length"),
        "finish_reason": rec.get("finish_reason", ""),
        "queries": [q.strip() for q in queries],
        "documents": documents,
        "segments": segments,
        "roles_from_text": True,
    }


def compact_trajectory(rec: dict[str, Any]) -> dict[str, Any]:
    """The fields the browser shows, with short keys (the page embeds every one of them)."""
    scores = rec.get("scores", {})
    segments = rec.get("segments", [])
    tokens = {"prompt": 0, "generated": 0, "observation": 0}
    for s in segments:
        tokens[s["role"]] = tokens.get(s["role"], 0) + int(s.get("tokens", 0))
    return {
        "id": rec.get("id", ""),
        "source": rec.get("data_source", "unknown"),
        "question": rec.get("question", ""),
        "golden": list(rec.get("golden_answers", [])),
        "answer": rec.get("answer"),
        "correct": bool(rec.get("correct", scores.get("em", 0.0) == 1.0)),
        "em": _finite(scores.get("em")),
        "sub_em": _finite(scores.get("sub_em")),
        "f1": _finite(scores.get("f1")),
        "valid": bool(scores.get("valid_format", 0.0)),
        "searches": int(rec.get("searches", 0)),
        "turns": int(rec.get("turns", 0)),
        "truncated": bool(rec.get("truncated", False)),
        "finish": rec.get("finish_reason", ""),
        "queries": list(rec.get("queries", [])),
        "documents": [
            [
                {"title": h.get("title", ""), "text": h.get("text", ""), "score": _finite(h.get("score"))}
                for h in hits
            ]
            for hits in rec.get("documents", [])
        ],
        "segments": [[s["role"], s["text"], int(s.get("tokens", 0))] for s in segments],
        "step": rec.get("step"),
        "text_roles": bool(rec.get("roles_from_text", False)),
        "tokens": tokens,
    }


def _finite(value: Any) -> float | None:
    v = as_number(value)
    return v if v is not None and math.isfinite(v) else None
