"""Score bounds at two levels: per block of 128 postings and per *superblock* of ``SUPER`` blocks.

Each block has its last row and its largest score (``block_last``, ``block_max``); superblock ``s``
of a column groups its blocks ``SUPER`` at a time from the column's first block (the last group
shorter), with the last row of its last block and the largest of its blocks' maxima:

    sb_last[s] = block_last[last block of s]        sb_max[s] = max(block_max[b] for b in s)

so a cursor moves past 32 x 128 postings with one comparison, and a query skips a superblock whose
bound cannot reach the k-th score without looking at its blocks -- the two levels of skip data with
impacts of Lucene's postings (``Lucene912PostingsFormat``: level 0 a block of 128 documents, level 1
every 32 blocks); the per-level maxima are Block-Max WAND's bounds (Ding & Suel, 2011, "Faster top-k
document retrieval using block-max indexes", SIGIR) one level up. ``sptr[t]`` is column ``t``'s first superblock (from
``bptr``: ``ceil(blocks / SUPER)`` a column).

A superblock bound below one of its blocks' would make the kernel skip passages that could enter the
top k: ``superblock_problem`` finds it (the build checks what it writes, the loader what it reads).
"""

from __future__ import annotations

import numpy as np

SUPER = 32
"""Blocks a superblock (4,096 postings)."""


def superblock_pointers(bptr: np.ndarray, super_blocks: int = SUPER) -> np.ndarray:
    """Per column, its first superblock (and the total at the end)."""
    blocks = np.diff(np.asarray(bptr, dtype=np.int64))
    sptr = np.zeros(len(blocks) + 1, dtype=np.int64)
    np.cumsum((blocks + super_blocks - 1) // super_blocks, out=sptr[1:])
    return sptr


def superblock_firsts(bptr: np.ndarray, sptr: np.ndarray, super_blocks: int = SUPER) -> np.ndarray:
    """The first block of each superblock."""
    bptr = np.asarray(bptr, dtype=np.int64)
    column = np.repeat(np.arange(len(sptr) - 1), np.diff(sptr))
    return bptr[column] + (np.arange(int(sptr[-1])) - sptr[column]) * super_blocks


def superblock_bounds(
    bptr: np.ndarray, block_last: np.ndarray, block_max: np.ndarray, super_blocks: int = SUPER
) -> tuple[np.ndarray, np.ndarray]:
    """(sb_last int32, sb_max float32) of the blocks ``bptr`` cuts into columns."""
    sptr = superblock_pointers(bptr, super_blocks)
    firsts = superblock_firsts(bptr, sptr, super_blocks)
    if len(firsts) == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.float32)
    lasts = np.append(firsts[1:], int(bptr[-1])) - 1
    sb_max = np.maximum.reduceat(np.asarray(block_max, np.float32), firsts).astype(np.float32)
    return np.asarray(block_last[lasts], np.int32), sb_max


def superblock_problem(
    bptr: np.ndarray, block_last: np.ndarray, block_max: np.ndarray, sb_last: np.ndarray, sb_max: np.ndarray,
    super_blocks: int = SUPER,
) -> str | None:  # fmt: skip
    """What is wrong with the superblocks of these blocks (None: nothing): their count, a last row
    other than their last block's, or a bound below one of their blocks' maxima."""
    if super_blocks < 1:
        return f"superblocks of {super_blocks} blocks"
    sptr = superblock_pointers(bptr, super_blocks)
    if len(sb_last) != int(sptr[-1]) or len(sb_max) != int(sptr[-1]):
        return f"{len(sb_max):,} superblock bounds for {int(sptr[-1]):,} superblocks"
    if len(sb_max) == 0:
        return None
    firsts = superblock_firsts(bptr, sptr, super_blocks)
    lasts = np.append(firsts[1:], int(bptr[-1])) - 1
    if not np.array_equal(np.asarray(sb_last, np.int64), np.asarray(block_last, np.int64)[lasts]):
        return "a superblock's last row is not its last block's"
    own = np.repeat(np.asarray(sb_max, np.float32), np.diff(np.append(firsts, int(bptr[-1]))))
    below = np.flatnonzero(own < np.asarray(block_max, np.float32))
    if len(below):
        b = int(below[0])
        return f"a superblock bound ({float(own[b])}) is below the largest score of its block {b} ({float(block_max[b])})"
    return None
