"""One generation turn per prompt and no search: the engine of the direct, cot and rag baselines.

    engine = SingleTurnEngine(model, tokenizer, max_new_tokens=64)
    trajs = engine.generate(prompt_ids, metas, sampling=SamplingParams.greedy_eval(), seed=0)

It is the KV-cached HF engine with no search turn (``rollout.max_turns = 0``): the same decoding
loop, sampler, per-row seeds, stored log-probs and steering hook as the agent's rollouts, so a
baseline differs from the agent only in its prompt and in not searching. A reply ends at the first
``</answer>`` (or ``</search>``: the search is not run), at EOS, or after ``max_new_tokens``.
``finish_reason``: answer | search | eos | length (``truncated`` is true for length).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from searchr1.retrieval.base import Hit, Retriever, SearchError
from searchr1.rollout.actions import eos_token_ids, parse_action
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.engine import PolicyWeights, RolloutEngine, TokenListener
from searchr1.rollout.hf import HFRolloutEngine
from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.steer import Steer
from searchr1.rollout.types import Trajectory


class _NoSearch(Retriever):
    """The retriever of an engine that never searches (a call is a bug, and says so)."""

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        raise SearchError("the single-turn engine does not search")


class SingleTurnEngine(RolloutEngine):
    """Greedy (or sampled) one-turn replies, as ``Trajectory`` objects with prompt / generated roles."""

    weight_format = "module"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_new_tokens: int = 256,
        *,
        config: RolloutConfig | None = None,
        steer: Steer | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"SingleTurnEngine: max_new_tokens must be >= 1, got {max_new_tokens}")
        cfg = replace(
            config or RolloutConfig(),
            max_turns=0,
            max_turn_tokens=max_new_tokens,
            max_response_tokens=max_new_tokens + 1,  # the turn limit ends the reply, not the budget
            invalid_action_message=False,
        )
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.config = cfg
        self._eos = eos_token_ids(tokenizer, model)
        self._engine = HFRolloutEngine(model, tokenizer, _NoSearch(), cfg, steer=steer)
        self.last_stats: dict[str, float] = {}

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        on_tokens: TokenListener | None = None,
    ) -> list[Trajectory]:
        """One reply per prompt, in order (greedy unless ``sampling`` says otherwise)."""
        trajs = self._engine.generate(
            prompt_ids,
            metas,
            sampling=sampling or SamplingParams(greedy=True),
            seed=seed,
            on_tokens=on_tokens,
        )
        self.last_stats = dict(self._engine.last_stats)
        for traj in trajs:
            traj.finish_reason = self._finish_reason(traj)
            traj.truncated = traj.finish_reason == "length"
        return trajs

    def _finish_reason(self, traj: Trajectory) -> str:
        if traj.finish_reason == "answer":
            return "answer"
        if traj.response_ids and traj.response_ids[-1] in self._eos:
            return "eos"
        text = self.tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        if parse_action(text).kind == "search":
            return "search"
        return "length"

    def update_weights(self, weights: PolicyWeights) -> None:
        self._engine.update_weights(weights)

    def close(self) -> None:
        self._engine.close()
