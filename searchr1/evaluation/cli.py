"""``searchr1 eval``, ``searchr1 ask`` and ``searchr1 report``.

Every input is checked before any work (the model, each data file, the search backend), and each
problem is one line naming it. Heavy modules (torch, transformers, the retrievers) are imported in
the handlers, so that ``searchr1 --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from searchr1.config import ConfigError, load_config
from searchr1.data.formats import load_samples as read_samples
from searchr1.errors import ModelNotFoundError, UserFacingError
from searchr1.evaluation.agent import Agent
from searchr1.evaluation.modes import MODES, Mode, parse_modes, sample_view
from searchr1.evaluation.progress import Monitor
from searchr1.evaluation.runner import evaluate_modes, run_state
from searchr1.evaluation.store import RESULTS_FILE, TABLE_FILE, check_resumable, load_results
from searchr1.evaluation.tables import (
    TABLE_METRICS,
    compare_tables,
    format_paper_table,
    format_summary_table,
    paper_table,
)
from searchr1.report import ReportError, build_report
from searchr1.retrieval.factory import build_retriever
from searchr1.rollout.registry import build_engine

SEARCH_FAILED_STATUS = 3
"""Exit status of ``eval`` when a search failed (and failures were not tolerated)."""

EXAMPLES_EVAL = """examples:
  searchr1 eval --model smollm2-135m-instruct --template instruct --data nq_test.jsonl \\
      --corpus wiki18_sample_corpus.jsonl --mode direct,cot,rag,agent      (the paper's rows, one table)
  searchr1 eval --model runs/tiny/checkpoints/step_000050/model --data data/world/test.jsonl --index indexes/world --out eval/after
  searchr1 eval --compare eval/before eval/after          (two runs side by side: before / after RL)
A rerun into the same --out continues an interrupted run (and retries questions whose search
failed); --no-resume starts over. Exit status 3: a search failed (--tolerate-search-failures: 0).
"""

EXAMPLES_ASK = """examples:
  searchr1 ask "Where was Alice Verdan born?" --model runs/tiny/checkpoints/step_000050/model --index indexes/world
  searchr1 ask --model runs/tiny/checkpoints/step_000050/model --search-url http://127.0.0.1:8000   (a prompt loop; Ctrl-D exits)
  searchr1 ask "..." --model smollm2-135m-instruct --corpus data/world/corpus.jsonl --json
"""

EXAMPLES_REPORT = """examples:
  searchr1 report runs/tiny                          (writes runs/tiny/report.html)
  searchr1 report eval/qwen3b --out qwen3b.html      (an eval output folder)
"""


def _add_model_and_search_args(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    p.add_argument(
        "--model",
        required=model_required,
        help="model: a local folder (a checkpoint), a hub id, a .gguf file or an alias (smollm2-135m-instruct)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--index", default=None, help="search index folder (from `searchr1 index build`)")
    g.add_argument("--search-url", default=None, help="retrieval server URL(s), comma-separated")
    g.add_argument("--corpus", default=None, help="corpus jsonl searched with BM25 in memory (small corpora)")
    p.add_argument(
        "--topk", type=int, default=None, help="documents per search (default: retrieval.topk = 3)"
    )
    p.add_argument(
        "--max-turns", type=int, default=None, help="search turns before the answer-only turn (default 4)"
    )
    p.add_argument("--max-turn-tokens", type=int, default=None, help="tokens per turn at most (default 500)")
    p.add_argument(
        "--template",
        default=None,
        help="prompt template: base | instruct | instruct_1shot | a file with {question} (default base); "
        "the baselines use chat messages when it is a chat template",
    )
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default float32)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument(
        "--config", default=None, help="YAML config (its retrieval, rollout and data sections are used)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. rollout.max_obs_tokens=300",
    )


def register(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    modes_help = "; ".join(f"{m.name}: {m.help}" for m in MODES.values())
    e = sub.add_parser(
        "eval",
        help="evaluate a model on question sets in the paper's modes (EM, subEM, F1 per dataset)",
        description="Run a model greedily over one or more datasets in one or more modes and score it per "
        "data source: EM, subEM, F1 (Search-R1's normalisation), valid-format and tagged-answer rates, "
        "searches, turns, truncations, failed searches. Prints one table in the paper's layout (rows: "
        "methods, columns: datasets and their average) and writes it with every trajectory into --out, "
        "batch by batch (a rerun continues an interrupted run).",
        epilog=EXAMPLES_EVAL,
        formatter_class=fmt,
    )
    _add_model_and_search_args(e, model_required=False)
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

    a = sub.add_parser(
        "ask",
        help="ask a model a question; shows its reasoning, searches and answer",
        description="Answer a question with the Search-R1 loop: prints the reasoning, each search query "
        "with the titles it retrieved, then the answer. Without a question, reads questions in a loop "
        "(Ctrl-D exits).",
        epilog=EXAMPLES_ASK,
        formatter_class=fmt,
    )
    a.add_argument("question", nargs="?", default=None, help="the question (omit for a prompt loop)")
    _add_model_and_search_args(a)
    a.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per question (answer, queries, hits, segments)",
    )
    a.set_defaults(func=_ask)

    r = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a run or eval folder",
        description="One HTML page (no network needed to view it): training curves, the results table in "
        "the paper's layout and per data source, and a trajectory browser with the role of every token.",
        epilog=EXAMPLES_REPORT,
        formatter_class=fmt,
    )
    r.add_argument("run_dir", help="training run folder (metrics.jsonl, validation/) or eval output folder")
    r.add_argument("--out", default=None, help="HTML file to write (default RUN_DIR/report.html)")
    r.add_argument(
        "--max-trajectories", type=int, default=1000, help="trajectories embedded in the page (default 1000)"
    )
    r.set_defaults(func=_report)


# ---------------------------------------------------------------------------------------------
# checks that run before any work
# ---------------------------------------------------------------------------------------------


def _error(message: str) -> Exception:
    return UserFacingError(message)


def check_model(model: str) -> None:
    """A local model folder must hold a readable config.json; any other name must resolve
    (``searchr1.models.resolve_model``: an alias, a .gguf file, a cached or reachable hub id)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _error(f"--model {model}: no config.json in this folder (not a Hugging Face model folder)")
        if not os.access(path / "config.json", os.R_OK):
            raise _error(f"--model {model}: config.json is not readable")
        return
    from searchr1.models import resolve_model

    try:
        resolve_model(model)
    except (ModelNotFoundError, OSError, ValueError) as exc:
        raise _error(f"--model {model}: {str(exc).splitlines()[0]}") from None


def check_readable_file(path: str, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise _error(f"{what} {path}: file not found")
    if not p.is_file():
        raise _error(f"{what} {path}: not a file")
    if not os.access(p, os.R_OK):
        raise _error(f"{what} {path}: not readable (permission denied)")
    return p


def check_index(path: str) -> None:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise _error(f"--index {path}: index folder not found")
    from searchr1.retrieval.index import IndexLoadError, Manifest

    try:
        Manifest.read(p)
    except (IndexLoadError, OSError, ValueError) as exc:
        raise _error(f"--index {path}: {exc}") from None


def load_samples(path: Path, limit: int | None) -> list[Any]:
    """Samples of a FlashRAG jsonl / Search-R1 parquet file (the data package names file and line)."""

    try:
        samples = list(read_samples(path, split="test", limit=limit))
    except (ValueError, KeyError, OSError) as exc:
        raise _error(f"--data {path}: {str(exc).splitlines()[0]}") from None
    if not samples:
        raise _error(f"--data {path}: no questions in this file")
    return samples


def _config(args: argparse.Namespace) -> Any:
    """The config tree with the command-line flags applied as overrides."""

    overrides = list(args.set)
    if args.index:
        from searchr1.retrieval.index import Manifest

        overrides += [
            f"retrieval.index={args.index}",
            f"retrieval.backend={Manifest.read(args.index).retriever}",
        ]
    if args.search_url:
        overrides += [f"retrieval.url={args.search_url}", "retrieval.backend=http"]
    if args.corpus:
        overrides += [f"retrieval.corpus={args.corpus}", "retrieval.backend=bm25"]
    for flag, key in (
        ("topk", "retrieval.topk"),
        ("max_turns", "rollout.max_turns"),
        ("max_turn_tokens", "rollout.max_turn_tokens"),
        ("template", "data.template"),
    ):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    try:
        return load_config(args.config, overrides)
    except ConfigError as exc:
        raise _error(str(exc)) from None


def _has_search(args: argparse.Namespace, cfg: Any) -> bool:
    return bool(
        args.index
        or args.search_url
        or args.corpus
        or cfg.retrieval.index
        or cfg.retrieval.url
        or cfg.retrieval.corpus
    )


def _check_search_args(args: argparse.Namespace) -> None:
    if args.index:
        check_index(args.index)
    if args.corpus:
        check_readable_file(args.corpus, "--corpus")


def _open_retriever(cfg: Any) -> Any:
    try:
        return build_retriever(cfg.retrieval)
    except (ValueError, OSError) as exc:
        raise _error(f"search backend: {exc}") from None


def _load_policy(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    from searchr1.models import load_model, load_tokenizer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = load_tokenizer(args.model)
        model = load_model(args.model, dtype=args.dtype, device=device)
    except (OSError, ValueError) as exc:
        raise _error(f"--model {args.model}: cannot be loaded ({exc})") from None
    model.eval()
    return model, tokenizer


# ---------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------


def _default_out(model: str) -> Path:
    name = Path(model.rstrip("/")).name or "model"
    return Path("runs") / "eval" / name


def _eval(args: argparse.Namespace) -> int:
    if args.compare:
        return _compare(args)
    modes = parse_modes(args.mode)
    if not args.model:
        raise _error("eval needs --model (or --compare A B)")
    if not args.data:
        raise _error("eval needs at least one --data FILE")
    for flag in ("batch_size", "answer_tokens"):
        if getattr(args, flag) < 1:
            raise _error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    check_model(args.model)
    data_paths = [check_readable_file(d, "--data") for d in args.data]
    _check_search_args(args)
    cfg = _config(args)
    searching = [m.name for m in modes if m.search != "none"]
    if searching and not _has_search(args, cfg):
        raise _error(
            f"--mode {','.join(searching)} needs a search backend: --index DIR, --search-url URL or --corpus FILE"
        )
    samples = [s for p in data_paths for s in load_samples(p, args.limit)]
    out = Path(args.out) if args.out else _default_out(args.model)
    settings = {
        "model": args.model,
        "data": [str(p) for p in data_paths],
        "limit": args.limit,
        "max_turns": cfg.rollout.max_turns,
        "max_turn_tokens": cfg.rollout.max_turn_tokens,
    }

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

    monitor = Monitor()
    retriever = monitor.wrap(_open_retriever(cfg)) if searching else None
    model, tokenizer = _load_policy(args)

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
    _print_results(args, results, [m.name for m in modes], out, cfg.data.template)
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


def _print_results(
    args: argparse.Namespace, results: dict[str, Any], modes: list[str], out: Path, template: str
) -> None:
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"model: {args.model}   template: {template}   normalization: {args.normalization}\n")
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


# ---------------------------------------------------------------------------------------------
# ask
# ---------------------------------------------------------------------------------------------


class _Printer:
    """Human-readable display of an answer's events (colour on a terminal)."""

    def __init__(self, stream: Any):
        self.stream = stream
        tty = hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")
        self.dim, self.bold, self.cyan, self.reset = (
            ("\033[2m", "\033[1m", "\033[36m", "\033[0m") if tty else ("",) * 4
        )

    def __call__(self, event: Any) -> None:
        w = self.stream.write
        if event.kind == "text":
            w(f"{self.dim}{event.text}{self.reset}")
        elif event.kind == "search":
            w(f"\n{self.cyan}search:{self.reset} {event.text}\n")
            for i, h in enumerate(event.hits, start=1):
                w(f"  {i}. {h.get('title', '')}\n")
            if not event.hits:
                w("  (no results)\n")
        elif event.kind == "note":
            w(f"\n{self.dim}[{event.text.strip()}]{self.reset}\n")
        elif event.kind == "answer":
            w(f"\n{self.bold}answer:{self.reset} {event.text or '(no answer)'}\n")
        self.stream.flush()


def _questions(first: str | None):
    if first is not None:
        yield first
        return
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = input("question> ") if interactive else sys.stdin.readline()
        except EOFError:
            if interactive:
                print()
            return
        if not interactive and line == "":
            return
        line = line.strip()
        if line:
            yield line


def _ask(args: argparse.Namespace) -> int:
    check_model(args.model)
    _check_search_args(args)
    cfg = _config(args)
    if not _has_search(args, cfg):
        raise _error("ask needs a search backend: --index DIR, --search-url URL or --corpus FILE")
    retriever = _open_retriever(cfg)
    model, tokenizer = _load_policy(args)
    agent = Agent(
        model,
        retriever,
        tokenizer=tokenizer,
        template=cfg.data.template,
        topk=cfg.retrieval.topk,
        max_turns=cfg.rollout.max_turns,
        max_turn_tokens=cfg.rollout.max_turn_tokens,
        engine=cfg.rollout.engine,
    )
    printer = _Printer(sys.stdout)
    try:
        for question in _questions(args.question):
            if args.json:
                print(json.dumps(agent.ask(question).to_dict(), ensure_ascii=False), flush=True)
            else:
                agent.ask(question, on_event=printer)
    finally:
        agent.close()
    return 0


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    try:
        path = build_report(args.run_dir, args.out, max_trajectories=args.max_trajectories)
    except ReportError as exc:
        raise _error(str(exc)) from None
    print(f"wrote {path}")
    return 0
