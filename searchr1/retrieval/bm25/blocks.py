"""The bytes of one block of postings (format 3): bit-packed full blocks, varint tails.

A column's postings (rows ascending, with a term frequency each) are cut into blocks of ``BLOCK``
(128); a posting's *gap* is ``row - previous row`` (>= 1; the first row of a column against -1, the
first of a later block against the last row of the block before). A block occupies
``offsets[b]:offsets[b+1]`` of one stream of uint32 words:

* a full block (128 postings), as Lucene writes its postings (``ForUtil`` / ``PForUtil``): a header of
  two words, then the gaps and (layout TF) the term frequencies, each bit-packed with its own frame of
  reference (``bitpack``: ``x - min(x)`` in ``width(max - min)`` bits, 4 interleaved lanes):

      word 0: gap width (bits 0-5) | tf width << 6 (bits 6-11) | tf minimum << 12 (bits 12-27)
      word 1: gap minimum
      then 4 x gap width words of gaps, 4 x tf width words of term frequencies

* the column's last block when shorter (1-127 postings; most columns have one such block only): each
  posting's gap, then (layout TF) its term frequency, as LEB128 varints (7 bits a byte, the high bit on
  all but the last), zero bytes up to the next word -- what Lucene does with the postings past its
  last full block (``vInt``s), since packing a handful of values in 4 lanes costs more than it saves.

Layout SCORE (methods other than Lucene's) packs the gaps alone and keeps each posting's float32 score
uncompressed beside the stream; layout RAW (indexes of format 1, in memory) has no stream at all:
rows and scores as they are.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from searchr1.retrieval.bm25.bitpack import BLOCK, MAX_WIDTH, pack, packed_words, unpack, width

RAW, TF, SCORE = 0, 1, 2
"""Posting layouts (see the module docstring)."""
HEADER_WORDS = 2
MAX_TF = 65535
"""Term frequencies are stored up to this (the build caps them: uint16)."""


@njit(nogil=True, cache=True)
def _varint_size(v: int) -> int:
    n = 1
    while v >= 128:
        v >>= 7
        n += 1
    return n


@njit(nogil=True, cache=True)
def _put_varint(out: np.ndarray, p: int, v: int) -> int:
    while v >= 128:
        out[p] = (v & 0x7F) | 0x80
        v >>= 7
        p += 1
    out[p] = v
    return p + 1


@njit(nogil=True, cache=True)
def _varint(stream: np.ndarray, p: int, end: int) -> tuple[int, int]:
    """(value, next position) of the LEB128 varint at ``p``; -1 as the value when it overruns ``end``."""
    v, shift = 0, 0
    while True:
        if p >= end or shift > 35:
            return -1, p
        byte = np.int64(stream[p])
        p += 1
        v |= (byte & 0x7F) << shift
        if byte < 128:
            return v, p
        shift += 7


@njit(nogil=True, cache=True)
def block_words(gaps: np.ndarray, tf: np.ndarray, lo: int, n: int, with_tf: bool) -> int:
    """Words the block of postings ``lo : lo + n`` takes (``gaps`` already relative to the row before)."""
    if n == BLOCK:
        g_min, g_max, f_min, f_max = gaps[lo], gaps[lo], tf[lo], tf[lo]
        for q in range(lo, lo + n):
            g_min, g_max = min(g_min, gaps[q]), max(g_max, gaps[q])
            f_min, f_max = min(f_min, tf[q]), max(f_max, tf[q])
        words = HEADER_WORDS + packed_words(width(g_max - g_min))
        if with_tf:
            words += packed_words(width(f_max - f_min))
        return words
    size = 0
    for q in range(lo, lo + n):
        size += _varint_size(gaps[q])
        if with_tf:
            size += _varint_size(tf[q])
    return (size + 3) // 4


@njit(nogil=True, cache=True)
def encode_block(
    gaps: np.ndarray, tf: np.ndarray, lo: int, n: int, with_tf: bool, out: np.ndarray, out_bytes: np.ndarray,
    at: int, scratch: np.ndarray,
) -> int:  # fmt: skip
    """Write the block of postings ``lo : lo + n`` at word ``at`` of ``out`` (``block_words`` words,
    zeroed by the caller; ``out_bytes`` the same memory as uint8); returns the word after it.
    ``scratch``: 128 uint32 of working space."""
    if n == BLOCK:
        g_min, g_max, f_min, f_max = gaps[lo], gaps[lo], tf[lo], tf[lo]
        for q in range(lo, lo + n):
            g_min, g_max = min(g_min, gaps[q]), max(g_max, gaps[q])
            f_min, f_max = min(f_min, tf[q]), max(f_max, tf[q])
        wg = width(g_max - g_min)
        wf = width(f_max - f_min) if with_tf else 0
        out[at] = np.uint32(wg | (wf << 6) | ((f_min if with_tf else 0) << 12))
        out[at + 1] = np.uint32(g_min)
        for j in range(n):
            scratch[j] = gaps[lo + j] - g_min
        at = pack(scratch, wg, out, at + HEADER_WORDS)
        if with_tf:
            for j in range(n):
                scratch[j] = tf[lo + j] - f_min
            at = pack(scratch, wf, out, at)
        return at
    p = 4 * at
    for q in range(lo, lo + n):
        p = _put_varint(out_bytes, p, gaps[q])
        if with_tf:
            p = _put_varint(out_bytes, p, tf[q])
    return (p + 3) // 4


@njit(nogil=True, cache=True, inline="always")
def decode_block(
    mode: int, b: int, first: int, n: int, prev: int, rows: np.ndarray, data: np.ndarray,
    offsets: np.ndarray, words: np.ndarray, stream: np.ndarray, num_docs: int, last: int,
    out_docs: np.ndarray, out_vals: np.ndarray, scratch: np.ndarray,
) -> bool:  # fmt: skip
    """Block ``b`` (``n`` postings from posting ``first``; ``prev`` the column's row before it, -1 for
    none) into ``out_docs[:n]`` and ``out_vals[:n]`` (term frequencies in layout TF, else scores).
    ``words`` is the stream, ``stream`` the same bytes as uint8 (the varint tails); ``scratch``: 128
    uint32. False when its bytes cannot be a block: widths above 32, a size other than its widths
    give, a gap or a term frequency of 0, rows beyond the corpus or not ending at ``last``."""
    if mode == RAW:
        for j in range(n):
            out_docs[j] = rows[first + j]
            out_vals[j] = data[first + j]
        return True
    at, end = offsets[b], offsets[b + 1]
    doc = prev
    if n == BLOCK:
        head = words[at]
        wg, wf, f_min = head & 63, (head >> 6) & 63, head >> 12
        g_min = np.int64(words[at + 1])
        if wg > MAX_WIDTH or wf > MAX_WIDTH or g_min < 1:
            return False
        size = HEADER_WORDS + packed_words(wg)
        if mode == TF:
            size += packed_words(wf)
            if f_min < 1:
                return False
        if at + size != end:
            return False
        unpack(words, at + HEADER_WORDS, wg, 0, scratch)
        for j in range(BLOCK):
            doc += g_min + np.int64(scratch[np.uint64(j)])
            out_docs[j] = doc
        if mode == TF:
            unpack(words, at + HEADER_WORDS + packed_words(wg), wf, f_min, scratch)
            for j in range(BLOCK):
                out_vals[j] = np.float32(scratch[np.uint64(j)])
        else:
            for j in range(BLOCK):
                out_vals[j] = data[first + j]
        return doc == last and doc < num_docs
    p, stop = 4 * at, 4 * end
    for j in range(n):
        gap, p = _varint(stream, p, stop)
        if gap < 1:
            return False
        doc += gap
        out_docs[j] = doc
        if mode == TF:
            tf, p = _varint(stream, p, stop)
            if tf < 1:
                return False
            out_vals[j] = np.float32(tf)
        else:
            out_vals[j] = data[first + j]
    if stop - p > 3:
        return False
    return doc == last and doc < num_docs


@njit(nogil=True, cache=True)
def encode_blocks(
    rows: np.ndarray, tf: np.ndarray, scores: np.ndarray, lengths: np.ndarray, prev: np.ndarray, with_tf: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Encode consecutive segments of postings (segment j: ``lengths[j]`` postings whose rows follow
    ``prev[j]``, -1 for a column's start) into blocks of ``BLOCK``: (words, each block's word count,
    last row, largest score). Every segment but a column's last holds whole blocks."""
    gaps = np.empty(len(rows), np.int64)
    nblocks = 0
    p = 0
    for j in range(len(lengths)):
        before = prev[j]
        for q in range(p, p + lengths[j]):
            gaps[q] = rows[q] - before
            before = rows[q]
        nblocks += (lengths[j] + BLOCK - 1) // BLOCK
        p += lengths[j]
    sizes = np.zeros(nblocks, np.int64)
    last = np.empty(nblocks, np.int32)
    best = np.empty(nblocks, np.float32)
    total, p, b = 0, 0, 0
    for j in range(len(lengths)):
        for lo in range(p, p + lengths[j], BLOCK):
            n = min(BLOCK, p + lengths[j] - lo)
            sizes[b] = block_words(gaps, tf, lo, n, with_tf)
            last[b] = rows[lo + n - 1]
            m = scores[lo]
            for q in range(lo, lo + n):
                m = max(m, scores[q])
            best[b] = m
            total += sizes[b]
            b += 1
        p += lengths[j]
    out = np.zeros(total, np.uint32)
    out_bytes = out.view(np.uint8)
    scratch = np.empty(BLOCK, np.uint32)
    at, p = 0, 0
    for j in range(len(lengths)):
        for lo in range(p, p + lengths[j], BLOCK):
            at = encode_block(gaps, tf, lo, min(BLOCK, p + lengths[j] - lo), with_tf, out, out_bytes, at, scratch)
        p += lengths[j]
    return out, sizes, last, best
