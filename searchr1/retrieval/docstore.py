"""Passage storage behind every local index: row number -> (id, title, text).

In memory (``DocStore(docs)``) or on disk (``docs.jsonl`` + ``docs.offsets.npy``) read through a memory
map, so a 21M-passage corpus costs page cache, not Python objects.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterable, Iterator, Sequence
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
        writer = DocStoreWriter(folder)
        for _ in writer.passing(docs):
            pass
        return writer.close()

    @staticmethod
    def open(folder: str | Path) -> MappedDocStore:
        return MappedDocStore(folder)


class DocStoreWriter:
    """Writes documents as they stream by (``passing``), so a corpus is read once and never held whole."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._fh = (self.folder / DOCS_FILE).open("wb")
        self._offsets = [0]

    def add(self, d: Document) -> None:
        line = json.dumps([d.id, d.title, d.text], ensure_ascii=False).encode("utf-8") + b"\n"
        self._fh.write(line)
        self._offsets.append(self._offsets[-1] + len(line))

    def passing(self, docs: Iterable[Document]) -> Iterator[Document]:
        """Yield ``docs`` unchanged, writing each one."""
        for d in docs:
            self.add(d)
            yield d

    def close(self) -> int:
        """Finish the files; returns the document count."""
        if not self._fh.closed:
            self._fh.close()
            np.save(self.folder / OFFSETS_FILE, np.asarray(self._offsets, dtype=np.int64))
        return len(self._offsets) - 1


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
