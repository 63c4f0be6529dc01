"""``eval`` and ``ask`` run a checkpoint (or an exported policy) with the retrieval and rollout settings
its run was trained with, unless a flag says otherwise; they say which ones they use and where each came
from, and ``eval`` records them all (``searchr1.data.trained_settings``, ``searchr1.cli_common.choose_settings``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from evalworld import write_world
from tinyrun import run_overrides

from searchr1.cli import main
from searchr1.config import load_config
from searchr1.data.trained_settings import SETTING_KEYS, find_trained_settings
from searchr1.data.trained_template import TEMPLATE_FILE, find_trained_template

TRAINED = {
    "retrieval.topk": 2,
    "rollout.max_turns": 2,
    "rollout.max_turn_tokens": 5,
    "rollout.max_obs_tokens": 20,
    "rollout.max_response_tokens": 30,
    "rollout.max_context": 400,
    "rollout.last_search_notice": True,
    "rollout.invalid_action_message": False,
    "rollout.eos_ends_trajectory": True,
    "rollout.max_query_chars": 40,
}
"""A run's settings, every one unlike the default."""
DEFAULTS = {
    "retrieval.topk": 3,
    "rollout.max_turns": 4,
    "rollout.max_turn_tokens": 500,
    "rollout.max_obs_tokens": 500,
    "rollout.max_response_tokens": 4096,
    "rollout.max_context": 0,
    "rollout.last_search_notice": False,
    "rollout.invalid_action_message": True,
    "rollout.eos_ends_trajectory": False,
    "rollout.max_query_chars": 512,
}
"""The defaults of the same settings (what eval took for every model before)."""


def test_the_trained_settings_all_differ_from_the_defaults():
    """The tests below can tell a run's value from a default only if they differ."""
    cfg = load_config(None)
    assert set(TRAINED) == set(SETTING_KEYS)
    for key in SETTING_KEYS:
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == DEFAULTS[key] != TRAINED[key]


def run_cli(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def settings_line(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("settings: ")]
    return line


# -- finding them: a run's layout on disk ----------------------------------------------------------------


def write_run_config(path: Path, **values) -> None:
    """A ``config.yaml`` as the trainer writes it: the whole resolved config (``values``: dotted keys)."""
    cfg = load_config(None, [f"{k}={json.dumps(v)}" for k, v in values.items()])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_settings_are_found_where_the_trainer_leaves_them(tmp_path):
    run = tmp_path / "run"
    write_run_config(run / "config.yaml", **TRAINED, **{"data.template": "base"})
    step = model_folder(run / "checkpoints" / "step_000004" / "model")
    write_run_config(step.parent / "config.yaml", **TRAINED)
    best = model_folder(run / "checkpoints" / "best" / "model")  # best/ has no config.yaml: the run's
    warm = model_folder(run / "warmstart" / "model")
    (warm.parent / "warmstart.json").write_text('{"done": true}')

    found = find_trained_settings(step)
    assert found is not None and found.values == TRAINED and found.source == step.parent / "config.yaml"
    for folder in (best, warm):
        found = find_trained_settings(folder)
        assert found is not None and found.values == TRAINED and found.source == run / "config.yaml"
    template = find_trained_template(warm)  # the warm start's template is found the same way
    assert template is not None and template.template == "base" and template.source == run / "config.yaml"


def test_a_folder_no_run_wrote_has_none(tmp_path, tiny_model_dir):
    assert find_trained_settings(tiny_model_dir) is None
    assert find_trained_settings("smollm2-135m-instruct") is None
    assert find_trained_settings(tmp_path / "missing") is None
    other = model_folder(tmp_path / "x" / "model")
    (other.parent / "config.yaml").write_text("not: a run config\n")  # a config.yaml of something else
    assert find_trained_settings(other) is None
    # a folder named warmstart without the warm start's summary is not a warm start of this run
    write_run_config(tmp_path / "y" / "config.yaml", **TRAINED)
    assert find_trained_settings(model_folder(tmp_path / "y" / "warmstart" / "model")) is None


def test_an_export_record_carries_them_and_an_older_one_points_at_its_run(tmp_path):
    run = tmp_path / "run"
    write_run_config(run / "config.yaml", **TRAINED)
    export = model_folder(tmp_path / "export")
    record = {"template": "base", "trained_template": "base", "run": str(run), "settings": TRAINED}
    (export / TEMPLATE_FILE).write_text(json.dumps(record))
    found = find_trained_settings(export)
    assert found is not None and found.values == TRAINED and found.source == export / TEMPLATE_FILE

    del record["settings"]  # written before settings were recorded: the run's config, while it is there
    (export / TEMPLATE_FILE).write_text(json.dumps(record))
    found = find_trained_settings(export)
    assert found is not None and found.values == TRAINED and found.source == run / "config.yaml"
    (run / "config.yaml").unlink()
    assert find_trained_settings(export) is None


# -- through the commands: a real run trained with settings that are not the defaults ------------------


@pytest.fixture(scope="module")
def settings_run(tiny_model_dir, tmp_path_factory):
    """A 1-step `searchr1 train` run of the tiny model with ``TRAINED``; and its world."""
    folder = tmp_path_factory.mktemp("trained-settings")
    world = write_world(folder / "world")
    out = folder / "run"
    extra = {key.replace(".", "__"): value for key, value in TRAINED.items()}
    argv = run_overrides(
        tiny_model_dir, out, [world["synth"]], [world["nq"]], world["corpus"], trainer__total_steps=1, **extra
    )
    assert main(["train", *argv]) == 0
    return out, world


def eval_argv(model, world, out, *flags):
    return ["eval", "--model", model, "--data", world["nq"], "--corpus", world["corpus"], "--limit", "2",
            "--out", out, *flags]  # fmt: skip


def recorded(out: Path) -> dict:
    """The settings ``eval`` recorded: its results.json and the mode's summary.json agree."""
    results = json.loads((out / "results.json").read_text())["settings"]
    assert json.loads((out / "agent" / "summary.json").read_text())["settings"] == results
    return results


def trajectories(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "agent" / "trajectories.jsonl").read_text().splitlines()]


