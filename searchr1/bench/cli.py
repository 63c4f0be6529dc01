"""``searchr1 bench NAME [--quick]``: run a benchmark from ``searchr1.bench``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import searchr1.bench as bench_pkg


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench_pkg.__path__) if m.name not in {"cli"})


def register(sub: argparse._SubParsersAction) -> None:
    names = available()
    p = sub.add_parser(
        "bench",
        help="run a benchmark (prints a table, writes benchmarks/results/NAME.json)",
        description="Benchmarks measure ratios against a baseline in the same run. Available: "
        + ", ".join(names),
    )
    p.add_argument("name", choices=names, help="which benchmark")
    p.add_argument("--quick", action="store_true", help="small sizes; finishes within a minute")
    p.add_argument("--out-dir", default="benchmarks/results", help="where NAME.json is written")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated workload")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from searchr1.bench import report

    module = importlib.import_module(f"searchr1.bench.{args.name}")
    result = module.run(args)
    report(result, args.out_dir)
    return 0
