"""Column kernels of the keyed exchange: routing a batch and packing its columns.

When a keyed edge crosses workers, every record pays three things on top of what the
operators do with it: finding its destination (a lookup of its key's partition), being
cut into the batch for that destination, and being encoded and decoded on the way.
In Python each is a C-level pass per column (`map`, `itertools.compress`, msgpack),
yet each costs 30-140 machine instructions per item, because every item goes through
the generic object protocol: together about half of what the whole chained pipeline
costs per record. So these loops have a C implementation (`_columns.c`, built with
the package): the partition codes of a batch in one pass, its columns cut for every
destination in one pass each, and int and float columns packed as machine words: an int
column in the narrowest of 1, 2, 4 or 8 bytes that holds all of it, in a few
instructions per item instead of msgpack's generic path. Where the extension was not
built (no compiler), the pure-Python versions below do the same; `NATIVE` says which
is in use, and the tests check they agree.

A frame between two tasks of one worker is not encoded at all when every column of
every batch in it holds only such numbers (`exact_numbers`): decoding would give back
equal values of the same types, and numbers cannot be mutated, so passing the batches
themselves means the same and skips two passes a column. The pieces of a cut batch
know it already (`split_columns`): the cut checks each item while it touches it,
where a pass over a piece whose frame leaves later would miss the cache on each.

The same loops make the durable form of a batch of window results (protocol "cec"
logs every result): one field of every result tuple as a column (`field_column`), and
a column of floats that repeats in runs, such as the window start and the stamp all
results of one window share, run-length encoded (`float64_runs`).

The built-in aggregations of a keyed ``reduce`` (`bastion.aggregations`: Count, Sum,
Min, Max, Mean) fold a batch here too (`fold_keyed`): per record a dict lookup, the
arithmetic and the ``(key, result)`` pair, in C, instead of a Python call of the
aggregation's ``add`` and ``result`` and the loop around them. It folds only plain
numbers (exact ints and floats) and stops at the first record that is not one, which
the operator folds in Python before calling it again after that record, so the two
paths interleave record by record and the results are those of the Python aggregation
exactly: the same values, of the same types.

**Columns of words.** A numpy batch function's column of ints (`bastion._batches`)
becomes an `IntColumn`: an immutable sequence of those ints held as int64 words,
which Python code sees as a tuple of ints (made one at a time, when read) and these
kernels read as words: routed by a byte table, cut, packed and folded without an
object per item. A packed int column decodes to one too (`unpack_int_column`). A
built-in Count, Sum, Min or Max over IntColumns folds in words (`fold_int_column`)
and emits a `PairColumn`, the running ``(key, result)`` pairs of two IntColumns, made
into tuples only where something reads them; on the wire it travels as its two packed
columns. So a job of batch functions and built-in aggregations moves numbers from
its sources to its sinks with no Python object per record, and every per-record
function in between still sees plain ints and tuples. Without the C extension there
are no such columns: the same jobs run on lists and tuples.

Packed columns keep the frame's meaning exactly: a column is packed only when every
item is exactly an ``int`` that fits in 64 bits (not a ``bool``, not a subclass) or
exactly a ``float``; it decodes to a tuple of the same values, as a msgpack array
would. Anything else travels as msgpack did before.
"""

from __future__ import annotations

import functools
import struct
import sys
from array import array
from itertools import accumulate, compress, groupby
from operator import itemgetter
from typing import Sequence


def py_partitions(memo: dict, keys: Sequence, table: bytearray | None = None) -> bytes:
    """``memo[key]`` (0..255) for every key; KeyError for a key not in ``memo``.
    ``table`` caches the codes of the int keys 0..len(table)-1 (255: unknown), which
    only the C kernel reads and fills: here it would cost more than the lookup."""
    return bytes(list(map(memo.__getitem__, keys)))


def py_split_column(codes: bytes, n: int, column: Sequence) -> list[list]:
    """``n`` lists: list ``p`` holds, in order, the items whose code is ``p``."""
    if len(codes) != len(column):
        raise ValueError(f"{len(codes)} codes for a column of {len(column)}")
    if codes and max(codes) >= n:
        raise ValueError(f"a code is not below {n}")
    return [list(compress(column, codes.translate(_select(p)))) for p in range(n)]


def py_split_columns(codes: bytes, n: int, columns: Sequence[Sequence]
                     ) -> tuple[list[int], list[list[list]], bool]:
    """How many codes are ``p`` for each ``p``; every column cut as `split_column`
    cuts it; and whether every item of every column is an exact number
    (`exact_numbers`)."""
    cuts = [py_split_column(codes, n, column) for column in columns]
    counts = [codes.count(p) for p in range(n)]
    return counts, cuts, all(py_exact_numbers(column) for column in columns)


