"""``searchr1 bench rl-step --device cuda``: one GRPO step on one GPU, ours beside TRL's ``GRPOTrainer``, at
two model shapes with random weights and fixed generation lengths (nothing downloaded).

Shapes (configs written here, weights random from ``seed``):

* ``smollm2-135m``: SmolLM2-135M's (the demo's model): hidden 576, 30 layers, 9 heads, 3 KV heads,
  intermediate 1536, vocabulary 49152, tied embeddings;
* ``qwen2.5-3b``: Qwen2.5-3B's: hidden 2048, 36 layers, 16 heads, 2 KV heads, intermediate 11008,
  vocabulary 151936, tied embeddings.

Work of every row (``Workload``): ``questions x samples`` trajectories (GRPO groups), prompts of
``prompt_tokens`` ids of which the first ``shared_tokens`` are common to every prompt (the instruction and
worked example of Search-R1's prompts), exactly ``gen_tokens`` generated tokens per trajectory (EOS never
sampled: random weights would end at random lengths), sampling at temperature 0.5, single turn (TRL's loop
does not speak Search-R1's tags, as on the CPU row), LoRA r 16 (alpha 32) on every linear layer, bfloat16,
no KL, one optimizer step. A tokenizer of one word per id (``t17`` is id 17) gives TRL the same prompt ids.

Rows, each in a fresh process, one measured step after a warm-up step of the same work:

* ``ours``: the rollout engine's decoder (``SlotBatch``: merged LoRA weights, the shared prefix stored once,
  CUDA graphs per row bucket, ``rollout.cuda_graphs=auto``) and sampler (on the device, one read of the
  sampled ids per step); the update through the fused decoder (``PolicyLogprobs(fused=True)``, the shared
  prefix once per optimizer step, micro-batches of ``--micro-batch`` rows, default 8) under bfloat16 autocast, frozen base weights
  in bfloat16, AdamW on the adapter.
* ``ours-eager``: ``ours`` with ``rollout.cuda_graphs=off`` (what the graphs buy).
* ``trl``: ``GRPOTrainer`` on the same random weights (bfloat16), the same prompt ids, ``num_generations`` =
  samples, ``max_completion_length = min_new_tokens = gen_tokens``, LoRA r 16 on all linear layers, ``beta=0``;
  its generation is timed around ``GRPOTrainer._generate``.

Columns: ``step_s``, ``rollout_s`` (TRL: its generation), ``update_s`` (TRL: the step minus its generation),
``gen_tok_per_s`` (generated tokens / rollout seconds), ``update_%peak`` (below), ``peak_gpu_gb``
(``torch.cuda.max_memory_allocated``), and the generated-token count each row really produced.

Share of peak (``update_share_of_peak``): the update's FLOPs are ``k x N x T``, ``N`` the parameters
(decoder without the embedding, plus the LM head), ``T`` the token positions the update runs (ours: the
shared prefix once and each row's rest, counted by ``ComputeCounter``; TRL: every position of every row),
``k = 6`` for full fine-tuning (forward 2; backward 4: activation and weight gradients) and ``k = 4`` with
LoRA (the frozen base has no weight gradients; the adapters' products, under 1% at r 16, are not counted);
divided by the update's seconds and by the card's dense bfloat16 peak from NVIDIA's datasheets (without
sparsity): H100 SXM and H200 989 TFLOP/s, H100 NVL 835, H100 PCIe 756, A100 312. Another card: no share.

GPU only: none of these figures has been measured yet; the rows run on a CPU with a tiny shape in the tests
(``tests/test_bench_rl_step.py``), which checks the work, not the speed.
"""

from __future__ import annotations

import resource
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from searchr1.algorithms.config import AlgorithmConfig
from searchr1.bench._counter import ComputeCounter

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        arch="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
        max_position_embeddings=8192, rms_norm_eps=1e-5,
    ),
    "qwen2.5-3b": dict(
        arch="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
        max_position_embeddings=32768, rms_norm_eps=1e-6,
    ),
    "tiny": dict(
        arch="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True, rope_theta=10000.0,
        max_position_embeddings=1024, rms_norm_eps=1e-6,
    ),
}  # fmt: skip
"""Model shapes by name; ``tiny`` is for the tests on a CPU."""
GPU_SHAPES = ("smollm2-135m", "qwen2.5-3b")
GPU_ROWS = ("ours", "ours-eager", "trl")
BF16_DENSE_PEAK_TFLOPS = {"H200": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0}
"""Dense bfloat16 peaks (NVIDIA datasheets, without sparsity), matched in this order against the card's name
(``NVIDIA H100 80GB HBM3`` is the SXM card)."""
EOS_ID, PAD_ID = 0, 1
LORA_R, LORA_ALPHA = 16, 32


