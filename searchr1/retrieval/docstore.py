"""Passage storage behind every local index: row number -> (id, title, text), and the hit's wire form.

In memory (``DocStore(docs)``) or on disk. On disk, store format 2 (``docs.zst``, written by this
version) holds the passages in small zstd-compressed blocks:

``docs.zst``
    the blocks, one zstd frame each (level ``LEVEL``, with its content size and the codec's XXH64
    checksum, so that a damaged block fails to decode instead of decoding to other bytes). A block
    holds up to ``BLOCK_PASSAGES`` consecutive passages (fewer once its text reaches ``BLOCK_BYTES``,
    and at the end of each chunk of the build); decompressed, its records joined by ``\\n``.
``docs.blocks.npy``
    int64, shape (blocks + 1, 2): block ``b``'s first byte in ``docs.zst`` and its first passage row;
    the last row is (the file's size, the passage count). Row ``r`` is in block
    ``searchsorted(first_rows, r, "right") - 1``.
``docs.store.json``
    the format, codec, level, block limits, counts, and the CRC-32 of ``docs.blocks.npy``.

A record is ``{title length} {fragment}``: the title's length in characters (decimal), a space, and the
passage exactly as the retrieval server sends it, ``{"id":ID,"contents":"\\"Title\\"\\ntext"}``
(``document_json``: orjson's UTF-8 JSON, no raw newline in it). The fragment goes on the wire as it
is (``Hit.wire``); the title and text are cut out of ``contents`` by the length
(``contents = '"' + title + '"\\n' + text``), so every title, a newline or quote in it too, comes back
exactly. Reading a passage decompresses its block (~10 KB: tens of microseconds); the last
``CACHE_BLOCKS`` decoded blocks are kept. A block that fails to decode (checksum, size, record count)
is refused in one line that says how to rebuild (``DamagedIndex``).

Store format 1 (earlier versions: ``docs.jsonl``, one ``["id", "title", "text"]`` line a passage, and
``docs.offsets.npy``, each line's first byte) still loads, through a memory map
(``MappedDocStore``); ``write_jsonl_store`` writes it (tests of that path).

Measured on 100k generated passages (540 bytes a record): 2.35x smaller than the records at 16
passages a block, level 3; a trained dictionary added 5% (not used: it would not clearly pay).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path

import numpy as np
import orjson
import zstandard

from searchr1.retrieval.bm25_blocks import REBUILD, DamagedIndex
from searchr1.retrieval.corpus import Document

_ID_DECODER = json.JSONDecoder()
DOCS_FILE = "docs.jsonl"
"""Store format 1 (earlier versions): one JSON array a passage."""
OFFSETS_FILE = "docs.offsets.npy"
OFFSETS_RAW = "docs.offsets.bin"
STORE_FILE = "docs.zst"
"""Store format 2: the compressed blocks."""
BLOCKS_FILE = "docs.blocks.npy"
BLOCKS_RAW = "docs.blocks.bin"
"""While a build writes: (end byte, end row) of each finished block, int64 pairs (resumable)."""
STORE_META = "docs.store.json"
STORE_FILES = (STORE_FILE, BLOCKS_FILE, BLOCKS_RAW, STORE_META, DOCS_FILE, OFFSETS_FILE, OFFSETS_RAW)
"""Every file a store of either format may leave in an index folder."""
STORE_FORMAT = 2
LEVEL = 3
"""zstd level: 2.35x at 16 passages a block on generated text; level 9 gained 4% for 5x the CPU."""
BLOCK_PASSAGES = 16
BLOCK_BYTES = 32 << 10
"""A block ends at ``BLOCK_PASSAGES`` passages or once its records reach this many bytes."""
CACHE_BLOCKS = 256
"""Decoded blocks kept (least recently used dropped): the passages of popular hits stay decoded."""


def document_json(doc_id: str, contents: str) -> bytes:
    """A hit's document as the retrieval server sends it: ``{"id":...,"contents":...}``, orjson's UTF-8
    JSON; text orjson refuses (a lone surrogate, which a corpus can hold as an escape) in the stdlib's
    ASCII form."""
    try:
        return orjson.dumps({"id": doc_id, "contents": contents})
    except orjson.JSONEncodeError:
        return f'{{"id":{encode_basestring_ascii(doc_id)},"contents":{encode_basestring_ascii(contents)}}}'.encode(
            "ascii"
        )


def encode_record(d: Document) -> bytes:
    """One passage's record: ``{len(title)} {document_json}`` (see the module docstring)."""
    return b"%d " % len(d.title) + document_json(d.id, d.contents)


