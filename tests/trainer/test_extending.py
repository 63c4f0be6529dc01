"""Extending without forking: the plugin module printed in docs/extending.md (a reward
component, an advantage estimator, a search backend and a rollout engine that holds a model of its own)
is written to a folder outside the package and named in the config; ``searchr1 train``, ``eval`` and
``ask`` then use all four by name, each run as a user runs it (a separate process), and each is seen
acting, not only named: the reward's metric, the backend's word-count scores, and (through a second plugin
that records the calls of the first's estimator and engine) advantages that are the batch's rewards minus
their mean, used by the update, and the engine's own model receiving the policy's weights before the first
rollout and after the update."""

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


SPY = """
# spy.py: the estimator and the engine of my_plugin, registered again under their names with every call
# written to $SPY_LOG (one JSON object a line); and a reward that differs between samples of the tiny model
# (its answers are never short or right), so that the advantages are not all zero
import json
import os

import my_plugin
from searchr1.algorithms import register_advantage
from searchr1.rewards import RewardComponent, register_reward
from searchr1.rollout.registry import register_engine


@register_reward("letters")
class Letters(RewardComponent):
    def score(self, ctx):
        return sum(c.isalpha() for c in ctx.response) / max(1, len(ctx.response))


def log(kind, **fields):
    with open(os.environ["SPY_LOG"], "a") as f:
        f.write(json.dumps({"kind": kind, **fields}) + "\\n")


def checksum(tensors, names):
    return float(sum(tensors[k].double().sum() for k in names))


@register_advantage("batch_mean", override=True)
def batch_mean(rewards, response_mask, **kwargs):
    advantages, returns = my_plugin.batch_mean(rewards, response_mask, **kwargs)
    score = rewards if rewards.dim() == 1 else (rewards * response_mask).sum(-1)
    per_row = (advantages * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)
    token_mean = (advantages * response_mask).sum() / response_mask.sum()
    log("advantages", rewards=score.tolist(), per_row=per_row.tolist(), token_mean=float(token_mean))
    return advantages, returns


class SpiedEngine(my_plugin.OwnCopyEngine):
    def generate(self, prompt_ids, metas=None, **kwargs):
        trajs = super().generate(prompt_ids, metas, **kwargs)
        log("generate", rows=len(trajs), generated=sum(t.num_generated for t in trajs))
        return trajs

    def update_weights(self, weights):
        super().update_weights(weights)
        names = sorted(weights.state_dict)
        log("update_weights", step=weights.step, sent=checksum(weights.state_dict, names),
            held=checksum(self.model.state_dict(), names))


@register_engine("own_copy", override=True)
def own_copy(cfg, model, tokenizer, retriever, **kwargs):
    return SpiedEngine(cfg, model, tokenizer, retriever)
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A user's folder: the plugin module and a tiny world, nothing of the package."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my_plugin.py").write_text(readme_plugin())
    (folder / "spy.py").write_text(SPY)
    return folder


def _calls(log: Path) -> dict[str, list[dict]]:
    calls: dict[str, list[dict]] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        calls.setdefault(record.pop("kind"), []).append(record)
    return calls


def test_a_plugin_of_each_kind_trains_and_evaluates_by_name(workdir, tiny_model_dir, monkeypatch):
    world = rlworld.write_world(workdir / "world")
    run = workdir / "runs" / "mine"
    overrides = rlworld.overrides(
        world, tiny_model_dir, run, trainer__total_steps=1, plugins=["my_plugin", "spy"],
        reward__components={"short_answer": 1.0, "f1": 1.0, "letters": 1.0}, algorithm__advantage="batch_mean",
        retrieval__backend="keyword", rollout__engine="own_copy", trainer__batch_size=4,
        trainer__mini_batch_size=4,
    )  # fmt: skip
    log = workdir / "calls.jsonl"
    monkeypatch.setenv("SPY_LOG", str(log))
    done = searchr1("train", *overrides, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = rlworld.read_metrics(run)
    assert "reward/short_answer" in metrics[-1] and "reward/f1" in metrics[-1]
    saved = (run / "config.yaml").read_text()
    for line in ("- my_plugin", "advantage: batch_mean", "backend: keyword", "engine: own_copy"):
        assert line in saved

    calls = _calls(log)
    # the estimator: called on the step's rewards; A = R - mean(R), zero-mean over the batch; the update used it
    [adv] = calls["advantages"]
    rewards = adv["rewards"]
    assert len(rewards) == 8 and sum(rewards) / 8 == pytest.approx(metrics[-1]["reward/mean"])
    assert len(set(rewards)) > 1, "the rewards differ, so the advantages are not all zero"
    mean = sum(rewards) / len(rewards)
    assert adv["per_row"] == pytest.approx([r - mean for r in rewards], abs=1e-6)
    assert sum(adv["per_row"]) == pytest.approx(0.0, abs=1e-5)
    assert metrics[-1]["actor/advantage_mean"] == pytest.approx(adv["token_mean"], abs=1e-6)
    # the engine: generated the step's rollout, and its own model got the policy before it and after the update
    assert [c["rows"] for c in calls["generate"]] == [8]
    weights = calls["update_weights"]
    assert [c["step"] for c in weights] == [0, 1]
    assert all(c["held"] == pytest.approx(c["sent"], rel=1e-9) for c in weights)
    assert weights[1]["sent"] != weights[0]["sent"], "the update changed the policy the engine received"
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
