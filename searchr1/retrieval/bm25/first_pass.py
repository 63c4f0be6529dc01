"""The first pass of an index build, chunk by chunk, in worker processes: parse, analyse, compress.

The corpus is cut into *chunks* of whole lines by the build's process alone, from the bytes, before
anything is parsed (``chunk_spans``): a chunk ends after ``chunk_passages`` lines, or earlier once it
holds ``chunk_passages x CHUNK_BYTES_PER_PASSAGE`` bytes (long lines, or documents that
``--chunk-size`` cuts into many passages, so that a chunk's memory stays bounded). The cuts depend only
on the corpus and the settings, never on the number of workers, so neither does anything written.

Each chunk is handled by one call of ``analyse_chunk`` (in a worker process, or in this one with one
worker): its lines parsed (``corpus.parse_raw_line``), the passages' records compressed into the
passage store's frames (``store.encode_frames``), the BM25 run analysed and written to the
spill folder under its chunk number (``build.make_run`` / ``write_run``), the passages' id hashes
(``ids.id_hash``) computed; for a dense build, the passages themselves returned. Rows in a run count
from the chunk's first passage (``build``: its base is the passages of the runs before it).

The build's process takes the chunks in corpus order (``commit_lines``): it checks each line's ids
against those read before (``ids.SeenIds``: one vectorised test of the chunk's hashes; only when it
finds a candidate are the lines checked one by one, as ``CorpusReader`` does), names or counts the
malformed lines in the order a single reader meets them, and where a line must be skipped for a
repeated id it analyses the chunk again without it (``analyse_chunk(..., exclude=...)``), so the
outcome is the one-process outcome byte for byte. Then it appends the frames to the store, registers
the run and checkpoints (``build``).

Memory: each worker holds one chunk at a time; at most ``workers + 1`` chunks are in flight.
"""

from __future__ import annotations

import errno
import multiprocessing
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from searchr1.retrieval.bm25.analysis import Analyzer
from searchr1.retrieval.bm25.build import make_run, run_path, write_run
from searchr1.retrieval.bm25.params import BM25Params
from searchr1.retrieval.bm25.store import DICT_SAMPLE, encode_frames, sample_dictionary
from searchr1.retrieval.corpus import (
    CorpusError,
    Document,
    ReadPosition,
    bad_line_message,
    bad_line_reason,
    chunk_document,
    parse_raw_line,
    repeat_reason,
    repeated_id,
    repeated_id_message,
)
from searchr1.retrieval.ids import SeenIds, id_hashes

CHUNK_BYTES_PER_PASSAGE = 2048
"""A chunk's bytes are at most ``chunk_passages`` x this (wiki-18's passages: ~600 bytes a line)."""
READ_BLOCK = 8 << 20


@dataclass(frozen=True)
class Pass1Spec:
    """What every chunk's analysis needs (sent once to each worker)."""

    corpus: str
    chunk_size: int | None = None
    overlap: int = 0
    bm25: BM25Params | None = None
    """BM25 settings: analyse the passages into a run; None: no run (dense builds)."""
    run_dir: str | None = None
    """The spill folder the runs are written to (``build.run_path``)."""
    keep_docs: bool = False
    """Return the passages (dense builds encode them in the build's process)."""
    store_dict: bytes | None = None
    """The passage store's zstd dictionary (``store.train_dictionary``)."""


@dataclass(frozen=True)
class ChunkSpan:
    """Chunk ``index``: the corpus bytes ``start:end`` (whole lines), after ``lineno`` lines."""

    index: int
    start: int
    end: int
    lineno: int


