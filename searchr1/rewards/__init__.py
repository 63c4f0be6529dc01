"""Rewards: answer extraction and metrics, the Search-R1 structure check, and the composite reward.

Light to import (no model or network code runs until a component needs it).
"""

from searchr1.rewards.composite import (
    CompositeReward,
    RewardOutput,
    build_reward,
    context_from_text,
    context_from_trajectory,
)
from searchr1.rewards.config import RewardConfig
from searchr1.rewards.format import FormatResult, check_format, is_valid_format
from searchr1.rewards.registry import REWARD_COMPONENTS, RewardComponent, RewardContext, register_reward
from searchr1.rewards.text import (
    ANSWER_METRICS,
    NORMALIZATIONS,
    answer_from_spans,
    answer_scores,
    exact_match,
    extract_answer,
    f1_score,
    model_spans,
    normalize_answer,
    normalize_answer_unicode,
    read_answer,
    strip_information,
    sub_exact_match,
)

__all__ = [
    "ANSWER_METRICS",
    "NORMALIZATIONS",
    "REWARD_COMPONENTS",
    "CompositeReward",
    "FormatResult",
    "RewardComponent",
    "RewardConfig",
    "RewardContext",
    "RewardOutput",
    "answer_from_spans",
    "answer_scores",
    "build_reward",
    "check_format",
    "context_from_text",
    "context_from_trajectory",
    "exact_match",
    "extract_answer",
    "f1_score",
    "is_valid_format",
    "model_spans",
    "normalize_answer",
    "normalize_answer_unicode",
    "read_answer",
    "register_reward",
    "strip_information",
    "sub_exact_match",
]
