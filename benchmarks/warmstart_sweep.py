"""The demo's warm start chosen on tuning seeds: each variant of the warm start alone (no RL), on the same tuning
worlds, compared by what its policy does on the world's held-out test questions.

    python benchmarks/warmstart_sweep.py --variants zero_e4 2hop_e4 --seeds 100 101 --runs /work/runs/wsweep

A row is one (variant, seed): the seed's synthetic world (the demo's settings), the demo's RL config with the
variant's keys, the warm start (``searchr1.trainer.warmstart``, with its held-out decision check every few
steps), then the kept policy evaluated greedily on the world's first 48 test questions (held-out EM overall
and per kind, searches per kind, valid format) and its two-sided decision probe. A finished row is reused
(the sweep resumes). Rows and one summary per variant (mean and spread over seeds) go to
``benchmarks/results/warmstart_sweep.json`` with ``RULE``, fixed before any row ran, and its verdict.
Tuning seeds only (100-103 and up), never the demo's (0-2, 7, 8, 11, 23).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RULE = (
    "Fixed before the sweep (round 7, issue 54): a variant passes a seed when its warm start alone meets the "
    "demo's targets there (held-out EM >= 0.90, single-hop >= 0.90, multi-hop >= 0.85, decision accuracy "
    ">= 0.90 with each side >= 0.85, valid format >= 0.95). Among variants that pass every tuning seed they "
    "ran on (at least two seeds), the one with the fewest warm-start optimizer steps (mean over seeds) wins, "
    "then the shorter wall time; if none passes, the highest mean kind-balanced EM. Tuning seeds only. "
    "Amended (round 7, fifth session, before zero_e4_b8_stop ran on its second seed, after its first 25 steps "
    "on seed 100): 'steps' counts training examples seen (optimizer steps x warmstart.batch_size), the cost of "
    "a warm start whatever its batch; every variant before had batches of 16, so their order is unchanged."
)
OLD_BATCH = 16
"""warmstart.batch_size of every row written before rows recorded it."""
FORBIDDEN_SEEDS = {0, 1, 2, 7, 8, 11, 23}
HOLDOUT = ["warmstart.holdout=32", "warmstart.check_every=5"]
VARIANTS: dict[str, dict[str, Any]] = {
    "2hop_e4": {"about": "the issue's finding: the instruct_2hop prompt, 4 passes over every training question",
                "template": "instruct_2hop",
                "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3", *HOLDOUT]},
    "zero_e4": {"about": "the same without worked examples in the prompt (Search-R1's instruction alone): "
                         "shorter sequences; the warm start teaches the format",
                "template": "instruct",
                "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3", *HOLDOUT]},
    "zero_e4_stop": {"about": "zero_e4 stopped once the held-out decision accuracy reaches 0.97",
                     "template": "instruct",
                     "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3",
                             "warmstart.stop_at=0.97", *HOLDOUT]},
    "zero_e2_lr2": {"about": "two passes at twice the rate",
                    "template": "instruct",
                    "set": ["warmstart.epochs=2", "warmstart.max_examples=0", "warmstart.lr=2.0e-3", *HOLDOUT]},
    "zero_e4_lr2_stop": {"about": "zero_e4_stop at twice the rate: the decision's 0.97 in fewer steps? (issue 54 item 4: "
                                 "the warm start is most of the quick demo's minutes)",
                         "template": "instruct",
                         "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=2.0e-3",
                                 "warmstart.stop_at=0.97", *HOLDOUT]},
    "zero_e4_b8_stop": {"about": "zero_e4_stop with 8 questions a step instead of 16: if the decision is learnt per "
                                "step, not per example seen, each step costs half (issue 54 item 4)",
                        "template": "instruct",
                        "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3",
                                "warmstart.batch_size=8", "warmstart.stop_at=0.97", *HOLDOUT]},
    "zero_e4_top10_stop": {"about": "zero_e4_stop with the adapter on the top 10 of 30 layers: the backward pass stops "
                                   "above the other 20 (and their outputs could be cached); does it still learn "
                                   "the decision? (issue 54 item 4)",
                           "template": "instruct",
                           "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3",
                                   "warmstart.lora_layers=10", "warmstart.stop_at=0.97", *HOLDOUT]},
    "zero_e4_dw20": {"about": "zero_e4 with the decision's tokens weighed 20x in the loss "
                             "(warmstart.decision_weight): the decision learnt in fewer steps?",
                     "template": "instruct",
                     "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3",
                             "warmstart.decision_weight=20", *HOLDOUT]},
    "zero_e4_dw20_stop": {"about": "zero_e4_dw20 stopped once the held-out decision accuracy reaches 0.97",
                          "template": "instruct",
                          "set": ["warmstart.epochs=4", "warmstart.max_examples=0", "warmstart.lr=1.0e-3",
                                  "warmstart.decision_weight=20", "warmstart.stop_at=0.97", *HOLDOUT]},
}  # fmt: skip


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tuning_world(seed: int, out: Path, template: str, num_test: int) -> tuple[Any, Path, Any, tuple[list, ...]]:
    """A tuning seed's world under ``out`` as the demo builds it: the demo's settings for the seed, the prompt
    file, BM25 over the world's corpus, and its train / val / test rows (test cut to ``num_test``)."""
    from searchr1.demo.runs import build_bm25, build_world, read_jsonl
    from searchr1.demo.settings import DemoSettings, write_prompt

    if seed in FORBIDDEN_SEEDS:
        raise ValueError(f"seed {seed} is one of the demo's: tune on others")
    settings = DemoSettings(seeds=(seed,), num_test=num_test, template=template)
    _, files = build_world(seed, settings, out / "world")
    prompt = write_prompt(out, template)
    splits = tuple(read_jsonl(files[k]) for k in ("train", "val", "test"))
    return settings, prompt, build_bm25(files["corpus"]), (splits[0], splits[1], splits[2][:num_test])


