"""Durable bytes: how task state, staged sink outputs and channel state are stored.

What a worker writes to the object store it later reads back — after a failure, in
another process, perhaps on another machine. Anyone who can write to the bucket
controls those bytes, so they must be *data*, never code: Bastion stores them as
msgpack (as on the wire, with the topology's registered codecs for other types), never
as pickle, whose loader runs whatever the bytes say.

**Exact types.** State is not the wire: an accumulator that was a list must come back a
list, not a tuple. `DurableCodec` packs with ``strict_types`` (msgpack then hands every
non-exact type to us) and marks the types msgpack has no notation for:

- a ``tuple``, ``set`` or ``frozenset`` is stored as an array whose first element is a
  *mark* (an empty extension value of a reserved code) — one array, no nested buffer,
  so a batch of tuples costs one call per tuple;
- an ``int`` beyond 64 bits is an extension value holding its signed big-endian bytes;
- a value of a type with a registered `Codec` is an extension value of the codec's
  code, exactly as on the wire; any other type is refused with the wire's error.

Everything else msgpack carries exactly: None, bool, int, float (inf and nan too), str,
bytes, list, and dict with any of these as keys. ``bytearray`` and ``memoryview`` are
stored as bytes (msgpack packs them without asking). Subclasses of builtin types (a
``namedtuple``, an ``IntEnum``, a ``Counter``) need a codec: storing one as its base
type would restore a different object after a failure, silently.

Extension codes ``RESERVED_CODES`` (112–127) are Bastion's own; a topology refuses a
codec that asks for one (`Topology.register_codec`), so a mark is never a user value.

**Runs.** A CEC burst holds the keys and the states of many parts, and on fast
windows a part opens every two records: a bytes object and a packer call per value
cost more than the operator's own work. So a burst stores each column as one *run*:
the values back to back, each as `DurableCodec.pack` packs it alone (its flags byte,
then its msgpack) — ``b"".join(codec.pack_many(values))``. `pack_run` makes it in one
C call (`_durable.c`) when every value is *plain* (None, bool, int within 64 bits,
float, str, bytes, and exact lists, tuples and dicts of them), and through the codec
otherwise, which refuses what it cannot store with the same error as ever;
`pack_rows` is the batched ``part_state`` of an operator whose part's state is a row
of table lookups (a time window's accumulators and its latest stamp), packed without
the rows being built. `split_run` cuts a run back into its items, each exactly the
bytes `pack` gives its value — a part is named by its key's bytes, whatever burst
holds it — or refuses bytes that are not a run. A flags byte (0 or 1) is itself a
msgpack integer, so a run reads as flags, value, flags, value...

**Table ends.** A `TableEnd` stands, in a value being encoded, for the entries a dict
gained since it held ``start`` keys (no key removed since: they are its newest
entries): they are stored as a dict of them, packed in C straight from the table —
no dict of them built, no older entry read (an incremental checkpoint's appended keys:
`bastion.runtime.incremental`). It decodes as that dict.

**Checksummed.** Every blob starts with a header — magic, flags, payload length — and
a CRC32 over header and payload. `open_blob` checks it before anything is decoded
and raises `CorruptBlobError` naming the key: a flipped byte, a truncated blob, or a
blob in another format (a planted pickle) is refused, never interpreted.
"""

from __future__ import annotations

import struct
import zlib
from itertools import islice
from typing import Any, Iterable, Protocol

import msgpack

from bastion.codecs import Codec
from bastion.errors import UnserialisableError
from bastion.runtime.columns import IntColumn, PairColumn
from bastion.storage.errors import CorruptBlobError

# Extension codes 112..127 belong to Bastion (user codecs get 0..111).
RESERVED_CODES = range(112, 128)
_TUPLE, _SET, _FROZENSET, _BIGINT = 127, 126, 125, 124

_MAGIC = b"BNDB"
# magic, flags, payload length; the CRC32 that follows covers these and the payload.
_PREFIX = struct.Struct("<4sBQ")
_CRC = struct.Struct("<I")
_HEADER_BYTES = _PREFIX.size + _CRC.size
# Flag: the payload has marked arrays, so decoding must look at every array (a
# Python call per array); blobs without tuples or sets decode without that cost.
_MARKED = 1
_PLAIN_FLAGS, _MARKED_FLAGS = bytes((0,)), bytes((_MARKED,))  # `pack`'s flags byte


