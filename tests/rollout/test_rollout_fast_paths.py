"""The decode fast paths: the growing KV cache, shared prompts of a group, decoding attention, and the
generation copy (another dtype, LoRA merged in) that follows the policy."""

from __future__ import annotations

import pytest
import torch

from searchr1.models import copy_weights, generation_copy
from searchr1.rollout.attention import ATTENTION_NAME, decode_attention_for
from searchr1.rollout.kv import MIN_SHARED_PREFIX, GrowingLayer, KVBatch


def _plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1]


def test_growing_layer_appends_in_place_and_adopts_replaced_tensors():
    layer = GrowingLayer()
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 3, n, 4, generator=g) for n in (5, 1, 1, 7, 1)]
    buffers = set()
    for i, part in enumerate(parts):
        keys, values = layer.update(part, -part)
        want = torch.cat(parts[: i + 1], dim=2)
        assert torch.equal(keys, want) and torch.equal(values, -want)
        buffers.add(layer._kbuf.data_ptr())
    assert len(buffers) < len(parts)  # single columns land in spare capacity, no copy of the cache
    layer.keys, layer.values = keys[:1].clone(), values[:1].clone()  # compaction hands over new tensors
    keys, _ = layer.update(torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 4))
    assert keys.shape == (1, 3, 17, 4) and torch.equal(keys[:, :, :15], want[:1])


def test_fresh_slots_fed_the_same_prompt_share_one_computation(tiny):
    model, tok = tiny
    prompt, other = [5, 9, 14, 3, 8, 21], [7, 7, 30]
    kv = KVBatch(model, n_slots=4, pad_id=tok.pad_token_id)
    logits = kv.step({0: prompt, 1: prompt, 2: other, 3: prompt})
    assert kv.shared_prompt_tokens == 2 * len(prompt)
    for row, ids in enumerate((prompt, prompt, other, prompt)):
        assert torch.allclose(logits[row], _plain_logits(model, ids), atol=1e-4)
    # the shared rows then diverge like independent streams
    logits = kv.step({0: [11], 1: [12], 3: [13]})
    for row, nxt in enumerate((11, 12, 13)):
        assert torch.allclose(logits[row], _plain_logits(model, [*prompt, nxt]), atol=1e-4)
    # a slot that has seen tokens is never merged with a fresh one fed the same tokens
    kv.reset_slot(2)
    logits = kv.step({2: [11, 12], 0: [11, 12]})
    assert kv.shared_prompt_tokens == 2 * len(prompt)
    assert torch.allclose(logits[1], _plain_logits(model, [11, 12]), atol=1e-4)
    assert torch.allclose(logits[0], _plain_logits(model, [*prompt, 11, 11, 12]), atol=1e-4)


def test_distinct_prompts_with_a_common_prefix_compute_it_once(tiny):
    model, tok = tiny
    g = torch.Generator().manual_seed(3)
    head = torch.randint(5, 60, (MIN_SHARED_PREFIX + 4,), generator=g).tolist()
    prompts = {0: [*head, 9, 14, 3], 1: [*head, 8], 2: [*head, 9, 14, 3], 3: [*head, 21, 22, 23, 24, 25]}
    kv = KVBatch(model, n_slots=5, pad_id=tok.pad_token_id)
    kv.step({4: [1, 2, 3, 4]})  # an older stream: the new prompts get columns after its own
    logits = kv.step(prompts)
    # slot 2 repeats slot 0 (all of it shared); slots 1 and 3 share the head with slot 0
    assert kv.shared_prompt_tokens == len(prompts[2]) + 2 * len(head)
    for row, slot in enumerate(sorted(prompts)):
        assert torch.allclose(logits[row], _plain_logits(model, prompts[slot]), atol=1e-4)
    # decoding on top of [prefix | holes | suffix] columns equals a plain pass over the stream
    logits = kv.step({0: [11], 1: [12], 3: [13], 4: [5]})
    for row, (slot, nxt) in enumerate(((0, 11), (1, 12), (3, 13))):
        assert torch.allclose(logits[row], _plain_logits(model, [*prompts[slot], nxt]), atol=1e-4)
    assert torch.allclose(logits[3], _plain_logits(model, [1, 2, 3, 4, 5]), atol=1e-4)
    # a head shorter than MIN_SHARED_PREFIX is computed per prompt
    kv2 = KVBatch(model, n_slots=2, pad_id=tok.pad_token_id)
    kv2.step({0: [*head[:3], 7], 1: [*head[:3], 8]})
    assert kv2.shared_prompt_tokens == 0


