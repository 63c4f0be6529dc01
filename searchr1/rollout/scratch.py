"""Weights folders in memory (/dev/shm) that a run writes for an inference server, and the sweep that frees
those a killed run left behind.

The vLLM engine writes the policy's weights to a folder in /dev/shm (RAM) for its server to reload; the
engine removes it when it closes, but a run killed with SIGKILL never gets there, and /dev/shm keeps the
folder (hundreds of MB) until reboot. So the folder's name says who owns it:

    /dev/shm/searchr1-vllm-weights-<pid>-<start>-<random>     pid and start time (clock ticks since boot)

and ``sweep_orphans()`` (run by every ``searchr1`` command and by the engine's start) removes each such
folder whose owner is gone: no process with that pid, or one started at another time (a reused pid). The
start time is what tells a reused pid apart. Folders of other users, of a process that still runs, and
folders named by ``rollout.vllm.weights_dir`` are never touched.

Imports only the standard library: ``searchr1 --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

PREFIX = "searchr1-vllm-weights-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-(\d+)-")


def scratch_roots() -> list[Path]:
    """Where weights folders are made: /dev/shm when it is a writable folder, and the temp folder."""
    roots = []
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        roots.append(shm)
    roots.append(Path(tempfile.gettempdir()))
    return roots


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None: no such
    process, or no /proc to ask."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


def make_weights_dir(root: Path | None = None) -> Path:
    """A fresh weights folder owned by this process, in ``root`` (default /dev/shm if possible, else the
    temp folder)."""
    pid = os.getpid()
    start = process_start(pid) or 0
    where = root if root is not None else scratch_roots()[0]
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{start}-", dir=str(where)))


def _owner_gone(pid: int, start: int) -> bool:
    if not Path("/proc").is_dir():  # cannot tell: leave it
        return False
    now = process_start(pid)
    return now is None or (start != 0 and now != start)


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
    """Remove the weights folders (of this user) whose owner process is gone; returns (folders, bytes)
    freed and, unless ``quiet`` or nothing was freed, prints one line saying so."""
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
