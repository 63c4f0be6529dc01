"""BM25's formulas: IDF and term-frequency factors of each method, Lucene's one-byte document lengths
(norms) and its float32 arithmetic, a repeated query term's boosted score, Anserini's order of ties."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from searchr1.retrieval.bm25.params import BM25Params


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
