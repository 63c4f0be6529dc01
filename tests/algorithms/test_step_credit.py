"""Step advantages (searchr1.algorithms.step_credit) against hand computations: the GRPO step advantage
beside the group's outcome advantage, and the step reward as a token reward under GAE."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.algorithms.advantages import compute_advantages
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.step_credit import (
    advantages_with_step_credit,
    group_step_advantages,
    step_signal_groups,
    step_tensors,
)
from searchr1.rewards.config import RewardConfig
from searchr1.rewards.steps import SearchTurn, StepCredit, step_credit
from searchr1.rollout.types import Role, Trajectory
from searchr1.trainer.experience import rows_with_signal


def _turns(
    layout: list[list[tuple[int, int, float]]], width: int, stops: list[tuple[int, int] | None] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(step rewards, turn ids) ``[B, width]`` from ``[(start, end, s), ...]`` per row and each row's stop
    span (what it did instead of one more search)."""
    stops = stops or [None] * len(layout)
    credits = [
        StepCredit([SearchTurn((a, b), s) for a, b, s in row], "ids", stop)
        for row, stop in zip(layout, stops, strict=True)
    ]
    return step_tensors(credits, [0] * len(layout), (len(layout), width))


def test_step_tensors_place_each_turn_after_the_prompt():
    credits = [
        StepCredit([SearchTurn((0, 2), 0.5), SearchTurn((4, 5), -0.25)], "ids", (6, 7)),
        StepCredit([SearchTurn((0, 3), 0.7)], "", (3, 5)),  # unscored: left out
        StepCredit([SearchTurn((0, 2), 0.5), SearchTurn(None, 1.0)], "ids", (4, 6)),  # a turn not found
    ]
    rewards, turns = step_tensors(credits, [3, 1, 0], (3, 10))
    assert turns[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 2, 0, -3]  # the stop span after search 2: position 3
    assert rewards[0].tolist() == [0, 0, 0, 0.5, 0.5, 0, 0, -0.25, 0, 0]
    assert not turns[1].any() and not rewards[1].any()
    assert turns[2].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]  # no stop span where a turn is unknown


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
STOPS = [(6, 8), (4, 8), (3, 8)]  # from the end of the last search turn to the end
SCORES = torch.tensor([1.0, 0.0, 1.0])
GROUPS = [0, 0, 1]


def test_grpo_step_advantage_per_search_position_beside_the_outcome_advantage():
    step_r, step_t = _turns(LAYOUT, 8, STOPS)
    cfg = AlgorithmConfig(advantage="grpo", step_credit_coef=0.5)
    adv, _ = advantages_with_step_credit(
        SCORES, MASK, cfg, group_ids=GROUPS, step_rewards=step_r, step_turns=step_t
    )
    # outcome (group 0): scores 1, 0 -> mean 0.5, unbiased std sqrt(0.5) -> +-0.70711; group 1 of one -> 1
    a = 0.5 / math.sqrt(0.5)
    # position 1 (group 0): 0.5, 0.0 -> centred +-0.25, std sqrt(0.125) -> +-0.70711
    # position 2: row 0 searched (-0.2), row 1 stopped (0) -> centred -0.1, +0.1, std sqrt(0.02) -> -+0.70711,
    # row 1's on its stop span (its answer turn); row 0's stop span is position 3, where nobody searched
    p = 0.70711
    expected = torch.tensor(
        [
            [0, a + 0.5 * p, a + 0.5 * p, 0, a - 0.5 * p, a - 0.5 * p, 0, a],
            [0, -a - 0.5 * p, -a - 0.5 * p, -a - 0.5 * p, 0, 0, -a + 0.5 * p, -a + 0.5 * p],
            [0, 1, 1, 0, 1, 1, 1, 1],  # the only trajectory of its group: no step advantage
        ]
    )
    assert torch.allclose(adv.float(), expected, atol=1e-5)


def test_dr_grpo_step_advantage_is_not_divided_by_the_std():
    step_r, step_t = _turns(LAYOUT, 8, STOPS)
    cfg = AlgorithmConfig(advantage="grpo", norm_adv_by_std=False, step_credit_coef=1.0)
    adv, _ = advantages_with_step_credit(
        SCORES, MASK, cfg, group_ids=GROUPS, step_rewards=step_r, step_turns=step_t
    )
    assert adv[0].tolist() == pytest.approx([0, 0.75, 0.75, 0, 0.4, 0.4, 0, 0.5])
    assert adv[1].tolist() == pytest.approx([0, -0.75, -0.75, -0.75, 0, 0, -0.4, -0.4])


