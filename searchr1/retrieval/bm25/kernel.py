"""The compiled BM25 top-k kernel: document-at-a-time MaxScore with per-block bounds, without the GIL.

Postings are read in blocks of ``BLOCK`` (128): each block has its last passage row and its largest
score (``block_last``, ``block_max``), so a cursor moves past whole blocks without decoding them.
A query's terms are ordered by their upper bound ``U_i`` (the column's largest score times the
term's count in the query); with ``theta`` the k-th best score so far, the terms whose bounds sum to
less than ``theta`` are *non-essential* (MaxScore: Turtle & Flood, 1995, "Query evaluation:
strategies and optimizations"): no passage holding only them can enter the top k, so only the
passages of the other (essential) terms are visited, in row order, and the non-essential terms are
probed for those. Per-block bounds tighten this (Block-Max MaxScore: Chakrabarti, Chaudhuri & Ganti,
2011, "Interval-based pruning for top-k processing over compressed lists"; Mallia et al., 2019,
"An experimental study of index compression and DAAT query processing methods"): for the window
``[cur, R]`` that every term's current block covers, the sum of those blocks' largest scores bounds
every passage in it; when it is below ``theta`` the whole window is skipped, and the non-essential
probes of a passage stop as soon as its partial score plus the blocks' bounds left falls below it.
The window's bound holds for every later candidate inside it, so it is computed once a window (again
when the essential terms change). Bounds one level up (``bounds``: superblocks of 32 blocks, as
Lucene's second level of impacts): a cursor moves past a superblock with one comparison, and when a
block window is skipped the superblock window around it is tried too, skipped whole when its bound
cannot reach ``theta`` either (Ding & Suel, 2011, "Faster top-k document retrieval using block-max
indexes": the same bound, one level up).

When one essential term is left with postings (all-common queries, MaxScore's worst case, every posting
of that list a candidate; or a rare essential term exhausted beside a common one: at 4M passages "what year
did the years two bafo", whose one "bafo" passage is found first, then took 37 ms visiting every "year"
posting a passage at a time, 18 ms this way), a window is scored a term at a time, as Lucene's
``MaxScoreBulkScorer`` does: the essential term's postings in the window in one loop (score, then kept only
if the non-essential bounds can lift it to ``theta``), then each non-essential term, strongest first, added
to the survivors and the survivors filtered again. The same passages are probed with the same partial sums,
in the same order, so the top k is the passage-at-a-time loop's bit for bit. With several essential terms
left, once the heap holds k passages, their postings in the window are merged in row order in one loop
(each one's current block is decoded and holds the window), each passage's essential scores summed
strongest first as the passage-at-a-time loop sums them, then filtered and probed the same way: at 4M
passages the slowest all-common queries ("who the of bafe second beni": four terms in 196k-640k passages,
two essential) went from 22 to 12 ms, the 4,096 queries' total 0.78x (interleaved rounds, one thread).

Hot loops pass no array to a function: numba counts references to an array handed to a call (two atomic
operations each), which cost a quarter of the kernel's time per posting before (profiled with ``perf``).

The search starts from a floor under ``theta`` (as WAND implementations seed their threshold; Ding &
Suel, 2011): before any passage is visited, each query term of at most ``FLOOR_POSTINGS`` postings has
its column decoded once and its k-th best score alone taken; every other term adds >= 0, so at least
k passages score that much and nothing below it can enter. Pruning runs on the floor from the first
passage (a passage *equal* to the floor is kept: the floor's passages are not yet ordered by row),
and on the heap's k-th as soon as that is higher. Measured on 4,096 queries at 4M passages (one thread,
interleaved rounds): 7% of the kernel's time; the top k unchanged. Block decoding is inlined
(``decode_block``, ``unpack``: ``inline="always"``): a call handing it eight arrays cost their reference
counts on every block, 8% of the kernel's time. The norms of a decoded block's rows are prefetched together
(``prefetch``): at 4M passages the norm bytes no longer sit in the caches.

A passage's score is summed in float64 in the order of decreasing term bounds and rounded to float32,
as Lucene reports it; the top k are the best by (float32 score desc, row asc), and with ``ties`` also
every passage tied with the k-th (Anserini orders those by id afterwards). Pruning compares
``float32(bound (1 + 1e-9)) < theta``: float32 rounding is monotone, so a skipped passage scores
strictly below the k-th (a tie is never skipped); the 1e-9 covers float64 rounding of the sums.

Posting layouts (``mode``, ``blocks``): RAW (rows int32 + float32 scores: indexes of format 1 and
``save``), TF (bit-packed row gaps and term frequencies; the score computed here, in float32, from the
term frequency and the passage's one-byte Lucene norm exactly as ``scoring.term_scores`` computes it
at build time: ``w - w / (1 + tf inv[norm])``) and SCORE (bit-packed row gaps, float32 scores beside
them: methods other than Lucene's). A query term repeated n times is one clause boosted by n
(``scoring.boosted_scores``): ``w = float32(n idf)`` in the formula above (TF), the term frequency
recovered from the stored score first (RAW, Lucene's settings), else n x the score.

The score table (TF): for a term with at least ``TABLE_MIN_POSTINGS`` postings, the scores of term
frequencies 1..``TABLE_TF`` at each of the 256 norms are computed once per query, by the same float32
expression (``lucene_score``), so a posting's score is one load instead of a division -- Lucene keeps
the 256 ``1 / (k1 (1 - b + b len / avgdl))`` (our ``inv``) and divides per posting; the table goes one
step further. Bit for bit the formula's value: the same function computes both.

Everything here runs with ``nogil``: a search thread releases the interpreter lock for the whole
batch it scores.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from searchr1.retrieval.bm25.blocks import BLOCK, decode_block
from searchr1.retrieval.bm25.prefetch import prefetch

PLAIN, FORMULA, RECOVER, TIMES = 0, 1, 2, 3
"""How a term's posting becomes its contribution: the stored score; Lucene's formula from tf; tf
recovered from the stored score, then the formula; the stored score times the count."""
END = np.int64(2**62)
"""The row of an exhausted cursor."""
MARGIN = 1e-9
"""Relative margin of the float64 sums of bounds (their rounding)."""
BOOST_MARGIN = 1e-6
"""A boosted term's score may exceed count x its single score by float32 rounding: its bound's margin."""
MAX_TF = 65535.0
TABLE_TF = 8
"""Term frequencies 1..this have their scores tabulated per query term (most postings: tf <= 3)."""
TABLE_MIN_POSTINGS = 2 * TABLE_TF * 256
"""A term gets a table when it has at least this many postings (the table's divisions: at most half
a division a posting)."""
FLOOR_POSTINGS = 8 * 1024
"""A column this short gives the search a floor under its k-th score before it starts (its k-th best
score alone): decoded once, a few blocks."""
FLOOR_MAX_K = 64
"""The floor is kept for k up to this (a sorted array of k scores, insertion per posting)."""


@njit(nogil=True, cache=True, error_model="numpy")
def _recover_tf(s: np.float32, idf: np.float32, inv: np.float32) -> np.float32:
    """The term frequency whose Lucene score is the stored ``s`` (``scoring.boosted_scores``)."""
    one = np.float32(1.0)
    est = (np.float64(idf) / (np.float64(idf) - np.float64(s)) - 1.0) / np.float64(inv)
    if np.isnan(est):
        tf = np.float32(1.0)
    elif est > MAX_TF:
        tf = np.float32(MAX_TF)
    elif est < 1.0:
        tf = one
    else:
        tf = np.float32(np.rint(est))
    for step in (-1.0, 1.0):
        if idf - idf / (one + tf * inv) != s:
            tf = max(tf + np.float32(step), one)
    if idf - idf / (one + tf * inv) != s:
        tf -= one
    return tf


@njit(nogil=True, cache=True, error_model="numpy")
def lucene_score(w: np.float32, tf: np.float32, inv: np.float32) -> np.float32:
    """Lucene's BM25 score in float32: ``w - w / (1 + tf inv)`` (``scoring.term_scores``)."""
    return w - w / (np.float32(1.0) + tf * inv)


