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

import hashlib
import json
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retrieval.analysis import Analyzer, make_analyzer
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


PRESETS: dict[str, dict[str, Any]] = {
    "pyserini": {"k1": 0.9, "b": 0.4, "analyzer": "lucene-english", "stemmer": "porter",
                 "stopwords": "lucene", "doc_length": "lucene", "tie_break": "pyserini"},
    "bm25s": {"k1": 1.5, "b": 0.75, "analyzer": "regex", "stemmer": "english", "stopwords": "en",
              "doc_length": "exact", "tie_break": "row"},
}  # fmt: skip
"""Named settings. ``pyserini`` (the default): Search-R1's retriever, pyserini's ``LuceneSearcher`` at
its defaults (k1 0.9, b 0.4, Lucene's English analyzer, Lucene's one-byte document lengths);
``bm25s``: the settings of earlier versions (bm25s's defaults with a Snowball stemmer)."""
DOC_LENGTHS = ("lucene", "exact")


@dataclass
class BM25Params:
    """Scoring and tokenisation options (saved with the index); the defaults are the ``pyserini`` preset."""

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    analyzer: str = "lucene-english"
    """lucene-english (Lucene's EnglishAnalyzer) | regex (earlier versions): see ``retrieval.analysis``."""
    stemmer: str | None = "porter"
    """lucene-english: porter (Lucene's PorterStemFilter) or another PyStemmer algorithm; regex: a
    PyStemmer language (english, ...); None: no stemming."""
    stopwords: str | None = "lucene"
    """lucene: Lucene's 33 English stop words; a bm25s list name (en, de, fr, ...); None: keep every word."""
    doc_length: str = "lucene"
    """lucene: a document's length as Lucene stores it, in one byte (``lucene_length``: exact below 24
    tokens, then 4 significant bits); exact: the token count."""
    tie_break: str = "pyserini"
    """Order of hits with equal scores. pyserini: as Anserini (pyserini's engine) orders them, by
    passage id as text (scores reported rounded to 4 decimals, as pyserini reports them); row: in
    corpus order (scores reported whole)."""
    delta: float = 0.5
    """The lower bound delta of bm25l and bm25+ (ignored by the other methods)."""
    preset: str | None = "pyserini"
    """The preset these settings started from (for people: manifests and ``/health`` show it)."""

    @classmethod
    def from_preset(cls, preset: str = "pyserini", **overrides: Any) -> BM25Params:
        """The settings of ``preset`` (``PRESETS``) with ``overrides`` on top (None: the preset's value;
        the string "none" for ``stemmer`` / ``stopwords``: none)."""
        if preset not in PRESETS:
            raise ValueError(f"unknown BM25 preset {preset!r}; choose one of {', '.join(PRESETS)}")
        given = {k: None if v in ("none", "None", "") else v for k, v in overrides.items() if v is not None}
        unknown = sorted(set(given) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown BM25 setting(s) {', '.join(unknown)}")
        return cls(**{**PRESETS[preset], "preset": preset, **given})

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> BM25Params:
        """The settings saved with an index; a folder of an earlier version (no ``analyzer`` key) was
        built with the ``bm25s`` preset's analyzer and exact lengths."""
        known = {k: v for k, v in saved.items() if k in cls.__dataclass_fields__}
        if "analyzer" not in known:
            known = {"analyzer": "regex", "doc_length": "exact", "tie_break": "row", "preset": None, **known}
        return cls(**known)

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown BM25 method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.tie_break not in ("pyserini", "row"):
            raise ValueError(f"unknown BM25 tie_break {self.tie_break!r}; choose pyserini or row")
        if self.doc_length not in DOC_LENGTHS:
            raise ValueError(f"unknown BM25 doc_length {self.doc_length!r}; choose one of {', '.join(DOC_LENGTHS)}")
        self.make_analyzer()

    def make_analyzer(self) -> Analyzer:
        return make_analyzer(self.analyzer, self.stemmer, self.stopwords)


# -- the formulas ---------------------------------------------------------------------------------


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


def lucene_norm(length) -> np.ndarray:
    """Lucene's one-byte document length (``SmallFloat.intToByte4``, the norm BM25Similarity stores):
    lengths below 24 as they are; above, 24 + a float of 3 mantissa bits and a 5-bit exponent, i.e.
    ``length - 24`` rounded down to 4 significant bits (61 is scored as 60, 101 as 96)."""
    n = np.asarray(length, dtype=np.int64)
    v = np.maximum(n - 24, 0)
    bits = np.frexp(v.astype(np.float64))[1].astype(np.int64)  # bit length (exact below 2^53)
    shift = np.maximum(bits - 4, 0)
    code = np.where(bits < 4, v, ((v >> shift) & 7) | ((shift + 1) << 3))
    return np.where(n < 24, n, 24 + code).astype(np.uint8)


def lucene_length(norm) -> np.ndarray:
    """The length Lucene scores with for a one-byte norm (``SmallFloat.byte4ToInt``), as float32."""
    c = np.asarray(norm, dtype=np.int64)
    v = np.maximum(c - 24, 0)
    bits, shift = v & 7, (v >> 3) - 1
    decoded = np.where(shift < 0, bits, (bits | 8) << np.maximum(shift, 0))
    return np.where(c < 24, c, np.minimum(24 + decoded, 2**31 - 1)).astype(np.float32)


LUCENE_LENGTHS = lucene_length(np.arange(256))
"""The 256 lengths a one-byte norm stands for."""


def doc_length_values(lens: np.ndarray, doc_length: str) -> np.ndarray:
    """Per document, the length the scores use: Lucene's decoded one-byte norm (float32) or the count."""
    if doc_length == "lucene":
        return LUCENE_LENGTHS[lucene_norm(lens)]
    return np.asarray(lens, dtype=np.float64)


def term_scores(
    params: BM25Params, idf32: np.ndarray, tf, dl: np.ndarray, avg_len: float, shift: np.ndarray | None = None
) -> np.ndarray:
    """float32 BM25 scores of postings (term IDF, term frequency, document length per posting).

    Method ``lucene`` with Lucene's lengths computes as Lucene's ``BM25Similarity`` does, in float32:
    ``w - w / (1 + tf * inv)`` with ``w = idf`` and ``inv = 1 / (k1 (1 - b + b dl / avgdl))`` (the same
    value as ``idf tf / (tf + k1 L)``, rounded as Lucene rounds it); otherwise ``tf_component`` in
    float64, as bm25s computes it, less ``shift`` (bm25l / bm25+: the score of a passage without the
    term, added back at search time)."""
    if params.method == "lucene" and params.doc_length == "lucene":
        f32 = np.float32
        k1, b, avg = f32(params.k1), f32(params.b), f32(avg_len)
        inv = f32(1) / (k1 * ((f32(1) - b) + b * np.asarray(dl, dtype=f32) / avg))
        w = np.asarray(idf32, dtype=f32)
        return w - w / (f32(1) + np.asarray(tf, dtype=f32) * inv)
    tfc = tf_component(params.method, tf, dl, avg_len, params.k1, params.b, params.delta)
    score = np.asarray(idf32, dtype=np.float64) * tfc
    if shift is not None:
        score -= shift
    return score.astype(np.float32)


# -- tokens and the vocabulary ----------------------------------------------------------------------


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


def write_params(out: Path, params: BM25Params, num_docs: int, vocab_size: int | None, vocab_salt: int) -> None:
    """``params.index.json`` (bm25s's keys plus the vocabulary hash salt) and ``tokenizer.json``."""
    meta = {
        "k1": params.k1, "b": params.b, "delta": params.delta, "method": params.method,
        "idf_method": params.method, "dtype": "float32", "int_dtype": "int32", "num_docs": num_docs,
        "vocab_salt": vocab_salt, "vocab_size": vocab_size,
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
        from searchr1.retrieval.bm25_build import build_matrix

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
