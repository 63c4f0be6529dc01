"""The ``searchr1`` command. Each package registers its own subcommands here.

searchr1 data synth --out data/world                  (corpus.jsonl, train/val/test.jsonl)
searchr1 index build --retriever bm25 --corpus data/world/corpus.jsonl --out indexes/world
searchr1 search --index indexes/world "who founded the Quillon Press"
searchr1 serve --index indexes/world --port 8000
searchr1 train --config tiny_cpu trainer.total_steps=50 trainer.out_dir=runs/tiny
searchr1 eval --model runs/tiny/checkpoints/step_000050/model --data data/world/test.jsonl --index indexes/world
searchr1 bench retrieval --quick
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence

from searchr1.errors import UserFacingError
from searchr1.memory import keep_freed_memory
from searchr1.rollout.scratch import sweep_orphans

# Modules exposing ``register(subparsers)``; heavy imports happen inside their handlers so that
# ``searchr1 --help`` stays fast.
COMMAND_MODULES = [
    "searchr1.demo.cli",
    "searchr1.retrieval.cli",
    "searchr1.data.cli",
    "searchr1.trainer.cli",
    "searchr1.trainer.warmstart_cli",
    "searchr1.evaluation.cli",
    "searchr1.evaluation.ask_cli",
    "searchr1.report.cli",
    "searchr1.bench.cli",
]


NOISY_WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # transformers 5.x deprecates the `past_key_values` argument that the KV-cached rollout engine
    # passes (searchr1/rollout/kv.py); printed by every command that generates
    (FutureWarning, r"`past_key_values` is deprecated"),
    # peft asks transformers whether gradient checkpointing is on through the deprecated name
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)
"""Third-party ``warnings`` the command line hides: (category, regex matched at the message's start)."""
NOISY_LOG_RECORDS: dict[str, tuple[str, ...]] = {
    "transformers.utils.generic": ("`past_key_values`/`cache_params` are deprecated",),
}
"""Third-party log messages the command line hides: logger name -> message prefixes."""
SHOW_WARNINGS_ENV = "SEARCHR1_SHOW_WARNINGS"


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


_quieted = False


def quiet_third_party_warnings() -> None:
    """Hide the known-noisy library warnings above, once per process (unless SEARCHR1_SHOW_WARNINGS=1)."""
    global _quieted
    if _quieted or os.environ.get(SHOW_WARNINGS_ENV, "") not in ("", "0"):
        return
    _quieted = True
    for category, message in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, prefixes in NOISY_LOG_RECORDS.items():
        logging.getLogger(name).addFilter(_DropPrefixes(prefixes))
    # transformers' "Loading weights" bar on every model load (a ~1 s load of a local folder); read by
    # transformers when it is first imported, so no import here
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="searchr1",
        description="Train, evaluate and serve language models that reason and search (Search-R1).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    quiet_third_party_warnings()
    keep_freed_memory()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    sweep_orphans()  # the vLLM weights folders (in RAM) of runs that were killed: one line if any is freed
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserFacingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":  # `python -m searchr1.cli`: use the package's own module so errors match
    from searchr1.cli import main as _main

    sys.exit(_main())
