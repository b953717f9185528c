"""Records, control records, and the wire format that carries them between instances.

A *record* is one value flowing through the dataflow with its metadata: ``key`` (set by
a keyed edge), ``value`` (any msgpack-able object), ``ts`` (event time, seconds) and
``born`` (wall-clock time the source emitted it, for end-to-end latency). When a
protocol tracks individual tuples (acks, redundancy) a record also has an ``id``: a
composite of root id, source index, sender operator, sender index and emit count, so
replicas of one tuple can be told apart from different tuples after fan-out and joins.

Records travel in a `Batch`: one list per field (columnar), because Python pays per
object and per call — one list comprehension over a batch is many times cheaper than a
call per record. Operators never mutate a batch they received; they build new lists,
sharing the unchanged ones.

*Control records* (watermarks, end-of-stream, and the protocols' barriers and markers,
which `bastion.protocols` defines and registers with `control_record`) travel
in-band, in order with the data on the same channel, so "everything before the
barrier" has a precise meaning. A *frame* is a list of elements — batches and control
records — and is what one channel message carries, msgpack-encoded. Arrays decode as
tuples, so a list value arrives as a tuple after crossing a process boundary. Columns
of exact ints or floats travel packed as machine words and decode to the same tuple
(`bastion.runtime.columns`); a frame of nothing but such numbers between two tasks of
one worker is not encoded at all (`passes_unencoded`).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, ClassVar, Sequence

import msgpack

from bastion.codecs import Codec
from bastion.lineage import IdColumn, IdRun, from_wire, take_ids, to_wire
from bastion.runtime.columns import (IntColumn, PairColumn, exact_numbers, pack_float64,
                                     pack_ints, pair_column, split_column, split_columns,
                                     unpack_float64, unpack_float64_xor, unpack_int_column)
from bastion.runtime.durable import unserialisable

DATA = 0
CONTROL = 1


class Batch:
    """A columnar batch of records. ``keys`` and ``ids`` are None when unused. Columns
    are sequences (lists or tuples; ``ids`` may be an unbuilt `IdRun`); nobody mutates
    a batch after building it. ``exact`` is True when every item of keys, values, ts
    and born is known to be an exact number (`columns.exact_numbers`), False when
    unknown."""

    __slots__ = ("keys", "values", "ts", "born", "ids", "exact")

    def __init__(self, keys: Sequence | None, values: Sequence, ts: Sequence,
                 born: Sequence, ids: IdColumn | None = None, exact: bool = False):
        self.keys = keys
        self.values = values
        self.ts = ts
        self.born = born
        self.ids = ids
        self.exact = exact

    def __len__(self) -> int:
        return len(self.values)

    def take(self, positions: list[int]) -> "Batch":
        """The records at ``positions``, in that order."""
        n = len(positions)
        ids = None if self.ids is None else take_ids(self.ids, positions)
        if n == 0:
            return Batch(None if self.keys is None else [], [], [], [], ids)
        if n == 1:
            i = positions[0]
            return Batch(None if self.keys is None else [self.keys[i]], [self.values[i]],
                         [self.ts[i]], [self.born[i]], ids)
        get = itemgetter(*positions)  # one C-level gather per column
        ts = _take_column(self.ts, get, n)
        born = ts if self.born is self.ts else _take_column(self.born, get, n)
        return Batch(None if self.keys is None else get(self.keys), get(self.values), ts,
                     born, ids)

    def split(self, parts: bytes | list[int], n: int) -> list["Batch | None"]:
        """The batch cut by destination: item ``p`` holds, in order, the records whose
        ``parts`` entry is ``p`` (None when there are none). A destination that gets
        every record gets the batch itself (batches are never mutated). ``parts`` is
        bytes (one code per record, for up to 256 destinations) or a list of ints."""
        if n > MAX_CODED_DESTINATIONS:
            buckets: list[list[int]] = [[] for _ in range(n)]
            appends = [b.append for b in buckets]
            for i, p in enumerate(parts):
                appends[p](i)
            size = len(parts)
            return [None if not positions else self if len(positions) == size
                    else self.take(positions) for positions in buckets]
        codes = parts if type(parts) is bytes else bytes(parts)
        size = len(codes)
        if not size:
            return [None] * n
        if codes.count(codes[0]) == size:
            return [self if p == codes[0] else None for p in range(n)]
        # one pass per column for every destination at once (`columns.split_columns`)
        columns = (self.values,) if self.keys is None else (self.values, self.keys)
        counts, cuts, exact = split_columns(codes, n, columns)
        values, keys = cuts[0], None if self.keys is None else cuts[1]
        ts, ts_exact = _split_stamps(self.ts, codes, n, counts)
        born, born_exact = ((ts, ts_exact) if self.born is self.ts
                            else _split_stamps(self.born, codes, n, counts))
        exact = exact and ts_exact and born_exact
        ids = None
        if self.ids is not None:
            ids = [take_ids(self.ids, positions)
                   for positions in split_column(codes, n, range(size))]
        return [None if not counts[p] else
                Batch(None if keys is None else keys[p], values[p], ts[p], born[p],
                      None if ids is None else ids[p], exact) for p in range(n)]

    def slice(self, start: int, stop: int) -> "Batch":
        """The records from ``start`` up to ``stop``."""
        ids = self.ids
        return Batch(None if self.keys is None else self.keys[start:stop],
                     self.values[start:stop], self.ts[start:stop], self.born[start:stop],
                     None if ids is None else (ids.slice(start, stop) if type(ids) is IdRun
                                               else ids[start:stop]))

    def records(self) -> list["Record"]:
        keys = self.keys or [None] * len(self.values)
        return [Record(k, v, t, b) for k, v, t, b in zip(keys, self.values, self.ts, self.born)]

    def __repr__(self) -> str:
        return f"Batch({len(self)} records)"


def _take_column(column: Sequence, get: itemgetter, n: int) -> Sequence:
    # Timestamps are often one value for a whole source batch: repeat it instead.
    first = column[0]
    if column[-1] == first and column.count(first) == len(column):
        return [first] * n
    return get(column)


def _split_stamps(column: Sequence, codes: bytes, n: int, counts: list[int]
                  ) -> tuple[list, bool]:
    """The column cut like its batch, and whether its items are exact numbers."""
    # Timestamps are often one value for a whole source batch: repeat it instead.
    first = column[0]
    if column[-1] == first and column.count(first) == len(column):
        return [[first] * count for count in counts], exact_numbers((first,))
    _, (cut,), exact = split_columns(codes, n, (column,))
    return cut, exact


# Batch.split cuts a batch for up to this many destinations by one code (a byte) per
# record; for more, by an interpreted pass that deals positions into buckets.
MAX_CODED_DESTINATIONS = 256


def _constant(column: Sequence) -> Any:
    """The column's single value if all its elements are equal, else the column."""
    if column and column[-1] == column[0] and column.count(column[0]) == len(column):
        first = float(column[0])
        # 0.0 == -0.0: a column mixing them is not one value (a stamp keeps its sign)
        if first != 0.0 or len({math.copysign(1.0, v) for v in column}) == 1:
            return first
    return column


