"""Progress polling: the job master's timeline, and the control loops fed by it.

While a job runs, every ``progress_interval_s`` the job master asks each worker for
its tasks' counters and turns the replies into one point of the job's *timeline*:
records per second read and written since the point before, and the latency of
what sinks received meanwhile. A worker that does not answer within a second is left
out of that point and counted at the next one (`ProgressTally` keeps per task what
it saw last, so nothing is counted twice or lost with a killed worker). The timeline
is what `bastion.runtime.recovery_times` reads a recovery's duration from, and what
the run's report and the Prometheus exporter show.

`ProgressPoller` owns the polls and what reads them, a step at a time:

1. the recovery's follow-ups (a callable of the failure handler: the standby a
   restart deferred until the sources caught up, the workers lowered while their
   tasks caught up);
2. the control loops (`bastion.runtime.progress`): the exporter, the termination of
   feedback loops, ``redundancy="auto"`` and the live re-tune of the checkpoint
   interval;
3. the timeline's point, and the per-query points from which each query's
   availability is computed at the end (a query with a task that does not run is
   *down* at that point).

The decisions are the scheduler's (`bastion.scheduler.resiliency`,
`bastion.scheduler.retune`); the poller only feeds them and carries out what they
return, through the deployment's calls to the workers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from bastion.runtime.config import JobConfig
from bastion.runtime.deployment import Deployment, JobStage
from bastion.runtime.events import EventLimits, EventLog
from bastion.runtime.export import MetricsExporter
from bastion.runtime.plan import PhysicalPlan
from bastion.runtime.progress import (LoopTermination, Poll, ProgressTally, RedundancyLoop,
                                      RetuneLoop)
from bastion.scheduler.detector import within
from bastion.scheduler.recovery import QueryNeeds
from bastion.scheduler.resiliency import ResiliencyManager
from bastion.scheduler.retune import Retuner
from bastion.scheduler.stall import StallWatch

_log = logging.getLogger(__name__)

PROGRESS_TIMEOUT_S = 1.0  # a worker busier than this is left out of one timeline point
FINAL_PROGRESS_TIMEOUT_S = 30.0  # ...but not out of an attempt's last one

# a recovery's follow-ups to one poll: the poll, the raw replies, when they were asked
# and the seconds since the poll before (None at the first)
FollowUps = Callable[[Poll, list, float, "float | None"], Awaitable[None]]


class ProgressPoller:
    """One job's progress polls: the timeline, per-query points, and the control loops
    that read them."""

    def __init__(self, plan: PhysicalPlan, config: JobConfig, deployment: Deployment,
                 stage: JobStage, queries: list[QueryNeeds], limits: EventLimits,
                 log: EventLog, exporter: MetricsExporter | None,
                 record_event: Callable[..., None], set_interval: Callable[[float], Any],
                 follow_ups: FollowUps, down_tasks: Callable[[], set[int]],
                 started_s: Callable[[], float | None]):
        self.config = config
        self.deployment = deployment
        self.stage = stage
        self.queries = queries
        self.limits = limits
        self.log = log
        self.exporter = exporter            # None: export_metrics is off
        self.record_event = record_event
        self.follow_ups = follow_ups
        self.down_tasks = down_tasks        # tasks that do not run now
        self.started_s = started_s          # when the job started (None: not yet)
        self._polled_at_s: float | None = None  # when the last progress poll ended
        self.query_points: list[dict[str, Any]] = []  # per poll: per query output, latency
        # feedback loops end when nothing can circulate any more
        plan_channel_dst = {c.channel_id: t.task_id for t in plan.tasks for c in t.inputs}
        self.loop_termination = (LoopTermination(plan_channel_dst, deployment.source_tasks)
                                 if plan.topology.has_feedback() else None)
        # `redundancy="auto"`: the resiliency manager decides the redundancy ratio each
        # period from the latency sinks saw in it (`bastion.scheduler.resiliency`)
        self.redundancy = (None if config.resiliency is None
                           else ResiliencyManager(config.resiliency))
        self.redundancy_loop = (None if self.redundancy is None else RedundancyLoop(
            self.redundancy, deployment.send_redundancy, record_event))
        # The counters of the progress polls. The tasks whose input holds copies: one
        # stalled on a frame is a fault the manager may answer at once
        # (`ResiliencyManager.on_stall`).
        sink_queries = {t.task_id: [q.name for q in queries
                                    if set(q.outputs) & set(plan.chains[t.chain_id].ops)]
                        for t in plan.tasks}
        self.tally = ProgressTally(
            sink_queries, [q.name for q in queries],
            {t.task_id for t in plan.tasks
             if set(plan.chains[t.chain_id].ops) & set(config.redundancy)})
        # `checkpoint_interval="auto"` with `retune_every_s`: every period the re-tuner
        # (`bastion.scheduler.retune`) gets the input rate the sources saw in it; the
        # job master moves the coordinator's interval when it says so. The rate counts
        # only failure-free seconds: from a failure until the sources caught up after
        # the restart, a catch-up reads at the job's maximum, not its input's rate.
        self.retune_loop: RetuneLoop | None = None
        if config.retune is not None:
            # the launcher sets a re-tune policy with the interval its tuning chose
            assert config.checkpoint_interval_s is not None
            self.retune_loop = RetuneLoop(
                Retuner(config.retune, config.checkpoint_interval_s),
                config.progress_interval_s, set_interval, record_event)

        # A task held on one frame is named (`bastion.scheduler.stall`), asked on the
        # workers' heartbeat thread — which answers while a user function holds the
        # task loop — every quarter of the warning time, at most once a second.
        self.stall_watch = (None if config.stall_warning_s is None
                            else StallWatch(config.stall_warning_s))
        self._stall_period_s = (None if config.stall_warning_s is None
                                else min(1.0, config.stall_warning_s / 4))
        self._task_names = {t.task_id: (f"{plan.chains[t.chain_id].name}[{t.index}]",
                                        plan.chains[t.chain_id].ops) for t in plan.tasks}

    def on_event(self, kind: str) -> None:
        """An event of the job: the re-tune counts failure-free seconds by them."""
        if self.retune_loop is not None:
            self.retune_loop.on_event(kind)

    async def poll_forever(self) -> None:
        """A point every ``progress_interval_s``, until cancelled."""
        while True:
            await asyncio.sleep(self.config.progress_interval_s)
            await self.poll_once()

    async def watch_stalls_forever(self) -> None:
        """Ask for stalls every period, until cancelled (nothing when not watched).
        Apart from the progress polls: those run on the workers' task loops, which a
        stalled function holds, and the job master starts them only once the tasks'
        start call returned — which a function stalled in the first batches delays."""
        if self._stall_period_s is None:
            return
        while True:
            await asyncio.sleep(self._stall_period_s)
            await self._watch_stalls(PROGRESS_TIMEOUT_S)

    async def close_stalls(self) -> None:
        """At an attempt's end: ask once more if a stall is still open, so that one
        that ended with the attempt's last records gets its ``task_resumed``."""
        if self.stall_watch is not None and self.stall_watch.stalled:
            await self._watch_stalls(PROGRESS_TIMEOUT_S)

    async def _watch_stalls(self, timeout_s: float) -> None:
        """Ask every worker how long its tasks have been on their frames; an event
        (and a warning) for each task newly held past the warning time, and one when
        it moves on."""
        assert self.stall_watch is not None
        replies = await asyncio.gather(*[within(w.frame_ages.remote(), timeout_s)
                                         for w in self.deployment.workers],
                                       return_exceptions=True)
        ages_s: dict[int, float | None] = {}
        for reply in replies:
            if not isinstance(reply, BaseException):
                ages_s.update(reply)
        began, ended = self.stall_watch.observe(ages_s)
        for stall in began:
            name, ops = self._task_names.get(stall.task_id, (f"task {stall.task_id}", []))
            self.record_event("task_stalled", task=name, operators=ops,
                              held_s=round(stall.held_s, 1))
            _log.warning("task %s has been on one frame for %.0f s: a function of "
                         "operator %s has not returned (a call without a timeout, a lock "
                         "never released, an endless loop?); the job waits for it",
                         name, stall.held_s, " or ".join(repr(op) for op in ops))
        for stall in ended:
            name, _ = self._task_names.get(stall.task_id, (f"task {stall.task_id}", []))
            self.record_event("task_resumed", task=name, held_s=round(stall.held_s, 1))

    async def poll_once(self, timeout_s: float = PROGRESS_TIMEOUT_S) -> None:
        """Add one point to the timeline — records per second since the last point and
        the latency of what sinks received meanwhile (`ProgressTally`: a killed
        worker's history is kept) — and feed the control loops that read it
        (`bastion.runtime.progress`). A worker that does not answer within
        ``timeout_s`` is counted at the next point."""
        asked_s = time.time()
        replies = await asyncio.gather(*[within(w.progress.remote(), timeout_s)
                                         for w in self.deployment.workers],
                                       return_exceptions=True)
        poll = self.tally.add(replies)
        polled_s, self._polled_at_s = self._polled_at_s, time.time()
        elapsed_s = None if polled_s is None else self._polled_at_s - polled_s
        # phase 1: the recovery's own follow-ups — the standby a restart deferred, and
        # workers lowered while their tasks caught up
        await self.follow_ups(poll, replies, asked_s, elapsed_s)
        # phase 2: the control loops
        if self.exporter is not None:
            self.exporter.observe_poll(poll, replies, time.time())
        if self.loop_termination is not None:
            heads = self.loop_termination.heads_to_finish(replies)
            if heads:
                self.record_event("loops_quiescent", tasks=heads)
                self.deployment.finish_loops(heads)
        started_s = self.started_s()
        if started_s is None:
            return
        run_s = time.time() - started_s
        if self.redundancy_loop is not None:
            self.redundancy_loop.observe(poll, time.time(), run_s)
        if self.retune_loop is not None and elapsed_s is not None:
            self.retune_loop.observe(
                poll, elapsed_s,
                bool(self.deployment.source_tasks & self.stage.finished_tasks), run_s)
        # phase 3: the timeline and the per-query points
        down = self.down_tasks()
        self.query_points.append({"t_s": run_s, "queries": {
            name: (records, None if (p50_s := h.percentile(50)) is None else p50_s * 1000)
            for name, (records, h) in poll.by_query.items()},
            # queries with a task waiting for capacity, or still being built and
            # restored to join: their output, if any, comes from the partitions
            # that kept running, and is incomplete
            "down": sorted(q.name for q in self.queries if q.tasks & down)})
        if len(self.query_points) > 2 * self.limits.first_points:
            # a long run: every other point, so memory stays flat and the
            # points still span the run (the first ones give the baseline)
            self.query_points = self.query_points[::2]
        latency = poll.latency
        p50, p99 = latency.percentile(50), latency.percentile(99)
        # the mean too: tuning's L_avg between kills (`timeline_latency_ms`), which
        # the last attempt's histograms no longer hold
        mean = latency.mean_std()
        self.log.progress({"t_s": time.time() - started_s,
                           "source_records": poll.source_records,
                           "sink_records": poll.sink_records,
                           "source_lag": poll.source_lag, "workers_answering": poll.answering,
                           "latency_p50_ms": None if p50 is None else p50 * 1000,
                           "latency_p99_ms": None if p99 is None else p99 * 1000,
                           "latency_mean_ms": None if mean is None else mean[0] * 1000})
