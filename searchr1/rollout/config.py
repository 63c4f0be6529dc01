"""Configuration of multi-turn generation (section ``rollout``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class VLLMConfig:
    """The vLLM engine (``rollout.engine=vllm``): a vLLM OpenAI-compatible server that the engine starts
    from its own environment (``scripts/setup-vllm.sh``), health-checks and stops, or one already running."""

    url: str = ""
    """A running vLLM server (http://host:port) to use instead of starting one; it must serve the policy's
    model and see the folder the new weights are written to (rollout.vllm.weights_dir)."""
    python: str = ""
    """The interpreter of the vLLM environment; empty: $SEARCHR1_VLLM_PYTHON, else the repository's
    .venv-vllm (scripts/setup-vllm.sh), else this interpreter when it can import vllm."""
    weight_sync: Literal["auto", "full", "lora"] = "auto"
    """How the policy's new weights reach the server after each update: full (the merged weights written to
    rollout.vllm.weights_dir and reloaded in place) | lora (the LoRA adapter loaded as a new adapter; needs
    model.lora_r > 0) | auto (full: measured faster on CPU, where vLLM generates 3-6x slower with an adapter)."""
    enforce_eager: bool = True
    """No graph capture or compilation: starts in ~20 s instead of ~100 s on CPU; false on a GPU for speed."""
    tensor_parallel_size: int = 1
    """GPUs the server shards the model over (vLLM's --tensor-parallel-size)."""
    gpu_memory_utilization: float = 0.5
    """Share of each GPU's memory vLLM may take for weights and KV cache (the trainer uses the rest)."""
    sleep_during_update: bool = False
    """GPU only: after each rollout the server sleeps (vLLM's sleep mode, level 1: KV cache freed, weights
    moved to host memory) so the update has the GPU memory; it wakes before the new weights load or the next
    rollout. vLLM has no sleep mode on CPU."""
    cpu_kv_cache_gb: float = 1.0
    """CPU only: KV cache space in whole GiB (VLLM_CPU_KVCACHE_SPACE, which vLLM reads as an integer)."""
    cpu_threads: str = "auto"
    """CPU only: cores the server's threads are bound to (VLLM_CPU_OMP_THREADS_BIND): auto (the cores this
    process may run on) | a list like 1 or 0-3 | all."""
    max_num_seqs: int = 0
    """Sequences the server decodes together at most; 0 = rollout.max_batch_rows."""
    weights_dir: str = ""
    """Where full weights are written for the server to reload (one folder, rewritten each update); empty:
    a fresh folder under /dev/shm (memory), else the system temp folder."""
    start_timeout_s: float = 900.0
    """Seconds the server may take to start and load the model before the engine gives up."""
    request_timeout_s: float = 600.0
    """Seconds one generation or weight-sync request may take before the engine fails the step."""
    extra_args: list[str] = field(default_factory=list)
    """More arguments for the server command line (vLLM's own flags, e.g. [--max-model-len, '8192'])."""

    def validate(self, root: Any) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"rollout.vllm.tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.vllm.gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if not (self.cpu_kv_cache_gb >= 1 and float(self.cpu_kv_cache_gb).is_integer()):
            raise ValueError(
                "rollout.vllm.cpu_kv_cache_gb: vLLM takes a whole number of GiB >= 1 (VLLM_CPU_KVCACHE_SPACE), "
                f"got {self.cpu_kv_cache_gb}"
            )
        for name in ("start_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"rollout.vllm.{name}: must be > 0, got {getattr(self, name)}")
        if self.max_num_seqs < 0:
            raise ValueError(f"rollout.vllm.max_num_seqs: must be >= 0, got {self.max_num_seqs}")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"rollout.vllm.url: expected http://host:port, got {self.url!r}")
        lora = getattr(getattr(root, "model", None), "lora_r", 0)
        if self.weight_sync == "lora" and not lora:
            raise ValueError("rollout.vllm.weight_sync=lora needs LoRA training (model.lora_r > 0); use full")


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """Generation engine by registered name (``searchr1.rollout.registry``): hf (KV-cached, async search) |
    turn_sync (reference: re-encodes every turn) | vllm (a vLLM server, rollout.vllm) | single_turn (one
    reply, no search) | a plugin's."""
    dtype: str = "auto"
    """Generation dtype of whichever engine runs (hf, turn_sync, single_turn, vllm: the server's weights and
    activations): auto (bfloat16 where the GPU or CPU has bfloat16 units, else the model's) | model |
    float32 | bfloat16 | float16; `--dtype` of eval and ask. An HF engine given another dtype than the
    model's, or LoRA, generates with its own merged copy of the policy, refreshed after every update."""
    fast_decode: bool = True
    """KV cache layers with spare capacity, one prompt computation for fresh rows fed the same prompt, and
    matmul attention for single-token steps; false: transformers' DynamicCache and SDPA (the benchmark baseline)."""
    n: int = 5
    """Trajectories sampled per prompt (the GRPO group size)."""
    max_turns: int = 4
    """Turns in which a search is executed; one more answer-only turn follows (Search-R1's max_turns)."""
    max_turn_tokens: int = 500
    """Tokens generated per turn at most (a turn ends at </search>, </answer>, EOS or this limit)."""
    max_obs_tokens: int = 500
    """Tokens of one <information> block at most (longer ones are truncated and counted)."""
    max_response_tokens: int = 4096
    """Tokens after the prompt (generated + observations) at most; beyond it the trajectory is truncated."""
    max_context: int = 0
    """Prompt + response tokens at most; 0 = the model's max_position_embeddings."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts; stored log-probs are log_softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability (1.0 = off)."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0 = off)."""
    val_greedy: bool = True
    """Validation and evaluation decode greedily (False: they sample like training)."""
    last_search_notice: bool = False
    """After the observation of the last turn that may search (turn max_turns), append a line telling the model that
    its next turn may only answer (searchr1.data.prompts.LAST_SEARCH_NOTICE; observation tokens, never trained).
    Off: Search-R1's rule, where a search in the answer-only turn ends the trajectory unanswered."""
    invalid_action_message: bool = True
    """Append Search-R1's invalid-action message after a turn that neither searched nor answered."""
    eos_ends_trajectory: bool = False
    """EOS without an action ends the trajectory (False: Search-R1's rule, it is an invalid turn)."""
    max_query_chars: int = 512
    """Longer search queries are cut to this many characters before they reach the backend."""
    search_timeout_s: float = 30.0
    """Seconds one search attempt may take before it counts as failed."""
    search_retries: int = 2
    """Extra attempts after a failed or timed-out search; then the observation says the search failed."""
    max_search_failure_rate: float = 0.5
    """Stop training (checkpoint, non-zero exit) when more than this share of the searches of the last
    `search_failure_window` steps failed; 1.0 = never stop. The first failures print one warning."""
    search_failure_window: int = 5
    """Steps over which rollout.max_search_failure_rate is measured (the run stops no earlier)."""
    search_workers: int = 8
    """Threads that run searches while the HF engine keeps decoding other rows."""
    max_batch_rows: int = 64
    """Rows decoded together; further prompts take the slots of finished rows (continuous batching)."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """Decode steps of the slot decoder (a Llama-family model, fast_decode) with fixed shapes per bucket of
    8 / 16 / 32 / 64 / 128 rows, each captured once as a CUDA graph and replayed (rollout/static_decode.py):
    auto (on where the model is on a CUDA device, off elsewhere) | on (refused off CUDA or without the slot
    decoder) | off (eager steps, the CPU's path). GPU only: not measured on a GPU yet."""
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    """The vLLM engine's server and weight sync (rollout.engine=vllm)."""

    def validate(self, root: Any) -> None:
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise ValueError(f"rollout.cuda_graphs: expected auto | on | off, got {self.cuda_graphs!r}")
        if self.dtype not in ("auto", "model", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"rollout.dtype: expected auto | model | float32 | bfloat16 | float16, got {self.dtype!r}"
            )
        positive = ("n", "max_turn_tokens", "max_obs_tokens", "max_response_tokens", "max_query_chars")
        for name in (*positive, "search_workers", "max_batch_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_turns", "max_context", "search_retries", "top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"rollout.{name}: must be >= 0, got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(
                f"rollout.temperature: must be > 0 (use greedy decoding instead), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p: must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.max_search_failure_rate <= 1.0:
            raise ValueError(
                f"rollout.max_search_failure_rate: must be in [0, 1] (1.0 = never stop), got {self.max_search_failure_rate}"
            )
        if self.search_failure_window < 1:
            raise ValueError(f"rollout.search_failure_window: must be >= 1, got {self.search_failure_window}")
        if not self.search_timeout_s > 0:
            raise ValueError(f"rollout.search_timeout_s: must be > 0, got {self.search_timeout_s}")
