"""Bounded sink staging: a sink writes what it staged as parts of the current commit
point once it holds ``bn.run(sink_spill_records=...)`` records; readers read exactly the
parts a commit point lists (`bastion.runtime.outputs`)."""

from __future__ import annotations

import pytest

import bastion as bn
from bastion.runtime.durable import DurableCodec
from bastion.runtime.outputs import (committed_blobs, encode_part, part_key, read_committed)
from bastion.storage import open_store
from bastion.storage.errors import CorruptBlobError

pytestmark = pytest.mark.usefixtures("ray_session")

SPILL_RECORDS = 100
BATCH_RECORDS = 50  # frames and source reads: what a sink receives at once


def _sink_reports(result: bn.RunResult, sink: str) -> list[dict]:
    return [task["sinks"][sink] for task in result.details["tasks"] if sink in task["sinks"]]


def test_none_spills_parts_and_commits_exactly_the_records(tmp_path):
    topo = bn.Topology("spill-none")
    topo.source("src", bn.sources.Collection(range(2000))).map(
        "pair", lambda v: (v, [v]), parallelism=2).sink("out", bn.sinks.Collect(),
                                                        parallelism=2)
    result = bn.run(topo, storage=f"local://{tmp_path}", lineage=True,
                    limits=bn.Limits(sink_spill_records=SPILL_RECORDS),
                    data_plane=bn.DataPlane(frame_records=BATCH_RECORDS, source_batch_records=BATCH_RECORDS))
    assert sorted(result.outputs["out"]) == [(v, [v]) for v in range(2000)]
    assert len(set(result.output_ids["out"])) == 2000
    reports = _sink_reports(result, "out")
    assert sum(r["spilled_parts"] for r in reports) >= 2000 // (SPILL_RECORDS + BATCH_RECORDS)
    # what a sink held in memory never grew past the threshold and one batch
    assert 0 < max(r["max_staged_records"] for r in reports) < SPILL_RECORDS + BATCH_RECORDS

    # A part no commit blob lists — as a failed attempt leaves it — is never read, and
    # a listed part replaced by other bytes is refused, not read.
    store = open_store(f"local://{tmp_path}")
    stale = part_key(result.job_id, "out", 0, 999, 0)
    store.put(stale, encode_part(DurableCodec(), ["stale"], [("stale",)]))
    values, ids = read_committed(store, result.job_id, "out")
    assert sorted(values) == [(v, [v]) for v in range(2000)] and len(ids) == 2000
    listed = next(key for key in store.list(f"jobs/{result.job_id}/outputs/out/")
                  if "/part-" in key and key != stale)
    store.put(listed, encode_part(DurableCodec(), ["forged"], [("forged",)]))
    with pytest.raises(CorruptBlobError, match=listed):
        read_committed(store, result.job_id, "out")


def test_coordinated_with_a_kill_and_spilling_is_exactly_once(tmp_path):
    topo = bn.Topology("spill-kill")
    topo.source("src", bn.sources.Generator(lambda i: i, count=4000, rate=1500)).key_by(
        lambda v: v % 7).reduce("sum", lambda acc, v: acc + v, initial=0,
                                parallelism=2).sink("out", bn.sinks.Collect())
    report = bn.drill(topo, protocol=bn.protocols.Coordinated(interval_s=0.5),
                      faults=[bn.faults.KillInstance("sum", 0, at=1.2)],
                      storage=f"local://{tmp_path}",
                      limits=bn.Limits(sink_spill_records=SPILL_RECORDS),
                      data_plane=bn.DataPlane(frame_records=BATCH_RECORDS, source_batch_records=BATCH_RECORDS))
    assert [f.landed for f in report.faults] == [True]
    assert report.exactly_once, report.verdict_reason
    store = open_store(f"local://{tmp_path}")
    parts = [key for key in store.list(f"jobs/{report.job_id}/outputs/out/")
             if "/part-" in key]
    assert parts, "no sink spilled: the test would not exercise parts"
    # every key committed by the faulty run is complete: the last running sum per key
    values, _ = read_committed(store, report.job_id, "out")
    last = {}
    for key, total in values:
        last[key] = total
    assert last == {k: sum(range(k, 4000, 7)) for k in range(7)}
    assert committed_blobs(store, report.job_id, "out")
