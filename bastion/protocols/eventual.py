"""Eventual checkpoints: an operator's state rebuilt from the control tuples in its output log.

Continuous eventual checkpointing (CEC, Sebeou & Magoutis) never snapshots a stateful
operator whole. Its state is split into independent *parts* — one per open window of
a time window aggregate or join, one per key of ``reduce`` / ``stateful_map`` or of a
count window (a part that never closes) — and the operator writes small *control
tuples* into its persisted output log, in order with its results:

- ``G_open`` when a part opens: the part's state after the input that opened it, as
  the paper has it, or — for parts that open empty, windows — before it (the runtime
  writes one for the parts a batch opened, before the batch's results: their state
  after the batch, or the empty one at the position before it:
  `bastion.protocols.cec`);
- ``G_check`` now and then for the parts whose last footprint is oldest: the part's
  state as it is now;
- ``closed`` when a part closes (a window fired): reading the log backwards, a part
  closed later than a footprint of it is no longer part of the state. (The paper
  recognises a closed window by its result tuple; a result of ours may not name its
  part — a keyed reduce's does not — so closing is a control tuple of its own.)

What an operator writes at one moment is one control tuple, a *burst*: the parts it
footprints (or that closed) then, each with its state. It carries N, the number of
parts open once it is applied, the operator's *position* — for every upstream source
instance, the offset of the last record that reached the operator — and its
watermark, and a CRC32 over all of it. A footprint's state reflects exactly the
inputs up to its position. The extent counts log records; in *tuples* (the paper's
measure) a burst counts once per part it holds.

**The eventual checkpoint** (EC) at the end of a log (or at a log time ``at``) is found
by reading the log backwards: the newest control tuple gives N; every part's newest
footprint is collected, skipping parts that closed later, until N footprints are
found. The records read on the way are the *extent*. The EC is then:

- the state of every part, each at its own position;
- ``replay_from``: the element-wise minimum of those positions and the newest
  control tuple's (all a part-less operator has reflected) — upstream replays the
  records after it;
- each part *ignores* replayed inputs at or below its own position, and inputs of
  the parts that closed inside the extent are dropped;
- the operator's watermark is the minimum of the footprints' watermarks: a window
  that closed before the extent began ended at or below it, so its replayed inputs
  are late, as they were when they first arrived after it fired.

A control tuple whose CRC does not match is skipped and reported, never loaded: the
older footprints of its parts are used instead. If the log's beginning is reached before N
footprints are found (a G_open lost), the EC is *incomplete*: the operator must
start from nothing and replay everything.

A position here is a vector, not a timestamp: parallel sources interleave records
in no fixed order, so one event time cannot say which inputs a part has reflected;
the offsets of each source instance can. This module is pure logic over log records
``(seq, ts, value)`` — the in-process recovery and the Spark job
(`bastion.spark_jobs.reconstruct`) both call `reconstruct`, so they give the same EC.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any, Iterable

import msgpack

from bastion.runtime.durable import DurableCodec, int_range, pack_run, split_run
from bastion.storage import CorruptRecordError, ObjectStore
from bastion.storage.log import Damage, LogReader, gc_paused, salvage_log

# Kinds, the first element of a log record's value.
RESULT = 0
G_OPEN = 1
G_CHECK = 2
CLOSED = 3
CONTROL_KINDS = (G_OPEN, G_CHECK, CLOSED)

Position = dict[str, int]  # "<source>/<instance>" -> offset of the last record reflected


# A control tuple is the list ``[kind, parts, states, n_open, meta, crc]`` and stands
# for a whole *burst*: the footprints (or closings) an operator writes at one moment,
# which share one position and one watermark. ``parts`` holds the parts' keys and
# ``states`` their states (None in a ``closed``; one item for several parts: the state
# of each, as windows that open empty have it), each item the bytes the task's codec
# packs of one value; ``meta`` the msgpack bytes of ``[position, watermark]``; ``crc``
# a CRC32 over the parts, states and meta bytes exactly as stored, started from a value
# that encodes the kind and N. Checking one is three CRC32 calls over bytes the log
# already holds — no re-encoding — whatever the size of the burst, and its columns are
# cut in C, one call each: a footprint per log record cost a Python pass per footprint,
# ~3 us, most of an EC-load of 230,000 footprints (measured by `benchmarks/cec.py`
# (f): 0.80 s before bursts).
#
# A column is stored in one of three layouts, told apart by its first byte:
#
# - a *run* (`bastion.runtime.durable`: the items back to back, a flags byte 0 or 1
#   first): what a running operator writes (`burst`). Its keys and states are packed
#   in one C call each — a bytes object per part and a packer call per value cost
#   more than a fast window's own work (`benchmarks/cec.py` (d): 22-34 % of a job's
#   CPU on fast windows, G_open only) — and cut back into items in one when read;
# - a msgpack *array of bin*, an item each (a msgpack array header first, never 0 or
#   1): what `footprints`, `footprint` and `closed` write from items packed already
#   (a resumed job copies an earlier one's footprints as they were), and every burst
#   of the logs of earlier versions;
# - a *range* (a byte 2 first, then the msgpack of ``[first, count]``): the parts'
#   keys when they are consecutive ints — the windows a watermark closes, or a batch
#   of time-ordered records opens, are numbered one by one — cut into the items
#   their run would hold. Fast sliding windows name a window twice (opened, closed)
#   per two records, and their runs were half the log (`benchmarks/cec.py` (d)).
#
# Whatever the layout a part's item is the same bytes, so a part is one part whichever
# layout names it, and the EC is the same.
_RUN_FLAGS = (0, 1)   # the first byte of a run; an array header is 0x90-0x9f, 0xdc, 0xdd
_RANGE_FLAG = 2
# The most items a range holds: a damaged (or hostile) one must not make billions.
_MAX_RANGE = 1 << 24
_INT64 = range(-2**63, 2**63)


def key_column(keys: list) -> bytes | None:
    """``keys`` as a range column, if they are two or more consecutive ints within
    64 bits (exactly ints: ``2.0`` is a part of its own; one C pass); else None, and
    the caller packs them as a run."""
    found = int_range(keys)
    if found is None or found[1] > _MAX_RANGE:
        return None
    return bytes((_RANGE_FLAG,)) + msgpack.packb(found)


def _range_items(data: bytes) -> tuple[bytes, ...] | None:
    """The items of a range column, as the run of its ints holds them; None if it is
    not one."""
    try:
        first, count = msgpack.unpackb(data[1:])
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if (type(first) is not int or type(count) is not int or not 1 < count <= _MAX_RANGE
            or first not in _INT64 or first + count - 1 not in _INT64):
        return None
    return split_run(pack_run(DurableCodec(), list(range(first, first + count))))


def _crc(kind: int, parts: bytes, states: bytes | None, n_open: int, meta: bytes) -> int:
    # For bytes of a fixed length, CRC32 maps distinct start values to distinct
    # results: a changed kind or N (below 2**30) always shows.
    crc = zlib.crc32(parts, ((n_open << 2) | kind) & 0xFFFFFFFF)
    if states is not None:
        crc = zlib.crc32(states, crc)
    return zlib.crc32(meta, crc)


def _control(kind: int, parts: list[bytes], states: list[bytes] | None, n_open: int,
             position: Position, watermark: float | None) -> list:
    packed_parts = msgpack.packb(parts, use_bin_type=True)
    packed_states = None if states is None else msgpack.packb(states, use_bin_type=True)
    meta = msgpack.packb([position, watermark])
    return [kind, packed_parts, packed_states, n_open, meta,
            _crc(kind, packed_parts, packed_states, n_open, meta)]


def burst(kind: int, parts: bytes, states: bytes | None, n_open: int,
          position: Position, watermark: float | None) -> list:
    """The value of a control tuple whose parts' keys and states (None: a ``closed``)
    are runs (`bastion.runtime.durable.pack_run`): what a running operator writes. The
    runs are taken as given — the reader cuts them, and refuses a burst whose runs do
    not cut into as many states as parts, or one for all — so the write costs one
    msgpack call (the meta) and three CRC32 calls."""
    meta = msgpack.packb([position, watermark])
    return [kind, parts, states, n_open, meta, _crc(kind, parts, states, n_open, meta)]


def footprints(kind: int, parts: list[bytes], states: list[bytes], n_open: int,
               position: Position, watermark: float) -> list:
    """The value of a ``G_open`` or ``G_check`` log record: a burst of footprints, the
    ``i``-th part's key ``parts[i]`` and state ``states[i]``, each encoded by the task's
    durable codec; ``n_open`` counts the parts open once all are applied. A part may
    appear once in a burst."""
    if len(parts) != len(states) or not parts:
        raise ValueError(f"a burst needs one state per part and at least one part, got "
                         f"{len(parts)} parts and {len(states)} states")
    return _control(kind, parts, states, n_open, position, watermark)


def footprint(kind: int, part: bytes, state: bytes, n_open: int, position: Position,
              watermark: float) -> list:
    """A burst of one footprint (see `footprints`)."""
    return _control(kind, [part], [state], n_open, position, watermark)


def closed(parts: list[bytes], n_open: int, position: Position,
           watermark: float | None) -> list:
    """The value of the log record saying ``parts`` closed (N counts them no more)."""
    if not parts:
        raise ValueError("a closing names at least one part")
    return _control(CLOSED, parts, None, n_open, position, watermark)


def result(payload: Any) -> list:
    """The value of an ordinary result record."""
    return [RESULT, payload]


def is_control(value: Any) -> bool:
    return _kind(value) in CONTROL_KINDS


def is_result(value: Any) -> bool:
    return _kind(value) == RESULT


def _kind(value: Any) -> int | None:
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):
        return value[0]
    return None


def valid(value: Any) -> bool:
    """Is ``value`` a well-formed control tuple whose checksum matches?"""
    return (_checked(value) and _decode_meta(value[4]) is not None
            and _decode_burst(value) is not None)


def parts_of(value: Any) -> tuple[bytes, ...] | None:
    """The part keys (as packed) a valid control tuple names, in the order written;
    None if ``value`` is not one."""
    burst = _decode_burst(value) if _checked(value) else None
    return None if burst is None else burst[0]


def _checked(value: Any) -> bool:
    """Has ``value`` a control tuple's shape, and does its checksum match?"""
    try:
        kind, parts, states, n_open, meta, crc = value
    except (TypeError, ValueError):
        return False
    return (kind in CONTROL_KINDS and type(parts) is bytes and type(meta) is bytes
            and type(n_open) is int and n_open >= 0
            and (type(states) is bytes if kind != CLOSED else states is None)
            and crc == _crc(kind, parts, states, n_open, meta))


