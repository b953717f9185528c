"""The correlated-failure scenario: three queries of different priorities over one bid
stream, two nodes lost at once, replacement nodes arriving one by one.

What it shows
-------------
Progressive recovery (Su & Zhou) pays off when a correlated failure takes out more
tasks than the cluster can replace at once: instead of waiting for every replacement
slot (blocking, operator-centric), it brings back whole queries as slots arrive, the
most valuable per slot first. The scenario makes that measurable:

- **Topology.** A bid source and a shared ``parse`` step (parallelism 3) feed three
  queries: ``alerts`` (priority 3: a stateless map of every bid to an alert), ``per_auction``
  (priority 2: a keyed running count per auction) and ``per_bidder`` (priority 1: the
  highest bid per bidder). With operator chaining that is 4 chains × 3 instances = 12
  tasks on 3 workers, one per node.
- **Cluster.** A simulated Ray cluster on 127.0.0.1 (`ray.cluster_utils.Cluster`):
  three nodes of 4 CPUs, one task slot per CPU, so every slot is taken.
- **Failure.** Nodes 1 and 2 are lost 0.2 s apart: one correlated failure that takes 8
  of the 12 tasks down, instances 1 and 2 of every chain — every query is hit.
- **Capacity.** ``staggered``: a 4-CPU node arrives 1 s after the failure, then a
  2-CPU node every 2 s — 4, 6, 8 slots; ``at_once`` (the best case): one 8-CPU node
  right after the failure.

Profit density orders the queries: each needs the two lost ``parse`` tasks (shared by
all three: 2/3 of a slot each) plus its own two lost tasks, so ``alerts`` comes back
with the first node, ``per_auction`` with the second and ``per_bidder`` with the third;
blocking recovery waits for the third for all of them.

`run_case` runs one case as a drill (the verdict compares with a failure-free run by
lineage id); it must run in a driver with no Ray of its own yet, since it starts the
simulated cluster and connects to it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Iterator

import bastion as bn
from bastion.drills import reference_runs

# The data plane of every run of the scenario, the references' and the drills': a
# frame waits up to 50 ms to fill.
DATA_PLANE = bn.DataPlane(buffer_timeout_ms=50.0)

PRIORITIES = {"alerts": 3, "per_auction": 2, "per_bidder": 1}
NODE_CPUS = 4
FAILURE_AT_S = 2.0
ARRIVAL_GAP_S = 3.0     # between two replacement nodes (staggered)
RATE = 1_000.0          # bids per second
RECORDS = 28_000        # 28 s of bids: long enough for the last query to catch up


# How long a live worker may stay silent before it counts as lost. The scenario's
# losses are whole nodes, which Ray reports at once as their workers' deaths: the
# heartbeat only has to catch a hung worker. Three simulated nodes (three raylets, a
# GCS, 12 tasks, a driver) on a 2-core machine leave a busy survivor silent for over
# a second at times; counted as lost, it would restart the queries the failure did
# not hit and measure the machine instead of the recovery.
HEARTBEAT_TIMEOUT_S = 5.0


def bid(i: int) -> dict[str, int]:
    """Bid ``i`` of the stream: deterministic, so a replay reads the same bids."""
    return {"id": i, "auction": i % 50, "bidder": (i * 7) % 37, "price": (i * 7919) % 1000}


def parse(b: dict[str, int]) -> tuple[int, int, int, int]:
    return (b["id"], b["auction"], b["bidder"], b["price"])


def alert(b: tuple[int, int, int, int]) -> tuple[int, int]:
    return (b[0], b[3])


def auction_of(b: tuple[int, int, int, int]) -> int:
    return b[1]


def bidder_of(b: tuple[int, int, int, int]) -> int:
    return b[2]


def count_bids(acc: int, _b: Any) -> int:
    return acc + 1


def highest_bid(acc: int, b: tuple[int, int, int, int]) -> int:
    return max(acc, b[3])


SHAPES = ("all_hit", "low_priority_hit")


def topology(records: int = RECORDS, rate: float | None = RATE, shape: str = "all_hit",
             parse_fn: Any = parse) -> bn.Topology:
    """The three queries over one bid stream (module-level functions: a replayed
    task calls the same code). ``all_hit``: every operator has 3 instances, one per
    node, so losing nodes 1 and 2 hits every query; ``low_priority_hit``: only
    ``per_bidder`` has 3 instances (the others run on node 0 alone), so the same
    loss hits only the lowest-priority query."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    width = 3 if shape == "all_hit" else 1
    topo = bn.Topology("correlated")
    bids = topo.source("bids", bn.sources.Generator(bid, count=records, rate=rate),
                       parallelism=width).map("parse", parse_fn, parallelism=width)
    bids.map("alert", alert, parallelism=width).sink("alerts", bn.sinks.Collect())
    bids.key_by(auction_of).reduce("auctions", count_bids, initial=0, parallelism=width) \
        .sink("per_auction", bn.sinks.Collect())
    bids.key_by(bidder_of).reduce("bidders", highest_bid, initial=0, parallelism=3) \
        .sink("per_bidder", bn.sinks.Collect())
    for name, priority in PRIORITIES.items():
        topo.query(name, [name], priority=priority)
    return topo


