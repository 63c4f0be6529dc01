"""The rollout interface the trainer and the evaluation call; engines plug in behind it.

    engine = build_engine(cfg, model, tokenizer, retriever)   # searchr1.rollout.registry; rollout.engine names it
    trajs = engine.generate(prompt_ids, metas, sampling=SamplingParams.from_config(cfg.rollout), seed=step)
    val = engine.generate(prompt_ids, metas, sampling=SamplingParams.greedy_eval(cfg.rollout), seed=0)

``generate`` returns one ``Trajectory`` per input row, in input order (repeat prompts ``n`` times
with ``expand_groups`` for GRPO groups). Nothing outside ``searchr1.rollout`` may depend on an
engine's internals: a vLLM engine only has to implement ``generate`` and ``update_weights``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.types import Trajectory


class RolloutEngine(ABC):
    """Turns prompts (token ids) into multi-turn trajectories."""

    last_stats: dict[str, float]
    """Engine-side measurements of the latest ``generate`` call (wall time, forward calls, ...)."""

    @abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt, in order; ``metas[i]`` is copied into ``trajectories[i].meta``."""

    def update_weights(self, state_dict: Mapping[str, Any] | None = None) -> None:  # noqa: B027
        """Make the engine generate with the trainer's latest weights.

        Engines that share the trainer's model object (the HF engines) need nothing; an engine with
        its own copy (vLLM) loads ``state_dict``.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads and memory."""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def expand_groups(
    prompt_ids: Sequence[Sequence[int]], metas: Sequence[Mapping[str, Any]], n: int
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """Repeat every prompt ``n`` times (a GRPO group); metas gain ``group`` and ``sample`` indices."""
    if len(prompt_ids) != len(metas):
        raise ValueError(f"expand_groups: {len(prompt_ids)} prompts but {len(metas)} metas")
    ids_out: list[list[int]] = []
    metas_out: list[dict[str, Any]] = []
    for g, (ids, meta) in enumerate(zip(prompt_ids, metas, strict=True)):
        for k in range(n):
            ids_out.append(list(ids))
            metas_out.append({**meta, "group": meta.get("group", g), "sample": k})
    return ids_out, metas_out


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch means for logging under ``rollout/``: turns, searches, invalid actions, truncations, ..."""
    n = max(1, len(trajectories))
    total = lambda attr: sum(float(getattr(t, attr)) for t in trajectories)  # noqa: E731
    searches = total("searches")
    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    metrics = {
        "rollout/turns_mean": total("turns") / n,
        "rollout/searches_mean": searches / n,
        "rollout/invalid_actions_mean": total("invalid_actions") / n,
        "rollout/obs_truncations_mean": total("obs_truncations") / n,
        "rollout/search_failure_rate": total("search_failures") / searches if searches else 0.0,
        "rollout/truncated_frac": sum(1.0 for t in trajectories if t.truncated) / n,
        "rollout/generated_tokens_mean": sum(t.num_generated for t in trajectories) / n,
        "rollout/response_tokens_mean": sum(len(t.response_ids) for t in trajectories) / n,
    }
    for reason, count in sorted(reasons.items()):
        metrics[f"rollout/finish_{reason or 'unknown'}_frac"] = count / n
    return metrics
