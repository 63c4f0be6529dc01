"""Corpus reading: both line forms, chunking with overlap, malformed lines named or counted."""

from __future__ import annotations

import json

import pytest
from sample_data import sample_file

from searchr1.retrieval.corpus import CorpusError, Document, chunk_document, read_corpus, split_contents


def test_reads_both_forms(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        json.dumps({"id": "a", "contents": '"Alice Verdan"\nborn in Borvik'})
        + "\n"
        + "\n"
        + json.dumps({"id": 7, "title": "Borvik", "text": "a city"})
        + "\n"
    )
    docs = list(read_corpus(path))
    assert docs == [Document("a", "Alice Verdan", "born in Borvik"), Document("7", "Borvik", "a city")]
    assert docs[0].contents == '"Alice Verdan"\nborn in Borvik'


def test_split_contents_without_quotes_or_title():
    assert split_contents("Title\nbody\nmore") == ("Title", "body\nmore")
    assert split_contents("no title line") == ("", "no title line")


def test_real_wiki18_sample_streams():
    docs = list(read_corpus(sample_file("wiki18_sample_corpus.jsonl")))
    assert len(docs) == 1000
    assert docs[0].title == "Evan Morris" and docs[0].text.startswith("Evan Morris Evan L. Morris")


def test_chunking_keeps_title_and_overlaps():
    doc = Document("d", "T", " ".join(f"w{i}" for i in range(10)))
    chunks = chunk_document(doc, chunk_size=4, overlap=1)
    assert [c.id for c in chunks] == ["d#0", "d#1", "d#2"]
    assert [c.text.split() for c in chunks] == [
        ["w0", "w1", "w2", "w3"],
        ["w3", "w4", "w5", "w6"],
        ["w6", "w7", "w8", "w9"],
    ]
    assert all(c.title == "T" for c in chunks)
    # every word is kept
    assert {w for c in chunks for w in c.text.split()} == set(doc.text.split())
    assert chunk_document(Document("s", "T", "short text"), 4) == [Document("s", "T", "short text")]
    with pytest.raises(ValueError, match="overlap"):
        chunk_document(doc, 4, 4)


def test_chunked_corpus_reading(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "x", "title": "X", "text": " ".join(["word"] * 25)}) + "\n")
    docs = list(read_corpus(path, chunk_size=10, overlap=5))
    assert [d.id for d in docs] == ["x#0", "x#1", "x#2", "x#3"]


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"contents": "x"}', "missing field 'id'"),
        ('{"id": "1"}', "needs either 'contents' or 'text'"),
        ('{"id": "1", "contents": 5}', "'contents' must be a string"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, reason):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "1", "contents": '"A"\nb'}) + "\n" + bad + "\n")
    with pytest.raises(CorpusError, match=rf"c\.jsonl:2: .*{reason}"):
        list(read_corpus(path))


def test_skip_bad_lines_counts_them(tmp_path):
    path = tmp_path / "c.jsonl"
    good = [json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i}'}) for i in range(3)]
    path.write_bytes(
        ("\n".join([good[0], "{oops", good[1], '{"id": 1}', good[2]]) + "\n").encode() + b"\xff\xfe\n"
    )
    reader = read_corpus(path, skip_bad_lines=True)
    docs = list(reader)
    assert [d.id for d in docs] == ["0", "1", "2"]
    assert reader.skipped == 3
    assert [line for line, _ in reader.bad_lines] == [2, 4, 6]
    assert "invalid UTF-8" in reader.bad_lines[-1][1]


def test_missing_file():
    with pytest.raises(CorpusError, match="not found"):
        list(read_corpus("/nonexistent/corpus.jsonl"))
