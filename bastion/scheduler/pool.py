"""The worker pool: processes that outlive a job, so the next job starts warm.

Ray starts a new process for every actor — about a core-second on a small machine —
while a small job runs for milliseconds. So the processes a job needs (one worker per
slot, the standby, and the host of the job master) are *lent* by a pool and given
back when the job ends, instead of being started and killed by every job:

- **one pool per cluster**: a named, detached Ray actor (``pool`` in the ``bastion``
  namespace, got-or-created), so ``bn.run``, ``bn.drill`` and the CLI against the same
  cluster share it;
- **by node**: placement (`bastion.scheduler.placement`) decides which node each slot
  runs on; the pool lends an idle worker of that node — the one given back last, so a
  job of the same size runs on the processes of the job before it and the oldest idle
  ones age out — or starts one there (strict node affinity). An idle worker whose node
  is gone is dropped, never lent;
- **only live ones**: before lending an idle worker the pool pings it (its heartbeat,
  which answers on a thread of its own, so this costs a round trip); one that does not
  answer is killed and another is taken or started. A worker a job lost (a drill
  killed it, a node died) is never given back, so the pool fills that place lazily, on
  the next lend;
- **clean state is the borrower's duty**: the job master resets a worker (every task,
  channel and per-job field dropped) before giving it back, and kills one that does
  not reset in time instead;
- **it shrinks**: a worker idle for ``idle_timeout_s`` is killed, and so is the job
  master host once no job has used it for as long.

The pool knows nothing of what runs in the processes: it is handed the worker and host
actor classes when it is created (the runtime's `Worker` and `JobHost`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from bastion.scheduler import detector, placement

POOL_NAME = "pool"
POOL_NAMESPACE = "bastion"
IDLE_TIMEOUT_S = 60.0
_LIVENESS_TIMEOUT_S = 2.0  # an idle worker that does not answer its ping this fast is dropped
_SHRINK_INTERVAL_MAX_S = 5.0  # the longest the pool sleeps between two looks at idle processes


def get_pool(worker_class: Any, host_class: Any) -> Any:
    """The cluster's pool (Ray must be connected), created on first use."""
    # Ray's stubs type the @ray.remote class as the plain class, without .options
    pool_options = WorkerPool.options  # type: ignore[attr-defined]
    return pool_options(name=POOL_NAME, namespace=POOL_NAMESPACE, get_if_exists=True,
                        lifetime="detached").remote(worker_class, host_class)


@ray.remote(num_cpus=0)
class WorkerPool:
    def __init__(self, worker_class: Any, host_class: Any,
                 idle_timeout_s: float = IDLE_TIMEOUT_S):
        self._worker_class = worker_class
        self._host_class = host_class
        self.idle_timeout_s = idle_timeout_s
        self._idle: list[tuple[Any, str, float]] = []  # worker, node, idle since (monotonic)
        self._node_of: dict[Any, str] = {}  # idle and lent workers: their node
        self._host: Any = None
        self._host_jobs = 0
        self._host_idle_since = time.monotonic()
        self._shrinker: asyncio.Task | None = None

    async def lend(self, nodes: list[str]) -> list[Any]:
        """One live worker on each of ``nodes`` (node ids, repeats allowed), idle ones
        first, new ones started where none is idle."""
        self._ensure_shrinker()
        lent = []
        for node in nodes:
            worker = await self._take_idle(node)
            if worker is None:
                worker = self._worker_class.options(
                    scheduling_strategy=placement.strategy_on(node)).remote()
                self._node_of[worker] = node
            lent.append(worker)
        return lent

    async def _take_idle(self, node: str) -> Any:
        while True:
            # the most recently given back first: the oldest idle ones age out
            found = next((i for i in reversed(range(len(self._idle)))
                          if self._idle[i][1] == node), None)
            if found is None:
                return None
            worker, _, _ = self._idle.pop(found)
            if await detector.answers(worker, _LIVENESS_TIMEOUT_S):
                return worker
            self._kill(worker)

    def give_back(self, workers: list[Any], lost: list[Any]) -> None:
        """``workers``: reset by a job that no longer uses them, idle from now on;
        ``lost``: lent workers the job killed or lost, forgotten (never lent again)."""
        now_s = time.monotonic()
        # reversed: lent last in, first out, the first of them goes to the next job's
        # first slot on that node
        self._idle.extend((w, self._node_of[w], now_s) for w in reversed(workers)
                          if w in self._node_of)
        for worker in lost:
            self._node_of.pop(worker, None)

    async def lend_host(self) -> Any:
        """The job master host, started if there is none (or it died)."""
        self._ensure_shrinker()
        if self._host is not None and not await detector.answers(self._host,
                                                                 _LIVENESS_TIMEOUT_S):
            ray.kill(self._host, no_restart=True)
            self._host = None
        if self._host is None:
            self._host = self._host_class.remote()
        self._host_jobs += 1
        return self._host

    def give_back_host(self) -> None:
        self._host_jobs -= 1
        self._host_idle_since = time.monotonic()

    def set_idle_timeout(self, idle_timeout_s: float) -> None:
        """How long an idle process is kept (seconds); checked from now on."""
        self.idle_timeout_s = idle_timeout_s
        if self._shrinker is not None:
            self._shrinker.cancel()  # it may sleep for the old timeout's share
            self._shrinker = None
        self._ensure_shrinker()

    def idle(self) -> list[tuple[Any, str]]:
        """The idle workers and their nodes, oldest first."""
        return [(w, node) for w, node, _ in self._idle]

    def _ensure_shrinker(self) -> None:
        if self._shrinker is None or self._shrinker.done():
            self._shrinker = asyncio.get_running_loop().create_task(self._shrink())

    async def _shrink(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_timeout_s / 4, _SHRINK_INTERVAL_MAX_S))
            now_s = time.monotonic()
            live = set(placement.live_nodes())
            keep = []
            for worker, node, since_s in self._idle:
                if node in live and now_s - since_s < self.idle_timeout_s:
                    keep.append((worker, node, since_s))
                else:
                    self._kill(worker)
            self._idle = keep
            if (self._host is not None and self._host_jobs == 0
                    and now_s - self._host_idle_since >= self.idle_timeout_s):
                ray.kill(self._host, no_restart=True)
                self._host = None

    def _kill(self, worker: Any) -> None:
        self._node_of.pop(worker, None)
        ray.kill(worker, no_restart=True)