@dataclass(frozen=True)
class Workload:
    """The work of one step, the same for every row (module docstring)."""

    questions: int = 8
    samples: int = 8
    prompt_tokens: int = 256
    shared_tokens: int = 192
    gen_tokens: int = 256
    temperature: float = 0.5
    micro_batch: int = 8
    seed: int = 0

    @property
    def trajectories(self) -> int:
        return self.questions * self.samples


def generated_tokens(work: Workload) -> int:
    """Tokens a step generates: every trajectory exactly ``gen_tokens`` (ours: EOS never sampled; TRL:
    ``max_completion_length = min_new_tokens = gen_tokens``)."""
    return work.trajectories * work.gen_tokens


def trl_batch_settings(work: Workload) -> dict[str, int]:
    """TRL's micro-steps as ours: ``micro_batch`` rows (whole groups) a micro-step, every completion of the
    step generated at once (accumulated over ``trajectories / micro_batch`` micro-steps)."""
    return {
        "per_device_train_batch_size": work.micro_batch,
        "gradient_accumulation_steps": work.trajectories // work.micro_batch,
    }


def trl_generation_settings(work: Workload) -> dict[str, Any]:
    """The ``GRPOConfig`` fields that fix TRL's completions to ``gen_tokens`` each."""
    return {
        "num_generations": work.samples,
        "max_completion_length": work.gen_tokens,
        "generation_kwargs": {"min_new_tokens": work.gen_tokens},
        "temperature": work.temperature,
    }


def prompt_ids(work: Workload, vocab: int) -> list[list[int]]:
    """``questions x samples`` prompts (each question's ``samples`` copies together), seeded: a common
    prefix of ``shared_tokens`` ids, then the question's own ids; ids avoid EOS and padding."""
    import torch

    g = torch.Generator().manual_seed(work.seed)
    shared = torch.randint(2, vocab, (work.shared_tokens,), generator=g).tolist()
    own = work.prompt_tokens - work.shared_tokens
    questions = [
        shared + torch.randint(2, vocab, (own,), generator=g).tolist() for _ in range(work.questions)
    ]
    return [list(q) for q in questions for _ in range(work.samples)]


