"""The thread governor uses the cores that other processes leave free (measured from /proc/stat)."""

from __future__ import annotations

import pytest
import torch

from searchr1 import threads


class Clock:
    """A fake machine: wall time, busy seconds of the allowed cores, this process's CPU time."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.busy = 500.0
        self.niced = 50.0
        self.own = 10.0

    def run(self, seconds: float, own_cores: float, other_cores: float, niced_cores: float = 0.0) -> None:
        """``niced_cores``: other processes at a higher nice value (in /proc/stat's nice column)."""
        self.wall += seconds
        self.own += own_cores * seconds
        self.busy += (own_cores + other_cores + niced_cores) * seconds
        self.niced += niced_cores * seconds

    def busy_seconds(self, cpus: list[int], count_nice: bool = True) -> float:
        return self.busy if count_nice else self.busy - self.niced


@pytest.fixture
def machine(monkeypatch):
    threads.configure(False)  # a governor a trainer test left installed
    clock = Clock()
    set_to: list[int] = []
    monkeypatch.setattr(threads, "_busy_seconds", clock.busy_seconds)
    monkeypatch.setattr(threads, "_niceness", lambda: 0)
    monkeypatch.setattr(threads, "_allowed_cpus", lambda: [0, 1])
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock.wall)
    monkeypatch.setattr(threads.time, "process_time", lambda: clock.own)
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    yield clock, set_to
    threads._GOVERNOR = None


def test_one_thread_while_another_process_takes_a_core_and_two_after(machine):
    clock, set_to = machine
    gov = threads.ThreadGovernor(requested=2)
    assert gov.adapt() == 2  # the first call only starts a window
    clock.run(1.0, own_cores=1.3, other_cores=0.7)  # a competitor keeps most of a core busy
    assert gov.adapt() == 1 and set_to == [1]
    assert gov.others == pytest.approx(0.7)
    clock.run(0.2, own_cores=1.0, other_cores=0.0)
    assert gov.adapt() == 1  # within the window: no new measurement
    clock.run(1.0, own_cores=1.0, other_cores=0.0)  # the competitor is gone
    assert gov.adapt() == 2 and set_to == [1, 2]
    clock.run(1.0, own_cores=2.0, other_cores=0.3)  # a little background work keeps both threads
    assert gov.adapt() == 2 and set_to == [1, 2]


def test_off_and_single_thread_governors_never_change_the_count(machine):
    clock, set_to = machine
    for gov in (threads.ThreadGovernor(requested=2, enabled=False), threads.ThreadGovernor(requested=1)):
        gov.adapt()
        clock.run(1.0, own_cores=1.0, other_cores=1.0)
        assert gov.adapt() == gov.requested
    assert set_to == []


def test_the_module_level_governor_is_installed_and_removed(machine):
    clock, set_to = machine
    assert threads.configure(True, requested=2) is threads.governor()
    threads.adapt()
    clock.run(1.0, own_cores=1.0, other_cores=1.0)
    assert threads.adapt() == 1
    threads.configure(False)  # back to the requested count
    assert threads.governor() is None and set_to == [1, 2]


def test_niced_processes_do_not_take_threads_from_a_process_at_normal_priority(machine, monkeypatch):
    clock, set_to = machine
    gov = threads.ThreadGovernor(requested=2)
    gov.adapt()
    clock.run(1.0, own_cores=1.9, other_cores=0.0, niced_cores=0.1)  # a nice-19 test suite soaks up what is left
    assert gov.adapt() == 2 and set_to == [] and gov.others == pytest.approx(0.0)
    clock.run(1.0, own_cores=1.2, other_cores=0.8, niced_cores=0.0)  # a competitor at normal priority does
    assert gov.adapt() == 1
    monkeypatch.setattr(threads, "_niceness", lambda: 10)  # a niced process counts niced competitors too
    niced = threads.ThreadGovernor(requested=2)
    niced.adapt()
    clock.run(1.0, own_cores=1.2, other_cores=0.0, niced_cores=0.8)
    assert niced.adapt() == 1 and niced.others == pytest.approx(0.8)