@njit(nogil=True, cache=True, error_model="numpy")
def fill_table(table: np.ndarray, w32: np.float32, inv: np.ndarray) -> None:
    """``table[tf - 1, norm] = lucene_score(w32, tf, inv[norm])`` for tf 1..``TABLE_TF``."""
    for t in range(TABLE_TF):
        tf = np.float32(t + 1)
        for norm in range(256):
            table[t, norm] = lucene_score(w32, tf, inv[norm])


@njit(nogil=True, cache=True)
def _worse(s1: np.float32, r1: int, s2: np.float32, r2: int) -> bool:
    return s1 < s2 or (s1 == s2 and r1 > r2)


@njit(nogil=True, cache=True)
def _swap_if_worse(hs: np.ndarray, hr: np.ndarray, a: int, b: int) -> bool:
    """One step of a sift: when hit ``a`` is worse than hit ``b`` (the heap's order: the worse nearer the
    root), the two swap places; returns whether they did."""
    if not _worse(hs[a], hr[a], hs[b], hr[b]):
        return False
    hs[a], hs[b] = hs[b], hs[a]
    hr[a], hr[b] = hr[b], hr[a]
    return True


@njit(nogil=True, cache=True)
def _sift_down(hs: np.ndarray, hr: np.ndarray, n: int, i: int) -> None:
    """Restore the heap (root = the worst hit) below ``i``."""
    while True:
        c = 2 * i + 1
        if c >= n:
            return
        if c + 1 < n and _worse(hs[c + 1], hr[c + 1], hs[c], hr[c]):
            c += 1
        if not _swap_if_worse(hs, hr, c, i):
            return
        i = c


