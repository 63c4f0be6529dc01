"""KVBatch (holes = padding at both ends of a stream, compaction, slot reuse), the sampler and the
rollout config checks."""

from __future__ import annotations

import pytest
import torch

from searchr1.config import ConfigError, load_config
from searchr1.rollout.kv import KVBatch
from searchr1.rollout.sampling import SamplingParams, filter_logits, row_generators, sample_tokens


def _plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("fast", [True, False])
def test_holes_at_both_ends_and_compaction_match_plain_forward(tiny, fast):
    """Streams fed in ragged pieces, waiting (right holes) and starting late (left holes), then
    compacted and one slot reused: every next-token distribution equals an unpadded forward pass
    (with the growing cache and with transformers' own)."""
    model, tok = tiny
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(5, len(tok) - 10, (n,), generator=g).tolist() for n in (7, 3, 12)]
    kv = KVBatch(model, n_slots=3, pad_id=tok.pad_token_id, fast=fast)
    schedule = [
        {0: seqs[0][:5], 1: seqs[1][:1]},  # slot 2 has not started: holes before its first token
        {1: seqs[1][1:3], 2: seqs[2][:4]},  # slot 0 waits: holes after its tokens
        {2: seqs[2][4:9]},
        {0: seqs[0][5:], 2: seqs[2][9:]},
    ]
    checks: list[tuple[int, int, torch.Tensor]] = []
    for feeds in schedule:
        logits = kv.step(feeds)
        for row, slot in enumerate(sorted(feeds)):
            checks.append((slot, kv.n_real[slot], logits[row]))
    assert kv.waste() > 0
    kv.compact()
    assert kv.length == max(kv.n_real) == 12
    seqs[0].append(11)
    seqs[1].append(12)
    logits = kv.step({0: [11], 1: [12]})
    checks += [(0, kv.n_real[0], logits[0]), (1, kv.n_real[1], logits[1])]
    for slot, n, got in checks:
        want = _plain_logits(model, seqs[slot][:n])[-1]
        assert torch.allclose(got, want, atol=1e-4), (slot, n)
    # a finished stream's slot takes a new one: positions restart, the old columns are invisible
    kv.reset_slot(2)
    fresh = [9, 10, 11, 12]
    got = kv.step({2: fresh, 0: [13]})
    assert torch.allclose(got[1], _plain_logits(model, fresh)[-1], atol=1e-4)
    assert torch.allclose(got[0], _plain_logits(model, [*seqs[0], 13])[-1], atol=1e-4)
    # dropping slots keeps the survivors intact
    kept = kv.compact([2])
    assert kept == [2] and kv.n_slots == 1
    got = kv.step({0: [14]})
    assert torch.allclose(got[0], _plain_logits(model, [*fresh, 14])[-1], atol=1e-4)
    for layer in kv.cache.layers:
        assert not torch.isnan(layer.keys).any() and not torch.isnan(layer.values).any()


def test_step_rejects_empty_feeds(tiny):
    model, tok = tiny
    kv = KVBatch(model, 2, tok.pad_token_id)
    with pytest.raises(ValueError, match="at least one slot"):
        kv.step({})
    with pytest.raises(ValueError, match="slot 1: empty feed"):
        kv.step({0: [3], 1: []})


def test_filters_top_k_top_p_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda p: torch.isfinite(filter_logits(logits, p))[0].tolist()  # noqa: E731
    assert kept(SamplingParams(top_k=2)) == [True, True, False, False]
    assert kept(SamplingParams(top_p=0.8)) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    assert kept(SamplingParams(top_p=0.81)) == [True, True, True, False]
    assert kept(SamplingParams(top_p=0.1)) == [True, False, False, False]  # the best token always stays
    hot = torch.softmax(filter_logits(logits, SamplingParams(temperature=2.0)), -1)
    assert torch.allclose(hot, torch.softmax(logits / 2.0, -1))


def test_sampler_draws_from_the_distribution_and_is_seeded():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(probs).repeat(4000, 1)
    gens = row_generators(5, 4000)
    tokens = sample_tokens(logits, SamplingParams(), gens)
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)
    again = sample_tokens(logits, SamplingParams(), row_generators(5, 4000))
    assert torch.equal(tokens, again)
    other = sample_tokens(logits, SamplingParams(), row_generators(6, 4000))
    assert not torch.equal(tokens, other)
    assert sample_tokens(logits[:3], SamplingParams(greedy=True), gens[:3]).tolist() == [0, 0, 0]
    # tokens without probability (first, middle, last of the vocabulary) are never drawn
    holes = torch.log(torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])).repeat(4000, 1)
    drawn = sample_tokens(holes, SamplingParams(), row_generators(7, 4000))
    assert set(drawn.tolist()) == {1, 3}


def test_sampling_params_checks_and_eval_default():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    from searchr1.rollout.config import RolloutConfig

    assert SamplingParams.greedy_eval().greedy
    assert SamplingParams.greedy_eval(RolloutConfig(val_greedy=True)).greedy
    sampled = SamplingParams.greedy_eval(RolloutConfig(val_greedy=False, temperature=0.7, top_k=5))
    assert (sampled.greedy, sampled.temperature, sampled.top_k) == (False, 0.7, 5)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.temperature=0", "rollout.temperature"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("rollout.max_turn_tokens=0", "rollout.max_turn_tokens"),
        ("rollout.engine=vllm2", "rollout.engine"),
        ("rollout.max_turns=-1", "rollout.max_turns"),
    ],
)
def test_config_rejects_bad_values(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override])
