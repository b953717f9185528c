"""The job master: deploys a physical plan onto worker actors and watches it run.

The job master is a Ray actor of its own, so a job keeps its coordinator when the
driver is a remote client. Its control loop has named phases:

1. **spawn** — start one worker actor per slot and wait until each answers;
2. **deploy** — give every worker the plan and the handles of its peers; each builds
   its tasks and their channels;
3. **start** — every task starts its loop; sources begin to read;
4. **watch** — wait for every worker to report its tasks finished; stop the sources
   after ``duration_s`` for unbounded inputs; on the first failure stop everything;
5. **collect** — gather committed outputs, counters, latency histograms and dead
   letters, then release the workers.

Failover (restart from a recovery line) belongs to the fault-tolerance protocols and
hooks in at the watch phase.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray

from bastion.errors import UDFError
from bastion.runtime.config import JobConfig
from bastion.runtime.instance import Worker
from bastion.runtime.plan import PhysicalPlan


@ray.remote(num_cpus=0)
class JobMaster:
    def __init__(self, plan: PhysicalPlan, config: JobConfig):
        self.plan = plan
        self.config = config
        self.workers: list = []
        self.phase = "created"
        self.started_s: float | None = None
        self._last_progress = {"source_records": 0, "sink_records": 0}

    async def run(self) -> dict[str, Any]:
        plan, config = self.plan, self.config
        try:
            self.phase = "spawn"
            t0 = time.time()
            self.workers = [Worker.remote(i, config)
                            for i in range(plan.workers)]
            await asyncio.gather(*[w.ping.remote() for w in self.workers])
            spawned_s = time.time()

            self.phase = "deploy"
            await asyncio.gather(*[w.deploy.remote(plan, self.workers) for w in self.workers])

            self.phase = "start"
            self.started_s = time.time()
            await asyncio.gather(*[w.start.remote() for w in self.workers])

            self.phase = "watch"
            failure = await self._watch()
            finished_s = time.time()
            if failure is not None:
                return {"failure": failure}

            self.phase = "collect"
            reports = await asyncio.gather(*[w.report.remote() for w in self.workers])
            self.phase = "done"
            return {
                "failure": None,
                "spawn_s": spawned_s - t0,
                "started_s": self.started_s,
                "finished_s": finished_s,
                "tasks": [task for worker in reports for task in worker],
            }
        finally:
            for w in self.workers:
                ray.kill(w)

    async def _watch(self) -> Any:
        waits = {asyncio.ensure_future(w.wait.remote()): i for i, w in enumerate(self.workers)}
        stopper = None
        if self.config.duration_s is not None:
            stopper = asyncio.ensure_future(self._stop_after(self.config.duration_s))
        pending = set(waits)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    try:
                        report = fut.result()
                    except ray.exceptions.RayActorError as exc:
                        return f"worker {waits[fut]} died: {exc}"
                    if report["failure"] is not None:
                        failure = report["failure"]
                        return failure if isinstance(failure, UDFError) else str(failure)
            return None
        finally:
            if stopper is not None:
                stopper.cancel()

    async def _stop_after(self, duration_s: float) -> None:
        await asyncio.sleep(duration_s)
        await self.stop()

    async def stop(self) -> None:
        """End unbounded sources: they send end-of-stream and the job drains."""
        await asyncio.gather(*[w.stop_sources.remote() for w in self.workers])

    async def progress(self) -> dict[str, Any]:
        if self.phase == "watch":
            try:
                parts = await asyncio.wait_for(
                    asyncio.gather(*[w.progress.remote() for w in self.workers]), 2.0)
                self._last_progress = {
                    k: sum(p[k] for p in parts) for k in ("source_records", "sink_records")}
            except (asyncio.TimeoutError, ray.exceptions.RayError):
                pass
        elapsed = time.time() - self.started_s if self.started_s else 0.0
        return {"phase": self.phase, "elapsed_s": elapsed, **self._last_progress}
