"""A batch of independent token streams sharing one key/value cache (the HF engine's memory).

Every slot (row) of the batch is its own sequence. A forward step feeds each slot a *right-aligned*
segment of new tokens (a prompt, one sampled token, or an observation) — slots with nothing to feed
get "holes": pad tokens whose attention-mask column is 0, so no later token ever attends to them.
Because every segment ends at the chunk's last column, ``logits[:, -1]`` is the next-token
distribution of every fed slot, whatever the segment lengths.

Positions are per slot (``n_real`` tokens seen so far), so a stream's positions are 0, 1, 2, ...
exactly as in a plain unpadded forward pass; holes change nothing but memory. Keys are stored
after the rotary embedding, so ``compact`` may move them: it gathers each slot's real columns to
the right (left padding) and drops finished slots, bounding the waste that holes cause.

    kv = KVBatch(model, n_slots=2, pad_id=0)
    logits = kv.step({0: prompt_a, 1: prompt_b})   # [2, vocab], rows in sorted slot order
    logits = kv.step({1: [next_b]})                 # slot 0 waits (a hole), slot 1 decodes
"""

from __future__ import annotations

from typing import Any

import torch


def model_config(model: Any) -> Any:
    """The Hugging Face config of ``model``, also through a DDP-style ``.module`` wrapper."""
    config = getattr(model, "config", None)
    if config is None:
        config = getattr(getattr(model, "module", None), "config", None)
    if config is None:
        raise TypeError(f"{type(model).__name__} has no Hugging Face .config (nor .module.config)")
    return config


