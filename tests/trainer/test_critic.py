"""The value model: aligned per-token values, packing-safe, trainable, save/load round trip."""

from __future__ import annotations

import pytest
import torch
from batching import make_micro_batches, scatter_to_samples
from tinymodel import tiny_config
from torch import nn

from searchr1.trainer.critic import VALUE_HEAD_FILE, ValueModel

VOCAB = 157
TOL = {"atol": 1e-5, "rtol": 1e-5}


pytestmark = pytest.mark.usefixtures("one_thread")


def make_lm(seed: int = 0) -> nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(VOCAB, hidden_size=32, intermediate_size=64, tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(cfg).float()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return ids, mask


def test_values_are_the_head_on_the_previous_hidden_state() -> None:
    lm = make_lm()
    critic = ValueModel(lm)
    assert critic.backbone is lm.model
    assert not any(p is lm.lm_head.weight for p in critic.parameters())  # the LM head is not kept
    ids, mask = batch()
    values = critic(ids, mask)
    hidden = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    expected = critic.value_head(hidden).squeeze(-1)
    assert values.shape == ids.shape and values.dtype == torch.float32
    torch.testing.assert_close(values[0, 1:], expected[0, :-1], **TOL)
    torch.testing.assert_close(values[1, 1:7], expected[1, :6], **TOL)
    assert (values[:, 0] == 0).all() and (values[1, 7:] == 0).all()


def test_packed_values_equal_one_sequence_at_a_time() -> None:
    critic = ValueModel(make_lm())
    g = torch.Generator().manual_seed(4)
    samples = [{"input_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()} for n in (5, 9, 3, 12)]
    with torch.no_grad():
        single = [critic(torch.tensor([s["input_ids"]]))[0] for s in samples]
        mbs = make_micro_batches(samples, 32, "pack")
        assert any(len(mb.segments) > 1 for mb in mbs)
        packed = scatter_to_samples(mbs, [critic(**mb.model_inputs()) for mb in mbs])
    for a, b in zip(packed, single, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_critic_learns_a_value_target() -> None:
    critic = ValueModel(make_lm())
    ids, mask = batch()
    target = torch.linspace(-1, 1, ids.shape[1]).expand_as(ids) * mask
    opt = torch.optim.Adam(critic.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        v = critic(ids, mask)
        loss = ((v - target)[:, 1:] ** 2 * mask[:, 1:]).mean()
        opt.zero_grad()
        loss.backward()
        assert critic.backbone.embed_tokens.weight.grad.abs().sum() > 0  # gradients reach the LM
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_save_and_load_round_trip(tmp_path) -> None:
    critic = ValueModel(make_lm(), seed=7)
    with torch.no_grad():
        critic.value_head.bias.fill_(0.25)
    ids, mask = batch()
    folder = critic.save_pretrained(tmp_path / "critic")
    assert (folder / VALUE_HEAD_FILE).exists() and (folder / "config.json").exists()
    loaded = ValueModel.from_pretrained(folder)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), critic(ids, mask), atol=0, rtol=0)

    from transformers import AutoModel  # the folder is an ordinary Hugging Face one

    assert type(AutoModel.from_pretrained(folder)).__name__ == "Qwen2Model"


def test_start_from_a_causal_lm_checkpoint(tiny_model_dir) -> None:
    from searchr1.models import load_model

    lm = load_model(tiny_model_dir)
    a = ValueModel.from_pretrained(tiny_model_dir, seed=1)
    b = ValueModel.from_pretrained(tiny_model_dir, seed=1)
    torch.testing.assert_close(a.value_head.weight, b.value_head.weight)  # seeded head
    for (name, p), (_, q) in zip(a.backbone.named_parameters(), lm.model.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)  # the decoder is the policy's
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    v = a(ids)
    assert v.shape == (1, 5) and torch.isfinite(v).all()
