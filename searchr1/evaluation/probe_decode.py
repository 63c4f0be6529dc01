"""The decision probe's decoding: from teacher-forced contexts to the greedy turn, its decision point and
log P(<search>) / log P(<answer>) there (what ``searchr1.evaluation.probe`` averages).

Per context ``x`` (a prompt and the gold prefix up to the end of the first ``<information>``):

1. the greedy turn ``y``: ``y_t = argmax_v logits(x, y_<t)[v]`` until it has opened ``<search>`` or
   ``<answer>`` (nothing after the tag changes what follows: the decision point lies before it), the
   end-of-sequence token, or ``max_tokens`` tokens;
2. its decision point ``k`` (``decision_point``): the tokens ``y_<k`` before the token that holds the turn's
   first ``<search>`` / ``<answer>`` (the end of the turn where it opens neither), and ``lead``, that token's
   text before the tag;
3. with ``S`` / ``A`` the tokens of ``lead + "<search>"`` / ``lead + "<answer>"`` and ``c = (x, y_<k)``:

       log P(S | c) = sum_j log softmax(logits(c, S_<j))[S_j]        (temperature 1)
       p_search     = P(S | c) / (P(S | c) + P(A | c)) = sigmoid(log P(S | c) - log P(A | c))

Two ways compute the same numbers:

* ``probe_question`` — one context at a time on the Hugging Face modules and one KV cache (the reference,
  and the path of models the slot decoder does not run): the prefix every context shares is run once, the
  turn decoded token by token, the cache cut back to the decision point for each candidate.
* ``probe_batched`` — many contexts together on the rollout's slot decoder (``searchr1.rollout.slots``,
  Llama-family models): the shared prefix (the template's instruction and worked examples) computed once
  and stored once, each context's own tokens prefilled in one pass (per-slot positions and length masks, no
  padding in the cache), the greedy turns decoded one batched step per token, then each candidate scored
  one batched step per token: every slot is cut back to ``c`` less its last token, which is fed again (its
  logits predict ``S_0``), then ``S_0``, ``S_1``, ... (each predicting the next).

``decide`` picks one: the batched path when ``batch_size > 1`` and the model is one the slot decoder runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from searchr1.data.prompts import ANSWER_OPEN, SEARCH_OPEN
from searchr1.hfcompat import cache_arg
from searchr1.rollout.hf import merged_weights_for  # the rollout engine's merged weights of the policy
from searchr1.rollout.slots import SlotBatch

TAGS = (SEARCH_OPEN, ANSWER_OPEN)


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
    found = [(text.find(tag), tag) for tag in TAGS if tag in text]
    if not found:
        return Decision(ids, "", None)
    start, tag = min(found)
    for j in range(len(ids)):
        if len(tokenizer.decode(ids[: j + 1])) > start:
            before = tokenizer.decode(ids[:j])
            return Decision(ids[:j], text[len(before) : start], tag)
    return Decision(ids, "", tag)  # not reached: the tag starts inside the decoded text


@dataclass
class Decided:
    """One context's greedy turn (``turn``: its token ids), its decision point and the log-probabilities of
    the two candidates there."""

    turn: list[int]
    decision: Decision
    log_search: float
    log_answer: float

    @property
    def p_search(self) -> float:
        """``sigmoid(log P(S) - log P(A)) = P(S) / (P(S) + P(A))``."""
        return float(torch.sigmoid(torch.tensor(self.log_search - self.log_answer, dtype=torch.float64)))

    def row(self, tokenizer: Any) -> dict[str, Any]:
        """The probe's per-question fields: ``p_search``, the tag the turn ``opened`` and the ``turn`` text (up to
        the tag it opened)."""
        return {"p_search": self.p_search, "opened": self.decision.tag, "turn": tokenizer.decode(self.turn)}


def candidates(decision: Decision, tokenizer: Any) -> list[list[int]]:
    """The token ids of ``lead + "<search>"`` and ``lead + "<answer>"``."""
    return [tokenizer.encode(decision.lead + tag, add_special_tokens=False) for tag in TAGS]


def end_ids(tokenizer: Any) -> set[int]:
    """The tokens that end a greedy turn: the end-of-sequence token."""
    return {tokenizer.eos_token_id} - {None}


TAG_TAIL = 16
"""Tokens at the end of a turn that ``opened_a_tag`` decodes: more than any tag takes (a byte-level
tokenizer spells ``<answer>`` in 8)."""


def opened_a_tag(turn_ids: Sequence[int], tokenizer: Any) -> bool:
    """Whether the turn has just opened ``<search>`` or ``<answer>``: its decision point is then fixed, and
    the greedy turn stops there (a turn used to run on to ``max_tokens``, ~3x the tokens the decision needs).
    Asked after every token, so a tag first appears at the turn's end: only the last ``TAG_TAIL`` tokens are
    decoded (the whole turn at every token cost O(T^2) decoding)."""
    text = tokenizer.decode(list(turn_ids[-TAG_TAIL:]))
    return any(tag in text for tag in TAGS)


# -- one context at a time (the reference) ---------------------------------------------------------------


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
def decide_one(
    model: Any, tokenizer: Any, context: list[int], max_tokens: int, cache: ContextCache | None = None
) -> Decided:
    """The greedy turn of one context decoded token by token, then log P(S) and log P(A) at its decision
    point, all on one KV cache (``cache``: one that already holds a proper prefix of ``context``; it is cut
    back to that prefix afterwards)."""
    cache = cache or ContextCache(model)
    shared = cache.length
    if context[:shared] != cache.ids or shared >= len(context):
        raise ValueError("probe_question: the cache must hold a proper prefix of the context")
    eos = end_ids(tokenizer)
    predicts = [cache.extend(context[shared:])[-1]]  # predicts[j]: the logits of the turn's token j
    turn: list[int] = []
    for _ in range(max_tokens):
        token = int(predicts[-1].argmax())
        if token in eos:
            break
        turn.append(token)
        if opened_a_tag(turn, tokenizer):  # predicts[:len(turn)] holds the decision point's logits
            break
        predicts.append(cache.extend([token])[-1])
    decision = decision_point(turn, tokenizer)
    at = len(context) + len(decision.ids)
    logs = []
    for candidate in candidates(decision, tokenizer):
        cache.cut(at)
        logs.append(continuation_logprob(cache, predicts[len(decision.ids)], candidate))
    cache.cut(shared)
    return Decided(turn, decision, logs[0], logs[1])


def probe_question(
    model: Any, tokenizer: Any, context: list[int], max_tokens: int, cache: ContextCache | None = None
) -> dict[str, Any]:
    """``p_search``, the tag the greedy turn ``opened`` and its ``turn`` text for one teacher-forced context
    (prompt + gold prefix), on the Hugging Face modules (``decide_one``)."""
    return decide_one(model, tokenizer, context, max_tokens, cache).row(tokenizer)


def common_prefix(contexts: Sequence[Sequence[int]]) -> int:
    """Tokens every context begins with, leaving each at least one of its own."""
    n = min(len(c) for c in contexts) - 1
    first = contexts[0]
    for other in contexts[1:]:
        n = next((i for i in range(n) if other[i] != first[i]), n)
    return max(0, n)


def decide_one_by_one(
    model: Any, tokenizer: Any, contexts: Sequence[list[int]], max_tokens: int
) -> list[Decided]:
    """``decide_one`` per context in order, on one cache that keeps the prefix every context shares."""
    cache = ContextCache(model)
    shared = common_prefix(contexts)
    if shared:
        cache.extend(contexts[0][:shared])
    return [decide_one(model, tokenizer, context, max_tokens, cache) for context in contexts]


# -- many contexts together (the slot decoder) -----------------------------------------------------------


def decode_dtype(model: Any) -> torch.dtype:
    """The dtype the model's own forward would compute in here: autocast's when autocast is on for its
    device (the demo's bfloat16 autocast), else the dtype of its parameters."""
    param = next(model.parameters())
    if torch.is_autocast_enabled(param.device.type):
        return torch.get_autocast_dtype(param.device.type)
    return param.dtype


@torch.no_grad()
def probe_batched(
    weights: Any, dtype: torch.dtype, tokenizer: Any, contexts: Sequence[list[int]], max_tokens: int,
    batch_size: int,
) -> list[Decided]:  # fmt: skip
    """``decide_one`` of every context, ``batch_size`` contexts at a time on one ``SlotBatch`` over the
    merged ``weights`` in ``dtype`` (see the module docstring); results in the contexts' order."""
    n_slots = min(batch_size, len(contexts))
    longest = max(len(c) for c in contexts)
    batch = SlotBatch(weights, n_slots, dtype, contexts, stream_tokens=longest + max_tokens + 1)
    out: list[Decided] = []
    for start in range(0, len(contexts), n_slots):
        out.extend(_wave(batch, tokenizer, contexts[start : start + n_slots], max_tokens))
    return out


def _wave(batch: SlotBatch, tokenizer: Any, contexts: Sequence[list[int]], max_tokens: int) -> list[Decided]:
    """One context per slot ``0 .. len(contexts) - 1``: prefill, greedy turns, decision points, scores."""
    slots = range(len(contexts))
    for s in slots:
        batch.reset_slot(s)
    logits = batch.step({s: contexts[s][batch.prefix_len :] for s in slots})
    turns = _greedy(batch, logits, end_ids(tokenizer), max_tokens, lambda turn: opened_a_tag(turn, tokenizer))
    decisions = [decision_point(turn, tokenizer) for turn in turns]
    reached = [contexts[s] + decisions[s].ids for s in slots]
    pairs = [candidates(d, tokenizer) for d in decisions]
    log_s = _score(batch, reached, [p[0] for p in pairs])
    log_a = _score(batch, reached, [p[1] for p in pairs])
    return [Decided(turns[s], decisions[s], log_s[s], log_a[s]) for s in slots]


def _greedy(
    batch: SlotBatch, logits: torch.Tensor, eos: set[int], max_tokens: int, done: Callable[[list[int]], bool]
) -> list[list[int]]:
    """Greedy turns of slots ``0 .. n - 1`` from their next-token ``logits [n, V]``: each turn ends before an
    end token, once ``done(turn)`` (it opened a tag) or at ``max_tokens`` tokens; a turn's last token is not
    fed (nothing is read after it)."""
    turns: list[list[int]] = [[] for _ in range(logits.shape[0])]
    live = list(range(logits.shape[0]))
    for step in range(max_tokens):
        feeds = {}
        for s, token in zip(live, logits.float().argmax(dim=-1).tolist(), strict=True):
            if token not in eos:
                turns[s].append(token)
                if not done(turns[s]):
                    feeds[s] = [token]
        live = sorted(feeds)
        if not live or step == max_tokens - 1:
            break
        logits = batch.step(feeds)
    return turns


def _score(batch: SlotBatch, reached: list[list[int]], targets: list[list[int]]) -> list[float]:
    """``log P(targets[s] | reached[s])`` per slot ``s``, one batched step per token: the slot is cut back to
    ``reached[s]`` less its last token, which is fed again, then ``targets[s][:-1]``; step ``j``'s logits
    predict ``targets[s][j]``."""
    feeds = []
    for s, (ids, target) in enumerate(zip(reached, targets, strict=True)):
        cut(batch, s, len(ids) - 1)
        feeds.append([ids[-1], *target[:-1]])
    total = [0.0] * len(reached)
    for j in range(max(len(t) for t in targets)):
        active = [s for s, target in enumerate(targets) if j < len(target)]
        logp = torch.log_softmax(batch.step({s: [feeds[s][j]] for s in active}).float(), dim=-1)
        index = torch.tensor([targets[s][j] for s in active], device=logp.device)
        picked = logp.gather(1, index[:, None]).squeeze(1).tolist()
        for s, value in zip(active, picked, strict=True):
            total[s] += value
    return total


def cut(batch: SlotBatch, slot: int, n_real: int) -> None:
    """Forget every position of ``slot`` from ``n_real`` on (the shared prefix included in the count): a
    ``SlotBatch`` slot holds its tokens after the prefix at columns ``0 .. lengths[slot] - 1`` and attends to
    no column past its length, so shortening the length drops the rest; the next token goes there."""
    own = n_real - batch.prefix_len
    if not 0 <= own <= batch.lengths[slot]:
        raise ValueError(f"slot {slot}: cannot cut {batch.n_real[slot]} positions to {n_real}")
    batch.lengths[slot] = own


def decide(
    model: Any, tokenizer: Any, contexts: Sequence[list[int]], max_tokens: int, batch_size: int = 64
) -> list[Decided]:
    """``Decided`` per context, in order: batched (``probe_batched``) when ``batch_size > 1`` and the slot
    decoder runs the model (a Llama-family causal LM, not sharded), else one at a time
    (``decide_one_by_one``). The model is put in eval mode meanwhile."""
    if not contexts:
        return []
    was_training = model.training
    model.eval()
    try:
        weights = merged_weights_for(model) if batch_size > 1 else None
        if weights is None:
            return decide_one_by_one(model, tokenizer, contexts, max_tokens)
        return probe_batched(weights, decode_dtype(model), tokenizer, contexts, max_tokens, batch_size)
    finally:
        model.train(was_training)