def capacity(arrival: str) -> list[Any]:
    """The nodes that arrive after the failure: ``staggered`` or ``at_once``."""
    first_s = FAILURE_AT_S + 1.0
    if arrival == "at_once":
        return [bn.faults.AddNode(at=FAILURE_AT_S + 0.3, cpus=2 * NODE_CPUS)]
    if arrival == "staggered":
        return [bn.faults.AddNode(at=first_s, cpus=NODE_CPUS),
                bn.faults.AddNode(at=first_s + ARRIVAL_GAP_S, cpus=2),
                bn.faults.AddNode(at=first_s + 2 * ARRIVAL_GAP_S, cpus=2)]
    raise ValueError(f"arrival must be 'staggered' or 'at_once', got {arrival!r}")


@dataclass(frozen=True)
class Case:
    """One run of the scenario: the planner and how capacity arrives."""

    recovery: str      # "progressive" or "blocking"
    arrival: str       # "staggered" or "at_once"
    shape: str = "all_hit"
    lost_nodes: tuple[int, ...] = (1, 2)

    @property
    def label(self) -> str:
        return "best case" if self.arrival == "at_once" else self.recovery


CASES = (Case("progressive", "staggered"), Case("blocking", "staggered"),
         Case("progressive", "at_once"))


@contextlib.contextmanager
def simulated_cluster() -> Iterator[Any]:
    """Three Ray nodes of `NODE_CPUS` CPUs on 127.0.0.1, with this driver connected;
    torn down on exit. The driver must not be connected to another Ray."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every socket on loopback
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray read the variable when it was first imported, maybe before it was set.
    ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        raise RuntimeError("the correlated scenario starts its own simulated cluster: "
                           "run it in a driver that is not connected to Ray yet")
    # A directory of its own: a Ray publishes its address under /tmp/ray, where any
    # address-less ray.init() on the machine would join this cluster.
    saved_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-sim-")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": NODE_CPUS, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=NODE_CPUS, node_ip_address="127.0.0.1")
        # Ray's stub says int; ray.init takes a level's name as logging does
        ray.init(address=cluster.address, logging_level="WARNING")  # type: ignore[arg-type]
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved_tmpdir


def references(shape: str = "all_hit", *, records: int = RECORDS,
               storage_dir: str | None = None) -> list[Any]:
    """Failure-free runs of ``shape`` to drill several cases against (`run_case`'s
    ``reference``): the input is the same, so one reference serves them all.

    They run unpaced (the bids as fast as the job takes them): no function of the
    scenario reads the clock, so the pace changes no record, and a drill measures
    latency against its own run's time before the failure, never against these. At
    the scenario's 1,000 bids/s the paced run would take three times as long."""
    storage = storage_dir or tempfile.mkdtemp(prefix="bastion-correlated-")
    with simulated_cluster():
        return reference_runs(topology(records, None, shape), storage=f"local://{storage}",
                              data_plane=DATA_PLANE, workers=3)


def run_case(case: Case, *, protocol: str = "coordinated", records: int = RECORDS,
             rate: float = RATE, storage_dir: str | None = None,
             checkpoint_interval: float = 0.5, reference: Any = None,
             progress: Any = None, held_frames_in_memory: int = 64,
             parse_fn: Any = parse, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
             catch_up_priority: str = "idle", catch_up_max_s: float | None = None
             ) -> "bn.DrillReport":
    """Drill ``case`` on a fresh simulated cluster (`simulated_cluster`); the drill's
    report. ``reference``: `references` of the same shape and input, to compare with
    instead of running them again. ``parse_fn`` replaces `parse` (tests pass one
    that breaks the worker it runs in). A lost node is seen from its workers' deaths;
    ``heartbeat_timeout_s`` is how long a live worker may stay silent before it
    counts as lost too. ``catch_up_priority`` and ``catch_up_max_s`` (None: the
    policy's default): how a worker hosting only recovering tasks catches up
    (`bastion.scheduler.catchup`)."""
    storage = storage_dir or tempfile.mkdtemp(prefix="bastion-correlated-")
    with simulated_cluster() as cluster:
        catch_up: dict[str, Any] = ({} if catch_up_max_s is None
                                    else {"catch_up_max_s": catch_up_max_s})
        faults = [bn.faults.KillNode(node, at=FAILURE_AT_S + 0.2 * i)
                  for i, node in enumerate(case.lost_nodes)] + capacity(case.arrival)
        checkpoints = bn.protocols.get_protocol(protocol)
        if checkpoints.needs_checkpoint_interval:   # the protocol's object, its interval
            # each protocol that needs an interval takes it as interval_s; the base
            # class, which get_protocol is typed to return, takes none
            protocol_class: Any = type(checkpoints)
            checkpoints = protocol_class(interval_s=checkpoint_interval)
        return bn.drill(topology(records, rate, case.shape, parse_fn), checkpoints,
                        faults=faults, cluster=cluster, storage=f"local://{storage}",
                        data_plane=DATA_PLANE, workers=3, reference=reference,
                        progress=progress,
                        recovery=bn.Recovery(bn.RecoveryPolicy(
                            mode=case.recovery, task_slots_per_cpu=1.0,
                            held_frames_in_memory=held_frames_in_memory,
                            catch_up_priority=catch_up_priority, **catch_up),
                            heartbeat_timeout_s=heartbeat_timeout_s))
