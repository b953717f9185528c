"""A worker process's allocator: freed memory is kept for reuse, not handed back.

glibc's malloc serves a block of 128 KiB or more (up to 32 MiB, as its threshold
adapts) with a fresh ``mmap`` and unmaps it when it is freed, and it hands the top of
its heap back to the system once 128 KiB lie free there. Every later block of that
size is then fresh memory, and the first write to each of its pages is a page fault:
about a quarter of a microsecond on bare metal, and up to 3 ms per MiB (~12 µs a page)
measured on the virtual machines Bastion is developed on, where the host backs a page
only when the guest first touches it.

A worker makes exactly such blocks again and again: a checkpoint's temporaries — an
incremental delta's sets and dicts of millions of keys, an encoded snapshot —, a log
segment's buffer, large frames. Six deltas of 2 M keys each, in process, took 580 k
page faults and 1.5 s of system time at glibc's defaults, and 92 k and 0.2 s with the
settings below (3.7 s → 1.8-2.5 s in all).

So a worker asks glibc (``mallopt``) to serve every block from its heap and to keep
what is freed there: what one checkpoint freed is what the next one writes into. The
price is that a worker's resident memory stays at its job's peak while it serves the
job (its heap is trimmed only past 2 GiB free); when the job gives the worker back
to the pool (`bastion.scheduler.pool`), `release_freed_memory` hands what is free
back to the system, so an idle worker does not hold its last job's peak. Where the C
library is not glibc (no ``mallopt``), nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory", "release_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# mallopt takes an int: the largest free top of the heap kept, 2 GiB - 1
_TRIM_THRESHOLD_BYTES = 2**31 - 1


def _glibc(function: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), function)
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Set this process's glibc malloc to reuse freed memory (see the module's
    docstring); whether it could (False where there is no glibc ``mallopt``)."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # mallopt returns 1 on success
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))


def release_freed_memory() -> None:
    """Hand the memory free in this process's heap back to the system
    (``malloc_trim``); nothing where there is no glibc."""
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is not None:
        malloc_trim.argtypes = (ctypes.c_size_t,)
        malloc_trim(0)
