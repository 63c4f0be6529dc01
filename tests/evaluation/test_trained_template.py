"""``eval`` and ``ask`` prompt a checkpoint (or an exported policy) with the template its run was trained
with, unless ``--template`` says otherwise, and say which one they use and why
(``searchr1.data.trained_template``, ``searchr1.cli_common.choose_template``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from evalworld import write_world
from tinyrun import run_overrides

from searchr1.cli import main
from searchr1.data.trained_template import TEMPLATE_FILE, find_trained_template

TINY_LIMITS = ["--max-turns", "1", "--max-turn-tokens", "6"]


def run_cli(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def template_line(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("template: ")]
    return line


def prompts(folder: Path) -> list[str]:
    """The prompt text of every question an evaluation (the agent mode) wrote."""
    records = [json.loads(x) for x in (folder / "agent" / "trajectories.jsonl").read_text().splitlines()]
    return [r["segments"][0]["text"] for r in records]


# -- finding it: a run's layout on disk ----------------------------------------------------------------


def fake_run(root: Path, template: str, out_dir: str) -> Path:
    """A run folder as the trainer writes it: config.yaml, a step checkpoint and the kept best."""
    run = root / out_dir
    config = yaml.safe_dump({"data": {"template": template}, "trainer": {"out_dir": out_dir}})
    for ckpt in ("step_000002", "best"):
        model = run / "checkpoints" / ckpt / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    (run / "config.yaml").write_text(config)
    (run / "checkpoints" / "step_000002" / "config.yaml").write_text(config)
    return run


def test_a_checkpoint_and_the_kept_best_know_their_template(tmp_path):
    run = fake_run(tmp_path, "instruct_2hop", "runs/a")
    step = find_trained_template(run / "checkpoints" / "step_000002" / "model")
    assert step is not None and step.template == "instruct_2hop" and step.found
    assert step.source == run / "checkpoints" / "step_000002" / "config.yaml"
    best = find_trained_template(run / "checkpoints" / "best" / "model")  # best/ has no config: the run's
    assert best is not None and best.template == "instruct_2hop" and best.source == run / "config.yaml"


def test_a_folder_no_run_wrote_has_none(tmp_path, tiny_model_dir):
    assert find_trained_template(tiny_model_dir) is None
    assert find_trained_template("smollm2-135m-instruct") is None
    (tmp_path / "model").mkdir()
    (tmp_path / "config.yaml").write_text("not: a run config\n")  # a config.yaml of something else
    assert find_trained_template(tmp_path / "model") is None
    auto = fake_run(tmp_path / "x", "auto", "runs/b")
    assert find_trained_template(auto / "checkpoints" / "step_000002" / "model") is None


def test_a_template_file_is_found_from_the_folder_the_run_started_in(tmp_path, monkeypatch):
    """The run was started in ``origin`` with relative paths; eval runs from somewhere else."""
    origin = tmp_path / "origin"
    run = fake_run(origin, "prompts/p.json", "runs/c")
    (origin / "prompts").mkdir()
    (origin / "prompts" / "p.json").write_text(json.dumps([{"role": "user", "content": "Q: {question}"}]))
    monkeypatch.chdir(tmp_path)
    found = find_trained_template(run / "checkpoints" / "best" / "model")
    assert (
        found is not None
        and found.found
        and Path(found.template) == (origin / "prompts" / "p.json").resolve()
    )
    (origin / "prompts" / "p.json").unlink()
    lost = find_trained_template(run / "checkpoints" / "best" / "model")
    assert lost is not None and not lost.found and lost.recorded == "prompts/p.json"


# -- through the commands: a real run trained with a template that is not the default ---------------


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tmp_path_factory):
    """A 1-step `searchr1 train` run of the tiny model (which has a chat template, so `auto` would be
    `instruct`) trained with the `base` template; and its world."""
    folder = tmp_path_factory.mktemp("trained-base")
    world = write_world(folder / "world")
    out = folder / "run"
    argv = run_overrides(
        tiny_model_dir, out, [world["synth"]], [world["nq"]], world["corpus"],
        trainer__total_steps=1, data__template="base",
    )  # fmt: skip
    assert main(["train", *argv]) == 0
    return out, world


def eval_argv(model, world, out):
    return ["eval", "--model", model, "--data", world["nq"], "--corpus", world["corpus"], "--limit", "2",
            "--out", out, *TINY_LIMITS]  # fmt: skip


def test_eval_of_a_checkpoint_uses_its_training_template(base_run, tmp_path, capsys):
    run, world = base_run
    model = run / "checkpoints" / "step_000001" / "model"
    code, stdout, err = run_cli(eval_argv(model, world, tmp_path / "trained"), capsys)
    assert code == 0
    assert template_line(err) == (
        f"template: base (the one this model was trained with, from {model.parent / 'config.yaml'}; "
        "--template overrides)"
    )
    assert "template: base" in stdout
    assert all(p.startswith("Answer the given question.") for p in prompts(tmp_path / "trained"))

    code, _, err = run_cli([*eval_argv(model, world, tmp_path / "given"), "--template", "instruct"], capsys)
    assert code == 0
    assert template_line(err).startswith("template: instruct (given); note: this model was trained with base")
    assert all(
        not p.startswith("Answer the given question.") and "user" in p for p in prompts(tmp_path / "given")
    )

    code, _, err = run_cli([*eval_argv(model, world, tmp_path / "auto"), "--template", "auto"], capsys)
    assert code == 0 and template_line(err).startswith(
        "template: instruct (auto: the model has a chat template)"
    )


def test_an_exported_policy_carries_its_template(base_run, tmp_path, capsys):
    run, world = base_run
    code, stdout, _ = run_cli(["train", "--export", run, tmp_path / "export"], capsys)
    assert code == 0 and "trained with the prompt template base" in stdout
    info = json.loads((tmp_path / "export" / TEMPLATE_FILE).read_text())
    assert info["template"] == "base" and info["run"] == str(run)
    code, _, err = run_cli(eval_argv(tmp_path / "export", world, tmp_path / "ev"), capsys)
    assert code == 0
    assert template_line(err).startswith(
        f"template: base (the one this model was trained with, from {tmp_path / 'export' / TEMPLATE_FILE}"
    )
    assert all(p.startswith("Answer the given question.") for p in prompts(tmp_path / "ev"))


def test_ask_uses_the_training_template_too(base_run, capsys):
    """The prompt ask sends (the first segment of its --json record) is the training template's, and the
    printed line says so; ``--template instruct`` sends another."""
    run, world = base_run
    model = run / "checkpoints" / "step_000001" / "model"
    argv = ["ask", "Where was Ivo Marsk born?", "--model", model, "--corpus", world["corpus"], "--json",
            *TINY_LIMITS]  # fmt: skip
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0 and template_line(err).startswith("template: base (the one this model was trained with")
    sent = json.loads(stdout)["segments"][0]["text"]
    assert sent.startswith("Answer the given question.") and "Where was Ivo Marsk born?" in sent
    code, stdout, err = run_cli([*argv, "--template", "instruct"], capsys)
    assert code == 0 and template_line(err).startswith("template: instruct (given)")
    sent = json.loads(stdout)["segments"][0]["text"]
    assert not sent.startswith("Answer the given question.") and "Where was Ivo Marsk born?" in sent


def test_a_template_file_travels_with_the_export_and_a_lost_one_is_named(tiny_model_dir, tmp_path, capsys):
    world = write_world(tmp_path / "world")
    template = tmp_path / "my_prompt.txt"
    template.write_text("Q: {question}\nA:")
    run = tmp_path / "run"
    argv = run_overrides(
        tiny_model_dir, run, [world["synth"]], [world["nq"]], world["corpus"],
        trainer__total_steps=1, data__template=str(template),
    )  # fmt: skip
    assert main(["train", *argv]) == 0
    assert run_cli(["train", "--export", run, tmp_path / "export"], capsys)[0] == 0
    assert (tmp_path / "export" / "searchr1_template.txt").read_text() == "Q: {question}\nA:"
    template.unlink()  # the export still has its copy; the checkpoint only knew the path
    code, _, err = run_cli(eval_argv(tmp_path / "export", world, tmp_path / "ev"), capsys)
    assert code == 0 and template_line(err).startswith(
        f"template: {tmp_path / 'export' / 'searchr1_template.txt'}"
    )
    assert all(p.startswith("Q: ") for p in prompts(tmp_path / "ev"))
    model = run / "checkpoints" / "step_000001" / "model"
    code, _, err = run_cli(eval_argv(model, world, tmp_path / "ev2"), capsys)
    assert code == 2
    assert f"was trained with the prompt template file {template}" in err and "--template" in err
    assert run_cli([*eval_argv(model, world, tmp_path / "ev3"), "--template", "base"], capsys)[0] == 0
