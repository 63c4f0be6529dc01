"""PNG plots of a run's main curves, from its metrics.jsonl (at the end of a run, or on demand).

searchr1 train --plot runs/tiny        # writes runs/tiny/plots/*.png
"""

from __future__ import annotations

import math
from pathlib import Path

from searchr1.trainer.tracking import read_metrics

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",)),
    ("validation", ("val/*/em", "val/em")),
    ("searches", ("rollout/searches", "rollout/turns")),
    ("response_length", ("rollout/response_length",)),
    ("kl", ("actor/kl",)),
    ("entropy", ("actor/entropy",)),
    ("clipfrac", ("actor/clipfrac",)),
    ("timing", ("timing/rollout", "timing/search", "timing/update")),
)


def _matches(pattern: str, key: str) -> bool:
    if "*" not in pattern:
        return key == pattern
    head, tail = pattern.split("*", 1)
    return key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(int(row.get("step", len(xs))))
            ys.append(float(value))
    return xs, ys


def write_plots(run_dir: str | Path) -> list[Path]:
    """``overview.png`` (every panel with data) plus ``reward.png`` and ``validation.png``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    keys = sorted({k for row in rows for k in row})
    panels = []
    for name, patterns in PANELS:
        series = [k for p in patterns for k in keys if _matches(p, k)]
        series = [k for k in dict.fromkeys(series) if _series(rows, k)[0]]
        if series:
            panels.append((name, series))
    out = run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if panels:
        cols = min(3, len(panels))
        nrows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3 * nrows), squeeze=False)
        for ax, (name, series) in zip(axes.flat, panels, strict=False):
            _draw(ax, rows, name, series)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        fig.tight_layout()
        path = out / "overview.png"
        fig.savefig(path, dpi=72)
        plt.close(fig)
        written.append(path)
        for name, series in panels[:2]:  # reward and validation also on their own
            fig, ax = plt.subplots(figsize=(5, 3.2))
            _draw(ax, rows, name, series)
            fig.tight_layout()
            path = out / f"{name}.png"
            fig.savefig(path, dpi=72)
            plt.close(fig)
            written.append(path)
    return written


def _draw(ax, rows: list[dict], name: str, series: list[str]) -> None:
    for key in series:
        xs, ys = _series(rows, key)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key)
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