def run_row(name: str, seed: int, runs: Path, num_test: int) -> dict[str, Any]:
    """One (variant, seed): the warm start alone, its policy evaluated and probed."""
    import torch

    from searchr1.demo.runs import _probe, _warm_started, evaluate_policy
    from searchr1.demo.settings import resolve_starting_model, rl_config
    from searchr1.demo.summary import hops_of, overall, per_group

    spec = VARIANTS[name]
    out = runs / name / f"seed_{seed}"
    out.mkdir(parents=True, exist_ok=True)
    settings, prompt, retriever, (train, val, test) = tuning_world(seed, out, spec["template"], num_test)
    model_dir = resolve_starting_model(settings.model)
    extra = list(spec["set"])
    cfg = rl_config(settings, seed, out / "run", prompt, model_dir, extra)
    load_before = load_average()
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    trainer = _warm_started(cfg, settings, seed, retriever, train, val, out / "run", prompt, extra, print)
    warm_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    summary = evaluate_policy(trainer, test, out / "eval_warm", str(prompt), seed)
    eval_seconds = time.perf_counter() - t1
    t2 = time.perf_counter()
    probe = _probe(trainer, test, prompt, retriever)
    probe_seconds = time.perf_counter() - t2
    groups = per_group(test, out / "eval_warm" / "trajectories.jsonl", hops_of)
    single, multi = groups.get("single-hop", {}), groups.get("multi-hop", {})

    ws = trainer.warm_start
    result = {
        "variant": name,
        "seed": seed,
        **{k: v for k, v in overall(summary).items()},
        "em_single": single.get("em"),
        "em_multi": multi.get("em"),
        "searches_single": single.get("searches"),
        "searches_multi": multi.get("searches"),
        "decision": probe.get("decision_accuracy"),
        "probe_search": probe["search_side"]["p"],
        "probe_answer": probe["answer_side"]["p"],
        "warm_steps": ws.get("steps"),
        "batch_size": int(cfg.warmstart.batch_size),
        "planned_steps": ws.get("planned_steps"),
        "kept_step": ws.get("kept_step"),
        "checks": [{k: c[k] for k in ("step", "decision_accuracy", "search_side", "answer_side", "seconds")}
                   for c in ws.get("checks", [])],
        "loss_last": ws.get("loss_last"),
        "warm_seconds": warm_seconds,
        "eval_seconds": eval_seconds,
        "probe_seconds": probe_seconds,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "command": " ".join(sys.argv),
        "template": spec["template"],
        "set": spec["set"],
    }
    (out / "row.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def passes(row: dict[str, Any]) -> bool:
    def at_least(key: str, bound: float) -> bool:
        return row.get(key) is not None and row[key] >= bound

    return (at_least("em", 0.90) and at_least("em_single", 0.90) and at_least("em_multi", 0.85)
            and at_least("decision", 0.90) and at_least("probe_search", 0.85) and at_least("probe_answer", 0.85)
            and at_least("valid_format", 0.95))  # fmt: skip


def batch_size(row: dict[str, Any]) -> int:
    """A row's ``warmstart.batch_size``: recorded, else read from its variant's keys, else ``OLD_BATCH``."""
    if row.get("batch_size"):
        return int(row["batch_size"])
    keys = [x.split("=", 1)[1] for x in row.get("set", []) if x.startswith("warmstart.batch_size=")]
    return int(keys[-1]) if keys else OLD_BATCH


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [{**r, "warm_examples": (r.get("warm_steps") or 0) * batch_size(r)} for r in rows]
    def stats(key: str) -> dict[str, float]:
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            return {}
        return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "min": min(values), "max": max(values)}  # fmt: skip

    keys = ("em", "em_single", "em_multi", "searches_single", "searches_multi", "valid_format", "decision",
            "probe_search", "probe_answer", "warm_steps", "warm_examples", "kept_step", "warm_seconds")  # fmt: skip
    return {"seeds": sorted(r["seed"] for r in rows), "passes": [passes(r) for r in rows],
            **{k: stats(k) for k in keys}}  # fmt: skip


