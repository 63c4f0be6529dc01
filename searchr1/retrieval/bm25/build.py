"""BM25 index builds whose memory is bounded by a setting, not by the corpus: sorted runs spilled to disk
and merged, as Lucene writes segments and merges them (an external merge sort of the postings).

Pass 1 (``add_chunk``, one call per chunk of passages, in corpus order). The chunk is analysed and its
postings (term, passage, term frequency) are sorted into a *run*: the chunk's distinct terms in the
order of their 128-bit keys (two 64-bit BLAKE2b hashes, ``term_key``), each with its postings, passages
ascending. The run is written to one file in the spill folder (a temporary name, fsync'ed, renamed), so
a finished run is a checkpoint; nothing of it stays in memory. Memory: one chunk (``chunk_passages``)
and a bounded memo of stems.

Pass 2 (``finish``). N, avgdl and each term's document frequency are known only now. The 64-bit hash
space is cut into ranges holding about ``memory_mb`` worth of postings (counted exactly from the runs'
term tables), and each range is merged on its own: every run's terms and postings of the range are
read, terms with the same key become one column, their postings concatenated in run order (so each
column's passages come out ascending), scored (``scoring.term_scores``: each block's largest score)
and appended to the index files as blocks of 128 postings (``postings``).
Columns are in key order, so the index's vocabulary hashes come out sorted, ready for the binary search
of ``HashedVocabulary``; two terms whose first hashes collide (odds ~1e-5 for 21M terms) get separate
columns and the vocabulary is hashed again with another salt. Memory: ``memory_mb`` of postings
(``BYTES_PER_POSTING`` each while merged), the runs' cut points, and 8 bytes per passage (lengths).

``build_matrix`` builds the same index in memory (one run, one range) for small corpora; the streamed
build equals it posting for posting. Disk while building: ~9 bytes a posting in runs (freed at the
end), the index ~2 (format 3: 1.74 bytes a posting in the blocks at 250k generated passages).
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from searchr1.retrieval.bm25.analysis import Analyzer
from searchr1.retrieval.bm25.blocks import BLOCK, encode_blocks
from searchr1.retrieval.bm25.bounds import superblock_bounds, superblock_problem
from searchr1.retrieval.bm25.errors import BoundsError
from searchr1.retrieval.bm25.files import (
    BLOCK_LAST_FILE,
    BLOCK_MAX_FILE,
    BLOCK_OFFSETS_FILE,
    BLOCK_PTR_FILE,
    ID_KEYS_FILE,
    INDPTR_FILE,
    NONOCCURRENCE_FILE,
    NORMS_FILE,
    POSTINGS_FILE,
    SCORES_FILE,
    SUPERBLOCK_LAST_FILE,
    SUPERBLOCK_MAX_FILE,
    TERM_MAX_FILE,
    ScoreMatrix,
    file_checksums,
    layout_name,
    tf_layout,
    write_params,
)
from searchr1.retrieval.bm25.params import NONOCCURRENCE_METHODS, BM25Params
from searchr1.retrieval.bm25.scoring import (
    LUCENE_LENGTHS,
    id_sort_keys,
    idf_array,
    lucene_norm,
    term_scores,
    tf_component,
)
from searchr1.retrieval.bm25.vocabulary import (
    VOCAB_HASH_FILE,
    VOCAB_IDS_FILE,
    VOCAB_TEXT_FILE,
    term_hash,
    write_vocabulary,
)
from searchr1.retrieval.corpus import Document

RUN_SUFFIX = ".run"
BYTES_PER_POSTING = 64
"""Memory a posting takes while its range is merged (the run's 6 bytes read, sort keys and order,
gathered lengths, scores; measured 40-60 bytes on 250k generated passages): ``memory_mb`` / this =
postings merged at a time."""
RANGES_PER_BUDGET = 8
"""Hash ranges cut per ``memory_mb`` worth of postings; neighbouring ones are merged together up to it."""
RUN_BYTES_PER_POSTING = 9
"""A run's bytes a posting (6 for the posting, the rest its term's entry), measured on generated passages."""
INDEX_BYTES_PER_POSTING = 2
"""The index's bytes a posting (a bit-packed row gap and term frequency, 1/128 of a block's 24 bytes
of header, bounds and offset, varint tails; layout score adds a float32): an estimate for a full
disk's message."""
INDEX_BYTES_PER_TERM = 50
"""The index's bytes a column: pointers to its postings and blocks, its maximum, hash, id, text and
the bounds of its last block."""
MAX_TF = np.iinfo(np.uint16).max
EMPTY_TERM = "\x00"
"""The one (empty) column of a corpus of stop words only."""


class SpillDiskFull(OSError):
    """The disk filled while a run or the index was written; the partial file is already removed."""

    def __init__(self, folder: Path, needed: int, cause: OSError):
        super().__init__(errno.ENOSPC, cause.strerror or "No space left on device", str(folder))
        self.folder, self.needed = folder, needed


def _write(fh, data) -> None:
    """Every byte of a run or of the index goes through here (a test fills the disk at a chosen byte)."""
    fh.write(data if isinstance(data, bytes) else np.ascontiguousarray(data).tobytes())


# -- terms -------------------------------------------------------------------------------------------


