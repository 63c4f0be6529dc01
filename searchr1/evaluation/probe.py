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

    probe = decision_probe(model, tokenizer, samples, template, writer)
    probe["decision_accuracy"], probe["search_side"]["p"], probe["answer_side"]["p"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from searchr1.data.formats import sample_prompt
from searchr1.data.prompts import ANSWER_OPEN, SEARCH_OPEN
from searchr1.rollout.gold import GoldPath, GoldWriter, gold_path, sentence_naming


@dataclass
class Decision:
    """Where a decoded turn opens its action: ``ids`` (the turn's tokens before it) and ``lead`` (the text
    of the token that holds the tag before the tag: prepended to both candidates); ``tag`` is the tag the
    turn opened (None: neither)."""

    ids: list[int]
    lead: str
    tag: str | None


def decision_point(turn_ids: Sequence[int], tokenizer: Any) -> Decision:
    """The decision point of a decoded turn (see the module docstring); end-of-sequence tokens end it."""
    eos = {tokenizer.eos_token_id, getattr(tokenizer, "pad_token_id", None)} - {None}
    ids = []
    for token in turn_ids:
        if int(token) in eos:
            break
        ids.append(int(token))
    text = tokenizer.decode(ids)
    found = [(text.find(tag), tag) for tag in (SEARCH_OPEN, ANSWER_OPEN) if tag in text]
    if not found:
        return Decision(ids, "", None)
    start, tag = min(found)
    for j in range(len(ids)):
        if len(tokenizer.decode(ids[: j + 1])) > start:
            before = tokenizer.decode(ids[:j])
            return Decision(ids[:j], text[len(before) : start], tag)
    return Decision(ids, "", tag)  # not reached: the tag starts inside the decoded text


@torch.no_grad()
def sequence_logprob(model: Any, context: Sequence[int], continuation: Sequence[int]) -> float:
    """log P(continuation | context) under ``model`` (one forward pass, temperature 1)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(context) + list(continuation)], device=device)
    logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp.gather(-1, torch.tensor(continuation, device=device)[:, None]).sum())


@torch.no_grad()
def greedy_turn(model: Any, context: Sequence[int], max_tokens: int, eos_ids: set[int]) -> list[int]:
    """The policy's greedy continuation of ``context``, ``max_tokens`` tokens at most (ends at EOS)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(context)], device=device)
    eos = sorted(eos_ids)
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
        eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0,
    )  # fmt: skip
    return [int(t) for t in out[0, ids.shape[1] :]]


def probe_question(model: Any, tokenizer: Any, context: list[int], max_tokens: int) -> dict[str, Any]:
    """``p_search`` of one teacher-forced context (prompt + gold prefix)."""
    eos = {tokenizer.eos_token_id} - {None}
    turn = greedy_turn(model, context, max_tokens, eos)
    decision = decision_point(turn, tokenizer)
    at = context + decision.ids
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    log_search = sequence_logprob(model, at, encode(decision.lead + SEARCH_OPEN))
    log_answer = sequence_logprob(model, at, encode(decision.lead + ANSWER_OPEN))
    p_search = float(torch.sigmoid(torch.tensor(log_search - log_answer)))
    return {"p_search": p_search, "opened": decision.tag, "turn": tokenizer.decode(turn)}


SEARCH_SIDE = "search"
ANSWER_SIDE = "answer"


def side_of(path: GoldPath | None, first_hits: Sequence[Any]) -> str | None:
    """The side of a question (see the module docstring) given its gold path and what its first gold search
    returned; None: on neither side (no gold path, or a one-search path whose passage lacks the answer)."""
    if path is None:
        return None
    if len(path.queries) >= 2:
        return SEARCH_SIDE
    return ANSWER_SIDE if sentence_naming(first_hits, path.answer) is not None else None


def decision_probe(
    model: Any, tokenizer: Any, samples: Sequence[Any], template: str, writer: GoldWriter
) -> dict[str, Any]:
    """The two-sided probe over ``samples`` (``writer``: the run's tokenizer, rollout limits and search
    backend, which answers the first gold search); rows in the samples' order, each tagged with its side."""
    was_training = model.training
    model.eval()
    rows = []
    left_out = 0
    try:
        for sample in samples:
            path = gold_path(sample)
            if path is None:
                continue
            prefix = writer.prefix(path)
            side = side_of(path, prefix.documents)
            if side is None:
                left_out += 1
                continue
            prompt = tokenizer(sample_prompt(sample, template, tokenizer), add_special_tokens=False)
            context = list(prompt["input_ids"]) + prefix.turn_ids + prefix.obs_ids
            row = probe_question(model, tokenizer, context, int(writer.config.max_turn_tokens))
            p = row["p_search"] if side == SEARCH_SIDE else 1.0 - row["p_search"]
            rows.append({"side": side, "question": _question(sample), "queries": list(path.queries),
                         "p": p, **row})  # fmt: skip
    finally:
        model.train(was_training)
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
