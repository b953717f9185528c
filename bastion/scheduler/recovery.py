"""Recovery planning: after a failure, which lost tasks get capacity, and when.

A failure takes task instances down with the workers (or whole nodes) they ran on.
The job rolls back to the protocol's recovery line — the failed region only, or every
running task: see "which tasks restart" below; what a planner decides is which lost
tasks run again *now* and on which capacity.

**Capacity.** With no capacity model (the default, `RecoveryPolicy.task_slots_per_cpu`
None), a replacement worker can start on any live node at once: the standby takes the
first lost slot, fresh workers the others, all at once — `BlockingRecovery`, as every
earlier version of Bastion recovered. With a capacity model, every live node offers
``CPUs × task_slots_per_cpu`` task slots (Flink's task slots), each task occupies one,
and a node that was lost offers none: the lost tasks of a node loss wait for capacity
to *arrive* — nodes joining the cluster (the autoscaler, an operator adding machines;
in drills `bastion.faults.AddNode`). The planner is asked again each time a node joins.

**Queries.** A topology names queries (`Topology.query(name, outputs, priority)`; a
sink not in any query is a query of its own, priority 1). A query *needs* every task of
every operator upstream of its outputs; a query is *hit* by a failure when it needs a
lost task, and *available* when every task it needs runs.

Two planners (Su & Zhou, "progressive recovery of correlated failures"):

- `BlockingRecovery` (operator-centric, the paper's OPC): wait until the capacity at
  hand fits *every* lost task, then recover them all at once;
- `ProgressiveRecovery` (the paper's PRG): recover whole queries as capacity arrives,
  by *profit density* — a query's priority over the task slots it still needs, a task
  needed by several hit queries counting for each as its share (``1 / f``):
  ``PD = priority / Σ 1/f_k`` over its lost tasks. The densest query whose remaining
  need fits the free slots is taken, its tasks count as recovered for the others, the
  densities are computed again, until nothing more fits. Tasks needed by no available
  query stay *pending*: not running, their inputs kept upstream until a later plan
  brings them back.

**Adaptive buffering** (Su & Zhou §4). A pending task recovered later, or a task a
later failure restores from the same checkpoint, needs what its upstream sent since
that checkpoint: an *upstream backup* (`bastion.runtime.channel.ReplayableOutputChannel`).
Keeping one on every channel at all times ("upstream buffering") costs memory and
store writes in normal operation, which the paper rejects; so, under a capacity model:

- in normal operation only source tasks keep one (the paper's source buffering: what
  they sent since the last completed checkpoint, trimmed as checkpoints complete);
- when the detector declares a burst (`bastion.scheduler.detector.CorrelatedFailures`),
  or a plan leaves tasks pending, every task that is not a source starts keeping one,
  and the tasks the recovery restores from the checkpoint keep everything they send
  from it on — so pending tasks recovered later are fed from their upstream's backup;
- the first checkpoint that completes once every lost task runs again turns it off:
  every backup but the sources' is freed. (A checkpoint needs every task, so none
  completes while tasks are pending.)

The ``adaptive_buffering`` events of a run say when it turned on and off and the
bytes it freed; each task's report counts the frames and bytes its backups ever kept
(``backup_frames_logged``, ``backup_bytes_logged``) and keep now (``backup_bytes_kept``).

**Which tasks restart** is the failover strategy's answer
(`bastion.scheduler.failover`). Under a capacity model and a protocol that can
restart a subset of tasks (``coordinated``) it is `RestartDownstream`: the lost tasks
and every task downstream of them, to the sinks — and, since a backup is kept only by
the senders above, every sender into that region that keeps no backup since the
checkpoint, with everything downstream of it, until every sender into the region is
backed up. A single failure in normal operation (no burst) therefore restarts the
failed tasks' upstream up to, not including, the source tasks, and all that is
downstream of it: fed again from the sources' backups (before adaptive buffering, it
restarted only the failed tasks' downstream, fed from backups kept on every channel).
Every other task keeps running — the queries the failure did not hit never stop —
since nothing it received came from the region. The region's tasks restore the
protocol's `region_line` (the last completed checkpoint and where it cut each
channel), each with a new *incarnation* (frames and acknowledgments addressed to the
one before are dropped), and the senders at the region's boundary send again, out of
their backup, everything the restored tasks have not seen. The region's sinks discard
what they staged since the checkpoint, as in any restart.

**A second wave** — a loss while tasks are still pending — adds to the plan: its
region restarts as above (the tasks the burst restored log since the checkpoint, so
they feed it; a survivor of the burst logs only since the burst, so the region grows
past it), and the planner is asked again with every task without a worker: the
newly lost ones and those still pending. The paper restores only the newly failed
partitions and has their downstream drop duplicates by sequence number; here their
downstream restarts with them, which needs no deduplication. The whole job restarts
instead — recorded as a ``whole_restart`` event with its reason — only when no region
can restart alone: no checkpoint completed in the running attempt (after an earlier
restart of the whole job none can complete while tasks are pending, since a
checkpoint needs every task), the topology has a feedback edge, a lost worker was not
confirmed dead, a failure came while a region was being rebuilt, or the protocol
restarts whole jobs. Then every running task restarts from the recovery line: the
runtime numbers channel frames by attempt, and the protocol's recovery line rewinds
every task.

Either way a plan that brings pending tasks back later restarts nothing else: the
pending tasks join the attempt that is running, restored from the same line, and
receive what their upstream kept for them — frames delayed (and, into a region,
sent again from where the restored task resumes) — so the outputs stay exactly once.

**Correlated failures.** The failure detector groups losses
(`bastion.scheduler.detector.CorrelatedFailures`): k or more within a window are one
correlated failure, planned at once by the policy's planner; fewer are recovered
blockingly (the paper switches to progressive recovery only for bursts).
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from bastion.scheduler.catchup import CATCH_UP_PRIORITIES, CatchUpPriority, catch_up_priority

RECOVERY_MODES = ("blocking", "progressive")
# Under a capacity model: backups at the sources always and elsewhere during a burst's
# recovery (Su & Zhou), or on every channel at all times (the baseline they reject).
UPSTREAM_BACKUPS = ("adaptive", "always")


@dataclass(frozen=True)
class RecoveryPolicy:
    """How a job recovers from failures (``bn.run(..., recovery=...)``).

    ``mode`` is the planner of correlated failures: ``"blocking"`` or
    ``"progressive"``. ``burst_losses`` losses (a lost node counts once, a lost worker
    on a live node once) within ``burst_window_s`` seconds of the first are one
    correlated failure. ``task_slots_per_cpu`` turns the capacity model on (None: a
    replacement starts at once on any live node). A task waiting for capacity has its
    inputs held upstream: up to ``held_frames_in_memory`` frames per channel in
    memory, the rest spilled to the job's store. A job whose tasks wait longer than
    ``capacity_timeout_s`` for capacity fails, saying how many slots it lacks.
    ``catch_up_priority``: ``"idle"``, while a query the failure did not hit runs,
    runs a worker that hosts only recovering tasks
    at the OS's lowest CPU priority while they catch up, for at most
    ``catch_up_max_s`` (`bastion.scheduler.catchup`); ``"normal"`` never lowers one.
    ``upstream_backups``: ``"adaptive"`` (sources always, other tasks during a burst's
    recovery) or ``"always"`` (every channel at all times: a single failure restarts
    less, at a cost in every failure-free second — the baseline `benchmarks/recovery.py`
    measures adaptive buffering against)."""

    mode: str = "blocking"
    burst_losses: int = 2
    burst_window_s: float = 1.0
    task_slots_per_cpu: float | None = None
    held_frames_in_memory: int = 64
    capacity_timeout_s: float = 300.0
    catch_up_priority: str = "idle"
    catch_up_max_s: float = 5.0
    upstream_backups: str = "adaptive"

    def __post_init__(self) -> None:
        if self.mode not in RECOVERY_MODES:
            raise ValueError(f"RecoveryPolicy.mode must be one of {RECOVERY_MODES}, "
                             f"got {self.mode!r}")
        if isinstance(self.burst_losses, bool) or not isinstance(self.burst_losses, int) \
                or self.burst_losses < 1:
            raise ValueError(f"RecoveryPolicy.burst_losses must be an int >= 1, "
                             f"got {self.burst_losses!r}")
        if self.upstream_backups not in UPSTREAM_BACKUPS:
            raise ValueError(f"RecoveryPolicy.upstream_backups must be one of "
                             f"{UPSTREAM_BACKUPS}, got {self.upstream_backups!r}")
        if self.catch_up_priority not in CATCH_UP_PRIORITIES:
            raise ValueError(f"RecoveryPolicy.catch_up_priority must be one of "
                             f"{CATCH_UP_PRIORITIES}, got {self.catch_up_priority!r}")
        for name in ("burst_window_s", "capacity_timeout_s", "catch_up_max_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"RecoveryPolicy.{name} must be >= 0 seconds, got {value!r}")
        slots = self.task_slots_per_cpu
        if slots is not None and (not isinstance(slots, (int, float)) or not slots > 0):
            raise ValueError(f"RecoveryPolicy.task_slots_per_cpu must be > 0 or None, "
                             f"got {slots!r}")
        if not isinstance(self.held_frames_in_memory, int) or self.held_frames_in_memory < 1:
            raise ValueError(f"RecoveryPolicy.held_frames_in_memory must be an int >= 1, "
                             f"got {self.held_frames_in_memory!r}")

    def planner(self) -> "RecoveryPlanner":
        return ProgressiveRecovery() if self.mode == "progressive" else BlockingRecovery()

    def catch_up(self) -> CatchUpPriority:
        return catch_up_priority(self.catch_up_priority, self.catch_up_max_s)


def recovery_policy(recovery: "str | RecoveryPolicy | None") -> RecoveryPolicy:
    """``bn.run``'s ``recovery`` argument as a policy."""
    if recovery is None:
        return RecoveryPolicy()
    if isinstance(recovery, RecoveryPolicy):
        return recovery
    if isinstance(recovery, str):
        return RecoveryPolicy(mode=recovery)
    raise ValueError(f"recovery must be 'blocking', 'progressive' or a RecoveryPolicy, "
                     f"got {recovery!r}")


