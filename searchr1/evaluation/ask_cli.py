"""``searchr1 ask``: a model answers questions with the Search-R1 loop, showing its reasoning, each
search with the titles it retrieved, and the answer (``searchr1.evaluation.agent.Agent``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from searchr1.cli_common import (
    add_config_flags,
    add_model_flags,
    add_search_flags,
    check_model,
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
from searchr1.errors import UserFacingError
from searchr1.evaluation.agent import Agent

EXAMPLES = """examples:
  searchr1 data synth --out data/world
  searchr1 ask "Where was Clara Thoped born?" --model smollm2-135m-instruct --corpus data/world/corpus.jsonl
  searchr1 index build --retriever bm25 --corpus data/world/corpus.jsonl --out indexes/world
  searchr1 ask --model smollm2-135m-instruct --index indexes/world          (a prompt loop; Ctrl-D exits)
  searchr1 ask "..." --model smollm2-135m-instruct --search-url http://127.0.0.1:8000 --json
"""


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser(
        "ask",
        help="ask a model a question; shows its reasoning, searches and answer",
        description="Answer a question with the Search-R1 loop: prints the reasoning, each search query "
        "with the titles it retrieved, then the answer. Without a question, reads questions in a loop "
        "(Ctrl-D exits).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    help_lists_names(a, ["retrieval.backend", "rollout.engine"])
    a.add_argument("question", nargs="?", default=None, help="the question (omit for a prompt loop)")
    add_model_flags(a)
    add_search_flags(a)
    add_config_flags(a, "retrieval, rollout and data")
    a.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per question (answer, queries, hits, segments)",
    )
    a.set_defaults(func=_ask)


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
    trained = choose_settings(args)  # the run's retrieval and rollout settings, under the flags
    cfg = command_config(args, [*trained.overrides(), *search_overrides(args), *model_overrides(args)])
    if not (has_search_flags(args) or cfg.retrieval.index or cfg.retrieval.url or cfg.retrieval.corpus):
        raise UserFacingError("ask needs a search backend: --index DIR, --search-url URL or --corpus FILE")
    dtype = choose_dtype(args, cfg)  # before anything loads: the engine must be able to generate in it
    template_line = choose_template(cfg, args.model, template_given(args))
    retriever = open_retriever(cfg.retrieval)
    model, tokenizer = load_policy(args, dtype)
    print(f"{template_line}   engine: {cfg.rollout.engine}   dtype: {dtype}", file=sys.stderr)
    print(trained.line(cfg), file=sys.stderr)
    agent = Agent(model, retriever, tokenizer=tokenizer, config=cfg)
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
