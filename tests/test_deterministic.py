"""Deterministic mode through the public API: order-sensitive topologies commit the
same outputs in the same order in every run — failure-free or recovered from real
process kills under every exactly-once protocol — and topologies that cannot be
deterministic are refused before anything is deployed, with the reason."""

from __future__ import annotations

import pytest

import bastion as bn
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")


def running_sums(count: int = 4000, rate: float | None = None) -> bn.Topology:
    """The issue's shape: a running sum and a window behind a parallel filter."""
    topo = bn.Topology("det-sums")
    tx = topo.source("tx", bn.sources.Generator(
        lambda i: {"account": f"a{(i * 7) % 11}", "merchant": f"m{(i * 3) % 5}",
                   "amount": (i % 17) + 0.25, "ts": i * 0.002},
        count=count, rate=rate), timestamp=lambda t: t["ts"])
    ok = tx.filter("ok", lambda t: t["amount"] > 2, parallelism=2)
    ok.key_by(lambda t: t["account"]).reduce(
        "sum", lambda acc, t: acc + t["amount"], initial=0.0, parallelism=2).sink(
        "sums", bn.sinks.Collect())
    ok.key_by(lambda t: t["merchant"]).window(bn.windows.Tumbling(1.0)).aggregate(
        "per-merchant", bn.aggregations.Sum(lambda t: t["amount"]), parallelism=2).sink(
        "windows", bn.sinks.Collect())
    return topo


def joined_history(count: int = 1500, rate: float | None = None) -> bn.Topology:
    """A keyed join of two parallel streams, then a per-user history of the pairs (the
    order of each history is the order the join produced them)."""
    topo = bn.Topology("det-join")
    orders = topo.source("orders", bn.sources.Generator(
        lambda i: {"user": i % 7, "order": i, "ts": i * 0.01}, count=count, rate=rate),
        timestamp=lambda o: o["ts"], parallelism=2)
    pays = topo.source("pays", bn.sources.Generator(
        lambda i: {"user": (i * 3) % 7, "pay": i, "ts": i * 0.01 + 0.004}, count=count,
        rate=rate), timestamp=lambda p: p["ts"], parallelism=2)
    pairs = orders.key_by(lambda o: o["user"]).join(
        pays.key_by(lambda p: p["user"]), "match", window=bn.windows.Tumbling(0.5),
        parallelism=2)
    pairs.key_by(lambda t: t[0]).stateful_map(
        "history", lambda seen, t: (seen + [t[1]["order"] * 10000 + t[2]["pay"]],
                                    len(seen) * 7919 + t[1]["order"] - t[2]["pay"]),
        initial=[], parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def unioned(count: int = 3000, rate: float | None = None) -> bn.Topology:
    topo = bn.Topology("det-union")
    a = topo.source("a", bn.sources.Generator(lambda i: i, count=count, rate=rate),
                    parallelism=2)
    b = topo.source("b", bn.sources.Generator(lambda i: -i, count=count, rate=rate))
    a.union(b, name="both", parallelism=2).key_by(lambda x: x % 3).reduce(
        "order", lambda acc, x: (acc * 31 + x) % 1_000_003, initial=1,
        parallelism=2).sink("out", bn.sinks.Collect())
    return topo


SHAPES = {"sums": running_sums, "join": joined_history, "union": unioned}


@pytest.mark.parametrize("shape", SHAPES)
def test_three_runs_commit_identical_outputs_in_order(shape):
    runs = [bn.run(SHAPES[shape](), deterministic=True, lineage=True) for _ in range(3)]
    for sink, values in runs[0].outputs.items():
        assert values, f"{shape}: sink {sink} committed nothing"
        for other in runs[1:]:
            assert other.outputs[sink] == values
            assert other.output_ids[sink] == runs[0].output_ids[sink]


@pytest.mark.parametrize("protocol,shape,seed", [
    ("coordinated", "sums", 0), ("uncoordinated", "join", 1), ("cic", "union", 2),
    pytest.param("coordinated", "join", 3, marks=pytest.mark.slow),
    pytest.param("uncoordinated", "union", 4, marks=pytest.mark.slow),
    pytest.param("cic", "sums", 5, marks=pytest.mark.slow),
])
def test_a_recovered_run_commits_exactly_the_failure_free_sequence(protocol, shape, seed,
                                                                   tmp_path):
    storage = f"local://{tmp_path}"
    options = dict(protocol=with_interval(protocol, interval_s=0.3), storage=storage,
                   deterministic=True, lineage=True)
    build = SHAPES[shape]
    reference = bn.run(build(count=5000, rate=2500), **options)
    faulty = bn.run(build(count=5000, rate=2500), faults=[
        bn.faults.RandomKills(count=1, between=(0.5, 1.2), seed=seed)], **options)
    assert faulty.metrics.protocol.failures, "the kill must have forced a restart"
    assert faulty.outputs == reference.outputs
    assert faulty.output_ids == reference.output_ids


def test_a_feedback_edge_cannot_be_deterministic():
    topo = bn.Topology("det-loop")
    src = topo.source("edges", bn.sources.Collection([1, 2, 3]))
    step = src.map("step", lambda x: x)
    step.sink("out", bn.sinks.Collect())
    topo.feedback(step, "step")
    with pytest.raises(bn.TopologyError, match="deterministic=True: the feedback edge "
                                               "'step' -> 'step' closes a cycle"):
        bn.run(topo, protocol="uncoordinated", deterministic=True)


def test_windows_on_ingest_time_cannot_be_deterministic():
    topo = bn.Topology("det-ingest")
    clicks = topo.source("clicks", bn.sources.Collection(["a", "b"]))
    clicks.key_by(lambda c: c).window(bn.windows.Tumbling(1.0)).aggregate(
        "per-page", bn.aggregations.Count()).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="'per-page' windows on ingest time: "
                                               "source 'clicks' has no timestamp"):
        bn.run(topo, deterministic=True)
    # count windows do not depend on time: the same shape runs
    topo = bn.Topology("det-count")
    clicks = topo.source("clicks", bn.sources.Collection(["a", "b", "a"]))
    clicks.key_by(lambda c: c).window(bn.windows.Count(2)).aggregate(
        "pairs", bn.aggregations.Count()).sink("out", bn.sinks.Collect())
    outputs = bn.run(topo, deterministic=True).outputs["out"]
    assert [(key, n) for key, _, _, n in outputs] == [("a", 2)]
