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
            "algorithm__use_kl_in_reward": True, "trainer__batch_size": 4, "trainer__mini_batch_size": 2,
            "trainer__critic_warmup_steps": 1},
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
        # critic warm-up: step 1 trains the critic only, step 2 both
        assert [r["actor/updated"] for r in rows] == [0.0, 1.0]
        assert "actor/pg_loss" not in rows[0] and "critic/vf_loss" in rows[0]
        assert (tmp_path / "run/checkpoints/step_000002/critic").is_dir()
    else:
        assert not any(k.startswith("critic/") for k in rows[-1])
    # the checkpoint's model folder loads unchanged and holds the trained weights
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(summary["checkpoint"] + "/model")
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, trainer.policy.state_dict()[key]), key


def test_ema_reference_with_topk_reverse_kl(world, tiny_model_dir, tmp_path):
    """The EMA-PG setting: the reference follows the policy by EMA, the KL is a top-k reverse KL."""
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run",
        reward__components={"rlworld:token_set_reward": 1.0},
        algorithm__kl_coef=0.5, algorithm__kl_loss_type="full_reverse", algorithm__kl_topk_tokens=8,
        algorithm__use_kl_iw=True, algorithm__ref_policy="ema", algorithm__ref_policy_ema_tau=0.5,
        algorithm__ref_policy_ema_update_period=2, trainer__total_steps=3,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    initial = {k: v.clone() for k, v in trainer.reference.state_dict().items()}
    trainer.train()
    rows = rlworld.read_metrics(tmp_path / "run")
    assert all(math.isfinite(r["actor/kl_loss"]) for r in rows)
    # the first step's policy is its reference (KL exactly 0); after a step it has moved away. The
    # top-k estimate (a partial sum over S plus a one-sample tail) may be of either sign in a batch.
    assert rows[0]["actor/kl_loss"] == 0.0 and rows[1]["actor/kl_loss"] != 0.0
    assert [r.get("actor/ref_ema_updated", 0.0) for r in rows] == [0.0, 1.0, 0.0]
    ref, pol = trainer.reference.state_dict(), trainer.policy.state_dict()
    moved = [k for k in ref if not torch.equal(ref[k], initial[k])]
    assert moved and all(not torch.equal(ref[k], pol[k]) for k in moved)  # between the two, not a copy
    assert (tmp_path / "run/checkpoints/step_000003/reference/config.json").is_file()


def test_lora_reference_is_the_base_model(world, tiny_model_dir, tmp_path):
    """LoRA: only adapter weights train, the reference log-probs come from the base model (adapter
    off, no second copy), and the checkpoint's model folder holds the merged weights."""
    cfg = rlworld.load(
        world, tiny_model_dir, tmp_path / "run",
        reward__components={"rlworld:token_set_reward": 1.0},
        model__lora_r=4, model__lora_alpha=8, trainer__actor_lr=1e-2, trainer__total_steps=2,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    assert trainer.reference is None
    trainable = [n for n, p in trainer.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    summary = trainer.train()
    from transformers import AutoModelForCausalLM

    from searchr1.models import load_model
    from searchr1.trainer.experience import build_experience
    from searchr1.trainer.policy import PolicyLogprobs

    merged = AutoModelForCausalLM.from_pretrained(summary["checkpoint"] + "/model")
    base = load_model(tiny_model_dir)
    traj = trainer._last_trajs[0]
    exp = build_experience([traj], [0.0], [0], pad_token_id=0)
    args = (exp.input_ids, exp.attention_mask)
    with torch.no_grad():
        policy_lp, _ = PolicyLogprobs(trainer.policy)(*args, target_mask=exp.train_mask)
        merged_lp, _ = PolicyLogprobs(merged)(*args, target_mask=exp.train_mask)
        base_lp, _ = PolicyLogprobs(base)(*args, target_mask=exp.train_mask)
        ref_lp = trainer._reference_logprobs(exp)
    torch.testing.assert_close(merged_lp, policy_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ref_lp, base_lp, atol=1e-6, rtol=0)
    assert not torch.allclose(policy_lp, base_lp, atol=1e-4)
    assert (tmp_path / "run/checkpoints/step_000002/adapter/adapter_config.json").is_file()
