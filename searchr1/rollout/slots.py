"""The rollout's decoder for Llama-family models: merged weights, fixed slots, a shared prompt prefix.

``SlotBatch`` is a drop-in for ``KVBatch`` (same ``step`` / ``reset_slot`` / ``compact`` contract) that
runs the network functionally on the policy's merged weights (``searchr1.modeling``: LoRA folded into
``W = W0 + s B A`` once per update, Q/K/V and gate/up each one product) instead of the Hugging Face
modules, and keeps its keys and values in preallocated per-slot buffers instead of a growing padded cache:

* **Slots without holes.** Slot ``s`` holds its stream's keys at columns ``0 .. len_s - 1`` (a new token
  goes to column ``len_s``); a decode step writes one column per fed slot in place and attends with a
  per-slot length mask, so there are no padding columns, no compaction copies, no attention mask to grow.
* **The prompt prefix stored once (cascade attention).** Every prompt of a ``generate`` call begins with
  the same instruction (and worked examples): its ``P`` tokens are computed once, their keys and values
  kept as one ``[K, P, d]`` block per layer, and each slot stores only what follows. Attention of a query
  ``q`` (scaled by ``1/sqrt(d)``) of slot ``s`` splits the keys in two:

      S_pre = q K_pre^T        (one matrix product for all slots' queries of a key/value head)
      S_own = q K_s^T + M_s    (per slot; M_s = -inf beyond the slot's length)
      [P_pre, P_own] = softmax([S_pre, S_own])          (one softmax over both parts, float32)
      O = P_pre V_pre + P_own V_s

  which is exactly attention over the concatenated keys, with the shared part read once for all rows.
* **Fresh prompts computed once.** Fresh slots fed the same prompt in one step (a GRPO group) compute it in
  one row; its columns are copied to the others.
* **The LM head only where a token is sampled**: one row per fed slot (its last position).

Numerics follow ``searchr1.modeling``: the residual stream and the norms in float32, products in the
generation dtype, rotary embedding in float32, softmax in float32. In float32 the logits equal the Hugging
Face forward's up to float rounding (``tests/rollout/test_slots.py``).

    batch = SlotBatch(weights, n_slots=2, dtype=torch.bfloat16, prompts=[a, b])
    batch.reset_slot(0); batch.reset_slot(1)
    logits = batch.step({0: a[batch.n_real[0]:], 1: b[batch.n_real[1]:]})   # [2, vocab]
    logits = batch.step({1: [next_b]})                                      # slot 0 waits
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from searchr1.modeling import LinearPlan, MergedWeights
from searchr1.rollout.decode_modes import DecodeMode, static_rows
from searchr1.rollout.static_decode import StaticDecode

MIN_SHARED_PREFIX = 16
"""A common prompt prefix shorter than this is not stored apart (a chosen threshold, not a measured one)."""
GROWTH = 32
"""Columns added to the slot buffers when a slot needs more (a multiple of this; the buffers are copied)."""

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``attend(layer, q [N, H, d], k [N, K, d], v [N, K, d]) -> [N, H d]`` (q already scaled)."""


class Linear:
    """``y = x W^T + b`` with ``W`` pre-packed once for oneDNN where this torch has it (measured on 2 cores,
    bfloat16, SmolLM2's shapes: 1.1-1.2x at 64 rows, 2x at 8 rows and for the LM head), else ``F.linear``.
    Packing reorders the weight into the kernel's blocked layout; the products are the same."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.packed: torch.Tensor | None = None
        if weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float32) and _can_pack():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
            except RuntimeError:
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@dataclass
class _Layer:
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear
    ln1: torch.Tensor
    ln2: torch.Tensor


class DecodeWeights:
    """The merged weights in the form decoding runs them, built once per weight version and dtype.

    Rotary embedding as a complex product: Llama-family models rotate channel ``i`` with channel
    ``i + d/2`` by the angle ``theta_i`` (``x cos + rotate_half(x) sin``, the same angle for both halves).
    The rows of the Q and K projections are reordered within each head to ``0, d/2, 1, d/2 + 1, ...``, so
    that each rotated pair is adjacent and the rotation is one complex multiplication
    ``(x_i + j x_{i+d/2}) e^{j theta_i}``; queries and keys share the order, so every score ``q . k`` is
    unchanged. The query's ``1/sqrt(d)`` is folded into its rotation."""

    def __init__(self, weights: MergedWeights, dtype: torch.dtype) -> None:
        plans, head = weights.plans(dtype)
        self.heads, self.kv_heads, self.head_dim = weights.heads, weights.kv_heads, weights.head_dim
        self.eps = weights.eps
        self.rotary = weights.rotary
        d = self.head_dim
        order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()
        rows = torch.cat([h * d + order for h in range(self.heads + self.kv_heads)])
        rows = torch.cat(
            [rows, torch.arange((self.heads + self.kv_heads) * d, (self.heads + 2 * self.kv_heads) * d)]
        )
        self.layers = [
            _Layer(
                qkv=_linear(plan.qkv, rows),
                o=_linear(plan.o),
                gate_up=_linear(plan.gate_up),
                down=_linear(plan.down),
                ln1=plan.ln1.detach().float(),
                ln2=plan.ln2.detach().float(),
            )
            for plan in plans
        ]
        self.head = Linear(head.detach().to(dtype))
        self.embedding = weights.embed.weight.detach()
        self.final_norm = weights.norm.weight.detach().float()


