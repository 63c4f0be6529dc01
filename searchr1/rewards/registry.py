"""Reward components by name: what each one measures on a finished episode.

Each component maps a ``RewardContext`` to a raw score; the composite reward multiplies it by the
weight given in ``reward.components`` and sums. A new component is one decorated class:

    @register_reward("short_answer")
    class ShortAnswer(RewardComponent):
        def score(self, ctx):
            return float(ctx.answer is not None and len(ctx.answer.split()) <= 3)

A user function ``module:function`` in ``reward.components`` receives the ``RewardContext`` and
returns a float; it needs no registration.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from searchr1.data.prompts import INFO_CLOSE, INFO_OPEN
from searchr1.registry import Registry
from searchr1.rewards.embedding import answer_similarity
from searchr1.rewards.format import FormatResult, check_format
from searchr1.rewards.judge import JudgeClient
from searchr1.rewards.steps import gold_coverage
from searchr1.rewards.text import (
    ANSWER_METRICS,
    answer_from_spans,
    exact_match,
    f1_score,
    model_spans,
    normalizer,
)
from searchr1.rewards.text import sub_exact_match as _sub_exact_match

if TYPE_CHECKING:  # the config section imports this module to check component names
    from searchr1.rewards.config import RewardConfig


@dataclass
class RewardContext:
    """Everything a reward component may read about one episode."""

    response: str
    """The model's own text (observations removed)."""
    golden_answers: list[str]
    spans: list[str] | None = None
    """The model's own text, one string per run of generated tokens (``Trajectory.generated_spans``):
    the only place an answer is read from. None: split from ``response`` (``model_spans``)."""
    full_response: str | None = None
    """Response with the <information> blocks, for the structure check (defaults to ``response``)."""
    question: str = ""
    searches: int = 0
    documents: list[list[dict[str, Any]]] = field(default_factory=list)
    """Per search, the hits (dicts with title / text or contents)."""
    meta: dict[str, Any] = field(default_factory=dict)
    trajectory: Any = None
    """The ``Trajectory`` when scored from one (None for plain strings)."""

    @cached_property
    def answer(self) -> str | None:
        """The last complete ``<answer>`` inside one span of model text (None: no answer)."""
        return answer_from_spans(self.spans if self.spans is not None else model_spans(self.response))

    @cached_property
    def format(self) -> FormatResult:
        return check_format(self.full_response if self.full_response is not None else self.response)

    @cached_property
    def retrieved_text(self) -> str:
        """All retrieved passages joined (from ``documents``, else parsed from the <information> blocks)."""
        if self.documents:
            parts = []
            for hits in self.documents:
                for h in hits:
                    parts.append(h.get("contents") or f"{h.get('title', '')} {h.get('text', '')}")
            return "\n".join(parts)

        text = self.full_response or ""
        blocks, pos = [], 0
        while (start := text.find(INFO_OPEN, pos)) >= 0:
            end = text.find(INFO_CLOSE, start)
            end = len(text) if end < 0 else end
            blocks.append(text[start + len(INFO_OPEN) : end])
            pos = end
        return "\n".join(blocks)


class RewardComponent:
    """One named reward term. ``score_batch`` may be overridden to batch model or network calls."""

    name = "component"

    def __init__(self, cfg: RewardConfig) -> None:
        self.cfg = cfg
        self.failures: list[str] = []
        """Failures of the last ``score_batch`` call (index: message), reported by the composite."""

    def score(self, ctx: RewardContext) -> float:
        raise NotImplementedError

    def score_batch(self, ctxs: list[RewardContext]) -> list[float]:
        self.failures = []
        return [float(self.score(c)) for c in ctxs]


REWARD_COMPONENTS: Registry[type[RewardComponent]] = Registry("reward component", "reward.components")
"""Component name -> class; ``reward.components`` keys are looked up here."""


def register_reward(
    name: str, *, override: bool = False
) -> Callable[[type[RewardComponent]], type[RewardComponent]]:
    """Class decorator: make a component selectable by name in ``reward.components``."""

    def deco(cls: type[RewardComponent]) -> type[RewardComponent]:
        REWARD_COMPONENTS.add(name, cls, override=override)
        cls.name = name
        return cls

    return deco


@register_reward("correct_answer")
class CorrectAnswer(RewardComponent):
    """Answer metric named by ``reward.answer_metric`` (em | subem | f1) of the extracted answer."""

    def score(self, ctx: RewardContext) -> float:
        return ANSWER_METRICS[self.cfg.answer_metric](ctx.answer, ctx.golden_answers, self.cfg.normalization)


@register_reward("exact_match")
class ExactMatch(RewardComponent):
    """1 if the extracted answer equals a golden answer after normalisation (Search-R1's reward)."""

    def score(self, ctx: RewardContext) -> float:
        return exact_match(ctx.answer, ctx.golden_answers, self.cfg.normalization)


@register_reward("sub_exact_match")
class SubExactMatch(RewardComponent):
    """1 if a golden answer occurs inside the extracted answer after normalisation."""

    def score(self, ctx: RewardContext) -> float:
        return _sub_exact_match(ctx.answer, ctx.golden_answers, self.cfg.normalization)


@register_reward("f1")
class F1(RewardComponent):
    """Token F1 of the extracted answer against the best golden answer."""

    def score(self, ctx: RewardContext) -> float:
        return f1_score(ctx.answer, ctx.golden_answers, self.cfg.normalization)


@register_reward("format")
class FormatBonus(RewardComponent):
    """1 if the response follows the Search-R1 structure (give it a positive weight)."""

    def score(self, ctx: RewardContext) -> float:
        return float(ctx.format.valid)


