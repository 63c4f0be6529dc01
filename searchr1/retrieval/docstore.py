"""Passage storage behind every local index: row number -> (id, title, text).

In memory (``DocStore(docs)``) or on disk (``docs.jsonl`` + ``docs.offsets.npy``) read through a memory
map, so a 21M-passage corpus costs page cache, not Python objects.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from searchr1.retrieval.corpus import Document

DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "docs.offsets.npy"


class DocStore:
    """Random access to documents by row number."""

    def __init__(self, docs: Sequence[Document]):
        self._docs = list(docs)

    def __len__(self) -> int:
        return len(self._docs)

    def __getitem__(self, row: int) -> Document:
        return self._docs[row]

    def close(self) -> None:
        pass

    @staticmethod
    def write(docs: Iterable[Document], folder: str | Path) -> int:
        """Write documents to ``folder``; returns how many were written."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        offsets = [0]
        with (folder / DOCS_FILE).open("wb") as fh:
            for d in docs:
                line = json.dumps([d.id, d.title, d.text], ensure_ascii=False).encode("utf-8") + b"\n"
                fh.write(line)
                offsets.append(offsets[-1] + len(line))
        np.save(folder / OFFSETS_FILE, np.asarray(offsets, dtype=np.int64))
        return len(offsets) - 1

    @staticmethod
    def open(folder: str | Path) -> MappedDocStore:
        return MappedDocStore(folder)


class MappedDocStore(DocStore):
    """Documents read lazily from ``docs.jsonl`` through a memory map."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self.offsets = np.load(folder / OFFSETS_FILE, mmap_mode="r")
        self._fh = (folder / DOCS_FILE).open("rb")
        size = (folder / DOCS_FILE).stat().st_size
        self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> Document:
        if not 0 <= row < len(self):
            raise IndexError(row)
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        doc_id, title, text = json.loads(self._map[start:end])
        return Document(doc_id, title, text)

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            self._map.close()
        self._fh.close()
