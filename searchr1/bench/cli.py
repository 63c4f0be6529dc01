"""``searchr1 bench NAME [--quick] [options]``: run a benchmark from ``searchr1.bench``.

A module ``searchr1/bench/NAME.py`` is the benchmark ``NAME`` (underscores may be written as dashes:
``server_load`` is ``server-load``). Its own options come from its ``add_arguments(parser)`` and are
parsed only when it runs, so ``searchr1 --help`` imports no benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import searchr1.bench as bench_pkg


def available() -> list[str]:
    """Benchmark names as typed on the command line (``server-load``); ``_name`` modules are shared helpers."""
    return sorted(
        m.name.replace("_", "-")
        for m in pkgutil.iter_modules(bench_pkg.__path__)
        if m.name != "cli" and not m.name.startswith("_")
    )


def register(sub: argparse._SubParsersAction) -> None:
    names = available()
    p = sub.add_parser(
        "bench",
        help="run a benchmark (prints a table, writes benchmarks/results/NAME.json)",
        description="Benchmarks measure ratios against a baseline in the same run. Available: "
        + ", ".join(names)
        + ". Options of one benchmark: searchr1 bench NAME --help.",
        usage="searchr1 bench NAME [--quick] [--out-dir DIR] [--seed N] [options of NAME]",
    )
    p.add_argument(
        "name", choices=names + [n.replace("-", "_") for n in names if "-" in n], help="which benchmark"
    )
    p.add_argument(
        "options", nargs=argparse.REMAINDER, help="--quick, --out-dir, --seed, and NAME's own options"
    )
    p.set_defaults(func=_run)


def module_parser(name: str, module: object) -> argparse.ArgumentParser:
    """The options of one benchmark: the common ones plus its ``add_arguments``."""
    parser = argparse.ArgumentParser(
        prog=f"searchr1 bench {name}", description=(module.__doc__ or "").strip()
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--quick", action="store_true", help="small sizes; finishes within a minute")
    parser.add_argument("--out-dir", default="benchmarks/results", help="where the JSON result is written")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workload")
    add = getattr(module, "add_arguments", None)
    if add is not None:
        add(parser)
    return parser


def _run(args: argparse.Namespace) -> int:
    from searchr1.bench import report

    name = args.name.replace("-", "_")
    module = importlib.import_module(f"searchr1.bench.{name}")
    options = module_parser(name.replace("_", "-"), module).parse_args(args.options)
    result = module.run(options)
    report(result, options.out_dir)
    return 0