@register_reward("invalid_format")
class InvalidFormat(RewardComponent):
    """1 if the response breaks the Search-R1 structure (give it a negative weight)."""

    def score(self, ctx: RewardContext) -> float:
        return float(not ctx.format.valid)


@register_reward("search_penalty")
class SearchCount(RewardComponent):
    """Number of searches made (a negative weight makes each search cost)."""

    def score(self, ctx: RewardContext) -> float:
        return float(ctx.searches)


@register_reward("search_budget")
class SearchesOverBudget(RewardComponent):
    """Searches beyond ``reward.search_budget``: max(0, searches - budget) (give it a negative weight)."""

    def score(self, ctx: RewardContext) -> float:
        return float(max(0, ctx.searches - self.cfg.search_budget))


@register_reward("retrieval")
class RetrievalHit(RewardComponent):
    """1 if a golden answer (normalised) appears in the retrieved information (normalised)."""

    def score(self, ctx: RewardContext) -> float:
        return float(retrieval_hit(ctx, self.cfg.normalization))


@register_reward("gold_coverage")
class GoldCoverage(RewardComponent):
    """The share of the question's gold passages that the trajectory's searches retrieved: the row's
    supporting passages (``reward.step_gold``), else a passage holding a golden answer; 0 when the row
    names none. It is the trajectory's total of StepSearch's information gain (``searchr1.rewards.steps``)
    as an outcome term, so that in a group a trajectory that found both passages of a two-hop question
    scores above one that found the first only (the per-turn step rewards, normalised over the group's
    search turns, pay every turn that found something new alike)."""

    def score(self, ctx: RewardContext) -> float:
        return gold_coverage(ctx.meta, ctx.documents, self.cfg) or 0.0


def retrieval_hit(ctx: RewardContext, normalization: str) -> bool:
    """Whether a golden answer (normalised, as whole words) appears in the retrieved passages."""
    norm = normalizer(normalization)
    info = f" {norm(ctx.retrieved_text)} "
    return any(norm(g) and f" {norm(g)} " in info for g in ctx.golden_answers)


@register_reward("search_r1")
class SearchR1Outcome(RewardComponent):
    """Search-R1's own outcome reward with its format and retrieval scores (Jin et al. 2025, v0.3
    ``qa_em_format.compute_score_em``; the terms are ``reward.structure_format_score`` s_f,
    ``reward.final_format_score`` s_a and ``reward.retrieval_score`` s_r):

        answer right  (EM, or subEM with reward.answer_metric=subem):  1 if valid else 1 - s_f
        answer wrong or missing, structure valid:                       s_f + s_r * hit
        answer wrong, structure invalid:                                s_a
        no closed answer, structure invalid:                            0

    "valid" is the Search-R1 structure (``check_format``: think first, a think after every
    information block, one closed answer last); "hit" means a golden answer appears in the
    retrieved passages. With s_f = s_a = s_r = 0 it is plain EM. A closed but wrong answer earns s_a
    where an unclosed one earns nothing, so a policy drifting into unclosed tags is pulled back.
    """

    def score(self, ctx: RewardContext) -> float:
        cfg = self.cfg
        valid = ctx.format.valid
        right = ctx.answer is not None and bool(
            ANSWER_METRICS[cfg.answer_metric](ctx.answer, ctx.golden_answers, cfg.normalization)
        )
        if right:
            return 1.0 if valid else 1.0 - cfg.structure_format_score
        if valid:
            hit = cfg.retrieval_score and retrieval_hit(ctx, cfg.normalization)
            return cfg.structure_format_score + (cfg.retrieval_score if hit else 0.0)
        return cfg.final_format_score if ctx.answer is not None else 0.0


@register_reward("embedding_similarity")
class EmbeddingSimilarity(RewardComponent):
    """max over golden answers of cos(e(answer), e(golden)) with the dense encoder; 0 without an answer."""

    def score_batch(self, ctxs: list[RewardContext]) -> list[float]:
        self.failures = []
        return answer_similarity(
            [c.answer for c in ctxs], [c.golden_answers for c in ctxs], self.cfg.embedding_model
        )

    def score(self, ctx: RewardContext) -> float:
        return self.score_batch([ctx])[0]


@register_reward("llm_judge")
class LLMJudge(RewardComponent):
    """Score in [0, 1] from an LLM judge on an OpenAI-compatible endpoint; failures give the fallback."""

    def __init__(self, cfg: RewardConfig) -> None:
        super().__init__(cfg)
        self.client = JudgeClient.from_config(cfg)

    def score_batch(self, ctxs: list[RewardContext]) -> list[float]:
        results = self.client.judge_batch([(c.question, c.answer, c.golden_answers) for c in ctxs])
        self.failures = [f"{i}: {r.error}" for i, r in enumerate(results) if r.error]
        return [r.score for r in results]

    def score(self, ctx: RewardContext) -> float:
        return self.score_batch([ctx])[0]


class UserFunction(RewardComponent):
    """A user reward ``module:function``; the function receives the ``RewardContext``."""

    def __init__(self, cfg: RewardConfig, spec: str) -> None:
        super().__init__(cfg)
        self.name = spec
        module_name, _, func_name = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(
                f"reward.components.{spec}: cannot import module {module_name!r}: {exc}"
            ) from exc
        fn = getattr(module, func_name, None)
        if not callable(fn):
            raise ValueError(f"reward.components.{spec}: {module_name} has no function {func_name!r}")
        self.fn = fn

    def score(self, ctx: RewardContext) -> float:
        value = self.fn(ctx)
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"user reward {self.name} returned {value!r}, not a number") from exc


def build_component(name: str, cfg: RewardConfig) -> RewardComponent:
    """The component for a ``reward.components`` key (registered name or ``module:function``)."""
    if ":" in name:
        return UserFunction(cfg, name)
    return REWARD_COMPONENTS.lookup(name)(cfg)
