"""The job master: deploys a physical plan onto worker actors, watches it, recovers it.

The job master runs in a Ray actor, so a job keeps its coordinator when the driver is a
remote client. That actor, the `JobHost`, outlives its jobs like the workers do
(`bastion.scheduler.pool` lends both): each `JobHost.run` builds a `JobMaster` — a
plain object holding one job's state — runs it and drops it, so jobs share the
process and nothing else. Workers reach their job's master through a `MasterLink`
(the host and the job's id). `JobMaster.run` is a loop over named phases; the
decisions in them — where workers go, when one is lost, what a recovery restarts —
are the scheduler's (`bastion.scheduler`), the checkpoints the protocol's
coordinator's:

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
   `_restart_region`), restart only those, within the running attempt, and go back
   to *watch*: the other tasks never stop, and neither does the progress timeline;
   a worker that hosts only tasks joining again runs at the OS's lowest CPU
   priority while they catch up on what they missed (`bastion.scheduler.catchup`),
   so that the tasks that never stopped keep the cores they need;
6. **finish** — commit the end-of-stream outputs, gather counters, latency histograms
   and dead letters; whatever happened, then, every worker that resets in time goes
   back to the pool clean, and every other one is killed and never lent again.

Three faults of the job's own machinery are handled here too:

- **a checkpoint that cannot be read back** — a worker restoring the recovery line
  finds a blob damaged or missing (`detector.UnreadableBlob`). The job master records
  ``checkpoint_unusable`` (the checkpoint, the blob's key, the reason), tells the
  coordinator to exclude that checkpoint (`Coordinator.exclude`) and deploys again
  from the line it names next. Committed outputs are never taken back, so a line
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
import math
import time
from dataclasses import dataclass, field
from typing import Any, cast

import ray

from bastion import faults as fault_injection
from bastion.errors import JobFailedError, NoUsableCheckpointError, SinkCommitError
from bastion.protocols import get_protocol
from bastion.protocols.base import MasterContext, cancel
from bastion.runtime.config import JobConfig, with_frame_key
from bastion.runtime import export
from bastion.runtime.events import EventLimits, EventLog
from bastion.runtime.lease import WorkerLease
from bastion.runtime.metrics import FailureRecovery, query_availability
from bastion.runtime.recovery_times import failures_in, recovery_times
from bastion.runtime.outputs import FINAL_COMMIT, committed_blobs, marker_key
from bastion.runtime.plan import PhysicalPlan
from bastion.scheduler import detector, injector, placement
from bastion.scheduler.detector import CorrelatedFailures, Failure, within
from bastion.scheduler.failover import TaskGraph, failover_strategy
from bastion.scheduler.recovery import (BlockingRecovery, Capacity, QueryNeeds,
                                       RecoveryPlanError, RecoveryPlanner, check_plan,
                                       queries_needs, recovery_policy, replacement_slots)
from bastion.runtime.progress import (LoopTermination, ProgressTally, RedundancyLoop,
                                      RetuneLoop, caught_up)
from bastion.scheduler.resiliency import ResiliencyManager
from bastion.scheduler.retune import Retuner
from bastion.storage import CheckpointStore, open_store


_PROGRESS_TIMEOUT_S = 1.0  # a worker busier than this is left out of one timeline point
_FINAL_PROGRESS_TIMEOUT_S = 30.0  # ...but not out of the last one (`_watch`)


@dataclass(frozen=True)
class MasterLimits:
    """How often a job master retries applying a commit, and how much of its events
    and timeline it keeps in memory (`EventLimits`)."""

    commit_attempts: int = 5
    commit_backoff_s: float = 0.1   # doubles after each failed attempt
    events: EventLimits = field(default_factory=EventLimits)


class _JobEnded(Exception):
    """A failure ended the job: ``report`` is what `JobMaster.run` returns."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(report.get("failure"))
        self.report = report


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
        return self._master.attempt

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
        return set(self._master.source_tasks)

    def sink_tasks(self) -> set[int]:
        return set(self._sinks)

    def unfinished_tasks(self) -> set[int]:
        return set(self._tasks) - self._master.finished_tasks

    def pending_tasks(self) -> set[int]:
        return set(self._master.pending)

    def all_sources_running(self) -> bool:
        return not (self._master.source_tasks & self._master.finished_tasks)

    def record_event(self, kind: str, **fields: Any) -> None:
        self._master.record_event(kind, **fields)

    async def trigger_sources(self, attempt: int, checkpoint_id: int) -> None:
        await self._master.trigger_sources(attempt, checkpoint_id)

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
                    meta: Any = None, incarnation: int = 0) -> None:
        self.host.acknowledge.remote(self.job_id, attempt, task_id, checkpoint_id, ref, meta,
                                     incarnation)

    async def commit(self, attempt: int, commit: int) -> bool:
        """Have the job master commit ``commit`` now; False if ``attempt`` is over."""
        return await self.host.commit_now.remote(self.job_id, attempt, commit)


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

    async def commit_now(self, job_id: str, attempt: int, commit: int) -> bool:
        """A task asks that its staged commit point be committed now (protocol acks)."""
        master = self.masters.get(job_id)
        return master is not None and await master.commit_now(attempt, commit)

    def acknowledge(self, job_id: str, attempt: int, task_id: int, checkpoint_id: int,
                    ref: Any, meta: Any = None, incarnation: int = 0) -> None:
        master = self.masters.get(job_id)
        if master is not None:  # an acknowledgment that arrives after its job ended
            master.acknowledge(attempt, task_id, checkpoint_id, ref, meta, incarnation)


