"""``searchr1 train``: RL training from a YAML config plus dotted overrides.

searchr1 train --config tiny_cpu trainer.total_steps=50 trainer.out_dir=runs/tiny
    (checkpoints: runs/tiny/checkpoints/step_000050/model is a Hugging Face folder for `searchr1 eval --model`)
    (with trainer.keep_best the last line names the kept best: its step, validation score and folder)
searchr1 train --config grpo_qwen2.5_3b data.train_files=[data/train.parquet] data.val_files=[data/test.parquet]
torchrun --nproc_per_node 8 -m searchr1 train --config ppo_qwen2.5_3b
searchr1 train --plot runs/tiny                 # (re)write the PNG plots of a run
searchr1 train --config tiny_cpu --print-config   # the resolved configuration, nothing trained
searchr1 train --list-keys                        # every key, its default and doc (--plugin M: with M's names)
searchr1 train --export runs/tiny export/tiny     # copy a run's newest policy (a from_pretrained folder
                                                  #  that carries its prompt template for eval and ask)
searchr1 train --export runs/tiny export/best --best   # the kept best validated one (trainer.keep_best)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from searchr1.cli_common import add_plugin_flag, help_lists_names
from searchr1.config import ConfigError, describe, load_config, resolve_config_path, to_dict
from searchr1.errors import UserFacingError
from searchr1.plugins import PluginError, import_plugins
from searchr1.trainer.plots import write_plots


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a policy with RL (PPO, GRPO, RLOO, REINFORCE, REINFORCE++)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    help_lists_names(parser)
    parser.add_argument(
        "--config",
        help="YAML config file (or the name of a shipped one: tiny_cpu, grpo_qwen2.5_3b, ppo_qwen2.5_3b, ...); keys not given keep their defaults",
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10"
    )
    add_plugin_flag(parser)
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument(
        "--list-keys", action="store_true", help="list every config key with its default and doc"
    )
    parser.add_argument("--plot", metavar="RUN_DIR", help="write the PNG plots of an existing run and exit")
    parser.add_argument(
        "--export",
        nargs=2,
        metavar=("RUN_DIR", "OUT"),
        help="copy the run's newest checkpointed policy (a from_pretrained folder, with the prompt template the "
        "run was trained with: eval and ask use it) to OUT and exit",
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help="with --export: the policy of the best validation EM (trainer.keep_best=val_em) instead",
    )
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.list_keys:
        try:
            import_plugins(args.plugin)
        except PluginError as exc:
            raise UserFacingError(str(exc)) from exc
        for key, default, doc in describe():
            print(f"{key} = {default}\n    {doc}")
        return 0
    if args.export:
        from searchr1.trainer.checkpoint import export_policy  # torch

        try:
            folder, origin = export_policy(*args.export, best=args.best)
        except (FileNotFoundError, FileExistsError) as exc:
            raise UserFacingError(str(exc)) from exc
        print(f"{folder}  ({origin})")
        return 0
    if args.plot:
        if not (Path(args.plot) / "metrics.jsonl").is_file():
            raise UserFacingError(f"{args.plot}: no metrics.jsonl (not a run folder?)")
        for path in write_plots(args.plot):
            print(path)
        return 0
    try:
        cfg = load_config(resolve_config_path(args.config), args.overrides, plugins=args.plugin)
    except ConfigError as exc:
        raise UserFacingError(str(exc)) from exc
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return 0
    from searchr1.trainer.loop import RLTrainer, TrainingStopped  # torch

    if cfg.warmstart.enabled:  # the warm start first (resumed or found done), then RL from its policy
        from searchr1.trainer.warmstart import WarmStartError, run_warm_start

        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise UserFacingError(
                "warmstart.epochs > 0 under torchrun: run `searchr1 warmstart` first, then train with "
                "model.path=<its model folder> and warmstart.epochs=0"
            )
        try:
            cfg.model.path = str(run_warm_start(cfg).model_dir)
        except (WarmStartError, FileNotFoundError) as exc:
            raise UserFacingError(str(exc)) from exc
    trainer = None
    try:
        try:
            trainer = RLTrainer(cfg)
            trainer.setup()
        except (ValueError, FileNotFoundError) as exc:  # bad data / paths / world size: no traceback
            raise UserFacingError(str(exc)) from exc
        try:
            summary = trainer.train()
        except TrainingStopped as exc:
            raise UserFacingError(str(exc)) from exc
    finally:
        if trainer is not None:
            trainer.close()  # the rollout engine's threads, a vLLM server
    if trainer.dist.is_main:
        last = summary.get("last", {})
        keys = ("reward/mean", "val/em", "rollout/searches", "actor/kl", "actor/entropy")
        shown = ", ".join(f"{k}={last[k]:.4g}" for k in keys if isinstance(last.get(k), int | float))
        print(f"done: step {summary['step']} {shown}", file=sys.stderr)
        print(f"run folder: {summary['out_dir']}  checkpoint: {summary.get('checkpoint')}")
        kept = _kept_best(summary, cfg.trainer.keep_best)
        if kept:
            print(kept)
    return 130 if summary.get("interrupted") else 0


def _kept_best(summary: dict[str, Any], keep_best: str) -> str | None:
    """The line that names the policy a run ships as its best (``trainer.keep_best``): its step, validation
    score and folder; None when it kept none."""
    from searchr1.trainer.checkpoint import best_checkpoint

    kept = best_checkpoint(summary["out_dir"]) if keep_best != "none" and summary.get("best") else None
    if kept is None:
        return None
    folder, info = kept
    score = {"val_em_by_kind": "validation EM (mean over kinds)"}.get(keep_best, "validation EM")
    return (
        f"kept best: step {info['step']}, {score} {info['em']:.3f}: {folder / 'model'}  "
        f"(searchr1 train --export {summary['out_dir']} OUT --best copies it)"
    )
