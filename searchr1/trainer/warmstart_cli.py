"""``searchr1 warmstart``: supervised LoRA on the training questions' gold trajectories, before RL.

searchr1 warmstart --config demo_learning warmstart.epochs=1 trainer.out_dir=runs/ws
    (runs/ws/warmstart/model: the warm-started policy; `searchr1 train` with the same config and
     warmstart.epochs > 0 finds it there and starts RL from it; a killed warm start resumes)
searchr1 warmstart --config demo_learning warmstart.epochs=1 data.train_files=[data/hotpotqa/train.jsonl] \\
    retrieval.corpus=data/hotpotqa/corpus.jsonl trainer.out_dir=runs/ws-hotpotqa
"""

from __future__ import annotations

import argparse
from typing import Any

from searchr1.cli_common import add_plugin_flag
from searchr1.config import ConfigError, load_config, resolve_config_path
from searchr1.errors import UserFacingError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "warmstart",
        help="supervised LoRA on gold trajectories (search, read, search what the passage names, answer) before RL",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML config file or the name of a shipped one (as for train)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. warmstart.epochs=1")
    add_plugin_flag(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(resolve_config_path(args.config), args.overrides, plugins=args.plugin)
    except ConfigError as exc:
        raise UserFacingError(str(exc)) from exc
    if not cfg.warmstart.enabled:
        raise UserFacingError("warmstart.epochs is 0: nothing to do (set warmstart.epochs=1, for example)")
    from searchr1.trainer.warmstart import WarmStartError, run_warm_start  # torch

    try:
        result = run_warm_start(cfg, progress=not args.no_progress)
    except (WarmStartError, FileNotFoundError) as exc:
        raise UserFacingError(str(exc)) from exc
    print(result.model_dir)
    return 0
