"""Passage ids seen by a streaming build, so that a repeated id is caught on the line that repeats it.

Each id is kept as a 64-bit BLAKE2b hash: the hashes of the current chunk in a dictionary (hash ->
passage row), older ones in sorted numpy blocks merged like a binary counter (block sizes 2^j x
``BLOCK``), so a lookup is a few binary searches and memory is 8 bytes a passage (168 MB at wiki-18's
21M, in blocks of at most ``CAP``; only while the corpus is read). The hashes are also appended, in row
order, to a file in the build's checkpoint folder (``sync`` with each chunk), from which an interrupted
build reloads them and the row of an earlier occurrence is found. Two distinct ids share a hash with
odds ~n^2 / 2^65 (1e-5 at 21M passages); such a pair would be reported as a repeat.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

BLOCK = 1 << 16
CAP = 1 << 22
"""Blocks are not merged beyond this many hashes (32 MB), so a merge's temporaries stay small."""


def id_hash(doc_id: str) -> int:
    """A stable 64-bit hash of a passage id."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


def id_hashes(ids: Sequence[str]) -> np.ndarray:
    """``id_hash`` of each id, as uint64."""
    return np.fromiter((id_hash(i) for i in ids), dtype=np.uint64, count=len(ids))


class SeenIds:
    """The ids of the passages read so far (see the module docstring)."""

    def __init__(self, path: str | Path, passages: int = 0) -> None:
        """``passages``: how many the checkpoint holds (the file is cut back to them and reloaded)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "r+b" if passages and self.path.is_file() else "w+b"
        self._fh = self.path.open(mode)
        self._fh.truncate(passages * 8)
        self._fh.seek(passages * 8)
        old = np.fromfile(self.path, dtype=np.uint64, count=passages) if passages else np.zeros(0, np.uint64)
        if len(old) != passages:
            raise ValueError(f"{self.path} holds {len(old)} ids, the checkpoint {passages}: start again with --restart")
        self.blocks: list[np.ndarray] = [np.sort(old[i : i + CAP]) for i in range(0, passages, CAP)]
        del old
        self.recent: dict[int, int] = {}
        self.count = passages

    def row_of(self, doc_id: str) -> int | None:
        """The row of the passage read earlier with this id, or None."""
        h = id_hash(doc_id)
        row = self.recent.get(h)
        if row is not None:
            return row
        key = np.uint64(h)
        for block in self.blocks:
            i = int(np.searchsorted(block, key))
            if i < len(block) and block[i] == key:
                self.flush()
                for start in range(0, self.count, CAP):  # the file in row order, a block at a time
                    part = np.fromfile(self.path, dtype=np.uint64, count=CAP, offset=start * 8)
                    hit = np.flatnonzero(part == key)
                    if len(hit):
                        return start + int(hit[0])
        return None

    def add(self, ids: Sequence[str]) -> None:
        """Record the ids of the next passages (rows ``count``, ``count + 1``, ...)."""
        for doc_id in ids:
            self.recent[id_hash(doc_id)] = self.count
            self.count += 1
        if len(self.recent) >= BLOCK:
            self._spill()

    def any_seen(self, hashes: np.ndarray) -> bool:
        """Whether any of ``hashes`` (of ids to be read next) was recorded before or occurs twice among
        them: a vectorised filter (False: none of those ids repeats; True: look at them one by one)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        if len(hashes) == 0:
            return False
        if len(np.unique(hashes)) != len(hashes):
            return True
        recent = self.recent
        if recent and any(h in recent for h in hashes.tolist()):
            return True
        for block in self.blocks:
            pos = np.minimum(np.searchsorted(block, hashes), len(block) - 1)
            if np.any(block[pos] == hashes):
                return True
        return False

    def add_hashes(self, hashes: np.ndarray) -> None:
        """``add`` for ids given by their hashes (``id_hashes``), none of them seen (``any_seen``)."""
        for h in np.asarray(hashes, dtype=np.uint64).tolist():
            self.recent[h] = self.count
            self.count += 1
        if len(self.recent) >= BLOCK:
            self._spill()

    def _spill(self) -> None:
        hashes = np.fromiter(self.recent, dtype=np.uint64, count=len(self.recent))
        rows = np.fromiter(self.recent.values(), dtype=np.int64, count=len(self.recent))
        self._fh.write(hashes[np.argsort(rows)].tobytes())
        self.recent = {}
        block = np.sort(hashes)
        while self.blocks and len(self.blocks[-1]) <= len(block) and len(self.blocks[-1]) + len(block) <= CAP:
            block = np.sort(np.concatenate([self.blocks.pop(), block]), kind="stable")
        self.blocks.append(block)

    def flush(self) -> None:
        """Write every hash recorded so far to the file (the chunk's, before its checkpoint)."""
        if self.recent:
            self._spill()
        self._fh.flush()

    def sync(self) -> None:
        self.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
