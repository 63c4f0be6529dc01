"""The fused decoder of the update gives the Hugging Face path's log-probs, entropies and gradients (float32),
with the shared prefix computed per call or once per optimizer step; the first update of the fast path equals
the baseline path's; bfloat16 stays within a stated distance of float32."""

from __future__ import annotations

import pytest
import rlworld
import torch
from test_logprobs import VOCAB
from tinymodel import tiny_config
from torch import nn

from searchr1.trainer.fused_decoder import FusedDecoder, StepPrefix, fused_token_logprobs, unsupported_reason
from searchr1.trainer.logprobs import token_logprobs, weight_head_logprobs
from searchr1.trainer.loop import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PREFIX = 20


def make_model(kind: str, lora: bool) -> nn.Module:
    """A tiny Llama or Qwen2 (biases on Q/K/V) model; with LoRA, adapters with non-zero B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    if kind == "qwen2":
        cfg = tiny_config(VOCAB, hidden_size=32, intermediate_size=64)
    else:
        cfg = LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
        )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float()
    if lora:
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                nn.init.normal_(p, std=0.1)
    return model


def batch(b: int = 4, t: int = 37, seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows sharing their first ``PREFIX`` tokens; targets after it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, t), generator=g)
    ids[:, :PREFIX] = ids[0, :PREFIX]
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    mask[3, 25:] = 0
    target = mask.bool().clone()
    target[:, : PREFIX + 2] = False
    return ids, mask, target


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = 1e-5) -> None:
    """Every gradient equal to ``rtol`` relative to its largest entry."""
    assert a.keys() == b.keys() and a
    for name in a:
        scale = float(a[name].abs().max()) or 1.0
        err = float((a[name] - b[name]).abs().max()) / scale
        assert err <= rtol, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("prefix", ["none", "call", "step"])
@pytest.mark.parametrize("entropy_weight", [0.0, 0.3])
def test_fused_decoder_equals_the_hugging_face_path(kind, lora, prefix, entropy_weight):
    model = make_model(kind, lora)
    ids, mask, target = batch()
    weights = torch.linspace(-1, 1, ids.numel()).view_as(ids)
    lp, ent = token_logprobs(model, ids, mask, target_mask=target, return_entropy=True, temperature=0.7)
    model.zero_grad(set_to_none=True)
    ((lp * weights).sum() + entropy_weight * ent.sum()).backward()
    expected = grads(model)

    decoder = FusedDecoder(model)
    step = StepPrefix(decoder, ids[0, :PREFIX], torch.float32) if prefix == "step" else None
    lp2, ent2 = fused_token_logprobs(
        decoder, ids, mask, target_mask=target, return_entropy=True, temperature=0.7, step_prefix=step,
        share_prefix=prefix == "call",
    )  # fmt: skip
    torch.testing.assert_close(lp2, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent2, ent, atol=1e-5, rtol=1e-5)
    model.zero_grad(set_to_none=True)
    ((lp2 * weights).sum() + entropy_weight * ent2.sum()).backward()
    if step is not None:
        step.backward()
    assert_close_grads(expected, grads(model))
    if lora:
        assert all("lora_" in n for n in expected)  # only the adapters train


def test_a_step_prefix_serves_several_micro_batches_with_one_backward():
    """Two micro-batches on one step prefix: the gradients of the plain path over both."""
    model = make_model("llama", lora=True)
    ids, mask, target = batch(b=6, seed=5)
    parts = [slice(0, 2), slice(2, 6)]
    model.zero_grad(set_to_none=True)
    for rows in parts:
        lp = token_logprobs(model, ids[rows], mask[rows], target_mask=target[rows])
        lp.sum().backward()
    expected = grads(model)

    decoder = FusedDecoder(model)
    step = StepPrefix(decoder, ids[0, :PREFIX], torch.float32)
    model.zero_grad(set_to_none=True)
    for rows in parts:
        lp, _ = fused_token_logprobs(
            decoder, ids[rows], mask[rows], target_mask=target[rows], step_prefix=step
        )
        lp.sum().backward()
    step.backward()
    assert_close_grads(expected, grads(model))


def test_a_step_prefix_refuses_rows_that_do_not_start_with_it():
    model = make_model("llama", lora=False)
    ids, mask, target = batch()
    decoder = FusedDecoder(model)
    step = StepPrefix(decoder, ids[0, :PREFIX], torch.float32)
    other = ids.clone()
    other[2, 3] = (other[2, 3] + 1) % VOCAB
    with pytest.raises(ValueError, match="does not start"):
        fused_token_logprobs(decoder, other, mask, target_mask=target, step_prefix=step)
    early = target.clone()
    early[0, PREFIX - 3] = True
    with pytest.raises(ValueError, match="does not fit"):
        fused_token_logprobs(decoder, ids, mask, target_mask=early, step_prefix=step)


def test_merged_weights_follow_an_optimizer_step():
    """The merged weights are rebuilt after the adapters change in place (and not before)."""
    model = make_model("qwen2", lora=True)
    ids, mask, target = batch()
    decoder = FusedDecoder(model)
    first = decoder.plans(torch.float32)
    assert decoder.plans(torch.float32) is first
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    lp, _ = fused_token_logprobs(decoder, ids, mask, target_mask=target)
    lp.sum().backward()
    opt.step()
    assert decoder.plans(torch.float32) is not first
    with torch.no_grad():
        fused, _ = fused_token_logprobs(decoder, ids, mask, target_mask=target)
        plain = token_logprobs(model, ids, mask, target_mask=target)
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    with model.disable_adapter(), torch.no_grad():  # the reference: adapters off
        fused_ref, _ = fused_token_logprobs(decoder, ids, mask, target_mask=target)
        plain_ref = token_logprobs(model, ids, mask, target_mask=target)
    torch.testing.assert_close(fused_ref, plain_ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(fused_ref, fused)


def test_unsupported_models_are_named():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert "gpt2" in unsupported_reason(gpt2)
    dropout = get_peft_model(
        make_model("llama", False), LoraConfig(r=2, lora_dropout=0.1, target_modules=["q_proj"])
    )
    assert unsupported_reason(dropout) == "LoRA dropout"
    assert unsupported_reason(make_model("llama", True)) is None


@pytest.mark.parametrize("entropy_weight", [0.0, 0.5])
def test_the_expected_row_head_gives_the_recomputing_heads_gradients(entropy_weight):
    """A frozen head's log-prob gradient from the forward's expected rows equals the recomputed one."""
    torch.manual_seed(0)
    hidden = torch.randn(23, 16)
    weight = torch.randn(VOCAB, 16)
    targets = torch.randint(0, VOCAB, (23,))
    coef = torch.randn(23)

    def run(trainable: bool) -> tuple[torch.Tensor, ...]:
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_(trainable)  # a trainable head takes the recomputing path
        lp, ent = weight_head_logprobs(h, w, targets, chunk_size=5, temperature=0.6, return_entropy=True)
        ((lp * coef).sum() + entropy_weight * ent.sum()).backward()
        return lp.detach(), ent.detach(), h.grad

    for a, b in zip(run(False), run(True), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# -- the trainer: fast path against the baseline path, bfloat16 against float32 ---------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return rlworld.write_world(tmp_path_factory.mktemp("world"))


def _first_step(world, model_dir, out, **extra) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """The first step's metrics and the gradients its optimizer step applied."""
    template = out.parent / f"{out.name}-template.txt"
    template.write_text(
        "You answer questions about a small world of people, cities, rivers and books. Think first, "
        "then search, then answer in a few words. Question: {question}\n"
    )
    cfg = rlworld.load(
        world, model_dir, out, trainer__total_steps=1, algorithm__kl_coef=0.0, data__template=str(template),
        model__lora_r=4, model__lora_alpha=8, trainer__micro_batch_size=2,
        reward__components={"rlworld:token_set_reward": 1.0}, **extra,
    )  # fmt: skip
    trainer = RLTrainer(cfg)
    trainer.setup()
    seen: dict[str, torch.Tensor] = {}
    step = trainer.actor_optimizer.step

    def record(*args, **kw):
        for name, p in trainer.policy.named_parameters():
            if p.grad is not None:
                seen[name] = p.grad.detach().clone()
        return step(*args, **kw)

    trainer.actor_optimizer.step = record
    return trainer.train_step(), seen


