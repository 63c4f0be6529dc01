"""Registries by name: a config string selects an estimator / loss, a user adds one with a decorator.

    from searchr1.algorithms import register_advantage

    @register_advantage("my_estimator")
    def my_estimator(rewards, response_mask, *, config, group_ids=None, values=None, state=None):
        ...
        return advantages, returns

Then ``algorithm.advantage=my_estimator`` selects it; the trainer never changes. The module holding
the decorated function is named in the config's ``plugins:`` (or imported by the user's script).

What the rest of the code must know about an estimator is said where it is registered, as traits
(``AdvantageTraits``), and asked from here, never from a list of names elsewhere:

    @register_advantage("my_critic_estimator", needs_critic=True)     # the trainer builds a critic
    @register_advantage("my_group_estimator", min_group_size=2)       # config: rollout.n >= 2
    @register_advantage("my_token_estimator", token_level=True)       # step rewards as token rewards

Each registry is a ``searchr1.registry.Registry``; the built-in functions live in modules that import
torch, imported on the registry's first use, so this module stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from searchr1.registry import Registry


@dataclass(frozen=True)
class AdvantageTraits:
    """What the trainer and the config checks need to know about an advantage estimator."""

    needs_critic: bool = False
    """It reads ``values`` (a learned critic): the trainer builds, trains and checkpoints one."""
    min_group_size: int | Callable[[Any], int] = 1
    """Smallest ``rollout.n`` (samples per prompt) it works with; a callable receives the ``algorithm``
    config section (grpo needs 2 only when it divides by the group's std)."""
    group_size_reason: str = ""
    """Why (ends the config error when ``rollout.n`` is too small)."""
    token_level: bool = False
    """It reads token-level rewards (credit flows back through the tokens, as in GAE): a search turn's
    step reward is added to the token rewards at the turn's last token; otherwise the trainer adds a
    group-normalised step advantage on the turn's tokens (``searchr1.algorithms.step_credit``)."""

    def group_size_needed(self, algorithm: Any) -> int:
        """``min_group_size`` for this ``algorithm`` section."""
        need = self.min_group_size
        return int(need(algorithm) if callable(need) else need)


_BUILTIN_MODULES = (
    "searchr1.algorithms.aggregation",
    "searchr1.algorithms.advantages",
    "searchr1.algorithms.policy_losses",
    "searchr1.algorithms.kl",
)
"""The modules that register the built-in functions (they import torch: imported on first use)."""

ADVANTAGE_ESTIMATORS: Registry[Callable[..., Any]] = Registry(
    "advantage estimator", "algorithm.advantage", traits=AdvantageTraits, builtins=_BUILTIN_MODULES
)
POLICY_LOSSES: Registry[Callable[..., Any]] = Registry(
    "policy loss", "algorithm.policy_loss", builtins=_BUILTIN_MODULES
)
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry(
    "KL estimator", "algorithm.kl_estimator", builtins=_BUILTIN_MODULES
)
LOSS_AGGREGATIONS: Registry[Callable[..., Any]] = Registry(
    "loss aggregation", "algorithm.loss_agg", builtins=_BUILTIN_MODULES
)

register_advantage = ADVANTAGE_ESTIMATORS.register
register_policy_loss = POLICY_LOSSES.register
register_kl_estimator = KL_ESTIMATORS.register
register_loss_agg = LOSS_AGGREGATIONS.register


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as ``name``."""
    return ADVANTAGE_ESTIMATORS.lookup(name)


def advantage_traits(name: str) -> AdvantageTraits:
    """What the estimator registered as ``name`` needs (a critic, a minimum group size)."""
    return ADVANTAGE_ESTIMATORS.traits_of(name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``."""
    return POLICY_LOSSES.lookup(name)


def get_kl_estimator(name: str) -> Callable[..., Any]:
    """The per-token KL estimator registered as ``name``."""
    return KL_ESTIMATORS.lookup(name)


def get_loss_agg(name: str) -> Callable[..., Any]:
    """The loss aggregation registered as ``name``."""
    return LOSS_AGGREGATIONS.lookup(name)
