"""Micro-batching: every token comes back to its sample, padding drops against the padded
baseline, and packed / bucketed rows give the log-probs of one sequence at a time."""

from __future__ import annotations

import pytest
import torch
from batching import (
    make_micro_batches,
    padding_stats,
    plan_packs,
    scatter_to_samples,
    trajectory_sample,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from naive_logprobs import naive_token_logprobs
from tinymodel import tiny_config
from torch import nn

from searchr1.trainer.experience import micro_batches
from searchr1.trainer.logprobs import token_logprobs

VOCAB = 211
TOL = {"atol": 1e-5, "rtol": 1e-5}


pytestmark = pytest.mark.usefixtures("one_thread")


def make_samples(lengths: list[int], seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i, n in enumerate(lengths):
        samples.append(
            {
                "input_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist(),
                "advantages": torch.randn(n, generator=g).tolist(),
                "loss_mask": [0] * min(n, 3) + [1] * max(0, n - 3),
                "tag": [i] * n,
            }
        )
    return samples


def long_tailed_lengths(k: int = 48, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(100, 300, (k,), generator=g)
    response = torch.distributions.LogNormal(5.3, 0.7).sample((k,)).clamp(50, 1500).long()
    return (prompt + response).tolist()


def make_model(attn: str = "sdpa") -> nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_config(VOCAB, hidden_size=32, intermediate_size=64, attn_implementation=attn)
    return AutoModelForCausalLM.from_config(cfg).float()


@pytest.mark.parametrize("mode", ["bucket", "pack", "pad"])
def test_scatter_back_round_trips_every_field(mode: str) -> None:
    lengths = [7, 3, 12, 1, 9, 9, 4, 15]
    samples = make_samples(lengths)
    mbs = make_micro_batches(samples, 24, mode)
    assert sorted(i for mb in mbs for i in mb.samples) == list(range(len(samples)))
    back_ids = scatter_to_samples(mbs, [mb.input_ids for mb in mbs])
    back_adv = scatter_to_samples(mbs, [mb.fields["advantages"] for mb in mbs])
    back_ids_from_sample_ids = scatter_to_samples(mbs, [mb.sample_ids for mb in mbs])
    for i, s in enumerate(samples):
        assert back_ids[i].tolist() == s["input_ids"]
        torch.testing.assert_close(back_adv[i], torch.tensor(s["advantages"]))
        assert (back_ids_from_sample_ids[i] == i).all()
    for mb in mbs:
        assert mb.fields["advantages"].dtype == torch.float32
        assert mb.fields["tag"].dtype == torch.long
        real = mb.attention_mask.bool()
        assert (mb.sample_ids[~real] == -1).all() and (mb.sample_ids[real] >= 0).all()
        assert (mb.fields["advantages"][~real] == 0).all()
        assert mb.num_slots <= 24 or len(mb.segments) == 1


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=25),
    budget=st.integers(1, 130),
    mode=st.sampled_from(["bucket", "pack", "pad"]),
)
def test_plans_cover_each_sample_once_within_budget(lengths: list[int], budget: int, mode: str) -> None:
    mbs = make_micro_batches([{"input_ids": [1] * n} for n in lengths], budget, mode)
    assert sorted(i for mb in mbs for i in mb.samples) == list(range(len(lengths)))
    for mb in mbs:
        assert mb.num_slots <= budget or len(mb.segments) == 1
    assert padding_stats(mbs)["tokens"] == sum(lengths)
    if mode == "pack":
        assert padding_stats(mbs)["padding_fraction"] == 0.0


def test_padding_waste_drops_against_the_padded_baseline() -> None:
    lengths = long_tailed_lengths()
    samples = [{"input_ids": [0] * n} for n in lengths]
    budget = 4096
    pad = padding_stats(make_micro_batches(samples, budget, "pad"))
    bucket = padding_stats(make_micro_batches(samples, budget, "bucket"))
    pack = padding_stats(make_micro_batches(samples, budget, "pack"))
    assert pad["tokens"] == bucket["tokens"] == pack["tokens"] == sum(lengths)
    assert pad["padding_fraction"] > 0.4  # the long tail: most of the padded batch is padding
    assert bucket["slots"] < 0.6 * pad["slots"]
    assert bucket["padding_fraction"] < 0.15
    assert pack["padding_fraction"] == 0.0
    assert pack["micro_batches"] <= bucket["micro_batches"]


def test_first_fit_decreasing_fills_rows() -> None:
    assert plan_packs([5, 4, 3, 3, 1], 8) == [[0, 2], [1, 3, 4]]
    assert plan_packs([10, 2], 8) == [[0], [1]]  # too long: alone


def test_trainer_micro_batches_sort_rows_by_length() -> None:
    lens = torch.tensor([5, 2, 5, 9, 1, 3])
    rows = [4, 0, 2, 5, 1, 3]  # any order: ties stay in row order
    assert micro_batches(rows, lens, max_rows=2) == [[3, 0], [2, 5], [1, 4]]
    # padded-token budget (plan_buckets): rows * longest <= 12, a longer row alone
    assert micro_batches(rows, lens, max_rows=2, max_tokens=12) == [[3], [0, 2], [5, 1, 4]]
    assert micro_batches([3, 1, 0], lens, max_rows=1, max_tokens=8) == [[3], [0], [1]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["bucket", "pack", "pad"])
def test_micro_batches_give_the_logprobs_of_one_sequence_at_a_time(attn: str, mode: str) -> None:
    model = make_model(attn)
    lengths = [5, 17, 9, 2, 30, 11, 11, 1]
    samples = make_samples(lengths, seed=3)
    expected = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s["input_ids"]])
            expected.append(naive_token_logprobs(model, ids, torch.ones_like(ids))[0])
        mbs = make_micro_batches(samples, 40, mode)
        if mode == "pack":
            assert any(len(mb.segments) > 1 for mb in mbs)
        results = [token_logprobs(model, **mb.model_inputs(), chunk_size=8) for mb in mbs]
    for i, lp in enumerate(scatter_to_samples(mbs, results)):
        torch.testing.assert_close(lp, expected[i], **TOL)


