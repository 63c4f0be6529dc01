"""Index folders: build once from a corpus, load anywhere, refuse to load against the wrong corpus/model.

    build_index("corpus.jsonl", "idx/", retriever="bm25")
    retriever = load_index("idx/")                      # BM25Retriever or DenseRetriever
    load_index("idx/", corpus="other.jsonl")            # IndexMismatchError: checksum differs

Folder layout: ``manifest.json`` (retriever, model, corpus path + sha256, document count, creation
time, parameters; written last), the passage store (``docs.zst`` + ``docs.blocks.npy`` +
``docs.store.json``; ``docs.jsonl`` + ``docs.offsets.npy`` from earlier versions), and ``bm25/`` or
``dense/``; while a build runs (or after it was interrupted) also ``.build/`` (see
:mod:`searchr1.retrieval.build`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searchr1.retrieval.base import Retriever
from searchr1.retrieval.bm25 import BM25Retriever
from searchr1.retrieval.bm25.errors import REBUILD, DamagedIndex
from searchr1.retrieval.bm25.store import DocStore
from searchr1.retrieval.build import BuildRequest, run_build
from searchr1.retrieval.corpus import file_sha256
from searchr1.retrieval.dense import DenseRetriever, model_label, same_encoder
from searchr1.retrieval.manifest import MANIFEST, IndexLoadError, IndexMismatchError, Manifest

__all__ = ["MANIFEST", "IndexLoadError", "IndexMismatchError", "Manifest", "build_index", "load_index"]


def build_index(
    corpus: str | Path,
    out: str | Path,
    retriever: str = "bm25",
    chunk_size: int | None = None,
    overlap: int = 0,
    skip_bad_lines: bool = False,
    bm25: dict[str, Any] | None = None,
    model: str | None = None,
    index_type: str = "flat",
    batch_size: int = 64,
    device: str | None = None,
    show_progress: bool = True,
    resume: bool | None = None,
    chunk_passages: int = 20_000,
    memory_mb: float = 512,
    dense: dict[str, Any] | None = None,
    workers: int = 1,
) -> Manifest:
    """Read ``corpus`` once, in chunks of ``chunk_passages``, and write the passages and the
    ``retriever`` index (bm25 | dense) into ``out``; see :mod:`searchr1.retrieval.build` for the
    checkpoints (``resume``), the memory bound (``memory_mb``), the first pass's processes
    (``workers``) and the dense options (``dense``: ``nlist``, ``pq_m``, ``hnsw_m``,
    ``ef_construction``, ``train_size``)."""
    return run_build(
        BuildRequest(
            corpus=Path(corpus), out=Path(out), retriever=retriever, chunk_size=chunk_size,
            overlap=overlap, skip_bad_lines=skip_bad_lines, bm25=bm25 or {}, model=model,
            index_type=index_type, batch_size=batch_size, device=device, show_progress=show_progress,
            resume=resume, chunk_passages=chunk_passages, memory_mb=memory_mb, dense=dense or {},
            workers=workers,
        )
    )  # fmt: skip


def check_manifest(
    manifest: Manifest, folder: str | Path, corpus: str | Path | None, model: str | None
) -> None:
    """Raise ``IndexMismatchError`` when ``corpus`` / ``model`` differ from what the index was built from."""
    if corpus is not None:
        if not Path(corpus).is_file():
            raise IndexLoadError(f"corpus file not found: {corpus}")
        digest = file_sha256(corpus)
        if digest != manifest.corpus_sha256:
            raise IndexLoadError(
                f"index {folder} was built from a different corpus: manifest has {manifest.corpus} "
                f"(sha256 {manifest.corpus_sha256[:12]}…), {corpus} has sha256 {digest[:12]}…; rebuild the index"
            )
    if model is not None:
        if manifest.retriever != "dense":
            raise IndexLoadError(f"index {folder} is a {manifest.retriever} index; it has no encoder model")
        if not same_encoder(model, manifest.model):
            raise IndexLoadError(
                f"index {folder} was built with encoder {manifest.model!r}, not {model_label(model)!r}; "
                "query vectors would not match the passage vectors"
            )


def load_index(
    folder: str | Path,
    corpus: str | Path | None = None,
    model: str | None = None,
    mmap: bool = True,
    nprobe: int | None = None,
    ef_search: int | None = None,
    device: str | None = None,
    threads: int = 1,
) -> Retriever:
    """Open an index folder as a retriever, checking its manifest (and ``corpus`` / ``model`` if given);
    ``threads``: BM25 searches each batch on that many threads."""
    folder = Path(folder)
    manifest = Manifest.read(folder)
    check_manifest(manifest, folder, corpus, model)
    how = REBUILD.replace("CORPUS", manifest.corpus or "CORPUS").replace("FOLDER", str(folder))
    try:
        docs = DocStore.open(folder)
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index {folder} is incomplete: {exc.filename} is missing") from exc
    except DamagedIndex as exc:
        raise IndexLoadError(str(exc).replace(REBUILD, how)) from None
    if len(docs) != manifest.num_documents:
        raise IndexLoadError(
            f"index {folder} is inconsistent: manifest says {manifest.num_documents} documents, store holds {len(docs)}"
        )
    try:
        if manifest.retriever == "bm25":
            return BM25Retriever.load(folder, docs, mmap=mmap, threads=threads)
        if manifest.retriever == "dense":
            return DenseRetriever.load(
                folder, docs, model=model, nprobe=nprobe, ef_search=ef_search, device=device
            )
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index {folder} is incomplete: {exc.filename} is missing") from exc
    except DamagedIndex as exc:
        raise IndexLoadError(str(exc).replace(REBUILD, how)) from None
    raise IndexLoadError(f"index {folder}: unknown retriever {manifest.retriever!r} in {MANIFEST}")
