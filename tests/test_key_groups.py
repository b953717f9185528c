"""Key groups (`bastion.runtime.key_groups`): every group has exactly one owner at every
parallelism, the owner is the instance whose range holds the group, and keys spread —
sequential names and small ints included, which a CRC32 unmixed did not spread."""

from __future__ import annotations

import pytest

import bastion as bn
from bastion.runtime.key_groups import KEY_GROUPS, groups_of, instance_of_group, key_group


@pytest.mark.parametrize("parallelism", range(1, KEY_GROUPS + 1))
def test_each_group_has_one_owner_whose_range_holds_it(parallelism):
    ranges = [groups_of(i, parallelism) for i in range(parallelism)]
    assert sorted(g for r in ranges for g in r) == list(range(KEY_GROUPS))
    for group in range(KEY_GROUPS):
        assert group in ranges[instance_of_group(group, parallelism)]


@pytest.mark.parametrize("keys", [
    [f"p{i}" for i in range(10)], [f"page{i}" for i in range(12)], list(range(12)),
    [f"user-{i:05d}" for i in range(3000)]])
def test_keys_spread_over_instances(keys):
    for parallelism in (2, 3):
        shares = [sum(bn.instance_of(k, parallelism) == i for k in keys)
                  for i in range(parallelism)]
        # no instance left without keys, none with most of them (a 10-key set at
        # p=2 takes 2..8; unmixed, "p0".."p9" all went to instance 0)
        assert min(shares) >= len(keys) // (4 * parallelism), shares
        assert max(shares) <= len(keys) - len(keys) // (4 * parallelism), shares


def test_a_key_group_is_a_function_of_the_key_alone():
    assert key_group("k") == key_group("k") and 0 <= key_group("k") < KEY_GROUPS
    assert key_group(1) == key_group(1.0) == key_group(True)


def test_a_keyed_operator_wider_than_the_key_groups_is_refused_naming_it():
    from bastion.runtime.plan import build_plan

    topo = bn.Topology("wide")
    topo.source("src", bn.sources.Collection([1])).key_by(lambda v: v).reduce(
        "total", lambda acc, v: acc + v, initial=0, parallelism=KEY_GROUPS + 1).sink(
        "out", bn.sinks.Discard())
    with pytest.raises(bn.TopologyError, match=r"operator 'total': parallelism 129 is "
                                               r"more than the 128 key groups"):
        build_plan(topo)