def decode_record(record: bytes) -> tuple[Document, bytes]:
    """(the passage, its wire fragment) of a record; ``ValueError`` when it is not a record."""
    space = record.index(b" ")
    title_len = int(record[:space])
    fragment = record[space + 1 :]
    try:
        obj = orjson.loads(fragment)
    except orjson.JSONDecodeError:  # the stdlib's escapes of a lone surrogate
        obj = json.loads(fragment)
    contents = obj["contents"]
    if contents[:1] != '"' or contents[title_len + 1 : title_len + 3] != '"\n':
        raise ValueError("a record's title length does not fit its contents")
    return Document(obj["id"], contents[1 : 1 + title_len], contents[title_len + 3 :]), fragment


def encode_store_blocks(
    docs: Sequence[Document], level: int = LEVEL, block_passages: int = BLOCK_PASSAGES, block_bytes: int = BLOCK_BYTES
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Passages as compressed blocks (a run of whole blocks, starting a new block):
    (the frames' bytes, each frame's size, each block's passage count)."""
    comp = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    frames: list[bytes] = []
    counts: list[int] = []
    records: list[bytes] = []
    size = 0
    for d in docs:
        rec = encode_record(d)
        records.append(rec)
        size += len(rec) + 1
        if len(records) >= block_passages or size >= block_bytes:
            frames.append(comp.compress(b"\n".join(records)))
            counts.append(len(records))
            records, size = [], 0
    if records:
        frames.append(comp.compress(b"\n".join(records)))
        counts.append(len(records))
    return b"".join(frames), np.array([len(f) for f in frames], np.int64), np.array(counts, np.int64)


class DocStore:
    """Random access to documents by row number."""

    def __init__(self, docs: Sequence[Document]):
        self._docs = list(docs)

    def __len__(self) -> int:
        return len(self._docs)

    def __getitem__(self, row: int) -> Document:
        return self._docs[row]

    def with_wire(self, row: int) -> tuple[Document, bytes | None]:
        """(a row's document, its wire fragment as the server sends it, or None where not stored)."""
        return self[row], None

    def doc_id(self, row: int) -> str:
        """The id of a row's document (cheaper than the document on disk)."""
        return self._docs[row].id

    def close(self) -> None:
        pass

    @staticmethod
    def write(docs: Iterable[Document], folder: str | Path) -> int:
        """Write documents to ``folder`` (store format 2); returns how many were written."""
        writer = DocStoreWriter(folder)
        batch: list[Document] = []
        for d in docs:
            batch.append(d)
            if len(batch) >= 65536:
                writer.add_docs(batch)
                batch = []
        writer.add_docs(batch)
        return writer.close()

    @staticmethod
    def open(folder: str | Path) -> DocStore:
        """The store in ``folder``: format 2 (``docs.zst``) or, from earlier versions, format 1."""
        folder = Path(folder)
        if (folder / STORE_META).is_file():
            return CompressedDocStore(folder)
        return MappedDocStore(folder)


class DocStoreWriter:
    """Appends compressed blocks (``append``, or ``add_docs`` which encodes them here) as a build streams.

    Each block's (end byte, end row) goes to the raw ``docs.blocks.bin`` as it is written and becomes
    ``docs.blocks.npy`` on ``close``; ``resume_at`` reopens the files of an interrupted build, cut back
    to a checkpoint (which always falls between blocks).
    """

    def __init__(self, folder: str | Path, resume_at: tuple[int, int] | None = None):
        """``resume_at``: (documents, bytes of ``docs.zst``) recorded at the checkpoint to go on from."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        store, raw = self.folder / STORE_FILE, self.folder / BLOCKS_RAW
        (self.folder / STORE_META).unlink(missing_ok=True)
        if resume_at is not None and not raw.exists() and (self.folder / BLOCKS_FILE).exists():
            # stopped between finishing the table and recording it: start from the finished table
            np.load(self.folder / BLOCKS_FILE)[1:].tofile(raw)
        (self.folder / BLOCKS_FILE).unlink(missing_ok=True)
        if resume_at is None:
            self._fh = store.open("wb")
            self._raw = raw.open("wb")
            self.count, self.bytes, self.blocks = 0, 0, 0
        else:
            self.count, self.bytes = resume_at
            ends = np.fromfile(raw, dtype=np.int64)
            ends = ends[: len(ends) // 2 * 2].reshape(-1, 2)  # a torn last pair is dropped
            self.blocks = int(np.searchsorted(ends[:, 0], self.bytes, side="right"))
            at = ends[self.blocks - 1] if self.blocks else np.zeros(2, np.int64)
            if (int(at[0]), int(at[1])) != (self.bytes, self.count):
                raise ValueError(f"{raw} does not reach the checkpoint ({self.count} passages, {self.bytes} bytes): "
                                 "start again with --restart")  # fmt: skip
            self._fh = store.open("r+b")
            self._fh.truncate(self.bytes)
            self._fh.seek(self.bytes)
            self._raw = raw.open("r+b")
            self._raw.truncate(self.blocks * 16)
            self._raw.seek(self.blocks * 16)

    def append(self, frames: bytes, sizes: np.ndarray, counts: np.ndarray) -> None:
        """Append encoded blocks (``encode_store_blocks``' output)."""
        self._fh.write(frames)
        ends = np.stack([self.bytes + np.cumsum(sizes), self.count + np.cumsum(counts)], axis=1)
        self._raw.write(np.ascontiguousarray(ends, dtype=np.int64).tobytes())
        self.bytes += int(np.sum(sizes))
        self.count += int(np.sum(counts))
        self.blocks += len(sizes)

    def add_docs(self, docs: Sequence[Document]) -> None:
        """Encode and append passages (their own blocks, the last one possibly short)."""
        self.append(*encode_store_blocks(docs))

    def sync(self) -> tuple[int, int]:
        """Push everything written so far to disk; returns (documents, bytes) for a checkpoint."""
        for fh in (self._fh, self._raw):
            fh.flush()
            os.fsync(fh.fileno())
        return self.count, self.bytes

    def close(self) -> int:
        """Finish the files (``docs.blocks.npy`` from the raw table, then ``docs.store.json``);
        returns the document count."""
        if not self._fh.closed:
            self.sync()
            self._fh.close()
            self._raw.close()
            raw = self.folder / BLOCKS_RAW
            ends = np.fromfile(raw, dtype=np.int64).reshape(-1, 2)
            table = np.concatenate([np.zeros((1, 2), np.int64), ends])
            np.save(self.folder / BLOCKS_FILE, table)
            meta = {
                "format": STORE_FORMAT, "codec": "zstd", "level": LEVEL, "block_passages": BLOCK_PASSAGES,
                "block_bytes": BLOCK_BYTES, "passages": self.count, "blocks": self.blocks, "bytes": self.bytes,
                "blocks_crc32": zlib.crc32((self.folder / BLOCKS_FILE).read_bytes()),
            }  # fmt: skip
            tmp = self.folder / (STORE_META + ".tmp")
            tmp.write_text(json.dumps(meta, indent=2))
            os.replace(tmp, self.folder / STORE_META)
            raw.unlink()
        return self.count

    def abort(self) -> None:
        """Close the files as they are (a checkpoint may still resume them)."""
        for fh in (self._fh, self._raw):
            if not fh.closed:
                with contextlib.suppress(OSError):
                    fh.close()


def _damaged(folder: Path, why: str) -> DamagedIndex:
    return DamagedIndex(f"passage store {folder / STORE_FILE} is damaged: {why}; {REBUILD}")


class CompressedDocStore(DocStore):
    """Store format 2 (see the module docstring): a passage decompresses its block; an LRU of blocks."""

    def __init__(self, folder: str | Path, cache_blocks: int = CACHE_BLOCKS):
        folder = Path(folder)
        self.folder = folder
        try:
            meta = json.loads((folder / STORE_META).read_text())
        except json.JSONDecodeError as exc:
            raise _damaged(folder, f"{STORE_META} is not JSON ({exc})") from None
        if meta.get("format") != STORE_FORMAT or meta.get("codec") != "zstd":
            raise DamagedIndex(f"passage store {folder} has format {meta.get('format')} / codec "
                               f"{meta.get('codec')}, which this version does not read; {REBUILD}")  # fmt: skip
        table_bytes = (folder / BLOCKS_FILE).read_bytes()
        if zlib.crc32(table_bytes) != meta.get("blocks_crc32"):
            raise _damaged(folder, f"{BLOCKS_FILE} fails its CRC-32 check")
        table = np.load(folder / BLOCKS_FILE)
        size = (folder / STORE_FILE).stat().st_size
        if (table.ndim != 2 or table.shape != (meta["blocks"] + 1, 2) or int(table[-1, 0]) != size
                or int(table[-1, 1]) != meta["passages"] or np.any(np.diff(table, axis=0) <= 0)):  # fmt: skip
            raise _damaged(folder, f"{STORE_FILE} holds {size:,} bytes, its table says {int(table[-1, 0]):,}"
                           if int(table[-1, 0]) != size else "its block table does not fit the passages")  # fmt: skip
        self._offsets = np.ascontiguousarray(table[:, 0])
        self._first = np.ascontiguousarray(table[:, 1])
        self._fh = (folder / STORE_FILE).open("rb")
        self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._n = int(meta["passages"])
        self._cache: OrderedDict[int, list[bytes]] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._lock = threading.Lock()
        self._local = threading.local()

    def __len__(self) -> int:
        return self._n

    def _block(self, b: int) -> list[bytes]:
        with self._lock:
            hit = self._cache.get(b)
            if hit is not None:
                self._cache.move_to_end(b)
                return hit
        dec = getattr(self._local, "dec", None)
        if dec is None:
            dec = self._local.dec = zstandard.ZstdDecompressor()
        frame = self._map[int(self._offsets[b]) : int(self._offsets[b + 1])]
        try:
            records = dec.decompress(frame).split(b"\n")
        except zstandard.ZstdError as exc:
            raise _damaged(self.folder, f"block {b} cannot be decompressed ({exc})") from None
        if len(records) != int(self._first[b + 1] - self._first[b]):
            raise _damaged(self.folder, f"block {b} holds {len(records)} passages, its table says "
                           f"{int(self._first[b + 1] - self._first[b])}")  # fmt: skip
        with self._lock:
            self._cache[b] = records
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        return records

    def _record(self, row: int) -> tuple[int, bytes]:
        if not 0 <= row < self._n:
            raise IndexError(row)
        b = int(np.searchsorted(self._first, row, side="right")) - 1
        return b, self._block(b)[row - int(self._first[b])]

    def with_wire(self, row: int) -> tuple[Document, bytes]:
        b, record = self._record(row)
        try:
            return decode_record(record)
        except (ValueError, KeyError, TypeError) as exc:
            raise _damaged(self.folder, f"a record of block {b} cannot be read ({exc})") from None

    def __getitem__(self, row: int) -> Document:
        return self.with_wire(row)[0]

    def doc_id(self, row: int) -> str:
        return self.with_wire(row)[0].id

    def block_count(self) -> int:
        return len(self._offsets) - 1

    def close(self) -> None:
        if isinstance(self._map, mmap.mmap):
            self._map.close()
        self._fh.close()


# -- store format 1 (earlier versions) ----------------------------------------------------------------


def write_jsonl_store(docs: Iterable[Document], folder: str | Path) -> int:
    """Write store format 1 (``docs.jsonl`` + ``docs.offsets.npy``), as earlier versions did."""
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


class MappedDocStore(DocStore):
    """Store format 1: documents read lazily from ``docs.jsonl`` through a memory map."""

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
