"""BM25 at its defaults ranks as Search-R1's retriever does (pyserini's LuceneSearcher, Lucene's
English analyzer), checked without Java against a fixture of Lucene's output made by
``scripts/lucene_rankings.py`` (pyserini 1.6.0): its tokens for tricky strings and passage openings,
and its top-3 ids and scores for the shared wiki-18 sample's NQ questions and 301 passage fragments."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from searchr1.retrieval.bm25 import BM25Retriever, lucene_length, lucene_norm
from searchr1.retrieval.bm25.analysis import LuceneEnglishAnalyzer, PorterStemmer
from searchr1.retrieval.bm25.scoring import LUCENE_LENGTHS, boosted_scores, inverse_norms
from searchr1.retrieval.corpus import Document, read_corpus, write_corpus
from searchr1.retrieval.index import build_index, load_index
from tests.must_run import skip_or_fail
from tests.sample_data import sample_file

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "lucene_wiki18.json").read_text(encoding="utf-8"))


def test_the_analyzer_gives_lucenes_tokens():
    analyzer = LuceneEnglishAnalyzer()
    wrong = [(a["text"], a["tokens"], analyzer(a["text"])) for a in FIXTURE["analysis"]
             if analyzer(a["text"]) != a["tokens"]]  # fmt: skip
    assert len(FIXTURE["analysis"]) > 200 and wrong == []


def test_porter_follows_the_reference_implementation_not_the_paper():
    stem = PorterStemmer()
    # the reference's departures: short words kept, bli -> ble, logi -> log
    assert [stem(w) for w in ("s", "as", "is")] == ["s", "as", "is"]
    assert [stem(w) for w in ("possibly", "assembly", "technology", "anthology")] == [
        "possibl", "assembl", "technolog", "antholog"
    ]  # fmt: skip
    assert [stem(w) for w in ("running", "generalizations", "happiness", "relational")] == [
        "run", "gener", "happi", "relat"
    ]  # fmt: skip


def test_document_lengths_are_lucenes_one_byte_norms():
    assert lucene_norm([0, 1, 23, 24, 25, 31, 32]).tolist() == [0, 1, 23, 24, 25, 31, 32]
    n = np.arange(5000)
    lengths = lucene_length(lucene_norm(n))
    assert (lengths <= n).all() and (lengths[24:] - 24 >= 0.875 * (n[24:] - 24)).all()  # 4 significant bits
    assert lucene_length(lucene_norm([60, 61, 63, 64, 100, 101])).tolist() == [60, 60, 60, 64, 96, 96]
    assert int(lucene_norm([2**31 - 1])[0]) == 255 and len(set(lucene_norm(range(10**6)).tolist())) < 256


def test_rankings_and_scores_equal_lucenes_on_the_wiki18_sample():
    corpus = sample_file("wiki18_sample_corpus.jsonl")
    if hashlib.sha256(corpus.read_bytes()).hexdigest() != FIXTURE["corpus_sha256"]:
        skip_or_fail("the shared sample changed: regenerate the fixture with scripts/lucene_rankings.py")
    r = BM25Retriever.from_documents(list(read_corpus(corpus)))
    assert (r.params.k1, r.params.b, r.params.analyzer) == (0.9, 0.4, "lucene-english")
    rankings = FIXTURE["rankings"]
    results = r.search([q["query"] for q in rankings], 3)
    same = sum([h.id for h in hits] == q["ids"] for q, hits in zip(rankings, results, strict=True))
    first = sum([h.id for h in hits][:1] == q["ids"][:1] for q, hits in zip(rankings, results, strict=True))
    assert len(rankings) == 317 and same == first == len(rankings)
    for q, hits in zip(rankings, results, strict=True):  # pyserini reports scores to 4 decimals
        assert [h.score for h in hits] == pytest.approx(q["scores"], abs=2e-6), q["query"]




TIES = Path(__file__).parent / "fixtures"


def _ties_fixture() -> tuple[dict, list[Document]]:
    fixture = json.loads((TIES / "lucene_ties.json").read_text(encoding="utf-8"))
    corpus = TIES / "lucene_ties_corpus.jsonl"
    assert hashlib.sha256(corpus.read_bytes()).hexdigest() == fixture["corpus_sha256"]
    return fixture, list(read_corpus(corpus))


def test_ties_repeated_terms_and_passages_without_terms_rank_as_in_lucene(tmp_path):
    """The fixture was made for what the wiki-18 one lacks: tied scores inside the top hits (by id as
    text, ids sharing their first 8 characters among them), query terms repeated 2-3 times, and
    passages of stop words only (in neither N nor avgdl)."""
    fixture, docs = _ties_fixture()
    rankings, k = fixture["rankings"], fixture["k"]
    # Anserini lowers the j-th of hits whose scores round alike by j x 1e-6: those are its ties
    tied = [q for q in rankings if any(0 < a - b < 5e-6 for a, b in zip(q["scores"][:3], q["scores"][1:4], strict=False))]
    repeated = [q for q in rankings if len(set(q["query"].split())) < len(q["query"].split())]
    assert len(tied) >= 10 and len(repeated) >= 8 and k == 10
    in_memory = BM25Retriever.from_documents(docs)
    write_corpus(docs, tmp_path / "c.jsonl")
    build_index(tmp_path / "c.jsonl", tmp_path / "idx", chunk_passages=64, show_progress=False)
    for r in (in_memory, load_index(tmp_path / "idx")):
        results = r.search([q["query"] for q in rankings], k)
        for q, hits in zip(rankings, results, strict=True):
            assert [h.id for h in hits] == q["ids"], q["query"]
            assert [h.score for h in hits] == pytest.approx(q["scores"], abs=2e-6), q["query"]


def test_odd_queries_give_lucenes_answers_without_error(tmp_path):
    """Lucene's analyzer drops stop words and a term absent from the index matches nothing, so a query
    of stop words only, an empty one and an absent term find no passage, and a fixture query padded to
    10,000 tokens with stop words, or with absent terms around it, finds exactly Lucene's hits with
    Lucene's scores -- in memory and from a built index."""
    fixture, docs = _ties_fixture()
    rankings, k = fixture["rankings"], fixture["k"]
    write_corpus(docs, tmp_path / "c.jsonl")
    build_index(tmp_path / "c.jsonl", tmp_path / "idx", chunk_passages=64, show_progress=False)
    stop = ["the", "of", "and", "a", "to", "in", "is", "with"]
    for r in (BM25Retriever.from_documents(docs), load_index(tmp_path / "idx")):
        assert r.search(["", "   ", "the of and is", "zzqqabsentx", "zzqqabsentx the"], k) == [[], [], [], [], []]
        for q in rankings:
            words = q["query"].split()
            long = " ".join(words + [stop[i % len(stop)] for i in range(10_000 - len(words))])
            absent = f"zzqqabsentx {q['query']} qqzzmissingx"
            assert len(long.split()) == 10_000
            for hits in r.search([long, absent], k):
                assert [h.id for h in hits] == q["ids"], q["query"]
                assert [h.score for h in hits] == pytest.approx(q["scores"], abs=2e-6), q["query"]


