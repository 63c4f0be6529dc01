"""Index folders: build once from a corpus, load anywhere, refuse to load against the wrong corpus/model.

    build_index("corpus.jsonl", "idx/", retriever="bm25")
    retriever = load_index("idx/")                      # BM25Retriever or DenseRetriever
    load_index("idx/", corpus="other.jsonl")            # IndexMismatchError: checksum differs

Folder layout: ``manifest.json`` (retriever, model, corpus path + sha256, document count, creation
time, parameters), ``docs.jsonl`` + ``docs.offsets.npy`` (passages), and ``bm25/`` or ``dense/``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchr1.retrieval.base import Retriever
from searchr1.retrieval.corpus import file_sha256, read_corpus
from searchr1.retrieval.docstore import DocStore

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class IndexLoadError(ValueError):
    """An index folder is missing, incomplete, or does not match the corpus / model asked for."""


IndexMismatchError = IndexLoadError
"""Alias: the error raised when the corpus or model does not match the manifest."""


@dataclass
class Manifest:
    retriever: str
    corpus: str
    corpus_sha256: str
    num_documents: int
    created: str
    model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    chunk_size: int | None = None
    overlap: int = 0
    skipped_lines: int = 0
    format_version: int = FORMAT_VERSION

    def write(self, folder: Path) -> None:
        (folder / MANIFEST).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, folder: str | Path) -> Manifest:
        path = Path(folder) / MANIFEST
        if not Path(folder).is_dir():
            raise IndexLoadError(f"index folder not found: {folder}")
        if not path.is_file():
            raise IndexLoadError(
                f"{folder} is not an index folder (no {MANIFEST}); build one with `searchr1 index build`"
            )
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (json.JSONDecodeError, TypeError) as exc:
            raise IndexLoadError(f"{path} is not a valid index manifest: {exc}") from exc


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
) -> Manifest:
    """Read ``corpus``, write the passages and the ``retriever`` index (bm25 | dense) into ``out``."""
    out = Path(out)
    if retriever not in ("bm25", "dense"):
        raise ValueError(f"index build supports retriever bm25 or dense, not {retriever!r}")
    reader = read_corpus(corpus, chunk_size, overlap, skip_bad_lines)
    docs = list(reader)
    if not docs:
        raise ValueError(f"corpus {corpus} holds no documents")
    out.mkdir(parents=True, exist_ok=True)
    params: dict[str, Any] = {}
    model_name = None
    if retriever == "bm25":
        from searchr1.retrieval.bm25 import BM25Params, BM25Retriever

        bm = BM25Retriever.from_documents(docs, BM25Params(**(bm25 or {})))
        bm.save(out)
        params = asdict(bm.params)
    else:
        from searchr1.retrieval.dense import DenseRetriever, Encoder

        encoder = Encoder(model, device=device, batch_size=batch_size)
        dense = DenseRetriever.from_documents(
            docs, encoder=encoder, index_type=index_type, show_progress=show_progress
        )
        dense.save(out)
        params = asdict(dense.params)
        model_name = encoder.label
    DocStore.write(docs, out)
    manifest = Manifest(
        retriever=retriever,
        corpus=str(Path(corpus).resolve()),
        corpus_sha256=file_sha256(corpus),
        num_documents=len(docs),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        model=model_name,
        params=params,
        chunk_size=chunk_size,
        overlap=overlap,
        skipped_lines=reader.skipped,
    )
    manifest.write(out)
    return manifest


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
        from searchr1.retrieval.dense import model_label

        if manifest.retriever != "dense":
            raise IndexLoadError(f"index {folder} is a {manifest.retriever} index; it has no encoder model")
        if model_label(model) != manifest.model:
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
) -> Retriever:
    """Open an index folder as a retriever, checking its manifest (and ``corpus`` / ``model`` if given)."""
    folder = Path(folder)
    manifest = Manifest.read(folder)
    check_manifest(manifest, folder, corpus, model)
    try:
        docs = DocStore.open(folder)
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index {folder} is incomplete: {exc.filename} is missing") from exc
    if len(docs) != manifest.num_documents:
        raise IndexLoadError(
            f"index {folder} is inconsistent: manifest says {manifest.num_documents} documents, store holds {len(docs)}"
        )
    try:
        if manifest.retriever == "bm25":
            from searchr1.retrieval.bm25 import BM25Retriever

            return BM25Retriever.load(folder, docs, mmap=mmap)
        if manifest.retriever == "dense":
            from searchr1.retrieval.dense import DenseRetriever

            return DenseRetriever.load(
                folder, docs, model=model, nprobe=nprobe, ef_search=ef_search, device=device
            )
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index {folder} is incomplete: {exc.filename} is missing") from exc
    raise IndexLoadError(f"index {folder}: unknown retriever {manifest.retriever!r} in {MANIFEST}")
