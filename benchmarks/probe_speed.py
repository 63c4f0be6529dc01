"""The decision probe batched (the slot decoder) against one question at a time, and against evaluating the
same questions, on the demo's model and world.

    python benchmarks/probe_speed.py                       # 48 test questions of world seed 0
    python benchmarks/probe_speed.py --rows new eval       # leave the one-at-a-time probe out

SmolLM2-135M-Instruct (``smollm2-135m-instruct``) as packaged, untrained; the demo's synthetic world (its
``DemoSettings().world`` knobs, ``--questions`` test questions), BM25, the demo's prompt (``instruct_2hop``)
and ``rollout`` section (``configs/demo_learning.yaml``: 64 tokens a turn, one passage a search). Rows, all
in this process on one loaded model:

* ``new``: ``decision_probe(..., batch_size=64)``, the batched probe;
* ``old``: ``decision_probe(..., batch_size=1)``, one question at a time on the Hugging Face modules (the
  probe as it was before batching);
* ``eval``: ``searchr1.evaluation.evaluate`` in agent mode at batch 64 (the demo's evaluation) on the same
  questions, with the HF rollout engine.

Per row the wall seconds and the process's CPU seconds; for the two probes the largest difference of a
question's ``p_search`` and how many greedy turns and opened tags agree. The load average (1 minute) is read
before and after each row: on a shared machine, other work inflates the wall seconds. Writes
``benchmarks/results/probe_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "probe_speed.json"


def _setup(questions: int, seed: int, folder: Path) -> dict[str, Any]:
    """The demo's world, search, prompt, rollout config and model."""
    from searchr1.data.synth import SynthConfig, generate_world, write_world
    from searchr1.demo.runs import build_bm25
    from searchr1.demo.settings import DemoSettings, rl_config, write_prompt
    from searchr1.models import load_model, load_tokenizer, resolve_model

    settings = DemoSettings()
    world = generate_world(SynthConfig(seed=seed, **{**settings.world, "num_test": questions}))
    paths = write_world(world, folder / "world")
    test = [json.loads(line) for line in paths["test"].read_text().splitlines() if line.strip()]
    prompt = write_prompt(folder, settings.template)
    cfg = rl_config(settings, seed, folder / "run", prompt)
    path = resolve_model(settings.model)
    model = load_model(path).eval()
    return {
        "test": test,
        "prompt": prompt,
        "cfg": cfg,
        "model": model,
        "tokenizer": load_tokenizer(path),
        "retriever": build_bm25(paths["corpus"]),
    }


def _timed(fn: Any) -> tuple[Any, dict[str, float]]:
    load_before = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return out, {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_before": round(load_before, 2),
                 "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=48, help="test questions of the world")
    ap.add_argument("--seed", type=int, default=0, help="world seed")
    ap.add_argument("--rows", nargs="+", default=["new", "old", "eval"], choices=["new", "old", "eval"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from searchr1.evaluation import evaluate
    from searchr1.evaluation.probe import decision_probe
    from searchr1.rollout.gold import GoldWriter
    from searchr1.rollout.hf import HFRolloutEngine

    rows: dict[str, dict[str, Any]] = {}
    probes: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        s = _setup(args.questions, args.seed, Path(tmp))
        cfg, model, tokenizer = s["cfg"], s["model"], s["tokenizer"]
        topk = cfg.retrieval.topk
        writer = GoldWriter(tokenizer, cfg.rollout, s["retriever"], topk)
        for name in args.rows:
            if name in ("new", "old"):
                size = 64 if name == "new" else 1

                def run(size: int = size) -> dict[str, Any]:
                    return decision_probe(model, tokenizer, s["test"], str(s["prompt"]), writer, size)

                probes[name], rows[name] = _timed(run)
                rows[name]["questions_probed"] = len(probes[name]["rows"])
                rows[name]["left_out"] = probes[name]["answer_side"]["left_out"]
            else:
                engine = HFRolloutEngine(model, tokenizer, s["retriever"], cfg.rollout, topk=topk)

                def run_eval(engine: Any = engine) -> dict[str, Any]:
                    return evaluate(engine, s["test"], tokenizer=tokenizer, mode="agent", batch_size=64,
                                    out_dir=Path(tmp) / "eval", resume=False, template=str(s["prompt"]),
                                    topk=topk, seed=args.seed)  # fmt: skip

                _, rows[name] = _timed(run_eval)
                rows[name]["questions_evaluated"] = len(s["test"])
                engine.close()
            print(f"{name}: {rows[name]}", flush=True)
    agreement = None
    if "new" in probes and "old" in probes:
        new, old = probes["new"]["rows"], probes["old"]["rows"]
        agreement = {
            "max_abs_p_search_diff": max(
                abs(a["p_search"] - b["p_search"]) for a, b in zip(new, old, strict=True)
            ),
            "same_turns": sum(a["turn"] == b["turn"] for a, b in zip(new, old, strict=True)),
            "same_opened": sum(a["opened"] == b["opened"] for a, b in zip(new, old, strict=True)),
            "rows": len(new),
            "decision_accuracy": {k: probes[k]["decision_accuracy"] for k in ("new", "old")},
        }
    result = {
        "questions": args.questions,
        "world_seed": args.seed,
        "threads": args.threads,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "rows": rows,
        "agreement": agreement,
    }
    print(f"\n{'row':<6} {'wall s':>8} {'cpu s':>8} {'load 1m before/after':>22}")
    for name, row in rows.items():
        print(
            f"{name:<6} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} {row['load_before']:>11.2f}/{row['load_after']:<10.2f}"
        )
    if "new" in rows and "old" in rows:
        print(f"new vs old: {rows['old']['wall_s'] / rows['new']['wall_s']:.2f}x faster")
    if "new" in rows and "eval" in rows:
        print(
            f"new vs eval: {rows['eval']['wall_s'] / rows['new']['wall_s']:.2f}x (eval seconds / probe seconds)"
        )
    if agreement:
        print(f"agreement: {agreement}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
