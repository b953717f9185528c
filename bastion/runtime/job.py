"""The job master: deploys a physical plan onto worker actors, watches it, recovers it.

The job master runs in a Ray actor, so a job keeps its coordinator when the driver is a
remote client. That actor, the `JobHost`, outlives its jobs like the workers do
(`bastion.scheduler.pool` lends both): each `JobHost.run` builds a `JobMaster` — a
plain object holding one job's state — runs it and drops it, so jobs share the
process and nothing else. Workers reach their job's master through a `MasterLink`
(the host and the job's id). `JobMaster.run` is a loop over named phases; the
decisions in them — where workers go, when one is lost, what a recovery restarts —
are the scheduler's (`bastion.scheduler`), the checkpoints the protocol's
coordinator's. The job master owns the job's *lifecycle* and composes one owner per
role, each with its own state and a narrow view of the rest (docs/architecture.md,
"The job master: one owner per role"): `Deployment` (`bastion.runtime.deployment`:
the workers, the task → worker assignment, spawn, deploy and start), `FailureHandler`
(`bastion.runtime.failures`: watch and recover) and `ProgressPoller`
(`bastion.runtime.polling`: the timeline and the control loops it feeds). The phases:

1. **spawn** — borrow one worker per slot from the pool, on the node placement names
   (`bastion.scheduler.placement`), and, when the protocol asks for one, a standby;
   bind each to the job and wait until each answers;
2. **deploy** — give every worker the plan, its peers and the attempt number; each
   builds its tasks and channels and, after a failure, restores their state from the
   recovery line;
3. **start** — tasks start their loops, sources read, the protocol's coordinator
   starts checkpointing; after a restart, the new standby is borrowed only once the
   sources have caught up with their input (`caught_up`), so that its process start
   does not take the cores the catch-up needs;
4. **watch** — until every task finished: heartbeats, actor deaths and task errors
   (`bastion.scheduler.detector`), scheduled faults, ``duration_s`` for unbounded
   inputs, and a progress timeline;
5. **recover** (on a failure) — stop the coordinator, carry out the recovery planner's
   plan (`bastion.scheduler.recovery`: replace dead workers), ask the protocol for the
   recovery line, and go back to *deploy* with the next attempt (a worker lost during
   *deploy* or *start* is one more failure) — or, when the failover strategy
   restarts fewer tasks than the job has (`bastion.scheduler.failover`,
   `FailureHandler._restart_region`), restart only those, within the running
   attempt, and go back to *watch*: the other tasks never stop, and neither does the
   progress timeline;
   a worker that hosts only tasks joining again runs at the OS's lowest CPU
   priority while they catch up on what they missed (`bastion.scheduler.catchup`),
   so that the tasks that never stopped keep the cores they need;
6. **finish** — commit the end-of-stream outputs, gather counters, latency histograms
   and dead letters; whatever happened, then, every worker that resets in time goes
   back to the pool clean, and every other one is killed and never lent again.

Three faults of the job's own machinery are handled here too:

- **a checkpoint that cannot be read back** — a worker restoring the recovery line
  finds a blob damaged or missing (`detector.UnreadableBlob`). The failure handler
  records ``checkpoint_unusable`` (the checkpoint, the blob's key, the reason), tells
  the coordinator to exclude that checkpoint (`Coordinator.exclude`) and the job
  deploys again from the line it names next. Committed outputs are never taken back, so a line
  that would replay outputs already committed — outputs of a later checkpoint that
  some sink made visible (`Coordinator.rolled_back_commits`) — is refused: the job
  fails with `NoUsableCheckpointError`. Restarting from the beginning is used, and
  recorded, only when no committed output would come out twice;
- **a sink that cannot apply a commit** — each worker whose ``apply_commit`` raised
  is asked again, ``commit_attempts`` times with doubling backoff (``commit_retried``
  events); then the job fails with `SinkCommitError`, naming the sinks and the commit
  point. A worker that died meanwhile is left to the failure detector: its
  replacement re-applies every committed output when it restores;
- **events that cannot be stored** — the event log (`bastion.runtime.events`) retries
  and then reports the loss in the run's result; it also keeps the job master's memory
  flat in a long run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from bastion import faults as fault_injection
from bastion.errors import JobFailedError, SinkCommitError
from bastion.protocols import get_protocol
from bastion.protocols.base import MasterContext, cancel
from bastion.runtime import export
from bastion.runtime.config import JobConfig, with_frame_key
from bastion.runtime.deployment import Deployment, JobStage
from bastion.runtime.events import EventLimits, EventLog
from bastion.runtime.failures import FailureHandler, JobEnded, line_summary
from bastion.runtime.lease import WorkerLease
from bastion.runtime.metrics import FailureRecovery, query_availability
from bastion.runtime.outputs import FINAL_COMMIT, marker_key
from bastion.runtime.plan import PhysicalPlan
from bastion.runtime.polling import (FINAL_PROGRESS_TIMEOUT_S, PROGRESS_TIMEOUT_S,
                                     ProgressPoller)
from bastion.runtime.recovery_times import failures_in, recovery_times
from bastion.runtime.savepoint import StopWatch
from bastion.scheduler import injector
from bastion.scheduler.detector import Failure, within
from bastion.scheduler.recovery import QueryNeeds, queries_needs
from bastion.storage import CheckpointStore, open_store

# How long a checkpoint's trigger waits for the workers to say which of their sources
# had finished (`JobMaster.trigger_sources`): a worker whose loop a user function
# holds answers late, and is the stall watch's and the detector's.
TRIGGER_REPLY_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class MasterLimits:
    """How often a job master retries applying a commit, and how much of its events
    and timeline it keeps in memory (`EventLimits`)."""

    commit_attempts: int = 5
    commit_backoff_s: float = 0.1   # doubles after each failed attempt
    events: EventLimits = field(default_factory=EventLimits)


class _CoordinatorContext(MasterContext):
    """The job master as its protocol's coordinator sees it."""

    def __init__(self, master: "JobMaster"):
        self._master = master
        plan = master.plan
        self.checkpoint_interval_s = master.config.checkpoint_interval_s
        self.retained_checkpoints = master.config.retained_checkpoints
        self.job_id = master.config.job_id
        self.resume_from = master.config.resume_from
        self._operators = {name: (node.kind, node.parallelism)
                           for name, node in plan.topology.nodes.items()}
        self._tasks = [t.task_id for t in plan.tasks]
        self._channels = {c.channel_id: (c.src_task, t.task_id)
                          for t in plan.tasks for c in t.inputs}
        self._sinks = {t.task_id for t in plan.tasks
                       if any(plan.topology.nodes[op].kind == "sink"
                              for op in plan.chains[t.chain_id].ops)}

    @property
    def attempt(self) -> int:
        return self._master.stage.attempt

    def checkpoint_store(self) -> CheckpointStore:
        return self._master.checkpoints

    def object_store(self) -> Any:
        return self._master.store

    def operators(self) -> dict[str, tuple[str, int]]:
        return dict(self._operators)

    def task_ids(self) -> list[int]:
        return list(self._tasks)

    def channels(self) -> dict[int, tuple[int, int]]:
        return dict(self._channels)

    def instances(self) -> dict[int, list[tuple[str, int]]]:
        plan = self._master.plan
        return {t.task_id: [(op, t.index) for op in plan.chains[t.chain_id].ops]
                for t in plan.tasks}

    def source_tasks(self) -> set[int]:
        return set(self._master.deployment.source_tasks)

    def sink_tasks(self) -> set[int]:
        return set(self._sinks)

    def unfinished_tasks(self) -> set[int]:
        return set(self._tasks) - self._master.stage.finished_tasks

    def pending_tasks(self) -> set[int]:
        return set(self._master.deployment.pending)

    def all_sources_running(self) -> bool:
        master = self._master
        return not (master.deployment.source_tasks & master.stage.finished_tasks)

    def record_event(self, kind: str, **fields: Any) -> None:
        self._master.record_event(kind, **fields)

    async def trigger_sources(self, attempt: int, checkpoint_id: int) -> set[int]:
        return await self._master.trigger_sources(attempt, checkpoint_id)

    async def commit_outputs(self, commit: int) -> None:
        await self._master.commit_outputs(commit)

    def trim_upstream_backups(self, below: dict[int, int]) -> None:
        self._master.trim_upstream_backups(below)

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        self._master.checkpoint_completed(checkpoint_id)


