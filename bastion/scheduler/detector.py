"""Failure detection: how the job master learns that a worker is lost, and why.

Three signals, whichever comes first:

- **heartbeats** — every quarter of ``heartbeat_timeout_s`` the job master pings every
  worker; a worker that does not answer within the timeout is dead (its process may
  still exist, hung or cut off: it is replaced all the same). The ping runs on a
  thread of its own in the worker, so a busy task loop does not look like a death;
- **dead actors** — a call to a worker whose process ended raises `RayActorError`;
- **task outcomes** — a worker reports how its tasks ended: a user-function error
  (`UDFError`, with ``fail_fast``), a peer it could not reach (`PeerLostError` or a
  `RayError`: the peer died), or any other exception (a bug or bad data).

Each becomes a `Failure` with a reason for the job's events. A lost process is
recovered; a failure a restart would only repeat (a task that raised) is *fatal* and
ends the job. One kind of task error is neither: a stored blob that cannot be read
back (`CorruptBlobError`, `KeyNotFoundError`, `IncompleteCheckpointError` — a worker
restoring a damaged checkpoint). Such a failure carries the blob's key (`Failure.blob`),
so the job master can give up that checkpoint and restore an older one.

**Correlated failures.** Machines often fail together (a rack, a power feed, a
zone). `CorrelatedFailures` groups what is lost: ``burst_losses`` or more losses —
a lost node counts once, a lost worker on a live node once — within
``burst_window_s`` of the first are one *correlated failure*, handed to the recovery
planner as one set (`bastion.scheduler.recovery`) instead of loss by loss. Under a
capacity model a burst also turns *adaptive buffering* on (Su & Zhou): from then
until the next checkpoint completed with every lost task running, every task keeps
an upstream backup, so that tasks recovered later, or lost again in a second wave,
are fed from their upstream instead of rolling the job back.

The rule for heartbeats is the one `answers` applies: a worker is alive when its ping
returns within ``heartbeat_timeout_s``, however late inside that timeout, and dead
when the ping times out or Ray reports the actor gone. How long a ping takes on a busy
machine is measured by `benchmarks/`, not asserted by tests.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NoReturn

import ray

from bastion.errors import PeerLostError, UDFError
from bastion.storage import CorruptBlobError, IncompleteCheckpointError, KeyNotFoundError


class Failure(Exception):
    """Why the job's tasks stopped. ``worker`` is the slot it was noticed on;
    ``fatal`` failures end the job instead of starting a recovery."""

    def __init__(self, reason: str, worker: int | None = None, udf: UDFError | None = None,
                 fatal: bool = False, blob: "UnreadableBlob | None" = None):
        super().__init__(reason)
        self.reason = reason
        self.worker = worker
        self.udf = udf
        self.fatal = fatal or udf is not None
        self.blob = blob


class UnreadableBlob:
    """A stored blob a worker could not read back: its key, and why (the error)."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnreadableBlob({self.key!r}, {self.reason!r})"


_BLOB_ERRORS = (CorruptBlobError, IncompleteCheckpointError, KeyNotFoundError)


def unreadable_blob(exc: BaseException) -> UnreadableBlob | None:
    """The blob ``exc`` — raised in a worker, or a Ray task error wrapping it — says
    could not be read back, if that is what it says."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
    if not isinstance(cause, _BLOB_ERRORS):
        return None
    # CorruptBlobError and KeyNotFoundError carry the key; IncompleteCheckpointError
    # names it in its message only, between quotes.
    key = getattr(cause, "key", None)
    if key is None:
        quoted = str(cause).split("'")
        key = quoted[1] if len(quoted) > 2 else ""
    return UnreadableBlob(key, f"{type(cause).__name__}: {cause}")


async def within(awaitable: Any, timeout_s: float) -> Any:
    """``await awaitable``, raising `TimeoutError` after ``timeout_s``. Cancelling it
    always cancels it (`asyncio.wait_for` before Python 3.12 can swallow that)."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


async def answers(worker: Any, timeout_s: float) -> bool:
    """Does ``worker`` answer a ping within ``timeout_s``?"""
    try:
        await within(worker.ping.remote(), timeout_s)
        return True
    except (TimeoutError, ray.exceptions.RayError):
        return False


