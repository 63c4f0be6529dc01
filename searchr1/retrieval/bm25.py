"""BM25 lexical search over a precomputed sparse score matrix, in memory or memory-mapped from disk.

BM25 (Robertson & Zaragoza, 2009, "The Probabilistic Relevance Framework: BM25 and Beyond"):

    score(q, d) = sum_{t in q} IDF(t) * tf(t,d) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

in the Lucene variant (the default; Lucene drops the constant (k1 + 1) factor of Robertson's form) with
``IDF(t) = log(1 + (N - df + 0.5) / (df + 0.5))``. ``method``: lucene | robertson | atire | bm25l | bm25+,
as in bm25s (Lù 2024, arXiv:2407.03618; the variants as in Kamphuis et al., ECIR 2020). Every
(term, doc) score is precomputed into a sparse column matrix (CSC: column t lists the documents holding
term t, ascending, with their scores), so a query is a sum of a few columns and a top-k.

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
(the terms, one per line in column order, for people), ``params.index.json``, ``tokenizer.json``.
Folders written by earlier versions (bm25s's ``vocab.index.json``) still load.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from searchr1.retrieval.base import Hit, Retriever
from searchr1.retrieval.corpus import Document, read_corpus
from searchr1.retrieval.docstore import DocStore

BM25_DIR = "bm25"
TOKENIZER_FILE = "tokenizer.json"
PARAMS_FILE = "params.index.json"
DATA_FILE, INDICES_FILE, INDPTR_FILE = "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"
NONOCCURRENCE_FILE = "nonoccurrence_array.index.npy"
TERM_MAX_FILE = "term_max.npy"
VOCAB_HASH_FILE, VOCAB_IDS_FILE, VOCAB_TEXT_FILE = "vocab.hash.npy", "vocab.ids.npy", "vocab.txt"
LEGACY_VOCAB_FILE = "vocab.index.json"
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
NONOCCURRENCE_METHODS = ("bm25l", "bm25+")
_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")


@dataclass
class BM25Params:
    """Scoring and tokenisation options (saved with the index)."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    stemmer: str | None = "english"
    """PyStemmer language (None: no stemming)."""
    stopwords: str | None = "en"
    """bm25s stop-word list name (en, de, fr, ...; None: keep every word)."""
    delta: float = 0.5
    """The lower bound delta of bm25l and bm25+ (ignored by the other methods)."""

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown BM25 method {self.method!r}; choose one of {', '.join(METHODS)}")


# -- the formulas (as bm25s computes them, so a streamed build equals bm25s's) ---------------------


def idf(method: str, df: int, n: int) -> float:
    """Inverse document frequency of a term in ``df`` of ``n`` documents:
    lucene ``log(1 + (n - df + .5) / (df + .5))``, robertson ``log(max(1, (n - df + .5) / (df + .5)))``,
    atire ``log(n / df)``, bm25l ``log((n + 1) / (df + .5))``, bm25+ ``log((n + 1) / df)``."""
    if method == "lucene":
        return math.log(1 + (n - df + 0.5) / (df + 0.5))
    if method == "robertson":
        return math.log(max(1.0, (n - df + 0.5) / (df + 0.5)))
    if method == "atire":
        return math.log(n / df)
    if method == "bm25l":
        return math.log((n + 1) / (df + 0.5))
    if method == "bm25+":
        return math.log((n + 1) / df)
    raise ValueError(f"unknown BM25 method {method!r}")


def tf_component(method: str, tf, doc_len, avg_len: float, k1: float, b: float, delta: float):
    """The term-frequency factor (float64), with ``L = 1 - b + b * |d| / avgdl``:
    lucene / robertson ``tf / (k1 L + tf)``, atire ``tf (k1 + 1) / (tf + k1 L)``,
    bm25l ``(k1 + 1)(c + delta) / (k1 + c + delta)`` with ``c = tf / L``, bm25+ ``(k1 + 1) tf / (k1 L + tf) + delta``."""
    tf = np.asarray(tf, dtype=np.float64)
    norm = (1 - b) + b * np.asarray(doc_len, dtype=np.float64) / np.float64(avg_len)
    if method in ("lucene", "robertson"):
        return tf / (k1 * norm + tf)
    if method == "atire":
        return (tf * (k1 + 1)) / (tf + k1 * norm)
    if method == "bm25l":
        c = tf / norm
        return ((k1 + 1) * (c + delta)) / (k1 + c + delta)
    if method == "bm25+":
        return ((k1 + 1) * tf) / (k1 * norm + tf) + delta
    raise ValueError(f"unknown BM25 method {method!r}")


