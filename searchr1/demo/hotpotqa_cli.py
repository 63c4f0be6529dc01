"""The flags of ``searchr1 demo`` that run the HotpotQA demo (``--data hotpotqa``; ``searchr1.demo.hotpotqa``).

    searchr1 demo --data hotpotqa                    # six rows on the 497 test questions, 3 RL seeds
    searchr1 demo --data hotpotqa --quick            # 100 test questions, fewer questions and steps, one seed
    searchr1 demo --data hotpotqa --out runs/hotpotqa trainer.device=cuda --rows warm warm_rl --seeds 0 1 2 \\
        --write-results benchmarks/results/hotpotqa_rl.json

The synthetic demo's flags that mean nothing here (``--only``, ``--no-control`` ...) are refused in one line,
and so are these flags without ``--data hotpotqa``. Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from searchr1.demo.hotpotqa_report import ROWS, print_report, results_file
from searchr1.errors import UserFacingError

HOTPOTQA_ONLY = {"rows": None, "val_questions": None, "train_questions": None, "write_results": None}
"""Flags of the HotpotQA demo and their unset values."""
SYNTH_ONLY = {
    "no_control": False, "no_ablation": False, "no_zero_shot": False, "only": None, "nq_sample": None,
    "hotpotqa_questions": None,
}  # fmt: skip
"""Flags of the synthetic demo and their unset values."""


def add_arguments(parser: Any) -> None:
    """``--data`` and the HotpotQA demo's own flags (the shared ones: ``--quick``, ``--out``, ``--seeds``,
    ``--steps``, ``--num-test``, ``--hotpotqa-sample``, ``--model``, ``--template``, ``--algorithm``,
    ``--threads``, overrides)."""
    parser.add_argument(
        "--data", choices=("synth", "hotpotqa"), default="synth",
        help="synth (default): the synthetic world; hotpotqa: Search-R1 in miniature on the shared HotpotQA "
        "sample, the rows direct, rag, agent, warm, rl, warm_rl on its test questions (--seeds: warm_rl's RL "
        "seeds, default 0 1 2; --num-test: test questions, default all 497; --quick: 100 test questions, 64 "
        "training questions, 2 RL steps of 4 x 4 trajectories, no validation, one seed)",
    )  # fmt: skip
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=None, metavar="ROW",
                        help=f"--data hotpotqa: run only these rows ({', '.join(ROWS)}; default all); "
                        "rows finished before in --out are kept")  # fmt: skip
    parser.add_argument("--val-questions", type=int, default=None,
                        help="--data hotpotqa: the validation slice of dev, half of each type (default 64)")  # fmt: skip
    parser.add_argument("--train-questions", type=int, default=None,
                        help="--data hotpotqa: training questions (default 0: all 529; --quick 64)")  # fmt: skip
    parser.add_argument("--write-results", default=None, metavar="PATH",
                        help="--data hotpotqa: also write the rows, commands, machine and minutes per row to PATH "
                        "(benchmarks/results/hotpotqa_rl.json's shape)")  # fmt: skip


def _given(args: argparse.Namespace, unset: dict[str, Any]) -> list[str]:
    return [
        "--" + dest.replace("_", "-") for dest, value in unset.items() if getattr(args, dest, value) != value
    ]


def settings_from_args(args: argparse.Namespace) -> Any:
    from searchr1.demo.hotpotqa import HotpotQASettings

    base = HotpotQASettings.quick_settings() if args.quick else HotpotQASettings()
    pick = lambda given, default: default if given is None else given  # noqa: E731
    return replace(
        base,
        sample=pick(args.hotpotqa_sample, base.sample),
        seeds=tuple(args.seeds) if args.seeds else base.seeds,
        rows=tuple(args.rows) if args.rows else base.rows,
        val_questions=pick(args.val_questions, base.val_questions),
        train_questions=pick(args.train_questions, base.train_questions),
        test_questions=pick(args.num_test, base.test_questions),
        steps=args.steps or base.steps,
        model=args.model,
        template=pick(args.template, base.template),
        algorithm=args.algorithm,
        overrides=[*base.overrides, *args.overrides],
        jobs=args.jobs,
    )


DEFAULT_THREADS = 2
"""``searchr1 demo --threads``'s default (both demos)."""


def command_of(settings: Any, out: Path, threads: int = DEFAULT_THREADS) -> str:
    """The command that runs these settings again into ``out`` on ``threads`` torch threads: the overrides,
    then the flags that differ from the defaults (``--rows NAME`` may follow)."""
    from searchr1.demo.hotpotqa import HotpotQASettings

    base = HotpotQASettings.quick_settings() if settings.quick else HotpotQASettings()
    flags = {"sample": "--hotpotqa-sample", "seeds": "--seeds", "val_questions": "--val-questions",
             "train_questions": "--train-questions", "test_questions": "--num-test", "steps": "--steps",
             "model": "--model", "template": "--template", "algorithm": "--algorithm", "jobs": "--jobs"}  # fmt: skip
    argv = ["searchr1", "demo", "--data", "hotpotqa", *(["--quick"] if settings.quick else [])]
    argv += [
        "--out",
        str(out),
        *settings.overrides[len(base.overrides) :],
    ]  # before the flags of several values
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name in flags and value != getattr(base, f.name):
            argv += [flags[f.name], *(map(str, value) if isinstance(value, tuple) else [str(value)])]
    if threads != DEFAULT_THREADS:
        argv += ["--threads", str(threads)]
    return shlex.join(argv)


def run_if_hotpotqa(args: argparse.Namespace) -> int | None:
    """Run the HotpotQA demo for ``--data hotpotqa`` and return its exit status; None for the synthetic demo
    (after refusing the HotpotQA demo's flags)."""
    if args.data != "hotpotqa":
        if given := _given(args, HOTPOTQA_ONLY):
            raise UserFacingError(f"{', '.join(given)}: only with --data hotpotqa")
        return None
    if given := _given(args, SYNTH_ONLY):
        raise UserFacingError(f"{', '.join(given)}: a flag of the synthetic demo, not of --data hotpotqa")
    import torch

    from searchr1.demo.hotpotqa import check_folder, run_hotpotqa_demo, validate

    torch.set_num_threads(max(1, args.threads))
    settings = settings_from_args(args)
    out = Path(args.out) if args.out else Path("runs") / time.strftime("demo-hotpotqa-%Y%m%d-%H%M%S")
    try:  # a bad flag, key, sample folder or model: one line before anything is written
        validate(settings)
        check_folder(out, settings)
    except ValueError as exc:
        raise UserFacingError(str(exc)) from exc
    summary = run_hotpotqa_demo(out, settings, command=command_of(settings, out, args.threads))
    print_report(summary, out)
    if args.write_results:
        path = Path(args.write_results)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results_file(summary), indent=1) + "\n")
        print(f"results: {path}")
    return 0
