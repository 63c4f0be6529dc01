"""BM25: ranking, options, in-memory vs saved/memory-mapped index agree."""

from __future__ import annotations

import math

import pytest

from searchr1.retrieval.bm25 import BM25Params, BM25Retriever
from searchr1.retrieval.bm25.analysis import RegexAnalyzer
from searchr1.retrieval.bm25.store import DocStore
from searchr1.retrieval.corpus import Document


def test_finds_each_document_by_its_name(bm25, docs):
    queries = [f"where is {d.title}" for d in docs[:50]]
    results = bm25.search(queries, topk=3)
    assert [r[0].id for r in results] == [d.id for d in docs[:50]]
    for hits in results:
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert len(hits) <= 3


def test_lucene_score_matches_the_formula():
    docs = [
        Document("0", "", "apple banana"),
        Document("1", "", "apple apple cherry"),
        Document("2", "", "date"),
    ]
    r = BM25Retriever.from_documents(docs, stemmer="none", stopwords="none", k1=1.2, b=0.75, tie_break="row")
    hits = r.search(["cherry"], topk=3)[0]
    n, df, tf, dl, avgdl = 3, 1, 1, 3, (2 + 3 + 1) / 3
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    expected = idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))
    assert [h.id for h in hits] == ["1"]
    assert hits[0].score == pytest.approx(expected, rel=1e-5)


def test_no_matching_terms_gives_no_hits(bm25):
    assert bm25.search(["the of and", "zzzzqqq", ""], topk=3) == [[], [], []]
    assert bm25.search([], topk=3) == []


def test_topk_larger_than_corpus():
    r = BM25Retriever.from_documents([Document("0", "A", "alpha beta"), Document("1", "", "alpha")])
    assert [h.id for h in r.search(["alpha"], topk=50)[0]] == ["1", "0"]


def test_stemming_and_stopwords_options():
    docs = [Document("0", "", "running dogs"), Document("1", "", "the cat")]
    stemmed = BM25Retriever.from_documents(docs)
    assert [h.id for h in stemmed.search(["run dog"], 2)[0]] == ["0"]
    plain = BM25Retriever.from_documents(docs, stemmer="none")
    assert plain.search(["run dog"], 2) == [[]]
    with_stop = BM25Retriever.from_documents(docs, stopwords="none")
    assert [h.id for h in with_stop.search(["the"], 2)[0]] == ["1"]
    assert stemmed.analyzer("The Runners are RUNNING, the runner's") == ["runner", "run", "runner"]
    assert RegexAnalyzer("english", "en")("The Runners are RUNNING") == ["runner", "run"]
    former = BM25Retriever.from_documents(docs, preset="bm25s")
    assert (former.params.k1, former.params.b, former.params.analyzer) == (1.5, 0.75, "regex")
    with pytest.raises(ValueError, match="unknown stemmer"):
        RegexAnalyzer("klingon")
    with pytest.raises(ValueError, match="unknown BM25 preset"):
        BM25Params.from_preset("lucy")


def test_save_and_memory_mapped_load_agree(tmp_path, bm25, docs):
    bm25.save(tmp_path)
    DocStore.write(docs, tmp_path)
    loaded = BM25Retriever.load(tmp_path, DocStore.open(tmp_path), mmap=True)
    queries = [d.title for d in docs[::7]] + ["river castle", "founded 1850"]
    assert loaded.search(queries, 5) == bm25.search(queries, 5)
    assert loaded.params == BM25Params()
    loaded.close()


def test_empty_corpus_is_an_error():
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever.from_documents([])
