"""Steering: a hook of the HF engines that edits next-token logits per row (``HFRolloutEngine(...,
steer=)``), for constrained decoding and for exact, repeatable test workloads.

A ``Steer`` sees, for every row about to sample, the row's index, meta, turn number and the tokens
of the current turn, and returns edited logits. Both HF engines call it at the same point (after
the stored log-prob is taken, before temperature / top-k / top-p), so a steer cannot change the
log-probs the trainer sees, only which token is chosen. It is not part of the engine interface
(``searchr1.rollout.engine``): to watch tokens go by, use ``generate(..., on_tokens=)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class SteerRow:
    index: int
    """Row of the ``generate`` call."""
    meta: dict[str, Any]
    turn: int
    """Turns completed before this one (0 for the first turn)."""
    turn_ids: list[int]
    """Tokens generated so far in this turn."""


class Steer(Protocol):
    def __call__(self, rows: list[SteerRow], logits: torch.Tensor) -> torch.Tensor:
        """Edited ``[len(rows), vocab]`` logits."""
        ...
