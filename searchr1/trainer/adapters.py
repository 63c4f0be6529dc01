"""The trainer's only contact points with the other packages (rollout, rewards, data, critic, KL).

Each function is a thin call into the owning package, so the loop reads as the data path and a
change of another package's signature is fixed here, in one place.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from searchr1.algorithms.kl import kl_loss_matrix, kl_penalty
from searchr1.data.formats import load_samples as read_samples
from searchr1.data.prompts import build_prompt
from searchr1.data.synth import SynthConfig, generate_world, write_world
from searchr1.rewards.composite import build_reward as build_composite_reward
from searchr1.rollout.registry import build_engine
from searchr1.rollout.sampling import SamplingParams
from searchr1.trainer.critic import ValueModel
from searchr1.trainer.fused_decoder import FusedDecoder, StepPrefix, first_target_column, fused_token_logprobs
from searchr1.trainer.fused_decoder import compute_dtype as fused_compute_dtype
from searchr1.trainer.fused_decoder import unsupported_reason as fused_unsupported_reason
from searchr1.trainer.logprobs import (
    MIN_SHARED_PREFIX,
    attention_kwargs,
    chunked_head_logprobs,
    common_prefix_length,
    decoder_of,
    final_hidden_states,
    lm_head_function,
    token_logprobs,
    valid_target_mask,
)

# ----------------------------------------------------------------------------------------------
# Models: the forward passes the update needs, as modules (so DDP / FSDP hooks see the call).


_FUSED_DECODERS: weakref.WeakKeyDictionary[nn.Module, FusedDecoder] = weakref.WeakKeyDictionary()
"""One fused decoder per model (its merged weights are reused by every ``PolicyLogprobs`` of the model)."""


def fused_decoder_for(model: nn.Module) -> FusedDecoder | None:
    """The fused decoder of ``model`` (``searchr1.trainer.fused_decoder``), or None when it does not apply."""
    decoder = _FUSED_DECODERS.get(model)
    if decoder is None:
        if fused_unsupported_reason(model) is not None:
            return None
        decoder = _FUSED_DECODERS[model] = FusedDecoder(model)
    return decoder


class PolicyLogprobs(nn.Module):
    """Wraps a causal LM: ``forward`` returns per-token log-probs (and entropies) via the chunked
    LM head of ``searchr1.trainer.logprobs`` (never full-vocabulary float32 logits).

    ``fused``: run Llama-family models through ``searchr1.trainer.fused_decoder`` (merged LoRA weights,
    fused projections, matmul attention); with ``share_prefix`` too, ``begin_step`` computes the prompt
    prefix of a whole optimizer step once. Other models, packed rows and the vocabulary-KL path take the
    Hugging Face modules."""

    def __init__(
        self, model: nn.Module, chunk_size: int = 1024, share_prefix: bool = False, fused: bool = False
    ) -> None:
        super().__init__()
        self.model = model
        self.chunk_size = chunk_size
        self.share_prefix = share_prefix
        """Run a prompt prefix common to every row of a micro-batch once (``final_hidden_states``)."""
        self.fused = fused
        self._step_prefix: StepPrefix | None = None

    def fused_decoder(self) -> FusedDecoder | None:
        """The fused decoder when this module uses one (``fused`` and a supported, unsharded model)."""
        if not self.fused or self._sharded():
            return None
        return fused_decoder_for(self.model)

    def begin_step(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor
    ) -> StepPrefix | None:
        """Compute the prefix every row of an optimizer step's rows shares (before any target) once, for the
        micro-batches that follow; ``end_step`` runs its backward. None (nothing started) when there is no
        such prefix of at least ``MIN_SHARED_PREFIX`` tokens or the fused decoder does not apply."""
        decoder = self.fused_decoder() if self.share_prefix else None
        if decoder is None or input_ids.shape[0] < 2:
            return None
        valid = valid_target_mask(input_ids, attention_mask, None) & target_mask.bool()
        p = min(common_prefix_length(input_ids, attention_mask), first_target_column(valid) - 1)
        if p < MIN_SHARED_PREFIX:
            return None
        dtype = fused_compute_dtype(decoder, input_ids.device)
        self._step_prefix = StepPrefix(decoder, input_ids[0, :p], dtype)
        return self._step_prefix

    def end_step(self, backward: bool = True) -> None:
        """Finish the step's prefix: with ``backward``, its gradients reach the weights; it is dropped."""
        prefix, self._step_prefix = self._step_prefix, None
        if prefix is not None and backward:
            prefix.backward()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        *,
        target_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        return_entropy: bool = False,
        return_logits: bool = False,
    ) -> Any:
        if return_logits:
            return self._with_logits(input_ids, attention_mask, position_ids, target_mask, temperature)
        if self._sharded():
            return self._through_root(
                input_ids, attention_mask, position_ids, target_mask, temperature, return_entropy
            )
        decoder = self.fused_decoder() if position_ids is None else None
        if decoder is not None:
            lp, ent = fused_token_logprobs(
                decoder, input_ids, attention_mask, target_mask=target_mask, temperature=temperature,
                return_entropy=return_entropy, chunk_size=self.chunk_size, step_prefix=self._step_prefix,
                share_prefix=self.share_prefix, min_prefix=MIN_SHARED_PREFIX,
            )  # fmt: skip
            return lp, ent
        out = token_logprobs(
            self.model,
            input_ids,
            attention_mask,
            position_ids,
            chunk_size=self.chunk_size,
            temperature=temperature,
            return_entropy=return_entropy,
            target_mask=target_mask,
            share_prefix=self.share_prefix,
        )
        if return_entropy:
            return out
        return out, None

    def _sharded(self) -> bool:
        """Whether FSDP2 manages the model: then every pass must enter through its root module."""
        if not hasattr(self, "_is_sharded"):
            self._is_sharded = any(type(m).__name__.startswith("FSDP") for m in self.model.modules())
        return self._is_sharded

    def _final_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """Last normed hidden states ``[B, T, H]``. Under FSDP2 the causal LM's own forward runs (so
        its hooks gather the parameters) with ``logits_to_keep=1`` and a hook catches the decoder's
        output; otherwise the decoder runs alone."""

        if not self._sharded():
            return final_hidden_states(self.model, input_ids, attention_mask, position_ids)
        caught: dict[str, torch.Tensor] = {}

        def hook(_module: nn.Module, _args: Any, out: Any) -> None:
            caught["h"] = out[0] if isinstance(out, tuple) else out.last_hidden_state

        handle = decoder_of(self.model).register_forward_hook(hook)
        try:
            out = self.model(
                input_ids=input_ids,
                use_cache=False,
                logits_to_keep=1,
                **attention_kwargs(self.model, attention_mask, position_ids),
            )
        finally:
            handle.remove()
        # keep the root's output in the graph (value unchanged): FSDP2 runs the root's backward
        # hooks - the gradient reduce-scatter and reshard of its own parameters - from there
        return caught["h"] + 0.0 * out.logits.sum().to(caught["h"].dtype)

    def _head_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        target_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden rows ``[N, H]`` predicting the N valid targets, the targets ``[N]``, valid ``[B, T]``)."""

        hidden = self._final_hidden(input_ids, attention_mask, position_ids)
        valid = valid_target_mask(input_ids, attention_mask, position_ids)
        if target_mask is not None:
            valid &= target_mask.bool()
        return hidden[:, :-1][valid[:, 1:]], input_ids[:, 1:][valid[:, 1:]], valid

    def _through_root(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        target_mask: torch.Tensor | None,
        temperature: float,
        return_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``token_logprobs`` for a sharded model (same chunked LM head, entered through the root)."""

        rows, targets, valid = self._head_inputs(input_ids, attention_mask, position_ids, target_mask)
        head, head_fn = lm_head_function(self.model)
        lp, ent = chunked_head_logprobs(
            rows, head, targets, head_fn=head_fn, chunk_size=self.chunk_size,
            temperature=temperature, return_entropy=return_entropy,
        )  # fmt: skip
        return _scatter(valid, lp), (_scatter(valid, ent) if ent is not None else None)

    def _with_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        target_mask: torch.Tensor | None,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logprobs [B, T], entropy [B, T], logits [N, V] float32 at the N valid target positions,
        valid [B, T]) - for a KL over the vocabulary (``algorithm.kl_loss_type=full_*``). Holds the
        ``[N, V]`` logits of the trained tokens of one micro-batch: keep micro-batches small."""

        rows, targets, valid = self._head_inputs(input_ids, attention_mask, position_ids, target_mask)
        head, head_fn = lm_head_function(self.model)
        logits = (head_fn or head)(rows).float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        lp = logp.gather(1, targets[:, None]).squeeze(1)
        ent = -(logp.exp() * logp).sum(-1)
        return _scatter(valid, lp), _scatter(valid, ent), logits, valid


def _scatter(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` zeros with ``values`` ``[N]`` at the N valid positions."""
    return values.new_zeros(valid.shape).masked_scatter(valid, values)


