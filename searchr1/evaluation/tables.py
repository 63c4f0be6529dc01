"""The evaluation's tables: per-source detail of one mode, the paper's layout, two runs side by side.

The paper's layout (Search-R1, Jin et al. 2025, Table 2): one row per method, one column per
dataset (``data_source``), then their average. The average is the paper's "Avg.": the mean over
the datasets of the row (macro), not over questions, so a large dataset does not outweigh a small
one:

    avg(method) = (1 / |D|) * sum_{d in D} metric(method, d)

Datasets come in the paper's order (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, Musique, Bamboogle),
others after them by name; methods in the paper's order (Direct, CoT, RAG, Search-R1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from searchr1.data.formats import BENCHMARK_SOURCES
from searchr1.evaluation.aggregate import COUNTS, METRICS
from searchr1.evaluation.modes import MODES

METRIC_NAMES = {
    "em": "EM",
    "sub_em": "subEM",
    "f1": "F1",
    "valid_format": "valid",
    "tagged": "tagged",
    "searches": "searches",
    "turns": "turns",
    "truncated": "trunc",
    "search_failures": "failed",
}
"""Column headers of the metrics."""
TABLE_METRICS = ("em", "sub_em", "f1")
"""Metrics that have a paper-layout table (``--metric``)."""


@dataclass
class PaperTable:
    """Rows = methods, columns = datasets then ``avg``; ``values[i][j]`` of row i, column j."""

    metric: str
    columns: list[str]
    labels: list[str]
    modes: list[str]
    values: list[list[float]]
    counts: dict[str, int]
    """Questions per dataset (of the first row that has it)."""
    failures: list[int]
    """Failed searches per row."""


GENERATED_BY = ("model", "engine", "dtype")
"""The settings of a run that say what generated its answers (the table's first line)."""


def generated_by(settings: dict[str, Any]) -> str:
    """``model: M   engine: hf   dtype: bfloat16``: what generated a run (the settings it has of these)."""
    return "   ".join(f"{k}: {settings[k]}" for k in GENERATED_BY if settings.get(k) not in (None, ""))


def _format(value: float, digits: int = 3) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _source_order(source: str) -> tuple[int, str]:
    return (
        (BENCHMARK_SOURCES.index(source), "")
        if source in BENCHMARK_SOURCES
        else (len(BENCHMARK_SOURCES), source)
    )


def ordered_modes(modes: Sequence[str]) -> list[str]:
    """Mode names in the paper's row order; names that are not evaluation modes last, as given."""
    known = [m for m in MODES if m in modes]
    return known + [m for m in modes if m not in MODES]


def paper_table(summaries: dict[str, dict[str, Any]], metric: str = "em") -> PaperTable:
    """The paper-layout table of ``metric`` from per-mode summaries (``{mode: summary}``)."""
    if metric not in TABLE_METRICS:
        raise ValueError(f"metric: expected one of {', '.join(TABLE_METRICS)}, got {metric!r}")
    modes = ordered_modes(list(summaries))
    sources = sorted({s for m in modes for s in summaries[m].get("sources", {})}, key=_source_order)
    values, counts, failures = [], {}, []
    for m in modes:
        rows = summaries[m].get("sources", {})
        cells = [float(rows[s][metric]) if s in rows else math.nan for s in sources]
        present = [c for c in cells if math.isfinite(c)]
        values.append([*cells, sum(present) / len(present) if present else math.nan])
        for s in sources:
            if s in rows:
                counts.setdefault(s, int(rows[s].get("n", 0)))
        failures.append(int(summaries[m].get("overall", {}).get("search_failures", 0)))
    labels = [MODES[m].label if m in MODES else m for m in modes]
    return PaperTable(metric, [*sources, "avg"], labels, modes, values, counts, failures)


def _align(rows: list[list[str]], left: int = 1) -> list[str]:
    """Columns padded to their widest cell (the first ``left`` left-aligned, the others right-aligned),
    with a rule of dashes under the first row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_paper_table(table: PaperTable, markdown: bool = False) -> str:
    """The table as aligned text (or Markdown): the method, one column per dataset, avg, and the
    failed-search count when any search failed."""
    show_failed = any(table.failures)
    head = ["method", *table.columns] + (["failed searches"] if show_failed else [])
    body = [
        [label, *(_format(v) for v in vals)] + ([str(f)] if show_failed else [])
        for label, vals, f in zip(table.labels, table.values, table.failures, strict=True)
    ]
    title = f"{METRIC_NAMES[table.metric]} per dataset (avg = mean over datasets)"
    sizes = ", ".join(f"{s} {n}" for s, n in table.counts.items())
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return f"{title}\n\n" + "\n".join(lines) + f"\n\nquestions: {sizes}\n"
    return f"{title}\n" + "\n".join(_align([head, *body])) + f"\nquestions: {sizes}"


def format_summary_table(summary: dict[str, Any]) -> str:
    """One mode's summary as an aligned text table: one row per source, then ``all`` (over questions)."""
    columns = (*METRICS, *COUNTS)
    head = ["source", "n", *(METRIC_NAMES[m] for m in columns)]

    def cells(row: dict[str, Any]) -> list[str]:
        return [str(row.get(m, 0)) if m in COUNTS else _format(row.get(m, math.nan)) for m in columns]

    rows = [[src, str(r["n"]), *cells(r)] for src, r in summary["sources"].items()]
    o = summary["overall"]
    rows.append(["all", str(o["n"]), *(cells(o) if o["n"] else ["-"] * len(columns))])
    return "\n".join(_align([head, *rows]))


def compare_tables(
    a: dict[str, dict[str, Any]],
    b: dict[str, dict[str, Any]],
    metric: str = "em",
    names: tuple[str, str] = ("A", "B"),
) -> str:
    """Two runs side by side in the paper's layout: per method, run A, run B and B - A."""
    ta, tb = paper_table(a, metric), paper_table(b, metric)
    modes = ordered_modes(list(dict.fromkeys([*ta.modes, *tb.modes])))
    columns = [*sorted(set(ta.columns[:-1]) | set(tb.columns[:-1]), key=_source_order), "avg"]

    def row(t: PaperTable, mode: str) -> list[float]:
        if mode not in t.modes:
            return [math.nan] * len(columns)
        vals = dict(zip(t.columns, t.values[t.modes.index(mode)], strict=True))
        return [vals.get(c, math.nan) for c in columns]

    head = ["method", "run", *columns]
    body = []
    for mode in modes:
        label = MODES[mode].label if mode in MODES else mode
        ra, rb = row(ta, mode), row(tb, mode)
        delta = [y - x for x, y in zip(ra, rb, strict=True)]
        body.append([label, "A", *(_format(v) for v in ra)])
        body.append(["", "B", *(_format(v) for v in rb)])
        body.append(["", "B-A", *("-" if not math.isfinite(d) else f"{d:+.3f}" for d in delta)])
    lines = _align([head, *body], left=2)
    title = f"{METRIC_NAMES[metric]} per dataset: A = {names[0]}, B = {names[1]}"
    return f"{title}\n" + "\n".join(lines)
