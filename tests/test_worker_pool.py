"""Warm job starts: the pool lends the processes of one job to the next.

A job borrows its workers and its job master's host from the cluster's pool
(`bastion.scheduler.pool`) and gives back the workers it reset. These tests run real
jobs on the session's Ray (the pool is shared with every other test) and check, by
actor id and by output, that a job reuses the workers of the job before it, sees
nothing of its state, and that a kill, a failed job or an idle timeout never leaves a
dead process to be lent. They assert no timing: `benchmarks/throughput.py` prints how
long a cold and a warm start take.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

import bastion as bn
from bastion.runtime.instance import Worker
from bastion.runtime.job import JobHost
from bastion.scheduler.pool import IDLE_TIMEOUT_S, get_pool
from bastion.storage import open_store
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]


def counting(name: str, words: list[str], parallelism: int = 2) -> bn.Topology:
    """A running count per word: per-key state that a reused worker must not keep."""
    topo = bn.Topology(name)
    topo.source("words", bn.sources.Collection(words)).key_by(lambda w: w).stateful_map(
        "count", lambda n, w: (n + 1, (w, n + 1)), initial=0,
        parallelism=parallelism).sink("out", bn.sinks.Collect())
    return topo


def running_counts(words: list[str]) -> list[tuple[str, int]]:
    seen: collections.Counter = collections.Counter()
    expected = []
    for w in words:
        seen[w] += 1
        expected.append((w, seen[w]))
    return sorted(expected)


def generated(count: int = 3000, rate: float = 1500) -> bn.Topology:
    topo = bn.Topology("pool-drill")
    src = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count, rate=rate))
    src.key_by(lambda i: i % 7).reduce("sum", lambda acc, i: acc + i, initial=0,
                                       parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def pool():
    return get_pool(Worker, JobHost)


def idle_workers() -> list:
    return [w for w, _ in ray.get(pool().idle.remote())]


def ids(handles: list) -> set[str]:
    return {h._actor_id.hex() for h in handles}


def test_the_next_job_runs_on_the_same_workers_and_sees_none_of_the_last_ones_state(tmp_path):
    storage = f"local://{tmp_path}"
    words_a = [WORDS[i % 5] for i in range(40)]
    words_b = [WORDS[(i * 3) % 7] for i in range(25)]
    a = bn.run(counting("pool-a", words_a), storage=storage)
    # the same operator names and keys: a worker that kept A's counts would add to them
    b = bn.run(counting("pool-a", words_b), storage=storage)
    assert sorted(a.outputs["out"]) == running_counts(words_a)
    assert sorted(b.outputs["out"]) == running_counts(words_b)
    assert len(b.details["workers"]) == 2
    assert b.details["workers"] == a.details["workers"]
    # each job still writes under a prefix of its own
    assert a.job_id != b.job_id
    jobs = {key.split("/")[1] for key in open_store(storage).list("jobs/")}
    assert {a.job_id, b.job_id} <= jobs
    # a different topology, one worker: still exact, on one of the same processes
    c = bn.run(counting("pool-c", words_b, parallelism=1), storage=storage)
    assert sorted(c.outputs["out"]) == running_counts(words_b)
    assert set(c.details["workers"]) <= set(a.details["workers"])


def test_a_released_worker_keeps_nothing_of_its_job(tmp_path):
    bn.run(counting("pool-release", WORDS * 3), storage=f"local://{tmp_path}")
    worker = idle_workers()[-1]
    # the progress a job master polls: no attempt, no task, nothing held back
    assert ray.get(worker.progress.remote()) == {"attempt": -1, "tasks": {},
                                                  "quiescence": {}, "replaying": [],
                                                  "cpu_priority": "normal"}
    assert ray.get(worker.report.remote()) == []
    assert ray.get(worker.ping.remote()) is None  # no slot


def _job_objects(worker: object) -> dict[str, int]:
    """The objects of a job's data path the worker's collector knows of, garbage not
    yet collected included."""
    import gc

    from bastion.runtime.instance import Task
    from bastion.runtime.operators import Operator
    objects = gc.get_objects()
    return {"tasks": sum(isinstance(o, Task) for o in objects),
            "operators": sum(isinstance(o, Operator) for o in objects)}


def test_a_released_worker_holds_no_object_of_its_job_not_even_as_garbage(tmp_path):
    # tasks and operators refer to each other: dropped, they are a cycle that only a
    # full collection frees, and a pooled worker held every earlier job's state
    bn.run(counting("pool-garbage", WORDS * 3, parallelism=1), storage=f"local://{tmp_path}")
    worker = idle_workers()[-1]
    assert ray.get(worker.__ray_call__.remote(_job_objects)) == {"tasks": 0, "operators": 0}


def test_deploy_and_teardown_are_reported_apart_from_the_run(tmp_path):
    result = bn.run(counting("pool-metrics", WORDS), storage=f"local://{tmp_path}")
    metrics = result.metrics
    assert metrics.deploy_s > 0 and metrics.teardown_s > 0 and metrics.duration_s > 0


def test_a_failed_job_leaves_its_workers_healthy_for_the_next(tmp_path):
    storage = f"local://{tmp_path}"
    topo = bn.Topology("pool-fails")
    topo.source("n", bn.sources.Collection(list(range(50)))).map(
        "boom", lambda i: 1 // (i - 20)).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.UDFError):
        bn.run(topo, fail_fast=True, storage=storage)
    idle = idle_workers()
    assert ray.get([w.ping.remote() for w in idle]) == [None] * len(idle)
    words = [WORDS[i % 7] for i in range(30)]
    after = bn.run(counting("pool-after-failure", words), storage=storage)
    assert sorted(after.outputs["out"]) == running_counts(words)


@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated"])
def test_a_drill_kill_leaves_the_pool_healthy_and_pooled_runs_exactly_once(protocol,
                                                                          tmp_path):
    storage = f"local://{tmp_path}"
    expected = sorted(bn.run(generated(), storage=storage).outputs["out"])
    for round_ in range(2):  # the second drill runs on what the first one left
        report = bn.drill(generated(), protocol=with_interval(protocol, interval_s=0.4),
                          faults=[bn.faults.KillWorker(round_, at=0.8)], storage=storage)
        assert report.faults_landed
        assert report.metrics.protocol.failures, "the kill must have forced a restart"
        assert report.exactly_once, report.verdict_reason
    # no dead process waits to be lent: every idle worker answers its heartbeat
    idle = idle_workers()
    assert ray.get([w.ping.remote() for w in idle]) == [None] * len(idle)
    after = bn.run(generated(count=500, rate=None), storage=storage)
    assert sorted(after.outputs["out"]) == sorted(
        bn.run(generated(count=500, rate=None), protocol="none",
               storage=storage).outputs["out"]) != []
    assert sorted(bn.run(generated(), storage=storage).outputs["out"]) == expected


def test_a_worker_killed_while_idle_is_never_lent(tmp_path):
    storage = f"local://{tmp_path}"
    first = bn.run(counting("pool-idle-kill", WORDS), storage=storage)
    victim = idle_workers()[-1]
    ray.kill(victim, no_restart=True)
    words = [WORDS[i % 3] for i in range(12)]
    second = bn.run(counting("pool-idle-kill", words), storage=storage)
    assert sorted(second.outputs["out"]) == running_counts(words)
    assert ids([victim]).isdisjoint(second.details["workers"])
    assert len(set(first.details["workers"]) & set(second.details["workers"])) == 1
    assert ids([victim]).isdisjoint(ids(idle_workers()))


def test_idle_workers_are_killed_after_the_idle_timeout(tmp_path):
    the_pool = pool()
    result = bn.run(counting("pool-shrink", WORDS), storage=f"local://{tmp_path}")
    mine = [w for w in idle_workers() if ids([w]) <= set(result.details["workers"])]
    assert len(mine) == 2
    with pytest.raises(ValueError, match="pool_idle_timeout_s"):
        bn.run(counting("pool-shrink", WORDS), limits=bn.Limits(pool_idle_timeout_s=0))
    # the knob is bn.run's: the next job borrows the same idle workers (idle ones are
    # lent first) and leaves them idle again under the short timeout
    bn.run(counting("pool-shrink", WORDS), storage=f"local://{tmp_path}",
           limits=bn.Limits(pool_idle_timeout_s=0.5))
    try:
        # no assertion on how long it takes: wait, up to a generous bound, until the
        # pool let them go, then check with Ray that their processes ended
        deadline_s = time.monotonic() + 60
        while any(w in idle_workers() for w in mine) and time.monotonic() < deadline_s:
            time.sleep(0.1)
        for worker in mine:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(worker.ping.remote(), timeout=30)
        assert not any(w in idle_workers() for w in mine)
    finally:
        ray.get(the_pool.set_idle_timeout.remote(IDLE_TIMEOUT_S))


def test_a_driver_that_gives_up_cancels_its_job_and_its_workers_go_back_clean(tmp_path):
    class GiveUp(Exception):
        pass

    def give_up(progress: dict) -> None:
        raise GiveUp  # like Ctrl-C in the middle of a job

    # rate-limited: running when the first progress point comes
    with pytest.raises(GiveUp):
        bn.run(generated(count=3000, rate=300), progress=give_up,
               storage=f"local://{tmp_path}")
    # the job master releases the workers once the cancellation reaches it
    deadline_s = time.monotonic() + 60
    while len(idle_workers()) < 2 and time.monotonic() < deadline_s:
        time.sleep(0.1)
    idle = idle_workers()
    assert len(idle) >= 2
    assert ray.get([w.progress.remote() for w in idle]) == [
        {"attempt": -1, "tasks": {}, "quiescence": {}, "replaying": [],
         "cpu_priority": "normal"}] * len(idle)


@pytest.mark.slow
def test_after_a_node_died_no_worker_of_it_is_lent(tmp_path):
    script = Path(__file__).with_name("pool_node_loss.py")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["nodes_after"] == 1
    assert outcome["before_exact"] and outcome["after_exact"], outcome
    assert outcome["lost_worker"] in outcome["before"]
    assert outcome["lost_worker"] not in outcome["after"]
    assert len(outcome["after"]) == 2


def test_a_host_whose_loop_is_busy_still_answers_its_ping():
    """The pool pings the job host before it lends it (2 s): a host busy with the
    calls of its job masters must not look dead, or every job it hosts would end with
    it. Sharing their thread, the ping waited 2.5 s behind a 3-s call."""
    host = JobHost.remote()
    ray.get(host.ping.remote())
    busy = host.__ray_call__.remote(lambda self: time.sleep(3.0))  # holds its calls' thread
    time.sleep(0.5)
    began_s = time.monotonic()
    ray.get(host.ping.remote(), timeout=10)
    waited_s = time.monotonic() - began_s
    ray.get(busy)
    ray.kill(host)
    assert waited_s < 1.0, f"the ping waited {waited_s:.2f} s for the busy loop"


def _copies_of_a_task(i: int) -> tuple[int, int]:
    """``i`` and, for the last records only (the scan is slow), how many `Task`
    objects of one task id this process holds at most, garbage not yet collected
    included: 1, unless a restart left the copy it replaced behind."""
    if i < PROBED_FROM:
        return i, 0
    import gc

    from bastion.runtime.instance import Task
    copies = collections.Counter(o.task_id for o in gc.get_objects() if isinstance(o, Task))
    return i, max(copies.values())


PROBED_COUNT = 3000
PROBED_FROM = PROBED_COUNT - 20


@pytest.mark.parametrize("failover", ["global", "local"])
def test_a_restart_leaves_no_copy_of_the_tasks_it_replaced(failover, tmp_path):
    # A restart drops a surviving worker's tasks (`Worker.reset`, `restart_region`)
    # and builds them again: the dropped ones are cyclic garbage, and until a full
    # collection every restart added one more copy of their state to the process.
    # Two branches: "local" restarts only the one the kill reaches, so the worker
    # that survives stops that branch's tasks and keeps the other's running.
    topo = bn.Topology("pool-restart-garbage")
    src = topo.source("numbers", bn.sources.Generator(lambda i: i, count=PROBED_COUNT,
                                                      rate=1500))
    src.key_by(lambda i: i % 7).map("probe", _copies_of_a_task, parallelism=2).sink(
        "out", bn.sinks.Collect())
    topo.source("others", bn.sources.Generator(lambda i: i, count=PROBED_COUNT,
                                               rate=1500)).sink("other", bn.sinks.Collect())
    report = bn.drill(topo, protocol=with_interval("coordinated", interval_s=0.4),
                      faults=[bn.faults.KillWorker(1, at=0.8)],
                      recovery=bn.Recovery(failover=failover, heartbeat_timeout_s=3.0),
                      storage=f"local://{tmp_path}")
    failures = report.metrics.protocol.failures
    assert failures, "the kill must have forced a restart"
    # the region restart the "local" case is about (the kill's worker holds no task
    # of the other branch, whose source and sink run at parallelism 1)
    assert ("others[0]" in failures[0].restarted_tasks) == (failover == "global")
    probed = sorted(out for out in report.outputs["out"] if out[0] >= PROBED_FROM)
    assert [i for i, _ in probed] == list(range(PROBED_FROM, PROBED_COUNT))
    assert {copies for _, copies in probed} == {1}
    assert report.exactly_once, report.verdict_reason