def unserialisable(value: Any) -> UnserialisableError:
    """The error for a value no codec covers: the same on the wire and in the store."""
    return UnserialisableError(
        f"cannot serialise a value of type {type(value).__name__}: values must be None, "
        "bool, int, float, str, bytes, or tuples, lists, sets or dicts of them; register "
        "a codec with topology.register_codec(...) for other types", type(value).__name__)


def seal(payload: bytes, flags: int = 0) -> bytes:
    """``payload`` behind a header whose CRC32 covers the header and the payload."""
    prefix = _PREFIX.pack(_MAGIC, flags, len(payload))
    return b"".join((prefix, _CRC.pack(zlib.crc32(payload, zlib.crc32(prefix))), payload))


def open_blob(data: bytes, key: str) -> tuple[int, memoryview]:
    """The flags and payload of a sealed blob, after checking its header and CRC32;
    `CorruptBlobError` naming ``key`` if anything is off."""
    if len(data) < _HEADER_BYTES:
        raise CorruptBlobError(f"blob {key!r} is {len(data)} bytes, shorter than the "
                               f"{_HEADER_BYTES}-byte header of a Bastion blob", key=key)
    magic, flags, length = _PREFIX.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptBlobError(f"blob {key!r} is not a Bastion blob (it starts with "
                               f"{bytes(data[:4])!r}, not {_MAGIC!r}); it is not read",
                               key=key)
    view = memoryview(data)
    payload = view[_HEADER_BYTES:]
    (crc,) = _CRC.unpack_from(data, _PREFIX.size)
    if length != len(payload) or zlib.crc32(payload, zlib.crc32(view[:_PREFIX.size])) != crc:
        raise CorruptBlobError(f"blob {key!r} fails its length or CRC32 check (corrupt "
                               "or truncated); it is not read", key=key)
    return flags, payload


def open_bytes(data: bytes, key: str) -> bytes:
    """The payload of a blob sealed by `seal` (channel state, in-flight logs)."""
    return bytes(open_blob(data, key)[1])


class _Mark:
    """What a reserved mark decodes to while its array is being built."""

    __slots__ = ("build",)

    def __init__(self, build: type):
        self.build = build


_MARKS = {_TUPLE: _Mark(tuple), _SET: _Mark(set), _FROZENSET: _Mark(frozenset)}
_TUPLE_EXT, _SET_EXT, _FROZENSET_EXT = (msgpack.ExtType(c, b"")
                                        for c in (_TUPLE, _SET, _FROZENSET))


def _build_marked(items: list) -> Any:
    if items:
        first = items[0]
        if type(first) is _Mark:
            return first.build(items[1:])
    return items


class TableEnd:
    """The entries ``table`` gained since it held ``start`` keys, for a table no key
    was removed from since: stored as a dict of them. Encode it before the table
    changes. In C (`_durable.c`) the entries from the table's ``start``-th entry on,
    which may also hold a few older keys (with their values now) if keys were removed
    before; through msgpack, the newest ``len(table) - start``: either way every key
    gained, with its value now."""

    __slots__ = ("table", "start")

    def __init__(self, table: dict, start: int) -> None:
        self.table = table
        self.start = start

    def as_dict(self) -> dict:
        return dict(islice(reversed(self.table.items()), max(len(self.table) - self.start, 0)))


try:  # plain values and runs in C: an optional build (setup.py), same bytes
    from ._durable import seal as _seal_c
    from ._durable import pack_rows as _pack_rows_c, pack_run as _pack_run_c
    from ._durable import set_table_end as _set_table_end
    from ._durable import split_run as _split_run_c
    from ._durable import int_range as _int_range_c
    _set_table_end(TableEnd)
    NATIVE = True
except ImportError:  # pragma: no cover - a machine without a C compiler
    NATIVE = False


