"""Checkpoints that a kill never leaves half-written, and resume from the newest complete one.

Layout of ``<out_dir>/checkpoints/step_000120/``::

    model/              Hugging Face folder (safetensors + config + tokenizer): from_pretrained loads it
    adapter/            the LoRA adapter (peft format), only with model.lora_r > 0
    critic/             the PPO critic (ValueModel.save_pretrained: decoder folder + value head)
    reference/          the EMA reference (algorithm.ref_policy=ema), a Hugging Face folder
    trainer_state.pt    optimizer(s), scheduler(s), RNG states, data position, step, counters
    config.yaml         the full run configuration
    COMPLETE            written last

``trainer.keep_best=val_em`` also keeps ``<out_dir>/checkpoints/best/`` (``model/``, ``adapter/``,
``best.json`` with the step and validation EM, ``COMPLETE``), replaced atomically when a validation
beats it; ``best_checkpoint`` finds it, rotation never deletes it, and ``load_best`` puts it back into a
policy (``RLTrainer.restore_best`` after a resume).

Everything is written to ``.tmp-step_000120`` and renamed at the end (a rename is atomic on POSIX);
only folders with ``COMPLETE`` count. ``keep_last`` complete checkpoints are kept.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from searchr1.data.trained_settings import run_settings
from searchr1.data.trained_template import TEMPLATE_FILE, run_template, write_trained_template
from searchr1.trainer.distributed import unwrap

STEP_RE = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """Every RNG the run touches: python, numpy, torch CPU and CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (step, path), oldest first."""
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_RE.match(child.name)
        if match and (child / COMPLETE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def resolve_resume(resume: str, out_dir: str | Path) -> Path | None:
    """The checkpoint to resume from for ``trainer.resume`` (auto | never | path), or None."""
    if resume == "never":
        return None
    if resume == "auto":
        return latest_checkpoint(out_dir)
    path = Path(resume)
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(f"trainer.resume: {path} is not a complete checkpoint (no {COMPLETE} file)")
    return path


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    write_model: Any,
    trainer_state: dict[str, Any],
    config_yaml: str,
    critic_state: dict[str, Any] | None = None,
    keep_last: int = 3,
) -> Path:
    """Write a checkpoint atomically and prune old ones; returns the final folder.

    ``write_model(folder)`` writes the Hugging Face folder (and the adapter, if any) into ``folder``.
    """
    root = checkpoint_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_model(tmp)
    if critic_state is not None:
        torch.save(critic_state, tmp / "critic.pt")
    torch.save(trainer_state, tmp / "trainer_state.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    (tmp / COMPLETE).write_text(f"{step}\n")
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. signal right after a periodic save)
        old = root / f".old-{name}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    prune_checkpoints(out_dir, keep_last)
    return final


BEST = "best"
BEST_INFO = "best.json"


def best_dir(out_dir: str | Path) -> Path:
    """Where ``trainer.keep_best`` keeps the best validated policy of a run."""
    return checkpoint_dir(out_dir) / BEST


def save_best(out_dir: str | Path, write_model: Any, info: dict[str, Any]) -> Path:
    """Write the best policy so far (``write_model(folder)``) with ``info`` (step, val EM) to
    ``best_dir``, replacing the previous best atomically."""
    import json

    final = best_dir(out_dir)
    tmp = final.parent / f".tmp-{BEST}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write_model(tmp)
    (tmp / BEST_INFO).write_text(json.dumps(info) + "\n")
    (tmp / COMPLETE).write_text(f"{info.get('step')}\n")
    _fsync_dir(tmp)
    if final.exists():
        old = final.parent / f".old-{BEST}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(final.parent)
    return final


def best_checkpoint(out_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """``(folder, info)`` of a run's kept best policy, or None when it has none (complete ones only)."""
    import json

    folder = best_dir(out_dir)
    if not (folder / COMPLETE).is_file():
        return None
    return folder, json.loads((folder / BEST_INFO).read_text())


def resumed_best(out_dir: str | Path, saved: dict[str, Any] | None) -> dict[str, Any] | None:
    """The best validation of a resumed run: the one its checkpoint ``saved``, or the kept folder's when
    it beats that (a best written after the checkpoint still counts)."""
    kept = best_checkpoint(out_dir)
    if kept is not None and (saved is None or kept[1]["em"] > saved["em"]):
        return kept[1]
    return saved