class KVBatch:
    """Slots of token streams decoded together with one cache; see the module docstring."""

    def __init__(self, model: Any, n_slots: int, pad_id: int) -> None:
        from transformers import DynamicCache

        self.model = model
        self.pad_id = int(pad_id)
        self.device = next(model.parameters()).device
        self.config = model_config(model)
        self.cache = DynamicCache(config=self.config)
        self.mask = torch.zeros(n_slots, 0, dtype=torch.long, device=self.device)
        self.n_real = [0] * n_slots
        """Tokens each slot holds (its next position id)."""
        self.peak_cache_bytes = 0
        self.forward_calls = 0
        self.fed_tokens = 0

    @property
    def n_slots(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        """Columns in the cache (real tokens and holes)."""
        return self.mask.shape[1]

    def cache_bytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total

    def reset_slot(self, slot: int) -> None:
        """Start a new stream in ``slot``: its past columns become holes, its positions restart at 0."""
        if self.length:
            self.mask[slot] = 0
        self.n_real[slot] = 0

    @torch.no_grad()
    def step(self, feeds: dict[int, list[int]]) -> torch.Tensor:
        """Feed ``feeds[slot]`` tokens to each slot; return next-token logits ``[len(feeds), vocab]``.

        Rows of the result follow ``sorted(feeds)``. Multi-token feeds (prompts, observations) of
        a few slots run as a separate forward over those slots only, so one slot's 300-token
        observation does not cost 300 columns of compute in every other row.
        """
        if not feeds:
            raise ValueError("KVBatch.step needs at least one slot to feed")
        for slot, toks in feeds.items():
            if not toks:
                raise ValueError(f"slot {slot}: empty feed")
        wide = {s: t for s, t in feeds.items() if len(t) > 1}
        if not wide or len(wide) == self.n_slots or not self.length or not self.can_compact():
            return self._forward_all(feeds)
        narrow = {s: t for s, t in feeds.items() if len(t) == 1}
        parts = [(sorted(wide), self._forward_subset(wide))]
        if narrow:
            parts.append((sorted(narrow), self._forward_all(narrow)))
        order = {slot: i for i, slot in enumerate(sorted(feeds))}
        out = torch.empty(
            len(feeds), parts[0][1].shape[-1], dtype=parts[0][1].dtype, device=parts[0][1].device
        )
        for slots, logits in parts:
            out[torch.tensor([order[s] for s in slots], device=out.device)] = logits
        return out

    def _inputs(self, feeds: dict[int, list[int]], slots: list[int]) -> tuple[torch.Tensor, ...]:
        """Right-aligned ids, chunk mask and positions for ``slots`` (holes where a slot is not fed)."""
        width = max(len(toks) for toks in feeds.values())
        ids = torch.full((len(slots), width), self.pad_id, dtype=torch.long)
        chunk_mask = torch.zeros(len(slots), width, dtype=torch.long)
        positions = torch.zeros(len(slots), width, dtype=torch.long)
        for row, slot in enumerate(slots):
            start = self.n_real[slot]
            positions[row] = start  # holes: any position, they are never attended
            toks = feeds.get(slot)
            if toks:
                k = len(toks)
                ids[row, width - k :] = torch.tensor(toks, dtype=torch.long)
                chunk_mask[row, width - k :] = 1
                positions[row, width - k :] = torch.arange(start, start + k)
        return ids.to(self.device), chunk_mask.to(self.device), positions.to(self.device)

    def _blind(self, feeds: dict[int, list[int]], slots: list[int], width: int) -> bool:
        """A hole that sees no real token (leading holes of an empty slot) may come out as NaN."""
        return any(self.n_real[s] == 0 and len(feeds.get(s, ())) < width for s in slots)

    def _advance(self, feeds: dict[int, list[int]]) -> None:
        for slot, toks in feeds.items():
            self.n_real[slot] += len(toks)
            self.fed_tokens += len(toks)

    def _forward_all(self, feeds: dict[int, list[int]]) -> torch.Tensor:
        slots = list(range(self.n_slots))
        ids, chunk_mask, positions = self._inputs(feeds, slots)
        width = ids.shape[1]
        blind = self._blind(feeds, slots, width)
        mask = torch.cat([self.mask, chunk_mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        self.mask = mask
        self._advance(feeds)
        self.forward_calls += 1
        if blind:
            self._sanitize_new_columns(width)
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache_bytes())
        rows = torch.tensor(sorted(feeds), dtype=torch.long, device=out.logits.device)
        return out.logits[rows, -1, :]

    def _forward_subset(self, feeds: dict[int, list[int]]) -> torch.Tensor:
        """Forward over the fed slots only; every other slot gets hole columns (zeros, masked)."""
        from transformers import DynamicCache

        slots = sorted(feeds)
        idx = torch.tensor(slots, dtype=torch.long, device=self.device)
        ids, chunk_mask, positions = self._inputs(feeds, slots)
        width = ids.shape[1]
        blind = self._blind(feeds, slots, width)
        sub = DynamicCache(config=self.config)
        for i, layer in enumerate(self.cache.layers):
            sub.update(layer.keys.index_select(0, idx), layer.values.index_select(0, idx), i)
        out = self.model(
            input_ids=ids,
            attention_mask=torch.cat([self.mask.index_select(0, idx), chunk_mask], dim=1),
            position_ids=positions,
            past_key_values=sub,
            use_cache=True,
            logits_to_keep=1,
        )
        for layer, new in zip(self.cache.layers, out.past_key_values.layers, strict=True):
            for name in ("keys", "values"):
                t, fresh = getattr(layer, name), getattr(new, name)[:, :, -width:, :]
                if blind:
                    fresh = fresh.nan_to_num(0.0)
                grown = torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], width, t.shape[3])], dim=2)
                grown[idx, :, -width:, :] = fresh
                setattr(layer, name, grown)
        full_chunk = torch.zeros(self.n_slots, width, dtype=torch.long, device=self.device)
        full_chunk[idx] = chunk_mask
        self.mask = torch.cat([self.mask, full_chunk], dim=1)
        self._advance(feeds)
        self.forward_calls += 1
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache_bytes())
        return out.logits[:, -1, :]

    def _sanitize_new_columns(self, width: int) -> None:
        """Zero NaNs a fully-masked hole query may leave in its own cache columns.

        A hole with no visible key before it (a fresh slot's leading holes) can come out of some
        attention kernels as NaN; its columns are masked for every later query, but a NaN value
        times a zero weight is still NaN, so it must not stay in the cache.
        """
        for layer in getattr(self.cache, "layers", []):
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor) and t.dim() == 4:
                    tail = t[:, :, -width:, :]
                    if torch.isnan(tail).any():
                        tail.nan_to_num_(0.0)

    def can_compact(self) -> bool:
        layers = getattr(self.cache, "layers", None)
        if not layers:
            return False
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in layers)

    def waste(self) -> int:
        """Cache columns beyond what the longest stream needs."""
        return self.length - max(self.n_real, default=0)

    @torch.no_grad()
    def compact(self, keep: list[int] | None = None) -> list[int]:
        """Gather every kept slot's real columns (left-padded) and drop the other slots.

        Returns the kept slots in their new order (new slot ``i`` was old slot ``keep[i]``).
        """
        keep = list(range(self.n_slots)) if keep is None else list(keep)
        if not self.can_compact():
            if keep != list(range(self.n_slots)):
                raise RuntimeError("this model's cache layers cannot be compacted")
            return keep
        sel = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, sel)
        real = [int(self.n_real[s]) for s in keep]
        new_len = max(real, default=0)
        index = torch.zeros(len(keep), new_len, dtype=torch.long, device=self.device)
        new_mask = torch.zeros(len(keep), new_len, dtype=torch.long, device=self.device)
        for i in range(len(keep)):
            cols = mask[i].nonzero().flatten()
            if cols.numel() != real[i]:
                raise RuntimeError(f"slot {keep[i]}: {cols.numel()} unmasked columns for {real[i]} tokens")
            if real[i]:
                index[i, new_len - real[i] :] = cols
                new_mask[i, new_len - real[i] :] = 1
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
                continue
            k = layer.keys.index_select(0, sel)
            v = layer.values.index_select(0, sel)
            gather = index[:, None, :, None].expand(k.shape[0], k.shape[1], new_len, k.shape[3])
            layer.keys = k.gather(2, gather).contiguous()
            layer.values = v.gather(2, gather).contiguous()
        self.mask = new_mask
        self.n_real = real
        return keep
