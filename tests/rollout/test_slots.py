"""The slot decoder (``searchr1.rollout.slots``): every logit it returns equals a plain Hugging Face forward over
the slot's whole stream (float32), whatever the schedule: a shared prefix, identical fresh prompts, prompts and
single tokens in one pass, waiting slots, buffer growth, compaction, slot reuse, LoRA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rollout_doubles import ScriptedRetriever
from scripted_turns import ScriptedTurns
from test_rollout_engines import prompts_of, scripted_metas

from searchr1.modeling import merged_weights_for, rotate
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.hf import HFRolloutEngine
from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.slots import GROWTH, MIN_SHARED_PREFIX, DecodeWeights, Linear, SlotBatch, _rotate_pairs

ATOL = 1e-4


def plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


class Streams:
    """A ``SlotBatch`` beside the token streams it should hold; every step is checked against ``model``."""

    def __init__(self, model, n_slots: int, prompts: list[list[int]], dtype=torch.float32) -> None:
        self.model = model
        self.batch = SlotBatch(merged_weights_for(model), n_slots, dtype, prompts)
        self.seen: dict[int, list[int]] = {}

    def start(self, slot: int, prompt: list[int]) -> list[int]:
        self.batch.reset_slot(slot)
        self.seen[slot] = list(prompt[: self.batch.n_real[slot]])
        return list(prompt[self.batch.n_real[slot] :])

    def step(self, feeds: dict[int, list[int]]) -> torch.Tensor:
        logits = self.batch.step(feeds)
        assert logits.shape[0] == len(feeds)
        for row, slot in enumerate(sorted(feeds)):
            self.seen[slot] += feeds[slot]
            assert self.batch.n_real[slot] == len(self.seen[slot])
            want = plain_logits(self.model, self.seen[slot])
            assert torch.allclose(logits[row].float(), want, atol=ATOL), (
                slot,
                (logits[row] - want).abs().max(),
            )
        return logits


def test_every_schedule_gives_the_plain_forward_logits(tiny):
    model, _ = tiny
    g = torch.Generator().manual_seed(0)
    head = torch.randint(5, 300, (MIN_SHARED_PREFIX + 5,), generator=g).tolist()
    prompts = [[*head, 7, 8, 9], [*head, 11], [*head, 7, 8, 9], head + list(range(20, 60))]
    s = Streams(model, 4, prompts)
    assert s.batch.prefix_len == len(head)  # stored once, outside the slots
    feeds = {slot: s.start(slot, p) for slot, p in enumerate(prompts)}
    s.step(feeds)
    # slot 2 repeated slot 0's prompt (copied); every slot after the first took the prefix for free
    assert s.batch.shared_prompt_tokens == 3 + 3 * len(head)
    s.step({0: [1], 1: [2], 2: [3], 3: [4]})
    s.step({1: [5], 3: [6]})  # slots 0 and 2 wait (a search in flight)
    s.step({0: [40, 41, 42, 43, 44], 1: [7], 2: list(range(100, 100 + GROWTH + 9))})  # observations + a token
    capacity = s.batch.capacity
    for k in range(GROWTH + 3):  # the buffers grow, every slot keeps its columns
        s.step({0: [k + 1], 2: [k + 2]})
    assert s.batch.capacity > capacity and s.batch.capacity % GROWTH == 0
    assert s.batch.compact([3, 0]) == [3, 0]  # slot 3 -> 0, slot 0 -> 1; slots 1 and 2 are dropped
    s.seen = {0: s.seen[3], 1: s.seen[0]}
    s.step({0: [9], 1: [10]})
    s.step({1: [*s.start(1, prompts[1]), 12]})  # slot 1 reused for a new stream
    s.step({0: [13], 1: [14]})


def test_without_a_shared_prefix_and_with_an_idle_empty_slot(tiny):
    model, _ = tiny
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    s = Streams(model, 4, prompts)
    assert s.batch.prefix_len == 0
    s.step({slot: s.start(slot, p) for slot, p in enumerate(prompts)})
    s.step({0: [1], 2: [3]})  # slot 1 waits, slot 3 never started: no NaN from its empty row
    s.step({1: [2], 2: [4]})


def test_lora_adapters_are_merged_and_followed_after_an_update(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from searchr1.models import load_model

    base = load_model(tiny_model_dir, dtype="float32").eval()
    policy = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])
    )
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    prompts = [[5, 9, 14, 3, 8], [7, 7, 30]]
    s = Streams(policy, 2, prompts)
    s.step({slot: s.start(slot, p) for slot, p in enumerate(prompts)})
    with torch.no_grad():  # an optimizer step: the adapter changes in place
        for name, p in policy.named_parameters():
            if "lora_A" in name:
                p.mul_(-1.5)
    s2 = Streams(policy, 2, prompts)  # a new rollout merges the new weights
    s2.step({slot: s2.start(slot, p) for slot, p in enumerate(prompts)})
    with policy.disable_adapter():
        plain = plain_logits(policy, prompts[0])
    assert not torch.allclose(plain, plain_logits(policy, prompts[0]), atol=1e-3)  # the adapter matters


def test_rotation_as_complex_pairs_equals_rotate_half(tiny):
    model, _ = tiny
    weights = merged_weights_for(model)
    decode = DecodeWeights(weights, torch.float32)
    d, heads = weights.head_dim, weights.heads
    positions = torch.tensor([0, 3, 17])
    cos, sin = weights.rotary(torch.zeros(1), positions[None])
    x = torch.randn(3, heads * d)
    want = rotate(x.view(3, heads, d), cos[0][:, None], sin[0][:, None])
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()
    turn = torch.complex(cos[0][:, : d // 2], sin[0][:, : d // 2])[:, None]
    got = _rotate_pairs(x.view(3, heads, d)[..., order].reshape(3, -1), turn, heads)
    assert torch.allclose(got, want[..., order], atol=1e-6)
    # the decode weights hold Q and K rows in that order: q.k is unchanged, the values are not reordered
    plan = weights.plans(torch.float32)[0][0].qkv
    assert torch.equal(decode.layers[0].qkv.weight[:d], plan.weight[:d][order])
    tail = plan.weight.shape[0] - weights.kv_heads * d
    assert torch.equal(decode.layers[0].qkv.weight[tail:], plan.weight[tail:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_a_plain_product(dtype):
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(40, 24, generator=g).to(dtype), torch.randn(40, generator=g).to(dtype)
    for layer in (Linear(weight), Linear(weight, bias)):
        for rows in (1, 7, 64):
            x = torch.randn(rows, 24, generator=g).to(dtype)
            want = F.linear(x.float(), weight.float(), None if layer.bias is None else bias.float())
            tol = 1e-5 if dtype == torch.float32 else 0.1
            assert torch.allclose(layer(x).float(), want, atol=tol, rtol=tol)


class HFModulesEngine(HFRolloutEngine):
    """Today's default path before the slot decoder: the Hugging Face modules over ``KVBatch``."""

    slot_decoder = False