@dataclass
class AnalysedChunk:
    """What ``analyse_chunk`` returns of a chunk; ``len()`` is its passages."""

    span: ChunkSpan
    end_lineno: int
    """The line number of the chunk's last line."""
    lines: list[tuple[int, int]]
    """Per line holding passages, in order: (line number, its passages)."""
    bad: list[tuple[int, str]]
    """Per malformed line: (line number, why); its passages are in nothing else here."""
    ids: list[str]
    hashes: np.ndarray
    """``ids.id_hash`` of each passage's id."""
    frames: bytes
    sizes: np.ndarray
    """The passages compressed for the store (``store.encode_frames``)."""
    run_postings: int = 0
    run_bytes: int = 0
    run_error: tuple[int, str, str] | None = None
    """(errno, message, file) when the disk was full while the run was written (its file removed)."""
    docs: list[Document] | None = None
    skipped_repeats: list[tuple[int, str]] = field(default_factory=list)
    """Lines skipped by ``commit_lines`` for a repeated id: (line number, why)."""

    def __len__(self) -> int:
        return len(self.ids)


_ANALYZERS: dict[str, Analyzer] = {}


def _analyzer(params: BM25Params) -> Analyzer:
    """One analyzer (and so one memo of stems) per process and settings."""
    key = repr(params)
    if key not in _ANALYZERS:
        _ANALYZERS.clear()
        _ANALYZERS[key] = params.make_analyzer()
    return _ANALYZERS[key]


def read_span(corpus: str | Path, span: ChunkSpan) -> bytes:
    with Path(corpus).open("rb") as fh:
        fh.seek(span.start)
        return fh.read(span.end - span.start)


def analyse_chunk(spec: Pass1Spec, span: ChunkSpan, exclude: frozenset[int] = frozenset()) -> AnalysedChunk:
    """Parse, analyse and compress one chunk (see the module docstring); lines ``exclude`` are left out."""
    raw_lines = read_span(spec.corpus, span).split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline that ends the chunk
    n_lines = len(raw_lines)
    docs: list[Document] = []
    lines: list[tuple[int, int]] = []
    bad: list[tuple[int, str]] = []
    for i, raw in enumerate(raw_lines):
        lineno = span.lineno + i + 1
        if lineno in exclude:
            continue
        try:
            passages = parse_raw_line(raw, spec.chunk_size, spec.overlap)
        except (ValueError, UnicodeDecodeError) as exc:
            bad.append((lineno, bad_line_reason(exc)))
            continue
        if passages:
            lines.append((lineno, len(passages)))
            docs.extend(passages)
    del raw_lines  # the chunk's bytes, before the run's arrays are made
    ids = [d.id for d in docs]
    frames, sizes = encode_frames(docs, spec.store_dict)
    out = AnalysedChunk(span, span.lineno + n_lines, lines, bad, ids, id_hashes(ids), frames, sizes)
    if spec.bm25 is not None and spec.run_dir is not None:
        run = make_run(docs, _analyzer(spec.bm25), 0)
        out.run_postings = run.n_postings
        try:
            out.run_bytes = write_run(run_path(Path(spec.run_dir), span.index), run)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            out.run_error = (exc.errno, exc.strerror or "No space left on device", str(exc.filename))
    if spec.keep_docs:
        out.docs = docs
    return out


def store_dictionary(corpus: str | Path, chunk_size: int | None, overlap: int) -> bytes | None:
    """The passage store's dictionary, trained on the corpus's first ``DICT_SAMPLE`` passages (malformed
    lines passed over: they only teach the codec)."""
    docs: list[Document] = []
    with Path(corpus).open("rb") as fh:
        for raw in fh:
            try:
                docs.extend(parse_raw_line(raw, chunk_size, overlap))
            except (ValueError, UnicodeDecodeError):
                continue
            if len(docs) >= DICT_SAMPLE:
                break
    return sample_dictionary(docs)


