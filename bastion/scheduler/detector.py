"""Failure detection: how the job master learns that a worker is lost, and why.

Three signals, whichever comes first:

- **heartbeats** — every quarter of ``heartbeat_timeout_s`` the job master pings every
  worker; a worker that does not answer within the timeout is dead (its process may
  still exist, hung or cut off: it is replaced all the same). The ping runs on a
  thread of its own in the worker, so a busy task loop does not look like a death;
- **dead actors** — a call to a worker whose process ended raises `RayActorError`;
- **task outcomes** — a worker reports how its tasks ended: a user-function error
  (`UDFError`, with ``fail_fast``), a peer it could not reach (a `RayError`: the peer
  died), or any other exception (a bug or bad data).

Each becomes a `Failure` with a reason for the job's events. A lost process is
recovered; a failure a restart would only repeat (a task that raised) is *fatal* and
ends the job.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, NoReturn

import ray

from bastion.errors import UDFError


class Failure(Exception):
    """Why the job's tasks stopped. ``worker`` is the slot it was noticed on;
    ``fatal`` failures end the job instead of starting a recovery."""

    def __init__(self, reason: str, worker: int | None = None, udf: UDFError | None = None,
                 fatal: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.worker = worker
        self.udf = udf
        self.fatal = fatal or udf is not None


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
    if isinstance(failure, ray.exceptions.RayError):
        # a task lost a peer worker: recover like from the death itself
        return Failure(f"worker {worker}: a peer died ({failure})", worker)
    if failure is not None:
        return Failure(f"worker {worker}: {failure}", worker, fatal=True)
    return None
