"""Cyclic dataflows: the reachability query of CheckMate §VI with a feedback edge.

A feedback loop has no natural end: its head keeps consuming what comes back around.
The job master ends it when every task is idle and every frame sent was processed
(distributed termination detection). Coordinated checkpoints cannot align around a
cycle and refuse it; the uncoordinated and communication-induced protocols run it,
recover it after a kill, and HMNR leaves no useless checkpoint behind.
"""

from __future__ import annotations

import collections

import pytest

import bastion as bn
from bastion.bench import nexmark as nx
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

GRAPH = nx.ReachabilityConfig(seed=3, vertices=300, links=1200)


def reach_topology():
    topo = bn.Topology("reachability")
    sink = nx.reachability(topo, GRAPH, bn.sinks.Collect(), parallelism=2)
    return topo, sink


def pairs(outputs):
    return collections.Counter((root, vertex) for root, vertex, _path in outputs)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('cycles')}"


@pytest.mark.parametrize("protocol", ["none", "uncoordinated", "cic"])
def test_reachability_loop_terminates_with_the_bfs_answer(protocol, storage):
    topo, sink = reach_topology()
    assert topo.has_feedback()
    result = bn.run(topo, protocol=with_interval(protocol, interval_s=0.05), storage=storage)
    found = pairs(result.outputs[sink])
    assert set(found) == nx.reachability_reference(GRAPH)
    assert max(found.values()) == 1, "every (root, vertex) pair is reported once"
    assert any(e["kind"] == "loops_quiescent" for e in result.details["events"])
    if protocol == "cic":
        # HMNR forces checkpoints where a Z-cycle would form: none is useless
        assert result.metrics.protocol.checkpoints_completed > 0
        assert result.metrics.protocol.invalid_checkpoints == 0


@pytest.mark.parametrize("protocol", ["uncoordinated", "cic"])
def test_a_kill_inside_the_loop_loses_and_duplicates_nothing(protocol, storage):
    topo, sink = reach_topology()
    join = next(name for name in topo.nodes if name.endswith("join"))
    report = bn.drill(topo, protocol=with_interval(protocol, interval_s=0.05), storage=storage,
                      faults=[bn.faults.KillInstance(join, 1, at=0.25)])
    # at least the kill's restart (a missed heartbeat on a busy machine may add one)
    assert report.metrics.protocol.failures
    found = pairs(report.outputs[sink])
    assert set(found) == nx.reachability_reference(GRAPH)
    assert max(found.values()) == 1
