"""The collapse guard in a real training run (the tiny model; the ``stops_searching`` engine of
``tests/collapse_engine.py`` searches in steps 1-2 and stops after): it must warn at step 4, once, on the
console, log ``health/*`` in metrics.jsonl, and keep what it saw across a resume."""

from __future__ import annotations

import collapse_engine
import rlworld

from searchr1.cli import main
from searchr1.trainer.loop import RLTrainer

EXTRA = {
    "plugins": ["collapse_engine"],
    "rollout__engine": "stops_searching",
    "reward__components": {"rlworld:token_set_reward": 1.0},
}


def test_a_run_that_stops_searching_is_warned_and_the_guard_survives_a_resume(
    tiny_model_dir, tmp_path, capsys
):
    world = rlworld.write_world(tmp_path / "world")
    run = tmp_path / "run"
    step = collapse_engine.ALERT_STEP
    assert (
        main(["train", *rlworld.overrides(world, tiny_model_dir, run, trainer__total_steps=step, **EXTRA)])
        == 0
    )
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "possible collapse" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"warning: possible collapse at step {step}: searching stopped")
    rows = rlworld.read_metrics(run)
    assert [r["rollout/searches"] for r in rows] == [1.0, 1.0, 0.0, 0.0]  # what the engine was told to do
    assert [r["health/searching_stopped"] for r in rows] == [0.0, 0.0, 0.0, 1.0]
    assert [r["health/collapse"] for r in rows] == [0.0, 0.0, 0.0, 1.0]
    assert all(r["health/format_lost"] == 0.0 and r["health/answers_unclosed"] == 0.0 for r in rows)

    # resumed from the step-4 checkpoint: the guard remembers the best searches (1.0) and its alert, so
    # the pattern still holds at steps 5-6, and is not announced again
    cfg = rlworld.load(world, tiny_model_dir, run, trainer__total_steps=step + 2, **EXTRA)
    summary = RLTrainer(cfg).train()
    err = capsys.readouterr().err
    assert (
        f"resumed from {run / 'checkpoints' / f'step_{step:06d}'}" in err and "possible collapse" not in err
    )
    rows = rlworld.read_metrics(run)
    assert [r["health/searching_stopped"] for r in rows] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert [(a["step"], a["pattern"]) for a in summary["health"]] == [(step, "searching_stopped")]
    assert summary["health"][0]["message"] == warnings[0]
