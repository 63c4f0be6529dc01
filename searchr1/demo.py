"""``searchr1 demo``: the learning demo: RL with outcome rewards teaches SmolLM2-135M-Instruct to search
the embedded synthetic world, on a CPU.

For each seed: generates the synthetic world and its BM25 index, evaluates the starting model on
held-out questions (single- and multi-hop apart), trains it with RL (GRPO + LoRA by default), evaluates
again, and repeats the same with search disabled (a search engine that finds nothing). The first seed
also gets a zero-shot-prompt row and, when the shared FlashRAG sample is found, an evaluation on real
NQ questions. Prints the before / after table, right answers per kind of question, one trajectory
before and after, and where the plots and HTML reports are; writes ``summary.json`` in the run
folder. See ``searchr1.learning_demo``.

    searchr1 demo                         # 3 seeds (0 1 2), controls, zero-shot row, NQ sample
    searchr1 demo --quick                 # seed 0, the search run only
    searchr1 demo --out runs/demo --algorithm rloo
    searchr1 demo trainer.actor_lr=1e-4 rollout.n=16 --seeds 4 5
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="RL teaches SmolLM2-135M-Instruct to search the synthetic world, on a CPU, in minutes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from searchr1.learning_demo import add_arguments

    add_arguments(parser)
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from searchr1.learning_demo import run_from_args

    return run_from_args(args)
