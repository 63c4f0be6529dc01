"""Reference (anchor) policy of the KL term: frozen initial weights, or an EMA of the policy.

EMA anchor (EMA-PG, Zhang & Ba 2026, "EMA Policy Gradient"; like a DQN target network):

    every N training steps:   theta_ref <- tau * theta_ref + (1 - tau) * theta_policy

(EMA-PG uses tau = 0.9, N = 10.) tau = 1 never moves (frozen); tau = 0 copies the policy.

The reference must start as a copy of the policy (``make_reference`` deep-copies it) so that
parameter names match. Only parameters that are trainable in the policy are averaged: the others
never change, so they are equal in both. With LoRA (peft) that means the EMA runs over the adapter
weights only, while the frozen base weights are shared in value (the copy still holds its own
base weights: the memory of a second model). With FSDP2 both modules must be sharded the same way;
``lerp_`` then works shard by shard. A low-precision (bf16) reference accumulates the EMA in bf16:
increments much smaller than the weights' precision are lost.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from searchr1.algorithms.config import AlgorithmConfig


@torch.no_grad()
def ema_update_(ref: nn.Module, policy: nn.Module, tau: float, *, only_trainable: bool = True) -> int:
    """In place: ref <- tau * ref + (1 - tau) * policy, parameter by parameter (matched by name).

    Returns the number of parameter tensors updated. Raises ``ValueError`` on a name or shape mismatch.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"EMA tau must be in [0, 1], got {tau}")
    policy_params = dict(policy.named_parameters())
    updated = 0
    for name, p_ref in ref.named_parameters():
        p = policy_params.get(name)
        if p is None:
            raise ValueError(f"EMA reference parameter '{name}' has no counterpart in the policy")
        if p.shape != p_ref.shape:
            raise ValueError(
                f"EMA reference parameter '{name}' has shape {tuple(p_ref.shape)}, policy {tuple(p.shape)}"
            )
        if only_trainable and not p.requires_grad:
            continue
        p_ref.lerp_(p.detach().to(device=p_ref.device, dtype=p_ref.dtype), 1.0 - tau)
        updated += 1
    return updated


class FrozenReference:
    """The reference is the initial policy and never changes."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module.eval().requires_grad_(False)
        self.steps = 0

    def step(self, policy: nn.Module) -> bool:
        """Count a training step; never updates. Returns False."""
        self.steps += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        """Step counter (the weights are the initial checkpoint's)."""
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step counter."""
        self.steps = int(state.get("steps", 0))


class EMAReference(FrozenReference):
    """Reference updated as an EMA of the policy every ``update_period`` calls to :meth:`step`."""

    def __init__(self, module: nn.Module, tau: float, update_period: int) -> None:
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"algorithm.ref_policy_ema_tau must be in [0, 1], got {tau}")
        if update_period < 1:
            raise ValueError(f"algorithm.ref_policy_ema_update_period must be >= 1, got {update_period}")
        super().__init__(module)
        self.tau = tau
        self.update_period = update_period

    def step(self, policy: nn.Module) -> bool:
        """Call once per training step after the optimiser step; returns True when it updated."""
        self.steps += 1
        if self.steps % self.update_period:
            return False
        ema_update_(self.module, policy, self.tau)
        return True

    def state_dict(self) -> dict[str, Any]:
        """Step counter and the reference weights (they differ from any checkpoint of the policy)."""
        return {"steps": self.steps, "module": self.module.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counter and weights saved by :meth:`state_dict`."""
        self.steps = int(state.get("steps", 0))
        if "module" in state:
            self.module.load_state_dict(state["module"])


def make_reference(policy: nn.Module, config: AlgorithmConfig) -> FrozenReference:
    """A frozen or EMA reference (``config.ref_policy``) starting as a deep copy of ``policy``."""
    module = copy.deepcopy(policy)
    if config.ref_policy == "ema":
        return EMAReference(module, config.ref_policy_ema_tau, config.ref_policy_ema_update_period)
    return FrozenReference(module)
