"""``searchr1 demo --data hotpotqa`` (``searchr1.demo.hotpotqa``) on a HotpotQA-format fixture written here and
the tiny model: the split keeps every test question and id out of training and validation, the corpus holds
each distinct paragraph once, a corpus without a gold paragraph is named in one line, and the command runs
every row end to end and writes every row's keys (summary.json, the table, --write-results)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchr1.cli import main
from searchr1.data.hotpotqa import missing_gold_line, paragraphs, read_raw
from searchr1.demo import hotpotqa_cli
from searchr1.demo.hotpotqa import ROWS, recipe
from searchr1.demo.hotpotqa_data import load_demo_data, question_key
from searchr1.demo.hotpotqa_report import ROW_KEYS

SHARED = ("Common Hall", ["Common Hall is a meeting house.", " It holds a library."])
"""A distractor paragraph in the context of every question (the corpus must hold it once)."""


def question(split: str, i: int) -> dict[str, Any]:
    """One HotpotQA row about invented names: bridge questions on even ``i``, comparison on odd."""
    org, person, city = f"Velm Press {split}{i}", f"Ada Quorn {split}{i}", f"Tarvik {split}{i}"
    other = f"Bo Lindqvist {split}{i}"
    if i % 2 == 0:
        facts = [org, person]
        ask, answer = f"Where was the founder of {org} born?", city
    else:
        facts = [person, other]
        ask, answer = f"Who was born first, {person} or {other}?", person
    context = [
        [org, [f"{org} is a publisher.", f" It was founded by {person}."]],
        [person, [f"{person} was a poet.", f" {person} was born in {city} in 1901."]],
        [other, [f"{other} was born in 1950 in Oslo."]],
        list(SHARED),
        [f"Noise {split}{i}", ["An unrelated paragraph about rivers."]],
    ]
    return {
        "id": f"{split}-{i}", "question": ask, "answer": answer, "type": "bridge" if i % 2 == 0 else "comparison",
        "level": "hard", "supporting_facts": {"title": facts, "sent_id": [0, 1]},
        "context": {"title": [t for t, _ in context], "sentences": [s for _, s in context]},
    }  # fmt: skip


def write_sample(folder: Path, per_split: int = 5) -> Path:
    """A sample folder: ``per_split`` questions in each of train, dev and test."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        rows = [question(split, i) for i in range(per_split)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def rewrite(path: Path, change: Any) -> None:
    rows = read_raw(path)
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_split_keeps_every_test_question_and_id_out_of_training_and_validation(tmp_path):
    sample = write_sample(tmp_path / "sample")
    test = read_raw(sample / "test.jsonl")

    def leak_id(rows: list[dict]) -> None:  # a dev row with a test row's id
        rows[0]["id"] = test[3]["id"]

    def leak_question(
        rows: list[dict],
    ) -> None:  # a training row asking a test question, spaced and cased apart
        rows[2]["question"] = "  " + test[4]["question"].upper().replace(" ", "  ")

    rewrite(sample / "dev.jsonl", leak_id)
    rewrite(sample / "train.jsonl", leak_question)
    data = load_demo_data(sample, val_questions=2, test_questions=3)
    test_ids = {r["id"] for r in test}  # every test row, evaluated or not
    test_questions = {question_key(r["question"]) for r in test}
    for part in (data.train, data.val):
        assert not test_ids & {r["id"] for r in part}
        assert not test_questions & {question_key(r["question"]) for r in part}
    assert data.dropped == {"dev": 1, "train": 1, "train_as_val": 0}
    assert [r["id"] for r in data.test] == ["test-0", "test-1", "test-2"]
    assert sorted(r["metadata"]["type"] for r in data.val) == ["bridge", "comparison"]  # one of each
    assert not {r["id"] for r in data.val} & {r["id"] for r in data.train}
    assert [r["id"] for r in data.train] == [  # train.jsonl, then the rest of dev
        "train-0", "train-1", "train-3", "train-4", "dev-3", "dev-4"
    ]  # fmt: skip
    assert data.counts()["train"] == 6 and data.counts()["by_type"]["val"] == {"bridge": 1, "comparison": 1}


