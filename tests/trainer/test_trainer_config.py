"""Trainer configuration: invalid settings fail before any model is loaded, naming the key; every
shipped config loads; `searchr1 train` reports config errors cleanly."""

from __future__ import annotations

import pytest

from searchr1.cli import main
from searchr1.config import ConfigError, load_config, shipped_configs
from searchr1.trainer.schedule import PromptSampler, lr_multiplier


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_shipped_configs_load(name):
    cfg = load_config(shipped_configs()[name])
    assert cfg.trainer.batch_size % cfg.trainer.mini_batch_size == 0


def test_paper_settings():
    ppo = load_config(shipped_configs()["ppo_qwen2.5_3b"])
    grpo = load_config(shipped_configs()["grpo_qwen2.5_3b"])
    ema = load_config(shipped_configs()["ema_pg_grpo_qwen2.5_3b"])
    assert (ppo.trainer.actor_lr, ppo.trainer.critic_lr, ppo.algorithm.advantage) == (1e-6, 1e-5, "gae")
    assert (grpo.algorithm.kl_coef, grpo.algorithm.kl_estimator, grpo.rollout.n) == (0.001, "low_var_kl", 5)
    assert (grpo.rollout.max_turns, grpo.retrieval.topk, grpo.rollout.max_turn_tokens) == (4, 3, 500)
    assert (ema.algorithm.ref_policy, ema.algorithm.ref_policy_ema_tau) == ("ema", 0.9)
    assert (ema.algorithm.ref_policy_ema_update_period, ema.algorithm.kl_topk_tokens, ema.algorithm.use_kl_iw) == (
        10, 32, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algorithm.advantage=grpo_typo"], "algorithm.advantage"),
        (["rollout.n=1", "algorithm.advantage=grpo"], "rollout.n"),
        (["trainer.batch_size=6", "trainer.mini_batch_size=4"], "trainer.mini_batch_size"),
        (["trainer.log_backends=[jsonl, mlflow]"], "trainer.log_backends"),
        (["trainer.micro_batch_size=0"], "trainer.micro_batch_size"),
        (["model.lora_r=8", "algorithm.ref_policy=ema"], "algorithm.ref_policy"),
        (["trainer.resume="], "trainer.resume"),
    ],
)
def test_invalid_config_names_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)


def test_grpo_group_of_one_allowed_without_std_normalisation():
    cfg = load_config(None, ["rollout.n=1", "algorithm.advantage=grpo", "algorithm.norm_adv_by_std=false"])
    assert cfg.rollout.n == 1


def test_cli_reports_config_errors_without_loading_a_model(capsys, tmp_path):
    code = main(["train", "--config", "tiny_cpu", "trainer.batch_size=3", f"trainer.out_dir={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "trainer.batch_size=3" in err and "mini_batch_size" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing was built


def test_cli_print_config_resolves_shipped_names(capsys):
    assert main(["train", "--config", "grpo_qwen2.5_3b", "--print-config", "trainer.total_steps=7"]) == 0
    out = capsys.readouterr().out
    assert "total_steps: 7" in out and "advantage: grpo" in out


def test_lr_schedules():
    assert [lr_multiplier(s, 10, 4, "constant", 0.0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_multiplier(4, 10, 4, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_multiplier(10, 10, 4, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_multiplier(7, 10, 4, "linear", 0.0) == pytest.approx(0.5)


def test_prompt_sampler_resumes_where_it_was():
    a = PromptSampler(10, 3, seed=5)
    seen = [a.next_batch() for _ in range(4)]  # crosses an epoch boundary
    assert sorted(i for b in seen[:3] for i in b) == sorted(set(i for b in seen[:3] for i in b))
    b = PromptSampler(10, 3, seed=5)
    b.load_state_dict(a.state_dict())
    assert [a.next_batch() for _ in range(5)] == [b.next_batch() for _ in range(5)]
    with pytest.raises(ValueError, match="same training data"):
        PromptSampler(11, 3, seed=5).load_state_dict(a.state_dict())
