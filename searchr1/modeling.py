"""Llama-family decoders (Llama, Qwen2, Mistral) as plain tensors: the merged weights that both the policy
update (``searchr1.trainer.fused_decoder``) and the rollout's slot decoder (``searchr1.rollout.slots``) run.

* **Merged LoRA weights.** Within one optimizer step the weights do not change, so each adapted linear
  layer is one product with ``W = W0 + s B A`` (merged once per step, in the compute dtype) instead of the
  base product plus two rank-r products and peft's dtype casts.
* **Fused projections.** Q, K and V are one product (their weights stacked), and so are gate and up.

``MergedWeights(model).plans(dtype)`` returns the per-layer plans, cached until a trainable parameter
changes in place (the optimizer steps) or the adapters are switched off or on; ``merged_weights_for``
keeps one per model, so the update and the rollout share one merged copy.

The layer arithmetic follows Hugging Face's modules under bfloat16 autocast: the residual stream and the
norms in float32, products in the compute dtype, rotary embedding in float32.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

FUSED_MODEL_TYPES = ("llama", "qwen2", "mistral")
"""``config.model_type`` values whose decoder layers this module reproduces."""


def _causal_lm(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _lora_parts(module: nn.Module) -> tuple[nn.Linear, list[tuple[nn.Parameter, nn.Parameter, float]]]:
    """(the plain linear layer, its active adapters as (A [r, in], B [out, r], scale)) of a linear module
    that peft may have wrapped."""
    base = getattr(module, "base_layer", None)
    if base is None:
        return module, []  # type: ignore[return-value]
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return base, []
    adapters = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        adapters.append((module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name])))
    return base, adapters


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 sharded ``model`` (its parameters are DTensors)."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot run through the fused decoder (None: it can)."""
    lm = _causal_lm(model)
    if is_sharded(lm):
        return "sharded (FSDP) parameters"
    config = getattr(lm, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FUSED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {FUSED_MODEL_TYPES}"
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(lm, "is_gradient_checkpointing", False):
        return "gradient checkpointing"
    head = lm.get_output_embeddings()
    if type(head) is not nn.Linear or head.bias is not None:
        return "an LM head that is not a plain bias-free linear layer"
    if getattr(config, "logit_scale", None) is not None or getattr(config, "final_logit_softcapping", None):
        return "scaled or soft-capped logits"
    for module in lm.modules():
        if hasattr(module, "lora_A"):
            for name in module.active_adapters:
                if name not in module.lora_A:
                    continue
                if getattr(module, "use_dora", {}).get(name, False):
                    return "DoRA adapters"
                if not isinstance(module.lora_dropout[name], nn.Identity):
                    return "LoRA dropout"
                if module.lora_B[name].bias is not None:
                    return "LoRA bias"
            if type(module.base_layer) is not nn.Linear:
                return f"an adapted layer of type {type(module.base_layer).__name__}"
    if lm.training and getattr(config, "attention_dropout", 0.0):
        return "attention dropout"
    return None


@dataclass
class _Piece:
    """The rows ``[start, stop)`` of a fused weight that one original linear layer produces."""

    start: int
    stop: int
    master: nn.Parameter | None
    """The layer's weight when it is trained (full fine-tuning), else None."""
    bias_master: nn.Parameter | None
    adapters: list[tuple[nn.Parameter, nn.Parameter, float]]
    """Trainable LoRA (A, B, scale) pairs."""

    def tracked(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        if self.master is not None:
            out.append(self.master)
        if self.bias_master is not None:
            out.append(self.bias_master)
        for a, b, _ in self.adapters:
            out += [a, b]
        return out


@dataclass
class LinearPlan:
    """One (possibly fused) linear layer for one optimizer step: the merged weight in the compute dtype
    and what the backward pass owes gradients to."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    pieces: list[_Piece]
    tracked: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tracked = [t for piece in self.pieces for t in piece.tracked()]


def merge_linear(modules: list[nn.Module], dtype: torch.dtype) -> LinearPlan:
    """The plan of ``modules`` (linear layers, maybe peft-wrapped, with one input) stacked along their outputs:
    ``W = W0 + sum s B A`` per layer, concatenated, in ``dtype``."""
    weights, biases, pieces = [], [], []
    start = 0
    for module in modules:
        base, adapters = _lora_parts(module)
        w = base.weight.detach()
        if adapters:
            w = w.float()
            for a, b, scale in adapters:
                w = w + scale * (b.detach().float() @ a.detach().float())
        weights.append(w.to(dtype))
        biases.append(base.bias.detach().to(dtype) if base.bias is not None else None)
        stop = start + w.shape[0]
        trained = [(a, b, s) for a, b, s in adapters if a.requires_grad or b.requires_grad]
        pieces.append(
            _Piece(
                start,
                stop,
                base.weight if base.weight.requires_grad else None,
                base.bias if base.bias is not None and base.bias.requires_grad else None,
                trained,
            )
        )
        start = stop
    weight = weights[0] if len(weights) == 1 else torch.cat(weights)
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b if b is not None else torch.zeros(w.shape[0], dtype=dtype)
                for b, w in zip(biases, weights, strict=True)
            ]
        )
    return LinearPlan(weight, bias, pieces)


@dataclass
class LayerPlan:
    qkv: LinearPlan
    o: LinearPlan
    gate_up: LinearPlan
    down: LinearPlan
    ln1: nn.Parameter
    ln2: nn.Parameter


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm: ``w * h / sqrt(mean(h^2) + eps)`` in float32."""
    h32 = h.float()
    return weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x cos + rotate_half(x) sin`` (float32 result)."""
    x = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class MergedWeights:
    """The merged per-layer weights of a Llama-family causal LM (maybe peft-wrapped), by compute dtype.

    Also the pieces a functional forward needs: the embedding, the final norm, the rotary module, the LM
    head and the attention shapes.
    """

    def __init__(self, model: nn.Module) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fused decoder does not support this model: {reason}")
        self.model = model
        lm = _causal_lm(model)
        self.config = lm.config
        base = getattr(lm, "base_model", lm)
        self.embed = base.embed_tokens
        self.layers = list(base.layers)
        self.norm = base.norm
        self.rotary = base.rotary_emb
        self.head = lm.get_output_embeddings()
        self.heads = self.config.num_attention_heads
        self.kv_heads = self.config.num_key_value_heads
        self.head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.heads
        self.eps = float(self.config.rms_norm_eps)
        self._plans: dict[Any, tuple[list[LayerPlan], torch.Tensor]] = {}

    def key(self, dtype: torch.dtype) -> tuple[Any, ...]:
        """Changes whenever the merged weights in ``dtype`` would: a trainable parameter was modified in
        place (its version counter moved) or replaced, or the adapters were switched off or on."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        adapters_off = any(getattr(m, "disable_adapters", False) for m in self.layers[0].modules())
        return (dtype, adapters_off, tuple(p._version for p in trainable), tuple(id(p) for p in trainable))

    @torch.no_grad()
    def plans(self, dtype: torch.dtype) -> tuple[list[LayerPlan], torch.Tensor]:
        """Per-layer plans and the LM head's weight in ``dtype`` (for the current weights)."""
        key = self.key(dtype)
        cached = self._plans.get(key)
        if cached is None:
            self._plans = {k: v for k, v in self._plans.items() if k[:2] != key[:2]}  # one per dtype and mode
            layers = []
            for layer in self.layers:
                attn, mlp = layer.self_attn, layer.mlp
                layers.append(
                    LayerPlan(
                        qkv=merge_linear([attn.q_proj, attn.k_proj, attn.v_proj], dtype),
                        o=merge_linear([attn.o_proj], dtype),
                        gate_up=merge_linear([mlp.gate_proj, mlp.up_proj], dtype),
                        down=merge_linear([mlp.down_proj], dtype),
                        ln1=layer.input_layernorm.weight,
                        ln2=layer.post_attention_layernorm.weight,
                    )
                )
            head = self.head.weight
            cached = self._plans[key] = (layers, head if head.requires_grad else head.detach().to(dtype))
        return cached


_MERGED: weakref.WeakKeyDictionary[nn.Module, MergedWeights] = weakref.WeakKeyDictionary()


def merged_weights_for(model: nn.Module) -> MergedWeights | None:
    """The one ``MergedWeights`` of ``model``, or None when the model is not a supported Llama-family LM."""
    if is_sharded(model):  # sharded after its weights were merged (torchrun, FSDP2): they are stale
        _MERGED.pop(model, None)
        return None
    weights = _MERGED.get(model)
    if weights is None:
        if unsupported_reason(model) is not None:
            return None
        weights = _MERGED[model] = MergedWeights(model)
    return weights
