"""The collapse guard (trainer/health.py) on scripted metric sequences, and in a tiny training run."""

from __future__ import annotations

import pytest

from searchr1.trainer.health import PATTERNS, CollapseMonitor, flat_group_share


def feed(steps: list[dict[str, float]], **kw) -> tuple[CollapseMonitor, list[tuple[int, str]], list[dict]]:
    monitor = CollapseMonitor(**kw)
    alerts, seen = [], []
    for step, metrics in enumerate(steps, start=1):
        metrics = dict(metrics)
        alerts += [(a.step, a.pattern) for a in monitor.observe(step, metrics)]
        seen.append(metrics)
    return monitor, alerts, seen


def steps(**series: list[float]) -> list[dict[str, float]]:
    keys = {"entropy": "actor/entropy", "answered": "rollout/answered", "searches": "rollout/searches",
            "valid": "rollout/valid_format", "flat": "rollout/flat_groups"}  # fmt: skip
    n = len(next(iter(series.values())))
    return [{keys[k]: v[i] for k, v in series.items()} for i in range(n)]


def test_a_healthy_run_raises_nothing_and_logs_zeros():
    run = steps(
        entropy=[0.30, 0.28, 0.25, 0.22, 0.20, 0.18],
        answered=[0.40, 0.60, 0.80, 0.90, 0.90, 0.95],
        searches=[0.9, 1.0, 1.0, 1.1, 1.0, 1.0],
        flat=[0.8, 0.6, 0.5, 0.5, 0.4, 0.5],
    )
    _, alerts, seen = feed(run)
    assert alerts == []
    assert all(m["health/collapse"] == 0.0 and all(m[f"health/{p}"] == 0.0 for p in PATTERNS) for m in seen)


def test_unclosed_answers_with_falling_entropy_warn_once_at_the_step_they_show():
    # answered peaks at 0.9 (2-step mean 0.9 at step 4), falls; entropy falls below half its first value
    run = steps(
        entropy=[0.30, 0.28, 0.20, 0.14, 0.10, 0.08, 0.07, 0.07],
        answered=[0.40, 0.70, 0.90, 0.90, 0.50, 0.30, 0.10, 0.10],
    )
    monitor, alerts, seen = feed(run)
    # step 6: mean(0.5, 0.3) = 0.4 < 0.45 and mean entropy 0.09 < 0.15
    assert alerts == [(6, "answers_unclosed")]
    assert [m["health/answers_unclosed"] for m in seen] == [0, 0, 0, 0, 0, 1, 1, 1]
    assert "step 6" in monitor.alerts[0].message and "rollout/answered" in monitor.alerts[0].message


def test_falling_answers_with_steady_entropy_are_not_a_collapse():
    run = steps(entropy=[0.3] * 8, answered=[0.40, 0.70, 0.90, 0.90, 0.50, 0.30, 0.10, 0.10])
    assert feed(run)[1] == []


def test_stopping_to_search_and_losing_the_format_are_named():
    run = steps(
        entropy=[0.3] * 7,
        searches=[0.9, 0.95, 0.9, 0.5, 0.2, 0.05, 0.03],
        valid=[0.1, 0.3, 0.5, 0.5, 0.4, 0.1, 0.0],
    )
    _, alerts, _ = feed(run)
    assert alerts == [(5, "searching_stopped"), (7, "format_lost")]  # means 0.25 at 6 is not < 0.5 * 0.5


def test_a_signal_that_never_mattered_is_not_watched():
    run = steps(entropy=[0.3] * 6, searches=[0.15, 0.1, 0.05, 0.0, 0.0, 0.0])
    assert feed(run)[1] == []  # best 0.125 < min_best 0.2: a run that never searched cannot stop


def test_no_signal_left_when_groups_turn_flat_and_entropy_falls():
    run = steps(entropy=[0.3, 0.25, 0.2, 0.12, 0.1, 0.08], flat=[0.5, 0.4, 0.6, 0.8, 0.95, 1.0])
    assert feed(run)[1] == [(5, "no_signal")]


def test_state_round_trip_keeps_the_best_and_the_alerts():
    run = steps(entropy=[0.30, 0.28, 0.20, 0.14, 0.10, 0.08], answered=[0.4, 0.7, 0.9, 0.9, 0.5, 0.3])
    monitor, _, _ = feed(run[:5])
    restored = CollapseMonitor()
    restored.load_state_dict(monitor.state_dict())
    assert restored.best == monitor.best and restored.first_entropy == monitor.first_entropy
    assert [a.pattern for a in restored.observe(6, dict(run[5]))] == ["answers_unclosed"]


def test_flat_group_share():
    assert flat_group_share([0, 0, 1, 0, 1, 1, 0.5, 0.5], [0, 0, 1, 1, 2, 2, 3, 3]) == pytest.approx(0.75)
    assert flat_group_share([], []) == 0.0
