"""The BM25 index on disk: its file names, the score matrix (CSC), the settings file, each file's size
and CRC-32, and loading a folder (``load_matrix``). The layout is in the package's docstring."""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchr1.retrieval.bm25.blocks import SCORE, TF
from searchr1.retrieval.bm25.bounds import SUPER
from searchr1.retrieval.bm25.errors import REBUILD, DamagedIndex, rebuild_bm25
from searchr1.retrieval.bm25.params import BM25Params
from searchr1.retrieval.bm25.postings import Postings
from searchr1.retrieval.bm25.vocabulary import (
    VOCAB_HASH_FILE,
    VOCAB_IDS_FILE,
    VOCAB_TEXT_FILE,
    DictVocabulary,
    HashedVocabulary,
)

BM25_DIR = "bm25"
TOKENIZER_FILE = "tokenizer.json"
PARAMS_FILE = "params.index.json"
DATA_FILE, INDICES_FILE, INDPTR_FILE = "data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy"
NONOCCURRENCE_FILE = "nonoccurrence_array.index.npy"
TERM_MAX_FILE = "term_max.npy"
NORMS_FILE = "norms.npy"
"""One byte per passage: Lucene's norm (``lucene_norm`` of its length); lets a repeated query term be
scored as Anserini scores it (``BM25Retriever``). Absent from folders of earlier versions."""
ID_KEYS_FILE = "id_keys.npy"
"""Per passage, ``id_sort_keys`` of its id: Anserini's order of tied hits without reading ids."""
POSTINGS_FILE = "postings.u32.npy"
"""The posting blocks' words (``blocks``: bit-packed full blocks, varint tails)."""
BLOCK_OFFSETS_FILE, BLOCK_PTR_FILE = "blocks.offsets.npy", "blocks.ptr.npy"
"""Each block's first word (and the end), each column's first block (and the count)."""
BLOCK_LAST_FILE, BLOCK_MAX_FILE = "blocks.last.npy", "blocks.max.npy"
"""Each block's last row and largest score."""
SUPERBLOCK_LAST_FILE, SUPERBLOCK_MAX_FILE = "superblocks.last.npy", "superblocks.max.npy"
"""Each superblock's last row and largest score (``bounds``; ``superblock`` in the settings: its blocks)."""
SCORES_FILE = "scores.f32.npy"
"""Layout score (methods other than Lucene's): the postings' float32 scores."""
FORMAT = 3
"""1 (no ``format`` key; ``save`` and the earliest versions): rows and float32 scores (``DATA_FILE``,
``INDICES_FILE``), still read; 2: varint blocks (``postings.u8.npy``), refused with the command that
rebuilds it; 3: bit-packed blocks."""
VARINT_FORMAT = 2
LEGACY_VOCAB_FILE = "vocab.index.json"


# -- the score matrix on disk -------------------------------------------------------------------------


@dataclass
class ScoreMatrix:
    """BM25 scores in CSC form: column t = the documents ``indices[indptr[t]:indptr[t+1]]`` (ascending)
    holding term t, with their scores ``data[...]``; ``term_max[t]`` is the column's largest score."""

    data: np.ndarray
    indices: np.ndarray
    indptr: np.ndarray
    num_docs: int
    nonoccurrence: np.ndarray | None = None
    """bm25l / bm25+: each term's score in a document without it (added to every document)."""
    term_max: np.ndarray | None = None
    norms: np.ndarray | None = None
    """Lucene's one-byte norm per passage (``NORMS_FILE``), None in folders of earlier versions."""
    id_keys: np.ndarray | None = None
    """``id_sort_keys`` of the passages' ids (``ID_KEYS_FILE``), None in folders of earlier versions."""
    doc_count: int | None = None
    """N of the IDF (``BM25Params.doc_count``); None: not recorded (earlier versions)."""
    avg_len: float | None = None
    """avgdl of the scores; None: not recorded (earlier versions)."""
    tf: np.ndarray | None = None
    """The postings' term frequencies (an index built in memory; on disk they are in the blocks)."""

    def column_max(self) -> np.ndarray:
        """Largest score per column (0 for an empty one), computed once when not stored."""
        if self.term_max is None:
            starts, ends = np.asarray(self.indptr[:-1]), np.asarray(self.indptr[1:])
            out = np.zeros(len(starts), dtype=np.float32)
            nonempty = ends > starts
            if self.data.size:
                out[nonempty] = np.maximum.reduceat(np.asarray(self.data), starts[nonempty])
            self.term_max = out
        return self.term_max


