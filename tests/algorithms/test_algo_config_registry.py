"""The ``algorithm`` config section: documented, validated by name and range; registries are pluggable."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from searchr1.algorithms import registry
from searchr1.algorithms.advantages import compute_advantages
from searchr1.config import ConfigError, describe, load_config


def test_every_algorithm_field_is_documented():
    rows = [r for r in describe() if r[0].startswith("algorithm.")]
    keys = {k for k, _, _ in rows}
    assert {"algorithm.clip_ratio_c", "algorithm.ref_policy_ema_tau", "algorithm.kl_topk_tokens"} <= keys
    assert all(doc for _, _, doc in rows)


def test_ema_pg_settings_load():
    cfg = load_config(
        overrides=[
            "algorithm.ref_policy=ema",
            "algorithm.ref_policy_ema_tau=0.9",
            "algorithm.ref_policy_ema_update_period=10",
            "algorithm.kl_loss_type=full_reverse",
            "algorithm.kl_topk_tokens=32",
            "algorithm.use_kl_iw=true",
            "algorithm.advantage=rloo",
            "algorithm.kl_estimator=k3+",
        ]
    ).algorithm
    assert (cfg.ref_policy, cfg.kl_topk_tokens, cfg.use_kl_iw, cfg.advantage) == ("ema", 32, True, "rloo")
    assert cfg.uses_reference


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("algorithm.advantage=ppo", r"algorithm\.advantage: unknown advantage estimator 'ppo'.*grpo"),
        ("algorithm.policy_loss=trpo", r"algorithm\.policy_loss"),
        ("algorithm.loss_agg=sum", r"algorithm\.loss_agg"),
        ("algorithm.kl_estimator=k9", r"algorithm\.kl_estimator"),
        ("algorithm.kl_loss_type=topk", r"algorithm\.kl_loss_type"),
        ("algorithm.gamma=1.5", r"algorithm\.gamma"),
        ("algorithm.clip_ratio_c=0.5", r"algorithm\.clip_ratio_c"),
        ("algorithm.ref_policy_ema_tau=2", r"algorithm\.ref_policy_ema_tau"),
        ("algorithm.ref_policy_ema_update_period=0", r"algorithm\.ref_policy_ema_update_period"),
        ("algorithm.use_kl_in_reward=true", r"use_kl_loss and algorithm\.use_kl_in_reward"),
        ("algorithm.kl_topk_tokens=8", r"algorithm\.kl_topk_tokens"),
    ],
)
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(overrides=[override])


def test_a_user_estimator_is_selected_by_config_without_touching_the_trainer():
    @registry.register_advantage("test_sign")
    def sign(rewards, response_mask, *, config=None, group_ids=None, values=None, state=None):
        adv = torch.sign(rewards).unsqueeze(-1) * response_mask
        return adv, adv

    try:
        cfg = load_config(overrides=["algorithm.advantage=test_sign"]).algorithm
        adv, _ = compute_advantages(torch.tensor([-3.0, 2.0]), torch.ones(2, 2), cfg)
        assert adv.tolist() == [[-1.0, -1.0], [1.0, 1.0]]
    finally:
        registry.ADVANTAGE_ESTIMATORS.remove("test_sign")
    with pytest.raises(ConfigError, match="test_sign"):
        load_config(overrides=["algorithm.advantage=test_sign"])


def test_package_exports_and_light_config_import():
    import searchr1.algorithms as alg

    assert alg.get_advantage_estimator("grpo") is alg.grpo
    assert callable(alg.agg_loss) and "ppo" in alg.POLICY_LOSSES
    with pytest.raises(AttributeError):
        _ = alg.no_such_name
    # the config section must not import torch (keeps `searchr1 --help` fast)
    code = "import sys, searchr1.algorithms.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_what_an_estimator_needs_is_registered_with_it():
    assert registry.advantage_traits("gae").needs_critic
    assert not registry.advantage_traits("grpo").needs_critic
    assert registry.advantage_traits("rloo").group_size_needed(None) == 2
    # grpo needs a group only when it divides by the group's std
    assert registry.advantage_traits("grpo").group_size_needed(load_config().algorithm) == 2
    dr_grpo = load_config(overrides=["algorithm.norm_adv_by_std=false", "rollout.n=1"]).algorithm
    assert registry.advantage_traits("grpo").group_size_needed(dr_grpo) == 1
    with pytest.raises(ValueError, match=r"algorithm\.advantage: unknown"):
        registry.advantage_traits("nope")


def test_a_user_estimator_declares_its_group_size_and_critic():
    @registry.register_advantage("test_triples", min_group_size=3, group_size_reason="it compares three")
    def triples(rewards, response_mask, *, config=None, group_ids=None, values=None, state=None):
        return response_mask, response_mask

    try:
        assert load_config(overrides=["algorithm.advantage=test_triples", "rollout.n=3"]).rollout.n == 3
        with pytest.raises(ConfigError, match=r"rollout\.n >= 3 \(it compares three\)"):
            load_config(overrides=["algorithm.advantage=test_triples", "rollout.n=2"])
        registry.register_advantage("test_triples", override=True, needs_critic=True)(triples)
        assert registry.advantage_traits("test_triples").needs_critic
        assert registry.advantage_traits("test_triples").group_size_needed(None) == 1
    finally:
        registry.ADVANTAGE_ESTIMATORS.remove("test_triples")
    with pytest.raises(TypeError):
        registry.register_advantage("test_typo", needs_critics=True)
    with pytest.raises(TypeError, match="takes no traits"):
        registry.register_policy_loss("test_loss", needs_critic=True)


def test_presets_are_listed_once_and_load():
    from searchr1.algorithms.presets import ALGORITHM_PRESETS, KNOWN_ALGORITHMS, preset_overrides

    assert tuple(ALGORITHM_PRESETS) == KNOWN_ALGORITHMS
    for name in KNOWN_ALGORITHMS:
        items = preset_overrides(name)
        cfg = load_config(
            overrides=[f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in items.items()]
        )
        assert cfg.algorithm.advantage == items["algorithm.advantage"]
    with pytest.raises(ValueError, match=r"rl_algorithm: unknown 'dpo'; known: ppo, grpo"):
        preset_overrides("dpo")
