"""Which floating-point type to compute in, decided from the hardware rather than assumed.

bfloat16 matrix products are fast where the hardware has bfloat16 units: CUDA GPUs from Ampere on,
and CPUs with AVX512-BF16 or AMX (measured on 2 cores of an AMD EPYC with AVX512-BF16: a
64 x 576 x 1536 product runs at ~760 GFLOP/s in bfloat16 against ~180 in float32). Elsewhere
bfloat16 is emulated and slower than float32, so ``auto`` means float32 there, and an explicit
``bfloat16`` gives one warning and falls back.
"""

from __future__ import annotations

import functools
import platform
import sys
from pathlib import Path

import torch

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """The CPU has bfloat16 matrix instructions (x86 AVX512-BF16 / AMX-BF16, Arm BF16), per the OS."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set()
    for line in info.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def fast_bf16(device: torch.device) -> bool:
    """bfloat16 is fast on ``device`` (a CUDA GPU that supports it, or a CPU with bf16 units)."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_has_fast_bf16()
    return False


_warned: set[str] = set()


def compute_dtype(requested: str, device: torch.device, fallback: torch.dtype, key: str) -> torch.dtype:
    """The dtype to compute in for a config value: ``auto`` (bfloat16 where fast, else ``fallback``),
    ``model`` (``fallback``: the model's own dtype) or a dtype name. An explicit ``bfloat16`` where it
    is not fast warns once (naming ``key``) and returns ``fallback``."""
    if requested == "model":
        return fallback
    if requested == "auto":
        return torch.bfloat16 if fast_bf16(device) else fallback
    if requested not in DTYPE_NAMES:
        raise ValueError(f"{key}: expected auto | model | {' | '.join(DTYPE_NAMES)}, got {requested!r}")
    dtype = DTYPE_NAMES[requested]
    if dtype == torch.bfloat16 and not fast_bf16(device):
        if key not in _warned:
            _warned.add(key)
            print(
                f"warning: {key}=bfloat16 but this {device.type} has no bfloat16 units; using {fallback}",
                file=sys.stderr,
            )
        return fallback
    return dtype


def autocast(device: torch.device, enabled: bool) -> torch.autocast:
    """bfloat16 autocast on ``device`` when ``enabled`` and bfloat16 is fast there; else a disabled one."""
    on = enabled and fast_bf16(device)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=on)


def frozen_linears_to_bf16(model: torch.nn.Module) -> int:
    """Store the frozen weights of the ``nn.Linear`` layers of ``model`` in bfloat16 (the base weights under
    LoRA, which autocast would otherwise convert at every forward); embeddings, norms, the LM head and every
    trainable parameter keep their dtype. Returns the number of weights converted."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    converted = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module is not head:
            for param in module.parameters(recurse=False):
                if not param.requires_grad and param.dtype != torch.bfloat16:
                    param.data = param.data.to(torch.bfloat16)
                    converted += 1
    return converted
