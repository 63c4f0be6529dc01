"""The files of an evaluation, written batch by batch so that an interrupted run is resumed.

    OUT/                       one folder per ``searchr1 eval`` run
      results.json             every mode's summary and the paper-layout tables
      table.md                 the paper-layout table (methods x datasets), as printed
      <mode>/                  one folder per mode (``evaluate(out_dir=OUT/<mode>)``)
        eval_state.json        what identifies the run (mode, model, data, samples, settings)
        trajectories.jsonl     one record per question, appended after every batch
        summary.json           per-source metrics, written when the mode is complete

A rerun into the same folder keeps the records already written and generates only the missing
questions (and those whose searches failed: a search server that was down is retried); it refuses a
folder that holds a different run, naming the setting that differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from searchr1.evaluation.errors import EvaluationError

SUMMARY_FILE = "summary.json"
TRAJECTORIES_FILE = "trajectories.jsonl"
STATE_FILE = "eval_state.json"
RESULTS_FILE = "results.json"
TABLE_FILE = "table.md"


def read_trajectories(path: str | Path, repair: bool = False) -> list[dict[str, Any]]:
    """Records of a ``trajectories.jsonl``. A truncated last line (an interrupted write) is ignored,
    and with ``repair`` cut from the file; a malformed line elsewhere raises naming file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(end)
    records = []
    for lineno, line in enumerate(data[:end].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise EvaluationError(f"{path}:{lineno}: not a JSON record ({exc.msg})") from exc
    return records


def latest_by_index(records: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The last record written for each sample index (a retried question replaces its first try)."""
    return {int(r["index"]): r for r in records}


def samples_fingerprint(views: Sequence[dict[str, Any]]) -> str:
    """A short hash of the questions (id, question, source, golden answers) in order."""
    h = hashlib.sha256()
    for s in views:
        h.update(json.dumps([s["id"], s["question"], s["data_source"], s["golden_answers"]]).encode())
    return h.hexdigest()[:16]


def check_resumable(out: Path, state: dict[str, Any]) -> bool:
    """Whether ``out`` holds a run to resume (False: nothing there); a different run there is an
    error naming the setting that differs. Reads only."""
    path = out / STATE_FILE
    if not path.is_file():
        return False
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"{path}: not valid JSON ({exc.msg}); remove it or use --no-resume") from None
    for key, value in state.items():
        if old.get(key) != value:
            raise EvaluationError(
                f"{out} holds a run with a different {key} ({old.get(key)!r}, now {value!r}); "
                "use another output folder or turn resuming off (--no-resume) to overwrite it"
            )
    return True


def open_run(out: Path, state: dict[str, Any], resume: bool) -> dict[int, dict[str, Any]]:
    """Create or resume the mode folder ``out`` for the run described by ``state``; returns the
    records already written (by sample index). Without ``resume`` an old run is overwritten."""
    out.mkdir(parents=True, exist_ok=True)
    if resume and check_resumable(out, state):
        return latest_by_index(read_trajectories(out / TRAJECTORIES_FILE, repair=True))
    for name in (TRAJECTORIES_FILE, SUMMARY_FILE):
        (out / name).unlink(missing_ok=True)
    write_json_atomic(out / STATE_FILE, state)
    return {}


def append_records(out: Path, records: Sequence[dict[str, Any]]) -> None:
    """Append records to ``out/trajectories.jsonl`` and flush them to disk."""
    with open(out / TRAJECTORIES_FILE, "a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def rewrite_records(out: Path, records: Sequence[dict[str, Any]]) -> None:
    """Replace ``out/trajectories.jsonl`` by ``records`` (atomically): one line per question once a
    retry has appended a second record for it."""
    tmp = out / (TRAJECTORIES_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / TRAJECTORIES_FILE)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_summary(path: Path) -> dict[str, Any]:
    """A ``summary.json``; an unreadable or foreign file is an error naming it."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(summary, dict) or "sources" not in summary:
        raise EvaluationError(f"{path}: not an evaluation summary (no 'sources')")
    return summary


def mode_summaries(folder: Path) -> dict[str, dict[str, Any]]:
    """The complete summaries of an eval folder by mode: its mode subfolders', or its own (a folder
    written by ``evaluate`` directly, or by an older version)."""
    folder = Path(folder)
    if (folder / SUMMARY_FILE).is_file():
        summary = read_summary(folder / SUMMARY_FILE)
        return {str(summary.get("mode", folder.name)): summary}
    found: dict[str, dict[str, Any]] = {}
    if folder.is_dir():
        for sub in sorted(p for p in folder.iterdir() if (p / SUMMARY_FILE).is_file()):
            summary = read_summary(sub / SUMMARY_FILE)
            found[str(summary.get("mode", sub.name))] = summary
    return found


def load_results(path: str | Path) -> dict[str, dict[str, Any]]:
    """Summaries by mode of an eval output folder: those of its ``results.json`` (the modes of one
    consistent run, as its table shows them), else its complete mode folders; for ``--compare`` and
    the report. A path with no results is a one-line error naming it."""
    path = Path(path)
    if path.is_file() and path.name == RESULTS_FILE:
        path = path.parent
    if not path.exists():
        raise EvaluationError(f"{path}: eval folder not found")
    if (path / RESULTS_FILE).is_file():
        try:
            results = json.loads((path / RESULTS_FILE).read_text(encoding="utf-8"))
            summaries = dict(results["summaries"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise EvaluationError(f"{path / RESULTS_FILE}: not a results file of `searchr1 eval`") from None
    else:
        summaries = mode_summaries(path)
    if not summaries:
        raise EvaluationError(
            f"{path}: no evaluation results here (expected {RESULTS_FILE} or <mode>/{SUMMARY_FILE} "
            f"from `searchr1 eval`, or {SUMMARY_FILE})"
        )
    return summaries
