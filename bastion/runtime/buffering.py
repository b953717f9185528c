"""Adaptive buffering: which tasks keep an upstream backup of what they send, and when.

A regional restart rebuilds a region of tasks from a checkpoint, and every sender into
the region must send again, out of its *upstream backup*, what the region's tasks
must see again (`bastion.runtime.channel.ReplayableOutputChannel`). Keeping such a
backup in every task all the time costs memory and store writes in normal
operation; keeping it in none makes every region grow upstream to the sources. Su &
Zhou's *adaptive* buffering keeps it where it pays:

- in normal operation only the sources back up (they must: nothing upstream of them
  can replay);
- from a burst of failures (or a plan that leaves tasks waiting for capacity) every
  task backs up, so a second failure while the first is recovered restarts a small
  region;
- once a checkpoint completes with every lost task running again, nothing from
  before it will be replayed: every backup but the sources' is freed.

`AdaptiveBuffering` carries this out for one job: it tells the workers (in order —
an async actor may run one caller's calls out of order) and records an
``adaptive_buffering`` event with the bytes freed. It also tracks `backed_up`: the
tasks whose backups hold everything they sent since the line a regional restart
restores — the failover strategy grows a region upstream past any other sender
(`bastion.scheduler.failover.TaskGraph.backed_up`). *Whether* buffering is on is
decided here by the rule above; the failure handler (`bastion.runtime.failures`)
says when a recovery's plan is made and the coordinator when a checkpoint completes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from bastion.runtime.deployment import Deployment


class AdaptiveBuffering:
    """Whether every task keeps an upstream backup now, and which tasks' backups hold
    everything since the line."""

    def __init__(self, enabled: bool, deployment: Deployment, job_id: str,
                 record_event: Callable[..., None]):
        self.enabled = enabled              # the failover strategy buffers adaptively
        self.deployment = deployment
        self.job_id = job_id
        self.record_event = record_event
        self.on = False
        self.backed_up: set[int] = set(deployment.source_tasks)
        self._change: asyncio.Future | None = None  # the workers being told
        self._telling: set[asyncio.Future] = set()

    async def after_plan(self, restarted: set[int], burst: bool) -> None:
        """After a recovery's plan: turn buffering on at a ``burst``, or when the plan
        left tasks pending (their upstream must keep what they will need); the
        ``restarted`` tasks, rebuilt from the line with it on, back up everything
        they send from the line on."""
        if not self.enabled:
            return
        pending = self.deployment.pending
        if not self.on and (burst or pending):
            self.on = True
            why = "a burst was detected" if burst else \
                f"tasks {sorted(pending)} wait for capacity"
            await self._tell(True, why)
        if self.on:
            self.backed_up |= restarted

    def checkpoint_completed(self, checkpoint_id: int, all_running: bool) -> None:
        """A checkpoint completed: once every lost task runs again (``all_running``),
        it is the global checkpoint after which adaptive buffering turns off (Su &
        Zhou) — every backup but the sources' is freed, and a later failure's region
        grows upstream again past the tasks that no longer log."""
        if not self.on or not all_running:
            return
        self.on = False
        self.backed_up = set(self.deployment.source_tasks)
        telling = asyncio.ensure_future(self._tell(
            False, f"checkpoint {checkpoint_id} completed with every lost task running",
            checkpoint_id=checkpoint_id))
        self._telling.add(telling)  # held: the loop keeps only a weak reference
        telling.add_done_callback(self._telling.discard)

    async def tell_new(self, workers: list[Any]) -> None:
        """Workers about to build tasks take adaptive buffering as it is now."""
        if self.on:
            await asyncio.gather(*[w.set_buffering.remote(self.job_id, True)
                                   for w in workers], return_exceptions=True)

    async def _tell(self, on: bool, reason: str, **fields: Any) -> None:
        """Every worker turns adaptive buffering ``on`` or off, after any change told
        before (an async actor may run one caller's calls out of order); recorded as
        an ``adaptive_buffering`` event with the bytes freed."""
        before, done = self._change, asyncio.get_running_loop().create_future()
        self._change = done
        try:
            if before is not None:
                await before
            replies = await asyncio.gather(*[w.set_buffering.remote(self.job_id, on)
                                             for w in self.deployment.workers],
                                           return_exceptions=True)
            self.record_event("adaptive_buffering", on=on, reason=reason,
                              freed_bytes=sum(r for r in replies if isinstance(r, int)),
                              **fields)
        finally:
            done.set_result(None)
