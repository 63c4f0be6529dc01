"""A functional decoder for the policy update of Llama-family models (Llama, Qwen2, Mistral).

The update runs the same network as the Hugging Face modules, with four changes that leave the values
and gradients equal (up to float rounding; tested against the Hugging Face path in float32):

* **Merged LoRA weights.** Within one optimizer step the weights do not change, so each adapted linear
  layer runs one product with ``W = W0 + s B A`` (merged once per step, in the compute dtype) instead of
  the base product plus two rank-r products and peft's dtype casts. The adapter's gradients come from
  small products in the backward pass (``y = x W^T``, incoming gradient ``g = dL/dy``):

      dL/dA = s (g B)^T x        [r, in]
      dL/dB = s g^T (x A^T)      [out, r]
      dL/dx = g W

  Full fine-tuning takes the same path with ``dL/dW0 = g^T x`` (accumulated in the master's dtype).
* **Fused projections.** Q, K and V are one product (their weights stacked), and so are gate and up.
* **Matmul attention.** The queries of the key/value heads they share (grouped-query attention) are
  stacked into one product per head group, ``S = Q K^T / sqrt(d) + M``, ``P = softmax(S)``, ``O = P V``,
  with one causal mask ``M`` for the whole micro-batch (``grouped_attention``): rows are right-padded, so every real token sits
  at the same position as in its unpadded sequence, and padding (after the real tokens) is attended by
  no real token. PyTorch's CPU flash-attention backward with a padding mask ran at ~25 GFLOP/s here.
* **The shared prompt prefix once per optimizer step.** The ``p`` tokens that every row of the
  mini-batch starts with (the instruction and the worked example) run once, as one row; their keys and
  values per layer become leaves that every micro-batch attends to, their gradients accumulate over the
  micro-batches, and one backward pass through the prefix at the end of the step (``StepPrefix.backward``)
  adds its share to the weights' gradients. Since the loss reads the prefix only through its keys and
  values, this is the same gradient as recomputing the prefix in every micro-batch.
* **A frozen trunk, when one is attached** (``FusedDecoder.trunk``, ``searchr1.trainer.frozen_trunk``): with
  trained tensors only in the top layers, the states entering the lowest trained layer are read per row
  from the trunk, or computed and kept there (one read of the rows' lengths from the device per micro-batch).

Host syncs (a read of a device value by the host stalls it until the GPU has run everything queued): none
per layer in the forward or the backward (no ``.item()``, ``.cpu()``, ``nonzero`` or branch on a tensor's
value inside ``hidden`` or ``_PlanLinear``); per micro-batch ``fused_token_logprobs`` reads the device once
for its prefix checks and once for the rows it selects for the LM head (their count sizes the result).
On CUDA the update runs under bfloat16 autocast (``trainer.bf16_autocast``, on by default where the GPU has
bfloat16). Share of peak: see ``searchr1.bench._gpu_step``.

Numerics follow Hugging Face's modules under bfloat16 autocast: the residual stream and the norms in
float32, products in the compute dtype (bfloat16 where the CPU has bf16 units and autocast is on,
otherwise the weights' dtype), rotary embedding in float32, softmax computed in float32 on the product's
scores (as Hugging Face's eager attention does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from searchr1.modeling import (
    LayerPlan,
    LinearPlan,
    merged_weights_for,
    rms_norm,
    rotate,
    unsupported_reason,
)
from searchr1.trainer.frozen_trunk import FrozenTrunk, TrunkKey
from searchr1.trainer.logprobs import (
    _scatter_rows,
    chunked_head_logprobs,
    common_prefix_length,
    valid_target_mask,
    weight_head_logprobs,
)

HEAD_CHUNK_ELEMENTS = 2**23
"""LM-head rows per chunk: ``[rows, V]`` float32 blocks of 32 MiB (170 rows at V = 49k). Measured on one
core (SmolLM2's head, 1,270 rows): 128-row chunks 1.0 s, 1,024-row chunks 1.3 s a forward + backward."""


class _PlanLinear(torch.autograd.Function):
    """``y = x W^T + b`` with a merged weight; gradients for the pieces' masters and adapters (module
    docstring). ``x`` is ``[N, in]`` in the plan's dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, plan: LinearPlan, *tracked: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.plan = plan
        ctx.save_for_backward(x)
        return F.linear(x, plan.weight, plan.bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        plan: LinearPlan = ctx.plan
        grad = grad.to(x.dtype)
        grad_x = grad @ plan.weight if ctx.needs_input_grad[0] else None
        grads: list[torch.Tensor] = []
        for piece in plan.pieces:
            g = grad[:, piece.start : piece.stop]
            if piece.master is not None:
                grads.append((g.t() @ x).to(piece.master.dtype))
            if piece.bias_master is not None:
                grads.append(g.float().sum(0).to(piece.bias_master.dtype))
            for a, b, scale in piece.adapters:
                a_low, b_low = a.detach().to(x.dtype), b.detach().to(x.dtype)
                grads.append(((g @ b_low).t() @ x).mul_(scale).to(a.dtype))  # dA = s (g B)^T x
                grads.append((g.t() @ (x @ a_low.t())).mul_(scale).to(b.dtype))  # dB = s g^T (x A^T)
        return (grad_x, None, *grads)


def plan_linear(x: torch.Tensor, plan: LinearPlan) -> torch.Tensor:
    """``x [..., in] -> [..., out]`` through ``plan`` (differentiable for its tracked parameters)."""
    flat = x.reshape(-1, x.shape[-1])
    out = _PlanLinear.apply(flat, plan, *plan.tracked)
    return out.view(*x.shape[:-1], out.shape[-1])


# ----------------------------------------------------------------------------------------------
# The decoder.


def causal_mask(queries: int, prefix: int, device: torch.device | None = None) -> torch.Tensor:
    """``[queries, prefix + queries]`` boolean mask of the keys each query must NOT see: query ``i`` sees keys
    ``0 .. prefix + i``."""
    keys = torch.arange(prefix + queries, device=device)
    return keys[None, :] > (prefix + torch.arange(queries, device=device))[:, None]


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor
) -> torch.Tensor:
    """``softmax(q k^T, keys in hidden masked) v`` with grouped-query heads: ``q [b, H, t, d]`` (already
    scaled), ``k, v [b, K, L, d]``, ``hidden [t, L]`` (boolean); returns ``[b, t, H d]``. The scores come out
    of the product in the compute dtype; the softmax (and its backward) computes in float32 inside PyTorch's
    CPU kernel and rounds to that dtype. Measured (4 rows x 292 queries over 531 keys, bfloat16, forward and
    backward): 26 ms against 31 ms with a float32 copy of the scores, gradients within 0.4% (bfloat16's
    rounding)."""
    b, heads, t, d = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scores = torch.matmul(q.reshape(b, kv_heads, group * t, d), k.transpose(-1, -2))
    scores = scores.view(b, kv_heads, group, t, length).masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, group * t, length)
    out = torch.matmul(probs, v)  # [b, K, group * t, d]
    return out.view(b, heads, t, d).transpose(1, 2).reshape(b, t, heads * d)


@dataclass
class PrefixKV:
    """Keys and values ``[1, K, p, d]`` of a shared prefix, per layer; ``graph`` holds the tensors of the
    prefix's own forward pass when its backward is still owed (``StepPrefix``)."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class FusedDecoder:
    """The decoder of a Llama-family causal LM (maybe peft-wrapped) run functionally; see the module docstring.

    ``plans(dtype)`` merges the weights (cached until a trainable parameter changes in place, i.e. until the
    optimizer steps, or the adapters are switched off or on); ``hidden`` runs rows that start at a common
    position on top of an optional ``PrefixKV``.
    """

    def __init__(self, model: nn.Module) -> None:
        weights = merged_weights_for(model)
        if weights is None:
            raise ValueError(f"the fused decoder does not support this model: {unsupported_reason(model)}")
        self.weights = weights
        self.model = model
        self.config = weights.config
        self.embed = weights.embed
        self.layers = weights.layers
        self.norm = weights.norm
        self.rotary = weights.rotary
        self.head = weights.head
        self.heads = weights.heads
        self.kv_heads = weights.kv_heads
        self.head_dim = weights.head_dim
        self.eps = weights.eps
        self.trunk: FrozenTrunk | None = None
        """Hidden states below the lowest trained layer, cached per row (``searchr1.trainer.frozen_trunk``);
        set only while those layers are frozen (the warm start on the top layers)."""

    def _key(self, dtype: torch.dtype) -> tuple[Any, ...]:
        return self.weights.key(dtype)

    def plans(self, dtype: torch.dtype) -> tuple[list[LayerPlan], torch.Tensor]:
        """Per-layer plans and the LM head's weight in ``dtype`` (``MergedWeights.plans``, shared with the
        rollout's slot decoder)."""
        return self.weights.plans(dtype)

    # -- forward ---------------------------------------------------------------------------------

    def _rope(self, start: int, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, start + length, device=device)[None]
        probe = torch.zeros(1, dtype=torch.float32, device=device)
        cos, sin = self.rotary(probe, positions)
        return cos[:, None].float(), sin[:, None].float()  # [1, 1, t, d]

    def hidden(
        self,
        input_ids: torch.Tensor,
        dtype: torch.dtype,
        prefix: PrefixKV | None = None,
        keep_kv: bool = False,
        trunk_keys: list[TrunkKey] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Final normed hidden states ``[b, t, H]`` (float32) of ``input_ids [b, t]`` placed after ``prefix``
        (positions ``p .. p + t - 1``), and with ``keep_kv`` each layer's new keys and values. With
        ``trunk_keys`` (``FrozenTrunk.keys``, one per row) and ``self.trunk`` set, the states entering
        layer ``trunk.layers`` come from the trunk when it holds every row, and fill it otherwise."""
        plans, _ = self.plans(dtype)
        trunk = self.trunk if trunk_keys is not None and not keep_kv else None
        b, t = input_ids.shape
        p = prefix.length if prefix is not None else 0
        device = input_ids.device
        cos, sin = self._rope(p, t, device)
        scale = self.head_dim**-0.5
        mask = causal_mask(t, p, device)
        split = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        h = F.embedding(input_ids, self.embed.weight)
        first = 0
        if trunk is not None:
            h, first = self._from_trunk(trunk, plans, h, trunk_keys or [])
        kvs = []
        with torch.autocast(device.type, enabled=False):
            for i, plan in enumerate(plans):
                if i < first:
                    continue
                if trunk is not None and i == trunk.layers:  # missed: fill the trunk with this batch's rows
                    for row, key in enumerate(trunk_keys or []):
                        trunk.put(key, h[row, : key.columns])
                x = rms_norm(h, plan.ln1, self.eps).to(dtype)
                q, k, v = plan_linear(x, plan.qkv).split(split, dim=-1)
                q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
                k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
                v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
                q = (rotate(q, cos, sin) * scale).to(dtype)
                k = rotate(k, cos, sin).to(dtype)
                if keep_kv:
                    kvs.append((k, v))
                if prefix is not None:
                    keys = torch.cat([prefix.keys[i].expand(b, -1, -1, -1), k], dim=2)
                    values = torch.cat([prefix.values[i].expand(b, -1, -1, -1), v], dim=2)
                else:
                    keys, values = k, v
                attn = grouped_attention(q, keys, values, mask)
                h = h + plan_linear(attn, plan.o)
                x = rms_norm(h, plan.ln2, self.eps).to(dtype)
                gate, up = plan_linear(x, plan.gate_up).chunk(2, dim=-1)
                h = h + plan_linear(F.silu(gate) * up, plan.down)
            h = rms_norm(h, self.norm.weight, self.eps)
        return h, kvs

    def _from_trunk(
        self, trunk: FrozenTrunk, plans: list[LayerPlan], h: torch.Tensor, keys: list[TrunkKey]
    ) -> tuple[torch.Tensor, int]:
        """``h`` replaced by the trunk's states and the first layer left to run, when it holds every row
        (padding columns zero: no real token attends to them); else ``h`` and 0."""
        if self.embed.weight.requires_grad:
            raise ValueError("frozen trunk: the embedding is trained; hidden states cannot be cached")
        trunk.check(plans)
        states = trunk.lookup(keys)
        if states is None:
            return h, 0
        out = torch.zeros_like(h)
        for row, state in enumerate(states):
            out[row, : state.shape[0]] = state
        return out, trunk.layers

    def prefix(self, prefix_ids: torch.Tensor, dtype: torch.dtype) -> tuple[PrefixKV, list[torch.Tensor]]:
        """Run ``prefix_ids [p]`` once. Returns its ``PrefixKV`` (detached leaves that require gradients
        when grad mode is on) and the graph's own keys/values (for ``StepPrefix.backward``)."""
        _, kvs = self.hidden(prefix_ids[None], dtype, keep_kv=True)
        graph = [t for kv in kvs for t in kv]
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in graph)
        # a layer below every trained one (an adapter on the top layers only) has no graph: its leaves stay
        # constants, and the backward pass stops above it
        leaves = [t.detach().requires_grad_(grad and t.requires_grad) for t in graph]
        kv = PrefixKV(int(prefix_ids.shape[0]), leaves[0::2], leaves[1::2])
        return kv, (graph if grad else [])


class StepPrefix:
    """The shared prefix of one optimizer step: computed once (``FusedDecoder.prefix``), attended by every
    micro-batch, its backward run once by ``backward()`` after the micro-batches' own."""

    def __init__(self, decoder: FusedDecoder, prefix_ids: torch.Tensor, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.ids = prefix_ids
        self.kv, self._graph = decoder.prefix(prefix_ids, dtype)

    @property
    def length(self) -> int:
        return self.kv.length

    def backward(self) -> None:
        """Send the gradients the micro-batches left on the prefix's keys and values through its forward."""
        leaves = [t for pair in zip(self.kv.keys, self.kv.values, strict=True) for t in pair]
        outs, grads = [], []
        for graph, leaf in zip(self._graph, leaves, strict=True):
            if leaf.grad is not None:
                outs.append(graph)
                grads.append(leaf.grad)
        if outs:
            torch.autograd.backward(outs, grads)
        self._graph = []
        for leaf in leaves:
            leaf.grad = None


# ----------------------------------------------------------------------------------------------
# Per-token log-probs through the fused decoder.


def compute_dtype(decoder: FusedDecoder, device: torch.device) -> torch.dtype:
    """The autocast dtype when autocast is on for ``device``, else the embedding's dtype."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return decoder.embed.weight.dtype


def first_target_column(valid: torch.Tensor) -> int:
    """The first column holding a valid target in any row (``valid.shape[1]`` when none)."""
    cols = valid.any(dim=0).nonzero()
    return int(cols[0]) if cols.numel() else valid.shape[1]


_NO_GRAD_PREFIXES: dict[Any, PrefixKV] = {}
"""The last no-gradient prefix per decoder (its token ids and weights key): the micro-batches of one
log-prob pass reuse it."""


def _prefix_for(
    decoder: FusedDecoder, input_ids: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype, min_prefix: int
) -> PrefixKV | None:
    """A prefix shared by every row of this micro-batch (before its first target), computed for this call
    (in the graph when gradients are on; cached between calls when they are off)."""
    if input_ids.shape[0] < 2:
        return None
    p = min(common_prefix_length(input_ids, None), first_target_column(valid) - 1)
    if p < min_prefix:
        return None
    ids = input_ids[0, :p]
    if torch.is_grad_enabled():
        _, kvs = decoder.hidden(ids[None], dtype, keep_kv=True)
        return PrefixKV(p, [k for k, _ in kvs], [v for _, v in kvs])
    key = (id(decoder), decoder._key(dtype), tuple(ids.tolist()))
    cached = _NO_GRAD_PREFIXES.get(key)
    if cached is None:
        _NO_GRAD_PREFIXES.clear()
        cached = _NO_GRAD_PREFIXES[key] = decoder.prefix(ids, dtype)[0]
    return cached


def fused_token_logprobs(
    decoder: FusedDecoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    target_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int | None = None,
    step_prefix: StepPrefix | None = None,
    share_prefix: bool = True,
    min_prefix: int = 16,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` (same alignment, zeros and values) through ``decoder``. Rows must be right-padded
    (real tokens first). ``step_prefix``: the optimizer step's shared prefix, which every row must start
    with and in which no target may lie; otherwise, with ``share_prefix``, a prefix common to this
    micro-batch's rows (before its first target) is computed once for the call."""

    dtype = compute_dtype(decoder, input_ids.device)
    valid = valid_target_mask(input_ids, attention_mask, None)
    if target_mask is not None:
        valid &= target_mask.bool()
    if step_prefix is not None:
        p = step_prefix.length
        # both checks in one read from the device: a target in the first p + 1 columns, a row not starting
        # with the prefix's ids
        target_early, other_start = torch.stack(
            [valid[:, : p + 1].any(), (input_ids[:, :p] != step_prefix.ids.to(input_ids.device)).any()]
        ).tolist()
        if step_prefix.dtype != dtype or target_early:
            raise ValueError("the step's shared prefix does not fit this micro-batch")
        if other_start:
            raise ValueError("a row of the micro-batch does not start with the step's shared prefix")
        prefix: PrefixKV | None = step_prefix.kv
    else:
        prefix = _prefix_for(decoder, input_ids, valid, dtype, min_prefix) if share_prefix else None
    p = prefix.length if prefix is not None else 0
    trunk_keys = None
    if decoder.trunk is not None and attention_mask is not None:  # one read from the device per micro-batch
        trunk_keys = FrozenTrunk.keys(input_ids, attention_mask.sum(dim=1), p, dtype)
    hidden, _ = decoder.hidden(input_ids[:, p:], dtype, prefix, trunk_keys=trunk_keys)
    keep = valid[:, p + 1 :].nonzero(as_tuple=True)  # one read from the device for both selections
    rows = hidden[:, :-1][keep]
    targets = input_ids[:, p + 1 :][keep]
    _, head_weight = decoder.plans(dtype)
    if head_weight.requires_grad:  # a trained (tied) head: under the caller's autocast, like token_logprobs
        lp, ent = chunked_head_logprobs(
            rows, decoder.head, targets, chunk_size=chunk_size, temperature=temperature,
            return_entropy=return_entropy,
        )  # fmt: skip
    else:
        chunk = max(16, HEAD_CHUNK_ELEMENTS // head_weight.shape[0])
        lp, ent = weight_head_logprobs(
            rows.to(dtype), head_weight, targets, chunk_size=chunk, temperature=temperature,
            return_entropy=return_entropy,
        )  # fmt: skip
    out = _scatter_rows(lp, valid)
    return out, (_scatter_rows(ent, valid) if ent is not None else None)