def test_greedy_tokens_equal_the_hf_modules_path_in_float32(tiny):
    """The same trajectories (token ids, searches, log-probs) on a fixed prompt set with searches (the random
    model is steered along a script at the tags only: every other token is its own greedy choice)."""
    model, tok = tiny
    metas = scripted_metas(6, seed=5)
    runs = []
    for cls in (HFRolloutEngine, HFModulesEngine):
        config = RolloutConfig(dtype="model", max_turn_tokens=40)
        eng = cls(model, tok, ScriptedRetriever(), config, topk=2, steer=ScriptedTurns(tok))
        with eng:
            assert (eng.merged is not None) == (cls is HFRolloutEngine)
            runs.append(eng.generate(prompts_of(tok, 6), metas, sampling=SamplingParams(greedy=True)))
    for fast, ref in zip(*runs, strict=True):
        assert fast.response_ids == ref.response_ids and fast.queries == ref.queries
        assert fast.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    assert sum(t.searches for t in runs[0]) > 0


def test_bfloat16_next_token_distributions_match_the_hf_modules_path(tiny):
    """In bfloat16 the two paths round differently (the slot decoder keeps the residual stream in float32):
    their next-token distributions stay within a total-variation distance of 0.005 (measured: 5e-4) of the float32 one and of
    each other, over every step of a sampled batch (sampling itself is shared code: ``sample_tokens``)."""
    model, tok = tiny
    prompts = prompts_of(tok, 4)
    exact = Streams(model, 4, prompts)
    fast = SlotBatch(merged_weights_for(model), 4, torch.bfloat16, prompts)
    from searchr1.models import generation_copy
    from searchr1.rollout.kv import KVBatch

    ref = KVBatch(generation_copy(model, torch.bfloat16), 4, tok.pad_token_id)
    g = torch.Generator().manual_seed(0)
    feeds = {slot: exact.start(slot, p) for slot, p in enumerate(prompts)}
    for slot in range(4):
        fast.reset_slot(slot)
    worst = 0.0
    for _ in range(12):
        want = torch.softmax(exact.step(feeds).float(), -1)
        got = torch.softmax(fast.step(feeds).float(), -1)
        other = torch.softmax(ref.step({s: exact.seen[s][ref.n_real[s] :] for s in feeds}).float(), -1)
        for a, b in ((got, want), (other, want), (got, other)):
            worst = max(worst, float(0.5 * (a - b).abs().sum(-1).max()))
        feeds = {s: [int(t)] for s, t in enumerate(torch.multinomial(want, 1, generator=g).flatten())}
    assert worst < 0.005


def test_a_policy_sharded_after_the_engine_was_built_decodes_through_the_hf_modules(tiny, monkeypatch):
    """torchrun with trainer.strategy=fsdp builds the engine and then shards the policy (FSDP2): the engine
    must notice the sharded (DTensor) weights and decode through the Hugging Face modules, with the same
    greedy tokens as before the sharding (one process, gloo)."""
    import copy
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    model, tok = tiny
    model = copy.deepcopy(model)  # sharded in place: not the fixture's
    metas = scripted_metas(4, seed=3)
    greedy = SamplingParams(greedy=True)
    monkeypatch.setitem(os.environ, "MASTER_ADDR", "127.0.0.1")
    monkeypatch.setitem(os.environ, "MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config = RolloutConfig(dtype="model", max_turn_tokens=40)
        with HFRolloutEngine(model, tok, ScriptedRetriever(), config, topk=2, steer=ScriptedTurns(tok)) as eng:
            assert eng.merged is not None
            before = eng.generate(prompts_of(tok, 4), metas, sampling=greedy)
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            after = eng.generate(prompts_of(tok, 4), metas, sampling=greedy)
            assert eng.merged is None
        assert merged_weights_for(model) is None
    finally:
        dist.destroy_process_group()
    assert [t.response_ids for t in after] == [t.response_ids for t in before]
    assert sum(t.num_generated for t in after) > 0
