"""Key hashing: a key routes by a hash that every process computes alike, or the job
refuses it. A key whose hash would come from a memory address (the default repr)
would land on a different instance in every process, so it fails the job naming the
operator that keys the stream; a key with a stable repr, like a dataclass, routes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

import bastion as bn
from bastion.runtime.records import UnstableKeyError, stable_hash


def test_equal_keys_hash_equal_at_the_top_and_inside_tuples_and_sets():
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    assert stable_hash((1, "a")) == stable_hash((1.0, "a")) == stable_hash((True, "a"))
    assert stable_hash(frozenset({1, 2})) == stable_hash(frozenset({2.0, True}))
    assert stable_hash((1, "a")) != stable_hash((2, "a"))


def test_a_default_repr_has_no_stable_hash_even_nested():
    class Opaque:
        pass

    for key in (Opaque(), (1, Opaque()), frozenset({Opaque()}), lambda: 0):
        with pytest.raises(UnstableKeyError, match="has no stable hash"):
            stable_hash(key)


@dataclass(frozen=True)
class Page:
    name: str


def test_a_dataclass_key_hashes_the_same_in_another_process():
    # a dataclass's repr names its class by qualified name: the other process imports
    # the same class rather than defining a look-alike
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
            "from test_key_hashing import Page\n"
            "from bastion.runtime.records import stable_hash\n"
            "print(stable_hash(Page('home')))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout
    assert int(other) == stable_hash(Page("home"))


@pytest.mark.usefixtures("ray_session")
def test_a_job_keyed_by_a_default_repr_object_fails_naming_the_keyed_operator():
    class Opaque:
        def __init__(self, n):
            self.n = n

    topo = bn.Topology("opaque-keys")
    topo.source("nums", bn.sources.Collection(range(20))).key_by(
        lambda x: Opaque(x % 2)).reduce("count", lambda acc, x: acc + 1, initial=0,
                                        parallelism=2).sink("out", bn.sinks.Collect())
    unstable = (r"operator 'count'.*key of type Opaque has no stable hash \(its repr "
                r"contains a memory address\)")
    with pytest.raises(bn.UDFError, match=unstable):
        bn.run(topo)


@pytest.mark.usefixtures("ray_session")
def test_a_job_keyed_by_a_dataclass_routes_every_key_to_one_instance():
    @dataclass(frozen=True)
    class PageKey:
        name: str

    topo = bn.Topology("dataclass-keys")
    topo.register_codec(PageKey, 9, lambda p: p.name.encode(), lambda b: PageKey(b.decode()))
    topo.source("visits", bn.sources.Collection(range(60))).key_by(
        lambda x: PageKey(f"p{x % 3}")).reduce(
        "count", lambda acc, x: acc + 1, initial=0, parallelism=2).map(
        "named", lambda kv: (kv[0].name, kv[1])).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    final = {}
    for name, count in result.outputs["out"]:
        final[name] = max(final.get(name, 0), count)
    # one instance saw all 20 visits of each page: a split key would count less
    assert final == {"p0": 20, "p1": 20, "p2": 20}