@dataclass(frozen=True)
class MasterLink:
    """How a job's workers reach its master: the host it runs in, and the job's id."""

    host: Any
    job_id: str

    def acknowledge(self, attempt: int, task_id: int, checkpoint_id: int, ref: Any,
                    meta: Any = None, incarnation: int = 0,
                    sink_records: int | None = None) -> None:
        """``sink_records``: what the task's sinks had received when it took the
        checkpoint (`JobMaster.note_sink_records`)."""
        self.host.acknowledge.remote(self.job_id, attempt, task_id, checkpoint_id, ref, meta,
                                     incarnation, sink_records)

    async def commit(self, attempt: int, commit: int, task_id: int, incarnation: int,
                     sink_records: int | None) -> bool:
        """Have the job master commit ``commit`` of ``task_id`` now, its sinks having
        received ``sink_records``; False if ``attempt`` is over."""
        return await self.host.commit_now.remote(self.job_id, attempt, commit, task_id,
                                                 incarnation, sink_records)


# Ray's stubs list no concurrency_groups among @ray.remote's options
@ray.remote(num_cpus=0, concurrency_groups={"liveness": 1})  # type: ignore[call-overload]
class JobHost:
    """The process job masters run in, lent by the pool to one job after another (and
    to several at once: each job is a `JobMaster` of its own, found by its id)."""

    def __init__(self) -> None:
        self.masters: dict[str, JobMaster] = {}

    @ray.method(concurrency_group="liveness")
    def ping(self) -> None:
        """Liveness, for the pool. On a thread of its own: a host busy with the calls
        of its job masters (a burst of acknowledgments) is alive, and declaring it
        dead would end every job it hosts."""

    async def run(self, plan: PhysicalPlan, config: JobConfig, limits: MasterLimits | None,
                  pool: Any) -> dict[str, Any]:
        """Run job ``config.job_id`` to its end with workers of ``pool``; its report."""
        me = ray.get_runtime_context().current_actor
        master = JobMaster(plan, config, limits, MasterLink(me, config.job_id), pool)
        self.masters[config.job_id] = master
        try:
            return await master.run()
        finally:
            del self.masters[config.job_id]

    def note_event(self, job_id: str, kind: str, **fields: Any) -> None:
        """Record an event the driver saw (a node it added) in the job's log."""
        master = self.masters.get(job_id)
        if master is not None:
            master.record_event(kind, **fields)

    def progress(self, job_id: str) -> dict[str, Any] | None:
        """The job's progress; None before it started here or after it ended."""
        master = self.masters.get(job_id)
        return None if master is None else master.progress()

    async def commit_now(self, job_id: str, attempt: int, commit: int, task_id: int,
                         incarnation: int, sink_records: int | None) -> bool:
        """A task asks that its staged commit point be committed now (protocol acks)."""
        master = self.masters.get(job_id)
        return master is not None and await master.commit_now(
            attempt, commit, task_id, incarnation, sink_records)

    def acknowledge(self, job_id: str, attempt: int, task_id: int, checkpoint_id: int,
                    ref: Any, meta: Any = None, incarnation: int = 0,
                    sink_records: int | None = None) -> None:
        master = self.masters.get(job_id)
        if master is not None:  # an acknowledgment that arrives after its job ended
            master.acknowledge(attempt, task_id, checkpoint_id, ref, meta, incarnation,
                               sink_records)