def test_the_controls_fail_where_parity_would():
    """Each setting the parity rests on, changed alone, breaks the agreement with Lucene: the
    fixtures can tell a divergence (a control that passed whatever the rankings were would not)."""
    corpus = sample_file("wiki18_sample_corpus.jsonl")
    if hashlib.sha256(corpus.read_bytes()).hexdigest() != FIXTURE["corpus_sha256"]:
        skip_or_fail("the shared sample changed: regenerate the fixture with scripts/lucene_rankings.py")
    wiki = list(read_corpus(corpus))
    fixture, ties = _ties_fixture()

    def identical(docs, rankings, k, scores=True, **settings) -> int:
        """Queries whose top-k ids (and scores, to pyserini's 4 decimals) equal Lucene's."""
        results = BM25Retriever.from_documents(docs, **settings).search([q["query"] for q in rankings], k)
        return sum([h.id for h in hits] == q["ids"][:k] and (not scores or np.allclose([h.score for h in hits], q["scores"][:k], atol=2e-6))
                   for q, hits in zip(rankings, results, strict=True))  # fmt: skip

    n_wiki, n_ties = len(FIXTURE["rankings"]), len(fixture["rankings"])
    assert identical(wiki, FIXTURE["rankings"], 3) == n_wiki
    assert identical(wiki, FIXTURE["rankings"], 3, False, preset="bm25s") == 185  # 0.885 overlap, as documented
    assert identical(wiki, FIXTURE["rankings"], 3, False, k1=1.2) < n_wiki
    assert identical(ties, fixture["rankings"], 10) == n_ties
    for changed in ({"tie_break": "row"}, {"doc_length": "exact"}, {"doc_count": "all"}):
        assert identical(ties, fixture["rankings"], 10, **changed) < n_ties, changed


