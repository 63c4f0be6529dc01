"""The compiled BM25 kernel: block-max MaxScore returns exactly the exhaustive top k, in every posting
layout, on any number of threads; encoded postings round-trip; damaged indexes are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.bm25.blocks import RAW, SCORE, TF
from searchr1.retrieval.bm25.errors import DamagedIndex
from searchr1.retrieval.bm25.files import POSTINGS_FILE
from searchr1.retrieval.bm25.postings import BLOCK, Postings, encode_postings
from searchr1.retrieval.bm25.retriever import _best
from searchr1.retrieval.bm25.store import DocStore
from searchr1.retrieval.corpus import Document, write_corpus
from searchr1.retrieval.index import build_index, load_index
from searchr1.retrieval.manifest import IndexLoadError


def _docs(n: int, seed: int, vocab: int) -> list[Document]:
    """Zipf-distributed words: a few terms in most passages (long columns, many blocks), many rare ones."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = rng.zipf(1.25, int(rng.integers(1, 40))) % vocab
        out.append(Document(f"p{i:05d}", f"t{i % 5}x", " ".join(f"w{w}x" for w in words)))
    return out


def _queries(docs: list[Document], n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = docs[int(rng.integers(len(docs)))].text.split()
        picked = [words[int(j)] for j in rng.integers(0, len(words), int(rng.integers(1, 8)))]
        out.append(" ".join(picked + picked[: int(rng.integers(0, 2))]))  # sometimes a term twice
    return out


def _raw(r: BM25Retriever) -> BM25Retriever:
    """The same index with RAW blocks (rows + float32 scores, the layout of earlier versions)."""
    m = r.matrix
    raw = Postings.from_matrix(m.indptr, m.indices, m.data, m.column_max())
    return BM25Retriever(m, r.vocab, r.docs, r.params, raw)


def _exhaustive(r: BM25Retriever, q: str, k: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    full = r.scores(q)
    if full is None:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    holding = np.flatnonzero(full > 0)
    return _best(holding, full[holding], k, ties)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(50, 1500),
    seed=st.integers(0, 2**16),
    vocab=st.sampled_from([30, 300, 3000]),
    preset=st.sampled_from(["pyserini", "bm25s"]),
)
def test_block_skipping_returns_exactly_the_exhaustive_top_k(n, seed, vocab, preset):
    docs = _docs(n, seed, vocab)
    r = BM25Retriever.from_documents(docs, preset=preset)
    assert r.postings.mode == (TF if preset == "pyserini" else SCORE)
    raw = _raw(r)
    for q in _queries(docs, 25, seed + 1):
        for k in (1, 2, 3, 5, 10, 50):
            for ties in (False, True):
                want_rows, want_scores = _exhaustive(r, q, k, ties)
                for kernel in (r, raw):
                    rows, scores = kernel.top(q, k, ties)
                    assert np.array_equal(rows, want_rows) and np.array_equal(scores, want_scores), (
                        q,
                        k,
                        ties,
                    )


def test_long_columns_are_skipped_block_by_block_and_still_exact():
    """A corpus where one common term spans hundreds of blocks: the top 3 of a rare + common query
    must come from the kernel's block skipping, identical to scoring every passage."""
    rng = np.random.default_rng(7)
    docs = [
        Document(str(i), "", "common " * int(rng.integers(1, 4)) + f"r{i % 97}x q{i % 13}x")
        for i in range(40_000)
    ]
    docs[123] = Document("123", "", "common solo q3x")  # a term of one passage beside common ones
    r = BM25Retriever.from_documents(docs)
    assert int(r.postings.bptr[-1]) > 300
    # the last two: "solo" and "common" essential, "solo" exhausted at its one passage, "common" left alone
    for q in (
        "common r5x",
        "r5x q3x common",
        "common common q7x",
        "q1x",
        "q3x common common solo",
        "solo common",
    ):
        for k in (1, 3, 10):
            assert all(
                np.array_equal(a, b)
                for a, b in zip(r.top(q, k, True), _exhaustive(r, q, k, True), strict=True)
            )


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    df=st.lists(st.integers(0, 3 * BLOCK + 5), min_size=1, max_size=6),
    gap=st.integers(1, 2**20),
    with_tf=st.booleans(),
)
def test_encoded_postings_round_trip(df, gap, with_tf):
    rng = np.random.default_rng(sum(df) + gap)
    indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
    rows = np.concatenate([np.cumsum(rng.integers(1, gap + 1, d)) - 1 for d in df]).astype(np.int64)
    tf = rng.integers(1, 65536, len(rows)).astype(np.uint16)
    scores = rng.random(len(rows)).astype(np.float32) + np.float32(0.01)
    p = encode_postings(indptr, rows, tf, scores, with_tf)
    assert p.mode == (TF if with_tf else SCORE)
    assert len(p.block_last) == sum((d + BLOCK - 1) // BLOCK for d in df)
    for t, d in enumerate(df):
        got_rows, got_vals = p.column(t)
        s, e = indptr[t], indptr[t + 1]
        assert np.array_equal(got_rows, rows[s:e])
        assert np.array_equal(got_vals, tf[s:e].astype(np.float32) if with_tf else scores[s:e])
        if d:
            firsts = range(s, e, BLOCK)
            bp = p.bptr[t]
            assert [int(x) for x in p.block_last[bp : bp + len(firsts)]] == [
                int(rows[min(f + BLOCK, e) - 1]) for f in firsts
            ]
            assert [float(x) for x in p.block_max[bp : bp + len(firsts)]] == [
                float(scores[f : min(f + BLOCK, e)].max()) for f in firsts
            ]


def test_several_threads_return_the_same_hits_as_one():
    docs = _docs(2000, 3, 500)
    queries = _queries(docs, 300, 4)
    one = BM25Retriever.from_documents(docs)
    many = BM25Retriever(one.matrix, one.vocab, one.docs, one.params, one.postings, threads=3)
    assert many.threads == 3 and one.threads == 1
    for k in (1, 3, 10):
        assert many.search(queries, k) == one.search(queries, k)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        one.set_threads(0)
    many.close()


def test_the_server_searches_on_its_threads_with_the_same_hits(tmp_path):
    from fastapi.testclient import TestClient

    from searchr1.retrieval.server import create_app

    docs = _docs(800, 5, 300)
    queries = _queries(docs, 64, 6)
    one = BM25Retriever.from_documents(docs)
    threaded = BM25Retriever.from_documents(docs)
    threaded.set_threads(4)
    bodies = []
    for r in (one, threaded):
        with TestClient(create_app(r, access_log=False)) as client:
            resp = client.post("/retrieve", json={"queries": queries, "topk": 5, "return_scores": True})
            assert resp.status_code == 200
            bodies.append(resp.json())
    assert bodies[0] == bodies[1] and sum(map(len, bodies[0]["result"])) > 100


@pytest.mark.parametrize("preset", ["pyserini", "bm25s"])
def test_odd_queries_give_the_exhaustive_answer_and_no_error(preset):
    docs = _docs(600, 9, 200)
    r = BM25Retriever.from_documents(docs, preset=preset)
    raw = _raw(r)
    rng = np.random.default_rng(1)
    vocab = sorted({w for d in docs for w in d.text.split()})
    long_query = " ".join(vocab[int(j)] for j in rng.integers(0, len(vocab), 10_000))
    odd = [
        "",
        "   ",
        "the of and",
        "a an the is",
        "zzzunknownzzz",
        "zzzunknownzzz w1x",
        long_query,
        "w1x " * 50,
    ]
    for q in odd:
        for k in (1, 3, 10):
            want = _exhaustive(r, q, k, True)
            for kernel in (r, raw):
                got = kernel.top(q, k, True)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), q[:40]
    results = r.search(odd, 3)
    assert results[:5] == [[], [], [], [], []] and all(results[5:])


