"""Placement: worker slots onto live Ray nodes, round robin, strictly.

A job runs one worker actor per *slot* plus, for protocols that recover, one standby
(`bastion.runtime.job`). Slot *i* runs on live node *i* mod the node count and the
standby on the node after the last slot's, so the slots spread evenly and losing one
node of a cluster loses as few slots as possible. Nodes are ordered by node id, so
every placement of a job — and every replacement after a failure — counts them the
same way. The affinity is strict: Ray's soft affinity (and ``SPREAD``) often ignored
the order, stacking slots on one node.

The worker of a slot is borrowed from the pool (`bastion.scheduler.pool`), which lends
one of the node placement names or starts one there.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

STANDBY = -1  # the slot index of the standby worker


def live_nodes() -> list[str]:
    """The ids of the cluster's live Ray nodes, sorted: what `KillNode` positions index."""
    return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))


def node_for(slot: int, slots: int, nodes: list[str]) -> str:
    """The node of worker slot ``slot`` (`STANDBY`: the standby) among ``slots`` slots."""
    position = slot if slot != STANDBY else slots
    return nodes[position % len(nodes)]


def strategy_on(node: str) -> NodeAffinitySchedulingStrategy:
    """How Ray must start a worker on ``node`` (the pool starts one there when it has
    none idle): on that node and no other."""
    return NodeAffinitySchedulingStrategy(node, soft=False)
