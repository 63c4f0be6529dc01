"""Frozen and EMA reference policies, including a LoRA (peft) policy."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.algorithms.reference import EMAReference, FrozenReference, ema_update_, make_reference


def const_linear(value: float) -> nn.Linear:
    layer = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


def test_ema_every_n_steps_hand_computed():
    # tau .9, period 2; ref 0, policy 1: step 1 nothing; step 2: .9*0 + .1*1 = .1
    # policy -> 2; step 3 nothing; step 4: .9*.1 + .1*2 = .29
    policy, ref = const_linear(1.0), EMAReference(const_linear(0.0), tau=0.9, update_period=2)
    assert ref.step(policy) is False
    assert ref.module.weight.flatten().tolist() == [0.0, 0.0]
    assert ref.step(policy) is True
    assert ref.module.weight.flatten().tolist() == pytest.approx([0.1, 0.1])
    with torch.no_grad():
        policy.weight.fill_(2.0)
    ref.step(policy)
    assert ref.module.weight.flatten().tolist() == pytest.approx([0.1, 0.1])
    ref.step(policy)
    assert ref.module.weight.flatten().tolist() == pytest.approx([0.29, 0.29])
    assert not ref.module.weight.requires_grad


def test_tau_extremes_and_frozen_reference():
    policy = const_linear(3.0)
    ref = const_linear(1.0)
    ema_update_(ref, policy, tau=1.0)
    assert ref.weight.flatten().tolist() == [1.0, 1.0]
    ema_update_(ref, policy, tau=0.0)
    assert ref.weight.flatten().tolist() == [3.0, 3.0]
    frozen = FrozenReference(const_linear(5.0))
    for _ in range(20):
        assert frozen.step(policy) is False
    assert frozen.module.weight.flatten().tolist() == [5.0, 5.0]


def test_mismatched_modules_are_rejected():
    with pytest.raises(ValueError, match="no counterpart"):
        ema_update_(nn.Linear(2, 1), nn.Sequential(nn.Linear(2, 1)), 0.5)
    with pytest.raises(ValueError, match="shape"):
        ema_update_(nn.Linear(2, 1), nn.Linear(3, 1), 0.5)
    with pytest.raises(ValueError, match="ref_policy_ema_tau"):
        EMAReference(nn.Linear(2, 1), tau=1.5, update_period=1)


def test_make_reference_copies_and_state_roundtrip():
    policy = const_linear(1.0)
    cfg = AlgorithmConfig(ref_policy="ema", ref_policy_ema_tau=0.5, ref_policy_ema_update_period=1)
    ref = make_reference(policy, cfg)
    assert isinstance(ref, EMAReference)
    assert ref.module is not policy and policy.weight.requires_grad
    with torch.no_grad():
        policy.weight.fill_(3.0)
    ref.step(policy)  # .5*1 + .5*3 = 2
    assert ref.module.weight.flatten().tolist() == [2.0, 2.0]
    restored = make_reference(const_linear(0.0), cfg)
    restored.load_state_dict(copy.deepcopy(ref.state_dict()))
    assert restored.steps == 1 and restored.module.weight.flatten().tolist() == [2.0, 2.0]
    assert type(make_reference(policy, AlgorithmConfig())) is FrozenReference


def test_ema_over_a_lora_policy_updates_only_the_adapters():
    from peft import LoraConfig, get_peft_model
    from tinymodel import tiny_config
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_config(64, num_hidden_layers=1))
    policy = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    ref = make_reference(
        policy, AlgorithmConfig(ref_policy="ema", ref_policy_ema_tau=0.75, ref_policy_ema_update_period=1)
    )
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        before = ref.module(ids).logits.clone()
    # one "optimiser step" on the adapters only
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    old_ref = {n: p.detach().clone() for n, p in ref.module.named_parameters()}
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.5)
    ref.step(policy)
    policy_params = dict(policy.named_parameters())
    for n, p in ref.module.named_parameters():
        if n in names:  # ref = .75 * ref + .25 * policy
            torch.testing.assert_close(p, 0.75 * old_ref[n] + 0.25 * policy_params[n].detach())
        else:  # frozen base weights untouched (and equal to the policy's)
            assert torch.equal(p, old_ref[n]) and torch.equal(p, policy_params[n])
    with torch.no_grad():
        after = ref.module(ids).logits
    assert not torch.allclose(before, after)
