"""The BM25 index and its scores: settings and presets, the formulas (with Lucene's one-byte document
lengths and float32 arithmetic), term hashes and vocabularies, and the score matrix on disk -- what
``bm25`` (search) and ``bm25_build`` (building) share. See ``bm25`` for the model and the file layout.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retrieval.analysis import Analyzer, make_analyzer
from searchr1.retrieval.bm25_blocks import REBUILD, DamagedIndex, Postings
from searchr1.retrieval.bm25_kernel import SCORE, TF

BM25_DIR = "bm25"
TOKENIZER_FILE = "tokenizer.json"
PARAMS_FILE = "params.index.json"
DATA_FILE, INDICES_FILE, INDPTR_FILE = "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"
NONOCCURRENCE_FILE = "nonoccurrence_array.index.npy"
TERM_MAX_FILE = "term_max.npy"
NORMS_FILE = "norms.npy"
"""One byte per passage: Lucene's norm (``lucene_norm`` of its length); lets a repeated query term be
scored as Anserini scores it (``BM25Retriever``). Absent from folders of earlier versions."""
ID_KEYS_FILE = "id_keys.npy"
"""Per passage, ``id_sort_keys`` of its id: Anserini's order of tied hits without reading ids."""
VOCAB_HASH_FILE, VOCAB_IDS_FILE, VOCAB_TEXT_FILE = "vocab.hash.npy", "vocab.ids.npy", "vocab.txt"
POSTINGS_FILE = "postings.u8.npy"
"""Format 2: the posting blocks' bytes (``bm25_blocks``)."""
BLOCK_OFFSETS_FILE, BLOCK_PTR_FILE = "blocks.offsets.npy", "blocks.ptr.npy"
"""Format 2: each block's first byte (and the end), each column's first block (and the count)."""
BLOCK_LAST_FILE, BLOCK_MAX_FILE = "blocks.last.npy", "blocks.max.npy"
"""Format 2: each block's last row and largest score."""
SCORES_FILE = "scores.f32.npy"
"""Format 2, layout score (methods other than Lucene's): the postings' float32 scores."""
FORMAT = 2
"""1 (no ``format`` key): rows and float32 scores (``DATA_FILE``, ``INDICES_FILE``), still read; 2: blocks."""
LEGACY_VOCAB_FILE = "vocab.index.json"
METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
NONOCCURRENCE_METHODS = ("bm25l", "bm25+")


PRESETS: dict[str, dict[str, Any]] = {
    "pyserini": {"k1": 0.9, "b": 0.4, "analyzer": "lucene-english", "stemmer": "porter",
                 "stopwords": "lucene", "doc_length": "lucene", "tie_break": "pyserini", "doc_count": "indexed"},
    "bm25s": {"k1": 1.5, "b": 0.75, "analyzer": "regex", "stemmer": "english", "stopwords": "en",
              "doc_length": "exact", "tie_break": "row", "doc_count": "all"},
}  # fmt: skip
"""Named settings. ``pyserini`` (the default): Search-R1's retriever, pyserini's ``LuceneSearcher`` at
its defaults (k1 0.9, b 0.4, Lucene's English analyzer, Lucene's one-byte document lengths);
``bm25s``: the settings of earlier versions (bm25s's defaults with a Snowball stemmer)."""
DOC_LENGTHS = ("lucene", "exact")
DOC_COUNTS = ("indexed", "all")


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
    doc_count: str = "indexed"
    """Which passages N (in the IDF) and avgdl count. indexed: those holding at least one indexed term,
    as Lucene's ``docCount`` (a passage of stop words only counts in neither); all: every passage, as
    bm25s counts them."""
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
        known.setdefault("doc_count", "all")  # what every index before the setting was built with
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
        if self.doc_count not in DOC_COUNTS:
            raise ValueError(f"unknown BM25 doc_count {self.doc_count!r}; choose one of {', '.join(DOC_COUNTS)}")
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


def inverse_norms(k1: float, b: float, avg_len: float) -> np.ndarray:
    """Lucene's ``BM25Scorer`` cache, one float32 per norm byte: ``1 / (k1 (1 - b + b len(norm) / avgdl))``."""
    f32 = np.float32
    return f32(1) / (f32(k1) * ((f32(1) - f32(b)) + f32(b) * LUCENE_LENGTHS / f32(avg_len)))


