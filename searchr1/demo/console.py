"""What the demo prints: the before / after table, right answers per kind of question, one trajectory
before and after, and where the plots and reports are."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchr1.demo.settings import SUMMARY_FILE
from searchr1.demo.summary import example_trajectories
from searchr1.report import build_report

RUN_LABELS = (
    ("search", ""),
    ("search disabled", "no_search_"),
    ("RL alone", "rl_only_"),
    ("no guidance", "no_guidance_"),
    ("outcome-only", "outcome_only_"),
    ("zero-shot prompt", "zero_shot_"),
)

WARM_LABELS = {"": ("warm start alone", "warm start + RL"), "no_search_": ("no search: warm", "search disabled")}
"""The table's labels of a run with a warm start: its warm start alone, then the run after RL."""


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


REAL_DATA = (
    ("nq", "NQ sample (real questions, BM25 over the wiki-18 sample)"),
    ("hotpotqa", "HotpotQA sample (transfer: real two-hop questions, BM25 over their context paragraphs)"),
)


def format_results(summary: dict[str, Any]) -> str:
    """The before/after table, one line per seed and run: EM overall, single- and multi-hop after RL,
    searches per single- and per multi-hop question before -> after, the decision probe before -> after
    (its search side, its answer side and the decision accuracy, their mean), the guided share of training,
    valid format after, and minutes."""
    head = (
        f"{'seed':>4}  {'run':<16} {'EM before':>9} {'EM after':>9} {'single':>6} {'multi':>6} "
        f"{'search/q single':>15} {'search/q multi':>14} {'search side':>12} {'answer side':>12} "
        f"{'decision':>12} {'guided':>6} {'valid':>5} {'min':>5}"
    )
    lines = [head, "-" * len(head)]
    for seed, r in summary["seeds"].items():
        for label, p in RUN_LABELS:
            if f"{p}em_before" not in r:
                continue
            if f"{p}em_warm" in r:  # the recipe's warm start alone, then warm start + RL
                warm, label = WARM_LABELS.get(p, (f"{label}: warm", label))
                lines.append(_table_row(seed, warm, r, p, "warm"))
            lines.append(_table_row(seed, label, r, p, "after"))
    lines.append(
        "decision probe, after the first gold search and its passage: search side P(the next turn searches "
        "rather than answers) on the two-hop test questions, answer side P(it answers) on the one-hop ones "
        "whose passage holds the answer, decision = their mean; guided: share of training trajectories from "
        "the gold path"
    )
    return "\n".join(lines)


def _table_row(seed: str, label: str, r: dict[str, Any], p: str, after: str) -> str:
    """One line of ``format_results``: run ``p`` of a seed, "after" read from the ``_{after}`` keys (``after`` or
    ``warm``: the policy of the warm start alone)."""
    get = lambda key: _number(r.get(p + key))  # noqa: E731
    single = f"{get('searches_single_before'):.2f} -> {get(f'searches_single_{after}'):.2f}"
    multi = f"{get('searches_multi_before'):.2f} -> {get(f'searches_multi_{after}'):.2f}"
    probe = " ".join(
        f"{get(key + '_before'):.2f} -> {get(f'{key}_{after}'):.2f}".rjust(12)
        for key in ("probe_search", "probe_answer", "decision")
    )
    guided = r.get(p + "guided_share", 0.0) if after == "after" else 0.0
    minutes = f"{get('seconds') / 60:>5.1f}" if after == "after" else f"{'-':>5}"  # the run's, on its last line
    return (
        f"{seed:>4}  {label:<16} {r[p + 'em_before']:>9.3f} {get(f'em_{after}'):>9.3f} "
        f"{get(f'em_single_{after}'):>6.3f} {get(f'em_multi_{after}'):>6.3f} {single:>15} {multi:>14} "
        f"{probe} {guided:>6.2f} {get(f'valid_format_{after}'):>5.2f} {minutes}"
    )


def format_by_relation(summary: dict[str, Any]) -> str:
    """Right answers per kind of question, summed over the seeds' search runs, before -> after."""
    totals: dict[str, list[float]] = {}
    for row in summary["seeds"].values():
        for relation, r in row.get("runs", {}).get("search", {}).get("by_relation", {}).items():
            t = totals.setdefault(relation, [0, 0.0, 0.0])
            t[0] += r["questions"]
            t[1] += r["em_before"] * r["questions"]
            t[2] += r["em_after"] * r["questions"]
    lines = [
        f"  {rel:20s} {round(b):3d} -> {round(a):3d} of {n:3d}" for rel, (n, b, a) in sorted(totals.items())
    ]
    return "\n".join(
        ["right answers per kind of question (search runs, all seeds), before -> after:", *lines]
    )


def render_trajectory(rec: dict[str, Any] | None, limit: int = 900) -> str:
    if rec is None:
        return "  (none)"
    text = "".join(seg.get("text", "") for seg in rec.get("segments", []) if seg.get("role") != "prompt")
    if not text:
        text = rec.get("response", "")
    if len(text) > limit:
        text = text[:limit] + " ..."
    return (
        f"  Q: {rec.get('question')}  (gold: {', '.join(rec.get('golden_answers', []))})\n  "
        + text.replace("\n", "\n  ")
    )