def test_eval_of_a_checkpoint_runs_with_its_training_settings(settings_run, tmp_path, capsys):
    run, world = settings_run
    model = run / "checkpoints" / "step_000001" / "model"
    code, _, err = run_cli(eval_argv(model, world, tmp_path / "ev"), capsys)
    assert code == 0
    line = settings_line(err)
    for key, value in TRAINED.items():
        assert f"{key}={json.dumps(value)} (run)" in line
    assert line.endswith(f"run = {model.parent / 'config.yaml'} (a flag or --set KEY=VALUE overrides)")
    settings = recorded(tmp_path / "ev")
    assert {key: settings[key] for key in SETTING_KEYS} == TRAINED
    assert settings["settings_from"] == dict.fromkeys(SETTING_KEYS, "run")
    assert settings["run_config"] == str(model.parent / "config.yaml")
    for record in trajectories(tmp_path / "ev"):  # generated within the run's budgets, not the defaults'
        assert record["turns"] <= TRAINED["rollout.max_turns"] + 1
        assert record["num_tokens"]["generated"] <= (TRAINED["rollout.max_turns"] + 1) * 5
        assert record["num_tokens"]["response"] <= TRAINED["rollout.max_response_tokens"]
        assert all(len(docs) <= TRAINED["retrieval.topk"] for docs in record["documents"])


def test_a_flag_overrides_a_trained_setting(settings_run, tmp_path, capsys):
    run, world = settings_run
    model = run / "checkpoints" / "step_000001" / "model"
    flags = [
        "--max-turns",
        "1",
        "--topk",
        "1",
        "--no-last-search-notice",
        "--set",
        "rollout.max_obs_tokens=16",
    ]
    code, _, err = run_cli(eval_argv(model, world, tmp_path / "ev", *flags), capsys)
    assert code == 0
    line = settings_line(err)
    assert "rollout.max_turns=1 (--max-turns)" in line and "retrieval.topk=1 (--topk)" in line
    assert "rollout.last_search_notice=false (--last-search-notice)" in line
    assert "rollout.max_obs_tokens=16 (--set)" in line and "rollout.max_turn_tokens=5 (run)" in line
    settings = recorded(tmp_path / "ev")
    given = {"rollout.max_turns": 1, "retrieval.topk": 1, "rollout.last_search_notice": False,
             "rollout.max_obs_tokens": 16}  # fmt: skip
    assert {key: settings[key] for key in SETTING_KEYS} == {**TRAINED, **given}
    assert settings["settings_from"]["rollout.max_turns"] == "--max-turns"
    assert settings["settings_from"]["rollout.max_obs_tokens"] == "--set"
    assert settings["settings_from"]["rollout.max_response_tokens"] == "run"
    assert all(record["turns"] <= 2 for record in trajectories(tmp_path / "ev"))


