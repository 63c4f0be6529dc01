"""``scripts/gpu-check.sh`` on this machine: every part runs on the CPU (the CUDA-only one prints one SKIP line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the check runs its CUDA parts instead"
)
def test_gpu_check_runs_on_the_cpu_and_skips_the_cuda_part():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True, timeout=600
    )
    lines = [line for line in out.stdout.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")]
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    status = {line.split(":", 1)[0][6:]: line[:4] for line in lines}
    assert status == {
        "environment": "PASS",
        "slot decoder (float32) vs Hugging Face forward": "PASS",
        "rollout engine (bfloat16, LoRA policy, scripted searches)": "PASS",
        "fused decoder (bfloat16 on the device) vs float32 on the CPU": "SKIP",
        "one GRPO step (bfloat16)": "PASS",
        "one guided trainer step (gold and branched rollouts, step credit, policy shaping)": "PASS",
        "FSDP2 in one process (NCCL on the GPU, gloo on the CPU)": "PASS",
        "CUDA graph decode (float32) vs eager decode": "SKIP",
        "one GRPO step with CUDA graphs (rollout.cuda_graphs=on)": "SKIP",
    }, out.stdout
    assert "prefix shared: 0 tokens" not in out.stdout  # the slot decoder's shared prefix was exercised
    assert out.stdout.rstrip().endswith("all parts passed or skipped")