def test_the_fused_first_update_equals_the_baseline_path_in_float32(world, tiny_model_dir, tmp_path):
    """Baseline: Hugging Face modules, a separate pass for the old log-probs, every row computes its prompt.
    Fast: the fused decoder, on-policy old log-probs, the prompt's shared instruction once per optimizer
    step. Same first loss, same LoRA gradients (1e-5 relative), in float32."""
    from searchr1.trainer import fused_decoder

    base_metrics, base_grads = _first_step(
        world, tiny_model_dir, tmp_path / "a", model__bf16_autocast=False, trainer__fused_update=False,
        trainer__on_policy_logprobs=False, trainer__share_prompt_prefix=False,
    )  # fmt: skip
    calls = []
    real = fused_decoder.StepPrefix.__init__

    def counted(self, *a, **kw):
        calls.append(1)
        real(self, *a, **kw)

    fused_decoder.StepPrefix.__init__ = counted
    try:
        fast_metrics, fast_grads = _first_step(
            world, tiny_model_dir, tmp_path / "b", model__bf16_autocast=False
        )
    finally:
        fused_decoder.StepPrefix.__init__ = real
    assert calls == [1]  # one shared prefix for the whole optimizer step
    assert base_metrics["rollout/searches"] == fast_metrics["rollout/searches"]
    assert fast_metrics["actor/loss"] == pytest.approx(base_metrics["actor/loss"], rel=1e-5, abs=1e-7)
    assert base_grads and all("lora_" in n for n in base_grads)
    assert max(float(g.abs().max()) for g in base_grads.values()) > 1e-4  # a step that moves something
    assert_close_grads(base_grads, fast_grads, rtol=1e-5)


