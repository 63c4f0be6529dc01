"""The demo's recipe chosen on tuning seeds: each variant of the learning recipe trained on the same tuning
seeds (worlds and RL seeds the demo never shows), compared by the mean and spread of their held-out gains.

    python benchmarks/recipe_sweep.py --variants shipped credit --seeds 100 101 102 103 --runs /work/runs/sweep

Each (variant, seeds) is one ``searchr1 demo --only search`` invocation (its command is recorded with the row);
a finished invocation is reused, so the sweep resumes where it stopped. Results: one row per variant x seed
(EM before and after, single- and multi-hop after, searches, the collapse guard's warnings, minutes) and one
summary per variant (mean and sample standard deviation over the seeds), written to
``benchmarks/results/recipe_sweep.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HARNESS = ["trainer.val_every=4", "trainer.val_max_samples=32", "trainer.keep_best=val_em"]
"""Every variant validates every 4 steps on 32 validation questions and ships the best validated policy."""
FROM_START = ["trainer.val_before_train=true"]
"""Variants named ``+v0`` also validate the starting policy, so a run that only got worse ships it (the first
variants of the sweep ran without: a policy that collapsed before step 4 was shipped)."""
CREDIT = [
    "reward.structure_format_score=0.0",
    "reward.final_format_score=0.0",
    "reward.step_gain=0.5",
    "reward.step_redundancy=0.1",
    "algorithm.step_credit_coef=1.0",
    "replay.enabled=true",
]
"""Step rewards for each search that finds a new gold passage (and a penalty for a search that finds only
what earlier ones found), replay of successful trajectories, and no reward for the format alone (the
structure score paid valid trajectories that never searched)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "shipped": {"about": "the recipe shipped before this sweep (outcome-only Search-R1 reward)", "set": []},
    "credit": {"about": "step rewards + replay, no format-only reward", "set": CREDIT},
    "credit-slow": {
        "about": "credit at half the learning rate for 20 steps",
        "set": [*CREDIT, "trainer.actor_lr=5.0e-4"],
        "steps": 20,
    },
    "credit-noreplay": {"about": "credit without replay", "set": [*CREDIT, "replay.enabled=false"]},
    "shipped+v0": {"about": "shipped, the starting policy validated too", "set": FROM_START},
    "coverage+v0": {
        "about": "Search-R1's reward + gold_coverage 0.3 (the share of gold passages found) + step rewards + "
        "replay on a pool of 48 training questions; the starting policy validated too",
        "set": [
            *FROM_START,
            "reward.components={search_r1: 1.0, gold_coverage: 0.3}",
            "reward.step_gain=0.5",
            "reward.step_redundancy=0.1",
            "algorithm.step_credit_coef=1.0",
            "replay.enabled=true",
            "data.max_train_samples=48",
        ],
    },
    "credit-pool": {
        "about": "credit with Search-R1's format scores kept, on a pool of 48 training questions (each drawn "
        "twice in 12 steps, so that replay has successes to bring back)",
        "set": [
            *CREDIT,
            "reward.structure_format_score=0.2",
            "reward.final_format_score=0.1",
            "data.max_train_samples=48",
        ],
    },
    "credit-format": {
        "about": "credit with Search-R1's format scores kept (0.2 structure, 0.1 final format)",
        "set": [*CREDIT, "reward.structure_format_score=0.2", "reward.final_format_score=0.1"],
    },
}


def command(name: str, seeds: list[int], runs: Path, jobs: int) -> list[str]:
    spec = VARIANTS[name]
    cmd = [
        "searchr1", "demo", "--only", "search", "--seeds", *map(str, seeds), "--jobs", str(jobs),
        "--nq-sample", "", "--out", str(runs / name),
    ]  # fmt: skip
    if spec.get("steps"):
        cmd += ["--steps", str(spec["steps"])]
    return cmd + HARNESS + list(spec["set"])


def rows_of(name: str, summary: dict[str, Any], cmd: list[str]) -> list[dict[str, Any]]:
    out = []
    for seed, s in summary["seeds"].items():
        run = s["runs"]["search"]
        hops = run.get("by_hops", {})
        multi = hops.get("multi-hop", {})
        out.append(
            {
                "variant": name,
                "seed": int(seed),
                "em_before": s["em_before"],
                "em_after": s["em_after"],
                "gain": s["em_after"] - s["em_before"],
                "em_single_after": s.get("em_single_after"),
                "em_multi_after": s.get("em_multi_after"),
                "searches_before": s["searches_before"],
                "searches_after": s["searches_after"],
                "searches_multi_after": multi.get("searches_after"),
                "best_step": (run.get("best") or {}).get("step"),
                "warnings": [
                    w.get("pattern", w) if isinstance(w, dict) else w for w in run.get("health", [])
                ],
                "minutes": run.get("seconds", float("nan")) / 60,
                "command": shlex.join(cmd),
            }
        )
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, float]:
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            return {}
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return {"mean": statistics.fmean(values), "std": spread, "min": min(values), "max": max(values)}

    return {
        "seeds": sorted(r["seed"] for r in rows),
        **{
            k: stats(k)
            for k in ("gain", "em_after", "em_multi_after", "searches_after", "searches_multi_after")
        },
        "collapsed": sum(1 for r in rows if r["searches_after"] < 0.5),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[100, 101, 102, 103])
    parser.add_argument(
        "--runs", type=Path, default=Path("runs/sweep"), help="run folders (kept between calls)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once (searchr1 demo --jobs)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/recipe_sweep.json"))
    args = parser.parse_args()
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"rows": []}
    rows = [r for r in previous.get("rows", []) if r["variant"] not in args.variants]
    for name in args.variants:
        cmd = command(name, args.seeds, args.runs, args.jobs)
        summary_file = args.runs / name / "summary.json"
        if not summary_file.is_file():
            print(f"sweep: {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            t0 = time.time()
            subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            print(f"sweep: {name} took {(time.time() - t0) / 60:.1f} min", file=sys.stderr, flush=True)
        rows += rows_of(name, json.loads(summary_file.read_text()), cmd)
    variants = sorted({r["variant"] for r in rows})
    about = {v: {k: VARIANTS[v][k] for k in ("about", "set")} for v in variants if v in VARIANTS}
    result = {
        "about": __doc__.strip().splitlines()[0],
        "harness": HARNESS,
        "variants": {
            v: {**about.get(v, {}), **summarize([r for r in rows if r["variant"] == v])} for v in variants
        },
        "rows": rows,
        "load_average_at_end": os.getloadavg(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for v in variants:
        s = result["variants"][v]
        g, m = s["gain"], s.get("em_multi_after", {})
        print(f"{v:16s} gain {g['mean']:+.3f} ± {g['std']:.3f} (min {g['min']:+.3f})  multi-hop after "
              f"{m.get('mean', float('nan')):.3f}  searches after {s['searches_after']['mean']:.2f}  "
              f"collapsed {s['collapsed']}/{len(s['seeds'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
