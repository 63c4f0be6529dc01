"""RL's steps after a finished warm start, on a tuning seed: does RL keep the decision the warm start learnt?

    python benchmarks/rl_after_warmstart.py 100 base
    python benchmarks/rl_after_warmstart.py 100 superfluous03 reward.step_superfluous=0.3

Starts from the warm start that ``benchmarks/warmstart_sweep.py --variants zero_e4_stop`` left in
``--sweep-runs`` (``<variant>/seed_<seed>/run/warmstart/model``), runs the demo's RL recipe (its 4 steps,
validation before and after) with the given overrides, and prints validation EM by kind and searches per
single-hop question at each validation step; one JSON row per run is written to ``<runs>/<name>/seed_<seed>/``
and appended to ``benchmarks/results/rl_after_warmstart.json``. Tuning seeds only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from warmstart_sweep import FORBIDDEN_SEEDS, tuning_world  # the demo's seeds, never tuned on (same folder)

from searchr1.demo.runs import demo_trainer

KEEP = (
    "val/em",
    "val/single-hop/em",
    "val/multi-hop/em",
    "val/single-hop/searches",
    "val/multi-hop/searches",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("seed", type=int)
    parser.add_argument("name")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--sweep-runs", default="runs/warmstart_sweep")
    parser.add_argument("--variant", default="zero_e4_stop")
    parser.add_argument("--runs", default="runs/rl_after_warmstart")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rl_after_warmstart.json"))
    args = parser.parse_args(argv)
    if args.seed in FORBIDDEN_SEEDS:
        parser.error(f"seed {args.seed} is one of the demo's: tune on others")
    root = Path(args.runs) / args.name / f"seed_{args.seed}"
    root.mkdir(parents=True, exist_ok=True)
    warm = Path(args.sweep_runs) / args.variant / f"seed_{args.seed}" / "run" / "warmstart" / "model"
    settings, prompt, retriever, (train, val, _) = tuning_world(args.seed, root, "instruct", num_test=48)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    extra = ["warmstart.epochs=0", "trainer.progress_bar=false", *args.overrides]
    trainer = demo_trainer(settings, args.seed, warm, retriever, train, val, root / "run", prompt, extra)
    result = trainer.train()
    lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
    vals = [json.loads(line) for line in lines if '"val/em"' in line]
    row = {
        "name": args.name, "seed": args.seed, "overrides": args.overrides, "updates": result.get("updates"),
        "seconds": time.perf_counter() - t0, "val": [{"step": v["step"], **{k: v.get(k) for k in KEEP}} for v in vals],
    }  # fmt: skip
    (root / "row.json").write_text(json.dumps(row, indent=1) + "\n")
    out = Path(args.out)
    rows = json.loads(out.read_text())["rows"] if out.is_file() else []
    rows = [r for r in rows if (r["name"], r["seed"]) != (args.name, args.seed)] + [row]
    out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
