"""Decoder positions and LM-head rows a step really computes (the FLOP counts of the rl-step benchmarks)."""

from __future__ import annotations

from typing import Any


class ComputeCounter:
    """Decoder positions and LM-head rows actually computed, apart for the update (gradients on) and the
    log-prob passes (no gradients): wraps the trainer's decoder and LM-head functions (the Hugging Face
    path's ``final_hidden_states``, the fused decoder's ``hidden``, and ``weight_head_logprobs``)."""

    def __init__(self) -> None:
        self.counts = {"update": [0, 0], "logprobs": [0, 0]}

    def install(self) -> None:
        import torch

        from searchr1.trainer import fused_decoder, logprobs

        hidden, head = logprobs.final_hidden_states, logprobs.weight_head_logprobs
        fused_hidden = fused_decoder.FusedDecoder.hidden

        def phase() -> list[int]:
            return self.counts["update" if torch.is_grad_enabled() else "logprobs"]

        def counted_hidden(model: Any, input_ids: Any, *args: Any, shared_prefix: int = 0, **kw: Any) -> Any:
            b, t = input_ids.shape
            phase()[0] += shared_prefix + b * (t - shared_prefix)
            return hidden(model, input_ids, *args, shared_prefix=shared_prefix, **kw)

        def counted_fused(decoder: Any, input_ids: Any, *args: Any, **kw: Any) -> Any:
            phase()[0] += int(input_ids.numel())
            return fused_hidden(decoder, input_ids, *args, **kw)

        def counted_head(rows: Any, *args: Any, **kw: Any) -> Any:
            phase()[1] += int(rows.shape[0])
            return head(rows, *args, **kw)

        logprobs.final_hidden_states = counted_hidden
        logprobs.weight_head_logprobs = counted_head
        fused_decoder.weight_head_logprobs = counted_head
        fused_decoder.FusedDecoder.hidden = counted_fused  # type: ignore[method-assign]

    def reset(self) -> None:
        self.counts = {"update": [0, 0], "logprobs": [0, 0]}
