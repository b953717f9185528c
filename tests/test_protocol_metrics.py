"""Protocol metrics as CheckMate §V defines them, typed in `RunResult.metrics.protocol`
and recorded as events in the store."""

from __future__ import annotations

import msgpack
import pytest

import bastion as bn
from bastion.storage import open_store
from protocol_knobs import with_interval

from test_drills import wordcount

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('metrics')}"


@pytest.fixture(scope="module")
def runs(storage):
    return {protocol: bn.run(wordcount(rate=3000, count=3000),
                             protocol=with_interval(protocol, interval_s=0.2),
                             storage=storage)
            for protocol in ("none", "coordinated", "uncoordinated", "cic")}


def test_checkpoint_counts_and_durations(runs):
    assert runs["none"].metrics.protocol.checkpoints_completed == 0
    for protocol in ("coordinated", "uncoordinated", "cic"):
        m = runs[protocol].metrics.protocol
        assert m.protocol == protocol
        assert m.checkpoints_completed >= 2
        assert 0 < m.checkpoint_duration_s_avg <= m.checkpoint_duration_s_max
        assert m.failures == []
    assert runs["coordinated"].metrics.protocol.invalid_checkpoints == 0


def test_message_overhead_is_what_each_protocol_adds_to_the_wire(runs):
    none, coordinated, unc, cic = (runs[p].metrics.protocol for p in
                                   ("none", "coordinated", "uncoordinated", "cic"))
    assert none.protocol_bytes == 0 and none.data_bytes > 0
    # barriers and acknowledgments, acknowledgments with channel counters, and a clock
    # piggybacked on every data frame (CheckMate Table II: cic is the costly one)
    assert coordinated.protocol_bytes > 0 and unc.protocol_bytes > 0
    assert cic.protocol_bytes > unc.protocol_bytes
    assert 0 < coordinated.message_overhead < cic.message_overhead
    # the data itself is the same whatever the protocol adds around it
    assert abs(cic.data_bytes - none.data_bytes) < 0.2 * none.data_bytes
    assert unc.log_bytes > 0 and coordinated.log_bytes == 0


def test_latency_over_time(runs):
    timeline = runs["coordinated"].metrics.latency_timeline
    assert len(timeline) >= 5
    samples = [(p50, p99) for _, p50, p99 in timeline if p50 is not None]
    assert samples and all(p50 <= p99 for p50, p99 in samples)


def test_restart_and_recovery_time_of_a_failure_are_measured_and_stored(storage):
    report = bn.drill(wordcount(), protocol=bn.protocols.Uncoordinated(interval_s=0.3),
                      faults=[bn.faults.KillInstance("count", 1, at=1.0)], storage=storage)
    assert report.exactly_once
    [failure] = report.metrics.protocol.failures
    assert "died" in failure.reason or "heartbeat" in failure.reason
    assert failure.restart_s == pytest.approx(report.restart_s)
    assert failure.recovery_s is None or failure.recovery_s >= failure.restart_s
    assert isinstance(failure.recovery_line, dict)
    # counters are restored with the state: they count the history of the outputs
    assert report.metrics.source_records == 3000
    assert report.metrics.sink_records == len(report.outputs["out"])
    assert report.metrics.operators["split"].records_out == 9000
    data = open_store(storage).get(f"jobs/{report.job_id}/events/job-master")
    unpacker = msgpack.Unpacker(strict_map_key=False)
    unpacker.feed(data)
    kinds = [e["kind"] for e in unpacker]
    for kind in ("fault", "failure_detected", "restarted", "recovery",
                 "checkpoint_completed", "progress"):
        assert kind in kinds
