"""The scheduler's decisions, without a cluster: placement, failure reasons, recovery plans."""

from __future__ import annotations

import asyncio

import pytest
import ray

from bastion.errors import UDFError
from bastion.scheduler.detector import outcome_failure
from bastion.scheduler.placement import STANDBY, node_for
from bastion.scheduler.recovery import BlockingRecovery, Capacity, RecoveryPlan


def test_slots_go_round_robin_over_the_nodes_and_the_standby_after_the_last_slot():
    nodes = ["a", "b", "c"]
    assert [node_for(i, 5, nodes) for i in range(5)] == ["a", "b", "c", "a", "b"]
    assert node_for(STANDBY, 5, nodes) == "c"      # position 5, after slot 4
    assert node_for(STANDBY, 2, ["only"]) == "only"


@pytest.mark.parametrize("standby,expected", [
    (True, RecoveryPlan(to_standby=(0,), to_fresh=(2,), restart=(0, 1, 2, 3))),
    (False, RecoveryPlan(to_standby=(), to_fresh=(0, 2), restart=(0, 1, 2, 3))),
])
def test_the_blocking_plan_gives_the_first_lost_slot_to_the_standby_and_restarts_all(
        standby, expected):
    assert BlockingRecovery().plan([2, 0], 4, Capacity(standby=standby)) == expected


def outcome(result=None, raises=None) -> asyncio.Future:
    future = asyncio.new_event_loop().create_future()
    if raises is not None:
        future.set_exception(raises)
    else:
        future.set_result(result)
    return future


def test_each_way_a_worker_ends_gets_its_reason():
    assert outcome_failure(1, outcome({"worker": 1, "failure": None})) is None

    died = outcome_failure(1, outcome(raises=ray.exceptions.RayActorError()))
    assert died.reason == "worker 1 died: RayActorError" and died.worker == 1
    assert not died.fatal

    peer = outcome_failure(2, outcome({"failure": ray.exceptions.RayError("gone")}))
    assert "a peer died" in peer.reason and not peer.fatal

    udf = UDFError("count", 0, "x", "ZeroDivisionError")
    user = outcome_failure(0, outcome({"failure": udf}))
    assert user.udf is udf and user.fatal

    bug = outcome_failure(0, outcome({"failure": RuntimeError("task count[0] failed")}))
    assert bug.fatal and bug.udf is None and "task count[0] failed" in bug.reason
