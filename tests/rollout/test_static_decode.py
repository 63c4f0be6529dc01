"""The slot decoder's fixed-shape decode steps (``searchr1.rollout.static_decode``) on the CPU: the same
logits and greedy tokens as the eager steps in float32, whatever the schedule (waiting slots, a bucket wider
than the slots, compaction, buffer growth, no shared prefix), an eager fallback for steps wider than the
largest bucket, and CUDA graphs refused off CUDA. Capture and replay themselves run in scripts/gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from rollout_doubles import ScriptedRetriever
from test_rollout_engines import prompts_of

from searchr1.errors import UserFacingError
from searchr1.modeling import merged_weights_for
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.decode_modes import BUCKETS, bucket_for, decode_mode, static_rows
from searchr1.rollout.hf import HFRolloutEngine
from searchr1.rollout.slots import GROWTH, MIN_SHARED_PREFIX, SlotBatch

ATOL = 1e-4


def twins(model, prompts: list[list[int]], n_slots: int, **static_kw) -> tuple[SlotBatch, SlotBatch]:
    """An eager and a static ``SlotBatch`` over the same prompts, every slot started and prefilled."""
    weights = merged_weights_for(model)
    eager = SlotBatch(weights, n_slots, torch.float32, prompts)
    static = SlotBatch(weights, n_slots, torch.float32, prompts, decode="static", **static_kw)
    for batch in (eager, static):
        for slot in range(len(prompts)):
            batch.reset_slot(slot)
        batch.step({slot: p[batch.n_real[slot] :] for slot, p in enumerate(prompts)})
    return eager, static


def greedy_steps(
    eager: SlotBatch, static: SlotBatch, schedule: list[list[int]], start: dict[int, int]
) -> int:
    """Feed each step's slots their greedy token in both batches; the logits must agree (and so the tokens).
    Returns the tokens fed."""
    last = dict(start)
    fed = 0
    for slots in schedule:
        feeds = {s: [last[s]] for s in slots}
        want, got = eager.step(feeds), static.step(feeds)
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=ATOL), (got - want).abs().max()
        tokens = got.argmax(-1).tolist()
        assert tokens == want.argmax(-1).tolist()
        last.update(zip(sorted(feeds), tokens, strict=True))
        fed += len(slots)
    assert static.lengths == eager.lengths
    return fed


def test_static_steps_give_the_eager_greedy_tokens_in_float32(tiny):
    model, _ = tiny
    g = torch.Generator().manual_seed(0)
    head = torch.randint(5, 300, (MIN_SHARED_PREFIX + 3,), generator=g).tolist()
    prompts = [head + torch.randint(5, 300, (n,), generator=g).tolist() for n in (3, 7, 1, 12, 5)]
    eager, static = twins(model, prompts, 5)
    assert static.prefix_len == len(head) and static.keys[0].shape[0] == 8  # rows of the smallest bucket
    start = {s: 40 + s for s in range(5)}
    schedule = [[0, 1, 2, 3, 4], [1, 3], [0, 2, 4], [4], [0, 1, 2, 3, 4], [2]]  # slots wait for searches
    fed = greedy_steps(eager, static, schedule, start)
    assert static.static.static_steps == len(schedule) and static.fed_tokens == eager.fed_tokens
    assert fed == sum(map(len, schedule))
    # an observation for one slot (an eager step), then decode again; then compaction keeps the buffers' rows
    obs = {1: [9, 10, 11, 12]}
    assert torch.allclose(eager.step(obs), static.step(obs), atol=ATOL)
    greedy_steps(eager, static, [[0, 1, 3], [1]], start)
    assert eager.compact([3, 1]) == static.compact([3, 1])
    assert static.keys[0].shape[0] == 8 and eager.keys[0].shape[0] == 2
    greedy_steps(eager, static, [[0, 1], [1], [0]], {0: 5, 1: 6})
    assert static.static.eager_steps == 0


def test_static_steps_across_buffer_growth_and_without_a_shared_prefix(tiny):
    model, _ = tiny
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    eager, static = twins(model, prompts, 3)
    assert static.prefix_len == 0 and static.capacity == GROWTH
    schedule = [[0, 1, 2] if k % 3 else [0, 2] for k in range(GROWTH + 4)]  # past the first capacity
    greedy_steps(eager, static, schedule, {0: 1, 1: 2, 2: 3})
    assert static.capacity > GROWTH


def test_reserved_stream_tokens_set_the_capacity_up_front(tiny):
    model, _ = tiny
    batch = SlotBatch(
        merged_weights_for(model), 2, torch.float32, [[5, 6, 7]], stream_tokens=100, decode="static"
    )
    assert batch.capacity == 128  # 100 columns rounded up to GROWTH
    assert SlotBatch(merged_weights_for(model), 2, torch.float32, [[5, 6, 7]]).capacity == GROWTH


def test_a_step_wider_than_the_largest_bucket_runs_eagerly_with_one_note(tiny, capsys):
    model, _ = tiny
    n = BUCKETS[-1] + 2
    prompts = [[5 + s % 50, 6, 7] for s in range(n)]
    eager, static = twins(model, prompts, n)
    assert static.keys[0].shape[0] == n
    greedy_steps(eager, static, [list(range(n)), list(range(n))], {s: 3 + s % 7 for s in range(n)})
    assert static.static.eager_steps == 2 and static.static.static_steps == 0
    assert capsys.readouterr().err.count("wider than the largest static bucket") == 1
    greedy_steps(eager, static, [list(range(BUCKETS[-1]))], {s: 9 for s in range(n)})  # fits: static again
    assert static.static.static_steps == 1


def test_buckets():
    assert [bucket_for(w) for w in (1, 8, 9, 64, 65, 128, 129)] == [8, 8, 16, 64, 128, 128, None]
    assert [static_rows(n) for n in (1, 9, 64, 200)] == [8, 16, 64, 200]


def test_cuda_graphs_are_refused_off_cuda_and_auto_keeps_the_cpu_path(tiny):
    model, tok = tiny
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the graphs (scripts/gpu_check.py)")
    cpu = torch.device("cpu")
    assert decode_mode("auto", cpu) == "eager" and decode_mode("off", cpu) == "eager"
    with pytest.raises(UserFacingError, match=r"^rollout.cuda_graphs=on needs a CUDA device") as err:
        decode_mode("on", cpu)
    assert "\n" not in str(err.value)
    with pytest.raises(UserFacingError):
        SlotBatch(merged_weights_for(model), 2, torch.float32, [[5, 6]], decode="graphs")
    with pytest.raises(UserFacingError):
        HFRolloutEngine(model, tok, ScriptedRetriever(), RolloutConfig(dtype="model", cuda_graphs="on"))
    with HFRolloutEngine(model, tok, ScriptedRetriever(), RolloutConfig(dtype="model")) as eng:
        assert eng.decode == "eager"
        eng.generate(prompts_of(tok, 2), [{"id": 0}, {"id": 1}], seed=0)
        assert "static_steps" not in eng.last_stats


def test_the_config_key_is_checked():
    with pytest.raises(ValueError, match=r"rollout\.cuda_graphs"):
        RolloutConfig(cuda_graphs="yes").validate(None)  # type: ignore[arg-type]
