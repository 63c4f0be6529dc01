"""KL estimators, vocabulary / top-k KL, entropy and log-probs from logits, KL controllers."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    full_kl_from_logits,
    kl_loss_matrix,
    kl_penalty,
    topk_kl,
    vocab_kl,
)
from searchr1.algorithms.logits import (
    entropy_from_logits,
    log_probs_from_logits,
    topk_log_probs,
    topk_log_probs_from_hidden,
)
from searchr1.algorithms.registry import KL_ESTIMATORS

LN2 = math.log(2)


def test_per_token_estimators_hand_computed():
    # pi(y) = .5, ref(y) = .25: d = ln 2
    # k1 = ln2 = .693147; |d| = .693147; k2 = ln2^2/2 = .240227; k3 = .25/.5 - 1 + ln2 = .193147
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    expected = {
        "kl": LN2,
        "k1": LN2,
        "abs": LN2,
        "mse": LN2**2 / 2,
        "k2": LN2**2 / 2,
        "low_var_kl": 0.5 - 1 + LN2,
    }
    expected["k3"] = expected["k3+"] = expected["low_var_kl+"] = expected["low_var_kl"]
    for name, value in expected.items():
        assert kl_penalty(lp, ref, name).item() == pytest.approx(value, abs=1e-6), name
    # abs is symmetric; k1 changes sign
    assert kl_penalty(ref, lp, "abs").item() == pytest.approx(LN2, abs=1e-6)
    assert kl_penalty(ref, lp, "kl").item() == pytest.approx(-LN2, abs=1e-6)


def test_straight_through_k3_has_the_k2_gradient():
    # d k2 / d logp = d = ln 2;  d k3 / d logp = 1 - ref/pi = 1 - .5 = .5
    lp = torch.tensor([math.log(0.5)], requires_grad=True)
    ref = torch.tensor([math.log(0.25)])
    (g_st,) = torch.autograd.grad(kl_penalty(lp, ref, "k3+").sum(), lp)
    (g_k3,) = torch.autograd.grad(kl_penalty(lp, ref, "k3").sum(), lp)
    assert g_st.item() == pytest.approx(LN2, abs=1e-6)
    assert g_k3.item() == pytest.approx(0.5, abs=1e-6)


def test_estimators_zero_when_identical_and_k3_nonnegative():
    torch.manual_seed(0)
    lp = torch.randn(4, 50) * 5
    for name in KL_ESTIMATORS.names():
        assert kl_penalty(lp, lp, name).abs().max().item() == 0.0, name
    ref = torch.randn(4, 50) * 5
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    assert (kl_penalty(lp, ref, "k3") <= 10).all()  # clamped
    assert torch.isfinite(kl_penalty(lp * 100, ref, "k3")).all()


@pytest.mark.parametrize("name", ["kl", "abs", "mse", "low_var_kl", "k3+"])
def test_gradcheck_kl_estimators(name):
    torch.manual_seed(5)
    lp = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    ref = lp.detach() + torch.tensor([[0.3, -0.4, 0.7], [-0.2, 0.5, 0.1]], dtype=torch.float64)
    fn = KL_ESTIMATORS[name]
    if name == "k3+":  # straight-through: value and gradient belong to different functions by design
        (g,) = torch.autograd.grad(fn(lp, ref).sum(), lp)
        torch.testing.assert_close(g, lp.detach() - ref)
    else:
        assert torch.autograd.gradcheck(lambda x: fn(x, ref), (lp,))


def test_full_kl_hand_computed():
    # pi = [.5, .5], ref = [.25, .75]
    # reverse = .5 ln(.5/.25) + .5 ln(.5/.75) = .346574 - .202733 = .143841
    # forward = .25 ln(.25/.5) + .75 ln(.75/.5) = -.173287 + .304099 = .130812
    logits = torch.log(torch.tensor([[[0.5, 0.5]]]))
    ref = torch.log(torch.tensor([[[0.25, 0.75]]])) + 3.0  # logits are shift-invariant
    assert full_kl_from_logits(logits, ref, "reverse").item() == pytest.approx(0.143841, abs=1e-5)
    assert full_kl_from_logits(logits, ref, "forward").item() == pytest.approx(0.130812, abs=1e-5)
    assert full_kl_from_logits(logits, logits + 1.0).abs().item() < 1e-6
    with pytest.raises(ValueError, match="direction"):
        full_kl_from_logits(logits, ref, "sideways")  # type: ignore[arg-type]


def test_chunking_changes_neither_values_nor_gradients():
    torch.manual_seed(6)
    logits = torch.randn(2, 7, 11, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(2, 7, 11, dtype=torch.float64)
    tokens = torch.randint(0, 11, (2, 7))

    def all_outputs(chunk):
        return (
            full_kl_from_logits(logits, ref, "reverse", chunk).sum()
            + full_kl_from_logits(logits, ref, "forward", chunk).sum() * 2
            + entropy_from_logits(logits, chunk).sum() * 3
            + log_probs_from_logits(logits, tokens, chunk).sum() * 5
        )

    whole = all_outputs(None)
    (g_whole,) = torch.autograd.grad(whole, logits)
    for chunk in (1, 3, 7):
        part = all_outputs(chunk)
        (g_part,) = torch.autograd.grad(part, logits)
        torch.testing.assert_close(part, whole)
        torch.testing.assert_close(g_part, g_whole)


def test_entropy_and_log_probs_hand_computed():
    # p = [.5, .25, .25]: H = .5 ln2 + 2 * .25 ln4 = 1.5 ln2 = 1.039721; log p[1] = ln .25
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    assert entropy_from_logits(logits).item() == pytest.approx(1.5 * LN2, abs=1e-6)
    assert log_probs_from_logits(logits, torch.tensor([[1]])).item() == pytest.approx(
        math.log(0.25), abs=1e-6
    )


def test_topk_log_probs_hand_computed():
    # p = [.1, .6, .3]: top-2 = indices [1, 2], log-probs normalised over all 3 tokens
    logits = torch.log(torch.tensor([[[0.1, 0.6, 0.3]]])) + 2.0
    values, idx = topk_log_probs(logits, 2)
    assert idx.tolist() == [[[1, 2]]]
    assert values.exp().tolist()[0][0] == pytest.approx([0.6, 0.3], abs=1e-6)
    again, _ = topk_log_probs(logits, indices=torch.tensor([[[0]]]))
    assert again.exp().item() == pytest.approx(0.1, abs=1e-6)


def test_topk_kl_hand_computed():
    # pi = [.5, .3, .2], ref = [.2, .3, .5], k = 1 -> S = {0}, head = .5 ln(.5/.2) = .458145
    # sampled y = 0 (in S): tail 0 -> .458145; y = 2: tail ln(.2/.5) = -.916291 -> -.458145
    # truncated (no tail): .458145 for both
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]]))
    ref = torch.log(torch.tensor([[[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]]))
    tokens = torch.tensor([[0, 2]])
    kl = vocab_kl(logits, ref, tokens, direction="reverse", topk=1)
    assert kl.tolist()[0] == pytest.approx([0.458145, -0.458145], abs=1e-5)
    truncated = vocab_kl(logits, ref, tokens, direction="reverse", topk=1, tail=False)
    assert truncated.tolist()[0] == pytest.approx([0.458145, 0.458145], abs=1e-5)
    # forward: S = top-1 of ref = {2}: head = .5 ln(.5/.2) = .458145; y = 0: tail ln(.2/.5) -> -.458145
    fwd = vocab_kl(logits, ref, tokens, direction="forward", topk=1)
    assert fwd.tolist()[0] == pytest.approx([-0.458145, 0.458145], abs=1e-5)


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_topk_with_whole_vocabulary_is_exact(direction):
    torch.manual_seed(7)
    logits = torch.randn(2, 5, 9, dtype=torch.float64)
    ref = torch.randn(2, 5, 9, dtype=torch.float64)
    tokens = torch.randint(0, 9, (2, 5))
    exact = full_kl_from_logits(logits, ref, direction)
    torch.testing.assert_close(vocab_kl(logits, ref, tokens, direction=direction, topk=9), exact)


@pytest.mark.parametrize(("direction", "use_iw"), [("reverse", True), ("reverse", False), ("forward", True)])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_topk_kl_is_unbiased_in_value_and_gradient(direction, use_iw, k):
    """E_{y ~ pi_old}[top-k KL(y)], computed exactly by enumerating y, equals the exact KL.

    With importance weights this holds for any behaviour policy pi_old; without (reverse only) it
    holds on-policy, pi_old = pi. Gradients w.r.t. the policy logits are unbiased too.
    """
    torch.manual_seed(8)
    vocab = 6
    pol = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(vocab, dtype=torch.float64)
    old = torch.randn(vocab, dtype=torch.float64) if use_iw else pol.detach()
    # one "position" per possible sampled token y, all sharing the same distributions
    logits = pol.expand(vocab, 1, vocab)
    ref_logits = ref.expand(vocab, 1, vocab)
    tokens = torch.arange(vocab).view(vocab, 1)
    old_lp = torch.log_softmax(old, -1).view(vocab, 1)
    source = logits if direction == "reverse" else ref_logits
    if k > 0:
        _, idx = topk_log_probs(source.detach(), k)
    else:
        idx = torch.zeros(vocab, 1, 0, dtype=torch.long)
    p_s, _ = topk_log_probs(logits, indices=idx)
    r_s, _ = topk_log_probs(ref_logits, indices=idx)
    per_y = topk_kl(
        p_s,
        r_s,
        direction=direction,
        log_prob=log_probs_from_logits(logits, tokens),
        ref_log_prob=log_probs_from_logits(ref_logits, tokens),
        old_log_prob=old_lp,
        sampled_in_topk=(idx == tokens.unsqueeze(-1)).any(-1),
        use_iw=use_iw,
    ).view(vocab)
    expectation = (torch.softmax(old, -1) * per_y).sum()
    exact = full_kl_from_logits(pol.view(1, 1, vocab), ref.view(1, 1, vocab), direction).sum()
    (g_est,) = torch.autograd.grad(expectation, pol)
    (g_exact,) = torch.autograd.grad(exact, pol)
    torch.testing.assert_close(expectation, exact)
    torch.testing.assert_close(g_est, g_exact)


def test_gradcheck_vocab_kl():
    torch.manual_seed(9)
    logits = torch.randn(1, 3, 5, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(1, 3, 5, dtype=torch.float64)
    tokens = torch.tensor([[0, 3, 4]])
    assert torch.autograd.gradcheck(lambda x: full_kl_from_logits(x, ref, "reverse", 2), (logits,))
    assert torch.autograd.gradcheck(lambda x: full_kl_from_logits(x, ref, "forward", 2), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 2), (logits,))
    # truncated top-k (no sampled tail, whose gradient is a score-function estimate by design)
    assert torch.autograd.gradcheck(
        lambda x: vocab_kl(x, ref, tokens, topk=2, tail=False, chunk_size=2), (logits,)
    )


def test_kl_loss_matrix_dispatch():
    torch.manual_seed(10)
    logits = torch.randn(2, 3, 7)
    ref_logits = torch.randn(2, 3, 7)
    tokens = torch.randint(0, 7, (2, 3))
    lp, rlp = log_probs_from_logits(logits, tokens), log_probs_from_logits(ref_logits, tokens)
    token = kl_loss_matrix(AlgorithmConfig(kl_estimator="mse"), log_prob=lp, ref_log_prob=rlp)
    torch.testing.assert_close(token, 0.5 * (lp - rlp) ** 2)
    cfg = AlgorithmConfig(kl_loss_type="full_forward")
    full = kl_loss_matrix(
        cfg, log_prob=lp, ref_log_prob=rlp, logits=logits, ref_logits=ref_logits, tokens=tokens
    )
    torch.testing.assert_close(full, full_kl_from_logits(logits, ref_logits, "forward"))
    with pytest.raises(ValueError, match="needs logits"):
        kl_loss_matrix(cfg, log_prob=lp, ref_log_prob=rlp)


def test_kl_in_reward_and_controllers():
    # r' = r - .1 * KL on generated tokens: [[0 - .05, 1 - .05, 2]] (masked KL 9 ignored)
    rewards = torch.tensor([[0.0, 1.0, 2.0]])
    kl = torch.tensor([[0.5, 0.5, 9.0]])
    out = apply_kl_penalty(rewards, kl, torch.tensor([[1, 1, 0]]), 0.1)
    assert out.tolist()[0] == pytest.approx([-0.05, 0.95, 2.0])
    fixed = FixedKLController(0.2)
    fixed.update(10.0, 100)
    assert fixed.value == 0.2
    # adaptive: KL .2 vs target .1 -> error clip(1, +-.2) = .2; beta = .1 * (1 + .2 * 10 / 100) = .102
    ctrl = AdaptiveKLController(0.1, target=0.1, horizon=100)
    ctrl.update(0.2, 10)
    assert ctrl.value == pytest.approx(0.102)
    # KL .05: error -.5 -> -.2; beta = .102 * (1 - .02) = .09996
    ctrl.update(0.05, 10)
    assert ctrl.value == pytest.approx(0.09996)
    built = build_kl_controller(AlgorithmConfig(kl_ctrl="adaptive", kl_coef=0.3, kl_target=1.0, kl_horizon=5))
    assert isinstance(built, AdaptiveKLController)
    assert (built.value, built.target, built.horizon) == (0.3, 1.0, 5)
    assert isinstance(build_kl_controller(AlgorithmConfig()), FixedKLController)


def test_topk_from_hidden_matches_the_logits_path():
    torch.manual_seed(11)
    hidden = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, dtype=torch.float64)
    logits = (hidden @ weight.T + bias) / 0.7
    ref_vals, ref_idx = topk_log_probs(logits, 3)
    vals, idx = topk_log_probs_from_hidden(hidden, weight, bias, k=3, temperature=0.7, chunk_size=2)
    assert torch.equal(idx, ref_idx)
    torch.testing.assert_close(vals, ref_vals)
    g_ref = torch.autograd.grad(ref_vals.sum(), (hidden, weight))
    g = torch.autograd.grad(vals.sum(), (hidden, weight))
    torch.testing.assert_close(g[0], g_ref[0])
    torch.testing.assert_close(g[1], g_ref[1])
    again, _ = topk_log_probs_from_hidden(hidden, weight, bias, indices=idx, temperature=0.7)
    torch.testing.assert_close(again, ref_vals)