def _expand(column: Any, n: int) -> Sequence:
    return [column] * n if isinstance(column, float) else column


# How a field of a batch travels (`FrameCodec`): as itself, packed, or a PairColumn as
# its two packed columns.
AS_IS, INTS, FLOAT64, PAIRS = 0, 1, 2, 3
# How a column of event times is logged (never in a frame: it costs a pass the log's
# bytes pay for and the wire's do not): each item's bits XOR the one before's
# (`columns.pack_float64_xor`).
FLOAT64_XOR = 4


def pack_column(column: Any) -> tuple[Any, int]:
    """``column`` packed as ints or float64s when every item is exactly that type (and
    an int fits in 64 bits), with its kind; else itself."""
    if type(column) is IntColumn:
        return pack_ints(column), INTS
    if type(column) is PairColumn:
        return (pack_ints(column.firsts), pack_ints(column.seconds)), PAIRS
    if type(column) is list or type(column) is tuple:
        kind = type(column[0]) if column else None
        if kind is int:
            data = pack_ints(column)
            if data is not None:
                return data, INTS
        elif kind is float:
            data = pack_float64(column)
            if data is not None:
                return data, FLOAT64
    return column, AS_IS


def unpack_column(field: Any, kind: int) -> Any:
    if kind == INTS:
        return unpack_int_column(field)
    if kind == FLOAT64:
        return unpack_float64(field)
    if kind == FLOAT64_XOR:
        return unpack_float64_xor(field)
    if kind == PAIRS:
        if type(field) is not tuple or len(field) != 2:
            raise ValueError("a packed pair column is two packed int columns")
        return pair_column(unpack_int_column(field[0]), unpack_int_column(field[1]))
    return field


