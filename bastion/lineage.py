"""Lineage ids: the identity of a tuple, the same in every run that produces it.

A value says *what* a record holds; an id says *which* tuple it is. Two correct runs of
an order-sensitive topology (a running sum fed by several channels) commit different
intermediate values, so values cannot tell a lost or duplicated tuple from a tuple
computed in another order. Ids can: a replay, a restart or (later) a replica of one
logical tuple carries the same id, and two different tuples never share one. These
are the composite tuple ids of the Dynamo thesis (§3.2.2.3, Table 3.3), built
structurally instead of hashed, so uniqueness holds by construction, not by chance.

An id is a tuple whose first element is the *code* of the operator that made the
tuple (its position in the topology, `op_codes`); the rest depends on the operator:

==================  ===========================================  ===================
operator            id                                           one per
==================  ===========================================  ===================
source              ``(op, instance, position)``                 record read
map, reduce,        ``(op, parent)``                             input
stateful_map
flat_map            ``(op, parent, j)``                          j-th output of input
union               ``(op, input_index, parent)``                input per side
join                ``(op, left_parent, right_parent, window)``  pair per window
time window         ``(op, key, window_start, window_end)``      key per window
count window        ``(op, key, n)``                             n-th firing of key
broadcast edge      ``(dst_op, -1 - instance, parent)``          copy per instance
==================  ===========================================  ===================

``filter`` and ``sink`` pass their input's id on: they make no new tuple. The instance
that processes a tuple is deliberately *not* part of a derived id: after a restart a
rebalanced tuple may reach another instance, and a replica (tuple-level redundancy)
is processed by the instance after the one its grouping picked — both must keep the
tuple's id. Only a broadcast makes several tuples of one, so only the broadcast edge
adds the receiving instance. A source's position counts the records its instance
read from its share (late records included), so it is dense and replayable whatever
the source's own offsets look like.

Ids travel only when a run asks for them (``bn.run(topo, lineage=True)``); without
lineage every batch's ``ids`` column is None and no operator spends anything on them.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Sequence

RecordId = tuple


def op_codes(topology: Any) -> dict[str, int]:
    """Operator name -> the code ids use for it (its position in the topology)."""
    return {name: code for code, name in enumerate(topology.nodes)}


def root_ids(op: int, instance: int, first_position: int, n: int) -> list[RecordId]:
    """Ids of ``n`` records a source instance read from ``first_position`` on."""
    return list(zip(repeat(op, n), repeat(instance, n),
                    range(first_position, first_position + n)))


def derived_ids(op: int, parents: Sequence[RecordId]) -> list[RecordId]:
    """One new tuple per input tuple (map, reduce, stateful_map)."""
    return list(zip(repeat(op), parents))


def union_ids(op: int, input_index: int, parents: Sequence[RecordId]) -> list[RecordId]:
    return list(zip(repeat(op), repeat(input_index), parents))


def broadcast_ids(dst_op: int, instance: int, parents: Sequence[RecordId]) -> list[RecordId]:
    return list(zip(repeat(dst_op), repeat(-1 - instance), parents))


def format_id(record_id: Any, topology: Any) -> str:
    """``record_id`` with operator names instead of codes, e.g.
    ``count(split(lines[0]@17 #2))`` for the running count of the third word of the
    18th line."""
    names = list(topology.nodes)
    kinds = [node.kind for node in topology.nodes.values()]

    def fmt(rid: Any) -> str:
        if not isinstance(rid, tuple) or not rid or not isinstance(rid[0], int) or not (
                0 <= rid[0] < len(names)):
            return repr(rid)
        name, kind, rest = names[rid[0]], kinds[rid[0]], rid[1:]
        if len(rest) == 2 and isinstance(rest[0], int) and rest[0] < 0:
            return f"{name}<broadcast to [{-1 - rest[0]}]>({fmt(rest[1])})"
        if kind == "source" and len(rest) == 2:
            return f"{name}[{rest[0]}]@{rest[1]}"
        if kind == "flat_map" and len(rest) == 2:
            return f"{name}({fmt(rest[0])} #{rest[1]})"
        if kind == "union" and len(rest) == 2:
            return f"{name}(input {rest[0]}: {fmt(rest[1])})"
        if kind == "join" and len(rest) == 3:
            return f"{name}({fmt(rest[0])} x {fmt(rest[1])} in window {rest[2]})"
        if kind == "window" and len(rest) == 3:
            return f"{name}(key {rest[0]!r}, [{rest[1]}, {rest[2]}))"
        if kind == "window" and len(rest) == 2:
            return f"{name}(key {rest[0]!r}, firing {rest[1]})"
        if len(rest) == 1:
            return f"{name}({fmt(rest[0])})"
        return f"{name}{rest!r}"

    return fmt(record_id)


__all__ = ["RecordId", "broadcast_ids", "derived_ids", "format_id", "op_codes",
           "root_ids", "union_ids"]