def term_key(term: str) -> tuple[int, int]:
    """Two independent 64-bit BLAKE2b hashes of a term: the first orders the columns and is the
    vocabulary's lookup hash (``term_hash`` with salt 0), the pair identifies the term."""
    return term_hash(term, 0), term_hash(term, 1)


class ChunkTerms:
    """Surface word -> column of one chunk (-1: a stop word), through the analyzer's memo of stems."""

    def __init__(self, analyzer: Analyzer):
        self.analyzer = analyzer
        self.ids: dict[str, int] = {}
        self.terms: list[str] = []
        self._words: dict[str, int] = {}

    def _miss(self, word: str) -> int:
        if word in self.analyzer.stopwords:
            tid = -1
        else:
            stem = self.analyzer.cached_stem(word)
            tid = self.ids.get(stem, -1)
            if tid < 0:
                tid = self.ids[stem] = len(self.terms)
                self.terms.append(stem)
        self._words[word] = tid
        return tid

    def __call__(self, words: list[str]) -> list[int]:
        ids = list(map(self._words.get, words))  # the C loop of map: ~2x a comprehension's speed
        if None in ids:
            ids = [i if i is not None else self._miss(w) for i, w in zip(ids, words, strict=True)]
        return ids


# -- runs ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One chunk's postings: terms in key order (``h1``, ``h2``, their text), term t's postings at
    ``ptr[t]:ptr[t+1]`` of ``docs`` (passage rows counted from the chunk's first, ascending) and ``tf``;
    ``lens`` per passage; ``base``: the row of the chunk's first passage (``slice`` adds it)."""

    h1: np.ndarray
    h2: np.ndarray
    ptr: np.ndarray
    text: bytes
    """The terms in key order, each followed by a newline (UTF-8)."""
    text_ptr: np.ndarray
    docs: np.ndarray
    tf: np.ndarray
    lens: np.ndarray
    idk: np.ndarray
    """Per passage, ``id_sort_keys`` of its id (for Anserini's order of tied hits)."""
    base: int

    @property
    def n_terms(self) -> int:
        return len(self.h1)

    @property
    def n_postings(self) -> int:
        return int(self.ptr[-1])

    @property
    def n_docs(self) -> int:
        return len(self.lens)

    def hashes(self) -> np.ndarray:
        return self.h1

    def slice(
        self, t0: int, t1: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray]:
        """Terms ``t0:t1``: (h1, h2, postings per term, terms, docs, tf)."""
        p0, p1 = int(self.ptr[t0]), int(self.ptr[t1])
        terms = _split(self.text[int(self.text_ptr[t0]) : int(self.text_ptr[t1])])
        return (
            self.h1[t0:t1],
            self.h2[t0:t1],
            np.diff(self.ptr[t0 : t1 + 1]),
            terms,
            self.docs[p0:p1] + np.uint32(self.base),
            self.tf[p0:p1],
        )

    def lengths(self) -> np.ndarray:
        return self.lens

    def id_keys(self) -> np.ndarray:
        return self.idk

    def table(self, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Terms ``t0:t1`` without their postings: (h1, h2, postings per term)."""
        return self.h1[t0:t1], self.h2[t0:t1], np.diff(self.ptr[t0 : t1 + 1])

    def cuts(self, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(term index, posting index) at each hash bound."""
        t = np.searchsorted(self.hashes(), bounds, side="left")
        return t, self.ptr[t]


def _split(blob: bytes) -> list[str]:
    return blob.decode("utf-8").split("\n")[:-1] if blob else []


def make_run(docs: Sequence[Document], analyzer: Analyzer, base: int = 0) -> Run:
    """Analyse passages ``base``, ``base + 1``, ... into a run (terms in key order)."""
    chunk = ChunkTerms(analyzer)
    words = analyzer.words
    flat = array("i")  # 4 bytes a token (a list would hold an 8-byte pointer and often a 28-byte int)
    sizes = np.empty(len(docs), dtype=np.int64)
    for j, d in enumerate(docs):
        ids = chunk(words(f"{d.title} {d.text}"))
        flat.extend(ids)
        sizes[j] = len(ids)
    ids_arr = np.frombuffer(flat, dtype=np.int32)
    doc_local = np.repeat(np.arange(len(docs), dtype=np.int32), sizes)
    kept = ids_arr >= 0
    ids_arr, doc_local = ids_arr[kept], doc_local[kept]
    del flat, kept
    lens = np.bincount(doc_local, minlength=len(docs)).astype(np.uint32)
    terms = chunk.terms
    keys = [term_key(t) for t in terms]
    h1 = np.fromiter((k[0] for k in keys), dtype=np.uint64, count=len(terms))
    h2 = np.fromiter((k[1] for k in keys), dtype=np.uint64, count=len(terms))
    order = np.lexsort((h2, h1))
    rank = np.empty(len(terms), dtype=np.int64)
    rank[order] = np.arange(len(terms))
    n = max(len(docs), 1)
    key = rank[ids_arr]  # (term rank, passage) as one sortable int64, sorted in place
    key *= n
    key += doc_local
    del ids_arr, doc_local
    key.sort()
    first = np.ones(len(key), dtype=bool)
    first[1:] = key[1:] != key[:-1]
    starts = np.flatnonzero(first)
    del first
    tf = np.diff(np.append(starts, len(key)))
    uniq = key[starts]
    del key, starts
    ptr = np.zeros(len(terms) + 1, dtype=np.int64)
    np.cumsum(np.bincount(uniq // n, minlength=len(terms)), out=ptr[1:])
    encoded = [terms[i].encode("utf-8") + b"\n" for i in order]
    text_ptr = np.zeros(len(terms) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=text_ptr[1:])
    return Run(
        h1[order], h2[order], ptr, b"".join(encoded), text_ptr,
        (uniq % n).astype(np.uint32), np.minimum(tf, MAX_TF).astype(np.uint16), lens,
        id_sort_keys(d.id for d in docs), base,
    )  # fmt: skip


_SECTIONS = {"h1": np.uint64, "h2": np.uint64, "ptr": np.int64, "text_ptr": np.int64, "text": np.uint8,
             "docs": np.uint32, "tf": np.uint16, "lens": np.uint32, "idk": np.uint64}  # fmt: skip
RUN_VERSION = 3
"""2: the passages' id keys (``idk``) added; 3: rows counted from the run's first passage (its base is
the passages of the runs before it, so a worker writes a run without knowing it)."""
_ALIGN = 64


def write_run(path: Path, run: Run) -> int:
    """Write ``run`` to ``path`` durably (temporary name, fsync, rename); returns its bytes. A header
    (8-byte length + JSON naming each section's offset and count) precedes the aligned sections."""
    arrays = {name: getattr(run, name) for name in _SECTIONS}
    arrays["text"] = np.frombuffer(run.text, dtype=np.uint8)
    layout, offset = {}, 0
    for name, arr in arrays.items():
        layout[name] = [offset, len(arr)]
        offset += -(-np.asarray(arr).nbytes // _ALIGN) * _ALIGN
    header = json.dumps({"version": RUN_VERSION, "sections": layout}).encode()
    start = -(-(8 + len(header)) // _ALIGN) * _ALIGN
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as fh:
            _write(fh, len(header).to_bytes(8, "little") + header + b"\0" * (start - 8 - len(header)))
            for name, arr in arrays.items():
                raw = np.ascontiguousarray(arr, dtype=_SECTIONS[name])
                _write(fh, raw)
                _write(fh, b"\0" * (-raw.nbytes % _ALIGN))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return start + offset


class RunFile:
    """A run on disk, read section by section (plain reads: nothing is memory-mapped, so what is read
    is what the process holds); ``base``: the row of its first passage."""

    def __init__(self, path: Path, base: int = 0):
        self.path = path
        with path.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            meta = json.loads(fh.read(size))
        if meta.get("version") != RUN_VERSION:
            raise ValueError(
                f"{path} was written by an earlier version of the build; start it again with --restart"
            )
        self.base = base
        self._start = -(-(8 + size) // _ALIGN) * _ALIGN
        self._layout = meta["sections"]
        self.n_terms = self._layout["h1"][1]
        self.n_docs = self._layout["lens"][1]
        self.n_postings = self._layout["docs"][1]

    def _read(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        offset, count = self._layout[name]
        hi = count if hi is None else hi
        dtype = np.dtype(_SECTIONS[name])
        if hi <= lo:
            return np.zeros(0, dtype=dtype)
        return np.fromfile(
            self.path, dtype=dtype, count=hi - lo, offset=self._start + offset + lo * dtype.itemsize
        )

    def hashes(self) -> np.ndarray:
        return self._read("h1")

    def lengths(self) -> np.ndarray:
        return self._read("lens")

    def id_keys(self) -> np.ndarray:
        return self._read("idk")

    def table(self, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._read("h1", t0, t1), self._read("h2", t0, t1), np.diff(self._read("ptr", t0, t1 + 1))

    def cuts(self, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = np.searchsorted(self.hashes(), bounds, side="left")
        ptr = self._read("ptr")
        return t, ptr[t]

    def slice(self, t0: int, t1: int):
        ptr = self._read("ptr", t0, t1 + 1)
        tp = self._read("text_ptr", t0, t1 + 1)
        text = self._read("text", int(tp[0]), int(tp[-1])).tobytes() if t1 > t0 else b""
        p0, p1 = (int(ptr[0]), int(ptr[-1])) if t1 > t0 else (0, 0)
        return (self._read("h1", t0, t1), self._read("h2", t0, t1), np.diff(ptr), _split(text),
                self._read("docs", p0, p1) + np.uint32(self.base), self._read("tf", p0, p1))  # fmt: skip


# -- the merge ----------------------------------------------------------------------------------------


class ArraySink:
    """Collects the merged columns in memory (``build_matrix``)."""

    def __init__(self) -> None:
        self.parts: dict[str, list] = {"h1": [], "df": [], "rows": [], "data": [], "tf": []}
        self.terms: list[str] = []
        self.collision = False

    def add(
        self, h1: np.ndarray, terms: list[str], df: np.ndarray, rows: np.ndarray, data: np.ndarray, tf: np.ndarray
    ) -> None:
        for name, arr in (("h1", h1), ("df", df), ("rows", rows), ("data", data), ("tf", tf)):
            self.parts[name].append(arr)
        self.terms.extend(terms)

    def begin_column(self, h1: int, term: str, df: int) -> None:
        self.add(np.array([h1], np.uint64), [term], np.array([df], np.int64), np.zeros(0, np.int32),
                 np.zeros(0, np.float32), np.zeros(0, np.uint16))  # fmt: skip

    def add_part(self, rows: np.ndarray, data: np.ndarray, tf: np.ndarray) -> None:
        self.parts["rows"].append(rows)
        self.parts["data"].append(data)
        self.parts["tf"].append(tf)

    def end_column(self) -> None:
        pass

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in self.parts.items()}


class NpyAppender:
    """A ``.npy`` file of one dimension written by appending: a header with room for any length,
    rewritten with the final length on ``close``."""

    HEADER = 128

    def __init__(self, path: Path, dtype) -> None:
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self.fh = path.open("wb")
        try:
            _write(self.fh, self._header(0))
        except BaseException:
            self.fh.close()
            raise

    def _header(self, n: int) -> bytes:
        d = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (n,)}
        body = repr(d).encode("latin1")
        pad = self.HEADER - 10 - len(body) - 1
        return b"\x93NUMPY\x01\x00" + (self.HEADER - 10).to_bytes(2, "little") + body + b" " * pad + b"\n"

    def append(self, arr: np.ndarray) -> None:
        _write(self.fh, np.asarray(arr, dtype=self.dtype))
        self.count += len(arr)

    def close(self) -> None:
        self.fh.seek(0)
        _write(self.fh, self._header(self.count))
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


class FileSink:
    """Appends the merged columns to the index files in ``out`` (the ``bm25`` folder): posting blocks
    (``postings``: row gaps and term frequencies, or row gaps beside float32 scores), their bounds,
    the column pointers and maxima, the vocabulary's hashes and text."""

    def __init__(self, out: Path, with_tf: bool) -> None:
        self.out = out
        self.with_tf = with_tf
        self.postings = 0
        self.terms = 0
        self.words = 0
        self.blocks = 0
        self.collision = False
        self._column: tuple[int, str, int] | None = None
        self._carry: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._prev = -1
        self._column_max = np.float32(0)
        files = [("stream", POSTINGS_FILE, np.uint32), ("block_offsets", BLOCK_OFFSETS_FILE, np.int64),
                 ("block_ptr", BLOCK_PTR_FILE, np.int64),
                 ("block_last", BLOCK_LAST_FILE, np.int32), ("block_max", BLOCK_MAX_FILE, np.float32),
                 ("indptr", INDPTR_FILE, np.int64), ("term_max", TERM_MAX_FILE, np.float32),
                 ("hashes", VOCAB_HASH_FILE, np.uint64)]  # fmt: skip
        if not with_tf:
            files.append(("scores", SCORES_FILE, np.float32))
        self._files: list[NpyAppender] = []
        try:
            for name, path, dtype in files:
                self._files.append(NpyAppender(out / path, dtype))
                setattr(self, name, self._files[-1])
            self.text = (out / VOCAB_TEXT_FILE).open("wb")
            for f in (self.indptr, self.block_offsets, self.block_ptr):
                f.append(np.zeros(1, dtype=np.int64))
        except BaseException:
            for f in self._files:
                f.fh.close()
            raise

    def _blocks(self, rows: np.ndarray, data: np.ndarray, tf: np.ndarray, lengths: np.ndarray, prev: np.ndarray) -> None:
        """Encode postings (segments of ``lengths``, each following row ``prev``) as blocks."""
        stream, sizes, last, best = encode_blocks(
            np.asarray(rows, np.int64), np.asarray(tf, np.int64), np.asarray(data, np.float32),
            np.asarray(lengths, np.int64), np.asarray(prev, np.int64), self.with_tf,
        )  # fmt: skip
        self.stream.append(stream)
        self.block_offsets.append(self.words + np.cumsum(sizes))
        self.block_last.append(last)
        self.block_max.append(best)
        if not self.with_tf:
            self.scores.append(data)
        self.words += len(stream)

    def _columns(self, h1: np.ndarray, terms: list[str], df: np.ndarray, term_max: np.ndarray) -> None:
        self.indptr.append(self.postings + np.cumsum(df))
        self.block_ptr.append(self.blocks + np.cumsum((df + BLOCK - 1) // BLOCK))
        self.blocks += int(((df + BLOCK - 1) // BLOCK).sum())
        self.term_max.append(term_max)
        self.hashes.append(h1)
        _write(self.text, "".join(t + "\n" for t in terms).encode("utf-8"))
        self.postings += int(df.sum())
        self.terms += len(terms)

    def add(
        self, h1: np.ndarray, terms: list[str], df: np.ndarray, rows: np.ndarray, data: np.ndarray, tf: np.ndarray
    ) -> None:
        self._blocks(rows, data, tf, df, np.full(len(df), -1, np.int64))
        self._columns(h1, terms, df, _column_max(data, df))

    def begin_column(self, h1: int, term: str, df: int) -> None:
        """A column too long for one merge, written in parts (``add_part``) then ``end_column``."""
        self._column, self._column_max, self._prev = (h1, term, df), np.float32(0), -1
        self._carry = None

    def add_part(self, rows: np.ndarray, data: np.ndarray, tf: np.ndarray) -> None:
        """Whole blocks of the column so far; the postings past the last whole block wait for the next part."""
        if self._carry is not None:
            rows, data, tf = (np.concatenate([c, x]) for c, x in zip(self._carry, (rows, data, tf), strict=True))
        if len(data):
            self._column_max = max(self._column_max, np.float32(data.max()))
        whole = len(rows) // BLOCK * BLOCK
        if whole:
            self._blocks(rows[:whole], data[:whole], tf[:whole], np.array([whole]), np.array([self._prev]))
            self._prev = int(rows[whole - 1])
        self._carry = (rows[whole:], data[whole:], tf[whole:])

    def end_column(self) -> None:
        h1, term, df = self._column
        if self._carry is not None and len(self._carry[0]):
            rows, data, tf = self._carry
            self._blocks(rows, data, tf, np.array([len(rows)]), np.array([self._prev]))
        self._columns(np.array([h1], np.uint64), [term], np.array([df], np.int64),
                      np.array([self._column_max], np.float32))  # fmt: skip
        self._column, self._carry = None, None

    SUPERBLOCK_CHUNK = 1 << 22
    """Blocks whose superblocks are computed at a time (``_superblocks``: ~16 bytes a block)."""

    def _superblocks(self) -> None:
        """The superblocks' last rows and bounds (``bounds``), from the block files just written, a few
        million blocks at a time; each part is checked (``superblock_problem``) before it is written,
        since a bound below one of its blocks' would let a search skip a passage of the top k."""
        bptr = np.load(self.out / BLOCK_PTR_FILE, mmap_mode="r")
        last = np.load(self.out / BLOCK_LAST_FILE, mmap_mode="r")
        best = np.load(self.out / BLOCK_MAX_FILE, mmap_mode="r")
        sb_files = (NpyAppender(self.out / SUPERBLOCK_LAST_FILE, np.int32),
                    NpyAppender(self.out / SUPERBLOCK_MAX_FILE, np.float32))  # fmt: skip
        try:
            c0, columns = 0, len(bptr) - 1
            while c0 < columns:
                c1 = int(np.searchsorted(bptr, int(bptr[c0]) + self.SUPERBLOCK_CHUNK, side="right")) - 1
                c1 = min(max(c1, c0 + 1), columns)
                lo, hi = int(bptr[c0]), int(bptr[c1])
                local = np.asarray(bptr[c0 : c1 + 1], np.int64) - lo
                part_last, part_max = np.asarray(last[lo:hi]), np.asarray(best[lo:hi])
                sb_last, sb_max = superblock_bounds(local, part_last, part_max)
                problem = superblock_problem(local, part_last, part_max, sb_last, sb_max)
                if problem is not None:
                    raise BoundsError(f"BM25 build refused its own bounds in {self.out}: {problem}")
                sb_files[0].append(sb_last)
                sb_files[1].append(sb_max)
                c0 = c1
        finally:
            for f in sb_files:
                f.close()

    def close(self) -> int:
        """Finish the files (the superblocks; the vocabulary's ids; hashed again on a collision);
        returns the salt."""
        for f in self._files:
            f.close()
        self._superblocks()
        self.text.flush()
        os.fsync(self.text.fileno())
        self.text.close()
        if self.collision:
            terms = (self.out / VOCAB_TEXT_FILE).read_text(encoding="utf-8").splitlines()
            return write_vocabulary(self.out, terms)
        ids = NpyAppender(self.out / VOCAB_IDS_FILE, np.uint32)
        for lo in range(0, self.terms, 1 << 22):
            ids.append(np.arange(lo, min(self.terms, lo + (1 << 22)), dtype=np.uint32))
        ids.close()
        return 0

    def abort(self) -> None:
        for f in self._files:
            f.fh.close()
        self.text.close()


def _column_max(data: np.ndarray, df: np.ndarray) -> np.ndarray:
    out = np.zeros(len(df), dtype=np.float32)
    nonempty = df > 0
    if data.size:
        starts = np.concatenate([[0], np.cumsum(df)[:-1]])
        out[nonempty] = np.maximum.reduceat(data, starts[nonempty])
    return out


@dataclass
class CorpusStats:
    """What the scores need of the whole corpus: passages, N and avgdl of the scores, and per passage
    either Lucene's one-byte norm (``doc_length`` lucene) or the token count (exact)."""

    n_docs: int
    doc_count: int
    """N of the IDF: the passages ``BM25Params.doc_count`` counts."""
    avg_len: float
    norms: np.ndarray | None
    lens: np.ndarray | None

    def dl(self, rows: np.ndarray) -> np.ndarray:
        """The length the scores use for passages ``rows`` (Lucene's decoded norm, or the count)."""
        if self.norms is not None:
            return LUCENE_LENGTHS[self.norms[rows]]
        return self.lens[rows].astype(np.float64)


def corpus_stats(runs: Sequence, params: BM25Params) -> CorpusStats:
    """N, avgdl and per-passage lengths, run by run: what it holds is 1 byte a passage (Lucene's norms)
    or 4 (exact counts), plus one run's lengths at a time -- never a corpus-sized temporary."""
    n = sum(r.n_docs for r in runs)
    if n == 0:
        raise ValueError("cannot build a BM25 index from an empty corpus")
    lucene = params.doc_length == "lucene"
    per_passage = np.empty(n, dtype=np.uint8 if lucene else np.uint32)
    total, indexed, at = 0, 0, 0
    for r in runs:
        lens = r.lengths()
        total += int(lens.sum(dtype=np.int64))
        indexed += int(np.count_nonzero(lens))
        per_passage[at : at + len(lens)] = lucene_norm(lens) if lucene else lens
        at += len(lens)
    count = indexed if params.doc_count == "indexed" else n
    avg = total / count if count else 0.0
    return CorpusStats(n, count, avg, per_passage if lucene else None, None if lucene else per_passage)


@dataclass
class Piece:
    """What one merge step reads: per run, the terms ``spans[r] = (t0, t1)``; ``single``: one term whose
    postings exceed the budget, merged run by run (``postings`` is its document frequency)."""

    spans: list[tuple[int, int]]
    postings: int
    single: bool = False


def plan_ranges(
    runs: Sequence, budget: int
) -> tuple[list[tuple[int, int]], list[tuple[np.ndarray, np.ndarray]]]:
    """Cut the hash space so that each group of ranges holds at most ``budget`` postings (a single range
    over budget stands alone): the groups (first, last range) and each run's (term, posting) cut points."""
    total = sum(r.n_postings for r in runs)
    n = max(1, RANGES_PER_BUDGET * math.ceil(total / max(budget, 1)))
    bounds = np.array([(j << 64) // n for j in range(1, n)], dtype=np.uint64)
    cuts = []
    per_range = np.zeros(n, dtype=np.int64)
    for r in runs:
        t, p = r.cuts(bounds)
        t = np.concatenate([[0], t, [r.n_terms]]).astype(np.int64)
        p = np.concatenate([[0], p, [r.n_postings]]).astype(np.int64)
        per_range += np.diff(p)
        cuts.append((t, p))
    groups, start, size = [], 0, 0
    for j in range(n):
        if j > start and size + per_range[j] > budget:
            groups.append((start, j))
            start, size = j, 0
        size += int(per_range[j])
    groups.append((start, n))
    return groups, cuts


def split_span(runs: Sequence, spans: list[tuple[int, int]], budget: int) -> list[Piece]:
    """Cut a range holding more than ``budget`` postings at term boundaries into pieces of at most
    ``budget`` postings; a term over budget on its own becomes a ``single`` piece. Reads only the
    range's term tables (keys and posting counts), never its postings."""
    tables = [r.table(t0, t1) for r, (t0, t1) in zip(runs, spans, strict=True)]
    h1 = np.concatenate([t[0] for t in tables])
    h2 = np.concatenate([t[1] for t in tables])
    counts = np.concatenate([t[2] for t in tables]).astype(np.int64)
    run_of = np.repeat(np.arange(len(runs)), [len(t[0]) for t in tables])
    order = np.lexsort((run_of, h2, h1))  # by key, then run (a run holds each key once)
    h1, h2, counts, run_of = h1[order], h2[order], counts[order], run_of[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1])
    starts = np.flatnonzero(new)
    per_key = np.add.reduceat(counts, starts) if len(starts) else np.zeros(0, np.int64)
    bounds, single, size = [0], [], 0  # piece boundaries, as entry positions in key order
    ends = np.append(starts[1:], len(order))
    for k, (s, e) in enumerate(zip(starts, ends, strict=True)):
        big = per_key[k] > budget
        if (big or size + per_key[k] > budget) and s > bounds[-1]:
            bounds.append(int(s))
            single.append(False)
            size = 0
        size += int(per_key[k])
        if big:
            bounds.append(int(e))
            single.append(True)
            size = 0
    if bounds[-1] < len(order):
        bounds.append(len(order))
        single.append(False)
    positions = [np.flatnonzero(run_of == r) for r in range(len(runs))]
    at = np.array([np.searchsorted(p, bounds) for p in positions])  # run r's terms before each bound
    pieces = []
    for j in range(len(bounds) - 1):
        sp = [(t0 + int(at[r, j]), t0 + int(at[r, j + 1])) for r, (t0, _) in enumerate(spans)]
        pieces.append(Piece(sp, int(counts[bounds[j] : bounds[j + 1]].sum()), single[j]))
    return pieces


def plan_pieces(runs: Sequence, budget: int) -> list[Piece]:
    """The merge steps in key order, each reading at most ``budget`` postings, except a term whose
    postings alone exceed it, which is read one run's part at a time (``Piece.single``)."""
    groups, cuts = plan_ranges(runs, budget)
    pieces = []
    for g0, g1 in groups:
        spans = [(int(t[g0]), int(t[g1])) for t, _ in cuts]
        size = sum(int(p[g1] - p[g0]) for _, p in cuts)
        pieces += [Piece(spans, size)] if size <= budget else split_span(runs, spans, budget)
    return pieces


def _scores(params: BM25Params, stats: CorpusStats, df: np.ndarray, column: np.ndarray, docs, tf):
    """(scores of postings, the columns' scores in a passage without the term or None)."""
    idf32, idf64 = idf_array(params.method, df, stats.doc_count)
    nonocc = shift = None
    if params.method in NONOCCURRENCE_METHODS:
        zero = tf_component(params.method, 0.0, stats.avg_len, stats.avg_len, params.k1, params.b, params.delta)
        nonocc = (idf64 * zero).astype(np.float32)
        shift = nonocc[column]
    return term_scores(params, idf32[column], tf, stats.dl(docs), stats.avg_len, shift), nonocc


def _merge_piece(runs: Sequence, piece: Piece, params: BM25Params, stats: CorpusStats, sink):
    """Merge one piece into ``sink``; returns its columns' non-occurrence scores (bm25l / bm25+) or None."""
    if piece.single:
        (h1, h2, _, (term,), _, _), *_ = [r.slice(t0, t1) for r, (t0, t1) in zip(runs, piece.spans, strict=True)
                                           if t1 > t0]  # fmt: skip
        df = np.array([piece.postings], np.int64)
        sink.begin_column(int(h1[0]), term, piece.postings)
        nonocc = None
        for r, (t0, t1) in zip(runs, piece.spans, strict=True):
            if t1 > t0:
                docs, tf = r.slice(t0, t1)[4:]
                data, nonocc = _scores(params, stats, df, np.zeros(len(docs), np.int64), docs, tf)
                sink.add_part(docs.astype(np.int32), data, tf)
        sink.end_column()
        return nonocc
    parts = [r.slice(t0, t1) for r, (t0, t1) in zip(runs, piece.spans, strict=True)]
    h1 = np.concatenate([p[0] for p in parts])
    if len(h1) == 0:
        return None
    h2 = np.concatenate([p[1] for p in parts])
    counts = np.concatenate([p[2] for p in parts])
    terms = [t for p in parts for t in p[3]]
    docs = np.concatenate([p[4] for p in parts])
    tf = np.concatenate([p[5] for p in parts])
    del parts
    order = np.lexsort((h2, h1))  # stable: equal keys keep run order
    h1s, h2s = h1[order], h2[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (h1s[1:] != h1s[:-1]) | (h2s[1:] != h2s[:-1])
    column_of_entry = np.empty(len(order), dtype=np.int64)
    column_of_entry[order] = np.cumsum(new) - 1
    first = order[new]
    col_h1 = h1s[new]
    if len(col_h1) > 1 and np.any(col_h1[1:] == col_h1[:-1]):
        sink.collision = True
    column = np.repeat(column_of_entry.astype(np.int32), counts)
    del h1, h2, h1s, h2s, column_of_entry
    porder = np.argsort(column, kind="stable")  # run order, so passages ascend in each column
    column = column[porder]
    docs, tf = docs[porder], tf[porder]
    del porder
    df = np.bincount(column, minlength=len(first)).astype(np.int64)
    data, nonocc = _scores(params, stats, df, column, docs, tf)
    sink.add(col_h1, [terms[i] for i in first], df, docs.astype(np.int32), data, tf)
    return nonocc


def merge_runs(
    runs: Sequence,
    params: BM25Params,
    sink,
    memory_mb: float | None,
    progress: Callable[[int], None] | None = None,
) -> tuple[CorpusStats, np.ndarray | None]:
    """Merge ``runs`` (in corpus order) into ``sink`` piece by piece (``memory_mb`` None: all at once);
    returns the corpus statistics and, for bm25l / bm25+, each column's score in a passage without
    the term."""
    stats = corpus_stats(runs, params)
    total = sum(r.n_postings for r in runs)
    budget = total if memory_mb is None else max(1, int(memory_mb * (1 << 20)) // BYTES_PER_POSTING)
    nonocc_parts: list[np.ndarray] = []
    done = 0
    for piece in plan_pieces(runs, max(budget, 1)):
        nonocc = _merge_piece(runs, piece, params, stats, sink)
        if nonocc is not None:
            nonocc_parts.append(nonocc)
        done += piece.postings
        if progress is not None:
            progress(done)
    nonocc = np.concatenate(nonocc_parts) if params.method in NONOCCURRENCE_METHODS else None
    return stats, nonocc


def min_memory_mb(chunk_passages: int) -> float:
    """The smallest ``memory_mb`` a build with chunks of ``chunk_passages`` can merge in: one run's
    postings of one term (at most one a passage of the chunk)."""
    return chunk_passages * BYTES_PER_POSTING / (1 << 20)


def build_matrix(docs: Sequence[Document], params: BM25Params) -> tuple[ScoreMatrix, list[str]]:
    """The index of passages held in memory (one run, merged whole): the score matrix and the terms
    of its columns. Equal, array for array, to what the streamed build writes for the same passages."""
    if not docs:
        raise ValueError("cannot build a BM25 index from an empty corpus")
    run = make_run(docs, params.make_analyzer(), 0)
    if run.n_terms == 0:
        run = _empty_run(run.lens, run.idk)
    sink = ArraySink()
    stats, nonocc = merge_runs([run], params, sink, memory_mb=None)
    a = sink.arrays()
    indptr = np.zeros(len(sink.terms) + 1, dtype=np.int64)
    np.cumsum(a["df"], out=indptr[1:])
    matrix = ScoreMatrix(
        a["data"].astype(np.float32), a["rows"].astype(np.int32), indptr, stats.n_docs, nonocc,
        _column_max(a["data"].astype(np.float32), a["df"].astype(np.int64)), stats.norms, run.idk,
        stats.doc_count, stats.avg_len, a["tf"].astype(np.uint16),
    )  # fmt: skip
    return matrix, sink.terms


def _empty_run(lens: np.ndarray, idk: np.ndarray) -> Run:
    """A corpus of stop words only (passage lengths ``lens``, all 0): one empty column, so the index has
    a vocabulary; nothing matches."""
    h1, h2 = term_key(EMPTY_TERM)
    return Run(np.array([h1], np.uint64), np.array([h2], np.uint64), np.zeros(2, np.int64),
               EMPTY_TERM.encode() + b"\n", np.array([0, 2], np.int64), np.zeros(0, np.uint32),
               np.zeros(0, np.uint16), lens, idk, 0)  # fmt: skip


# -- the streamed build ---------------------------------------------------------------------------------


def run_path(folder: Path, k: int) -> Path:
    """Chunk ``k``'s run in the spill folder."""
    return folder / f"run_{k:06d}{RUN_SUFFIX}"


class BM25StreamBuilder:
    """Pass 1 (``add_chunk``, one call per chunk in corpus order) and pass 2 (``finish``)."""

    def __init__(self, workdir: str | Path, params: BM25Params, chunks_done: int = 0):
        """``chunks_done``: runs already in ``workdir`` (the spill folder) from an interrupted build;
        later run files are stale and are removed."""
        params.validate()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.params = params
        self.analyzer = params.make_analyzer()
        self.chunks = chunks_done
        self.passages = 0
        self.run_bytes = 0
        self._bases: list[int] = []
        for k in range(chunks_done):
            run = RunFile(run_path(self.workdir, k))
            self._bases.append(self.passages)
            self.passages += run.n_docs
            self.run_bytes += run.path.stat().st_size
        self.drop_uncommitted()

    def drop_uncommitted(self) -> None:
        """Remove the run files of chunks not added (written ahead by workers, or by a stopped build)."""
        for path in self.workdir.glob(f"run_*{RUN_SUFFIX}*"):
            if path.name.endswith(".tmp") or int(path.name[4:10]) >= self.chunks:
                path.unlink(missing_ok=True)

    def add_chunk(self, chunk, remaining_fraction: float | None = None) -> None:
        """Add the next chunk: passages (a list of ``Document``: analysed and written here), or a chunk
        whose run ``first_pass.analyse_chunk`` wrote already (``first_pass.AnalysedChunk``). Either way
        the run is durable before this returns (a checkpoint may name it next). ``remaining_fraction``:
        the share of the corpus still to read (for the space a full disk needs)."""
        path = run_path(self.workdir, self.chunks)
        error: OSError | None = None
        if isinstance(chunk, list):
            run = make_run(chunk, self.analyzer, 0)
            postings, written = run.n_postings, 0
            try:
                written = write_run(path, run)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                error = exc
        else:
            if chunk.span.index != self.chunks:
                raise ValueError(f"chunk {chunk.span.index} added as chunk {self.chunks}")
            postings, written = chunk.run_postings, chunk.run_bytes
            if chunk.run_error is not None:
                error = OSError(*chunk.run_error)
        if error is not None:
            done = self.passages + len(chunk)
            frac = remaining_fraction if remaining_fraction is not None else 0.0
            per_passage = (self.run_bytes + postings * RUN_BYTES_PER_POSTING) / max(done, 1)
            runs_total = per_passage * (done / max(1e-9, 1 - frac) if frac < 1 else done)
            # the runs still to write, then the index written from them (about as large as the runs)
            needed = int(runs_total - self.run_bytes + runs_total)
            raise SpillDiskFull(self.workdir, needed, error) from error
        self.run_bytes += written
        self._bases.append(self.passages)
        self.chunks += 1
        self.passages += len(chunk)

    def runs(self) -> list[RunFile]:
        """The runs added, each with its base (the passages of the runs before it)."""
        return [RunFile(run_path(self.workdir, k), self._bases[k]) for k in range(self.chunks)]

    def postings(self) -> int:
        return sum(r.n_postings for r in self.runs())

    def finish(
        self, out: str | Path, memory_mb: float = 512, progress: Callable[[int], None] | None = None
    ) -> int:
        """Merge the runs into the index files in ``out`` (the ``bm25`` folder); returns the passage
        count. ``progress(n)`` is called with the postings placed so far. On a full disk the partial
        index is removed and ``SpillDiskFull`` says how much it needs."""
        out = Path(out)
        if self.passages == 0:
            raise ValueError("cannot build a BM25 index from an empty corpus")
        runs: list = self.runs()
        if all(r.n_terms == 0 for r in runs):  # stop words only: tiny, whatever the corpus
            runs = [_empty_run(np.concatenate([r.lengths() for r in runs]), np.concatenate([r.id_keys() for r in runs]))]
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        sink = None
        try:
            sink = FileSink(out, with_tf=tf_layout(self.params))
            stats, nonocc = merge_runs(runs, self.params, sink, memory_mb, progress)
            salt = sink.close()
            if nonocc is not None:
                np.save(out / NONOCCURRENCE_FILE, nonocc)
            if stats.norms is not None:
                np.save(out / NORMS_FILE, stats.norms)
            keys = NpyAppender(out / ID_KEYS_FILE, np.uint64)
            for r in runs:  # one run's keys at a time
                keys.append(r.id_keys())
            keys.close()
            write_params(out, self.params, stats.n_docs, sink.terms, salt, stats.doc_count, stats.avg_len,
                         layout=layout_name(self.params), checksums=file_checksums(out))  # fmt: skip
        except OSError as exc:
            if sink is not None:
                sink.abort()
            shutil.rmtree(out, ignore_errors=True)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            total = sum(r.n_postings for r in runs)
            per_posting = INDEX_BYTES_PER_POSTING + (0 if tf_layout(self.params) else 4)
            needed = total * per_posting + sum(r.n_terms for r in runs) * INDEX_BYTES_PER_TERM + self.passages * 9
            raise SpillDiskFull(out, int(needed), exc) from exc
        return stats.n_docs

    def remove_runs(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
