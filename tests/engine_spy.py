"""A spy on the engines that ``searchr1 eval`` builds: each engine and every trajectory it generates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def spy_eval_engines(monkeypatch, note: Callable[[Any], Any] = lambda engine: None) -> tuple[list, list]:
    """(engines, trajectories), filled as eval runs: ``(engine, note(engine))`` for each engine built (``note``
    reads what must be read while the engine is open), and the trajectories its ``generate`` returned."""
    import searchr1.evaluation.cli as eval_cli

    engines: list = []
    trajectories: list = []
    real = eval_cli.build_engine

    def spied(*args, **kwargs):
        engine = real(*args, **kwargs)
        engines.append((engine, note(engine)))
        generate = engine.generate

        def recorded(*a, **k):
            out = generate(*a, **k)
            trajectories.extend(out)
            return out

        engine.generate = recorded
        return engine

    monkeypatch.setattr(eval_cli, "build_engine", spied)
    return engines, trajectories
