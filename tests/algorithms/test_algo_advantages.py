"""Advantage estimators on small hand-computed cases (numbers derived in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.algorithms.advantages import (
    compute_advantages,
    gae,
    group_index,
    grpo,
    reinforce,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
    scores_to_token_rewards,
    sequence_scores,
)
from searchr1.algorithms.config import AlgorithmConfig

ALL_ONES_2 = torch.ones(1, 2, dtype=torch.long)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def per_seq(adv: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """The single value each row holds on its generated tokens (checked constant)."""
    out = []
    for row, m in zip(adv, mask.bool(), strict=True):
        vals = row[m]
        assert torch.allclose(vals, vals[0].expand_as(vals)), "outcome advantage not constant over a row"
        out.append(float(vals[0]))
    return out


def test_gae_full_mask_hand_computed():
    # gamma=1, lam=0.5, V=[.5,.5,.5], r=[0,0,1]
    # t=2: delta=1+0-.5=.5, A2=.5 ; t=1: delta=0+.5-.5=0, A1=0+.5*.5=.25 ; t=0: A0=0+.5*.25=.125
    # returns = A + V = [.625, .75, 1.0]
    cfg = AlgorithmConfig(
        gamma=1.0, lam=0.5, gae_whiten=False
    )  # the raw recursion (whitening: test_gae_whitening)
    mask = torch.ones(1, 3, dtype=torch.long)
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), mask, config=cfg, values=torch.tensor([[0.5, 0.5, 0.5]]))
    close(adv, [[0.125, 0.25, 0.5]])
    close(ret, [[0.625, 0.75, 1.0]])


def test_gae_skips_observation_tokens():
    # mask [1,0,1]: the observation token (value 9, reward 7) is not a step.
    # gamma=.5, lam=1, V0=.2, V2=.5, r2=1: t=2: delta=1-.5=.5, A2=.5
    # t=0: next value is V2: delta=0+.5*.5-.2=.05, A0=.05+.5*1*.5=.3 (= gamma*1 - V0)
    cfg = AlgorithmConfig(gamma=0.5, lam=1.0, gae_whiten=False)
    mask = torch.tensor([[1, 0, 1]])
    adv, ret = gae(torch.tensor([[0.0, 7.0, 1.0]]), mask, config=cfg, values=torch.tensor([[0.2, 9.0, 0.5]]))
    close(adv, [[0.3, 0.0, 0.5]])
    close(ret, [[0.5, 0.0, 1.0]])


def test_gae_scalar_score_goes_on_last_generated_token():
    # score 1 on the last generated token (index 1); gamma=lam=1, V=0 -> A = reward-to-go = [1, 1, 0]
    mask = torch.tensor([[1, 1, 0]])
    adv, _ = gae(
        torch.tensor([1.0]), mask, config=AlgorithmConfig(gae_whiten=False), values=torch.zeros(1, 3)
    )
    assert adv.tolist() == [[1.0, 1.0, 0.0]]


def test_gae_needs_values():
    with pytest.raises(ValueError, match="values"):
        gae(torch.tensor([1.0]), ALL_ONES_2)


def test_grpo_hand_computed():
    # scores [1,0,0,1], one group: mean .5, unbiased var = 4*.25/3 = 1/3, std = .57735
    # A = +-.5/.57735 = +-sqrt(3)/2 = +-.866025
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    adv, ret = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, group_ids=["q"] * 4)
    s = math.sqrt(3) / 2
    assert per_seq(adv, mask) == pytest.approx([s, -s, -s, s], rel=1e-5)
    assert (adv[mask == 0] == 0).all()
    assert torch.equal(adv, ret)


def test_grpo_groups_constant_groups_and_singletons():
    # group a: [1,0] -> mean .5, std sqrt(.5)=.7071 -> +-.7071; group b: [2,2,2] -> 0; group c: [3] -> 3
    mask = torch.ones(6, 2, dtype=torch.long)
    scores = torch.tensor([1.0, 0.0, 2.0, 2.0, 2.0, 3.0])
    adv, _ = grpo(scores, mask, group_ids=["a", "a", "b", "b", "b", "c"])
    r = math.sqrt(0.5)
    assert per_seq(adv, mask) == pytest.approx([r, -r, 0, 0, 0, 3.0], rel=1e-5)


def test_dr_grpo_skips_std_division():
    # Dr. GRPO: A = s - mean = [.5, -.5, -.5, .5]
    adv, _ = grpo(
        torch.tensor([1.0, 0.0, 0.0, 1.0]),
        torch.ones(4, 1),
        group_ids=[7, 7, 7, 7],
        config=AlgorithmConfig(norm_adv_by_std=False),
    )
    assert adv.squeeze(-1).tolist() == [0.5, -0.5, -0.5, 0.5]


def test_token_rewards_are_summed_into_the_sequence_score():
    # row 0 tokens: .25 + .75 = 1 (masked 5 ignored); row 1: 0 -> same as scores [1, 0]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rewards = torch.tensor([[0.25, 0.75, 5.0], [0.0, 0.0, 0.0]])
    assert sequence_scores(rewards, mask).tolist() == [1.0, 0.0]
    a1, _ = grpo(rewards, mask, group_ids=[0, 0])
    a2, _ = grpo(torch.tensor([1.0, 0.0]), mask, group_ids=[0, 0])
    assert torch.allclose(a1, a2)


def test_rloo_hand_computed():
    # group [1,2,6]: A0 = 1-(2+6)/2 = -3; A1 = 2-(1+6)/2 = -1.5; A2 = 6-(1+2)/2 = 4.5; singleton [4] -> 4
    mask = torch.ones(4, 1)
    adv, _ = rloo(torch.tensor([1.0, 2.0, 6.0, 4.0]), mask, group_ids=torch.tensor([5, 5, 5, 9]))
    assert adv.squeeze(-1).tolist() == pytest.approx([-3.0, -1.5, 4.5, 4.0])


def test_reinforce_baselines():
    mask = torch.ones(2, 1)
    scores = torch.tensor([1.0, 3.0])
    none, _ = reinforce(scores, mask)
    assert none.squeeze(-1).tolist() == [1.0, 3.0]
    batch, _ = reinforce(scores, mask, config=AlgorithmConfig(reinforce_baseline="batch_mean"))
    assert batch.squeeze(-1).tolist() == [-1.0, 1.0]  # mean 2
    cfg = AlgorithmConfig(reinforce_baseline="running_mean", reinforce_baseline_momentum=0.5)
    state: dict = {}
    # first batch: baseline 0 -> A = scores; then b = .5*0 + .5*2 = 1
    first, _ = reinforce(scores, mask, config=cfg, state=state)
    assert first.squeeze(-1).tolist() == [1.0, 3.0]
    assert state["reinforce_baseline"] == pytest.approx(1.0)
    # second batch [2,2]: A = 2 - 1 = 1; then b = .5*1 + .5*2 = 1.5
    second, _ = reinforce(torch.tensor([2.0, 2.0]), mask, config=cfg, state=state)
    assert second.squeeze(-1).tolist() == [1.0, 1.0]
    assert state["reinforce_baseline"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="state"):
        reinforce(scores, mask, config=cfg)


def test_reinforce_plus_plus_hand_computed():
    # scores [1, 2] on the last generated tokens: rewards [[0,1],[2,-]], gamma .5
    # returns: row0 [.5, 1], row1 [2]; over tokens {.5,1,2}: mean 7/6, unbiased var 7/12, std .763763
    # A = (G - 7/6) / .763763 = [-.872872, -.218218, 1.091089]
    mask = torch.tensor([[1, 1], [1, 0]])
    adv, ret = reinforce_plus_plus(torch.tensor([1.0, 2.0]), mask, config=AlgorithmConfig(gamma=0.5))
    close(ret, [[0.5, 1.0], [2.0, 0.0]])
    close(adv, [[-0.872872, -0.218218], [1.091089, 0.0]], atol=1e-5)


def test_reinforce_plus_plus_folds_in_token_level_kl():
    # token rewards with a KL penalty: [-.1, 1-.1] and gamma 1 -> G = [.8, .9]; 2 tokens: mean .85,
    # unbiased var = 2*.05^2/1 = .005, std .0707107 -> A = [-.707107, .707107]
    mask = torch.ones(1, 2)
    adv, ret = reinforce_plus_plus(torch.tensor([[-0.1, 0.9]]), mask)
    close(ret, [[0.8, 0.9]])
    close(adv, [[-0.707107, 0.707107]], atol=1e-4)


def test_reinforce_plus_plus_baseline_hand_computed():
    # scores [1,3 | 5], groups a,a,b -> centred [-1, 1, 5] (singleton keeps its score), 2 tokens each
    # tokens {-1,-1,1,1,5,5}: mean 5/3; squared deviations sum = 2*(64/9 + 4/9 + 100/9) = 336/9;
    # unbiased var = 336/45 = 7.466667, std 2.732520 -> A = [-.975900, -.243975, 1.219875]
    mask = torch.ones(3, 2)
    adv, ret = reinforce_plus_plus_baseline(torch.tensor([1.0, 3.0, 5.0]), mask, group_ids=["a", "a", "b"])
    assert per_seq(adv, mask) == pytest.approx([-0.975900, -0.243975, 1.219875], abs=1e-5)
    assert per_seq(ret, mask) == [1.0, 3.0, 5.0]


def test_group_estimators_need_matching_group_ids():
    for fn in (grpo, rloo, reinforce_plus_plus_baseline):
        with pytest.raises(ValueError, match="group_ids"):
            fn(torch.tensor([1.0, 2.0]), torch.ones(2, 1))
        with pytest.raises(ValueError, match="2 samples"):
            fn(torch.tensor([1.0, 2.0]), torch.ones(2, 1), group_ids=[0, 0, 1])


def test_group_index_and_score_placement():
    assert group_index(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]
    assert group_index(torch.tensor([10, 3, 10])).tolist() == [1, 0, 1]
    # last generated tokens at 1 and 2; an all-masked row gets nothing
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
    placed = scores_to_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert placed.tolist() == [[0, 2, 0, 0], [0, 0, 3, 0], [0, 0, 0, 0]]


def test_compute_advantages_dispatches_by_name_and_rejects_unknown():
    mask = torch.ones(2, 1)
    adv, _ = compute_advantages(
        torch.tensor([1.0, 2.0]), mask, AlgorithmConfig(advantage="rloo"), group_ids=[0, 0]
    )
    assert adv.squeeze(-1).tolist() == [-1.0, 1.0]  # 1-2, 2-1
    with pytest.raises(ValueError, match=r"algorithm\.advantage.*nope"):
        compute_advantages(torch.tensor([1.0]), torch.ones(1, 1), AlgorithmConfig(advantage="nope"))


def test_float64_is_preserved():
    adv, _ = grpo(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.ones(2, 1), group_ids=[0, 0])
    assert adv.dtype == torch.float64
