"""The second-search probe: after the first passage of a two-hop question, does the policy search again?

For each question whose gold path searches two titles or more (``searchr1.rollout.gold``), the policy is
teacher-forced through its prompt and the gold path up to the end of the first ``<information>`` (the first
gold search and its real observation), then decodes its next turn greedily. The decision point is where
that turn opens its action tag (the first ``<search>`` or ``<answer>`` in it; where it opens neither, the
end of the turn). There, with ``x`` the context and ``S`` / ``A`` the tokens of ``<search>`` / ``<answer>``:

    log P(S | x) = sum_j log softmax(logits(x, S_<j))[S_j]         (temperature 1, the policy's own numbers)
    p_search     = P(S | x) / (P(S | x) + P(A | x))

``p_search`` is the probability that the policy's next turn opens a search rather than an answer, given its
own reasoning up to the decision; its mean over the questions is the probe (``second_search_p``), reported
before and after RL. ``greedy_search_share`` is the share of questions whose greedy turn opened a search.

    probe = second_search_probe(model, tokenizer, samples, template, writer)   # {"second_search_p", ...}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from searchr1.data.formats import sample_prompt
from searchr1.data.prompts import ANSWER_OPEN, SEARCH_OPEN
from searchr1.rollout.gold import GoldWriter, gold_path


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


def second_search_probe(
    model: Any, tokenizer: Any, samples: Sequence[Any], template: str, writer: GoldWriter
) -> dict[str, Any]:
    """The probe over the samples whose gold path searches two titles or more (``writer``: the run's
    tokenizer, rollout limits and search backend, which answers the first gold search); the means are None
    when there is no such sample."""
    was_training = model.training
    model.eval()
    rows = []
    try:
        for sample in samples:
            path = gold_path(sample)
            if path is None or len(path.queries) < 2:
                continue
            prompt = tokenizer(sample_prompt(sample, template, tokenizer), add_special_tokens=False)[
                "input_ids"
            ]
            prefix = writer.prefix(path)
            context = list(prompt) + prefix.turn_ids + prefix.obs_ids
            row = probe_question(model, tokenizer, context, int(writer.config.max_turn_tokens))
            rows.append({"question": _question(sample), "second_query": path.queries[1], **row})
    finally:
        model.train(was_training)
    n = len(rows)
    return {
        "questions": n,
        "second_search_p": sum(r["p_search"] for r in rows) / n if n else None,
        "greedy_search_share": sum(r["opened"] == SEARCH_OPEN for r in rows) / n if n else None,
        "rows": rows,
    }


def _question(sample: Any) -> str:
    return str(sample.get("question", "") if isinstance(sample, dict) else getattr(sample, "question", ""))