@dataclass
class Record:
    """One record, for the places that handle records one at a time (dead letters)."""

    key: Any
    value: Any
    ts: float
    born: float


class ControlRecord:
    """Base of in-band control records. Subclasses set a unique ``code`` and register."""

    code: ClassVar[int]

    def payload(self) -> Any:
        return None

    @classmethod
    def from_payload(cls, payload: Any) -> "ControlRecord":
        return cls()


_CONTROL_TYPES: dict[int, type[ControlRecord]] = {}


def control_record(cls: type[ControlRecord]) -> type[ControlRecord]:
    """Class decorator: make a control record type decodable from the wire."""
    if cls.code in _CONTROL_TYPES and _CONTROL_TYPES[cls.code] is not cls:
        raise ValueError(f"control code {cls.code} already used by {_CONTROL_TYPES[cls.code]}")
    _CONTROL_TYPES[cls.code] = cls
    return cls


@control_record
@dataclass(frozen=True)
class Watermark(ControlRecord):
    """No record with event time below ``time`` will follow on this channel."""

    time: float
    code: ClassVar[int] = 1

    def payload(self) -> Any:
        return self.time

    @classmethod
    def from_payload(cls, payload: Any) -> "Watermark":
        return cls(payload)


@control_record
@dataclass(frozen=True)
class EndOfStream(ControlRecord):
    """The sender has sent its last record on this channel. ``savepoint``: the job is
    stopping with a savepoint (`bastion.runtime.savepoint`), not ending — the
    receiver keeps its state for a later job instead of flushing it (no window fires
    for the end of input)."""

    savepoint: bool = False
    code: ClassVar[int] = 2

    def payload(self) -> Any:
        return self.savepoint or None

    @classmethod
    def from_payload(cls, payload: Any) -> "EndOfStream":
        return cls(payload is True)


# -- wire format -------------------------------------------------------------------------


def passes_unencoded(elements: list) -> bool:
    """Would ``elements`` decode to equal elements of the same types, none of which
    anybody can change? Then a frame to a task in the same process may skip the codec:
    batches without lineage ids whose columns hold only exact ints (64-bit) and floats
    (`columns.exact_numbers`), watermarks and ends of stream (frozen)."""
    for e in elements:
        kind = type(e)
        if kind is Batch:
            if e.ids is not None or not e.exact and not (
                    (e.keys is None or exact_numbers(e.keys))
                    and (type(e.values) is PairColumn or exact_numbers(e.values))
                    and exact_numbers(e.ts) and (e.born is e.ts or exact_numbers(e.born))):
                return False
        elif kind is not Watermark and kind is not EndOfStream:
            return False
    return True


