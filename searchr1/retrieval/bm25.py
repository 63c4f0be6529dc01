"""BM25 lexical search over a precomputed sparse score matrix, in memory or memory-mapped from disk.

BM25 (Robertson & Zaragoza, 2009, "The Probabilistic Relevance Framework: BM25 and Beyond"):

    score(q, d) = sum_{t in q} IDF(t) * tf(t,d) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

in the Lucene variant (the default; Lucene drops the constant (k1 + 1) factor of Robertson's form) with
``IDF(t) = log(1 + (N - df + 0.5) / (df + 0.5))``. ``method``: lucene | robertson | atire | bm25l | bm25+,
as in bm25s (Lù 2024, arXiv:2407.03618; the variants as in Kamphuis et al., ECIR 2020).

The defaults are Search-R1's retriever, pyserini's ``LuceneSearcher`` (preset ``pyserini``): k1 0.9,
b 0.4, Lucene's English analyzer (``retrieval.analysis``), and |d| as Lucene stores it, in one byte
(``lucene_norm``), with Lucene's float32 arithmetic (``term_scores``), so rankings match Lucene's. The
settings of earlier versions are preset ``bm25s`` (k1 1.5, b 0.75, a regex tokenizer, a Snowball
stemmer, exact lengths). Every (term, doc) score is precomputed into a sparse column matrix (CSC:
column t lists the documents holding term t, ascending, with their scores), so a query is a sum of a
few columns and a top-k; a query term repeated n times is one clause boosted by n, as Anserini's
bag-of-words query builds it (``bm25_index.boosted_scores``: ``w - w / (1 + tf inv)`` with
``w = float32(n idf)``).

Top-k is exact and, for the lucene variant, pruned in the manner of MaxScore (Turtle & Flood, 1995,
"Query evaluation: strategies and optimizations"): columns are taken in decreasing order of their
largest score; once the largest scores of the columns not yet taken sum to less than the k-th best
partial score, no document outside the columns taken can enter the top k, and the remaining (long,
low-IDF) columns are only probed for the candidates found so far (binary search), never scanned.

    bm25 = BM25Retriever.from_documents(docs)              # in process, nothing written
    bm25.search(["who founded Acme"], topk=3)

On disk (``folder/bm25``): ``data.csc.index.npy`` / ``indices.csc.index.npy`` / ``indptr.csc.index.npy``
(bm25s's names), ``term_max.npy`` (each column's largest score), ``vocab.hash.npy`` + ``vocab.ids.npy``
(sorted 64-bit hashes of the terms and their column ids: a term is found by binary search in a memory
map, so serving 10M terms costs neither a dictionary in memory nor seconds of loading), ``vocab.txt``
(the terms, one per line in column order, for people), ``norms.npy`` (Lucene's one-byte norm a
passage: a repeated query term scored as Anserini does), ``id_keys.npy`` (8 bytes a passage: the ids'
text order, for Anserini's order of tied hits), ``params.index.json`` (with N and avgdl),
``tokenizer.json`` (the settings). Columns are in the order of the terms' hashes (``bm25_build``). Folders written by
earlier versions (bm25s's ``vocab.index.json``; no ``analyzer`` setting) still load.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from searchr1.retrieval.base import Hit, Retriever
from searchr1.retrieval.bm25_build import build_matrix
from searchr1.retrieval.bm25_index import (
    BM25_DIR,
    DATA_FILE,
    DOC_LENGTHS,
    ID_KEYS_FILE,
    INDICES_FILE,
    INDPTR_FILE,
    LEGACY_VOCAB_FILE,
    LUCENE_LENGTHS,
    METHODS,
    NONOCCURRENCE_FILE,
    NONOCCURRENCE_METHODS,
    NORMS_FILE,
    PARAMS_FILE,
    PRESETS,
    TERM_MAX_FILE,
    TOKENIZER_FILE,
    VOCAB_HASH_FILE,
    VOCAB_IDS_FILE,
    VOCAB_TEXT_FILE,
    BM25Params,
    DictVocabulary,
    HashedVocabulary,
    ScoreMatrix,
    boosted_scores,
    doc_length_values,
    hash_terms,
    idf,
    idf_array,
    inverse_norms,
    load_matrix,
    lucene_length,
    lucene_norm,
    term_hash,
    term_scores,
    tf_component,
    write_params,
    write_vocabulary,
)
from searchr1.retrieval.corpus import Document, read_corpus
from searchr1.retrieval.docstore import DocStore

__all__ = [
    "BM25_DIR",
    "DATA_FILE",
    "DOC_LENGTHS",
    "INDICES_FILE",
    "INDPTR_FILE",
    "LEGACY_VOCAB_FILE",
    "LUCENE_LENGTHS",
    "METHODS",
    "NONOCCURRENCE_FILE",
    "NONOCCURRENCE_METHODS",
    "PARAMS_FILE",
    "PRESETS",
    "TERM_MAX_FILE",
    "TOKENIZER_FILE",
    "VOCAB_HASH_FILE",
    "VOCAB_IDS_FILE",
    "VOCAB_TEXT_FILE",
    "BM25Params",
    "BM25Retriever",
    "DictVocabulary",
    "HashedVocabulary",
    "ScoreMatrix",
    "doc_length_values",
    "hash_terms",
    "idf",
    "idf_array",
    "load_matrix",
    "lucene_length",
    "lucene_norm",
    "term_hash",
    "term_scores",
    "tf_component",
    "write_params",
    "write_vocabulary",
]


# -- search -------------------------------------------------------------------------------------------


class BM25Retriever(Retriever):
    """BM25 over a score matrix, a vocabulary and a document store."""

    name = "bm25"
    PROBE_BELOW = 4096
    """Queries whose columns hold fewer postings than this are scored exhaustively (a sort is cheaper)."""
    SEEDS, SEED_COLUMNS = 64, 3
    """Best documents of each of the first columns whose full scores set MaxScore's first threshold."""
    SEED_CACHE_DF = 4096
    """Columns longer than this keep their ``SEEDS`` best rows once found (at most 512 bytes a column)."""
    DENSE_SCAN = 16
    """The scanned columns are summed in a per-passage accumulator when they hold more than 1 / this of
    the corpus (allocated then, 8 bytes a passage, kept by the thread); else through a sort."""

    def __init__(self, matrix: ScoreMatrix, vocab, docs: DocStore, params: BM25Params):
        self.matrix = matrix
        self.vocab = vocab
        self.docs = docs
        self.params = params
        self.analyzer = params.make_analyzer()
        # plain ndarray views of memory maps: slicing a numpy.memmap costs a Python call per slice
        self._data, self._indices = np.asarray(matrix.data), np.asarray(matrix.indices)
        self._indptr = np.asarray(matrix.indptr)
        self._num_docs = matrix.num_docs
        self._nonoccurrence = matrix.nonoccurrence
        self._prune = params.method == "lucene"  # every stored score > 0: partial sums only grow
        self._id_keys = None if matrix.id_keys is None else np.asarray(matrix.id_keys)
        self._norms = None if matrix.norms is None else np.asarray(matrix.norms)
        self._inverse = None
        anserini = (params.method, params.doc_length) == ("lucene", "lucene")
        if anserini and self._norms is not None and matrix.avg_len is not None and matrix.doc_count is not None:
            self._inverse = inverse_norms(params.k1, params.b, matrix.avg_len)
        self._seeds: dict[int, np.ndarray] = {}
        self._local = threading.local()

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
        return cls(matrix, DictVocabulary({t: i for i, t in enumerate(terms)}), store, params)

    @classmethod
    def from_corpus(cls, path: str | Path, chunk_size: int | None = None, overlap: int = 0, **overrides):
        """Index a jsonl corpus file in memory."""
        return cls.from_documents(read_corpus(path, chunk_size, overlap), **overrides)

    def save(self, folder: str | Path) -> None:
        """Write the score matrix, vocabulary and settings under ``folder/bm25`` (docs go elsewhere)."""
        out = Path(folder) / BM25_DIR
        out.mkdir(parents=True, exist_ok=True)
        m = self.matrix
        np.save(out / DATA_FILE, np.asarray(m.data, dtype=np.float32))
        np.save(out / INDICES_FILE, np.asarray(m.indices, dtype=np.int32))
        np.save(out / INDPTR_FILE, np.asarray(m.indptr, dtype=np.int64))
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
    def load(cls, folder: str | Path, docs: DocStore, mmap: bool = True) -> BM25Retriever:
        """Open ``folder/bm25``; with ``mmap`` the score arrays stay on disk (page cache, not RSS)."""
        src = Path(folder) / BM25_DIR
        saved = json.loads((src / TOKENIZER_FILE).read_text())
        params = BM25Params.from_saved(saved)
        matrix, vocab, meta = load_matrix(src, mmap=mmap)
        if "delta" not in saved and "delta" in meta:
            params.delta = float(meta["delta"])
        return cls(matrix, vocab, docs, params)

    # -- search -----------------------------------------------------------------------------------

    def term_ids(self, query: str) -> list[int]:
        """Column ids of the query's terms (repeated terms repeated, unknown ones dropped)."""
        return self.vocab.lookup(self.analyzer(query))

    def _weighted(self, t: int, w: float, vals: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """float64 scores of column ``t``'s postings ``rows`` (stored scores ``vals``) for a term that
        occurs ``w`` times in the query: as Anserini scores it (one clause boosted by the count,
        ``bm25_index.boosted_scores``) with Lucene's settings and norms, else ``w`` x the score."""
        if w == 1:
            return vals.astype(np.float64)
        if self._inverse is not None:
            df = int(self._indptr[t + 1] - self._indptr[t])
            idf32 = np.float32(idf(self.params.method, df, int(self.matrix.doc_count)))
            return boosted_scores(vals, idf32, self._inverse[self._norms[rows]], w).astype(np.float64)
        return vals.astype(np.float64) * w

    def scores(self, query: str) -> np.ndarray | None:
        """BM25 score of every document for ``query`` (None when no query term is in the vocabulary)."""
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
        return [self._search_one(q, topk) for q in queries]

    def top(self, query: str, topk: int, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of the ``topk`` best documents holding a query term (every document
        for bm25l / bm25+, whose scores are shifted), by score then row; exact. ``ties``: also every
        document tied with the ``topk``-th (so that another tie-break can choose among them)."""
        ids = self.term_ids(query)
        if not ids or topk <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        terms, weights = _counts(ids)
        postings = sum(int(self._indptr[t + 1] - self._indptr[t]) for t in terms)
        if self._nonoccurrence is not None or topk >= self._num_docs:
            return _best(np.arange(self._num_docs), self.scores(query), topk, ties)
        if not self._prune or postings < self.PROBE_BELOW:
            return self._top_sorted(terms, weights, topk, ties)
        return self._top_maxscore(np.asarray(terms), np.asarray(weights, dtype=np.float64), topk, ties)

    def _column(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = int(self._indptr[t]), int(self._indptr[t + 1])
        return self._indices[s:e], self._data[s:e]

    def _top_sorted(
        self, terms: list[int], weights: list[int], k: int, ties: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every posting of the query's columns, summed per document through a sort."""
        cols = [self._column(t) for t in terms]
        if len(cols) == 1:
            (rows, vals), t, w = cols[0], terms[0], weights[0]
            return _best(rows, self._weighted(t, w, vals, rows).astype(np.float32), k, ties)
        rows, sums = _sum_by_row(
            [c[0] for c in cols], [self._weighted(t, w, c[1], c[0]) for c, t, w in zip(cols, terms, weights, strict=True)]
        )
        return _best(rows, sums.astype(np.float32), k, ties)

    def _accumulator(self) -> np.ndarray:
        """A zeroed float64 score per document, one per thread, reused by every query (zeroed after)."""
        acc = getattr(self._local, "acc", None)
        if acc is None:
            acc = self._local.acc = np.zeros(self._num_docs, dtype=np.float64)
        return acc

    def _probe(self, cand: np.ndarray, score: np.ndarray, columns, weights) -> None:
        """Add to ``score`` (float64, per candidate row) each column's score of the candidates,
        found by binary search in the column's ascending rows."""
        for t, w in zip(columns, weights, strict=True):
            rows, vals = self._column(int(t))
            if len(rows) == 0 or len(cand) == 0:
                continue
            pos = np.minimum(np.searchsorted(rows, cand), len(rows) - 1)
            hit = rows[pos] == cand
            at = pos[hit]
            score[hit] += self._weighted(int(t), float(w), vals[at], rows[at])

    def _best_of_column(self, t: int) -> np.ndarray:
        """Rows of the ``SEEDS`` highest scores of column ``t`` (kept for a column longer than
        ``SEED_CACHE_DF``: the same for every query, found once)."""
        found = self._seeds.get(t)
        if found is not None:
            return found
        rows, vals = self._column(t)
        if len(rows) <= self.SEEDS:
            return np.asarray(rows)
        best = np.asarray(rows[np.argpartition(-vals, self.SEEDS - 1)[: self.SEEDS]])
        if len(rows) > self.SEED_CACHE_DF:
            self._seeds[t] = best
        return best

    def _top_maxscore(
        self, terms: np.ndarray, weights: np.ndarray, k: int, ties: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """MaxScore (see the module docstring). The threshold starts from the full scores of the best
        documents of the columns with the largest bounds (found by probing every column), so the
        long low-IDF columns are usually never scanned, only probed for the few candidates left."""
        # bounds a little above w x the column's largest score: a repeated term's score is rounded apart
        bound = self.matrix.column_max()[terms].astype(np.float64) * weights * np.where(weights > 1, 1 + 1e-6, 1)
        order = np.argsort(-bound, kind="stable")
        terms, weights, bound = terms[order], weights[order], bound[order]
        rest = np.concatenate([np.cumsum(bound[::-1])[::-1], [0.0]])  # rest[i] = sum of bounds i..
        # a lower bound on the k-th best score: full scores of the best documents of the first columns
        seed_rows = np.unique(
            np.concatenate([self._best_of_column(int(t)) for t in terms[: self.SEED_COLUMNS]])
        )
        seed_score = np.zeros(len(seed_rows), dtype=np.float64)
        self._probe(seed_rows, seed_score, terms, weights)
        theta = (
            float(np.partition(seed_score, len(seed_score) - k)[len(seed_score) - k])
            if len(seed_score) >= k
            else 0.0
        )
        i = 0
        while i < len(order) and not rest[i] * (1 + 1e-9) < theta:
            i += 1
        scanned = [self._column(int(t)) for t in terms[:i]]
        values = [self._weighted(int(t), w, c[1], c[0]) for c, t, w in zip(scanned, terms, weights, strict=False)]
        if sum(len(c[0]) for c in scanned) * self.DENSE_SCAN > self._num_docs:
            cand, score = self._sum_dense([c[0] for c in scanned], values)
        else:
            cand, score = _sum_by_row([c[0] for c in scanned], values)
        # the columns left, probed one by one for the candidates that can still reach theta (which
        # rises as their scores fill in, so fewer candidates reach the longer columns that come last)
        for j in range(i, len(order)):
            keep = score + rest[j] * (1 + 1e-9) >= theta
            cand, score = cand[keep], score[keep]
            self._probe(cand, score, terms[j : j + 1], weights[j : j + 1])
            if len(score) > k and j + 1 < len(order) and len(score) > 64:
                theta = max(theta, float(np.partition(score, len(score) - k)[len(score) - k]))
        return _best(cand, score.astype(np.float32), k, ties)

    def _sum_dense(self, rows: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``_sum_by_row`` through the thread's per-passage accumulator (long scans)."""
        acc = self._accumulator()
        found: list[np.ndarray] = []
        try:
            for r, v in zip(rows, values, strict=True):
                before = acc[r]
                found.append(r[before == 0.0])
                acc[r] = before + v
            cand = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
            return cand, acc[cand]
        finally:
            for f in found:
                acc[f] = 0.0

    def _search_one(self, query: str, topk: int) -> list[Hit]:
        pyserini = self.params.tie_break == "pyserini"
        rows, scores = self.top(query, topk, ties=pyserini)
        keep = scores > 0.0
        rows, scores = rows[keep], scores[keep]
        if pyserini:
            rows, scores = self._pyserini_order(rows, scores, topk)
        hits = []
        for row, score in zip(rows, scores, strict=True):
            doc = self.docs[int(row)]
            hits.append(Hit(doc.id, doc.title, doc.text, float(score)))
        return hits

    def _pyserini_order(self, rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Anserini's hits (``rows`` by score, with every row tied with the k-th): Lucene collects the
        ``k`` best by float32 score, ties by passage id as text, in that order; Anserini's score-ties
        adjuster then reports each score rounded to 4 decimals, ``r = round(score x 10000) / 10000``, and
        lowers it by ``j x 1e-6`` where it is the j-th of a run of hits whose rounded scores differ from
        the one before by less than 1e-4 in float32 (equal ones, and neighbours such as 0.4930 / 0.4929
        whose float32 difference falls below 1e-4). Checked against pyserini 1.6.0 on 344 rankings."""
        if len(rows) > k or (len(rows) > 1 and np.any(scores[1:] == scores[:-1])):
            first = np.lexsort((self._id_order(rows), -scores))[:k]
            rows, scores = rows[first], scores[first]
        f32 = np.float32
        rounded = (np.floor(scores.astype(np.float64) * 10000 + 0.5) / 10000).astype(f32)
        near = np.abs(rounded[1:] - rounded[:-1]) < f32(1e-4)
        if not near.any():
            return rows, np.round(rounded.astype(np.float64), 4)
        run = np.zeros(len(rows), dtype=np.int64)  # j: the hit's place in its run
        for i in range(1, len(rows)):
            run[i] = run[i - 1] + 1 if near[i - 1] else 0
        return rows, np.round(np.round(rounded.astype(np.float64), 4) - 1e-6 * run, 6)

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
        self.docs.close()


def _counts(ids: list[int]) -> tuple[list[int], list[int]]:
    """The distinct column ids, ascending, and how often each occurs."""
    counts: dict[int, int] = {}
    for i in ids:
        counts[i] = counts.get(i, 0) + 1
    terms = sorted(counts)
    return terms, [counts[t] for t in terms]


def _sum_by_row(rows: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(distinct rows ascending, float64 sum of their values) of several columns, each with ascending
    rows: one stable sort of the concatenation (a merge of sorted runs), then a sum per row."""
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    r = np.concatenate(rows)
    v = np.concatenate(values)
    if len(rows) > 1:
        order = np.argsort(r, kind="stable")
        r, v = r[order], v[order]
    if len(r) == 0:
        return r, v
    first = np.ones(len(r), dtype=bool)
    np.not_equal(r[1:], r[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return r[starts], np.add.reduceat(v, starts)


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
