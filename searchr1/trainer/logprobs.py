"""Per-token log-probabilities (and entropies) of a causal LM without full-vocabulary logits.

The policy loss needs ``log p(x_t | x_<t)`` for every trained token. The textbook way computes
``logits = lm_head(hidden)`` for the whole micro-batch ([B, T, V] float32: 4 GB for 8 x 4096 tokens
at V = 32k) and then ``log_softmax`` + ``gather``. Here the decoder runs once, its final hidden
states are gathered at the positions whose next token is wanted ([N, H]), and the LM head is applied
``chunk_size`` rows at a time:

    z_i   = W h_i / temperature                      (one chunk of rows, float32)
    lp_i  = z_i[x_i] - logsumexp(z_i)                (log-prob of the observed next token)
    ent_i = logsumexp(z_i) - sum_v softmax(z_i)_v z_iv   (entropy of the predictive distribution)

A custom autograd function keeps only ``h``, ``W`` and one float per row (``logsumexp``) for the
backward pass, which recomputes each chunk's logits and applies

    d lp_i  / d z_i = onehot(x_i) - p_i
    d ent_i / d z_i = -p_i * (z_i - sum_v p_iv z_iv)

so neither pass ever holds more than one ``[chunk_size, V]`` float32 block of logits (two with
the entropy), by working in place on it (the idea of Liger-kernel's fused linear cross-entropy,
fused linear + cross-entropy, written in plain torch). Heads that are not a plain ``nn.Linear``
(a LoRA-wrapped ``lm_head``, soft-capped or scaled logits) take a generic path that runs the head
module per chunk under ``torch.utils.checkpoint``: the same memory bound, autograd does the rest.

Alignment (the same for every function here): results are ``[B, T]`` like ``input_ids`` and
``logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``, computed from the hidden state at
``t - 1``. Position 0 has no prefix and is 0. A position is *valid* (computed, otherwise 0) when it
and its predecessor are real tokens (``attention_mask``) and, with ``position_ids``, it does not start
a new sequence (``position_ids[b, t] != 0``): so packed rows (several sequences in one row with
positions restarting at 0) never score a token from the previous
sequence's context.

Distributed training: pass the bare model (or its peft wrapper) and wrap the *module that calls*
``token_logprobs`` with DDP / FSDP2 (like the trainer's ``PolicyLogprobs``), so their forward hooks
run. The fused path reads ``lm_head.weight`` directly instead of calling ``lm_head``: under FSDP2
leave the LM head in the root unit (not a ``fully_shard`` unit of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from searchr1.hfcompat import cache_arg

CHUNK_ELEMENTS = 2**24
"""Default chunk: ``CHUNK_ELEMENTS // V`` rows (a 64 MiB float32 block: 512 rows at V = 32k,
110 at V = 152k), clamped to [16, 4096]."""


def default_chunk_size(vocab_size: int) -> int:
    return max(16, min(4096, CHUNK_ELEMENTS // max(1, vocab_size)))


FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "flash_attention")


# ----------------------------------------------------------------------------------------------
# Model anatomy: decoder (hidden states) and LM head, through peft wrappers.


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The Hugging Face causal LM inside ``model`` (a ``peft`` wrapper is looked through; its LoRA
    layers live inside the wrapped model, so they stay active, and ``disable_adapter()`` still works)."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):  # peft.PeftModel
        model = get_base()
    return model


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM (``model.model`` for Qwen2/Llama, ``model.transformer``
    for GPT-2): the module that returns the final, normed hidden states. A base model is returned
    unchanged."""
    lm = unwrap_causal_lm(model)
    base = getattr(lm, "base_model", None)  # transformers: getattr(self, base_model_prefix, self)
    return base if isinstance(base, nn.Module) else lm


def lm_head_function(model: nn.Module) -> tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor] | None]:
    """The output embedding module and, when the logits are not just ``lm_head(h)``, the function
    that computes them (logit scale of Cohere, final soft-capping of Gemma 2/3)."""
    lm = unwrap_causal_lm(model)
    head = lm.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(lm).__name__} has no output embeddings (not a causal LM?)")
    config = getattr(lm, "config", None)
    scale = getattr(config, "logit_scale", None)
    cap = getattr(config, "final_logit_softcapping", None)
    if scale is None and cap is None:
        return head, None

    def head_fn(h: torch.Tensor) -> torch.Tensor:
        z = head(h)
        if scale is not None:
            z = z * scale
        if cap is not None:
            z = torch.tanh(z / cap) * cap
        return z

    return head, head_fn


