"""What the report reads from a run folder or an ``eval`` output folder.

A training run folder holds ``metrics.jsonl`` (one JSON object per step with namespaced keys),
possibly ``validation/step_N/{summary.json,trajectories.jsonl}`` (written by ``evaluate``), and the
trainer's own ``trajectories.jsonl`` (a few rollouts per step, in the eval record layout). An eval
folder holds one ``<mode>/`` folder per mode (``summary.json``, ``trajectories.jsonl``) and
``results.json``, or (written by ``evaluate`` directly) ``summary.json`` and ``trajectories.jsonl``
itself. Whatever is missing is left out of the page. Records of older versions that carry text,
not token roles, get their roles recovered from the text (``<information>`` blocks and the
invalid-action message are the masked observations).
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
from searchr1.evaluation.errors import EvaluationError
from searchr1.evaluation.store import (
    RESULTS_FILE,
    STATE_FILE,
    SUMMARY_FILE,
    TRAJECTORIES_FILE,
    load_results,
    mode_summaries,
    read_summary,
    read_trajectories,
)
from searchr1.evaluation.tables import ordered_modes
from searchr1.rewards.format import is_valid_format
from searchr1.rewards.text import answer_scores, read_answer

METRICS_FILE = "metrics.jsonl"
VALIDATION_DIR = "validation"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class ReportError(ValueError):
    """The folder is not a run or eval folder; the message says what was expected."""


@dataclass
class Evaluation:
    """One evaluation: a validation step of a run, or one mode of an eval folder (step None)."""

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
    """Validation steps in order (a run), or the modes in the paper's order (an eval folder)."""
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
        return read_summary(path)
    except EvaluationError as exc:
        raise ReportError(str(exc)) from None


def _mode_folders(folder: Path) -> list[Path]:
    """The mode folders of an eval output folder (``<mode>/eval_state.json``), in the paper's order."""
    subs = {p.name: p for p in folder.iterdir() if p.is_dir() and (p / STATE_FILE).is_file()}
    return [subs[name] for name in ordered_modes(sorted(subs))]


def load_run(folder: str | Path, max_trajectories: int = 1000) -> RunData:
    """Read a run or eval folder. Trajectories come from the eval folder itself, or from the latest
    validation step that has them; at most ``max_trajectories`` are kept (the first ones)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReportError(f"run folder not found: {folder}")
    data = RunData(folder=folder, kind="run", metrics=read_metrics(folder / METRICS_FILE))
    single = (folder / SUMMARY_FILE).is_file() or (folder / STATE_FILE).is_file()
    modes = [] if single else _mode_folders(folder)
    if single or modes or (folder / RESULTS_FILE).is_file():
        data.kind = "eval"
        traj_dirs = [folder] if single else modes
        try:  # an interrupted run has trajectories and no summary yet: the page shows what there is
            summaries = load_results(folder) if (folder / RESULTS_FILE).is_file() else mode_summaries(folder)
        except EvaluationError as exc:
            raise ReportError(str(exc)) from None
        by_name = {sub.name: sub for sub in traj_dirs}
        data.evaluations = [
            Evaluation(by_name.get(mode, folder), None, summary) for mode, summary in summaries.items()
        ]
        share = -(-max_trajectories // max(1, len(traj_dirs)))  # every mode gets its share of the page
        for sub in traj_dirs:
            if (sub / TRAJECTORIES_FILE).is_file():
                records = [as_eval_record(r) for r in read_trajectories(sub / TRAJECTORIES_FILE)]
                data.trajectories += records[:share]
                data.trajectories_total += len(records)
                data.trajectories_from = sub / TRAJECTORIES_FILE if single else folder
        data.trajectories = data.trajectories[:max_trajectories]
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
                if sub == folder:  # training samples: the latest steps are the interesting ones
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
            f"(a training run) or <mode>/{SUMMARY_FILE} + {TRAJECTORIES_FILE} (an eval output folder)"
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
    """A record in the ``trajectory_record`` layout; a record of an older trainer (``response`` text,
    no token roles) is split into role segments by its text and scored here."""
    if "segments" in rec:
        return rec
    response = str(rec.get("response", ""))
    golden = [str(g) for g in rec.get("golden_answers") or []]
    segments = text_segments(response)
    answer, source = read_answer([s["text"] for s in segments if s["role"] == "generated"])
    scores = answer_scores(answer, golden)
    scores["valid_format"] = float(is_valid_format(response))
    scores["tagged"] = float(source == "tag")
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
        "mode": rec.get("mode", ""),
        "question": rec.get("question", ""),
        "golden": list(rec.get("golden_answers", [])),
        "answer": rec.get("answer"),
        "correct": bool(rec.get("correct", scores.get("em", 0.0) == 1.0)),
        "em": _finite(scores.get("em")),
        "sub_em": _finite(scores.get("sub_em")),
        "f1": _finite(scores.get("f1")),
        "valid": bool(scores.get("valid_format", 0.0)),
        "answer_source": rec.get("answer_source", ""),
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
