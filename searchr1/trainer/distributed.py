"""torch.distributed plumbing: the same entry point alone or under ``torchrun``.

Each rank rolls out its share of the prompts (whole groups), gradients are synchronised by DDP or
FSDP2 (``fully_shard``), and rank 0 alone logs and writes checkpoints; the full state dict is gathered
to rank 0 so checkpoints are the same Hugging Face folder whatever the world size.

Loss scaling: DDP and FSDP *average* gradients over ranks, so each rank's micro-batch loss is its
share of the global aggregate times the world size (see ``searchr1.trainer.loop``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); a no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(name: str) -> torch.device:
    """``trainer.device`` as a device with an index (``cuda`` alone: this rank's GPU, ``LOCAL_RANK`` under
    torchrun, else the current one), made the current CUDA device (``torch.cuda.set_device`` refuses a CUDA
    device without an index)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) if multi else torch.cuda.current_device()}"
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few scalars over ranks (float64, so counts stay exact)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def wrap_model(
    model: torch.nn.Module, info: DistInfo, strategy: str, device: torch.device
) -> torch.nn.Module:
    """DDP or FSDP2 around ``model`` when distributed; the model itself otherwise."""
    if not info.enabled:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # a forward wrapper (PolicyLogprobs) stays outside: the causal LM is the root, so the rollout
        # engine's direct calls to it enter through the root's hooks too
        root = model.model if hasattr(model, "_sharded") else model
        for layer in _decoder_layers(root):
            fully_shard(layer)
        fully_shard(root)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=False)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (each becomes an FSDP unit); found by the usual attribute paths."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            return list(layers)
    return []


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


@contextlib.contextmanager
def no_sync(model: torch.nn.Module, skip_sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on accumulation micro-batches (DDP / FSDP2)."""
    if skip_sync and hasattr(model, "no_sync"):
        with model.no_sync():
            yield
        return
    root = model if hasattr(model, "set_requires_gradient_sync") else getattr(model, "model", None)
    if hasattr(root, "set_requires_gradient_sync"):  # FSDP2 (possibly inside a forward wrapper)
        root.set_requires_gradient_sync(not skip_sync)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)
        return
    yield


def full_state_dict(
    model: torch.nn.Module, info: DistInfo, all_ranks: bool = False
) -> dict[str, torch.Tensor] | None:
    """The unsharded state dict on CPU: on rank 0 (None elsewhere under FSDP), or on every rank with
    ``all_ranks``. Collective under FSDP."""
    inner = unwrap(model)
    if info.enabled and _is_fsdp(inner):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if all_ranks:
            sd = get_model_state_dict(
                inner, options=StateDictOptions(full_state_dict=True, cpu_offload=False)
            )
            return {k: v.detach().cpu() for k, v in sd.items()}
        sd = get_model_state_dict(inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if info.is_main else None
    return {k: v.detach().cpu() for k, v in inner.state_dict().items()}


def _is_fsdp(model: torch.nn.Module) -> bool:
    return any(type(m).__name__.startswith("FSDP") for m in model.modules())


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> Any:
    """The optimizer state to checkpoint. Under FSDP2 every state tensor is gathered in full
    (collective) and keyed by the parameter's position in the optimizer, so the checkpoint does not
    depend on the world size; otherwise ``optimizer.state_dict()``."""
    if not (info.enabled and _is_fsdp(unwrap(module))):
        return optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    full: dict[int, dict[str, Any]] = {}
    for index, param in enumerate(params):
        state = optimizer.state.get(param, {})
        full[index] = {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
            if torch.is_tensor(v)
            else v
            for k, v in state.items()
        }
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"fsdp_full": {"state": full, "param_groups": groups}}


def load_optimizer_state(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Any, info: DistInfo
) -> None:
    """Inverse of ``optimizer_state`` (resume with the ``trainer.strategy`` it was saved with)."""
    fsdp = info.enabled and _is_fsdp(unwrap(module))
    if fsdp != (isinstance(state, dict) and "fsdp_full" in state):
        raise ValueError(
            "trainer.strategy: this checkpoint's optimizer state was saved with another strategy "
            "(fsdp vs ddp / single process); resume with the strategy it was trained with"
        )
    if not fsdp:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.tensor import distribute_tensor

    saved = state["fsdp_full"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        group.update(saved_group)
    for index, param in enumerate(params):
        entry = {}
        for k, v in saved["state"].get(index, {}).items():
            if torch.is_tensor(v) and hasattr(param, "device_mesh") and v.shape == param.shape:
                v = distribute_tensor(v.to(param.device), param.device_mesh, param.placements)
            entry[k] = v
        if entry:
            optimizer.state[param] = entry
