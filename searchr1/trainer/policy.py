"""The policy as the update sees it: ``PolicyLogprobs`` wraps a causal LM so that ``forward`` returns
per-token log-probs (and entropies) through the chunked LM head of ``searchr1.trainer.logprobs``, as
a module (so DDP / FSDP hooks see the call).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

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