class JobMaster:
    """One job's control plane, run by a `JobHost`: the owner of the job's lifecycle.

    It composes one owner per role and moves the job through its phases:

    - `Deployment` (`bastion.runtime.deployment`) — the workers by slot, the task →
      worker assignment, the rounds of calls that spawn, deploy and start them;
    - `FailureHandler` (`bastion.runtime.failures`) — the watch, and every recovery:
      whole, regional, under a capacity model, from a damaged checkpoint;
    - `ProgressPoller` (`bastion.runtime.polling`) — the timeline and the control
      loops it feeds;
    - the protocol's coordinator (`bastion.protocols`) — checkpoints and commits,
      through `_CoordinatorContext`.

    What stays here is the lifecycle: the phases and the stage they share
    (`JobStage`), the event log, the commits of sink outputs, the scheduled faults,
    the end of the job and its report."""

    def __init__(self, plan: PhysicalPlan, config: JobConfig,
                 limits: MasterLimits | None, link: MasterLink, pool: Any):
        self.plan = plan
        # a fresh data-plane key per job (docs/security.md): the workers get it with
        # the config they are bound with, through Ray only
        self.config = with_frame_key(config)
        self.limits = limits or MasterLimits()
        self.store = open_store(config.storage_url)
        self.checkpoints = CheckpointStore(self.store, config.job_id)
        self.protocol = get_protocol(config.protocol)
        self.stage = JobStage()
        # the workers borrowed from the pool, and the standby (`bastion.runtime.lease`)
        self.lease = WorkerLease(pool, self.config, link, plan.workers,
                                 self.protocol.needs_standby)
        self.deployment = Deployment(plan, self.config, self.lease, self.stage)
        self._committing = asyncio.Lock()
        self.started_s: float | None = None
        self.entered_s = time.time()  # when the host began to run this job
        self.log = EventLog(self.store, config.job_id, self.limits.events)
        # a stop with a savepoint asked of the job (`bastion.runtime.savepoint`)
        self.stop_watch = StopWatch(self.store, config.job_id, self.record_event)
        self.exporter = export.for_job(plan, config)  # None: export_metrics is off
        # Set when the job must end whatever the phase (a sink kept failing a commit):
        # the error, and a future the watch phase wakes up on.
        self.job_error: JobFailedError | None = None
        self._job_error_set: asyncio.Future | None = None
        self.kills = fault_injection.validate(config.faults, plan)
        self._injector: asyncio.Task | None = None
        self.queries = _queries_of(plan)
        self.coordinator = self.protocol.coordinator(_CoordinatorContext(self))
        # The poller and the failure handler each call the other: through these
        # lambdas, which read the attribute when they run.
        self.poller = ProgressPoller(
            plan, self.config, self.deployment, self.stage, self.queries,
            self.limits.events, self.log, self.exporter, self.record_event,
            self.coordinator.set_interval,
            follow_ups=lambda *poll: self.failures.after_poll(*poll),
            down_tasks=lambda: self.failures.down_tasks(),
            started_s=lambda: self.started_s)
        self.failures = FailureHandler(
            plan, self.config, self.protocol, self.coordinator, self.deployment,
            self.stage, self.queries, self.store, self.checkpoints, self.record_event,
            job_error=lambda: self.job_error, poll_progress=self.poller.poll_forever)

    # -- what the coordinator's context and the workers call --------------------------------

    def record_event(self, kind: str, **fields: Any) -> None:
        event = self.log.record(kind, self.started_s, **fields)
        if self.exporter is not None:
            self.exporter.observe_event(event)
        self.poller.on_event(kind)

    async def trigger_sources(self, attempt: int, checkpoint_id: int) -> set[int]:
        replies = await asyncio.gather(
            *[within(reply, TRIGGER_REPLY_TIMEOUT_S)
              for reply in self.deployment.trigger_sources(attempt, checkpoint_id)],
            return_exceptions=True)
        # a worker that died or did not answer is the failure detector's
        return {task_id for reply in replies if not isinstance(reply, BaseException)
                for task_id in reply}

    async def commit_outputs(self, commit: int) -> None:
        """Make the sink outputs staged for ``commit`` visible (the second phase).
        Commits are applied one at a time, in the order they are made. A worker whose
        sinks fail to apply it is asked again, with backoff; `SinkCommitError` when
        they still fail (the job then ends).

        Once its marker is stored a commit is final, whichever attempt staged it: the
        workers running now apply it (a worker deployed later applies it when it
        restores). Sent under an attempt that had ended, the workers would ignore
        it, and a commit the coordinator completes after the job's end (a slow
        store) would never reach a sink with an outside effect."""
        deployment = self.deployment
        async with self._committing:
            await self.store.aput(marker_key(self.config.job_id, commit), b"")
            slots = list(range(len(deployment.workers)))
            delay_s = self.limits.commit_backoff_s
            for tries in range(1, self.limits.commit_attempts + 1):
                results = await asyncio.gather(
                    *[deployment.workers[i].apply_commit.remote(
                        deployment.epoch(self.stage.attempt), commit) for i in slots],
                    return_exceptions=True)
                # A dead worker is the detector's: its replacement re-applies commits.
                failed = {i: r for i, r in zip(slots, results)
                          if isinstance(r, Exception)
                          and not isinstance(r, ray.exceptions.RayActorError)}
                if not failed:
                    return
                slots = sorted(failed)
                if tries < self.limits.commit_attempts:
                    self.record_event("commit_retried", commit=commit, workers=slots,
                                      sinks=deployment.sinks_of(slots), error=_cause(
                                          failed[slots[0]]))
                    await asyncio.sleep(delay_s)
                    delay_s *= 2
            error = SinkCommitError(
                f"job {self.config.job_id} failed: sink "
                f"{', '.join(deployment.sinks_of(slots))} "
                f"could not apply {_commit_name(commit)} after "
                f"{self.limits.commit_attempts} attempts: {_cause(failed[slots[0]])}")
            self.record_event("commit_failed", commit=commit, workers=slots,
                              sinks=deployment.sinks_of(slots), error=str(error))
            self._end_job(error)
            raise error

    def trim_upstream_backups(self, below: dict[int, int]) -> None:
        """Have every worker's upstream backups forget the frames below ``below``,
        when the failover keeps backups; a worker that misses it holds more."""
        if self.failures.failover.backs_up_channels:
            self.deployment.trim_upstream_backups(below)

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        self.failures.checkpoint_completed(checkpoint_id)

    async def commit_now(self, attempt: int, commit: int, task_id: int, incarnation: int,
                         sink_records: int | None) -> bool:
        """Commit ``commit`` for a task of ``attempt`` (`TaskContext.commit_sink_outputs`);
        False when that attempt is no longer the one running, or the job has ended."""
        if attempt != self.stage.attempt or self.job_error is not None \
                or self.stage.phase == "done":
            return False
        self.note_sink_records(attempt, task_id, incarnation, sink_records)
        await self.commit_outputs(commit)
        return True

    def note_sink_records(self, attempt: int, task_id: int, incarnation: int,
                          sink_records: int | None) -> None:
        """What a sink task had received when it staged outputs for a commit. A sink's
        counters reach the timeline at each progress poll, and a worker killed
        between two polls takes with it what its sinks received since the last one —
        outputs it may have committed meanwhile: the timeline would show the sinks
        receiving fewer records than they committed. Every commit point carries the
        count, so nothing committed is missing from "received"."""
        if (sink_records is not None and attempt == self.stage.attempt
                and incarnation == self.deployment.incarnations[task_id]):
            self.poller.tally.at_least(task_id, (attempt, incarnation), sink_records)

    def _end_job(self, error: JobFailedError) -> None:
        """End the job with ``error``, whatever phase it is in."""
        if self.job_error is None:
            self.job_error = error
        if self._job_error_set is not None and not self._job_error_set.done():
            self._job_error_set.set_result(None)

    def acknowledge(self, attempt: int, task_id: int, checkpoint_id: int, ref: Any,
                    meta: Any = None, incarnation: int = 0,
                    sink_records: int | None = None) -> None:
        if incarnation != self.deployment.incarnations[task_id]:
            return  # from a task a regional restart has rebuilt since: it takes it again
        self.note_sink_records(attempt, task_id, incarnation, sink_records)
        self.coordinator.on_acknowledge(attempt, task_id, checkpoint_id, ref, meta)

    # -- the control loop -----------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        """Run the job to its end; the report `bastion.launcher` turns into a result."""
        self._job_error_set = asyncio.get_running_loop().create_future()
        try:
            report = await self._phases()
        finally:
            # A job that ended early (or was cancelled) may still have checkpoints and
            # kills scheduled: none may reach a worker once another job borrowed it.
            await self.coordinator.stop()
            await cancel(self._injector)
            released_at_s = await self.lease.release()
            # frames held for a pending task, or an upstream backup, spilled
            if self.failures.capacity_model or self.failures.failover.backs_up_channels:
                await asyncio.gather(*[self.store.adelete(key) for key in await
                                       self.store.alist(f"jobs/{self.config.job_id}/held/")],
                                     return_exceptions=True)
            await self.log.close()
        report["events_not_stored"] = self.log.summary()
        report["worker_ids"] = [w._actor_id.hex() for w in self.deployment.workers]
        if "finished_s" in report:  # a job that ran to its end
            assert self.started_s is not None  # ... started first
            report["deploy_s"] = self.started_s - self.entered_s
            report["teardown_s"] = released_at_s - report["finished_s"]
        return report

    async def _phases(self) -> dict[str, Any]:
        try:
            spawn_s = await self.deployment.spawn()
            restore: Any = await self.coordinator.initial_line()
            redeploy = True  # False after a regional restart: the job runs on
            failure: Failure | None = None
            while True:
                try:
                    # A worker may die during a recovery too (while tasks join the
                    # running attempt): that is one more failure to recover from.
                    if failure is not None:
                        restore, redeploy = await self.failures.recover(failure)
                        failure = None
                    if redeploy:
                        await self._deploy(restore)
                        await self._start(restore)
                    await self._watch()
                    break
                except Failure as exc:
                    failure = exc
                    await self.stop_watch.on_failure()
            return await self._finish(spawn_s)
        except JobEnded as ended:
            return self._ended(ended.report)
        except JobFailedError:
            return self._ended({"failure": self.job_error})

    def _ended(self, report: dict[str, Any]) -> dict[str, Any]:
        """The report of a job that failed: an error that ended it wins over the
        failure it caused on its way (a sink that failed, then the watch that noticed)."""
        if self.job_error is not None:
            report = {**report, "failure": self.job_error}
        return report

    async def _deploy(self, restore: Any) -> None:
        """Every worker builds this attempt's tasks, restored from ``restore``."""
        self.stage.phase = "deploy"
        peers = await self.deployment.peers()
        await self.failures.before_deploy(restore)
        await self.deployment.deploy(restore, peers)

    async def _start(self, restore: Any) -> None:
        """Tasks start their loops; the first start also starts the clock and the
        scheduled faults."""
        self.stage.phase = "start"
        self.stage.finished_tasks = set()
        if self.started_s is None:
            self.started_s = time.time()
            self.record_event("started")
            self._injector = asyncio.ensure_future(self._inject_faults())
        # the sources' first batches run before the workers answer: a function that
        # stalls there is named meanwhile
        stalls = asyncio.ensure_future(self.poller.watch_stalls_forever())
        try:
            running_s = await self.deployment.start()
        finally:
            stalls.cancel()
        # The tasks run already: a new standby (a process start, when the pool has
        # none idle) is borrowed and bound meanwhile, not waited for. After a
        # restart, only once the sources have caught up (`FailureHandler.after_poll`):
        # the process start costs about a core-second, which the catch-up needs more —
        # on a 2-core machine a catch-up it overlapped took 0.5-3 s longer, at
        # random, much of what made one recovery's total time unlike the next
        # one's (`bastion.scheduler.tuning`).
        if self.stage.attempt:
            self.failures.standby_after_catch_up = True
        else:
            self.lease.borrow_standby()
        if self.stage.attempt:
            self.record_event("restarted", at=running_s, attempt=self.stage.attempt,
                              checkpoint=line_summary(restore),
                              tasks=self.deployment.task_names(range(len(self.plan.tasks))))
            redundancy = self.poller.redundancy
            if redundancy is not None:  # new tasks start from the configured ratio
                self.deployment.send_redundancy(redundancy.ratio)
        self.coordinator.start(self.stage.attempt)

    async def _watch(self) -> None:
        """Return when every task finished; raise `Failure` on the first failure
        (`FailureHandler.watch`). Meanwhile the timeline gets a point every
        ``progress_interval_s``, and an unbounded input stops after ``duration_s``."""
        self.stage.phase = "watch"
        background = [asyncio.ensure_future(self.poller.poll_forever()),
                      asyncio.ensure_future(self.poller.watch_stalls_forever())]
        if self.config.duration_s is not None:
            background.append(asyncio.ensure_future(self._stop_after(self.config.duration_s)))
        background.append(asyncio.ensure_future(self.stop_watch.watch(
            lambda: self.deployment.stop_sources(savepoint_stop=True))))
        assert self._job_error_set is not None  # made by `run` before any attempt
        finished = False
        try:
            await self.failures.watch(self._job_error_set)
            finished = True
        finally:
            for fut in background:
                fut.cancel()
            # The attempt's last point. After every task finished it waits for every
            # worker: the timeline's points are summed (what the sinks received), and
            # a worker left out of the last one is left out for good — on a loaded
            # machine one busy finishing took over the usual timeout, and the sinks
            # had "received" 2,488 of the 2,500 records they committed. After a
            # failure the usual timeout: a hung worker must not hold up the recovery.
            await self.poller.poll_once(FINAL_PROGRESS_TIMEOUT_S if finished
                                        else PROGRESS_TIMEOUT_S)
            await self.poller.close_stalls()

    async def _inject_faults(self) -> None:
        assert self.started_s is not None  # injected from the start of the run on
        await injector.inject(self.kills, self.started_s, self.deployment.victims,
                              self.coordinator.checkpoint_in_progress, self.record_event,
                              self.failures.under_repair, self.failures.node_lost)

    async def _stop_after(self, duration_s: float) -> None:
        await asyncio.sleep(duration_s)
        await self.deployment.stop_sources()

    async def _finish(self, spawn_s: float) -> dict[str, Any]:
        """Every task finished: commit what is final and collect the report."""
        await self.coordinator.stop()
        await cancel(self._injector)
        finished_s = time.time()
        self.stage.phase = "collect"
        reports = await asyncio.gather(*[w.report.remote() for w in self.deployment.workers])
        tasks = [task for worker in reports for task in worker]
        if self.failures.failover.backs_up_channels:
            self._record_backups(tasks)
        self.stage.phase = "commit"
        await self.coordinator.on_job_finished(tasks)
        await self.commit_outputs(FINAL_COMMIT)
        # after the commits: a savepoint's manifest says every output before it is
        # committed
        saved = await self.stop_watch.on_finished(self.plan.topology, tasks)
        self.stage.phase = "done"
        failures = self._failures()
        redundancy = self.poller.redundancy
        return {
            "failure": None,
            "savepoint": None if saved is None else saved.job_id,
            "spawn_s": spawn_s,
            "started_s": self.started_s,
            "finished_s": finished_s,
            "tasks": tasks,
            **self._events_report(),
            "protocol": self.coordinator.stats(
                {t["task_id"]: (t["final_sent"], t["final_received"]) for t in tasks}),
            "attempts": self.stage.attempt + 1,
            "failures": failures,
            "queries": query_availability(
                self.poller.query_points, {q.name: q.priority for q in self.queries},
                *_first_failure(self.log.events)),
            "redundancy_decisions": ([] if redundancy is None else
                                     [dataclasses.asdict(d) for d in redundancy.decisions]),
        }

    def _record_backups(self, tasks: list[dict[str, Any]]) -> None:
        """What the upstream backups kept over the run, sources apart from the other
        tasks (adaptive buffering: the others keep one only while a burst is
        recovered), as an ``upstream_backups`` event. A task's counters cover its
        last incarnation."""
        figures: dict[str, int] = {}
        for kind, of_sources in (("source", True), ("other", False)):
            chosen = [t for t in tasks if t.get("is_source") == of_sources]
            for counter in ("backup_frames_logged", "backup_bytes_logged",
                            "backup_bytes_kept"):
                figures[f"{kind}_{counter[len('backup_'):]}"] = sum(t[counter]
                                                                  for t in chosen)
        self.record_event("upstream_backups", adaptive=self.failures.failover.adaptive_buffering,
                          **figures)

    def _events_report(self) -> dict[str, Any]:
        return {"events": self.log.events, "timeline": self.log.timeline.points(),
                "event_counts": dict(self.log.counts)}

    def _failures(self) -> list[FailureRecovery]:
        """Detection, restart, recovery and total recovery time of every failure
        (`bastion.runtime.recovery_times`, the one definition every command uses), from
        the events and the progress timeline; each is also recorded as a ``recovery``
        event."""
        failures = []
        timeline = self.log.timeline.points()
        for fault, detected, restarted in failures_in(self.log.events):
            times = recovery_times(timeline, (fault or detected)["t_s"], detected["t_s"],
                                   restarted["t_s"])
            assert times.restart_s is not None  # known: the failure's restart is given
            failure = FailureRecovery(
                reason=detected["reason"], detected_at_s=detected["t_s"],
                restart_s=times.restart_s, recovery_s=times.recovery_s,
                recovery_line=restarted["checkpoint"],
                restarted_tasks=list(restarted.get("tasks", ())),
                failed_at_s=times.failed_at_s, detection_s=times.detection_s,
                trt_s=times.trt_s)
            self.record_event("recovery", **dataclasses.asdict(failure))
            failures.append(failure)
        return failures

    def progress(self) -> dict[str, Any]:
        elapsed = time.time() - self.started_s if self.started_s else 0.0
        return {"job_id": self.config.job_id, "phase": self.stage.phase,
                "elapsed_s": elapsed, "attempt": self.stage.attempt,
                **self.poller.tally.totals}


