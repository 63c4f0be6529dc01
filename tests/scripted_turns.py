"""``ScriptedTurns``: a steer that makes a random tiny model act like a Search-R1 policy, for exact,
repeatable rollout workloads in the tests.

A seeded script per row (``meta["script"]``) says how many tokens to think and whether to search or
answer each turn; tag tokens are forced, the tokens in between are sampled from the model's real
distribution (with the tokens that could spell a tag masked out). Every forward pass stays real; only
the choice at the tag positions is forced.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from searchr1.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
)
from searchr1.rollout.steer import SteerRow

FREE = -1
"""A plan position where the model's own (masked) distribution chooses."""


def make_script(
    rng: random.Random,
    searches: int,
    think: tuple[int, int] = (4, 24),
    query: tuple[int, int] = (2, 6),
    answer: tuple[int, int] = (1, 4),
    think_lognormal: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """A turn plan: ``searches`` search turns, then an answer turn; lengths drawn from ``rng``.

    Thinking tokens per turn are uniform in ``think``, or, with ``think_lognormal=(median,
    sigma)``, log-normal (a long tail: most turns short, a few very long) clamped to ``think``.
    """

    def n_think() -> int:
        if think_lognormal is None:
            return rng.randint(*think)
        median, sigma = think_lognormal
        return min(think[1], max(think[0], round(rng.lognormvariate(math.log(median), sigma))))

    turns: list[dict[str, Any]] = [
        {"action": "search", "think": n_think(), "content": rng.randint(*query)} for _ in range(searches)
    ]
    turns.append({"action": "answer", "think": n_think(), "content": rng.randint(*answer)})
    return turns


class ScriptedTurns:
    """Force each row along ``meta["script"]`` (see ``make_script``); rows without one are left alone.

    A turn ``{"action": "search", "think": 5, "content": 3}`` becomes
    ``<think> ×5 </think> <search> ×3 </search>`` where each ``×`` is a free token (with
    ``"text": "Alice Verdan"`` instead of ``"content"``, that text is forced as the query); action
    ``"answer"`` uses ``<answer>``; action ``"none"`` thinks and then emits EOS (an invalid turn).
    Past the end of its script a row is forced to EOS.
    """

    def __init__(self, tokenizer: Any, eos_id: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id if eos_id is None else eos_id)
        self.tag_ids = {
            tag: list(tokenizer.encode(tag, add_special_tokens=False))
            for tag in (THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
        }
        self.banned = self._banned_tokens()
        self._plans: dict[tuple[int, int], list[int]] = {}

    def _banned_tokens(self) -> torch.Tensor:
        """Tokens a free position may not take: specials and anything containing ``<`` or ``>``."""
        vocab = len(self.tokenizer)
        banned = torch.zeros(vocab, dtype=torch.bool)
        special = set(getattr(self.tokenizer, "all_special_ids", []))
        for tid in range(vocab):
            piece = self.tokenizer.decode([tid], skip_special_tokens=False)
            if tid in special or "<" in piece or ">" in piece or "\ufffd" in piece or not piece.strip():
                banned[tid] = True
        banned[self.eos_id] = True
        return banned

    def plan(self, row: SteerRow) -> list[int]:
        key = (row.index, row.turn)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        script = row.meta.get("script") or []
        if row.turn >= len(script):
            plan = [self.eos_id]
        else:
            spec = script[row.turn]
            action = spec["action"]
            plan = self.tag_ids[THINK_OPEN] + [FREE] * int(spec["think"]) + self.tag_ids[THINK_CLOSE]
            if action == "none":
                plan += [self.eos_id]
            else:
                open_tag, close_tag = (
                    (SEARCH_OPEN, SEARCH_CLOSE) if action == "search" else (ANSWER_OPEN, ANSWER_CLOSE)
                )
                if "text" in spec:  # a fixed query / answer, typed out token by token
                    content = list(self.tokenizer.encode(" " + spec["text"] + " ", add_special_tokens=False))
                else:
                    content = [FREE] * int(spec["content"])
                plan += self.tag_ids[open_tag] + content + self.tag_ids[close_tag]
        self._plans[key] = plan
        return plan

    def __call__(self, rows: list[SteerRow], logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        banned = self.banned.to(logits.device)
        vocab = min(out.shape[-1], banned.shape[0])
        for i, row in enumerate(rows):
            if "script" not in row.meta:
                continue
            plan = self.plan(row)
            pos = len(row.turn_ids)
            forced = plan[pos] if pos < len(plan) else self.eos_id
            if forced == FREE:
                out[i, :vocab] = out[i, :vocab].masked_fill(banned[:vocab], float("-inf"))
                out[i, vocab:] = float("-inf")
            else:
                out[i] = float("-inf")
                out[i, forced] = 0.0
        return out
