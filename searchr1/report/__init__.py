"""The run report: one self-contained HTML page for a training run or an ``eval`` output folder.

    searchr1 report runs/tiny               # writes runs/tiny/report.html
    build_report("eval/qwen-agent", out="agent.html")

The page shows the training curves (reward and its components, validation EM, searches, response
length, KL, entropy, clip fraction, step-time split), the validation table per data source, and a
trajectory browser (filters: correct / incorrect, number of searches, data source) that shows each
token's role: prompt, generated and trained, retrieved and masked. No network is needed to view it.
"""

from __future__ import annotations

from pathlib import Path

from searchr1.report.html import render_page
from searchr1.report.loading import ReportError, load_run

REPORT_FILE = "report.html"

__all__ = ["REPORT_FILE", "ReportError", "build_report"]


def build_report(run_dir: str | Path, out: str | Path | None = None, max_trajectories: int = 1000) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``) and return its path."""

    data = load_run(run_dir, max_trajectories=max_trajectories)
    path = Path(out) if out is not None else Path(run_dir) / REPORT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(data), encoding="utf-8")
    return path
