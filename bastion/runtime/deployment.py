"""Deployment: which worker runs which task, and the calls that put a plan on them.

A physical plan (`bastion.runtime.plan`) names *slots*: task *t* runs on the worker of
slot ``plan.tasks[t].worker``. Deploying it takes four steps, each a round of calls
to every worker:

1. **spawn** — borrow one worker per slot from the pool (`WorkerLease`, on the node
   placement names) and the standby, and wait until each answers;
2. **peers** — ask every worker its frame address (`WorkerLease.frame_addresses`):
   tasks on different workers exchange frames over direct TCP links, so each
   worker must know where the others listen;
3. **deploy** — give every worker the plan, the peers, the attempt, the recovery line
   to restore, its slot and the *assignment* (task → worker); each builds its tasks
   and channels;
4. **start** — tasks start their loops.

`Deployment` owns the state those steps read and a recovery rewrites: the workers by
slot and their nodes, the assignment (None for a task lost with its worker and not
placed again yet), the *pending* tasks (placed nowhere: they wait for capacity), and
the *incarnation* of every task (a regional restart rebuilds a task under a new one,
so frames and acknowledgments of the old one are dropped). Every call carries an
*epoch* — the job's id and the attempt — which a worker checks, so a call of an
attempt that ended is ignored: a worker outlives its job, and may already serve the
next.

Deployment only carries out: *where* tasks go after a failure is the recovery
planner's (`bastion.scheduler.recovery`) and the failure handler's
(`bastion.runtime.failures`), which rewrite the assignment through `drop_workers` and
`add_workers`; *when* to deploy is the job master's (`bastion.runtime.job`).

`JobStage` is the little state all the job master's owners share: the phase the job
is in (a worker's failure is reported with it), the attempt, and the tasks that
finished in it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import ray

from bastion.runtime.config import JobConfig
from bastion.runtime.lease import WorkerLease
from bastion.runtime.plan import PhysicalPlan
from bastion.scheduler import detector


@dataclass
class JobStage:
    """Where one job is: its phase (``created``, ``spawn``, ``deploy``, ``start``,
    ``watch``, ``recover``, ``collect``, ``commit``, ``done``), the attempt running
    (a restart of the whole job starts the next), and the tasks that finished in it.
    The job master moves it on; its owners read it, and the failure handler moves
    the attempt and the phase ``recover``."""

    phase: str = "created"
    attempt: int = 0
    finished_tasks: set[int] = field(default_factory=set)


class Deployment:
    """The workers of one job by slot, the task → worker assignment, and the rounds
    of calls that deploy and start the plan on them."""

    def __init__(self, plan: PhysicalPlan, config: JobConfig, lease: WorkerLease,
                 stage: JobStage):
        self.plan = plan
        self.config = config
        self.lease = lease
        self.stage = stage
        self.workers: list = []   # the worker of each slot
        self.worker_nodes: list[str | None] = []  # the node of each of self.workers
        self.assignment: list[int | None] = [t.worker for t in plan.tasks]  # home worker
        # tasks no worker runs: lost, and waiting for capacity (`bastion.runtime.failures`)
        self.pending: set[int] = set()
        self.incarnations = [0] * len(plan.tasks)
        self.source_tasks = {t.task_id for t in plan.tasks
                             if plan.topology.nodes[plan.chains[t.chain_id].ops[0]].kind
                             == "source"}

    # -- who runs what -----------------------------------------------------------------

    def epoch(self, attempt: int) -> tuple[str, int]:
        """What a worker checks a call against: this job's id and the attempt."""
        return (self.config.job_id, attempt)

    def home(self, task_id: int) -> int:
        """The worker of a task that is placed (it runs, or restarts where it ran)."""
        worker = self.assignment[task_id]
        assert worker is not None, f"task {task_id} is not placed"
        return worker

    def tasks_on(self, worker: int) -> list[Any]:
        """The tasks worker ``worker`` runs now (pending ones excluded)."""
        return [self.plan.tasks[t] for t, w in enumerate(self.assignment)
                if w == worker and t not in self.pending]

    def running_assignment(self) -> list[int | None]:
        """The worker of every task that runs; None for a pending one."""
        return [None if t in self.pending else w for t, w in enumerate(self.assignment)]

    def task_names(self, task_ids: Iterable[int]) -> list[str]:
        """The operator instances the tasks ``task_ids`` run, as ``op[index]``, in
        plan order (a chained task runs several operators)."""
        plan = self.plan
        return [f"{op}[{plan.tasks[t].index}]" for t in sorted(task_ids)
                for op in plan.chains[plan.tasks[t].chain_id].ops]

    def sinks_of(self, slots: list[int]) -> list[str]:
        """The sink instances the workers of ``slots`` run, as ``'name' [index]``."""
        plan = self.plan
        return [f"{op!r} [{t.index}]" for slot in slots for t in self.tasks_on(slot)
                for op in plan.chains[t.chain_id].ops
                if plan.topology.nodes[op].kind == "sink"]

    def victims(self) -> dict[str, Any]:
        """The job's processes a kill may take down, by name: the worker of every slot
        and the standby."""
        named = {f"worker {i}": w for i, w in enumerate(self.workers)}
        if self.lease.standby is not None:
            named["standby"] = self.lease.standby
        return named

    def raise_call_failures(self, outcomes: list) -> None:
        """Raise the most urgent failure among the workers' ``outcomes`` of a call:
        a worker may die here too (a second fault during a recovery): a death is
        recovered first, then a damaged checkpoint; anything else ends the job."""
        failures = [detector.call_failure(self.stage.phase, i, exc)
                    for i, exc in enumerate(outcomes) if isinstance(exc, Exception)]
        if failures:
            raise min(failures, key=lambda f: (f.fatal, f.blob is not None))

    # -- the rounds of a deployment ----------------------------------------------------

    async def spawn(self) -> float:
        """Borrow every slot's worker and the standby; the seconds it took."""
        self.stage.phase = "spawn"
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

    async def peers(self) -> list[tuple[str, int]]:
        """Every worker's frame address, by slot (`WorkerLease.frame_addresses`). A
        worker that died meanwhile is a failure (the job master recovers from it)."""
        addresses = await self.lease.frame_addresses(self.workers)
        self.raise_call_failures(addresses)
        return addresses

    async def deploy(self, restore: Any, peers: list[tuple[str, int]]) -> None:
        """Every worker builds this attempt's tasks, restored from ``restore``."""
        assignment = self.running_assignment()
        outcomes = await asyncio.gather(*[w.deploy.remote(self.plan, peers,
                                                          self.stage.attempt, restore, i,
                                                          assignment, self.incarnations)
                                          for i, w in enumerate(self.workers)],
                                        return_exceptions=True)
        self.raise_call_failures(outcomes)

    async def start(self) -> float:
        """Every worker starts its tasks; when the last one began running, on this
        clock."""
        sent_s = time.time()
        try:
            began_s = await asyncio.gather(*[w.start.remote() for w in self.workers])
        except ray.exceptions.RayActorError as exc:
            raise detector.died_during(self.stage.phase, exc) from None
        # the last worker's tasks began then; kept within the call's span, on this
        # clock, should a worker's host clock be off
        return min(max(max(began_s, default=sent_s), sent_s), time.time())

    # -- a recovery rewrites the assignment (`bastion.runtime.failures`) ----------------

    def drop_workers(self, lost: list[int]) -> list[int]:
        """Kill the ``lost`` workers and forget them: the slots after them move down,
        and the tasks they ran have no worker any more. Those tasks (with any that
        had none already)."""
        for i in lost:
            ray.kill(self.workers[i], no_restart=True)
        keep = [i for i in range(len(self.workers)) if i not in lost]
        index = {old: new for new, old in enumerate(keep)}
        self.workers = [self.workers[i] for i in keep]
        self.worker_nodes = [self.worker_nodes[i] for i in keep]
        lost_tasks = sorted(t for t, w in enumerate(self.assignment) if w is None or w in lost)
        self.assignment = [None if w is None or w in lost else index[w]
                           for w in self.assignment]
        return lost_tasks

    async def add_workers(self, placed: dict[str, list[int]]) -> None:
        """Borrow one new worker on each node of ``placed`` and assign it the tasks
        placed there; they get the slots after the last one."""
        nodes = sorted(placed)
        first = len(self.workers)
        workers = await self.lease.borrow(list(range(first, first + len(nodes))), nodes)
        for offset, (node, worker) in enumerate(zip(nodes, workers)):
            self.workers.append(worker)
            self.worker_nodes.append(node)
            for task in placed[node]:
                self.assignment[task] = first + offset

    # -- calls to every worker of the running attempt ------------------------------------

    def trigger_sources(self, attempt: int, checkpoint_id: int) -> list[Any]:
        """The running sources of ``attempt`` take checkpoint ``checkpoint_id``; per
        worker, the reply: those of its sources that had finished."""
        by_worker: dict[int, list[int]] = {}
        for task_id in self.source_tasks - self.pending:
            worker = self.assignment[task_id]
            if worker is None:
                continue  # lost, not placed yet (a regional restart): triggered when it joins
            by_worker.setdefault(worker, []).append(task_id)
        return [self.workers[w].trigger_checkpoint.remote(self.epoch(attempt), task_ids,
                                                          checkpoint_id)
                for w, task_ids in by_worker.items()]

    def trim_upstream_backups(self, below: dict[int, int]) -> None:
        """Every worker's upstream backups forget the frames below ``below``; a
        worker that misses it holds more."""
        epoch = self.epoch(self.stage.attempt)
        for worker in self.workers:
            worker.trim_upstream_backups.remote(epoch, below)

    def send_redundancy(self, ratio: float) -> None:
        """Every worker sends redundant copies at ``ratio`` from now on."""
        epoch = self.epoch(self.stage.attempt)
        for w in self.workers:
            w.set_redundancy.remote(epoch, ratio)

    def finish_loops(self, heads: list[int]) -> None:
        """The loop heads ``heads`` finish: nothing circulates in their loops any more."""
        by_worker: dict[int, list[int]] = {}
        for t in heads:
            by_worker.setdefault(self.home(t), []).append(t)
        for w, task_ids in by_worker.items():
            self.workers[w].finish_loops.remote(self.epoch(self.stage.attempt), task_ids)

    async def stop_sources(self, savepoint_stop: bool = False) -> None:
        """Every source stops reading (an unbounded input's ``duration_s`` is over;
        ``savepoint_stop``: the job stops with a savepoint, `bastion.runtime.savepoint`)."""
        epoch = self.epoch(self.stage.attempt)
        await asyncio.gather(*[w.stop_sources.remote(epoch, savepoint_stop)
                               for w in self.workers], return_exceptions=True)
