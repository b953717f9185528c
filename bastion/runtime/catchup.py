"""Catch-up priority, carried out: the workers lowered while their tasks catch up.

When lost tasks join the running job again, their upstream sends them again
everything since the line they restored — a burst of work on the same cores as the
queries a failure did not hit. The catch-up policy (`bastion.scheduler.catchup`)
decides which workers run at the OS's lowest CPU priority meanwhile (those hosting
only recovering tasks, while some query needs protecting) and when each gets its
priority back (no replay feeds its tasks any more, or the policy's time is up); the
worker process changes its own priority (`bastion.runtime.priority`).

`CatchUpLowering` is the job master's half: it asks the policy, calls the workers,
remembers whom it lowered, when, and since when their replays run — a worker's
answer that it replays nothing any more means something only if it was asked
after the replays started — and records ``catch_up_lowered`` and
``catch_up_restored`` events. The failure handler (`bastion.runtime.failures`) lowers
workers as tasks join; every progress poll lets it restore those that caught up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from bastion.runtime.deployment import Deployment, JobStage
from bastion.runtime.polling import PROGRESS_TIMEOUT_S
from bastion.scheduler.catchup import CatchUpPriority
from bastion.scheduler.detector import within
from bastion.scheduler.recovery import QueryNeeds

# the workers being lowered for joining tasks: actor id -> (worker, its tasks, when
# it was lowered)
Lowering = dict[str, tuple[Any, set[int], float]]


class CatchUpLowering:
    """The workers one job lowered while their tasks catch up."""

    def __init__(self, policy: CatchUpPriority, deployment: Deployment, stage: JobStage,
                 queries: list[QueryNeeds], record_event: Callable[..., None]):
        self.policy = policy
        self.deployment = deployment
        self.stage = stage
        self.queries = queries
        self.record_event = record_event
        # actor id -> (worker, its tasks, when it was lowered, when its replays started)
        self._lowered: dict[str, tuple[Any, set[int], float, float]] = {}

    def __bool__(self) -> bool:
        """Whether some worker is lowered now."""
        return bool(self._lowered)

    def clear(self) -> None:
        """Every worker resets (a deploy of the whole job): its priority with it."""
        self._lowered.clear()

    async def lower(self, joining: set[int], workers: list[int],
                    restarting: set[int]) -> Lowering:
        """Before the ``joining`` tasks are built and catch up: the workers (of
        ``workers``, those they joined) that the catch-up policy lowers run at the
        OS's lowest CPU priority; ``restarting``: the tasks the failure restarted.
        The lowering, for `watched` once the replays started (or `abandon`)."""
        deployment = self.deployment
        hosted = {w: {t for t, a in enumerate(deployment.assignment)
                      if a == w and t not in deployment.pending} for w in workers}
        # the queries the failure did not hit: none of their tasks restarted
        protected = set().union(*[q.tasks for q in self.queries
                                  if not q.tasks & restarting])
        lowering = sorted(self.policy.to_lower(hosted, joining, protected))
        if not lowering:
            return {}
        epoch = deployment.epoch(self.stage.attempt)
        replies = await asyncio.gather(*[deployment.workers[w].set_catch_up.remote(epoch, True)
                                         for w in lowering], return_exceptions=True)
        now_s = time.time()
        self.record_event("catch_up_lowered", workers=lowering,
                          tasks=sorted(set().union(*[hosted[w] for w in lowering])),
                          priority=[r if isinstance(r, str) else None for r in replies])
        return {deployment.workers[w]._actor_id.hex(): (deployment.workers[w], hosted[w], now_s)
                for w in lowering}

    def watched(self, lowering: Lowering, watched_s: float) -> None:
        """The replays into the tasks of ``lowering`` started at ``watched_s``: a
        progress poll asked after it sees them."""
        self._lowered.update({k: (*entry, watched_s) for k, entry in lowering.items()})

    def abandon(self, lowering: Lowering) -> None:
        """The join of ``lowering``'s tasks failed: nothing is catching up."""
        epoch = self.deployment.epoch(self.stage.attempt)
        for worker, _, _ in lowering.values():
            worker.set_catch_up.remote(epoch, False)

    async def restore(self, replaying: set[int] | None, asked_s: float) -> None:
        """Give a lowered worker its priority back once no replay feeds its tasks any
        more (or the policy's time is up); ``replaying``: the tasks the workers said,
        when asked at ``asked_s``, they still replay a backlog to (None: unknown) —
        an answer asked before the replays started cannot tell."""
        live = {w._actor_id.hex() for w in self.deployment.workers}
        for key in [k for k in self._lowered if k not in live]:
            del self._lowered[key]  # lost meanwhile
        if not self._lowered:
            return
        now_s = time.time()
        epoch = self.deployment.epoch(self.stage.attempt)
        for key, (worker, tasks, since_s, watched_s) in list(self._lowered.items()):
            why = self.policy.to_restore(tasks, None if asked_s < watched_s
                                         else replaying, now_s - since_s)
            if why is None:
                continue
            del self._lowered[key]
            reply = await asyncio.gather(within(worker.set_catch_up.remote(epoch, False),
                                                PROGRESS_TIMEOUT_S), return_exceptions=True)
            self.record_event("catch_up_restored", tasks=sorted(tasks),
                              lowered_s=round(now_s - since_s, 3),
                              reason=why,
                              priority=reply[0] if isinstance(reply[0], str) else None)
