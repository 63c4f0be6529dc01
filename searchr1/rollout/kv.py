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

Two things keep a decode step cheap:

* the cache layers (``GrowingLayer``) keep spare capacity, so appending a column writes that column
  only; transformers' ``DynamicLayer`` concatenates, copying the whole cache at every token (at batch
  64 and 300 cached tokens, 30 layers: 0.9 GB a step, more time than the model's matmuls);
* fresh slots fed the very same prompt in one step (the samples of a GRPO group) run the prompt once:
  one row is computed and its keys, values and logits are copied to the others (a stream's cache
  depends on its tokens only); distinct fresh prompts that begin alike (one system prompt and
  in-context example before each question) compute that common prefix once, then their own
  suffixes on top of it.

    kv = KVBatch(model, n_slots=2, pad_id=0)
    logits = kv.step({0: prompt_a, 1: prompt_b})   # [2, vocab], rows in sorted slot order
    logits = kv.step({1: [next_b]})                 # slot 0 waits (a hole), slot 1 decodes
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from searchr1.hfcompat import cache_arg, output_cache

MIN_SHARED_PREFIX = 16
"""A common prefix of fewer fresh-prompt tokens is recomputed per prompt rather than given its own forward
call (a chosen threshold, not a measured one)."""


def last_column(width: int) -> int | torch.Tensor:
    """``logits_to_keep`` for the last of ``width`` columns. An index tensor rather than ``1`` when
    ``width > 1``: transformers slices ``hidden[:, -1:]``, a strided view that ``F.linear`` cannot fold
    into one matrix product, so the LM head's weight was expanded and copied per row (measured: a
    third of the rollout's time in prompt and observation steps); indexing gives a compact copy."""
    return 1 if width == 1 else torch.tensor([width - 1])


