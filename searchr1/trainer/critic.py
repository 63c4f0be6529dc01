"""The PPO critic: a causal LM's decoder with a scalar value head on its last hidden state.

``V(s_t)`` estimates the return from the state before token ``t`` (Schulman et al. 2017, PPO; the
LM form of Ouyang et al. 2022 and Search-R1): ``V(s_t) = w . h_{t-1} + b`` with ``h`` the decoder's
final hidden states. The alignment is the one of ``searchr1.trainer.logprobs``: ``values[b, t]`` is
the value of the state in which token ``t`` was chosen (so it sits next to ``logprobs[b, t]`` and the
advantage of token ``t``), computed from the hidden state at ``t - 1``; position 0 and invalid
positions (padding, the first token of a packed sequence) are 0.

Only the decoder is kept (the LM head of a causal-LM checkpoint is dropped: no ``[T, V]`` logits,
no vocabulary-sized weight in the critic's memory unless it is tied to the input embeddings). The
value head is applied to the valid positions only, in float32, like the chunked LM head of the
log-prob path (a ``[N, H] x [H, 1]`` product needs no further chunking).

``save_pretrained(folder)`` writes the decoder as an ordinary Hugging Face folder (``AutoModel``
loads it) plus ``value_head.safetensors``; ``ValueModel.from_pretrained`` loads either such a
folder or a plain causal-LM checkpoint (then with a freshly initialised head: the critic's
warm start from the policy, as in the paper).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from searchr1.models import DTYPES
from searchr1.trainer.logprobs import decoder_of, final_hidden_states, valid_target_mask

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_HEAD_CONFIG = "value_head.json"


class ValueModel(nn.Module):
    """``ValueModel(model)``: ``model`` is a Hugging Face causal LM, its base model, or a ``peft``
    wrapper of either; only its decoder is used."""

    def __init__(self, model: nn.Module, value_head: nn.Linear | None = None, *, seed: int | None = 0):
        super().__init__()
        self.backbone = decoder_of(model)
        hidden = _hidden_size(self.backbone)
        if value_head is None:
            value_head = nn.Linear(hidden, 1)
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            with torch.no_grad():
                # small init: initial values ~0, so the first critic steps do not disturb GAE
                value_head.weight.copy_(torch.randn(1, hidden, generator=generator) / (hidden + 1))
                value_head.bias.zero_()
        if value_head.in_features != hidden or value_head.out_features != 1:
            raise ValueError(
                f"value head must map hidden size {hidden} to 1, got "
                f"{value_head.in_features} -> {value_head.out_features}"
            )
        self.value_head = value_head.float()

    @property
    def config(self) -> Any:
        return self.backbone.config

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.backbone.gradient_checkpointing_enable(**kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        target_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, T]`` float32 values (alignment in the module docstring). Packed rows
        (``position_ids`` restarting at 0) are kept apart exactly like in ``token_logprobs``;
        ``target_mask`` restricts the computation, e.g. to generated tokens."""
        hidden = final_hidden_states(self.backbone, input_ids, attention_mask, position_ids)
        valid = valid_target_mask(input_ids, attention_mask, position_ids)
        if target_mask is not None:
            valid &= target_mask.bool()
        rows = hidden[:, :-1][valid[:, 1:]]
        values = self.value_head(rows.float()).squeeze(-1)
        return values.new_zeros(valid.shape).masked_scatter(valid, values)

    def save_pretrained(self, folder: str | Path, **kwargs: Any) -> Path:
        """Decoder as a Hugging Face folder (safetensors) + ``value_head.safetensors``."""
        from safetensors.torch import save_file

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(out, safe_serialization=True, **kwargs)
        head = {k: v.detach().contiguous().cpu() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(out / VALUE_HEAD_FILE))
        (out / VALUE_HEAD_CONFIG).write_text(
            json.dumps({"hidden_size": self.value_head.in_features, "alignment": "values[t] = V(tokens[:t])"})
            + "\n"
        )
        return out

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | Path,
        dtype: str | torch.dtype = "float32",
        *,
        seed: int | None = 0,
        **kwargs: Any,
    ) -> ValueModel:
        """Load a saved critic, or start one from a causal-LM checkpoint (head freshly initialised)."""
        from transformers import AutoModel

        torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
        backbone = AutoModel.from_pretrained(str(path_or_id), dtype=torch_dtype, **kwargs)
        head_file = Path(str(path_or_id)) / VALUE_HEAD_FILE
        if not head_file.exists():
            return cls(backbone, seed=seed)
        from safetensors.torch import load_file

        state = load_file(str(head_file))
        head = nn.Linear(state["weight"].shape[1], 1)
        head.load_state_dict(state)
        return cls(backbone, head)


def _hidden_size(backbone: nn.Module) -> int:
    config = getattr(backbone, "config", None)
    size = getattr(config, "hidden_size", None)
    if size is None:
        get_text = getattr(config, "get_text_config", None)
        size = getattr(get_text(), "hidden_size", None) if callable(get_text) else None
    if size is None:
        raise ValueError(f"cannot find hidden_size in the config of {type(backbone).__name__}")
    return int(size)
