"""Frame-of-reference bit packing of 128 integers in four interleaved 32-bit lanes.

A block of ``BLOCK`` (128) non-negative integers, each below ``2**w``, is stored in ``4 w`` uint32
words (exactly ``w`` bits a value, ``16 w`` bytes): value ``j`` lives in lane ``j % 4`` as that lane's
``j // 4``-th value, the lane's values packed one after another from bit 0 of its first word, and word
``m`` of lane ``l`` is word ``4 m + l`` of the block. Decoding value ``4 k + l`` reads bit
``k w`` of its lane:

    v = (word[4 (k w >> 5) + l] >> (k w & 31)  |  word[4 ((k w >> 5) + 1) + l] << (32 - (k w & 31)))  &  (2^w - 1)

(the second word only when the value straddles two). For one ``k`` the four lanes share the shift and
the branch, so the inner loop over the lanes is one SIMD operation: this is the layout of SIMD-BP128
(Lemire & Boytsov, 2015, "Decoding billions of integers per second through vectorization", Software:
Practice and Experience 45(1)), the idea behind Lucene's ``ForUtil`` (128-value blocks, one bit width
each). *Frame of reference* (Goldstein, Ramakrishnan & Shaft, 1998, "Compressing relations and
indexes", ICDE): the values packed are ``x - min(x)`` of the block, the minimum kept in the block's
header, so a block of equal values takes no bits at all.

The postings use it for row gaps and term frequencies (``postings``); ``width`` gives ``w``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BLOCK = 128
"""Values a packed block holds."""
LANES = 4
"""Interleaved 32-bit lanes (one SSE register of uint32; numba vectorises the lane loop)."""
PER_LANE = BLOCK // LANES
MAX_WIDTH = 32


@njit(nogil=True, cache=True)
def width(max_value: int) -> int:
    """Bits needed for values up to ``max_value`` (0 for 0): ``floor(log2(max_value)) + 1``."""
    w = 0
    while max_value > 0:
        max_value >>= 1
        w += 1
    return w


@njit(nogil=True, cache=True)
def packed_words(w: int) -> int:
    """uint32 words a block of width ``w`` takes: ``4 w``."""
    return LANES * w


@njit(nogil=True, cache=True)
def pack(values: np.ndarray, w: int, out: np.ndarray, at: int) -> int:
    """Pack ``values[:128]`` (each ``< 2**w``, ``0 <= w <= 32``) into ``out[at : at + 4 w]`` (zeroed
    here first); returns ``at + 4 w``."""
    for m in range(LANES * w):
        out[at + m] = 0
    if w == 0:
        return at
    for k in range(PER_LANE):
        bit = k * w
        m = bit >> 5
        s = bit & 31
        for lane in range(LANES):
            v = np.uint64(values[LANES * k + lane])
            out[at + LANES * m + lane] |= np.uint32((v << np.uint64(s)) & np.uint64(0xFFFFFFFF))
            if s + w > 32:
                out[at + LANES * (m + 1) + lane] |= np.uint32(v >> np.uint64(32 - s))
    return at + LANES * w


@njit(nogil=True, cache=True, inline="always")
def unpack(words: np.ndarray, at: int, w: int, base: int, out: np.ndarray) -> None:
    """``out[j] = base + value j`` (uint32) for the 128 values packed at ``words[at:]`` with width ``w``.

    Indices are unsigned, so numba emits no negative-index wraparound: measured 2x faster (0.6 against
    1.3 ns a value, CPU time, on this project's shared 2-core machine)."""
    b = np.uint32(base)
    if w == 0:
        for j in range(BLOCK):
            out[np.uint64(j)] = b
        return
    mask = np.uint32(0xFFFFFFFF) if w == MAX_WIDTH else np.uint32((1 << w) - 1)
    start = np.uint64(at)
    four = np.uint64(LANES)
    for k in range(PER_LANE):
        bit = k * w
        m = start + np.uint64(LANES * (bit >> 5))
        s = np.uint32(bit & 31)
        o = np.uint64(LANES * k)
        if (bit & 31) + w > 32:
            up = np.uint32(32) - s
            for lane in range(LANES):
                q = np.uint64(lane)
                out[o + q] = (((words[m + q] >> s) | (words[m + four + q] << up)) & mask) + b
        else:
            for lane in range(LANES):
                q = np.uint64(lane)
                out[o + q] = ((words[m + q] >> s) & mask) + b
