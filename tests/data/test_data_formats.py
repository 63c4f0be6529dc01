"""FlashRAG jsonl, Search-R1 parquet, hub loading (with local files), bad rows, merge."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sample_data import sample_file

from searchr1.data.formats import (
    BENCHMARK_SOURCES,
    DataError,
    LoadStats,
    Sample,
    infer_source,
    load_samples,
    merge_samples,
    read_flashrag_jsonl,
    write_flashrag_jsonl,
    write_parquet,
)
from searchr1.data.prompts import SEARCH_R1_INSTRUCTION

ROWS = [
    {
        "id": "a1",
        "question": "where was alice verdan born",
        "golden_answers": ["Borvik"],
        "metadata": {"type": "single"},
    },
    {"id": "a2", "question": "When was Borvik founded?", "golden_answers": ["1820", "in 1820"]},
    {"id": "a3", "question": "Who wrote X?", "golden_answers": [1901]},
]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def test_read_flashrag_jsonl_and_source_inference(tmp_path):
    samples = load_samples(_jsonl(tmp_path / "hotpotqa_dev.jsonl", ROWS), split="test")
    assert [s.id for s in samples] == ["a1", "a2", "a3"]
    assert {s.data_source for s in samples} == {"hotpotqa"}
    assert [s.group_index for s in samples] == [0, 1, 2]
    assert samples[0].metadata == {"type": "single"} and samples[0].split == "test"
    assert samples[2].golden_answers == ["1901"]
    assert load_samples(tmp_path / "hotpotqa_dev.jsonl", source="mine")[0].data_source == "mine"
    assert infer_source("2wikimultihopqa_train.jsonl") == "2wikimultihopqa"
    assert infer_source("nq-test.jsonl") == "nq" and infer_source("custom.jsonl") == "custom"
    assert len(BENCHMARK_SOURCES) == 7


def test_reads_the_real_flashrag_sample():
    path = sample_file("nq_test_sample.jsonl")
    samples = load_samples(path, split="test")
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    assert len(samples) == len(lines) and samples[0].data_source == "nq"
    assert samples[0].golden_answers == lines[0]["golden_answers"]


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"id": "x", "golden_answers": ["a"]}, "missing 'question'"),
        ({"id": "x", "question": "  ", "golden_answers": ["a"]}, "empty 'question'"),
        ({"id": "x", "question": 3, "golden_answers": ["a"]}, "'question' must be a string"),
        ({"id": "x", "question": "q"}, "missing 'golden_answers'"),
        ({"id": "x", "question": "q", "golden_answers": []}, "empty golden answers"),
        ({"id": "x", "question": "q", "golden_answers": [""]}, "empty golden answers"),
        ({"id": "x", "question": "q", "golden_answers": "a"}, "must be a list"),
        ({"id": "x", "question": "q", "golden_answers": [["a"]]}, "golden answer 0 must be a string"),
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_rows_are_reported_with_their_line(tmp_path, row, problem):
    line = row if isinstance(row, str) else json.dumps(row)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + line + "\n" + json.dumps(ROWS[1]) + "\n")
    with pytest.raises(DataError, match=problem) as err:
        read_flashrag_jsonl(path)
    assert f"{path}:3" in str(err.value)
    stats = LoadStats()
    samples = read_flashrag_jsonl(path, skip_bad=True, stats=stats)
    assert [s.id for s in samples] == ["a1", "a2"]
    assert [s.group_index for s in samples] == [0, 1]
    assert stats.rows == 3 and stats.skipped == 1 and f"{path}:3" in stats.messages[0]


def test_parquet_roundtrip_in_search_r1_form(tmp_path):
    samples = load_samples(_jsonl(tmp_path / "nq_train.jsonl", ROWS))
    out = write_parquet(samples, tmp_path / "nq.parquet")
    table = pq.read_table(out)
    for col in ("data_source", "prompt", "ability", "reward_model", "extra_info"):
        assert col in table.column_names
    row = table.to_pylist()[1]
    assert row["data_source"] == "nq" and row["ability"] == "fact-reasoning"
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": ["1820", "in 1820"]}}
    assert row["extra_info"] == {"split": "train", "index": 1}
    assert row["prompt"] == [
        {"role": "user", "content": SEARCH_R1_INSTRUCTION.format(question="When was Borvik founded?")}
    ]
    back = load_samples(out)
    assert [(s.id, s.question, s.golden_answers, s.group_index, s.data_source) for s in back] == [
        (s.id, s.question, s.golden_answers, s.group_index, s.data_source) for s in samples
    ]
    assert back[0].metadata == {"type": "single"}
    assert back[0].prompt_messages == samples[0].messages()
    # the question is normalised into the prompt as Search-R1 does
    assert back[0].prompt().endswith("Question: where was alice verdan born?\n")


def test_reads_a_reference_style_parquet_without_flashrag_columns(tmp_path):
    import pyarrow as pa

    content = SEARCH_R1_INSTRUCTION.format(question="who founded acme?")
    rows = [
        {
            "data_source": "musique",
            "prompt": [{"role": "user", "content": content}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Ann Lee"]}},
            "extra_info": {"split": "train", "index": 7},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "ref.parquet")
    (s,) = load_samples(tmp_path / "ref.parquet")
    assert (s.question, s.golden_answers, s.group_index, s.data_source) == (
        "who founded acme?",
        ["Ann Lee"],
        7,
        "musique",
    )
    assert s.id == "musique_train_0"


def test_hub_path_goes_through_datasets_load_dataset(tmp_path):
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    _jsonl(folder / "test.jsonl", ROWS[:2])
    samples = load_samples(str(folder), split="test", source="popqa", cache_dir=str(tmp_path / "cache"))
    assert [s.question for s in samples] == [r["question"] for r in ROWS[:2]]
    assert samples[1].golden_answers == ["1820", "in 1820"] and samples[0].data_source == "popqa"
    via_builder = load_samples(
        "json", split="train", data_files=str(folder / "test.jsonl"), cache_dir=str(tmp_path / "cache")
    )
    assert [s.id for s in via_builder] == ["a1", "a2"]
    with pytest.raises(DataError, match="cannot load dataset"):
        load_samples(str(tmp_path / "no_such_dataset_dir"), split="test")
    with pytest.raises(DataError, match="not found"):
        load_samples(tmp_path / "missing.jsonl")


def test_merge_keeps_group_indices_unique_across_sources(tmp_path):
    nq = load_samples(_jsonl(tmp_path / "nq_train.jsonl", ROWS))
    hq = load_samples(_jsonl(tmp_path / "hotpotqa_train.jsonl", ROWS[:2]))
    assert [s.group_index for s in nq] == [0, 1, 2] and [s.group_index for s in hq] == [0, 1]
    merged = merge_samples([nq, hq])
    assert [s.group_index for s in merged] == [0, 1, 2, 3, 4]
    assert len({s.id for s in merged}) == 5
    assert [s.data_source for s in merged] == ["nq"] * 3 + ["hotpotqa"] * 2
    shuffled = merge_samples([nq, hq], shuffle=True, seed=1)
    assert sorted(s.group_index for s in shuffled) == [0, 1, 2, 3, 4]
    assert sorted(s.question for s in shuffled) == sorted(s.question for s in merged)
    assert merge_samples([nq, hq], shuffle=True, seed=1) == shuffled
    # written and read back: still unique
    write_parquet(merged, tmp_path / "m.parquet")
    assert [s.group_index for s in load_samples(tmp_path / "m.parquet")] == [0, 1, 2, 3, 4]


def test_sample_meta_and_jsonl_roundtrip(tmp_path):
    s = Sample(
        "q1", "Where?", ["Borvik"], data_source="synth", group_index=4, split="test", metadata={"hops": ["A"]}
    )
    assert s.meta()["golden_answers"] == ["Borvik"] and s.meta()["group_index"] == 4
    write_flashrag_jsonl([s], tmp_path / "o.jsonl")
    (back,) = load_samples(tmp_path / "o.jsonl", split="test")
    assert (back.id, back.question, back.golden_answers, back.data_source) == (
        "q1",
        "Where?",
        ["Borvik"],
        "synth",
    )
    assert back.metadata["hops"] == ["A"]
