"""Line charts as inline SVG strings (no JavaScript, no network): the report's training curves."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

PALETTE = ("#0b57d0", "#d93025", "#188038", "#e37400", "#8430ce", "#007b83", "#b3261e", "#5f6368", "#c5221f")
WIDTH, HEIGHT = 460, 230
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 54, 12, 10, 30

Series = tuple[str, Sequence[tuple[float, float]]]
"""(label, [(step, value), ...]); non-finite values are gaps."""


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        lo, hi = lo - (abs(lo) * 0.1 or 1.0), hi + (abs(hi) * 0.1 or 1.0)
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = [round(k * step, 12) for k in range(first, last + 1)]
    return ticks


def tick_label(v: float, step: float) -> str:
    """``v`` with as many decimals as the tick step needs (0.0125 steps -> 4 decimals)."""
    if step <= 0 or not math.isfinite(step):
        return _fmt(v)
    a = max(abs(v), step)
    if a >= 1e5 or a < 1e-4:
        return f"{v:.{max(1, min(4, math.ceil(-math.log10(step / a))))}e}"
    decimals = max(0, math.ceil(-math.log10(step) - 1e-9))
    return f"{v:.{decimals}f}"


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-3:
        return f"{v:.1e}"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def line_chart(title: str, series: Sequence[Series], y_label: str = "") -> str:
    """A titled ``<div class="chart">`` holding one SVG line chart of ``series`` over steps."""
    points = [(x, y) for _, pts in series for x, y in pts if math.isfinite(y)]
    esc = html.escape
    if not points:
        return f'<div class="chart"><h3>{esc(title)}</h3><p class="note">no finite values</p></div>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_ticks = nice_ticks(min(ys), max(ys))
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 0.0
    y_lo, y_hi = min(y_ticks[0], min(ys)), max(y_ticks[-1], max(ys))
    if y_hi == y_lo:
        y_hi = y_lo + 1
    pw, ph = WIDTH - MARGIN_L - MARGIN_R, HEIGHT - MARGIN_T - MARGIN_B

    def sx(x: float) -> float:
        return MARGIN_L + (x - x_lo) / (x_hi - x_lo) * pw

    def sy(y: float) -> float:
        return MARGIN_T + (1 - (y - y_lo) / (y_hi - y_lo)) * ph

    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{esc(title)}" font-size="11" font-family="system-ui, sans-serif">'
    ]
    for t in y_ticks:
        if y_lo <= t <= y_hi:
            y = sy(t)
            parts.append(
                f'<line x1="{MARGIN_L}" x2="{WIDTH - MARGIN_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e9ed"/>'
            )
            parts.append(
                f'<text x="{MARGIN_L - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#5b6673">{tick_label(t, y_step)}</text>'
            )
    x_ticks = nice_ticks(x_lo, x_hi, 6)
    if all(float(x).is_integer() for x in xs):  # steps: integer ticks only
        x_ticks = [t for t in x_ticks if float(t).is_integer()]
    for t in x_ticks:
        if x_lo <= t <= x_hi:
            x = sx(t)
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MARGIN_T + ph}" y2="{MARGIN_T + ph + 4}" stroke="#9aa3ad"/>'
            )
            parts.append(
                f'<text x="{x:.1f}" y="{HEIGHT - 12}" text-anchor="middle" fill="#5b6673">{_fmt(round(t, 9))}</text>'
            )
    parts.append(
        f'<rect x="{MARGIN_L}" y="{MARGIN_T}" width="{pw}" height="{ph}" fill="none" stroke="#c4cbd3"/>'
        f'<text x="{WIDTH - MARGIN_R}" y="{HEIGHT - 1}" text-anchor="end" fill="#5b6673">step</text>'
    )
    if y_label:
        parts.append(f'<text x="4" y="{MARGIN_T + 8}" fill="#5b6673">{esc(y_label)}</text>')
    legend = []
    for i, (label, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in pts:
            if math.isfinite(y):
                runs[-1].append((x, y))
            elif runs[-1]:
                runs.append([])
        for run in runs:
            if len(run) == 1:
                ((x, y),) = run
                parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>')
            elif run:
                coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in run)
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        last = next(((x, y) for x, y in reversed(pts) if math.isfinite(y)), None)
        if last is not None:
            parts.append(
                f'<circle cx="{sx(last[0]):.1f}" cy="{sy(last[1]):.1f}" r="3" fill="{color}">'
                f"<title>{esc(label)} at step {_fmt(last[0])}: {_fmt(last[1])}</title></circle>"
            )
        legend.append(f'<span style="--c:{color}">{esc(label)}</span>')
    parts.append("</svg>")
    return (
        f'<div class="chart"><h3>{esc(title)}</h3>{"".join(parts)}'
        f'<div class="legend">{"".join(legend)}</div></div>'
    )