class FrameCodec:
    """Encodes frames to bytes and back; one per instance (it holds a msgpack Packer)."""

    def __init__(self, codecs: tuple[Codec, ...] = ()):
        self._by_type = {c.cls: c for c in codecs}
        self._by_code = {c.code: c for c in codecs}
        self._packer = msgpack.Packer(use_bin_type=True, default=self._default)

    def _default(self, value: Any) -> Any:
        codec = self._by_type.get(type(value))
        if codec is None:
            if isinstance(value, (set, frozenset, IntColumn, PairColumn)):
                return list(value)
            raise unserialisable(value)
        return msgpack.ExtType(codec.code, codec.encode(value))

    def _ext_hook(self, code: int, data: bytes) -> Any:
        codec = self._by_code.get(code)
        if codec is None:
            return msgpack.ExtType(code, data)
        return codec.decode(data)

    def encode(self, elements: list) -> bytes:
        wire: list[tuple] = []  # a data or a control element each
        for e in elements:
            if isinstance(e, Batch):
                # int and float columns travel as packed machine words when they can
                # (`bastion.runtime.columns`); ``packing`` says which, 2 bits a field
                keys, keys_kind = pack_column(e.keys)
                values, values_kind = pack_column(e.values)
                ts, ts_kind = pack_column(_constant(e.ts))
                born, born_kind = ((ts, ts_kind) if e.born is e.ts
                                   else pack_column(_constant(e.born)))
                packing = keys_kind | values_kind << 2 | ts_kind << 4 | born_kind << 6
                wire.append((DATA, keys, values, ts, born, to_wire(e.ids), packing))
            else:
                wire.append((CONTROL, e.code, e.payload()))
        return self._packer.pack(wire)

    def decode(self, data: bytes) -> list:
        wire = msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False,
                               ext_hook=self._ext_hook)
        out: list = []
        for e in wire:
            if e[0] == DATA:
                keys, values, ts, born, packing = e[1], e[2], e[3], e[4], e[6]
                if packing:
                    keys = unpack_column(keys, packing & 3)
                    values = unpack_column(values, packing >> 2 & 3)
                    ts = unpack_column(ts, packing >> 4 & 3)
                    born = unpack_column(born, packing >> 6 & 3)
                n = len(values)
                ts_column = _expand(ts, n)
                # one list for both, as the source made them (batches are never mutated)
                born_column = (ts_column if type(ts) is float and born == ts
                               else _expand(born, n))
                out.append(Batch(keys, values, ts_column, born_column, from_wire(e[5])))
            else:
                out.append(_CONTROL_TYPES[e[1]].from_payload(e[2]))
        return out

    def pack_value(self, value: Any) -> bytes:
        return self._packer.pack(value)

    def unpack_value(self, data: bytes) -> Any:
        return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False,
                               ext_hook=self._ext_hook)


# -- stable hashing ------------------------------------------------------------------------


class UnstableKeyError(TypeError):
    """A key whose stable hash would differ from process to process. Routing code
    catches it and names the operator that keys the stream."""

    def __init__(self, key: Any):
        self.key_type = type(key).__name__
        super().__init__(
            f"key of type {self.key_type} has no stable hash (its repr contains a memory "
            "address); key by a str/int/tuple or give the class a __repr__ that is stable")


def stable_hash(key: Any) -> int:
    """A hash of ``key`` that is the same in every process and after every restart
    (Python's ``hash()`` of str/bytes is salted per process, so it cannot route keys).
    Keys equal in Python hash equal: ``1``, ``1.0`` and ``True`` are one key.

    str, bytes, numbers, None and tuples (or lists) of them hash by value. Any other
    object hashes by its ``repr()``, so it is a usable key exactly when its repr is a
    function of its value, as a dataclass's is (two equal keys whose reprs differ, like
    ``Point(1)`` and ``Point(1.0)``, may land on different instances). The default
    ``object.__repr__`` shows a memory address, which differs per process: such a key
    raises `UnstableKeyError` instead of routing by address. A set or frozenset hashes
    as its elements in the order of their reprs, which are stable when each element's
    is."""
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes):
        return zlib.crc32(key)
    if isinstance(key, float) and key.is_integer():
        key = int(key)
    if isinstance(key, bool):
        key = int(key)
    if isinstance(key, int) and -(2**63) <= key < 2**64:
        return zlib.crc32(key.to_bytes(9, "little", signed=True))
    return zlib.crc32(msgpack.packb(_canonical(key), use_bin_type=True,
                                    default=_hash_default))


def _canonical(value: Any) -> Any:
    """``value`` with every number inside its tuples in one form, so that equal keys
    pack to equal bytes: ``(1,)``, ``(1.0,)`` and ``(True,)`` are one key."""
    if isinstance(value, (tuple, list)):
        return tuple(map(_canonical, value))
    if isinstance(value, (set, frozenset)):
        return sorted(map(_canonical, value), key=repr)
    if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
        return int(value)
    return value


def _hash_default(value: Any) -> Any:
    text = repr(value)
    # CPython's default repr, and those of functions, methods and many C objects,
    # end in "at 0x<address>": an address is only meaningful inside one process.
    if " at 0x" in text:
        raise UnstableKeyError(value)
    return text
