"""The scheduler's decisions, without a cluster: placement, failure reasons, recovery plans."""

from __future__ import annotations

import asyncio

import pytest
import ray

from bastion.errors import UDFError
from bastion.scheduler.detector import outcome_failure
from bastion.scheduler.placement import STANDBY, node_for
from bastion.scheduler.recovery import replacement_slots


def test_slots_go_round_robin_over_the_nodes_and_the_standby_after_the_last_slot():
    nodes = ["a", "b", "c"]
    assert [node_for(i, 5, nodes) for i in range(5)] == ["a", "b", "c", "a", "b"]
    assert node_for(STANDBY, 5, nodes) == "c"      # position 5, after slot 4
    assert node_for(STANDBY, 2, ["only"]) == "only"


@pytest.mark.parametrize("standby,expected", [
    (True, ((0,), (2,))),
    (False, ((), (0, 2))),
])
def test_without_a_capacity_model_the_standby_takes_the_first_lost_slot(standby, expected):
    assert replacement_slots([2, 0, 2], standby) == expected


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
