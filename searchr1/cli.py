"""The ``searchr1`` command. Each package registers its own subcommands here.

searchr1 index build --retriever bm25 --corpus corpus.jsonl --out idx/
searchr1 search --index idx/ "who founded Acme"
searchr1 serve --index idx/ --port 8000
searchr1 data synth --out world/
searchr1 train --config tiny_cpu trainer.total_steps=50
searchr1 eval --model runs/x/checkpoints/latest --data test.jsonl --index idx/
searchr1 bench retrieval --quick
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from searchr1.errors import UserFacingError

# Modules exposing ``register(subparsers)``; heavy imports happen inside their handlers so that
# ``searchr1 --help`` stays fast.
COMMAND_MODULES = [
    "searchr1.demo",
    "searchr1.retrieval.cli",
    "searchr1.data.cli",
    "searchr1.trainer.cli",
    "searchr1.evaluation.cli",
    "searchr1.bench.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="searchr1",
        description="Train, evaluate and serve language models that reason and search (Search-R1).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a package still under construction
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
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
