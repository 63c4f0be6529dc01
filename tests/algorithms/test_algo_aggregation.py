"""Loss aggregation: hand-computed modes, masked entries, and independence from the micro-batch split."""

from __future__ import annotations

import pytest
import torch

import searchr1.algorithms.policy_losses  # noqa: F401  (registers the losses)
from searchr1.algorithms.aggregation import AggNorms, agg_loss, masked_mean, masked_var, masked_whiten
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.registry import POLICY_LOSSES

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # (3/2 + 4/1) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # (3 + 4) / (2 sequences * 3 positions)
    ],
)
def test_modes_hand_computed(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", MODES)
def test_masked_entries_and_empty_rows_change_nothing(mode):
    base = agg_loss(LOSS, MASK, mode, norms=AggNorms.of(MASK))
    # garbage (even NaN / inf) in masked entries, plus an all-masked row: same value
    loss = torch.cat([LOSS, torch.full((1, 3), 9.0)])
    loss[0, 2], loss[1, 1], loss[2, 0] = float("nan"), float("inf"), float("nan")
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.long)])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(base.item())


def test_seq_mean_token_sum_norm_uses_the_constant_budget():
    # budget L = 10: (3 + 4) / (2 * 10)
    norms = AggNorms.of(MASK, seq_len=10)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norms=norms).item() == pytest.approx(0.35)


def test_empty_batch_is_zero_not_nan():
    for mode in MODES:
        assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def _split_losses(param, loss_fn, mask, mode, splits):
    """Sum over micro-batches of the loss aggregated with mini-batch norms, and its gradient."""
    norms = AggNorms.of(mask)
    total = torch.zeros((), dtype=param.dtype)
    start = 0
    for size in splits:
        rows = slice(start, start + size)
        # each micro-batch is padded only to its own longest response (as a trainer would)
        width = int(mask[rows].nonzero()[:, 1].max()) + 1 if mask[rows].any() else 1
        total = total + loss_fn(param[rows, :width], mask[rows, :width], mode, norms)
        start += size
    (grad,) = torch.autograd.grad(total, param)
    return total.detach(), grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [[6], [1, 5], [3, 3], [2, 1, 3], [1, 1, 1, 1, 1, 1]])
def test_gradient_accumulation_is_independent_of_the_split(mode, splits):
    torch.manual_seed(3)
    param = torch.randn(6, 7, dtype=torch.float64, requires_grad=True)
    lengths = [7, 1, 4, 0, 6, 2]
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    norms_full = AggNorms.of(mask)

    def fn(p, m, mode, norms):
        # seq-mean-token-sum-norm's budget must be the mini-batch's, whatever the micro padding
        return agg_loss(torch.sin(p) * 3, m, mode, norms=norms)

    full = agg_loss(torch.sin(param) * 3, mask, mode)
    (full_grad,) = torch.autograd.grad(full, param)
    total, grad = _split_losses(param, fn, mask, mode, splits)
    assert norms_full.seq_len == 7
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(grad, full_grad)


@pytest.mark.parametrize("name", ["ppo", "gspo", "vanilla"])
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_gradient_accumulation(name, mode):
    torch.manual_seed(4)
    logp = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    old = logp.detach() + 0.3 * torch.randn(5, 6, dtype=torch.float64)
    adv = torch.randn(5, 1, dtype=torch.float64).expand(5, 6)
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in [6, 2, 3, 5, 1]])
    cfg = AlgorithmConfig(loss_agg=mode)
    fn = POLICY_LOSSES[name]
    full, _ = fn(logp, old, adv, mask, config=cfg)
    (g_full,) = torch.autograd.grad(full, logp)
    norms = AggNorms.of(mask)
    parts = [
        fn(logp[r], old[r], adv[r], mask[r], config=cfg, norms=norms)[0] for r in (slice(0, 2), slice(2, 5))
    ]
    total = parts[0] + parts[1]
    (g_split,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total.detach(), full.detach())
    torch.testing.assert_close(g_split, g_full)


def test_own_normalisers_would_depend_on_the_split():
    # the pitfall the norms avoid: token-mean per micro-batch then averaged != mini-batch token-mean
    # rows [1 token of loss 1] and [3 tokens of loss 3]: global mean (1 + 9) / 4 = 2.5, averaged = 2
    loss = torch.tensor([[1.0, 0, 0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    naive = (agg_loss(loss[:1], mask[:1], "token-mean") + agg_loss(loss[1:], mask[1:], "token-mean")) / 2
    norms = AggNorms.of(mask)
    right = agg_loss(loss[:1], mask[:1], "token-mean", norms=norms) + agg_loss(
        loss[1:], mask[1:], "token-mean", norms=norms
    )
    assert naive.item() == pytest.approx(2.0)
    assert right.item() == pytest.approx(2.5)


def test_masked_statistics():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, float("nan"), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # {1, 2, 3}: mean 2, unbiased var (1 + 0 + 1) / 2 = 1, biased 2/3
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    assert masked_var(x, mask).item() == pytest.approx(1.0)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2 / 3)
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.5, 3.0])
    # whiten: (x - 2) / 1 on masked positions, 0 elsewhere
    w = masked_whiten(x, mask)
    assert w.tolist()[0] == pytest.approx([-1.0, 0.0, 0.0], abs=1e-6)
    assert w.tolist()[1] == pytest.approx([1.0, 0.0, 0.0], abs=1e-6)


def test_unknown_mode_names_the_key():
    with pytest.raises(ValueError, match=r"algorithm\.loss_agg.*'sum'"):
        agg_loss(LOSS, MASK, "sum")
