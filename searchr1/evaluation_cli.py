"""``searchr1 eval``, ``searchr1 ask`` and ``searchr1 report``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

EXAMPLES_EVAL = """examples:
  searchr1 eval --model runs/tiny/checkpoints/step_000050/model --data data/world/test.jsonl --index indexes/world
  searchr1 eval --model Qwen/Qwen2.5-3B --data all7.parquet --search-url http://127.0.0.1:8000 --out eval/qwen3b
  searchr1 eval --model runs/tiny/checkpoints/step_000050/model --data data/world/test.jsonl --mode direct   (no search: the Direct row)
  searchr1 eval --model runs/tiny/checkpoints/step_000050/model --data data/world/test.jsonl --corpus data/world/corpus.jsonl --mode rag
  searchr1 eval --model Qwen/Qwen2.5-3B --data nq_test.jsonl --data hotpotqa_dev.jsonl --index indexes/wiki-bm25
A rerun into the same --out continues an interrupted run; --no-resume starts over.
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


def _add_model_and_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        help="hub id, alias or local folder of the policy; a training checkpoint's model/ folder, "
        "e.g. runs/tiny/checkpoints/step_000050/model",
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
        help="prompt template: base | instruct | a file with {question} (default base)",
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
    e = sub.add_parser(
        "eval",
        help="evaluate a model on question sets (EM, subEM, F1, searches per source)",
        description="Run a model greedily over one or more datasets and score it per data source: EM, "
        "subEM, F1, average searches and turns, valid-format and truncation rates. Writes summary.json "
        "and trajectories.jsonl into --out, batch by batch (a rerun continues an interrupted run).",
        epilog=EXAMPLES_EVAL,
        formatter_class=fmt,
    )
    _add_model_and_search_args(e)
    e.add_argument(
        "--data",
        action="append",
        required=True,
        metavar="FILE",
        help="FlashRAG jsonl or Search-R1 parquet; repeat for several",
    )
    e.add_argument(
        "--mode",
        choices=["agent", "direct", "rag"],
        default="agent",
        help="agent: the Search-R1 loop; direct: no search; rag: retrieve once with the question (default agent)",
    )
    e.add_argument("--out", default=None, help="output folder (default runs/eval/<model>-<mode>)")
    e.add_argument("--batch-size", type=int, default=16, help="questions generated together (default 16)")
    e.add_argument("--limit", type=int, default=None, help="evaluate only the first N questions of each file")
    e.add_argument("--no-resume", action="store_true", help="start over even if --out holds a partial run")
    e.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
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
        description="One HTML page (no network needed to view it): training curves, validation table per "
        "data source, and a trajectory browser with the role of every token.",
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
    from searchr1.errors import UserFacingError

    return UserFacingError(message)


def check_model(model: str) -> None:
    """A local model folder must exist and hold config.json; anything else must resolve as a hub id."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise _error(f"--model {model}: not a folder (expected a Hugging Face model folder)")
        if not (path / "config.json").is_file():
            raise _error(f"--model {model}: no config.json in this folder (not a Hugging Face model folder)")
        if not os.access(path / "config.json", os.R_OK):
            raise _error(f"--model {model}: config.json is not readable")
        return
    looks_local = model.startswith((".", "/", "~")) or model.count("/") > 1 or os.sep + os.sep in model
    if looks_local:
        raise _error(f"--model {model}: model folder not found")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except Exception as exc:  # any failure means: cannot be loaded
        raise _error(
            f"--model {model}: not a local folder and not loadable as a hub id ({type(exc).__name__})"
        ) from None


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
    from searchr1.data.formats import load_samples as _load

    try:
        samples = list(_load(path, split="test", limit=limit))
    except (ValueError, KeyError, OSError) as exc:
        raise _error(f"--data {path}: {exc}") from None
    if not samples:
        raise _error(f"--data {path}: no questions in this file")
    return samples


def _config(args: argparse.Namespace) -> Any:
    """The config tree with the command-line flags applied as overrides."""
    from searchr1.config import ConfigError, load_config

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
    from searchr1.retrieval.factory import build_retriever

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


def _default_out(model: str, mode: str) -> Path:
    name = Path(model.rstrip("/")).name or "model"
    return Path("runs") / "eval" / f"{name}-{mode}"


def _eval(args: argparse.Namespace) -> int:
    from searchr1.evaluation import EvaluationError, SingleTurnEngine, evaluate, format_table

    check_model(args.model)
    data_paths = [check_readable_file(d, "--data") for d in args.data]
    _check_search_args(args)
    cfg = _config(args)
    if args.mode in ("agent", "rag") and not _has_search(args, cfg):
        raise _error(
            f"--mode {args.mode} needs a search backend: --index DIR, --search-url URL or --corpus FILE"
        )
    if args.batch_size < 1:
        raise _error("--batch-size must be >= 1")
    samples = [s for p in data_paths for s in load_samples(p, args.limit)]
    out = Path(args.out) if args.out else _default_out(args.model, args.mode)

    retriever = _open_retriever(cfg) if args.mode in ("agent", "rag") else None
    model, tokenizer = _load_policy(args)
    if args.mode == "agent":
        from searchr1.rollout.engine import build_engine

        engine = build_engine(cfg, model, tokenizer, retriever)
    else:
        engine = SingleTurnEngine(model, tokenizer, max_new_tokens=cfg.rollout.max_turn_tokens)

    def progress(p: Any) -> None:
        print(f"\r[eval] {p.done}/{p.total} questions", end="", file=sys.stderr, flush=True)

    settings = {
        "model": args.model,
        "data": [str(p) for p in data_paths],
        "max_turns": cfg.rollout.max_turns,
        "max_turn_tokens": cfg.rollout.max_turn_tokens,
    }
    try:
        summary = evaluate(
            engine,
            samples,
            tokenizer=tokenizer,
            mode=args.mode,
            retriever=retriever,
            batch_size=args.batch_size,
            out_dir=out,
            resume=not args.no_resume,
            template=cfg.data.template,
            topk=cfg.retrieval.topk,
            settings=settings,
            on_batch=progress,
        )
    except EvaluationError as exc:
        raise _error(str(exc)) from None
    finally:
        print(file=sys.stderr)
        if hasattr(engine, "close"):
            engine.close()
        if retriever is not None:
            retriever.close()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"mode: {args.mode}   model: {args.model}")
        print(format_table(summary))
        print(f"\nwrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
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
    from searchr1.inference import Agent

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
    from searchr1.evaluation import EvaluationError
    from searchr1.report import ReportError, build_report

    try:
        path = build_report(args.run_dir, args.out, max_trajectories=args.max_trajectories)
    except (ReportError, EvaluationError) as exc:
        raise _error(str(exc)) from None
    print(f"wrote {path}")
    return 0
