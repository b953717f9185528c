"""A record's ``born`` is when it first entered the job, kept across replays.

Latency counts from ``born``. A paced generator's records are born at their due time
and a log's at their append time, so a record that a restart re-reads from a
checkpointed offset keeps its age: the latency figures of a run with a failure
include the outage instead of showing the replay as fresh records.
"""

from __future__ import annotations

import time

import pytest

import bastion as bn
from bastion.runtime.operators import OperatorContext, SourceOp
from bastion.storage import LogWriter, open_store

RATE = 100.0  # records per second over all instances, in the unit tests
START_S = 1000.0


def read_paced(reader, now_s):
    """What ``reader`` hands out at ``now_s``: (values, their arrival times)."""
    values = reader.read(1000, now_s)
    return values, reader.arrivals(len(values), now_s)


def test_paced_generator_records_are_born_at_their_due_time_also_after_a_restore():
    source = bn.sources.Generator(lambda k: k, count=1000, rate=RATE)
    reader = source.open(1, 2)  # 50 records/s of k = 1, 3, 5, ...
    assert read_paced(reader, START_S) == ([1], [START_S])
    state = reader.state()  # a checkpoint after record 1
    values, born = read_paced(reader, START_S + 0.5)
    assert values == list(range(3, 53, 2))  # 25 more due in 0.5 s
    assert born == [START_S + j / 50 for j in range(1, 26)]

    restored = source.open(1, 2)
    restored.restore(state)
    # 5 s later: the schedule's backlog at once, born when first due, not now
    again, born_again = read_paced(restored, START_S + 5.5)
    assert again[:25] == values and born_again[:25] == born
    assert len(again) == 275 and born_again[-1] == START_S + 5.5
    assert born_again == sorted(born_again)


def test_born_is_the_read_time_for_sources_without_a_schedule():
    for source in (bn.sources.Generator(lambda k: k, count=10),
                   bn.sources.Collection(range(10))):
        reader = source.open(0, 1)
        assert len(reader.read(4, START_S)) == 4
        assert reader.arrivals(4, START_S) is None


def source_op(source, **params):
    topo = bn.Topology("first-arrival")
    topo.source("src", source, **params)
    return SourceOp(topo.nodes["src"], OperatorContext("src", 0, 1, fail_fast=False))


def test_source_op_stamps_born_and_ingest_time_from_the_schedule():
    op = source_op(bn.sources.Generator(lambda k: k, count=100, rate=RATE))
    assert len(op.poll(1000, START_S)) == 1
    batch = op.poll(1000, START_S + 0.1)
    assert batch.born == [START_S + k / RATE for k in range(1, 11)]
    assert batch.ts is batch.born and op.watermark == batch.born[-1]
    snapshot = op.snapshot()

    later = source_op(bn.sources.Generator(lambda k: k, count=100, rate=RATE))
    later.restore(snapshot)
    replay = later.poll(1000, START_S + 3.0)
    assert replay.born[0] == START_S + 11 / RATE and replay.ts is replay.born

    # with a timestamp function, born is still the due time
    timed = source_op(bn.sources.Generator(lambda k: k, count=100, rate=RATE),
                      timestamp=float)
    timed.poll(1000, START_S)
    batch = timed.poll(1000, START_S + 0.25)
    assert batch.ts == [float(k) for k in range(1, 26)]
    assert batch.born == [START_S + k / RATE for k in range(1, 26)]

    # unpaced: one read time, shared by ts and born (the fast path)
    unpaced = source_op(bn.sources.Collection(range(5))).poll(1000, START_S)
    assert unpaced.born == [START_S] * 5 and unpaced.ts is unpaced.born


def test_log_source_records_are_born_when_they_were_appended(tmp_path):
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(2)
    before = time.time()
    sink.open(0, 2).apply(1, ["a", "b"])
    middle = time.time()
    sink.open(1, 2).apply(1, ["c"])
    after = time.time()

    reader = bn.sources.Log(url).open(0, 1)  # reads both sub-logs, one after the other
    values = reader.read(2, after + 60)
    first = reader.arrivals(2, after + 60)
    assert values == ["a", "b"] and before <= first[0] == first[1] <= middle
    state = reader.state()
    assert reader.read(10, after + 60) == ["c"]
    born_c = reader.arrivals(1, after + 60)
    assert middle <= born_c[0] <= after

    restored = bn.sources.Log(url).open(0, 1)
    restored.restore(state)
    assert restored.read(10, after + 3600) == ["c"]
    assert restored.arrivals(1, after + 3600) == born_c


def test_log_arrivals_are_never_ahead_of_the_read_and_ingest_time_never_goes_back(
        tmp_path):
    url = f"local://{tmp_path}/log"
    writer = LogWriter(open_store(url), "")
    writer.append_many([(START_S + 2, "x"), (START_S + 1, "y"), (START_S + 9, "z")])
    writer.flush()
    op = source_op(bn.sources.Log(url))
    batch = op.poll(10, START_S + 5)
    assert batch.born == [START_S + 2, START_S + 1, START_S + 5]
    assert batch.ts == [START_S + 2, START_S + 2, START_S + 5]  # nothing is late
    assert op.watermark == START_S + 5


# -- through bn.run, with a real kill ---------------------------------------------------

JOB_RATE, JOB_COUNT = 1000, 3000


def stamped_numbers() -> bn.Topology:
    """Paced numbers; each output carries the wall clock it passed the last operator."""
    topo = bn.Topology("first-arrival")
    numbers = topo.source("numbers", bn.sources.Generator(lambda k: k, count=JOB_COUNT,
                                                           rate=JOB_RATE))
    numbers.map("stamp", lambda k: (k, time.time())).sink("out", bn.sinks.Collect())
    return topo


@pytest.mark.usefixtures("ray_session")
def test_latency_after_a_restart_counts_from_first_arrival_and_includes_the_outage(
        tmp_path):
    result = bn.run(stamped_numbers(), protocol=bn.protocols.Coordinated(interval_s=0.3),
                    storage=f"local://{tmp_path}",
                    faults=[bn.faults.KillInstance("stamp", 0, at=1.5)])
    out = result.outputs["out"]
    assert sorted(k for k, _ in out) == list(range(JOB_COUNT))  # exactly once

    # How long the job was down, from the run's own figures: the kill to every task
    # running again from the checkpoint.
    [failure] = result.metrics.protocol.failures
    [fault] = [e for e in result.details["events"] if e["kind"] == "fault"]
    down_s = failure.detected_at_s + failure.restart_s - fault["t_s"]
    assert down_s > 0

    # Brute force, independent of `born`: record k was due at t0 + k / rate. The
    # schedule's start t0 is the earliest any record could have been seen (no record
    # passes the map before it is due), and a record's true latency is when it passed
    # the map (right before the sink, in the same task) less its due time.
    t0 = min(seen_s - k / JOB_RATE for k, seen_s in out)
    true_max_s = max(seen_s - (t0 + k / JOB_RATE) for k, seen_s in out)
    assert true_max_s >= down_s

    # The engine's figure: the largest latency the sinks sampled (the first record of
    # every batch is sampled, the oldest replayed record among them); buckets are 2%
    # wide. Born reset to the read time on replay, it would be a few milliseconds.
    engine_max_s = result.metrics.latency_histogram.percentile(100)
    assert engine_max_s >= 0.97 * down_s
    assert 0.9 * true_max_s - 0.01 <= engine_max_s <= 1.03 * true_max_s + 0.01
