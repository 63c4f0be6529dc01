"""``searchr1 eval``: a model over question sets in the paper's modes, scored per data source.

Every input is checked before any work (the model, each data file, the search backend), and each
problem is one line naming it. Heavy modules (torch, transformers, the retrievers) are imported in
the handlers, so that ``searchr1 --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from searchr1.cli_common import (
    add_config_flags,
    add_model_flags,
    add_search_flags,
    check_model,
    check_readable_file,
    choose_dtype,
    choose_settings,
    choose_template,
    command_config,
    has_search_flags,
    help_lists_names,
    load_policy,
    model_overrides,
    open_retriever,
    search_overrides,
    template_given,
)
from searchr1.data.formats import load_samples as read_samples
from searchr1.errors import UserFacingError
from searchr1.evaluation.modes import MODES, Mode, parse_modes, sample_view
from searchr1.evaluation.progress import Monitor
from searchr1.evaluation.runner import evaluate_modes, run_state
from searchr1.evaluation.store import RESULTS_FILE, TABLE_FILE, check_resumable, load_results
from searchr1.evaluation.tables import (
    TABLE_METRICS,
    compare_tables,
    format_paper_table,
    format_summary_table,
    generated_by,
    paper_table,
)
from searchr1.rollout.registry import build_engine

SEARCH_FAILED_STATUS = 3
"""Exit status of ``eval`` when a search failed (and failures were not tolerated)."""

EXAMPLES = """examples:
  searchr1 data synth --out data/world
  searchr1 eval --model smollm2-135m-instruct --data data/world/test.jsonl --corpus data/world/corpus.jsonl \\
      --mode direct,rag,agent --limit 32 --out eval/before      (the paper's rows, one table)
  searchr1 train --config tiny_cpu trainer.total_steps=20 trainer.out_dir=runs/tiny
  searchr1 eval --model runs/tiny/checkpoints/step_000020/model --data data/world/test.jsonl \\
      --corpus data/world/corpus.jsonl --mode direct,rag,agent --limit 32 --out eval/after
  searchr1 eval --compare eval/before eval/after          (two runs side by side: before / after RL)
  searchr1 eval --model smollm2-135m-instruct --data data/world/test.jsonl --corpus data/world/corpus.jsonl \\
      --engine vllm --limit 32 --out eval/vllm      (the search loop on a vLLM server; bash scripts/setup-vllm.sh)
  searchr1 eval --model smollm2-135m-instruct --data shared/data/flashrag-sample/nq_test_sample.jsonl \\
      --corpus shared/data/flashrag-sample/wiki18_sample_corpus.jsonl --mode direct,rag,agent --out eval/nq
A rerun into the same --out continues an interrupted run (and retries questions whose search
failed); --no-resume starts over. Exit status 3: a search failed (--tolerate-search-failures: 0).
"""


def register(sub: argparse._SubParsersAction) -> None:
    modes_help = "; ".join(f"{m.name}: {m.help}" for m in MODES.values())
    e = sub.add_parser(
        "eval",
        help="evaluate a model on question sets in the paper's modes (EM, subEM, F1 per dataset)",
        description="Run a model greedily over one or more datasets in one or more modes and score it per "
        "data source: EM, subEM, F1 (Search-R1's normalisation), valid-format and tagged-answer rates, "
        "searches, turns, truncations, failed searches. Prints one table in the paper's layout (rows: "
        "methods, columns: datasets and their average) and writes it with every trajectory into --out, "
        "batch by batch (a rerun continues an interrupted run).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    help_lists_names(e, ["retrieval.backend", "rollout.engine"])
    add_model_flags(e, model_required=False)
    add_search_flags(e)
    add_config_flags(e, "retrieval, rollout and data")
    e.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="FILE",
        help="FlashRAG jsonl or Search-R1 parquet; repeat for several",
    )
    e.add_argument(
        "--mode",
        default="agent",
        help=f"comma-separated modes (default agent). {modes_help}",
    )
    e.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="print two eval output folders side by side (e.g. before / after RL) and exit",
    )
    e.add_argument(
        "--metric",
        choices=TABLE_METRICS,
        default="em",
        help="metric of the paper-layout and --compare tables (default em, the paper's)",
    )
    e.add_argument(
        "--normalization",
        choices=("squad", "unicode"),
        default="squad",
        help="answer normalisation: squad = Search-R1's and the paper's scorer (default); unicode also "
        "drops Unicode punctuation",
    )
    e.add_argument(
        "--answer-tokens",
        type=int,
        default=64,
        help="tokens of a direct / rag reply at most (default 64; cot replies get --max-turn-tokens)",
    )
    e.add_argument(
        "--tolerate-search-failures",
        action="store_true",
        help="exit 0 even if searches failed (they are counted in the tables either way)",
    )
    e.add_argument("--out", default=None, help="output folder (default runs/eval/<model>)")
    e.add_argument("--batch-size", type=int, default=16, help="questions generated together (default 16)")
    e.add_argument("--limit", type=int, default=None, help="evaluate only the first N questions of each file")
    e.add_argument("--no-resume", action="store_true", help="start over even if --out holds a partial run")
    e.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    e.set_defaults(func=_eval)


def load_samples(path: Path, limit: int | None) -> list[Any]:
    """Samples of a FlashRAG jsonl / Search-R1 parquet file (the data package names file and line)."""

    try:
        samples = list(read_samples(path, split="test", limit=limit))
    except (ValueError, KeyError, OSError) as exc:
        raise UserFacingError(f"--data {path}: {str(exc).splitlines()[0]}") from None
    if not samples:
        raise UserFacingError(f"--data {path}: no questions in this file")
    return samples


def _default_out(model: str) -> Path:
    name = Path(model.rstrip("/")).name or "model"
    return Path("runs") / "eval" / name


def _eval(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    modes = parse_modes(args.mode)
    data_paths = _check_flags(args)
    trained = choose_settings(args)  # the run's retrieval and rollout settings, under the flags
    cfg = command_config(args, [*trained.overrides(), *search_overrides(args), *model_overrides(args)])
    searching = [m.name for m in modes if m.search != "none"]
    has_search = has_search_flags(args) or cfg.retrieval.index or cfg.retrieval.url or cfg.retrieval.corpus
    if searching and not has_search:
        raise UserFacingError(
            f"--mode {','.join(searching)} needs a search backend: --index DIR, --search-url URL or --corpus FILE"
        )
    dtype = choose_dtype(args, cfg)  # before anything loads: the engine must be able to generate in it
    samples = [s for p in data_paths for s in load_samples(p, args.limit)]
    template_line = choose_template(cfg, args.model, template_given(args))
    out = Path(args.out) if args.out else _default_out(args.model)
    settings = {"model": args.model, "data": [str(p) for p in data_paths], "limit": args.limit,
                "engine": cfg.rollout.engine, "dtype": dtype, **trained.record(cfg)}  # fmt: skip

    def reply_tokens(mode: Mode) -> int | None:
        if mode.search == "agent":
            return None
        return cfg.rollout.max_turn_tokens if mode.name == "cot" else args.answer_tokens

    views = [sample_view(s, i) for i, s in enumerate(samples)]
    if not args.no_resume:  # a folder holding another run is refused before the model loads
        for mode in modes:
            state = run_state(
                mode, views, template=cfg.data.template, topk=cfg.retrieval.topk,
                normalization=args.normalization, reply_tokens=reply_tokens(mode), settings=settings,
            )  # fmt: skip
            check_resumable(out / mode.name, state)

    from searchr1.rollout.sampling import SamplingParams  # torch

    print(template_line, file=sys.stderr)
    print(trained.line(cfg), file=sys.stderr)
    monitor = Monitor()
    retriever = monitor.wrap(open_retriever(cfg.retrieval)) if searching else None
    model, tokenizer = load_policy(args, dtype)

    def engine_for(mode: Mode) -> Any:
        if mode.search == "agent":  # rollout.engine: the multi-turn engine the model was trained with
            return build_engine(cfg, model, tokenizer, retriever)
        return build_engine(cfg, model, tokenizer, name="single_turn", max_new_tokens=reply_tokens(mode))

    try:
        results = evaluate_modes(
            [m.name for m in modes],
            engine_for,
            samples,
            tokenizer=tokenizer,
            out_dir=out,
            settings=settings,
            on_start=lambda mode, done, total: monitor.start(mode.name, done, total),
            on_batch=monitor.batch,
            on_tokens=monitor.on_tokens,
            retriever=retriever,
            batch_size=args.batch_size,
            resume=not args.no_resume,
            template=cfg.data.template,
            topk=cfg.retrieval.topk,
            sampling=SamplingParams.greedy_eval(cfg.rollout),
            normalization=args.normalization,
            search_timeout_s=cfg.rollout.search_timeout_s,
            search_retries=cfg.rollout.search_retries,
        )
    finally:
        if retriever is not None:
            retriever.close()
    _print_results(args, results, [m.name for m in modes], out, cfg.data.template, settings)
    failed = sum(int(results["summaries"][m.name]["overall"]["search_failures"]) for m in modes)
    if failed and not args.tolerate_search_failures:
        print(
            f"error: {failed} search{'es' if failed > 1 else ''} failed (after retries); the results in {out} "
            "count them as searches without documents. Rerun the same command to retry those questions, or "
            "pass --tolerate-search-failures to accept them.",
            file=sys.stderr,
        )
        return SEARCH_FAILED_STATUS
    return 0


def _check_flags(args: argparse.Namespace) -> list[Path]:
    """The flags of a run, checked before any work; returns the data files."""
    if not args.model:
        raise UserFacingError("eval needs --model (or --compare A B)")
    if not args.data:
        raise UserFacingError("eval needs at least one --data FILE")
    for flag in ("batch_size", "answer_tokens"):
        if getattr(args, flag) < 1:
            raise UserFacingError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    check_model(args.model)
    return [check_readable_file(d, "--data") for d in args.data]


def _print_results(
    args: argparse.Namespace,
    results: dict[str, Any],
    modes: list[str],
    out: Path,
    template: str,
    settings: dict[str, Any],
) -> None:
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{generated_by(settings)}   template: {template}   normalization: {args.normalization}\n")
    print(format_paper_table(paper_table(results["summaries"], args.metric)))
    for mode in modes:
        print(f"\n{MODES[mode].label} ({mode}) per data source:")
        print(format_summary_table(results["summaries"][mode]))
    print(
        "\nvalid = Search-R1's tag format followed; tagged = answer read from an <answer> tag "
        "(the baselines score the reply itself without one)"
    )
    print(f"wrote {out / TABLE_FILE}, {out / RESULTS_FILE} and {out}/<mode>/trajectories.jsonl")


def _compare(args: argparse.Namespace) -> int:
    a_path, b_path = args.compare
    a, b = load_results(a_path), load_results(b_path)
    if args.json:
        tables = {p: paper_table(s, args.metric).__dict__ for p, s in ((a_path, a), (b_path, b))}
        print(json.dumps({"A": a_path, "B": b_path, "tables": tables}, indent=2))
        return 0
    print(compare_tables(a, b, args.metric, names=(a_path, b_path)))
    return 0
