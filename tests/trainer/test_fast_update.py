"""The fast update paths give the baseline's numbers: a shared prompt prefix computed once, the old
log-probs of an on-policy update taken from its own pass, the frozen LoRA base in bfloat16."""

from __future__ import annotations

import pytest
import rlworld
import torch
from test_logprobs import VOCAB, assert_same_grads, grads_of, make_model

from searchr1.trainer.logprobs import common_prefix_length, shareable_prefix, token_logprobs
from searchr1.trainer.loop import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def shared_batch(b: int = 4, prefix: int = 20, t: int = 37, seed: int = 3) -> tuple[torch.Tensor, ...]:
    """Rows that start with the same ``prefix`` tokens, then differ; right padding; targets after the prefix
    and two inside it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, t), generator=g)
    ids[:, :prefix] = ids[0, :prefix]
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[3, 25:] = 0
    target = mask.bool().clone()
    target[:, : prefix - 2] = False
    return ids, mask, target


def test_common_prefix_length_counts_equal_real_columns():
    ids, mask, _ = shared_batch()
    assert common_prefix_length(ids, mask) == 20
    mask[2, 5] = 0  # a hole inside the prefix ends it
    assert common_prefix_length(ids, mask) == 5
    same = ids[:1].repeat(3, 1)
    assert common_prefix_length(same, None) == ids.shape[1] - 1  # at least one column stays per row


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prefix_gives_the_plain_values_and_gradients(attn):
    model = make_model(attn=attn)
    ids, mask, target = shared_batch()
    assert shareable_prefix(model, ids, mask) == 20
    plain = token_logprobs(model, ids, mask, target_mask=target, return_entropy=True)
    shared = token_logprobs(model, ids, mask, target_mask=target, return_entropy=True, share_prefix=True)
    for a, b in zip(plain, shared, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    weights = torch.linspace(-1, 1, ids.numel()).view_as(ids)
    g_plain = grads_of(model, (plain[0] * weights).sum() + plain[1].sum())
    plain2 = token_logprobs(model, ids, mask, target_mask=target, return_entropy=True, share_prefix=True)
    g_shared = grads_of(model, (plain2[0] * weights).sum() + plain2[1].sum())
    assert_same_grads(g_plain, g_shared)


def test_no_sharing_under_gradient_checkpointing_or_short_prefixes():
    model = make_model()
    ids, mask, _ = shared_batch(prefix=8)
    assert shareable_prefix(model, ids, mask) == 0  # below MIN_SHARED_PREFIX
    ids, mask, _ = shared_batch()
    model.gradient_checkpointing_enable()
    assert shareable_prefix(model, ids, mask) == 0


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


def _first_update(world, model_dir, out, **extra):
    """The first step's loss and the weights after it."""
    cfg = rlworld.load(world, model_dir, out, trainer__total_steps=1, algorithm__kl_coef=0.0, **extra)
    trainer = RLTrainer(cfg)
    trainer.setup()
    metrics = trainer.train_step()
    return metrics, {k: v.clone() for k, v in trainer.policy.state_dict().items()}


def test_the_fast_update_equals_the_baseline_path_in_float32(world, tiny_model_dir, tmp_path, monkeypatch):
    """Baseline: a separate pass for the old log-probs, every row computes its prompt. Fast: the update's own
    log-probs (detached) as the old ones, the prompt's shared instruction computed once. Same loss, same new
    weights (float32)."""
    from searchr1.trainer import logprobs

    template = tmp_path / "template.txt"
    template.write_text(
        "You answer questions about a small world of people, cities, rivers and books. Think first, "
        "then search, then answer in a few words. Question: {question}\n"
    )
    shared = []
    real = logprobs.shareable_prefix
    monkeypatch.setattr(logprobs, "shareable_prefix", lambda *a: shared.append(real(*a)) or shared[-1])
    base_metrics, base_weights = _first_update(
        world, tiny_model_dir, tmp_path / "a", trainer__on_policy_logprobs=False,
        trainer__share_prompt_prefix=False, trainer__fused_update=False, data__template=str(template),
    )  # fmt: skip
    assert shared == []
    fast_metrics, fast_weights = _first_update(
        world, tiny_model_dir, tmp_path / "b", trainer__fused_update=False, data__template=str(template)
    )  # the Hugging Face path's sharing (the fused decoder's: test_fused_decoder.py)
    assert shared and min(shared) >= 16  # the instruction was computed once per micro-batch
    assert base_metrics["rollout/searches"] == fast_metrics["rollout/searches"]
    assert fast_metrics["actor/loss"] == pytest.approx(base_metrics["actor/loss"], abs=1e-6)
    assert fast_metrics["actor/clipfrac"] == base_metrics["actor/clipfrac"] == 0.0
    for name, weight in base_weights.items():
        torch.testing.assert_close(fast_weights[name], weight, atol=1e-6, rtol=1e-5)


def test_on_policy_needs_one_epoch_one_mini_batch_and_no_kl_in_the_reward(world, tiny_model_dir, tmp_path):
    def on_policy(**extra):
        return RLTrainer(rlworld.load(world, tiny_model_dir, tmp_path, **extra)).on_policy

    assert on_policy()
    assert not on_policy(trainer__ppo_epochs=2)
    assert not on_policy(trainer__mini_batch_size=1)
    assert not on_policy(algorithm__use_kl_in_reward=True, algorithm__use_kl_loss=False)
    assert not on_policy(trainer__on_policy_logprobs=False)


def test_lora_keeps_its_frozen_base_in_bfloat16(tiny_model_dir, monkeypatch):
    from peft import LoraConfig, get_peft_model

    from searchr1.models import load_model
    from searchr1.precision import frozen_linears_to_bf16

    model = get_peft_model(load_model(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj", "down_proj"]))
    converted = frozen_linears_to_bf16(model)
    assert converted > 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.dtype == torch.float32, name  # the adapters train in float32
        elif "embed_tokens" in name or "norm" in name:
            assert p.dtype == torch.float32, name
    bf16 = [n for n, p in model.named_parameters() if p.dtype == torch.bfloat16]
    assert any("q_proj.base_layer" in n for n in bf16) and any("mlp.up_proj" in n for n in bf16)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids).logits
    out.float().sum().backward()  # gradients reach the adapters through the bfloat16 base
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
