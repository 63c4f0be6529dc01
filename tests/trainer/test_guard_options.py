"""Options that guard a run: algorithm.filter_groups, trainer.keep_best (with --export --best), LLDS,
and validation reading answers as the reward and the evaluation do."""

from __future__ import annotations

import pytest
import rlworld
import torch

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.policy_losses import llds_loss
from searchr1.trainer import checkpoint
from searchr1.trainer.experience import rows_with_signal
from searchr1.trainer.loop import RLTrainer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


def test_rows_with_signal_keeps_signal_groups_and_pads_to_whole_shares():
    scores = [0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0]
    groups = [g for g in range(4) for _ in range(4)]
    assert rows_with_signal(scores, groups) == [0, 1, 2, 3, 12, 13, 14, 15]
    assert rows_with_signal(scores, groups, multiple=4) == list(range(16))  # 2 signal + 2 flat
    three = rows_with_signal(scores, groups, multiple=3)
    assert {0, 12} <= set(three) and len(three) == 12  # 2 signal groups + the first flat one
    assert rows_with_signal([1.0] * 8, [0] * 4 + [1] * 4) == []


def test_filter_groups_skips_a_step_without_signal(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run",
        reward__components={"rlworld:constant_reward": 1.0}, algorithm__filter_groups=True,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
    trainer.train()
    assert all(torch.equal(before[k], v) for k, v in trainer.policy.named_parameters())
    rows = rlworld.read_metrics(tmp_path / "run")
    assert [r["rollout/flat_groups"] for r in rows] == [1.0, 1.0]
    assert [r["actor/updated"] for r in rows] == [0.0, 0.0] and "actor/pg_loss" not in rows[0]


def test_filter_groups_trains_on_the_groups_with_signal(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run",
        reward__components={"rlworld:token_set_reward": 1.0}, algorithm__filter_groups=True,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
    trainer.train()
    rows = rlworld.read_metrics(tmp_path / "run")
    assert any(not torch.equal(before[k], v) for k, v in trainer.policy.named_parameters())
    for r in rows:
        assert 0.0 < r["actor/trained_share"] <= 1.0
        assert r["actor/trained_share"] == pytest.approx(1.0 - r["rollout/flat_groups"])  # one group a share


def test_filter_groups_is_refused_with_a_critic_baseline():
    from searchr1.config import load_config

    load_config(None, ["algorithm.advantage=grpo", "algorithm.filter_groups=true"])  # a group baseline: fine
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups"):
        load_config(None, ["algorithm.advantage=gae", "algorithm.filter_groups=true"])


def test_keep_best_keeps_the_best_validation_and_exports_it(world, tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = rlworld.load(
        world, tiny_model_dir, run,
        reward__components={"rlworld:token_set_reward": 1.0},
        trainer__total_steps=3, trainer__val_every=1, trainer__keep_best="val_em",
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    summary = trainer.train()
    rows = rlworld.read_metrics(run)
    ems = [r["val/em"] for r in rows]
    best_step = 1 + ems.index(max(ems))  # ties keep the earlier step
    _, info = checkpoint.best_checkpoint(run)
    assert info == {"step": best_step, "em": max(ems)} == summary["best"]
    assert rows[best_step - 1]["val/best_em"] == max(ems)
    out, origin = checkpoint.export_policy(run, tmp_path / "export", best=True)
    assert f"step {best_step}" in origin
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out) is not None
    with pytest.raises(FileExistsError):
        checkpoint.export_policy(run, tmp_path / "export", best=True)
    latest, origin = checkpoint.export_policy(run, tmp_path / "latest")
    assert "step_000003" in origin and (latest / "config.json").is_file()


def test_export_best_without_a_kept_best_names_the_option(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"trainer\.keep_best=val_em"):
        checkpoint.export_policy(tmp_path, tmp_path / "out", best=True)


def test_keep_best_needs_validation(world, tiny_model_dir, tmp_path):
    from searchr1.config import ConfigError

    with pytest.raises((ValueError, ConfigError), match="val_every"):
        rlworld.load(world, tiny_model_dir, tmp_path / "run", trainer__keep_best="val_em")


def test_llds_against_a_hand_computation():
    """Two responses of three generated tokens; the first lost likelihood overall, the second gained."""
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    new = torch.tensor([[-1.5, -1.8, -0.9, -9.0], [-0.5, -1.2, -0.8, -1.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    cfg = AlgorithmConfig(llds_coef=1.0, loss_agg="token-mean")
    loss = llds_loss(new, old, adv, mask, config=cfg)
    # response 1: drops (0.5, -0.2, 0.4) sum 0.7 > 0 -> gated in; tokens that fell: 0.5 + 0.4
    # response 2: drops (-0.5, 0.2, -0.2) sum -0.5 -> out. token-mean over 6 tokens
    assert float(loss) == pytest.approx((0.5 + 0.4) / 6)
    loss.backward()
    expected = torch.zeros(2, 4)
    expected[0, 0] = expected[0, 2] = -1 / 6  # raising these log-probs lowers the loss
    torch.testing.assert_close(new.grad, expected)
    # a negative advantage switches it off (positive_only), a threshold above the drop too
    assert float(llds_loss(new, old, -adv, mask, config=cfg)) == 0.0
    high = AlgorithmConfig(llds_coef=1.0, llds_threshold=0.8)
    assert float(llds_loss(new, old, adv, mask, config=high)) == 0.0
    # on-policy (old = new) it is exactly zero
    assert float(llds_loss(new, new.detach(), adv, mask, config=cfg)) == 0.0


def test_llds_in_an_update_with_two_epochs(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run",
        reward__components={"rlworld:token_set_reward": 1.0},
        algorithm__llds_coef=1.0, algorithm__llds_positive_only=False, trainer__ppo_epochs=2,
    )  # fmt: skip
    RLTrainer(cfg).train()
    rows = rlworld.read_metrics(tmp_path / "run")
    assert all(r["actor/llds_loss"] >= 0.0 for r in rows)
    assert any(r["actor/llds_loss"] > 0.0 for r in rows)  # the second epoch sees a moved policy


def test_stop_without_signal_ends_a_run_that_cannot_learn(world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run",
        reward__components={"rlworld:constant_reward": 1.0}, algorithm__filter_groups=True,
        trainer__total_steps=6, trainer__stop_without_signal=2,
    )  # fmt: skip
    summary = RLTrainer(cfg).train()
    assert summary["step"] == 2 and summary["stopped_without_signal"] == 2 and summary["updates"] == 0
    assert checkpoint.latest_checkpoint(tmp_path / "run").name == "step_000002"