def py_pack_ints(column: Sequence) -> bytes | None:
    """A width byte w (1, 2, 4 or 8, the narrowest that holds every item), then the
    items as little-endian signed w-byte ints; None unless every item is exactly an
    int that fits in 64 bits."""
    if not all(type(v) is int for v in column):
        return None
    low, high = min(column, default=0), max(column, default=0)
    for width in (1, 2, 4, 8):
        bound = 1 << (8 * width - 1)
        if -bound <= low and high < bound:
            return bytes([width]) + b"".join(v.to_bytes(width, "little", signed=True)
                                             for v in column)
    return None


def py_pack_float64(column: Sequence) -> bytes | None:
    if not all(type(v) is float for v in column):
        return None
    return _little_endian(array("d", column)).tobytes()


# Set in the width byte of a packed int column whose items are differences to the item
# before (`py_pack_int_deltas`).
_DELTAS = 0x80


def py_pack_int_deltas(column: Sequence) -> bytes | None:
    """A width byte w (1, 2, 4 or 8: the narrowest that holds every difference) with
    `_DELTAS` set, the first item as a little-endian 8-byte word, then each later
    item's difference to the one before as a little-endian signed w-byte int; None
    unless every item and every difference is exactly an int that fits in 64 bits."""
    if not all(type(v) is int and -(2**63) <= v < 2**63 for v in column):
        return None
    if not column:
        return bytes([1 | _DELTAS])
    rest = py_pack_ints([b - a for a, b in zip(column, column[1:])])
    if rest is None:
        return None
    return (bytes([rest[0] | _DELTAS]) + column[0].to_bytes(8, "little", signed=True)
            + rest[1:])


def py_unpack_ints(data: bytes) -> tuple:
    width = data[0] & ~_DELTAS if data else 0
    first = 8 if data and data[0] & _DELTAS and len(data) > 1 else 0
    if width not in (1, 2, 4, 8) or len(data) - 1 < first or (len(data) - 1 - first) % width:
        raise ValueError(f"{len(data)} bytes are not a packed int column")
    items = tuple(int.from_bytes(data[i:i + width], "little", signed=True)
                  for i in range(1 + first, len(data), width))
    if not first:
        return items
    # as the kernel adds them, in 64-bit words: a damaged column wraps around
    start = int.from_bytes(data[1:9], "little", signed=True)
    return tuple((total + 2**63) % 2**64 - 2**63 for total in accumulate(items, initial=start))


def py_pack_float64_xor(column: Sequence) -> bytes | None:
    """Each exact float's bits XOR the bits of the one before it (the first's against
    0): a header byte (high nibble: the zero bytes above the significant ones; low
    nibble: how many are stored) and those bytes, little-endian; None unless every
    item is exactly a float."""
    if not all(type(v) is float for v in column):
        return None
    out = bytearray()
    previous = 0
    for v in column:
        bits = struct.unpack("<Q", struct.pack("<d", v))[0]
        x, previous = bits ^ previous, bits
        if not x:
            out.append(0x80)
            continue
        lead = (64 - x.bit_length()) // 8
        trail = ((x & -x).bit_length() - 1) // 8
        count = 8 - lead - trail
        out.append(lead << 4 | count)
        out += (x >> 8 * trail).to_bytes(count, "little")
    return bytes(out)


def py_unpack_float64_xor(data: bytes) -> tuple:
    items = []
    bits = at = 0
    while at < len(data):
        lead, count = data[at] >> 4, data[at] & 0x0F
        if lead + count > 8 or (count == 0) != (lead == 8):
            raise ValueError(f"byte {at}: 0x{data[at]:02x} is not an item's header")
        if at + 1 + count > len(data):
            raise ValueError(f"the last item is cut short ({len(data)} bytes)")
        x = int.from_bytes(data[at + 1:at + 1 + count], "little")
        bits ^= x << 8 * (8 - lead - count) if count else 0
        items.append(struct.unpack("<d", struct.pack("<Q", bits))[0])
        at += 1 + count
    return tuple(items)


def py_unpack_float64(data: bytes) -> tuple:
    return tuple(_from_little_endian("d", data))


def py_exact_numbers(column: Sequence) -> bool:
    """Every item is exactly an int that fits in 64 bits or exactly a float: values a
    msgpack round trip gives back equal and of the same type, and immutable."""
    return all(type(v) is float or (type(v) is int and -(2**63) <= v < 2**63)
               for v in column)


def py_field_column(rows: Sequence, index: int) -> list:
    """Item ``index`` of every row, in order."""
    return list(map(itemgetter(index), rows))


def py_float64_runs(column: Sequence) -> tuple[bytes, list[int]] | None:
    """When every item is exactly a float: each run of consecutive items with the same
    bits once, as little-endian float64s, and the length of every run; else None."""
    if not all(type(v) is float for v in column):
        return None
    values, lengths = array("d"), []
    for bits, run in groupby(column, key=_bits):
        values.append(next(run))
        lengths.append(1 + sum(1 for _ in run))
    return _little_endian(values).tobytes(), lengths


