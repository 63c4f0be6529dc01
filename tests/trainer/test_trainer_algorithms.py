"""Each algorithm family runs a few steps end to end on a tiny model: the weights move, the metrics
are logged under their namespaces, and the checkpoint is a Hugging Face folder."""

from __future__ import annotations

import math

import pytest
import rlworld
import torch

from searchr1.trainer.loop import RLTrainer

ALGORITHMS = {
    "ppo": {"algorithm__advantage": "gae", "rollout__n": 1, "algorithm__use_kl_loss": False,
            "algorithm__use_kl_in_reward": True, "trainer__batch_size": 4, "trainer__mini_batch_size": 2},
    "grpo": {"algorithm__advantage": "grpo"},
    "rloo": {"algorithm__advantage": "rloo"},
    "reinforce": {"algorithm__advantage": "reinforce", "algorithm__policy_loss": "vanilla",
                  "algorithm__reinforce_baseline": "running_mean"},
    "reinforce_plus_plus": {"algorithm__advantage": "reinforce_plus_plus", "algorithm__use_kl_loss": False,
                            "algorithm__use_kl_in_reward": True},
}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_algorithm_runs_and_updates(name, world, tiny_model_dir, tmp_path):
    cfg = rlworld.load(
        world,
        tiny_model_dir,
        tmp_path / "run",
        reward__components={"rlworld:token_set_reward": 1.0},
        **ALGORITHMS[name],
    )
    trainer = RLTrainer(cfg)
    trainer.setup()
    before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
    summary = trainer.train()
    assert summary["step"] == 2
    moved = sum(not torch.equal(before[k], v) for k, v in trainer.policy.named_parameters())
    assert moved > 0, "no parameter changed"
    rows = rlworld.read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "reward/rlworld:token_set_reward", "rollout/searches", "actor/entropy",
                "actor/clipfrac", "actor/grad_norm", "timing/rollout", "timing/update"):  # fmt: skip
        assert key in rows[-1], key
        assert math.isfinite(rows[-1][key])
    if name == "ppo":
        assert "critic/vf_loss" in rows[-1] and rows[-1]["critic/grad_norm"] > 0
        assert (tmp_path / "run/checkpoints/step_000002/critic").is_dir()
    else:
        assert not any(k.startswith("critic/") for k in rows[-1])
    # the checkpoint's model folder loads unchanged and holds the trained weights
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(summary["checkpoint"] + "/model")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, trainer.policy.state_dict()[key]), key
