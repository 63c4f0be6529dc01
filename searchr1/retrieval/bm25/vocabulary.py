"""Term -> column: stable 64-bit hashes of the terms, and the two vocabularies (a dictionary in memory,
sorted hashes searched in a memory map on disk)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

VOCAB_HASH_FILE, VOCAB_IDS_FILE, VOCAB_TEXT_FILE = "vocab.hash.npy", "vocab.ids.npy", "vocab.txt"


def term_hash(term: str, salt: int = 0) -> int:
    """A stable 64-bit hash of a term (BLAKE2b, 8 bytes); ``salt`` changes it if two terms collide."""
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=8, salt=salt.to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little")


def hash_terms(terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted hashes, the column id of each, salt): the first salt under which no two terms collide."""
    for salt in range(16):
        hashes = np.fromiter((term_hash(t, salt) for t in terms), dtype=np.uint64, count=len(terms))
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        if len(hashes) < 2 or not np.any(hashes[1:] == hashes[:-1]):
            return hashes, order.astype(np.uint32), salt
    raise ValueError("cannot hash the vocabulary without collisions")  # 16 salts in a row: never


class DictVocabulary:
    """Term -> column id in a dictionary (in-memory indexes and folders written by bm25s)."""

    def __init__(self, vocab: dict[str, int]):
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.vocab)

    def lookup(self, terms: Iterable[str]) -> list[int]:
        """Column ids of the terms in the vocabulary (unknown terms dropped)."""
        v = self.vocab
        return [v[t] for t in terms if t in v]


class HashedVocabulary:
    """Term -> column id by binary search among sorted 64-bit term hashes (memory-mapped)."""

    def __init__(self, hashes: np.ndarray, ids: np.ndarray, salt: int, terms_file: Path | None = None):
        self.hashes, self.ids, self.salt = hashes, ids, salt
        self.terms_file = terms_file
        """``vocab.txt``: the terms themselves, in column order (read only to save a copy)."""

    def terms(self) -> list[str]:
        if self.terms_file is None:
            raise ValueError("this vocabulary has no terms file")
        return self.terms_file.read_text(encoding="utf-8").splitlines()

    def __len__(self) -> int:
        return len(self.hashes)

    def lookup(self, terms: Iterable[str]) -> list[int]:
        h = np.fromiter((term_hash(t, self.salt) for t in terms), dtype=np.uint64)
        hashes = np.asarray(self.hashes)  # a plain view: indexing a numpy.memmap costs a Python call
        if len(h) == 0 or len(hashes) == 0:
            return []
        pos = np.minimum(np.searchsorted(hashes, h), len(hashes) - 1)
        found = hashes[pos] == h
        return np.asarray(self.ids)[pos[found]].tolist()


def write_vocabulary(out: Path, terms: Sequence[str]) -> int:
    """The hashed vocabulary and ``vocab.txt``; returns the hash salt."""
    hashes, ids, salt = hash_terms(terms)
    np.save(out / VOCAB_HASH_FILE, hashes)
    np.save(out / VOCAB_IDS_FILE, ids)
    with (out / VOCAB_TEXT_FILE).open("w", encoding="utf-8") as fh:
        for t in terms:
            fh.write(t + "\n")
    return salt
