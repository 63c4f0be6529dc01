"""``searchr1 demo`` through the command line on the tiny model: summary.json and the console, the shipped
ablations (no guidance, outcome only), the collapse guard's warning carried into summary.json, ``--only``,
and bad settings that leave nothing built and name the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchr1.cli import main
from searchr1.demo import settings as demo_settings

TINY = [
    "--seeds", "3", "--num-test", "4", "--template", "base", "--no-zero-shot", "--nq-sample", "",
    "--hotpotqa-sample", "", "--threads", "1", "trainer.batch_size=2", "trainer.mini_batch_size=2", "rollout.n=3",
    "rollout.max_turn_tokens=16", "trainer.progress_bar=false", "warmstart.epochs=0.5",
]  # fmt: skip
"""A demo of one seed, 4 test questions, a warm start of half a pass (10 steps, checked at 0, 5 and 10), 2 RL
steps of 2 x 3 trajectories (add --model; groups of 3: the recipe's guidance takes two places of a failed
group)."""


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_the_demo_command_writes_summary_json_with_both_ablations(tmp_path, tiny_model_dir, capsys, one_thread):
    """The shipped ablations run: ``no_guidance`` is the recipe without guidance, ``outcome_only`` the recipe
    with Search-R1's reward alone; each run's config differs from the recipe's in exactly those keys (the
    values written out here, not read from the constants that set them)."""
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--model", str(tiny_model_dir), "--steps", "2", *TINY]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    row = summary["seeds"]["3"]
    assert list(row["runs"]) == ["search", "no_search", "rl_only", "no_guidance", "outcome_only"]
    for mode, run in row["runs"].items():
        assert run["steps"] == 2 and len(run["reward_curve"]) == 2, mode
        assert json.loads((out / "seed_3" / mode / "row.json").read_text()) == run, mode  # written as it landed
        phases = run["phase_seconds"]  # where the run's minutes went, each phase once, in the order they ran
        assert list(phases)[:3] == ["setup", "eval_before", "probe_before"] and "rl" in phases, mode
        assert list(phases)[-3:] == ["eval_after", "probe_after", "real_after"], mode
        assert min(phases.values()) >= 0 and 0 < sum(phases.values()) <= run["seconds"], mode
        for when in ("before", "after"):  # the numbers are those of the evaluation files
            recs = records(out / "seed_3" / mode / f"eval_{when}" / "trajectories.jsonl")
            assert len(recs) == 4
            assert run[when]["em"] == pytest.approx(sum(r["scores"]["em"] for r in recs) / 4), (mode, when)
            assert run[when]["searches"] == pytest.approx(sum(r["searches"] for r in recs) / 4), (mode, when)
    for key in ("em_before", "em_after", "searches_before", "searches_after"):  # the keys users rely on
        metric, when = key.split("_")
        assert row[key] == row["runs"]["search"][when][metric]
        assert row["no_search"][key] == row["runs"]["no_search"][when][metric]
        for ablation in ("no_guidance", "outcome_only"):
            assert row[f"{ablation}_{key}"] == row["runs"][ablation][when][metric]
            assert summary["mean"][f"{ablation}_{key}"] == row[f"{ablation}_{key}"]  # one seed
    # the same starting model, world and greedy decoding: every run starts from the same numbers
    assert row["em_before"] == row["outcome_only_em_before"] == row["no_guidance_em_before"]

    def config(mode: str) -> dict[str, Any]:
        return flat(yaml.safe_load((out / "seed_3" / mode / "config.yaml").read_text()))

    recipe, no_guidance, outcome_only = config("search"), config("no_guidance"), config("outcome_only")
    rl_only = config("rl_only")  # RL alone: the recipe without its warm start
    differ = {k for k in recipe.keys() | rl_only.keys() if recipe.get(k) != rl_only.get(k)}
    assert rl_only["warmstart.epochs"] == 0 and differ <= {"trainer.out_dir", "warmstart.epochs", "model.path"}
    if "model.path" in differ:  # the recipe's RL starts from its warm start's policy, RL alone from the model
        assert recipe["model.path"] == str(out / "seed_3" / "search" / "warmstart" / "model")
        assert rl_only["model.path"] == str(tiny_model_dir)
    assert recipe["guidance.off_policy"] >= 1 and recipe["replay.enabled"] and recipe["reward.step_gain"] > 0
    # with a warm start each run's RL starts from its own (model.path: <run>/warmstart/model)
    warm = recipe["model.path"] == str(out / "seed_3" / "search" / "warmstart" / "model")
    own = {"trainer.out_dir", "model.path"} if warm else {"trainer.out_dir"}
    for mode, cfg in (("no_guidance", no_guidance), ("outcome_only", outcome_only)):
        assert cfg["model.path"] == (str(out / "seed_3" / mode / "warmstart" / "model") if "model.path" in own
                                     else recipe["model.path"])  # fmt: skip
    differ = {k for k in recipe.keys() | no_guidance.keys() if recipe.get(k) != no_guidance.get(k)}
    assert differ == {*own, "guidance.off_policy", "guidance.branched"}
    assert (no_guidance["guidance.off_policy"], no_guidance["guidance.branched"]) == (0, 0)
    differ = {k for k in recipe.keys() | outcome_only.keys() if recipe.get(k) != outcome_only.get(k)}
    assert differ == {
        *own, "reward.components.gold_coverage", "reward.step_gain", "reward.step_redundancy",
        "replay.enabled", "guidance.off_policy", "guidance.branched",
    }  # fmt: skip
    assert outcome_only["reward.components.search_r1"] == 1.0 and "reward.components.gold_coverage" not in outcome_only
    assert (outcome_only["reward.step_gain"], outcome_only["reward.step_redundancy"]) == (0.0, 0.0)
    assert outcome_only["replay.enabled"] is False
    assert (outcome_only["guidance.off_policy"], outcome_only["guidance.branched"]) == (0, 0)

    table = printed.splitlines()
    assert any(line.split()[:2] == ["3", "search"] for line in table)
    assert any(line.split()[:3] == ["3", "search", "disabled"] for line in table)
    assert any(line.split()[:3] == ["3", "no", "guidance"] for line in table)
    assert any(line.split()[:2] == ["3", "outcome-only"] for line in table)
    assert any(line.startswith("outcome-only ablation:  EM") for line in table)
    assert any(line.startswith("no-guidance ablation:   EM") for line in table)
    assert f"summary: {out / 'summary.json'}" in printed


def test_the_collapse_guard_reaches_summary_json_and_the_console(
    tmp_path, tiny_model_dir, capsys, one_thread
):
    """The ``stops_searching`` engine (tests/collapse_engine.py) searches in steps 1-2 only: the guard of
    the demo's run warns at step 4, and the demo keeps and prints it."""
    import collapse_engine

    out = tmp_path / "demo"
    step = collapse_engine.ALERT_STEP
    argv = ["demo", "--out", str(out), "--model", str(tiny_model_dir), "--steps", str(step), "--only", "search",
            *TINY, "plugins=[collapse_engine]", "rollout.engine=stops_searching"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    run = json.loads((out / "summary.json").read_text())["seeds"]["3"]["runs"]["search"]
    assert list(json.loads((out / "summary.json").read_text())["seeds"]["3"]["runs"]) == ["search"]
    assert [(a["step"], a["pattern"]) for a in run["health"]] == [(step, "searching_stopped")]
    metrics = [
        m for m in records(out / "seed_3" / "search" / "metrics.jsonl") if m["step"] > 0
    ]  # 0: validation
    assert [m["health/searching_stopped"] for m in metrics] == [0.0] * (step - 1) + [1.0]
    assert f"collapse guard, seed 3 (search): {run['health'][0]['message']}" in printed


def test_only_picks_the_runs_of_a_seed():
    import argparse

    from searchr1.demo.cli import add_arguments, settings_from_args
    from searchr1.demo.runs import plan_runs

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def modes(*argv: str) -> list[tuple[int, str]]:
        settings = settings_from_args(parser.parse_args(list(argv)))
        return [(r.seed, r.mode) for r in plan_runs(settings, Path("out"), Path("out/prompt.json"))]

    assert modes("--seeds", "0", "1") == [  # the default prompt is the zero-shot one: no second zero-shot run
        (0, "search"), (0, "no_search"), (0, "rl_only"), (0, "no_guidance"), (0, "outcome_only"),
        (1, "search"), (1, "no_search"), (1, "rl_only"), (1, "no_guidance"), (1, "outcome_only"),
    ]  # fmt: skip
    assert modes("--seeds", "0", "1", "--template", "instruct_2hop") == [
        (0, "search"), (0, "no_search"), (0, "rl_only"), (0, "no_guidance"), (0, "outcome_only"), (0, "zero_shot"),
        (1, "search"), (1, "no_search"), (1, "rl_only"), (1, "no_guidance"), (1, "outcome_only"),
    ]  # fmt: skip
    assert modes("--seeds", "0", "1", "--no-ablation", "--no-zero-shot") == [
        (0, "search"), (0, "no_search"), (1, "search"), (1, "no_search")
    ]  # fmt: skip
    assert modes("--only", "no_search") == [(0, "no_search"), (1, "no_search"), (2, "no_search")]
    assert modes("--quick") == [(0, "search")]
    assert modes("--quick", "--only", "search", "zero_shot", "--template", "instruct_2hop") == [
        (0, "search"), (0, "zero_shot")
    ]  # fmt: skip
    assert modes("--only", "no_guidance", "--seeds", "7") == [(7, "no_guidance")]
    assert modes("--only", "rl_only", "--seeds", "7") == [(7, "rl_only")]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--algorithm", "nope"], "--algorithm"),
        (["rollout.nope=1"], "rollout.nope"),
        (["trainer.batch_size=0"], "trainer.batch_size"),
        (["--template", "nope"], "--template"),
        (["--num-test", "0"], "--num-test"),
        (["--jobs", "0"], "--jobs"),
        (["--nq-sample", "/no/such/folder"], "--nq-sample"),
        (["--hotpotqa-sample", "/no/such/folder"], "--hotpotqa-sample"),
        (["--hotpotqa-questions", "-1"], "--hotpotqa-questions"),
        (["--model", "/no/such/model"], "--model"),
    ],
)
def test_bad_settings_leave_nothing_built_and_name_the_key(tmp_path, argv, named, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err
    assert not out.exists()


def test_bad_ablation_overrides_are_named_before_anything_is_built(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_settings, "OUTCOME_ONLY_OVERRIDES", ("reward.step_nope=0",))
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "outcome_only_overrides" in err and "reward.step_nope" in err
    assert not out.exists()
    assert main(["demo", "--out", str(out), "--no-ablation", "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err  # without the ablation its overrides are not used: the next problem shows
    assert "outcome_only_overrides" not in err and "--model" in err and not out.exists()