BF16_GRAD_REL_ERROR = 0.03
"""The bfloat16 fast path's LoRA gradient (the whole vector) differs from the float32 fast path's by at most
this relative L2 error (measured on the tiny model: 0.006; cosine similarity 0.99998)."""
BF16_LOSS_ATOL = 1e-4
"""... and its first loss by at most this (measured: equal; an on-policy loss reads the ratio 1)."""


def test_the_bfloat16_fast_path_stays_near_the_float32_fast_path(world, tiny_model_dir, tmp_path):
    from searchr1.precision import fast_bf16

    if not fast_bf16(torch.device("cpu")):
        pytest.skip("this CPU has no bfloat16 units (the fast path runs in float32 here)")
    f32_metrics, f32 = _first_step(world, tiny_model_dir, tmp_path / "a", model__bf16_autocast=False)
    bf_metrics, bf = _first_step(world, tiny_model_dir, tmp_path / "b", model__bf16_autocast=True)
    assert bf_metrics["rollout/searches"] == f32_metrics["rollout/searches"]
    assert bf_metrics["actor/loss"] == pytest.approx(f32_metrics["actor/loss"], abs=BF16_LOSS_ATOL)
    assert f32.keys() == bf.keys() and f32
    a = torch.cat([f32[n].flatten() for n in sorted(f32)])
    b = torch.cat([bf[n].flatten() for n in sorted(bf)])
    assert float(a.norm()) > 1e-4
    error = float((a - b).norm() / a.norm())
    assert error <= BF16_GRAD_REL_ERROR, error


# -- the frozen trunk: the layers below the adapter run once per row ---------------------------------------


def top_layer_model() -> nn.Module:
    """The tiny Llama (2 layers) with adapters on its top layer only."""
    from peft import LoraConfig, get_peft_model

    model = make_model("llama", lora=False)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, layers_to_transform=[1]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(p, std=0.1)
    return model


@pytest.mark.parametrize("prefix", ["none", "call", "step"])
def test_a_frozen_trunk_gives_the_uncached_log_probs_and_gradients(prefix):
    """The trunk filled by one micro-batch and read by others (rows in other company, so padded to other
    lengths) gives the log-probs and adapter gradients of the uncached path."""
    from searchr1.trainer.frozen_trunk import FrozenTrunk

    model = top_layer_model()
    ids, mask, target = batch(b=6, seed=7)
    parts = [slice(0, 4), slice(2, 6), slice(1, 3)]  # rows 2 and 3 are read back in two other batches

    def run(trunk: FrozenTrunk | None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        decoder = FusedDecoder(model)
        decoder.trunk = trunk
        model.zero_grad(set_to_none=True)
        step = StepPrefix(decoder, ids[0, :PREFIX], torch.float32) if prefix == "step" else None
        out = []
        for rows in parts:
            lp, _ = fused_token_logprobs(
                decoder, ids[rows], mask[rows], target_mask=target[rows], step_prefix=step,
                share_prefix=prefix != "none",
            )  # fmt: skip
            lp.sum().backward()
            out.append(lp.detach())
        if step is not None:
            step.backward()
        return out, grads(model)

    plain_lp, plain_grads = run(None)
    trunk = FrozenTrunk(1)
    cached_lp, cached_grads = run(trunk)
    assert (trunk.hits, trunk.misses) == (2, 8) and len(trunk) == 6  # rows 1-2 read; 0-3, then 2-5 computed
    for a, b in zip(plain_lp, cached_lp, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert_close_grads(plain_grads, cached_grads)
    assert all("layers.1." in n for n in cached_grads)  # the adapter of the top layer only
    read_before = trunk.hits
    again_lp, again_grads = run(trunk)  # every row from the trunk now
    assert trunk.hits == read_before + 10 and len(trunk) == 6
    assert_close_grads(plain_grads, again_grads)
    for a, b in zip(plain_lp, again_lp, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_frozen_trunk_refuses_a_trained_layer_or_embedding_below_it():
    from searchr1.trainer.frozen_trunk import FrozenTrunk

    decoder = FusedDecoder(make_model("llama", lora=True))  # adapters on both layers
    decoder.trunk = FrozenTrunk(1)
    ids, mask, target = batch()
    with pytest.raises(ValueError, match="layer 0 is trained"):
        fused_token_logprobs(decoder, ids, mask, target_mask=target)
    decoder.trunk = FrozenTrunk(3)
    with pytest.raises(ValueError, match="decoder of 2"):
        fused_token_logprobs(decoder, ids, mask, target_mask=target)
    trained_embedding = top_layer_model()
    trained_embedding.get_input_embeddings().weight.requires_grad_(True)
    decoder = FusedDecoder(trained_embedding)
    decoder.trunk = FrozenTrunk(1)
    with pytest.raises(ValueError, match="embedding is trained"):
        fused_token_logprobs(decoder, ids, mask, target_mask=target)
