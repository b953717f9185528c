"""The physical plan: from named operators to tasks, channels and workers.

The logical graph says *what* runs; the physical plan says *where* and *how records
move*:

- **Chains.** Forward-connected operators with equal parallelism — the upstream has no
  other consumer, the downstream no other input — are fused into one *chain*, as Flink
  chains operators: records pass between them by function call, never serialised. An
  edge between two operators of parallelism 1 is forward whatever its partitioning,
  since there is only one place a record can go.
- **Tasks.** Instance ``i`` of a chain is a task. Tasks are what the data plane runs.
- **Channels.** Every edge between chains becomes channels between tasks: one per
  instance pair for forward edges, one per (upstream, downstream) instance pair for
  rebalance, hash and broadcast edges. A channel is FIFO, has its own sequence numbers,
  and carries control records in order with data.
- **Workers.** Tasks run inside worker actors (Ray processes). Like Flink's slot
  sharing, worker ``w`` hosts instance ``i`` of every chain with ``i % workers == w``,
  so a job needs as many processes as its widest operator, not one per task (each Ray
  actor costs about 84 MiB here). Channels between tasks of one worker skip the
  network (frames are still encoded: see `bastion.runtime.channel`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from bastion.errors import TopologyError
from bastion.runtime.key_groups import KEY_GROUPS
from bastion.topology import AUTO, BROADCAST, FORWARD, HASH, REBALANCE, Topology


@dataclass
class EdgePlan:
    """An edge between two chains."""

    edge_id: int
    src_op: str
    dst_op: str
    src_chain: int
    dst_chain: int
    input_index: int           # which input of ``dst_op`` (a join has two)
    partition: str             # FORWARD, REBALANCE, HASH or BROADCAST
    key_fn: Callable[[Any], Any] | None
    feedback: bool
    # Tuple-level redundancy (`bastion.runtime.redundancy`): the ratio of copies this
    # edge sends to the next instance, and whether it routes unkeyed tuples by their
    # lineage id (so copies made upstream meet on one instance) instead of round-robin.
    copies: float = 0.0
    by_id: bool = False


@dataclass
class ChainPlan:
    chain_id: int
    ops: list[str]
    # key function applied in front of ops[j] inside the chain (None for unkeyed links)
    link_key_fns: list[Callable[[Any], Any] | None]
    parallelism: int
    inputs: list[EdgePlan] = field(default_factory=list)
    outputs: list[EdgePlan] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "+".join(self.ops)


@dataclass(frozen=True)
class InputChannel:
    channel_id: int
    input_index: int
    feedback: bool
    src_task: int


@dataclass
class OutputRoute:
    """Where one out-edge of a task sends: a channel per downstream instance it reaches."""

    edge: EdgePlan
    channel_ids: list[int]     # indexed like ``dst_tasks``
    dst_tasks: list[int]


@dataclass
class TaskPlan:
    task_id: int
    chain_id: int
    index: int
    parallelism: int
    worker: int
    inputs: list[InputChannel] = field(default_factory=list)
    routes: list[OutputRoute] = field(default_factory=list)


@dataclass
class PhysicalPlan:
    topology: Topology
    chains: list[ChainPlan]
    tasks: list[TaskPlan]
    workers: int

    def tasks_of(self, worker: int) -> list[TaskPlan]:
        return [t for t in self.tasks if t.worker == worker]

    def task_of(self, op: str, index: int) -> TaskPlan:
        for chain in self.chains:
            if op in chain.ops:
                return next(t for t in self.tasks
                            if t.chain_id == chain.chain_id and t.index == index)
        raise KeyError(op)

    def describe(self) -> str:
        lines = [f"{len(self.chains)} chains, {len(self.tasks)} tasks on {self.workers} workers"]
        for c in self.chains:
            lines.append(f"  chain {c.chain_id} [{c.name}] x{c.parallelism}")
        return "\n".join(lines)


def _resolve(partition: str, src_p: int, dst_p: int, src: str, dst: str) -> str:
    if partition == AUTO:
        return FORWARD if src_p == dst_p else REBALANCE
    if partition == FORWARD and src_p != dst_p:
        raise TopologyError(f"edge {src!r} -> {dst!r} is forward but parallelism differs "
                            f"({src_p} vs {dst_p})")
    if partition == HASH and dst_p > KEY_GROUPS:
        raise TopologyError(f"operator {dst!r}: parallelism {dst_p} is more than the "
                            f"{KEY_GROUPS} key groups its keyed state is split into "
                            "(bastion.runtime.key_groups); use at most that many instances")
    return partition


def build_plan(topology: Topology, *, chaining: bool = True, workers: int | None = None,
               redundancy: dict[str, float] | None = None) -> PhysicalPlan:
    """Chain, instantiate and place a validated topology. ``redundancy`` (operator ->
    ratio, `bastion.runtime.redundancy.resolve`) names the operators that receive
    copies: each heads a chain, so its copies arrive over channels; the chain goes on
    through stateless operators and ends before a sink or another copying operator, so
    the copies' results meet again on the channel that leaves it."""
    topology.validate()
    copied = redundancy or {}
    nodes = topology.nodes
    # operators whose output holds copies: a copying one, and what it chains into
    carries_copies: set[str] = set(copied)
    consumers: dict[str, list[tuple[str, int]]] = {name: [] for name in nodes}
    for node in nodes.values():
        for i, inp in enumerate(node.inputs):
            consumers[inp.upstream].append((node.name, i))

    def fusable(name: str) -> bool:
        """Could ``name`` be fused with its single consumer, copies aside?"""
        if not chaining or len(consumers[name]) != 1:
            return False
        dst_name, i = consumers[name][0]
        if dst_name in copied:
            return False
        dst = nodes[dst_name]
        inp = dst.inputs[i]
        if len(dst.inputs) != 1 or inp.feedback:
            return False
        src_p, dst_p = nodes[name].parallelism, dst.parallelism
        if src_p == dst_p == 1:
            return True
        return src_p == dst_p and inp.partition in (AUTO, FORWARD)

    for name in nodes:  # insertion order is a topological order of the DSL
        if name in carries_copies and fusable(name):
            carries_copies.add(consumers[name][0][0])

    def chains_into_next(name: str) -> bool:
        """Can ``name`` be fused with its single consumer? Not a sink behind copies."""
        return fusable(name) and not (name in carries_copies
                                      and nodes[consumers[name][0][0]].kind == "sink")

    chained_from_upstream = {consumers[n][0][0] for n in nodes if chains_into_next(n)}
    chains: list[ChainPlan] = []
    chain_of: dict[str, int] = {}
    for name, node in nodes.items():  # insertion order is a topological order of the DSL
        if name in chained_from_upstream:
            continue
        ops: list[str] = [name]
        keys: list[Callable[[Any], Any] | None] = [None]  # the chain's head has none
        while chains_into_next(ops[-1]):
            nxt = consumers[ops[-1]][0][0]
            ops.append(nxt)
            keys.append(nodes[nxt].inputs[0].key_fn)
        chain = ChainPlan(len(chains), ops, keys, node.parallelism)
        for op in ops:
            chain_of[op] = chain.chain_id
        chains.append(chain)
    for name in nodes:
        if name not in chain_of:  # only reachable through a cycle of chained links
            raise TopologyError(f"operator {name!r} could not be placed in a chain")

    edges: list[EdgePlan] = []
    for node in nodes.values():
        for i, inp in enumerate(node.inputs):
            src_chain, dst_chain = chain_of[inp.upstream], chain_of[node.name]
            if src_chain == dst_chain and not inp.feedback and chains[dst_chain].ops[0] != node.name:
                continue  # a chained link
            partition = _resolve(inp.partition, nodes[inp.upstream].parallelism,
                                 node.parallelism, inp.upstream, node.name)
            copies = copied.get(node.name, 0.0)
            # Copies made upstream may come from any instance: they meet only if the
            # edge routes them by id. Copies this edge makes need no such rule: the
            # copied operator's instances all take any tuple, and its own output edge
            # brings the copies together.
            by_id = inp.upstream in carries_copies
            if (by_id or copies > 0) and partition == FORWARD and node.parallelism > 1:
                partition = REBALANCE   # a copy goes to another instance
            edge = EdgePlan(len(edges), inp.upstream, node.name, src_chain, dst_chain, i,
                            partition, inp.key_fn, inp.feedback, copies,
                            by_id and partition == REBALANCE)
            edges.append(edge)
            chains[src_chain].outputs.append(edge)
            chains[dst_chain].inputs.append(edge)

    n_workers = workers or max(c.parallelism for c in chains)
    if n_workers < 1:
        raise TopologyError(f"workers must be >= 1, got {n_workers}")
    tasks: list[TaskPlan] = []
    task_id: dict[tuple[int, int], int] = {}
    for chain in chains:
        for index in range(chain.parallelism):
            task = TaskPlan(len(tasks), chain.chain_id, index, chain.parallelism,
                            index % n_workers)
            task_id[(chain.chain_id, index)] = task.task_id
            tasks.append(task)

    next_channel = 0
    for edge in edges:
        src_p = chains[edge.src_chain].parallelism
        dst_p = chains[edge.dst_chain].parallelism
        for s in range(src_p):
            targets = [s] if edge.partition == FORWARD else list(range(dst_p))
            route = OutputRoute(edge, [], [])
            for d in targets:
                channel = next_channel
                next_channel += 1
                src_task = task_id[(edge.src_chain, s)]
                dst_task = task_id[(edge.dst_chain, d)]
                route.channel_ids.append(channel)
                route.dst_tasks.append(dst_task)
                tasks[dst_task].inputs.append(
                    InputChannel(channel, edge.input_index, edge.feedback, src_task))
            tasks[task_id[(edge.src_chain, s)]].routes.append(route)
    return PhysicalPlan(topology, chains, tasks, n_workers)


__all__ = ["BROADCAST", "FORWARD", "HASH", "REBALANCE", "build_plan", "PhysicalPlan"]
