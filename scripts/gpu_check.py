"""The GPU check: the parts of searchr1 that run differently on CUDA, exercised in a few minutes on one GPU.

    bash scripts/gpu-check.sh            # on a machine with one CUDA GPU (falls back to the CPU without)

Needs only the working tree and the machine's own PyTorch, transformers and peft (no model download: a
small Qwen2-shaped model is built from a config in code, with a byte-level tokenizer trained on a few lines);
part 7 imports the trainer, which also needs ``orjson`` and ``PyStemmer`` (``pip install orjson PyStemmer``
on a bare GPU image).
Each part prints one line, ``PASS``, ``FAIL`` or ``SKIP`` with its figures; the exit status is 1 when a part
fails. On a CPU the CUDA parts print one ``SKIP`` line each and the rest runs on the CPU (the test suite runs
it that way: ``tests/test_gpu_check.py``).

1. environment: torch / transformers / peft versions, the device, bfloat16 support;
2. the slot decoder on the device in float32 against a plain Hugging Face forward (max |logit difference|);
3. the rollout engine on the device in bfloat16 (LoRA policy, scripted searches): trajectories, tokens/s;
4. the fused decoder of the update in bfloat16 on the device against float32 on the CPU (log-probs);
5. one GRPO step in bfloat16 on the device: rollout, group advantages, PPO loss through the fused decoder,
   backward, optimizer step (the adapter moves, every gradient finite), step seconds;
6. FSDP2 (``fully_shard``) in one process over NCCL on the GPU (gloo on the CPU): forward, backward, step;
7. one guided step of the trainer itself on the device (``RLTrainer.train_step``, tiny world): a gold and a
   branched rollout mixed into the failed group, step credit per search position, policy shaping of the
   gold tokens; every metric finite, the adapter moved.
8. CUDA graphs (``rollout.cuda_graphs``, ``searchr1.rollout.static_decode``): the slot decoder's graph-replayed
   decode steps against its eager ones in float32 (the same greedy tokens, logits within ``LOGIT_TOLERANCE``;
   waiting slots, a compaction), and the decode step time of both at 64 rows;
9. the engine with graphs on against off (float32 greedy, scripted searches: the same token ids), then one
   GRPO step in bfloat16 with graphs on.

On a GPU parts 3, 5 and 7 decode with graphs too (``rollout.cuda_graphs=auto``).
"""

from __future__ import annotations

import os
import random
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(ROOT),
    str(ROOT / "tests"),
    str(ROOT / "tests" / "rollout"),
    str(ROOT / "tests" / "trainer"),
]

import torch  # noqa: E402

TEXTS = [
    "where was Alice Verdan born? <think> search </think> <search> Alice Verdan </search>",
    "<information> Doc 1(Title: Alice Verdan) Alice Verdan was born in Tarsk. </information>",
    "<answer> Tarsk </answer> the founder of the Quillon Press was born in 1875 in Borvik.",
] * 20
LOGIT_TOLERANCE = 1e-3
"""Slot decoder vs Hugging Face forward, float32, on the device (a random model's logits are O(1))."""
BF16_LOGPROB_TOLERANCE = 0.1
"""Fused decoder in bfloat16 on the device vs float32 on the CPU: max |log-prob difference| (8 bits of mantissa)."""

failures: list[str] = []


def report(name: str, status: str, detail: str) -> None:
    print(f"{status:4s}  {name}: {detail}", flush=True)
    if status == "FAIL":
        failures.append(name)


def part(name: str, needs_cuda: bool = False) -> Callable[[Callable[[], str]], Callable[[], None]]:
    def wrap(fn: Callable[[], str]) -> Callable[[], None]:
        def run() -> None:
            if needs_cuda and not torch.cuda.is_available():
                report(name, "SKIP", "no CUDA device")
                return
            t0 = time.perf_counter()
            try:
                detail = fn()
            except Exception as exc:  # one line per failing part; the traceback after it
                report(name, "FAIL", f"{type(exc).__name__}: {exc}")
                traceback.print_exc()
                return
            report(name, "PASS", f"{detail} ({time.perf_counter() - t0:.1f} s)")

        return run

    return wrap


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bf16_ok(dev: torch.device) -> bool:
    from searchr1.precision import fast_bf16

    return fast_bf16(dev)


