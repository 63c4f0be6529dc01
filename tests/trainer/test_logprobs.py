"""Chunked log-probs equal the full-logits reference (values, entropies, gradients) and keep the
backward free of [N, V] tensors."""

from __future__ import annotations

import pytest
import torch
from naive_logprobs import naive_token_logprobs
from tinymodel import tiny_config
from torch import nn

from searchr1.trainer.logprobs import (
    chunked_head_logprobs,
    decoder_of,
    token_logprobs,
    valid_target_mask,
)

VOCAB = 301
TOL = {"atol": 1e-5, "rtol": 1e-5}


pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(tied: bool = True, attn: str = "sdpa", seed: int = 0) -> nn.Module:
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(
        VOCAB, hidden_size=32, intermediate_size=64, tie_word_embeddings=tied, attn_implementation=attn
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).float()


def batch(b: int = 3, t: int = 19, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0  # right padding
    mask[2, 6:] = 0
    return ids, mask


def grads_of(model: nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_values_entropies_and_gradients_match_full_logits(tied: bool, attn: str) -> None:
    model = make_model(tied, attn)
    ids, mask = batch()
    weights = torch.randn(ids.shape)  # a loss that touches every position differently

    lp, ent = token_logprobs(model, ids, mask, chunk_size=7, temperature=0.8, return_entropy=True)
    ref_lp, ref_ent = naive_token_logprobs(model, ids, mask, temperature=0.8, return_entropy=True)
    torch.testing.assert_close(lp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)
    assert lp.dtype == torch.float32 and lp.shape == ids.shape

    ours = grads_of(model, (lp * weights).sum() + 0.3 * (ent * weights).sum())
    lp2, ent2 = naive_token_logprobs(model, ids, mask, temperature=0.8, return_entropy=True)
    ref = grads_of(model, (lp2 * weights).sum() + 0.3 * (ent2 * weights).sum())
    assert_same_grads(ours, ref)


def test_alignment_and_zeros_on_invalid_positions() -> None:
    model = make_model()
    ids, mask = batch()
    lp = token_logprobs(model, ids, mask)
    valid = valid_target_mask(ids, mask, None)
    assert not valid[:, 0].any()
    assert (lp[~valid] == 0).all() and (lp[valid] < 0).all()
    # logprob[t] is log p(ids[t] | ids[:t]): recompute position 5 of row 0 from a truncated prefix
    logits = model(input_ids=ids[:1, :5], use_cache=False).logits[0, -1]
    expected = torch.log_softmax(logits.float(), -1)[ids[0, 5]]
    torch.testing.assert_close(lp[0, 5], expected, **TOL)


@pytest.mark.parametrize("chunk_size", [1, 5, 64, 10_000])
def test_chunk_size_does_not_change_results(chunk_size: int) -> None:
    model = make_model()
    ids, mask = batch()
    with torch.no_grad():
        ref = naive_token_logprobs(model, ids, mask)
        lp = token_logprobs(model, ids, mask, chunk_size=chunk_size)
    torch.testing.assert_close(lp, ref, **TOL)


def test_target_mask_computes_only_there() -> None:
    model = make_model()
    ids, mask = batch()
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[:, 8:] = True
    lp = token_logprobs(model, ids, mask, target_mask=target)
    ref = naive_token_logprobs(model, ids, mask)
    keep = target & valid_target_mask(ids, mask, None)
    torch.testing.assert_close(lp[keep], ref[keep], **TOL)
    assert (lp[~keep] == 0).all()


def test_no_full_vocabulary_tensor_is_saved_for_backward() -> None:
    """The fused path saves h, W, targets and one float per row; the reference saves [N, V]."""
    n, h, v = 256, 8, 4096
    hidden = torch.randn(n, h, requires_grad=True)
    head = nn.Linear(h, v, bias=False)
    targets = torch.randint(0, v, (n,))
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = chunked_head_logprobs(hidden, head, targets, chunk_size=16, return_entropy=True)
    assert max(saved) <= max(v * h, n * 16)  # the weight, or one chunk at most
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ref = torch.log_softmax(head(hidden).float(), -1).gather(1, targets[:, None])
    assert max(saved) >= n * v  # the check can fail: the reference does keep the logits
    torch.testing.assert_close(lp, ref.squeeze(1), **TOL)


def test_generic_head_path_matches_reference_gradients() -> None:
    """A head that is not a plain nn.Linear (here with a bias and soft-capping) runs per chunk under
    checkpointing; values and gradients still equal the full computation."""
    torch.manual_seed(3)
    n, h, v = 37, 12, 97
    hidden = torch.randn(n, h, requires_grad=True)
    linear = nn.Linear(h, v)
    targets = torch.randint(0, v, (n,))

    def head_fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(linear(x) / 5.0) * 5.0

    lp, ent = chunked_head_logprobs(
        hidden, linear, targets, head_fn=head_fn, chunk_size=8, temperature=1.3, return_entropy=True
    )
    (lp.sum() + ent.sum()).backward()
    ours = (hidden.grad.clone(), linear.weight.grad.clone(), linear.bias.grad.clone())
    hidden.grad = linear.weight.grad = linear.bias.grad = None
    logp = torch.log_softmax(head_fn(hidden) / 1.3, -1)
    ref_lp = logp.gather(1, targets[:, None]).squeeze(1)
    ref_ent = -(logp.exp() * logp).sum(-1)
    (ref_lp.sum() + ref_ent.sum()).backward()
    torch.testing.assert_close(lp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)
    for a, b in zip(ours, (hidden.grad, linear.weight.grad, linear.bias.grad), strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_fused_path_with_bias_matches_reference() -> None:
    torch.manual_seed(4)
    hidden = torch.randn(23, 10, requires_grad=True)
    head = nn.Linear(10, 50, bias=True)
    targets = torch.randint(0, 50, (23,))
    lp, _ = chunked_head_logprobs(hidden, head, targets, chunk_size=4)
    lp.pow(2).sum().backward()
    ours = (hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    hidden.grad = head.weight.grad = head.bias.grad = None
    ref = torch.log_softmax(head(hidden), -1).gather(1, targets[:, None]).squeeze(1)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(lp, ref, **TOL)
    for a, b in zip(ours, (hidden.grad, head.weight.grad, head.bias.grad), strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_bfloat16_head_matches_reference() -> None:
    """Low-precision weights: logits in bf16, softmax in float32 (like the reference), gradients
    accumulated in float32 across chunks."""
    torch.manual_seed(5)
    hidden = torch.randn(40, 16).bfloat16().requires_grad_()
    head = nn.Linear(16, 300, bias=False).bfloat16()
    targets = torch.randint(0, 300, (40,))
    lp, ent = chunked_head_logprobs(hidden, head, targets, chunk_size=7, return_entropy=True)
    (lp.sum() + ent.sum()).backward()
    ours = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad = head.weight.grad = None
    logp = torch.log_softmax(head(hidden).float(), -1)
    ref_lp = logp.gather(1, targets[:, None]).squeeze(1)
    (ref_lp.sum() - (logp.exp() * logp).sum()).backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)  # same bf16 logits, same float32 math
    assert lp.dtype == torch.float32 and ours[0].dtype == torch.bfloat16
    for a, b in zip(ours, (hidden.grad, head.weight.grad), strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("lora_on_head", [False, True])
def test_peft_lora_model(lora_on_head: bool) -> None:
    from peft import LoraConfig, get_peft_model

    base = make_model(tied=False)
    ids, mask = batch()
    with torch.no_grad():
        base_lp = naive_token_logprobs(base, ids, mask)
    targets = ["q_proj", "v_proj"] + (["lm_head"] if lora_on_head else [])
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0))
    with torch.no_grad():  # make the adapter do something
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert decoder_of(model) is model.get_base_model().model

    lp = token_logprobs(model, ids, mask, chunk_size=6)
    ref = naive_token_logprobs(model, ids, mask)
    torch.testing.assert_close(lp, ref, **TOL)
    assert (lp - base_lp).abs().max() > 1e-3  # the adapter is active
    ours = grads_of(model, lp.sum())
    ref_grads = grads_of(model, naive_token_logprobs(model, ids, mask).sum())
    assert_same_grads(ours, ref_grads)
    assert any("lora" in n for n in ours) and all("lora" in n for n in ours)
    with torch.no_grad(), model.disable_adapter():  # the reference policy: base weights, no copy
        torch.testing.assert_close(token_logprobs(model, ids, mask), base_lp, **TOL)


def test_bad_arguments_are_named() -> None:
    head = nn.Linear(4, 8)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_head_logprobs(torch.randn(3, 4), head, torch.zeros(3, dtype=torch.long), chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_head_logprobs(torch.randn(3, 4), head, torch.zeros(3, dtype=torch.long), temperature=0)


def test_works_with_gradient_checkpointing() -> None:
    model = make_model()
    ids, mask = batch()
    ref = grads_of(model, naive_token_logprobs(model, ids, mask).sum())
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    lp = token_logprobs(model, ids, mask)
    assert_same_grads(grads_of(model, lp.sum()), ref)
