"""Recovery plans: what the job master accepts, and that it carries out the plan.

Every slot must restart from the recovery line today (`bastion.scheduler.recovery`
says why): a plan that would keep a survivor running, leave a lost slot without a
worker, or give the one standby two slots is refused with a clear error instead of
being carried out in part.
"""

from __future__ import annotations

import collections

import pytest

import bastion as bn
from bastion.scheduler.recovery import (BlockingRecovery, Capacity, RecoveryPlan,
                                        RecoveryPlanError, check_plan)


@pytest.mark.parametrize("lost", [[0], [3], [1, 2], [0, 1, 2, 3]])
@pytest.mark.parametrize("standby", [True, False])
def test_every_blocking_plan_passes_the_check(lost, standby):
    plan = BlockingRecovery().plan(lost, 4, Capacity(standby=standby))
    check_plan(plan, lost, 4)
    assert plan.restart == (0, 1, 2, 3)


@pytest.mark.parametrize("plan,complaint", [
    # progressive-style: restart the lost slot only, keep the survivors running
    (RecoveryPlan(to_standby=(1,), to_fresh=(), restart=(1,)),
     "slots [0, 2] would run out of step"),
    (RecoveryPlan(to_standby=(), to_fresh=(), restart=(0, 1, 2)),
     "replaces slots [], but the lost slots are [1]"),
    (RecoveryPlan(to_standby=(1,), to_fresh=(1,), restart=(0, 1, 2)),
     "replaces slots [1, 1]"),
    (RecoveryPlan(to_standby=(1,), to_fresh=(), restart=(0, 1, 2, 5)),
     "restarts slots [0, 1, 2, 5] of 3"),
])
def test_a_plan_the_job_master_cannot_carry_out_is_refused(plan, complaint):
    with pytest.raises(RecoveryPlanError) as refused:
        check_plan(plan, [1], 3)
    assert complaint in str(refused.value)


def test_the_standby_takes_one_slot_only():
    plan = RecoveryPlan(to_standby=(0, 1), to_fresh=(), restart=(0, 1, 2))
    with pytest.raises(RecoveryPlanError, match="2 slots to the one standby"):
        check_plan(plan, [0, 1], 3)


WORDS = ["ant", "bee", "cat", "dog", "eel"]


@pytest.mark.usefixtures("ray_session")
def test_a_recovery_carries_out_the_plan_and_restarts_every_slot(tmp_path):
    count = 3000
    topo = bn.Topology("planned")
    topo.source("words", bn.sources.Generator(lambda i: WORDS[i % len(WORDS)], count=count,
                                              rate=1500)) \
        .key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0,
                                    parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo, protocol="coordinated", checkpoint_interval=0.3,
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
