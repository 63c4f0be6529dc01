"""Building the pieces of a run from its configuration: data, retriever, tokenizer, policy (LoRA),
reference, critic, reward; and writing the policy as a Hugging Face folder.

``model.path`` is anything ``searchr1.models.resolve_model`` accepts (a folder, an alias such as
``smollm2-135m-instruct``, a ``.gguf`` file, a hub id). ``data.train_files`` unset means the embedded synthetic world (generated under ``<out_dir>/world``),
with a BM25 index over its corpus unless ``retrieval`` says otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from searchr1.algorithms.registry import advantage_traits
from searchr1.data.formats import load_samples
from searchr1.data.synth import ensure_world
from searchr1.models import load_model, load_tokenizer, merged_lora_state_dict, resolve_model
from searchr1.retrieval.factory import build_retriever
from searchr1.rewards.composite import build_reward
from searchr1.trainer.critic import ValueModel
from searchr1.trainer.distributed import DistInfo, full_state_dict, unwrap


@dataclass
class Built:
    tokenizer: Any
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    critic: torch.nn.Module | None
    retriever: Any
    reward_fn: Any
    train_samples: list[Any]
    val_samples: list[Any]
    engine: Any
    lora: bool
    model_path: str


def resolve_data(cfg: Any, out_dir: Path) -> tuple[list[str], list[str], str | None]:
    """(train files, val files, corpus) - the synthetic world when no training files are given."""
    if cfg.data.train_files:
        return list(cfg.data.train_files), list(cfg.data.val_files or []), None
    files = ensure_world(out_dir / "world", seed=cfg.seed)
    val = list(cfg.data.val_files) if cfg.data.val_files else [str(files["val"])]
    return [str(files["train"])], val, str(files["corpus"])


def prepare_files(cfg: Any, world: bool = True, model: bool = True) -> None:
    """Write what every rank then reads (idempotent): the synthetic world when no training files are
    given, and the model's folder when ``model.path`` needs converting (a GGUF file or an alias)."""

    if world:
        resolve_data(cfg, Path(cfg.trainer.out_dir))
    if model:
        resolve_model(cfg.model.path)


def build(cfg: Any, injected: dict[str, Any], resume_from: Path | None) -> Built:
    """Every piece of a run: the injected ones as given, the others from ``cfg`` (and the checkpoint
    ``resume_from``, if any)."""
    train_samples, val_samples, corpus = _samples(cfg, injected)
    retriever = injected.get("retriever")
    if retriever is None:
        retriever = _retriever(cfg, corpus)
    tokenizer = injected.get("tokenizer")
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.path)
    reward_fn = injected.get("reward_fn")
    if reward_fn is None:
        reward_fn = build_reward(cfg.reward)
    policy, reference = _policy_and_reference(cfg, injected.get("model"), resume_from)
    return Built(
        tokenizer=tokenizer,
        policy=policy,
        reference=reference,
        critic=_critic(cfg, resume_from),
        retriever=retriever,
        reward_fn=reward_fn,
        train_samples=train_samples,
        val_samples=val_samples,
        engine=injected.get("engine"),
        lora=cfg.model.lora_r > 0,
        model_path=str(cfg.model.path),
    )


def _samples(cfg: Any, injected: dict[str, Any]) -> tuple[list[Any], list[Any], str | None]:
    """(training samples, validation samples, the synthetic world's corpus when it is the data)."""
    train_samples = injected.get("train_samples")
    val_samples = injected.get("val_samples")
    corpus = None
    if train_samples is None:
        train_files, val_files, corpus = resolve_data(cfg, Path(cfg.trainer.out_dir))
        train_samples = [s for path in train_files for s in load_samples(path)]
        if val_samples is None:
            val_samples = [s for path in val_files for s in load_samples(path)]
    if len(train_samples) < cfg.trainer.batch_size:
        raise ValueError(
            f"trainer.batch_size={cfg.trainer.batch_size} but the training data has only {len(train_samples)} prompts"
        )
    return list(train_samples), list(val_samples or []), corpus


def _retriever(cfg: Any, world_corpus: str | None) -> Any:
    """``retrieval``'s backend; over the synthetic world's corpus when it is the data and no index or
    corpus is named."""
    rcfg = cfg.retrieval
    if world_corpus and rcfg.index is None and not rcfg.corpus:
        rcfg = dataclasses.replace(rcfg, corpus=world_corpus)
    return build_retriever(rcfg)


