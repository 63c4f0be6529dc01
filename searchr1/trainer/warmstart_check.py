"""The warm start's own check: does the policy take the decision on training questions it was not trained on?

A slice of the training split is held out of the warm start (``holdout_split``: balanced by kind, seeded,
never among the trained rows). Every ``warmstart.check_every`` optimizer steps the policy is scored on it,
teacher-forced, on both sides of the decision that follows the first gold passage:

* the search side (gold path of two searches or more): the gold next turn opens ``<think> {the sentence
  that names the next title}`` and goes on `` I should search ...``;
* the answer side (one search, its passage holds the answer): ``<think> {the sentence that holds the
  answer}`` goes on `` </think>\\n<answer>``.

With ``x`` the prompt, the first gold search turn, its real observation and the next turn's opening
(``<think>`` and its evidence sentence), ``S`` = `` I should search`` and ``A`` = `` </think>\\n<answer>``:

    log P(C | x) = sum_j log pi(C_j | x, C_<j)            C in {S, A}, the policy's own numbers, temperature 1
    p            = P(right | x) / (P(S | x) + P(A | x))   right = S on the search side, A on the answer side
    decision_accuracy = (mean p over the search side + mean p over the answer side) / 2

It is the two-sided decision probe of ``searchr1.evaluation.probe`` without the greedy decoding: one
forward pass over the contexts, the candidates after them on the cached keys and values, so it costs seconds
and can run during training. Where the update's fused decoder applies, the warm start scores each (context,
candidate) row through it instead: the shared prompt prefix runs once, and with the adapter on the top layers
only the layers below run at the first check alone (``fused_continuation_logprobs``). ``right_share`` is the share of questions whose right candidate is the likelier
one. The warm start keeps the adapter of its best
check (``WarmStart``) and stops once ``warmstart.stop_at`` is reached.

    held, train = holdout_split(samples, 32, seed)
    check = DecisionCheck.build([samples[i] for i in held], tokenizer, template, writer)
    check.measure(policy, device)["decision_accuracy"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from searchr1.data.formats import sample_kind
from searchr1.data.prompts import ANSWER_OPEN, THINK_CLOSE, THINK_OPEN
from searchr1.hfcompat import cache_arg
from searchr1.rollout.gold import (
    ANSWER_SIDE,
    SEARCH_SIDE,
    GoldWriter,
    decision_points,
    gold_path,
    sentence_naming,
)
from searchr1.trainer.fused_decoder import fused_token_logprobs

SEARCH_CONTINUATION = " I should search"
ANSWER_CONTINUATION = f" {THINK_CLOSE}\n{ANSWER_OPEN}"


def holdout_split(samples: Sequence[Any], n: int, seed: int) -> tuple[list[int], list[int]]:
    """``(held, trained)`` row indices: ``n`` rows with a gold path held out, half of them multi-hop and half
    single-hop where both kinds have enough (the rest from the other kind), in a seeded order; every other
    row is trained. ``held`` and ``trained`` never overlap and together are every row."""
    if n <= 0:
        return [], list(range(len(samples)))
    gen = torch.Generator().manual_seed(int(seed) * 7_919 + 17)
    order = torch.randperm(len(samples), generator=gen).tolist()
    by_kind: dict[str, list[int]] = {}
    for i in order:
        if gold_path(samples[i]) is not None:
            by_kind.setdefault(sample_kind(samples[i]), []).append(i)
    kinds = sorted(by_kind)
    if sum(len(v) for v in by_kind.values()) <= n:
        raise ValueError(
            f"warmstart.holdout={n}: only {sum(len(v) for v in by_kind.values())} training rows have a gold "
            "path; hold out fewer so that some are left to train on"
        )
    held: list[int] = []
    share = n // max(1, len(kinds))
    for kind in kinds:
        held.extend(by_kind[kind][:share])
    rest = [i for kind in kinds for i in by_kind[kind][share:]]
    held.extend(rest[: n - len(held)])
    held_set = set(held)
    return sorted(held), [i for i in range(len(samples)) if i not in held_set]


@dataclass
class CheckItem:
    """One held-out question: its context ids, its side and the ids of the two candidates."""

    side: str
    context: list[int]
    search_ids: list[int]
    answer_ids: list[int]


class DecisionCheck:
    """The teacher-forced two-sided decision check over held-out questions (see the module docstring)."""

    def __init__(self, items: list[CheckItem], pad_id: int, batch_size: int = 8) -> None:
        """``batch_size``: contexts per forward pass."""
        self.items = items
        self.pad_id = pad_id
        self.batch_size = batch_size

    @classmethod
    def build(
        cls, samples: Sequence[Any], tokenizer: Any, template: str, writer: GoldWriter, batch_size: int = 8
    ) -> DecisionCheck:
        """The items of ``samples`` (a question on neither side is left out, as in the probe)."""
        items = []
        search_ids = writer.encode(SEARCH_CONTINUATION)
        answer_ids = writer.encode(ANSWER_CONTINUATION)
        for point in decision_points(samples, template, tokenizer, writer):
            if point.side is None:
                continue
            phrase = point.path.queries[1] if point.side == SEARCH_SIDE else point.path.answer
            evidence = sentence_naming(point.first.documents, phrase)
            opening = f"{THINK_OPEN} {evidence}" if evidence else THINK_OPEN
            context = [*point.context, *writer.encode(opening)]
            items.append(CheckItem(point.side, context, list(search_ids), list(answer_ids)))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(items, int(pad or 0), batch_size)

    @property
    def sides(self) -> dict[str, int]:
        return {side: sum(it.side == side for it in self.items) for side in (SEARCH_SIDE, ANSWER_SIDE)}

    @torch.no_grad()
    def continuation_logprobs(self, model: Any, device: torch.device) -> list[tuple[float, float]]:
        """``(log P(S | x), log P(A | x))`` per item, in batches of left-padded contexts: each context runs
        once, its keys and values cached, and each candidate runs after it on the cache (cut back to the
        context between the two), so the check costs one pass over the contexts, not two."""
        out: list[tuple[float, float]] = []
        for start in range(0, len(self.items), self.batch_size):
            chunk = self.items[start : start + self.batch_size]
            width = max(len(it.context) for it in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for r, item in enumerate(chunk):
                ids[r, width - len(item.context) :] = torch.tensor(item.context)
                mask[r, width - len(item.context) :] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            mask = mask.to(device)
            cache = DynamicCache()
            context = model(
                input_ids=ids.to(device),
                attention_mask=mask,
                position_ids=positions.to(device),
                **cache_arg(cache),
                use_cache=True,
                logits_to_keep=1,
            )
            # the last position's distribution: each candidate's first token
            first = torch.log_softmax(context.logits[:, -1].float(), dim=-1)
            scores = [
                self._candidate_logprobs(model, cache, first, mask, positions[:, -1], cands, device)
                for cands in ([it.search_ids for it in chunk], [it.answer_ids for it in chunk])
            ]
            out.extend(zip(*scores, strict=True))
        return out

    @torch.no_grad()
    def fused_continuation_logprobs(self, decoder: Any) -> list[tuple[float, float]]:
        """The same pairs through the update's fused decoder (``searchr1.trainer.fused_decoder``): each
        (context, candidate) one right-padded row, ``2 * batch_size`` rows a pass, the candidate's tokens the
        targets. The prompt prefix the rows share runs once a pass, and with a frozen trunk attached
        (``FrozenTrunk``, the warm start on its top layers) the layers below it run at the first check only."""
        rows = [(it.context, cand) for it in self.items for cand in (it.search_ids, it.answer_ids)]
        scores: list[float] = []
        device = decoder.embed.weight.device
        for start in range(0, len(rows), 2 * self.batch_size):
            chunk = rows[start : start + 2 * self.batch_size]
            width = max(len(ctx) + len(cand) for ctx, cand in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            target = torch.zeros((len(chunk), width), dtype=torch.bool)
            for r, (ctx, cand) in enumerate(chunk):
                ids[r, : len(ctx) + len(cand)] = torch.tensor([*ctx, *cand])
                mask[r, : len(ctx) + len(cand)] = 1
                target[r, len(ctx) : len(ctx) + len(cand)] = True
            lp, _ = fused_token_logprobs(
                decoder, ids.to(device), mask.to(device), target_mask=target.to(device)
            )
            scores.extend((lp.float() * target.to(device)).sum(dim=1).tolist())
        return list(zip(scores[0::2], scores[1::2], strict=True))

    def _candidate_logprobs(
        self,
        model: Any,
        cache: Any,
        first: torch.Tensor,
        mask: torch.Tensor,
        last_position: torch.Tensor,
        cands: list[list[int]],
        device: torch.device,
    ) -> list[float]:
        """``sum_j log pi(C_j | x, C_<j)`` of each row's candidate ``cands[r]`` after its cached context; the
        cache is cut back to the context afterwards."""
        length = max(len(c) for c in cands)
        totals = [float(first[r, c[0]]) for r, c in enumerate(cands)]
        if length < 2:
            return totals
        ids = torch.full((len(cands), length - 1), self.pad_id, dtype=torch.long)
        cont = torch.zeros((len(cands), length - 1), dtype=torch.long)
        for r, c in enumerate(cands):  # right-padded: a candidate's tokens never see the padding after them
            ids[r, : len(c) - 1] = torch.tensor(c[:-1])
            cont[r, : len(c) - 1] = 1
        positions = last_position[:, None] + 1 + torch.arange(length - 1)[None, :]
        logits = model(
            input_ids=ids.to(device),
            attention_mask=torch.cat([mask, cont.to(device)], dim=1),
            position_ids=positions.to(device),
            **cache_arg(cache),
            use_cache=True,
        ).logits.float()
        cache.crop(-(length - 1))  # negative: remove that many (every transformers 4.4x-5.x)
        logp = torch.log_softmax(logits, dim=-1)  # position j predicts the candidate's token j + 1
        for r, c in enumerate(cands):
            totals[r] += sum(float(logp[r, j, c[j + 1]]) for j in range(len(c) - 1))
        return totals

    def measure(self, model: Any, device: torch.device, decoder: Any = None) -> dict[str, Any]:
        """``decision_accuracy`` and, per side, ``p`` (the mean probability of the right candidate against
        the wrong one), ``right_share`` and ``questions``; None where a side has no question. With
        ``decoder`` (the fused decoder of ``model``) the pairs come from ``fused_continuation_logprobs``."""
        was_training = model.training
        model.eval()
        try:
            if decoder is not None:
                pairs = self.fused_continuation_logprobs(decoder)
            else:
                pairs = self.continuation_logprobs(model, device)
        finally:
            model.train(was_training)
        sides: dict[str, dict[str, Any]] = {}
        for side in (SEARCH_SIDE, ANSWER_SIDE):
            ps = []
            for item, (log_s, log_a) in zip(self.items, pairs, strict=True):
                if item.side != side:
                    continue
                p_search = float(torch.sigmoid(torch.tensor(log_s - log_a)))
                ps.append(p_search if side == SEARCH_SIDE else 1.0 - p_search)
            n = len(ps)
            sides[side] = {
                "questions": n,
                "p": sum(ps) / n if n else None,
                "right_share": sum(p > 0.5 for p in ps) / n if n else None,
            }
        s, a = sides[SEARCH_SIDE]["p"], sides[ANSWER_SIDE]["p"]
        return {
            "decision_accuracy": (s + a) / 2 if s is not None and a is not None else None,
            "search_side": sides[SEARCH_SIDE],
            "answer_side": sides[ANSWER_SIDE],
        }


__all__ = ["ANSWER_CONTINUATION", "SEARCH_CONTINUATION", "CheckItem", "DecisionCheck", "holdout_split"]