def test_decode_attention_equals_sdpa_with_holes(tiny):
    """The same ragged schedule (left and right holes) with the decoding attention and with SDPA."""
    model, tok = tiny
    schedule = [{0: [5, 6, 7, 8], 1: [9]}, {1: [10, 11]}, {0: [12], 1: [13]}, {0: [14], 1: [15]}]

    def run(fast: bool) -> list[torch.Tensor]:
        kv = KVBatch(model, 2, tok.pad_token_id)
        with decode_attention_for(model) if fast else torch.no_grad():
            assert (model.config._attn_implementation == ATTENTION_NAME) == fast
            return [kv.step(feeds) for feeds in schedule]

    for a, b in zip(run(True), run(False), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_generation_copy_in_bfloat16_follows_the_policy(tiny):
    model, _ = tiny
    policy = generation_copy(model, torch.float32)  # a private float32 policy to modify
    policy.requires_grad_(True)
    copy = generation_copy(policy, torch.bfloat16)
    assert next(copy.parameters()).dtype == torch.bfloat16
    assert not any(p.requires_grad for p in copy.parameters())
    ids = [5, 9, 14, 3, 8]
    want = _plain_logits(policy, ids)
    assert torch.allclose(_plain_logits(copy, ids).float(), want, atol=0.1, rtol=0.05)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.5)
    moved = _plain_logits(policy, ids)
    assert not torch.allclose(_plain_logits(copy, ids).float(), moved, atol=0.1)
    copy_weights(policy, copy)
    assert torch.allclose(_plain_logits(copy, ids).float(), moved, atol=0.1, rtol=0.05)


def test_generation_copy_merges_lora(tiny):
    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    base = generation_copy(model, torch.float32)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    copy = generation_copy(peft, torch.float32)
    ids = [5, 9, 14, 3, 8]
    with torch.no_grad():
        want = peft(torch.tensor([ids])).logits[0, -1]
        with peft.disable_adapter():
            plain = peft(torch.tensor([ids])).logits[0, -1]
    assert not torch.allclose(want, plain, atol=1e-3)  # the adapter matters
    assert torch.allclose(_plain_logits(copy, ids), want, atol=1e-4)


@pytest.mark.parametrize("dtype, owns", [("model", False), ("float32", False), ("bfloat16", True)])
def test_engine_generates_with_a_copy_only_when_needed(tiny, dtype, owns, monkeypatch):
    """The Hugging Face modules' path (the reference engine, and fast_decode=false) copies the model only for
    another dtype; the slot decoder never copies it (it runs the policy's merged weights in that dtype)."""
    from searchr1 import precision
    from searchr1.rollout.config import RolloutConfig
    from searchr1.rollout.hf import HFRolloutEngine, TurnSyncRolloutEngine

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)
    model, tok = tiny
    eng = TurnSyncRolloutEngine(model, tok, retriever=None, config=RolloutConfig(dtype=dtype))
    assert eng.owns_copy == owns and (eng.model is model) == (not owns)
    eng = HFRolloutEngine(model, tok, retriever=None, config=RolloutConfig(dtype=dtype, fast_decode=False))
    assert eng.owns_copy == owns and eng.merged is None
    eng = HFRolloutEngine(model, tok, retriever=None, config=RolloutConfig(dtype=dtype))
    assert not eng.owns_copy and eng.model is model and eng.merged is not None
    assert eng.generation_dtype == (torch.bfloat16 if owns else torch.float32)


def test_bfloat16_without_hardware_support_warns_once_and_falls_back(monkeypatch, capsys):
    from searchr1 import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    monkeypatch.setattr(precision, "_warned", set())
    cpu = torch.device("cpu")
    assert precision.compute_dtype("bfloat16", cpu, torch.float32, "rollout.dtype") == torch.float32
    assert precision.compute_dtype("bfloat16", cpu, torch.float32, "rollout.dtype") == torch.float32
    assert capsys.readouterr().err.count("warning: rollout.dtype=bfloat16") == 1
    assert precision.compute_dtype("auto", cpu, torch.float32, "x") == torch.float32
    with pytest.raises(ValueError, match="expected auto"):
        precision.compute_dtype("float8", cpu, torch.float32, "rollout.dtype")
