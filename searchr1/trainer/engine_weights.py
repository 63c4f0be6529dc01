"""The last stage of a step: the rollout engine receives the policy's new weights, in the form it asked
for (``RolloutEngine.weight_format``), so that an engine in another process needs nothing else.

    module       the policy object itself (the HF engines: same process, nothing copied)
    state_dict   a plain causal-LM state dict, LoRA merged (gathered in full under FSDP)
    path         a ``from_pretrained`` folder, LoRA merged: ``<out_dir>/engine_weights/model``
    adapter      the LoRA adapter folder: ``<out_dir>/engine_weights/adapter`` (needs ``model.lora_r > 0``)

Folders are written by rank 0 and replaced atomically; every rank waits for them before its engine
loads them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from searchr1.models import plain_state_dict
from searchr1.rollout.engine import PolicyWeights
from searchr1.trainer.components import save_policy
from searchr1.trainer.distributed import DistInfo, barrier, full_state_dict, unwrap

FOLDER = "engine_weights"
"""Under the run folder: where the ``path`` and ``adapter`` forms are written."""


def check_weight_format(engine: Any, lora: bool) -> None:
    """Fail before training when the engine asks for a form this run cannot give."""
    fmt = getattr(engine, "weight_format", None)
    if fmt not in ("module", "state_dict", "path", "adapter"):
        raise ValueError(
            f"rollout engine {type(engine).__name__}: weight_format must be module | state_dict | path | adapter, "
            f"got {fmt!r}"
        )
    if fmt == "adapter" and not lora:
        raise ValueError(
            f"rollout engine {type(engine).__name__} takes LoRA adapters, but model.lora_r = 0 (full fine-tuning)"
        )


def policy_weights(
    fmt: str, policy: Any, *, step: int, tokenizer: Any, lora: bool, dist: DistInfo, out_dir: Path
) -> PolicyWeights:
    """The policy's weights after ``step`` updates in the form ``fmt`` (every rank calls: collective)."""
    model = unwrap(policy)
    if fmt == "module":
        return PolicyWeights(step, module=model)
    if fmt == "state_dict":
        if dist.enabled and not lora:
            return PolicyWeights(step, state_dict=full_state_dict(policy, dist, all_ranks=True))
        return PolicyWeights(step, state_dict=plain_state_dict(model))
    folder = Path(out_dir) / FOLDER
    sd = full_state_dict(policy, dist) if fmt == "path" and dist.enabled and not lora else None  # collective
    if dist.is_main:
        tmp = folder.with_name(f"{FOLDER}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if fmt == "path":
            save_policy(policy, tokenizer, tmp, lora=lora, state_dict=sd)
        else:
            model.save_pretrained(str(tmp / "adapter"))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    barrier(dist)
    if fmt == "path":
        return PolicyWeights(step, path=folder / "model")
    return PolicyWeights(step, adapter_path=folder / "adapter")


def hand_weights(
    engine: Any, policy: Any, *, step: int, tokenizer: Any, lora: bool, dist: DistInfo, out_dir: Path
) -> None:
    """``engine.update_weights`` with the policy's weights in the engine's own form."""
    weights = policy_weights(
        engine.weight_format, policy, step=step, tokenizer=tokenizer, lora=lora, dist=dist, out_dir=out_dir
    )
    engine.update_weights(weights)
