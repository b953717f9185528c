"""``import bastion`` is cheap: the package root loads its names on first use.

Building a topology — sources, sinks, windows, aggregations, faults, validation —
is describing a job, so it must not start Ray, load the runtime or open storage; a
malformed topology then fails in milliseconds, before any of them is loaded. Each
check runs in a fresh interpreter, where ``sys.modules`` shows what really got
imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import bastion as bn

BUILD_A_TOPOLOGY = """
import json, sys
import bastion as bn

topo = bn.Topology("described")
clicks = topo.source("clicks", bn.sources.Collection([("home", 1.0)] * 10),
                     timestamp=lambda e: e[1])
logged = topo.source("logged", bn.sources.Log("local:///tmp/bastion-lazy-import/in"))
counts = clicks.union(logged, name="both").key_by(lambda e: e[0]).window(
    bn.windows.Tumbling(5)).aggregate("count", bn.aggregations.Count())
counts.sink("file", bn.sinks.File("/tmp/bastion-lazy-import/out.jsonl"))
counts.sink("log", bn.sinks.Log("local:///tmp/bastion-lazy-import/out"))
topo.validate()
faults = [bn.faults.KillInstance("count", 0, at=1.0), bn.faults.RandomKills(2)]
try:
    bn.Topology("malformed").source("s", bn.sources.Collection([1]), parallelism=0)
except bn.TopologyError:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return set(json.loads(out))


def test_building_a_topology_loads_neither_ray_nor_the_runtime_nor_storage_io():
    loaded = modules_after(BUILD_A_TOPOLOGY)
    assert "bastion.topology" in loaded and "bastion.sinks" in loaded
    heavy = sorted(m for m in loaded if m == "ray" or m.startswith((
        "ray.", "bastion.runtime", "bastion.launcher", "bastion.scheduler",
        "bastion.connectors", "bastion.storage.store", "bastion.storage.log", "boto")))
    assert heavy == []


def test_every_public_name_loads_on_first_use():
    assert set(bn.__all__) <= set(dir(bn))
    for name in bn.__all__:
        assert getattr(bn, name) is not None
    assert bn.run.__module__ == "bastion.launcher"
    assert bn.faults.KillNode.__module__ == "bastion.faults"
    assert bn.sinks.Collect.__module__ == "bastion.sinks"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        bn.no_such_name  # noqa: B018


def test_a_star_import_gets_every_public_name():
    code = "from bastion import *; print(run.__name__, Topology.__name__)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert loaded == ["run", "Topology"]
