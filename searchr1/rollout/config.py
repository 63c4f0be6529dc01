"""Configuration of multi-turn generation (section ``rollout``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RolloutConfig:
    n: int = 5
    """Trajectories sampled per prompt (the GRPO group size)."""
    max_turns: int = 4
    """Search turns before the final answer-only generation."""
    max_turn_tokens: int = 500
    """Tokens generated per turn at most."""
    max_obs_tokens: int = 500
    """Tokens of one <information> block at most (longer ones are truncated and counted)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (validation is greedy)."""
