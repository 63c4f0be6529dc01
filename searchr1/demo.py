"""``searchr1 demo``: the whole pipeline on a laptop CPU in a few minutes.

1. generates the embedded synthetic world (a fictional corpus + questions no model can answer from
   memory) and indexes its corpus with BM25;
2. builds a tiny Qwen2-style model and a tokenizer trained on text of the world's language
   (``searchr1.models``), saved as a Hugging Face folder;
3. validates it (greedy, EM / F1, searches per question), trains it with GRPO for a few minutes,
   validates again, and prints the before / after table;
4. writes metrics.jsonl, TensorBoard logs, checkpoints and PNG plots under ``--out``.

    searchr1 demo                 # ~ a few minutes on 2 cores
    searchr1 demo --quick         # < 1 minute: a handful of steps
    searchr1 demo --out runs/demo --steps 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train a tiny model to search on the synthetic world, on CPU, in minutes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    parser.add_argument("--quick", action="store_true", help="a few steps only (smoke test, < 1 minute)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 20, --quick 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("overrides", nargs="*", help="extra dotted key=value config overrides")
    parser.set_defaults(func=_main)


def demo_overrides(
    out: Path, model_dir: Path, files: dict[str, Path], steps: int, quick: bool, seed: int
) -> list[str]:
    """The tiny CPU config with this demo's world, model and budget."""
    val = 8 if quick else 48
    return [
        f"model.path={model_dir}",
        f"data.train_files=[{files['train']}]",
        f"data.val_files=[{files['val']}]",
        f"retrieval.corpus={files['corpus']}",
        f"trainer.out_dir={out}",
        f"trainer.total_steps={steps}",
        f"trainer.val_every={steps}",
        "trainer.val_before_train=true",
        f"trainer.val_max_samples={val}",
        f"trainer.save_every={steps}",
        f"seed={seed}",
    ]


def build_world_and_model(out: Path, seed: int, quick: bool) -> tuple[dict[str, Path], Path]:
    from searchr1.data.prompts import SEARCH_R1_INSTRUCTION
    from searchr1.data.synth import SynthConfig, generate_world, pretraining_texts, write_world
    from searchr1.models import save_tiny_checkpoint

    synth = SynthConfig(num_entities=120 if quick else 300, seed=seed)
    world = generate_world(synth)
    files = write_world(world, out / "world")
    model_dir = out / "tiny-model"
    if not (model_dir / "config.json").is_file():
        texts = pretraining_texts(synth)
        texts += [
            SEARCH_R1_INSTRUCTION.replace("{question}", q["question"]) for q in world.splits["train"][:200]
        ]
        save_tiny_checkpoint(model_dir, texts, seed=seed, vocab_size=2048)
    return files, model_dir


def _table(before: dict[str, float], after: dict[str, float]) -> str:
    keys = [k for k in sorted(set(before) | set(after)) if k.startswith("val/")]
    width = max([len(k) for k in keys] + [10])
    lines = [f"{'metric'.ljust(width)}  {'before':>8}  {'after':>8}"]
    for k in keys:
        b, a = before.get(k), after.get(k)
        fb = f"{b:8.3f}" if isinstance(b, int | float) else f"{'-':>8}"
        fa = f"{a:8.3f}" if isinstance(a, int | float) else f"{'-':>8}"
        lines.append(f"{k.ljust(width)}  {fb}  {fa}")
    return "\n".join(lines)


def run_demo(out: str | Path, quick: bool = False, steps: int | None = None, seed: int = 0,
             overrides: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the demo; returns the training summary plus ``before`` / ``after`` validation metrics."""
    from searchr1.config import load_config
    from searchr1.trainer.configs import shipped_config
    from searchr1.trainer.loop import RLTrainer

    out = Path(out)
    steps = steps if steps is not None else (3 if quick else 20)
    t0 = time.perf_counter()
    print(f"[demo] building the synthetic world and a tiny model under {out} ...", file=sys.stderr)
    files, model_dir = build_world_and_model(out, seed, quick)
    cfg = load_config(
        shipped_config("tiny_cpu"),
        [*demo_overrides(out, model_dir, files, steps, quick, seed), *(overrides or [])],
    )
    print(f"[demo] training {steps} steps of {cfg.algorithm.advantage} (batch {cfg.trainer.batch_size} x "
          f"{cfg.rollout.n}) ...", file=sys.stderr)  # fmt: skip
    summary = RLTrainer(cfg).train()
    before = summary.get("first_val", {})
    after = {k: v for k, v in summary.get("last", {}).items() if k.startswith("val/")}
    summary.update(before=before, after=after, seconds=time.perf_counter() - t0)
    return summary


def _main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(max(1, args.threads))
    summary = run_demo(args.out, quick=args.quick, steps=args.steps, seed=args.seed, overrides=args.overrides)
    print()
    print("validation before / after training (greedy):")
    print(_table(summary["before"], summary["after"]))
    last = summary.get("last", {})
    print()
    print(f"training reward: last step {last.get('reward/mean', float('nan')):.3f}; "
          f"searches / trajectory {last.get('rollout/searches', float('nan')):.2f}")  # fmt: skip
    print(f"run folder: {summary['out_dir']}  ({summary['seconds']:.0f} s)")
    for path in summary.get("plots", []):
        print(f"plot: {path}")
    print(f"checkpoint: {summary.get('checkpoint')}")
    print(
        f"next: searchr1 report {summary['out_dir']}   |   tensorboard --logdir {summary['out_dir']}/tensorboard"
    )
    return 0
