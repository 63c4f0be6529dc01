"""``BM25Retriever``: BM25 search over posting blocks (``postings``) with the compiled top-k kernel
(``kernel``), a vocabulary (``vocabulary``) and a passage store (``store``); built in memory
(``from_documents``) or loaded from an index folder (``load``). The model and the file layout are in
the package's docstring (``searchr1.retrieval.bm25``).
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from searchr1.retrieval.base import Hit, Retriever
from searchr1.retrieval.bm25.blocks import TF
from searchr1.retrieval.bm25.build import build_matrix
from searchr1.retrieval.bm25.errors import CorruptIndex
from searchr1.retrieval.bm25.files import (
    BM25_DIR,
    DATA_FILE,
    ID_KEYS_FILE,
    INDICES_FILE,
    INDPTR_FILE,
    NONOCCURRENCE_FILE,
    NORMS_FILE,
    TERM_MAX_FILE,
    TOKENIZER_FILE,
    ScoreMatrix,
    load_matrix,
    tf_layout,
    write_params,
)
from searchr1.retrieval.bm25.kernel import BOOST_MARGIN, FORMULA, RECOVER, TIMES, top_k_batch
from searchr1.retrieval.bm25.params import BM25Params
from searchr1.retrieval.bm25.postings import Postings, encode_postings, frozen
from searchr1.retrieval.bm25.scoring import LUCENE_LENGTHS, boosted_scores, idf, inverse_norms, term_scores
from searchr1.retrieval.bm25.store import DocStore
from searchr1.retrieval.bm25.vocabulary import DictVocabulary, write_vocabulary
from searchr1.retrieval.corpus import Document, read_corpus

# -- search -------------------------------------------------------------------------------------------


class BM25Retriever(Retriever):
    """BM25 over posting blocks (``postings``), a vocabulary and a document store; top-k by the
    compiled kernel (``kernel``), a batch split over ``threads`` threads."""

    name = "bm25"
    CHUNKS_PER_THREAD = 4
    """A batch is cut into this many kernel calls per thread (queries differ in cost)."""

    def __init__(
        self, matrix: ScoreMatrix, vocab, docs: DocStore, params: BM25Params, postings: Postings | None = None,
        threads: int = 1,
    ):  # fmt: skip
        """``postings``: encoded blocks (an index of this version); None: RAW blocks over ``matrix``'s
        scores. ``threads``: threads a batch of queries is searched on."""
        self.matrix = matrix
        self.vocab = vocab
        self.docs = docs
        self.params = params
        self.analyzer = params.make_analyzer()
        if postings is None:
            postings = Postings.from_matrix(matrix.indptr, matrix.indices, matrix.data, matrix.column_max())
        self.postings = postings
        self._indptr = np.asarray(postings.indptr)
        self._num_docs = matrix.num_docs
        self._nonoccurrence = matrix.nonoccurrence
        self._prune = params.method == "lucene"  # every stored score > 0: partial sums only grow
        self._id_keys = None if matrix.id_keys is None else np.asarray(matrix.id_keys)
        self._norms = None if matrix.norms is None else np.asarray(matrix.norms)
        self._inverse = None
        anserini = (params.method, params.doc_length) == ("lucene", "lucene")
        if anserini and self._norms is not None and matrix.avg_len is not None and matrix.doc_count is not None:
            self._inverse = inverse_norms(params.k1, params.b, matrix.avg_len)
        if postings.mode == TF and self._inverse is None:
            raise ValueError("BM25 postings of term frequencies need Lucene's settings, norms and avgdl")
        p = postings
        norms = self._norms if self._norms is not None else np.zeros(0, np.uint8)
        inv = self._inverse if self._inverse is not None else np.zeros(0, np.float32)
        words = frozen(p.stream, np.uint32)
        self._kernel_arrays = (
            p.mode, *(frozen(a, d) for a, d in ((p.indptr, np.int64), (p.bptr, np.int64), (p.block_last, np.int32),
                      (p.block_max, np.float32), (p.sptr, np.int64), (p.sb_last, np.int32), (p.sb_max, np.float32))),
            p.super_blocks, *(frozen(a, d) for a, d in ((p.rows, np.int32), (p.data, np.float32), (p.offsets, np.int64))),
            words, words.view(np.uint8), frozen(norms, np.uint8), frozen(inv, np.float32), self._num_docs,
        )  # fmt: skip
        """What ``top_k_batch`` reads of the index: plain read-only arrays of fixed types, so that one
        compiled version serves every index, in memory or mapped."""
        self.threads = 1
        self._pool: ThreadPoolExecutor | None = None
        self.set_threads(threads)
        self.kernel_ready = False
        """Whether the kernel was compiled (or loaded from numba's cache) for this index's arrays:
        ``warm_up`` or a first search did it."""

    def warm_up(self) -> str | None:
        """Compile the kernel for this index's arrays before the first query needs it (``serve`` calls
        it at start): one search of one column. The kernel is compiled with numba's ``cache=True``, so
        after the first time on a machine it is loaded from ``__pycache__`` (numba's user cache folder
        where the package's folder is not writable) instead of compiled again (30-60 s of CPU).
        Returns a line for the log, or None (methods scored without the kernel: bm25l, bm25+)."""
        if self._nonoccurrence is not None:
            return None
        t0 = time.perf_counter()
        known, hits_before = len(top_k_batch.signatures), sum(top_k_batch.stats.cache_hits.values())
        t = int(np.argmax(np.diff(self._indptr))) if len(self._indptr) > 1 else 0
        one = np.ones(1)
        kind = FORMULA if self.postings.mode == TF else 0
        idf32 = np.float32(idf(self.params.method, max(self._df(t), 1), int(self.matrix.doc_count or 1)))
        plan = (np.array([t], np.int64), one, np.array([kind], np.int64), np.array([idf32], np.float32),
                np.array([idf32], np.float32), self.postings.col_max[[t]].astype(np.float64))  # fmt: skip
        self._run_kernel([plan], 1, self.params.tie_break == "pyserini")
        self.kernel_ready = True
        if len(top_k_batch.signatures) == known:
            how = "ready (compiled earlier in this process)"
        elif sum(top_k_batch.stats.cache_hits.values()) > hits_before:
            how = "loaded from numba's on-disk cache"
        else:
            how = "compiled (numba caches it on disk for the next start)"
        return f"BM25 kernel {how} in {time.perf_counter() - t0:.1f} s"

    def set_threads(self, threads: int) -> None:
        """Search each batch on ``threads`` threads (the kernel releases the interpreter lock)."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.threads = int(threads)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="bm25") if self.threads > 1 else None

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def from_documents(
        cls, docs: Iterable[Document], params: BM25Params | None = None, **overrides
    ) -> BM25Retriever:
        """Index documents in memory (nothing is written to disk); ``overrides`` change the default
        (``pyserini``) settings, ``preset="bm25s"`` starts from the former ones."""
        params = params or BM25Params.from_preset(**overrides)
        params.validate()
        store = DocStore(list(docs))
        matrix, terms = build_matrix(store._docs, params)
        postings = encode_postings(matrix.indptr, matrix.indices, matrix.tf, matrix.data, tf_layout(params))
        return cls(matrix, DictVocabulary({t: i for i, t in enumerate(terms)}), store, params, postings)

    @classmethod
    def from_corpus(cls, path: str | Path, chunk_size: int | None = None, overlap: int = 0, **overrides):
        """Index a jsonl corpus file in memory."""
        return cls.from_documents(read_corpus(path, chunk_size, overlap), **overrides)

    def save(self, folder: str | Path) -> None:
        """Write the score matrix (format 1: rows and float32 scores, which every version reads),
        vocabulary and settings under ``folder/bm25`` (docs go elsewhere)."""
        out = Path(folder) / BM25_DIR
        out.mkdir(parents=True, exist_ok=True)
        m = self.matrix
        indptr, rows, data = self.csc()  # whatever the layout: rows and float32 scores (format 1)
        np.save(out / DATA_FILE, data)
        np.save(out / INDICES_FILE, rows)
        np.save(out / INDPTR_FILE, indptr)
        np.save(out / TERM_MAX_FILE, m.column_max())
        if m.nonoccurrence is not None:
            np.save(out / NONOCCURRENCE_FILE, np.asarray(m.nonoccurrence, dtype=np.float32))
        if m.norms is not None:
            np.save(out / NORMS_FILE, np.asarray(m.norms, dtype=np.uint8))
        if m.id_keys is not None:
            np.save(out / ID_KEYS_FILE, np.asarray(m.id_keys, dtype=np.uint64))
        if isinstance(self.vocab, DictVocabulary):
            terms = sorted(self.vocab.vocab, key=self.vocab.vocab.__getitem__)
        else:
            terms = self.vocab.terms()
        salt = write_vocabulary(out, terms)
        write_params(out, self.params, m.num_docs, len(terms), salt, m.doc_count, m.avg_len)

    @classmethod
    def load(cls, folder: str | Path, docs: DocStore, mmap: bool = True, threads: int = 1) -> BM25Retriever:
        """Open ``folder/bm25``; with ``mmap`` the arrays stay on disk (page cache, not RSS). An index of
        format 3 is checked first (each file's size and CRC-32); one of format 1 (rows and scores,
        earlier versions) is read as it is, its block bounds computed here."""
        src = Path(folder) / BM25_DIR
        saved = json.loads((src / TOKENIZER_FILE).read_text())
        params = BM25Params.from_saved(saved)
        matrix, vocab, meta, postings = load_matrix(src, mmap=mmap)
        if "delta" not in saved and "delta" in meta:
            params.delta = float(meta["delta"])
        return cls(matrix, vocab, docs, params, postings, threads)

    # -- search -----------------------------------------------------------------------------------

    def term_ids(self, query: str) -> list[int]:
        """Column ids of the query's terms (repeated terms repeated, unknown ones dropped)."""
        return self.vocab.lookup(self.analyzer(query))

    def _weighted(self, t: int, w: float, vals: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """float64 scores of column ``t``'s postings ``rows`` (stored scores ``vals``) for a term that
        occurs ``w`` times in the query: as Anserini scores it (one clause boosted by the count,
        ``scoring.boosted_scores``) with Lucene's settings and norms, else ``w`` x the score."""
        if w == 1:
            return vals.astype(np.float64)
        if self._inverse is not None:
            idf32 = np.float32(idf(self.params.method, self._df(t), int(self.matrix.doc_count)))
            return boosted_scores(vals, idf32, self._inverse[self._norms[rows]], w).astype(np.float64)
        return vals.astype(np.float64) * w

    def _df(self, t: int) -> int:
        return int(self._indptr[t + 1] - self._indptr[t])

    def _column(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Column ``t``'s rows and float32 scores (computed from the term frequencies in layout TF)."""
        rows, vals = self.postings.column(t)
        if self.postings.mode == TF:
            idf32 = np.float32(idf(self.params.method, self._df(t), int(self.matrix.doc_count)))
            vals = term_scores(self.params, idf32, vals, LUCENE_LENGTHS[self._norms[rows]], self.matrix.avg_len)
        return rows, vals

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole score matrix, decoded: (indptr int64, rows int32, float32 scores)."""
        cols = [self._column(t) for t in range(len(self._indptr) - 1)]
        rows = np.concatenate([c[0] for c in cols]).astype(np.int32) if cols else np.zeros(0, np.int32)
        data = np.concatenate([c[1] for c in cols]).astype(np.float32) if cols else np.zeros(0, np.float32)
        return self._indptr.astype(np.int64), rows, data

    def scores(self, query: str) -> np.ndarray | None:
        """BM25 score of every document for ``query`` (None when no query term is in the vocabulary):
        exhaustive, column by column (the reference the kernel's top k is tested against)."""
        ids = self.term_ids(query)
        if not ids:
            return None
        terms, weights = _counts(ids)
        scores = np.zeros(self._num_docs, dtype=np.float64)
        for t, w in zip(terms, weights, strict=True):
            rows, vals = self._column(t)
            scores[rows] += self._weighted(t, w, vals, rows)
        scores = scores.astype(np.float32)
        if self._nonoccurrence is not None:
            scores += self._nonoccurrence[ids].sum()
        return scores

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        pyserini = self.params.tie_break == "pyserini"
        tops = self.top_batch(list(queries), topk, ties=pyserini)
        return [self._hits(rows, scores, topk, pyserini) for rows, scores in tops]

    def top(self, query: str, topk: int, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of the ``topk`` best documents holding a query term (every document
        for bm25l / bm25+, whose scores are shifted), by score then row; exact. ``ties``: also every
        document tied with the ``topk``-th (so that another tie-break can choose among them)."""
        return self.top_batch([query], topk, ties)[0]

    def top_batch(self, queries: list[str], topk: int, ties: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """``top`` of each query: the batch cut into chunks scored by the kernel on ``threads`` threads."""
        none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        if topk <= 0:
            return [none for _ in queries]
        if self._nonoccurrence is not None:  # every document scores: exhaustive
            out = []
            for q in queries:
                full = self.scores(q)
                out.append(none if full is None else _best(np.arange(self._num_docs), full, topk, ties))
            return out
        topk = min(topk, self._num_docs)  # the kernel holds k hits a query
        plans = [self._plan(q) for q in queries]
        n_chunks = min(len(queries), self.threads * self.CHUNKS_PER_THREAD) if self._pool else 1
        bounds = np.linspace(0, len(queries), max(n_chunks, 1) + 1).astype(int)
        chunks = [plans[a:z] for a, z in itertools.pairwise(bounds) if z > a]
        if self._pool is not None and len(chunks) > 1:
            parts = list(self._pool.map(lambda c: self._run_kernel(c, topk, ties), chunks))
        else:
            parts = [self._run_kernel(c, topk, ties) for c in chunks]
        return [t for part in parts for t in part]

    def _plan(self, query: str) -> tuple[np.ndarray, ...]:
        """A query's distinct columns in ascending order of their bounds, with what the kernel needs of
        each: (columns, counts, contribution kinds, boosted idf w, idf, bounds)."""
        ids = self.term_ids(query)
        terms, counts = _counts(ids)
        n = len(terms)
        cols, cnt = np.asarray(terms, np.int64), np.asarray(counts, np.float64)
        kinds, w32, idf32 = np.zeros(n, np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32)
        if n == 0:
            return cols, cnt, kinds, w32, idf32, np.zeros(0, np.float64)
        from_tf = self.postings.mode == TF
        if from_tf or (self._inverse is not None and max(counts) > 1):
            doc_count = int(self.matrix.doc_count)
            for j, (t, c) in enumerate(zip(terms, counts, strict=True)):
                if from_tf or c > 1:
                    idf32[j] = np.float32(idf(self.params.method, self._df(t), doc_count))
                    w32[j] = idf32[j] if c == 1 else np.float32(np.float32(c) * idf32[j])
                    kinds[j] = FORMULA if from_tf else RECOVER
        if not from_tf and self._inverse is None:
            kinds[cnt > 1] = TIMES
        bound = self.postings.col_max[cols].astype(np.float64) * cnt * np.where(cnt > 1, 1 + BOOST_MARGIN, 1)
        order = np.argsort(bound, kind="stable")
        return cols[order], cnt[order], kinds[order], w32[order], idf32[order], bound[order]

    def _run_kernel(self, plans: list[tuple[np.ndarray, ...]], topk: int, ties: bool):
        qptr = np.zeros(len(plans) + 1, np.int64)
        np.cumsum([len(p[0]) for p in plans], out=qptr[1:])
        flat = [np.concatenate([p[j] for p in plans]) for j in range(6)]
        rptr, rows, scores, ok = top_k_batch(qptr, *flat, topk, ties, self._prune, *self._kernel_arrays)
        self.kernel_ready = True
        if not ok:
            raise CorruptIndex("the BM25 index is corrupt (a block of postings cannot be decoded); rebuild it "
                               "with `searchr1 index build`")  # fmt: skip
        return [(rows[rptr[q] : rptr[q + 1]], scores[rptr[q] : rptr[q + 1]]) for q in range(len(plans))]

    def _hits(self, rows: np.ndarray, scores: np.ndarray, topk: int, pyserini: bool) -> list[Hit]:
        keep = scores > 0.0
        rows, scores = rows[keep], scores[keep]
        if pyserini:
            rows, values = self._pyserini_order(rows, scores, topk)
        else:
            values = scores.tolist()
        found = self.docs.many_with_wire(rows.tolist())
        return [Hit(d.id, d.title, d.text, s, wire) for (d, wire), s in zip(found, values, strict=True)]

    def _pyserini_order(self, rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, list[float]]:
        """Anserini's hits (``rows`` by score, with every row tied with the k-th): Lucene collects the
        ``k`` best by float32 score, ties by passage id as text, in that order; Anserini's score-ties
        adjuster then reports each score rounded to 4 decimals, ``r = round(score x 10000) / 10000``, and
        lowers it by ``j x 1e-6`` where it is the j-th of a run of hits whose rounded scores differ from
        the one before by less than 1e-4 in float32 (equal ones, and neighbours such as 0.4930 / 0.4929
        whose float32 difference falls below 1e-4). Checked against pyserini 1.6.0 on 344 rankings."""
        if len(rows) > k or (len(rows) > 1 and np.any(scores[1:] == scores[:-1])):
            first = np.lexsort((self._id_order(rows), -scores))[:k]
            rows, scores = rows[first], scores[first]
        return rows, anserini_scores(scores.tolist())

    def _id_order(self, rows: np.ndarray) -> np.ndarray:
        """Sort keys of the rows' passage ids in text order: the stored ``id_sort_keys``; the ids
        themselves only where two of the keys are equal (ids sharing their first 8 bytes) or the index
        has no keys (earlier versions)."""
        if self._id_keys is not None:
            keys = self._id_keys[rows]
            if len(np.unique(keys)) == len(keys):
                return keys
        ids = [self.docs.doc_id(int(r)) for r in rows]
        rank = np.empty(len(rows), dtype=np.int64)
        rank[sorted(range(len(rows)), key=ids.__getitem__)] = np.arange(len(rows))
        return rank

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.docs.close()


_F32 = struct.Struct("f")
_NEAR = _F32.unpack(_F32.pack(1e-4))[0]
"""Anserini's 1e-4 as float32."""


def _float32(x: float) -> float:
    """``x`` rounded to the nearest float32 (as ``numpy.float32(x)``), as a Python float."""
    return _F32.unpack(_F32.pack(x))[0]


def _round(x: float, decimals: int) -> float:
    """``numpy.round(x, decimals)`` for a float64: ``rint(x 10^d) / 10^d`` (half to even), which Python's
    ``round(x, d)`` (correctly rounded in decimal) is not in every case."""
    scale = 10.0**decimals
    return round(x * scale) / scale


def anserini_scores(scores: list[float]) -> list[float]:
    """Anserini's reported scores of hits in rank order (``scores``: float32 values): each rounded to 4
    decimals in float32, ``r = float32(floor(s 10^4 + 0.5) / 10^4)``, then lowered by ``j x 1e-6`` where it
    is the j-th of a run whose rounded scores differ from the one before by less than 1e-4 in float32.
    In plain Python: a query has a handful of hits, and numpy's per-call costs made it 29 us a call against 8
    (three hits, measured on this project's 2-core machine)."""
    rounded = [_float32(math.floor(s * 10000 + 0.5) / 10000) for s in scores]
    out, run = [], 0
    for i, r in enumerate(rounded):
        run = run + 1 if i and _float32(abs(r - rounded[i - 1])) < _NEAR else 0
        out.append(_round(_round(r, 4) - 1e-6 * run, 6) if run else _round(r, 4))
    return out


def _counts(ids: list[int]) -> tuple[list[int], list[int]]:
    """The distinct column ids, ascending, and how often each occurs."""
    counts: dict[int, int] = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    terms = sorted(counts)
    return terms, [counts[t] for t in terms]


def _best(rows: np.ndarray, scores: np.ndarray, k: int, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (row, score) pairs, by score descending then row ascending (``ties``: and every
    pair tied with the k-th)."""
    if len(rows) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth  # ties at the k-th score all stay, the row order settles them
        rows, scores = rows[keep], scores[keep]
    order = np.lexsort((rows, -scores))
    if not ties:
        order = order[:k]
    return rows[order], scores[order]
