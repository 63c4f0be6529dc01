"""The evaluation package's shape: every module imports on its own (no import cycle, whatever is
imported first), and what ``searchr1 --help``, ``report`` and the tables need does not import torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LIGHT = [
    "searchr1.evaluation",
    "searchr1.evaluation.errors",
    "searchr1.evaluation.modes",
    "searchr1.evaluation.aggregate",
    "searchr1.evaluation.tables",
    "searchr1.evaluation.store",
    "searchr1.evaluation.progress",
    "searchr1.evaluation.runner",
    "searchr1.evaluation.agent",
    "searchr1.evaluation.cli",
    "searchr1.rollout.records",
    "searchr1.report",
    "searchr1.report.loading",
    "searchr1.report.html",
]
"""Modules that must not import torch (the engines import it when they generate)."""
HEAVY = ["searchr1.rollout.single_turn"]

PROBE = "import importlib, sys; importlib.import_module(sys.argv[1]); print('torch' in sys.modules)"


@pytest.mark.parametrize("module", LIGHT + HEAVY)
def test_module_imports_on_its_own(module):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
    assert done.stdout.strip() == ("True" if module in HEAVY else "False")


def test_the_old_entry_points_still_work():
    from searchr1 import Agent
    from searchr1.cli import COMMAND_MODULES, build_parser
    from searchr1.evaluation.agent import Agent as AgentClass

    assert Agent is AgentClass
    assert "searchr1.evaluation.cli" in COMMAND_MODULES
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"eval", "ask", "report"} <= set(commands)