def verdict(summaries: dict[str, dict[str, Any]]) -> str:
    passing = {n: s for n, s in summaries.items() if len(s["seeds"]) >= 2 and all(s["passes"])}
    if passing:
        best = min(passing, key=lambda n: (passing[n]["warm_examples"]["mean"], passing[n]["warm_seconds"]["mean"]))
        return f"{best}: passes every tuning seed it ran on with the fewest training examples seen"
    if not summaries:
        return "no row yet"

    def balanced(n: str) -> float:
        s = summaries[n]
        return (s["em_single"].get("mean", 0.0) + s["em_multi"].get("mean", 0.0)) / 2

    best = max(summaries, key=balanced)
    return f"none passes every seed yet; highest kind-balanced EM: {best}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[100, 101])
    parser.add_argument("--runs", default="runs/warmstart_sweep")
    parser.add_argument("--num-test", type=int, default=48)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "warmstart_sweep.json"))
    args = parser.parse_args(argv)
    if FORBIDDEN_SEEDS & set(args.seeds):
        parser.error(f"seeds {sorted(FORBIDDEN_SEEDS & set(args.seeds))} are the demo's: tune on others")
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    done = {(r["variant"], r["seed"]) for r in results["rows"]}
    for name in args.variants:
        for seed in args.seeds:
            if (name, seed) in done:
                continue
            row = run_row(name, seed, Path(args.runs), args.num_test)
            results["rows"].append(row)
            by_variant = {n: [r for r in results["rows"] if r["variant"] == n] for n in VARIANTS}
            summaries = {n: summarize(rs) for n, rs in by_variant.items() if rs}
            results.update(rule=RULE, variants={n: VARIANTS[n] for n in VARIANTS}, summaries=summaries,
                           verdict=verdict(summaries), machine=f"{platform.processor() or platform.machine()}, "
                           f"{os.cpu_count()} cores")  # fmt: skip
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1) + "\n")
            print(json.dumps({k: row[k] for k in ("variant", "seed", "em", "em_single", "em_multi",
                                                  "searches_single", "searches_multi", "decision",
                                                  "warm_steps", "batch_size", "kept_step",
                                                  "warm_seconds")}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