class JobMaster:
    """One job's control plane, run by a `JobHost`."""

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
        self.workers: list = []   # the worker of each slot
        # the workers borrowed from the pool, and the standby (`bastion.runtime.lease`)
        self.lease = WorkerLease(pool, self.config, link, plan.workers,
                                 self.protocol.needs_standby)
        self._committing = asyncio.Lock()
        self.attempt = 0
        self.phase = "created"
        self.started_s: float | None = None
        self.entered_s = time.time()  # when the host began to run this job
        self.log = EventLog(self.store, config.job_id, self.limits.events)
        self.exporter = export.for_job(plan, config)  # None: export_metrics is off
        # Set when the job must end whatever the phase (a sink kept failing a commit):
        # the error, and a future the watch phase wakes up on.
        self.job_error: JobFailedError | None = None
        self._job_error_set: asyncio.Future | None = None
        self.unusable: dict[int, str] = {}  # checkpoint -> why it cannot be restored
        self.finished_tasks: set[int] = set()
        self.source_tasks = {t.task_id for t in plan.tasks
                             if plan.topology.nodes[plan.chains[t.chain_id].ops[0]].kind
                             == "source"}
        self.kills = fault_injection.validate(config.faults, plan)
        self.plan_channel_dst = {c.channel_id: t.task_id for t in plan.tasks for c in t.inputs}
        # feedback loops end when nothing can circulate any more
        self.loop_termination = (LoopTermination(self.plan_channel_dst, self.source_tasks)
                                 if plan.topology.has_feedback() else None)
        self.coordinator = self.protocol.coordinator(_CoordinatorContext(self))
        # How failures are recovered (`bastion.scheduler.recovery`). With a capacity
        # model, tasks lost with their node wait for capacity; a task no available
        # query needs is *pending* (not running, its inputs held upstream).
        self.recovery = recovery_policy(config.recovery)
        self.capacity_model = self.recovery.task_slots_per_cpu is not None
        self.bursts = CorrelatedFailures(self.recovery.burst_losses,
                                         self.recovery.burst_window_s)
        self.assignment: list[int | None] = [t.worker for t in plan.tasks]  # home worker
        self.pending: set[int] = set()
        self.worker_nodes: list[str | None] = []  # the node of each of self.workers
        self.lost_nodes: set[str] = set()          # nodes a fault took down
        self.queries = _queries_of(plan)
        sink_queries = {t.task_id: [q.name for q in self.queries
                                    if set(q.outputs) & set(plan.chains[t.chain_id].ops)]
                        for t in plan.tasks}
        self.query_points: list[dict[str, Any]] = []  # per poll: per query output, latency
        self._restore: Any = None   # what joining tasks restore from (`_join`)
        # Regional restarts (`_restart_region`): which tasks a failure restarts (the
        # failover strategy), the incarnation of every task (a regional restart bumps
        # those it rebuilds), the channel positions its line resumes from, and how
        # many regional restarts the job made.
        self.failover = failover_strategy(config.failover, self.protocol.restart_scope,
                                          self.recovery)
        self.regional = self.failover.partial
        self.incarnations = [0] * len(plan.tasks)
        self._resume: dict[int, int] = {}
        self._retake: tuple[int, ...] = ()  # checkpoints joining sources take again
        self.region_restarts = 0
        # a failure interrupted a regional restart: the next recovery is of the job
        self._region_broken = False
        # Adaptive buffering (Su & Zhou; `bastion.scheduler.failover`): whether it is
        # on (from a burst's detection to the next checkpoint that completes once
        # every lost task runs again), and the tasks whose upstream backups hold every
        # frame they sent since the line a regional restart restores — the sources
        # always, and the tasks a restart rebuilt while it was on.
        self.buffering = False
        self.backed_up: set[int] = set(self.source_tasks)
        self._buffering_change: asyncio.Future | None = None  # the workers being told
        self._telling: set[asyncio.Future] = set()
        # the tasks that restarted at the last failure: only they can be pending
        self.restarting: set[int] = set(range(len(plan.tasks)))
        self._planned_free = 0  # free task slots left after the last placement
        self.planner: RecoveryPlanner = BlockingRecovery()  # of the last failure
        # Workers hosting only recovering tasks run at the OS's lowest CPU priority
        # while those catch up (`bastion.scheduler.catchup`): actor id -> (worker,
        # its tasks, when it was lowered, when its replays had started)
        self.catch_up = self.recovery.catch_up()
        self._lowered: dict[str, tuple[Any, set[int], float, float]] = {}
        # tasks being built and restored on their workers (`_join`): not running yet
        self._joining: set[int] = set()
        self._injector: asyncio.Task | None = None
        self.repaired_at_s: dict[int, float] = {}  # slot -> when its crash is repaired
        self._standby_after_catch_up = False  # a restart's standby waits (`_start`)
        self._polled_at_s: float | None = None  # when the last progress poll ended
        # `redundancy="auto"`: the resiliency manager decides the redundancy ratio each
        # period from the latency sinks saw in it (`bastion.scheduler.resiliency`)
        self.redundancy = (None if config.resiliency is None
                           else ResiliencyManager(config.resiliency))
        self.redundancy_loop = (None if self.redundancy is None else RedundancyLoop(
            self.redundancy, self._send_redundancy, self.record_event))
        # The counters of the progress polls. The tasks whose input holds copies: one
        # stalled on a frame is a fault the manager may answer at once
        # (`ResiliencyManager.on_stall`).
        self.tally = ProgressTally(
            sink_queries, [q.name for q in self.queries],
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
                config.progress_interval_s, self.coordinator.set_interval,
                self.record_event)

    # -- what the coordinator's context and the workers call --------------------------------

    def record_event(self, kind: str, **fields: Any) -> None:
        event = self.log.record(kind, self.started_s, **fields)
        if self.exporter is not None:
            self.exporter.observe_event(event)
        if self.retune_loop is not None:
            self.retune_loop.on_event(kind)

    async def trigger_sources(self, attempt: int, checkpoint_id: int) -> None:
        by_worker: dict[int, list[int]] = {}
        for task_id in self.source_tasks - self.pending:
            worker = self.assignment[task_id]
            if worker is None:
                continue  # lost, not placed yet (a regional restart): triggered at `_join`
            by_worker.setdefault(worker, []).append(task_id)
        for w, task_ids in by_worker.items():
            self.workers[w].trigger_checkpoint.remote(self._epoch(attempt), task_ids,
                                                     checkpoint_id)

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
        async with self._committing:
            await self.store.aput(marker_key(self.config.job_id, commit), b"")
            slots = list(range(len(self.workers)))
            delay_s = self.limits.commit_backoff_s
            for tries in range(1, self.limits.commit_attempts + 1):
                results = await asyncio.gather(
                    *[self.workers[i].apply_commit.remote(self._epoch(self.attempt), commit)
                      for i in slots],
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
                                      sinks=self._sinks_of(slots), error=_cause(
                                          failed[slots[0]]))
                    await asyncio.sleep(delay_s)
                    delay_s *= 2
            error = SinkCommitError(
                f"job {self.config.job_id} failed: sink {', '.join(self._sinks_of(slots))} "
                f"could not apply {_commit_name(commit)} after "
                f"{self.limits.commit_attempts} attempts: {_cause(failed[slots[0]])}")
            self.record_event("commit_failed", commit=commit, workers=slots,
                              sinks=self._sinks_of(slots), error=str(error))
            self._end_job(error)
            raise error

    def trim_upstream_backups(self, below: dict[int, int]) -> None:
        """Have every worker's upstream backups forget the frames below ``below``,
        when the failover keeps backups; a worker that misses it holds more."""
        if self.failover.backs_up_channels:
            epoch = self._epoch(self.attempt)
            for worker in self.workers:
                worker.trim_upstream_backups.remote(epoch, below)

    async def commit_now(self, attempt: int, commit: int) -> bool:
        """Commit ``commit`` for a task of ``attempt`` (`TaskContext.commit_sink_outputs`);
        False when that attempt is no longer the one running, or the job has ended."""
        if attempt != self.attempt or self.job_error is not None or self.phase == "done":
            return False
        await self.commit_outputs(commit)
        return True

    def _task_names(self, task_ids: Any) -> list[str]:
        """The operator instances the tasks ``task_ids`` run, as ``op[index]``, in
        plan order (a chained task runs several operators)."""
        plan = self.plan
        return [f"{op}[{plan.tasks[t].index}]" for t in sorted(task_ids)
                for op in plan.chains[plan.tasks[t].chain_id].ops]

    def _sinks_of(self, slots: list[int]) -> list[str]:
        """The sink instances the workers of ``slots`` run, as ``'name' [index]``."""
        plan = self.plan
        return [f"{op!r} [{t.index}]" for slot in slots for t in self._tasks_on(slot)
                for op in plan.chains[t.chain_id].ops
                if plan.topology.nodes[op].kind == "sink"]

    def _end_job(self, error: JobFailedError) -> None:
        """End the job with ``error``, whatever phase it is in."""
        if self.job_error is None:
            self.job_error = error
        if self._job_error_set is not None and not self._job_error_set.done():
            self._job_error_set.set_result(None)

    def acknowledge(self, attempt: int, task_id: int, checkpoint_id: int, ref: Any,
                    meta: Any = None, incarnation: int = 0) -> None:
        if incarnation != self.incarnations[task_id]:
            return  # from a task a regional restart has rebuilt since: it takes it again
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
            if self.capacity_model or self.failover.backs_up_channels:
                await asyncio.gather(*[self.store.adelete(key) for key in await
                                       self.store.alist(f"jobs/{self.config.job_id}/held/")],
                                     return_exceptions=True)
            await self.log.close()
        report["events_not_stored"] = self.log.summary()
        report["worker_ids"] = [w._actor_id.hex() for w in self.workers]
        if "finished_s" in report:  # a job that ran to its end
            assert self.started_s is not None  # ... started first
            report["deploy_s"] = self.started_s - self.entered_s
            report["teardown_s"] = released_at_s - report["finished_s"]
        return report

    async def _phases(self) -> dict[str, Any]:
        try:
            spawn_s = await self._spawn()
            restore: Any = await self.coordinator.initial_line()
            redeploy = True  # False after a regional restart: the job runs on
            failure: Failure | None = None
            while True:
                try:
                    # A worker may die during a recovery too (while tasks join the
                    # running attempt): that is one more failure to recover from.
                    if failure is not None:
                        restore, redeploy = await self._recover(failure)
                        failure = None
                    if redeploy:
                        await self._deploy(restore)
                        await self._start(restore)
                    await self._watch()
                    break
                except Failure as exc:
                    failure = exc
            return await self._finish(spawn_s)
        except _JobEnded as ended:
            return self._ended(ended.report)
        except JobFailedError:
            return self._ended({"failure": self.job_error})

    def _ended(self, report: dict[str, Any]) -> dict[str, Any]:
        """The report of a job that failed: an error that ended it wins over the
        failure it caused on its way (a sink that failed, then the watch that noticed)."""
        if self.job_error is not None:
            report = {**report, "failure": self.job_error}
        return report

    async def _spawn(self) -> float:
        """Borrow every slot's worker and the standby; the seconds it took."""
        self.phase = "spawn"
        t0 = time.time()
        self.workers = await self.lease.borrow(list(range(self.plan.workers)))
        self.worker_nodes = await self.lease.nodes_of(self.workers)
        # A standby worker, borrowed now, takes over the slot of the first worker
        # to die: a restart then costs a deploy, not a process start. Waiting for
        # it here keeps its start (about a core-second, when the pool has no idle
        # worker) out of the job's run.
        await self.lease.ensure_standby()
        await asyncio.gather(*[w.ping.remote() for w in self.workers + self.lease.spare()])
        return time.time() - t0

    async def _deploy(self, restore: Any) -> None:
        """Every worker builds this attempt's tasks, restored from ``restore``."""
        self.phase = "deploy"
        peers = await self._peers()
        self._restore, self._resume, self._retake = restore, {}, ()
        self._lowered.clear()  # every worker resets, its priority with it
        await self._buffering_told(self.workers)
        assignment = self._running_assignment()
        outcomes = await asyncio.gather(*[w.deploy.remote(self.plan, peers, self.attempt,
                                                          restore, i, assignment,
                                                          self.incarnations)
                                          for i, w in enumerate(self.workers)],
                                        return_exceptions=True)
        self._raise_call_failures(outcomes)

    async def _peers(self) -> list[tuple[str, int]]:
        """Every worker's frame address, by slot (`WorkerLease.frame_addresses`). A
        worker that died meanwhile is a failure (`_phases` recovers from it)."""
        addresses = await self.lease.frame_addresses(self.workers)
        self._raise_call_failures(addresses)
        return addresses

    def _home(self, task_id: int) -> int:
        """The worker of a task that is placed (it runs, or restarts where it ran)."""
        worker = self.assignment[task_id]
        assert worker is not None, f"task {task_id} is not placed"
        return worker

    def _epoch(self, attempt: int) -> tuple[str, int]:
        """What a worker checks a call against: this job's id and the attempt."""
        return (self.config.job_id, attempt)

    def _raise_call_failures(self, outcomes: list) -> None:
        """Raise the most urgent failure among the workers' ``outcomes`` of a call:
        a worker may die here too (a second fault during a recovery): a death is
        recovered first, then a damaged checkpoint; anything else ends the job."""
        failures = [detector.call_failure(self.phase, i, exc)
                    for i, exc in enumerate(outcomes) if isinstance(exc, Exception)]
        if failures:
            raise min(failures, key=lambda f: (f.fatal, f.blob is not None))

    async def _start(self, restore: Any) -> None:
        """Tasks start their loops; the first start also starts the clock and the
        scheduled faults."""
        self.phase = "start"
        self.finished_tasks = set()
        if self.started_s is None:
            self.started_s = time.time()
            self.record_event("started")
            self._injector = asyncio.ensure_future(self._inject_faults())
        sent_s = time.time()
        try:
            began_s = await asyncio.gather(*[w.start.remote() for w in self.workers])
        except ray.exceptions.RayActorError as exc:
            raise detector.died_during(self.phase, exc) from None
        # the last worker's tasks began then; kept within the call's span, on this
        # clock, should a worker's host clock be off
        running_s = min(max(max(began_s, default=sent_s), sent_s), time.time())
        # The tasks run already: a new standby (a process start, when the pool has
        # none idle) is borrowed and bound meanwhile, not waited for. After a
        # restart, only once the sources have caught up (`_poll_once`): the
        # process start costs about a core-second, which the catch-up needs more —
        # on a 2-core machine a catch-up it overlapped took 0.5-3 s longer, at
        # random, much of what made one recovery's total time unlike the next
        # one's (`bastion.scheduler.tuning`).
        if self.attempt:
            self._standby_after_catch_up = True
        else:
            self.lease.borrow_standby()
        if self.attempt:
            self.record_event("restarted", at=running_s, attempt=self.attempt,
                              checkpoint=_line_summary(restore),
                              tasks=self._task_names(range(len(self.plan.tasks))))
            if self.redundancy is not None:  # new tasks start from the configured ratio
                self._send_redundancy(self.redundancy.ratio)
        self.coordinator.start(self.attempt)

    async def _recover(self, failure: Failure) -> tuple[Any, bool]:
        """After ``failure``: replace what was lost and return the recovery line the
        next attempt restores from, and whether every task restarts from it — False
        when only the failed region restarted, and the job runs on (`_restart_region`);
        raise `_JobEnded` when the job cannot go on."""
        unfinished = self.coordinator.checkpoint_in_progress()
        self._standby_after_catch_up = False   # the next restart decides again
        # A loss of workers — also one while tasks of an earlier failure wait for
        # capacity (a second wave: `_rebuild_region` plans it with them): the failed
        # region may restart alone, so the coordinator goes on with the job's
        # checkpoints. Why not, when it restarts the job instead (an event says so).
        regional = (self.regional and failure.udf is None
                    and not failure.fatal and failure.blob is None)
        whole_because = None
        if regional and self.phase in ("spawn", "deploy", "start"):
            # The attempt's tasks had not all started (a loss while a restart of the
            # job deploys them): no task runs on outside a region, so the job
            # restarts whole. Restarting the region alone left the tasks deployed
            # outside it never started, and the job waited for them for ever.
            regional = False
            whole_because = (f"a failure came during {self.phase}, before every task of "
                             "the attempt ran: no task runs on outside a region, so every "
                             "task restarts")
        elif regional and self._region_broken:
            regional = False
            whole_because = ("a failure came while a regional restart was rebuilding its "
                             "region: its tasks are half restored, so every task restarts")
        elif not self.regional and self.pending:
            whole_because = (f"the failover strategy {self.failover.name} restarts every "
                             f"task (protocol {self.protocol.name!r} cannot restart a region "
                             "under a capacity model)")
        self._region_broken = False
        if not regional:
            await self.coordinator.stop()
        if self.job_error is not None:
            raise _JobEnded({"failure": self.job_error})
        if failure.udf is not None:
            raise _JobEnded({"failure": failure.udf})
        if failure.fatal:
            raise _JobEnded({"failure": failure.reason})
        if failure.blob is not None:
            return await self._exclude_checkpoint(failure), True
        self.record_event("failure_detected", reason=failure.reason, worker=failure.worker,
                          checkpoint_in_progress=unfinished)
        if self.attempt + self.region_restarts >= self.config.max_restarts:
            raise _JobEnded({"failure": f"{failure.reason} (gave up after "
                                        f"{self.config.max_restarts} restarts)"})
        self.phase = "recover"
        try:
            lost = (await self._lost_workers(failure) if self.config.recovery is None
                    else await self._collect_losses(failure))
            if regional:
                # the tasks outside the region run on meanwhile: their progress too
                polling = asyncio.ensure_future(self._poll_progress())
                try:
                    whole_because = await self._restart_region(lost)
                finally:
                    await cancel(polling)
                if whole_because is None:
                    return self._restore, False
                await self.coordinator.stop()
            if whole_because is not None and (self.failover.adaptive_buffering
                                              or self.pending):
                self.record_event("whole_restart", reason=whole_because,
                                  second_wave=bool(self.pending),
                                  pending=sorted(self.pending))
            if self.config.recovery is None:
                await self._replace_workers(failure, lost)
            else:
                await self._recover_with_policy(failure, lost)
        except RecoveryPlanError as exc:
            raise _JobEnded({"failure": str(exc)}) from None
        restore = await self._recovery_line()
        self.attempt += 1
        return restore, True

    async def _exclude_checkpoint(self, failure: Failure) -> Any:
        """A worker could not read a blob of the checkpoint it restores (its state on
        deploy, or logged frames it replays once started): give that checkpoint up
        and return the line to deploy again from, as the next attempt — tasks that
        had started send nothing the new attempt takes. The workers are alive."""
        blob = failure.blob
        assert blob is not None  # asked only about a failure that names its blob
        checkpoint = self.checkpoints.checkpoint_of(blob.key)
        if checkpoint is None or checkpoint in self.unusable:
            # not a checkpoint's blob, or the coordinator named it again: no way around
            raise _JobEnded({"failure": failure.reason})
        self.unusable[checkpoint] = f"{blob.key}: {blob.reason}"
        self.record_event("checkpoint_unusable", checkpoint=checkpoint, key=blob.key,
                          reason=blob.reason)
        self.coordinator.exclude(checkpoint)
        self.phase = "recover"
        restore = await self._recovery_line()
        self.attempt += 1
        return restore

    async def _recovery_line(self) -> Any:
        """The coordinator's recovery line, unless restoring it would commit again
        outputs already committed (possible only once a checkpoint was excluded)."""
        restore = await self.coordinator.recovery_line()
        rolled_back = self.coordinator.rolled_back_commits(restore)
        if rolled_back:
            visible = await asyncio.to_thread(self._with_outputs, rolled_back)
            if visible:
                damaged = "; ".join(f"checkpoint {c} ({why})"
                                    for c, why in sorted(self.unusable.items()))
                start = ("the beginning" if restore is None
                         else f"checkpoint {_line_summary(restore)}")
                raise _JobEnded({"failure": NoUsableCheckpointError(
                    f"job {self.config.job_id} failed: no checkpoint can be restored. "
                    f"Unreadable: {damaged or 'none'}. Restarting from {start} would "
                    f"commit again the outputs of commit points {sorted(visible)}, which "
                    "sinks have made visible already; the outputs committed so far are "
                    f"kept under jobs/{self.config.job_id}/outputs/ — run the job again")})
        return restore

    def _with_outputs(self, commits: set[int]) -> set[int]:
        """Of the commit points ``commits``, those that committed some sink record."""
        found: set[int] = set()
        for name, node in self.plan.topology.nodes.items():
            if node.kind == "sink":
                found |= {c for _, c, _ in committed_blobs(self.store, self.config.job_id,
                                                           name) if c in commits}
        return found

    async def _finish(self, spawn_s: float) -> dict[str, Any]:
        """Every task finished: commit what is final and collect the report."""
        await self.coordinator.stop()
        await cancel(self._injector)
        finished_s = time.time()
        self.phase = "collect"
        reports = await asyncio.gather(*[w.report.remote() for w in self.workers])
        tasks = [task for worker in reports for task in worker]
        if self.failover.backs_up_channels:
            self._record_backups(tasks)
        self.phase = "commit"
        await self.coordinator.on_job_finished(tasks)
        await self.commit_outputs(FINAL_COMMIT)
        self.phase = "done"
        failures = self._failures()
        return {
            "failure": None,
            "spawn_s": spawn_s,
            "started_s": self.started_s,
            "finished_s": finished_s,
            "tasks": tasks,
            **self._events_report(),
            "protocol": self.coordinator.stats(
                {t["task_id"]: (t["final_sent"], t["final_received"]) for t in tasks}),
            "attempts": self.attempt + 1,
            "failures": failures,
            "queries": query_availability(
                self.query_points, {q.name: q.priority for q in self.queries},
                *_first_failure(self.log.events)),
            "redundancy_decisions": ([] if self.redundancy is None else
                                     [dataclasses.asdict(d) for d in self.redundancy.decisions]),
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
        self.record_event("upstream_backups", adaptive=self.failover.adaptive_buffering,
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

    async def _replace_workers(self, failure: Failure, lost: list[int] | None = None) -> None:
        """Without a capacity model: replace every dead worker at once (`_refill`)
        and restart every slot (the survivors are reset by the next deploy). A new
        standby is only started once the job runs again (`WorkerLease.ensure_standby`):
        starting a process costs a core for about a second, which the restart needs
        more."""
        alive = await asyncio.gather(*[detector.answers(w, self.config.heartbeat_timeout_s)
                                       for w in self.workers])
        lost = sorted(set(lost or []) | {i for i, ok in enumerate(alive)
                                         if not ok or i == failure.worker})
        await self._refill(lost, restart=list(range(len(self.workers))))
        # a worker that dies meanwhile fails the deploy, which starts another recovery
        await asyncio.gather(*[w.ping.remote() for w in self.workers], return_exceptions=True)

    async def _refill(self, lost: list[int], restart: list[int]) -> None:
        """Without a capacity model: the ``lost`` slots get new workers in place, each
        bound to its slot — the standby (when it is alive and idle) takes the first,
        so a restart costs a deploy and not a process start, fresh workers the
        others; every task keeps its slot. ``restart``: the slots whose tasks
        restart (for the event)."""
        lease = self.lease
        await lease.standby_lent()
        standby_alive = lease.standby is not None and await detector.answers(
            lease.standby, self.config.heartbeat_timeout_s)
        if not standby_alive:
            lease.drop_standby()  # lost with the others (a node)
        to_standby, to_fresh = replacement_slots(lost, standby_alive)
        self.record_event("recovery_planned", lost=lost, to_standby=list(to_standby),
                          to_fresh=list(to_fresh), restart=restart)
        for i in lost:
            ray.kill(self.workers[i], no_restart=True)
        await self._await_repairs(lost)
        for i in to_standby:
            self.workers[i] = await lease.bind_standby(i)
        for i, worker in zip(to_fresh, await self.lease.borrow(list(to_fresh))):
            self.workers[i] = worker
        # Only the new workers' nodes are news; their frame addresses are asked now,
        # in the same round trip, for the deploy that follows (`_peers`).
        new = [self.workers[i] for i in lost]
        nodes, _ = await asyncio.gather(self.lease.nodes_of(new), self._peers(),
                                        return_exceptions=True)
        if isinstance(nodes, BaseException):
            raise nodes
        for i, node in zip(lost, nodes):
            self.worker_nodes[i] = node

    # -- recovery under a policy (`bastion.scheduler.recovery`) ------------------------

    def _tasks_on(self, worker: int) -> list[Any]:
        """The tasks worker ``worker`` runs now (pending ones excluded)."""
        return [self.plan.tasks[t] for t, w in enumerate(self.assignment)
                if w == worker and t not in self.pending]

    def _running_assignment(self) -> list[int | None]:
        """The worker of every task that runs; None for a pending one."""
        return [None if t in self.pending else w for t, w in enumerate(self.assignment)]

    def _node_lost(self, node_id: str) -> None:
        """A fault took node ``node_id`` down: it offers no capacity any more."""
        self.lost_nodes.add(node_id)

    async def _lost_workers(self, failure: Failure) -> list[int]:
        alive = await asyncio.gather(*[detector.answers(w, self.config.heartbeat_timeout_s)
                                       for w in self.workers])
        return [i for i, ok in enumerate(alive) if not ok or i == failure.worker]

    async def _collect_losses(self, failure: Failure) -> list[int]:
        """The workers one failure took down: while the burst window that its first
        loss opened is open and the losses are fewer than a burst, look again — a
        correlated failure is planned as one (`detector.CorrelatedFailures`)."""
        self.bursts.clear()
        while True:
            lost = await self._lost_workers(failure)
            live = set(placement.live_nodes()) - self.lost_nodes
            self.bursts.add(time.time(), [
                f"node {self.worker_nodes[i]}" if self.worker_nodes[i] not in live
                else f"worker {i}" for i in lost])
            if self.bursts.correlated() or not self.bursts.window_open(time.time()):
                break
            await asyncio.sleep(min(0.05, self.recovery.burst_window_s))
        self.record_event("losses_grouped", losses=[n for _, n in self.bursts.losses],
                          correlated=self.bursts.correlated())
        return lost

    async def _recover_with_policy(self, failure: Failure, lost: list[int]) -> None:
        """Drop the ``lost`` workers (grouped by `_collect_losses`), and let the
        planner decide which lost tasks run again now: the rest stay pending until
        capacity arrives (`_bring_back`). Without a capacity model every lost slot
        is replaced."""
        if not self.capacity_model:
            await self._replace_workers(failure, lost)
            return
        lost_tasks = await self._drop_workers(lost)
        self.restarting = set(range(len(self.plan.tasks)))
        plan = await self._place(lost_tasks, self.planner)
        self.record_event("recovery_planned", lost=lost, lost_tasks=lost_tasks,
                          recover=list(plan.recover), pending=sorted(self.pending),
                          queries=list(plan.queries), planner=type(self.planner).__name__,
                          free_task_slots=self._planned_free)
        # every task restores the line: with buffering on, each backs up from there
        await self._adapt_buffering(self.restarting)

    async def _restart_region(self, lost: list[int]) -> str | None:
        """Restart only the failed region: the tasks of the ``lost`` workers and those
        the failover strategy restarts with them (`bastion.scheduler.failover`), from
        the coordinator's `region_line`; every other task keeps running. None when it
        did; else why it cannot — the protocol cannot restart a region now, or the
        region is the whole job: the job then restarts whole (the ``lost`` workers may
        be dead by then).

        Under adaptive buffering the region also holds every sender into it whose
        upstream backup does not hold what it sent since the line (`backed_up`).
        A loss while tasks of an earlier failure still wait for capacity (a *second
        wave*) restarts its own region the same way: the tasks it restores catch up
        from backups kept since the burst, and the planner is asked again with the
        tasks still waiting and the newly lost ones.

        Survivors stop forwarding into the region and the region's tasks that ran on
        live workers stop (`Worker.restart_region`); each task of the region gets a
        new incarnation, so frames and acknowledgments of the one before are dropped.
        The planner places the lost tasks on free capacity as after any failure; the
        region's tasks that an available query needs join the running attempt,
        restored from the line, and every sender into them sends again, out of its
        upstream backup, what they must see again (`_join`). The others stay pending
        and join as capacity arrives (`_bring_back`)."""
        if self.plan.topology.has_feedback():
            # Loops end when every frame sent on every channel was processed
            # (`_check_loops`): a restarted receiver counts afresh what its senders
            # kept counting, so the counts would never meet again.
            return ("the topology has a feedback edge: a restarted region would count "
                    "its loops' frames afresh, so no region restarts alone")
        lost_tasks = {t for t, w in enumerate(self.assignment) if w in lost}
        graph = TaskGraph(frozenset(range(len(self.plan.tasks))),
                          _CoordinatorContext(self).channels(),
                          frozenset(self.backed_up) if self.failover.adaptive_buffering
                          else None)
        region = set(self.failover.tasks_to_restart(lost_tasks, graph))
        if region == graph.tasks and not self.capacity_model:
            # Restarting every task within the attempt gains nothing over a restart
            # of the job (under a capacity model the regional path is what lets
            # tasks wait for capacity while the attempt runs on).
            return "the failed region is the whole job"
        # The region takes the checkpoint in progress again, under the same id: a lost
        # worker that only missed its heartbeat must be dead before, or a blob it
        # stores late would replace its next incarnation's.
        for i in lost:
            ray.kill(self.workers[i], no_restart=True)
        dead = await asyncio.gather(*[detector.confirmed_dead(
            self.workers[i], self.config.heartbeat_timeout_s * 5) for i in lost])
        if not all(dead):
            return (f"lost worker(s) {[i for i, d in zip(lost, dead) if not d]} were not "
                    f"confirmed dead within {self.config.heartbeat_timeout_s * 5:g} s: a "
                    "checkpoint blob one stored late could replace its successor's")
        line = await self.coordinator.region_line(region)
        if line is None:
            return ("no checkpoint has completed in this attempt yet, so there is no line "
                    "a region can restore alone"
                    + (" (a checkpoint needs every task, and tasks "
                       f"{sorted(self.pending)} wait for capacity)" if self.pending else ""))
        self.region_restarts += 1
        try:
            await self._rebuild_region(lost, lost_tasks, region, line)
        except Failure:
            self._region_broken = True  # half rebuilt: the whole job restarts instead
            raise
        return None

    async def _rebuild_region(self, lost: list[int], lost_tasks: set[int], region: set[int],
                              line: Any) -> None:
        """`_restart_region` from its line on: stop the region, place its lost tasks,
        and let those that can run join."""
        # Tasks an earlier failure left waiting for capacity: this is a second wave,
        # planned with them (they never ran since, so nothing they fed restarts).
        waiting = set(self.pending)
        for t in region:
            self.incarnations[t] += 1
        epoch = self._epoch(self.attempt)
        # The survivors stop the region's tasks while the lost slots are refilled
        # (no capacity model: in place, the standby first) — two round trips in one.
        stopping = asyncio.gather(*[w.restart_region.remote(epoch, sorted(region))
                                    for i, w in enumerate(self.workers) if i not in lost],
                                  return_exceptions=True)  # a death is the detector's
        self.finished_tasks -= region
        # only these may be left pending: a task an earlier restart brought back runs
        self.restarting = region | waiting
        self._restore, self._resume, self._retake = line, line.resume, line.retake
        if not self.capacity_model:
            await asyncio.gather(stopping, self._refill(
                lost, restart=sorted({self._home(t) for t in region})))
        else:
            await stopping
            # the planner is asked with every task without a worker: those lost now
            # and those still waiting since an earlier failure
            unplaced = await self._drop_workers(lost)
            plan = await self._place(unplaced, self.planner)
            self.pending &= self.restarting  # a task outside them never stopped
            self.record_event("recovery_planned", lost=lost, lost_tasks=sorted(lost_tasks),
                              region=sorted(region), recover=list(plan.recover),
                              pending=sorted(self.pending), queries=list(plan.queries),
                              planner=type(self.planner).__name__,
                              free_task_slots=self._planned_free,
                              second_wave=bool(waiting), waiting=sorted(waiting))
            await self._adapt_buffering(region)
        await self._join(sorted(self.restarting - self.pending))
        if not self.capacity_model:
            # The standby went to a lost slot: a new one once the region caught up —
            # not before it joined (the tasks outside it may look caught up at once),
            # or the process start would take the cores the restart needs.
            self._standby_after_catch_up = True
        self.record_event("restarted", attempt=self.attempt, checkpoint=_line_summary(line.line),
                          region=sorted(region), tasks=self._task_names(region))

    async def _drop_workers(self, lost: list[int]) -> list[int]:
        """Kill the ``lost`` workers (and the standby) and forget them; the tasks they
        ran, now without a worker. Picks the planner of this failure."""
        await self.lease.standby_lent()
        self.lease.drop_standby()  # a warm process is not capacity: let it go
        for i in lost:
            ray.kill(self.workers[i], no_restart=True)
        keep = [i for i in range(len(self.workers)) if i not in lost]
        index = {old: new for new, old in enumerate(keep)}
        self.workers = [self.workers[i] for i in keep]
        self.worker_nodes = [self.worker_nodes[i] for i in keep]
        lost_tasks = sorted(t for t, w in enumerate(self.assignment) if w is None or w in lost)
        self.assignment = [None if w is None or w in lost else index[w]
                           for w in self.assignment]
        # The planner of this failure plans it to its end (`_bring_back` too). A loss
        # while tasks of a correlated failure still wait for capacity is part of
        # recovering that failure: its planner goes on (a blocking plan would hold
        # back queries it had promised to bring back as capacity arrives).
        still_recovering = bool(self.pending) and not isinstance(self.planner,
                                                                 BlockingRecovery)
        self.planner = (self.recovery.planner()
                        if self.bursts.correlated() or still_recovering
                        else BlockingRecovery())
        return lost_tasks

    async def _adapt_buffering(self, restarted: set[int]) -> None:
        """After a recovery's plan, under adaptive buffering: turn it on at a burst,
        or when the plan left tasks pending (their upstream must keep what they will
        need); the ``restarted`` tasks, rebuilt from the line with it on, back up
        everything they send from the line on."""
        if not self.failover.adaptive_buffering:
            return
        if not self.buffering and (self.bursts.correlated() or self.pending):
            self.buffering = True
            why = "a burst was detected" if self.bursts.correlated() else \
                f"tasks {sorted(self.pending)} wait for capacity"
            await self._tell_buffering(True, why)
        if self.buffering:
            self.backed_up |= restarted

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """A checkpoint completed: once every lost task runs again, it is the global
        checkpoint after which adaptive buffering turns off (Su & Zhou) — every
        backup but the sources' is freed, and a later failure's region grows
        upstream again past the tasks that no longer log."""
        if not self.buffering or self.pending or self._joining or self.phase != "watch" \
                or any(w is None for w in self.assignment):
            return
        self.buffering = False
        self.backed_up = set(self.source_tasks)
        telling = asyncio.ensure_future(self._tell_buffering(
            False, f"checkpoint {checkpoint_id} completed with every lost task running",
            checkpoint_id=checkpoint_id))
        self._telling.add(telling)  # held: the loop keeps only a weak reference
        telling.add_done_callback(self._telling.discard)

    async def _tell_buffering(self, on: bool, reason: str, **fields: Any) -> None:
        """Every worker turns adaptive buffering ``on`` or off, after any change told
        before (an async actor may run one caller's calls out of order); recorded as
        an ``adaptive_buffering`` event with the bytes freed."""
        before, done = self._buffering_change, asyncio.get_running_loop().create_future()
        self._buffering_change = done
        try:
            if before is not None:
                await before
            replies = await asyncio.gather(*[w.set_buffering.remote(self.config.job_id, on)
                                             for w in self.workers], return_exceptions=True)
            self.record_event("adaptive_buffering", on=on, reason=reason,
                              freed_bytes=sum(r for r in replies if isinstance(r, int)),
                              **fields)
        finally:
            done.set_result(None)

    async def _buffering_told(self, workers: list[Any]) -> None:
        """Workers about to build tasks take adaptive buffering as it is now."""
        if self.buffering:
            await asyncio.gather(*[w.set_buffering.remote(self.config.job_id, True)
                                   for w in workers], return_exceptions=True)

    def _free_slots(self) -> dict[str, int]:
        """Free task slots per live node that no fault took down."""
        per_cpu = self.recovery.task_slots_per_cpu
        used: dict[str | None, int] = {}
        for w in self.assignment:
            if w is not None:
                node = self.worker_nodes[w]
                used[node] = used.get(node, 0) + 1
        return {n["NodeID"]: max(0, math.floor(n["Resources"].get("CPU", 0) * per_cpu)
                                 - used.get(n["NodeID"], 0))
                for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in self.lost_nodes}

    async def _place(self, unplaced: list[int], planner: RecoveryPlanner) -> Any:
        """Ask ``planner`` which of the ``unplaced`` tasks run again on the free
        slots, start a worker on each node they go to, and work out which tasks are
        pending: those no available query needs."""
        free = self._free_slots()
        free_task_slots = sum(free.values())
        capacity = Capacity(free_task_slots=free_task_slots)
        plan = planner.plan(unplaced, self.queries, capacity)
        check_plan(plan, unplaced, capacity.free_task_slots)
        placed: dict[str, list[int]] = {}
        recovering = iter(plan.recover)
        for node in sorted(free):
            for _ in range(free[node]):
                task = next(recovering, None)
                if task is not None:
                    placed.setdefault(node, []).append(task)
        nodes = sorted(placed)
        first = len(self.workers)
        workers = await self.lease.borrow(list(range(first, first + len(nodes))), nodes)
        for offset, (node, worker) in enumerate(zip(nodes, workers)):
            self.workers.append(worker)
            self.worker_nodes.append(node)
            for task in placed[node]:
                self.assignment[task] = first + offset
        self._planned_free = free_task_slots - len(plan.recover)
        running = set().union(*[q.tasks for q in self.queries
                                if all(self.assignment[t] is not None for t in q.tasks)])
        # a task outside the restart (a regional one) runs on, whatever its queries
        self.pending = (set(range(len(self.plan.tasks))) - running) & self.restarting
        return plan

    async def _capacity_arrived(self) -> None:
        """Return once more task slots are free than at the last placement; raise a
        fatal `Failure` when tasks waited ``capacity_timeout_s`` in vain."""
        waited_since_s = time.time()
        while True:
            await asyncio.sleep(0.1)
            # ray.nodes() asks the cluster's control store: off the event loop
            if sum((await asyncio.to_thread(self._free_slots)).values()) > self._planned_free:
                return
            if time.time() - waited_since_s > self.recovery.capacity_timeout_s:
                unplaced = sum(w is None for w in self.assignment)
                raise Failure(
                    f"{unplaced} task(s) lost with their node waited "
                    f"{self.recovery.capacity_timeout_s:g} s for task slots that never came "
                    f"({self._planned_free} free): add nodes to the cluster, or raise "
                    "RecoveryPolicy.task_slots_per_cpu", fatal=True)

    async def _bring_back(self) -> list[int]:
        """Capacity arrived: plan again, and let the tasks that can run join the
        running attempt — restored from its recovery line, fed what their upstream
        held for them. The workers that got tasks."""
        before = set(self.pending)
        unplaced = sorted(t for t, w in enumerate(self.assignment) if w is None)
        plan = await self._place(unplaced, self.planner)
        joining = sorted(before - self.pending)
        if not joining:
            return []
        self.record_event("recovery_progressed", recover=list(plan.recover),
                          joining=joining, queries=list(plan.queries),
                          pending=sorted(self.pending))
        return await self._join(joining)

    async def _join(self, joining: list[int]) -> list[int]:
        """Tasks ``joining`` join the running attempt, restored from ``_restore``:
        built on their workers, then started, while every channel into them starts
        sending (`Worker.attach`; from ``_resume`` on, after a regional restart).
        Under a protocol that restarts regions, joining sources take the checkpoint
        in progress too: the tasks downstream of them wait for its barrier. The
        workers that got tasks."""
        if not joining:
            return []
        self._joining = set(joining)
        try:
            return await self._join_now(joining)
        finally:
            self._joining = set()

    async def _join_now(self, joining: list[int]) -> list[int]:
        epoch = self._epoch(self.attempt)
        peers = await self._peers()
        assignment = self._running_assignment()
        by_worker: dict[int, list[int]] = {}
        for t in joining:
            by_worker.setdefault(self._home(t), []).append(t)
        # lowered before they build and restore their tasks: that is catch-up work too
        lowered = await self._lower_catching_up(set(joining), list(by_worker))
        await self._buffering_told([self.workers[w] for w in by_worker])
        try:
            self._raise_call_failures(await asyncio.gather(*[self.workers[w].join.remote(
                epoch, self.plan, peers, self._restore, assignment, tasks,
                self.incarnations) for w, tasks in by_worker.items()], return_exceptions=True))
            # Triggered once built and before they start, in order: a checkpoint the
            # trigger loop starts from now on comes after these at every source.
            checkpoint = self.coordinator.checkpoint_in_progress()
            retake = [*self._retake, *([checkpoint] if checkpoint is not None
                                       and checkpoint not in self._retake else [])]
            if self.regional:
                for w, tasks in by_worker.items():
                    sources = [t for t in tasks if t in self.source_tasks]
                    for checkpoint_id in retake if sources else ():
                        self.workers[w].trigger_checkpoint.remote(epoch, sources, checkpoint_id)
            self._raise_call_failures(await asyncio.gather(
                *[w.attach.remote(epoch, self.plan, peers, assignment, self._resume,
                                  self.incarnations) for w in self.workers],
                return_exceptions=True))
        except BaseException:
            for worker, _, _ in lowered.values():  # a failure: nothing is catching up
                worker.set_catch_up.remote(epoch, False)
            raise
        # watched from now on: the replays into them have started, and a progress
        # poll asked after this moment sees them
        watched_s = time.time()
        self._lowered.update({k: (*entry, watched_s) for k, entry in lowered.items()})
        return sorted(by_worker)

    async def _lower_catching_up(self, joining: set[int], workers: list[int]
                                 ) -> dict[str, tuple[Any, set[int], float]]:
        """Before the ``joining`` tasks are built and catch up: the workers (of
        ``workers``, those they joined) that the catch-up policy lowers run at the
        OS's lowest CPU priority until `_restore_caught_up` restores them, once the
        attach started the replays (the entries for `_lowered` it returns)."""
        hosted = {w: {t for t, a in enumerate(self.assignment)
                      if a == w and t not in self.pending} for w in workers}
        # the queries the failure did not hit: none of their tasks restarted
        protected = set().union(*[q.tasks for q in self.queries
                                  if not q.tasks & self.restarting])
        lowering = sorted(self.catch_up.to_lower(hosted, joining, protected))
        if not lowering:
            return {}
        epoch = self._epoch(self.attempt)
        replies = await asyncio.gather(*[self.workers[w].set_catch_up.remote(epoch, True)
                                         for w in lowering], return_exceptions=True)
        now_s = time.time()
        self.record_event("catch_up_lowered", workers=lowering,
                          tasks=sorted(set().union(*[hosted[w] for w in lowering])),
                          priority=[r if isinstance(r, str) else None for r in replies])
        return {self.workers[w]._actor_id.hex(): (self.workers[w], hosted[w], now_s)
                for w in lowering}

    async def _restore_caught_up(self, replaying: set[int] | None, asked_s: float) -> None:
        """Give a lowered worker its priority back once no replay feeds its tasks any
        more (or the policy's time is up); ``replaying``: the tasks the workers said,
        when asked at ``asked_s``, they still replay a backlog to (None: unknown) —
        an answer asked before the replays started cannot tell."""
        live = {w._actor_id.hex() for w in self.workers}
        for key in [k for k in self._lowered if k not in live]:
            del self._lowered[key]  # lost meanwhile
        if not self._lowered:
            return
        now_s = time.time()
        epoch = self._epoch(self.attempt)
        for key, (worker, tasks, since_s, watched_s) in list(self._lowered.items()):
            why = self.catch_up.to_restore(tasks, None if asked_s < watched_s
                                           else replaying, now_s - since_s)
            if why is None:
                continue
            del self._lowered[key]
            reply = await asyncio.gather(within(worker.set_catch_up.remote(epoch, False),
                                                _PROGRESS_TIMEOUT_S), return_exceptions=True)
            self.record_event("catch_up_restored", tasks=sorted(tasks),
                              lowered_s=round(now_s - since_s, 3),
                              reason=why,
                              priority=reply[0] if isinstance(reply[0], str) else None)

    async def _watch(self) -> None:
        """Return when every task finished; raise `Failure` on the first failure."""
        self.phase = "watch"
        attempt = self.attempt
        # each wait covers the tasks its worker ran when it was asked: tasks that
        # join later get a wait of their own
        waits = {asyncio.ensure_future(w.wait.remote(self._epoch(attempt))):
                 (i, self._tasks_on(i)) for i, w in enumerate(self.workers)}
        helpers: list[asyncio.Future] = [asyncio.ensure_future(detector.watch_heartbeats(
                       lambda: self.workers, self.config.heartbeat_timeout_s)),
                   asyncio.ensure_future(self._poll_progress())]
        if self.config.duration_s is not None:
            helpers.append(asyncio.ensure_future(self._stop_after(self.config.duration_s)))
        assert self._job_error_set is not None  # made by `run` before any attempt
        ended = asyncio.ensure_future(asyncio.shield(self._job_error_set))
        helpers.append(ended)
        pending = set(waits) | set(helpers[:1]) | {ended}
        # Tasks waiting for capacity join the attempt as it arrives (`_bring_back`).
        capacity = None
        if self.pending:
            capacity = asyncio.ensure_future(self._capacity_arrived())
            helpers.append(capacity)
            pending.add(capacity)
        finished = False
        try:
            while any(f in pending for f in waits) or self.pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    if fut is ended:
                        raise Failure(str(self.job_error), fatal=True)
                    if capacity is not None and fut is capacity:
                        fut.result()  # raises when the wait for capacity timed out
                        for w in await self._bring_back():
                            joined = asyncio.ensure_future(self.workers[w].wait.remote(
                                self._epoch(attempt)))
                            waits[joined] = (w, self._tasks_on(w))
                            pending.add(joined)
                        if self.pending:
                            capacity = asyncio.ensure_future(self._capacity_arrived())
                            helpers.append(capacity)
                            pending.add(capacity)
                        continue
                    if fut not in waits:
                        fut.result()  # the heartbeat loop only returns by raising
                        continue
                    failure = detector.outcome_failure(waits[fut][0], fut)
                    if failure is not None:
                        raise failure
                    self.finished_tasks |= {t.task_id for t in waits[fut][1]}
            # every task finished: no replay is left (a last progress poll may time
            # out on workers busy finishing)
            await self._restore_caught_up(set(), time.time())
            finished = True
        finally:
            for fut in list(waits) + helpers:
                fut.cancel()
            # The attempt's last point. After every task finished it waits for every
            # worker: the timeline's points are summed (what the sinks received), and
            # a worker left out of the last one is left out for good — on a loaded
            # machine one busy finishing took over the usual timeout, and the sinks
            # had "received" 2,488 of the 2,500 records they committed. After a
            # failure the usual timeout: a hung worker must not hold up the recovery.
            await self._poll_once(_FINAL_PROGRESS_TIMEOUT_S if finished
                                  else _PROGRESS_TIMEOUT_S)

    async def _inject_faults(self) -> None:
        assert self.started_s is not None  # injected from the start of the run on
        await injector.inject(self.kills, self.started_s, self._victims,
                              self.coordinator.checkpoint_in_progress, self.record_event,
                              self._under_repair, self._node_lost)

    def _under_repair(self, names: list[str], until_s: float) -> None:
        for name in names:
            if name.startswith("worker "):
                slot = int(name.split()[1])
                self.repaired_at_s[slot] = max(self.repaired_at_s.get(slot, 0.0), until_s)

    async def _await_repairs(self, lost: list[int]) -> None:
        """A slot lost to a crash with a repair time (`bastion.faults.Crash`) gets its
        replacement only once that time has passed: the crashed instance is down
        for its repair, as the fault describes, and the job waits for it."""
        until_s = max((self.repaired_at_s.pop(i, 0.0) for i in lost), default=0.0)
        wait_s = until_s - time.time()
        if wait_s > 0:
            self.record_event("repair_wait", slots=lost, seconds=round(wait_s, 3))
            await asyncio.sleep(wait_s)

    def _victims(self) -> dict[str, Any]:
        """The job's processes a kill may take down, by name: the worker of every slot
        and the standby."""
        named = {f"worker {i}": w for i, w in enumerate(self.workers)}
        if self.lease.standby is not None:
            named["standby"] = self.lease.standby
        return named

    async def _stop_after(self, duration_s: float) -> None:
        await asyncio.sleep(duration_s)
        epoch = self._epoch(self.attempt)
        await asyncio.gather(*[w.stop_sources.remote(epoch) for w in self.workers],
                             return_exceptions=True)

    # -- progress ---------------------------------------------------------------------

    async def _poll_progress(self) -> None:
        while True:
            await asyncio.sleep(self.config.progress_interval_s)
            await self._poll_once()

    async def _poll_once(self, timeout_s: float = _PROGRESS_TIMEOUT_S) -> None:
        """Add one point to the timeline — records per second since the last point and
        the latency of what sinks received meanwhile (`ProgressTally`: a killed
        worker's history is kept) — and feed the control loops that read it
        (`bastion.runtime.progress`). A worker that does not answer within
        ``timeout_s`` is counted at the next point."""
        asked_s = time.time()
        replies = await asyncio.gather(*[within(w.progress.remote(), timeout_s)
                                         for w in self.workers], return_exceptions=True)
        poll = self.tally.add(replies)
        polled_s, self._polled_at_s = self._polled_at_s, time.time()
        elapsed_s = None if polled_s is None else self._polled_at_s - polled_s
        # phase 1: the recovery's own follow-ups — the standby a restart deferred, and
        # workers lowered while their tasks caught up
        if (self._standby_after_catch_up and poll.complete and elapsed_s is not None
                and caught_up(poll.source_lag, poll.source_records, elapsed_s,
                              self.config.progress_interval_s)):
            self._standby_after_catch_up = False
            if self.lease.standby is None and self.protocol.needs_standby:
                self.record_event("standby_borrowed", source_lag=poll.source_lag)
            self.lease.borrow_standby()
        if self._lowered:
            await self._restore_caught_up(
                None if any(isinstance(r, BaseException) for r in replies)
                # no reply is an exception here
                else set().union(*[r.get("replaying", ())
                                   for r in cast(list[dict[str, Any]], replies)]), asked_s)
        # phase 2: the control loops
        if self.exporter is not None:
            self.exporter.observe_poll(replies, time.time())
        if self.loop_termination is not None:
            heads = self.loop_termination.heads_to_finish(replies)
            if heads:
                self._finish_loops(heads)
        if self.started_s is None:
            return
        run_s = time.time() - self.started_s
        if self.redundancy_loop is not None:
            self.redundancy_loop.observe(poll, time.time(), run_s)
        if self.retune_loop is not None and elapsed_s is not None:
            self.retune_loop.observe(poll, elapsed_s,
                                     bool(self.source_tasks & self.finished_tasks), run_s)
        # phase 3: the timeline and the per-query points
        self.query_points.append({"t_s": run_s, "queries": {
            name: (records, None if (p50_s := h.percentile(50)) is None else p50_s * 1000)
            for name, (records, h) in poll.by_query.items()},
            # queries with a task waiting for capacity, or still being built and
            # restored to join: their output, if any, comes from the partitions
            # that kept running, and is incomplete
            "down": sorted(q.name for q in self.queries
                           if q.tasks & (self.pending | self._joining))})
        if len(self.query_points) > 2 * self.limits.events.first_points:
            # a long run: every other point, so memory stays flat and the
            # points still span the run (the first ones give the baseline)
            self.query_points = self.query_points[::2]
        latency = poll.latency
        p50, p99 = latency.percentile(50), latency.percentile(99)
        # the mean too: tuning's L_avg between kills (`timeline_latency_ms`), which
        # the last attempt's histograms no longer hold
        mean = latency.mean_std()
        self.log.progress({"t_s": time.time() - self.started_s,
                           "source_records": poll.source_records,
                           "sink_records": poll.sink_records,
                           "source_lag": poll.source_lag, "workers_answering": poll.answering,
                           "latency_p50_ms": None if p50 is None else p50 * 1000,
                           "latency_p99_ms": None if p99 is None else p99 * 1000,
                           "latency_mean_ms": None if mean is None else mean[0] * 1000})

    def _send_redundancy(self, ratio: float) -> None:
        epoch = self._epoch(self.attempt)
        for w in self.workers:
            w.set_redundancy.remote(epoch, ratio)

    def _finish_loops(self, heads: list[int]) -> None:
        self.record_event("loops_quiescent", tasks=heads)
        by_worker: dict[int, list[int]] = {}
        for t in heads:
            by_worker.setdefault(self._home(t), []).append(t)
        for w, task_ids in by_worker.items():
            self.workers[w].finish_loops.remote(self._epoch(self.attempt), task_ids)

    def progress(self) -> dict[str, Any]:
        elapsed = time.time() - self.started_s if self.started_s else 0.0
        return {"phase": self.phase, "elapsed_s": elapsed, "attempt": self.attempt,
                **self.tally.totals}


def _cause(exc: BaseException) -> str:
    """What a worker raised, without Ray's wrapping."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
    return f"{type(cause).__name__}: {cause}"


def _commit_name(commit: int) -> str:
    return ("the end-of-stream commit" if commit == FINAL_COMMIT
            else f"commit point {commit}")


def _line_summary(restore: Any) -> Any:
    """What a recovery line restores, for events and messages: a checkpoint id, or
    the checkpoint of every task (uncoordinated lines)."""
    return restore.get("summary") if isinstance(restore, dict) else restore


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

