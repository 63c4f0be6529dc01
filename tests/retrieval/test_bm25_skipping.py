"""Skipping at two levels (blocks and superblocks of blocks) returns exactly the top k that scoring
every passage returns, ties in Lucene's order included; the superblock bounds are what the kernel
skips by; a superblock bound below one of its blocks' is refused, by the loader and by the build."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.bm25 import build as bm25_build
from searchr1.retrieval.bm25.blocks import TF
from searchr1.retrieval.bm25.bounds import SUPER, superblock_bounds, superblock_pointers, superblock_problem
from searchr1.retrieval.bm25.errors import BoundsError, DamagedIndex
from searchr1.retrieval.bm25.files import SUPERBLOCK_MAX_FILE
from searchr1.retrieval.bm25.postings import encode_postings
from searchr1.retrieval.corpus import Document, write_corpus
from searchr1.retrieval.index import build_index, load_index


def _docs(n: int, seed: int, vocab: int, common: int) -> list[Document]:
    """Zipf words plus ``common`` words in 30-60% of the passages each (long columns: many blocks and
    superblocks), passage lengths 1-60, ids whose text order differs from the row order."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = [f"w{w}x" for w in rng.zipf(1.3, int(rng.integers(1, 60))) % vocab]
        words += [f"c{c}x" for c in range(common) if rng.random() < 0.3 + 0.1 * c]
        out.append(Document(f"d{(i * 7919) % n:06d}", "", " ".join(words)))
    return out


def _queries(docs: list[Document], n: int, seed: int, common: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = docs[int(rng.integers(len(docs)))].text.split()
        picked = [words[int(j)] for j in rng.integers(0, len(words), int(rng.integers(1, 5)))]
        picked += [f"c{c}x" for c in rng.choice(common, int(rng.integers(0, common + 1)), replace=False)]
        out.append(" ".join(picked))
    return out


def _with_superblocks(r: BM25Retriever, super_blocks: int, prune: bool = True) -> BM25Retriever:
    m, p = r.matrix, r.postings
    again = encode_postings(m.indptr, m.indices, m.tf, m.data, p.mode == TF, super_blocks)
    out = BM25Retriever(m, r.vocab, r.docs, r.params, again)
    out._prune = prune
    return out


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(300, 3000),
    seed=st.integers(0, 2**16),
    common=st.integers(1, 4),
    super_blocks=st.sampled_from([1, 2, 3, SUPER]),
)
def test_two_level_skipping_returns_exactly_the_unskipped_top_k(n, seed, common, super_blocks):
    docs = _docs(n, seed, 400, common)
    base = BM25Retriever.from_documents(docs)
    skipping = _with_superblocks(base, super_blocks)
    unskipped = _with_superblocks(base, super_blocks, prune=False)
    assert len(skipping.postings.sb_max) < len(skipping.postings.block_max) or super_blocks == 1
    queries = _queries(docs, 30, seed + 1, common)
    for k in (1, 2, 3, 4, 7, 10, 25, 100):
        for q in queries:
            for ties in (False, True):
                got, want = skipping.top(q, k, ties), unskipped.top(q, k, ties)
                assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), (q, k, ties)
        # the hits as Lucene orders them: ties by passage id as text
        assert skipping.search(queries, k) == unskipped.search(queries, k)


