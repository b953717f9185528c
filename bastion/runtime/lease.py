"""The workers one job borrowed: its lease on the cluster's pool of warm processes.

A job does not start worker processes; it borrows them from the cluster's pool
(`bastion.scheduler.pool`), which keeps them warm between jobs, and binds each to its
slot of the job (``bind``: the job's config and the link back to its master). Whatever
happens to the job, every worker it borrowed goes back at the end — clean if it resets
in time, killed otherwise (`WorkerLease.release`) — including those a phase cancelled
half-way had borrowed but not yet taken: a borrowing is shielded, so the lease always
learns what it was lent.

The lease also holds the *standby*: a warm worker borrowed ahead, bound to no slot,
that takes over the slot of the first worker to die — a restart then costs a deploy,
not a process start (about a core-second). Protocols that restart the whole job gain
little from one and do not ask for it (`Protocol.needs_standby`).

Which slots and nodes, and when a standby is borrowed, are the job master's decisions
(`bastion.runtime.job`) and placement's (`bastion.scheduler.placement`); the lease
only carries them out and remembers what it holds.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from bastion.runtime.config import JobConfig
from bastion.scheduler import placement
from bastion.scheduler.detector import within

# A worker that takes longer to drop its job (a user function holding the event loop)
# is killed instead of given back to the pool.
RELEASE_TIMEOUT_S = 5.0


class WorkerLease:
    """The workers a job borrowed from ``pool``, bound to its slots, and its standby."""

    def __init__(self, pool: Any, config: JobConfig, link: Any, slots: int,
                 wants_standby: bool):
        self.pool = pool
        self.config = config
        self.link = link               # how a worker reaches the job's master
        self.slots = slots             # the plan's worker slots
        self.wants_standby = wants_standby
        self.lent: list[Any] = []      # every worker the pool lent this job
        self._borrowing: set[asyncio.Future] = set()  # lends not yet bound
        self.standby: Any = None
        self._standby_lending: asyncio.Future | None = None
        # A worker keeps its frame address for its lifetime: by actor id
        self._frame_addresses: dict[Any, tuple[str, int]] = {}

    async def borrow(self, slots: list[int], nodes: list[str] | None = None) -> list[Any]:
        """Borrow the workers of ``slots`` (`placement.STANDBY`: the standby), each on
        the node placement puts it (or on ``nodes``), and bind them to the job.
        Shielded: a job cancelled meanwhile still learns what it borrowed, and gives
        it back."""
        if not slots:
            return []
        borrowing = asyncio.ensure_future(self._borrow(slots, nodes))
        self._borrowing.add(borrowing)
        borrowing.add_done_callback(self._borrowing.discard)
        return await asyncio.shield(borrowing)

    async def _borrow(self, slots: list[int], nodes: list[str] | None) -> list[Any]:
        if nodes is None:
            live = placement.live_nodes()
            nodes = [placement.node_for(slot, self.slots, live) for slot in slots]
        workers = await self.pool.lend.remote(nodes)
        self.lent.extend(workers)
        # Awaited: an async actor may run one caller's calls out of order. A worker
        # that died meanwhile fails the next call made to it, a failure like any other.
        await asyncio.gather(*[w.bind.remote(self.config, slot, self.link)
                               for slot, w in zip(slots, workers)], return_exceptions=True)
        return workers

    # -- the standby ------------------------------------------------------------------

    async def ensure_standby(self) -> None:
        """Borrow a standby if the job wants one and has none."""
        if self.standby is None and self.wants_standby:
            [self.standby] = await self.borrow([placement.STANDBY])

    def borrow_standby(self) -> None:
        """Borrow a standby in the background (none when there is one, or one is on
        its way)."""
        if self._standby_lending is None or self._standby_lending.done():
            self._standby_lending = asyncio.ensure_future(self.ensure_standby())

    async def standby_lent(self) -> None:
        """Wait until a standby being borrowed in the background is bound (or failed)."""
        if self._standby_lending is not None:
            await asyncio.gather(self._standby_lending, return_exceptions=True)

    async def bind_standby(self, slot: int) -> Any:
        """The standby, bound to ``slot`` from now on (it is the standby no more); a
        death is a failure the next call to it reports."""
        worker, self.standby = self.standby, None
        await asyncio.gather(worker.bind.remote(self.config, slot, self.link),
                             return_exceptions=True)
        return worker

    def drop_standby(self) -> None:
        """Kill the standby (lost with a node, or not capacity the job may keep)."""
        if self.standby is not None:
            ray.kill(self.standby, no_restart=True)
            self.standby = None

    def spare(self) -> list[Any]:
        return [self.standby] if self.standby is not None else []

    # -- what the workers are ---------------------------------------------------------

    async def frame_addresses(self, workers: list[Any]) -> list[Any]:
        """Every worker's frame address (or the exception asking it raised). Only
        workers not asked before are asked: a round trip saved on every restart."""
        known = self._frame_addresses
        asking = [w for w in workers if w._actor_id not in known]
        answers = await asyncio.gather(*[w.frame_address.remote() for w in asking],
                                       return_exceptions=True)
        known.update((w._actor_id, address) for w, address in zip(asking, answers)
                     if not isinstance(address, BaseException))
        failed = {w._actor_id: a for w, a in zip(asking, answers)
                  if isinstance(a, BaseException)}
        return [failed.get(w._actor_id) or known[w._actor_id] for w in workers]

    @staticmethod
    async def nodes_of(workers: list[Any]) -> list[str | None]:
        """The node of each worker (None: it did not answer)."""
        nodes = await asyncio.gather(*[w.node_id.remote() for w in workers],
                                     return_exceptions=True)
        return [None if isinstance(n, BaseException) else n for n in nodes]

    async def release(self) -> float:
        """Give every worker lent to the job that resets in time back to the pool —
        those it holds, and any a cancelled phase borrowed without taking; kill the
        others (a worker the job lost fails its release at once). When it was done
        (time.time())."""
        await asyncio.gather(*self._borrowing, return_exceptions=True)
        outcomes = await asyncio.gather(*[within(w.release.remote(), RELEASE_TIMEOUT_S)
                                          for w in self.lent], return_exceptions=True)
        clean = [w for w, outcome in zip(self.lent, outcomes)
                 if not isinstance(outcome, BaseException)]
        lost = [w for w in self.lent if w not in clean]
        for w in lost:
            ray.kill(w, no_restart=True)
        await self.pool.give_back.remote(clean, lost)
        return time.time()