async def confirmed_dead(worker: Any, timeout_s: float) -> bool:
    """Is ``worker`` (killed, or lost) known to Ray as dead within ``timeout_s``? A
    worker that only missed its heartbeat may still run — and write to the store —
    until its kill takes effect."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        try:
            await within(worker.ping.remote(), max(0.01, deadline_s - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except (TimeoutError, ray.exceptions.RayError):
            pass
        await asyncio.sleep(0.05)
    return False


async def watch_heartbeats(workers: Callable[[], list], timeout_s: float) -> NoReturn:
    """Ping ``workers()`` every quarter of ``timeout_s``; raise `Failure` for the first
    that does not answer in time."""
    while True:
        await asyncio.sleep(timeout_s / 4)
        alive = await asyncio.gather(*[answers(w, timeout_s) for w in workers()])
        for i, ok in enumerate(alive):
            if not ok:
                raise Failure(f"worker {i} missed its heartbeat ({timeout_s} s)", i)


def died_during(phase: str, exc: BaseException) -> Failure:
    """A worker died while the job master was deploying or starting the tasks."""
    return Failure(f"a worker died during {phase}: {type(exc).__name__}")


def call_failure(phase: str, worker: int, exc: BaseException) -> Failure:
    """The failure of a call to ``worker`` during ``phase`` (deploy, start) that
    raised ``exc``: the worker died, or one of its peers did (it could not connect),
    it could not read a stored blob back (restoring a damaged checkpoint), or anything
    else — a bug a restart would repeat."""
    if isinstance(exc, ray.exceptions.RayActorError):
        return died_during(phase, exc)
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
    if isinstance(cause, PeerLostError):
        return Failure(f"worker {worker}: a peer died during {phase} ({cause})", worker)
    blob = unreadable_blob(exc)
    if blob is not None:
        return Failure(f"worker {worker} could not read {blob.key!r} during {phase}: "
                       f"{blob.reason}", worker, blob=blob)
    return Failure(f"worker {worker} failed during {phase}: {type(cause).__name__}: "
                   f"{cause}", worker, fatal=True)


def outcome_failure(worker: int, outcome: "asyncio.Future") -> Failure | None:
    """The failure a finished ``wait`` call on ``worker`` reports (None: its tasks all
    finished)."""
    try:
        report = outcome.result()
    except ray.exceptions.RayActorError as exc:
        return Failure(f"worker {worker} died: {type(exc).__name__}", worker)
    failure = report["failure"]
    if isinstance(failure, UDFError):
        return Failure(str(failure), worker, udf=failure)
    if isinstance(failure, (PeerLostError, ray.exceptions.RayError)):
        # a task lost a peer worker: recover like from the death itself
        return Failure(f"worker {worker}: a peer died ({failure})", worker)
    blob = None if failure is None else unreadable_blob(failure)
    if blob is not None:  # e.g. logged frames a restored task replays
        return Failure(f"worker {worker} could not read {blob.key!r}: {blob.reason}",
                       worker, blob=blob)
    if failure is not None:
        return Failure(f"worker {worker}: {failure}", worker, fatal=True)
    return None


@dataclass
class CorrelatedFailures:
    """Groups losses into correlated failures: ``burst_losses`` or more within
    ``burst_window_s`` of the first make one."""

    burst_losses: int
    burst_window_s: float
    losses: list[tuple[float, str]] = field(default_factory=list)

    def add(self, at_s: float, what: Iterable[str]) -> None:
        """Losses noticed at ``at_s`` (wall clock): names of lost nodes or workers."""
        known = {name for _, name in self.losses}
        self.losses.extend((at_s, name) for name in what if name not in known)

    def window_open(self, now_s: float) -> bool:
        """Is the window that the first loss opened still open?"""
        return bool(self.losses) and now_s - self.losses[0][0] < self.burst_window_s

    def correlated(self) -> bool:
        if not self.losses:
            return False
        first_s = self.losses[0][0]
        within = [n for t, n in self.losses if t - first_s <= self.burst_window_s]
        return len(within) >= self.burst_losses

    def clear(self) -> None:
        self.losses = []
