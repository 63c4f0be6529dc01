"""Step advantages (searchr1.algorithms.step_credit) against hand computations: the GRPO step advantage
beside the group's outcome advantage, and the step reward as a token reward under GAE."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.algorithms.advantages import compute_advantages
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.step_credit import advantages_with_step_credit, step_tensors
from searchr1.rewards.steps import SearchTurn, StepCredit


def _turns(layout: list[list[tuple[int, int, float]]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(step rewards, turn ids) ``[B, width]`` from ``[(start, end, s), ...]`` per row."""
    credits = [StepCredit([SearchTurn((a, b), s) for a, b, s in row], "ids") for row in layout]
    return step_tensors(credits, [0] * len(layout), (len(layout), width))


def test_step_tensors_place_each_turn_after_the_prompt():
    credits = [
        StepCredit([SearchTurn((0, 2), 0.5), SearchTurn((4, 5), -0.25), SearchTurn(None, 1.0)], "ids"),
        StepCredit([SearchTurn((0, 3), 0.7)], ""),  # unscored: left out
    ]
    rewards, turns = step_tensors(credits, [3, 1], (2, 10))
    assert turns[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 2, 0, 0]
    assert rewards[0].tolist() == [0, 0, 0, 0.5, 0.5, 0, 0, -0.25, 0, 0]
    assert not turns[1].any() and not rewards[1].any()


# rows: prompt at position 0; row 0 has two search turns, row 1 one, row 2 (a group of its own) one
MASK = torch.tensor(
    [
        [0, 1, 1, 0, 1, 1, 0, 1],  # turn 1 at 1-2, observation 3, turn 2 at 4-5, observation 6, answer 7
        [0, 1, 1, 1, 0, 0, 1, 1],  # turn 1 at 1-3, observation 4-5, answer 6-7
        [0, 1, 1, 0, 1, 1, 1, 1],  # turn 1 at 1-2, observation 3, answer 4-7
    ],
    dtype=torch.bool,
)
LAYOUT = [[(1, 3, 0.5), (4, 6, -0.2)], [(1, 4, 0.0)], [(1, 3, 0.3)]]
SCORES = torch.tensor([1.0, 0.0, 1.0])
GROUPS = [0, 0, 1]


def test_grpo_step_advantage_beside_the_outcome_advantage():
    step_r, step_t = _turns(LAYOUT, 8)
    cfg = AlgorithmConfig(advantage="grpo", step_credit_coef=0.5)
    adv, _ = advantages_with_step_credit(
        SCORES, MASK, cfg, group_ids=GROUPS, step_rewards=step_r, step_turns=step_t
    )
    # outcome (group 0): scores 1, 0 -> mean 0.5, unbiased std sqrt(0.5) -> +-0.70711; group 1 of one -> 1
    a = 0.5 / math.sqrt(0.5)
    # steps (group 0): 0.5, -0.2, 0.0 -> mean 0.1, unbiased std sqrt(0.13) = 0.36056
    s = math.sqrt((0.4**2 + 0.3**2 + 0.1**2) / 2)
    t1, t2, t3 = 0.4 / s, -0.3 / s, -0.1 / s  # 1.10940, -0.83205, -0.27735
    expected = torch.tensor(
        [
            [0, a + 0.5 * t1, a + 0.5 * t1, 0, a + 0.5 * t2, a + 0.5 * t2, 0, a],
            [0, -a + 0.5 * t3, -a + 0.5 * t3, -a + 0.5 * t3, 0, 0, -a, -a],
            [0, 1, 1, 0, 1, 1, 1, 1],  # one search turn in its group: no step advantage
        ]
    )
    assert torch.allclose(adv.float(), expected, atol=1e-5)
    assert adv[0, 1].item() == pytest.approx(1.26181, abs=1e-5)


