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
With lineage, a batch's ids are kept *unbuilt* for as long as they can be: an `IdRun`
holds the source, instance and positions of its records and the prefixes operators
added since (map, reduce: ``(op,)``; union: ``(op, input_index)``; broadcast:
``(op, -1 - instance)``) — an int per record instead of a tuple per record per
operator, on the wire too. The tuples are built (`ids_of`) only where an operator
needs them: flat_map, join, sinks that keep what they receive. A count window's
results keep theirs as a `NumberedIds`: their keys and a column of firing numbers
(built on the wire, where a frame carries plain tuples).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, final

import msgpack

RecordId = tuple


@final  # no subclasses: `type(column) is IdRun` tells an unbuilt run from a sequence
class IdRun:
    """The ids of records of one source instance, not built yet (see the module)."""

    __slots__ = ("source", "instance", "positions", "path")

    def __init__(self, source: int, instance: int, positions: Sequence[int],
                 path: tuple = ()):
        self.source = source
        self.instance = instance
        self.positions = positions
        self.path = path  # prefixes, innermost first

    def __len__(self) -> int:
        return len(self.positions)

    def take(self, positions: list[int]) -> "IdRun":
        if len(positions) == 1:
            picked: Sequence[int] = (self.positions[positions[0]],)
        else:
            picked = itemgetter(*positions)(self.positions) if positions else ()
        return IdRun(self.source, self.instance, picked, self.path)

    def slice(self, start: int, stop: int) -> "IdRun":
        return IdRun(self.source, self.instance, self.positions[start:stop], self.path)

    def derive(self, prefix: tuple) -> "IdRun":
        return IdRun(self.source, self.instance, self.positions, self.path + (prefix,))

    def build(self) -> list[RecordId]:
        n = len(self.positions)
        ids: Any = zip(repeat(self.source, n), repeat(self.instance, n), self.positions)
        for prefix in self.path:
            ids = zip(*[repeat(part, n) for part in prefix], ids)
        return list(ids)

    def wire(self) -> tuple:
        positions = self.positions
        return (1, self.source, self.instance,
                list(positions) if isinstance(positions, range) else positions, self.path)