# The kinds `fold_keyed` folds (the C kernel numbers them the same).
FOLD_COUNT, FOLD_SUM, FOLD_MIN, FOLD_MAX, FOLD_MEAN = range(5)
_COUNT_LIMIT = 1 << 62  # a Mean's count beyond it is not folded here (nor in C)


def _number(value: object) -> bool:
    return type(value) is int or type(value) is float


def py_fold_keyed(kind: int, state: dict, keys: Sequence, values: Sequence, start: int,
                  out: list | None, opened: list | None) -> int:
    """Fold records ``start..`` into ``state`` (``{key: accumulator}``), appending
    ``(key, result)`` to ``out`` (unless None) and every key new to ``state`` to
    ``opened`` (when a list); the position of the first record not folded
    (``len(values)``: all of them).

    A record is folded here when its value and its key's accumulator are plain numbers
    (exact ints or floats) of what ``kind`` expects: Count any value and an int
    accumulator; Sum a number and a number accumulator; Min and Max a number and a
    number or None; Mean a number and a ``(sum, count)`` tuple of a number and an int
    count in 0..2**62. The accumulator and result are then exactly what the built-in
    aggregation (with no ``fn``) computes."""
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys for {len(values)} values")
    if not 0 <= kind <= FOLD_MEAN:
        raise ValueError(f"unknown fold kind {kind}")
    get = state.get
    append = out.append if out is not None else _discard
    i = max(start, 0)
    for i in range(i, len(values)):
        key, value = keys[i], values[i]
        acc = get(key, _MISSING)
        new = acc is _MISSING
        if kind == FOLD_COUNT:
            if new:
                acc = 0
            elif type(acc) is not int:
                return i
            acc = result = acc + 1
        elif kind == FOLD_SUM:
            if not _number(value) or not (new or _number(acc)):
                return i
            acc = result = (0 if new else acc) + value
        elif kind in (FOLD_MIN, FOLD_MAX):
            if not _number(value) or not (new or acc is None or _number(acc)):
                return i
            if new or acc is None:
                acc = value
            else:
                acc = (min if kind == FOLD_MIN else max)(acc, value)
            result = acc
        else:
            if not _number(value):
                return i
            if new:
                acc = (0, 0)
            elif not (type(acc) is tuple and len(acc) == 2 and _number(acc[0])
                      and type(acc[1]) is int and 0 <= acc[1] <= _COUNT_LIMIT):
                return i
            acc = (acc[0] + value, acc[1] + 1)
            result = acc[0] / acc[1]
        state[key] = acc
        append((key, result))
        if new and opened is not None:
            opened.append(key)
    return len(values)


_MISSING = object()


def _discard(item: object) -> None:
    pass


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


@functools.cache
def _select(p: int) -> bytes:
    """The translation table that turns code ``p`` into 1 and every other into 0."""
    return bytes(int(code == p) for code in range(256))


def _little_endian(packed: array) -> array:
    if sys.byteorder == "big":
        packed.byteswap()
    return packed


def _from_little_endian(typecode: str, data: bytes) -> array:
    if len(data) % 8:
        raise ValueError(f"a packed column of {len(data)} bytes is not whole 8-byte items")
    values = array(typecode, data)
    return _little_endian(values)


def py_int_column(column: object) -> None:
    """Without the C extension no column is held as words: None, as the kernel
    answers for a column it does not take."""
    return None


def py_fold_int_column(kind: int, state: dict, keys: Sequence, values: Sequence,
                       opened: list | None) -> None:
    """Without IntColumns there is nothing to fold in words: None (fold_keyed folds)."""
    return None


class _NoColumn:
    """Stands for IntColumn and PairColumn where the extension was not built: no
    object is ever of this type."""


try:
    from bastion.runtime._columns import (IntColumn, PairColumn, exact_numbers,
                                          field_column, float64_runs, fold_int_column,
                                          fold_keyed, int_column, pack_float64,
                                          pack_float64_xor, pack_int_deltas, pack_ints,
                                          pair_column, partitions, split_column,
                                          split_columns, unpack_float64, unpack_float64_xor,
                                          unpack_int_column, unpack_ints)
    NATIVE = True
except ImportError:  # built without a C compiler: the same, slower
    IntColumn = PairColumn = _NoColumn  # type: ignore[misc,assignment]
    int_column, fold_int_column = py_int_column, py_fold_int_column  # type: ignore[assignment]
    unpack_int_column = py_unpack_ints  # type: ignore[assignment]
    pair_column = None  # type: ignore[assignment]  # never called: no IntColumns
    partitions, split_column = py_partitions, py_split_column
    split_columns = py_split_columns
    pack_ints, pack_float64 = py_pack_ints, py_pack_float64
    unpack_ints, unpack_float64 = py_unpack_ints, py_unpack_float64
    pack_float64_xor, unpack_float64_xor = py_pack_float64_xor, py_unpack_float64_xor
    pack_int_deltas = py_pack_int_deltas
    exact_numbers = py_exact_numbers
    field_column, float64_runs = py_field_column, py_float64_runs
    fold_keyed = py_fold_keyed
    NATIVE = False