def attention_kwargs(
    model: nn.Module, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
) -> dict[str, Any]:
    """Keyword arguments for the decoder that keep packed sequences apart.

    Rows are *packed* when ``position_ids`` restart at 0 inside a row. Then:
      - flash-attention (GPU) reads the sequence boundaries from ``position_ids`` (varlen kernel):
        we pass ``position_ids`` and no mask;
      - sdpa / eager get an explicit block-diagonal causal 4D mask (boolean for sdpa, additive for
        eager). Measured with transformers 5.23 on CPU: with a 2D mask (even all ones), or with a
        KV cache (``use_cache`` defaults to True in most configs), packed ``position_ids`` only
        change the rotary positions and a sequence attends to the ones before it in its row;
        transformers infers the blocks itself only when the mask is None and there is no cache,
        and 4.x never does. The explicit mask works on every version;
      - other implementations get ``attention_mask=None`` and the ``position_ids`` (transformers
        >= 5 builds the packed mask from them when ``use_cache=False``, which we always pass).
    Padding tokens attend only to themselves (no fully masked row, hence no NaN in the backward).
    """
    if position_ids is None or not is_packed(position_ids):
        return {"attention_mask": attention_mask, "position_ids": position_ids}
    impl = str(getattr(getattr(unwrap_causal_lm(model), "config", None), "_attn_implementation", "sdpa"))
    if impl in FLASH_IMPLEMENTATIONS or "flash" in impl:
        return {"attention_mask": None, "position_ids": position_ids}
    if impl not in ("sdpa", "eager"):
        return {"attention_mask": None, "position_ids": position_ids}
    allowed = packed_causal_mask(position_ids, attention_mask)[:, None]  # [B, 1, T, T]
    if impl == "eager":
        dtype = next(model.parameters()).dtype
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        allowed = additive.masked_fill_(~allowed, torch.finfo(dtype).min)
    return {"attention_mask": allowed, "position_ids": position_ids}


def is_packed(position_ids: torch.Tensor) -> bool:
    """True when some row holds more than one sequence (a position 0 after the first column)."""
    return bool((position_ids[:, 1:] == 0).any())


def segment_ids(position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T]`` sequence index inside each row (a new one starts where ``position_ids`` is 0);
    padding tokens (``attention_mask == 0``) get a unique negative id each."""
    starts = position_ids == 0
    starts[:, 0] = True
    seg = starts.long().cumsum(-1)
    if attention_mask is not None:
        pad = attention_mask == 0
        unique = -1 - torch.arange(seg.numel(), device=seg.device).view_as(seg)
        seg = torch.where(pad, unique, seg)
    return seg


def packed_causal_mask(
    position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, T, T]`` boolean: query ``q`` may attend key ``k`` iff ``k <= q`` and both belong to the
    same packed sequence."""
    seg = segment_ids(position_ids, attention_mask)
    t = seg.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=seg.device).tril_()
    return causal[None] & (seg[:, :, None] == seg[:, None, :])


def valid_target_mask(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
) -> torch.Tensor:
    """``[B, T]`` boolean: which positions get a log-prob (see the module docstring)."""
    valid = torch.zeros_like(input_ids, dtype=torch.bool)
    inner = torch.ones_like(input_ids[:, 1:], dtype=torch.bool)
    if attention_mask is not None:
        am = attention_mask.bool()
        inner &= am[:, 1:] & am[:, :-1]
    if position_ids is not None:
        inner &= position_ids[:, 1:] != 0
    valid[:, 1:] = inner
    return valid


