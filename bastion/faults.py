"""Faults: which processes of a job to kill, and when — described, not carried out.

A drill proves a protocol by killing real processes while a job runs. The faults a
user passes to ``bn.run(faults=...)`` or ``bn.drill`` are descriptions, like a
topology: they name *what* to kill and *when* (seconds after the job started) and
import nothing of Ray, so writing them costs nothing and a fault that names no
operator or worker fails before anything is deployed (`validate`). The job master
hands the schedule to the injector (`bastion.scheduler.injector`), which carries each
kill out with ``ray.kill``: that terminates the worker actor's process — every task it
hosts dies with it, as when a machine disappears — and the job master then has to
detect the loss and recover like after any other failure.

- ``KillInstance(op, index, at, during_checkpoint=False)``: the worker hosting
  instance ``index`` of ``op``; with ``during_checkpoint`` the kill waits after ``at``
  until a checkpoint is in progress, to prove an interrupted checkpoint is never used;
- ``KillWorker(worker, at)``: one worker process (a slot) by number;
- ``KillNode(node, at)``: every worker process Ray placed on a node — the job's
  workers and its standby — at once, as when the machine is lost. ``node`` is the
  node's position among the cluster's live nodes sorted by node id (``0`` on a
  single-machine Ray) or its node id (hex);
- ``RandomKills(count, between, seed)``: ``count`` kills of random instances at random
  times in ``between = (first_s, last_s)``, reproducible from ``seed``.

Each fault turns into kills (`ScheduledKill`) against a physical plan (``schedule``):
the schedule the injector follows and a drill compares with what happened.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class ScheduledKill:
    """One kill the injector carries out: a worker slot, or a whole Ray node."""

    at_s: float
    what: str
    worker: int | None = None
    node: int | str | None = None
    during_checkpoint: bool = False


@dataclass(frozen=True)
class KillInstance:
    op: str
    index: int = 0
    at: float = 1.0
    during_checkpoint: bool = False

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        task = plan.task_of(self.op, self.index)
        return [ScheduledKill(self.at, f"kill {self.op}[{self.index}]", worker=task.worker,
                              during_checkpoint=self.during_checkpoint)]


@dataclass(frozen=True)
class KillWorker:
    worker: int
    at: float = 1.0

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        if not 0 <= self.worker < plan.workers:
            raise ValueError(f"KillWorker: worker {self.worker} does not exist "
                             f"(the job has {plan.workers})")
        return [ScheduledKill(self.at, f"kill worker {self.worker}", worker=self.worker)]


@dataclass(frozen=True)
class KillNode:
    node: int | str = 0
    at: float = 1.0

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        if isinstance(self.node, bool) or not isinstance(self.node, (int, str)) or (
                isinstance(self.node, int) and self.node < 0):
            raise ValueError(f"KillNode: node must be a position (0, 1, ...) among the "
                             f"cluster's live nodes or a node id, not {self.node!r}")
        return [ScheduledKill(self.at, f"kill node {self.node}", node=self.node)]


@dataclass(frozen=True)
class RandomKills:
    count: int = 1
    between: tuple[float, float] = (1.0, 3.0)
    seed: int | None = None  # a drill fills in its own seed

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        rng = random.Random(0 if self.seed is None else self.seed)
        instances = [(op, t.index, t.worker) for c in plan.chains for op in c.ops[:1]
                     for t in plan.tasks if t.chain_id == c.chain_id]
        kills = []
        for _ in range(self.count):
            op, index, worker = rng.choice(instances)
            at = round(rng.uniform(*self.between), 3)
            kills.append(ScheduledKill(at, f"kill {op}[{index}]", worker=worker))
        return kills


Fault = KillInstance | KillWorker | KillNode | RandomKills


def validate(faults: Any, plan: Any) -> list[ScheduledKill]:
    """Every fault's kills, sorted by time; a fault naming nothing fails here."""
    kills = []
    for fault in faults:
        if not hasattr(fault, "schedule"):
            raise ValueError(f"not a fault: {fault!r}; use bn.faults.KillInstance, "
                             "KillWorker, KillNode or RandomKills")
        try:
            kills.extend(fault.schedule(plan))
        except KeyError as exc:
            raise ValueError(f"{fault!r}: no operator named {exc.args[0]!r}") from None
        except StopIteration:
            raise ValueError(f"{fault!r}: the operator has no instance {fault.index}") from None
    return sorted(kills)


def live_nodes() -> list[str]:
    """The ids of the cluster's live Ray nodes, sorted as placement counts them: what
    `KillNode` positions index."""
    from bastion.scheduler import placement  # imports Ray: only when a fault needs it

    return placement.live_nodes()


def resolve_node(node: int | str, nodes: list[str]) -> str:
    """The node id a `KillNode` names; a clear error when the cluster has no such node."""
    if isinstance(node, int):
        if node >= len(nodes):
            raise ValueError(f"KillNode: node {node} does not exist (the cluster has "
                             f"{len(nodes)} live node{'s' if len(nodes) != 1 else ''})")
        return nodes[node]
    if node not in nodes:
        raise ValueError(f"KillNode: no live Ray node has id {node!r}")
    return node