def _policy_and_reference(
    cfg: Any, model: Any, resume_from: Path | None
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy (the injected ``model`` or ``model.path``; resumed weights; LoRA; checkpointing) and
    the frozen or EMA reference when the KL needs one (none with LoRA: the adapter switched off is it)."""
    lora = cfg.model.lora_r > 0
    if model is None:
        source = str(resume_from / "model") if resume_from is not None and not lora else cfg.model.path
        model = load_model(source, dtype=cfg.model.dtype)
        base_for_ref = cfg.model.path
    else:
        base_for_ref = None
        if resume_from is not None and not lora:
            model.load_state_dict(_load_hf_weights(resume_from / "model"), strict=False)
    reference = None
    if cfg.algorithm.uses_reference and not lora:
        if (
            cfg.algorithm.ref_policy == "ema"
            and resume_from is not None
            and (resume_from / "reference").is_dir()
        ):
            reference = load_model(resume_from / "reference", dtype=cfg.model.dtype)
        elif resume_from is not None and base_for_ref is not None:
            reference = load_model(base_for_ref, dtype=cfg.model.dtype)
        else:
            reference = copy.deepcopy(model)
        reference.requires_grad_(False)
        reference.eval()
    if lora:
        model = _apply_lora(model, cfg.model, resume_from)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if lora and hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
        model.config.use_cache = False
    return model, reference


def _critic(cfg: Any, resume_from: Path | None) -> torch.nn.Module | None:
    """The value model, when the advantage estimator reads values (registered with ``needs_critic``)."""
    if not advantage_traits(cfg.algorithm.advantage).needs_critic:
        return None
    source = cfg.model.critic_path or cfg.model.path
    if resume_from is not None and (resume_from / "critic").is_dir():
        source = str(resume_from / "critic")
    critic = ValueModel.from_pretrained(str(source), dtype=cfg.model.dtype)
    if cfg.model.gradient_checkpointing:
        critic.gradient_checkpointing_enable()
    return critic


def _load_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    return sd


def _apply_lora(
    model: torch.nn.Module, mcfg: Any, resume_from: Path | None, top_layers: int = 0
) -> torch.nn.Module:
    """``model`` with a LoRA adapter on ``mcfg.lora_targets`` (every decoder layer, or with ``top_layers`` > 0
    the top ``top_layers`` only), or the adapter saved under ``resume_from``."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume_from is not None and (resume_from / "adapter").is_dir():
        return PeftModel.from_pretrained(model, str(resume_from / "adapter"), is_trainable=True)
    targets = [t for t in mcfg.lora_targets if any(name.endswith(t) for name, _ in model.named_modules())]
    if not targets:
        raise ValueError(
            f"model.lora_targets: none of {mcfg.lora_targets} names a module of {type(model).__name__}"
        )
    layers = None
    if top_layers > 0:
        total = int(getattr(model.config, "num_hidden_layers", 0))
        if not 0 < top_layers <= total:
            raise ValueError(f"LoRA on the top {top_layers} layers: {type(model).__name__} has {total}")
        layers = list(range(total - top_layers, total))
    config = LoraConfig(
        layers_to_transform=layers,
        r=mcfg.lora_r,
        lora_alpha=mcfg.lora_alpha,
        lora_dropout=mcfg.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def save_policy(
    policy: torch.nn.Module,
    tokenizer: Any,
    folder: Path,
    lora: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """``folder/model``: a Hugging Face folder ``from_pretrained`` loads (LoRA merged in);
    ``folder/adapter``: the LoRA adapter alone (for resuming)."""
    model = unwrap(policy)
    target = folder / "model"
    if lora:
        model.save_pretrained(str(folder / "adapter"))
        base = model.get_base_model()
        merged = {k: v.cpu() for k, v in merged_lora_state_dict(model).items()}
        base.save_pretrained(str(target), state_dict=merged, safe_serialization=True)
    else:
        sd = (
            state_dict
            if state_dict is not None
            else {k: v.detach().cpu() for k, v in model.state_dict().items()}
        )
        model.save_pretrained(str(target), state_dict=sd, safe_serialization=True)
    tokenizer.save_pretrained(str(target))


def save_plain(model: torch.nn.Module, folder: Path, info: DistInfo) -> None:
    sd = full_state_dict(model, info)
    unwrap(model).save_pretrained(str(folder), state_dict=sd, safe_serialization=True)


def save_critic(critic: torch.nn.Module, folder: Path, state_dict: dict[str, torch.Tensor] | None) -> None:
    """The critic as ``ValueModel.save_pretrained`` writes it (decoder folder + value head)."""
    model = unwrap(critic)
    if state_dict is not None:
        current = model.state_dict()
        if any(current[k].shape != v.shape for k, v in state_dict.items() if k in current):
            model = copy.deepcopy(model).to("cpu")  # sharded: write a gathered copy
            model.load_state_dict(state_dict)
    model.save_pretrained(folder)
