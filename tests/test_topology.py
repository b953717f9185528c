"""Validation: malformed topologies raise TopologyError naming the operator, before deploy."""

from __future__ import annotations

import pytest

import bastion as bn
from bastion.runtime.plan import build_plan


def base(name="t"):
    topo = bn.Topology(name)
    return topo, topo.source("src", bn.sources.Collection([1, 2, 3]))


def test_duplicate_names():
    topo, src = base()
    src.map("m", str)
    with pytest.raises(bn.TopologyError, match="'m' is used twice"):
        src.filter("m", bool)


@pytest.mark.parametrize("parallelism", [0, -1, 1.5, True])
def test_parallelism_below_one_or_not_int(parallelism):
    topo, src = base()
    with pytest.raises(bn.TopologyError, match="operator 'm': parallelism"):
        src.map("m", str, parallelism=parallelism)


def test_operator_without_path_to_a_sink():
    topo, src = base()
    src.map("dangling", str)
    src.sink("out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="operator 'dangling' has no path to a sink"):
        topo.validate()


def test_no_sink_at_all():
    topo, src = base()
    src.map("m", str)
    with pytest.raises(bn.TopologyError, match="has no sink"):
        topo.validate()


def test_join_of_unkeyed_streams():
    topo, src = base()
    other = topo.source("other", bn.sources.Collection([1]))
    with pytest.raises(bn.TopologyError, match="join 'j': both inputs must be keyed"):
        src.key_by(lambda x: x).join(other, "j", window=bn.windows.Tumbling(1))


def test_join_needs_a_time_window():
    topo, src = base()
    other = topo.source("other", bn.sources.Collection([1]))
    with pytest.raises(bn.TopologyError, match="join 'j': window must be"):
        src.key_by(lambda x: x).join(other.key_by(lambda x: x), "j", window=bn.windows.Count(3))


def test_cycle_not_declared_as_feedback():
    topo, src = base()
    a = src.map("a", str)
    b = a.map("b", str)
    b.sink("out", bn.sinks.Collect())
    topo.connect(b, "a")
    with pytest.raises(bn.TopologyError, match="operator 'a' is on a cycle .* not declared "
                                                "as feedback"):
        topo.validate()


def test_declared_feedback_cycle_is_valid():
    topo, src = base()
    a = src.map("a", str)
    b = a.map("b", str)
    b.sink("out", bn.sinks.Collect())
    topo.feedback(b, "a")
    topo.validate()
    assert topo.has_feedback()
    plan = build_plan(topo)
    feedback_edges = [e for c in plan.chains for e in c.inputs if e.feedback]
    assert [(e.src_op, e.dst_op) for e in feedback_edges] == [("b", "a")]


@pytest.mark.parametrize("make,match", [
    (lambda: bn.windows.Tumbling(0), "Tumbling window needs size > 0"),
    (lambda: bn.windows.Tumbling(-5), "Tumbling window needs size > 0"),
    (lambda: bn.windows.Sliding(0, 1), "Sliding window needs size > 0"),
    (lambda: bn.windows.Sliding(10, 0), "Sliding window needs slide > 0"),
    (lambda: bn.windows.Sliding(5, 10), "slide .* is larger than its size"),
    (lambda: bn.windows.Count(0), "Count window needs n >= 1"),
])
def test_window_spec_sizes(make, match):
    with pytest.raises(bn.TopologyError, match=match):
        make()


def test_unknown_names_in_edges_and_queries():
    topo, src = base()
    src.sink("out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="no operator named 'nope'"):
        topo.feedback("nope", "out")
    topo.query("q", outputs=["src"])
    with pytest.raises(bn.TopologyError, match="query 'q' names 'src', which is not a sink"):
        topo.validate()


def test_non_callable_and_wrong_types():
    topo, src = base()
    with pytest.raises(bn.TopologyError, match="operator 'm': fn must be callable"):
        src.map("m", 42)
    with pytest.raises(bn.TopologyError, match="sink 'out': expected a bastion sink"):
        src.sink("out", [])
    with pytest.raises(bn.TopologyError, match="source 's2': expected a bastion source"):
        topo.source("s2", [1, 2])
    with pytest.raises(bn.TopologyError, match="aggregate 'w'.*lacks create"):
        src.key_by(lambda x: x).window(bn.windows.Tumbling(1)).aggregate("w", object())


def test_unbounded_source_needs_a_duration():
    topo = bn.Topology("forever")
    topo.source("gen", bn.sources.Generator(lambda i: i)).sink("out", bn.sinks.Discard())
    with pytest.raises(bn.TopologyError, match="source 'gen' is unbounded: pass duration_s"):
        bn.run(topo)


def test_chaining_plan():
    topo = bn.Topology("chain")
    src = topo.source("src", bn.sources.Collection([1]), parallelism=2)
    m = src.map("m", str).filter("f", bool)                      # inherit parallelism 2
    counted = m.key_by(str).reduce("r", lambda a, v: a + 1, initial=0)
    counted.sink("out", bn.sinks.Collect())
    plan = build_plan(topo)
    assert [c.ops for c in plan.chains] == [["src", "m", "f"], ["r", "out"]]
    assert plan.workers == 2 and len(plan.tasks) == 4
    unchained = build_plan(topo, chaining=False)
    assert len(unchained.chains) == 5
    # parallelism 1 everywhere: the keyed edge is forward too, all in one chain
    topo1 = bn.Topology("one")
    s1 = topo1.source("src", bn.sources.Collection([1]))
    s1.key_by(str).reduce("r", lambda a, v: a + 1, initial=0).sink("out", bn.sinks.Collect())
    assert [c.ops for c in build_plan(topo1).chains] == [["src", "r", "out"]]
