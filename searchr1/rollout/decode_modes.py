"""How the slot decoder runs its single-token steps: the decode modes, ``rollout.cuda_graphs`` -> a mode, and
the row buckets of the fixed-shape steps.

Shared by the slot decoder (``searchr1.rollout.slots``: ``SlotBatch(decode=...)`` sizes its buffers with
``static_rows``), its fixed-shape steps (``searchr1.rollout.static_decode``) and the HF engine, which picks
the mode once (``decode_mode``). It imports neither decoder module, so that they import each other in one
direction only (``slots`` -> ``static_decode`` -> this module).
"""

from __future__ import annotations

from typing import Literal

import torch

from searchr1.errors import UserFacingError

DecodeMode = Literal["eager", "static", "graphs"]
"""How ``SlotBatch`` runs a step that feeds one token per slot: eager (shapes of the step's own slots; the
CPU's path) | static (fixed shapes per row bucket, ``searchr1.rollout.static_decode``) | graphs (static, each
bucket's step captured once as a CUDA graph and replayed; CUDA only)."""

BUCKETS = (8, 16, 32, 64, 128)
"""Rows of the fixed-shape decode steps (the largest is ``rollout.max_batch_rows`` at most in practice)."""


def bucket_for(width: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket of at least ``width`` rows, or None when ``width`` exceeds them all."""
    return next((b for b in buckets if b >= width), None)


def static_rows(n_slots: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """Rows the slot buffers need so that every step over ``n_slots`` slots fits its bucket."""
    return max(n_slots, bucket_for(n_slots, buckets) or n_slots)


def check_graphs_device(device: torch.device) -> None:
    """Refuse CUDA graphs on a device that is not CUDA (one line)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        raise UserFacingError(
            f"rollout.cuda_graphs=on needs a CUDA device, the model is on {device.type} "
            "(auto or off decode eagerly)"
        )


def decode_mode(setting: str, device: torch.device) -> DecodeMode:
    """The ``SlotBatch`` decode mode of ``rollout.cuda_graphs`` on ``device``: auto (graphs on CUDA, eager
    elsewhere) | on (graphs; refused off CUDA) | off (eager)."""
    if setting == "on":
        check_graphs_device(device)
        return "graphs"
    if setting == "auto" and device.type == "cuda":
        return "graphs"
    return "eager"
