"""A plugin for the tests of the collapse guard in real runs: the rollout engine ``stops_searching``, the HF
engine whose policy searches in the first ``SEARCHING_STEPS`` training steps of a run and answers at once
(no search) after them, so that the guard's "searching stopped" must show at step ``SEARCHING_STEPS + 2``
(its trailing mean over 2 steps falls below half the best).

Select it with ``plugins=[collapse_engine] rollout.engine=stops_searching`` (``tests/`` is on the path).
Every forward pass is the model's own; only the tags are forced (turn 0: ``<search> x x </search>`` while
searching, ``<answer> x x </answer>`` after; later turns answer), as ``rlworld.ForceSearch`` does. The
training step is read from the rollout seed the trainer derives from it, so a resumed run behaves the same;
an evaluation's ``generate`` (any other seed) searches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from searchr1.data.prompts import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN
from searchr1.rollout.engine import PolicyWeights, RolloutEngine
from searchr1.rollout.registry import build_engine, register_engine
from searchr1.trainer.loop import _seed_for  # how the trainer seeds a step's rollout

SEARCHING_STEPS = 2
"""Training steps (counted from 1) in which the policy searches."""
ALERT_STEP = SEARCHING_STEPS + 2
"""The step at which the guard must warn: mean(1 search, 0) is still half the best, mean(0, 0) is not."""


class SearchThenAnswer:
    """A steer: turn 0 searches (while ``searching``) or answers; later turns answer; 2 free tokens inside."""

    def __init__(self, tokenizer: Any) -> None:
        ids = tokenizer.convert_tokens_to_ids
        self.search = (ids(SEARCH_OPEN), ids(SEARCH_CLOSE))
        self.answer = (ids(ANSWER_OPEN), ids(ANSWER_CLOSE))
        self.tags = [*self.search, *self.answer]
        self.searching = True

    def __call__(self, rows: list, logits: torch.Tensor) -> torch.Tensor:
        for i, row in enumerate(rows):
            opening, closing = self.search if (row.turn == 0 and self.searching) else self.answer
            n = len(row.turn_ids)
            force = opening if n == 0 else closing if n == 3 else None
            if force is None:
                logits[i, self.tags] = -torch.inf
            else:
                logits[i] = -torch.inf
                logits[i, force] = 0.0
        return logits


class StopsSearching(RolloutEngine):
    """The HF engine with ``SearchThenAnswer``; searching while the training step is <= ``SEARCHING_STEPS``."""

    def __init__(self, cfg: Any, model: Any, tokenizer: Any, retriever: Any, **kwargs: Any) -> None:
        self.steer = SearchThenAnswer(tokenizer)
        self.inner = build_engine(cfg, model, tokenizer, retriever, name="hf", steer=self.steer, **kwargs)
        self.weight_format = self.inner.weight_format  # type: ignore[misc]
        self.seeds = {_seed_for(cfg.seed, step, 0): step + 1 for step in range(1000)}  # rollout seed -> step

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampling: Any = None,
        seed: int | None = None,
        on_tokens: Any = None,
    ) -> list:
        step = self.seeds.get(seed) if seed is not None else None
        self.steer.searching = step is None or step <= SEARCHING_STEPS
        return self.inner.generate(prompt_ids, metas, sampling=sampling, seed=seed, on_tokens=on_tokens)

    def update_weights(self, weights: PolicyWeights) -> None:
        self.inner.update_weights(weights)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # last_stats and the like: the inner engine's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


register_engine("stops_searching")(StopsSearching)
