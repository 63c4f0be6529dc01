"""Keep freed memory in the process instead of returning it to the kernel at every free.

glibc serves allocations above ``M_MMAP_THRESHOLD`` (128 KiB at first, adapting up to 32 MiB) with their own
``mmap`` and unmaps them when freed, and trims the heap's top above ``M_TRIM_THRESHOLD``; every such tensor
then costs fresh zeroed pages (a page fault per 4 KiB) the next time. PyTorch's CPU allocator has no cache of
its own, so a decoding step that creates megabyte-sized temporaries (attention scores, MLP activations) pays
this on every layer. Measured on 2 cores (prefill attention of one layer, 10 rows x 75 queries over 425 keys,
and 1 row x 750 over 950): 5.4-8.3 ms and 27-31 ms by default, 4.9-5.1 ms and 12.5-12.7 ms with the thresholds
raised (``benchmarks/`` figures of the rollout include it).

``keep_freed_memory()`` raises both thresholds (mmap to its 32 MiB maximum, trim to 1 GiB) through
``mallopt``; the command line calls it once at start. Peak memory is unchanged (a freed block is reused by
the next allocation); resident memory no longer drops between steps. A no-op where libc is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc's largest accepted ``M_MMAP_THRESHOLD`` on 64-bit systems."""


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (once); True when glibc accepted them."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
    ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    ok = mallopt(M_TOP_PAD, 64 << 20) == 1 and ok
    return ok