def load_best(policy: torch.nn.Module, out_dir: str | Path, lora: bool) -> dict[str, Any] | None:
    """Put the run's kept best policy (``checkpoints/best``) into ``policy``, in place, and return its info
    (step, validation EM); None (``policy`` untouched) when the run kept none. With ``lora`` its adapter
    (``adapter/``) is loaded, else the whole model's trainable parameters (``model/``)."""
    kept = best_checkpoint(out_dir)
    if kept is None:
        return None
    folder, info = kept
    if lora:
        from peft import get_peft_model_state_dict
        from peft.utils import load_peft_weights

        saved = load_peft_weights(str(folder / "adapter"), device="cpu")
        live = get_peft_model_state_dict(unwrap(policy))  # the adapter's tensors under their saved names
    else:
        from safetensors.torch import load_file

        saved = {}
        for f in sorted((folder / "model").glob("*.safetensors")):
            saved.update(load_file(str(f)))
        live = {n: p for n, p in unwrap(policy).named_parameters() if p.requires_grad}
    missing = sorted(set(live) - set(saved))
    if missing:
        raise ValueError(
            f"{folder}: the kept best policy lacks {len(missing)} of the policy's tensors ({missing[0]}, ...)"
        )
    copy_params(live, {name: saved[name] for name in live})
    return info


@torch.no_grad()
def copy_params(targets: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> None:
    """``targets[name].copy_(value)`` for every ``name, value`` of ``values``; a sharded (FSDP2) target
    receives its own shard of a full value (every rank calls: collective then)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, value in values.items():
        target = targets[name]
        if isinstance(target, DTensor) and not isinstance(value, DTensor):
            value = distribute_tensor(
                value.to(target.device, target.dtype), target.device_mesh, target.placements
            )
        target.copy_(value)


def export_policy(run_dir: str | Path, out: str | Path, best: bool = False) -> tuple[Path, str]:
    """Copy a run's policy (``model/``, a ``from_pretrained`` folder) to ``out``: the newest complete
    checkpoint's, or with ``best`` the kept best (``trainer.keep_best``), with the prompt template the run
    was trained with (``searchr1.data.trained_template``: ``eval`` and ``ask`` use it). Returns (the
    copied folder, where it came from and its template)."""
    if best:
        kept = best_checkpoint(run_dir)
        if kept is None:
            raise FileNotFoundError(
                f"{run_dir}: no kept best policy (train with trainer.keep_best=val_em and trainer.val_every > 0)"
            )
        source, origin = kept[0], f"best validation EM {kept[1]['em']:.3f} at step {kept[1]['step']}"
    else:
        latest = latest_checkpoint(run_dir)
        if latest is None:
            raise FileNotFoundError(f"{run_dir}: no complete checkpoint")
        source, origin = latest, f"newest checkpoint {latest.name}"
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} exists and is not empty")
    shutil.copytree(source / "model", target, dirs_exist_ok=True)
    return target, f"{origin}; {carry_template(run_dir, target, source)}"


def carry_template(run_dir: str | Path, folder: str | Path, checkpoint: str | Path | None = None) -> str:
    """Record in an exported policy ``folder`` the prompt template and the retrieval and rollout settings
    the run was trained with (its ``config.yaml``, else ``checkpoint``'s; ``searchr1.data.trained_template``,
    ``searchr1.data.trained_settings``), so that ``eval`` and ``ask`` prompt and run it the same way;
    returns what to tell the user."""
    trained = run_template(run_dir, checkpoint)
    settings = run_settings(run_dir, checkpoint)
    if trained is None and not settings:
        return f"no prompt template or settings recorded in {run_dir}"
    write_trained_template(folder, trained, run_dir, settings)
    told = f"{len(settings)} retrieval and rollout settings" if settings else "no settings"
    if trained is None:
        return f"no prompt template recorded in {run_dir}; {told} carried"
    note = "" if trained.found else f": the file is not found here, so {TEMPLATE_FILE} only names it"
    return f"trained with the prompt template {trained.recorded}{note}; {told} carried"


def prune_checkpoints(out_dir: str | Path, keep_last: int) -> None:
    found = list_checkpoints(out_dir)
    for _, path in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)
    root = checkpoint_dir(out_dir)
    for child in root.iterdir():  # leftovers of a killed save
        if child.name.startswith((".tmp-", ".old-")) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=False)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