def test_a_repeated_query_term_is_one_clause_boosted_by_its_count_as_anserini_builds_it():
    """Anserini's bag-of-words query gives a term repeated c times one clause of boost c: Lucene's
    BM25Scorer then scores ``w - w / (1 + tf inv)`` with ``w = float32(c idf)``, which is not c times
    the single-term score in float32. The index stores the single-term score; the boosted one is
    recomputed from it (the term frequency recovered) and each passage's norm."""
    f32 = np.float32
    inv = inverse_norms(0.9, 0.4, 57.3)
    codes = np.flatnonzero(LUCENE_LENGTHS <= 10_000)  # passages of up to 10,000 tokens (wiki-18's: ~100)
    norms = np.repeat(codes, 40)
    tf = np.tile(np.arange(1, 41), len(codes)).astype(f32)
    idf32 = f32(3.7171)
    stored = idf32 - idf32 / (f32(1) + tf * inv[norms])
    for count in (2, 3, 7):
        w = f32(f32(count) * idf32)
        lucene = w - w / (f32(1) + tf * inv[norms])
        assert np.array_equal(boosted_scores(stored, idf32, inv[norms], count), lucene)
        # the plain product: exact for a power of two, rounded apart otherwise
        assert np.any((stored * f32(count)) != lucene) == (count != 2)


def _anserini_scores_numpy(scores: np.ndarray) -> list[float]:
    """The score adjuster as first written, array at a time in numpy: the reference for the plain-Python one."""
    f32 = np.float32
    rounded = (np.floor(scores.astype(np.float64) * 10000 + 0.5) / 10000).astype(f32)
    near = np.abs(rounded[1:] - rounded[:-1]) < f32(1e-4)
    run = np.zeros(len(scores), dtype=np.int64)
    for i in range(1, len(scores)):
        run[i] = run[i - 1] + 1 if near[i - 1] else 0
    return np.round(np.round(rounded.astype(np.float64), 4) - 1e-6 * run, 6).tolist()


def test_the_plain_python_score_adjuster_equals_numpys_bit_for_bit():
    """Hits' scores in rank order, many near one another (runs lowered by j x 1e-6), some equal, some a
    rounding step apart: every reported score is numpy's float for float."""
    from searchr1.retrieval.bm25.retriever import anserini_scores

    rng = np.random.default_rng(56)
    for _ in range(20_000):
        k = int(rng.integers(1, 12))
        spread = float(rng.choice([1e-5, 1e-4, 3e-4, 1e-2, 1.0]))
        scores = (rng.uniform(0, 30) - np.abs(rng.normal(0, spread, k))).astype(np.float32)
        if k > 1 and rng.random() < 0.3:
            scores[1:] = np.where(rng.random(k - 1) < 0.5, scores[:-1], scores[1:])
        scores = np.sort(scores)[::-1]
        assert anserini_scores(scores.tolist()) == _anserini_scores_numpy(scores), scores.tolist()
    assert anserini_scores([0.49300003, 0.49290001, 0.4929]) == [0.493, 0.492899, 0.492898]
