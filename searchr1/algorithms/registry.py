"""Registries by name: a config string selects an estimator / loss, a user adds one with a decorator.

    from searchr1.algorithms import register_advantage

    @register_advantage("my_estimator")
    def my_estimator(rewards, response_mask, *, config, group_ids=None, values=None, state=None):
        ...
        return advantages, returns

Then ``algorithm.advantage=my_estimator`` selects it; the trainer never changes. The module holding
the decorated function must be imported before the config is validated (e.g. in the user's script).

What the rest of the code must know about an estimator is said where it is registered, as traits
(``AdvantageTraits``), and asked from here, never from a list of names elsewhere:

    @register_advantage("my_critic_estimator", needs_critic=True)     # the trainer builds a critic
    @register_advantage("my_group_estimator", min_group_size=2)       # config: rollout.n >= 2

This module imports no torch, so ``searchr1.config`` stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


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

    def group_size_needed(self, algorithm: Any) -> int:
        """``min_group_size`` for this ``algorithm`` section."""
        need = self.min_group_size
        return int(need(algorithm) if callable(need) else need)


class Registry(dict[str, Callable[..., Any]]):
    """A ``name -> function`` dict with a ``register`` decorator and errors that list the known names.

    With ``traits`` (a dataclass), ``register(name, **traits)`` also records what the rest of the code
    needs to know about the entry; ``traits_of(name)`` answers (the dataclass's defaults if none given).
    """

    def __init__(self, kind: str, config_key: str, traits: type | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.config_key = config_key
        self.traits_type = traits
        self._traits: dict[str, Any] = {}

    def register(self, name: str, *aliases: str, override: bool = False, **traits: Any) -> Callable[[F], F]:
        """Decorator registering ``fn`` under ``name`` (and ``aliases``); refuses silent redefinition."""
        if traits and self.traits_type is None:
            raise TypeError(f"{self.kind} '{name}': this registry takes no traits, got {sorted(traits)}")
        info = self.traits_type(**traits) if self.traits_type is not None else None

        def deco(fn: F) -> F:
            for key in (name, *aliases):
                if key in self and self[key] is not fn and not override:
                    raise ValueError(
                        f"{self.kind} '{key}' is already registered ({self[key].__module__}."
                        f"{self[key].__qualname__}); pass override=True to replace it"
                    )
                self[key] = fn
                self._traits[key] = info
            return fn

        return deco

    def traits_of(self, name: str) -> Any:
        """The traits registered with ``name`` (``ValueError`` naming the config key if unknown)."""
        self.lookup(name)
        info = self._traits.get(name)
        if info is None and self.traits_type is not None:
            return self.traits_type()  # set by plain item assignment: the defaults
        return info

    def lookup(self, name: str) -> Callable[..., Any]:
        """The function registered as ``name``; ``ValueError`` naming the config key if unknown.

        (``dict.get`` keeps its usual meaning: ``None`` or a default for an unknown name.)
        """
        ensure_builtins()
        try:
            return self[name]
        except KeyError:
            raise ValueError(
                f"{self.config_key}: unknown {self.kind} '{name}'; registered: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self)


ADVANTAGE_ESTIMATORS = Registry("advantage estimator", "algorithm.advantage", traits=AdvantageTraits)
POLICY_LOSSES = Registry("policy loss", "algorithm.policy_loss")
KL_ESTIMATORS = Registry("KL estimator", "algorithm.kl_estimator")
LOSS_AGGREGATIONS = Registry("loss aggregation", "algorithm.loss_agg")

register_advantage = ADVANTAGE_ESTIMATORS.register
register_policy_loss = POLICY_LOSSES.register
register_kl_estimator = KL_ESTIMATORS.register
register_loss_agg = LOSS_AGGREGATIONS.register

_BUILTIN_MODULES = (
    "searchr1.algorithms.aggregation",
    "searchr1.algorithms.advantages",
    "searchr1.algorithms.policy_losses",
    "searchr1.algorithms.kl",
)


def ensure_builtins() -> None:
    """Import the modules that register the built-in functions (they import torch, hence lazily)."""
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


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
