"""Configuration of the composite reward (section ``reward``).

The component names are checked against ``searchr1.rewards.registry.REWARD_COMPONENTS`` where the
whole config is assembled (``searchr1.plugins``), so that a plugin's component is accepted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Names accepted by ``RewardConfig.from_simple`` besides the component names themselves.
SIMPLE_ALIASES = {
    "format_bonus": "format",
    "format_reward": "format",
    "invalid_format_penalty": "invalid_format",
    "em": "exact_match",
    "subem": "sub_exact_match",
    "retrieval_reward": "retrieval",
    "judge": "llm_judge",
}


@dataclass
class RewardConfig:
    components: dict[str, float] = field(default_factory=lambda: {"exact_match": 1.0})
    """Reward components by name and their weights, e.g. {correct_answer: 10.0, search_penalty: -0.1, invalid_format: -5.0}; a `module:function` name adds a user reward."""
    answer_metric: str = "em"
    """Metric of the `correct_answer` component: em | subem | f1."""
    normalization: str = "squad"
    """Answer normalisation of em / subem / f1: squad (Search-R1's and the paper's scorer) | unicode (also drops Unicode punctuation)."""
    structure_format_score: float = 0.2
    """`search_r1` component: score of a response with Search-R1's valid structure (and 1 minus it for a right answer without it)."""
    final_format_score: float = 0.1
    """`search_r1` component: score of a closed but wrong answer in a response without the valid structure."""
    retrieval_score: float = 0.0
    """`search_r1` component: added to a valid-structure wrong answer when a golden answer was retrieved."""
    search_budget: int = 3
    """Searches allowed before the `search_budget` component counts each further one."""
    step_gain: float = 0.0
    """Step reward (StepSearch, arXiv 2505.15107) of a search turn that retrieves gold passages no earlier turn of the trajectory retrieved: step_gain x (such passages / the question's gold passages); it reaches the turn's own tokens (algorithm.step_credit_coef). 0 = off (Search-R1's outcome reward alone)."""
    step_redundancy: float = 0.0
    """Step penalty of a search turn whose hits were all retrieved by earlier turns of the trajectory (the turn earns -step_redundancy). 0 = off."""
    step_superfluous: float = 0.0
    """Step penalty of a search turn made after earlier turns of the trajectory had already retrieved every gold passage of the question (the turn earns -step_superfluous, added to any redundancy penalty): searching again when nothing is missing. 0 = off."""
    step_gold: Literal["supporting", "supporting_or_answer", "answer"] = "supporting_or_answer"
    """Gold passages of the step reward: supporting (the row's supporting ids / titles; a row without them gets no step reward) | supporting_or_answer (else a passage holding a golden answer) | answer (always a passage holding a golden answer)."""
    embedding_model: str | None = None
    """Sentence-transformers folder for `embedding_similarity` (None = the bundled all-MiniLM-L6-v2)."""
    judge_url: str | None = None
    """OpenAI-compatible endpoint for `llm_judge` (base URL such as http://host:8000/v1, or the full /chat/completions URL)."""
    judge_model: str = "gpt-4o-mini"
    """Model name sent to the judge endpoint."""
    judge_api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the judge's API key (sent as a Bearer token when set)."""
    judge_timeout_s: float = 20.0
    """Seconds to wait for one judge answer."""
    judge_retries: int = 1
    """Extra attempts after a failed judge call."""
    judge_fallback: float = 0.0
    """Score used (and the failure recorded) when the judge fails, times out or answers nonsense."""

    @property
    def step_rewards(self) -> bool:
        """Whether search turns get a step reward (``reward.step_gain``, ``step_redundancy`` or
        ``step_superfluous`` > 0)."""
        return self.step_gain > 0.0 or self.step_redundancy > 0.0 or self.step_superfluous > 0.0

    @classmethod
    def from_simple(cls, weights: Mapping[str, float], **fields: Any) -> RewardConfig:
        """Build from the seed's flat form, e.g. ``{"correct_answer": 10.0, "search_penalty": -0.1,
        "invalid_format": -5.0}``; aliases such as ``format_bonus`` map to component names."""
        comps = {SIMPLE_ALIASES.get(k, k): float(v) for k, v in weights.items()}
        cfg = cls(components=comps, **fields)
        cfg.validate(None)
        return cfg

    def validate(self, root: Any) -> None:
        if not self.components:
            raise ValueError("reward.components: at least one component is needed")
        for name in self.components:
            if ":" in name:
                module, _, func = name.partition(":")
                if not module or not func:
                    raise ValueError(f"reward.components.{name}: a user reward is given as module:function")
        if self.answer_metric not in ("em", "subem", "f1"):
            raise ValueError(f"reward.answer_metric: expected em | subem | f1, got {self.answer_metric!r}")
        if self.normalization not in ("squad", "unicode"):
            raise ValueError(f"reward.normalization: expected squad | unicode, got {self.normalization!r}")
        for key in ("structure_format_score", "final_format_score", "retrieval_score"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"reward.{key}: must be in [0, 1), got {getattr(self, key)}")
        if "search_r1" in self.components and self.answer_metric == "f1":
            raise ValueError(
                "reward.answer_metric: the search_r1 component scores a right answer 1 and needs em or subem, got f1"
            )
        for key in ("step_gain", "step_redundancy", "step_superfluous"):
            value = getattr(self, key)
            if not (value >= 0.0 and value < float("inf")):
                raise ValueError(f"reward.{key}: must be a finite number >= 0, got {value}")
        if self.step_gold not in ("supporting", "supporting_or_answer", "answer"):
            raise ValueError(
                f"reward.step_gold: expected supporting | supporting_or_answer | answer, got {self.step_gold!r}"
            )
        if self.search_budget < 0:
            raise ValueError(f"reward.search_budget: must be >= 0, got {self.search_budget}")
        if "llm_judge" in self.components and not self.judge_url:
            raise ValueError("reward.judge_url: required when reward.components has llm_judge")
        if self.judge_timeout_s <= 0:
            raise ValueError("reward.judge_timeout_s: must be > 0")
        if self.judge_retries < 0:
            raise ValueError("reward.judge_retries: must be >= 0")