def final_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
    shared_prefix: int = 0,
) -> torch.Tensor:
    """``[B, T, H]`` last-layer hidden states (after the final norm) of the decoder of ``model``.

    ``shared_prefix = p > 0``: the first ``p`` tokens are the same real tokens in every row (a prompt
    that every trajectory of the batch starts with). They run once, as one row; their keys and values
    are expanded to every row and the rest of each row attends to them as a cache. The result equals
    the plain forward (up to float rounding), and so do the gradients: the expanded cache sums the
    rows' gradients back into the one prefix computation. For ``B`` rows that share ``p`` of ``T``
    tokens, the decoder computes ``p + B (T - p)`` token positions instead of ``B T``.
    """
    decoder = decoder_of(model)
    if shared_prefix <= 0:
        out = decoder(
            input_ids=input_ids, use_cache=False, **attention_kwargs(model, attention_mask, position_ids)
        )
        return out[0] if isinstance(out, tuple) else out.last_hidden_state
    from transformers import DynamicCache

    p, (b, t) = shared_prefix, input_ids.shape
    if not 0 < p < t or position_ids is not None:
        raise ValueError(f"shared_prefix={p} needs 0 < p < {t} and no packed position_ids")
    config = unwrap_causal_lm(model).config
    prefix_cache = DynamicCache(config=config)
    head = decoder(input_ids=input_ids[:1, :p], **cache_arg(prefix_cache), use_cache=True)
    shared = DynamicCache(config=config)
    for i, layer in enumerate(prefix_cache.layers):
        shared.update(layer.keys.expand(b, -1, -1, -1), layer.values.expand(b, -1, -1, -1), i)
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    rest = decoder(
        input_ids=input_ids[:, p:],
        attention_mask=mask,
        position_ids=torch.arange(p, t, device=input_ids.device).expand(b, -1),
        **cache_arg(shared),
        use_cache=True,
    )
    return torch.cat([head.last_hidden_state.expand(b, -1, -1), rest.last_hidden_state], dim=1)


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> int:
    """How many leading columns hold the same real token in every row (at most ``T - 1``)."""
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= attention_mask.bool().all(dim=0)
    run = int(same.long().cumprod(0).sum())
    return min(run, input_ids.shape[1] - 1)


MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are not worth a separate pass."""


def shareable_prefix(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> int:
    """The prefix length ``final_hidden_states`` may share for this batch, or 0: rows must share at least
    ``MIN_SHARED_PREFIX`` tokens, and the model must not recompute its layers in the backward pass
    (gradient checkpointing would replay the cache updates)."""
    if input_ids.shape[0] < 2 or getattr(unwrap_causal_lm(model), "is_gradient_checkpointing", False):
        return 0
    p = common_prefix_length(input_ids, attention_mask)
    return p if p >= MIN_SHARED_PREFIX else 0


# ----------------------------------------------------------------------------------------------
# Chunked LM head + log-softmax + gather.


class _FusedLinearLogprob(torch.autograd.Function):
    """``(h [N, H], W [V, H], b [V] | None, targets [N]) -> (logprob [N], entropy [N])``, chunked.

    Per chunk, the forward holds one ``[c, V]`` float32 block (two with the entropy) and the
    backward the same, by working in place: ``z -> z - lse = log p -> p -> dL/dz``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        logprob = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_zeros(n if with_entropy else 0, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _chunk_logits(hidden[s:e], weight, bias, temperature)
            picked = z.gather(1, targets[s:e, None]).squeeze(1)
            zmax = z.amax(dim=-1, keepdim=True)
            z.sub_(zmax)  # z' = z - max
            if with_entropy:
                ez = torch.exp(z)
                total = ez.sum(-1)
                weighted = ez.mul_(z).sum(-1)  # sum_v e^{z'} z'
                del ez
                entropy[s:e] = total.log() - weighted / total
            else:
                total = z.exp_().sum(-1)
            del z
            lse_c = zmax.squeeze(1) + total.log()
            lse[s:e] = lse_c
            logprob[s:e] = picked - lse_c
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy.clone())
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return logprob, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprob: torch.Tensor | None, grad_entropy: torch.Tensor | None):  # type: ignore[override]
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        use_entropy = grad_entropy is not None and entropy.numel() > 0
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if grad_logprob is None and not use_entropy:
            return None, None, None, None, None, None, None
        n = hidden.shape[0]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            h = hidden[s:e]
            g = _chunk_logits(h, weight, bias, temperature).sub_(lse[s:e, None])  # log p
            if use_entropy:  # d ent / d z = -p (log p + ent)
                p = torch.exp(g)
                g.add_(entropy[s:e, None]).mul_(p).mul_(-grad_entropy[s:e, None])
                if grad_logprob is not None:
                    g.sub_(p.mul_(grad_logprob[s:e, None]))
                del p
            else:  # d lp / d z = onehot - p, times the incoming gradient
                g.exp_().mul_(-grad_logprob[s:e, None])
            if grad_logprob is not None:
                g.scatter_add_(1, targets[s:e, None], grad_logprob[s:e, None].float())
            if temperature != 1.0:
                g.div_(temperature)
            if need_b:
                grad_b.add_(g.sum(0))
            if hidden.dtype == torch.float32:
                if need_h:
                    torch.mm(g, weight, out=grad_h[s:e])
                if need_w:  # accumulated in float32 across chunks
                    grad_w.addmm_(g.t(), h)
            else:
                g_low = g.to(hidden.dtype)
                del g
                if need_h:
                    grad_h[s:e] = g_low @ weight
                if need_w:
                    grad_w.add_(g_low.t() @ h)
        return (
            grad_h,
            grad_w.to(weight.dtype) if need_w else None,
            grad_b.to(bias.dtype) if need_b else None,
            None,
            None,
            None,
            None,
        )


