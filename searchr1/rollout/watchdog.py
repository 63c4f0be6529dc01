"""The watchdog: a small process that stops what this process started (a vLLM server's process group) and
removes what it wrote (weights folders in /dev/shm) when this process dies, however it dies.

    wd = shared()                        # started on first use: one per process, ~10 MB
    wd.guard_group(server.pid, 15.0)     # if this process dies: SIGTERM to the group, SIGKILL after 15 s
    wd.guard_folder(folder)              # ... and then remove this folder
    wd.release_group(pid); wd.release_folder(folder)   # stopped / removed it myself: forget it

This process holds the write end of a pipe whose read end is the watchdog's stdin; each call is one line on
it. Nothing else holds the write end (it is not inherited across exec), so when this process ends (exit,
SIGKILL, OOM killer) the kernel closes it and the watchdog reads EOF: a death noticed without any signal,
whichever thread started what. The watchdog then stops every group still registered (SIGTERM, then SIGKILL
to the whole group after its grace period, until no process of it is left), removes every folder still
registered, prints one line saying what it did, and exits. A clean shutdown releases everything first, so
the EOF that follows finds nothing to do. A group that needed SIGKILL could not unlink its shared memory
(vLLM's engine core and worker hold ~400 MB of ``/dev/shm/psm_*``): the files in /dev/shm the group held are
removed once it is gone, unless another process still holds them. What a group holds is read while it
runs (at registration, then every ``RESCAN_S``), not only at the death: the kernel's death signal reaches
the server at the same moment as the EOF, and a vLLM server interrupted while reloading weights kills its
engine core at once, before the watchdog could read which files that process had mapped.

The watchdog runs in a session of its own (Ctrl-C or a closed terminal reaches the trainer, not it) and
imports only the standard library: it is started as ``python -I <this file>`` and never imports torch.
A process group id is signalled only while it is still the server's: its leader has the start time recorded
when it was registered, or (the leader gone) processes of the group remain, which keeps the id from reuse.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KILL_WAIT_S = 10.0
"""After SIGKILL, how long the watchdog waits for the group's processes to be gone before it moves on."""
RESCAN_S = 1.0
"""How often the watchdog reads which files in /dev/shm the registered groups hold (measured here: 7 ms for
a one-process group with torch loaded, among 65 processes: under 1% of a core at one rescan a second)."""
SHM = Path("/dev/shm")
"""Where the shared memory that a killed group leaves is looked for."""


# -- processes, read from /proc ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` the watchdog and the weights-folder sweep read."""

    state: str
    """R, S, D, Z (a zombie: exited, not yet reaped), ..."""
    pgid: int
    start: int
    """When the process started, in clock ticks since boot (what tells a reused pid apart)."""


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s state, process group and start time; None: no such process, or no /proc to ask."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    return ProcStat(state=fields[0], pgid=int(fields[2]), start=int(fields[19]))


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None: no such
    process, or no /proc to ask."""
    stat = proc_stat(pid)
    return None if stat is None else stat.start


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group ``pgid``. Without /proc: ``[pgid]`` while the
    kernel still knows the group, else ``[]``."""
    if not Path("/proc/self/stat").is_file():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat.pgid == pgid and stat.state != "Z":
                members.append(int(entry.name))
    return members


def group_is_ours(pgid: int, leader_start: int) -> bool:
    """Whether process group ``pgid`` is still the one registered: its leader runs with the start time
    recorded (0: not known), or the leader is gone and processes of the group remain (a group id is not
    reused while any process of the group exists; a new group with this id would have a live leader of
    another start time)."""
    leader = proc_stat(pgid)
    if leader is not None and leader.state != "Z":
        return leader_start in (0, leader.start)
    return bool(group_members(pgid))


def wait_gone(pgid: int, timeout_s: float) -> bool:
    """Whether no process of group ``pgid`` is left within ``timeout_s`` (polled every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def shm_held(pids: list[int] | None = None) -> set[str]:
    """The files directly in ``SHM`` that processes ``pids`` (default: every process this user may inspect)
    have mapped or open: the shared memory of vLLM's engine processes (``psm_*``) among them."""
    held: set[str] = set()
    prefix = f"{SHM}/"
    for pid in pids if pids is not None else _pids():
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        names = [line.split(None, 5)[5] for line in maps if prefix in line]
        for fd in fds:
            with contextlib.suppress(OSError):
                names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        held.update(n for n in names if n.startswith(prefix) and "/" not in n[len(prefix) :])
    return {n for n in held if not n.endswith(" (deleted)")}


def remove_leaked_shm(paths: set[str]) -> int:
    """Remove those of ``paths`` (files in ``SHM`` that a group now gone held) that are this user's and
    that no process holds any more: a group killed with SIGKILL cannot unlink its shared memory, and
    /dev/shm would keep it (hundreds of MB for vLLM) until reboot. Returns the bytes freed."""
    if not paths:
        return 0
    freed = 0
    for name in paths - shm_held():
        path = Path(name)
        with contextlib.suppress(OSError):
            info = path.lstat()
            if path.parent == SHM and path.is_file() and not path.is_symlink() and info.st_uid == os.getuid():
                path.unlink()
                freed += info.st_size
    return freed


def _freed(freed: int) -> str:
    return f"; {freed / 1e6:.0f} MB of shared memory it left freed" if freed else ""


