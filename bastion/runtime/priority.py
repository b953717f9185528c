"""The CPU priority of the thread that runs a worker's tasks: lowered to the OS's idle
class while they only catch up, and back (`bastion.scheduler.catchup` decides when).

A worker's tasks all run on its asyncio event loop, one thread; that thread does the
catch-up's work (decoding the replayed frames, running the operators). Linux
schedules threads, and ``sched_setscheduler(0, ...)`` changes the calling thread
only, so `set_idle`, called on the event loop, lowers exactly that thread — and the
helper threads it starts from then on (store reads and writes), which inherit its
class. Those helper threads outlive the catch-up (an executor keeps its threads), so
going back puts every thread of the process in the idle class back, not only the
calling one: else a pooled worker's later store writes would run at idle priority
for good, in this job and the next. Ray's own threads (its RPC, the worker's ``liveness`` thread that answers
heartbeats) keep their priority: a starved catch-up is slow, never taken for dead.

``SCHED_IDLE`` is below every nice level: a worker already at nice 19 still runs
before it. Going back to ``SCHED_OTHER`` keeps the thread's nice value; it needs no
privilege on Linux >= 2.6.39 when the nice value is within ``RLIMIT_NICE``. Where
the kernel refuses, the thread stays where it is and the caller is told: `set_idle`
returns what the thread runs at afterwards, read back from the kernel.
"""

from __future__ import annotations

import os
import threading

IDLE = "idle"
NORMAL = "normal"


def supported() -> bool:
    return hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setscheduler")


def set_idle(idle: bool) -> str:
    """Put the calling thread in the idle class (``idle``), or it and every thread
    of the process that it lowered (and those started meanwhile) back in the normal
    one; what the calling thread runs at afterwards (`current`). A no-op where the
    OS has no idle class."""
    if not supported():
        return NORMAL
    if idle:
        _set(0, os.SCHED_IDLE)
    else:
        _set(0, os.SCHED_OTHER)
        for thread in threading.enumerate():
            tid = thread.native_id
            try:
                lowered = tid is not None and os.sched_getscheduler(tid) == os.SCHED_IDLE
            except OSError:
                continue  # ended meanwhile
            if lowered:
                _set(tid, os.SCHED_OTHER)
    return current()


def _set(tid: int, policy: int) -> None:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
    except (PermissionError, ProcessLookupError):
        pass  # refused (`current` tells), or the thread ended


def current() -> str:
    """What the calling thread runs at: `IDLE` or `NORMAL`."""
    if supported() and os.sched_getscheduler(0) == os.SCHED_IDLE:
        return IDLE
    return NORMAL