@njit(nogil=True, cache=True)
def _sift_up(hs: np.ndarray, hr: np.ndarray, i: int) -> None:
    """Restore the heap above ``i``."""
    while i > 0:
        p = (i - 1) // 2
        if not _swap_if_worse(hs, hr, i, p):
            return
        i = p


@njit(nogil=True, cache=True)
def _push(
    hs: np.ndarray, hr: np.ndarray, hn: int, k: int, ts: np.ndarray, tr: np.ndarray, tn: int, s: np.float32,
    row: int, ties: bool,
) -> tuple[int, int]:  # fmt: skip
    """Offer (``s``, ``row``) to the heap of the k best (``hs``, ``hr``, ``hn`` of them) and, with
    ``ties``, to the passages tied with the k-th (``ts``, ``tr``, ``tn`` of them: room for one more,
    ``_grow`` before); returns (hn, tn). No array is returned: a returned array costs two atomic
    reference counts a call, a third of the kernel's time when it was called a candidate."""
    if hn < k:
        hs[hn], hr[hn] = s, row
        _sift_up(hs, hr, hn)
        return hn + 1, tn
    if s > hs[0]:
        old_s, old_r = hs[0], hr[0]
        hs[0], hr[0] = s, row
        _sift_down(hs, hr, hn, 0)
        if ties:
            if hs[0] > old_s:
                tn = 0
            else:
                ts[tn], tr[tn] = old_s, old_r
                tn += 1
    elif ties and s == hs[0]:
        ts[tn], tr[tn] = s, row
        tn += 1
    return hn, tn


@njit(nogil=True, cache=True)
def _skip(bound: float, theta: np.float32, equal_loses: bool) -> bool:
    """Whether a passage whose score is at most ``bound`` cannot enter the top k (nor tie the k-th):
    below ``theta``, or equal to it when ``equal_loses`` (a later row loses a tie)."""
    b32 = np.float32(bound * (1.0 + MARGIN))
    return b32 < theta or (equal_loses and b32 == theta)


