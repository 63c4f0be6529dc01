"""``searchr1 report``: one self-contained HTML page of a training run or an eval folder."""

from __future__ import annotations

import argparse

from searchr1.errors import UserFacingError
from searchr1.report import ReportError, build_report

EXAMPLES = """examples:
  searchr1 train --config tiny_cpu trainer.total_steps=20 trainer.out_dir=runs/tiny
  searchr1 report runs/tiny                          (writes runs/tiny/report.html)
  searchr1 data synth --out data/world
  searchr1 eval --model smollm2-135m-instruct --data data/world/test.jsonl --corpus data/world/corpus.jsonl --limit 8 --out eval/smollm2
  searchr1 report eval/smollm2 --out smollm2.html    (an eval output folder)
"""


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a run or eval folder",
        description="One HTML page (no network needed to view it): training curves, the results table in "
        "the paper's layout and per data source, and a trajectory browser with the role of every token.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("run_dir", help="training run folder (metrics.jsonl, validation/) or eval output folder")
    r.add_argument("--out", default=None, help="HTML file to write (default RUN_DIR/report.html)")
    r.add_argument(
        "--max-trajectories", type=int, default=1000, help="trajectories embedded in the page (default 1000)"
    )
    r.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    try:
        path = build_report(args.run_dir, args.out, max_trajectories=args.max_trajectories)
    except ReportError as exc:
        raise UserFacingError(str(exc)) from None
    print(f"wrote {path}")
    return 0
