"""Configuration of the RL algorithm (section ``algorithm``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"
    """Advantage estimator by registry name: gae | grpo | rloo | reinforce | reinforce_plus_plus | ..."""
    policy_loss: str = "ppo"
    """Policy loss by registry name: ppo | gspo | vanilla."""
    loss_agg: str = "token-mean"
    """Loss aggregation: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm."""
