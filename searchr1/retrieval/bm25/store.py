"""Passage storage behind every local index: row number -> (id, title, text), and the hit's wire form.

In memory (``DocStore(docs)``) or on disk. On disk, store format 2 (``docs.zst``, written by this
version) holds each passage compressed on its own with a dictionary trained on the corpus:

``docs.zst``
    one zstd frame a passage, in row order (level ``LEVEL``, with the content size and the codec's
    XXH64 checksum, so that a damaged frame fails to decode instead of decoding to other bytes),
    compressed with the store's dictionary.
``docs.dict``
    the zstd dictionary (``DICT_BYTES``), trained on the records of the corpus's first ``DICT_SAMPLE``
    passages (``train_dictionary``; none for a corpus too small to train one): what lets a passage
    compressed alone shrink about as much as a block of many compressed together.
``docs.frames.npy``
    int64, passages + 1: each frame's first byte in ``docs.zst``, then the file's size.
``docs.store.json``
    the format, codec, level, counts, and the CRC-32 of ``docs.frames.npy`` and of ``docs.dict``.

A record (a frame's content) is ``{title length} {fragment}``: the title's length in characters
(decimal), a space, and the passage exactly as the retrieval server sends it,
``{"id":ID,"contents":"\\"Title\\"\\ntext"}`` (``document_json``: orjson's UTF-8 JSON). The fragment
goes on the wire as it is (``Hit.wire``); the title and text are cut out of ``contents`` by the length
(``contents = '"' + title + '"\\n' + text``), so every title, a newline or quote in it too, comes back
exactly. Reading a passage decompresses its frame (~4 microseconds); the last ``CACHE_PASSAGES``
decoded passages are kept. A frame that fails to decode (checksum, size, record) is refused in one
line that says how to rebuild (``DamagedIndex``).

Why one frame a passage: measured on generated wiki-like passages (540 bytes a record, zstd level 3,
CPU microseconds to decompress what one hit needs, on a loaded machine), blocks of 16 passages without
a dictionary are 2.35x smaller than the records but cost 32 us a hit (the earlier JSON lines: ~10 us
all told, a hit's JSON decoded), 4 with a dictionary 2.40x and 11 us, 1 with a dictionary 2.14x and
4 us, without one 1.60x; level 9 gains 6% for 5x the CPU. One frame a passage with the dictionary
keeps a search's hits as cheap as they were.

Store format 1 (earlier versions: ``docs.jsonl``, one ``["id", "title", "text"]`` line a passage, and
``docs.offsets.npy``, each line's first byte) still loads, through a memory map
(``MappedDocStore``); ``write_jsonl_store`` writes it (tests of that path).
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import threading
import zlib
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path

import numpy as np
import orjson
import zstandard

from searchr1.retrieval.bm25.errors import REBUILD, DamagedIndex
from searchr1.retrieval.corpus import Document

_ID_DECODER = json.JSONDecoder()
DOCS_FILE = "docs.jsonl"
"""Store format 1 (earlier versions): one JSON array a passage."""
OFFSETS_FILE = "docs.offsets.npy"
OFFSETS_RAW = "docs.offsets.bin"
STORE_FILE = "docs.zst"
"""Store format 2: the compressed passages."""
DICT_FILE = "docs.dict"
FRAMES_FILE = "docs.frames.npy"
FRAMES_RAW = "docs.frames.bin"
"""While a build writes: each finished frame's end byte, int64 (resumable)."""
STORE_META = "docs.store.json"
STORE_FILES = (STORE_FILE, FRAMES_FILE, FRAMES_RAW, STORE_META, DICT_FILE, DOCS_FILE, OFFSETS_FILE, OFFSETS_RAW)
"""Every file a store of either format may leave in an index folder."""
STORE_FORMAT = 2
LEVEL = 3
CACHE_PASSAGES = 4096
"""Decoded passages kept (least recently used dropped): popular hits are not decompressed again."""
DICT_BYTES = 64 << 10
DICT_SAMPLE = 4000
"""Passages the dictionary is trained on: the corpus's first (what a build reads first)."""