@dataclass(frozen=True)
class QueryNeeds:
    """A query, its priority, its outputs (sinks), and the tasks it needs to produce
    output."""

    name: str
    priority: float
    tasks: frozenset[int]
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capacity:
    """How many task slots a recovery can use (None: no capacity model, as many as
    it takes)."""

    free_task_slots: int | None = None


@dataclass(frozen=True)
class RecoveryPlan:
    """What one planning step decided.

    ``recover`` are the lost tasks that run again now (on free capacity);
    ``pending`` those that stay down until capacity arrives; ``queries`` the hit
    queries the plan makes available, in the order it picked them."""

    recover: tuple[int, ...]
    pending: tuple[int, ...]
    queries: tuple[str, ...] = ()


def replacement_slots(lost_slots: Sequence[int], standby: bool
                      ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Without a capacity model, who replaces each lost slot: the standby (when it is
    alive and idle) takes the first — a restart then costs a deploy, not a process
    start — and fresh workers the others. (slots to the standby, slots to fresh)."""
    lost = sorted(set(lost_slots))
    to_standby = tuple(lost[:1]) if standby else ()
    return to_standby, tuple(lost[len(to_standby):])


class RecoveryPlanError(Exception):
    """A planner's plan that the job master cannot carry out (a bug in the planner)."""


def check_plan(plan: RecoveryPlan, lost_tasks: Iterable[int],
               free_task_slots: int | None) -> None:
    """Raise `RecoveryPlanError` unless ``plan`` splits exactly the ``lost_tasks``
    into recovered and pending ones, each once, within the free capacity."""
    lost = sorted(set(lost_tasks))
    decided = sorted(list(plan.recover) + list(plan.pending))
    if decided != lost:
        raise RecoveryPlanError(f"recovery plan {plan} decides on tasks {decided}, but the "
                                f"lost tasks are {lost}: each lost task must be recovered "
                                "or left pending, once")
    if free_task_slots is not None and len(plan.recover) > free_task_slots:
        raise RecoveryPlanError(f"recovery plan {plan} recovers {len(plan.recover)} tasks "
                                f"on {free_task_slots} free task slots")


class RecoveryPlanner(abc.ABC):
    """Decides which lost tasks run again, given the queries and the capacity."""

    @abc.abstractmethod
    def plan(self, lost_tasks: Sequence[int], queries: Sequence[QueryNeeds],
             capacity: Capacity) -> RecoveryPlan:
        """The plan for the lost (or still pending) ``lost_tasks``."""


class BlockingRecovery(RecoveryPlanner):
    """Recover every lost task at once, as soon as the capacity fits them all."""

    def plan(self, lost_tasks: Sequence[int], queries: Sequence[QueryNeeds],
             capacity: Capacity) -> RecoveryPlan:
        lost = tuple(sorted(set(lost_tasks)))
        free = capacity.free_task_slots
        if free is not None and free < len(lost):
            return RecoveryPlan(recover=(), pending=lost)
        hit = tuple(q.name for q in queries if q.tasks & set(lost))
        return RecoveryPlan(recover=lost, pending=(), queries=hit)


class ProgressiveRecovery(RecoveryPlanner):
    """Recover whole queries by profit density as the capacity allows."""

    def plan(self, lost_tasks: Sequence[int], queries: Sequence[QueryNeeds],
             capacity: Capacity) -> RecoveryPlan:
        lost = set(lost_tasks)
        free = math.inf if capacity.free_task_slots is None else capacity.free_task_slots
        recovered: set[int] = set()
        picked: list[str] = []
        hit = [q for q in queries if q.tasks & lost]
        while True:
            waiting = [q for q in hit if q.name not in picked]
            densities = profit_densities(waiting, lost - recovered)
            fitting = [q for q in waiting
                       if len((q.tasks & lost) - recovered) <= free - len(recovered)]
            if not fitting:
                break
            best = max(fitting, key=lambda q: (densities[q.name], q.priority, _neg(q.name)))
            picked.append(best.name)
            recovered |= best.tasks & lost
        return RecoveryPlan(recover=tuple(sorted(recovered)),
                            pending=tuple(sorted(lost - recovered)), queries=tuple(picked))


def _neg(name: str) -> tuple[int, ...]:
    """A key that sorts names in reverse, so `max` breaks ties by the first name."""
    return tuple(-ord(c) for c in name)


def profit_densities(queries: Sequence[QueryNeeds], lost: set[int]) -> dict[str, float]:
    """Each query's priority over the lost task slots it needs, a task needed by ``f``
    of these queries costing each ``1/f`` (shared recovery work is shared). A query
    that needs no lost task has infinite density: it costs nothing."""
    sharing: dict[int, int] = {}
    for q in queries:
        for task in q.tasks & lost:
            sharing[task] = sharing.get(task, 0) + 1
    densities = {}
    for q in queries:
        cost = sum(1.0 / sharing[task] for task in q.tasks & lost)
        densities[q.name] = math.inf if cost == 0 else q.priority / cost
    return densities


def queries_needs(queries: Mapping[str, tuple[float, Iterable[str]]],
                  sinks: Sequence[str], upstream: Mapping[str, Sequence[str]],
                  tasks_of_op: Mapping[str, Sequence[int]]) -> list[QueryNeeds]:
    """The tasks each query needs: every task of every operator upstream of (or
    equal to) its outputs. ``queries`` maps a name to (priority, outputs); a sink in
    no query is a query of its own (priority 1); ``upstream[op]`` lists the operators
    ``op`` reads from; ``tasks_of_op[op]`` the tasks that run ``op``."""
    named = {name: (priority, tuple(outputs)) for name, (priority, outputs) in queries.items()}
    covered = {out for _, outs in named.values() for out in outs}
    for sink in sinks:
        if sink not in covered:
            named[sink] = (1.0, (sink,))
    needs = []
    for name, (priority, outputs) in named.items():
        ops: set[str] = set()
        stack = list(outputs)
        while stack:
            op = stack.pop()
            if op in ops:
                continue
            ops.add(op)
            stack.extend(upstream.get(op, ()))
        tasks = frozenset(t for op in ops for t in tasks_of_op.get(op, ()))
        needs.append(QueryNeeds(name, float(priority), tasks, outputs))
    return needs
