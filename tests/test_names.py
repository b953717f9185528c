"""Names are store keys: topology, operator, sink and query names follow one rule,
checked before anything is deployed.

A sink named ``COMMITTED`` landed among the commit markers, and sinks ``a`` and
``a/b`` shared a folder: both crashed the commit bookkeeping. Now a name holds only
ASCII letters, digits, ``_``, ``-`` and ``.``, is not ``.`` or ``..``, is none of the
layout's own key segments in any case, and two operator names may not differ only in
case; the `TopologyError` names the culprit and the rule.
"""

from __future__ import annotations

import pytest

import bastion as bn
from bastion import launcher
from bastion.topology import MAX_NAME_LENGTH, RESERVED_NAMES, check_name

BAD = ["COMMITTED", "committed", "Manifest", "MANIFEST", "channels", "CHANNELS", "a/b",
       "../up", ".", "..", "a b", "", "tab\there", "a\\b", "a:b", "naïve", "x" * 101,
       "new\nline", "nul\x00"]
GOOD = ["a", "A", "a.b", "a..b", ".a", "v1.2-rc_3", "x" * MAX_NAME_LENGTH, "COMMITTED2",
        "manifests", "my-channels", "0"]


def source(topo: bn.Topology) -> bn.Stream:
    return topo.source("src", bn.sources.Collection(range(10)))


def refused(build, name: str) -> str:
    with pytest.raises(bn.TopologyError) as caught:
        build(name)
    message = str(caught.value)
    assert repr(name) in message  # the culprit
    assert "Names become keys in the store" in message and "rename it" in message
    return message


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_naming_the_culprit_and_the_rule(name):
    def sink(n):
        source(bn.Topology("t")).sink(n, bn.sinks.Collect())

    def operator(n):
        source(bn.Topology("t")).map(n, abs).sink("out", bn.sinks.Collect())

    def keyed(n):
        source(bn.Topology("t")).key_by(abs).reduce(n, max, initial=0)

    def query(n):
        bn.Topology("t").query(n, outputs=["out"])

    assert refused(sink, name).startswith(f"sink name {name!r}")
    assert refused(operator, name).startswith(f"map operator name {name!r}")
    assert refused(keyed, name).startswith(f"reduce operator name {name!r}")
    assert refused(query, name).startswith(f"query name {name!r}")
    assert refused(bn.Topology, name).startswith(f"topology name {name!r}")


def test_the_message_says_what_is_wrong():
    assert "'COMMITTED' is reserved (in any case): jobs/<job>/outputs/COMMITTED/" in (
        refused(lambda n: check_name("sink", n), "committed"))
    assert "it contains '/'" in refused(lambda n: check_name("sink", n), "a/b")
    assert "it contains ' ', 'ï'" in refused(lambda n: check_name("sink", n), "naïve x")
    assert "is 101 characters long" in refused(lambda n: check_name("sink", n), "x" * 101)
    assert "'..' means a folder" in refused(lambda n: check_name("sink", n), "..")
    with pytest.raises(bn.TopologyError, match="sink name 3: it is a int, not a str"):
        check_name("sink", 3)
    assert set(RESERVED_NAMES) == {"COMMITTED", "MANIFEST", "channels"}


@pytest.mark.parametrize("name", GOOD)
def test_good_names_are_accepted(name):
    topo = bn.Topology(name)
    source(topo).map(name, abs).sink("out", bn.sinks.Collect())
    topo.query(name, outputs=["out"])
    topo.validate()
    topo = bn.Topology("t")
    source(topo).sink(name, bn.sinks.Collect())
    topo.validate()


def test_sinks_a_and_a_slash_b_cannot_share_a_folder():
    topo = bn.Topology("nested")
    stream = source(topo)
    stream.sink("a", bn.sinks.Collect())
    message = refused(lambda n: stream.sink(n, bn.sinks.Collect()), "a/b")
    assert message.startswith("sink name 'a/b': it contains '/'")


def test_operator_names_that_differ_only_in_case_collide():
    topo = bn.Topology("cased")
    stream = source(topo)
    stream.sink("out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError,
                       match=r"operator names 'out' and 'Out' \(a sink\) differ only in case"):
        stream.sink("Out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="'src' and 'SRC' .a map. differ only in case"):
        stream.map("SRC", abs)
    topo.query("Q", outputs=["out"])
    topo.query("q", outputs=["out"])  # queries are not store keys: case is theirs


@pytest.fixture
def no_deploy(monkeypatch):
    """Fail the test if a run gets as far as starting Ray or preparing a sink."""
    def deployed(*args, **kwargs):
        raise AssertionError("the run was deployed")

    monkeypatch.setattr(launcher, "ensure_ray", deployed)
    monkeypatch.setattr(bn.sinks.Collect, "prepare", deployed, raising=False)


def test_names_changed_after_building_are_refused_before_deploy(no_deploy, tmp_path):
    storage = f"local://{tmp_path}"
    topo = bn.Topology("renamed")
    source(topo).sink("out", bn.sinks.Collect())
    topo.name = "bad/name"
    with pytest.raises(bn.TopologyError, match="topology name 'bad/name': it contains '/'"):
        bn.run(topo, storage=storage)

    topo = bn.Topology("renamed")
    source(topo).sink("out", bn.sinks.Collect())
    topo.nodes["out"].name = "COMMITTED"
    with pytest.raises(bn.TopologyError, match="sink name 'COMMITTED': 'COMMITTED' is "
                                               "reserved"):
        bn.run(topo, storage=storage)

    topo = bn.Topology("renamed")
    source(topo).sink("out", bn.sinks.Collect())
    topo.nodes["OUT"] = topo.nodes.pop("out")
    topo.nodes["OUT"].name = "OUT"
    topo.nodes["out"] = bn.topology.OpNode("out", "sink", 1, [bn.topology.Input("src")],
                                           {"sink": bn.sinks.Collect()})
    with pytest.raises(bn.TopologyError, match="'OUT' and 'out' .a sink. differ only in case"):
        bn.run(topo, storage=storage)


def test_unusual_good_names_run_and_commit(ray_session, tmp_path):
    """Sinks ``a`` and ``a.b`` (where ``a/b`` used to be) and names with dots and
    dashes commit their outputs under their own keys."""
    topo = bn.Topology("Names.v1-x_y")
    stream = topo.source("src.v1", bn.sources.Collection(range(50)))
    doubled = stream.map("x2-.a_", lambda v: 2 * v)
    doubled.sink("a", bn.sinks.Collect())
    doubled.sink("a.b", bn.sinks.Log(f"local://{tmp_path}/log"))
    stream.sink("committed-not", bn.sinks.Collect())
    topo.query("the.query", outputs=["a", "a.b"])
    result = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.1),
                    storage=f"local://{tmp_path}/jobs")
    assert result.outputs["a"] == result.outputs["a.b"] == [2 * v for v in range(50)]
    assert result.outputs["committed-not"] == list(range(50))
