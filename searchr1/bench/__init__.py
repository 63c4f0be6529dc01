"""Benchmarks: each module measures a speed or memory target as a ratio against a baseline run
in the same process, prints a table, and writes ``benchmarks/results/NAME.json`` with its
parameters, its measurements and its ``headline`` ratio.

A benchmark module defines ``add_arguments(parser)`` (optional) and ``run(args) -> BenchResult``.
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class BenchResult:
    name: str
    params: dict[str, Any]
    rows: list[dict[str, Any]]
    """One dict per measured setting; printed as a table and stored under ``measurements``."""
    headline: float
    """The ratio the benchmark's target is about."""
    headline_label: str
    """What the headline means, e.g. 'server / in-process queries/s at batch 128 (target >= 0.8)'."""
    extra: dict[str, Any] = field(default_factory=dict)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table with one column per key of the rows."""
    if not rows:
        return "(no rows)"
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def report(result: BenchResult, out_dir: str | Path = "benchmarks/results") -> Path:
    """Print the table and headline, and write the JSON file; returns its path."""
    print(format_table(result.rows))
    print(f"\nheadline: {result.headline:.3f}  ({result.headline_label})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result.name}.json"
    payload = {
        "name": result.name,
        "headline": result.headline,
        "headline_label": result.headline_label,
        "params": result.params,
        "measurements": result.rows,
        **result.extra,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path.write_text(json.dumps(strict_json(payload), indent=2, default=str, allow_nan=False) + "\n")
    print(f"wrote {path}")
    return path


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float (a ratio with nothing measured) as ``None``: strict JSON,
    which ``NaN`` is not."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
