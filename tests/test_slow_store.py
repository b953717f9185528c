"""A slow store holds up no task: with S3 taking 200 ms a request (the test server
behind `slow_proxy.SlowProxy`), a CEC job, whose stateful operator logs as it goes,
and a job committing into a Log sink keep every worker's event loop and heartbeat
answering within 200 ms at p99; no worker is declared dead, and the outputs are exact.

The loop is probed with an async method of each worker (it runs on the loop that runs
the tasks), the heartbeat with `Worker.ping` (its own thread). A control run whose
map blocks the loop shows the probe sees a stall when there is one."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
import ray

import bastion as bn
from bastion.storage import LogReader, open_store
from protocol_knobs import with_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slow_proxy import SlowProxy  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

# Fake credentials for moto, in the environment before Ray starts (its workers inherit
# it and open the s3:// stores themselves).
os.environ.setdefault("BASTION_S3_ACCESS_KEY", "AKIABASTIONSLOWSTORE")
os.environ.setdefault("BASTION_S3_SECRET_KEY", "bastion-slow-store-secret")

DELAY_S = 0.2
N = 6000


@pytest.fixture(scope="module")
def slow_s3(moto_endpoint):
    proxy = SlowProxy(moto_endpoint, DELAY_S)
    yield proxy
    proxy.close()


class Probe:
    """Times, every 50 ms, a call into each worker's event loop and a heartbeat."""

    def __init__(self) -> None:
        self.loop_s: list[float] = []
        self.ping_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Probe":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from bastion.scheduler.pool import POOL_NAME, POOL_NAMESPACE

        while not self._stop.is_set():
            try:
                pool = ray.get_actor(POOL_NAME, namespace=POOL_NAMESPACE)
                workers = ray.get(pool.__ray_call__.remote(lambda p: list(p._node_of)))
            except ValueError:  # no pool before the first job borrowed one
                workers = []
            for worker in workers:
                for calls, method in ((self.loop_s, worker.frame_address),
                                      (self.ping_s, worker.ping)):
                    began = time.perf_counter()
                    try:
                        ray.get(method.remote(), timeout=10)
                    except ray.exceptions.RayActorError:
                        continue  # released and shut down meanwhile
                    calls.append(time.perf_counter() - began)
            self._stop.wait(0.05)

    @staticmethod
    def p99(samples: list[float]) -> float:
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def no_failure(result) -> None:
    kinds = {e["kind"] for e in result.details["events"]}
    assert "failure_detected" not in kinds, [e for e in result.details["events"]
                                             if e["kind"] == "failure_detected"]


def keyed_sums() -> dict[int, int]:
    sums: dict[int, int] = {}
    for i in range(N):
        sums[i % 17] = sums.get(i % 17, 0) + i
    return sums


@pytest.mark.internal
def test_cec_on_a_slow_store_keeps_loops_and_heartbeats_answering(slow_s3):
    topo = bn.Topology("slow-cec")
    topo.source("src", bn.sources.Generator(lambda i: i, count=N, rate=1500)).key_by(
        lambda v: v % 17).reduce("sum", lambda acc, v: acc + v, 0, parallelism=2).sink(
        "out", bn.sinks.Collect(), parallelism=2)
    storage = f"s3://bastion-slow/cec?endpoint={slow_s3.endpoint}&secure=false"
    requests_before = slow_s3.requests
    with Probe() as probe:
        result = bn.run(topo, protocol=bn.protocols.Cec(interval_s=0.2), storage=storage)
    assert slow_s3.requests - requests_before > 20, "the job must have used the slow store"
    final = {}
    for key, acc in result.outputs["out"]:
        final[key] = acc  # a running sum: the last per key is the total
    assert final == keyed_sums()
    no_failure(result)
    assert len(probe.loop_s) > 20 and len(probe.ping_s) > 20
    assert probe.p99(probe.loop_s) < DELAY_S, sorted(probe.loop_s)[-5:]
    assert probe.p99(probe.ping_s) < DELAY_S, sorted(probe.ping_s)[-5:]


@pytest.mark.internal
@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated"])
def test_a_log_sink_on_a_slow_store_keeps_loops_and_heartbeats_answering(slow_s3, protocol):
    """Also every commit reaches the Log: commits the coordinator completed after the
    job's end (the store kept them waiting) were once sent under an attempt that had
    ended, which the workers ignore — records 1,233-5,761 of 6,000 never reached it."""
    out = f"s3://bastion-slow/log-out-{protocol}?endpoint={slow_s3.endpoint}&secure=false"
    topo = bn.Topology("slow-log")
    topo.source("src", bn.sources.Generator(lambda i: i, count=N, rate=1500)).map(
        "sq", lambda v: v * v).sink("log", bn.sinks.Log(out))
    storage = f"s3://bastion-slow/log-job?endpoint={slow_s3.endpoint}&secure=false"
    with Probe() as probe:
        result = bn.run(topo,
                        protocol=with_interval(protocol, interval_s=0.2), storage=storage)
    written = [r[2] for r in LogReader(open_store(out), "").records()]
    assert written == [i * i for i in range(N)]
    no_failure(result)
    assert len(probe.loop_s) > 20
    assert probe.p99(probe.loop_s) < DELAY_S, sorted(probe.loop_s)[-5:]
    assert probe.p99(probe.ping_s) < DELAY_S, sorted(probe.ping_s)[-5:]


@pytest.mark.internal
def test_the_probe_sees_a_loop_that_is_held_up(tmp_path):
    """The control: a map that holds the loop 300 ms every 500 records is seen."""
    def hold(v):
        if v % 500 == 0:
            time.sleep(0.3)
        return v

    topo = bn.Topology("held-loop")
    topo.source("src", bn.sources.Generator(lambda i: i, count=3000, rate=1500)).map(
        "hold", hold).sink("out", bn.sinks.Collect())
    with Probe() as probe:
        result = bn.run(topo, storage=f"local://{tmp_path}")
    assert len(result.outputs["out"]) == 3000
    assert max(probe.loop_s) >= DELAY_S
    assert probe.p99(probe.loop_s) >= DELAY_S or max(probe.loop_s) > 0.25
