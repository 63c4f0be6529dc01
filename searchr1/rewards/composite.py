"""The composite reward: a weighted sum of named components, with every term reported.

    R(episode) = sum_k  w_k * r_k(episode)

``reward.components`` gives the names and weights. The Search-R1 paper uses EM only
(``{exact_match: 1.0}``); the seed example is ``{correct_answer: 10.0, search_penalty: -0.1,
invalid_format: -5.0}``. ``RewardOutput.components`` holds the weighted terms (they sum to
``total``) so training can log them separately; ``raw`` holds the unweighted scores.

    reward = build_reward(RewardConfig.from_simple({"correct_answer": 10.0, "search_penalty": -0.1}))
    out = reward(trajectory, tokenizer.decode)                # from a rollout
    out = reward.score_text(response_text, ["Borvik"])        # from plain strings (evaluation)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchr1.data.prompts import SEARCH_OPEN
from searchr1.rewards.config import RewardConfig
from searchr1.rewards.registry import RewardComponent, RewardContext, build_component
from searchr1.rewards.text import model_spans


@dataclass
class RewardOutput:
    """The scalar reward of one episode and its parts."""

    total: float
    components: dict[str, float]
    """Weighted term per component name (sums to ``total``)."""
    raw: dict[str, float] = field(default_factory=dict)
    """Unweighted score per component name."""
    failures: dict[str, str] = field(default_factory=dict)
    """Component name -> what went wrong (e.g. the judge timed out and the fallback was used)."""


def context_from_trajectory(traj: Any, decode: Callable[[list[int]], str]) -> RewardContext:
    """The reward view of a ``searchr1.rollout.types.Trajectory``: the answer is read from the
    generated tokens only (the role mask, never a pattern over decoded text), one span per run of
    generated tokens; the structure is checked on the whole response (observations included)."""
    meta = dict(traj.meta or {})
    golden = meta.get("golden_answers") or []
    if isinstance(golden, str):
        golden = [golden]
    spans = traj.generated_spans(decode)
    return RewardContext(
        response="".join(spans),
        golden_answers=[str(g) for g in golden],
        spans=spans,
        full_response=traj.response_text or decode(list(traj.response_ids)),
        question=str(meta.get("question", "")),
        searches=int(traj.searches),
        documents=list(traj.documents or []),
        meta=meta,
        trajectory=traj,
    )


def context_from_text(
    response: str,
    golden_answers: Sequence[str] | str,
    question: str = "",
    searches: int | None = None,
    documents: list[list[dict[str, Any]]] | None = None,
    meta: dict[str, Any] | None = None,
) -> RewardContext:
    """The reward view of a plain response string (with its <information> blocks, as produced): the
    model's spans are what lies between the environment's insertions (``model_spans``)."""
    golden = [golden_answers] if isinstance(golden_answers, str) else [str(g) for g in golden_answers]
    spans = model_spans(response)
    own = "".join(spans)
    return RewardContext(
        response=own,
        golden_answers=golden,
        spans=spans,
        full_response=response,
        question=question,
        searches=own.count(SEARCH_OPEN) if searches is None else searches,
        documents=documents or [],
        meta=meta or {},
    )


class CompositeReward:
    """Weighted sum of the components named in a ``RewardConfig``."""

    def __init__(self, cfg: RewardConfig) -> None:
        cfg.validate(None)
        self.cfg = cfg
        self.weights = dict(cfg.components)
        self.components: dict[str, RewardComponent] = {n: build_component(n, cfg) for n in self.weights}

    def score_contexts(self, ctxs: list[RewardContext]) -> list[RewardOutput]:
        outs = [RewardOutput(0.0, {}) for _ in ctxs]
        for name, comp in self.components.items():
            scores = comp.score_batch(ctxs)
            failed = {}
            for f in comp.failures:
                idx, _, msg = f.partition(": ")
                failed[int(idx)] = msg
            for i, (out, raw) in enumerate(zip(outs, scores, strict=True)):
                out.raw[name] = float(raw)
                out.components[name] = self.weights[name] * float(raw)
                if i in failed:
                    out.failures[name] = failed[i]
        for out in outs:
            out.total = float(sum(out.components.values()))
        return outs

    def score_trajectories(self, trajs: list[Any], decode: Callable[[list[int]], str]) -> list[RewardOutput]:
        """Rewards of a batch of rollouts (the judge and the encoder are called once per batch)."""
        return self.score_contexts([context_from_trajectory(t, decode) for t in trajs])

    def __call__(self, traj: Any, decode: Callable[[list[int]], str]) -> RewardOutput:
        return self.score_trajectories([traj], decode)[0]

    def score_text(self, response: str, golden_answers: Sequence[str] | str, **kwargs: Any) -> RewardOutput:
        """Reward of a plain response string; ``kwargs`` go to ``context_from_text``."""
        return self.score_contexts([context_from_text(response, golden_answers, **kwargs)])[0]


def build_reward(cfg: RewardConfig | dict[str, float] | None = None) -> CompositeReward:
    """A composite reward from a config, or from the flat ``{name: weight}`` form."""
    if cfg is None:
        cfg = RewardConfig()
    elif not isinstance(cfg, RewardConfig):
        cfg = RewardConfig.from_simple(cfg)
    return CompositeReward(cfg)
