"""The demo's recipe chosen on tuning seeds: each variant of the learning recipe trained on the same tuning
seeds (worlds and RL seeds the demo never shows), compared by the mean and spread of what they give.

    python benchmarks/recipe_sweep.py --variants guided --seeds 100 101 102 103 --runs /work/runs/sweep

Each (variant, seeds) is one ``searchr1 demo --only search`` invocation (its command is recorded with the row);
a finished invocation is reused, so the sweep resumes where it stopped. Every variant sets the whole recipe
(``RECIPE`` plus its own keys) on top of the shipped config, so a later change of the shipped config does not
change what a variant was. Results: one row per variant x seed (EM before and after, single- and multi-hop
after, searches per kind, the second-search probe, the guided share, the collapse guard's warnings, minutes,
the load average before and after) and one summary per variant (mean and sample standard deviation over the
seeds), written to ``benchmarks/results/recipe_sweep.json`` (``--out``) with the rule that chooses (``RULE``,
fixed before the sweep ran) and its verdict. Rows of earlier rounds are kept under ``earlier_rounds``.
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

RULE = (
    "Fixed before the sweep (round 6): the variant with the highest mean over the tuning seeds of the "
    "kind-balanced held-out EM after RL ((single-hop EM + multi-hop EM) / 2), among variants with no collapsed "
    "seed (searches per question after RL < 0.5); a difference smaller than the standard error of the "
    "difference goes to the variant with the higher mean decision accuracy after RL (the two-sided probe: "
    "P(search) on two-hop questions after the first gold passage, P(answer) on single-hop ones after the passage "
    "that holds the answer, averaged). Tuning seeds only (100-103), never the demo's (0-2, 7, 8, 11, 23)."
)
HARNESS = [
    "trainer.val_every=4",
    "trainer.val_max_samples=32",
    "trainer.val_balance_kinds=true",
    "trainer.keep_best=val_em_by_kind",
    "trainer.val_before_train=true",
]
"""Every variant validates the starting policy and every 4 steps on 16 single-hop and 16 multi-hop validation
questions, and ships the policy with the best mean of the two EMs (the rule's own measure)."""
RECIPE = [
    "reward.components={search_r1: 1.0, gold_coverage: 0.3}",
    "reward.structure_format_score=0.2",
    "reward.final_format_score=0.1",
    "reward.retrieval_score=0.2",
    "reward.step_gain=0.5",
    "reward.step_redundancy=0.1",
    "algorithm.step_credit_coef=1.0",
    "replay.enabled=true",
    "data.max_train_samples=0",
]
"""What every variant shares: Search-R1's reward + gold coverage, step credit per search position, replay,
the whole training split (340 questions, half two-hop)."""
GUIDED = ["guidance.off_policy=1", "guidance.branched=1", "guidance.share=0.5", "guidance.decay_until=0.75"]

WARM = ["warmstart.batch_size=16", "warmstart.micro_batch_size=4", "warmstart.lr=1.0e-3"]
"""The warm start every variant of this round runs first (one pass over the first N training questions' gold
trajectories; N is the variant's)."""
BUDGET = ["rollout.last_search_notice=true", "rollout.max_response_tokens=416"]
"""Budgets that fit two searches and an answer at their limits (issue 47's first item)."""

VARIANTS: dict[str, dict[str, Any]] = {
    "warm96_rl8": {"about": "warm start on 96 gold trajectories (one pass), then 8 guided RL steps",
                   "set": [*RECIPE, *GUIDED, *BUDGET, *WARM, "warmstart.epochs=1", "warmstart.max_examples=96",
                           "trainer.actor_lr=5.0e-4"], "steps": 8},
    "warm192_rl4": {"about": "warm start on 192 gold trajectories (one pass), then 4 guided RL steps: the "
                             "same minutes spent more on imitation",
                    "set": [*RECIPE, *GUIDED, *BUDGET, *WARM, "warmstart.epochs=1", "warmstart.max_examples=192",
                            "trainer.actor_lr=5.0e-4"], "steps": 4},
    "warm96_rl8_2shot": {
        "about": "warm96_rl8 with the instruct_2shot prompt (one single-hop and one two-hop worked example, "
        "where instruct_2hop shows two two-hop ones): both sides of the decision in the prompt too",
        "set": [*RECIPE, *GUIDED, *BUDGET, *WARM, "warmstart.epochs=1", "warmstart.max_examples=96",
                "trainer.actor_lr=5.0e-4"],
        "steps": 8,
        "template": "instruct_2shot",
    },
    "warm192_rl4_decide": {
        "about": "warm192_rl4 with decision groups (issue 47, part 3): 4 of a step's 8 groups continue all their "
        "rollouts from the gold prefix that ends after the first passage (the question's first gold search and "
        "its real hits), half single-hop and half two-hop, so the 4 continuations of one decision point compare "
        "searching again with answering; a search after every gold passage was found costs 0.2 "
        "(reward.step_superfluous): searching twice on a single-hop question ranks below answering",
        "set": [*RECIPE, *GUIDED, *BUDGET, *WARM, "warmstart.epochs=1", "warmstart.max_examples=192",
                "trainer.actor_lr=5.0e-4", "guidance.decision_groups=4", "reward.step_superfluous=0.2"],
        "steps": 4,
    },
    "warm680_rl4_decide": {
        "about": "warm192_rl4_decide with a warm start over every training question twice (340 gold "
        "trajectories, 2 passes, 43 steps of 16): after one pass over 192 the policy lands on a habit per "
        "seed (seed 100 never searches twice, seed 101 searches twice on half the single-hop questions), "
        "as if the decision were still under-trained; about 2.5x the warm start's minutes",
        "set": [*RECIPE, *GUIDED, *BUDGET, *WARM, "warmstart.epochs=2", "warmstart.max_examples=0",
                "trainer.actor_lr=5.0e-4", "guidance.decision_groups=4", "reward.step_superfluous=0.2"],
        "steps": 4,
    },
}  # fmt: skip
"""This round's variants (issue 47): a warm start before RL, two splits of about the same time between
imitation and RL (defined after a pilot on development seed 200, before any tuning seed ran), and the first
of them with a prompt that shows both sides of the decision (added while the first two ran, before any of
their tuning rows was read), and the second of them with decision groups (``warm192_rl4_decide``, added after
the RL drift to searching twice on every question was seen: no tuning row of it has run yet), and that one
with a warm start over every training question twice (``warm680_rl4_decide``, added after seeing the first
warm-start-alone rows on the fixed code, before any row of it ran); a variant's
``template`` is the demo's ``--template``. A run takes ~40 minutes on this round's machine (2 AVX2 cores shared with other work),
so the sweep covers what the session's time allowed (the rows say which seeds ran); the variants of earlier
rounds and their rows are under ``earlier_rounds`` in the JSON."""


def command(name: str, seeds: list[int], runs: Path, jobs: int) -> list[str]:
    """The ``searchr1 demo`` call of variant ``name`` on ``seeds``, its run folder ``runs``."""
    spec = VARIANTS[name]
    cmd = [
        "searchr1", "demo", "--only", "search", "--seeds", *map(str, seeds), "--jobs", str(jobs),
        "--nq-sample", "", "--hotpotqa-sample", "", "--out", str(runs),
    ]  # fmt: skip
    if spec.get("steps"):
        cmd += ["--steps", str(spec["steps"])]
    if spec.get("template"):
        cmd += ["--template", spec["template"]]
    return cmd + HARNESS + list(spec["set"])


def rows_of(name: str, summary: dict[str, Any], cmd: list[str], load: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for seed, s in summary["seeds"].items():
        run = s["runs"]["search"]
        single, multi = s.get("em_single_after"), s.get("em_multi_after")
        out.append(
            {
                "variant": name,
                "seed": int(seed),
                "em_before": s["em_before"],
                "em_after": s["em_after"],
                "gain": s["em_after"] - s["em_before"],
                "em_single_after": single,
                "em_multi_after": multi,
                "em_by_kind_after": (single + multi) / 2
                if single is not None and multi is not None
                else None,
                "searches_before": s["searches_before"],
                "searches_after": s["searches_after"],
                "searches_single_after": s.get("searches_single_after"),
                "searches_multi_after": s.get("searches_multi_after"),
                "valid_format_after": s.get("valid_format_after"),
                "probe_before": s.get("probe_before"),
                "probe_after": s.get("probe_after"),
                **{
                    f"{k}_{when}": s.get(f"{k}_{when}")
                    for k in ("decision", "probe_search", "probe_answer")
                    for when in ("before", "warm", "after")
                },
                **{
                    k: s.get(k)
                    for k in (
                        "em_warm",
                        "em_single_warm",
                        "em_multi_warm",
                        "searches_single_warm",
                        "searches_multi_warm",
                        "valid_format_warm",
                    )
                },
                "guided_share": s.get("guided_share"),
                "best_step": (run.get("best") or {}).get("step"),
                "warnings": [
                    w.get("pattern", w) if isinstance(w, dict) else w for w in run.get("health", [])
                ],
                "minutes": run.get("seconds", float("nan")) / 60,
                "command": shlex.join(cmd),
                "load_average": load,
            }
        )
    return out


METRICS = (
    "em_by_kind_after", "gain", "em_after", "em_single_after", "em_multi_after", "searches_after",
    "searches_single_after", "searches_multi_after", "valid_format_after", "probe_before", "probe_after",
    "guided_share", "em_warm", "em_single_warm", "em_multi_warm", "searches_single_warm", "searches_multi_warm",
    "decision_before", "decision_warm", "decision_after",
)  # fmt: skip


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> dict[str, float]:
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            return {}
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return {"mean": statistics.fmean(values), "std": spread, "min": min(values), "max": max(values)}

    return {
        "seeds": sorted(r["seed"] for r in rows),
        **{k: stats(k) for k in METRICS},
        "collapsed": sum(1 for r in rows if r["searches_after"] < 0.5),
    }


TUNING_SEEDS = (100, 101, 102, 103)
"""The rule chooses only among variants measured on every one of these seeds."""


def choose(variants: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule (``RULE``) applied to the variants measured on every tuning seed: the eligible ones by the
    mean kind-balanced EM after, the standard error of each difference from the best (paired by seed), and
    the choice (a difference within one standard error goes to the higher mean decision accuracy after).
    Until some variant has every tuning seed nothing is chosen: means over different seeds do not compare."""
    complete = {v: s for v, s in variants.items() if set(TUNING_SEEDS) <= set(s.get("seeds", []))}
    if not complete:
        return {
            "chosen": None,
            "why": f"no variant has all the tuning seeds {list(TUNING_SEEDS)} yet",
            "seeds_so_far": {v: s.get("seeds", []) for v, s in variants.items()},
        }
    eligible = {v: s for v, s in complete.items() if s["collapsed"] == 0 and s.get("em_by_kind_after")}
    if not eligible:
        return {"chosen": None, "why": "no variant without a collapsed seed"}
    ranked = sorted(eligible, key=lambda v: -eligible[v]["em_by_kind_after"]["mean"])
    best = ranked[0]
    by_seed = {v: {r["seed"]: r["em_by_kind_after"] for r in rows if r["variant"] == v} for v in ranked}
    close = []
    for other in ranked[1:]:
        diffs = [by_seed[best][s] - by_seed[other][s] for s in TUNING_SEEDS]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        if statistics.fmean(diffs) < se:
            close.append((other, statistics.fmean(diffs), se))
    chosen = best
    if close:
        contenders = [best] + [c[0] for c in close]
        chosen = max(contenders, key=lambda v: eligible[v].get("decision_after", {}).get("mean", float("-inf")))
    return {
        "ranking": [(v, eligible[v]["em_by_kind_after"]["mean"]) for v in ranked],
        "within_one_standard_error_of_the_best": [
            {"variant": v, "difference": d, "se": se} for v, d, se in close
        ],
        "chosen": chosen,
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
    parser.add_argument("--note", default="", help="a line kept in the JSON (how the runs went)")
    args = parser.parse_args()
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"rows": []}
    if previous.get("rule") != RULE:  # a new round: the former one is kept apart
        earlier = previous.get("earlier_rounds", [])
        if previous.get("rows"):
            earlier.append({k: previous[k] for k in previous if k != "earlier_rounds"})
        previous = {"rows": [], "earlier_rounds": earlier}
    # a (variant, seed) measured again replaces its row; every other row stays (seeds land one call at a time)
    asked = {(v, s) for v in args.variants for s in args.seeds}
    rows = [r for r in previous.get("rows", []) if (r["variant"], r["seed"]) not in asked]
    for name in args.variants:
        folder = args.runs / name / ("seeds_" + "_".join(map(str, args.seeds)))
        cmd = command(name, args.seeds, folder, args.jobs)
        summary_file = folder / "summary.json"
        load_file = folder / "load_average.json"
        if not summary_file.is_file():
            print(f"sweep: {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            t0, before = time.time(), os.getloadavg()
            subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
            load_file.write_text(json.dumps({"before": before, "after": os.getloadavg()}) + "\n")
            print(f"sweep: {name} took {(time.time() - t0) / 60:.1f} min", file=sys.stderr, flush=True)
        load = json.loads(load_file.read_text()) if load_file.is_file() else {}
        rows += rows_of(name, json.loads(summary_file.read_text()), cmd, load)
    names = sorted({r["variant"] for r in rows})
    variants = {
        v: {**{k: VARIANTS[v][k] for k in ("about", "set")}, "steps": VARIANTS[v].get("steps"),
            **summarize([r for r in rows if r["variant"] == v])}
        for v in names if v in VARIANTS
    }  # fmt: skip
    result = {
        "about": __doc__.strip().splitlines()[0],
        "rule": RULE,
        "harness": HARNESS,
        "recipe": RECIPE,
        "variants": variants,
        "verdict": choose(variants, rows),
        **({"note": args.note} if args.note else {}),
        "rows": rows,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "earlier_rounds": previous.get("earlier_rounds", []),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for v, s in variants.items():
        k, g, m = s["em_by_kind_after"], s["gain"], s.get("em_multi_after", {})
        print(f"{v:14s} kind-balanced EM after {k['mean']:.3f} ± {k['std']:.3f}  gain {g['mean']:+.3f} ± "
              f"{g['std']:.3f}  multi-hop after {m.get('mean', float('nan')):.3f}  searches/multi-hop "
              f"{s['searches_multi_after'].get('mean', float('nan')):.2f}  collapsed {s['collapsed']}/{len(s['seeds'])}")  # fmt: skip
    print(f"chosen by the rule: {result['verdict']['chosen']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
