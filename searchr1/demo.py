"""``searchr1 demo``: the learning demo: RL with outcome rewards on a tiny model and the synthetic world.

RL teaches the tiny model to search and to answer from the passage it found (searches per question
rise to 1), but its EM target (+0.3 after RL) is not reached: no configuration tried reaches it
within the 15-minute, 2-core budget (README, "Round 8").

For each seed: generates the embedded synthetic world and its BM25 index, prepares the tiny starting
model (pre-trained self-supervised on other worlds, cached in runs/starting-models), evaluates it on
held-out test questions, trains it with RL (GRPO by default), evaluates again, and repeats the same
with search disabled (a search engine that finds nothing). Prints the before / after table (EM, F1,
searches per question), one trajectory before and after, and where the plots and the HTML report
are; writes ``summary.json`` in the run folder. See ``searchr1.learning_demo``.

    searchr1 demo                         # 3 seeds (0 1 2)
    searchr1 demo --quick                 # 1 seed, fewer steps
    searchr1 demo --out runs/demo --algorithm ppo
    searchr1 demo --seeds 4 5 trainer.actor_lr=1e-4 rollout.n=16
    searchr1 demo --probe 32              # only: how the starting model's sampled rollouts behave
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="RL teaches a tiny model to search the synthetic world, on CPU, in minutes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from searchr1.learning_demo import add_arguments

    add_arguments(parser)
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from searchr1.learning_demo import run_from_args

    return run_from_args(args)
