"""Passage storage behind every local index: row number -> (id, title, text).

In memory (``DocStore(docs)``) or on disk (``docs.jsonl`` + ``docs.offsets.npy``) read through a memory
map, so a 21M-passage corpus costs page cache, not Python objects.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from searchr1.retrieval.corpus import Document

_ID_DECODER = json.JSONDecoder()
DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "docs.offsets.npy"
OFFSETS_RAW = "docs.offsets.bin"


class DocStore:
    """Random access to documents by row number."""

    def __init__(self, docs: Sequence[Document]):
        self._docs = list(docs)

    def __len__(self) -> int:
        return len(self._docs)

    def __getitem__(self, row: int) -> Document:
        return self._docs[row]

    def doc_id(self, row: int) -> str:
        """The id of a row's document (cheaper than the document on disk)."""
        return self._docs[row].id

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
    """Writes documents as they stream by (``passing``), so a corpus is read once and never held whole.

    Row offsets go to a raw ``docs.offsets.bin`` as they are known and become ``docs.offsets.npy`` on
    ``close``; ``resume_at`` reopens the files of an interrupted build, cut back to a checkpoint.
    """

    def __init__(self, folder: str | Path, resume_at: tuple[int, int] | None = None):
        """``resume_at``: (documents, bytes of ``docs.jsonl``) recorded at the checkpoint to go on from."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        docs_path, raw_path = self.folder / DOCS_FILE, self.folder / OFFSETS_RAW
        if resume_at is not None and not raw_path.exists() and (self.folder / OFFSETS_FILE).exists():
            # stopped between finishing the offsets and recording it: start from the finished ones
            np.load(self.folder / OFFSETS_FILE, mmap_mode="r")[: resume_at[0] + 1].tofile(raw_path)
        (self.folder / OFFSETS_FILE).unlink(missing_ok=True)
        if resume_at is None:
            self._fh = docs_path.open("wb")
            self._raw = raw_path.open("wb")
            self._raw.write(np.zeros(1, dtype=np.int64).tobytes())
            self.count, self.bytes = 0, 0
        else:
            self.count, self.bytes = resume_at
            self._fh = docs_path.open("r+b")
            self._fh.truncate(self.bytes)
            self._fh.seek(self.bytes)
            self._raw = raw_path.open("r+b")
            self._raw.truncate((self.count + 1) * 8)
            self._raw.seek((self.count + 1) * 8)
        self._pending: list[int] = []

    def add(self, d: Document) -> None:
        line = json.dumps([d.id, d.title, d.text], ensure_ascii=False).encode("utf-8") + b"\n"
        self._fh.write(line)
        self.bytes += len(line)
        self.count += 1
        self._pending.append(self.bytes)
        if len(self._pending) >= 65536:
            self._flush_offsets()

    def passing(self, docs: Iterable[Document]) -> Iterator[Document]:
        """Yield ``docs`` unchanged, writing each one."""
        for d in docs:
            self.add(d)
            yield d

    def _flush_offsets(self) -> None:
        self._raw.write(np.asarray(self._pending, dtype=np.int64).tobytes())
        self._pending = []

    def sync(self) -> tuple[int, int]:
        """Push everything written so far to disk; returns (documents, bytes) for a checkpoint."""
        self._flush_offsets()
        for fh in (self._fh, self._raw):
            fh.flush()
            os.fsync(fh.fileno())
        return self.count, self.bytes

    def close(self) -> int:
        """Finish the files (``docs.offsets.npy`` from the raw offsets); returns the document count."""
        if not self._fh.closed:
            self._flush_offsets()
            self._fh.close()
            self._raw.close()
            raw_path = self.folder / OFFSETS_RAW
            offsets = np.memmap(raw_path, dtype=np.int64, mode="r", shape=(self.count + 1,))
            out = np.lib.format.open_memmap(
                self.folder / OFFSETS_FILE, mode="w+", dtype=np.int64, shape=(self.count + 1,)
            )
            for start in range(0, self.count + 1, 1 << 22):
                out[start : start + (1 << 22)] = offsets[start : start + (1 << 22)]
            out.flush()
            del offsets, out
            raw_path.unlink()
        return self.count

    def abort(self) -> None:
        """Close the files as they are (a checkpoint may still resume them)."""
        for fh in (self._fh, self._raw):
            if not fh.closed:
                with contextlib.suppress(OSError):
                    fh.close()


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

    def doc_id(self, row: int) -> str:
        if not 0 <= row < len(self):
            raise IndexError(row)
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        line = self._map[start : min(end, start + 512)].decode("utf-8", "ignore")
        try:
            return _ID_DECODER.raw_decode(line, 1)[0]  # the first item of ["id", "title", "text"]
        except json.JSONDecodeError:  # an id longer than the slice read
            return self[row].id

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            self._map.close()
        self._fh.close()
