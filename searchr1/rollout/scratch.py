"""Weights folders in memory (/dev/shm) that a run writes for an inference server: where they go (room
checked first), who owns them, and the sweep that frees those a killed run left behind.

The vLLM engine writes the policy's weights to a folder in /dev/shm (RAM) for its server to reload. Before
the first write the weights' size is checked against the free space there: a container's /dev/shm is often
64 MB, so a folder that would not fit goes to the temp folder (on disk) instead, and one line says which was
used (``make_weights_dir``). The engine removes the folder when it closes; when the run dies before that
(SIGKILL, OOM killer), its watchdog removes it (``searchr1.rollout.watchdog``). As a last resort, every
``searchr1`` command and every engine start sweeps what neither could remove (``sweep_orphans``).

A folder says who owns it twice, and the sweep removes it only when both say the owner is gone:

    /dev/shm/searchr1-vllm-weights-<pid>-<start>-<random>/     the owner's pid and start time (clock ticks
        .searchr1-owner.lock                                    since boot: a reused pid starts at another);
                                                                a lock the owner holds while it lives

The pid means nothing in another pid namespace (a container sharing /dev/shm or /tmp with the host), but the
lock (``flock``) is the kernel's and is released only when the owner dies, whatever the namespace. Folders of
other users, and folders named by ``rollout.vllm.weights_dir``, are never touched.

Imports only the standard library: ``searchr1 --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from searchr1.errors import UserFacingError
from searchr1.rollout import watchdog
from searchr1.rollout.watchdog import process_start

try:
    import fcntl
except ImportError:  # not POSIX: the pid and start time alone tell
    fcntl = None  # type: ignore[assignment]

PREFIX = "searchr1-vllm-weights-"
LOCK_NAME = ".searchr1-owner.lock"
"""The file in each folder whose ``flock`` the owner holds while it lives."""
HEADROOM = 1 << 20
"""Room asked for beyond the weights themselves: the safetensors header and the small files beside it."""
_NAME = re.compile(rf"^\.?{re.escape(PREFIX)}(\d+)-(\d+)-")  # a leading dot: a folder still being made
_held: dict[Path, tuple[int, bool]] = {}
"""Each folder this process made: the fd of its lock (held until ``remove_weights_dir``), whether the
watchdog guards it."""


class ScratchSpaceError(UserFacingError):
    """No folder has room for the weights; the message names the free space of each and what to do."""


def scratch_roots() -> list[Path]:
    """Where weights folders are made: /dev/shm when it is a writable folder, and the temp folder."""
    roots = []
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        roots.append(shm)
    roots.append(Path(tempfile.gettempdir()))
    return roots


def free_bytes(folder: Path) -> int:
    """Bytes a process of this user may still write in ``folder``'s file system."""
    return shutil.disk_usage(folder).free


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def check_room(
    folder: Path, need_bytes: int, *, replacing: int = 0, free: Callable[[Path], int] = free_bytes
) -> None:
    """``ScratchSpaceError`` (one line) unless ``folder`` has room for ``need_bytes`` of weights, counting the
    ``replacing`` bytes of the file they replace as free (it is removed before they are written)."""
    available = free(folder) + replacing
    if need_bytes + HEADROOM > available:
        raise ScratchSpaceError(
            f"no room for the vLLM weights ({_mb(need_bytes)}) in {folder}: {_mb(available)} free; free some "
            "memory there, or set rollout.vllm.weights_dir to a folder with room"
        )


