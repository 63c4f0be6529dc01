"""Hugging Face transformers engines: our own batched decoding loop over ``SlotBatch`` / ``KVBatch``.

``HFRolloutEngine`` — the fast one. One KV cache for the whole batch, kept across turns: after a
turn, only the new tokens (the turn's last token and the observation) are fed, in one forward
pass, never the whole context. Llama-family models (Llama, Qwen2, Mistral) decode through
``searchr1.rollout.slots.SlotBatch``: the policy's merged weights (LoRA folded in once per update),
fixed slots, the prompts' shared prefix stored once; other models (and ``rollout.fast_decode=false``)
through the Hugging Face modules and ``searchr1.rollout.kv.KVBatch``. Every row is its own state machine (``Episode``): when a row closes
``</search>``, its query goes to a thread pool and the other rows keep decoding; the row rejoins
as soon as its hits arrive. When a row finishes, the next prompt takes its slot (continuous
batching), and the cache is compacted when holes (idle columns) dominate it.

``TurnSyncRolloutEngine`` — the reference (Search-R1's original loop): every row generates a turn,
then every row's search runs as one batch, then the whole context of every row is re-encoded
from scratch. It shares the episode logic, the sampler and the per-row seeds with the fast engine,
so with the same search results both produce the same token ids; it is the correctness oracle
and the benchmark baseline.

Both engines store log-probs at the sampling temperature (see ``searchr1.rollout.sampling``).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from searchr1 import threads
from searchr1.errors import UserFacingError
from searchr1.modeling import MergedWeights, is_sharded, merged_weights_for
from searchr1.models import copy_weights, generation_copy, is_peft_model
from searchr1.precision import compute_dtype
from searchr1.retrieval.base import Retriever
from searchr1.rollout.actions import StopDetector, eos_token_ids
from searchr1.rollout.attention import decode_attention_for
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.decode_modes import decode_mode
from searchr1.rollout.engine import NewToken, PolicyWeights, RolloutEngine, TokenListener
from searchr1.rollout.episode import Episode, EpisodeContext, checked_prompts
from searchr1.rollout.kv import KVBatch, model_config
from searchr1.rollout.sampling import SamplingParams, logprob_temperature, row_generators, sample_tokens
from searchr1.rollout.search import SearchJob, SearchRunner
from searchr1.rollout.slots import SlotBatch
from searchr1.rollout.steer import Steer, SteerRow
from searchr1.rollout.types import Trajectory


class _HFEngineBase(RolloutEngine):
    weight_format = "module"  # the trainer's own model object: nothing is copied between processes
    slot_decoder = False
    """Decode Llama-family models through ``SlotBatch`` on the policy's merged weights (with fast_decode)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        retriever: Retriever,
        config: RolloutConfig | None = None,
        *,
        topk: int = 3,
        steer: Steer | None = None,
    ) -> None:
        self.policy = model
        """The trainer's model (maybe LoRA-wrapped); generation reads ``self.model``."""
        self.tokenizer = tokenizer
        self.retriever = retriever
        self.config = config or RolloutConfig()
        self.merged = self._merged_weights(model)
        """The policy's merged weights when decoding through ``SlotBatch``, else None."""
        self.model = model if self.merged is not None else self._generation_model(model)
        if self.config.cuda_graphs == "on" and self.merged is None:
            raise UserFacingError(
                "rollout.cuda_graphs=on needs the slot decoder (a Llama-family model, rollout.fast_decode=true)"
            )
        self.decode = "eager" if self.merged is None else decode_mode(self.config.cuda_graphs, self.device)
        """How the slot decoder runs single-token steps (``searchr1.rollout.static_decode``)."""
        self.topk = topk
        self.steer = steer
        self.stop = StopDetector(tokenizer, eos_token_ids(tokenizer, model))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad)
        self.runner = SearchRunner(
            retriever,
            topk=topk,
            timeout_s=self.config.search_timeout_s,
            retries=self.config.search_retries,
            workers=self.config.search_workers,
        )
        self.last_stats: dict[str, float] = {}
        self._on_tokens: TokenListener | None = None

    def _merged_weights(self, model: Any) -> MergedWeights | None:
        if not (self.slot_decoder and self.config.fast_decode):
            return None
        return merged_weights_for(model)  # None for a sharded model

    @property
    def generation_dtype(self) -> torch.dtype:
        """The dtype the engine decodes in (``rollout.dtype`` resolved for this device and model)."""
        if self.merged is None:
            return next(self.model.parameters()).dtype
        own = next(self.policy.parameters()).dtype
        return compute_dtype(self.config.dtype, self.device, own, "rollout.dtype")

    def _generation_model(self, model: Any) -> Any:
        """``model`` itself, or a frozen copy of it in the generation dtype (``rollout.dtype``) with any
        LoRA adapter merged in, when the dtype differs or LoRA is on (sharded models are shared)."""

        params = list(model.parameters())
        if is_sharded(model):
            return model
        own = params[0].dtype
        dtype = compute_dtype(self.config.dtype, params[0].device, own, "rollout.dtype")
        if dtype == own and not is_peft_model(model):
            return model
        return generation_copy(model, dtype)

    @property
    def owns_copy(self) -> bool:
        """Generation runs on a copy that ``update_weights`` refreshes from the policy."""
        return self.model is not self.policy

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def max_context(self) -> int:
        if self.config.max_context:
            return self.config.max_context
        return int(getattr(model_config(self.model), "max_position_embeddings", 0) or 2**31 - 1)

    def close(self) -> None:
        self.runner.close()

    def update_weights(self, weights: PolicyWeights) -> None:
        """Generate with the policy's new weights: ``weights.module`` is the model this engine was built on
        (nothing to do when it generates itself; its generation copy is refreshed from it otherwise); a
        ``weights.state_dict`` is loaded into the generating model."""

        if weights.state_dict is not None:
            self.model.load_state_dict(dict(weights.state_dict), strict=False)
            if self.merged is not None:
                self.merged = MergedWeights(self.model)  # frozen weights changed: merge afresh
        elif weights.module is not None and self.merged is not None:
            if weights.module is not self.merged.model:
                self.merged = merged_weights_for(weights.module)
                self.policy = self.model = weights.module
        elif weights.module is not None and self.owns_copy:
            copy_weights(weights.module, self.model)

    def _prepare(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None,
        sampling: SamplingParams | None,
    ) -> tuple[list[list[int]], list[dict[str, Any]], SamplingParams, EpisodeContext]:
        prompts, metas_ = checked_prompts(prompt_ids, metas)
        sampling = sampling or SamplingParams.from_config(self.config)
        turn_limit = sampling.max_turn_tokens or self.config.max_turn_tokens
        ctx = EpisodeContext(self.tokenizer, self.config, self.stop, turn_limit, self.max_context())
        return prompts, metas_, sampling, ctx

    def _choose(
        self,
        episodes: list[Episode],
        logits: torch.Tensor,
        sampling: SamplingParams,
        generators: list[torch.Generator],
    ) -> tuple[list[int], list[float]]:
        """Sample one token per episode; store ``log_softmax(logits / T)`` at it (see ``sampling``)."""
        logits = logits.float()
        logp = torch.log_softmax(logits / logprob_temperature(sampling), dim=-1)
        if self.steer is not None:
            rows = [SteerRow(ep.index, ep.traj.meta, ep.traj.turns, ep.turn_ids) for ep in episodes]
            logits = self.steer(rows, logits)
        tokens = sample_tokens(logits, sampling, [generators[ep.index] for ep in episodes])
        chosen = logp.gather(1, tokens[:, None]).squeeze(1)
        # one read from the device for both (float64 holds every token id and float32 log-prob exactly)
        read = torch.stack([tokens.to(torch.float64), chosen.to(torch.float64)]).tolist()
        ids = [int(t) for t in read[0]]
        if self._on_tokens is not None:
            self._on_tokens(
                [NewToken(ep.index, ep.traj.turns, t) for ep, t in zip(episodes, ids, strict=True)]
            )
        return ids, read[1]

    def _deliver(self, job: SearchJob, episodes: list[Episode | None]) -> None:
        for k, i in enumerate(job.owners):
            ep = episodes[i]
            assert ep is not None
            hits = job.result[k] if job.result is not None else None
            ep.receive(hits, job.error, wait_s=job.elapsed)

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None = None,
        *,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        on_tokens: TokenListener | None = None,
    ) -> list[Trajectory]:
        """Run ``_generate`` in eval mode without gradients, restoring the model's mode after."""
        if self.merged is not None and is_sharded(self.policy):
            # FSDP sharded the policy after this engine was built: the HF modules decode it
            self.merged = None
            self.model = self.policy
        was_training = self.model.training
        self.model.eval()
        self._on_tokens = on_tokens
        try:
            hf_modules = self.config.fast_decode and self.merged is None
            fast = decode_attention_for(self.model) if hf_modules else contextlib.nullcontext()
            with torch.no_grad(), fast:
                return self._generate(prompt_ids, metas, sampling, seed)
        finally:
            self.model.train(was_training)
            self._on_tokens = None

    def _generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None,
        sampling: SamplingParams | None,
        seed: int | None,
    ) -> list[Trajectory]:
        raise NotImplementedError


