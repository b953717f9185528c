"""The end of a job must not overtake a checkpoint's outputs.

A sink hands its staged outputs to a checkpoint's blob when the barrier passes it. If
the job ends before that checkpoint completes — its acknowledgments still on their
way, or never coming because a source finished before it could inject the barrier —
the blob is neither committed with the checkpoint nor part of the end-of-stream
commit. Before the fix, about one coordinated run in ten of this job lost a
checkpoint's worth of outputs with no fault at all (seen as 1,496 of 2,000 records),
and drills of the keyed join lost thousands. The check is against plain Python: a
keyed running count emits ``(key, 1..n_key)`` for every key, nothing else."""

from __future__ import annotations

import collections

import pytest

import bastion as bn
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

RECORDS = 2000
KEYS = 7


def running_count() -> bn.Topology:
    topo = bn.Topology("end-of-job")
    src = topo.source("src", bn.sources.Generator(lambda i: i, count=RECORDS,
                                                  rate=RECORDS * 4), parallelism=2)
    src.key_by(lambda x: x % KEYS).reduce("count", lambda acc, _: acc + 1, initial=0,
                                          parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def expected() -> list:
    per_key = collections.Counter(i % KEYS for i in range(RECORDS))
    return sorted((key, n) for key, count in per_key.items() for n in range(1, count + 1))


@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated"])
def test_checkpoints_in_flight_when_the_job_ends_lose_no_output(protocol, tmp_path):
    # Checkpoints every 10 ms of a half-second job: one is in flight at the end of
    # nearly every run, and which way the race goes varies, so the job runs many times.
    for run in range(25):
        result = bn.run(running_count(), protocol=with_interval(protocol, interval_s=0.01),
                        storage=f"local://{tmp_path}")
        outputs = sorted(tuple(o) for o in result.outputs["out"])
        assert outputs == expected(), (
            f"run {run}: {len(outputs)} records committed of {RECORDS}; "
            f"{result.metrics.protocol.checkpoints_completed} checkpoints completed")