def _column(data: bytes) -> Any:
    """A burst's column as a tuple of items, from any layout (see above); None or
    another shape if it is none."""
    if data[:1] and data[0] in _RUN_FLAGS:
        return split_run(data)
    if data[:1] and data[0] == _RANGE_FLAG:
        return _range_items(data)
    try:
        return msgpack.unpackb(data, use_list=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def _decode_burst(value: Any) -> tuple[tuple, tuple | None] | None:
    """A checked control tuple's parts and states (None in a ``closed``) as tuples of
    bytes; None if its bytes, though they are what was written, are not in a shape
    this version reads."""
    parts = _column(value[1])
    # set(map(type, ...)): the element test in C, a burst holds thousands
    if type(parts) is not tuple or not parts or set(map(type, parts)) != {bytes}:
        return None
    if value[2] is None:   # a closing (`_checked` saw to it)
        return parts, None
    states = _column(value[2])
    if (type(states) is not tuple or len(states) not in (1, len(parts))
            or set(map(type, states)) != {bytes}):
        return None
    return parts, states * len(parts) if len(states) < len(parts) else states


def _decode_meta(meta: bytes) -> tuple[Position, float] | None:
    """A checked control tuple's ``(position, watermark)``; None if its bytes, though
    they are what was written, are not in a shape this version reads."""
    try:
        position, watermark = msgpack.unpackb(meta, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    if type(position) is not dict or not isinstance(watermark, (int, float)):
        return None
    return position, float(watermark)


class Footprint(tuple):
    """A part's newest footprint: ``(kind, seq, state, position, watermark)`` — kind
    G_OPEN or G_CHECK, the log record holding it, the part's state as packed, and
    the position and watermark it reflects. A tuple, built by ``Footprint((kind, seq,
    state, position, watermark))``: an EC-load makes one per part by the hundred
    thousand, and a tuple's constructor runs in C where a dataclass's runs Python
    (~1 us each, half the backward pass of a 230,000-footprint extent)."""

    __slots__ = ()
    kind = property(itemgetter(0))
    seq = property(itemgetter(1))
    state = property(itemgetter(2))
    position = property(itemgetter(3))
    watermark = property(itemgetter(4))


@dataclass
class EventualCheckpoint:
    """An operator instance's state as its log's control tuples give it (see the
    module docstring). ``seq`` is the newest log record taken into account."""

    parts: dict[bytes, Footprint] = field(default_factory=dict)
    closed: set[bytes] = field(default_factory=set)
    n_open: int = 0
    # the newest control tuple's position and watermark: with no part open, what
    # replay starts after
    newest_position: Position = field(default_factory=dict)
    newest_watermark: float | None = None
    seq: int = -1
    extent_records: int = 0          # log records from ``seq`` back to the oldest footprint
    skipped: list[int] = field(default_factory=list)  # seqs of damaged control tuples
    complete: bool = True            # False: a footprint is missing, replay everything

    @property
    def replay_from(self) -> Position | None:
        """The offsets upstream replays after: element-wise the minimum of the parts'
        positions and the newest control tuple's (a source instance a position lacks
        counts as -1). None: replay everything."""
        if not self.complete:
            return None
        positions = [f.position for f in self.parts.values()] + [self.newest_position]
        sources = set().union(*positions)
        return {s: min(p.get(s, -1) for p in positions) for s in sorted(sources)}

    @property
    def watermark(self) -> float | None:
        """The watermark the operator restarts with (None: from nothing)."""
        if not self.complete or self.newest_watermark is None:
            return None
        return min([f.watermark for f in self.parts.values()] + [self.newest_watermark])

    def to_wire(self) -> dict:
        """Plain msgpack-able form (what is stored, and what Spark returns)."""
        return {"parts": {p: list(f) for p, f in self.parts.items()},
                "closed": sorted(self.closed), "n_open": self.n_open, "seq": self.seq,
                "newest_position": self.newest_position,
                "newest_watermark": self.newest_watermark,
                "extent_records": self.extent_records, "skipped": list(self.skipped),
                "complete": self.complete}

    @classmethod
    def from_wire(cls, wire: dict) -> "EventualCheckpoint":
        return cls(parts={p: Footprint((k, s, st, dict(pos), wm))
                          for p, (k, s, st, pos, wm) in wire["parts"].items()},
                   closed=set(wire["closed"]), n_open=wire["n_open"], seq=wire["seq"],
                   newest_position=dict(wire["newest_position"]),
                   newest_watermark=wire["newest_watermark"],
                   extent_records=wire["extent_records"], skipped=list(wire["skipped"]),
                   complete=wire["complete"])


class Reconstruction:
    """The backward pass, fed records newest first; `done` once every footprint is
    found. Records newer than ``at`` (a log time) are passed over. The extent counts
    the records from the newest one taken into account (``newest_seq``, if the
    caller feeds control tuples only, as the Spark job does) down to the oldest
    footprint, or to the beginning of the log when one is missing."""

    def __init__(self, at: float | None = None, newest_seq: int | None = None):
        self.at = at
        self.ec = EventualCheckpoint()
        self.ec.seq = -1 if newest_seq is None else newest_seq
        self._n_target: int | None = None
        self._oldest_seq: int | None = None
        self._meta: bytes | None = None   # the last meta bytes decoded, and what they gave
        self._decoded: tuple[Position, float] | None = None
        self.done = False

    def feed(self, seq: int, ts: float, value: Any) -> bool:
        """Take one record (in decreasing seq order); True once done."""
        if self.done:
            return True
        if self.at is not None and ts > self.at:
            return False
        ec = self.ec
        if ec.seq < 0:
            ec.seq = seq
        self._oldest_seq = seq
        # Most of an extent is results, and the backward pass reads all of it: the test
        # that passes them over is `_kind`'s, inline, because a call per record cost as
        # much as the test (measured: 1.1 -> 2.2 M records/s fed).
        if not (isinstance(value, (list, tuple)) and value and isinstance(value[0], int)
                and value[0] in CONTROL_KINDS):
            return False
        return self._take(seq, value)

    def feed_newest_first(self, records: list[tuple[int, float, Any]]) -> bool:
        """`feed` over a list of records (newest first) in one loop; True once done."""
        if self.done:
            return True
        at = self.at
        ec = self.ec
        take = self._take
        for record in records:
            seq, ts, value = record
            if at is not None and ts > at:
                continue
            if ec.seq < 0:
                ec.seq = seq
            self._oldest_seq = seq
            if not (isinstance(value, (list, tuple)) and value and isinstance(value[0], int)
                    and value[0] in CONTROL_KINDS):
                continue
            if take(seq, value):
                return True
        return False

    def _take(self, seq: int, value: Any) -> bool:
        ec = self.ec
        burst = decoded = None
        if _checked(value):
            meta = value[4]
            if meta != self._meta:
                self._meta, self._decoded = meta, _decode_meta(meta)
            decoded = self._decoded
            if decoded is not None:
                burst = _decode_burst(value)
        if burst is None or decoded is None:
            ec.skipped.append(seq)
            return False
        # Footprints of one burst share their (position, watermark): read-only here.
        position, watermark = decoded
        kind = value[0]
        if self._n_target is None:
            self._n_target = ec.n_open = value[3]
            ec.newest_position, ec.newest_watermark = dict(position), watermark
        found, closed = ec.parts, ec.closed
        part_keys, states = burst
        target = self._n_target
        if kind == CLOSED:
            closed.update(p for p in part_keys if p not in found)
        else:
            assert states is not None   # a footprint burst carries its parts' states
            if found.keys().isdisjoint(part_keys) and closed.isdisjoint(part_keys):
                # Every part of the burst is new (a G_open burst always is): the newest
                # ones, as many as are missing, taken in C — no Python step per part.
                take = min(len(part_keys), target - len(found))
                if take > 0:
                    found.update(zip(part_keys[:-take - 1:-1], map(Footprint, zip(
                        repeat(kind), repeat(seq), states[:-take - 1:-1], repeat(position),
                        repeat(watermark)))))
            else:
                # Newest first inside the burst too; a part of it already found or closed
                # later keeps what the newer record said.
                for i in range(len(part_keys) - 1, -1, -1):
                    part = part_keys[i]
                    if part not in found and part not in closed:
                        found[part] = Footprint((kind, seq, states[i], position, watermark))
                        if len(found) == target:
                            break
        self.done = len(found) == target
        return self.done

    def finish(self) -> EventualCheckpoint:
        """The EC; incomplete if the log ended before every footprint was found."""
        ec = self.ec
        if not self.done and self._n_target is not None:
            ec.complete = False
        if ec.seq >= 0:
            oldest = (self._oldest_seq or 0) if self.done else 0
            ec.extent_records = ec.seq - oldest + 1
        return ec


def reconstruct(records_newest_first: Iterable[tuple[int, float, Any]],
                at: float | None = None, newest_seq: int | None = None
                ) -> EventualCheckpoint:
    """The eventual checkpoint of a log whose records come newest first."""
    rebuild = Reconstruction(at, newest_seq)
    for seq, ts, value in records_newest_first:
        if rebuild.feed(seq, ts, value):
            break
    return rebuild.finish()


def decode_parts(codec: Any, ec: EventualCheckpoint) -> tuple[list, list, list[Footprint]]:
    """What a restart loads of ``ec``: its parts, their states and their footprints,
    oldest footprint first, keys and states decoded by ``codec`` (the task's state
    codec) in one unpacking pass each."""
    # The pass found them newest first, a burst's parts too (and the stored form keeps
    # that order): reversed, they come in the order they were written.
    found = list(reversed(ec.parts.items()))
    footprints = [fp for _, fp in found]
    return (codec.unpack_many([part for part, _ in found], "eventual checkpoint part"),
            codec.unpack_many([fp.state for fp in footprints], "eventual checkpoint state"),
            footprints)


def _reconstruct_batches(batches: Iterable[list[tuple[int, float, Any]]],
                         at: float | None) -> EventualCheckpoint:
    rebuild = Reconstruction(at)
    for batch in batches:
        if rebuild.feed_newest_first(batch):
            break
    return rebuild.finish()


def read_eventual_checkpoint(store: ObjectStore, prefix: str, at: float | None = None
                             ) -> tuple[EventualCheckpoint, list[Damage]]:
    """The EC of the log under ``prefix``, read backwards only as far as its extent,
    by the log's fast block-checked reader; if that meets a damaged record, the whole
    log is salvaged (`salvage_log`) and the damage returned with the EC."""
    with gc_paused():
        try:
            return _reconstruct_batches(LogReader(store, prefix).read_backward(), at), []
        except CorruptRecordError:
            salvaged = salvage_log(store, prefix)
            return reconstruct(reversed(salvaged.records), at), salvaged.damaged


# -- where logs and stored checkpoints live ------------------------------------------------


def log_prefix(job: str, operator: str, instance: int | str | None = None) -> str:
    """Where an operator's (or one instance's) output log lives in the store."""
    base = f"jobs/{job}/logs/{operator}/"
    return base if instance is None else f"{base}{instance}/"


def eventual_prefix(job: str, operator: str, instance: int | str) -> str:
    """Where the eventual checkpoints of one operator instance are stored."""
    return f"jobs/{job}/eventual/{operator}/{instance}/"


# -- the stored form: what `bastion reconstruct` writes and a restart loads ---------------
#
# An EC is stored as one object ``<prefix>ec-<seq, 20 digits>`` (``prefix`` is
# ``jobs/<job>/eventual/<operator>/<instance>/``), framed like a log record —
# ``u32 length | u32 CRC32 | payload``, little-endian, CRC32 over the payload — where
# the payload is the msgpack map ``{"format": 1, "ec": EventualCheckpoint.to_wire()}``.
# The seq in the name orders the ECs of one instance: the newest is the last listed.

_EC_FORMAT = 1
_EC_FRAME = struct.Struct("<II")


def store_eventual_checkpoint(store: ObjectStore, prefix: str,
                              ec: EventualCheckpoint) -> str:
    """Write ``ec`` under ``prefix`` (see above) and return its key. An EC of an
    empty log (``seq == -1``) says nothing a restart could load: ValueError."""
    if ec.seq < 0:
        raise ValueError("the log is empty: there is no eventual checkpoint to store")
    payload = msgpack.packb({"format": _EC_FORMAT, "ec": ec.to_wire()}, use_bin_type=True)
    key = f"{prefix.rstrip('/')}/ec-{ec.seq:020d}"
    store.put(key, _EC_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
    return key


def load_eventual_checkpoint(store: ObjectStore, prefix: str, seq: int | None = None
                             ) -> EventualCheckpoint | None:
    """The EC stored under ``prefix`` for log record ``seq``, or the newest one if
    ``seq`` is None; None if there is none. A stored EC whose length or CRC does not
    check out raises `CorruptRecordError` naming it: it is never loaded."""
    prefix = prefix.rstrip("/") + "/"
    if seq is None:
        names = sorted(k for k in store.list(prefix) if k[len(prefix):].startswith("ec-"))
        if not names:
            return None
        key = names[-1]
    else:
        key = f"{prefix}ec-{seq:020d}"
        if not store.exists(key):
            return None
    data = store.get(key)
    if len(data) < _EC_FRAME.size:
        raise CorruptRecordError(f"eventual checkpoint {key!r} is {len(data)} bytes, "
                                 "shorter than its header", key=key, offset=0)
    length, crc = _EC_FRAME.unpack_from(data)
    payload = memoryview(data)[_EC_FRAME.size:]
    if length != len(payload) or zlib.crc32(payload) != crc:
        raise CorruptRecordError(f"eventual checkpoint {key!r} fails its length or CRC32 "
                                 "check (corrupt or truncated); it is not loaded",
                                 key=key, offset=0)
    doc = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(doc, dict) or doc.get("format") != _EC_FORMAT:
        raise CorruptRecordError(f"eventual checkpoint {key!r} has an unknown format",
                                 key=key, offset=0)
    return EventualCheckpoint.from_wire(doc["ec"])