@final
class NumberedIds(Sequence):
    """The ids ``(op, key, n)`` of results numbered per key (a count window's n-th
    firing of each key), not built yet: a column of numbers beside the keys the
    results carry anyway. A tuple is made only for an id that is read; a count window
    over fast windows fires once per input, and a tuple per result was most of what
    lineage cost it."""

    __slots__ = ("op", "keys", "numbers")

    def __init__(self, op: int, keys: Sequence[Any], numbers: Sequence[int]):
        self.op = op
        self.keys = keys
        self.numbers = numbers

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return NumberedIds(self.op, self.keys[index], self.numbers[index])
        return (self.op, self.keys[index], self.numbers[index])

    def __iter__(self) -> Any:
        return zip(repeat(self.op, len(self.numbers)), self.keys, self.numbers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # a column, compared by value

    def build(self) -> list[RecordId]:
        return list(self)


IdColumn = IdRun | Sequence[RecordId]


def ids_of(column: IdColumn) -> Sequence[RecordId]:
    """The ids of a batch's ``ids`` column, as a sequence of built ids (a
    `NumberedIds` builds each as it is read)."""
    return column.build() if type(column) is IdRun else column


def take_ids(column: IdColumn, positions: list[int]) -> IdColumn:
    if type(column) is IdRun:
        return column.take(positions)
    if len(positions) == 1:
        return [column[positions[0]]]
    return itemgetter(*positions)(column) if positions else []


def to_wire(column: IdColumn | None) -> Any:
    if column is None:
        return None
    if type(column) is IdRun:
        return column.wire()
    return (0, column.build() if type(column) is NumberedIds else column)


def from_wire(wire: Any) -> IdColumn | None:
    if wire is None:
        return None
    if wire[0] == 1:
        return IdRun(wire[1], wire[2], wire[3], tuple(wire[4]))
    return wire[1]


def op_codes(topology: Any) -> dict[str, int]:
    """Operator name -> the code ids use for it (its position in the topology)."""
    return {name: code for code, name in enumerate(topology.nodes)}


def root_ids(op: int, instance: int, first_position: int, n: int) -> IdRun:
    """Ids of ``n`` records a source instance read from ``first_position`` on."""
    return IdRun(op, instance, range(first_position, first_position + n))


def _derive(column: IdColumn, prefix: tuple) -> IdColumn:
    if type(column) is IdRun:
        return column.derive(prefix)
    return list(zip(*[repeat(part) for part in prefix], column))


def derived_ids(op: int, parents: IdColumn) -> IdColumn:
    """One new tuple per input tuple (map, reduce, stateful_map)."""
    return _derive(parents, (op,))


def union_ids(op: int, input_index: int, parents: IdColumn) -> IdColumn:
    return _derive(parents, (op, input_index))


def broadcast_ids(dst_op: int, instance: int, parents: IdColumn) -> IdColumn:
    return _derive(parents, (dst_op, -1 - instance))


def ancestry(record_id: Any, kinds: Sequence[str]) -> set[int]:
    """The codes of the operators that made ``record_id`` and every id it derives
    from, up to its roots (a window's id is a root of its own: key and bounds).
    ``kinds``: each operator's kind, by code (`op_codes` order)."""
    codes: set[int] = set()
    stack = [record_id]
    while stack:
        rid = stack.pop()
        if not isinstance(rid, tuple) or not rid or not isinstance(rid[0], int) or not (
                0 <= rid[0] < len(kinds)):
            continue
        codes.add(rid[0])
        kind, rest = kinds[rid[0]], rid[1:]
        if kind in ("source", "window"):
            continue
        if kind == "join" and len(rest) == 3:
            stack += [rest[0], rest[1]]
        elif len(rest) == 2:  # flat_map (parent, j), union (input, parent), broadcast
            stack.append(rest[0] if kind == "flat_map" else rest[1])
        elif len(rest) == 1:
            stack.append(rest[0])
    return codes


def source_root(record_id: Any, kinds: Sequence[str]) -> tuple[int, int, int]:
    """The source id ``(op, instance, position)`` that ``record_id`` descends from,
    for ids with one root (no window or join on the way). ``kinds``: each operator's
    kind, by code (`op_codes` order)."""
    rid = record_id
    while kinds[rid[0]] != "source":
        # union (op, input, parent) and broadcast (op, -1 - instance, parent) name an
        # int before the parent; map-like (op, parent) and flat_map (op, parent, j) not
        rid = rid[2] if len(rid) == 3 and type(rid[1]) is int else rid[1]
    return rid


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
        if kind == "window" and len(rest) == 3:
            return f"{name}(key {rest[0]!r}, [{rest[1]}, {rest[2]}))"
        if kind == "window" and len(rest) == 2:  # keyed: never behind a broadcast
            return f"{name}(key {rest[0]!r}, firing {rest[1]})"
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
        if len(rest) == 1:
            return f"{name}({fmt(rest[0])})"
        return f"{name}{rest!r}"

    return fmt(record_id)


__all__ = ["ancestry", "format_id", "op_codes", "source_root"]


# -- tokens ------------------------------------------------------------------------------
# A tuple's 64-bit token names it within its root, the same in every process (never
# Python's salted `hash`): tuple tracking (protocol ``acks``) counts outstanding tuples
# by token, and tuple-level redundancy routes and drops copies by `record_hashes`. A
# tuple whose id is still an unbuilt `IdRun` is its root's position plus the path of
# operator prefixes it took, so within its root the path alone names it: its token is
# the path's hash, one for the whole column. A built id (after a flat_map) gets a hash
# of the whole id, folded element by element: an int as itself, a nested id by its own
# token, anything else (a window's key or bounds) by BLAKE2b of its msgpack bytes. A
# tuple keeps its form from the task that emits it to the task that takes it in (frames
# carry id columns as they are), so both sides name it alike.
_MASK = (1 << 64) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15  # odd: multiplying by it is a bijection mod 2**64


def fold(h: int, value: int) -> int:
    """Mix the 64-bit ``value`` into the 64-bit hash ``h``."""
    h = ((h ^ value) * _MULTIPLIER) & _MASK
    return h ^ (h >> 29)


def _element(value: Any) -> int:
    kind = type(value)
    if kind is int or kind is bool:
        return value & _MASK
    if kind is tuple:
        return token(value)
    return int.from_bytes(hashlib.blake2b(msgpack.packb(value), digest_size=8).digest(),
                          "little")


def token(record_id: tuple) -> int:
    """A built id's 64-bit token (see above)."""
    h = len(record_id)
    for value in record_id:
        h = fold(h, _element(value))
    return h


def path_token(path: tuple) -> int:
    """The token of every tuple of an `IdRun` with this ``path`` within its root (the
    root itself: the empty path). Distinct from a built id's token but by chance."""
    h = 0x5bd1e995  # keeps the empty path away from small values
    for parts in path:
        h = fold(h, token(parts))
    return h


def record_hashes(column: IdColumn) -> list[int]:
    """A 64-bit hash per record of ``column`` that names the tuple across the whole job
    (its root included): two copies of one tuple hash alike wherever they are, two
    different tuples alike only by chance (about 2**-64 a pair)."""
    if type(column) is IdRun:
        base = fold(fold(path_token(column.path), column.source), column.instance)
        return [fold(base, p) for p in column.positions]
    return list(map(token, column))
