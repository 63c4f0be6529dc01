"""What a warm-start step costs with the adapter on every layer and on the top layers only (the layers below
run once per trajectory, ``warmstart.lora_layers``), measured in one process on the same steps.

    python benchmarks/warmstart_step_cost.py --seed 100 --top 10 --rounds 5

On a tuning seed's world with the demo's warm-start settings: two copies of the starting model, one with the
demo's adapter (every layer), one with the adapter on the top ``--top`` layers and the frozen trunk attached.
The top-layer stage first runs one pass over the training trajectories (every step computes the trunk: the
"first pass" cost), then the two stages take the same steps in alternating rounds (``--rounds``, the order
swapped each round), the top-layer stage now reading every trajectory's trunk. Prints a table and writes
``benchmarks/results/warmstart_step_cost.json``: seconds per step (median over rounds) and the ratios to the
every-layer step, and the cost of a warm start of S steps over n trajectories in every-layer steps,

    cost(S) = min(S, P) * first + max(0, S - P) * cached      (P = steps of one pass)

Time it alone on the machine (load average recorded before and after).
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

sys.path.insert(0, str(Path(__file__).parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", default="runs/warmstart_step_cost")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "warmstart_step_cost.json"))
    args = parser.parse_args(argv)

    import torch
    from warmstart_sweep import HOLDOUT, tuning_world

    from searchr1.data.prompts import resolve_template
    from searchr1.demo.settings import resolve_starting_model, rl_config
    from searchr1.models import load_model, load_tokenizer
    from searchr1.rollout.gold import GoldWriter
    from searchr1.trainer.components import _apply_lora
    from searchr1.trainer.warmstart import WarmStart, gold_examples
    from searchr1.trainer.warmstart_check import holdout_split

    out = Path(args.runs) / f"seed_{args.seed}"
    settings, prompt, retriever, (train, _, _) = tuning_world(args.seed, out, "instruct", 48)
    model_dir = resolve_starting_model(settings.model)
    keys = ["warmstart.epochs=4", "warmstart.max_examples=0", *HOLDOUT]
    cfg = rl_config(settings, args.seed, out / "run", prompt, model_dir, keys)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    template = resolve_template(cfg.data.template, tokenizer)
    writer = GoldWriter(tokenizer, cfg.rollout, retriever, cfg.retrieval.topk)
    _, trained = holdout_split(train, cfg.warmstart.holdout, args.seed)
    examples = gold_examples([train[i] for i in trained], tokenizer, template, writer)

    def stage(top: int) -> WarmStart:
        torch.manual_seed(args.seed)
        run_cfg = rl_config(settings, args.seed, out / "run", prompt, model_dir, [*keys, f"warmstart.lora_layers={top}"])
        policy = _apply_lora(load_model(model_dir), run_cfg.model, None, top_layers=top)
        return WarmStart(run_cfg, policy, tokenizer, examples, out / f"top{top}", log=lambda line: None)

    every, top = stage(0), stage(args.top)
    with top.frozen_trunk() as trunk:
        if trunk is None:
            raise SystemExit("the fused decoder does not apply to this model: nothing to compare")
        return measure(args, cfg, examples, every, top, trunk)


def measure(args: argparse.Namespace, cfg: Any, examples: Any, every: Any, top: Any, trunk: Any) -> int:
    """The timed steps of ``every`` (the adapter on every layer) and ``top`` (its trunk attached)."""
    import torch
    from warmstart_sweep import load_average

    from searchr1.precision import cpu_has_fast_bf16

    layers = trunk.layers + args.top
    load_before = load_average()

    def timed(st: Any, rows: list[int]) -> float:
        t0 = time.perf_counter()
        st.train_step(rows)
        return time.perf_counter() - t0

    per_pass = -(-len(examples.trajectories) // cfg.warmstart.batch_size)
    first = [timed(top, top.steps[i]) for i in range(per_pass)]
    steps = top.steps[per_pass : per_pass + args.rounds]
    every_s, cached_s = [], []
    for r, rows in enumerate(steps):
        pair = [(every, every_s), (top, cached_s)]
        for st, sink in pair if r % 2 == 0 else pair[::-1]:
            sink.append(timed(st, rows))
    full, first_m, cached = statistics.median(every_s), statistics.median(first), statistics.median(cached_s)

    def cost(s: int) -> float:
        return (min(s, per_pass) * first_m + max(0, s - per_pass) * cached) / full

    result = {
        "benchmark": "warmstart_step_cost",
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"bfloat16 units: {cpu_has_fast_bf16()}, {torch.get_num_threads()} threads",
        "seed": args.seed,
        "layers": layers,
        "top": args.top,
        "trajectories": len(examples.trajectories),
        "batch_size": cfg.warmstart.batch_size,
        "steps_per_pass": per_pass,
        "every_layer_step_s": every_s,
        "top_first_pass_step_s": first,
        "top_cached_step_s": cached_s,
        "median_s": {"every_layer": full, "top_first_pass": first_m, "top_cached": cached},
        "ratio": {"top_first_pass": first_m / full, "top_cached": cached / full},
        "cost_in_every_layer_steps": {str(s): cost(s) for s in (40, 50, 60, 70, 77)},
        "trunk": {"rows": len(trunk), "gib": trunk.bytes / 2**30, "hits": trunk.hits, "misses": trunk.misses},
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    print(f"{'step':<28}{'s (median)':>12}{'x every-layer':>15}")
    for name, value in result["median_s"].items():
        print(f"{name:<28}{value:>12.2f}{value / full:>15.2f}")
    print("cost of S steps in every-layer steps:", {k: round(v, 1) for k, v in result["cost_in_every_layer_steps"].items()})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
