"""``searchr1 bench update``: policy-update throughput and log-prob-step memory, ours vs naive.

Workload: one PPO mini-batch of trajectories with a long-tailed length mix (prompts of 100-300
tokens, responses log-normal between 50 and 1,500 tokens with masked observation blocks), a
Qwen2-style model with a 32,768-token vocabulary and a few small layers (random weights, no
tokenizer needed), micro-batches of at most ``max_tokens`` token slots, AdamW.

Variants (the same samples, weights and loss; gradient accumulation over micro-batches with a
token-mean over the whole mini-batch, so every variant computes the same update):
  - ``naive_padded``: the mini-batch padded to its longest sequence, split into micro-batches of
    ``max_tokens // longest`` rows, full ``[B, T, V]`` logits, float32 ``log_softmax`` + ``gather``;
  - ``ours_pad``: the same padded micro-batches, chunked log-probs (isolates the LM-head part);
  - ``ours_bucket``: length-bucketed micro-batches + chunked log-probs on generated tokens only;
  - ``ours_pack``: packed rows (block-diagonal attention) + chunked log-probs.

(a) throughput: real tokens of the mini-batch / wall time of one update (forward, backward and
optimizer step over all micro-batches), median over repeats after one warm-up update (``--quick``:
the first update, no warm-up);
(b) memory: peak memory of the log-prob step (forward + backward of the log-probs of every
micro-batch, no optimizer). On CPU each variant runs in a fresh subprocess with
``MALLOC_MMAP_THRESHOLD_=65536`` (large buffers are mmapped and returned on free, so RSS follows the
allocator); the peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs`` after the model
and the inputs are built) minus the resident set at that point is the step's peak. On CUDA it is
``torch.cuda.max_memory_allocated`` minus the allocated memory before the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from searchr1.bench import BenchResult

VOCAB = 32768


@dataclass
class Sizes:
    num_samples: int
    prompt_min: int
    prompt_max: int
    response_median: float
    response_max: int
    max_tokens: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    repeats: int
    warmup: bool = True
    """One untimed update before the timed ones (the quick run times its first update)."""
    chunk_size: int | None = None
    """LM-head rows per chunk; None: ``default_chunk_size(V)`` (512 at V = 32k)."""
    vocab_size: int = VOCAB


FULL = Sizes(
    num_samples=24,
    prompt_min=100,
    prompt_max=300,
    response_median=250.0,
    response_max=1200,
    max_tokens=4096,
    hidden_size=128,
    intermediate_size=352,
    num_layers=2,
    repeats=1,
)

QUICK = Sizes(
    num_samples=8,
    prompt_min=100,
    prompt_max=200,
    response_median=120.0,
    response_max=700,
    max_tokens=1024,
    hidden_size=64,
    intermediate_size=176,
    num_layers=2,
    repeats=1,
    warmup=False,
)

VARIANTS: dict[str, tuple[str, str]] = {
    # name: (batching mode, log-prob implementation)
    "naive_padded": ("pad", "naive"),
    "ours_pad": ("pad", "chunked"),
    "ours_bucket": ("bucket", "chunked"),
    "ours_pack": ("pack", "chunked"),
}
QUICK_VARIANTS = ("naive_padded", "ours_bucket")


# ----------------------------------------------------------------------------------------------
# Workload


def make_samples(sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    """Prompt + response token ids, loss mask (0 on prompt and observation blocks), a GRPO-like
    per-sequence advantage broadcast over its tokens."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(sizes.num_samples):
        p = int(torch.randint(sizes.prompt_min, sizes.prompt_max + 1, (1,), generator=g))
        normal = torch.randn(1, generator=g).item()
        r = int(
            min(sizes.response_max, max(50, sizes.response_median * float(torch.tensor(0.8 * normal).exp())))
        )
        ids = torch.randint(0, sizes.vocab_size, (p + r,), generator=g)
        mask = torch.zeros(p + r, dtype=torch.long)
        mask[p:] = 1
        for k in range(min(3, r // 250)):  # <information> blocks: not trained
            start = p + 100 + k * 250
            mask[start : min(start + 120, p + r)] = 0
        adv = torch.randn(1, generator=g).item()
        samples.append({"input_ids": ids, "loss_mask": mask, "advantages": torch.full((p + r,), adv)})
    return samples


def build_model(sizes: Sizes, seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=sizes.vocab_size,
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).float()


def add_old_logprobs(model: torch.nn.Module, samples: list[dict[str, Any]], sizes: Sizes) -> None:
    """The behaviour policy's log-probs (no gradient), slightly perturbed so ratios are not all 1."""
    from searchr1.trainer.batching import make_micro_batches, scatter_to_samples
    from searchr1.trainer.logprobs import token_logprobs

    mbs = make_micro_batches(samples, sizes.max_tokens, "bucket")
    with torch.no_grad():
        results = [token_logprobs(model, **mb.model_inputs(), chunk_size=sizes.chunk_size) for mb in mbs]
    g = torch.Generator().manual_seed(1)
    for sample, lp in zip(samples, scatter_to_samples(mbs, results), strict=True):
        sample["old_logprobs"] = lp + 0.05 * torch.randn(lp.shape, generator=g)


# ----------------------------------------------------------------------------------------------
# One update


def ppo_clip_token_loss(logprob, old_logprob, advantages, clip: float = 0.2):  # type: ignore[no-untyped-def]
    """PPO-clip per-token loss, ``-min(r A, clip(r, 1-e, 1+e) A)`` with ``r = exp(lp - lp_old)``."""
    ratio = torch.exp(logprob - old_logprob)
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)


def micro_batch_logprobs(model, mb, impl: str, sizes: Sizes) -> torch.Tensor:  # type: ignore[no-untyped-def]
    from searchr1.trainer.logprobs import naive_token_logprobs, token_logprobs

    if impl == "naive":
        return naive_token_logprobs(model, **mb.model_inputs())
    return token_logprobs(
        model, **mb.model_inputs(), chunk_size=sizes.chunk_size, target_mask=mb.fields["loss_mask"]
    )


def update(model, optimizer, samples, variant: str, sizes: Sizes, device: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """One PPO update over the mini-batch; returns the loss and the micro-batch statistics."""
    from searchr1.trainer.batching import make_micro_batches, padding_stats

    mode, impl = VARIANTS[variant]
    mbs = [mb.to(device) for mb in make_micro_batches(samples, sizes.max_tokens, mode)]
    total = sum(float(mb.fields["loss_mask"].sum()) for mb in mbs)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for mb in mbs:
        lp = micro_batch_logprobs(model, mb, impl, sizes)
        per_token = ppo_clip_token_loss(lp, mb.fields["old_logprobs"], mb.fields["advantages"])
        loss = (per_token * mb.fields["loss_mask"]).sum() / total
        loss.backward()
        loss_sum += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return {"loss": loss_sum, **padding_stats(mbs)}


def measure_throughput(variant: str, sizes: Sizes, seed: int, device: str) -> dict[str, Any]:
    model = build_model(sizes, seed).to(device)
    samples = make_samples(sizes, seed)
    add_old_logprobs(model, samples, sizes)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    if sizes.warmup:
        first = update(model, optimizer, samples, variant, sizes, device)  # also the equivalence check
    else:
        _sync(device)
        t0 = time.perf_counter()
        first = update(model, optimizer, samples, variant, sizes, device)
        _sync(device)
        times.append(time.perf_counter() - t0)
    for _ in range(sizes.repeats - len(times)):
        _sync(device)
        t0 = time.perf_counter()
        update(model, optimizer, samples, variant, sizes, device)
        _sync(device)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return {
        "variant": variant,
        "micro_batches": int(first["micro_batches"]),
        "padding_fraction": first["padding_fraction"],
        "update_s": seconds,
        "tokens_per_s": first["tokens"] / seconds,
        "first_loss": first["loss"],
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# Peak memory of the log-prob step


def logprob_step(model, samples, variant: str, sizes: Sizes, device: str) -> None:  # type: ignore[no-untyped-def]
    """Forward + backward of the log-probs of every micro-batch (gradient accumulation)."""
    from searchr1.trainer.batching import make_micro_batches

    mode, impl = VARIANTS[variant]
    for mb in make_micro_batches(samples, sizes.max_tokens, mode):
        mb = mb.to(device)
        lp = micro_batch_logprobs(model, mb, impl, sizes)
        (lp * mb.fields["advantages"] * mb.fields["loss_mask"]).sum().backward()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_probe(variant: str, sizes: Sizes, seed: int, device: str) -> dict[str, Any]:
    """Runs in a fresh process (CPU) or in-process (CUDA); returns the step's peak in MiB."""
    model = build_model(sizes, seed).to(device)
    samples = make_samples(sizes, seed)
    for p in model.parameters():  # gradient buffers exist before the step in both variants
        p.grad = torch.zeros_like(p)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        logprob_step(model, samples, variant, sizes, device)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        return {"variant": variant, "peak_mib": peak / 2**20, "method": "torch.cuda.max_memory_allocated"}
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kib("VmRSS")
    logprob_step(model, samples, variant, sizes, device)
    peak = _status_kib("VmHWM") - before
    return {"variant": variant, "peak_mib": peak / 1024, "method": "VmHWM delta in a fresh process"}


def measure_memory(variant: str, sizes: Sizes, seed: int, device: str) -> dict[str, Any]:
    if device.startswith("cuda"):
        result = memory_probe(variant, sizes, seed, device)
        torch.cuda.empty_cache()
        return result
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "searchr1.bench.update",
        "--probe",
        variant,
        "--sizes",
        json.dumps(asdict(sizes)),
    ]
    cmd += ["--seed", str(seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe {variant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> BenchResult:
    torch.set_num_threads(2)
    sizes = QUICK if args.quick else FULL
    variants = QUICK_VARIANTS if args.quick else tuple(VARIANTS)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = int(getattr(args, "seed", 0))
    rows = []
    for variant in variants:
        row = measure_throughput(variant, sizes, seed, device)
        row["logprob_step_peak_mib"] = measure_memory(variant, sizes, seed, device)["peak_mib"]
        rows.append(row)
        print(
            f"  {variant}: {row['tokens_per_s']:.0f} tokens/s, {row['logprob_step_peak_mib']:.0f} MiB",
            flush=True,
        )
    by = {r["variant"]: r for r in rows}
    naive, ours = by["naive_padded"], by["ours_bucket"]
    speedup = ours["tokens_per_s"] / naive["tokens_per_s"]
    memory_ratio = ours["logprob_step_peak_mib"] / naive["logprob_step_peak_mib"]
    lengths = [len(s["input_ids"]) for s in make_samples(sizes, seed)]
    return BenchResult(
        name="update",
        params={
            **asdict(sizes),
            "device": device,
            "threads": torch.get_num_threads(),
            "tokens": sum(lengths),
            "length_min": min(lengths),
            "length_median": statistics.median(lengths),
            "length_max": max(lengths),
            "quick": bool(args.quick),
            "seed": seed,
        },
        rows=rows,
        headline=speedup,
        headline_label="update tokens/s, ours_bucket / naive_padded (target >= 1.5)",
        extra={
            "memory_ratio": memory_ratio,
            "memory_ratio_label": "log-prob step peak memory, ours_bucket / naive_padded (target <= 0.5)",
            "memory_method": (
                "torch.cuda.max_memory_allocated minus allocated before the step"
                if device == "cuda"
                else "fresh subprocess per variant, MALLOC_MMAP_THRESHOLD_=65536, VmHWM after "
                "/proc/self/clear_refs reset minus VmRSS before the step (forward + backward of all micro-batches)"
            ),
            "loss_equivalence": {
                "description": "first-update loss of each variant (same weights and data: should agree)",
                **{r["variant"]: r["first_loss"] for r in rows},
            },
        },
    )


def _main() -> None:
    parser = argparse.ArgumentParser(description="memory probe of searchr1 bench update (internal)")
    parser.add_argument("--probe", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args()
    torch.set_num_threads(2)
    sizes = Sizes(**json.loads(ns.sizes))
    print(json.dumps(memory_probe(ns.probe, sizes, ns.seed, "cpu")))


if __name__ == "__main__":
    _main()
