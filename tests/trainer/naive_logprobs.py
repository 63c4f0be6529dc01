"""The reference the fast log-prob paths are tested against: full ``[B, T, V]`` logits, float32
``log_softmax``, ``gather`` (test-only: production uses ``searchr1.trainer.logprobs.token_logprobs``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from searchr1.trainer.logprobs import attention_kwargs, valid_target_mask


def naive_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference implementation: full ``[B, T, V]`` logits from ``model(...)``, float32
    ``log_softmax``, ``gather``. Same alignment and zeros as ``token_logprobs``; the tests' reference."""
    logits = model(
        input_ids=input_ids, use_cache=False, **attention_kwargs(model, attention_mask, position_ids)
    ).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    valid = valid_target_mask(input_ids, attention_mask, position_ids)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    out = F.pad(lp, (1, 0)) * valid
    if return_entropy:
        ent = -(logp.exp() * logp).sum(-1)
        return out, F.pad(ent, (1, 0)) * valid
    return out
