"""Fault injection: kill the processes that run a job, on a schedule, for real.

A fault names *what* to kill and *when* (seconds after the job started). The job
master carries faults out with ``ray.kill``, which terminates the worker actor's
process — every task it hosts dies with it, as when a machine disappears — and then
has to detect the loss and recover like after any other failure.

- ``KillInstance(op, index, at, during_checkpoint=False)``: the worker hosting
  instance ``index`` of ``op``; with ``during_checkpoint`` the kill waits after ``at``
  until a checkpoint is in progress, to prove an interrupted checkpoint is never used;
- ``KillWorker(worker, at)``: one worker process (a slot) by number;
- ``RandomKills(count, between, seed)``: ``count`` kills of random instances at random
  times in ``between = (first_s, last_s)``, reproducible from ``seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KillInstance:
    op: str
    index: int = 0
    at: float = 1.0
    during_checkpoint: bool = False

    def schedule(self, plan: Any) -> list[tuple[float, int, str, bool]]:
        task = plan.task_of(self.op, self.index)
        return [(self.at, task.worker, f"kill {self.op}[{self.index}]",
                 self.during_checkpoint)]


@dataclass(frozen=True)
class KillWorker:
    worker: int
    at: float = 1.0

    def schedule(self, plan: Any) -> list[tuple[float, int, str, bool]]:
        if not 0 <= self.worker < plan.workers:
            raise ValueError(f"KillWorker: worker {self.worker} does not exist "
                             f"(the job has {plan.workers})")
        return [(self.at, self.worker, f"kill worker {self.worker}", False)]


@dataclass(frozen=True)
class RandomKills:
    count: int = 1
    between: tuple[float, float] = (1.0, 3.0)
    seed: int | None = None  # a drill fills in its own seed

    def schedule(self, plan: Any) -> list[tuple[float, int, str, bool]]:
        rng = random.Random(0 if self.seed is None else self.seed)
        instances = [(op, t.index, t.worker) for c in plan.chains for op in c.ops[:1]
                     for t in plan.tasks if t.chain_id == c.chain_id]
        kills = []
        for _ in range(self.count):
            op, index, worker = rng.choice(instances)
            at = round(rng.uniform(*self.between), 3)
            kills.append((at, worker, f"kill {op}[{index}]", False))
        return sorted(kills)


Fault = KillInstance | KillWorker | RandomKills


def validate(faults: Any, plan: Any) -> list[tuple[float, int, str, bool]]:
    """Every fault's kills, sorted by time; a fault naming nothing fails here."""
    kills = []
    for fault in faults:
        if not hasattr(fault, "schedule"):
            raise ValueError(f"not a fault: {fault!r}; use bn.faults.KillInstance, "
                             "KillWorker or RandomKills")
        try:
            kills.extend(fault.schedule(plan))
        except KeyError as exc:
            raise ValueError(f"{fault!r}: no operator named {exc.args[0]!r}") from None
        except StopIteration:
            raise ValueError(f"{fault!r}: the operator has no instance {fault.index}") from None
    return sorted(kills)