class _ExpectedRowLogprob(torch.autograd.Function):
    """``(h [N, H], W [V, H], targets [N]) -> (logprob [N], entropy [N])`` for a frozen head, with the
    backward's work done in the forward pass.

    With ``z = W h / T`` and ``p = softmax(z)``, the gradient of a log-prob is
    ``d lp / d h = (W[x] - E_p[W]) / T`` where ``E_p[W] = sum_v p_v W_v``: one ``[N, H]`` row of expected
    embeddings per token. The forward computes it from the probabilities it already holds (one more
    product, ``p W``), so the backward is ``grad * (W[x] - E) / T``, with no second pass over the
    ``[N, V]`` logits. The entropy's gradient, rarely wanted (``algorithm.entropy_coef``), takes the
    recomputing backward of ``_FusedLinearLogprob``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        logprob = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_zeros(n if with_entropy else 0, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        expected = hidden.new_empty(hidden.shape, dtype=torch.float32)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _chunk_logits(hidden[s:e], weight, None, temperature)
            picked = z.gather(1, targets[s:e, None]).squeeze(1)
            zmax = z.amax(dim=-1, keepdim=True)
            z.sub_(zmax)  # z' = z - max
            ez = torch.exp(z)
            total = ez.sum(-1)
            if with_entropy:  # H = log total - sum_v e^{z'} z' / total
                entropy[s:e] = total.log() - torch.linalg.vecdot(ez, z) / total
            del z
            expected[s:e] = (ez.to(weight.dtype) @ weight).float().div_(total[:, None])
            del ez
            lse[s:e] = zmax.squeeze(1) + total.log()
            logprob[s:e] = picked - lse[s:e]
        ctx.save_for_backward(hidden, weight, targets, lse, entropy.clone(), expected)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return logprob, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprob: torch.Tensor | None, grad_entropy: torch.Tensor | None):  # type: ignore[override]
        hidden, weight, targets, lse, entropy, expected = ctx.saved_tensors
        if not ctx.needs_input_grad[0] or (grad_logprob is None and grad_entropy is None):
            return None, None, None, None, None, None
        if grad_entropy is not None and entropy.numel() > 0:
            grad_h = _recomputed_grad_hidden(
                hidden,
                weight,
                targets,
                lse,
                entropy,
                ctx.temperature,
                ctx.chunk_size,
                grad_logprob,
                grad_entropy,
            )
            return grad_h, None, None, None, None, None
        assert grad_logprob is not None
        grad_h = (weight[targets].float() - expected).mul_(grad_logprob[:, None] / ctx.temperature)
        return grad_h.to(hidden.dtype), None, None, None, None, None


def _recomputed_grad_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
    chunk_size: int,
    grad_logprob: torch.Tensor | None,
    grad_entropy: torch.Tensor,
) -> torch.Tensor:
    """``dL/dh`` of log-probs and entropies, recomputing each chunk's logits (as ``_FusedLinearLogprob``)."""
    grad_h = torch.empty_like(hidden)
    for s in range(0, hidden.shape[0], chunk_size):
        e = min(s + chunk_size, hidden.shape[0])
        g = _chunk_logits(hidden[s:e], weight, None, temperature).sub_(lse[s:e, None])  # log p
        p = torch.exp(g)
        g.add_(entropy[s:e, None]).mul_(p).mul_(-grad_entropy[s:e, None])  # d ent / d z = -p (log p + ent)
        if grad_logprob is not None:
            g.sub_(p.mul_(grad_logprob[s:e, None]))
            g.scatter_add_(1, targets[s:e, None], grad_logprob[s:e, None].float())
        del p
        if temperature != 1.0:
            g.div_(temperature)
        grad_h[s:e] = (g.to(hidden.dtype) @ weight).to(hidden.dtype)
    return grad_h