def test_the_corpus_holds_each_distinct_paragraph_of_the_whole_sample_once(tmp_path):
    sample = write_sample(tmp_path / "sample")
    data = load_demo_data(sample, val_questions=2, test_questions=1)
    contents = [p["contents"] for p in data.corpus]
    assert len(contents) == len(set(contents))
    expected = {
        f'"{title}"\n{text}'
        for split in ("train", "dev", "test")
        for row in read_raw(sample / f"{split}.jsonl")
        for title, text in paragraphs(row)
    }  # every paragraph of all three files, test included, though one test question is evaluated
    assert set(contents) == expected
    assert contents.count(f'"{SHARED[0]}"\n{"".join(SHARED[1])}') == 1
    assert len(data.corpus) == 15 * 4 + 1  # four paragraphs of each question's own, one shared by all
    assert len({p["id"] for p in data.corpus}) == len(data.corpus)


def test_a_corpus_missing_a_gold_paragraph_is_named_in_one_line(tmp_path, tiny_model_dir, capsys, one_thread):
    sample = write_sample(tmp_path / "sample")

    def drop_gold(rows: list[dict]) -> None:  # the second gold paragraph of test-2 appears nowhere
        ctx = rows[2]["context"]
        gone = ctx["title"].index(rows[2]["supporting_facts"]["title"][1])
        del ctx["title"][gone], ctx["sentences"][gone]

    rewrite(sample / "test.jsonl", drop_gold)
    data = load_demo_data(sample, val_questions=2)
    assert data.missing == [("test-2", "Ada Quorn test2")]
    line = missing_gold_line(data.missing, 15)
    assert line is not None and "\n" not in line
    assert (
        "test-2" in line
        and "Ada Quorn test2" in line
        and "1 gold paragraph of 1 of the 15 questions missing" in line
    )
    assert (
        missing_gold_line(load_demo_data(write_sample(tmp_path / "whole"), val_questions=2).missing, 15)
        is None
    )


