"""The report page: curves (inline SVG), validation tables, and the trajectory browser (inline JS).

Everything is inlined (styles, script, data), so the file opens offline and can be mailed around.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from importlib import resources
from typing import Any

from searchr1.evaluation.aggregate import COUNTS, METRICS
from searchr1.evaluation.tables import METRIC_NAMES, PaperTable, generated_by, paper_table
from searchr1.report.charts import Series, line_chart
from searchr1.report.loading import RunData, compact_trajectory

esc = html.escape

CHARTS: list[tuple[str, tuple[str, ...]]] = [
    ("Reward and its components", ("reward/",)),
    ("Validation EM", ("val/*/em", "val/em")),
    ("Searches per trajectory", ("rollout/searches",)),
    ("Response length (tokens)", ("rollout/response_length",)),
    ("KL to the reference policy", ("actor/kl",)),
    ("Entropy", ("actor/entropy",)),
    ("Clip fraction", ("actor/clipfrac",)),
    ("Step time split (seconds)", ("timing/",)),
]
"""(title, key patterns): a trailing ``/`` takes a whole namespace, ``*`` matches one path part."""
MAX_SERIES = 9
NOT_CURVES = {"step", "time", "timestamp", "wall_time", "epoch"}
"""Columns of metrics.jsonl that are coordinates, not curves."""
METRIC_HEADERS = {
    **METRIC_NAMES,
    "valid_format": "valid format",
    "tagged": "tagged answer",
    "truncated": "truncated",
    "search_failures": "failed searches",
}


def _asset(name: str) -> str:
    return resources.files("searchr1.report").joinpath("assets", name).read_text(encoding="utf-8")


def _matches(key: str, pattern: str) -> bool:
    if pattern.endswith("/"):
        return key.startswith(pattern)
    kp, pp = key.split("/"), pattern.split("/")
    return len(kp) == len(pp) and all(p in ("*", k) for k, p in zip(kp, pp, strict=True))


def _series(rows: list[dict[str, float]], keys: list[str]) -> list[Series]:
    return [(k, [(r["step"], r[k]) for r in rows if k in r]) for k in keys]


def validation_series(data: RunData) -> dict[str, list[tuple[float, float]]]:
    """``val/<source>/em`` per validation step, read from the step summaries."""
    out: dict[str, list[tuple[float, float]]] = {}
    for ev in data.evaluations:
        if ev.step is None:
            continue
        for source, row in ev.summary.get("sources", {}).items():
            out.setdefault(f"val/{source}/em", []).append((float(ev.step), float(row.get("em", math.nan))))
    return out


def charts_html(data: RunData) -> str:
    """One chart per entry of ``CHARTS`` that has data, then one per other metric namespace."""
    rows = data.metrics
    keys = sorted({k for r in rows for k in r if k not in NOT_CURVES})
    val_from_summaries = validation_series(data)
    used: set[str] = set()
    blocks = []
    for title, patterns in CHARTS:
        chosen = [k for k in keys if any(_matches(k, p) for p in patterns)]
        if "reward/" in patterns and "reward/mean" in chosen:
            chosen = ["reward/mean"] + [k for k in chosen if k != "reward/mean"]
        used.update(chosen)
        series = _series(rows, chosen)
        if "val/*/em" in patterns:
            have = {k for k, _ in series}
            series += [(k, v) for k, v in sorted(val_from_summaries.items()) if k not in have]
        for i in range(0, len(series), MAX_SERIES):
            part = series[i : i + MAX_SERIES]
            blocks.append(line_chart(title if i == 0 else f"{title} (continued)", part))
    rest: dict[str, list[str]] = {}
    for k in keys:
        if k not in used:
            rest.setdefault(k.split("/", 1)[0] if "/" in k else "other", []).append(k)
    for ns, ks in sorted(rest.items()):
        for i in range(0, len(ks), MAX_SERIES):
            blocks.append(line_chart(f"{ns}/*", _series(rows, ks[i : i + MAX_SERIES])))
    if not blocks:
        return '<p class="note">No training metrics here (no metrics.jsonl): an eval folder, or a run that has not logged a step yet.</p>'
    return f'<div class="charts">{"".join(blocks)}</div>'


def _cell(v: Any) -> str:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return "-" if not math.isfinite(v) else (str(v) if isinstance(v, int) else f"{v:.3f}")
    return esc(str(v))


def summary_table(summary: dict[str, Any], columns: tuple[str, ...] = (*METRICS, *COUNTS)) -> str:
    head = "".join(f"<th>{esc(METRIC_HEADERS.get(m, m))}</th>" for m in columns)
    body = []
    for source, row in summary.get("sources", {}).items():
        cells = "".join(f"<td>{_cell(row.get(m, math.nan))}</td>" for m in columns)
        body.append(f"<tr><td>{esc(source)}</td><td>{_cell(row.get('n', '-'))}</td>{cells}</tr>")
    overall = summary.get("overall")
    if overall and (len(summary.get("sources", {})) > 1 or not summary.get("sources")):
        cells = "".join(f"<td>{_cell(overall.get(m, math.nan))}</td>" for m in columns)
        body.append(f'<tr class="all"><td>all</td><td>{_cell(overall.get("n", "-"))}</td>{cells}</tr>')
    return f'<table class="metrics"><tr><th>source</th><th>n</th>{head}</tr>{"".join(body)}</table>'


def validation_from_metrics(
    rows: list[dict[str, float]],
) -> tuple[float, dict[str, Any], tuple[str, ...]] | None:
    """The latest logged validation (``val/<source>/<metric>`` and ``val/<metric>`` keys of
    metrics.jsonl) as a summary-shaped table: (step, summary, columns)."""
    for row in reversed(rows):
        val = {k: v for k, v in row.items() if k.startswith("val/")}
        if not val:
            continue
        sources: dict[str, dict[str, float]] = {}
        overall: dict[str, float] = {}
        for key, value in val.items():
            parts = key.split("/")
            if len(parts) == 3:
                sources.setdefault(parts[1], {})[parts[2]] = value
            elif len(parts) == 2:
                overall[parts[1]] = value
        names = {m for r in (*sources.values(), overall) for m in r}
        columns = tuple(m for m in METRICS if m in names) + tuple(sorted(names - set(METRICS)))
        summary = {"sources": dict(sorted(sources.items())), "overall": overall if len(sources) > 1 else {}}
        return row["step"], summary, columns
    return None


def validation_html(data: RunData) -> str:
    if not data.evaluations:
        logged = validation_from_metrics(data.metrics)
        if logged is None:
            return '<p class="note">No validation results found (no summary.json, no val/ metrics).</p>'
        step, summary, columns = logged
        return f"<h3>validation at step {_cell(int(step))} (from metrics.jsonl)</h3>" + summary_table(
            summary, columns
        )
    if data.kind == "eval":
        return results_html(data)
    latest = data.evaluations[-1]
    parts = [f"<h3>validation at step {latest.step}</h3>", summary_table(latest.summary)]
    steps = [e for e in data.evaluations if e.step is not None]
    if len(steps) > 1:
        sources = sorted({s for e in steps for s in e.summary.get("sources", {})})
        head = "".join(f"<th>{esc(s)}</th>" for s in sources)
        body = "".join(
            f"<tr><td>{e.step}</td>"
            + "".join(
                f"<td>{_cell(e.summary['sources'].get(s, {}).get('em', math.nan))}</td>" for s in sources
            )
            + "</tr>"
            for e in steps
        )
        parts.append(
            f'<h3>EM per validation step</h3><table class="metrics"><tr><th>step</th>{head}</tr>{body}</table>'
        )
    return "".join(parts)


def paper_table_html(table: PaperTable) -> str:
    """Rows = methods, columns = datasets and their average (the paper's Table 2 layout)."""
    failed = any(table.failures)
    head = "".join(f"<th>{esc(c)}</th>" for c in table.columns) + ("<th>failed searches</th>" if failed else "")
    body = "".join(
        f"<tr><td>{esc(label)}</td>"
        + "".join(f"<td>{_cell(v)}</td>" for v in values)
        + (f"<td>{f}</td>" if failed else "")
        + "</tr>"
        for label, values, f in zip(table.labels, table.values, table.failures, strict=True)
    )
    sizes = ", ".join(f"{esc(s)} {n}" for s, n in table.counts.items())
    return (
        f'<table class="metrics paper"><tr><th>method</th>{head}</tr>{body}</table>'
        f'<p class="note">questions: {sizes}; avg = mean over datasets</p>'
    )


def results_html(data: RunData) -> str:
    """An eval folder: the paper-layout tables (EM, subEM, F1), then each mode per data source."""
    summaries = {str(e.summary.get("mode", e.folder.name)): e.summary for e in data.evaluations}
    parts = []
    made = sorted({generated_by(s.get("settings") or {}) for s in summaries.values()} - {""})
    if made:  # what generated the answers: model, engine and the dtype it generated in
        parts.append(f'<p class="note generated-by">generated by {"<br>".join(esc(m) for m in made)}</p>')
    for metric in ("em", "sub_em", "f1"):
        parts.append(f"<h3>{esc(METRIC_NAMES[metric])} per dataset</h3>")
        parts.append(paper_table_html(paper_table(summaries, metric)))
    for mode, summary in summaries.items():
        label = summary.get("label", mode)
        parts.append(f"<h3>{esc(str(label))} per data source (mode: {esc(mode)})</h3>")
        parts.append(summary_table(summary))
    parts.append(
        '<p class="note">valid format: the reply follows Search-R1\'s tags; tagged answer: the answer was '
        "read from an &lt;answer&gt; tag (the direct, cot and rag baselines score the reply itself "
        "without one).</p>"
    )
    return "".join(parts)


def _json_for_script(obj: Any) -> str:
    """JSON safe inside ``<script>``: no ``</script>`` or ``<!--`` can end or confuse the element."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def browser_html(data: RunData) -> str:
    if not data.trajectories:
        return '<p class="note">No trajectories.jsonl found.</p>'
    where = ""
    if data.trajectories_from is not None:
        rel = data.trajectories_from.relative_to(data.folder)
        where = esc(str(rel)) if str(rel) != "." else "&lt;mode&gt;/trajectories.jsonl"
    cut = (
        f" The first {len(data.trajectories)} of {data.trajectories_total} are included."
        if data.trajectories_total > len(data.trajectories)
        else ""
    )
    return f"""
<p class="note">From <code>{where}</code>.{cut} Click a trajectory to see its tokens by role, its searches and hits.</p>
<div class="legend-roles"><span class="seg prompt">prompt</span><span class="seg generated">generated · trained</span><span class="seg observation">retrieved · masked</span></div>
<div class="filters">
  <label>answer <select id="filter-correct"><option value="all">all</option><option value="correct">correct</option><option value="incorrect">incorrect</option></select></label>
  <label>searches <select id="filter-searches"><option value="all">any</option></select></label>
  <label>data source <select id="filter-source"><option value="all">all</option></select></label>
  <label>mode <select id="filter-mode"><option value="all">all</option></select></label>
  <label>step <select id="filter-step"><option value="all">all</option></select></label>
  <label>text <input id="filter-text" type="search" placeholder="question or answer"></label>
  <span id="traj-count"></span>
</div>
<div id="traj-list"></div>
<button id="traj-more" class="more" hidden>show more</button>"""


def render_page(data: RunData, title: str | None = None) -> str:
    """The whole report as one HTML string."""
    title = title or f"searchr1 report: {data.folder.resolve().name}"
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    steps = f"{len(data.metrics)} logged steps, " if data.metrics else ""
    meta = f"{esc(str(data.folder))} · {data.kind} folder · {steps}{len(data.evaluations)} evaluation(s) · generated {now}"
    payload = {"trajectories": [compact_trajectory(r) for r in data.trajectories]}
    curves = (
        ""
        if data.kind == "eval" and not data.metrics
        else (f'<section id="curves"><h2>Training curves</h2>{charts_html(data)}</section>')
    )
    nav_curves = '<a href="#curves">curves</a>' if curves else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{_asset("report.css")}</style>
</head><body>
<header><h1>{esc(title)}</h1><div class="meta">{meta}</div></header>
<nav>{nav_curves}<a href="#validation">{"results" if data.kind == "eval" else "validation"}</a><a href="#trajectories">trajectories</a></nav>
<main>
{curves}
<section id="validation"><h2>{"Results" if data.kind == "eval" else "Validation"}</h2>{validation_html(data)}</section>
<section id="trajectories"><h2>Trajectories</h2>{browser_html(data)}</section>
</main>
<script type="application/json" id="report-data">{_json_for_script(payload)}</script>
<script>{_asset("report.js")}</script>
</body></html>
"""
