"""Replay of what worked (searchr1.trainer.replay): the buffer, the mixing into groups without a success,
and the replayed tokens' importance ratio pi_theta / mu and its clipping against a hand computation."""

from __future__ import annotations

import math

import pytest
import rlworld
import torch

from searchr1.algorithms.aggregation import AggNorms
from searchr1.algorithms.config import AlgorithmConfig
from searchr1.config import ConfigError, load_config
from searchr1.rollout.types import Role, Trajectory
from searchr1.trainer.config import ReplayConfig
from searchr1.trainer.distributed import DistInfo
from searchr1.trainer.experience import Experience
from searchr1.trainer.replay import ReplayBuffer, mix_replay, replay_tensors
from searchr1.trainer.update import MetricSums, UpdateSettings, _actor_loss, _Step


def traj(question: int, tag: int, gid: int = 0, k: int = 0, logprobs: list[float] | None = None) -> Trajectory:
    lp = logprobs or [-0.5, -1.5]
    return Trajectory(
        prompt_ids=[1, 2],
        response_ids=[tag] * len(lp),
        roles=[int(Role.GENERATED)] * len(lp),
        logprobs=list(lp),
        timing={"total_s": 1.0},
        meta={"sample_index": question, "group_id": gid, "sample_in_group": k},
    )


def test_buffer_keeps_the_newest_successes_and_survives_a_round_trip(tmp_path):
    buf = ReplayBuffer(keep_per_question=2, max_age=3)
    for step, tag in ((1, 11), (2, 12), (4, 14)):
        buf.add(7, traj(7, tag), step)
    buf.add(8, traj(8, 20), 2)
    assert len(buf) == 2
    assert [(s, t.response_ids[0]) for s, t in buf.take(7, 5)] == [(4, 14), (2, 12)]  # newest first, 2 kept
    newest = buf.take(7, 1)[0][1]
    assert newest.timing == {} and type(newest.logprobs) is list and type(newest.response_ids) is list
    torch.save(buf.state_dict(), tmp_path / "state.pt")
    again = ReplayBuffer(2, 3)
    again.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert again.state_dict() == buf.state_dict()
    assert again.take(7, 1)[0][1] == buf.take(7, 1)[0][1]
    again.expire(6)  # older than 3 steps at step 6: step 2 entries go, question 8 with them
    assert [s for s, _ in again.take(7, 5)] == [4] and again.take(8, 1) == [] and len(again) == 1


def _batch(groups: int, n: int) -> tuple[list[Trajectory], list[int]]:
    trajs = [traj(100 + g, 0, gid=g, k=k) for g in range(groups) for k in range(n)]
    return trajs, [g for g in range(groups) for _ in range(n)]


def test_groups_without_a_success_take_stored_successes_of_their_question():
    buf = ReplayBuffer(keep_per_question=3)
    stored = traj(101, 77, gid=9, k=2, logprobs=[-0.1, -0.2, -0.3])
    buf.add(101, stored, 4)
    buf.add(101, traj(101, 78, logprobs=[-0.4, -0.5, -0.6]), 5)
    buf.add(100, traj(100, 66), 5)
    trajs, groups = _batch(3, 3)
    totals = [1.0, 0.0, 0.0] + [0.0] * 3 + [0.2] * 3  # group 0 has a success; 1 and 2 none; 2 has no store
    cfg = ReplayConfig(enabled=True, per_group=2, max_share=1.0, min_reward=1.0)
    mixed, rows = mix_replay(trajs, groups, totals, buf, cfg, step=6)
    assert rows == [4, 5]  # group 1's last two fresh trajectories, newest success first
    assert [mixed[r].response_ids[0] for r in rows] == [78, 77]
    assert mixed[5].logprobs == [-0.1, -0.2, -0.3]  # the sampling log-probs travel with it
    assert mixed[5].meta == {"sample_index": 101, "group_id": 1, "sample_in_group": 2, "replayed": True,
                             "replayed_from_step": 4}  # fmt: skip
    assert all(mixed[r] is trajs[r] for r in range(9) if r not in rows)
    assert stored.meta["group_id"] == 9  # the stored copy is untouched
    # the share cap: at most one of nine trajectories
    _, capped = mix_replay(trajs, groups, totals, buf, ReplayConfig(enabled=True, per_group=2, max_share=0.12), 6)
    assert capped == [5]