def train_dictionary(records: Sequence[bytes]) -> bytes | None:
    """A zstd dictionary for the store trained on ``records`` (``encode_record``s): fastCover with fixed
    parameters on one thread, so the same records always give the same bytes; None when they are too
    few to train on (under 16 kB)."""
    size = sum(len(r) for r in records)
    if size < 16 << 10 or len(records) < 16:
        return None
    try:
        d = zstandard.train_dictionary(min(DICT_BYTES, size // 4), list(records), k=1024, d=8, level=LEVEL)
    except zstandard.ZstdError:
        return None
    return d.as_bytes()


def sample_dictionary(docs: Sequence[Document]) -> bytes | None:
    """``train_dictionary`` on the first ``DICT_SAMPLE`` of ``docs``."""
    return train_dictionary([encode_record(d) for d in docs[:DICT_SAMPLE]])


def _compressor(dictionary: bytes | None) -> zstandard.ZstdCompressor:
    opts = {"level": LEVEL, "write_checksum": True, "write_content_size": True, "write_dict_id": False}
    if dictionary is not None:
        opts["dict_data"] = zstandard.ZstdCompressionDict(dictionary)
    return zstandard.ZstdCompressor(**opts)


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


def encode_frames(docs: Sequence[Document], dictionary: bytes | None = None) -> tuple[bytes, np.ndarray]:
    """Passages as zstd frames with the store's ``dictionary``: (the frames' bytes, each frame's size)."""
    comp = _compressor(dictionary)
    frames = [comp.compress(encode_record(d)) for d in docs]
    return b"".join(frames), np.fromiter((len(f) for f in frames), np.int64, count=len(frames))


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

    def many_with_wire(self, rows: Sequence[int]) -> list[tuple[Document, bytes | None]]:
        """``with_wire`` of each row (a search's hits)."""
        return [self.with_wire(r) for r in rows]

    def doc_id(self, row: int) -> str:
        """The id of a row's document (cheaper than the document on disk)."""
        return self._docs[row].id

    def close(self) -> None:
        pass

    @staticmethod
    def write(docs: Iterable[Document], folder: str | Path) -> int:
        """Write documents to ``folder`` (store format 2); returns how many were written."""
        writer: DocStoreWriter | None = None
        batch: list[Document] = []
        for d in docs:
            batch.append(d)
            if len(batch) >= 65536:
                writer = writer or DocStoreWriter(folder, dictionary=sample_dictionary(batch))
                writer.add_docs(batch)
                batch = []
        writer = writer or DocStoreWriter(folder, dictionary=sample_dictionary(batch))
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
    """Appends compressed passages (``append``, or ``add_docs`` which encodes them here) as a build streams.

    Each frame's end byte goes to the raw ``docs.frames.bin`` as it is written and ``docs.frames.npy`` is
    made of it on ``close``; ``resume_at`` reopens the files of an interrupted build, cut back to a
    checkpoint.
    """

    def __init__(
        self, folder: str | Path, resume_at: tuple[int, int] | None = None, dictionary: bytes | None = None
    ):
        """``resume_at``: (documents, bytes of ``docs.zst``) recorded at the checkpoint to go on from (the
        dictionary is the one written when the build started); ``dictionary``: a new store's
        (``train_dictionary``), written to ``docs.dict`` now."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        store, raw = self.folder / STORE_FILE, self.folder / FRAMES_RAW
        (self.folder / STORE_META).unlink(missing_ok=True)
        dict_path = self.folder / DICT_FILE
        if resume_at is None:
            dict_path.unlink(missing_ok=True)
            if dictionary is not None:
                with dict_path.open("wb") as fh:
                    fh.write(dictionary)
                    fh.flush()
                    os.fsync(fh.fileno())
        self.dictionary = dict_path.read_bytes() if dict_path.is_file() else None
        if resume_at is not None and not raw.exists() and (self.folder / FRAMES_FILE).exists():
            # stopped between finishing the table and recording it: start from the finished table
            np.load(self.folder / FRAMES_FILE)[1:].tofile(raw)
        (self.folder / FRAMES_FILE).unlink(missing_ok=True)
        if resume_at is None:
            self._fh = store.open("wb")
            self._raw = raw.open("wb")
            self.count, self.bytes = 0, 0
        else:
            self.count, self.bytes = resume_at
            ends = np.fromfile(raw, dtype=np.int64, count=self.count)
            if len(ends) != self.count or (self.count and int(ends[-1]) != self.bytes):
                raise ValueError(f"{raw} does not reach the checkpoint ({self.count} passages, {self.bytes} bytes): "
                                 "start again with --restart")  # fmt: skip
            self._fh = store.open("r+b")
            self._fh.truncate(self.bytes)
            self._fh.seek(self.bytes)
            self._raw = raw.open("r+b")
            self._raw.truncate(self.count * 8)
            self._raw.seek(self.count * 8)

    def append(self, frames: bytes, sizes: np.ndarray) -> None:
        """Append encoded passages (``encode_frames``' output)."""
        self._fh.write(frames)
        self._raw.write((self.bytes + np.cumsum(sizes, dtype=np.int64)).tobytes())
        self.bytes += int(np.sum(sizes))
        self.count += len(sizes)

    def add_docs(self, docs: Sequence[Document]) -> None:
        """Encode and append passages."""
        self.append(*encode_frames(docs, self.dictionary))

    def sync(self) -> tuple[int, int]:
        """Push everything written so far to disk; returns (documents, bytes) for a checkpoint."""
        for fh in (self._fh, self._raw):
            fh.flush()
            os.fsync(fh.fileno())
        return self.count, self.bytes

    def close(self) -> int:
        """Finish the files (``docs.frames.npy`` from the raw table, then ``docs.store.json``);
        returns the document count."""
        if not self._fh.closed:
            self.sync()
            self._fh.close()
            self._raw.close()
            raw = self.folder / FRAMES_RAW
            ends = np.fromfile(raw, dtype=np.int64)
            np.save(self.folder / FRAMES_FILE, np.concatenate([np.zeros(1, np.int64), ends]))
            meta = {
                "format": STORE_FORMAT, "codec": "zstd", "level": LEVEL, "passages": self.count, "bytes": self.bytes,
                "frames_crc32": zlib.crc32((self.folder / FRAMES_FILE).read_bytes()),
                "dict_crc32": None if self.dictionary is None else zlib.crc32(self.dictionary),
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
    """Store format 2 (see the module docstring): a passage decompresses its frame; an LRU of passages."""

    def __init__(self, folder: str | Path, cache_passages: int = CACHE_PASSAGES):
        folder = Path(folder)
        self.folder = folder
        for name in (STORE_META, FRAMES_FILE, STORE_FILE):
            if not (folder / name).is_file():  # worded as the index's own check of its files
                raise DamagedIndex(f"passage store {folder / STORE_FILE} is incomplete: {name} is missing; {REBUILD}")
        try:
            meta = json.loads((folder / STORE_META).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _damaged(folder, f"{STORE_META} is not JSON ({exc})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("passages"), int):
            raise _damaged(folder, f"{STORE_META} does not say how many passages the store holds")
        if meta.get("format") != STORE_FORMAT or meta.get("codec") != "zstd":
            raise DamagedIndex(f"passage store {folder} has format {meta.get('format')} / codec "
                               f"{meta.get('codec')}, which this version does not read; {REBUILD}")  # fmt: skip
        if zlib.crc32((folder / FRAMES_FILE).read_bytes()) != meta.get("frames_crc32"):
            raise _damaged(folder, f"{FRAMES_FILE} fails its CRC-32 check")
        offsets = np.load(folder / FRAMES_FILE, mmap_mode="r")
        size = (folder / STORE_FILE).stat().st_size
        if offsets.ndim != 1 or len(offsets) != meta["passages"] + 1:
            raise _damaged(folder, f"{FRAMES_FILE} has {offsets.size:,} offsets for {meta['passages']:,} passages "
                           f"(one more than the passages wanted)")  # fmt: skip
        if int(offsets[-1]) != size:
            raise _damaged(folder, f"{STORE_FILE} holds {size:,} bytes, its table says {int(offsets[-1]):,}")
        for lo in range(0, len(offsets) - 1, 1 << 22):  # a part at a time: no corpus-sized temporary
            if np.any(np.diff(offsets[lo : lo + (1 << 22) + 1]) <= 0):
                raise _damaged(folder, f"{FRAMES_FILE} does not ascend")
        dictionary = None
        if meta.get("dict_crc32") is not None:
            dictionary = (folder / DICT_FILE).read_bytes()
            if zlib.crc32(dictionary) != meta["dict_crc32"]:
                raise _damaged(folder, f"{DICT_FILE} fails its CRC-32 check")
        self._dict = None if dictionary is None else zstandard.ZstdCompressionDict(dictionary)
        self._offsets = memoryview(np.ascontiguousarray(offsets, np.int64)).cast("B").cast("q")
        """Indexing gives Python ints directly (a numpy array's scalars cost ~10x more)."""
        self._fh = (folder / STORE_FILE).open("rb")
        self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._n = int(meta["passages"])
        self._local = threading.local()
        self._cached = functools.lru_cache(maxsize=cache_passages)(self._decode)
        """A row's (document, fragment); the last ``cache_passages`` kept (C's LRU: thread-safe)."""

    def __len__(self) -> int:
        return self._n

    def _decode(self, row: int) -> tuple[Document, bytes]:
        dec = getattr(self._local, "dec", None)
        if dec is None:  # one decompression context a thread
            dec = self._local.dec = zstandard.ZstdDecompressor(**({"dict_data": self._dict} if self._dict else {}))
        try:
            record = dec.decompress(self._map[self._offsets[row] : self._offsets[row + 1]])
        except zstandard.ZstdError as exc:
            raise _damaged(self.folder, f"passage {row}'s frame cannot be decompressed ({exc})") from None
        try:
            return decode_record(record)
        except (ValueError, KeyError, TypeError) as exc:
            raise _damaged(self.folder, f"passage {row}'s record cannot be read ({exc})") from None

    def with_wire(self, row: int) -> tuple[Document, bytes]:
        if not 0 <= row < self._n:
            raise IndexError(row)
        return self._cached(row)

    def many_with_wire(self, rows: Sequence[int]) -> list[tuple[Document, bytes]]:
        return [self.with_wire(r) for r in rows]

    def __getitem__(self, row: int) -> Document:
        return self.with_wire(row)[0]

    def doc_id(self, row: int) -> str:
        return self.with_wire(row)[0].id

    def close(self) -> None:
        self._cached.cache_clear()
        self._offsets.release()
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
