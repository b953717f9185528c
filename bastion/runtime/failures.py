"""Failure handling: how a job master notices a failure and what it does about it.

A job master deploys its plan (`bastion.runtime.deployment`) and then *watches* it:
every worker's ``wait`` call returns when its tasks finish, or raises when one fails;
heartbeats find a worker that hangs or died without a word
(`bastion.scheduler.detector`). The first failure ends the watch, and the job master
asks `FailureHandler.recover` what to do. The *decisions* are the scheduler's —
which tasks restart (`bastion.scheduler.failover`), where lost tasks go and which
wait (`bastion.scheduler.recovery`), which workers run at a lower CPU priority while
their tasks catch up (`bastion.scheduler.catchup`) — and the recovery line is the
protocol's coordinator's; the failure handler carries them out:

- **a restart of the job** — stop the coordinator, replace the lost workers in their
  slots (the standby first: a deploy instead of a process start) or, under a
  capacity model, drop them and let the planner place their tasks on the free task
  slots, and return the coordinator's recovery line: the job master deploys the
  next attempt from it;
- **a regional restart** (`recover` returns ``redeploy=False``) — when the failover
  strategy restarts fewer tasks than the job has, only those restart, within the
  running attempt: the survivors stop sending into the region, its tasks get a new
  incarnation and *join* again, restored from the coordinator's region line and fed
  again from their senders' upstream backups; the other tasks never stop;
- **tasks that wait for capacity** — under a capacity model, a lost task that no
  available query needs is *pending*; the watch looks for free task slots and brings
  such tasks back (`_bring_back`) as they arrive, up to ``capacity_timeout_s``;
- **a correlated failure** — losses within the burst window are grouped and planned
  as one (`detector.CorrelatedFailures`); adaptive buffering (Su & Zhou) then keeps
  upstream backups in every task until a checkpoint completes with every lost task
  running again;
- **a checkpoint that cannot be read back** — its damaged blob is recorded, the
  coordinator excludes it and names another line; a line that would commit visible
  outputs again ends the job (`NoUsableCheckpointError`).

A failure the job cannot go on from (a user function's error, too many restarts, a
plan the planner cannot keep) raises `JobEnded`, which carries the job's report.

The handler owns the state of recoveries in progress (the planner of the last
failure, the tasks restarting and joining, the lines they restore from) and two
helpers of its own: `AdaptiveBuffering` (`bastion.runtime.buffering`: which tasks
keep upstream backups) and `CatchUpLowering` (`bastion.runtime.catchup`: the
workers lowered while their tasks catch up). It sees the rest of the job through
narrow collaborators: the deployment (who runs what), the job's stage, the
protocol's coordinator, and callables for the job's events, its fatal error and a
progress poll.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Awaitable, Callable

import ray

from bastion.errors import JobFailedError, NoUsableCheckpointError
from bastion.protocols.base import Coordinator, Protocol, cancel
from bastion.runtime.buffering import AdaptiveBuffering
from bastion.runtime.catchup import CatchUpLowering
from bastion.runtime.config import JobConfig
from bastion.runtime.deployment import Deployment, JobStage
from bastion.runtime.outputs import committed_blobs
from bastion.runtime.plan import PhysicalPlan
from bastion.runtime.progress import Poll, caught_up
from bastion.scheduler import detector, placement
from bastion.scheduler.detector import CorrelatedFailures, Failure
from bastion.scheduler.failover import TaskGraph, failover_strategy
from bastion.scheduler.recovery import (BlockingRecovery, Capacity, QueryNeeds,
                                       RecoveryPlanError, RecoveryPlanner, check_plan,
                                       recovery_policy, replacement_slots)
from bastion.storage import CheckpointStore, ObjectStore

class JobEnded(Exception):
    """A failure ended the job: ``report`` is what `JobMaster.run` returns."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(report.get("failure"))
        self.report = report


def line_summary(restore: Any) -> Any:
    """What a recovery line restores, for events and messages: a checkpoint id, or
    the checkpoint of every task (uncoordinated lines)."""
    return restore.get("summary") if isinstance(restore, dict) else restore


