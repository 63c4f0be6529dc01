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
from searchr1.retrieval.bm25 import BM25Params, BM25Retriever, build_bm25_model
from searchr1.retrieval.corpus import file_sha256, read_corpus
from searchr1.retrieval.dense import (
    DenseParams,
    DenseRetriever,
    Encoder,
    build_faiss_index,
    encode_stream,
    model_label,
    same_encoder,
)
from searchr1.retrieval.docstore import DocStore, DocStoreWriter

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
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a failed rebuild must not leave an old manifest behind
    writer = DocStoreWriter(out)  # the corpus is read once, passages written as they stream by
    model_name = None
    try:
        if retriever == "bm25":
            bm25_params = BM25Params(**(bm25 or {}))
            bm25_model = build_bm25_model(writer.passing(reader), bm25_params)
            BM25Retriever(bm25_model, DocStore([]), bm25_params).save(out)
            params: dict[str, Any] = asdict(bm25_params)
        else:
            encoder = Encoder(model, device=device, batch_size=batch_size)
            vectors = encode_stream(encoder, writer.passing(reader), show_progress=show_progress)
            if len(vectors) == 0:
                raise ValueError(f"corpus {corpus} holds no documents")
            dense_params = DenseParams(encoder.label, index_type, encoder.dim)
            DenseRetriever(encoder, build_faiss_index(vectors, index_type), DocStore([]), dense_params).save(
                out
            )
            params = asdict(dense_params)
            model_name = encoder.label
    finally:
        count = writer.close()
    manifest = Manifest(
        retriever=retriever,
        corpus=str(Path(corpus).resolve()),
        corpus_sha256=file_sha256(corpus),
        num_documents=count,
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
            return BM25Retriever.load(folder, docs, mmap=mmap)
        if manifest.retriever == "dense":
            return DenseRetriever.load(
                folder, docs, model=model, nprobe=nprobe, ef_search=ef_search, device=device
            )
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index {folder} is incomplete: {exc.filename} is missing") from exc
    raise IndexLoadError(f"index {folder}: unknown retriever {manifest.retriever!r} in {MANIFEST}")
