"""Recovery without a capacity model: every lost slot gets a worker at once (the
standby first) and every slot restarts from the recovery line, as the job master's
``recovery_planned`` event records. The planners of a capacity model are tested in
`test_progressive_recovery`."""

from __future__ import annotations

import collections

import pytest

import bastion as bn


WORDS = ["ant", "bee", "cat", "dog", "eel"]


@pytest.mark.usefixtures("ray_session")
def test_a_recovery_carries_out_the_plan_and_restarts_every_slot(tmp_path):
    count = 3000
    topo = bn.Topology("planned")
    topo.source("words", bn.sources.Generator(lambda i: WORDS[i % len(WORDS)], count=count,
                                              rate=1500)) \
        .key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0,
                                    parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.3),
                    storage=f"local://{tmp_path}",
                    faults=[bn.faults.KillInstance("count", 1, at=1.0)])
    planned = [e for e in result.details["events"] if e["kind"] == "recovery_planned"]
    assert planned, "the kill never caused a recovery"
    for event in planned:
        assert event["restart"] == [0, 1]
        assert sorted(event["to_standby"] + event["to_fresh"]) == sorted(event["lost"])
    assert 1 in planned[0]["lost"]          # the slot of count[1]
    per_word = collections.defaultdict(list)
    for word, n in result.outputs["out"]:
        per_word[word].append(n)
    assert {w: sorted(ns) for w, ns in per_word.items()} == {
        w: list(range(1, count // len(WORDS) + 1)) for w in WORDS}
