"""The run's CPU seconds (`RunMetrics.cpu_s`): summed over the job's worker processes,
each process counted once however many tasks it hosts."""

from __future__ import annotations

import pytest

import bastion as bn
from bastion.launcher import process_cpu_s


def _task(process: str, started_cpu_s: float, finished_cpu_s: float) -> dict:
    return {"process": process, "started_cpu_s": started_cpu_s,
            "finished_cpu_s": finished_cpu_s}


def test_tasks_of_one_process_count_its_cpu_once():
    # Three tasks read one process's clock: the process ran them from 1.0 to 4.0.
    tasks = [_task("node:7", 1.0, 3.0), _task("node:7", 1.5, 4.0), _task("node:7", 2.0, 2.5)]
    assert process_cpu_s(tasks) == (3.0, 1)


def test_processes_add_up():
    tasks = [_task("node:7", 1.0, 3.0), _task("node:8", 10.0, 10.5),
             _task("other-node:7", 0.0, 1.0)]  # same pid on another node: another process
    assert process_cpu_s(tasks) == (3.5, 3)


def _busy(x: int) -> int:
    return x + sum(range(50))


def _job(records: int, parallelism: int) -> bn.Topology:
    topo = bn.Topology("cpu")
    src = topo.source("src", bn.sources.Generator(lambda i: i, count=records),
                      parallelism=parallelism)
    src.map("busy", _busy, parallelism=parallelism).sink("out", bn.sinks.Discard())
    return topo


@pytest.mark.usefixtures("ray_session")
def test_a_job_reports_the_cpu_of_each_worker_process_once():
    # Unchained, the three operators are three tasks of one worker: one process.
    shared = bn.run(_job(20_000, 1), data_plane=bn.DataPlane(chaining=False), workers=1)
    assert len(shared.details["tasks"]) == 3
    assert shared.metrics.cpu_processes == 1
    assert shared.metrics.cpu_s > 0
    assert shared.metrics.cpu_s_per_million_records == pytest.approx(
        shared.metrics.cpu_s / 20_000 * 1e6)
    two = bn.run(_job(20_000, 2), workers=2)
    assert two.metrics.cpu_processes == 2


@pytest.mark.usefixtures("ray_session")
def test_cpu_grows_with_the_records_processed():
    # Twenty times the records through a map that does real work per record.
    small = bn.run(_job(10_000, 1)).metrics.cpu_s
    large = bn.run(_job(200_000, 1)).metrics.cpu_s
    assert large > small > 0
