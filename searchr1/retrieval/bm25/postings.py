"""Postings in blocks of 128 for the compiled kernel (``kernel``): the arrays it reads, built from
an in-memory score matrix (layout RAW) or encoded (layouts TF and SCORE, ``blocks``).

Each column's postings are cut into blocks of ``BLOCK``; block ``b`` of column ``t`` is block
``bptr[t] + j`` (``bptr`` from the document frequencies), with its last row ``block_last[b]`` and its
largest score ``block_max[b]``; the blocks are grouped into superblocks of ``super_blocks`` with their
own last row and bound (``bounds``: ``sptr``, ``sb_last``, ``sb_max``). Encoded blocks are ``offsets[b]:offsets[b+1]`` of one stream of
uint32 words (``stream``), in the format ``blocks`` describes: full blocks bit-packed with a frame
of reference, a column's shorter last block as varints. Layout SCORE keeps the float32 scores
uncompressed beside the stream (methods whose scores need exact lengths).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from searchr1.retrieval.bm25.blocks import BLOCK, RAW, SCORE, TF, decode_block, encode_blocks
from searchr1.retrieval.bm25.bounds import SUPER, superblock_bounds, superblock_pointers, superblock_problem
from searchr1.retrieval.bm25.errors import REBUILD, DamagedIndex

_EMPTY_I32 = np.zeros(0, np.int32)
_EMPTY_F32 = np.zeros(0, np.float32)
_EMPTY_U32 = np.zeros(0, np.uint32)


def frozen(a: np.ndarray, dtype) -> np.ndarray:
    """A read-only, contiguous, plain ndarray view of ``a`` (a memory map too) as ``dtype``: what the
    compiled functions are given, so that one compiled version serves arrays in memory and mapped."""
    view = np.ascontiguousarray(np.asarray(a), dtype=dtype).view()
    view.flags.writeable = False
    return view


def block_pointers(indptr: np.ndarray) -> np.ndarray:
    """Per column, its first block (and the total at the end): ``ceil(df / BLOCK)`` blocks a column."""
    df = np.diff(np.asarray(indptr, dtype=np.int64))
    bptr = np.zeros(len(df) + 1, dtype=np.int64)
    np.cumsum((df + BLOCK - 1) // BLOCK, out=bptr[1:])
    return bptr


def block_firsts(indptr: np.ndarray, bptr: np.ndarray) -> np.ndarray:
    """The posting index of each block's first posting."""
    indptr = np.asarray(indptr, dtype=np.int64)
    column = np.repeat(np.arange(len(bptr) - 1), np.diff(bptr))
    return indptr[column] + (np.arange(int(bptr[-1])) - bptr[column]) * BLOCK