class HFRolloutEngine(_HFEngineBase):
    """KV cache kept across turns, asynchronous search, continuous batching (module docstring)."""

    slot_decoder = True

    def _generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None,
        sampling: SamplingParams | None,
        seed: int | None,
    ) -> list[Trajectory]:
        prompts, metas, sampling, ctx = self._prepare(prompt_ids, metas, sampling)
        n = len(prompts)
        if n == 0:
            return []
        t0 = time.perf_counter()
        generators = row_generators(seed, n, self.device)
        episodes: list[Episode | None] = [None] * n
        queue = deque(range(n))
        n_slots = min(self.config.max_batch_rows, n)
        if self.merged is not None:
            stream = min(self.max_context(), max(map(len, prompts)) + self.config.max_response_tokens + 1)
            kv: KVBatch | SlotBatch = SlotBatch(
                self.merged, n_slots, self.generation_dtype, prompts,
                stream_tokens=stream if self.decode != "eager" else 0, decode=self.decode,
            )  # fmt: skip
        else:
            kv = KVBatch(self.model, n_slots, self.pad_id, fast=self.config.fast_decode)
        slot_episode: list[int | None] = [None] * kv.n_slots
        waiting: set[int] = set()
        jobs: list[SearchJob] = []
        steps = compactions = 0

        def live(slot: int) -> Episode | None:
            i = slot_episode[slot]
            ep = episodes[i] if i is not None else None
            return ep if ep is not None and not ep.done else None

        while True:
            # 1. admit queued prompts into free slots
            for slot in range(kv.n_slots):
                while queue and live(slot) is None:
                    i = queue.popleft()
                    episodes[i] = Episode.start(i, prompts[i], metas[i], ctx)
                    if not episodes[i].done:  # type: ignore[union-attr]
                        kv.reset_slot(slot)
                        slot_episode[slot] = i
            # 2. collect finished searches: those rows rejoin
            for job in [j for j in jobs if j.poll()]:
                jobs.remove(job)
                self._deliver(job, episodes)
                waiting.difference_update(job.owners)
            # 3. one forward step over every row that has tokens to feed
            feeds: dict[int, list[int]] = {}
            for slot in range(kv.n_slots):
                ep = live(slot)
                if ep is not None and ep.index not in waiting:
                    feeds[slot] = ep.tokens_from(kv.n_real[slot])
            if not feeds:
                if jobs:
                    self.runner.wait_any(jobs)
                    continue
                if queue:
                    continue
                break
            logits = kv.step(feeds)
            steps += 1
            threads.adapt()  # fewer torch threads while other processes keep cores busy (searchr1.threads)
            stepped = [episodes[slot_episode[s]] for s in sorted(feeds)]  # type: ignore[index]
            tokens, logprobs = self._choose(stepped, logits, sampling, generators)  # type: ignore[arg-type]
            searching: list[Episode] = []
            queries: list[str] = []
            for ep, tok, lp in zip(stepped, tokens, logprobs, strict=True):
                assert ep is not None
                if ep.add_token(tok, lp):
                    end = ep.end_turn()
                    if end.kind == "search":
                        searching.append(ep)
                        queries.append(end.query)
            if searching:
                owners = [ep.index for ep in searching]
                jobs.append(self.runner.submit(queries, owners))
                waiting.update(owners)
            # 4. keep the cache small: drop finished slots once nothing is queued, squeeze out holes
            slots_live = [s for s in range(kv.n_slots) if live(s) is not None]
            if kv.should_compact(slots_live, queue_empty=not queue):
                keep = slots_live if not queue else list(range(kv.n_slots))
                if keep:
                    kv.compact(keep)
                    slot_episode = [slot_episode[s] for s in keep]
                    compactions += 1
        self.last_stats = {
            "wall_s": time.perf_counter() - t0,
            "forward_calls": float(kv.forward_calls),
            "fed_tokens": float(kv.fed_tokens),
            "decode_steps": float(steps),
            "compactions": float(compactions),
            "peak_kv_cache_bytes": float(kv.peak_cache_bytes),
            "shared_prompt_tokens": float(kv.shared_prompt_tokens),
        }
        static = getattr(kv, "static", None)
        if static is not None:
            self.last_stats.update(
                static_steps=float(static.static_steps),
                eager_steps=float(static.eager_steps),
                graph_captures=float(static.captures),
            )
        return [ep.finalize(t0) for ep in episodes if ep is not None]


