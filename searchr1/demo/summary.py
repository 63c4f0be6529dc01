"""The demo's numbers: per-group EM and searches from evaluation records, the reward curve, and the
rows of ``summary.json`` (whose keys users and tests rely on)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from searchr1.evaluation.aggregate import aggregate
from searchr1.evaluation.store import read_trajectories
from searchr1.trainer.tracking import read_metrics

RUN_MODES = (
    ("search", ""),
    ("no_search", "no_search_"),
    ("rl_only", "rl_only_"),
    ("no_guidance", "no_guidance_"),
    ("outcome_only", "outcome_only_"),
    ("zero_shot", "zero_shot_"),
)
"""Each run of a seed and the prefix of its flat keys in ``summary.json``."""


def hops_of(sample: dict) -> str:
    """``single-hop`` or ``multi-hop`` (bridge and comparison questions) from a sample's metadata."""
    kind = (sample.get("metadata") or {}).get("type", "single")
    return "single-hop" if kind == "single" else "multi-hop"


def relation_of(sample: dict) -> str:
    """A sample's kind of question (``metadata.relation``: ``birth_city``, ``founder`` ...)."""
    return (sample.get("metadata") or {}).get("relation", "unknown")


def per_group(samples: list[dict], path: Path, label: Callable[[dict], str]) -> dict[str, dict[str, float]]:
    """EM and searches per question, per group of questions (``label(sample)``), from one
    evaluation's trajectory file (records carry the sample's ``index``; a question with no record
    counts as wrong and searchless)."""
    labels = [label(s) for s in samples]
    questions = Counter(labels)
    groups = aggregate(read_trajectories(path), group=lambda rec: labels[rec["index"]])["sources"]
    out = {}
    for key in sorted(questions):
        g = groups.get(key, {"n": 0, "em": 0.0, "searches": 0.0})
        share = g["n"] / questions[key]
        out[key] = {"em": g["em"] * share, "searches": g["searches"] * share}
    return out


def em_per_group(samples: list[dict], path: Path, label: Callable[[dict], str]) -> dict[str, float]:
    """EM per group of questions (see ``per_group``)."""
    return {key: g["em"] for key, g in per_group(samples, path, label).items()}


def before_after(
    samples: list[dict], before: Path, after: Path, label: Callable[[dict], str]
) -> dict[str, dict[str, Any]]:
    """Per group of questions: how many, EM and searches per question before and after."""
    questions = Counter(label(s) for s in samples)
    b, a = (per_group(samples, path, label) for path in (before, after))
    return {
        key: {
            "questions": questions[key],
            "em_before": b[key]["em"],
            "em_after": a[key]["em"],
            "searches_before": b[key]["searches"],
            "searches_after": a[key]["searches"],
        }
        for key in sorted(questions)
    }


def reward_curve(metrics_path: Path, window: int = 5) -> list[float]:
    """Mean training reward per step, smoothed by a trailing window."""
    raw = [float(r["reward/mean"]) for r in read_metrics(metrics_path) if "reward/mean" in r]
    return [
        sum(raw[max(0, i - window + 1) : i + 1]) / len(raw[max(0, i - window + 1) : i + 1])
        for i in range(len(raw))
    ]


def overall(summary: dict[str, Any]) -> dict[str, float]:
    """EM, F1, searches and valid format of an evaluation summary."""
    o = summary["overall"]
    return {k: float(o[k]) for k in ("em", "f1", "searches", "valid_format")}


def probe_keys(probe: dict[str, Any]) -> dict[str, float | None]:
    """The flat keys of one decision probe (``searchr1.evaluation.probe``), before ``_before`` / ``_after``:
    ``decision`` (the decision accuracy, (p_search_side + p_answer_side) / 2), ``probe_search`` and
    ``probe_answer`` (each side's mean P(the right decision)), and ``probe`` (the search side, the key of the
    one-sided probe before it); None where the probe has no such number."""
    search = (probe.get("search_side") or {}).get("p", probe.get("second_search_p"))
    return {
        "decision": probe.get("decision_accuracy"),
        "probe_search": search,
        "probe_answer": (probe.get("answer_side") or {}).get("p"),
        "probe": search,
    }


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """The per-seed keys of summary.json: EM, F1, searches, valid format before and after, single- and
    multi-hop EM and searches, the decision probe before and after (``probe_keys``: ``decision_before``,
    ``probe_search_before``, ``probe_answer_before``, ``probe_before`` = the search side, and ``_after``),
    the guided share and second-search rate of training (``guided_share``, ``second_search_rate_first`` /
    ``_last``), for the search run (no prefix), the control (``no_search_``, also nested under
    ``no_search``), the ablations (``no_guidance_``, ``outcome_only_``) and the zero-shot row (``zero_shot_``)."""
    flat: dict[str, Any] = {}
    for mode, prefix in RUN_MODES:
        if mode not in row:
            continue
        r = row[mode]
        for metric in ("em", "searches", "f1", "valid_format"):
            flat[f"{prefix}{metric}_before"] = r["before"][metric]
            flat[f"{prefix}{metric}_after"] = r["after"][metric]
        for hops, g in r.get("by_hops", {}).items():
            key = hops.replace("-hop", "")
            for metric in ("em", "searches"):
                flat[f"{prefix}{metric}_{key}_before"] = g[f"{metric}_before"]
                flat[f"{prefix}{metric}_{key}_after"] = g[f"{metric}_after"]
        if "warm" in r:  # the warm start alone (the recipe's runs with a warm start)
            for metric in ("em", "searches", "f1", "valid_format"):
                flat[f"{prefix}{metric}_warm"] = r["warm"][metric]
            for hops, g in r.get("by_hops_warm", {}).items():
                for metric in ("em", "searches"):
                    flat[f"{prefix}{metric}_{hops.replace('-hop', '')}_warm"] = g[f"{metric}_after"]
        flat[f"{prefix}reward_first"] = r["reward_first"]
        flat[f"{prefix}reward_last"] = r["reward_last"]
        for when, probe in r.get("probe", {}).items():
            flat.update({f"{prefix}{key}_{when}": value for key, value in probe_keys(probe).items()})
        for key, value in r.get("training", {}).items():
            flat[f"{prefix}{key}"] = value
        flat[f"{prefix}seconds"] = r.get("seconds", math.nan)
    flat["no_search"] = {
        k[len("no_search_") :]: v
        for k, v in flat.items()
        if isinstance(k, str) and k.startswith("no_search_")
    }
    return flat


def mean_row(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean of each numeric key over the rows where it is a number (the zero-shot row: the first seed only;
    a probe side without questions: None)."""
    keys: list[str] = []
    for r in rows:
        keys.extend(k for k, v in r.items() if isinstance(v, int | float) and k not in keys)
    numbers = {k: [r[k] for r in rows if isinstance(r.get(k), int | float)] for k in keys}
    return {k: sum(v) / len(v) for k, v in numbers.items()}


def example_trajectories(run_dir: Path) -> tuple[dict | None, dict | None]:
    """One test question shown before and after RL (the first one answered correctly after)."""
    before = {r["index"]: r for r in read_trajectories(run_dir / "eval_before" / "trajectories.jsonl")}
    after = read_trajectories(run_dir / "eval_after" / "trajectories.jsonl")
    if not before or not after:
        return None, None
    pick = next((r for r in after if r.get("correct") and r.get("searches", 0) > 1), None)
    pick = pick or next((r for r in after if r.get("correct") and r.get("searches")), after[0])
    return before.get(pick["index"]), pick
