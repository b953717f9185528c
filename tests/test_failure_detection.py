"""Failure detection must not mistake a busy worker for a dead one.

The detector's rule (`bastion.scheduler.detector`): a worker is alive when its ping
returns within ``heartbeat_timeout_s`` — however late inside it — and dead when the
ping times out or Ray reports the actor gone. The rule is tested here on workers whose
answers the test releases by hand, so no clock decides the outcome. Then a real run
of an unpaced, busy keyed count, whose every output must be exact whether or not the
machine was too busy to answer a heartbeat in time: a false alarm may cost a restart,
never a record. How quickly a busy worker answers is a benchmark's business
(`benchmarks/`), not a test's.
"""

from __future__ import annotations

import asyncio
import collections

import pytest
import ray

import bastion as bn
from bastion.scheduler.detector import Failure, answers, watch_heartbeats
from protocol_knobs import with_interval


class _Call:
    def __init__(self, answer):
        self.remote = answer


class Worker:
    """A worker as the detector sees it: ``ping.remote()`` gives an awaitable. Its
    answer waits until the test releases it (``release``), or raises ``error``, or
    never comes (``silent``)."""

    def __init__(self, *, silent: bool = False, error: Exception | None = None):
        self.released = asyncio.Event()
        self.silent = silent
        self.error = error
        self.pings = 0
        self.ping = _Call(self._answer)

    async def _answer(self) -> None:
        self.pings += 1
        if self.error is not None:
            raise self.error
        if self.silent:
            await asyncio.Event().wait()  # never set
        await self.released.wait()


def test_a_late_answer_within_the_timeout_is_alive():
    async def scenario():
        busy = Worker()
        check = asyncio.ensure_future(answers(busy, timeout_s=3600.0))
        for _ in range(10):           # the detector is waiting; the worker is busy
            await asyncio.sleep(0)
        assert not check.done()
        busy.released.set()           # it answers, late but inside the timeout
        return await check

    assert asyncio.run(scenario()) is True


def test_no_answer_within_the_timeout_or_a_dead_actor_is_dead():
    async def scenario():
        return (await answers(Worker(silent=True), timeout_s=0.01),
                await answers(Worker(error=ray.exceptions.RayActorError()), timeout_s=3600.0))

    assert asyncio.run(scenario()) == (False, False)


def test_heartbeats_report_the_silent_worker_and_never_the_busy_one():
    async def scenario():
        busy, silent = Worker(), Worker(silent=True)
        busy.released.set()  # busy, but it answers every ping within the timeout
        with pytest.raises(Failure) as failed:
            await watch_heartbeats(lambda: [busy, silent], timeout_s=0.04)
        return failed.value, busy

    failure, busy = asyncio.run(scenario())
    assert failure.worker == 1 and "worker 1 missed its heartbeat" in failure.reason
    assert not failure.fatal
    assert busy.pings >= 1


def busy_keyed_count(count: int, keys: int) -> bn.Topology:
    topo = bn.Topology("busy")
    src = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count))
    src.key_by(lambda i: i % keys).reduce("count", lambda acc, _: acc + 1, initial=0) \
        .sink("out", bn.sinks.Collect())  # (key, running count) per record
    return topo


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("protocol", ["none", "coordinated"])
def test_a_busy_run_with_a_short_heartbeat_commits_exact_outputs(protocol, tmp_path):
    count, keys = 200_000, 50
    result = bn.run(busy_keyed_count(count, keys),
                    protocol=(protocol if protocol == "none"
                              else with_interval(protocol, interval_s=0.5)),
                    recovery=bn.Recovery(heartbeat_timeout_s=0.5), storage=f"local://{tmp_path}")
    assert result.metrics.source_records == count
    per_key = collections.defaultdict(list)
    for key, n in result.outputs["out"]:
        per_key[key].append(n)
    # every key counted each of its records exactly once, restarts or not
    assert {k: sorted(ns) for k, ns in per_key.items()} == {
        k: list(range(1, count // keys + 1)) for k in range(keys)}
