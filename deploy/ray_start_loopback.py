"""`ray start` for a worker node that joins a head on the same machine, on loopback.

Usage (a worker node of a cluster whose head runs on this machine at port 6379):

    python deploy/ray_start_loopback.py --address=127.0.0.1:6379 --node-ip-address=127.0.0.1 [ray start flags]

It runs Ray's own ``ray start`` command with one change. A node that joins a
cluster refuses ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and without it ``ray start``
rewrites a loopback address — ``--address=127.0.0.1:...`` *and*
``--node-ip-address=127.0.0.1`` — to the machine's network address
(ray-project/ray#59110): the node then binds there and looks for the head where it
does not listen. Here a loopback address stays loopback, so every node of a
one-machine cluster listens on 127.0.0.1 only. On real clusters (one node per
machine, deploy/ray-cluster.yaml, deploy/kuberay.yaml) plain ``ray start`` is right.
"""

import sys

from ray._common.network_utils import is_localhost
from ray._private import services
from ray.scripts.scripts import main

_resolve = services.resolve_ip_for_localhost


def _keep_loopback(host: str) -> str:
    return "127.0.0.1" if is_localhost(host) else _resolve(host)


if __name__ == "__main__":
    services.resolve_ip_for_localhost = _keep_loopback
    sys.argv = ["ray", "start", *sys.argv[1:]]
    sys.exit(main())