def test_dr_grpo_step_advantage_is_not_divided_by_the_std():
    step_r, step_t = _turns(LAYOUT, 8)
    cfg = AlgorithmConfig(advantage="grpo", norm_adv_by_std=False, step_credit_coef=1.0)
    adv, _ = advantages_with_step_credit(
        SCORES, MASK, cfg, group_ids=GROUPS, step_rewards=step_r, step_turns=step_t
    )
    assert adv[0].tolist() == pytest.approx([0, 0.9, 0.9, 0, 0.2, 0.2, 0, 0.5])
    assert adv[1].tolist() == pytest.approx([0, -0.6, -0.6, -0.6, 0, 0, -0.5, -0.5])


def test_without_step_rewards_it_is_the_outcome_estimator():
    cfg = AlgorithmConfig(advantage="grpo")
    adv, ret = advantages_with_step_credit(SCORES, MASK, cfg, group_ids=GROUPS)
    ref_adv, ref_ret = compute_advantages(SCORES, MASK, cfg, group_ids=GROUPS)
    assert torch.equal(adv, ref_adv) and torch.equal(ret, ref_ret)
    # equal step rewards across the group's turns carry no step advantage
    flat_r, flat_t = _turns([[(1, 3, 0.4), (4, 6, 0.4)], [(1, 4, 0.4)], [(1, 3, 0.4)]], 8)
    same, _ = advantages_with_step_credit(SCORES, MASK, cfg, group_ids=GROUPS, step_rewards=flat_r,
                                          step_turns=flat_t)  # fmt: skip
    assert torch.allclose(same, ref_adv)


# one row without a prompt: turn 1 (search) at 0-1, observation 2-3, answer turn at 4-5
GAE_MASK = torch.tensor([[1, 1, 0, 0, 1, 1]], dtype=torch.bool)
VALUES = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3, 0.4]])  # observation values are never read


@pytest.mark.parametrize("coef", [1.0, 2.0])
def test_gae_step_reward_on_the_turns_last_token(coef):
    step_r, step_t = _turns([[(0, 2, 0.5)]], 6)
    cfg = AlgorithmConfig(advantage="gae", gamma=0.9, lam=0.8, gae_whiten=False, step_credit_coef=coef)
    adv, ret = advantages_with_step_credit(
        torch.tensor([1.0]), GAE_MASK, cfg, group_ids=[0], values=VALUES, step_rewards=step_r, step_turns=step_t
    )
    # r = [0, 0.5c, -, -, 0, 1]; delta_t = r_t + 0.9 V_next - V_t (observations skipped); A_t = delta_t + 0.72 A_next
    a5 = 1.0 - 0.4  # 0.6
    a4 = (0.9 * 0.4 - 0.3) + 0.72 * a5  # 0.492
    a1 = (0.5 * coef + 0.9 * 0.3 - 0.2) + 0.72 * a4  # 0.92424 for c = 1
    a0 = (0.9 * 0.2 - 0.1) + 0.72 * a1  # 0.7454528 for c = 1
    assert adv[0].tolist() == pytest.approx([a0, a1, 0, 0, a4, a5], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([a0 + 0.1, a1 + 0.2, 0, 0, a4 + 0.3, a5 + 0.4], abs=1e-6)
    if coef == 1.0:
        assert a0 == pytest.approx(0.7454528) and a1 == pytest.approx(0.92424)


def test_reinforce_plus_plus_returns_carry_the_step_reward_back():
    step_r, step_t = _turns([[(0, 2, 0.5)]], 6)
    cfg = AlgorithmConfig(advantage="reinforce_plus_plus", gamma=1.0)
    _, ret = advantages_with_step_credit(
        torch.tensor([1.0]), GAE_MASK, cfg, group_ids=[0], step_rewards=step_r, step_turns=step_t
    )
    assert ret[0].tolist() == pytest.approx([1.5, 1.5, 0, 0, 1.0, 1.0])


def test_step_credit_coef_is_validated():
    with pytest.raises(ValueError, match=r"algorithm\.step_credit_coef"):
        AlgorithmConfig(step_credit_coef=-0.1).validate()
