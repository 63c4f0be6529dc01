"""``manifest.json``: what an index folder holds, written last and atomically, read first.

A folder without a manifest is not an index: a build writes the manifest only once every other file
is complete (via a temporary file renamed into place, so a crash or a full disk never leaves half a
manifest), and ``load_index`` / ``serve`` refuse a folder without one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchr1.retrieval.checkpoint import build_dir, read_state

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
"""2: streamed BM25 (hashed vocabulary, column maxima) and dense kinds with PQ; 1 still loads."""


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
    build: dict[str, Any] = field(default_factory=dict)
    """How the build went: seconds, chunks, whether it was resumed, bytes on disk."""

    def write(self, folder: Path) -> None:
        """Write atomically (temporary file, fsync, rename)."""
        tmp = folder / (MANIFEST + ".tmp")
        with tmp.open("w") as fh:
            fh.write(json.dumps(asdict(self), indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / MANIFEST)

    @classmethod
    def read(cls, folder: str | Path) -> Manifest:
        path = Path(folder) / MANIFEST
        if not Path(folder).is_dir():
            raise IndexLoadError(f"index folder not found: {folder}")
        if not path.is_file():
            if build_dir(folder).is_dir():
                try:
                    state = read_state(folder)
                except ValueError:
                    state = None
                done = f" ({state.passages} passages read)" if state else ""
                raise IndexLoadError(
                    f"{folder} holds an unfinished build{done}, not an index: finish it with "
                    "`searchr1 index build ... --resume` (same options)"
                )
            raise IndexLoadError(
                f"{folder} is not an index folder (no {MANIFEST}); build one with `searchr1 index build`"
            )
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (json.JSONDecodeError, TypeError) as exc:
            raise IndexLoadError(f"{path} is not a valid index manifest: {exc}") from exc
