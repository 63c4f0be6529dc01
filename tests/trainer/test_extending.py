"""Extending without forking: the plugin module printed in docs/extending.md (a reward
component, an advantage estimator, a search backend and a rollout engine that holds a model of its own)
is written to a folder outside the package and named in the config; ``searchr1 train``, ``eval`` and
``ask`` then use all four by name, each run as a user runs it (a separate process)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import rlworld

README = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def readme_plugin() -> str:
    """The ``# my_plugin.py`` code block of docs/extending.md."""
    found = re.search(r"```python\n# my_plugin\.py\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert found, "docs/extending.md shows my_plugin.py"
    return found.group(1)


def searchr1(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "searchr1", *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's folder: the plugin module and a tiny world, nothing of the package."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my_plugin.py").write_text(readme_plugin())
    return folder


def test_a_plugin_of_each_kind_trains_and_evaluates_by_name(workdir, tiny_model_dir):
    world = rlworld.write_world(workdir / "world")
    run = workdir / "runs" / "mine"
    overrides = rlworld.overrides(
        world, tiny_model_dir, run, trainer__total_steps=1, plugins=["my_plugin"],
        reward__components={"short_answer": 1.0, "f1": 1.0}, algorithm__advantage="batch_mean",
        retrieval__backend="keyword", rollout__engine="own_copy",
    )  # fmt: skip
    done = searchr1("train", *overrides, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = rlworld.read_metrics(run)
    assert "reward/short_answer" in metrics[-1] and "reward/f1" in metrics[-1]
    saved = (run / "config.yaml").read_text()
    for line in ("- my_plugin", "advantage: batch_mean", "backend: keyword", "engine: own_copy"):
        assert line in saved
    checkpoint = run / "checkpoints" / "step_000001" / "model"

    search = ["--backend", "keyword", "--corpus", world["corpus"], "--set", "rollout.engine=own_copy"]
    tiny = ["--max-turns", "1", "--max-turn-tokens", "6", "--template", world["template"]]
    done = searchr1(
        "eval", "--plugin", "my_plugin", "--model", checkpoint, "--data", world["val"], "--mode", "rag,agent",
        "--out", workdir / "eval", *search, *tiny, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rag = [json.loads(x) for x in (workdir / "eval" / "rag" / "trajectories.jsonl").read_text().splitlines()]
    scores = [hit["score"] for rec in rag for hits in rec["documents"] for hit in hits]
    assert scores and all(s == int(s) for s in scores), "the keyword backend's scores are word counts"

    done = searchr1("ask", "where was Alice Verdan born", "--plugin", "my_plugin", "--model", checkpoint,
                    "--json", *search, *tiny, cwd=workdir)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["question"] == "where was Alice Verdan born"


def test_without_the_plugin_the_names_are_unknown(workdir, tiny_model_dir):
    done = searchr1("train", "--print-config", "retrieval.backend=keyword", cwd=workdir)
    assert done.returncode == 2
    assert "retrieval.backend: unknown search backend 'keyword'; known: bing, bm25" in done.stderr
    done = searchr1(
        "train", "--print-config", "plugins=[my_plugin]", "retrieval.backend=keyword", cwd=workdir
    )
    assert done.returncode == 0 and "backend: keyword" in done.stdout
