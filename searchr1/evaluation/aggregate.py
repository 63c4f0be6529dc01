"""Per-source averages of the per-trajectory records: the numbers of one evaluation.

For a group G of records (one data source, or all of them):

    metric(G) = (1 / |G|) * sum_{r in G} r.metric        for every name in ``METRICS``
    search_failures(G) = sum_{r in G} r.search_failures  (a count, not a mean)

``overall`` is over all samples (micro average); the paper's "Avg." column, the mean over data
sources (macro average), is computed by ``searchr1.evaluation.tables``. A record without a metric
(written by an older version) is left out of that metric's mean; a metric no record has is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

METRICS = ("em", "sub_em", "f1", "valid_format", "tagged", "searches", "turns", "truncated")
"""Per-source means in the summary, in table order."""
COUNTS = ("search_failures",)
"""Per-source totals in the summary."""
SCORE_KEYS = ("em", "sub_em", "f1", "valid_format", "tagged")
"""Metrics read from a record's ``scores``; the others are its own fields."""


def record_values(rec: dict[str, Any]) -> dict[str, float]:
    """The metrics one record contributes (missing ones are absent)."""
    scores = rec.get("scores") or {}
    out = {m: float(scores[m]) for m in SCORE_KEYS if m in scores}
    for m in ("searches", "turns", "truncated", "search_failures"):
        if m in rec:
            out[m] = float(rec[m])
    return out


def _summarise(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for m in METRICS:
        have = [r[m] for r in rows if m in r]
        out[m] = sum(have) / len(have) if have else math.nan
    for m in COUNTS:
        out[m] = int(sum(r.get(m, 0.0) for r in rows))
    return out


def aggregate(
    records: Iterable[dict[str, Any]], group: Callable[[dict[str, Any]], str] | None = None
) -> dict[str, Any]:
    """``{"sources": {source: row}, "overall": row}`` with a row per group of ``METRICS`` means,
    ``COUNTS`` totals and ``n``; ``group`` names another grouping than the records' ``data_source``."""
    groups: dict[str, list[dict[str, float]]] = {}
    everything: list[dict[str, float]] = []
    for rec in records:
        values = record_values(rec)
        key = rec.get("data_source", "unknown") if group is None else group(rec)
        groups.setdefault(key, []).append(values)
        everything.append(values)
    return {
        "sources": {k: _summarise(v) for k, v in sorted(groups.items())},
        "overall": _summarise(everything),
    }


def flatten_summary(summary: dict[str, Any], prefix: str = "val") -> dict[str, float]:
    """``{"val/nq/em": 0.41, ..., "val/all/em": 0.38}``: the summary as namespaced metrics."""
    flat = {}
    for source, row in summary["sources"].items():
        for m in (*METRICS, *COUNTS):
            flat[f"{prefix}/{source}/{m}"] = row[m]
    for m in (*METRICS, *COUNTS):
        flat[f"{prefix}/all/{m}"] = summary["overall"][m]
    return flat