def build_value_model(path: Any, dtype: str = "float32") -> nn.Module:
    """The PPO critic: a value head on a causal LM's decoder (``searchr1.trainer.critic``);
    ``values[b, t]`` is the value of the state before token ``t`` (aligned with the log-probs)."""

    return ValueModel.from_pretrained(str(path), dtype=dtype)


# ----------------------------------------------------------------------------------------------
# KL between policy and reference on sampled tokens.


def token_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` (``algorithm.kl_estimator``) from the algorithms registry."""

    return kl_penalty(logprobs, ref_logprobs, estimator)


def vocab_kl_matrix(
    algo: Any,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    input_ids: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """``[B, T]`` KL over the vocabulary (full or top-k, ``algorithm.kl_loss_type``) at the valid
    positions, from the ``[N, V]`` logits of policy and reference there."""

    tokens = input_ids[valid]
    kl_rows = kl_loss_matrix(
        algo,
        log_prob=logprobs[valid][None],
        ref_log_prob=ref_logprobs[valid][None],
        old_log_prob=old_logprobs[valid][None],
        logits=logits[None],
        ref_logits=ref_logits[None],
        tokens=tokens[None],
    )[0]
    return _scatter(valid, kl_rows)


# ----------------------------------------------------------------------------------------------
# Rollout.


def make_engine(cfg: Any, model: nn.Module, tokenizer: Any, retriever: Any) -> Any:
    """The rollout engine named by ``rollout.engine`` (``searchr1.rollout.registry``)."""
    return build_engine(cfg, model, tokenizer, retriever)


def sampling_params(rollout_cfg: Any, greedy: bool = False) -> Any:
    return SamplingParams.greedy_eval(rollout_cfg) if greedy else SamplingParams.from_config(rollout_cfg)


def generate(
    engine: Any, prompt_ids: list[list[int]], metas: list[dict], sampling: Any, seed: int
) -> list[Any]:
    return engine.generate(prompt_ids, metas, sampling=sampling, seed=seed)


# ----------------------------------------------------------------------------------------------
# Rewards.


def build_reward(reward_cfg: Any) -> Any:
    return build_composite_reward(reward_cfg)


def score(reward_fn: Any, trajectories: Sequence[Any], decode: Any) -> list[Any]:
    """``RewardOutput(total, components, ...)`` per trajectory (batched when the reward supports it)."""
    if hasattr(reward_fn, "score_trajectories"):
        return reward_fn.score_trajectories(list(trajectories), decode)
    return [reward_fn(t, decode) for t in trajectories]


# ----------------------------------------------------------------------------------------------
# Data.


def load_samples(paths: Sequence[str]) -> list[Any]:
    """``Sample(id, question, golden_answers, data_source, ...)`` rows of jsonl / parquet files."""

    rows: list[Any] = []
    for path in paths:
        rows.extend(read_samples(path))
    return rows


def prompt_text(sample: Any, template: str, tokenizer: Any) -> str:
    """The prompt the policy continues (stored chat messages of a parquet row, else the template)."""
    if hasattr(sample, "prompt"):
        return sample.prompt(template, tokenizer)

    return build_prompt(sample_meta(sample, 0)["question"], template, tokenizer)


def sample_meta(sample: Any, index: int) -> dict[str, Any]:
    """What travels with a trajectory: question, golden answers, source, ids."""
    if hasattr(sample, "meta"):
        meta = dict(sample.meta())
    else:
        meta = {
            "id": sample.get("id", str(index)),
            "question": sample.get("question", ""),
            "golden_answers": list(sample.get("golden_answers", []) or []),
            "data_source": sample.get("data_source"),
        }
    meta["data_source"] = meta.get("data_source") or "default"
    meta["sample_index"] = index
    return meta


def synthetic_world(out_dir: Any, seed: int) -> dict[str, Any]:
    """Generate (once) the embedded synthetic world under ``out_dir``; returns its file paths."""
    from pathlib import Path

    out = Path(out_dir)
    marker = out / ".complete"
    if not marker.is_file():
        world = generate_world(SynthConfig(seed=seed))
        write_world(world, out)
        marker.write_text("ok\n")
    return {p.stem: p for p in out.glob("*.jsonl")}
