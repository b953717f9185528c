"""Exactly-once drills on a vectorized topology (issue 41, item 3): a source that makes
columns (``Generator(batch_fn=...)``), a ``map_batches``, ``key_by_batch`` and a
running ``Sum`` folded in C. Worker processes are killed mid-stream; every protocol
must commit exactly the reference run's records, by lineage id and value ("exact by
identity") — so a batch function's records and a C fold's state come back from
checkpoints exactly as per-record ones do. A planted defect (sources restoring an
older checkpoint than the operators after them) must be caught on the same topology.
"""

from __future__ import annotations

import pytest

import bastion as bn
from bastion.drills import reference_runs
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")


def readings(k):
    """Record k's reading, for a column of k (elementwise: a replay that cuts the
    stream into other batches makes the same records)."""
    return (k * 7919) % 1000 - 300


def vector_sum(rate: float = 1500, count: int = 3000) -> bn.Topology:
    topo = bn.Topology("drill-vector-sum")
    nums = topo.source("nums", bn.sources.Generator(batch_fn=readings, count=count,
                                                    rate=rate))
    scaled = nums.map_batches("scale", lambda c: c * 3 + 1)
    scaled.key_by_batch(lambda c: c % 11).reduce(
        "total", bn.aggregations.Sum(), parallelism=2).sink("out", bn.sinks.Collect())
    return topo


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('vector-drills')}"


@pytest.fixture(scope="module")
def reference(storage):
    ref = reference_runs(vector_sum(), storage=storage)
    assert len(ref) == 1, "the topology must be deterministic: one reference run"
    # the running sums are what the plain Python reduce gives
    totals: dict[int, int] = {}
    want = []
    for k in range(3000):
        x = readings(k) * 3 + 1
        totals[x % 11] = totals.get(x % 11, 0) + x
        want.append((x % 11, totals[x % 11]))
    assert sorted(ref[0].outputs["out"]) == sorted(want)
    return ref


INCREMENTAL = bn.State(incremental=True, max_chain=3)


@pytest.mark.parametrize("protocol,seed,state", [
    ("coordinated", 0, None), ("uncoordinated", 1, None), ("cic", 2, None),
    ("coordinated", 3, INCREMENTAL), ("cec", 4, None)],
    ids=["coordinated", "uncoordinated", "cic", "coordinated-incremental", "cec"])
def test_kills_lose_duplicate_and_corrupt_nothing(protocol, seed, state, storage,
                                                   reference):
    options = {} if state is None else {"state": state}
    report = bn.drill(vector_sum(), protocol=with_interval(protocol, interval_s=0.4),
                      faults=[bn.faults.RandomKills(count=1, between=(0.6, 1.5))],
                      seed=seed, reference=reference, storage=storage, **options)
    assert [e["kind"] for e in report.events].count("fault") == 1
    assert any(e["kind"] == "restarted" for e in report.events) or (
        report.metrics.protocol.failures), "the kill must have forced a restart"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.corrupted == 0, report.corrupted_examples
    assert report.faults_landed and report.verdict == "exactly-once"


@pytest.mark.internal  # plants its defect in the task behind the context
def test_a_planted_restore_defect_is_caught_on_the_same_topology(storage, reference):
    from test_drill_verdicts import SourcesRestoreOlder, show

    report = bn.drill(vector_sum(), protocol=with_interval(SourcesRestoreOlder(),
                                                           interval_s=0.3),
                      faults=[bn.faults.KillInstance("total", 0, at=1.2)],
                      reference=reference, storage=storage)
    assert report.faults_landed, [f.note for f in report.faults]
    assert report.exactly_once is False and report.verdict == "violated"
    assert report.corrupted > 0, show(report)
