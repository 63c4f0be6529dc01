"""HotpotQA's own row format to FlashRAG rows and a corpus of its context paragraphs (searchr1.data.hotpotqa),
and ``searchr1 data hotpotqa``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from must_run import skip_or_fail
from sample_data import REPO

from searchr1.cli import main
from searchr1.data.formats import load_samples
from searchr1.data.hotpotqa import (
    HotpotQAError,
    flashrag_row,
    hotpotqa_corpus,
    missing_gold,
    missing_gold_line,
    read_hotpotqa,
)
from searchr1.data.supporting import question_kind, supporting_titles
from searchr1.rollout.gold import GoldPath, gold_path

DICT_FORM = {
    "id": "a1", "question": "Where was the founder of Quillon Press born?", "answer": "Borvik", "type": "bridge",
    "level": "hard", "supporting_facts": {"title": ["Quillon Press", "Alice Verdan"], "sent_id": [0, 1]},
    "context": {"title": ["Quillon Press", "Alice Verdan"],
                "sentences": [["Quillon Press was founded by Alice Verdan."], ["Alice Verdan was a poet.", " She was born in Borvik."]]},
}  # fmt: skip
LIST_FORM = {
    "_id": "x", "id": "a2", "question": "Who was born first, A or B?", "answer": "A", "type": "comparison",
    "supporting_facts": [["A", 0], ["B", 0]],
    "context": [["A", ["A was born in 1900."]], ["Quillon Press", ["Quillon Press was founded by Alice Verdan."]]],
}  # fmt: skip


def test_both_forms_of_a_row_become_flashrag_rows_with_their_gold_path():
    a, b = flashrag_row(DICT_FORM), flashrag_row(LIST_FORM)
    assert a == {
        "id": "a1", "question": DICT_FORM["question"], "golden_answers": ["Borvik"],
        "metadata": {"type": "bridge", "level": "hard", "data_source": "hotpotqa",
                     "supporting_facts": {"title": ["Quillon Press", "Alice Verdan"], "sent_id": [0, 1]}},
    }  # fmt: skip
    assert b["metadata"]["supporting_facts"] == {"title": ["A", "B"], "sent_id": [0, 0]}
    assert supporting_titles(a["metadata"]) == ["Quillon Press", "Alice Verdan"]
    assert gold_path(a) == GoldPath(("Quillon Press", "Alice Verdan"), "Borvik")
    assert question_kind(a["metadata"]) == question_kind(b["metadata"]) == "multi-hop"


def test_the_corpus_holds_each_distinct_paragraph_once():
    corpus = hotpotqa_corpus([DICT_FORM, LIST_FORM])
    assert corpus == [
        {"id": "0", "contents": '"Quillon Press"\nQuillon Press was founded by Alice Verdan.'},
        {"id": "1", "contents": '"Alice Verdan"\nAlice Verdan was a poet. She was born in Borvik.'},
        {"id": "2", "contents": '"A"\nA was born in 1900.'},
    ]


def test_gold_paragraphs_the_corpus_lacks_are_named_by_row_and_title():
    rows = [flashrag_row(DICT_FORM), flashrag_row(LIST_FORM)]
    corpus = hotpotqa_corpus([DICT_FORM, LIST_FORM])  # LIST_FORM's context lacks its gold paragraph "B"
    assert missing_gold(rows, corpus) == [("a2", "B")]
    line = missing_gold_line(missing_gold(rows, corpus), len(rows))
    assert line == "corpus: 1 gold paragraph of 1 of the 2 questions missing, so no search can find it (a2: 'B')"
    titled = [{"contents": '" quillon  PRESS "\nx'}, {"contents": '"alice verdan"\ny'}]  # titles compare by title_key
    assert missing_gold([rows[0]], titled) == []
    assert missing_gold_line([], 2) is None
    many = [(f"q{i}", f"T{i}") for i in range(5)]
    assert missing_gold_line(many, 9).endswith("(q0: 'T0'; q1: 'T1'; q2: 'T2' ...)")


def test_a_row_without_its_fields_is_named_by_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(DICT_FORM) + "\n" + json.dumps({"id": "q", "question": "?"}) + "\n")
    with pytest.raises(
        HotpotQAError, match=r"bad\.jsonl: row 2 is not a HotpotQA row \(missing answer, supporting_facts\)"
    ):
        read_hotpotqa(path)
    path.write_text("{not json\n")
    with pytest.raises(HotpotQAError, match=r"bad\.jsonl:1: not JSON"):
        read_hotpotqa(path)


def test_the_data_command_writes_rows_the_loader_reads_and_a_corpus(tmp_path, capsys):
    source = tmp_path / "dev.jsonl"
    source.write_text(json.dumps(DICT_FORM) + "\n" + json.dumps(LIST_FORM) + "\n")
    out = tmp_path / "out"
    assert main(["data", "hotpotqa", str(source), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote dev:" in printed and "(2 questions)" in printed and "(3 passages)" in printed
    samples = load_samples(out / "dev.jsonl")
    assert [s.golden_answers for s in samples] == [["Borvik"], ["A"]]
    assert samples[0].meta()["supporting_titles"] == ["Quillon Press", "Alice Verdan"]
    assert len((out / "corpus.jsonl").read_text().splitlines()) == 3
    assert main(["data", "hotpotqa", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_the_shared_sample_reads_whole():
    """The shared sample (``shared/data/hotpotqa-sample`` in the repository root or a folder above it, as CI
    places ``shared`` beside the checkout): every row read, each with a gold path of two titles or more. A
    developer's checkout without it skips; CI (``CI=true``) fails instead (``must_run``)."""
    folder = next((f / "shared" / "data" / "hotpotqa-sample" for f in (REPO, *REPO.parents)
                   if (f / "shared" / "data" / "hotpotqa-sample" / "test.jsonl").is_file()), None)  # fmt: skip
    if folder is None:
        skip_or_fail("shared HotpotQA sample not present (shared/data/hotpotqa-sample beside the repository)")
    for name, count in (("train", 296), ("dev", 297), ("test", 497)):
        rows = read_hotpotqa(Path(folder) / f"{name}.jsonl")
        assert len(rows) == count
        assert all(len(supporting_titles(r["metadata"])) >= 2 and gold_path(r) is not None for r in rows)
