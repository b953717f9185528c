"""The job master's events: complete in the store, bounded in memory, and never lost
without the run's result saying so.

The limits are set small (`bn.Limits`), so a few seconds of run make more events
and progress points than the job master may keep: what it keeps in memory must stay
within the limits — counts, first examples, every failure event and the timeline
around each failure — while the store gets every record, spilled in chunks as the job
runs.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

import bastion as bn
from bastion.runtime.events import KEPT_KINDS, EventLimits, read_events
from bastion.storage import open_store

pytestmark = pytest.mark.usefixtures("ray_session")

SMALL = EventLimits(examples_per_kind=3, first_points=5, context_points=4,
                    chunk_records=10, store_attempts=2, store_backoff_s=0.01)


def counting(name: str, count: int, rate: float, udf=None) -> bn.Topology:
    topo = bn.Topology(name)
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count,
                                                          rate=rate))
    if udf is not None:
        numbers = numbers.map("udf", udf)
    numbers.key_by(lambda i: i % 3).reduce("count", lambda acc, _: acc + 1, initial=0,
                                           parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def test_memory_keeps_counts_examples_and_failures_while_the_store_gets_everything(
        tmp_path):
    storage = f"local://{tmp_path}"
    result = bn.run(counting("events", 3000, rate=1000),
                    protocol=bn.protocols.Coordinated(interval_s=0.05),
                    storage=storage,
                    faults=[bn.faults.KillInstance("count", 1, at=1.5)],
                    limits=bn.Limits(events=SMALL))
    assert sorted(n for _, n in result.outputs["out"]) == sorted(
        n for k in range(3) for n in range(1, 1001))
    events, counts = result.details["events"], result.details["event_counts"]
    timeline = result.details["timeline"]
    in_memory = collections.Counter(e["kind"] for e in events)

    # bounded: examples of the frequent kinds, every event of the failure kinds
    assert counts["checkpoint_completed"] > SMALL.examples_per_kind
    for kind, n in in_memory.items():
        assert n == counts[kind] if kind in KEPT_KINDS else n <= SMALL.examples_per_kind
    assert in_memory["fault"] == 1 and in_memory["restarted"] >= 1
    marks = in_memory["fault"] + in_memory["failure_detected"] + in_memory["restarted"]
    assert counts["progress"] > len(timeline)
    assert len(timeline) <= SMALL.first_points + marks * 2 * SMALL.context_points \
        + SMALL.context_points
    # the points just before the fault were kept, for the recovery time
    fault_s = next(e["t_s"] for e in events if e["kind"] == "fault")
    assert any(fault_s - 1.0 <= p["t_s"] < fault_s for p in timeline)

    # complete: the store has every record, spilled in chunks while the job ran
    store = open_store(storage)
    chunks = [k for k in store.list(f"jobs/{result.job_id}/events/")
              if not k.endswith("/job-master")]
    assert chunks
    stored = read_events(store, result.job_id)
    assert collections.Counter(e["kind"] for e in stored) == counts
    assert [e["t"] for e in stored if e["kind"] != "progress"] == sorted(
        e["t"] for e in stored if e["kind"] != "progress")
    assert result.warnings == []


def block_events(storage_dir: Path):
    """A map that, once the job's folder exists (its first checkpoint), puts a plain
    file where the job's events directory goes: the store can then write no event
    object of the job (none is written before the end, the log being short)."""

    def apply(i: int) -> int:
        jobs = storage_dir / "jobs"
        if jobs.exists():
            for job in jobs.iterdir():
                events = job / "events"
                if not events.exists():
                    events.write_text("not a directory")
        return i

    return apply


def test_events_the_store_does_not_take_are_a_warning_of_the_result(tmp_path):
    limits = bn.Limits(events=EventLimits(store_attempts=2, store_backoff_s=0.01))
    result = bn.run(counting("lost-events", 1000, rate=1000, udf=block_events(tmp_path)),
                    protocol=bn.protocols.Coordinated(interval_s=0.05),
                    storage=f"local://{tmp_path}", limits=limits)
    assert len(result.outputs["out"]) == 1000          # the job itself succeeded
    [warning] = result.warnings
    assert f"run events of job {result.job_id} could not be stored" in warning
    assert f"jobs/{result.job_id}/events/" in warning
    assert os.path.isfile(tmp_path / "jobs" / result.job_id / "events")


JOB = '''
from pathlib import Path

import bastion as bn

STORE = Path({store!r})


def block_events(i):
    jobs = STORE / "jobs"
    if jobs.exists():
        for job in jobs.iterdir():
            if not (job / "events").exists():
                (job / "events").write_text("not a directory")
    return i


topology = bn.Topology("cli-lost-events")
topology.source("numbers", bn.sources.Generator(lambda i: i, count=1000, rate=1000)) \\
    .map("udf", block_events).sink("out", bn.sinks.Collect())
'''


def test_the_command_line_prints_the_warning_of_a_run_that_lost_its_events(
        tmp_path, capsys, monkeypatch):
    from bastion.cli import main

    real_run = bn.run
    limits = bn.Limits(events=EventLimits(store_attempts=1))
    monkeypatch.setattr(bn, "run", lambda *a, **kw: real_run(*a, limits=limits,
                                                              **kw))
    job = tmp_path / "job.py"
    job.write_text(JOB.format(store=str(tmp_path / "store")))
    assert main(["run", str(job), "--protocol", "coordinated", "--checkpoint-interval",
                 "0.05", "--storage", f"local://{tmp_path / 'store'}"]) == 0
    printed = capsys.readouterr()
    assert "out: 1,000 committed records" in printed.out
    assert "warning: " in printed.err and "could not be stored" in printed.err