def boosted_scores(stored: np.ndarray, idf32: float, inv: np.ndarray, boost: float) -> np.ndarray:
    """float32 scores of a query term repeated ``boost`` times, as Anserini scores it (one clause
    boosted by the count: ``w - w / (1 + tf inv)`` with ``w = float32(boost idf)``), from the stored
    single-term scores ``s = idf - idf / (1 + tf inv)`` and each posting's ``inv`` (``inverse_norms``).

    The term frequency is recovered exactly: ``tf = round((idf / (idf - s) - 1) / inv)``, then the
    neighbour whose stored score it reproduces in float32 (s is increasing in tf); where float32 cannot
    tell neighbouring tf apart (hundreds of repeats in one passage) the nearest estimate is used."""
    f32 = np.float32
    s, inv, idf, one = np.asarray(stored, f32), np.asarray(inv, f32), f32(idf32), f32(1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        est = (np.float64(idf) / (np.float64(idf) - s.astype(np.float64)) - 1.0) / inv.astype(np.float64)
    tf = np.clip(np.nan_to_num(np.rint(est), nan=1.0, posinf=65535.0), 1, 65535).astype(f32)
    for step in (-1, 1):
        wrong = idf - idf / (one + tf * inv) != s
        tf[wrong] = np.maximum(tf[wrong] + f32(step), one)
    still = idf - idf / (one + tf * inv) != s
    tf[still] -= f32(1)  # neither neighbour reproduces it: back to the estimate
    w = f32(f32(boost) * idf)
    return w - w / (one + tf * inv)


def id_sort_keys(ids: Iterable[str]) -> np.ndarray:
    """Per id, its first 8 bytes of UTF-8 as a big-endian number (zero-padded): ids order as these keys
    do (Python's and Lucene's byte order of text), except ids sharing their first 8 bytes, which tie."""
    raw = b"".join(i.encode("utf-8")[:8].ljust(8, b"\0") for i in ids)
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


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
        hashes = np.asarray(self.hashes)  # a plain view: indexing a numpy.memmap costs a Python call
        if len(h) == 0 or len(hashes) == 0:
            return []
        pos = np.minimum(np.searchsorted(hashes, h), len(hashes) - 1)
        found = hashes[pos] == h
        return np.asarray(self.ids)[pos[found]].tolist()


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
    norms: np.ndarray | None = None
    """Lucene's one-byte norm per passage (``NORMS_FILE``), None in folders of earlier versions."""
    id_keys: np.ndarray | None = None
    """``id_sort_keys`` of the passages' ids (``ID_KEYS_FILE``), None in folders of earlier versions."""
    doc_count: int | None = None
    """N of the IDF (``BM25Params.doc_count``); None: not recorded (earlier versions)."""
    avg_len: float | None = None
    """avgdl of the scores; None: not recorded (earlier versions)."""
    tf: np.ndarray | None = None
    """The postings' term frequencies (an index built in memory; on disk they are in the blocks)."""

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


def tf_layout(params: BM25Params) -> bool:
    """Whether the index stores term frequencies (scores computed at query time from them and the
    norms, as Lucene does): with Lucene's method and lengths; else float32 scores."""
    return (params.method, params.doc_length) == ("lucene", "lucene")


def layout_name(params: BM25Params) -> str:
    return "tf" if tf_layout(params) else "score"


CHECKSUM_SKIP = ("params.index.json", "tokenizer.json")


def crc32_file(path: Path) -> int:
    crc = 0
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            crc = zlib.crc32(block, crc)
    return crc


def file_checksums(folder: Path) -> dict[str, list[int]]:
    """Per file of an index folder (but the settings): [bytes, CRC-32]."""
    return {p.name: [p.stat().st_size, crc32_file(p)] for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in CHECKSUM_SKIP}  # fmt: skip



def verify_checksums(src: Path, checksums: dict[str, list[int]]) -> None:
    """Refuse (one line) a file of ``src`` whose size or CRC-32 differs from what the build recorded."""
    for name, (size, crc) in checksums.items():
        path = src / name
        if not path.is_file():
            raise DamagedIndex(f"BM25 index {src} is incomplete: {name} is missing; {REBUILD}")
        if path.stat().st_size != size:
            raise DamagedIndex(f"BM25 index {src} is damaged: {name} holds {path.stat().st_size:,} bytes, "
                               f"the build wrote {size:,} (truncated?); {REBUILD}")  # fmt: skip
        if crc32_file(path) != crc:
            raise DamagedIndex(f"BM25 index {src} is damaged: {name} fails its CRC-32 check; {REBUILD}")


def write_params(
    out: Path, params: BM25Params, num_docs: int, vocab_size: int | None, vocab_salt: int,
    doc_count: int | None = None, avg_len: float | None = None, layout: str | None = None,
    checksums: dict[str, list[int]] | None = None,
) -> None:  # fmt: skip
    """``params.index.json`` (bm25s's keys plus the vocabulary hash salt, N and avgdl of the scores;
    with ``layout``, format 2: posting blocks of that layout and each file's size and CRC-32)
    and ``tokenizer.json``."""
    meta: dict[str, Any] = {
        "k1": params.k1, "b": params.b, "delta": params.delta, "method": params.method,
        "idf_method": params.method, "dtype": "float32", "int_dtype": "int32", "num_docs": num_docs,
        "vocab_salt": vocab_salt, "vocab_size": vocab_size, "doc_count": doc_count, "avg_len": avg_len,
    }  # fmt: skip
    if layout is not None:
        meta.update(format=FORMAT, layout=layout, block=128, checksums=checksums or {})
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


def load_matrix(src: Path, mmap: bool = True, verify: bool = True) -> tuple[ScoreMatrix, object, dict, Any]:
    """(score matrix, vocabulary, params.index.json, posting blocks or None) of a ``bm25`` folder. An
    index of format 2 has blocks (``bm25_blocks.Postings``) and a matrix without rows and scores;
    ``verify``: its files' sizes and CRC-32 are checked first. A file that cannot be read is refused
    in one line (``DamagedIndex``)."""
    try:
        meta = json.loads((src / PARAMS_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise DamagedIndex(f"BM25 index {src} is damaged: {PARAMS_FILE} is not JSON ({exc}); {REBUILD}") from None
    blocks = meta.get("format", 1) >= 2
    if meta.get("format", 1) > FORMAT:
        raise DamagedIndex(f"BM25 index {src} has format {meta['format']}, newer than this version reads ({FORMAT})")
    if blocks and verify:
        verify_checksums(src, meta.get("checksums", {}))
    try:
        return _load_arrays(src, meta, mmap, blocks)
    except (ValueError, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError | DamagedIndex):
            raise
        raise DamagedIndex(f"BM25 index {src} is damaged: {type(exc).__name__}: {exc}; {REBUILD}") from None


def _load_arrays(src: Path, meta: dict, mmap: bool, blocks: bool) -> tuple[ScoreMatrix, object, dict, Any]:
    mode = "r" if mmap else None

    def opt(name: str, mapped: bool = True):
        return np.load(src / name, mmap_mode=mode if mapped else None) if (src / name).is_file() else None

    indptr = np.load(src / INDPTR_FILE)  # vocabulary-sized: read whole, it is touched by every query
    if blocks:
        data, indices = np.zeros(0, np.float32), np.zeros(0, np.int32)
    else:
        data, indices = np.load(src / DATA_FILE, mmap_mode=mode), np.load(src / INDICES_FILE, mmap_mode=mode)
        if len(data) != int(indptr[-1]) or len(indices) != int(indptr[-1]):
            raise DamagedIndex(f"BM25 index {src} is damaged: {len(data):,} scores and {len(indices):,} rows "
                               f"for {int(indptr[-1]):,} postings; {REBUILD}")  # fmt: skip
    matrix = ScoreMatrix(data, indices, indptr, int(meta["num_docs"]), opt(NONOCCURRENCE_FILE, False),
                         opt(TERM_MAX_FILE, False), opt(NORMS_FILE), opt(ID_KEYS_FILE), meta.get("doc_count"),
                         meta.get("avg_len"))  # fmt: skip
    postings = None
    if blocks:
        layout = TF if meta["layout"] == "tf" else SCORE
        postings = Postings(
            layout, indptr, np.load(src / BLOCK_PTR_FILE), np.load(src / BLOCK_LAST_FILE, mmap_mode=mode),
            np.load(src / BLOCK_MAX_FILE, mmap_mode=mode), matrix.column_max(),
            data=np.load(src / SCORES_FILE, mmap_mode=mode) if layout == SCORE else np.zeros(0, np.float32),
            offsets=np.load(src / BLOCK_OFFSETS_FILE, mmap_mode=mode), stream=np.load(src / POSTINGS_FILE, mmap_mode=mode),
        )  # fmt: skip
        postings.check(int(meta["num_docs"]))
    if (src / VOCAB_HASH_FILE).is_file():
        vocab: object = HashedVocabulary(
            np.load(src / VOCAB_HASH_FILE, mmap_mode=mode),
            np.load(src / VOCAB_IDS_FILE, mmap_mode=mode),
            int(meta.get("vocab_salt", 0)),
            src / VOCAB_TEXT_FILE,
        )
    else:
        vocab = DictVocabulary(json.loads((src / LEGACY_VOCAB_FILE).read_text(encoding="utf-8")))
    return matrix, vocab, meta, postings