def model_config(model: Any) -> Any:
    """The Hugging Face config of ``model``, also through a DDP-style ``.module`` wrapper."""
    config = getattr(model, "config", None)
    if config is None:
        config = getattr(getattr(model, "module", None), "config", None)
    if config is None:
        raise TypeError(f"{type(model).__name__} has no Hugging Face .config (nor .module.config)")
    return config


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values are views of buffers with spare capacity.

    ``update`` writes the new columns into the buffers (growing them by half when full), so
    appending ``n`` columns copies ``n`` columns, not the whole cache. Code that assigns
    ``layer.keys`` / ``layer.values`` (compaction) hands over new tensors: they become the buffers.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._adopt_tensors(key_states[:, :, :0], value_states[:, :, :0])
        self.is_initialized = True

    def _adopt_tensors(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._kbuf, self._vbuf = keys, values
        self._set_length(keys.shape[-2])

    def _set_length(self, length: int) -> None:
        self.keys = self._kbuf[:, :, :length]
        self.values = self._vbuf[:, :, :length]
        self._views = (self.keys, self.values)

    def _reserve(self, needed: int) -> None:
        capacity = self._kbuf.shape[-2]
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity + capacity // 2 + 64)
        length = self.keys.shape[-2]
        grown = []
        for view in (self.keys, self.values):
            buf = view.new_empty(view.shape[0], view.shape[1], new_capacity, view.shape[3])
            buf[:, :, :length] = view
            grown.append(buf)
        self._kbuf, self._vbuf = grown
        self._set_length(length)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.keys is not self._views[0] or self.values is not self._views[1]:
            self._adopt_tensors(self.keys, self.values)  # replaced from outside (compaction)
        length, n = self.keys.shape[-2], key_states.shape[-2]
        self._reserve(length + n)
        self._kbuf[:, :, length : length + n] = key_states
        self._vbuf[:, :, length : length + n] = value_states
        self._set_length(length + n)
        return self.keys, self.values

    def allocated_bytes(self) -> int:
        if not self.is_initialized:
            return 0
        return sum(t.numel() * t.element_size() for t in (self._kbuf, self._vbuf))


def growing_cache(config: Any) -> Any:
    """transformers' ``DynamicCache`` for ``config`` with every plain dynamic layer a ``GrowingLayer``
    (sliding-window or other special layers are kept as they are)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class KVBatch:
    """Slots of token streams decoded together with one cache; see the module docstring."""

    def __init__(self, model: Any, n_slots: int, pad_id: int, fast: bool = True) -> None:
        from transformers import DynamicCache

        self.model = model
        self.pad_id = int(pad_id)
        self.fast = fast
        """Growing cache layers and shared prompts; False: transformers' DynamicCache, every row computed."""
        self.device = next(model.parameters()).device
        self.config = model_config(model)
        self.cache = growing_cache(self.config) if fast else DynamicCache(config=self.config)
        self.mask = torch.zeros(n_slots, 0, dtype=torch.long, device=self.device)
        self.n_real = [0] * n_slots
        """Tokens each slot holds (its next position id)."""
        self.peak_cache_bytes = 0
        self.forward_calls = 0
        self.fed_tokens = 0
        self.shared_prompt_tokens = 0
        """Prompt tokens not computed because another fresh slot was fed the same prompt in the same step."""

    @property
    def n_slots(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        """Columns in the cache (real tokens and holes)."""
        return self.mask.shape[1]

    def cache_bytes(self) -> int:
        """Bytes allocated for keys and values (spare capacity included)."""
        total = 0
        for layer in getattr(self.cache, "layers", []):
            if isinstance(layer, GrowingLayer):
                total += layer.allocated_bytes()
                continue
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
        observation does not cost 300 columns of compute in every other row; fresh slots fed the
        same prompt share one computation.
        """
        if not feeds:
            raise ValueError("KVBatch.step needs at least one slot to feed")
        for slot, toks in feeds.items():
            if not toks:
                raise ValueError(f"slot {slot}: empty feed")
        wide = {s: t for s, t in feeds.items() if len(t) > 1}
        if not self.can_compact() or not wide:
            return self._forward_all(feeds)
        shared = any(rep != slot for slot, rep in self._representatives(wide).items())
        if len(wide) == self.n_slots and not shared:
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

    def _representatives(self, feeds: dict[int, list[int]]) -> dict[int, int]:
        """For each fed slot, the slot whose computation it takes: itself, or the first fresh slot
        (nothing seen yet) fed the same tokens."""
        first: dict[tuple[int, ...], int] = {}
        rep: dict[int, int] = {}
        for slot in sorted(feeds):
            key = tuple(feeds[slot]) if self.n_real[slot] == 0 and self.fast else None
            rep[slot] = first.setdefault(key, slot) if key is not None else slot
        return rep

    def _inputs(
        self, feeds: dict[int, list[int]], slots: list[int], offset: int = 0
    ) -> tuple[torch.Tensor, ...]:
        """Right-aligned ids, chunk mask and positions for ``slots`` (holes where a slot is not fed);
        positions start ``offset`` after the tokens a slot holds."""
        width = max(len(toks) for toks in feeds.values())
        ids = torch.full((len(slots), width), self.pad_id, dtype=torch.long)
        chunk_mask = torch.zeros(len(slots), width, dtype=torch.long)
        positions = torch.zeros(len(slots), width, dtype=torch.long)
        for row, slot in enumerate(slots):
            start = self.n_real[slot] + offset
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
            **cache_arg(self.cache),
            use_cache=True,
            logits_to_keep=last_column(width),
        )
        self.cache = output_cache(out)
        self.mask = mask
        self._advance(feeds)
        self.forward_calls += 1
        if blind:
            self._sanitize_new_columns(width)
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache_bytes())
        rows = torch.tensor(sorted(feeds), dtype=torch.long, device=out.logits.device)
        return out.logits[rows, -1, :]

    def _forward_subset(self, feeds: dict[int, list[int]]) -> torch.Tensor:
        """Forward over the fed slots only (one row per distinct fresh prompt); every other slot gets
        hole columns (zeros, masked). Distinct fresh prompts that begin alike (a system prompt, an
        in-context example) compute their longest common prefix once."""
        slots = sorted(feeds)
        rep = self._representatives(feeds)
        run = [s for s in slots if rep[s] == s]
        prefix = self._common_prefix(feeds, run)
        if prefix:
            logits, columns, chunk_mask = self._prefix_then_suffixes(feeds, run, prefix)
        else:
            logits, columns, chunk_mask = self._run_rows(feeds, run)
        width = chunk_mask.shape[1]
        row = {s: i for i, s in enumerate(run)}
        src = torch.tensor([row[rep[s]] for s in slots], dtype=torch.long, device=self.device)
        dst = torch.tensor(slots, dtype=torch.long, device=self.device)
        for layer, kv in zip(self.cache.layers, columns, strict=True):
            scattered = []
            for fresh in kv:
                fresh = fresh.index_select(0, src)
                full = fresh.new_zeros(self.n_slots, fresh.shape[1], width, fresh.shape[3])
                full[dst] = fresh
                scattered.append(full)
            layer.update(*scattered)
        full_chunk = torch.zeros(self.n_slots, width, dtype=torch.long, device=self.device)
        full_chunk[dst] = chunk_mask.index_select(0, src)
        self.mask = torch.cat([self.mask, full_chunk], dim=1)
        self._advance(feeds)
        shared = sum(len(feeds[s]) for s in slots if rep[s] != s) + prefix * (len(run) - 1)
        self.shared_prompt_tokens += shared
        self.forward_calls += 1
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache_bytes())
        return logits.index_select(0, src)

    def _run_rows(
        self, feeds: dict[int, list[int]], run: list[int]
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Feed ``run``'s slots on top of their own cache rows: last logits, new columns, chunk mask."""
        from transformers import DynamicCache

        run_idx = torch.tensor(run, dtype=torch.long, device=self.device)
        ids, chunk_mask, positions = self._inputs(feeds, run)
        width = ids.shape[1]
        blind = self._blind(feeds, run, width)
        sub = DynamicCache(config=self.config)
        if self.length:
            for i, layer in enumerate(self.cache.layers):
                sub.update(layer.keys.index_select(0, run_idx), layer.values.index_select(0, run_idx), i)
        out = self.model(
            input_ids=ids,
            attention_mask=torch.cat([self.mask.index_select(0, run_idx), chunk_mask], dim=1),
            position_ids=positions,
            **cache_arg(sub),
            use_cache=True,
            logits_to_keep=last_column(width),
        )
        columns = []
        for new in output_cache(out).layers:
            kv = (new.keys[:, :, -width:, :], new.values[:, :, -width:, :])
            columns.append(tuple(t.nan_to_num(0.0) for t in kv) if blind else kv)
        return out.logits[:, -1, :], columns, chunk_mask

    def _common_prefix(self, feeds: dict[int, list[int]], run: list[int]) -> int:
        """Tokens that every one of ``run``'s fresh prompts begins with (0 when not worth sharing); each
        prompt keeps at least one token of its own so that its next-token logits are its own."""
        if not self.fast or len(run) < 2 or any(self.n_real[s] for s in run):
            return 0
        first = feeds[run[0]]
        n = min(len(feeds[s]) for s in run) - 1
        for s in run[1:]:
            other = feeds[s]
            i = 0
            while i < n and other[i] == first[i]:
                i += 1
            n = i
        return n if n >= MIN_SHARED_PREFIX else 0

    def _prefix_then_suffixes(
        self, feeds: dict[int, list[int]], run: list[int], prefix: int
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """The shared prefix computed once (one row), then every prompt's own suffix on top of it.

        The new columns of row ``i`` are ``[prefix | holes | suffix_i]``: holes sit between the prefix
        and a shorter suffix (masked, and never blind since the prefix precedes them); positions are
        those of the whole prompt, so attention sees exactly what a full-prompt forward sees.
        """
        from transformers import DynamicCache

        rows = len(run)
        head = torch.tensor([feeds[run[0]][:prefix]], dtype=torch.long, device=self.device)
        ones = torch.ones(1, prefix, dtype=torch.long, device=self.device)
        shared = DynamicCache(config=self.config)
        self.model(
            input_ids=head,
            attention_mask=ones,
            position_ids=torch.arange(prefix, device=self.device)[None],
            **cache_arg(shared),
            use_cache=True,
            logits_to_keep=last_column(prefix),
        )
        sub = DynamicCache(config=self.config)
        for i, layer in enumerate(shared.layers):
            keys = layer.keys.expand(rows, -1, -1, -1).contiguous()
            sub.update(keys, layer.values.expand(rows, -1, -1, -1).contiguous(), i)
        tails = {s: feeds[s][prefix:] for s in run}
        ids, tail_mask, positions = self._inputs(tails, run, offset=prefix)
        chunk_mask = torch.cat([ones.expand(rows, -1), tail_mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=chunk_mask,
            position_ids=positions,
            **cache_arg(sub),
            use_cache=True,
            logits_to_keep=last_column(ids.shape[1]),
        )
        columns = [(layer.keys, layer.values) for layer in output_cache(out).layers]
        return out.logits[:, -1, :], columns, chunk_mask

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
        return all(type(layer) in (GrowingLayer, DynamicLayer) for layer in layers)

    def should_compact(self, live: list[int], queue_empty: bool) -> bool:
        """Compact now (to ``live`` when nothing is queued, else in place): when half the slots are done and
        nothing waits for them, or when holes dominate the cache."""
        shrink = queue_empty and len(live) <= self.n_slots // 2
        return self.can_compact() and (shrink or self.waste() > max(64, max(self.n_real) // 2))

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