TINY = [
    "--seeds", "0", "1", "--steps", "1", "--val-questions", "2", "--template", "base", "--threads", "1",
    "trainer.batch_size=2", "trainer.mini_batch_size=2", "rollout.n=3", "rollout.max_turn_tokens=16",
    "rollout.max_obs_tokens=48", "rollout.max_response_tokens=160", "trainer.progress_bar=false",
    "warmstart.batch_size=4", "rollout.max_batch_rows=8",
]  # fmt: skip
"""Two warm_rl seeds, one RL step of 2 x 3 trajectories per run, 2 validation questions (add --model)."""


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_the_command_runs_every_row_and_writes_every_rows_keys(tmp_path, tiny_model_dir, capsys, one_thread):
    sample = write_sample(tmp_path / "sample")
    out, results = tmp_path / "demo", tmp_path / "results" / "hotpotqa_rl.json"
    argv = ["demo", "--data", "hotpotqa", "--hotpotqa-sample", str(sample), "--out", str(out),
            "--model", str(tiny_model_dir), "--write-results", str(results), *TINY]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["rows"]) == list(ROWS)
    test_ids = [r["id"] for r in read_raw(sample / "test.jsonl")]
    folders = {"direct": "direct", "rag": "rag", "agent": "agent", "warm": "warm", "rl": "rl"}
    for name, row in summary["rows"].items():
        assert all(isinstance(row[k], float) for k in ROW_KEYS), name
        assert row["questions"] == 5 and row["minutes"] > 0
        if name in folders:  # the numbers are those of the row's evaluation of the five test questions
            recs = records(out / "eval" / folders[name] / "trajectories.jsonl")
            assert sorted(r["id"] for r in recs) == test_ids
            assert row["em"] == pytest.approx(sum(r["scores"]["em"] for r in recs) / 5)
            bridge = [r["searches"] for r in recs if int(r["id"].split("-")[1]) % 2 == 0]
            assert row["searches_bridge"] == pytest.approx(sum(bridge) / len(bridge))
    assert summary["rows"]["direct"]["searches_bridge"] == 0.0  # no search at all
    assert summary["rows"]["rag"]["searches_comparison"] == 1.0  # one retrieval for the question
    warm_rl, rl = summary["rows"]["warm_rl"], summary["rows"]["rl"]
    assert list(warm_rl["em_by_seed"]) == ["0", "1"] and list(rl["em_by_seed"]) == ["0"]
    for seed in ("0", "1"):
        recs = records(out / "eval" / f"warm_rl_seed_{seed}" / "trajectories.jsonl")
        assert warm_rl["em_by_seed"][seed] == pytest.approx(sum(r["scores"]["em"] for r in recs) / 5)
    assert warm_rl["em"] == pytest.approx(sum(warm_rl["em_by_seed"].values()) / 2) == warm_rl["em_mean"]
    assert warm_rl["em_std"] >= 0.0 and rl["em_std"] == 0.0
    assert summary["data"]["test"] == 5 and summary["data"]["val"] == 2 and summary["data"]["train"] == 8

    # every RL run trains on the training split, from its own starting point, with the user's keys
    def config(run: str) -> dict[str, Any]:
        return yaml.safe_load((out / run / "config.yaml").read_text())

    assert config("rl")["model"]["path"] == str(tiny_model_dir)
    for seed in (0, 1):
        cfg = config(f"warm_rl/seed_{seed}")
        assert cfg["seed"] == seed and cfg["model"]["path"] == str(out / "warm_start" / "model")
        assert cfg["rollout"]["max_turn_tokens"] == 16 and cfg["retrieval"]["topk"] == 2
    assert json.loads((out / "warm_start" / "warmstart.json").read_text())["examples"] == 8
    trained = {r["id"] for r in records(out / "data" / "train.jsonl")}
    assert not trained & set(test_ids)

    printed = captured.out.splitlines()
    for name in ROWS:
        assert any(line.split()[:1] == [name] for line in printed), name
    assert "corpus: every gold paragraph of the questions is in it" in captured.err
    written = json.loads(results.read_text())
    assert list(written["rows"]) == list(ROWS)
    for name, row in written["rows"].items():
        assert set(ROW_KEYS) <= set(row) and row["minutes"] > 0
        assert row["command"].endswith(f"--rows {name}") and "--data hotpotqa" in row["command"]
    assert set(written["rows"]["warm_rl"]["em_by_seed"]) == {"0", "1"}
    assert written["machine"]["cpu"] and written["machine"]["device"] == "cpu"

    # the same command again: every row is kept, nothing runs
    assert main([*argv[: -len(TINY)], "--rows", "direct", *TINY]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert all(f"{name}: done before" in err for name in ROWS)
    assert json.loads((out / "summary.json").read_text())["rows"] == summary["rows"]


def test_jobs_run_the_rows_in_worker_processes_from_one_warm_start(tmp_path, tiny_model_dir, capfd, one_thread):
    sample = write_sample(tmp_path / "sample")
    out = tmp_path / "demo"
    argv = ["demo", "--data", "hotpotqa", "--hotpotqa-sample", str(sample), "--out", str(out),
            "--model", str(tiny_model_dir), "--jobs", "2", *TINY]  # fmt: skip
    assert main(argv) == 0
    err = capfd.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["rows"]) == list(ROWS)
    for name, row in summary["rows"].items():
        assert all(isinstance(row[k], float) for k in ROW_KEYS), name
    # each run in a worker (its log lines prefixed), the warm start once, in this process
    for unit in ("[start] direct: EM", "[rl] rl: EM", "[warm] warm: EM", "[warm_rl seed 0] warm_rl: RL from",
                 "[warm_rl seed 1] warm_rl: RL from"):  # fmt: skip
        assert unit in err, unit
    assert err.count("warm start: 8 gold trajectories") == 1 and "done before" not in err
    warm_rl = summary["rows"]["warm_rl"]
    for seed in ("0", "1"):
        recs = records(out / "eval" / f"warm_rl_seed_{seed}" / "trajectories.jsonl")
        assert warm_rl["em_by_seed"][seed] == pytest.approx(sum(r["scores"]["em"] for r in recs) / 5)
        cfg = yaml.safe_load((out / "warm_rl" / f"seed_{seed}" / "config.yaml").read_text())
        assert cfg["seed"] == int(seed) and cfg["model"]["path"] == str(out / "warm_start" / "model")
    assert summary["settings"]["jobs"] == 2
    # the folder continues with another --jobs: the settings' fingerprint leaves it out
    assert main([*argv[: argv.index("--jobs")], *TINY, "--rows", "rl"]) == 0
    assert "rl: done before" in capfd.readouterr().err
    # the same numbers as one process running the same units one after another (same seeds, one thread)
    serial = tmp_path / "serial"
    assert main([*argv[: argv.index("--out") + 1], str(serial), *argv[argv.index("--out") + 2 : argv.index("--jobs")],
                 *TINY]) == 0  # fmt: skip
    rows = json.loads((serial / "summary.json").read_text())["rows"]
    for name, row in summary["rows"].items():
        numbers = [*ROW_KEYS, "em_bridge", "em_comparison", "em_by_seed"]
        assert {k: row.get(k) for k in numbers} == {k: rows[name].get(k) for k in numbers}, name
    # the rows' numbers are all 0 with the tiny model: what each RL run sampled and logged tells runs apart
    # (the two seeds' trajectories differ), and must match run for run
    def run_log(folder: Path) -> tuple[list, list]:
        sampled = [r["segments"] for r in records(folder / "trajectories.jsonl")]
        steps = [{k: v for k, v in r.items() if k != "time" and not k.startswith("timing/")}
                 for r in records(folder / "metrics.jsonl")]  # fmt: skip
        return sampled, steps

    runs = ["rl", "warm_rl/seed_0", "warm_rl/seed_1"]
    assert run_log(out / runs[1])[0] != run_log(out / runs[2])[0]
    for run in runs:
        assert run_log(out / run) == run_log(serial / run), run