def chunk_spans(corpus: str | Path, start: ReadPosition, chunk_passages: int, first_index: int) -> Iterator[ChunkSpan]:
    """The chunks after ``start`` (see the module docstring), numbered from ``first_index``."""
    if chunk_passages <= 0:
        raise ValueError("chunk_passages must be positive")
    max_bytes = chunk_passages * CHUNK_BYTES_PER_PASSAGE
    index, offset, lineno = first_index, start.offset, start.lineno
    with Path(corpus).open("rb") as fh:
        fh.seek(offset)
        buf, buf_at = b"", offset  # unread bytes and where they start in the file
        chunk_start, lines = offset, 0
        while True:
            block = fh.read(READ_BLOCK)
            if not block:
                break
            buf = buf[offset - buf_at :] + block
            buf_at = offset
            pos = 0
            while True:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    break
                pos = nl + 1
                lines += 1
                end = buf_at + pos
                if lines >= chunk_passages or end - chunk_start >= max_bytes:
                    yield ChunkSpan(index, chunk_start, end, lineno)
                    index, lineno, chunk_start, lines = index + 1, lineno + lines, end, 0
            offset = buf_at + pos
        tail = buf_at + len(buf)
        if tail > offset:  # the last line, without its newline
            lines += 1
        if lines:
            yield ChunkSpan(index, chunk_start, tail, lineno)


def analysed_chunks(spec: Pass1Spec, spans: Iterable[ChunkSpan], workers: int) -> Iterator[AnalysedChunk]:
    """``analyse_chunk`` of each span, in order: here with one worker, else on ``workers`` processes
    (``spawn``ed: no state of this process is inherited) with at most ``workers + 1`` chunks in flight."""
    if workers <= 1:
        for span in spans:
            yield analyse_chunk(spec, span)
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    pending: list[Future] = []
    try:
        it = iter(spans)
        for span in it:
            pending.append(pool.submit(analyse_chunk, spec, span))
            if len(pending) > workers:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def commit_lines(chunk: AnalysedChunk, spec: Pass1Spec, seen: SeenIds, skip_bad_lines: bool) -> AnalysedChunk:
    """Take a chunk's lines in corpus order: a malformed one, or one whose passage repeats an id read
    before, is named (``CorpusError``) or, with ``skip_bad_lines``, counted and left out (the chunk
    analysed again without it); the others' ids are recorded in ``seen``. Returns the chunk to keep."""
    bad = dict(chunk.bad)
    if bad and not skip_bad_lines and not seen.any_seen(chunk.hashes[: _passages_before(chunk, min(bad))]):
        lineno = min(bad)
        raise CorpusError(bad_line_message(spec.corpus, lineno, bad[lineno]))
    if not seen.any_seen(chunk.hashes):
        seen.add_hashes(chunk.hashes)
        return chunk
    # a candidate repeat: the lines one by one, as one reader takes them
    events = sorted([(n, "bad") for n in bad] + [(n, "ok") for n, _ in chunk.lines])
    at = {n: i for i, (n, _) in enumerate(chunk.lines)}
    starts = np.concatenate([[0], np.cumsum([k for _, k in chunk.lines])]).astype(int)
    repeats: list[tuple[int, str]] = []
    for lineno, kind in events:
        if kind == "bad":
            if not skip_bad_lines:
                raise CorpusError(bad_line_message(spec.corpus, lineno, bad[lineno]))
            continue
        i = at[lineno]
        docs = [Document(doc_id, "", "") for doc_id in chunk.ids[starts[i] : starts[i + 1]]]
        repeat = repeated_id(seen, docs)
        if repeat is not None:
            if not skip_bad_lines:
                raise CorpusError(repeated_id_message(spec.corpus, lineno, repeat))
            repeats.append((lineno, repeat_reason(repeat)))
            continue
        seen.add([d.id for d in docs])
    if not repeats:
        return chunk
    again = analyse_chunk(spec, chunk.span, exclude=frozenset(n for n, _ in repeats))
    again.skipped_repeats = repeats
    return again


def _passages_before(chunk: AnalysedChunk, lineno: int) -> int:
    """The chunk's passages on lines before ``lineno``."""
    return sum(k for n, k in chunk.lines if n < lineno)


def validate_chunking(chunk_size: int | None, overlap: int) -> None:
    if chunk_size is not None:
        chunk_document(Document("", "", ""), chunk_size, overlap)
