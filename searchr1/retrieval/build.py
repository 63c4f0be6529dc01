"""The streaming build behind ``searchr1 index build``: read once, in chunks, checkpointed, bounded memory.

    corpus --chunks of lines--> workers: parse, analyse, compress (``bm25.first_pass``)
           --> passage store (docs.zst, compressed passages)          every chunk: fsync, then
           \\-> bm25 runs | dense vectors on disk                       .build/state.json
    end of corpus --> bm25: scores column range by range | dense: train on a sample, add in blocks
                  --> manifest.json, written last (atomically); .build/ removed

The first pass runs on ``workers`` processes (``bm25.first_pass``); whatever their number, every file
written is the same byte for byte. Memory: each worker holds one chunk (``chunk_passages`` lines), and
no more workers are started than ``memory_mb`` holds chunks of (``PASS1_BYTES_PER_PASSAGE``); the
final pass merges ``memory_mb`` of postings at a time.

An interrupted build (killed, machine rebooted, disk full) leaves ``.build/state.json`` naming the last
finished chunk; ``resume=True`` continues from there after checking that the corpus has the same
sha256 and the build the same settings (refused otherwise, naming the checksums). A folder with no
manifest is never loaded, so a half-built index cannot be served. Progress bars show the corpus bytes
read (with a rate and an ETA) and the passages per second.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retrieval.bm25 import BM25_DIR, BM25Params
from searchr1.retrieval.bm25.build import BM25StreamBuilder, min_memory_mb
from searchr1.retrieval.bm25.first_pass import (
    AnalysedChunk,
    Pass1Spec,
    analysed_chunks,
    chunk_spans,
    commit_lines,
    store_dictionary,
    validate_chunking,
)
from searchr1.retrieval.bm25.store import STORE_FILES, DocStoreWriter
from searchr1.retrieval.checkpoint import (
    BuildState,
    IndexBuildError,
    build_dir,
    check_resumable,
    clear_state,
    disk_errors,
    fsync_file,
    read_state,
    write_state,
)
from searchr1.retrieval.corpus import ReadPosition, file_sha256
from searchr1.retrieval.dense import DENSE_DIR, INDEX_FILE, PARAMS_FILE, DenseParams, Encoder
from searchr1.retrieval.dense_build import DenseIndexSpec, fill_index, new_index, training_sample
from searchr1.retrieval.ids import SeenIds
from searchr1.retrieval.manifest import MANIFEST, Manifest

RUNS_DIR = "bm25_runs"
VECTORS_FILE = "vectors.f32"
IDS_FILE = "ids.u64"
"""The hashes of the passage ids read so far (``ids.SeenIds``), in the checkpoint folder."""
PARTIAL_INDEX = "partial.faiss"
STORE_SETTING = "zstd-frames"
"""The passage store a build writes (``bm25.store``), in the settings: a build interrupted by an
earlier version (another store, chunks of passages) is not resumed."""
PASS1_BYTES_PER_PASSAGE = 6000
"""A pass-1 worker's peak memory a passage of its chunk, beyond its ~110 MB of libraries (measured on
generated wiki-like passages: 5.8 kB at chunks of 50,000, 7 kB at 10,000)."""


@dataclass
class BuildRequest:
    corpus: Path
    out: Path
    retriever: str = "bm25"
    chunk_size: int | None = None
    overlap: int = 0
    skip_bad_lines: bool = False
    bm25: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    index_type: str = "flat"
    batch_size: int = 64
    device: str | None = None
    show_progress: bool = True
    resume: bool | None = None
    """None: refuse when an unfinished build is in ``out``; True: continue it; False: start again."""
    chunk_passages: int = 20_000
    """Lines per chunk (a passage each, or several with ``chunk_size``; fewer when the lines are long,
    ``bm25.first_pass.CHUNK_BYTES_PER_PASSAGE``): the unit of memory (one chunk's tokens or vectors),
    of the workers' tasks and of checkpoints."""
    workers: int = 1
    """Processes of the first pass (parse, analyse, compress; ``bm25.first_pass``); 1: this process.
    Fewer are started when ``memory_mb`` does not hold a chunk for each. The index does not depend on
    it. The processes are ``spawn``ed: a script that builds with several needs Python's
    ``if __name__ == "__main__":`` guard around what it runs."""
    memory_mb: float = 512
    """BM25: the postings merged at a time in the final pass (``bm25.build.BYTES_PER_POSTING`` each);
    with one chunk of the first pass, what bounds the build's memory."""
    dense: dict[str, Any] = field(default_factory=dict)
    """Dense index options: nlist, pq_m, hnsw_m, ef_construction, train_size."""
    checkpoint_vectors: int = 2_000_000
    """Dense: save the partly filled index every this many vectors added."""


class _Bar:
    """A tqdm bar, or nothing when progress is off."""

    def __init__(self, show: bool, **kwargs: Any):
        self.bar = None
        if show:
            from tqdm import tqdm

            self.bar = tqdm(**kwargs)

    def to(self, n: int, **postfix: Any) -> None:
        if self.bar is not None:
            self.bar.update(n - self.bar.n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _BM25Sink:
    """Pass 1 into runs under ``.build/bm25_runs``; pass 2 into ``bm25/``."""

    def __init__(self, req: BuildRequest):
        self.params = BM25Params.from_preset(**req.bm25)
        self.params.validate()
        self.req = req
        self.builder: BM25StreamBuilder | None = None

    def settings(self) -> dict[str, Any]:
        return {"bm25": asdict(self.params)}

    def start(self, state: BuildState) -> None:
        self.builder = BM25StreamBuilder(build_dir(self.req.out) / RUNS_DIR, self.params, state.chunks)

    def pass1(self, store_dict: bytes | None) -> Pass1Spec:
        return Pass1Spec(str(self.req.corpus), self.req.chunk_size, self.req.overlap, self.params,
                         str(build_dir(self.req.out) / RUNS_DIR), store_dict=store_dict)  # fmt: skip

    def add(self, chunk: AnalysedChunk, state: BuildState, remaining: float | None = None) -> None:
        self.builder.add_chunk(chunk, remaining)

    def discard_ahead(self) -> None:
        """Remove runs that workers wrote for chunks not added (a build stopped on an error)."""
        if self.builder is not None:
            self.builder.drop_uncommitted()

    def finish(self, state: BuildState) -> dict[str, Any]:
        total = self.builder.postings()
        bar = _Bar(self.req.show_progress, total=total, unit="posting", unit_scale=True, desc="bm25: scoring")
        try:
            self.builder.finish(self.req.out / BM25_DIR, self.req.memory_mb, progress=bar.to)
        finally:
            bar.close()
        self.builder.remove_runs()
        return asdict(self.params)


class _DenseSink:
    """Passages encoded chunk by chunk into ``.build/vectors.f32``; then the index from that file."""

    def __init__(self, req: BuildRequest):
        self.req = req
        self.spec = DenseIndexSpec(req.index_type, **req.dense)
        self.spec.validate()
        self.encoder = Encoder(req.model, device=req.device, batch_size=req.batch_size)
        self.spec.validate(self.encoder.dim)
        self.vectors = build_dir(req.out) / VECTORS_FILE

    def settings(self) -> dict[str, Any]:
        return {"model": self.encoder.label, "dim": self.encoder.dim, "index": asdict(self.spec)}

    def start(self, state: BuildState) -> None:
        size = state.passages * self.encoder.dim * 4
        self.vectors.parent.mkdir(parents=True, exist_ok=True)
        with self.vectors.open("ab") as fh:
            fh.truncate(size)  # drop vectors written after the last checkpoint

    def pass1(self, store_dict: bytes | None) -> Pass1Spec:
        return Pass1Spec(str(self.req.corpus), self.req.chunk_size, self.req.overlap, keep_docs=True,
                         store_dict=store_dict)  # fmt: skip

    def discard_ahead(self) -> None:
        pass

    def add(self, chunk: AnalysedChunk, state: BuildState, remaining: float | None = None) -> None:
        docs = chunk.docs or []
        if not docs:
            return
        vecs = self.encoder.encode_passages(docs)
        with self.vectors.open("ab") as fh:
            fh.write(np.ascontiguousarray(vecs, dtype=np.float32).tobytes())
        fsync_file(self.vectors)

    def finish(self, state: BuildState) -> dict[str, Any]:
        import faiss

        n, dim = state.passages, self.encoder.dim
        if n == 0:
            raise ValueError(f"corpus {self.req.corpus} holds no documents")
        vectors = np.memmap(self.vectors, dtype=np.float32, mode="r", shape=(n, dim))
        partial = build_dir(self.req.out) / PARTIAL_INDEX
        added = int(state.extra.get("added", 0))
        if added and partial.is_file():
            index = faiss.read_index(str(partial))
        else:
            added = 0
            index = new_index(self.spec, dim, n)
            if not index.is_trained:
                index.train(training_sample(vectors, self.spec.training_rows(n)))

        def checkpoint(idx, done: int) -> None:
            faiss.write_index(idx, str(partial) + ".tmp")
            fsync_file(str(partial) + ".tmp")
            Path(str(partial) + ".tmp").replace(partial)
            state.extra["added"] = done
            write_state(self.req.out, state)

        bar = _Bar(self.req.show_progress, total=n, initial=added, unit="vec", unit_scale=True,
                   desc=f"dense: {self.spec.kind} index")  # fmt: skip
        try:
            fill_index(index, vectors, start=added, progress=bar.to, checkpoint=checkpoint,
                       checkpoint_every=self.req.checkpoint_vectors)  # fmt: skip
        finally:
            bar.close()
        out = self.req.out / DENSE_DIR
        out.mkdir(parents=True, exist_ok=True)
        faiss.write_index(index, str(out / INDEX_FILE))
        params = DenseParams(
            self.encoder.label, self.spec.kind, dim, nlist=self.spec.cells(n) if "ivf" in self.spec.kind else None,
            pq_m=self.spec.code_bytes(dim) if "pq" in self.spec.kind else None,
            hnsw_m=self.spec.hnsw_m if "hnsw" in self.spec.kind else None,
        )  # fmt: skip
        (out / PARAMS_FILE).write_text(json.dumps(asdict(params), indent=2))
        return asdict(params)


def _clear_outputs(out: Path) -> None:
    """Remove what an earlier build may have left in ``out`` (only the files a build writes)."""
    for name in (MANIFEST, *STORE_FILES):
        (out / name).unlink(missing_ok=True)
    for sub in (BM25_DIR, DENSE_DIR):
        shutil.rmtree(out / sub, ignore_errors=True)
    clear_state(out)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run_build(req: BuildRequest) -> Manifest:
    """Build (or resume building) the index ``req`` describes; returns the manifest written last."""
    if req.retriever not in ("bm25", "dense"):
        raise ValueError(f"index build supports retriever bm25 or dense, not {req.retriever!r}")
    if req.retriever == "bm25" and req.memory_mb < (least := min_memory_mb(req.chunk_passages)):
        raise ValueError(
            f"--memory-mb {req.memory_mb:g} is below what one chunk of {req.chunk_passages:,} passages needs "
            f"in the merge ({least:.2f} MB): raise --memory-mb or lower --chunk-passages"
        )
    validate_chunking(req.chunk_size, req.overlap)
    if req.workers < 1:
        raise ValueError(f"workers must be >= 1, got {req.workers}")
    if not Path(req.corpus).is_file():
        raise ValueError(f"corpus file not found: {req.corpus}")
    t_start = time.perf_counter()
    sink = _BM25Sink(req) if req.retriever == "bm25" else _DenseSink(req)
    settings = {"retriever": req.retriever, "chunk_size": req.chunk_size, "overlap": req.overlap,
                "chunk_passages": req.chunk_passages, "store": STORE_SETTING, **sink.settings()}  # fmt: skip
    req.out.mkdir(parents=True, exist_ok=True)
    digest = file_sha256(req.corpus)
    state = read_state(req.out)
    if state is not None and req.resume is None:
        raise IndexBuildError(
            f"{req.out} holds an unfinished build ({state.passages} passages read, phase {state.phase}): "
            "pass --resume to continue it or --restart to start again"
        )
    resumed = state is not None and bool(req.resume)
    if resumed:
        check_resumable(state, digest, str(req.corpus), settings)
        (req.out / MANIFEST).unlink(missing_ok=True)
    else:
        _clear_outputs(req.out)
        state = BuildState(req.retriever, str(Path(req.corpus).resolve()), digest, settings)
    workers = None  # the first pass's processes (None: it was done before this run)
    with disk_errors(req.out):
        write_state(req.out, state)
        sink.start(state)
        if state.phase == "read":
            workers = _read_phase(req, sink, state, resumed)
        params = sink.finish(state)
        manifest = Manifest(
            retriever=req.retriever,
            corpus=str(Path(req.corpus).resolve()),
            corpus_sha256=digest,
            num_documents=state.passages,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            model=params.get("model") if req.retriever == "dense" else None,
            params=params,
            chunk_size=req.chunk_size,
            overlap=req.overlap,
            skipped_lines=state.skipped,
            build={
                "seconds_this_run": round(time.perf_counter() - t_start, 3),
                "resumed": resumed,
                "chunks": state.chunks,
                "workers": workers,
            },
        )
        clear_state(req.out)
        manifest.build["bytes"] = folder_bytes(req.out)
        manifest.write(req.out)
    return manifest


def pass1_workers(req: BuildRequest) -> int:
    """The workers of the first pass: as asked, but no more than ``memory_mb`` holds chunks of (one
    always: a build held one chunk before it had workers). At the defaults (20,000 lines a chunk,
    512 MB): 4."""
    per_chunk = req.chunk_passages * PASS1_BYTES_PER_PASSAGE
    return max(1, min(req.workers, int(req.memory_mb * (1 << 20) // max(per_chunk, 1))))


def _read_phase(req: BuildRequest, sink, state: BuildState, resumed: bool) -> int:
    """Stream the corpus chunk by chunk (``bm25.first_pass``) into the passage store and the sink,
    checkpointing each chunk; returns the workers used."""
    if resumed and state.chunks:  # the dictionary written when the build started
        writer = DocStoreWriter(req.out, resume_at=(state.passages, state.docstore_bytes))
    else:
        writer = DocStoreWriter(req.out, dictionary=store_dictionary(req.corpus, req.chunk_size, req.overlap))
    seen = SeenIds(build_dir(req.out) / IDS_FILE, state.passages if resumed else 0)
    size = Path(req.corpus).stat().st_size
    bar = _Bar(req.show_progress, total=size, initial=state.offset, unit="B", unit_scale=True,
               unit_divisor=1024, desc=f"{req.retriever}: reading corpus")  # fmt: skip
    t0, start_passages = time.perf_counter(), state.passages
    workers = pass1_workers(req)
    spec = sink.pass1(writer.dictionary)
    chunks = analysed_chunks(spec, chunk_spans(req.corpus, state.position, req.chunk_passages, state.chunks),
                             workers)  # fmt: skip
    try:
        for analysed in chunks:
            chunk = commit_lines(analysed, spec, seen, req.skip_bad_lines)
            writer.append(chunk.frames, chunk.sizes)
            sink.add(chunk, state, 1 - chunk.span.end / max(size, 1))
            seen.sync()
            count, nbytes = writer.sync()
            skipped = state.skipped + len(chunk.bad) + len(chunk.skipped_repeats)
            state.advance(ReadPosition(chunk.span.end, chunk.end_lineno, skipped), count, nbytes)
            write_state(req.out, state)
            rate = (count - start_passages) / max(time.perf_counter() - t0, 1e-9)
            bar.to(chunk.span.end, passages=count, per_s=f"{rate:,.0f}")
        if state.passages == 0:
            clear_state(req.out)
            raise ValueError(f"corpus {req.corpus} holds no documents")
        writer.close()
    except BaseException:
        writer.abort()
        chunks.close()  # the workers stopped before their runs are removed
        sink.discard_ahead()
        raise
    finally:
        chunks.close()
        seen.close()
        bar.close()
    state.phase = "index"
    write_state(req.out, state)
    return workers
