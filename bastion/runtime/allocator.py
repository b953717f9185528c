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
back to the system once more than `KEEP_IDLE_BYTES` lie free, so an idle worker does
not hold a large job's peak. Below that it keeps them: the next job's first log
segments, buffers and frames are written into them. Trimming a worker's 30-odd MB
after every job cost the next job ~4,000 page faults (~50 ms) before its first
checkpoint — measured on pooled workers running a CEC job of a million records
twice: 5,400 faults the second time with the trim, 1,500 without. Where the C
library is not glibc (no ``mallopt``), nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["keep_freed_memory", "release_freed_memory", "free_heap_bytes",
           "KEEP_IDLE_BYTES"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# mallopt takes an int: the largest free top of the heap kept, 2 GiB - 1
_TRIM_THRESHOLD_BYTES = 2**31 - 1
#: The free heap an idle worker keeps for its next job: a few jobs' buffers, small
#: beside a worker's ~84 MiB, where a large state's peak is gigabytes.
KEEP_IDLE_BYTES = 128 * 2**20


class _MallInfo2(ctypes.Structure):
    # glibc's ``struct mallinfo2`` (2.33 and later): every field a size_t
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # loaded once: find_library runs ``ldconfig -p`` in a subprocess (~1.7 ms a call,
    # twice per worker given back to the pool before this was cached)
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _glibc(function: str):
    return getattr(_libc(), function, None)


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


def free_heap_bytes() -> int | None:
    """The bytes free in this process's malloc heaps (``mallinfo2().fordblks``);
    None where glibc has no ``mallinfo2``."""
    mallinfo2 = _glibc("mallinfo2")
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


def release_freed_memory(keep_bytes: int = KEEP_IDLE_BYTES) -> bool:
    """Hand the memory free in this process's heap back to the system
    (``malloc_trim``) when more than ``keep_bytes`` are free (always where that
    cannot be told); whether it did. Nothing where there is no glibc."""
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is None:
        return False
    free_bytes = free_heap_bytes()
    if free_bytes is not None and free_bytes <= keep_bytes:
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim(0)
    return True
