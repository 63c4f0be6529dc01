"""Worker processes for the demos' ``--jobs``: each one pinned to its own share of the CPU cores. The processes
are spawned (torch is not fork-safe once used), so what they run is a module-level function, pickled by name:
``with worker_pool(3) as pool: pool.submit(fn, *args)``."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def _pin_worker(cores: Any) -> None:
    """Worker initializer: take a set of cores, pin to them, use as many torch threads."""
    import torch

    mine = cores.get()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, mine)
    torch.set_num_threads(len(mine))


def worker_pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` spawned worker processes, the cores this process may use split evenly among them (every core
    to each when there are fewer cores than jobs)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cores = ctx.Queue()
    available = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    per = max(1, len(available) // jobs)
    for j in range(jobs):
        cores.put(set(available[j * per : (j + 1) * per]) or set(available))
    return ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_pin_worker, initargs=(cores,))
