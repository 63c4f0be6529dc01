"""`searchr1 eval`, `searchr1 ask`, `searchr1 report` from the command line, and the Agent API."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from searchr1.cli import main

TINY_LIMITS = ["--max-turns", "1", "--max-turn-tokens", "6"]


def run_cli(argv, capsys):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The rows of the printed tables by their first cell (the first row of each name)."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line.split():
            rows.setdefault(line.split()[0], line.split())
    return rows


def test_eval_command_writes_summary_and_table(tiny_model_dir, world_files, tmp_path, capsys):
    out = tmp_path / "ev"
    argv = [
        "eval",
        "--model",
        tiny_model_dir,
        "--data",
        world_files["synth"],
        "--data",
        world_files["nq"],
        "--corpus",
        world_files["corpus"],
        "--mode",
        "agent",
        "--out",
        out,
        "--batch-size",
        "4",
        *TINY_LIMITS,
    ]
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0
    summary = json.loads((out / "agent" / "summary.json").read_text())
    assert set(summary["sources"]) == {"synth", "nq"} and summary["overall"]["n"] == 6
    assert summary["settings"]["model"] == str(tiny_model_dir)
    lines = [x.split() for x in stdout.splitlines()]
    assert ["method", "nq", "synth", "avg"] in lines  # the paper's layout
    assert table_rows(stdout)["Search-R1"][1:3] == [
        f"{summary['sources'][s]['em']:.3f}" for s in ("nq", "synth")
    ]
    head = ["source", "n", "EM", "subEM", "F1", "valid", "tagged", "searches", "turns", "trunc", "failed"]
    assert head in lines
    assert any(row[:2] == ["synth", "3"] for row in lines) and any(row[:2] == ["all", "6"] for row in lines)
    assert len((out / "agent" / "trajectories.jsonl").read_text().splitlines()) == 6
    assert "[eval agent] 6 questions" in err and "[eval agent] 6/6 questions" in err  # progress

    # a second run into the same folder has nothing left to do and reports the same numbers
    code, stdout2, err2 = run_cli([*argv, "--json"], capsys)
    assert code == 0 and json.loads(stdout2)["summaries"]["agent"] == summary
    assert "6 already done, resuming" in err2


def test_eval_every_mode_prints_one_table(tiny_model_dir, world_files, tmp_path, capsys):
    """The fast variant of the real-model test: four modes, one table (rows methods, columns sources)."""
    out = tmp_path / "ev"
    argv = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--data", world_files["synth"],
            "--corpus", world_files["corpus"], "--mode", "agent,rag,direct,cot", "--out", out, *TINY_LIMITS]  # fmt: skip
    code, stdout, _ = run_cli(argv, capsys)
    assert code == 0
    lines = [x.split() for x in stdout.splitlines()]
    header = lines.index(["method", "nq", "synth", "avg"])
    methods = [row[0] for row in lines[header + 2 : header + 6]]
    assert methods == ["Direct", "CoT", "RAG", "Search-R1"]
    results = json.loads((out / "results.json").read_text())
    for label, row in zip(methods, lines[header + 2 : header + 6], strict=True):
        mode = {"Direct": "direct", "CoT": "cot", "RAG": "rag", "Search-R1": "agent"}[label]
        sources = results["summaries"][mode]["sources"]
        nq, synth = sources["nq"]["em"], sources["synth"]["em"]
        assert row[1:] == [f"{nq:.3f}", f"{synth:.3f}", f"{(nq + synth) / 2:.3f}"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["agent", "cot", "direct", "rag"]
    assert (out / "table.md").read_text().count("\n| ") == 5
    # every baseline reply is scored, with or without an answer tag
    for mode in ("direct", "cot", "rag"):
        for line in (out / mode / "trajectories.jsonl").read_text().splitlines():
            assert json.loads(line)["answer"] is not None


def test_eval_direct_needs_no_search_backend_and_agent_does(tiny_model_dir, world_files, tmp_path, capsys):
    base = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--limit", "2", *TINY_LIMITS]
    code, _, _ = run_cli([*base, "--mode", "direct", "--out", tmp_path / "d"], capsys)
    assert code == 0
    assert json.loads((tmp_path / "d" / "direct" / "summary.json").read_text())["overall"]["n"] == 2
    code, _, err = run_cli([*base, "--mode", "direct,rag", "--out", tmp_path / "r"], capsys)
    assert code == 2 and "--mode rag needs a search backend" in err and "--index" in err
    assert not (tmp_path / "r").exists()


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_bad_input_is_one_line_naming_it(tiny_model_dir, world_files, tmp_path, capsys):
    out = tmp_path / "o"
    base = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--out", out]
    code, _, err = run_cli([*base, "--mode", "direct,bogus"], capsys)
    assert code == 2
    assert one_line_error(err) == "error: --mode bogus: unknown mode; expected one of direct, cot, rag, agent"
    bad = tmp_path / "nq_bad.jsonl"
    bad.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": "r?"}\n')
    code, _, err = run_cli(
        ["eval", "--model", tiny_model_dir, "--data", bad, "--mode", "direct", "--out", out], capsys
    )
    assert code == 2 and f"{bad}:2" in one_line_error(err) and "golden_answers" in err
    missing = tmp_path / "no-corpus.jsonl"
    code, _, err = run_cli([*base, "--mode", "rag", "--corpus", missing], capsys)
    assert code == 2 and one_line_error(err) == f"error: --corpus {missing}: file not found"
    assert not out.exists(), "nothing is written before the inputs are checked"


def test_a_partial_eval_folder_is_resumed_not_overwritten(tiny_model_dir, world_files, tmp_path, capsys):
    out = tmp_path / "ev"
    argv = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--data", world_files["synth"],
            "--mode", "direct", "--out", out, "--batch-size", "2", *TINY_LIMITS]  # fmt: skip
    assert run_cli(argv, capsys)[0] == 0
    full = (out / "direct" / "trajectories.jsonl").read_text().splitlines()
    # an interrupted run: two questions on disk, a line half written, no summary
    (out / "direct" / "trajectories.jsonl").write_text("\n".join(full[:2]) + "\n" + full[2][:30])
    (out / "direct" / "summary.json").unlink()
    code, _, err = run_cli(argv, capsys)
    assert code == 0 and "2 already done, resuming" in err
    assert (out / "direct" / "trajectories.jsonl").read_text().splitlines() == full
    code, _, err = run_cli([*argv, "--limit", "1"], capsys)  # another run: refused, nothing lost
    assert code == 2 and "different" in one_line_error(err) and "--no-resume" in err
    assert (out / "direct" / "trajectories.jsonl").read_text().splitlines() == full


def test_failed_searches_warn_once_and_set_the_exit_status(tiny_model_dir, world_files, tmp_path, capsys):
    argv = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--mode", "rag",
            "--search-url", "http://127.0.0.1:9", "--set", "retrieval.retries=0",
            "--set", "rollout.search_retries=0", "--batch-size", "2", *TINY_LIMITS]  # fmt: skip
    code, stdout, err = run_cli([*argv, "--out", tmp_path / "a"], capsys)
    assert code == 3
    warnings = [x for x in err.splitlines() if x.startswith("warning")]
    assert len(warnings) == 1 and "search failing" in warnings[0] and "127.0.0.1:9" in warnings[0]
    assert "3 searches failed" in err and "--tolerate-search-failures" in err
    assert any(x.startswith("method") and x.endswith("failed searches") for x in stdout.splitlines())
    assert table_rows(stdout)["RAG"][-1] == "3"
    summary = json.loads((tmp_path / "a" / "rag" / "summary.json").read_text())
    assert summary["overall"]["search_failures"] == 3
    code, _, _ = run_cli([*argv, "--out", tmp_path / "b", "--tolerate-search-failures"], capsys)
    assert code == 0


def test_compare_puts_two_runs_side_by_side(tiny_model_dir, world_files, tmp_path, capsys):
    base = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--corpus", world_files["corpus"],
            *TINY_LIMITS]  # fmt: skip
    assert run_cli([*base, "--mode", "direct", "--out", tmp_path / "a"], capsys)[0] == 0
    assert run_cli([*base, "--mode", "direct,rag", "--out", tmp_path / "b"], capsys)[0] == 0
    code, stdout, _ = run_cli(["eval", "--compare", tmp_path / "a", tmp_path / "b"], capsys)
    assert code == 0
    lines = [x.split() for x in stdout.splitlines()]
    assert ["method", "run", "nq", "avg"] in lines
    a = json.loads((tmp_path / "a" / "direct" / "summary.json").read_text())["sources"]["nq"]["em"]
    b = json.loads((tmp_path / "b" / "rag" / "summary.json").read_text())["sources"]["nq"]["em"]
    assert ["Direct", "A", f"{a:.3f}", f"{a:.3f}"] in lines and ["B-A", "+0.000", "+0.000"] in lines
    assert ["RAG", "A", "-", "-"] in lines and ["B", f"{b:.3f}", f"{b:.3f}"] in lines
    code, _, err = run_cli(["eval", "--compare", tmp_path / "a", tmp_path / "nope"], capsys)
    assert code == 2 and "nope" in one_line_error(err)


@pytest.mark.parametrize("broken", ["model", "data", "index", "corpus", "model_file"])
def test_missing_inputs_fail_before_any_work_naming_the_path(
    broken, tiny_model_dir, world_files, tmp_path, capsys
):
    missing = tmp_path / "does-not-exist"
    model, data, search = (
        str(tiny_model_dir),
        str(world_files["nq"]),
        ["--corpus", str(world_files["corpus"])],
    )
    if broken == "model":
        model = str(missing)
    elif broken == "model_file":
        model = str(world_files["nq"])  # a file, not a model folder
    elif broken == "data":
        data = str(missing)
    elif broken == "index":
        search = ["--index", str(missing)]
    elif broken == "corpus":
        search = ["--corpus", str(missing)]
    out = tmp_path / "out"
    code, _, err = run_cli(["eval", "--model", model, "--data", data, *search, "--out", out], capsys)
    assert code == 2
    named = model if broken.startswith("model") else str(missing)
    assert named in err and "Traceback" not in err
    assert not out.exists(), "nothing may be written before the inputs are checked"


def test_unreadable_data_file_is_named(tiny_model_dir, world_files, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root reads any file: an unreadable file cannot be made")
    bad = tmp_path / "locked.jsonl"
    bad.write_text(world_files["nq"].read_text())
    bad.chmod(0)
    code, _, err = run_cli(["eval", "--model", tiny_model_dir, "--data", bad, "--mode", "direct"], capsys)
    assert code == 2 and str(bad) in err and "not readable" in err


def test_malformed_data_line_is_named(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": \n')
    code, _, err = run_cli(
        ["eval", "--model", tiny_model_dir, "--data", bad, "--mode", "direct", "--out", tmp_path / "o"],
        capsys,
    )
    assert code == 2 and str(bad) in err and "2" in err and not (tmp_path / "o").exists()


def test_ask_json(tiny_model_dir, world_files, capsys):
    code, stdout, _ = run_cli(
        [
            "ask",
            "Where was Alice Verdan born?",
            "--model",
            tiny_model_dir,
            "--corpus",
            world_files["corpus"],
            "--json",
            *TINY_LIMITS,
        ],
        capsys,
    )
    assert code == 0
    (line,) = stdout.strip().splitlines()
    result = json.loads(line)
    assert result["question"] == "Where was Alice Verdan born?"
    assert set(result) >= {"answer", "searches", "queries", "hits", "segments", "valid_format"}
    assert result["searches"] == len(result["queries"]) == len(result["hits"])
    assert result["segments"][0]["role"] == "prompt" and "Alice Verdan" in result["segments"][0]["text"]


def test_agent_api_shows_searches_and_hits(tiny_model_dir, world_files):
    from evalworld import WORLD
    from test_evaluation_core import ScriptBySample

    from searchr1 import Agent
    from searchr1.models import load_model, load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir)
    question = WORLD[2][3]  # sample index 2 of the script: two searches, then the golden answer
    steer = ScriptBySample(tok, fixed_index=2)
    with Agent(
        model, str(world_files["corpus"]), tokenizer=tok, max_turns=3, max_turn_tokens=32, steer=steer
    ) as agent:
        events = []
        result = agent.ask(question, on_event=events.append)
    assert result.answer == WORLD[2][4] and result.queries == ["Ivo Marsk", "Ivo Marsk"]
    # streamed while generating: text pieces, each search when it returns, then the answer
    kinds = [e.kind for e in events]
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert collapsed == ["text", "search", "text", "search", "text", "answer"]
    assert kinds.count("text") > 3, "reasoning arrives in pieces, not at the end"
    searches = [e for e in events if e.kind == "search"]
    assert [e.text for e in searches] == ["Ivo Marsk", "Ivo Marsk"]
    assert searches[0].hits[0]["title"] == "Ivo Marsk"
    streamed = "".join(e.text for e in events if e.kind == "text")
    generated = [seg["text"] for seg in result.record["segments"] if seg["role"] == "generated"]
    assert streamed == "".join(generated), "every generated token is streamed, closing tags included"
    assert events[-1].text == WORLD[2][4]
    # the same story replayed from the finished trajectory
    replay = [e.kind for e in result.events()]
    assert replay == ["text", "search", "text", "search", "text", "answer"]
    assert result.trajectory.searches == 2


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def test_ask_prompt_loop_under_a_pseudo_terminal(tiny_model_dir, world_files):
    """Without a question `ask` reads questions at a prompt on a terminal and exits on Ctrl-D."""
    leader, follower = pty.openpty()
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "searchr1.cli",
            "ask",
            "--model",
            str(tiny_model_dir),
            "--corpus",
            str(world_files["corpus"]),
            *TINY_LIMITS,
        ],
        stdin=follower,
        stdout=follower,
        stderr=follower,  # the line-editing prompt goes to stderr (as in the Python REPL)
        env=env,
        close_fds=True,
    )
    os.close(follower)
    try:
        seen = _read_until(leader, b"question> ", 120)
        assert b"question> " in seen
        os.write(leader, b"Where was Alice Verdan born?\n")
        seen = _read_until(leader, b"question> ", 120)
        assert b"answer:" in seen
        os.write(leader, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)


def test_report_command_names_a_folder_without_results(tmp_path, capsys):
    code, _, err = run_cli(["report", tmp_path], capsys)
    assert code == 2 and str(tmp_path) in err and "metrics.jsonl" in err
    code, _, err = run_cli(["report", tmp_path / "nope"], capsys)
    assert code == 2 and "not found" in err


def test_report_command_on_an_eval_folder(tiny_model_dir, world_files, tmp_path, capsys):
    out = tmp_path / "ev"
    code, _, _ = run_cli(
        [
            "eval",
            "--model",
            tiny_model_dir,
            "--data",
            world_files["nq"],
            "--mode",
            "direct",
            "--out",
            out,
            *TINY_LIMITS,
        ],
        capsys,
    )
    assert code == 0
    code, stdout, _ = run_cli(["report", out, "--out", tmp_path / "r.html"], capsys)
    assert code == 0 and str(tmp_path / "r.html") in stdout
    page = (tmp_path / "r.html").read_text()
    assert "Where was Ivo Marsk born" not in page  # the nq file only
    assert "In which country is Tarnholm" in page and "mode: direct" in page
    assert "EM per dataset" in page and "<td>Direct</td>" in page
    assert Path(tmp_path / "r.html").stat().st_size > 5000


def test_eval_on_a_merged_parquet_reports_each_source(tiny_model_dir, world_files, tmp_path, capsys):
    """The benchmark sources in one file (Search-R1's merged test parquet): one row per data_source."""
    from searchr1.data.formats import load_samples, merge_samples, write_parquet

    merged = merge_samples([load_samples(world_files["synth"]), load_samples(world_files["nq"])])
    parquet = write_parquet(merged, tmp_path / "test.parquet")
    out = tmp_path / "ev"
    code, stdout, _ = run_cli(
        [
            "eval",
            "--model",
            tiny_model_dir,
            "--data",
            parquet,
            "--mode",
            "direct",
            "--out",
            out,
            "--json",
            *TINY_LIMITS,
        ],
        capsys,
    )
    assert code == 0
    summary = json.loads(stdout)["summaries"]["direct"]
    assert {k: v["n"] for k, v in summary["sources"].items()} == {"synth": 3, "nq": 3}
    records = [json.loads(x) for x in (out / "direct" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["data_source"] for r in records) == ["nq"] * 3 + ["synth"] * 3


def test_the_template_is_the_models_chat_template_by_default_and_is_printed(
    tiny_model_dir, world_files, tmp_path, capsys
):
    argv = ["eval", "--model", tiny_model_dir, "--data", world_files["nq"], "--mode", "direct",
            "--limit", "1", *TINY_LIMITS]  # fmt: skip
    code, stdout, err = run_cli([*argv, "--out", tmp_path / "auto"], capsys)
    assert code == 0 and "template: instruct (auto: the model has a chat template)" in err
    assert "template: instruct" in stdout
    code, _, err = run_cli([*argv, "--out", tmp_path / "base", "--template", "base"], capsys)
    assert code == 0 and "template: base (given)\n" in err
