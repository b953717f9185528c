"""Restart time after a failure against parallelism, per checkpointing protocol, on
simulated nodes (CheckMate Fig. 11).

What it measures
----------------
CheckMate's restart time is "the time passed from detecting the failure until the
system is ready to restart processing" (§VII-B): the coordinated protocol restores the
last completed round; the uncoordinated and communication-induced protocols first find
a recovery line (rollback propagation over the checkpoint graph) and prepare the
in-flight messages to replay. Bastion measures the same span as
`FailureRecovery.restart_s`: detection -> every task running again from the recovery
line.

How
---
- **Cluster.** Ray's `cluster_utils.Cluster`: ``--nodes`` raylets on 127.0.0.1
  (``node_ip_address="127.0.0.1"`` for each), ``--node-cpus`` CPUs each, all sharing
  this machine's cores, one Bastion worker per node. CheckMate gave each worker a CPU
  of its own; here the nodes are simulated, so the figure shows how the restart *work*
  grows with parallelism (tasks to restore, logs to load), not what spare hardware
  would hide.
- **Job.** NexMark ``--query`` (default Q12: a keyed count per bidder, so every
  instance holds state and receives from every source instance) at parallelism p for
  each p of ``--parallelism``, paced at ``--rate`` events/s in total for ``--seconds``
  of input, checkpointing every ``--interval`` s.
- **Failure.** One instance of the query's last stateful operator killed at
  ``--kill-at`` s (a real process kill). The first failure's ``restart_s`` is kept.

Prints a table; asserts nothing. ``--json PATH`` writes the figures
(`bastion.bench.results`) for the results page.

    .venv/bin/python benchmarks/restart_parallelism.py [--parallelism 1 2 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every socket on loopback
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import bastion as bn  # noqa: E402
from bastion.bench import nexmark  # noqa: E402
from bastion.bench import results  # noqa: E402

PROTOCOLS = ["coordinated", "uncoordinated", "cic"]
QUERIES = {"q1": nexmark.q1, "q3": nexmark.q3, "q8": nexmark.q8, "q12": nexmark.q12}
# A busy simulated node may stay silent for over a second on 2 cores; counted as lost,
# it would add restarts the kill did not cause. A killed process is seen at once from
# its death, not from the heartbeat.
HEARTBEAT_TIMEOUT_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(query: str, p: int, rate: float, seconds: float) -> tuple[bn.Topology, str]:
    """The query at parallelism ``p``, and the operator whose instance 0 is killed."""
    topo = bn.Topology(f"restart-{query}-p{p}")
    config = nexmark.NexmarkConfig(seed=7, events=int(rate * seconds), inter_event_s=0.001)
    QUERIES[query](topo, config, bn.sinks.Discard(), parallelism=p, rate=rate)
    victim = list(topo.nodes)[-2]  # the operator before the sink, as protocols.py kills
    return topo, victim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallelism", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--query", default="q12", choices=sorted(QUERIES))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--node-cpus", type=int, default=1)
    parser.add_argument("--rate", type=float, default=4_000.0, help="events/s in total")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of input")
    parser.add_argument("--kill-at", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=0.5, help="checkpoint interval, s")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per (protocol, p); the median restart is kept")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    args = parser.parse_args()

    # A port and a temp dir of their own (see scaling.py): another Ray on this machine
    # may own the default port, and an address-less ray.init() would join this one.
    temp_dir = tempfile.mkdtemp(prefix="bnrp-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = temp_dir
    os.makedirs(os.path.join(temp_dir, "ray"))
    storage = f"local://{tempfile.mkdtemp(prefix='bastion-restart-')}"
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": args.node_cpus, "node_ip_address": "127.0.0.1",
        "include_dashboard": False, "gcs_server_port": free_port(), "temp_dir": temp_dir})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=args.node_cpus, node_ip_address="127.0.0.1",
                         temp_dir=temp_dir)
    restart_s: dict[str, list[float | None]] = {p: [] for p in PROTOCOLS}
    restarted: dict[str, list[int]] = {p: [] for p in PROTOCOLS}
    try:
        # Ray's stub says int; ray.init takes a level's name as logging does
        ray.init(address=cluster.address, logging_level="WARNING")  # type: ignore[arg-type]
        nodes = len([n for n in ray.nodes() if n["Alive"]])
        recovery = bn.Recovery(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        # warm the workers' pool so that the first case does not pay process starts
        warm, _ = build(args.query, max(args.parallelism), args.rate, 0.5)
        bn.run(warm, storage=storage, workers=args.nodes, recovery=recovery)
        for p in args.parallelism:
            for protocol in PROTOCOLS:
                times, tasks = [], 0
                for _ in range(args.repeat):
                    topo, victim = build(args.query, p, args.rate, args.seconds)
                    # each protocol that needs an interval takes it as interval_s; the
                    # base class, which get_protocol is typed to return, takes none
                    cls: Any = type(bn.protocols.get_protocol(protocol))
                    result = bn.run(topo, cls(interval_s=args.interval), storage=storage,
                                    workers=args.nodes, recovery=recovery,
                                    faults=[bn.faults.KillInstance(victim, 0,
                                                                   at=args.kill_at)])
                    assert result.metrics.protocol is not None
                    failures = result.metrics.protocol.failures
                    if failures:
                        times.append(failures[0].restart_s)
                        tasks = len(failures[0].restarted_tasks)
                restart_s[protocol].append(statistics.median(times) if times else None)
                restarted[protocol].append(tasks)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)

    print(f"NexMark {args.query.upper()} at {args.rate:,.0f} events/s, kill instance 0 of "
          f"its last operator at {args.kill_at:g} s, checkpoint interval {args.interval} s, "
          f"{nodes} simulated nodes of {args.node_cpus} CPU, {os.cpu_count()} cores")
    print(f"{'p':>3} " + " ".join(f"{f'{x} restart s':>24}" for x in PROTOCOLS))
    for i, p in enumerate(args.parallelism):
        cells = []
        for x in PROTOCOLS:
            value = restart_s[x][i]
            cells.append(f"{'-' if value is None else f'{value:.3f}'} "
                         f"({restarted[x][i]} tasks)")
        print(f"{p:>3} " + " ".join(f"{c:>24}" for c in cells))
    if args.json:
        results.write_figures(args.json, {
            "query": args.query, "parallelism": args.parallelism, "nodes": nodes,
            "rate": args.rate, "interval_s": args.interval,
            # -1: no failure was recorded (the page shows it as not measured)
            "restart_s": {x: [-1.0 if v is None else v for v in restart_s[x]]
                          for x in PROTOCOLS},
            "restarted_tasks": restarted})
    means = {x: statistics.mean(v for v in restart_s[x] if v is not None)
             for x in PROTOCOLS if any(v is not None for v in restart_s[x])}
    print("mean restart s over p: " + ", ".join(f"{x} {v:.3f}" for x, v in means.items()))


if __name__ == "__main__":
    main()