@njit(nogil=True, cache=True, error_model="numpy")
def top_k(
    cols: np.ndarray, counts: np.ndarray, kinds: np.ndarray, w32: np.ndarray, idf32: np.ndarray,
    bounds: np.ndarray, k: int, ties: bool, prune: bool, mode: int, indptr: np.ndarray,
    bptr: np.ndarray, block_last: np.ndarray, block_max: np.ndarray, sptr: np.ndarray,
    sb_last: np.ndarray, sb_max: np.ndarray, super_blocks: int, rows: np.ndarray, data: np.ndarray,
    offsets: np.ndarray, words: np.ndarray, stream: np.ndarray, norms: np.ndarray, inv: np.ndarray,
    num_docs: int,
) -> tuple[np.ndarray, np.ndarray, bool]:  # fmt: skip
    """(rows, float32 scores, ok) of the ``k`` best passages holding a query term, by score desc then
    row asc (``ties``: and every passage tied with the k-th). ``cols`` are the query's distinct
    columns sorted by ascending ``bounds`` (each column's largest score x ``counts``, with margin);
    ``ok`` is False when a block's bytes are corrupt."""
    nt = len(cols)
    cur_block = np.empty(nt, np.int64)
    end_block = np.empty(nt, np.int64)
    cur_sb = np.empty(nt, np.int64)  # the superblock holding cur_block
    end_sb = np.empty(nt, np.int64)
    dec_block = np.full(nt, -1, np.int64)
    pos = np.zeros(nt, np.int64)
    size = np.zeros(nt, np.int64)
    doc = np.empty(nt, np.int64)
    factor = np.empty(nt, np.float64)  # block bound = block_max x factor
    buf_docs = np.empty((nt, BLOCK), np.int64)
    buf_vals = np.empty((nt, BLOCK), np.float32)
    prefix = np.empty(nt, np.float64)  # sum of bounds of terms 0..i
    near = np.zeros(nt, np.float64)  # per non-essential term: its block bound at the candidate
    scratch = np.empty(BLOCK, np.uint32)
    cand_doc = np.empty(nt * BLOCK, np.int64)  # the essential terms' candidates in a window
    cand_score = np.empty(nt * BLOCK, np.float64)
    tix = np.full(nt, -1, np.int64)  # the term's score table, or -1
    n_tables = 0
    for i in range(nt):
        if kinds[i] == FORMULA and indptr[cols[i] + 1] - indptr[cols[i]] >= TABLE_MIN_POSTINGS:
            tix[i] = n_tables
            n_tables += 1
    table = np.empty((max(n_tables, 1), TABLE_TF, 256), np.float32)
    acc = 0.0
    for i in range(nt):
        t = cols[i]
        if tix[i] >= 0:
            fill_table(table[tix[i]], w32[i], inv)
        cur_block[i], end_block[i] = bptr[t], bptr[t + 1]
        cur_sb[i], end_sb[i] = sptr[t], sptr[t + 1]
        factor[i] = counts[i] * (1.0 + BOOST_MARGIN) if counts[i] > 1 else 1.0
        acc += bounds[i]
        prefix[i] = acc
        doc[i] = -1
    hs = np.empty(max(k, 1), np.float32)
    hr = np.empty(max(k, 1), np.int64)
    hn = 0
    ts = np.empty(16, np.float32)
    tr = np.empty(16, np.int64)
    tn = 0
    neg_inf = np.float32(-np.inf)

    # -- cursors ---------------------------------------------------------------------------------
    # shallow(i, target): term i's block that would hold ``target`` (-1: none), moved to without
    # decoding: superblocks first (one comparison a 4,096 postings), then the blocks of one superblock
    def shallow(i, target):
        sb = cur_sb[i]
        e = end_sb[i]
        if sb == e:
            return -1
        if sb_last[sb] < target:
            sb += 1
            while sb < e and sb_last[sb] < target:
                sb += 1
            cur_sb[i] = sb
            if sb == e:
                cur_block[i] = end_block[i]
                return -1
            t = cols[i]
            first = bptr[t] + (sb - sptr[t]) * super_blocks
            if cur_block[i] < first:
                cur_block[i] = first
        b = cur_block[i]
        while block_last[b] < target:  # ends inside this superblock: its last row is >= target
            b += 1
        cur_block[i] = b
        return b

    # load(i, b): term i's block b decoded into its buffer (False: corrupt bytes), its norms prefetched
    def load(i, b):
        t = cols[i]
        first = indptr[t] + (b - bptr[t]) * BLOCK
        n = min(BLOCK, indptr[t + 1] - first)
        prev = np.int64(block_last[b - 1]) if b > bptr[t] else np.int64(-1)
        if not decode_block(mode, b, first, n, prev, rows, data, offsets, words, stream, num_docs,
                            np.int64(block_last[b]), buf_docs[i], buf_vals[i], scratch):  # fmt: skip
            return False
        dec_block[i] = b
        size[i] = n
        pos[i] = 0
        for j in range(n):  # the block's norms requested together (``prefetch``)
            prefetch(norms, buf_docs[i, j])
        return True

    # seek(i, target): term i on its first posting with row >= target (its block decoded); inside the
    # block decoded already when that block reaches target
    def seek(i, target):
        if dec_block[i] == cur_block[i] and buf_docs[i, size[i] - 1] >= target:
            p = pos[i]
            while buf_docs[i, p] < target:
                p += 1
            pos[i] = p
            doc[i] = buf_docs[i, p]
            return True
        b = shallow(i, target)
        if b < 0:
            doc[i] = END
            return True
        if dec_block[i] != b and not load(i, b):
            return False
        p = pos[i]
        while buf_docs[i, p] < target:
            p += 1
        pos[i] = p
        doc[i] = buf_docs[i, p]
        return True

    # contribution(i, v, d): term i's score in passage d from its stored value v (PLAIN ... TIMES). A
    # closure, not a function given the arrays: arrays passed to a call cost two atomic reference
    # counts each, per posting (measured: a quarter of the kernel's time)
    def contribution(i, v, d):
        kind = kinds[i]
        if kind == FORMULA:
            if tix[i] >= 0 and v <= TABLE_TF:
                return np.float64(table[tix[i], np.int64(v) - 1, norms[d]])
            return np.float64(lucene_score(w32[i], v, inv[norms[d]]))
        if kind == PLAIN:
            return np.float64(v)
        if kind == RECOVER:
            iv = inv[norms[d]]
            return np.float64(lucene_score(w32[i], _recover_tf(v, idf32[i], iv), iv))
        return np.float64(v) * counts[i]

    def score_of(i):
        return contribution(i, buf_vals[i, pos[i]], doc[i])

    # competes(s): whether a passage of float32 score s enters the heap (or the k-th's ties)
    def competes(s):
        return hn < k or s > hs[0] or (ties and s == hs[0])

    ok = True
    # a floor under the k-th score before any passage is visited: the k-th best score of one short
    # column alone (every other term adds >= 0, so k passages score at least that)
    floor = neg_inf
    if prune and k <= FLOOR_MAX_K:
        best_k = np.empty(k, np.float32)
        for i in range(nt):
            t = cols[i]
            n_post = indptr[t + 1] - indptr[t]
            if n_post < k or n_post > FLOOR_POSTINGS:
                continue
            best_k[:] = neg_inf
            for b in range(bptr[t], bptr[t + 1]):
                if not load(i, b):
                    ok = False
                    break
                for j in range(size[i]):
                    s1 = np.float32(contribution(i, buf_vals[i, j], buf_docs[i, j]))
                    if s1 > best_k[0]:
                        q = 0
                        while q + 1 < k and best_k[q + 1] < s1:
                            best_k[q] = best_k[q + 1]
                            q += 1
                        best_k[q] = s1
            floor = max(floor, best_k[0])
    for i in range(nt):
        ok = ok and seek(i, 0)
    ne = 0  # terms 0..ne-1 are non-essential
    win_hi, win_ne, win_bound = np.int64(-1), -1, 0.0  # the window [.., win_hi] and its bound
    while ok:
        theta, eq = (hs[0], not ties) if hn == k else (neg_inf, False)
        if floor > theta:
            theta, eq = floor, False
        active = prune and theta > neg_inf
        if active:
            while ne < nt and _skip(prefix[ne], theta, eq):
                ne += 1
        if ne == nt:
            break
        cur = END
        for i in range(ne, nt):
            if doc[i] < cur:
                cur = doc[i]
        if cur == END:
            break
        if active:
            if cur > win_hi or ne != win_ne:
                # the window [cur, r] inside every term's current block: one bound for all of it, and
                # for every later candidate up to r while the essential terms stay the same
                r = END
                for i in range(ne, nt):
                    if doc[i] != END:
                        r = min(r, np.int64(block_last[cur_block[i]]))
                for i in range(ne):
                    b = shallow(i, cur)
                    if b >= 0:
                        r = min(r, np.int64(block_last[b]))
                window = 0.0
                for i in range(ne, nt):
                    if doc[i] <= r:
                        window += block_max[cur_block[i]] * factor[i]
                for i in range(ne):
                    b = cur_block[i]
                    near[i] = block_max[b] * factor[i] if b < end_block[i] else 0.0
                    window += near[i]
                win_hi, win_ne, win_bound = r, ne, window
            if _skip(win_bound, theta, eq):
                # nothing in [cur, win_hi] can enter: past it, and past the whole superblock window
                # [cur, R] when its bound cannot either
                r = win_hi
                big = END
                for i in range(nt):
                    if cur_sb[i] < end_sb[i] and (i < ne or doc[i] != END):
                        big = min(big, np.int64(sb_last[cur_sb[i]]))
                if big > r:
                    window = 0.0
                    for i in range(nt):
                        if cur_sb[i] < end_sb[i] and (i < ne or doc[i] <= big):
                            window += sb_max[cur_sb[i]] * factor[i]
                    if _skip(window, theta, eq):
                        r = big
                for i in range(ne, nt):
                    if doc[i] <= r:
                        ok = ok and seek(i, r + 1)
                win_hi = np.int64(-1)
                continue
            e = -1  # the one essential term with postings left, if only one has (nt: several)
            for i in range(ne, nt):
                if doc[i] != END:
                    e = i if e < 0 else nt
            if e < nt or hn == k:
                # one essential term left (any other one exhausted): its postings in the window scored
                # in one loop; several (once the heap is full): their postings in the window merged in
                # row order, each passage's essential scores summed strongest first. Those that the
                # non-essential bounds can lift to theta are kept, then each non-essential term
                # (strongest first) added to the survivors and the survivors filtered again -- the
                # probes of the passage-at-a-time loop below, a term at a time (scores summed in the
                # same order)
                rest = 0.0
                for i in range(ne):
                    rest += near[i]
                m = 0
                if e < nt:
                    p, n_e = pos[e], size[e]
                    while p < n_e and buf_docs[e, p] <= win_hi:
                        d = buf_docs[e, p]
                        sc = contribution(e, buf_vals[e, p], d)
                        if not _skip(sc + rest, theta, eq):
                            cand_doc[m], cand_score[m] = d, sc
                            m += 1
                        p += 1
                    if p < n_e:
                        pos[e], doc[e] = p, buf_docs[e, p]
                    else:
                        ok = ok and seek(e, buf_docs[e, n_e - 1] + 1)
                else:
                    # every essential term's current block is decoded and holds the window's postings
                    while ok:
                        d = END
                        for i in range(ne, nt):
                            if doc[i] <= win_hi and doc[i] < d:
                                d = doc[i]
                        if d == END:
                            break
                        sc = 0.0
                        for i in range(nt - 1, ne - 1, -1):
                            if doc[i] == d:
                                sc += score_of(i)
                                p = pos[i] + 1
                                if p < size[i]:
                                    pos[i], doc[i] = p, buf_docs[i, p]
                                else:
                                    ok = ok and seek(i, d + 1)
                        if not _skip(sc + rest, theta, eq):
                            cand_doc[m], cand_score[m] = d, sc
                            m += 1
                for i in range(ne - 1, -1, -1):
                    rest -= near[i]
                    kept = 0
                    for j in range(m):
                        d = cand_doc[j]
                        if doc[i] < d:
                            q = pos[i]
                            if dec_block[i] == cur_block[i] and buf_docs[i, size[i] - 1] >= d:
                                while buf_docs[i, q] < d:  # inside the decoded block: no seek
                                    q += 1
                                pos[i], doc[i] = q, buf_docs[i, q]
                            else:
                                ok = ok and seek(i, d)
                        sc = cand_score[j]
                        if doc[i] == d:
                            sc += score_of(i)
                        if not _skip(sc + rest, theta, eq):
                            cand_doc[kept], cand_score[kept] = d, sc
                            kept += 1
                    m = kept
                for j in range(m):
                    s32 = np.float32(cand_score[j])
                    if competes(s32):
                        if tn == len(ts):
                            ts, tr = _grow(ts, tr)
                        hn, tn = _push(hs, hr, hn, k, ts, tr, tn, s32, cand_doc[j], ties)
                continue
        score = 0.0
        for i in range(nt - 1, ne - 1, -1):
            if doc[i] == cur:
                score += score_of(i)
                ok = ok and seek(i, cur + 1)
        if ne > 0:
            pruning = active
            rest = 0.0
            if pruning:
                for i in range(ne):
                    rest += near[i]
            dropped = False
            for i in range(ne - 1, -1, -1):
                if pruning:
                    if _skip(score + rest, theta, eq):
                        dropped = True
                        break
                    rest -= near[i]
                ok = ok and seek(i, cur)
                if doc[i] == cur:
                    score += score_of(i)
            if dropped:
                continue
        s32 = np.float32(score)
        if competes(s32):
            if tn == len(ts):
                ts, tr = _grow(ts, tr)
            hn, tn = _push(hs, hr, hn, k, ts, tr, tn, s32, cur, ties)
    out_s = np.concatenate((hs[:hn], ts[:tn]))
    out_r = np.concatenate((hr[:hn], tr[:tn]))
    order = np.argsort(out_r, kind="mergesort")
    out_s, out_r = out_s[order], out_r[order]
    order = np.argsort(-out_s, kind="mergesort")
    return out_r[order], out_s[order], ok