class DurableCodec:
    """Encodes values to sealed blobs and back, exactly, with the topology's codecs.
    One per task: it holds a msgpack Packer, which is not reentrant, so encode only on
    the task's own thread; `decode` is safe anywhere."""

    def __init__(self, codecs: Iterable[Codec] = ()):
        codecs = tuple(codecs)
        self._by_type = {c.cls: c for c in codecs}
        self._by_code = {c.code: c for c in codecs}
        self._packer = msgpack.Packer(use_bin_type=True, strict_types=True,
                                      default=self._default)
        self._marked = False

    def _default(self, value: Any) -> Any:
        kind = type(value)
        if kind is tuple:
            self._marked = True
            return [_TUPLE_EXT, *value]
        codec = self._by_type.get(kind)
        if codec is not None:
            return msgpack.ExtType(codec.code, codec.encode(value))
        if kind is set or kind is frozenset:
            self._marked = True
            return [_SET_EXT if kind is set else _FROZENSET_EXT, *value]
        if kind is int:  # msgpack asks only for ints beyond 64 bits
            return msgpack.ExtType(_BIGINT, value.to_bytes(
                (value.bit_length() + 8) // 8, "big", signed=True))
        if kind is TableEnd:
            return value.as_dict()
        if kind is IntColumn or kind is PairColumn:  # a batch's column of words: its
            return value.tolist()  # items, restored as the list of ints or pairs they are
        raise unserialisable(value)

    def encode(self, value: Any) -> bytes:
        """A sealed blob of ``value``; `TypeError` for a value no codec covers.

        A plain value (see `pack_run`) is packed and sealed in C, the same bytes,
        straight into the blob (a snapshot of 16 M keys is 100 MB: packed, copied into
        a bytes object and copied again behind its header, it cost three times the
        pages), offering the GIL to other threads as it goes: a snapshot of millions
        of keys must not keep the worker from answering its heartbeat."""
        if NATIVE:
            blob = _seal_c(value, _MAGIC, _MARKED)
            if blob is not None:
                return blob
        self._marked = False
        payload = self._packer.pack(value)
        return seal(payload, _MARKED if self._marked else 0)

    def _ext_hook(self, code: int, data: bytes) -> Any:
        mark = _MARKS.get(code)
        if mark is not None:
            return mark
        if code == _BIGINT:
            return int.from_bytes(data, "big", signed=True)
        codec = self._by_code.get(code)
        if codec is None:
            raise CorruptBlobError(f"extension code {code} has no codec in this topology",
                                   key="")
        return codec.decode(data)

    def pack(self, value: Any) -> bytes:
        """``value`` exactly, like `encode`, but unsealed — a flags byte and the payload,
        no header or CRC — for bytes a checksum of their own already covers (a CEC
        control tuple's part and state): small values, read back by the hundred
        thousand, where a second check would cost as much as the decoding."""
        self._marked = False
        payload = self._packer.pack(value)
        return bytes((_MARKED if self._marked else 0,)) + payload

    def pack_many(self, values: list) -> list[bytes]:
        """`pack` of each of ``values``. A CEC burst packs a key and a state per part,
        and on fast windows that is a part every few records: the loop is inline, and
        a tuple — the commonest key — is packed as the marked array the packer's
        ``default`` would make of it (the same bytes), without the call back into
        Python that ``strict_types`` costs a tuple."""
        pack = self._packer.pack
        out: list[bytes] = []
        append = out.append
        for value in values:
            if type(value) is tuple:
                append(_MARKED_FLAGS + pack([_TUPLE_EXT, *value]))
            else:
                self._marked = False
                payload = pack(value)
                append((_MARKED_FLAGS if self._marked else _PLAIN_FLAGS) + payload)
        return out

    def unpack(self, data: bytes, key: str) -> Any:
        """The value `pack` made of ``data`` (read from ``key``: for messages)."""
        if not data:
            raise CorruptBlobError(f"{key!r} holds no packed value", key=key)
        try:
            # inline, not through `_unpack`: an EC-load calls this twice per part
            return msgpack.unpackb(data[1:], raw=False, strict_map_key=False,
                                   ext_hook=self._ext_hook,
                                   list_hook=_build_marked if data[0] & _MARKED else None)
        except (CorruptBlobError, ValueError, TypeError, msgpack.UnpackException):
            return self._unpack(data[0], data[1:], key)  # raises, naming the key

    def unpack_many(self, datas: list[bytes], key: str) -> list:
        """`unpack` of each of ``datas``, in one pass of one unpacker over them side by
        side: a flags byte is itself a msgpack integer, so the bytes read as flags,
        value, flags, value... An EC-load unpacks every part's key and state, and a call
        per value cost more than its decoding. Anything else than a flags byte and one
        value per item is unpacked item by item, which raises naming ``key``."""
        joined = b"".join(datas)
        # Marks need the list hook, a call per array: only when some value has one.
        for hook in (None, _build_marked):
            unpacker = msgpack.Unpacker(None, max_buffer_size=max(len(joined), 1),
                                        raw=False, strict_map_key=False,
                                        ext_hook=self._ext_hook, list_hook=hook)
            unpacker.feed(joined)
            try:
                flat = list(unpacker)
            except (CorruptBlobError, ValueError, TypeError, msgpack.UnpackException):
                break
            flags = set(flat[0::2])
            if len(flat) != 2 * len(datas) or not flags <= {0, _MARKED}:
                break
            if hook is None and _MARKED in flags:
                continue
            return flat[1::2]
        return [self.unpack(data, key) for data in datas]

    def decode(self, data: bytes, key: str) -> Any:
        """The value in blob ``data`` read from ``key``, once its checksum holds."""
        flags, payload = open_blob(data, key)
        return self._unpack(flags, payload, key)

    def _unpack(self, flags: int, payload: Any, key: str) -> Any:
        try:
            return msgpack.unpackb(payload, raw=False, strict_map_key=False,
                                   ext_hook=self._ext_hook,
                                   list_hook=_build_marked if flags & _MARKED else None)
        except CorruptBlobError as exc:
            raise CorruptBlobError(f"blob {key!r}: {exc}", key=key) from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            # The CRC held, so these are bytes Bastion wrote, in a shape this version
            # cannot read: still never guessed at.
            raise CorruptBlobError(f"blob {key!r} cannot be decoded: {exc}",
                                   key=key) from None


# -- runs: a burst's keys or states as one bytes object (see the module docstring) --------

class PacksMany(Protocol):
    """What packs a run's values one by one when the C loop cannot (a state codec)."""

    def pack_many(self, values: list) -> list[bytes]: ...


def pack_run(codec: PacksMany, values: list) -> bytes:
    """``values`` as a run: each packed as ``codec.pack`` packs it, back to back, in one
    C call when all are plain; `UnserialisableError` (from the codec) for a value no
    codec covers."""
    if NATIVE:
        run = _pack_run_c(values)
        if run is not None:
            return run
    return b"".join(codec.pack_many(values))


def pack_rows(codec: PacksMany, parts: list, tables: tuple[dict, ...]) -> bytes | None:
    """The run of ``[table[part] for table in tables]`` for every part of ``parts``
    (in C when all is plain: no row is built); None if a part is missing from a
    table. `UnserialisableError` (from the codec) for a value no codec covers."""
    if NATIVE:
        run = _pack_rows_c(parts, tables)
        if run is not None:
            return run
    try:
        rows = [[table[part] for table in tables] for part in parts]
    except KeyError:
        return None
    return b"".join(codec.pack_many(rows))


def py_split_run(data: bytes) -> tuple[bytes, ...] | None:
    """`split_run` in Python: an unpacker passes over each flags byte and value."""
    if not data:
        return None
    unpacker = msgpack.Unpacker(None, max_buffer_size=len(data))
    unpacker.feed(data)
    items, start = [], 0
    try:
        while start < len(data):
            if data[start] > _MARKED:
                return None
            unpacker.skip()   # the flags byte
            unpacker.skip()   # the value
            end = unpacker.tell()
            items.append(data[start:end])
            start = end
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData):
        return None
    return tuple(items)


def py_int_range(values: list) -> tuple[int, int] | None:
    """`int_range` in Python."""
    n = len(values)
    if n < 2 or set(map(type, values)) != {int}:
        return None
    first = values[0]
    if first < -2**63 or first + n > 2**63 or values != list(range(first, first + n)):
        return None
    return first, n


def int_range(values: list) -> tuple[int, int] | None:
    """``(first, count)`` when ``values`` are two or more exact ints within 64 bits
    (signed), each one more than the one before — the window numbers a batch opens
    or a watermark closes; else None."""
    if NATIVE:
        return _int_range_c(values)
    return py_int_range(values)


def split_run(data: bytes) -> tuple[bytes, ...] | None:
    """The items of a run, each its flags byte and its value's bytes — what `pack`
    gives the value alone; None unless ``data`` is one or more such items back to
    back (a flags byte 0 or 1, one whole msgpack value), nothing after the last."""
    if NATIVE:
        return _split_run_c(data)
    return py_split_run(data)
