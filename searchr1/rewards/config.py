"""Configuration of the composite reward (section ``reward``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RewardConfig:
    components: dict[str, float] = field(default_factory=lambda: {"exact_match": 1.0})
    """Reward components by name and their weights, e.g. {exact_match: 10.0, search_penalty: -0.1}."""
