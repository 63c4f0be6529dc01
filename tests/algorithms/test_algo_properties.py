"""Property-based tests (hypothesis): shapes, masks and group layouts for every estimator and loss."""

from __future__ import annotations

import itertools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.algorithms.aggregation import AggNorms
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.registry import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

SETTINGS = settings(
    max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)  # derandomize: the same examples on every run (seeded, reproducible in CI)
MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
OUTCOME = ["grpo", "rloo", "reinforce", "reinforce_plus_plus_baseline"]
GROUPED = ["grpo", "rloo"]  # per-group baselines only (the ++ variants whiten over the batch)


@st.composite
def batches(draw, min_rows: int = 1):
    """A padded batch: mask [B, T] (rows may be empty, may have holes), group ids, scores, seed."""
    rows = draw(st.integers(min_rows, 6))
    cols = draw(st.integers(1, 7))
    mask = torch.tensor(
        draw(st.lists(st.lists(st.booleans(), min_size=cols, max_size=cols), min_size=rows, max_size=rows))
    )
    groups = draw(st.lists(st.integers(0, 2), min_size=rows, max_size=rows))
    scores = torch.tensor(
        draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]), min_size=rows, max_size=rows))
    )
    seed = draw(st.integers(0, 2**16))
    return mask, groups, scores.double(), seed


def run_estimator(name: str, scores, mask, groups, cfg=None, values=None):
    fn = ADVANTAGE_ESTIMATORS[name]
    if values is None:
        values = torch.zeros(mask.shape, dtype=torch.float64)
    return fn(scores, mask, config=cfg or AlgorithmConfig(), group_ids=groups, values=values, state={})


@SETTINGS
@given(batch=batches(), name=st.sampled_from([*OUTCOME, "gae", "reinforce_plus_plus"]))
def test_shapes_finite_and_zero_on_masked_positions(batch, name):
    mask, groups, scores, seed = batch
    torch.manual_seed(seed)
    values = torch.randn(mask.shape, dtype=torch.float64)
    adv, ret = run_estimator(name, scores, mask, groups, values=values)
    assert adv.shape == ret.shape == mask.shape
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


@SETTINGS
@given(batch=batches(), name=st.sampled_from(OUTCOME))
def test_outcome_advantage_is_constant_along_each_response(batch, name):
    mask, groups, scores, _ = batch
    adv, _ = run_estimator(name, scores, mask, groups)
    for row, m in zip(adv, mask, strict=True):
        if m.any():
            assert torch.allclose(row[m], row[m][0].expand(int(m.sum())))


@SETTINGS
@given(batch=batches(min_rows=2), name=st.sampled_from(GROUPED), delta=st.floats(-3, 3))
def test_groups_do_not_leak(batch, name, delta):
    mask, groups, scores, _ = batch
    mask = torch.ones_like(mask)
    before, _ = run_estimator(name, scores, mask, groups)
    changed = scores.clone()
    target = groups[0]
    in_group = torch.tensor([g == target for g in groups])
    changed[in_group] += delta * torch.arange(1, int(in_group.sum()) + 1, dtype=torch.float64)
    after, _ = run_estimator(name, changed, mask, groups)
    torch.testing.assert_close(after[~in_group], before[~in_group])


@SETTINGS
@given(batch=batches(), name=st.sampled_from(GROUPED), norm=st.booleans())
def test_group_baselines_centre_each_group_and_constant_groups_get_zero(batch, name, norm):
    mask, groups, scores, _ = batch
    mask = torch.ones_like(mask)
    cfg = AlgorithmConfig(norm_adv_by_std=norm)
    adv, _ = run_estimator(name, scores, mask, groups, cfg=cfg)
    first = adv[:, 0]
    for g in set(groups):
        members = torch.tensor([x == g for x in groups])
        if members.sum() > 1:
            assert abs(float(first[members].sum())) < 1e-6  # centred
            if scores[members].unique().numel() == 1:
                assert first[members].abs().max() < 1e-9  # zero up to the rounding of the mean
        else:
            assert float(first[members][0]) == float(scores[members][0])  # no baseline for a singleton
    constant, _ = run_estimator(name, torch.full_like(scores, 0.7), mask, groups, cfg=cfg)
    multi = torch.tensor([groups.count(g) > 1 for g in groups])
    assert all(abs(float(x)) < 1e-9 for x in constant[multi].flatten())