def tiny(dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[Any, Any]:
    from tinymodel import build_tiny_model, train_tokenizer

    tok = train_tokenizer(TEXTS, vocab_size=400)
    model = build_tiny_model(tok, seed=seed, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return model.to(device(), dtype).eval(), tok


def lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return policy


def scripted_batch(tok: Any, n: int, seed: int = 0) -> tuple[list[list[int]], list[dict]]:
    from scripted_turns import make_script

    rng = random.Random(seed)
    questions = ["where was Alice Verdan born?", "who founded the Quillon Press?", "when was Borvik founded?"]
    prompts = [tok.encode(questions[i % 3], add_special_tokens=False) for i in range(n)]
    metas = [{"id": i, "script": make_script(rng, rng.randint(1, 2), think=(4, 12))} for i in range(n)]
    return prompts, metas


def engine(policy: Any, tok: Any, dtype: str, cuda_graphs: str = "auto") -> Any:
    from rollout_doubles import ScriptedRetriever
    from scripted_turns import ScriptedTurns

    from searchr1.rollout.config import RolloutConfig
    from searchr1.rollout.hf import HFRolloutEngine

    config = RolloutConfig(
        dtype=dtype, max_turn_tokens=40, max_batch_rows=32, temperature=1.0, cuda_graphs=cuda_graphs
    )
    return HFRolloutEngine(policy, tok, ScriptedRetriever(), config, topk=2, steer=ScriptedTurns(tok))


@part("environment")
def environment() -> str:
    import peft
    import transformers

    dev = device()
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU"
    return (f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}; "
            f"device {name}; bfloat16 fast: {bf16_ok(dev)}")  # fmt: skip


@part("slot decoder (float32) vs Hugging Face forward")
def slot_decoder() -> str:
    from searchr1.modeling import merged_weights_for
    from searchr1.rollout.slots import SlotBatch

    model, tok = tiny()
    prompts, _ = scripted_batch(tok, 4)
    head = tok.encode("<think> search </think> where was Alice Verdan born? " * 3, add_special_tokens=False)
    prompts = [head + p for p in prompts]
    batch = SlotBatch(merged_weights_for(model), 4, torch.float32, prompts)
    seen = {s: list(p) for s, p in enumerate(prompts)}
    feeds = {}
    for s, p in enumerate(prompts):
        batch.reset_slot(s)
        feeds[s] = p[batch.n_real[s] :]
    worst = 0.0
    last: dict[int, int] = {}
    for step in range(6):
        logits = batch.step(feeds)
        with torch.no_grad():
            for row, s in enumerate(sorted(feeds)):
                ref = model(torch.tensor([seen[s]], device=device())).logits[0, -1]
                worst = max(worst, float((logits[row] - ref).abs().max()))
                last[s] = int(logits[row].argmax())
        feeds = {s: [last[s]] for s in range(4) if (s + step) % 3}  # some slots wait a step
        for s, t in feeds.items():
            seen[s] += t
    if worst > LOGIT_TOLERANCE:
        raise AssertionError(f"max |logit difference| {worst:.2e} > {LOGIT_TOLERANCE}")
    return f"6 steps, prefix shared: {batch.prefix_len} tokens, max |logit difference| {worst:.1e}"


@part("rollout engine (bfloat16, LoRA policy, scripted searches)")
def rollout() -> str:
    model, tok = tiny()
    policy = lora(model)
    prompts, metas = scripted_batch(tok, 32)
    dtype = "bfloat16" if bf16_ok(device()) else "model"
    with engine(policy, tok, dtype) as eng:
        eng.generate(prompts[:4], metas[:4], seed=0)  # warm-up
        t0 = time.perf_counter()
        trajs = eng.generate(prompts, metas, seed=1)
        seconds = time.perf_counter() - t0
        assert eng.merged is not None, "the slot decoder was not used"
    generated = sum(t.num_generated for t in trajs)
    searches = sum(t.searches for t in trajs)
    assert searches > 0 and all(t.finish_reason == "answer" for t in trajs), (
        "scripted trajectories did not finish"
    )
    return (f"{len(trajs)} trajectories in {dtype}, {searches} searches, {generated} generated tokens, "
            f"{generated / seconds:.0f} generated tokens/s")  # fmt: skip


@part("fused decoder (bfloat16 on the device) vs float32 on the CPU", needs_cuda=True)
def fused_decoder() -> str:
    from searchr1.trainer.fused_decoder import FusedDecoder, fused_token_logprobs

    model, tok = tiny()
    cpu = tiny()[0].to("cpu")
    cpu.load_state_dict(model.state_dict())
    ids = torch.randint(4, len(tok), (4, 48), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want, _ = fused_token_logprobs(FusedDecoder(cpu), ids, mask)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            got, _ = fused_token_logprobs(FusedDecoder(model), ids.cuda(), mask.cuda())
    diff = float((got.float().cpu() - want).abs().max())
    if diff > BF16_LOGPROB_TOLERANCE:
        raise AssertionError(f"max |log-prob difference| {diff:.3f} > {BF16_LOGPROB_TOLERANCE}")
    return f"4 x 48 tokens, max |log-prob difference| {diff:.3f} (tolerance {BF16_LOGPROB_TOLERANCE})"


@part("one GRPO step (bfloat16)")
def grpo_step() -> str:
    return _grpo_step("auto")


def _grpo_step(cuda_graphs: str) -> str:
    """Rollout (``rollout.cuda_graphs``), group advantages, PPO loss through the fused decoder, backward, step."""
    from searchr1.algorithms.advantages import grpo
    from searchr1.algorithms.config import AlgorithmConfig
    from searchr1.algorithms.policy_losses import compute_policy_loss
    from searchr1.precision import autocast
    from searchr1.trainer.policy import PolicyLogprobs

    dev = device()
    model, tok = tiny()
    policy = lora(model)
    questions, scripts = scripted_batch(tok, 4, seed=3)
    prompts = [questions[i // 4] for i in range(16)]  # 4 groups of 4
    metas = [dict(scripts[i // 4], id=i, group=i // 4) for i in range(16)]
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    t0 = time.perf_counter()
    dtype = "bfloat16" if bf16_ok(dev) else "model"
    with engine(policy, tok, dtype, cuda_graphs) as eng:
        trajs = eng.generate(prompts, metas, seed=5)
        stats = dict(eng.last_stats)
    if cuda_graphs == "on":
        assert stats.get("graph_captures", 0) > 0 and stats.get("static_steps", 0) > 0, stats
    rows = [t.prompt_ids + t.response_ids for t in trajs]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    gen = torch.zeros(len(rows), width, dtype=torch.bool)
    old = torch.zeros(len(rows), width)
    for i, (t, r) in enumerate(zip(trajs, rows, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        p = len(t.prompt_ids)
        gen[i, p : len(r)] = torch.tensor([role == 1 for role in t.roles])
        old[i, p : len(r)] = torch.tensor(t.logprobs)
    ids, attn, gen, old = (x.to(dev) for x in (ids, attn, gen, old))
    rewards = torch.zeros(len(rows), width, device=dev)
    for i, t in enumerate(trajs):  # a made-up outcome: longer answers score more, so groups differ
        rewards[i, len(rows[i]) - 1] = float(len(t.response_ids) % 5)
    cfg = AlgorithmConfig()
    advantages, _ = grpo(rewards, gen.float(), config=cfg, group_ids=[m["group"] for m in metas])
    actor = PolicyLogprobs(policy, fused=True)
    policy.train()
    with autocast(dev, True):
        logprob, _ = actor(ids, attn, target_mask=gen)
    loss, _ = compute_policy_loss(logprob, old, advantages, gen.float(), cfg)
    loss.backward()
    grads = [p.grad for p in policy.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads), "non-finite or missing gradients"
    optimizer.step()
    seconds = time.perf_counter() - t0
    moved = max(
        float((p.detach() - before[n]).abs().max()) for n, p in policy.named_parameters() if n in before
    )
    assert torch.isfinite(loss) and moved > 0, "the step did not move the adapter"
    graphs = (f", {stats['static_steps']:.0f} graph decode steps, {stats['graph_captures']:.0f} captures"
              if "graph_captures" in stats else "")  # fmt: skip
    return f"16 trajectories, loss {float(loss):+.4f}, adapter moved by {moved:.1e}, step {seconds:.2f} s{graphs}"


@part("CUDA graph decode (float32) vs eager decode", needs_cuda=True)
def graph_decode() -> str:
    """The slot decoder's graph-replayed steps against its eager steps on the device: the same greedy tokens
    and logits within LOGIT_TOLERANCE (float32), slots waiting, a compaction; then decode step times of both
    at 64 rows (the tiny model: launch-bound, which is what graphs remove)."""
    from searchr1.modeling import merged_weights_for
    from searchr1.rollout.slots import SlotBatch

    model, tok = tiny()
    prompts, _ = scripted_batch(tok, 12)
    head = tok.encode("<think> search </think> where was Alice Verdan born? " * 3, add_special_tokens=False)
    prompts = [head + p for p in prompts]
    weights = merged_weights_for(model)
    eager = SlotBatch(weights, 12, torch.float32, prompts)
    graphs = SlotBatch(weights, 12, torch.float32, prompts, stream_tokens=len(max(prompts, key=len)) + 64,
                       decode="graphs")  # fmt: skip
    last = {}
    for batch in (eager, graphs):
        for s in range(12):
            batch.reset_slot(s)
        logits = batch.step({s: p[batch.n_real[s] :] for s, p in enumerate(prompts)})
        last = {s: int(t) for s, t in enumerate(logits.argmax(-1).tolist())}
    worst, steps = 0.0, 0
    for step in range(24):
        slots = [s for s in range(12) if (s + step) % 4]  # some slots wait a step
        if step == 12:
            keep = list(range(0, 12, 2))  # half the streams finish; the rest move to the front
            eager.compact(keep)
            graphs.compact(keep)
            last = {i: last[s] for i, s in enumerate(keep)}
        slots = [s for s in slots if s < eager.n_slots]
        feeds = {s: [last[s]] for s in slots}
        want, got = eager.step(feeds), graphs.step(feeds)
        worst = max(worst, float((want - got).abs().max()))
        tokens = got.argmax(-1).tolist()
        if tokens != want.argmax(-1).tolist():
            raise AssertionError(f"step {step}: graph decode chose other greedy tokens than eager decode")
        last.update(zip(slots, tokens, strict=True))
        steps += 1
    static = graphs.static
    assert static is not None and static.static_steps == steps and static.captures >= 2, vars(static)
    if worst > LOGIT_TOLERANCE:
        raise AssertionError(f"max |logit difference| {worst:.2e} > {LOGIT_TOLERANCE}")
    timing = decode_step_times(model, tok)
    return (f"{steps} steps, {static.captures} captures, max |logit difference| {worst:.1e}; decode step at 64 "
            f"rows: eager {timing['eager']:.2f} ms, graphs {timing['graphs']:.2f} ms")  # fmt: skip


def decode_step_times(model: Any, tok: Any, rows: int = 64, steps: int = 50) -> dict[str, float]:
    """Milliseconds per decode step of ``rows`` slots, eager and graph-replayed (float32, after warm-up)."""
    from searchr1.modeling import merged_weights_for
    from searchr1.rollout.slots import SlotBatch

    prompts, _ = scripted_batch(tok, rows)
    out = {}
    for mode in ("eager", "graphs"):
        batch = SlotBatch(
            merged_weights_for(model), rows, torch.float32, prompts, stream_tokens=160, decode=mode
        )
        for s in range(rows):
            batch.reset_slot(s)
        batch.step({s: p[batch.n_real[s] :] for s, p in enumerate(prompts)})
        feeds = {s: [5] for s in range(rows)}
        for _ in range(3):
            batch.step(feeds)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            batch.step(feeds)
        torch.cuda.synchronize()
        out[mode] = (time.perf_counter() - t0) / steps * 1e3
    return out


@part("one GRPO step with CUDA graphs (rollout.cuda_graphs=on)", needs_cuda=True)
def grpo_step_graphs() -> str:
    """The engine with graphs on against graphs off (float32, greedy, scripted searches: the same token ids),
    then one GRPO step in bfloat16 with graphs on."""
    from searchr1.rollout.sampling import SamplingParams

    model, tok = tiny()
    prompts, metas = scripted_batch(tok, 20, seed=7)
    runs = {}
    for mode in ("on", "off"):
        with engine(model, tok, "float32", mode) as eng:
            runs[mode] = [
                t.response_ids for t in eng.generate(prompts, metas, sampling=SamplingParams(greedy=True))
            ]
            if mode == "on":
                captures = eng.last_stats["graph_captures"]
    if runs["on"] != runs["off"]:
        raise AssertionError("the engine with CUDA graphs generated other greedy tokens than without")
    return f"greedy rollouts equal with and without graphs ({captures:.0f} captures); {_grpo_step('on')}"


@part("FSDP2 in one process (NCCL on the GPU, gloo on the CPU)")
def fsdp2() -> str:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dev = device()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        model, tok = tiny()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(4, len(tok), (2, 32), device=dev)
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        again = model(input_ids=ids, labels=ids).loss
        assert torch.isfinite(loss) and float(again) != float(loss), (
            "the sharded step did not change the loss"
        )
        return f"backend {backend}, loss {float(loss):.4f} -> {float(again):.4f}"
    finally:
        dist.destroy_process_group()


@part("one guided trainer step (gold and branched rollouts, step credit, policy shaping)")
def guided_trainer_step() -> str:
    import math
    import tempfile

    import rlworld
    from conftest import TINY_TEXTS
    from tinymodel import save_tiny_checkpoint

    from searchr1.trainer.loop import RLTrainer

    with tempfile.TemporaryDirectory() as tmp:
        world = rlworld.write_guided_world(Path(tmp) / "world")
        model_dir = save_tiny_checkpoint(Path(tmp) / "model", TINY_TEXTS, seed=0, vocab_size=512)
        cfg = rlworld.load(
            world, model_dir, Path(tmp) / "run", **rlworld.GUIDED_RUN, trainer__device=device().type,
            guidance__off_policy=1, guidance__branched=1, guidance__share=1.0, guidance__decay_until=1.0,
            reward__step_gain=0.5,
        )  # fmt: skip
        trainer = RLTrainer(cfg)
        trainer.setup()
        try:
            trained = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
            metrics = trainer.train_step()
            moved = max(float((p.detach() - trained[n]).abs().max()) for n, p in trainer.policy.named_parameters()
                        if n in trained)  # fmt: skip
            on = {p.device.type for p in trainer.policy.parameters()}
        finally:
            trainer.close()
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    assert on == {device().type}, f"the policy is on {on}"
    assert not bad, f"non-finite metrics: {bad}"
    assert metrics["guidance/gold"] == 1 and metrics["guidance/branched"] == 1, metrics
    assert 0 < metrics["guidance/shaping_weight"] < 0.25 and "step/reward_mean" in metrics, metrics
    assert moved > 0, "the step did not move the adapter"
    return (f"on {device().type}: guided share {metrics['guidance/share']:.2f}, shaping weight "
            f"{metrics['guidance/shaping_weight']:.3f}, step reward mean {metrics['step/reward_mean']:+.3f}, "
            f"adapter moved by {moved:.1e}")  # fmt: skip


def main() -> int:
    torch.manual_seed(0)
    checks = (environment, slot_decoder, rollout, fused_decoder, grpo_step, guided_trainer_step, fsdp2, graph_decode,
              grpo_step_graphs)  # fmt: skip
    for check in checks:
        check()
    print(f"gpu-check: {'FAILED: ' + ', '.join(failures) if failures else 'all parts passed or skipped'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