def _cause(exc: BaseException) -> str:
    """What a worker raised, without Ray's wrapping."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
    return f"{type(cause).__name__}: {cause}"


def _commit_name(commit: int) -> str:
    return ("the end-of-stream commit" if commit == FINAL_COMMIT
            else f"commit point {commit}")


def _queries_of(plan: PhysicalPlan) -> list[QueryNeeds]:
    """The topology's queries (a sink in none is one of its own) and their tasks."""
    topology = plan.topology
    upstream = {name: [i.upstream for i in node.inputs] for name, node in topology.nodes.items()}
    tasks_of_op = {op: [t.task_id for t in plan.tasks if t.chain_id == chain.chain_id]
                   for chain in plan.chains for op in chain.ops}
    sinks = [name for name, node in topology.nodes.items() if node.kind == "sink"]
    return queries_needs({q.name: (q.priority, q.outputs) for q in topology.queries.values()},
                         sinks, upstream, tasks_of_op)


def _first_failure(events: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """When the first failure was detected, and when the job ran again after it."""
    detected = next((e["t_s"] for e in events if e["kind"] == "failure_detected"), None)
    restarted = None if detected is None else next(
        (e["t_s"] for e in events if e["kind"] == "restarted" and e["t_s"] >= detected), None)
    return detected, restarted

