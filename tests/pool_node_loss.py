"""The pool after a node of a simulated two-node cluster died, run as its own process.

A job runs with one worker on each node; the second node is then removed (its raylet
and every process on it end). The next job must run, exactly, on workers of the node
that is left: the pool drops the idle worker of the dead node and never lends it.
Prints a JSON line last (see `test_worker_pool`).

    python tests/pool_node_loss.py STORAGE_DIR
"""

from __future__ import annotations

import json
import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every socket on loopback
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import bastion as bn  # noqa: E402
from bastion.faults import live_nodes  # noqa: E402


def squares(n: int) -> bn.Topology:
    topo = bn.Topology("pool-node-loss")
    topo.source("n", bn.sources.Collection(list(range(n))), parallelism=2).map(
        "square", lambda i: i * i, parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def main(storage_dir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    second = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    try:
        ray.init(address=cluster.address, logging_level="WARNING")
        storage = f"local://{storage_dir}"
        before = bn.run(squares(100), storage=storage)
        # slot i ran on live node i (`bastion.scheduler.placement`)
        lost_worker = before.details["workers"][live_nodes().index(second.node_id)]
        cluster.remove_node(second)
        cluster.wait_for_nodes()
        after = bn.run(squares(50), storage=storage)
        print(json.dumps({
            "nodes_after": len(live_nodes()), "lost_worker": lost_worker,
            "before_exact": sorted(before.outputs["out"]) == [i * i for i in range(100)],
            "after_exact": sorted(after.outputs["out"]) == [i * i for i in range(50)],
            "before": before.details["workers"], "after": after.details["workers"]}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