def _built(tmp_path, docs=None, **bm25) -> tuple:
    docs = docs or _docs(300, 11, 100)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "idx", bm25=bm25, chunk_passages=64, show_progress=False)
    return docs, tmp_path / "idx"


@pytest.mark.parametrize("preset", ["pyserini", "bm25s"])
def test_a_built_index_searches_as_the_in_memory_one_on_any_threads(tmp_path, preset):
    docs, idx = _built(tmp_path, preset=preset)
    meta = json.loads((idx / "bm25" / "params.index.json").read_text())
    assert meta["format"] == 3 and meta["layout"] == ("tf" if preset == "pyserini" else "score")
    in_memory = BM25Retriever.from_documents(docs, preset=preset)
    queries = _queries(docs, 100, 12)
    for threads in (1, 3):
        loaded = load_index(idx, threads=threads)
        assert all(np.array_equal(a, b) for a, b in zip(loaded.csc(), in_memory.csc(), strict=True))
        assert loaded.search(queries, 5) == in_memory.search(queries, 5)
        loaded.close()


def test_an_index_of_the_earlier_format_still_loads_and_ranks_the_same(tmp_path):
    docs = _docs(300, 13, 100)
    r = BM25Retriever.from_documents(docs)
    DocStore.write(docs, tmp_path / "old")
    r.save(tmp_path / "old")  # rows + float32 scores, no format key: what earlier versions wrote
    assert not (tmp_path / "old" / "bm25" / POSTINGS_FILE).exists()
    old = BM25Retriever.load(tmp_path / "old", DocStore.open(tmp_path / "old"))
    assert old.postings.mode == RAW
    queries = _queries(docs, 100, 14)
    assert old.search(queries, 10) == r.search(queries, 10)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_index_file_is_refused_in_one_line(tmp_path, damage):
    _, idx = _built(tmp_path)
    path = idx / "bm25" / POSTINGS_FILE
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(bytes(raw[: len(raw) - 7]))
    else:
        raw[len(raw) // 2] ^= 0x10
        path.write_bytes(bytes(raw))
    with pytest.raises(IndexLoadError) as err:
        load_index(idx)
    message = str(err.value)
    assert "\n" not in message and POSTINGS_FILE in message and "searchr1 index build" in message
    assert str(idx) in message


def test_an_earlier_format_index_whose_scores_are_truncated_is_refused_in_one_line(tmp_path):
    docs = _docs(200, 15, 80)
    r = BM25Retriever.from_documents(docs)
    DocStore.write(docs, tmp_path / "old")
    r.save(tmp_path / "old")
    data = tmp_path / "old" / "bm25" / "data.csc.index.npy"
    data.write_bytes(data.read_bytes()[:-12])
    with pytest.raises(DamagedIndex) as err:
        BM25Retriever.load(tmp_path / "old", DocStore.open(tmp_path / "old"))
    assert "\n" not in str(err.value) and "searchr1 index build" in str(err.value)


def test_serve_refuses_zero_threads_in_one_line(tmp_path, capsys):
    from searchr1.cli import main

    assert main(["serve", "--corpus", str(tmp_path / "never-read.jsonl"), "--threads", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--threads must be >= 1, got 0" in err[0]


@pytest.mark.parametrize("preset", ["pyserini", "bm25s"])
def test_a_floor_made_of_tied_passages_keeps_them_in_row_order(preset):
    """Twelve identical passages: the k-th best single-term score (the floor the kernel starts from) is
    every one's score, so a passage equal to it must still enter -- the first k rows without ties,
    all twelve with them -- and not be skipped as a later row losing a tie."""
    docs = [Document(str(i), "", "alpha beta") for i in range(12)]
    docs += [Document(str(12 + i), "", f"gamma w{i}x") for i in range(30)]
    r = BM25Retriever.from_documents(docs, preset=preset)
    for q in ("alpha", "alpha beta", "beta gamma"):
        for k in (1, 3, 5):
            rows, _ = r.top(q, k, False)
            assert rows.tolist() == list(range(k)), (q, k)
            rows, _ = r.top(q, k, True)
            assert rows.tolist() == list(range(12)), (q, k)
            assert np.array_equal(rows, _exhaustive(r, q, k, True)[0])


def test_the_prefetch_intrinsic_compiles_and_leaves_the_data_alone():
    """``prefetch`` is an LLVM intrinsic numba must lower on this platform (the kernel calls it on every
    decoded block): a loop that prefetches every element, and one past the end, reads the same values."""
    from numba import njit

    from searchr1.retrieval.bm25.prefetch import prefetch

    @njit
    def prefetched_sum(values, rows):
        total = 0
        for r in rows:
            prefetch(values, r)
        prefetch(values, len(values) + 4096)  # past the end: a hint, never a fault
        for r in rows:
            total += values[r]
        return total

    values = np.arange(1000, dtype=np.uint8)
    rows = np.random.default_rng(0).integers(0, 1000, 300)
    assert prefetched_sum(values, rows) == int(values[rows].astype(np.int64).sum())
    assert np.array_equal(values, np.arange(1000, dtype=np.uint8))
