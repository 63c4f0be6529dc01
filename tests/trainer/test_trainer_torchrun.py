"""The same entry point under torchrun (CPU, gloo): 2 processes train, checkpoint to the Hugging Face
folder, resume; DDP and FSDP2 give the same metrics (slow: several processes start)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import rlworld

from searchr1.trainer import checkpoint


def _torchrun(world, model_dir, out_dir, *extra: str) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to the interpreter")
    # old log-probs from a pass of their own (not the on-policy shortcut), so that rollout/ref_kl is logged
    args = rlworld.overrides(world, model_dir, out_dir, trainer__save_every=1, trainer__on_policy_logprobs=False,
                             reward__components={"rlworld:token_set_reward": 1.0})  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent), OMP_NUM_THREADS="1")
    cmd = [str(torchrun), "--nproc_per_node", "2", "-m", "searchr1", "train", *args, *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and k != "time"} for r in rows]


@pytest.mark.slow
def test_torchrun_ddp_and_fsdp(tmp_path, tiny_model_dir):
    world = rlworld.write_world(tmp_path / "world")
    runs = {}
    for strategy in ("ddp", "fsdp"):
        out = tmp_path / strategy
        done = _torchrun(world, tiny_model_dir, out, "trainer.total_steps=2", f"trainer.strategy={strategy}")
        assert done.returncode == 0, done.stderr[-3000:]
        runs[strategy] = rlworld.read_metrics(out)
        assert [s for s, _ in checkpoint.list_checkpoints(out)] == [1, 2]
    ddp, fsdp = _strip(runs["ddp"]), _strip(runs["fsdp"])
    for a, b in zip(ddp, fsdp, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "rollout/ref_kl"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key
    # resume the FSDP run for one more step from its gathered checkpoint
    shutil.rmtree(tmp_path / "fsdp/checkpoints/step_000002")
    done = _torchrun(
        world, tiny_model_dir, tmp_path / "fsdp", "trainer.total_steps=3", "trainer.strategy=fsdp"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stderr
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp/checkpoints/step_000003/model")
    rows = rlworld.read_metrics(tmp_path / "fsdp")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward/mean", "actor/pg_loss", "rollout/ref_kl"):  # step 2 again, from step 1's checkpoint
        assert rows[1][key] == pytest.approx(fsdp[1][key], abs=1e-5), key