def tf_layout(params: BM25Params) -> bool:
    """Whether the index stores term frequencies (scores computed at query time from them and the
    norms, as Lucene does): with Lucene's method and lengths; else float32 scores."""
    return (params.method, params.doc_length) == ("lucene", "lucene")


def layout_name(params: BM25Params) -> str:
    return "tf" if tf_layout(params) else "score"


CHECKSUM_SKIP = ("params.index.json", "tokenizer.json")


def crc32_file(path: Path) -> int:
    crc = 0
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            crc = zlib.crc32(block, crc)
    return crc


def file_checksums(folder: Path) -> dict[str, list[int]]:
    """Per file of an index folder (but the settings): [bytes, CRC-32]."""
    return {p.name: [p.stat().st_size, crc32_file(p)] for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in CHECKSUM_SKIP}  # fmt: skip



def verify_checksums(src: Path, checksums: dict[str, list[int]]) -> None:
    """Refuse (one line) a file of ``src`` whose size or CRC-32 differs from what the build recorded."""
    for name, (size, crc) in checksums.items():
        path = src / name
        if not path.is_file():
            raise DamagedIndex(f"BM25 index {src} is incomplete: {name} is missing; {REBUILD}")
        if path.stat().st_size != size:
            raise DamagedIndex(f"BM25 index {src} is damaged: {name} holds {path.stat().st_size:,} bytes, "
                               f"the build wrote {size:,} (truncated?); {REBUILD}")  # fmt: skip
        if crc32_file(path) != crc:
            raise DamagedIndex(f"BM25 index {src} is damaged: {name} fails its CRC-32 check; {REBUILD}")


def write_params(
    out: Path, params: BM25Params, num_docs: int, vocab_size: int | None, vocab_salt: int,
    doc_count: int | None = None, avg_len: float | None = None, layout: str | None = None,
    checksums: dict[str, list[int]] | None = None,
) -> None:  # fmt: skip
    """``params.index.json`` (bm25s's keys plus the vocabulary hash salt, N and avgdl of the scores;
    with ``layout``, format 2: posting blocks of that layout and each file's size and CRC-32)
    and ``tokenizer.json``."""
    meta: dict[str, Any] = {
        "k1": params.k1, "b": params.b, "delta": params.delta, "method": params.method,
        "idf_method": params.method, "dtype": "float32", "int_dtype": "int32", "num_docs": num_docs,
        "vocab_salt": vocab_salt, "vocab_size": vocab_size, "doc_count": doc_count, "avg_len": avg_len,
    }  # fmt: skip
    if layout is not None:
        meta.update(format=FORMAT, layout=layout, block=128, superblock=SUPER, checksums=checksums or {})
    (out / PARAMS_FILE).write_text(json.dumps(meta, indent=2))
    (out / TOKENIZER_FILE).write_text(json.dumps(asdict(params), indent=2))




