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
from searchr1.hfcompat import cache_arg
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


class ContextCache:
    """The policy's KV cache over a context, grown and cut back in place: the probe runs the prompt prefix
    every question shares once, then per question only what follows it (``cut`` returns to any length)."""

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.ids: list[int] = []

    @torch.no_grad()
    def extend(self, ids: Sequence[int]) -> torch.Tensor:
        """Run ``ids`` after the cached context; returns their logits ``[len(ids), V]`` in float32 (row j
        predicts the token after ``ids[j]``)."""
        x = torch.tensor([list(ids)], device=self.device)
        positions = torch.arange(self.length, self.length + len(ids), device=self.device)
        out = self.model(input_ids=x, **cache_arg(self.cache), use_cache=True, cache_position=positions)
        self.ids.extend(int(i) for i in ids)
        return out.logits[0].float()

    @property
    def length(self) -> int:
        return len(self.ids)

    def cut(self, length: int) -> None:
        """Forget every cached position from ``length`` on."""
        if length < self.length:
            self.cache.crop(length - self.length)  # negative: remove that many (every transformers 4.4x-5.x)
            del self.ids[length:]

    def keep_prefix_of(self, context: Sequence[int]) -> None:
        """Cut the cache back to the longest prefix it shares with ``context``."""
        n = next((i for i, (a, b) in enumerate(zip(self.ids, context, strict=False)) if a != b), None)
        self.cut(min(self.length, len(context) - 1) if n is None else n)


def continuation_logprob(cache: ContextCache, first: torch.Tensor, continuation: Sequence[int]) -> float:
    """log P(continuation | context) where ``first`` holds the logits that predict the token after the cached
    context (the cache is grown by ``continuation[:-1]``)."""
    logp = torch.log_softmax(first, dim=-1)[continuation[0]]
    if len(continuation) > 1:
        rest = torch.log_softmax(cache.extend(continuation[:-1]), dim=-1)
        logp = logp + rest.gather(-1, torch.tensor(continuation[1:], device=rest.device)[:, None]).sum()
    return float(logp)


@torch.no_grad()
def probe_question(
    model: Any, tokenizer: Any, context: list[int], max_tokens: int, cache: ContextCache | None = None
) -> dict[str, Any]:
    """``p_search`` of one teacher-forced context (prompt + gold prefix): the greedy turn decoded token by
    token, then log P(S) and log P(A) at its decision point, all on one KV cache (``cache``: one that already
    holds a prefix of ``context``; it is cut back to that prefix afterwards)."""
    cache = cache or ContextCache(model)
    shared = cache.length
    if context[:shared] != cache.ids or shared >= len(context):
        raise ValueError("probe_question: the cache must hold a proper prefix of the context")
    eos = {tokenizer.eos_token_id} - {None}
    predicts = [cache.extend(context[shared:])[-1]]  # predicts[j]: the logits of the turn's token j
    turn: list[int] = []
    for _ in range(max_tokens):
        token = int(predicts[-1].argmax())
        if token in eos:
            break
        turn.append(token)
        predicts.append(cache.extend([token])[-1])
    decision = decision_point(turn, tokenizer)
    at = len(context) + len(decision.ids)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    logs = []
    for tag in (SEARCH_OPEN, ANSWER_OPEN):
        cache.cut(at)
        logs.append(continuation_logprob(cache, predicts[len(decision.ids)], encode(decision.lead + tag)))
    cache.cut(shared)
    p_search = float(torch.sigmoid(torch.tensor(logs[0] - logs[1])))
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
    cache: ContextCache | None = None
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
            if cache is None:  # the template's prefix every prompt shares, run once
                cache = ContextCache(model)
                cache.extend(context[: max(1, shared_prefix(samples, template, tokenizer))])
            cache.keep_prefix_of(context)  # a prompt of its own (stored messages): less is shared
            row = probe_question(model, tokenizer, context, int(writer.config.max_turn_tokens), cache)
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


def shared_prefix(samples: Sequence[Any], template: str, tokenizer: Any) -> int:
    """Tokens every sample's prompt starts with (the template before the question), minus one."""
    prompts = [tokenizer(sample_prompt(s, template, tokenizer), add_special_tokens=False)["input_ids"]
               for s in samples[:2]] + [tokenizer(sample_prompt({"question": "x"}, template, tokenizer),
                                                  add_special_tokens=False)["input_ids"]]  # fmt: skip
    n = min(len(p) for p in prompts)
    same = next((i for i in range(n) if len({p[i] for p in prompts}) > 1), n)
    return max(0, same - 1)


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