def test_replayed_rows_carry_their_behaviour_logprobs():
    trajs = [traj(1, 5), traj(1, 6, logprobs=[-0.25, -2.0, -0.5])]
    trajs[1].meta["replayed"] = True
    extras = replay_tensors(trajs, (2, 6))
    assert extras["replayed"].tolist() == [False, True]
    assert extras["behaviour_logprobs"][1].tolist() == [0, 0, -0.25, -2.0, -0.5, 0]
    assert not extras["behaviour_logprobs"][0].any()


def test_replayed_ratio_and_clipping_against_a_hand_computation():
    """Row 0 fresh (on-policy fast path: ratio 1), advantage -1; row 1 replayed, advantage +1, sampled
    by mu with probabilities 0.25, 0.3, 0.5 where the current policy gives 0.5, 0.3, 0.9."""
    log = math.log
    current = torch.tensor([[0.0, log(0.5), log(0.4), 0.0], [0.0, log(0.5), log(0.3), log(0.9)]])
    mu = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, log(0.25), log(0.3), log(0.5)]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    mb = Experience(
        input_ids=torch.ones(2, 4, dtype=torch.long),
        attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),
        train_mask=mask,
        gen_mask=mask,
        group_ids=[0, 0],
        scores=torch.tensor([0.0, 1.0]),
        seq_lens=torch.tensor([3, 4]),
        advantages=torch.tensor([[0, -1.0, -1.0, 0], [0, 1.0, 1.0, 1.0]]),
        extras={"replayed": torch.tensor([False, True]), "behaviour_logprobs": mu},
    )  # old_logprobs None: the on-policy fast path (trainer.on_policy_logprobs)
    algo = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, use_kl_loss=False, loss_agg="token-mean")
    actor = rlworld.FixedLogprobs(current)
    step = _Step(actor, None, None, None, algo,
                 UpdateSettings(1, 1, 2, 0, 1.0, 1.0, True, False, 0), DistInfo(), torch.device("cpu"),
                 False, None)  # fmt: skip
    sums = MetricSums()
    loss = _actor_loss(actor, mb, step, AggNorms(num_tokens=5, num_seqs=2, seq_len=3), sums)
    loss.backward()
    # w = pi / mu = 2.0, 1.0, 1.8 on row 1; l = -A min(w, 1.2) = -1.2, -1.0, -1.2; row 0: -A * 1 = 1, 1
    assert loss.item() == pytest.approx((1 + 1 - 1.2 - 1.0 - 1.2) / 5)
    # gradient -A w / N where the ratio is not clipped, 0 where it is (tokens 1 and 3 of row 1)
    expected_grad = torch.tensor([[0, 0.2, 0.2, 0], [0, 0, -0.2, 0]])
    assert torch.allclose(actor.theta.grad, expected_grad, atol=1e-6)
    metrics = sums.reduce(DistInfo(), torch.device("cpu"))
    assert metrics["replay/ratio_mean"] == pytest.approx((2.0 + 1.0 + 1.8) / 3)
    assert metrics["replay/clipfrac"] == pytest.approx(2 / 3)
    # the same rows with no replay flag would be trained as on-policy: ratio 1, gradient -A / N everywhere
    mb.extras = {}
    actor.theta.grad = None
    _actor_loss(actor, mb, step, AggNorms(num_tokens=5, num_seqs=2, seq_len=3), MetricSums()).backward()
    assert torch.allclose(actor.theta.grad, torch.tensor([[0, 0.2, 0.2, 0], [0, -0.2, -0.2, -0.2]]))


def test_replay_settings_are_checked_with_the_key_named():
    assert not load_config(None, []).replay.enabled
    with pytest.raises(ConfigError, match=r"replay\.per_group=2 with rollout\.n=2"):
        load_config(None, ["replay.enabled=true", "replay.per_group=2", "rollout.n=2"])
    with pytest.raises(ConfigError, match=r"algorithm\.policy_loss=vanilla"):
        load_config(None, ["replay.enabled=true", "rollout.n=4", "algorithm.policy_loss=vanilla"])
    with pytest.raises(ConfigError, match=r"replay\.max_share"):
        load_config(None, ["replay.max_share=0"])
    with pytest.raises(ConfigError, match=r"replay\.keep_per_question"):
        load_config(None, ["replay.keep_per_question=0"])
    with pytest.raises(ConfigError, match=r"unknown config key 'replay\.share'"):
        load_config(None, ["replay.share=0.5"])