def make_weights_dir(
    need_bytes: int = 0,
    roots: list[Path] | None = None,
    *,
    free: Callable[[Path], int] = free_bytes,
    quiet: bool = False,
    guard: bool = False,
) -> Path:
    """A fresh weights folder owned (and locked) by this process, in the first of ``roots`` (default
    ``scratch_roots()``: /dev/shm, then the temp folder) with room for ``need_bytes``; unless ``quiet``,
    one line says which folder was used and why. ``guard``: this process's watchdog removes it if this
    process dies before ``remove_weights_dir``. ``ScratchSpaceError`` when none has room."""
    roots = roots if roots is not None else scratch_roots()
    room = {root: free(root) for root in roots}
    fits = [root for root in roots if room[root] >= need_bytes + HEADROOM]
    if not fits:
        where = ", ".join(f"{root} {_mb(n)}" for root, n in room.items())
        raise ScratchSpaceError(
            f"no room for the vLLM weights ({_mb(need_bytes)}): free space {where}; free some, or set "
            "rollout.vllm.weights_dir to a folder with room"
        )
    folder = _locked_dir(fits[0])
    if guard:
        try:
            watchdog.shared().guard_folder(folder)
            _held[folder] = (_held[folder][0], True)
        except OSError as exc:
            print(f"warning: no watchdog for {folder} ({exc}): a killed run leaves it", file=sys.stderr)
    if not quiet:
        skipped = roots[: roots.index(fits[0])]
        why = "".join(f"{root} has {_mb(room[root])} free, " for root in skipped)
        print(
            f"vllm: weights folder {folder} ({why}{_mb(need_bytes)} of weights, {_mb(room[fits[0]])} free there)",
            file=sys.stderr,
            flush=True,
        )
    return folder


def _locked_dir(root: Path) -> Path:
    """Made under a hidden name, locked, then renamed: a folder under the sweep's name always has its lock."""
    pid = os.getpid()
    start = process_start(pid) or 0
    making = Path(tempfile.mkdtemp(prefix=f".{PREFIX}{pid}-{start}-", dir=str(root)))
    fd = -1
    if fcntl is not None:
        fd = os.open(making / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited across exec
        fcntl.flock(fd, fcntl.LOCK_EX)
    folder = making.with_name(making.name[1:])
    making.rename(folder)
    _held[folder] = (fd, False)
    return folder


def remove_weights_dir(folder: Path) -> None:
    """Remove a folder made by ``make_weights_dir``, let go of its lock, and tell the watchdog."""
    shutil.rmtree(folder, ignore_errors=True)
    fd, guarded = _held.pop(Path(folder), (-1, False))
    if fd >= 0:
        os.close(fd)
    if guarded:
        with contextlib.suppress(OSError):  # a watchdog that died has nothing to forget
            watchdog.shared().release_folder(folder)


def _owner_gone(pid: int, start: int) -> bool:
    if not Path("/proc").is_dir():  # cannot tell: leave it
        return False
    now = process_start(pid)
    return now is None or (start != 0 and now != start)


@contextlib.contextmanager
def _lock_if_free(folder: Path):
    """Yields True while holding the folder's lock when nobody else holds it (or it has no lock file, as in
    folders of earlier versions), False when a live process holds it."""
    if fcntl is None:
        yield True
        return
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR)
    except FileNotFoundError:
        yield True
        return
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if not path.is_symlink():
                with contextlib.suppress(OSError):
                    total += path.stat().st_size
    return total


def sweep_orphans(roots: list[Path] | None = None, *, quiet: bool = False) -> tuple[int, int]:
    """Remove the weights folders (of this user) whose owner is gone: no process with its pid and start
    time, and nobody holding its lock. Returns (folders, bytes) freed and, unless ``quiet`` or nothing was
    freed, prints one line saying so."""
    freed, size, where = 0, 0, set()
    uid = os.getuid() if hasattr(os, "getuid") else None
    for root in roots if roots is not None else scratch_roots():
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            m = _NAME.match(entry.name)
            if m is None or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
            except OSError:
                continue
            if not _owner_gone(int(m.group(1)), int(m.group(2))):
                continue
            folder = Path(entry.path)
            with _lock_if_free(folder) as free_:
                if not free_:
                    continue  # its owner lives (in another pid namespace: its pid means nothing here)
                bytes_ = _size(folder)
                shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                freed, size = freed + 1, size + bytes_
                where.add(str(root))
    if freed and not quiet:
        print(
            f"freed {size / 1e6:.0f} MB in {', '.join(sorted(where))}: {freed} vLLM weights "
            f"folder{'s' if freed > 1 else ''} left by killed runs",
            file=sys.stderr,
            flush=True,
        )
    return freed, size
