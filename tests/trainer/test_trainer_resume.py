"""Kill a CPU training run with SIGKILL at an arbitrary step, resume it, and get the very same metrics
as an uninterrupted run with the same seed (checkpoints carry weights, optimizer, scheduler, RNG
states and the data position)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import rlworld

from searchr1.trainer import checkpoint

TOTAL_STEPS = 5


def _command(world, model_dir, out_dir) -> list[str]:
    extra = rlworld.overrides(
        world,
        model_dir,
        out_dir,
        trainer__total_steps=TOTAL_STEPS,
        trainer__save_every=1,
        trainer__keep_last=2,
        reward__components={"rlworld:token_set_reward": 1.0},
        algorithm__advantage="grpo",
    )
    return [sys.executable, "-m", "searchr1", "train", *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def _comparable(rows: list[dict]) -> dict[int, dict]:
    return {
        r["step"]: {k: v for k, v in r.items() if not k.startswith("timing/") and k != "time"} for r in rows
    }


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, tiny_model_dir):
    world = rlworld.write_world(tmp_path / "world")
    reference_dir, killed_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    subprocess.run(_command(world, tiny_model_dir, reference_dir), env=_env(), check=True, timeout=600,
                   capture_output=True)  # fmt: skip

    kill_at = random.Random(1234).randint(1, TOTAL_STEPS - 2)
    proc = subprocess.Popen(_command(world, tiny_model_dir, killed_dir), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    metrics = killed_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and any(r["step"] >= kill_at for r in rlworld.read_metrics(killed_dir)):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = [step for step, _ in checkpoint.list_checkpoints(killed_dir)]
    assert saved and max(saved) < TOTAL_STEPS

    done = subprocess.run(_command(world, tiny_model_dir, killed_dir), env=_env(), timeout=600,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {checkpoint.checkpoint_dir(killed_dir)}" in done.stderr

    expected = _comparable(rlworld.read_metrics(reference_dir))
    got = _comparable(rlworld.read_metrics(killed_dir))
    assert sorted(got) == list(range(1, TOTAL_STEPS + 1))
    for step in range(max(saved) + 1, TOTAL_STEPS + 1):
        assert got[step] == expected[step], f"step {step} differs after resume"
    # only complete checkpoints remain, the newest kept
    assert [s for s, _ in checkpoint.list_checkpoints(killed_dir)] == [TOTAL_STEPS - 1, TOTAL_STEPS]
    assert not any(p.name.startswith(".tmp-") for p in checkpoint.checkpoint_dir(killed_dir).iterdir())


def test_sigterm_writes_a_checkpoint_at_the_current_step_and_stops(tmp_path, tiny_model_dir):
    """With periodic saves off (save_every=0), SIGTERM still leaves a complete checkpoint of the step
    the run had reached, and the run stops there instead of finishing."""
    world = rlworld.write_world(tmp_path / "world")
    out = tmp_path / "run"
    extra = rlworld.overrides(
        world,
        tiny_model_dir,
        out,
        trainer__total_steps=50,
        trainer__save_every=0,
        reward__components={"rlworld:token_set_reward": 1.0},
        algorithm__advantage="grpo",
    )
    proc = subprocess.Popen([sys.executable, "-m", "searchr1", "train", *extra], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "metrics.jsonl").is_file() and rlworld.read_metrics(out):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before the signal"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "signal received: checkpoint written" in stderr, stderr[-2000:]
    last_logged = max(r["step"] for r in rlworld.read_metrics(out))
    saved = [step for step, _ in checkpoint.list_checkpoints(out)]
    assert saved == [last_logged] and last_logged < 50
    model_dir = checkpoint.checkpoint_dir(out) / f"step_{last_logged:06d}" / "model"
    assert (model_dir / "model.safetensors").is_file()
