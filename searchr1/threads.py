"""How many CPU threads torch should use now: fewer while other processes keep cores busy.

PyTorch splits each operation over its threads and waits for the slowest (an OpenMP barrier per op). When
another process takes one of the cores, the thread that shares that core runs at half speed or less, every
op waits for it, and the threads that finish first spin at the barrier, taking CPU from the thread they
wait for. With thousands of small ops per decoding step the step then slows far more than the lost share
of the machine (measured in issue 28: 5-10x with a second 2-thread PyTorch process on 2 cores, where a fair
share is 2x). One thread per core that is actually free avoids that: the step then runs at the speed of
the cores it has.

``ThreadGovernor.adapt()`` measures, since its previous call, the CPU time that other processes used on
the cores this process may run on (``/proc/stat``'s busy time of those cores minus this process's own CPU
time) and sets ``torch.set_num_threads(max(1, min(requested, round(cores - others))))``. A process at
normal priority does not count the time of niced processes (``/proc/stat``'s ``nice`` column): they run
only on what it leaves, so its threads are not slowed by them; a niced process counts everything. Callers (the
rollout's decoding loop, the update's micro-batches) call it often; it re-measures at most every
``interval_s``. Linux only (elsewhere, and when off, the requested count stays).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

INTERVAL_S = 0.5
"""Shortest measuring window (shorter ones are dominated by the 10 ms clock ticks of ``/proc/stat``)."""


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _busy_seconds(cpus: list[int], count_nice: bool = True) -> float | None:
    """Busy (not idle, not iowait; without ``count_nice``, not niced either) seconds of ``cpus`` since boot,
    from ``/proc/stat``; None if unreadable."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{i}" for i in cpus}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    found = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name in wanted:
            values = [int(v) for v in rest.split()]
            busy += sum(values[:8]) - values[3] - values[4]  # user..steal, less idle and iowait
            if not count_nice:
                busy -= values[1]
            found += 1
    return busy / tick if found else None


def _niceness() -> int:
    try:
        return os.nice(0)
    except (AttributeError, OSError):
        return 0


class ThreadGovernor:
    """Keeps ``torch``'s intra-op threads at the number of allowed cores that other processes leave free."""

    def __init__(
        self, requested: int | None = None, enabled: bool = True, interval_s: float = INTERVAL_S
    ) -> None:
        self.requested = max(1, requested or torch.get_num_threads())
        """The most threads to use (the count configured when the governor was made)."""
        self.cpus = _allowed_cpus()
        self.count_nice = _niceness() > 0
        """Niced processes yield to this one unless it is niced itself: their time counts only then."""
        self.enabled = enabled and self.requested > 1 and _busy_seconds(self.cpus) is not None
        self.interval_s = interval_s
        self.threads = self.requested
        self.others = 0.0
        """Cores other processes kept busy in the last window (an average)."""
        self.changes = 0
        self._last: tuple[float, float, float] | None = None

    def _sample(self) -> tuple[float, float, float] | None:
        busy = _busy_seconds(self.cpus, self.count_nice)
        return None if busy is None else (time.monotonic(), busy, time.process_time())

    def adapt(self) -> int:
        """Re-measure if a window has passed and set the thread count; returns the count in force."""
        if not self.enabled:
            return self.threads
        now = self._sample()
        if now is None:
            return self.threads
        if self._last is None:
            self._last = now
            return self.threads
        wall = now[0] - self._last[0]
        if wall < self.interval_s:
            return self.threads
        own = now[2] - self._last[2]
        self.others = max(0.0, (now[1] - self._last[1] - own) / wall)
        self._last = now
        free = min(len(self.cpus), self.requested) - self.others
        threads = max(1, min(self.requested, int(free + 0.5)))
        if threads != self.threads:
            self.threads = threads
            self.changes += 1
            torch.set_num_threads(threads)
        return threads

    def restore(self) -> None:
        """Back to the requested count (e.g. at the end of a run)."""
        if self.threads != self.requested:
            torch.set_num_threads(self.requested)
            self.threads = self.requested


_GOVERNOR: ThreadGovernor | None = None


def configure(enabled: bool, requested: int | None = None) -> ThreadGovernor | None:
    """Install (``enabled``) or remove the process's governor; returns it. ``requested``: the most threads
    (default: torch's current count)."""
    global _GOVERNOR
    if _GOVERNOR is not None:
        _GOVERNOR.restore()
    _GOVERNOR = ThreadGovernor(requested, enabled=True) if enabled else None
    return _GOVERNOR


def adapt() -> int:
    """``ThreadGovernor.adapt`` of the installed governor (a no-op returning torch's count when none is)."""
    if _GOVERNOR is None:
        return torch.get_num_threads()
    return _GOVERNOR.adapt()


def governor() -> ThreadGovernor | None:
    return _GOVERNOR