@SETTINGS
@given(batch=batches())
def test_gae_with_unit_discount_is_reward_to_go_minus_value(batch):
    # gamma = lam = 1: A_t = (sum of rewards from t on, over generated tokens) - V_t
    mask, _, _, seed = batch
    torch.manual_seed(seed)
    rewards = torch.randn(mask.shape, dtype=torch.float64)
    values = torch.randn(mask.shape, dtype=torch.float64)
    adv, _ = ADVANTAGE_ESTIMATORS["gae"](
        rewards, mask, config=AlgorithmConfig(gae_whiten=False), values=values
    )
    kept = torch.where(mask, rewards, 0.0)
    to_go = kept.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(adv, torch.where(mask, to_go - values, 0.0))


@st.composite
def loss_batches(draw):
    mask, _, _, seed = draw(batches())
    return mask, seed


@SETTINGS
@given(batch=loss_batches(), name=st.sampled_from(sorted(POLICY_LOSSES)), mode=st.sampled_from(MODES))
def test_masked_tokens_never_change_a_loss_or_gradient(batch, name, mode):
    mask, seed = batch
    g = torch.Generator().manual_seed(seed)
    shape = mask.shape
    logp = (torch.randn(shape, generator=g, dtype=torch.float64) - 1).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(shape, generator=g, dtype=torch.float64)
    adv = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).expand(shape).clone()
    cfg = AlgorithmConfig(loss_agg=mode)
    fn = POLICY_LOSSES[name]
    loss, _ = fn(logp, old, adv, mask, config=cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    # garbage on masked positions, including inf
    noise = torch.randn(shape, generator=g, dtype=torch.float64) * 50
    logp2 = torch.where(mask, logp.detach(), noise).requires_grad_(True)
    old2 = torch.where(mask, old, -noise)
    adv2 = torch.where(mask, adv, torch.full_like(adv, float("inf")))
    loss2, _ = fn(logp2, old2, adv2, mask, config=cfg)
    (grad2,) = torch.autograd.grad(loss2, logp2)
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(grad2, grad)
    assert (grad2[~mask] == 0).all()


@SETTINGS
@given(batch=loss_batches(), mode=st.sampled_from(MODES), cuts=st.lists(st.integers(1, 5), max_size=4))
def test_any_micro_batch_split_gives_the_mini_batch_loss(batch, mode, cuts):
    mask, seed = batch
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(mask.shape, generator=g, dtype=torch.float64).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    adv = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    cfg = AlgorithmConfig(loss_agg=mode)
    full, _ = POLICY_LOSSES["ppo"](logp, old, adv, mask, config=cfg)
    (g_full,) = torch.autograd.grad(full, logp)
    bounds = sorted({0, mask.shape[0], *[c for c in cuts if c < mask.shape[0]]})
    norms = AggNorms.of(mask)
    total = sum(
        POLICY_LOSSES["ppo"](logp[a:b], old[a:b], adv[a:b], mask[a:b], config=cfg, norms=norms)[0]
        for a, b in itertools.pairwise(bounds)
    )
    (g_split,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(g_split, g_full)


@SETTINGS
@given(seed=st.integers(0, 2**16), scale=st.floats(0.01, 30))
def test_kl_estimators_zero_on_identity_and_k3_nonnegative(seed, scale):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(3, 5, generator=g, dtype=torch.float64) * scale
    ref = torch.randn(3, 5, generator=g, dtype=torch.float64) * scale
    for name in KL_ESTIMATORS:
        assert (KL_ESTIMATORS[name](lp, lp) == 0).all()
    for name in ("low_var_kl", "k3+", "mse", "abs"):
        assert (KL_ESTIMATORS[name](lp, ref) >= 0).all()