def _chunk_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """A fresh float32 ``[c, V]`` block of ``(h W^T + b) / temperature`` (safe to modify in place)."""
    z = F.linear(h, weight, bias)
    z = z.float() if z.dtype != torch.float32 else z
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _checkpointed_chunk(
    head_fn: Callable[[torch.Tensor], torch.Tensor],
    h: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    z = head_fn(h).float() / temperature
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(1, targets[:, None]).squeeze(1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else lp.new_zeros(0)
    return lp, ent


def chunked_head_logprobs(
    hidden: torch.Tensor,
    head: nn.Module,
    targets: torch.Tensor,
    *,
    head_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets [N]`` under ``head(hidden [N, H])`` (and entropy), chunk by chunk.

    A plain ``nn.Linear`` head without ``head_fn`` takes the fused autograd function; anything else
    runs ``head_fn`` (default: the head module) per chunk under ``torch.utils.checkpoint``.
    """
    if chunk_size is None:
        weight = getattr(head, "weight", None)
        chunk_size = default_chunk_size(weight.shape[0] if isinstance(weight, torch.Tensor) else 32768)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if return_entropy else None)
    if head_fn is None and type(head) is nn.Linear:
        return weight_head_logprobs(
            hidden, head.weight, targets, bias=head.bias, chunk_size=chunk_size, temperature=temperature,
            return_entropy=return_entropy,
        )  # fmt: skip
    fn = head_fn or head
    lps, ents = [], []
    grad = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    for s in range(0, hidden.shape[0], chunk_size):
        args = (
            fn,
            hidden[s : s + chunk_size],
            targets[s : s + chunk_size],
            float(temperature),
            return_entropy,
        )
        if grad:
            lp, ent = checkpoint(_checkpointed_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _checkpointed_chunk(*args)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), (torch.cat(ents) if return_entropy else None)


def weight_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused chunked path of ``chunked_head_logprobs`` for a head given by its ``weight [V, H]`` (and
    ``bias``); ``hidden`` and ``weight`` in one dtype (products in it, log-softmax in float32)."""
    chunk = default_chunk_size(weight.shape[0]) if chunk_size is None else int(chunk_size)
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if return_entropy else None)
    if bias is None and not weight.requires_grad:
        lp, ent = _ExpectedRowLogprob.apply(
            hidden, weight, targets, float(temperature), chunk, return_entropy
        )
    else:
        lp, ent = _FusedLinearLogprob.apply(
            hidden, weight, bias, targets, float(temperature), chunk, return_entropy
        )
    return lp, (ent if return_entropy else None)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    target_mask: torch.Tensor | None = None,
    share_prefix: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` float32 log-probs of each token given its prefix (``[:, 0]`` and invalid positions
    are 0; see the module docstring), and with ``return_entropy`` the ``[B, T]`` entropies of the
    same predictive distributions. Differentiable with respect to the model's parameters.

    ``attention_mask`` is the 2D padding mask (1 = real token). ``position_ids`` restarting at 0
    inside a row mark packed sequences. ``temperature`` divides the logits (match the sampler's).
    ``target_mask`` (``[B, T]`` bool) restricts the computation further, e.g. to the generated
    tokens: the LM head then runs only there (prompt tokens are free). ``chunk_size`` rows of the
    LM head are computed at once (default ``default_chunk_size(V)``: a 64 MiB float32 block).
    ``share_prefix``: run a prompt prefix common to every row once (``final_hidden_states``).
    """
    prefix = (
        shareable_prefix(model, input_ids, attention_mask) if share_prefix and position_ids is None else 0
    )
    hidden = final_hidden_states(model, input_ids, attention_mask, position_ids, shared_prefix=prefix)
    valid = valid_target_mask(input_ids, attention_mask, position_ids)
    if target_mask is not None:
        valid &= target_mask.bool()
    # hidden[t - 1] predicts input_ids[t]
    rows = hidden[:, :-1][valid[:, 1:]]
    targets = input_ids[:, 1:][valid[:, 1:]]
    head, head_fn = lm_head_function(model)
    lp, ent = chunked_head_logprobs(
        rows,
        head,
        targets,
        head_fn=head_fn,
        chunk_size=chunk_size,
        temperature=temperature,
        return_entropy=return_entropy,
    )
    out = _scatter_rows(lp, valid)
    if return_entropy:
        assert ent is not None
        return out, _scatter_rows(ent, valid)
    return out


def _scatter_rows(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    out = values.new_zeros(valid.shape)
    return out.masked_scatter(valid, values)