def test_the_kernel_skips_by_the_superblock_bounds():
    """Two words in every passage, strong in the first rows and in one block of the second superblock,
    weak elsewhere: once the first rows fill the top 3, the weak blocks are skipped, and the strong
    block is found because its superblock's bound says it may hold better passages. With superblock
    bounds of zero (a bug the check refuses) the kernel skips that whole superblock and misses it: the
    kernel does skip by them."""
    filler = [f"f{j}x" for j in range(8)]
    docs = []
    for i in range(12 * SUPER * 128):
        strong = 6 if i < 3 else 12 if i == 41 * 128 + 5 else 1  # block 41: superblock 1, not its first
        docs.append(Document(f"d{i:06d}", "", " ".join(["ax"] * strong + ["bx"] * strong + filler)))
    r = BM25Retriever.from_documents(docs)
    assert np.diff(r.postings.sptr).tolist() == [12] * 10  # ax, bx and the fillers: 12 superblocks each
    unskipped = _with_superblocks(r, SUPER, prune=False)
    want = unskipped.top("ax bx", 3)
    assert want[0].tolist() == [41 * 128 + 5, 0, 1]
    assert all(np.array_equal(a, b) for a, b in zip(r.top("ax bx", 3), want, strict=True))
    zero = encode_postings(r.matrix.indptr, r.matrix.indices, r.matrix.tf, r.matrix.data, True)
    zero.sb_max = np.zeros_like(zero.sb_max)
    broken = BM25Retriever(r.matrix, r.vocab, r.docs, r.params, zero)
    assert broken.top("ax bx", 3)[0].tolist() == [0, 1, 2]


def test_superblock_bounds_are_the_maxima_of_their_blocks():
    bptr = np.array([0, 0, 1, 5, 70], np.int64)  # columns of 0, 1, 4 and 65 blocks
    rng = np.random.default_rng(0)
    last = np.cumsum(rng.integers(1, 9, 70)).astype(np.int32)
    best = rng.random(70).astype(np.float32)
    sb_last, sb_max = superblock_bounds(bptr, last, best, 32)
    assert superblock_pointers(bptr, 32).tolist() == [0, 0, 1, 2, 5]
    assert sb_last.tolist() == [last[0], last[4], last[36], last[68], last[69]]
    assert sb_max.tolist() == [best[0], best[1:5].max(), best[5:37].max(), best[37:69].max(), best[69]]
    assert superblock_problem(bptr, last, best, sb_last, sb_max, 32) is None


@pytest.mark.parametrize(
    "damage, why",
    [("lower", "is below the largest score of its block"), ("last", "last row is not its last block's"),
     ("short", "superblock bounds for")],
)  # fmt: skip
def test_a_superblock_bound_below_a_blocks_is_refused_in_one_line(damage, why):
    docs = _docs(3000, 2, 200, 2)
    r = BM25Retriever.from_documents(docs)
    p = encode_postings(r.matrix.indptr, r.matrix.indices, r.matrix.tf, r.matrix.data, True, 2)
    p.check(len(docs))
    s = int(np.argmax(p.sb_max))
    if damage == "lower":
        p.sb_max = p.sb_max.copy()
        p.sb_max[s] = np.nextafter(p.sb_max[s], np.float32(0))  # one ulp below the block that holds it
    elif damage == "last":
        p.sb_last = p.sb_last.copy()
        p.sb_last[s] -= 1
    else:
        p.sb_max = p.sb_max[:-1]
    with pytest.raises(DamagedIndex) as err:
        p.check(len(docs))
    assert why in str(err.value) and "\n" not in str(err.value) and "searchr1 index build" in str(err.value)


def test_the_build_refuses_superblock_bounds_below_a_blocks(tmp_path, monkeypatch):
    docs = _docs(4000, 3, 200, 2)
    corpus = write_corpus(docs, tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "good", chunk_passages=1000, show_progress=False)
    meta = json.loads((tmp_path / "good" / "bm25" / "params.index.json").read_text())
    assert meta["superblock"] == SUPER and (tmp_path / "good" / "bm25" / SUPERBLOCK_MAX_FILE).is_file()
    good = load_index(tmp_path / "good")
    assert good.search(["c0x c1x w1x"], 5) == BM25Retriever.from_documents(docs).search(["c0x c1x w1x"], 5)

    real = bm25_build.superblock_bounds

    def too_low(*args):
        sb_last, sb_max = real(*args)
        return sb_last, sb_max * np.float32(0.5)

    monkeypatch.setattr(bm25_build, "superblock_bounds", too_low)
    with pytest.raises(BoundsError) as err:
        build_index(corpus, tmp_path / "bad", chunk_passages=1000, show_progress=False)
    message = str(err.value)
    assert "\n" not in message and "refused its own bounds" in message and "is below the largest score" in message