def test_a_config_file_overrides_a_trained_setting(settings_run, tmp_path, capsys):
    run, world = settings_run
    model = run / "checkpoints" / "step_000001" / "model"
    config = tmp_path / "eval.yaml"
    config.write_text("rollout:\n  max_turn_tokens: 4\n")
    code, _, err = run_cli(eval_argv(model, world, tmp_path / "ev", "--config", config), capsys)
    assert code == 0 and "rollout.max_turn_tokens=4 (--config)" in settings_line(err)
    assert recorded(tmp_path / "ev")["rollout.max_turn_tokens"] == 4


def test_an_exported_policy_carries_its_settings(settings_run, tmp_path, capsys):
    run, world = settings_run
    code, stdout, _ = run_cli(["train", "--export", run, tmp_path / "export"], capsys)
    assert code == 0 and f"{len(SETTING_KEYS)} retrieval and rollout settings carried" in stdout
    info = json.loads((tmp_path / "export" / TEMPLATE_FILE).read_text())
    assert info["settings"] == TRAINED
    code, _, err = run_cli(eval_argv(tmp_path / "export", world, tmp_path / "ev"), capsys)
    assert code == 0
    assert settings_line(err).endswith(
        f"run = {tmp_path / 'export' / TEMPLATE_FILE} (a flag or --set KEY=VALUE overrides)"
    )
    settings = recorded(tmp_path / "ev")
    assert {key: settings[key] for key in SETTING_KEYS} == TRAINED


def test_a_model_without_a_run_config_falls_back_to_the_defaults(
    tiny_model_dir, world_files, tmp_path, capsys
):
    flags = ["--max-turns", "1", "--max-turn-tokens", "6"]  # the defaults' 4 turns of 500 tokens are slow
    code, _, err = run_cli(eval_argv(tiny_model_dir, world_files, tmp_path / "ev", *flags), capsys)
    assert code == 0
    line = settings_line(err)
    assert line.startswith(f"settings: {tiny_model_dir} has no run config") and "the defaults" in line
    assert "retrieval.topk=3 (default)" in line and "rollout.max_turns=1 (--max-turns)" in line
    settings = recorded(tmp_path / "ev")
    expected = {**DEFAULTS, "rollout.max_turns": 1, "rollout.max_turn_tokens": 6}
    assert {key: settings[key] for key in SETTING_KEYS} == expected
    assert settings["run_config"] is None
    assert settings["settings_from"]["rollout.max_obs_tokens"] == "default"


def test_ask_uses_the_training_settings_too(settings_run, capsys):
    run, world = settings_run
    model = run / "checkpoints" / "step_000001" / "model"
    argv = ["ask", "Where was Ivo Marsk born?", "--model", model, "--corpus", world["corpus"], "--json"]
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0
    line = settings_line(err)
    assert "rollout.max_turns=2 (run)" in line and "rollout.max_turn_tokens=5 (run)" in line
    answer = json.loads(stdout)  # generated within the run's budgets: 3 turns of 5 tokens at most
    assert answer["turns"] <= TRAINED["rollout.max_turns"] + 1
    assert sum(s["tokens"] for s in answer["segments"] if s["role"] == "generated") <= 3 * 5
    code, _, err = run_cli([*argv, "--max-turn-tokens", "3"], capsys)
    assert code == 0 and "rollout.max_turn_tokens=3 (--max-turn-tokens)" in settings_line(err)