def test_test_questions_of_one_type_print_a_dash_for_the_other(tmp_path, tiny_model_dir, capsys, one_thread):
    sample = write_sample(tmp_path / "sample")  # test question 0 is a bridge question
    argv = ["demo", "--data", "hotpotqa", "--hotpotqa-sample", str(sample), "--out", str(tmp_path / "demo"),
            "--model", str(tiny_model_dir), "--num-test", "1", "--rows", "direct", *TINY]  # fmt: skip
    assert main(argv) == 0
    row = json.loads((tmp_path / "demo" / "rows" / "direct.json").read_text())
    assert row["searches_bridge"] == 0.0 and row["searches_comparison"] is None
    assert "searches bridge 0.00 / comparison -" in capsys.readouterr().err


def parser() -> argparse.ArgumentParser:
    from searchr1.demo.cli import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_quick_and_overrides_reach_the_recipe_and_the_command_runs_them_again():
    settings = hotpotqa_cli.settings_from_args(
        parser().parse_args(["--data", "hotpotqa", "--quick", "trainer.device=cuda"])
    )
    assert (settings.seeds, settings.test_questions, settings.train_questions) == ((0,), 100, 64)
    cfg = recipe(settings, 0, Path("runs/x"), "instruct_2hop", "smollm2-135m-instruct")
    assert cfg.trainer.device == "cuda" and cfg.trainer.total_steps == settings.steps == 2
    assert (cfg.trainer.batch_size, cfg.trainer.val_every, cfg.trainer.keep_best) == (4, 0, "none")
    command = hotpotqa_cli.command_of(settings, Path("runs/x"))
    assert command.startswith("searchr1 demo --data hotpotqa --quick --out runs/x trainer.device=cuda")

    def parsed(command: str) -> Any:
        return hotpotqa_cli.settings_from_args(parser().parse_args(command.split()[2:]))

    assert parsed(command) == settings
    full = parsed("searchr1 demo --data hotpotqa --seeds 4 5 --num-test 7 --steps 5 rollout.n=8")
    assert (full.seeds, full.test_questions, full.steps, full.rows) == ((4, 5), 7, 5, ROWS)
    assert full.overrides == ["rollout.n=8"] and not full.quick
    again = hotpotqa_cli.command_of(full, Path("runs/y"))
    assert parsed(again) == full  # the overrides go before --seeds, which would take them as seeds
    assert parsed(again + " --rows rl").rows == ("rl",)  # each row's command in the results file
    one_thread = hotpotqa_cli.command_of(full, Path("runs/y"), threads=1)  # the exact line that ran
    assert one_thread == again + " --threads 1" and parser().parse_args(one_thread.split()[2:]).threads == 1
    # each data set keeps its own prompt unless --template names one
    assert settings.template == "instruct_2hop" and parsed(command + " --template base").template == "base"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--data", "hotpotqa", "--only", "search"], "--only"),
        (["--data", "hotpotqa", "--no-control"], "--no-control"),
        (["--write-results", "x.json"], "--write-results"),
        (["--rows", "rl"], "--rows"),
        (["--data", "hotpotqa", "--hotpotqa-sample", "/no/such/folder"], "/no/such/folder"),
        (["--data", "hotpotqa", "--val-questions", "0"], "--val-questions"),
        (["--data", "hotpotqa", "rollout.nope=1"], "rollout.nope"),
        (["--data", "hotpotqa", "--model", "/no/such/model"], "--model"),
        (["--data", "hotpotqa", "warmstart.epochs=0", "--rows", "warm"], "warmstart.epochs=0"),
    ],
)
def test_bad_flags_are_one_line_and_leave_nothing_built(tmp_path, argv, named, capsys):
    out = tmp_path / "demo"
    sample = write_sample(tmp_path / "sample")
    extra = [] if "--hotpotqa-sample" in argv else ["--hotpotqa-sample", str(sample)]
    assert main(["demo", "--out", str(out), *extra, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
