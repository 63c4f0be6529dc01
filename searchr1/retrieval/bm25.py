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
few columns and a top-k; a query term repeated n times counts n times (as Anserini's bag-of-words
query boosts it).

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
(the terms, one per line in column order, for people), ``params.index.json``, ``tokenizer.json``
(the settings). Columns are in the order of the terms' hashes (``bm25_build``). Folders written by
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
    INDICES_FILE,
    INDPTR_FILE,
    LEGACY_VOCAB_FILE,
    LUCENE_LENGTHS,
    METHODS,
    NONOCCURRENCE_FILE,
    NONOCCURRENCE_METHODS,
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
    doc_length_values,
    hash_terms,
    idf,
    idf_array,
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
        if isinstance(self.vocab, DictVocabulary):
            terms = sorted(self.vocab.vocab, key=self.vocab.vocab.__getitem__)
        else:
            terms = self.vocab.terms()
        salt = write_vocabulary(out, terms)
        write_params(out, self.params, m.num_docs, len(terms), salt)

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

    def scores(self, query: str) -> np.ndarray | None:
        """BM25 score of every document for ``query`` (None when no query term is in the vocabulary)."""
        ids = self.term_ids(query)
        if not ids:
            return None
        starts, ends = self._indptr[ids], self._indptr[np.asarray(ids) + 1]
        idx = np.concatenate([self._indices[s:e] for s, e in zip(starts, ends, strict=True)])
        val = np.concatenate([self._data[s:e] for s, e in zip(starts, ends, strict=True)])
        scores = np.bincount(idx, weights=val, minlength=self._num_docs).astype(np.float32)
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
        terms, weights = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
        postings = int((self._indptr[terms + 1] - self._indptr[terms]).sum())
        if self._nonoccurrence is not None or topk >= self._num_docs:
            return _best(np.arange(self._num_docs), self.scores(query), topk, ties)
        if not self._prune or postings < self.PROBE_BELOW:
            return self._top_sorted(terms, weights, topk, ties)
        return self._top_maxscore(terms, weights, topk, ties)

    def _column(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = int(self._indptr[t]), int(self._indptr[t + 1])
        return self._indices[s:e], self._data[s:e]

    def _top_sorted(
        self, terms: np.ndarray, weights: np.ndarray, k: int, ties: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every posting of the query's columns, summed per document through a sort."""
        cols = [self._column(int(t)) for t in terms]
        idx = np.concatenate([c[0] for c in cols])
        val = np.concatenate([c[1].astype(np.float64) * w for c, w in zip(cols, weights, strict=True)])
        rows, inverse = np.unique(idx, return_inverse=True)
        sums = np.bincount(inverse, weights=val, minlength=len(rows)).astype(np.float32)
        return _best(rows, sums, k, ties)

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
            score[hit] += vals[pos[hit]].astype(np.float64) * float(w)

    def _best_of_column(self, t: int) -> np.ndarray:
        """Rows of the ``SEEDS`` highest scores of column ``t``."""
        rows, vals = self._column(t)
        if len(rows) <= self.SEEDS:
            return np.asarray(rows)
        return np.asarray(rows[np.argpartition(-vals, self.SEEDS - 1)[: self.SEEDS]])

    def _top_maxscore(
        self, terms: np.ndarray, weights: np.ndarray, k: int, ties: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """MaxScore (see the module docstring). The threshold starts from the full scores of the best
        documents of the columns with the largest bounds (found by probing every column), so the
        long low-IDF columns are usually never scanned, only probed for the few candidates left."""
        bound = self.matrix.column_max()[terms].astype(np.float64) * weights
        order = np.argsort(-bound, kind="stable")
        terms, weights, bound = terms[order], weights[order].astype(np.float64), bound[order]
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
        acc = self._accumulator()
        found: list[np.ndarray] = []
        i = 0
        try:
            while i < len(order) and not rest[i] * (1 + 1e-9) < theta:
                rows, vals = self._column(int(terms[i]))
                before = acc[rows]
                found.append(rows[before == 0.0])
                acc[rows] = before + (vals if weights[i] == 1.0 else vals.astype(np.float64) * weights[i])
                i += 1
            cand = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
            score = acc[cand]
        finally:
            for f in found:
                acc[f] = 0.0
        # the columns left, probed one by one for the candidates that can still reach theta (which
        # rises as their scores fill in, so fewer candidates reach the longer columns that come last)
        for j in range(i, len(order)):
            keep = score + rest[j] * (1 + 1e-9) >= theta
            cand, score = cand[keep], score[keep]
            self._probe(cand, score, terms[j : j + 1], weights[j : j + 1])
            if len(score) > k and j + 1 < len(order) and len(score) > 64:
                theta = max(theta, float(np.partition(score, len(score) - k)[len(score) - k]))
        return _best(cand, score.astype(np.float32), k, ties)

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
        """Anserini's order of hits: by score, ties by passage id (as text, ascending); the scores are
        reported rounded to 4 decimals (as pyserini reports them)."""
        if len(rows) > k or (len(rows) > 1 and np.any(scores[1:] == scores[:-1])):
            ids = [self.docs.doc_id(int(r)) for r in rows]
            order = sorted(range(len(rows)), key=lambda i: (-float(scores[i]), ids[i]))[:k]
            rows, scores = rows[order], scores[order]
        return rows, np.round(scores.astype(np.float64), 4)

    def close(self) -> None:
        self.docs.close()


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