class TurnSyncRolloutEngine(_HFEngineBase):
    """Reference: generate a turn for every row, search for every row, re-encode everything."""

    def _generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        metas: Sequence[Mapping[str, Any]] | None,
        sampling: SamplingParams | None,
        seed: int | None,
    ) -> list[Trajectory]:
        prompts, metas, sampling, ctx = self._prepare(prompt_ids, metas, sampling)
        n = len(prompts)
        t0 = time.perf_counter()
        generators = row_generators(seed, n, self.device)
        episodes: list[Episode | None] = [Episode.start(i, prompts[i], metas[i], ctx) for i in range(n)]
        forward_calls = fed_tokens = 0
        peak_cache = 0
        rows = self.config.max_batch_rows
        for start in range(0, n, rows):
            group = [ep for ep in episodes[start : start + rows] if ep is not None]
            while True:
                active = [ep for ep in group if not ep.done]
                if not active:
                    break
                # one turn for every active row, from a fresh cache over the whole context
                kv = KVBatch(self.model, len(active), self.pad_id, fast=self.config.fast_decode)
                feeds = {k: ep.context_ids for k, ep in enumerate(active)}
                ended: set[int] = set()
                while feeds:
                    logits = kv.step(feeds)
                    order = sorted(feeds)
                    tokens, logprobs = self._choose([active[k] for k in order], logits, sampling, generators)
                    feeds = {}
                    for k, tok, lp in zip(order, tokens, logprobs, strict=True):
                        if active[k].add_token(tok, lp):
                            ended.add(k)
                        else:
                            feeds[k] = [tok]
                forward_calls += kv.forward_calls
                fed_tokens += kv.fed_tokens
                peak_cache = max(peak_cache, kv.peak_cache_bytes)
                del kv
                # the turn barrier: every row's action, then one batched search for all of them
                searching = [ep for ep in active if ep.end_turn().kind == "search"]
                if searching:
                    job = self.runner.submit(
                        [ep.traj.queries[-1] for ep in searching], [ep.index for ep in searching]
                    )
                    job.wait()
                    self._deliver(job, episodes)
        self.last_stats = {
            "wall_s": time.perf_counter() - t0,
            "forward_calls": float(forward_calls),
            "fed_tokens": float(fed_tokens),
            "peak_kv_cache_bytes": float(peak_cache),
        }
        return [ep.finalize(t0) for ep in episodes if ep is not None]