def _linear(plan: LinearPlan, rows: torch.Tensor | None = None) -> Linear:
    weight, bias = plan.weight, plan.bias
    if rows is not None:
        rows = rows.to(weight.device)
        weight = weight.index_select(0, rows)
        bias = bias.index_select(0, rows) if bias is not None else None
    return Linear(weight.contiguous(), bias)


_DECODE: weakref.WeakKeyDictionary[MergedWeights, tuple[Any, DecodeWeights]] = weakref.WeakKeyDictionary()


def decode_weights(weights: MergedWeights, dtype: torch.dtype) -> DecodeWeights:
    """``DecodeWeights`` of the current weights (rebuilt after the weights change)."""
    key = weights.key(dtype)
    cached = _DECODE.get(weights)
    if cached is None or cached[0] != key:
        cached = _DECODE[weights] = (key, DecodeWeights(weights, dtype))
    return cached[1]


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt begins with, leaving each prompt at least one token of its own (0 when fewer
    than ``MIN_SHARED_PREFIX``)."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for other in prompts[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
    return n if n >= MIN_SHARED_PREFIX else 0


def _rotate_pairs(x: torch.Tensor, turn: torch.Tensor, heads: int) -> torch.Tensor:
    """``x [N, heads * d]`` (pair-ordered channels, see ``DecodeWeights``) rotated: ``[N, heads, d]`` float32."""
    n = x.shape[0]
    pairs = torch.view_as_complex(x.float().view(n, heads, -1, 2))
    return torch.view_as_real(pairs * turn).view(n, heads, -1)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class SlotBatch:
    """Slots of token streams decoded together on merged weights; see the module docstring."""

    def __init__(
        self,
        weights: MergedWeights,
        n_slots: int,
        dtype: torch.dtype,
        prompts: Sequence[Sequence[int]] = (),
        *,
        stream_tokens: int = 0,
        decode: DecodeMode = "eager",
    ) -> None:
        """``stream_tokens``: the most tokens one stream may hold (prompt and response), reserved up front in
        every slot (the buffers still grow past it when needed). ``decode``: how single-token steps run."""
        if n_slots < 1:
            raise ValueError(f"SlotBatch needs at least one slot, got {n_slots}")
        if decode not in ("eager", "static", "graphs"):
            raise ValueError(f"SlotBatch decode: expected eager | static | graphs, got {decode!r}")
        self.weights = weights
        self.dtype = dtype
        self.w = decode_weights(weights, dtype)
        self.device = self.w.embedding.device
        self.heads, self.kv_heads, self.head_dim = self.w.heads, self.w.kv_heads, self.w.head_dim
        self.group = self.heads // self.kv_heads
        self.lengths = [0] * n_slots
        """Columns each slot holds (tokens after the shared prefix)."""
        self.forward_calls = 0
        self.fed_tokens = 0
        self.shared_prompt_tokens = 0
        """Prompt tokens not computed: the shared prefix of every slot but the first, and fresh slots that
        took another slot's computation of the same prompt."""
        self.peak_cache_bytes = 0
        self._streams = 0
        self._turns = torch.empty(0, dtype=torch.complex64)
        self.prefix_len = shared_prefix_length(prompts)
        longest = max((len(p) for p in prompts), default=0) - self.prefix_len
        capacity = _round_up(max(1, longest + 1, stream_tokens - self.prefix_len), GROWTH)
        rows = n_slots if decode == "eager" else static_rows(n_slots)
        self.fixed_rows = decode != "eager"
        """The buffers keep all their rows through ``compact`` (the static decode steps address them)."""
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in self.w.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in self.w.layers]
        self.prefix_keys: list[torch.Tensor] = []
        self.prefix_values: list[torch.Tensor] = []
        if self.prefix_len:
            with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
                self._run_prefix(list(prompts[0][: self.prefix_len]))
        self.static = StaticDecode(self, graphs=decode == "graphs") if decode != "eager" else None
        """The fixed-shape decode steps (``searchr1.rollout.static_decode``), or None (eager steps only)."""
        self._note_memory()

    # -- the KVBatch contract ------------------------------------------------------------------------

    @property
    def n_slots(self) -> int:
        return len(self.lengths)

    @property
    def n_real(self) -> list[int]:
        """Tokens each slot has seen, the shared prefix included (its next position)."""
        return [self.prefix_len + n for n in self.lengths]

    def reset_slot(self, slot: int) -> None:
        """Start a new stream in ``slot``; it has seen the shared prefix (every prompt begins with it)."""
        self.lengths[slot] = 0
        if self._streams:
            self.shared_prompt_tokens += self.prefix_len
        self._streams += 1

    def can_compact(self) -> bool:
        return True

    def should_compact(self, live: list[int], queue_empty: bool) -> bool:
        """Move the live slots to the front once nothing is queued and a quarter of the slots up to the last
        live one (at least 4) are idle: decode attention runs over all of those slots, a move copies the
        moved slots' columns in every layer."""
        if not queue_empty or not live:
            return False
        width = live[-1] + 1
        return width - len(live) >= max(4, width // 4)

    @torch.no_grad()
    def compact(self, keep: list[int] | None = None) -> list[int]:
        """Keep only the slots ``keep`` (new slot ``i`` is old slot ``keep[i]``); returns ``keep``."""
        keep = list(range(self.n_slots)) if keep is None else list(keep)
        moved = [(new, old) for new, old in enumerate(keep) if new != old]
        if moved:
            dst = torch.tensor([n for n, _ in moved], device=self.device)
            src = torch.tensor([o for _, o in moved], device=self.device)
            for buffers in (self.keys, self.values):
                for buf in buffers:
                    buf.index_copy_(0, dst, buf.index_select(0, src))
        n = len(keep)
        if not self.fixed_rows:
            self.keys = [buf[:n] for buf in self.keys]
            self.values = [buf[:n] for buf in self.values]
        self.lengths = [self.lengths[s] for s in keep]
        return keep

    @torch.no_grad()
    def step(self, feeds: dict[int, list[int]]) -> torch.Tensor:
        """Feed ``feeds[slot]`` tokens to each slot; return next-token logits ``[len(feeds), vocab]`` (rows in
        ``sorted(feeds)`` order, in the generation dtype).

        One pass over the layers: the multi-token feeds (prompts, observations) and the single tokens run
        through the same products (their rows stacked); only attention treats them apart. Fresh slots fed
        the same tokens are computed once and copied."""
        if not feeds:
            raise ValueError("SlotBatch.step needs at least one slot to feed")
        for slot, toks in feeds.items():
            if not toks:
                raise ValueError(f"slot {slot}: empty feed")
        order = sorted(feeds)
        if self.static is not None and all(len(feeds[s]) == 1 for s in order):
            logits = self.static.step(order, [feeds[s][0] for s in order])
            if logits is not None:  # None: wider than the largest bucket, the eager step below runs it
                return logits
        first: dict[tuple[int, ...], int] = {}
        rep: dict[int, int] = {}
        for slot in order:
            fresh = len(feeds[slot]) > 1 and self.lengths[slot] == 0
            rep[slot] = first.setdefault(tuple(feeds[slot]), slot) if fresh else slot
        wide = [s for s in order if len(feeds[s]) > 1 and rep[s] == s]
        narrow = [s for s in order if len(feeds[s]) == 1]
        with torch.autocast(self.device.type, enabled=False):
            hidden = self._forward(wide, [feeds[s] for s in wide], narrow, [feeds[s][0] for s in narrow])
            row = {s: i for i, s in enumerate([*wide, *narrow])}
            self._copy_shared([(s, rep[s]) for s in order if rep[s] != s], feeds)
            pick = [row[rep[s]] for s in order]
            if pick != list(range(hidden.shape[0])):
                hidden = hidden[torch.tensor(pick, device=self.device)]
            logits = self.w.head(self._norm(hidden, self.w.final_norm))
        for s in order:
            self.fed_tokens += len(feeds[s])
        self.forward_calls += 1
        self._note_memory()
        return logits

    # -- the layers ----------------------------------------------------------------------------------

    def _norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in float32 (Hugging Face's Llama formula), returned in the generation dtype."""
        return F.rms_norm(h, (h.shape[-1],), weight, self.w.eps).to(self.dtype)

    def _layers(
        self, h: torch.Tensor, turns: tuple[torch.Tensor, torch.Tensor], attend: Attend
    ) -> torch.Tensor:
        """Run every decoder layer over the rows of ``h [N, hidden]`` (float32) rotated by ``turns`` (the
        queries' and the keys' rotations of the rows' positions, ``_rotations``)."""
        n = h.shape[0]
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        turn_q, turn_k = turns
        for i, layer in enumerate(self.w.layers):
            qkv = layer.qkv(self._norm(h, layer.ln1))
            q = _rotate_pairs(qkv[:, : heads * d], turn_q, heads).to(self.dtype)
            k = _rotate_pairs(qkv[:, heads * d : (heads + kv_heads) * d], turn_k, kv_heads).to(self.dtype)
            v = qkv[:, (heads + kv_heads) * d :].view(n, kv_heads, d)
            attn = attend(i, q, k, v)
            h = h + layer.o(attn)
            gate, up = layer.gate_up(self._norm(h, layer.ln2)).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate).mul_(up))
        return h

    def _rotations(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``e^{j theta}`` per position ``[N, 1, d/2]`` (complex64) for keys, and the same times
        ``1/sqrt(d)`` for queries; from a table grown as needed."""
        self._turn_table(int(positions.max()) + 1)
        turn = self._turns[positions][:, None]
        return turn * self.head_dim**-0.5, turn

    def _turn_table(self, need: int) -> torch.Tensor:
        """The table of ``e^{j theta}`` for positions ``0 .. need - 1`` at least ``[P, d/2]`` (complex64), grown
        when too short (a new tensor: ``StaticDecode`` checks its address)."""
        if need > self._turns.shape[0]:
            size = max(need, int(self._turns.shape[0] * 1.5), 256)
            probe = torch.zeros(1, dtype=torch.float32, device=self.device)
            cos, sin = self.w.rotary(probe, torch.arange(size, device=self.device)[None])
            half = self.head_dim // 2
            cos, sin = cos[0].float(), sin[0].float()
            if not (torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
                raise ValueError("rotary embedding with different angles for the two halves of a head")
            self._turns = torch.complex(cos[:, :half], sin[:, :half])
        return self._turns

    def _embed(self, ids: list[int]) -> torch.Tensor:
        return F.embedding(torch.tensor(ids, device=self.device), self.w.embedding).float()

    # -- the shared prefix ---------------------------------------------------------------------------

    def _run_prefix(self, ids: list[int]) -> None:
        """Compute the shared prefix once (causal attention within it) and keep its keys and values."""
        p, kv_heads, g, d = len(ids), self.kv_heads, self.group, self.head_dim
        causal = torch.ones(p, p, dtype=torch.bool, device=self.device).tril_()
        mask = torch.zeros(p, p, device=self.device).masked_fill_(~causal, float("-inf"))

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            keys = k.transpose(0, 1).contiguous()  # [K, P, d]
            values = v.transpose(0, 1).contiguous()
            self.prefix_keys.append(keys)
            self.prefix_values.append(values)
            q4 = q.view(p, kv_heads, g, d).permute(1, 2, 0, 3).reshape(kv_heads, g * p, d)
            scores = torch.matmul(q4, keys.transpose(1, 2)).float().view(kv_heads, g, p, p) + mask
            probs = torch.softmax(scores, dim=-1).to(self.dtype).view(kv_heads, g * p, p)
            out = torch.matmul(probs, values).view(kv_heads, g, p, d)
            return out.permute(2, 0, 1, 3).reshape(p, self.heads * d)

        self._layers(self._embed(ids), self._rotations(torch.arange(p, device=self.device)), attend)

    def _prefix_scores(self, i: int, q: torch.Tensor) -> torch.Tensor:
        """``q [R, K, m, d] -> [R, K, m, P]``: scores against the shared prefix, one product per KV head."""
        r, kv_heads, m, d = q.shape
        flat = q.transpose(0, 1).reshape(kv_heads, r * m, d)
        scores = torch.matmul(flat, self.prefix_keys[i].transpose(1, 2))
        return scores.view(kv_heads, r, m, self.prefix_len).transpose(0, 1)

    def _prefix_output(self, i: int, probs: torch.Tensor) -> torch.Tensor:
        """``probs [R, K, m, P] -> [R, K, m, d]``: the prefix's share of the attention output."""
        r, kv_heads, m, p = probs.shape
        flat = probs.transpose(0, 1).reshape(kv_heads, r * m, p)
        out = torch.matmul(flat, self.prefix_values[i])
        return out.view(kv_heads, r, m, self.head_dim).transpose(0, 1)

    def _attention(
        self, i: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor
    ) -> torch.Tensor:
        """``q [R, K, m, d]`` against the shared prefix and the rows' own ``keys / values [R, K, L, d]``, where
        ``hidden`` (boolean, broadcast to ``[R, K, m, L]``) marks the keys a query must not see; returns
        ``[R, K, m, d]``. The scores come out of the products in the generation dtype; the softmax computes
        in float32 and rounds its result to that dtype (PyTorch's CPU kernel), as a float32 copy of the
        scores would (without the extra passes over them)."""
        own = torch.matmul(q, keys.transpose(-1, -2)).masked_fill_(hidden, float("-inf"))
        if not self.prefix_len:
            return torch.matmul(torch.softmax(own, dim=-1), values)
        probs = torch.softmax(torch.cat([self._prefix_scores(i, q), own], dim=-1), dim=-1)
        p = self.prefix_len
        return torch.matmul(probs[..., p:], values) + self._prefix_output(i, probs[..., :p])

    # -- one pass: several tokens for some slots, one token for others --------------------------------

    def _forward(
        self, wide: list[int], wide_feeds: list[list[int]], narrow: list[int], tokens: list[int]
    ) -> torch.Tensor:
        """Run ``wide_feeds`` into the slots ``wide`` and one token into each of ``narrow`` (disjoint, sorted);
        returns the final hidden state of each wide slot's last token, then of each narrow slot."""
        ids: list[int] = [t for feed in wide_feeds for t in feed] + tokens
        slot_of = [s for s, feed in zip(wide, wide_feeds, strict=True) for _ in feed] + narrow
        column = [
            self.lengths[s] + j for s, feed in zip(wide, wide_feeds, strict=True) for j in range(len(feed))
        ]
        column += [self.lengths[s] for s in narrow]
        self._reserve(max(column) + 1)
        n_wide = len(ids) - len(tokens)
        slot_idx = torch.tensor(slot_of, device=self.device)
        col_idx = torch.tensor(column, device=self.device)
        for s, feed in zip(wide, wide_feeds, strict=True):
            self.lengths[s] += len(feed)
        for s in narrow:
            self.lengths[s] += 1
        prefill = self._prefill_attention(wide, wide_feeds) if wide else None
        decode = self._decode_attention(narrow) if narrow else None

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.keys[i][slot_idx, :, col_idx] = k
            self.values[i][slot_idx, :, col_idx] = v
            parts = []
            if prefill is not None:
                parts.append(prefill(i, q[:n_wide]))
            if decode is not None:
                parts.append(decode(i, q[n_wide:]))
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        h = self._layers(self._embed(ids), self._rotations(col_idx + self.prefix_len), attend)
        ends = torch.tensor(list(itertools.accumulate(len(f) for f in wide_feeds)), dtype=torch.long) - 1
        rows = torch.cat([ends, torch.arange(n_wide, len(ids))]).to(self.device)
        return h.index_select(0, rows)

    def _decode_attention(self, slots: list[int]) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Attention of one new query per slot of ``slots`` (sorted; their keys already written), over slots
        ``0 .. slots[-1]`` of the buffers (views, no gather: idle slots in the range are computed and
        dropped; the engine compacts the slots so that few are idle)."""
        m = len(slots)
        width = slots[-1] + 1
        lengths = list(self.lengths[:width])
        span = self.capacity
        if not self.prefix_len:  # a row with no key at all (an idle empty slot) must not give NaN
            lengths = [max(1, n) for n in lengths]
        visible = (
            torch.arange(span, device=self.device)[None] < torch.tensor(lengths, device=self.device)[:, None]
        )
        hidden = ~visible[:, None, None]
        idx = torch.tensor(slots, device=self.device)
        every = m == width
        kv_heads, g, d = self.kv_heads, self.group, self.head_dim

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            q4 = q.view(m, kv_heads, g, d)
            if not every:
                full = q4.new_zeros(width, kv_heads, g, d)
                full[idx] = q4
                q4 = full
            keys, values = self.keys[i][:width], self.values[i][:width]  # contiguous: no copy in the products
            out = self._attention(i, q4, keys, values, hidden)
            if not every:
                out = out[idx]
            return out.reshape(m, self.heads * d)

        return attend

    def _prefill_attention(
        self, slots: list[int], feeds: list[list[int]]
    ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Attention of several new queries per slot (their keys already written): the queries are laid out
        right-padded, ``[R, T]``, causal within each slot's own columns, after the shared prefix."""
        r = len(slots)
        width = max(len(f) for f in feeds)
        lens = [len(f) for f in feeds]
        starts = [self.lengths[s] - n for s, n in zip(slots, lens, strict=True)]
        span = self.capacity
        col = (
            torch.tensor(starts, device=self.device)[:, None] + torch.arange(width, device=self.device)[None]
        )
        visible = torch.arange(span, device=self.device)[None, None] <= col[:, :, None]  # [R, T, L]
        hidden = ~visible[:, None]
        if self.group > 1:
            hidden = hidden.repeat(1, 1, self.group, 1)  # queries are ordered (group, position)
        real = torch.tensor(
            [row * width + j for row, n in enumerate(lens) for j in range(n)], device=self.device
        )
        idx = torch.tensor(slots, device=self.device)
        one = slice(slots[0], slots[0] + 1)
        kv_heads, g, d = self.kv_heads, self.group, self.head_dim

        def attend(i: int, q: torch.Tensor) -> torch.Tensor:
            padded = q.new_zeros(r * width, self.heads, d)
            padded[real] = q
            q4 = (
                padded.view(r, width, kv_heads, g, d)
                .permute(0, 2, 3, 1, 4)
                .reshape(r, kv_heads, g * width, d)
            )
            if r == 1:  # a view, no gather
                keys, values = self.keys[i][one], self.values[i][one]
            else:
                keys, values = self.keys[i].index_select(0, idx), self.values[i].index_select(0, idx)
            out = self._attention(i, q4, keys, values, hidden)
            out = out.view(r, kv_heads, g, width, d).permute(0, 3, 1, 2, 4).reshape(r * width, self.heads * d)
            return out[real]

        return attend

    def _copy_shared(self, copies: list[tuple[int, int]], feeds: dict[int, list[int]]) -> None:
        """Fresh slots that were fed the same prompt as ``rep`` take its columns: ``copies = [(slot, rep)]``."""
        if not copies:
            return
        n = max(len(feeds[s]) for s, _ in copies)
        dst = torch.tensor([s for s, _ in copies], device=self.device)
        src = torch.tensor([r for _, r in copies], device=self.device)
        for buffers in (self.keys, self.values):
            for buf in buffers:
                buf[:, :, :n].index_copy_(0, dst, buf[:, :, :n].index_select(0, src))
        for s, r in copies:
            self.lengths[s] = self.lengths[r]
            self.shared_prompt_tokens += len(feeds[s])

    # -- memory --------------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Columns per slot in the buffers. Attention reads every column (masked past each slot's length):
        a whole buffer is contiguous, and PyTorch's batched products copy a strided operand first (measured:
        the scores of 64 slots x 205 keys took 0.40 ms from a view of a wider buffer, 0.19 ms contiguous), so
        the buffers grow in small steps (``GROWTH``) rather than keep spare room."""
        return self.keys[0].shape[2]

    def _reserve(self, columns: int) -> None:
        """Grow every slot buffer to at least ``columns`` columns (rounded up to ``GROWTH``)."""
        capacity = self.capacity
        if columns <= capacity:
            return
        new = _round_up(columns, GROWTH)
        for buffers in (self.keys, self.values):
            for i, buf in enumerate(buffers):
                grown = buf.new_zeros(buf.shape[0], buf.shape[1], new, buf.shape[3])
                grown[:, :, :capacity] = buf
                buffers[i] = grown
        self._note_memory()

    def cache_bytes(self) -> int:
        tensors = [*self.keys, *self.values, *self.prefix_keys, *self.prefix_values]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _note_memory(self) -> None:
        self.peak_cache_bytes = max(self.peak_cache_bytes, self.cache_bytes())