@dataclass
class Postings:
    """What the kernel reads (see the module docstring); unused arrays are empty."""

    mode: int
    indptr: np.ndarray
    bptr: np.ndarray
    block_last: np.ndarray
    block_max: np.ndarray
    col_max: np.ndarray
    rows: np.ndarray = field(default_factory=lambda: _EMPTY_I32)
    data: np.ndarray = field(default_factory=lambda: _EMPTY_F32)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    stream: np.ndarray = field(default_factory=lambda: _EMPTY_U32)
    """uint32 words (``blocks``)."""
    sb_last: np.ndarray | None = None
    sb_max: np.ndarray | None = None
    """The superblocks' last rows and bounds (``bounds``); None: computed here from the blocks'."""
    super_blocks: int = SUPER

    def __post_init__(self) -> None:
        if self.sb_last is None or self.sb_max is None:
            self.sb_last, self.sb_max = superblock_bounds(self.bptr, self.block_last, self.block_max, self.super_blocks)

    @property
    def sptr(self) -> np.ndarray:
        """Each column's first superblock (and the count)."""
        return superblock_pointers(self.bptr, self.super_blocks)

    @classmethod
    def from_matrix(
        cls, indptr: np.ndarray, rows: np.ndarray, data: np.ndarray, col_max: np.ndarray, super_blocks: int = SUPER
    ) -> Postings:
        """RAW blocks over a score matrix (rows + float32 scores), their bounds computed here: one pass
        over the scores (what loading an index of an earlier version costs)."""
        indptr = np.asarray(indptr, dtype=np.int64)
        bptr = block_pointers(indptr)
        firsts = block_firsts(indptr, bptr)
        rows, data = np.asarray(rows), np.asarray(data)
        if len(firsts):
            lasts = np.append(firsts[1:], int(indptr[-1])) - 1
            block_last = np.asarray(rows[lasts], dtype=np.int32)
            block_max = np.maximum.reduceat(data, firsts).astype(np.float32)
        else:
            block_last, block_max = _EMPTY_I32, _EMPTY_F32
        return cls(RAW, indptr, bptr, block_last, block_max, np.asarray(col_max, np.float32), rows, data,
                   super_blocks=super_blocks)

    def check(self, num_docs: int) -> None:
        """Refuse (one line) arrays that do not fit together, before the kernel reads them unchecked."""
        nb = len(self.block_last)
        problems = [
            (len(self.bptr) != len(self.indptr), "block pointers and column pointers differ in length"),
            (not np.array_equal(self.bptr, block_pointers(self.indptr)), "block pointers do not fit the columns"),
            (len(self.block_max) != nb or len(self.offsets) != nb + 1, "block tables differ in length"),
            (nb and (self.offsets[0] != 0 or self.offsets[-1] != len(self.stream)), "block offsets miss the stream"),
            (nb and bool(np.any(np.diff(self.offsets) <= 0)), "block offsets do not ascend"),
            (nb and int(np.max(self.block_last)) >= num_docs, "a block ends beyond the corpus"),
            (self.mode == SCORE and len(self.data) != int(self.indptr[-1]), "scores and postings differ in count"),
        ]  # fmt: skip
        for bad, why in problems:
            if bad:
                raise DamagedIndex(f"BM25 index is damaged: {why}; {REBUILD}")
        problem = superblock_problem(self.bptr, self.block_last, self.block_max, self.sb_last, self.sb_max,
                                     self.super_blocks)  # fmt: skip
        if problem is not None:
            raise DamagedIndex(f"BM25 index is damaged: {problem}; {REBUILD}")

    def column(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Column ``t``'s rows and stored values (float32 scores, or term frequencies in layout TF)."""
        s, e = int(self.indptr[t]), int(self.indptr[t + 1])
        if self.mode == RAW:
            return self.rows[s:e], self.data[s:e]
        words = frozen(self.stream, np.uint32)
        rows, vals, ok = decode_column(
            self.mode, t, frozen(self.indptr, np.int64), frozen(self.bptr, np.int64),
            frozen(self.block_last, np.int32), frozen(self.data, np.float32), frozen(self.offsets, np.int64),
            words, words.view(np.uint8), 2**62,
        )  # fmt: skip
        if not ok:
            raise ValueError(f"BM25 index is corrupt: column {t} cannot be decoded")
        return rows, vals


@njit(nogil=True, cache=True)
def decode_column(
    mode: int, t: int, indptr: np.ndarray, bptr: np.ndarray, block_last: np.ndarray, data: np.ndarray,
    offsets: np.ndarray, words: np.ndarray, stream: np.ndarray, num_docs: int,
) -> tuple[np.ndarray, np.ndarray, bool]:  # fmt: skip
    """Every posting of column ``t``: (rows, values, ok); ``stream`` is ``words`` as bytes."""
    s, e = indptr[t], indptr[t + 1]
    rows = np.empty(e - s, np.int64)
    vals = np.empty(e - s, np.float32)
    buf_d = np.empty(BLOCK, np.int64)
    buf_v = np.empty(BLOCK, np.float32)
    scratch = np.empty(BLOCK, np.uint32)
    for b in range(bptr[t], bptr[t + 1]):
        first = s + (b - bptr[t]) * BLOCK
        n = min(BLOCK, e - first)
        prev = np.int64(block_last[b - 1]) if b > bptr[t] else np.int64(-1)
        if not decode_block(mode, b, first, n, prev, rows, data, offsets, words, stream, num_docs,
                            np.int64(block_last[b]), buf_d, buf_v, scratch):  # fmt: skip
            return rows, vals, False
        rows[first - s : first - s + n] = buf_d[:n]
        vals[first - s : first - s + n] = buf_v[:n]
    return rows, vals, True


def encode_postings(
    indptr: np.ndarray, rows: np.ndarray, tf: np.ndarray, scores: np.ndarray, with_tf: bool,
    super_blocks: int = SUPER,
) -> Postings:  # fmt: skip
    """A whole index's postings encoded in memory (layout TF with ``with_tf``, else SCORE), with
    superblocks of ``super_blocks`` blocks."""
    indptr = np.asarray(indptr, np.int64)
    df = np.diff(indptr)
    stream, sizes, last, best = encode_blocks(np.asarray(rows, np.int64), np.asarray(tf, np.int64),
                                              np.asarray(scores, np.float32), df, np.full(len(df), -1, np.int64),
                                              with_tf)  # fmt: skip
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    col_max = np.zeros(len(df), np.float32)
    nonempty = df > 0
    if len(scores):
        col_max[nonempty] = np.maximum.reduceat(np.asarray(scores, np.float32), indptr[:-1][nonempty])
    data = _EMPTY_F32 if with_tf else np.asarray(scores, np.float32)
    return Postings(TF if with_tf else SCORE, indptr, block_pointers(indptr), last, best, col_max,
                    data=data, offsets=offsets, stream=stream, super_blocks=super_blocks)  # fmt: skip
