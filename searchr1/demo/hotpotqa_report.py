"""The HotpotQA demo's numbers: one row per evaluation, RL rows over seeds, ``summary.json``, the printed
table and the results file (``--write-results``, ``benchmarks/results/hotpotqa_rl.json``).

A row's ``searches_bridge`` / ``searches_comparison`` (and ``em_bridge`` / ``em_comparison``) are means over
the test questions of that HotpotQA type; an RL row's numbers are means over its seeds, with
``em_by_seed``, ``em_mean`` and ``em_std`` (the sample standard deviation over seeds, 0 for one seed).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from searchr1.demo.hotpotqa_data import TYPES, type_of
from searchr1.demo.summary import per_group

ROW_KEYS = ("em", "f1", "valid_format", "searches_bridge", "searches_comparison")
"""The keys every row has (and the results file keeps), beside ``minutes``."""
MEANS = (*ROW_KEYS, "searches", *(f"em_{t}" for t in TYPES))
"""What an RL row averages over its seeds."""
LABELS = {
    "direct": "starting model, no retrieval",
    "rag": "starting model, top-k retrieval then answer",
    "agent": "starting model in the search loop",
    "warm": "warm start alone (SFT on gold paths)",
    "rl": "RL alone from the starting model",
    "warm_rl": "warm start + RL",
}
"""What each row is, in the table's order."""
ROWS = tuple(LABELS)
"""The rows of the HotpotQA demo, in the table's order."""


def row_metrics(summary: dict[str, Any], test: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    """One evaluation's row: overall EM, F1, valid format and searches, and EM and searches per type (None
    for a type the test questions lack)."""
    overall = summary["overall"]
    groups = per_group(test, folder / "trajectories.jsonl", type_of)
    row: dict[str, Any] = {k: float(overall[k]) for k in ("em", "f1", "valid_format", "searches")}
    for kind in TYPES:
        g = groups.get(kind)
        row[f"searches_{kind}"] = g["searches"] if g else None
        row[f"em_{kind}"] = g["em"] if g else None
    row["questions"] = len(test)
    return row


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and not math.isnan(v)]
    return sum(numbers) / len(numbers) if numbers else None


def seed_rows(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """An RL row from its runs by seed: the means of ``MEANS``, ``em_by_seed``, ``em_mean``, ``em_std`` and
    each seed's row under ``seeds``."""
    runs = [per_seed[s] for s in sorted(per_seed)]
    row: dict[str, Any] = {k: _mean([r.get(k) for r in runs]) for k in MEANS}
    ems = [float(r["em"]) for r in runs]
    row["em_by_seed"] = {str(s): float(per_seed[s]["em"]) for s in sorted(per_seed)}
    row["em_mean"] = sum(ems) / len(ems)
    row["em_std"] = statistics.stdev(ems) if len(ems) > 1 else 0.0
    row["questions"] = runs[0].get("questions")
    row["seeds"] = {str(s): per_seed[s] for s in sorted(per_seed)}
    return row


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str) -> dict[str, Any]:
    """Where the rows ran: CPU model and cores, the GPU's name when the device is CUDA, torch's version."""
    import torch

    gpu = None
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model(), "cores": cores, "gpu": gpu, "device": device, "torch": torch.__version__}


def _num(value: Any, width: int, digits: int = 3) -> str:
    return f"{value:>{width}.{digits}f}" if isinstance(value, int | float) else f"{'-':>{width}}"


def format_table(summary: dict[str, Any]) -> str:
    """The rows as a table: EM, F1, valid format, searches per type, EM by seed, minutes."""
    head = (f"{'row':<8} {'EM':>6} {'F1':>6} {'valid':>6} {'searches':>9} {'':>10}  {'EM by seed':<24} "
            f"{'min':>5}  what")  # fmt: skip
    sub = f"{'':<8} {'':>6} {'':>6} {'':>6} {'bridge':>9} {'comparison':>10}"
    lines = [head, sub, "-" * len(head)]
    for name, row in summary["rows"].items():
        seeds = ""
        if "em_by_seed" in row:
            ems = " ".join(f"{v:.3f}" for v in row["em_by_seed"].values())
            seeds = f"{ems} (±{row['em_std']:.3f})" if len(row["em_by_seed"]) > 1 else ems
        lines.append(
            f"{name:<8} {_num(row['em'], 6)} {_num(row['f1'], 6)} {_num(row['valid_format'], 6, 2)} "
            f"{_num(row['searches_bridge'], 9, 2)} {_num(row['searches_comparison'], 10, 2)}  {seeds:<24} "
            f"{_num(row.get('minutes'), 5, 1)}  {LABELS.get(name, '')}"
        )
    return "\n".join(lines)


def print_report(summary: dict[str, Any], out: Path) -> None:
    d = summary["data"]
    print(f"\nHotpotQA sample: {d['test']} test questions ({d['by_type']['test']}), trained on {d['train']}, "
          f"validated on {d['val']}; BM25 over {d['corpus']} passages, top-{summary['recipe']['retrieval.topk']}")  # fmt: skip
    print(format_table(summary))
    print(f"\nsummary: {out / 'summary.json'}")


def results_file(summary: dict[str, Any]) -> dict[str, Any]:
    """The shape of ``benchmarks/results/hotpotqa_rl.json``: each row's numbers, minutes and the command that
    runs it alone; the whole command, the machine, the model, the split and the budgets."""
    command = summary["command"]
    rows = {}
    for name, row in summary["rows"].items():
        kept = {k: row.get(k) for k in ROW_KEYS}
        for key in ("em_by_seed", "em_mean", "em_std", "em_bridge", "em_comparison", "questions"):
            if key in row:
                kept[key] = row[key]
        kept["minutes"] = row.get("minutes")
        kept["command"] = f"{command} --rows {name}" if command else ""
        rows[name] = kept
    return {
        "benchmark": "hotpotqa_rl",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": command,
        "machine": summary["machine"],
        "model": summary["starting_model"]["name"],
        "quick": summary["settings"]["quick"],
        "seeds": summary["settings"]["seeds"],
        "overrides": summary["settings"]["overrides"],
        "recipe": summary["recipe"],
        "data": summary["data"],
        "rows": rows,
        "minutes": summary["seconds"] / 60,
    }