def idf_array(method: str, df: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 IDF per term as stored with the scores, float64 IDF); terms with df 0 get 0."""
    values, inverse = np.unique(df, return_inverse=True)
    exact = np.array([idf(method, int(v), n) if v > 0 else 0.0 for v in values], dtype=np.float64)
    return exact.astype(np.float32)[inverse], exact[inverse]


# -- tokens and the vocabulary ----------------------------------------------------------------------


class Tokenizer:
    """Lower-case word tokens (two or more word characters), minus stop words, stemmed (memoised)."""

    def __init__(self, stemmer: str | None = "english", stopwords: str | None = "en"):
        from bm25s.tokenization import _infer_stopwords

        self.stopwords = frozenset(_infer_stopwords(stopwords)) if stopwords else frozenset()
        if stemmer:
            import Stemmer

            try:
                self._stemmer = Stemmer.Stemmer(stemmer)
            except KeyError:
                raise ValueError(
                    f"unknown stemmer language {stemmer!r}; known: {', '.join(Stemmer.algorithms())}"
                ) from None
        else:
            self._stemmer = None
        self._cache: dict[str, str] = {}

    def words(self, text: str) -> list[str]:
        """The raw word tokens of ``text``, lower-cased (stop words and stems not applied yet)."""
        return _TOKEN_RE.findall(text.lower())

    def stem(self, word: str) -> str:
        return word if self._stemmer is None else self._stemmer.stemWord(word)

    def __call__(self, text: str) -> list[str]:
        words = [w for w in self.words(text) if w not in self.stopwords]
        if self._stemmer is None:
            return words
        cache = self._cache
        out = []
        for w in words:
            s = cache.get(w)
            if s is None:
                s = self._stemmer.stemWord(w)
                if len(cache) < 1_000_000:
                    cache[w] = s
            out.append(s)
        return out


def term_hash(term: str, salt: int = 0) -> int:
    """A stable 64-bit hash of a term (BLAKE2b, 8 bytes); ``salt`` changes it if two terms collide."""
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=8, salt=salt.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little")


def hash_terms(terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted hashes, the column id of each, salt): the first salt under which no two terms collide."""
    for salt in range(16):
        hashes = np.fromiter((term_hash(t, salt) for t in terms), dtype=np.uint64, count=len(terms))
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        if len(hashes) < 2 or not np.any(hashes[1:] == hashes[:-1]):
            return hashes, order.astype(np.uint32), salt
    raise ValueError("cannot hash the vocabulary without collisions")  # 16 salts in a row: never


class DictVocabulary:
    """Term -> column id in a dictionary (in-memory indexes and folders written by bm25s)."""

    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.vocab)

    def lookup(self, terms: Iterable[str]) -> list[int]:
        """Column ids of the terms in the vocabulary (unknown terms dropped)."""
        v = self.vocab
        return [v[t] for t in terms if t in v]


class HashedVocabulary:
    """Term -> column id by binary search among sorted 64-bit term hashes (memory-mapped)."""

    def __init__(self, hashes: np.ndarray, ids: np.ndarray, salt: int, terms_file: Path | None = None):
        self.hashes, self.ids, self.salt = hashes, ids, salt
        self.terms_file = terms_file
        """``vocab.txt``: the terms themselves, in column order (read only to save a copy)."""

    def terms(self) -> list[str]:
        if self.terms_file is None:
            raise ValueError("this vocabulary has no terms file")
        return self.terms_file.read_text(encoding="utf-8").splitlines()

    def __len__(self) -> int:
        return len(self.hashes)

    def lookup(self, terms: Iterable[str]) -> list[int]:
        h = np.fromiter((term_hash(t, self.salt) for t in terms), dtype=np.uint64)
        if len(h) == 0 or len(self.hashes) == 0:
            return []
        pos = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
        found = self.hashes[pos] == h
        return [int(i) for i in self.ids[pos[found]]]


