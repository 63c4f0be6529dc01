"""Checkpoints of a streaming index build: what has been read, so an interrupted build resumes.

A build of wiki-18 takes hours (dense encoding on a CPU: days). Every chunk of passages it finishes
is made durable (its files flushed and fsync'ed) and then recorded in ``OUT/.build/state.json``,
written atomically (a temporary file renamed over the old one), so the state on disk always names a
consistent prefix of the corpus. ``state.json`` holds the corpus checksum and the build settings: a
resume against a changed corpus or other settings is refused, naming the checksums or the settings.

A folder holding ``.build/`` but no ``manifest.json`` is an interrupted build; ``load_index`` says so
rather than loading it (the manifest is written last, once the index is complete).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchr1.retrieval.corpus import ReadPosition

BUILD_DIR = ".build"
STATE_FILE = "state.json"


class IndexBuildError(ValueError):
    """A build cannot start, go on or finish: a changed corpus on resume, a full disk, ..."""


@dataclass
class BuildState:
    """Progress of one build, as recorded after its last finished chunk."""

    retriever: str
    corpus: str
    corpus_sha256: str
    settings: dict[str, Any]
    """Everything that changes the index (retriever parameters, chunking, encoder, index kind)."""
    offset: int = 0
    """Corpus bytes read by the finished chunks (always a line boundary)."""
    lineno: int = 0
    skipped: int = 0
    """Malformed lines skipped so far."""
    passages: int = 0
    docstore_bytes: int = 0
    chunks: int = 0
    phase: str = "read"
    """read (passages streamed chunk by chunk) -> index (the retriever's own finishing passes)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Retriever-specific progress (e.g. vectors added to a dense index so far)."""

    @property
    def position(self) -> ReadPosition:
        return ReadPosition(self.offset, self.lineno, self.skipped)

    def advance(self, position: ReadPosition, passages: int, docstore_bytes: int) -> None:
        self.offset, self.lineno, self.skipped = position.offset, position.lineno, position.skipped
        self.passages, self.docstore_bytes = passages, docstore_bytes
        self.chunks += 1


def build_dir(out: str | Path) -> Path:
    return Path(out) / BUILD_DIR


def read_state(out: str | Path) -> BuildState | None:
    """The recorded state of an interrupted build in ``out``, or None."""
    path = build_dir(out) / STATE_FILE
    if not path.is_file():
        return None
    try:
        return BuildState(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise IndexBuildError(
            f"{path} is not a build checkpoint ({exc}); start again without --resume"
        ) from None


def write_state(out: str | Path, state: BuildState) -> None:
    """Record ``state`` atomically: a reader sees the old state or the new one, never half of one."""
    folder = build_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    with tmp.open("w") as fh:
        fh.write(json.dumps(asdict(state), indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / STATE_FILE)


def clear_state(out: str | Path) -> None:
    shutil.rmtree(build_dir(out), ignore_errors=True)


def check_resumable(state: BuildState, corpus_sha256: str, corpus: str, settings: dict[str, Any]) -> None:
    """Refuse to resume ``state`` against another corpus or other settings, naming what differs."""
    if state.corpus_sha256 != corpus_sha256:
        raise IndexBuildError(
            f"cannot resume: the interrupted build read a corpus with sha256 {state.corpus_sha256} "
            f"({state.corpus}), but {corpus} now has sha256 {corpus_sha256}; restore that corpus or "
            "start again with --restart"
        )
    changed = sorted(k for k in {*state.settings, *settings} if state.settings.get(k) != settings.get(k))
    if changed:
        diffs = ", ".join(f"{k}: {state.settings.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise IndexBuildError(
            f"cannot resume: the interrupted build used other settings ({diffs}); "
            "use the same options or start again with --restart"
        )


def fsync_file(path: str | Path) -> None:
    """Make a file's written bytes durable (a checkpoint may only name what is on disk)."""
    with Path(path).open("rb+") as fh:
        os.fsync(fh.fileno())


@contextlib.contextmanager
def disk_errors(out: str | Path) -> Iterator[None]:
    """Turn a full disk (or quota) during a build into an ``IndexBuildError`` that says what to do."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        needed = getattr(exc, "needed", None)
        if needed is not None:
            where = (
                f" in {exc.filename} (its partial file removed; it needs about {_size(needed)} "
                f"({needed:,} bytes) more to finish)"
            )
        try:
            free = shutil.disk_usage(out).free / 1e9
            free_note = f"; {free:.1f} GB free now"
        except OSError:
            free_note = ""
        state = read_state(out) if build_dir(out).is_dir() else None
        resume = (
            f"; {state.passages} passages are checkpointed: free space and rerun with --resume"
            if state and state.passages
            else "; free space and run the build again"
        )
        raise IndexBuildError(
            f"disk full{where} while building the index in {out}{free_note}. The folder holds no "
            f"manifest, so `searchr1 serve` will not load the partial index{resume}"
        ) from exc


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"
