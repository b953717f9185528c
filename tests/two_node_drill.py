"""A node-loss drill on a simulated two-node Ray cluster, run as its own process.

The test session shares one single-node Ray instance; a second cluster needs a driver
of its own, so `test_drills` runs this script and reads the JSON line it prints last.
Both nodes are raylets on 127.0.0.1 (Ray's cluster_utils), one CPU each.

    python tests/two_node_drill.py PROTOCOL STORAGE_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every socket on loopback
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import bastion as bn  # noqa: E402
from bastion.faults import live_nodes  # noqa: E402
from test_drills import wordcount  # noqa: E402
from protocol_knobs import with_interval


def main(protocol: str, storage_dir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    try:
        ray.init(address=cluster.address, logging_level="WARNING")
        report = bn.drill(wordcount(), protocol=with_interval(protocol, interval_s=0.4),
                          faults=[bn.faults.KillNode(1, at=1.0)],
                          storage=f"local://{storage_dir}")
        fault = next(e for e in report.events if e["kind"] == "fault")
        print(json.dumps({"nodes": len(live_nodes()), "killed": fault["killed"],
                          "failures": len(report.metrics.protocol.failures),
                          "lost": report.lost, "duplicated": report.duplicated,
                          "exactly_once": report.exactly_once}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
