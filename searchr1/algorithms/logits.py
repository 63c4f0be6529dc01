"""Quantities computed from logits ``[B, T, V]``, chunked over the sequence to bound memory.

Each chunk works on ``[B, chunk, V]`` in float32. When the logits require a gradient, each chunk runs
under activation checkpointing, so the backward pass also holds one chunk's softmax at a time
instead of the whole ``[B, T, V]`` float32 copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def chunked_over_sequence(
    fn: Callable[..., Tensor | tuple[Tensor, ...]], *tensors: Tensor, chunk_size: int | None = None
) -> Tensor | tuple[Tensor, ...]:
    """Apply ``fn`` to slices ``[:, s:s+chunk]`` of every tensor and concatenate along dim 1."""
    seq = tensors[0].shape[1]
    size = chunk_size if chunk_size and chunk_size > 0 else seq
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    outs = []
    for start in range(0, max(seq, 1), size):
        parts = [t[:, start : start + size] for t in tensors]
        if need_grad and size < seq:
            outs.append(checkpoint(fn, *parts, use_reentrant=False))
        else:
            outs.append(fn(*parts))
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(group, dim=1) for group in zip(*outs, strict=True))
    return torch.cat(outs, dim=1)


def upcast(x: Tensor) -> Tensor:
    """At least float32 (bf16/fp16 logits are upcast; float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _token_log_probs(logits: Tensor, tokens: Tensor) -> Tensor:
    x = upcast(logits)
    return x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def log_probs_from_logits(logits: Tensor, tokens: Tensor, chunk_size: int | None = None) -> Tensor:
    """log softmax(logits)[tokens]: ``[B, T, V]``, ``[B, T]`` -> ``[B, T]`` (at least float32)."""
    return chunked_over_sequence(_token_log_probs, logits, tokens, chunk_size=chunk_size)


def _entropy(logits: Tensor) -> Tensor:
    x = upcast(logits)
    logp = torch.log_softmax(x, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy of softmax(logits) per position: H = -sum_v p_v log p_v, ``[B, T]`` (at least float32)."""
    return chunked_over_sequence(_entropy, logits, chunk_size=chunk_size)


def topk_log_probs(
    logits: Tensor, k: int | None = None, indices: Tensor | None = None, chunk_size: int | None = None
) -> tuple[Tensor, Tensor]:
    """Full-vocabulary log-probabilities at ``indices`` (or at the top-``k`` of these logits).

    Returns ``(log_probs [B, T, k], indices [B, T, k])``; the log-probs are normalised over the whole
    vocabulary (``logit_v - logsumexp(logits)``), only ``k`` of them are kept.
    """
    if indices is None:
        if not k or k <= 0:
            raise ValueError("topk_log_probs needs k > 0 or explicit indices")
        k = min(k, logits.shape[-1])
        with torch.no_grad():
            indices = chunked_over_sequence(
                lambda x: x.topk(k, dim=-1).indices, logits.detach(), chunk_size=chunk_size
            )

    def gather(x: Tensor, idx: Tensor) -> Tensor:
        x = upcast(x)
        return x.gather(-1, idx) - torch.logsumexp(x, dim=-1, keepdim=True)

    return chunked_over_sequence(gather, logits, indices, chunk_size=chunk_size), indices


def topk_log_probs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    k: int | None = None,
    indices: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = 128,
) -> tuple[Tensor, Tensor]:
    """:func:`topk_log_probs` of ``logits = (hidden @ weight.T + bias) / temperature``, chunk by chunk.

    ``hidden`` ``[B, T, H]``, ``weight`` ``[V, H]``: the ``[B, T, V]`` logits never exist at once
    (one chunk's ``[B, chunk, V]`` does, recomputed in the backward pass). This is the memory-
    efficient path of top-k KL: gather the top-k of pi_old (reverse KL) or of the reference (forward
    KL) once, then the other models' log-probs at those indices, and call :func:`topk_kl`.
    """

    def logits_of(h: Tensor) -> Tensor:
        out = torch.nn.functional.linear(h, weight, bias)
        return out / temperature if temperature != 1.0 else out

    if indices is None:
        if not k or k <= 0:
            raise ValueError("topk_log_probs_from_hidden needs k > 0 or explicit indices")
        k = min(k, weight.shape[0])
        with torch.no_grad():
            indices = chunked_over_sequence(
                lambda h: logits_of(h).topk(k, dim=-1).indices, hidden.detach(), chunk_size=chunk_size
            )

    def gather(h: Tensor, idx: Tensor) -> Tensor:
        x = upcast(logits_of(h))
        return x.gather(-1, idx) - torch.logsumexp(x, dim=-1, keepdim=True)

    return chunked_over_sequence(gather, hidden, indices, chunk_size=chunk_size), indices