def _mean_lines(m: dict[str, Any], seeds: int) -> list[str]:
    lines = []
    if "em_before" in m:
        lines.append(
            f"mean over {seeds} seed(s): EM {m['em_before']:.3f} -> {m['em_after']:.3f} "
            f"(gain {m['em_after'] - m['em_before']:+.3f}); multi-hop EM {m.get('em_multi_after', math.nan):.3f}, "
            f"searches/question {m['searches_before']:.2f} -> {m['searches_after']:.2f} "
            f"(multi-hop {m.get('searches_multi_after', math.nan):.2f})"
        )
    if "em_warm" in m:
        lines.append(
            f"warm start alone:       EM {m['em_before']:.3f} -> {m['em_warm']:.3f} "
            f"(gain {m['em_warm'] - m['em_before']:+.3f}); multi-hop EM {m.get('em_multi_warm', math.nan):.3f}; "
            f"RL after it adds {m['em_after'] - m['em_warm']:+.3f}"
        )
    probe = [
        f"{label} {m[f'{key}_before']:.3f} -> {m[f'{key}_after']:.3f}"
        for key, label in (
            ("decision", "decision probe: accuracy"),
            ("probe_search", "P(search again) on two-hop"),
            ("probe_answer", "P(answer) on one-hop"),
        )
        if f"{key}_before" in m and f"{key}_after" in m
    ]
    if probe:
        lines.append(", ".join(probe))
    for prefix, label in (
        ("no_search_", "search disabled:       "),
        ("rl_only_", "RL alone (no warm start):"),
        ("no_guidance_", "no-guidance ablation:  "),
        ("outcome_only_", "outcome-only ablation: "),
        ("zero_shot_", "zero-shot prompt:      "),
    ):
        if f"{prefix}em_before" in m:
            b, a = m[f"{prefix}em_before"], m[f"{prefix}em_after"]
            note = "; first seed only" if prefix == "zero_shot_" else ""
            multi = m.get(f"{prefix}em_multi_after")
            multi_text = "" if multi is None else f"; multi-hop EM {multi:.3f}"
            lines.append(f"{label} EM {b:.3f} -> {a:.3f} (gain {a - b:+.3f}{note}){multi_text}")
    return lines


def print_report(summary: dict[str, Any], out: Path, log: Callable[[str], None] = print) -> None:
    """The console view: per-seed table, means, per kind, one trajectory before/after, warnings, files."""
    log("")
    log("held-out test questions (entities never asked about in training), greedy decoding:")
    log(format_results(summary))
    for line in _mean_lines(summary["mean"], len(summary["seeds"])):
        log(line)
    if any("by_relation" in r.get("runs", {}).get("search", {}) for r in summary["seeds"].values()):
        log(format_by_relation(summary))
    for seed, row in summary["seeds"].items():
        for name, label in REAL_DATA:
            data = row.get("runs", {}).get("search", {}).get(name)
            if data:
                b, a = data["before"], data["after"]
                log(
                    f"{label}, seed {seed}'s policy: EM {b['em']:.3f} -> {a['em']:.3f}, F1 {b['f1']:.3f} -> "
                    f"{a['f1']:.3f}, searches/question {b['searches']:.2f} -> {a['searches']:.2f}, valid format "
                    f"{b['valid_format']:.2f} -> {a['valid_format']:.2f}"
                )
        for mode, run in row.get("runs", {}).items():
            for alert in run.get("health", []):
                log(f"collapse guard, seed {seed} ({mode}): {alert['message']}")
    first = next((s for s, row in summary["seeds"].items() if "search" in row.get("runs", {})), None)
    if first is not None:
        before, after = example_trajectories(out / f"seed_{first}" / "search")
        log("")
        log(f"one test question, seed {first}, before RL:")
        log(render_trajectory(before))
        log("after RL:")
        log(render_trajectory(after))
    log("")
    for seed, row in summary["seeds"].items():
        for mode, r in row.get("runs", {}).items():
            for p in r.get("plots", []):
                log(f"plot ({mode}, seed {seed}): {p}")
        if row.get("report"):
            log(f"HTML report (seed {seed}): {row['report']}")
    log(f"summary: {out / SUMMARY_FILE}   ({summary['seconds']:.0f} s)")


def write_reports(summary: dict[str, Any], out: Path) -> None:
    """An HTML report per seed of the search-enabled training run (``searchr1 report``)."""
    for seed, row in summary["seeds"].items():
        if "search" not in row.get("runs", {}):
            continue
        run_dir = out / f"seed_{seed}" / "search"
        try:
            row["report"] = str(build_report(run_dir))
        except Exception as exc:  # a report never fails the demo
            row["report"] = None
            print(f"warning: no HTML report for seed {seed}: {exc}", file=sys.stderr)
