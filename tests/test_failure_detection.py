"""Failure detection must not mistake a busy worker for a dead one.

A task loop that never waits (an unpaced source feeding a chained keyed count) keeps
its worker's GIL; the heartbeat is answered on another thread of the same process.
Before the task loop released the GIL now and then, such runs missed a 1 s heartbeat
about two seconds in and restarted for nothing, again and again."""

from __future__ import annotations

import pytest

import bastion as bn

pytestmark = pytest.mark.usefixtures("ray_session")


def busy_keyed_count(count: int) -> bn.Topology:
    topo = bn.Topology("busy")
    src = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count))
    src.key_by(lambda i: i % 100).reduce("count", lambda acc, _: acc + 1, initial=0) \
        .sink("out", bn.sinks.Discard())
    return topo


@pytest.mark.parametrize("protocol", ["none", "coordinated"])
def test_a_busy_worker_is_not_declared_dead(protocol, tmp_path):
    result = bn.run(busy_keyed_count(8_000_000), protocol=protocol,
                    checkpoint_interval=1.0 if protocol != "none" else None,
                    heartbeat_timeout_s=0.5, storage=f"local://{tmp_path}")
    assert result.metrics.duration_s > 1.0  # long enough for a heartbeat to go missing
    assert result.metrics.protocol.failures == []
    assert result.metrics.source_records == 8_000_000