# -- the score matrix on disk -------------------------------------------------------------------------


@dataclass
class ScoreMatrix:
    """BM25 scores in CSC form: column t = the documents ``indices[indptr[t]:indptr[t+1]]`` (ascending)
    holding term t, with their scores ``data[...]``; ``term_max[t]`` is the column's largest score."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    num_docs: int
    nonoccurrence: np.ndarray | None = None
    """bm25l / bm25+: each term's score in a document without it (added to every document)."""
    term_max: np.ndarray | None = None

    def column_max(self) -> np.ndarray:
        """Largest score per column (0 for an empty one), computed once when not stored."""
        if self.term_max is None:
            starts, ends = np.asarray(self.indptr[:-1]), np.asarray(self.indptr[1:])
            out = np.zeros(len(starts), dtype=np.float32)
            nonempty = ends > starts
            if self.data.size:
                out[nonempty] = np.maximum.reduceat(np.asarray(self.data), starts[nonempty])
            self.term_max = out
        return self.term_max


def write_params(
    out: Path, params: BM25Params, num_docs: int, vocab_terms: Sequence[str] | None, vocab_salt: int
) -> None:
    """``params.index.json`` (bm25s's keys plus the vocabulary hash salt) and ``tokenizer.json``."""
    meta = {
        "k1": params.k1, "b": params.b, "delta": params.delta, "method": params.method,
        "idf_method": params.method, "dtype": "float32", "int_dtype": "int32", "num_docs": num_docs,
        "vocab_salt": vocab_salt, "vocab_size": len(vocab_terms) if vocab_terms is not None else None,
    }  # fmt: skip
    (out / PARAMS_FILE).write_text(json.dumps(meta, indent=2))
    (out / TOKENIZER_FILE).write_text(json.dumps(asdict(params), indent=2))


def write_vocabulary(out: Path, terms: Sequence[str]) -> int:
    """The hashed vocabulary and ``vocab.txt``; returns the hash salt."""
    hashes, ids, salt = hash_terms(terms)
    np.save(out / VOCAB_HASH_FILE, hashes)
    np.save(out / VOCAB_IDS_FILE, ids)
    with (out / VOCAB_TEXT_FILE).open("w", encoding="utf-8") as fh:
        for t in terms:
            fh.write(t + "\n")
    return salt


def load_matrix(src: Path, mmap: bool = True) -> tuple[ScoreMatrix, object, dict]:
    """(score matrix, vocabulary, params.index.json) of a ``bm25`` folder."""
    mode = "r" if mmap else None
    meta = json.loads((src / PARAMS_FILE).read_text())
    data, indices = np.load(src / DATA_FILE, mmap_mode=mode), np.load(src / INDICES_FILE, mmap_mode=mode)
    indptr = np.load(src / INDPTR_FILE)  # vocabulary-sized: read whole, it is touched by every query
    nonocc = np.load(src / NONOCCURRENCE_FILE) if (src / NONOCCURRENCE_FILE).is_file() else None
    term_max = np.load(src / TERM_MAX_FILE) if (src / TERM_MAX_FILE).is_file() else None
    matrix = ScoreMatrix(data, indices, indptr, int(meta["num_docs"]), nonocc, term_max)
    if (src / VOCAB_HASH_FILE).is_file():
        vocab: object = HashedVocabulary(
            np.load(src / VOCAB_HASH_FILE, mmap_mode=mode),
            np.load(src / VOCAB_IDS_FILE, mmap_mode=mode),
            int(meta.get("vocab_salt", 0)),
            src / VOCAB_TEXT_FILE,
        )
    else:
        vocab = DictVocabulary(json.loads((src / LEGACY_VOCAB_FILE).read_text(encoding="utf-8")))
    return matrix, vocab, meta