@njit(nogil=True, cache=True)
def _grow(ts: np.ndarray, tr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.empty(2 * len(ts), ts.dtype)
    r = np.empty(2 * len(tr), tr.dtype)
    s[: len(ts)] = ts
    r[: len(tr)] = tr
    return s, r


@njit(nogil=True, cache=True, error_model="numpy")
def top_k_batch(
    qptr: np.ndarray, cols: np.ndarray, counts: np.ndarray, kinds: np.ndarray, w32: np.ndarray,
    idf32: np.ndarray, bounds: np.ndarray, k: int, ties: bool, prune: bool, mode: int,
    indptr: np.ndarray, bptr: np.ndarray, block_last: np.ndarray, block_max: np.ndarray,
    sptr: np.ndarray, sb_last: np.ndarray, sb_max: np.ndarray, super_blocks: int, rows: np.ndarray,
    data: np.ndarray, offsets: np.ndarray, words: np.ndarray, stream: np.ndarray, norms: np.ndarray,
    inv: np.ndarray, num_docs: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:  # fmt: skip
    """``top_k`` of each query ``q`` (its terms at ``qptr[q]:qptr[q+1]`` of the flat arrays): (result
    pointers, rows, scores, ok), query q's hits at ``rptr[q]:rptr[q+1]``."""
    nq = len(qptr) - 1
    rptr = np.zeros(nq + 1, np.int64)
    out_r = np.empty(max(16, nq * k), np.int64)
    out_s = np.empty(max(16, nq * k), np.float32)
    n = 0
    for q in range(nq):
        a, z = qptr[q], qptr[q + 1]
        if z > a:
            r, s, ok = top_k(cols[a:z], counts[a:z], kinds[a:z], w32[a:z], idf32[a:z], bounds[a:z], k, ties,
                             prune, mode, indptr, bptr, block_last, block_max, sptr, sb_last, sb_max,
                             super_blocks, rows, data, offsets, words, stream, norms, inv, num_docs)  # fmt: skip
            if not ok:
                return rptr, out_r[:0], out_s[:0], False
            if n + len(r) > len(out_r):
                grown_r = np.empty(2 * (n + len(r)), np.int64)
                grown_s = np.empty(2 * (n + len(r)), np.float32)
                grown_r[:n], grown_s[:n] = out_r[:n], out_s[:n]
                out_r, out_s = grown_r, grown_s
            out_r[n : n + len(r)] = r
            out_s[n : n + len(r)] = s
            n += len(r)
        rptr[q + 1] = n
    return rptr, out_r[:n], out_s[:n], True
