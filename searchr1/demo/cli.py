"""``searchr1 demo``: the learning demo: RL with outcome rewards teaches SmolLM2-135M-Instruct to search
the embedded synthetic world, on a CPU.

For each seed: generates the synthetic world and its BM25 index, evaluates the starting model on
held-out questions (single- and multi-hop apart), trains it with RL (GRPO + LoRA by default), evaluates
again, and repeats the same with search disabled (a search engine that finds nothing) and with the
outcome reward alone (the ablation). The first seed also gets a zero-shot-prompt row and, when the
shared FlashRAG sample is found, an evaluation on real NQ questions. Prints the before / after table,
right answers per kind of question, one trajectory before and after, and where the plots and HTML
reports are; writes ``summary.json`` in the run folder. See ``searchr1.demo``.

    searchr1 demo                         # 3 seeds (0 1 2), controls, ablation, zero-shot row, NQ sample
    searchr1 demo --quick                 # seed 0, the search run only
    searchr1 demo --out runs/demo --algorithm rloo
    searchr1 demo trainer.actor_lr=1e-4 rollout.n=16 --seeds 4 5
    searchr1 demo --only no_search --seeds 0 1 2      # the search-disabled controls alone
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from searchr1.demo import hotpotqa_cli
from searchr1.demo.settings import DEFAULT_TEMPLATE, RUN_NAMES, SUMMARY_FILE, DemoSettings, check_settings
from searchr1.errors import UserFacingError
from searchr1.models import DEFAULT_MODEL


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="RL teaches SmolLM2-135M-Instruct to search the synthetic world, on a CPU, in minutes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run_from_args)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--out", default=None, help="run folder (default: a new runs/demo-<time>)")
    parser.add_argument(
        "--quick", action="store_true", help="seed 0, the search run only (no control, zero-shot or NQ runs)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds (default 0 1 2; --quick 0)")
    parser.add_argument(
        "--algorithm", default="grpo", help="grpo (default) | ppo | rloo | reinforce | reinforce_plus_plus"
    )
    parser.add_argument("--steps", type=int, default=0, help="RL steps per run (default: the recipe's)")
    parser.add_argument("--no-control", action="store_true", help="skip the search-disabled control runs")
    parser.add_argument(
        "--no-ablation",
        action="store_true",
        help="skip the ablation runs (RL alone without the warm start, the recipe without guidance, and with Search-R1's outcome reward alone)",
    )
    parser.add_argument("--no-zero-shot", action="store_true", help="skip the zero-shot prompt row")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=RUN_NAMES,
        default=None,
        metavar="RUN",
        help=f"run only these runs of each seed ({', '.join(RUN_NAMES)}); e.g. --only no_search runs the "
        "search-disabled control alone",
    )
    parser.add_argument(
        "--num-test",
        type=int,
        default=None,
        help="held-out test questions evaluated before and after (default 64; --quick 48)",
    )
    parser.add_argument(
        "--nq-sample",
        default=None,
        help="FlashRAG sample folder for the real-data evaluation (default: shared/data/flashrag-sample "
        "when found; '' for none)",
    )
    parser.add_argument(
        "--hotpotqa-sample",
        default=None,
        help="HotpotQA sample folder (test.jsonl) for the transfer row (default: shared/data/hotpotqa-sample "
        "when found; '' for none)",
    )
    parser.add_argument(
        "--hotpotqa-questions",
        type=int,
        default=None,
        help="the transfer row's questions: the first N HotpotQA test questions (default 128; 0: all 497)",
    )
    parser.add_argument(
        "--threads", type=int, default=hotpotqa_cli.DEFAULT_THREADS, help="torch CPU threads (default 2)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at the same time, each in its own process pinned to its share of the cores "
        "(default 1: one run after another with --threads threads); --data hotpotqa: the starting model's "
        "evaluations, rl and each warm_rl seed at once, the warm start in the main process",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"starting model (default {DEFAULT_MODEL})")
    parser.add_argument(
        "--template",
        default=None,
        help=f"prompt template (data.template; default {DEFAULT_TEMPLATE}; with --data hotpotqa instruct_2hop)",
    )
    hotpotqa_cli.add_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="extra dotted key=value overrides of the RL config")


def settings_from_args(args: argparse.Namespace) -> DemoSettings:
    settings = DemoSettings.quick_settings() if args.quick else DemoSettings()
    settings = replace(
        settings,
        algorithm=args.algorithm,
        steps=args.steps or settings.steps,
        no_search=settings.no_search and not args.no_control,
        outcome_only=settings.outcome_only and not args.no_ablation,
        no_guidance=settings.no_guidance and not args.no_ablation,
        rl_only=settings.rl_only and not args.no_ablation,
        zero_shot_template="" if args.no_zero_shot else settings.zero_shot_template,
        nq_sample=settings.nq_sample if args.nq_sample is None else args.nq_sample,
        hotpotqa_sample=settings.hotpotqa_sample if args.hotpotqa_sample is None else args.hotpotqa_sample,
        hotpotqa_questions=settings.hotpotqa_questions
        if args.hotpotqa_questions is None
        else args.hotpotqa_questions,
        overrides=[*settings.overrides, *args.overrides],
        model=args.model,
        template=args.template or DEFAULT_TEMPLATE,
        num_test=settings.num_test if args.num_test is None else args.num_test,
        jobs=args.jobs,
    )
    if args.only:
        zero_shot = settings.zero_shot_template or DemoSettings().zero_shot_template
        settings = replace(
            settings,
            search="search" in args.only,
            no_search="no_search" in args.only,
            no_guidance="no_guidance" in args.only,
            rl_only="rl_only" in args.only,
            outcome_only="outcome_only" in args.only,
            zero_shot_template=zero_shot if "zero_shot" in args.only else "",
        )
    if args.seeds:
        settings = replace(settings, seeds=tuple(args.seeds))
    return settings


def run_from_args(args: argparse.Namespace) -> int:
    if (status := hotpotqa_cli.run_if_hotpotqa(args)) is not None:
        return status
    import torch

    from searchr1.demo.console import print_report, write_reports
    from searchr1.demo.runs import run_learning_demo

    torch.set_num_threads(max(1, args.threads))
    settings = settings_from_args(args)
    out = Path(args.out) if args.out else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    try:
        check_settings(out, settings)
    except ValueError as exc:  # bad --algorithm / override: a clean message before anything is built
        raise UserFacingError(str(exc)) from exc
    summary = run_learning_demo(out, settings)
    write_reports(summary, out)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print_report(summary, out)
    return 0
