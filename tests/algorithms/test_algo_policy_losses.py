"""Policy and value losses: hand-computed values and gradients, clipping invariants, gradcheck."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.policy_losses import (
    compute_policy_loss,
    gspo_loss,
    ppo_loss,
    value_loss,
    vanilla_pg_loss,
)
from searchr1.algorithms.registry import POLICY_LOSSES, register_policy_loss

LN = math.log


def ratio_inputs(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """log_prob (leaf, grad) and old_log_prob with exp(log_prob - old) = ratios."""
    old = torch.full((1, len(ratios)), -2.0, dtype=torch.float64)
    logp = (old + torch.tensor([[LN(r) for r in ratios]], dtype=torch.float64)).requires_grad_(True)
    return logp, old


def test_ppo_hand_computed_with_dual_clip():
    # A = [1, 1, -1, -1, -1], r = [1.5, .5, .5, 1.5, 5], eps = .2, c = 3:
    # t0: max(-1.5, -1.2) = -1.2 (clipped)   t1: max(-.5, -.8) = -.5
    # t2: max(.5, .8) = .8 (clipped)         t3: max(1.5, 1.2) = 1.5
    # t4: max(5, 1.2) = 5 -> min(5, 3) = 3 (dual clip)
    # token-mean = (-1.2 - .5 + .8 + 1.5 + 3) / 5 = .72; clipfrac 2/5, clipfrac_lower 1/5
    # d/dlogp(-A r) = -A r where unclipped branch active: t1: -.5, t3: 1.5, others 0; /5 -> [0,-.1,0,.3,0]
    logp, old = ratio_inputs([1.5, 0.5, 0.5, 1.5, 5.0])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    loss, m = ppo_loss(logp, old, adv, torch.ones(1, 5), config=AlgorithmConfig(clip_ratio_c=3.0))
    assert loss.item() == pytest.approx(0.72)
    assert m["pg_clipfrac"].item() == pytest.approx(0.4)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.2)
    # ppo_kl = mean(-log r) = -(2 ln 1.5 + 2 ln .5 + ln 5) / 5 = -.2068148
    assert m["ppo_kl"].item() == pytest.approx(-0.2068148, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.1, 0.0, 0.3, 0.0])


def test_ppo_clip_higher_and_dual_clip_off():
    # eps_high .28: t0 -> max(-1.5, -1.28) = -1.28; c = 0: t4 stays 5
    # mean = (-1.28 - .5 + .8 + 1.5 + 5) / 5 = 1.104
    logp, old = ratio_inputs([1.5, 0.5, 0.5, 1.5, 5.0])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    cfg = AlgorithmConfig(clip_ratio_high=0.28, clip_ratio_c=0.0)
    loss, m = ppo_loss(logp, old, adv, torch.ones(1, 5), config=cfg)
    assert loss.item() == pytest.approx(1.104)
    assert "pg_clipfrac_lower" not in m


def test_ppo_equals_vanilla_surrogate_at_ratio_one():
    # r = 1: clipping is inactive, loss = mean(-A) and gradient = -A / N (same as vanilla PG)
    torch.manual_seed(0)
    logp = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    adv = torch.randn(3, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]])
    loss, m = ppo_loss(logp, logp.detach(), adv, mask)
    (grad_ppo,) = torch.autograd.grad(loss, logp)
    n = mask.sum()
    assert loss.item() == pytest.approx(float(-(adv * mask).sum() / n))
    assert m["pg_clipfrac"].item() == 0.0
    loss_v, _ = vanilla_pg_loss(logp, logp.detach(), adv, mask)
    (grad_v,) = torch.autograd.grad(loss_v, logp)
    torch.testing.assert_close(grad_ppo, grad_v)
    torch.testing.assert_close(grad_ppo, -adv * mask / n)


def test_vanilla_hand_computed():
    # l = -A logp: A = [2, -1], logp = [-.5, -1] -> (1 + (-1)) / 2 = 0; grad = -A / 2 = [-1, .5]
    logp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    loss, _ = vanilla_pg_loss(logp, logp.detach(), torch.tensor([[2.0, -1.0]]), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(0.0)
    assert logp.grad.tolist() == [[-1.0, 0.5]]


def test_gspo_sequence_ratio_hand_computed():
    # token log-ratios [ln 2, 0] -> log s = ln2 / 2, s = sqrt 2 = 1.414214, for both tokens
    # A = +1: max(-1.414, -1.2) = -1.2 on both tokens (clipped) -> loss -1.2, zero gradient
    logp, old = ratio_inputs([2.0, 1.0])
    loss, m = gspo_loss(logp, old, torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-1.2)
    assert m["pg_clipfrac"].item() == 1.0
    loss.backward()
    assert logp.grad.abs().max().item() == 0.0
    # A = -1: max(1.414, 1.2) = sqrt 2, unclipped; per token d/dlogp = -A s = sqrt2, token-mean /2
    logp, old = ratio_inputs([2.0, 1.0])
    loss, _ = gspo_loss(logp, old, -torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(math.sqrt(2))
    assert logp.grad.tolist()[0] == pytest.approx([math.sqrt(2) / 2] * 2)


def test_gspo_sequence_ratio_ignores_masked_tokens():
    # masked token has log-ratio ln 8; generated tokens [ln 2, -ln 2] -> s = 1: no clipping, loss = -A
    logp, old = ratio_inputs([2.0, 0.5, 8.0])
    loss, m = gspo_loss(logp, old, torch.ones(1, 3, dtype=torch.float64), torch.tensor([[1, 1, 0]]))
    assert loss.item() == pytest.approx(-1.0)
    assert m["pg_clipfrac"].item() == 0.0


def test_value_loss_hand_computed():
    # V = [1, 2], V_old = [.5, .5], R = [1, 0], clip .2 -> V_clip = [.7, .7]
    # t0: max(0, .09) -> .045 (clipped larger); t1: max(4, .49) -> 2.0; mean 1.0225, clipfrac .5
    values = torch.tensor([[1.0, 2.0]], requires_grad=True)
    loss, m = value_loss(
        values, torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2),
        config=AlgorithmConfig(value_clip=0.2),
    )  # fmt: skip
    assert loss.item() == pytest.approx(1.0225)
    assert m["vf_clipfrac"].item() == pytest.approx(0.5)
    # gradient: t0 clipped branch (V_clip constant in V beyond the clip) -> 0; t1: (V-R)/2 = 1
    loss.backward()
    assert values.grad.tolist() == [[0.0, 1.0]]
    # no clipping: .5 * mean((V-R)^2) = .5 * (0 + 4) / 2 = 1
    loss0, _ = value_loss(
        values, torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2),
        config=AlgorithmConfig(value_clip=0.0),
    )  # fmt: skip
    assert loss0.item() == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["ppo", "gspo", "vanilla"])
@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_gradcheck_policy_losses(name, agg):
    torch.manual_seed(1)
    old = torch.randn(3, 4, dtype=torch.float64) - 1
    # ratios within (.5, 2) but away from the clip kinks 0.8 / 1.2 (not differentiable there)
    logp = old + torch.tensor([[0.5, -0.5, 0.05, 0.6], [-0.6, 0.1, 0.4, -0.05], [0.02, 0.3, -0.4, 0.7]])
    logp = logp.double().requires_grad_(True)
    # outcome advantages (constant along a sequence): GSPO's gradient is the derivative of its value
    # only then, by design
    adv = torch.randn(3, 1, dtype=torch.float64).expand(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1]])
    fn = POLICY_LOSSES[name]
    cfg = AlgorithmConfig(loss_agg=agg, clip_ratio_low=0.3, clip_ratio_high=0.3)
    assert torch.autograd.gradcheck(lambda lp: fn(lp, old, adv, mask, config=cfg)[0], (logp,))


def test_gradcheck_value_loss():
    torch.manual_seed(2)
    values = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    old = values.detach() + torch.tensor([[0.9, -0.05, 0.1], [-0.8, 0.02, 0.6]], dtype=torch.float64)
    returns = torch.randn(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    cfg = AlgorithmConfig(value_clip=0.5)
    assert torch.autograd.gradcheck(lambda v: value_loss(v, old, returns, mask, config=cfg)[0], (values,))


def test_registry_selects_and_a_user_loss_plugs_in():
    logp = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[1.0, 3.0]])

    @register_policy_loss("test_double_vanilla")
    def double(log_prob, old_log_prob, advantages, response_mask, *, config=None, loss_agg=None, norms=None):
        loss, m = vanilla_pg_loss(log_prob, old_log_prob, advantages, response_mask, config=config)
        return 2 * loss, m

    try:
        cfg = AlgorithmConfig(policy_loss="test_double_vanilla")
        loss, _ = compute_policy_loss(logp - 1.0, logp.detach(), adv, torch.ones(1, 2), cfg)
        # 2 * mean(-A * logp) = 2 * (1 + 3) / 2 = 4
        assert loss.item() == pytest.approx(4.0)
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("test_double_vanilla")(vanilla_pg_loss)
    finally:
        POLICY_LOSSES.remove("test_double_vanilla")
    with pytest.raises(ValueError, match=r"algorithm\.policy_loss: unknown policy loss .trpo.; known: .*ppo"):
        compute_policy_loss(logp, logp, adv, torch.ones(1, 2), AlgorithmConfig(policy_loss="trpo"))
