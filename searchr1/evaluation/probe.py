"""The decision probe: after a gold search and its passage, does the policy decide as the passage asks?

Two sides, each teacher-forced through the question's prompt and its gold path (``searchr1.rollout.gold``)
up to the end of the first ``<information>`` (the first gold search and its real observation):

* the search side: the questions whose gold path searches two titles or more. The passage names what to
  look up next: the right decision is to search again.
* the answer side: the questions whose gold path searches one title, where the first passage holds the
  gold answer (``sentence_naming``: a sentence of the hits contains it; the others are left out and
  counted). The passage holds the answer: the right decision is to answer.

From that context the policy decodes its next turn greedily. The decision point is where that turn opens
its action tag (the first ``<search>`` or ``<answer>`` in it; where it opens neither, the end of the turn).
There, with ``x`` the context and ``S`` / ``A`` the tokens of ``<search>`` / ``<answer>``:

    log P(S | x) = sum_j log softmax(logits(x, S_<j))[S_j]         (temperature 1, the policy's own numbers)
    p_search     = P(S | x) / (P(S | x) + P(A | x))
    p            = p_search           on the search side
                   1 - p_search       on the answer side  (= P(A | x) / (P(S | x) + P(A | x)))

Each side's ``p`` is the mean over its questions; ``greedy_share`` the share of its questions whose greedy
turn opened the right tag. The decision accuracy weighs the two sides alike, whatever their sizes:

    decision_accuracy = (p_search_side + p_answer_side) / 2

A policy that always searches (or always answers) scores 1/2; one that searches exactly when the passage
names the next hop scores 1. A side without a question is None, and so is the decision accuracy then.
``second_search_p`` (the search side's ``p``) keeps the probe's earlier one-sided number.

The decoding (``searchr1.evaluation.probe_decode``) runs the questions ``batch_size`` at a time on the
rollout's slot decoder (Llama-family models): the template's shared prefix computed once, the contexts
prefilled together, the greedy turns and both candidates decoded in batched steps. ``batch_size=1`` (and a
model the slot decoder does not run) probes one question at a time on the Hugging Face modules, the
reference the batched path equals (``tests/evaluation/test_probe.py``).

    probe = decision_probe(model, tokenizer, samples, template, writer)
    probe["decision_accuracy"], probe["search_side"]["p"], probe["answer_side"]["p"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from searchr1.data.prompts import ANSWER_OPEN, SEARCH_OPEN
from searchr1.evaluation.probe_decode import (  # noqa: F401 (the probe's public names, re-exported)
    ContextCache,
    Decision,
    decide,
    decision_point,
    probe_question,
)
from searchr1.rollout.gold import ANSWER_SIDE, SEARCH_SIDE, GoldWriter, decision_points


@dataclass
class ProbeItem:
    """A question on a side: its ``context`` is its prompt's tokens, then its first gold search turn and
    that search's observation (the gold prefix up to the end of the first ``<information>``)."""

    side: str
    question: str
    queries: list[str]
    context: list[int]


def probe_items(
    samples: Sequence[Any], template: str, tokenizer: Any, writer: GoldWriter
) -> tuple[list[ProbeItem], int]:
    """The samples on a side (``searchr1.rollout.gold.decision_side``), in order, and how many one-search
    samples were left out (their passage lacks the answer); samples without a gold path are skipped."""
    items = []
    left_out = 0
    for point in decision_points(samples, template, tokenizer, writer):
        if point.side is None:
            left_out += 1
            continue
        items.append(ProbeItem(point.side, _question(point.sample), list(point.path.queries), point.context))
    return items, left_out


def decision_probe(
    model: Any,
    tokenizer: Any,
    samples: Sequence[Any],
    template: str,
    writer: GoldWriter,
    batch_size: int = 64,
) -> dict[str, Any]:
    """The two-sided probe over ``samples`` (``writer``: the run's tokenizer, rollout limits and search
    backend, which answers the first gold search); rows in the samples' order, each tagged with its side.
    ``batch_size``: questions decoded together (1: one at a time, the reference)."""
    items, left_out = probe_items(samples, template, tokenizer, writer)
    max_tokens = int(writer.config.max_turn_tokens)
    decided = decide(model, tokenizer, [item.context for item in items], max_tokens, batch_size)
    rows = []
    for item, result in zip(items, decided, strict=True):
        row = result.row(tokenizer)
        p = row["p_search"] if item.side == SEARCH_SIDE else 1.0 - row["p_search"]
        rows.append({"side": item.side, "question": item.question, "queries": item.queries, "p": p, **row})
    search = _side_summary([r for r in rows if r["side"] == SEARCH_SIDE], SEARCH_OPEN)
    answer = {
        **_side_summary([r for r in rows if r["side"] == ANSWER_SIDE], ANSWER_OPEN),
        "left_out": left_out,
    }
    both = search["p"] is not None and answer["p"] is not None
    return {
        "search_side": search,
        "answer_side": answer,
        "decision_accuracy": (search["p"] + answer["p"]) / 2 if both else None,
        "second_search_p": search["p"],
        "rows": rows,
    }


def _side_summary(rows: list[dict[str, Any]], right_tag: str) -> dict[str, Any]:
    """A side's questions, mean ``p`` and share of greedy turns that opened ``right_tag`` (None: no row)."""
    n = len(rows)
    return {
        "questions": n,
        "p": sum(r["p"] for r in rows) / n if n else None,
        "greedy_share": sum(r["opened"] == right_tag for r in rows) / n if n else None,
    }


def _question(sample: Any) -> str:
    return str(sample.get("question", "") if isinstance(sample, dict) else getattr(sample, "question", ""))
