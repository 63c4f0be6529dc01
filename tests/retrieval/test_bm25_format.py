"""The BM25 index format: bit packing at every width, blocks of every size in both layouts, damaged
blocks refused, and an index of the previous (varint) format refused in one line with the command
that rebuilds it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from searchr1.retrieval.bm25.bitpack import BLOCK, MAX_WIDTH, pack, unpack, width
from searchr1.retrieval.bm25.blocks import SCORE, TF
from searchr1.retrieval.bm25.files import PARAMS_FILE
from searchr1.retrieval.bm25.postings import encode_postings
from searchr1.retrieval.corpus import Document, write_corpus
from searchr1.retrieval.index import build_index, load_index
from searchr1.retrieval.manifest import IndexLoadError


@pytest.mark.parametrize("w", range(MAX_WIDTH + 1))
def test_bit_packing_round_trips_at_every_width(w):
    rng = np.random.default_rng(w)
    top = (1 << w) - 1
    values = rng.integers(0, top + 1, BLOCK, dtype=np.uint64)
    values[[0, 77, BLOCK - 1]] = top  # the widest value, at a lane's start, middle and end
    base = 0 if w == MAX_WIDTH else int(rng.integers(0, (1 << 32) - top))  # base + value fits 32 bits
    assert width(top) == w and (w == 0 or width(top >> 1) == w - 1)
    out = np.full(4 * w + 6, 0xA5A5A5A5, np.uint32)  # garbage around: packing must not read or keep it
    assert pack(values, w, out, 3) == 3 + 4 * w
    assert (out[:3] == 0xA5A5A5A5).all() and (out[3 + 4 * w :] == 0xA5A5A5A5).all()
    got = np.zeros(BLOCK, np.uint32)
    unpack(out, 3, w, base, got)
    assert np.array_equal(got.astype(np.int64), values.astype(np.int64) + base)


def _column(rng: np.random.Generator, df: int, max_gap: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.cumsum(rng.integers(1, max_gap + 1, df)) - 1
    tf = rng.integers(1, 4, df)
    tf[rng.random(df) < 0.05] = 65535  # a frequency at the cap now and then: a wide block
    return rows, tf


@pytest.mark.parametrize("layout", [TF, SCORE])
def test_columns_of_every_block_size_round_trip(layout):
    """Full blocks (bit-packed), a block of one posting and other short last blocks (varints), gaps
    from 1 to 2^30, equal frequencies (no bits at all) and frequencies at the cap."""
    rng = np.random.default_rng(3)
    dfs = [1, 2, 127, 128, 129, 255, 256, 257, 3 * BLOCK, 1, 5 * BLOCK + 1]
    gaps = [1, 2**30, 3, 1, 50, 1, 2**20, 7, 1, 1, 2**12]
    cols = [_column(rng, df, g) for df, g in zip(dfs, gaps, strict=True)]
    cols[3] = (4 + np.arange(BLOCK) * 5, np.full(BLOCK, 2))  # gaps all 5 (the first from -1), tf all 2: widths 0 and 0
    indptr = np.concatenate([[0], np.cumsum(dfs)]).astype(np.int64)
    rows = np.concatenate([c[0] for c in cols])
    tf = np.concatenate([c[1] for c in cols]).astype(np.uint16)
    scores = rng.random(len(rows)).astype(np.float32) + np.float32(0.5)
    p = encode_postings(indptr, rows, tf, scores, layout == TF)
    assert p.mode == layout and p.stream.dtype == np.uint32
    for t in range(len(dfs)):
        got_rows, got_vals = p.column(t)
        s, e = indptr[t], indptr[t + 1]
        assert np.array_equal(got_rows, rows[s:e]), t
        want = tf[s:e].astype(np.float32) if layout == TF else scores[s:e]
        assert np.array_equal(got_vals, want), t
    # a full block of equal gaps and frequencies is its two header words alone
    b = int(p.bptr[3])
    assert int(p.offsets[b + 1] - p.offsets[b]) == 2


def test_a_corrupted_block_is_refused_not_decoded_into_other_postings():
    rng = np.random.default_rng(5)
    rows, tf = _column(rng, 3 * BLOCK + 9, 40)
    indptr = np.array([0, len(rows)], np.int64)
    scores = np.ones(len(rows), np.float32)
    p = encode_postings(indptr, rows, tf.astype(np.uint16), scores, True)
    good = p.stream.copy()
    header = int(p.offsets[1])  # block 1's first word
    # its gap width, its tf width, its gap minimum; the tail's last word as unterminated varint bytes
    for at, value in ((header, good[header] ^ 0x3F), (header, good[header] ^ (0x3F << 6)),
                      (header + 1, good[header + 1] ^ 0xFFFF), (len(good) - 1, 0xFFFFFFFF)):  # fmt: skip
        stream = good.copy()
        stream[at] = np.uint32(value)
        p.stream = stream
        with pytest.raises(ValueError, match="cannot be decoded"):
            p.column(0)


def _docs(n: int) -> list[Document]:
    rng = np.random.default_rng(11)
    return [Document(f"p{i}", "", " ".join(f"w{int(w)}x" for w in rng.zipf(1.3, 30) % 200)) for i in range(n)]


def test_an_index_of_the_varint_format_is_refused_in_one_line_naming_the_rebuild(tmp_path):
    corpus = write_corpus(_docs(300), tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "idx", chunk_passages=100, show_progress=False)
    params = tmp_path / "idx" / "bm25" / PARAMS_FILE
    meta = json.loads(params.read_text())
    assert meta["format"] == 3
    params.write_text(json.dumps({**meta, "format": 2}))  # what the previous version wrote
    with pytest.raises(IndexLoadError) as err:
        load_index(tmp_path / "idx")
    message = str(err.value)
    assert "\n" not in message and "format 2" in message
    assert f"searchr1 index build --retriever bm25 --corpus {corpus} --out {tmp_path / 'idx'}" in message