def test_packed_gradients_equal_one_sequence_at_a_time() -> None:
    model = make_model()
    samples = make_samples([6, 13, 4, 9], seed=5)

    def loss_of(lp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        return -(lp * adv).sum()

    model.zero_grad()
    for s in samples:
        ids = torch.tensor([s["input_ids"]])
        loss_of(
            naive_token_logprobs(model, ids, torch.ones_like(ids)), torch.tensor([s["advantages"]])
        ).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    mbs = make_micro_batches(samples, 64, "pack")
    assert len(mbs) == 1 and len(mbs[0].segments) == 4
    for mb in mbs:
        loss_of(token_logprobs(model, **mb.model_inputs(), chunk_size=5), mb.fields["advantages"]).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], **TOL)


def test_trajectory_sample_aligns_prompt_and_response() -> None:
    from searchr1.rollout.types import Role, Trajectory

    traj = Trajectory(
        prompt_ids=[5, 6, 7],
        response_ids=[8, 9, 10],
        roles=[Role.GENERATED, Role.OBSERVATION, Role.GENERATED],
        logprobs=[-0.5, 0.0, -1.5],
    )
    s = trajectory_sample(traj, advantages=[0.0] * 6)
    assert s["input_ids"] == [5, 6, 7, 8, 9, 10]
    assert s["loss_mask"] == [0, 0, 0, 1, 0, 1]
    assert s["old_logprobs"] == [0.0, 0.0, 0.0, -0.5, 0.0, -1.5]
    (mb,) = make_micro_batches([s], 100, "bucket")
    assert mb.fields["loss_mask"].tolist() == [[0, 0, 0, 1, 0, 1]]


def test_bad_samples_are_named() -> None:
    with pytest.raises(ValueError, match=r"sample 1: field 'advantages' has 2 entries"):
        make_micro_batches([{"input_ids": [1, 2]}, {"input_ids": [1, 2, 3], "advantages": [0.1, 0.2]}], 8)
    with pytest.raises(ValueError, match="sample 0: empty"):
        make_micro_batches([{"input_ids": []}], 8)
    with pytest.raises(ValueError, match="batching mode"):
        make_micro_batches([{"input_ids": [1]}], 8, "sorted")
    with pytest.raises(ValueError, match="micro-batch is"):
        mbs = make_micro_batches([{"input_ids": [1, 2]}], 8)
        scatter_to_samples(mbs, [torch.zeros(1, 5)])


def test_packed_attention_arguments_per_kernel() -> None:
    """sdpa gets a boolean block-diagonal causal mask, eager an additive one, flash-attention only
    the restarting position_ids (its varlen kernel reads the boundaries from them)."""
    from types import SimpleNamespace

    from searchr1.trainer.logprobs import attention_kwargs, packed_causal_mask

    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])  # last column: padding
    allowed = packed_causal_mask(pos, mask)[0]
    seg = [0, 0, 0, 1, 1, 2, -1]
    for q in range(7):
        for k in range(7):
            expected = k <= q and seg[q] == seg[k] and (seg[k] >= 0 or k == q)
            assert bool(allowed[q, k]) == expected, (q, k)

    def stub(impl: str) -> nn.Module:
        m = nn.Linear(1, 1)
        m.config = SimpleNamespace(_attn_implementation=impl)
        return m

    sdpa = attention_kwargs(stub("sdpa"), mask, pos)
    assert sdpa["attention_mask"].dtype == torch.bool and sdpa["attention_mask"].shape == (1, 1, 7, 7)
    eager = attention_kwargs(stub("eager"), mask, pos)["attention_mask"]
    assert (
        eager.dtype == torch.float32
        and (eager[0, 0][allowed] == 0).all()
        and (eager[0, 0][~allowed] < -1e30).all()
    )
    flash = attention_kwargs(stub("flash_attention_2"), mask, pos)
    assert flash["attention_mask"] is None and flash["position_ids"] is pos
    unpacked = torch.arange(7)[None]
    assert attention_kwargs(stub("sdpa"), mask, unpacked)["attention_mask"] is mask
