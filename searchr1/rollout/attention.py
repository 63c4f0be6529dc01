"""Decoding attention for the HF engines: one query token per row against a KV cache.

PyTorch's CPU kernels for ``scaled_dot_product_attention`` are built for blocks of queries; with a
single query per row and a padding mask they spend most of a decode step in attention (measured on
2 cores, SmolLM2-135M's shapes, batch 64, bfloat16, 30 layers: 390 ms a step in SDPA at 400 cached
tokens; the two matmuls below take 58 ms at 600 cached tokens, 125 ms in the Q K^T order). For a query length of 1, the query heads that share a key/value head
(grouped-query attention) are stacked as rows of one small matrix product:

    S = (K Q^T)^T * scale + mask        [rows, kv_heads, heads_per_kv, keys]  (float32)
    P = softmax(S)                    over the keys
    O = P V

Longer queries (prompts, observations) go to transformers' SDPA function unchanged. The function is
registered with transformers' ``AttentionInterface`` under ``ATTENTION_NAME`` (with SDPA's mask
format), so any model using the functional attention interface (Llama, Qwen2, Mistral, ...) can
switch to it with ``model.set_attn_implementation(ATTENTION_NAME)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

ATTENTION_NAME = "searchr1_decode"


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, H, q, D]``, ``key/value [B, KVH, L, D]``,
    a boolean (True = attend) or additive SDPA-style mask; returns ``[B, q, H, D]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    # K Q^T rather than Q K^T: the cache's keys are a view into a buffer with spare capacity (not
    # contiguous across rows); as the left operand the matmul reads them in place, as a transposed right
    # operand it copies them first (9x slower at batch 64). The scores are then made contiguous along
    # the keys (small: one row per query head) for the mask and a last-dimension softmax.
    scores = torch.matmul(key, q.transpose(-1, -2)).transpose(-1, -2).float().contiguous()
    scores.mul_(scale)
    if attention_mask is not None:
        mask = attention_mask.reshape(attention_mask.shape[0], 1, 1, -1)
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask.float())
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # [B, KVH, H/KVH, D]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``ATTENTION_NAME`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, decode_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def supports_decode_attention(model: Any) -> bool:
    """Models whose attention goes through transformers' functional interface (and is SDPA today)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    can_set = getattr(model, "_can_set_attn_implementation", None)
    return impl in ("sdpa", ATTENTION_NAME) and callable(can_set) and bool(can_set())


@contextlib.contextmanager
def decode_attention_for(model: Any) -> Iterator[None]:
    """Decode with ``decode_attention`` inside the block (restored after); a no-op for other models."""
    if not supports_decode_attention(model):
        yield
        return
    register()
    before = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
