"""`searchr1 data synth | prepare | merge` end to end through the real command."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from searchr1.cli import main
from searchr1.data.formats import load_samples


def cli(*args) -> int:
    """``searchr1 <args>`` in-process (paths and numbers become strings)."""
    return main([str(a) for a in args])


def test_synth_writes_the_world_and_parquet(tmp_path, capsys):
    out, sizes = tmp_path / "w", ("--entities", 80, "--num-train", 60, "--seed", 3)
    assert cli("data", "synth", "--out", out, *sizes, "--parquet") == 0
    for name in ("corpus.jsonl", "train.jsonl", "val.jsonl", "test.jsonl", "train.parquet", "test.parquet"):
        assert (out / name).is_file(), name
    assert len((out / "train.jsonl").read_text().splitlines()) == 60
    assert "train: 60 questions" in capsys.readouterr().out
    train = load_samples(out / "train.parquet")
    assert len(train) == 60 and {s.data_source for s in train} == {"synth"}
    first = (out / "corpus.jsonl").read_bytes()
    assert cli("data", "synth", "--out", tmp_path / "w2", *sizes) == 0
    assert (tmp_path / "w2" / "corpus.jsonl").read_bytes() == first


def test_synth_rejects_a_bad_hop_mix(tmp_path, capsys):
    assert cli("data", "synth", "--out", tmp_path, "--hop-mix", "single") == 2
    assert "--hop-mix" in capsys.readouterr().err
    assert cli("data", "synth", "--out", tmp_path, "--hop-mix", "trivia=1") == 2
    assert "hop_mix" in capsys.readouterr().err


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prepare_and_merge(tmp_path, capsys):
    nq = _rows(
        tmp_path / "nq.jsonl",
        [{"id": f"n{i}", "question": f"q{i}", "golden_answers": [f"a{i}"]} for i in range(3)],
    )
    hq = _rows(
        tmp_path / "hq.jsonl",
        [{"id": f"h{i}", "question": f"r{i}", "golden_answers": [f"b{i}"]} for i in range(2)],
    )
    nq_out, hq_out, merged_out = (tmp_path / f"{n}.parquet" for n in ("nq", "hq", "m"))
    assert cli("data", "prepare", "--source", "nq", "--input", nq, "--split", "train", "--out", nq_out) == 0
    assert cli("data", "prepare", "--source", "hotpotqa", "--input", hq, "--out", hq_out) == 0
    rows = pq.read_table(nq_out).to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2] and rows[0]["data_source"] == "nq"
    assert cli("data", "merge", nq_out, hq_out, "--out", merged_out) == 0
    merged = pq.read_table(merged_out).to_pylist()
    assert [r["extra_info"]["index"] for r in merged] == [0, 1, 2, 3, 4]
    assert [r["data_source"] for r in merged] == ["nq"] * 3 + ["hotpotqa"] * 2
    assert "indices 0..4" in capsys.readouterr().out


def test_prepare_bad_rows_stop_or_skip_with_a_count(tmp_path, capsys):
    src = _rows(
        tmp_path / "bad.jsonl",
        [
            {"id": "1", "question": "q", "golden_answers": ["a"]},
            {"id": "2", "question": "q2", "golden_answers": []},
        ],
    )
    out = tmp_path / "o.parquet"
    assert cli("data", "prepare", "--input", src, "--out", out) == 2
    err = capsys.readouterr().err
    assert f"{src}:2" in err and "empty golden answers" in err and "--skip-bad" in err
    assert not out.exists()
    assert cli("data", "prepare", "--input", src, "--out", out, "--skip-bad") == 0
    assert "skipped 1 bad row(s) of 2" in capsys.readouterr().err
    assert len(load_samples(out)) == 1


def test_prepare_with_instruct_and_file_templates(tmp_path):
    src = _rows(tmp_path / "d.jsonl", [{"id": "1", "question": "who", "golden_answers": ["a"]}])
    tpl = tmp_path / "t.txt"
    tpl.write_text("Q: {question} A:")
    assert cli("data", "prepare", "--input", src, "--template", tpl, "--out", tmp_path / "o.parquet") == 0
    assert pq.read_table(tmp_path / "o.parquet").to_pylist()[0]["prompt"][0]["content"] == "Q: who? A:"
    assert cli("data", "prepare", "--input", src, "--template", "nope", "--out", tmp_path / "x.parquet") == 2
