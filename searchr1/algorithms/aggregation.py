"""Loss aggregation: reduce a per-token loss matrix ``[B, T]`` to a scalar, masked to generated tokens.

Gradient accumulation. A mini-batch is often split into micro-batches whose losses are summed into
one optimiser step. Normalising each micro-batch by its *own* token or sequence count makes the step
depend on the split (a short micro-batch gets more weight). Here every micro-batch is normalised by
the *mini-batch* counts, passed as :class:`AggNorms`; then

    sum_over_microbatches agg_loss(loss[mb], mask[mb], mode, norms=AggNorms.of(mask))
        == agg_loss(loss, mask, mode)

for every split, for the value and for the gradient. Call ``loss.backward()`` on each micro-batch
loss as is (no extra division by the number of micro-batches). With data parallelism, build the
norms from counts summed over ranks and multiply the loss by the world size (DDP/FSDP average
gradients over ranks).

Modes (``n_i`` = generated tokens of sequence i, ``N = sum_i n_i``, ``S`` = sequences with n_i > 0,
``L`` = a constant token budget):

* ``token-mean``               sum_{i,t} l_it / N                       (DAPO, Yu et al. 2025)
* ``seq-mean-token-sum``       sum_i (sum_t l_it) / S
* ``seq-mean-token-mean``      sum_i (sum_t l_it / n_i) / S              (GRPO, Shao et al. 2024)
* ``seq-mean-token-sum-norm``  sum_i (sum_t l_it) / (S * L)               (Dr. GRPO, Liu et al. 2025)

Sequences without any generated token contribute nothing and are not counted in ``S``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from searchr1.algorithms.registry import get_loss_agg, register_loss_agg


@dataclass(frozen=True)
class AggNorms:
    """Mini-batch-level normalisers shared by all its micro-batches."""

    num_tokens: float
    """Generated tokens in the whole mini-batch (N)."""
    num_seqs: float
    """Sequences with at least one generated token in the mini-batch (S)."""
    seq_len: float
    """Constant token budget L of seq-mean-token-sum-norm (the padded response length by default)."""

    @classmethod
    def of(cls, response_mask: Tensor, seq_len: int | None = None) -> AggNorms:
        """Norms of a whole mini-batch from its response mask ``[B, T]``."""
        mask = response_mask.bool()
        return cls(
            num_tokens=float(mask.sum().item()),
            num_seqs=float(mask.any(dim=-1).sum().item()),
            seq_len=float(seq_len if seq_len else response_mask.shape[-1]),
        )


def _norms(mask: Tensor, norms: AggNorms | None) -> AggNorms:
    return norms if norms is not None else AggNorms.of(mask)


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with masked-out entries replaced by 0 (``where``, so a NaN there cannot leak)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


@register_loss_agg("token-mean")
def token_mean(loss_mat: Tensor, mask: Tensor, norms: AggNorms | None = None) -> Tensor:
    """sum_{i,t} m_it l_it / N."""
    n = _norms(mask, norms)
    return _masked(loss_mat, mask).sum() / max(n.num_tokens, 1.0)


@register_loss_agg("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, norms: AggNorms | None = None) -> Tensor:
    """sum_i (sum_t m_it l_it) / S."""
    n = _norms(mask, norms)
    return _masked(loss_mat, mask).sum() / max(n.num_seqs, 1.0)


@register_loss_agg("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, norms: AggNorms | None = None) -> Tensor:
    """sum_i (sum_t m_it l_it / n_i) / S (per-sequence mean, then mean over sequences)."""
    n = _norms(mask, norms)
    per_seq = _masked(loss_mat, mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_seq.sum() / max(n.num_seqs, 1.0)


@register_loss_agg("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: Tensor, mask: Tensor, norms: AggNorms | None = None) -> Tensor:
    """sum_i (sum_t m_it l_it) / (S * L): Dr. GRPO's constant normaliser (no length bias)."""
    n = _norms(mask, norms)
    return _masked(loss_mat, mask).sum() / (max(n.num_seqs, 1.0) * n.seq_len)


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, *, norms: AggNorms | None = None) -> Tensor:
    """Aggregate ``loss_mat`` ``[B, T]`` over ``mask`` with the registered mode ``mode``.

    ``norms`` are the mini-batch normalisers (see the module docstring); omit them when the batch is
    the whole mini-batch. Masked entries are selected away with ``torch.where``, so they reach
    neither the value nor the gradient (not even a NaN or inf in them).
    """
    mask = mask.bool()
    return get_loss_agg(mode)(loss_mat, mask, norms)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 when there are none)."""
    masked = _masked(x, mask)
    mask = mask.to(x.dtype)
    if dim is None:
        return masked.sum() / mask.sum().clamp(min=1)
    return masked.sum(dim=dim) / mask.sum(dim=dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over the masked positions (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(x, mask)
    count = mask.to(x.dtype).sum()
    sq = _masked((x - mean) ** 2, mask).sum()
    denom = (count - 1).clamp(min=1) if unbiased else count.clamp(min=1)
    return sq / denom


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over masked positions; masked positions come out 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return _masked(out, mask)