def test_without_step_rewards_it_is_the_outcome_estimator():
    cfg = AlgorithmConfig(advantage="grpo")
    adv, ret = advantages_with_step_credit(SCORES, MASK, cfg, group_ids=GROUPS)
    ref_adv, ref_ret = compute_advantages(SCORES, MASK, cfg, group_ids=GROUPS)
    assert torch.equal(adv, ref_adv) and torch.equal(ret, ref_ret)
    # equal step rewards at every position (a second search that found nothing against stopping) carry none
    flat_r, flat_t = _turns([[(1, 3, 0.4), (4, 6, 0.0)], [(1, 4, 0.4)], [(1, 3, 0.4)]], 8, STOPS)
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
        torch.tensor([1.0]),
        GAE_MASK,
        cfg,
        group_ids=[0],
        values=VALUES,
        step_rewards=step_r,
        step_turns=step_t,
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


def _trajectory(turn_docs: list[list[str]]) -> Trajectory:
    """Search turns of 2 generated tokens, each followed by a 1-token observation, then a 2-token answer;
    ``turn_docs[k]``: the ids turn k retrieved. Gold passages: ``a`` and ``b``."""
    response, roles, spans = [], [], []
    for _ in turn_docs:
        spans.append([len(response), len(response) + 2])
        response += [5, 6, 7]
        roles += [Role.GENERATED, Role.GENERATED, Role.OBSERVATION]
    response += [8, 9]
    roles += [Role.GENERATED, Role.GENERATED]
    return Trajectory(
        prompt_ids=[1],
        response_ids=response,
        roles=[int(r) for r in roles],
        logprobs=[0.0] * len(response),
        searches=len(turn_docs),
        documents=[[{"id": i} for i in ids] for ids in turn_docs],
        search_spans=spans,
        meta={"supporting_ids": ["a", "b"], "golden_answers": ["x"]},
    )


def test_a_second_search_that_finds_hop_2_earns_more_than_stopping_and_a_repeat_less():
    """Four trajectories of one two-hop question, each finding hop 1 first (gain 0.5 -> 0.25 a gold
    passage): A then finds hop 2, B stops, C repeats its first search, D finds an unrelated passage."""
    cfg = RewardConfig(step_gain=0.5, step_redundancy=0.1)
    trajs = [_trajectory(d) for d in ([["a"], ["b"]], [["a"]], [["a"], ["a"]], [["a"], ["z"]])]
    credits = [step_credit(t, cfg) for t in trajs]
    assert [[turn.reward for turn in c.turns] for c in credits] == [
        [0.25, 0.25],
        [0.25],
        [0.25, -0.1],
        [0.25, 0.0],
    ]
    width = 1 + max(len(t.response_ids) for t in trajs)
    rewards, turns = step_tensors(credits, [1] * 4, (4, width))
    adv = group_step_advantages(rewards, turns, [0, 0, 0, 0], norm_by_std=False)
    # position 1: all 0.25 -> 0. Position 2: 0.25, 0 (stopped), -0.1, 0 -> mean 0.0375
    hop2, stop, repeat, nothing_new = adv[0, 4].item(), adv[1, 4].item(), adv[2, 4].item(), adv[3, 4].item()
    assert hop2 == pytest.approx(0.2125) and stop == pytest.approx(-0.0375)
    assert repeat == pytest.approx(-0.1375) and nothing_new == pytest.approx(-0.0375)
    assert hop2 > stop == nothing_new > repeat
    assert adv[:, 1:3].abs().max().item() == 0.0  # the first searches compare equal
    assert adv[1, 4:].tolist() == pytest.approx([-0.0375] * 2 + [0.0] * (width - 6))  # B's answer turn
    # the stop spans of A, C and D are position 3, where nobody searched: no step advantage there
    assert adv[0, 8:].abs().max().item() == 0.0


def test_groups_kept_by_the_filter_for_their_step_signal_alone():
    """Three groups of two, every outcome equal within groups 0 and 1: group 0's two trajectories made the
    same decisions (no signal: dropped), group 1's differ at the second search (kept), group 2's outcomes
    differ (kept whatever its steps)."""
    layout = [
        [(1, 3, 0.5)],
        [(1, 3, 0.5)],
        [(1, 3, 0.25), (4, 6, 0.25)],
        [(1, 3, 0.25)],
        [(1, 3, 0.5)],
        [(1, 3, 0.5)],
    ]
    stops = [(3, 8), (3, 8), (6, 8), (3, 8), (3, 8), (3, 8)]
    rewards, turns = _turns(layout, 8, stops)
    groups = [0, 0, 1, 1, 2, 2]
    assert step_signal_groups(rewards, turns, groups) == {1}
    scores = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert rows_with_signal(scores, groups) == [4, 5]
    assert rows_with_signal(scores, groups, signal_groups=step_signal_groups(rewards, turns, groups)) == [
        2,
        3,
        4,
        5,
    ]