def build_model(shape: str, device: str, seed: int) -> Any:
    """A causal LM of ``shape`` with random weights drawn on ``device`` (seeded), float32."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    params = dict(SHAPES[shape])
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[params.pop("arch")]
    config = config_class(**params, bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    torch.manual_seed(seed)
    if device == "cuda":
        torch.cuda.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    return model


def bench_tokenizer(vocab: int) -> Any:
    """One word per id: ``<eos>`` 0, ``<pad>`` 1, ``t2`` .. ``t{vocab-1}``; text is the words joined by spaces,
    so encoding a decoded text gives the ids back."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<eos>": EOS_ID, "<pad>": PAD_ID, **{f"t{i}": i for i in range(2, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def update_params(model: Any) -> int:
    """Parameters the update's FLOPs count: the decoder without the embedding, plus the LM head (tied or
    not), without the adapters."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = sum(
        p.numel() for n, p in base.named_parameters() if "embed_tokens" not in n and "lora_" not in n
    )
    head = base.get_output_embeddings().weight
    tied = head is base.get_input_embeddings().weight
    return decoder + (head.numel() if tied else 0)  # an untied head is counted in the decoder's sum


def card_peak_tflops(name: str) -> float | None:
    """The dense bfloat16 peak of the card called ``name`` (``BF16_DENSE_PEAK_TFLOPS``), None if unknown."""
    return next((peak for key, peak in BF16_DENSE_PEAK_TFLOPS.items() if key in name), None)


def update_share_of_peak(
    params: int, positions: int, seconds: float, lora: bool, peak_tflops: float | None
) -> float | None:
    """Percent of the card's dense bfloat16 peak: ``k x params x positions / seconds / peak``, k = 4 with
    LoRA, 6 for full fine-tuning (module docstring); None without a known peak."""
    if peak_tflops is None or seconds <= 0:
        return None
    k = 4 if lora else 6
    return 100 * k * params * positions / seconds / (peak_tflops * 1e12)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _peak_memory_gb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def card_facts() -> dict[str, Any]:
    """The card's name, the driver (``nvidia-smi``), torch's and CUDA's versions."""
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        facts["card"] = torch.cuda.get_device_name(0)
        facts["memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 1e9
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        facts["driver"] = (
            out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        )
    except (OSError, subprocess.SubprocessError):
        facts["driver"] = None
    return facts


# -- ours ------------------------------------------------------------------------------------------------


def _rollout(
    policy: Any, prompts: list[list[int]], work: Workload, decode: str
) -> tuple[Any, dict[str, float]]:
    """Generate ``gen_tokens`` per prompt through the engine's decoder and sampler: ``[B, gen_tokens]`` ids
    on the device, and the decoder's step counts."""
    import torch

    from searchr1.modeling import merged_weights_for
    from searchr1.rollout.sampling import SamplingParams, row_generators, sample_tokens
    from searchr1.rollout.slots import SlotBatch

    weights = merged_weights_for(policy)
    assert weights is not None, "the slot decoder needs a Llama-family model"
    device = next(policy.parameters()).device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    n = len(prompts)
    batch = SlotBatch(weights, n, dtype, prompts, stream_tokens=work.prompt_tokens + work.gen_tokens + 1,
                      decode=decode)  # type: ignore[arg-type]  # fmt: skip
    for slot in range(n):
        batch.reset_slot(slot)
    logits = batch.step({s: p[batch.n_real[s] :] for s, p in enumerate(prompts)})
    generators = row_generators(work.seed, n, device)
    sampling = SamplingParams(temperature=work.temperature)
    out = torch.empty(n, work.gen_tokens, dtype=torch.long, device=device)
    for k in range(work.gen_tokens):
        logits = logits.float()
        logits[:, EOS_ID] = float("-inf")  # fixed lengths (as TRL's min_new_tokens)
        tokens = sample_tokens(logits, sampling, generators)
        out[:, k] = tokens
        if k + 1 < work.gen_tokens:
            logits = batch.step({s: [t] for s, t in enumerate(tokens.tolist())})
    static = batch.static
    counts = {
        "static_steps": float(static.static_steps if static else 0),
        "eager_steps": float(static.eager_steps if static else 0),
        "graph_captures": float(static.captures if static else 0),
    }
    return out, counts


def _update(actor: Any, optimizer: Any, ids: Any, work: Workload) -> None:
    """One optimizer step of the GRPO policy loss through the fused decoder (micro-batches of
    ``micro_batch`` rows, the shared prefix once per step); made-up rewards from the generated ids."""
    import torch

    from searchr1.algorithms.advantages import grpo
    from searchr1.algorithms.policy_losses import compute_policy_loss
    from searchr1.precision import autocast

    device = ids.device
    n, width = ids.shape
    mask = torch.ones_like(ids)
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[:, work.prompt_tokens :] = True
    rewards = torch.zeros(n, width, device=device)
    rewards[:, -1] = (ids[:, work.prompt_tokens :] % 7 == 0).float().mean(1)  # differs within groups
    cfg = AlgorithmConfig()
    advantages, _ = grpo(rewards, target.float(), config=cfg, group_ids=[i // work.samples for i in range(n)])
    actor.model.train()
    optimizer.zero_grad(set_to_none=True)
    with autocast(device, True):
        started = actor.begin_step(ids, mask, target)
    for start in range(0, n, work.micro_batch):
        rows = slice(start, start + work.micro_batch)
        with autocast(device, True):
            logprobs, _ = actor(ids[rows], mask[rows], target_mask=target[rows])
        loss, _ = compute_policy_loss(
            logprobs, logprobs.detach(), advantages[rows], target[rows].float(), cfg
        )
        (loss * (ids[rows].shape[0] / n)).backward()
    if started is not None:
        actor.end_step()
    params = [p for p in actor.model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


def run_ours_row(shape: str, work: Workload, device: str, graphs: bool) -> dict[str, Any]:
    """The ``ours`` (``graphs``) or ``ours-eager`` row in this process (module docstring)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from searchr1.precision import frozen_linears_to_bf16
    from searchr1.rollout.decode_modes import decode_mode
    from searchr1.trainer.policy import PolicyLogprobs

    model = build_model(shape, device, work.seed)
    policy = get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules="all-linear"))
    if device == "cuda":
        frozen_linears_to_bf16(policy)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    actor = PolicyLogprobs(policy, share_prefix=True, fused=True)
    decode = decode_mode("auto" if graphs else "off", torch.device(device))
    prompts = prompt_ids(work, SHAPES[shape]["vocab_size"])
    counter = ComputeCounter()
    counter.install()

    def step(rows: list[list[int]]) -> tuple[float, float, Any, dict[str, float]]:
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            generated, counts = _rollout(policy, rows, work, decode)
        _sync(device)
        t1 = time.perf_counter()
        ids = torch.cat([torch.tensor(rows, device=generated.device), generated], dim=1)
        _update(actor, optimizer, ids, work)
        _sync(device)
        return t1 - t0, time.perf_counter() - t1, generated, counts

    # warm-up on the whole batch: the measured step then captures no CUDA graph and meets no new shape (a
    # warm-up on one group left the 64-row bucket's capture inside the first H200 figure, 2026-11-28)
    step(prompts)
    counter.reset()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rollout_s, update_s, generated, counts = step(prompts)
    positions = counter.counts["update"][0]
    name = card_facts().get("card", "") if device == "cuda" else ""
    share = update_share_of_peak(update_params(policy), positions, update_s, True, card_peak_tflops(name))
    step_s = rollout_s + update_s
    return {
        "row": "ours" if graphs else "ours-eager",
        "shape": shape,
        "decode": decode,
        "trajectories": len(prompts),
        "generated_tokens": int(generated.numel()),
        "step_s": step_s,
        "rollout_s": rollout_s,
        "update_s": update_s,
        "gen_tok_per_s": generated.numel() / rollout_s,
        "update_positions": positions,
        "update_%peak": share,
        "peak_gpu_gb" if device == "cuda" else "peak_rss_gb": _peak_memory_gb(device),
        **counts,
    }


# -- TRL -------------------------------------------------------------------------------------------------


def run_trl_row(shape: str, work: Workload, device: str) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the same weights and prompt ids: a warm-up step and a measured step."""
    import tempfile

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from searchr1.precision import fast_bf16

    vocab = SHAPES[shape]["vocab_size"]
    tokenizer = bench_tokenizer(vocab)
    # one prompt per question: TRL repeats it num_generations times
    prompts = prompt_ids(work, vocab)[:: work.samples]
    data = Dataset.from_list([{"prompt": " ".join(f"t{i}" for i in p)} for p in prompts])
    bf16 = fast_bf16(torch.device(device))
    model = build_model(shape, device, work.seed)
    if bf16:
        model = model.to(torch.bfloat16)

    def reward(completions: list, **_: Any) -> list[float]:  # made-up, as ours: share of ids divisible by 7
        ids = [[int(w[1:]) for w in c.split() if w[1:].isdigit()] for c in completions]
        return [sum(i % 7 == 0 for i in row) / max(1, len(row)) for row in ids]

    times: list[float] = []
    generation: list[float] = []
    lengths: list[float] = []

    class Watch(TrainerCallback):
        def on_step_begin(self, *args: Any, **kw: Any) -> None:
            _sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, *args: Any, **kw: Any) -> None:
            _sync(device)
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp,
            **trl_batch_settings(work),
            **trl_generation_settings(work),
            beta=0.0,
            learning_rate=1e-5,
            max_steps=2,
            logging_steps=1,
            report_to="none",
            use_cpu=device == "cpu",
            bf16=bf16,
            seed=work.seed,
            save_strategy="no",
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=LoraConfig(
                r=LORA_R, lora_alpha=LORA_ALPHA, target_modules="all-linear", task_type="CAUSAL_LM"
            ),
            callbacks=[Watch()],
        )
        inner = trainer._generate

        def timed_generate(*a: Any, **kw: Any) -> Any:
            _sync(device)
            t0 = time.perf_counter()
            out = inner(*a, **kw)
            _sync(device)
            generation.append(time.perf_counter() - t0)
            return out

        trainer._generate = timed_generate  # type: ignore[method-assign]
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        params = update_params(trainer.model)
    step_s, gen_s = times[-1], generation[-1] if generation else float("nan")
    generated = round(lengths[-1] * work.trajectories) if lengths else None
    positions = work.trajectories * (work.prompt_tokens + work.gen_tokens)
    name = card_facts().get("card", "") if device == "cuda" else ""
    update_s = step_s - gen_s
    return {
        "row": "trl",
        "shape": shape,
        "trajectories": work.trajectories,
        "generated_tokens": generated,
        "step_s": step_s,
        "rollout_s": gen_s,
        "update_s": update_s,
        "gen_tok_per_s": (generated or 0) / gen_s,
        "update_positions": positions,
        "update_%peak": update_share_of_peak(params, positions, update_s, True, card_peak_tflops(name)),
        "peak_gpu_gb" if device == "cuda" else "peak_rss_gb": _peak_memory_gb(device),
        "note": "single turn; update_s is the step minus its generation (rewards and log-probs included)",
    }


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """One row from a child's spec (``row``, ``shape``, ``device``, ``work``)."""
    work = Workload(**spec["work"])
    if spec["row"] == "trl":
        return run_trl_row(spec["shape"], work, spec["device"])
    return run_ours_row(spec["shape"], work, spec["device"], graphs=spec["row"] == "ours")


def child_spec(row: str, shape: str, work: Workload, device: str = "cuda") -> dict[str, Any]:
    return {"gpu": True, "row": row, "shape": shape, "device": device, "work": asdict(work)}