def build_bm25_model(docs: Iterable[Document], params: BM25Params):
    """A ``bm25s.BM25`` index of documents held in memory (title + text), for small corpora;
    ``searchr1.retrieval.bm25_build`` builds the same scores streaming, within bounded memory."""
    import bm25s

    tok = Tokenizer(params.stemmer, params.stopwords)
    vocab: dict[str, int] = {}
    corpus_ids = [[vocab.setdefault(t, len(vocab)) for t in tok(f"{d.title} {d.text}")] for d in docs]
    if not corpus_ids:
        raise ValueError("cannot build a BM25 index from an empty corpus")
    if not vocab:
        vocab["\x00"] = 0  # a corpus of stop words only: keep bm25s happy, nothing will match
    model = bm25s.BM25(k1=params.k1, b=params.b, delta=params.delta, method=params.method)
    model.index((corpus_ids, vocab), show_progress=False)
    return model


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
        self.tokenizer = Tokenizer(params.stemmer, params.stopwords)
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
        """Index documents in memory (nothing is written to disk)."""
        params = params or BM25Params(**overrides)
        params.validate()
        store = DocStore(list(docs))
        return cls.from_model(build_bm25_model(store._docs, params), store, params)

    @classmethod
    def from_model(cls, model, docs: DocStore, params: BM25Params) -> BM25Retriever:
        """Wrap a ``bm25s.BM25`` model."""
        s = model.scores
        matrix = ScoreMatrix(
            s["data"],
            s["indices"],
            s["indptr"],
            int(s["num_docs"]),
            getattr(model, "nonoccurrence_array", None),
        )
        return cls(matrix, DictVocabulary(model.vocab_dict), docs, params)

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
        write_params(out, self.params, m.num_docs, terms, salt)

    @classmethod
    def load(cls, folder: str | Path, docs: DocStore, mmap: bool = True) -> BM25Retriever:
        """Open ``folder/bm25``; with ``mmap`` the score arrays stay on disk (page cache, not RSS)."""
        src = Path(folder) / BM25_DIR
        known = set(BM25Params.__dataclass_fields__)
        saved = json.loads((src / TOKENIZER_FILE).read_text())
        params = BM25Params(**{k: v for k, v in saved.items() if k in known})
        matrix, vocab, meta = load_matrix(src, mmap=mmap)
        if "delta" not in saved and "delta" in meta:
            params.delta = float(meta["delta"])
        return cls(matrix, vocab, docs, params)

    # -- search -----------------------------------------------------------------------------------

    def term_ids(self, query: str) -> list[int]:
        """Column ids of the query's terms (repeated terms repeated, unknown ones dropped)."""
        return self.vocab.lookup(self.tokenizer(query))

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

    def top(self, query: str, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, float32 scores) of the ``topk`` best documents holding a query term (every document
        for bm25l / bm25+, whose scores are shifted), by score then row; exact."""
        ids = self.term_ids(query)
        if not ids or topk <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        terms, weights = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
        postings = int((self._indptr[terms + 1] - self._indptr[terms]).sum())
        if self._nonoccurrence is not None or topk >= self._num_docs:
            rows, scores = _best(np.arange(self._num_docs), self.scores(query), topk)
            return rows, scores
        if not self._prune or postings < self.PROBE_BELOW:
            return self._top_sorted(terms, weights, topk)
        return self._top_maxscore(terms, weights, topk)

    def _column(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        s, e = int(self._indptr[t]), int(self._indptr[t + 1])
        return self._indices[s:e], self._data[s:e]

    def _top_sorted(self, terms: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Every posting of the query's columns, summed per document through a sort."""
        cols = [self._column(int(t)) for t in terms]
        idx = np.concatenate([c[0] for c in cols])
        val = np.concatenate([c[1].astype(np.float64) * w for c, w in zip(cols, weights, strict=True)])
        rows, inverse = np.unique(idx, return_inverse=True)
        sums = np.bincount(inverse, weights=val, minlength=len(rows)).astype(np.float32)
        return _best(rows, sums, k)

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

    def _top_maxscore(self, terms: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
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
        return _best(cand, score.astype(np.float32), k)

    def _search_one(self, query: str, topk: int) -> list[Hit]:
        rows, scores = self.top(query, topk)
        hits = []
        for row, score in zip(rows, scores, strict=True):
            if score <= 0.0:
                break
            doc = self.docs[int(row)]
            hits.append(Hit(doc.id, doc.title, doc.text, float(score)))
        return hits

    def close(self) -> None:
        self.docs.close()


def _best(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (row, score) pairs, by score descending then row ascending."""
    if len(rows) > k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth  # ties at the k-th score all stay, the row order settles them
        rows, scores = rows[keep], scores[keep]
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]