def load_matrix(src: Path, mmap: bool = True, verify: bool = True) -> tuple[ScoreMatrix, object, dict, Any]:
    """(score matrix, vocabulary, params.index.json, posting blocks or None) of a ``bm25`` folder. An
    index of format 3 has blocks (``postings.Postings``) and a matrix without rows and scores;
    ``verify``: its files' sizes and CRC-32 are checked first. A file that cannot be read, or an index
    of format 2 (varint blocks), is refused in one line (``DamagedIndex``) naming the rebuild command."""
    try:
        meta = json.loads((src / PARAMS_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise DamagedIndex(f"BM25 index {src} is damaged: {PARAMS_FILE} is not JSON ({exc}); {REBUILD}") from None
    blocks = meta.get("format", 1) >= 2
    if meta.get("format", 1) > FORMAT:
        raise DamagedIndex(f"BM25 index {src} has format {meta['format']}, newer than this version reads ({FORMAT})")
    if meta.get("format") == VARINT_FORMAT:
        raise DamagedIndex(f"BM25 index {src} has format 2 (varint postings), which this version no longer "
                           f"reads (format 3: bit-packed blocks); {rebuild_bm25(src.parent)}")  # fmt: skip
    if blocks and verify:
        verify_checksums(src, meta.get("checksums", {}))
    try:
        return _load_arrays(src, meta, mmap, blocks)
    except (ValueError, EOFError, OSError) as exc:
        if isinstance(exc, FileNotFoundError | DamagedIndex):
            raise
        raise DamagedIndex(f"BM25 index {src} is damaged: {type(exc).__name__}: {exc}; {REBUILD}") from None


def _load_arrays(src: Path, meta: dict, mmap: bool, blocks: bool) -> tuple[ScoreMatrix, object, dict, Any]:
    mode = "r" if mmap else None

    def opt(name: str, mapped: bool = True):
        return np.load(src / name, mmap_mode=mode if mapped else None) if (src / name).is_file() else None

    indptr = np.load(src / INDPTR_FILE)  # vocabulary-sized: read whole, it is touched by every query
    if blocks:
        data, indices = np.zeros(0, np.float32), np.zeros(0, np.int32)
    else:
        data, indices = np.load(src / DATA_FILE, mmap_mode=mode), np.load(src / INDICES_FILE, mmap_mode=mode)
        if len(data) != int(indptr[-1]) or len(indices) != int(indptr[-1]):
            raise DamagedIndex(f"BM25 index {src} is damaged: {len(data):,} scores and {len(indices):,} rows "
                               f"for {int(indptr[-1]):,} postings; {REBUILD}")  # fmt: skip
    matrix = ScoreMatrix(data, indices, indptr, int(meta["num_docs"]), opt(NONOCCURRENCE_FILE, False),
                         opt(TERM_MAX_FILE, False), opt(NORMS_FILE), opt(ID_KEYS_FILE), meta.get("doc_count"),
                         meta.get("avg_len"))  # fmt: skip
    postings = None
    if blocks:
        layout = TF if meta["layout"] == "tf" else SCORE
        postings = Postings(
            layout, indptr, np.load(src / BLOCK_PTR_FILE), np.load(src / BLOCK_LAST_FILE, mmap_mode=mode),
            np.load(src / BLOCK_MAX_FILE, mmap_mode=mode), matrix.column_max(),
            data=np.load(src / SCORES_FILE, mmap_mode=mode) if layout == SCORE else np.zeros(0, np.float32),
            offsets=np.load(src / BLOCK_OFFSETS_FILE, mmap_mode=mode), stream=np.load(src / POSTINGS_FILE, mmap_mode=mode),
            sb_last=np.load(src / SUPERBLOCK_LAST_FILE), sb_max=np.load(src / SUPERBLOCK_MAX_FILE),
            super_blocks=int(meta.get("superblock", SUPER)),
        )  # fmt: skip
        postings.check(int(meta["num_docs"]))
    if (src / VOCAB_HASH_FILE).is_file():
        vocab: object = HashedVocabulary(
            np.load(src / VOCAB_HASH_FILE, mmap_mode=mode),
            np.load(src / VOCAB_IDS_FILE, mmap_mode=mode),
            int(meta.get("vocab_salt", 0)),
            src / VOCAB_TEXT_FILE,
        )
    else:
        vocab = DictVocabulary(json.loads((src / LEGACY_VOCAB_FILE).read_text(encoding="utf-8")))
    return matrix, vocab, meta, postings
