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

`children_niced` is the other use of the same mechanism: the processes a thread
starts inherit its nice value, so starting them from a thread niced for the moment
starts them below everything already running, while the thread itself goes back.
A simulated cluster boots the nodes that arrive during a drill that way
(`bastion.launcher`): on one machine, a booting node's Ray agents at nice 0 would
otherwise take both cores from the job's workers, which Ray runs at nice 15.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
from typing import Iterator

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
            if tid is None:
                continue  # not started yet: no thread to lower
            try:
                lowered = os.sched_getscheduler(tid) == os.SCHED_IDLE
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


LOWEST_NICE = 19


@contextlib.contextmanager
def children_niced(nice: int = LOWEST_NICE) -> Iterator[bool]:
    """Processes the calling thread starts inside the block run at nice ``nice``
    (and so do theirs: Linux children inherit it); the thread itself goes back to
    its own nice value on the way out. Yields whether it lowered: it does not where
    going back would need a privilege the process lacks (an unprivileged process may
    only raise its nice value above its ``RLIMIT_NICE`` floor), nor where the OS
    has no per-thread nice values — a thread left niced would slow everything it
    did afterwards."""
    # elsewhere a nice value is the whole process's, this driver's every thread
    own = os.getpriority(os.PRIO_PROCESS, 0) if sys.platform == "linux" else None
    if own is None or own >= nice or not _may_return_to(own):
        yield False
        return
    os.setpriority(os.PRIO_PROCESS, 0, nice)  # 0: the calling thread, on Linux
    try:
        yield True
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, own)


def _may_return_to(nice: int) -> bool:
    """Whether this process may lower its nice value back to ``nice``: as root
    (CAP_SYS_NICE, which root holds unless a container took it away), or within
    ``RLIMIT_NICE`` (a soft limit of ``r`` allows nice values down to ``20 - r``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or 20 - soft <= nice
