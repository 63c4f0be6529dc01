"""Named algorithm presets: what ``SearchR1Trainer(rl_algorithm="grpo")`` selects.

A preset is a set of dotted config overrides (any of them can still be overridden by the caller).
This is the one place the names are listed; ``KNOWN_ALGORITHMS`` is derived from it. A preset names
its advantage estimator by registry name, so a new preset over a user-registered estimator is one
more entry here (or ``ALGORITHM_PRESETS["mine"] = {...}`` in the user's script). No torch.
"""

from __future__ import annotations

from typing import Any

ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "ppo": {
        "algorithm.advantage": "gae",
        "algorithm.policy_loss": "ppo",
        "algorithm.use_kl_loss": False,
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_estimator": "kl",
        "rollout.n": 1,
    },
    "grpo": {
        "algorithm.advantage": "grpo",
        "algorithm.policy_loss": "ppo",
        "algorithm.use_kl_loss": True,
        "algorithm.use_kl_in_reward": False,
        "algorithm.kl_estimator": "low_var_kl",
        "rollout.n": 5,
    },
    "rloo": {
        "algorithm.advantage": "rloo",
        "algorithm.policy_loss": "ppo",
        "algorithm.use_kl_loss": False,
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_estimator": "kl",
        "rollout.n": 5,
    },
    "reinforce": {
        "algorithm.advantage": "reinforce",
        "algorithm.policy_loss": "vanilla",
        "algorithm.reinforce_baseline": "running_mean",
        "algorithm.use_kl_loss": True,
        "algorithm.use_kl_in_reward": False,
        "rollout.n": 1,
        "trainer.ppo_epochs": 1,
    },
    "reinforce_plus_plus": {
        "algorithm.advantage": "reinforce_plus_plus",
        "algorithm.policy_loss": "ppo",
        "algorithm.use_kl_loss": False,
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_estimator": "kl",
        "rollout.n": 1,
    },
}
"""Preset name -> dotted config overrides."""

KNOWN_ALGORITHMS: tuple[str, ...] = tuple(ALGORITHM_PRESETS)
"""Names accepted by the Python API's ``rl_algorithm`` (each maps to an advantage estimator)."""


def preset_overrides(name: str) -> dict[str, Any]:
    """A copy of the preset ``name``'s overrides; ``ValueError`` listing the known names."""
    if name not in ALGORITHM_PRESETS:
        raise ValueError(f"rl_algorithm: unknown '{name}'; known: {', '.join(ALGORITHM_PRESETS)}")
    return dict(ALGORITHM_PRESETS[name])