class FailureHandler:
    """Watches one job's workers, and recovers the job from every failure."""

    def __init__(self, plan: PhysicalPlan, config: JobConfig, protocol: Protocol,
                 coordinator: Coordinator, deployment: Deployment, stage: JobStage,
                 queries: list[QueryNeeds], store: ObjectStore, checkpoints: CheckpointStore,
                 record_event: Callable[..., None],
                 job_error: Callable[[], JobFailedError | None],
                 poll_progress: Callable[[], Awaitable[None]]):
        self.plan = plan
        self.config = config
        self.protocol = protocol
        self.coordinator = coordinator
        self.deployment = deployment
        self.stage = stage
        self.queries = queries
        self.store = store
        self.checkpoints = checkpoints
        self.record_event = record_event
        self.job_error = job_error          # the error that ended the job, if one did
        self.poll_progress = poll_progress  # polls until cancelled
        self.unusable: dict[int, str] = {}  # checkpoint -> why it cannot be restored
        # How failures are recovered (`bastion.scheduler.recovery`). With a capacity
        # model, tasks lost with their node wait for capacity; a task no available
        # query needs is *pending* (not running, its inputs held upstream).
        self.recovery = recovery_policy(config.recovery)
        self.capacity_model = self.recovery.task_slots_per_cpu is not None
        self.bursts = CorrelatedFailures(self.recovery.burst_losses,
                                         self.recovery.burst_window_s)
        self.lost_nodes: set[str] = set()          # nodes a fault took down
        self._restore: Any = None   # what joining tasks restore from (`_join`)
        # Regional restarts (`_restart_region`): which tasks a failure restarts (the
        # failover strategy), the channel positions its line resumes from, and how
        # many regional restarts the job made (the incarnation of every task, which
        # a regional restart bumps for those it rebuilds, is the deployment's).
        self.failover = failover_strategy(config.failover, protocol.restart_scope,
                                          self.recovery)
        self.regional = self.failover.partial
        self._resume: dict[int, int] = {}
        self._retake: tuple[int, ...] = ()  # checkpoints joining sources take again
        self.region_restarts = 0
        # a failure interrupted a regional restart: the next recovery is of the job
        self._region_broken = False
        # Adaptive buffering (Su & Zhou; `bastion.runtime.buffering`): on from a
        # burst's detection to the next checkpoint that completes once every lost
        # task runs again
        self.buffering = AdaptiveBuffering(self.failover.adaptive_buffering, deployment,
                                           config.job_id, record_event)
        # the tasks that restarted at the last failure: only they can be pending
        self.restarting: set[int] = set(range(len(plan.tasks)))
        self._planned_free = 0  # free task slots left after the last placement
        self.planner: RecoveryPlanner = BlockingRecovery()  # of the last failure
        # Workers hosting only recovering tasks run at the OS's lowest CPU priority
        # while those catch up (`bastion.runtime.catchup`)
        self.lowering = CatchUpLowering(self.recovery.catch_up(), deployment, stage,
                                        queries, record_event)
        # tasks being built and restored on their workers (`_join`): not running yet
        self._joining: set[int] = set()
        self.repaired_at_s: dict[int, float] = {}  # slot -> when its crash is repaired
        self._channels = {c.channel_id: (c.src_task, t.task_id)   # channel -> (from, to)
                          for t in plan.tasks for c in t.inputs}
        # a restart's new standby waits until the sources caught up (`after_poll`)
        self.standby_after_catch_up = False

    # -- what the job master asks around its phases --------------------------------------

    async def before_deploy(self, restore: Any) -> None:
        """A deploy of the whole job from ``restore`` follows: no task joins any more,
        every worker resets (its CPU priority with it) and takes adaptive buffering as
        it is now."""
        self._restore, self._resume, self._retake = restore, {}, ()
        self.lowering.clear()
        await self.buffering.tell_new(self.deployment.workers)

    def down_tasks(self) -> set[int]:
        """The tasks that do not run now: waiting for capacity, or being built and
        restored to join."""
        return self.deployment.pending | self._joining

    async def after_poll(self, poll: Poll, replies: list, asked_s: float,
                         elapsed_s: float | None) -> None:
        """A recovery's follow-ups to a progress poll asked at ``asked_s``
        (``elapsed_s`` after the one before): the standby a restart deferred, once
        the sources caught up, and the priority of workers lowered while their tasks
        caught up."""
        lease = self.deployment.lease
        if (self.standby_after_catch_up and poll.complete and elapsed_s is not None
                and caught_up(poll.source_lag, poll.source_records, elapsed_s,
                              self.config.progress_interval_s)):
            self.standby_after_catch_up = False
            if lease.standby is None and self.protocol.needs_standby:
                self.record_event("standby_borrowed", source_lag=poll.source_lag)
            lease.borrow_standby()
        if self.lowering:
            await self.lowering.restore(
                None if any(isinstance(r, BaseException) for r in replies)
                # no reply is an exception here
                else set().union(*[r.get("replaying", ()) for r in replies]), asked_s)

    # -- watch, and recover --------------------------------------------------------------

    async def watch(self, job_error_set: asyncio.Future) -> None:
        """Return when every task finished; raise `Failure` on the first failure — a
        worker's task failed or its process died, a heartbeat went unanswered, tasks
        waited for capacity in vain, or ``job_error_set`` is done (an error ended the
        job: `job_error`). Tasks waiting for capacity join as it arrives."""
        deployment = self.deployment
        attempt = self.stage.attempt
        # each wait covers the tasks its worker ran when it was asked: tasks that
        # join later get a wait of their own
        waits = {asyncio.ensure_future(w.wait.remote(deployment.epoch(attempt))):
                 (i, deployment.tasks_on(i)) for i, w in enumerate(deployment.workers)}
        heartbeats = asyncio.ensure_future(detector.watch_heartbeats(
            lambda: deployment.workers, self.config.heartbeat_timeout_s))
        ended = asyncio.ensure_future(asyncio.shield(job_error_set))
        helpers: list[asyncio.Future] = [heartbeats, ended]
        pending = set(waits) | {heartbeats, ended}
        # Tasks waiting for capacity join the attempt as it arrives (`_bring_back`).
        capacity = None
        if deployment.pending:
            capacity = asyncio.ensure_future(self._capacity_arrived())
            helpers.append(capacity)
            pending.add(capacity)
        try:
            while any(f in pending for f in waits) or deployment.pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    if fut is ended:
                        raise Failure(str(self.job_error()), fatal=True)
                    if capacity is not None and fut is capacity:
                        fut.result()  # raises when the wait for capacity timed out
                        for w in await self._bring_back():
                            joined = asyncio.ensure_future(deployment.workers[w].wait.remote(
                                deployment.epoch(attempt)))
                            waits[joined] = (w, deployment.tasks_on(w))
                            pending.add(joined)
                        if deployment.pending:
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
                    self.stage.finished_tasks |= {t.task_id for t in waits[fut][1]}
            # every task finished: no replay is left (a last progress poll may time
            # out on workers busy finishing)
            await self.lowering.restore(set(), time.time())
        finally:
            for fut in list(waits) + helpers:
                fut.cancel()

    async def recover(self, failure: Failure) -> tuple[Any, bool]:
        """After ``failure``: replace what was lost and return the recovery line the
        next attempt restores from, and whether every task restarts from it — False
        when only the failed region restarted, and the job runs on (`_restart_region`);
        raise `JobEnded` when the job cannot go on."""
        deployment = self.deployment
        unfinished = self.coordinator.checkpoint_in_progress()
        self.standby_after_catch_up = False   # the next restart decides again
        # A loss of workers — also one while tasks of an earlier failure wait for
        # capacity (a second wave: `_rebuild_region` plans it with them): the failed
        # region may restart alone, so the coordinator goes on with the job's
        # checkpoints. Why not, when it restarts the job instead (an event says so).
        regional = (self.regional and failure.udf is None
                    and not failure.fatal and failure.blob is None)
        whole_because = None
        if regional and self.stage.phase in ("spawn", "deploy", "start"):
            # The attempt's tasks had not all started (a loss while a restart of the
            # job deploys them): no task runs on outside a region, so the job
            # restarts whole. Restarting the region alone left the tasks deployed
            # outside it never started, and the job waited for them for ever.
            regional = False
            whole_because = (f"a failure came during {self.stage.phase}, before every task of "
                             "the attempt ran: no task runs on outside a region, so every "
                             "task restarts")
        elif regional and self._region_broken:
            regional = False
            whole_because = ("a failure came while a regional restart was rebuilding its "
                             "region: its tasks are half restored, so every task restarts")
        elif not self.regional and deployment.pending:
            whole_because = (f"the failover strategy {self.failover.name} restarts every "
                             f"task (protocol {self.protocol.name!r} cannot restart a region "
                             "under a capacity model)")
        self._region_broken = False
        if not regional:
            await self.coordinator.stop()
        if self.job_error() is not None:
            raise JobEnded({"failure": self.job_error()})
        if failure.udf is not None:
            raise JobEnded({"failure": failure.udf})
        if failure.fatal:
            raise JobEnded({"failure": failure.reason})
        if failure.blob is not None:
            return await self._exclude_checkpoint(failure), True
        self.record_event("failure_detected", reason=failure.reason, worker=failure.worker,
                          checkpoint_in_progress=unfinished)
        if self.stage.attempt + self.region_restarts >= self.config.max_restarts:
            raise JobEnded({"failure": f"{failure.reason} (gave up after "
                                        f"{self.config.max_restarts} restarts)"})
        self.stage.phase = "recover"
        try:
            lost = (await self._lost_workers(failure) if self.config.recovery is None
                    else await self._collect_losses(failure))
            if regional:
                # the tasks outside the region run on meanwhile: their progress too
                polling = asyncio.ensure_future(self.poll_progress())
                try:
                    whole_because = await self._restart_region(lost)
                finally:
                    await cancel(polling)
                if whole_because is None:
                    return self._restore, False
                await self.coordinator.stop()
            if whole_because is not None and (self.failover.adaptive_buffering
                                              or deployment.pending):
                self.record_event("whole_restart", reason=whole_because,
                                  second_wave=bool(deployment.pending),
                                  pending=sorted(deployment.pending))
            if self.config.recovery is None:
                await self._replace_workers(failure, lost)
            else:
                await self._recover_with_policy(failure, lost)
        except RecoveryPlanError as exc:
            raise JobEnded({"failure": str(exc)}) from None
        restore = await self._recovery_line()
        self.stage.attempt += 1
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
            raise JobEnded({"failure": failure.reason})
        self.unusable[checkpoint] = f"{blob.key}: {blob.reason}"
        self.record_event("checkpoint_unusable", checkpoint=checkpoint, key=blob.key,
                          reason=blob.reason)
        self.coordinator.exclude(checkpoint)
        self.stage.phase = "recover"
        restore = await self._recovery_line()
        self.stage.attempt += 1
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
                         else f"checkpoint {line_summary(restore)}")
                raise JobEnded({"failure": NoUsableCheckpointError(
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

    async def _replace_workers(self, failure: Failure, lost: list[int] | None = None) -> None:
        """Without a capacity model: replace every dead worker at once (`_refill`)
        and restart every slot (the survivors are reset by the next deploy). A new
        standby is only started once the job runs again (`WorkerLease.ensure_standby`):
        starting a process costs a core for about a second, which the restart needs
        more."""
        deployment = self.deployment
        alive = await asyncio.gather(*[detector.answers(w, self.config.heartbeat_timeout_s)
                                       for w in deployment.workers])
        lost = sorted(set(lost or []) | {i for i, ok in enumerate(alive)
                                         if not ok or i == failure.worker})
        await self._refill(lost, restart=list(range(len(deployment.workers))))
        # a worker that dies meanwhile fails the deploy, which starts another recovery
        await asyncio.gather(*[w.ping.remote() for w in deployment.workers],
                             return_exceptions=True)

    async def _refill(self, lost: list[int], restart: list[int]) -> None:
        """Without a capacity model: the ``lost`` slots get new workers in place, each
        bound to its slot — the standby (when it is alive and idle) takes the first,
        so a restart costs a deploy and not a process start, fresh workers the
        others; every task keeps its slot. ``restart``: the slots whose tasks
        restart (for the event)."""
        deployment = self.deployment
        lease = deployment.lease
        await lease.standby_lent()
        standby_alive = lease.standby is not None and await detector.answers(
            lease.standby, self.config.heartbeat_timeout_s)
        if not standby_alive:
            lease.drop_standby()  # lost with the others (a node)
        to_standby, to_fresh = replacement_slots(lost, standby_alive)
        self.record_event("recovery_planned", lost=lost, to_standby=list(to_standby),
                          to_fresh=list(to_fresh), restart=restart)
        for i in lost:
            ray.kill(deployment.workers[i], no_restart=True)
        await self._await_repairs(lost)
        for i in to_standby:
            deployment.workers[i] = await lease.bind_standby(i)
        for i, worker in zip(to_fresh, await lease.borrow(list(to_fresh))):
            deployment.workers[i] = worker
        # Only the new workers' nodes are news; their frame addresses are asked now,
        # in the same round trip, for the deploy that follows (`Deployment.peers`).
        new = [deployment.workers[i] for i in lost]
        nodes, _ = await asyncio.gather(lease.nodes_of(new), deployment.peers(),
                                        return_exceptions=True)
        if isinstance(nodes, BaseException):
            raise nodes
        for i, node in zip(lost, nodes):
            deployment.worker_nodes[i] = node

    async def _lost_workers(self, failure: Failure) -> list[int]:
        alive = await asyncio.gather(*[detector.answers(w, self.config.heartbeat_timeout_s)
                                       for w in self.deployment.workers])
        return [i for i, ok in enumerate(alive) if not ok or i == failure.worker]

    async def _collect_losses(self, failure: Failure) -> list[int]:
        """The workers one failure took down: while the burst window that its first
        loss opened is open and the losses are fewer than a burst, look again — a
        correlated failure is planned as one (`detector.CorrelatedFailures`)."""
        self.bursts.clear()
        while True:
            lost = await self._lost_workers(failure)
            live = set(placement.live_nodes()) - self.lost_nodes
            nodes = self.deployment.worker_nodes
            self.bursts.add(time.time(), [
                f"node {nodes[i]}" if nodes[i] not in live
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
                          recover=list(plan.recover), pending=sorted(self.deployment.pending),
                          queries=list(plan.queries), planner=type(self.planner).__name__,
                          free_task_slots=self._planned_free)
        # every task restores the line: with buffering on, each backs up from there
        await self.buffering.after_plan(self.restarting, self.bursts.correlated())

    async def _restart_region(self, lost: list[int]) -> str | None:
        """Restart only the failed region: the tasks of the ``lost`` workers and those
        the failover strategy restarts with them (`bastion.scheduler.failover`), from
        the coordinator's `region_line`; every other task keeps running. None when it
        did; else why it cannot — the protocol cannot restart a region now, or the
        region is the whole job: the job then restarts whole (the ``lost`` workers may
        be dead by then).

        Under adaptive buffering the region also holds every sender into it whose
        upstream backup does not hold what it sent since the line
        (`AdaptiveBuffering.backed_up`).
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
        deployment = self.deployment
        if self.plan.topology.has_feedback():
            # Loops end when every frame sent on every channel was processed
            # (`_check_loops`): a restarted receiver counts afresh what its senders
            # kept counting, so the counts would never meet again.
            return ("the topology has a feedback edge: a restarted region would count "
                    "its loops' frames afresh, so no region restarts alone")
        lost_tasks = {t for t, w in enumerate(deployment.assignment) if w in lost}
        graph = TaskGraph(frozenset(range(len(self.plan.tasks))),
                          self._channels,
                          frozenset(self.buffering.backed_up)
                          if self.failover.adaptive_buffering
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
            ray.kill(deployment.workers[i], no_restart=True)
        dead = await asyncio.gather(*[detector.confirmed_dead(
            deployment.workers[i], self.config.heartbeat_timeout_s * 5) for i in lost])
        if not all(dead):
            return (f"lost worker(s) {[i for i, d in zip(lost, dead) if not d]} were not "
                    f"confirmed dead within {self.config.heartbeat_timeout_s * 5:g} s: a "
                    "checkpoint blob one stored late could replace its successor's")
        line = await self.coordinator.region_line(region)
        if line is None:
            return ("no checkpoint has completed in this attempt yet, so there is no line "
                    "a region can restore alone"
                    + (" (a checkpoint needs every task, and tasks "
                       f"{sorted(deployment.pending)} wait for capacity)"
                       if deployment.pending else ""))
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
        deployment = self.deployment
        # Tasks an earlier failure left waiting for capacity: this is a second wave,
        # planned with them (they never ran since, so nothing they fed restarts).
        waiting = set(deployment.pending)
        for t in region:
            deployment.incarnations[t] += 1
        epoch = deployment.epoch(self.stage.attempt)
        # The survivors stop the region's tasks while the lost slots are refilled
        # (no capacity model: in place, the standby first) — two round trips in one.
        stopping = asyncio.gather(*[w.restart_region.remote(epoch, sorted(region))
                                    for i, w in enumerate(deployment.workers) if i not in lost],
                                  return_exceptions=True)  # a death is the detector's
        self.stage.finished_tasks -= region
        # only these may be left pending: a task an earlier restart brought back runs
        self.restarting = region | waiting
        self._restore, self._resume, self._retake = line, line.resume, line.retake
        if not self.capacity_model:
            await asyncio.gather(stopping, self._refill(
                lost, restart=sorted({deployment.home(t) for t in region})))
        else:
            await stopping
            # the planner is asked with every task without a worker: those lost now
            # and those still waiting since an earlier failure
            unplaced = await self._drop_workers(lost)
            plan = await self._place(unplaced, self.planner)
            deployment.pending &= self.restarting  # a task outside them never stopped
            self.record_event("recovery_planned", lost=lost, lost_tasks=sorted(lost_tasks),
                              region=sorted(region), recover=list(plan.recover),
                              pending=sorted(deployment.pending), queries=list(plan.queries),
                              planner=type(self.planner).__name__,
                              free_task_slots=self._planned_free,
                              second_wave=bool(waiting), waiting=sorted(waiting))
            await self.buffering.after_plan(region, self.bursts.correlated())
        await self._join(sorted(self.restarting - deployment.pending))
        if not self.capacity_model:
            # The standby went to a lost slot: a new one once the region caught up —
            # not before it joined (the tasks outside it may look caught up at once),
            # or the process start would take the cores the restart needs.
            self.standby_after_catch_up = True
        self.record_event("restarted", attempt=self.stage.attempt,
                          checkpoint=line_summary(line.line),
                          region=sorted(region), tasks=deployment.task_names(region))

    async def _drop_workers(self, lost: list[int]) -> list[int]:
        """Kill the ``lost`` workers (and the standby) and forget them; the tasks they
        ran, now without a worker. Picks the planner of this failure."""
        deployment = self.deployment
        await deployment.lease.standby_lent()
        deployment.lease.drop_standby()  # a warm process is not capacity: let it go
        lost_tasks = deployment.drop_workers(lost)
        # The planner of this failure plans it to its end (`_bring_back` too). A loss
        # while tasks of a correlated failure still wait for capacity is part of
        # recovering that failure: its planner goes on (a blocking plan would hold
        # back queries it had promised to bring back as capacity arrives).
        still_recovering = bool(deployment.pending) and not isinstance(self.planner,
                                                                       BlockingRecovery)
        self.planner = (self.recovery.planner()
                        if self.bursts.correlated() or still_recovering
                        else BlockingRecovery())
        return lost_tasks

    def _free_slots(self) -> dict[str, int]:
        """Free task slots per live node that no fault took down."""
        per_cpu = self.recovery.task_slots_per_cpu
        used: dict[str | None, int] = {}
        for w in self.deployment.assignment:
            if w is not None:
                node = self.deployment.worker_nodes[w]
                used[node] = used.get(node, 0) + 1
        return {n["NodeID"]: max(0, math.floor(n["Resources"].get("CPU", 0) * per_cpu)
                                 - used.get(n["NodeID"], 0))
                for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in self.lost_nodes}

    async def _place(self, unplaced: list[int], planner: RecoveryPlanner) -> Any:
        """Ask ``planner`` which of the ``unplaced`` tasks run again on the free
        slots, start a worker on each node they go to, and work out which tasks are
        pending: those no available query needs."""
        deployment = self.deployment
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
        await deployment.add_workers(placed)
        self._planned_free = free_task_slots - len(plan.recover)
        running = set().union(*[q.tasks for q in self.queries
                                if all(deployment.assignment[t] is not None for t in q.tasks)])
        # a task outside the restart (a regional one) runs on, whatever its queries
        deployment.pending = (set(range(len(self.plan.tasks))) - running) & self.restarting
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
                unplaced = sum(w is None for w in self.deployment.assignment)
                raise Failure(
                    f"{unplaced} task(s) lost with their node waited "
                    f"{self.recovery.capacity_timeout_s:g} s for task slots that never came "
                    f"({self._planned_free} free): add nodes to the cluster, or raise "
                    "RecoveryPolicy.task_slots_per_cpu", fatal=True)

    async def _bring_back(self) -> list[int]:
        """Capacity arrived: plan again, and let the tasks that can run join the
        running attempt — restored from its recovery line, fed what their upstream
        held for them. The workers that got tasks."""
        deployment = self.deployment
        before = set(deployment.pending)
        unplaced = sorted(t for t, w in enumerate(deployment.assignment) if w is None)
        plan = await self._place(unplaced, self.planner)
        joining = sorted(before - deployment.pending)
        if not joining:
            return []
        self.record_event("recovery_progressed", recover=list(plan.recover),
                          joining=joining, queries=list(plan.queries),
                          pending=sorted(deployment.pending))
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
        deployment = self.deployment
        epoch = deployment.epoch(self.stage.attempt)
        peers = await deployment.peers()
        assignment = deployment.running_assignment()
        by_worker: dict[int, list[int]] = {}
        for t in joining:
            by_worker.setdefault(deployment.home(t), []).append(t)
        # lowered before they build and restore their tasks: that is catch-up work too
        lowered = await self.lowering.lower(set(joining), list(by_worker), self.restarting)
        await self.buffering.tell_new([deployment.workers[w] for w in by_worker])
        try:
            deployment.raise_call_failures(await asyncio.gather(*[
                deployment.workers[w].join.remote(
                    epoch, self.plan, peers, self._restore, assignment, tasks,
                    deployment.incarnations) for w, tasks in by_worker.items()],
                return_exceptions=True))
            # Triggered once built and before they start, in order: a checkpoint the
            # trigger loop starts from now on comes after these at every source.
            checkpoint = self.coordinator.checkpoint_in_progress()
            retake = [*self._retake, *([checkpoint] if checkpoint is not None
                                       and checkpoint not in self._retake else [])]
            if self.regional:
                for w, tasks in by_worker.items():
                    sources = [t for t in tasks if t in deployment.source_tasks]
                    for checkpoint_id in retake if sources else ():
                        deployment.workers[w].trigger_checkpoint.remote(epoch, sources,
                                                                       checkpoint_id)
            deployment.raise_call_failures(await asyncio.gather(
                *[w.attach.remote(epoch, self.plan, peers, assignment, self._resume,
                                  deployment.incarnations) for w in deployment.workers],
                return_exceptions=True))
        except BaseException:
            self.lowering.abandon(lowered)  # a failure: nothing is catching up
            raise
        # watched from now on: the replays into them have started, and a progress
        # poll asked after this moment sees them
        self.lowering.watched(lowered, time.time())
        return sorted(by_worker)

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """A checkpoint completed: adaptive buffering may turn off, if every lost task
        runs again (`AdaptiveBuffering.checkpoint_completed`)."""
        deployment = self.deployment
        self.buffering.checkpoint_completed(
            checkpoint_id, all_running=not (deployment.pending or self._joining
                                            or self.stage.phase != "watch"
                                            or any(w is None for w in deployment.assignment)))

    def node_lost(self, node_id: str) -> None:
        """A fault took node ``node_id`` down: it offers no capacity any more."""
        self.lost_nodes.add(node_id)

    def under_repair(self, names: list[str], until_s: float) -> None:
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
