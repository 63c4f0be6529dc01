"""Streaming BM25 build: the scores of ``searchr1.retrieval.bm25`` within bounded memory, resumable.

Pass 1 reads the corpus chunk by chunk. Each chunk's passages are tokenised and turned into postings
(term, document, term frequency), sorted by term and written as a *run* (``run_K.*.npy`` files in the
build folder) with the chunk's document lengths and the terms it saw first. Only the vocabulary
(term -> column id) and one chunk are in memory; a finished run is a checkpoint.

Pass 2 needs the corpus statistics, known only at the end: N, avgdl and each term's document frequency
(its number of postings). It fills the CSC score matrix one range of columns at a time, the range
sized to ``memory_mb``: for each run in corpus order, the run's postings of those columns are scored
(``bm25.idf``, ``bm25.tf_component``) and dropped at their place, so each column's documents come out
ascending, as bm25s orders them. The result equals a one-shot ``bm25s`` build of the same passages
(the same column ids, in order of first appearance, and the same float32 scores).

Memory: the vocabulary, 4 bytes per passage (lengths), ``memory_mb`` of column buffers and one chunk.
Disk while building: ~10 bytes per posting in runs, freed at the end; the index ~8 bytes per posting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from searchr1.retrieval.bm25 import (
    DATA_FILE,
    INDICES_FILE,
    INDPTR_FILE,
    NONOCCURRENCE_FILE,
    NONOCCURRENCE_METHODS,
    TERM_MAX_FILE,
    BM25Params,
    Tokenizer,
    idf_array,
    tf_component,
    write_params,
    write_vocabulary,
)
from searchr1.retrieval.checkpoint import fsync_file
from searchr1.retrieval.corpus import Document

RUN_PARTS = ("terms", "docs", "tf", "lens")
WORD_CACHE_LIMIT = 4_000_000
"""Surface words remembered with their column id (beyond it, words are stemmed again each time)."""


def _run_path(folder: Path, k: int, part: str) -> Path:
    suffix = "vocab.txt" if part == "vocab" else f"{part}.npy"
    return folder / f"run_{k:06d}.{suffix}"


class TermIds:
    """Word -> column id: stop words are -1, a new stem gets the next id (order of first appearance)."""

    def __init__(self, tokenizer: Tokenizer, terms: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(terms)}
        self.terms: list[str] = list(terms)
        self._words: dict[str, int] = {}

    def _miss(self, word: str) -> int:
        if word in self.tokenizer.stopwords:
            tid = -1
        else:
            stem = self.tokenizer.stem(word)
            tid = self.vocab.get(stem, -1)
            if tid < 0:
                tid = self.vocab[stem] = len(self.terms)
                self.terms.append(stem)
        if len(self._words) < WORD_CACHE_LIMIT:
            self._words[word] = tid
        return tid

    def __call__(self, words: list[str]) -> list[int]:
        """Column ids of ``words`` (stop words as -1)."""
        get = self._words.get
        ids = [get(w, -2) for w in words]
        if -2 in ids:
            ids = [i if i != -2 else self._miss(w) for i, w in zip(ids, words, strict=True)]
        return ids


class BM25StreamBuilder:
    """Pass 1 (``add_chunk``, one call per chunk in corpus order) and pass 2 (``finish``)."""

    def __init__(self, workdir: str | Path, params: BM25Params, chunks_done: int = 0):
        """``chunks_done``: runs already in ``workdir`` from an interrupted build (their vocabulary is
        read back; any later run files are stale and are overwritten)."""
        params.validate()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.params = params
        self.chunks = chunks_done
        self.passages = 0
        terms: list[str] = []
        for k in range(chunks_done):
            text = _run_path(self.workdir, k, "vocab").read_text(encoding="utf-8")
            terms.extend(text.splitlines())
            self.passages += len(np.load(_run_path(self.workdir, k, "lens"), mmap_mode="r"))
        self.term_ids = TermIds(Tokenizer(params.stemmer, params.stopwords), terms)

    def add_chunk(self, docs: list[Document]) -> None:
        """Tokenise one chunk and write its run (durably: a checkpoint may name it next)."""
        k, base = self.chunks, self.passages
        first_new = len(self.term_ids.terms)
        words = self.term_ids.tokenizer.words
        flat: list[int] = []
        sizes = np.empty(len(docs), dtype=np.int64)
        for j, d in enumerate(docs):
            ids = self.term_ids(words(f"{d.title} {d.text}"))
            flat.extend(ids)
            sizes[j] = len(ids)
        ids_arr = np.asarray(flat, dtype=np.int64)
        doc_local = np.repeat(np.arange(len(docs), dtype=np.int64), sizes)
        kept = ids_arr >= 0
        ids_arr, doc_local = ids_arr[kept], doc_local[kept]
        lens = np.bincount(doc_local, minlength=len(docs)).astype(np.uint32)
        key = ids_arr * max(len(docs), 1) + doc_local  # sorted by term, then document
        uniq, tf = np.unique(key, return_counts=True)
        run = {
            "terms": (uniq // max(len(docs), 1)).astype(np.uint32),
            "docs": (uniq % max(len(docs), 1) + base).astype(np.uint32),
            "tf": np.minimum(tf, np.iinfo(np.uint16).max).astype(np.uint16),
            "lens": lens,
        }
        for part, arr in run.items():
            path = _run_path(self.workdir, k, part)
            np.save(path, arr)
            fsync_file(path)
        path = _run_path(self.workdir, k, "vocab")
        path.write_text("".join(t + "\n" for t in self.term_ids.terms[first_new:]), encoding="utf-8")
        fsync_file(path)
        self.chunks += 1
        self.passages += len(docs)

    def finish(
        self, out: str | Path, memory_mb: float = 1024, progress: Callable[[int], None] | None = None
    ) -> int:
        """Write the index files into ``out`` (the ``bm25`` folder); returns the passage count.
        ``progress(n)`` is called with the postings placed so far."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        p = self.params
        terms = self.term_ids.terms
        if self.passages == 0:
            raise ValueError("cannot build a BM25 index from an empty corpus")
        if not terms:
            terms.append("\x00")  # a corpus of stop words only: one empty column, nothing will match
        runs = [{part: np.load(_run_path(self.workdir, k, part), mmap_mode="r") for part in RUN_PARTS}
                for k in range(self.chunks)]  # fmt: skip
        n_docs = self.passages
        lens = np.concatenate([r["lens"] for r in runs]).astype(np.int64)
        avg_len = float(lens.mean())
        df = np.zeros(len(terms), dtype=np.int64)
        for r in runs:
            df += np.bincount(r["terms"], minlength=len(terms))
        idf32, idf64 = idf_array(p.method, df, n_docs)
        nonocc = None
        if p.method in NONOCCURRENCE_METHODS:
            zero = tf_component(p.method, 0.0, avg_len, avg_len, p.k1, p.b, p.delta)
            nonocc = (idf64 * zero).astype(np.float32)
            nonocc[df == 0] = 0.0
            np.save(out / NONOCCURRENCE_FILE, nonocc)
        indptr = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        nnz = int(indptr[-1])
        np.save(out / INDPTR_FILE, indptr)
        data_out = np.lib.format.open_memmap(out / DATA_FILE, mode="w+", dtype=np.float32, shape=(nnz,))
        idx_out = np.lib.format.open_memmap(out / INDICES_FILE, mode="w+", dtype=np.int32, shape=(nnz,))
        term_max = np.zeros(len(terms), dtype=np.float32)
        budget = max(1, int(memory_mb * (1 << 20)) // 8)  # postings per range: 4 + 4 bytes each
        t0 = 0
        while t0 < len(terms):
            # the widest range of columns holding at most `budget` postings (at least one column)
            t1 = max(t0 + 1, int(np.searchsorted(indptr, indptr[t0] + budget, side="right")) - 1)
            t1 = min(t1, len(terms))
            lo, hi = int(indptr[t0]), int(indptr[t1])
            data = np.empty(hi - lo, dtype=np.float32)
            rows = np.empty(hi - lo, dtype=np.int32)
            cursor = indptr[t0:t1] - lo
            for r in runs:
                a, b = np.searchsorted(r["terms"], [t0, t1])
                if a == b:
                    continue
                t = np.asarray(r["terms"][a:b], dtype=np.int64)
                d = np.asarray(r["docs"][a:b], dtype=np.int64)
                tfc = tf_component(p.method, r["tf"][a:b], lens[d], avg_len, p.k1, p.b, p.delta)
                score = idf32[t].astype(np.float64) * tfc
                if nonocc is not None:
                    score -= nonocc[t]
                starts = np.flatnonzero(np.concatenate([[True], t[1:] != t[:-1]]))
                counts = np.diff(np.append(starts, len(t)))
                first = t[starts] - t0
                pos = np.repeat(cursor[first] - starts, counts) + np.arange(len(t))
                data[pos] = score
                rows[pos] = d
                cursor[first] += counts
            data_out[lo:hi] = data
            idx_out[lo:hi] = rows
            nonempty = df[t0:t1] > 0
            if hi > lo:
                term_max[t0:t1][nonempty] = np.maximum.reduceat(data, (indptr[t0:t1] - lo)[nonempty])
            if progress is not None:
                progress(hi)
            t0 = t1
        data_out.flush()
        idx_out.flush()
        del data_out, idx_out
        np.save(out / TERM_MAX_FILE, term_max)
        salt = write_vocabulary(out, terms)
        write_params(out, p, n_docs, terms, salt)
        return n_docs

    def remove_runs(self) -> None:
        for path in self.workdir.glob("run_*"):
            path.unlink()
