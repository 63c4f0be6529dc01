"""The frozen trunk: the hidden states below the lowest trained layer, computed once per sequence.

When only the top ``K`` of a decoder's ``L`` layers carry a trained adapter (``warmstart.lora_layers``), the
first ``L - K`` layers are the base model's and never change, and a causal decoder's hidden state at
position ``j`` depends only on the tokens ``0 .. j``. So the residual stream entering layer ``L - K``,

    h_{L-K}[j] = f_{L-K-1}( ... f_0( embed(x) ) ... )[j],

is a fixed function of a sequence's tokens: a supervised stage that visits the same sequences for several
passes can compute it once per sequence and run only the top ``K`` layers (forward and backward) afterwards.
The result equals the uncached pass up to float rounding (a row computed alone or inside a padded batch).

``FrozenTrunk`` holds those states by the row's real tokens (the shared prefix included) and the column
where the computed part starts; ``FusedDecoder.hidden`` reads and fills it when rows come with their
lengths. It refuses to serve a layer below ``layers`` that tracks a trained tensor (the states would go
stale): attach it only while the lower layers are frozen, and detach it (``FusedDecoder.trunk = None``)
after.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

DEFAULT_MAX_BYTES = 2 * 2**30
"""The cache's bound: rows beyond it are computed every time (SmolLM2-135M: ~2.3 KB a token)."""


class TrunkKey(NamedTuple):
    """A row's place in the trunk: the column its computed part starts at, its real length, the compute
    dtype and its real tokens (the shared prefix included)."""

    start: int
    length: int
    dtype: str
    tokens: bytes

    @property
    def columns(self) -> int:
        """The computed columns (the real tokens after ``start``)."""
        return max(0, self.length - self.start)


class FrozenTrunk:
    """Hidden states ``[n, H]`` (float32) entering layer ``layers``, per (start column, real row tokens)."""

    def __init__(self, layers: int, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if layers < 1:
            raise ValueError(f"a frozen trunk needs at least one layer, got {layers}")
        self.layers = layers
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._states: dict[TrunkKey, torch.Tensor] = {}

    @staticmethod
    def keys(input_ids: torch.Tensor, lengths: torch.Tensor, start: int, dtype: torch.dtype) -> list[TrunkKey]:
        """One key per row of ``input_ids [b, T]`` (right-padded, ``lengths`` real tokens each) whose columns
        from ``start`` on are computed."""
        rows = input_ids.cpu()
        return [
            TrunkKey(start, int(n), str(dtype), rows[i, : int(n)].numpy().tobytes())
            for i, n in enumerate(lengths.tolist())
        ]

    def lookup(self, keys: list[TrunkKey]) -> list[torch.Tensor] | None:
        """The states of every key, or None when one is missing (then the whole batch is computed: ``misses``
        counts its rows, ``hits`` the rows served)."""
        states = [self._states.get(key) for key in keys]
        if any(state is None for state in states):
            self.misses += len(keys)
            return None
        self.hits += len(keys)
        return states  # type: ignore[return-value]

    def put(self, key: TrunkKey, state: torch.Tensor) -> None:
        size = state.numel() * state.element_size()
        if key in self._states or self.bytes + size > self.max_bytes:
            return
        self._states[key] = state.detach().clone()
        self.bytes += size

    def check(self, plans: list) -> None:
        """Refuse when a layer below ``layers`` tracks a trained tensor (its cached states would go stale)."""
        if self.layers > len(plans):
            raise ValueError(f"frozen trunk of {self.layers} layers on a decoder of {len(plans)}")
        for i, plan in enumerate(plans[: self.layers]):
            if any(linear.tracked for linear in (plan.qkv, plan.o, plan.gate_up, plan.down)) or any(
                norm.requires_grad for norm in (plan.ln1, plan.ln2)
            ):
                raise ValueError(f"frozen trunk: layer {i} is trained; its hidden states cannot be cached")

    def __len__(self) -> int:
        return len(self._states)


__all__ = ["DEFAULT_MAX_BYTES", "FrozenTrunk", "TrunkKey"]