def stop_group(pgid: int, leader_start: int, grace_s: float, held_before: Iterable[str] = ()) -> str | None:
    """SIGTERM to process group ``pgid``, SIGKILL to it after ``grace_s`` if any of it is left, until none
    is (at most ``KILL_WAIT_S`` more); then the shared memory it held (now or, ``held_before``, earlier)
    and left behind is removed. Returns what happened in a few words, or None when the group is no longer
    the one registered (gone, or its id reused): then nothing is signalled or removed."""
    if not group_is_ours(pgid, leader_start):
        return None
    t0 = time.monotonic()
    held = set(held_before) | shm_held(group_members(pgid))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    if wait_gone(pgid, grace_s):
        how = f"SIGTERM, gone in {time.monotonic() - t0:.1f} s"
    else:
        held |= shm_held(group_members(pgid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        gone = wait_gone(pgid, KILL_WAIT_S)
        state = "gone" if gone else f"{len(group_members(pgid))} processes still there"
        how = f"SIGTERM, SIGKILL after {grace_s:g} s, {state} in {time.monotonic() - t0:.1f} s"
    return how + _freed(remove_leaked_shm(held))


# -- this process's side ----------------------------------------------------------------------------------


class Watchdog:
    """This process's end of the pipe to its watchdog. Thread-safe; a call after the watchdog died raises
    ``OSError`` (its line is lost, not the caller's work: callers suppress it)."""

    def __init__(self, process: subprocess.Popen, pipe_fd: int) -> None:
        self.process = process
        self._fd = pipe_fd
        self._lock = threading.Lock()
        self.owner = os.getpid()

    @classmethod
    def start(cls) -> Watchdog:
        """Start a watchdog for this process (see the module docstring)."""
        read_fd, write_fd = os.pipe()  # neither end is inherited across exec
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).resolve()), str(os.getpid())],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return cls(process, write_fd)

    def _send(self, *words: str) -> None:
        line = " ".join(words)
        if "\n" in line:
            raise ValueError(f"watchdog: a name with a line break cannot be registered: {line!r}")
        with self._lock:
            os.write(self._fd, (line + "\n").encode())

    def guard_group(self, pgid: int, grace_s: float) -> None:
        """If this process dies: SIGTERM to process group ``pgid``, SIGKILL after ``grace_s``."""
        self._send("group", str(pgid), str(process_start(pgid) or 0), f"{grace_s:g}")

    def release_group(self, pgid: int) -> None:
        self._send("release-group", str(pgid))

    def guard_folder(self, folder: Path | str) -> None:
        """If this process dies: remove ``folder`` (after the groups are stopped: they may read it)."""
        self._send("folder", str(Path(folder).resolve()))

    def release_folder(self, folder: Path | str) -> None:
        self._send("release-folder", str(Path(folder).resolve()))

    def close(self) -> None:
        """End the watchdog: what is still registered is stopped and removed, as at this process's death."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=KILL_WAIT_S)


_shared: Watchdog | None = None
_shared_lock = threading.Lock()


def shared() -> Watchdog:
    """This process's watchdog, started on first use (a forked child gets one of its own)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.owner != os.getpid() or _shared.process.poll() is not None:
            _shared = Watchdog.start()
        return _shared


# -- the watchdog process -----------------------------------------------------------------------------------


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # whoever read this process's stderr may be gone too
        print(f"searchr1 watchdog: {line}", file=sys.stderr, flush=True)


@dataclass
class _Guarded:
    """A registered group: its leader's start time, its grace period, the files in /dev/shm it was seen to
    hold."""

    start: int
    grace_s: float
    held: set[str]

    def rescan(self, pgid: int) -> None:
        if group_is_ours(pgid, self.start):
            self.held |= shm_held(group_members(pgid))
        self.held = {name for name in self.held if os.path.exists(name)}  # those it removed itself: forgotten


def _lines_to(inbox: queue.Queue, lines) -> None:
    for raw in lines:
        inbox.put(raw)
    inbox.put(None)  # EOF


def watch(lines, owner: int, rescan_s: float = RESCAN_S) -> int:
    """Read registrations from ``lines`` until EOF (reading the shared memory the registered groups hold at
    each registration and every ``rescan_s`` in between), then stop and remove what is still registered."""
    groups: dict[int, _Guarded] = {}
    folders: dict[str, None] = {}  # in registration order
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_lines_to, args=(inbox, lines), daemon=True).start()
    while True:
        try:
            raw = inbox.get(timeout=rescan_s)
        except queue.Empty:
            for pgid, guarded in groups.items():
                guarded.rescan(pgid)
            continue
        if raw is None:
            break
        word, _, rest = raw.decode(errors="surrogateescape").rstrip("\n").partition(" ")
        if word == "group":
            pgid, start, grace = rest.split()
            groups[int(pgid)] = _Guarded(int(start), float(grace), set())
            groups[int(pgid)].rescan(int(pgid))
        elif word == "release-group":
            groups.pop(int(rest), None)
        elif word == "folder":
            folders[rest] = None
        elif word == "release-folder":
            folders.pop(rest, None)
    done = []
    for pgid, guarded in groups.items():
        how = stop_group(pgid, guarded.start, guarded.grace_s, guarded.held)
        if how is not None:
            done.append(f"stopped the vLLM server's process group {pgid} ({how})")
        elif freed := remove_leaked_shm(guarded.held):  # gone before its trainer: only what it left
            done.append(f"the vLLM server's process group {pgid} was already gone{_freed(freed)}")
    for folder in folders:
        if Path(folder).exists():
            shutil.rmtree(folder, ignore_errors=True)
            done.append(f"removed {folder}" if not Path(folder).exists() else f"could not remove {folder}")
    if done:
        _say(f"process {owner} ended without cleaning up: {'; '.join(done)}")
    return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its own session already; a stray Ctrl-C does not count
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    owner = int(argv[0]) if argv else os.getppid()
    return watch(sys.stdin.buffer, owner)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
