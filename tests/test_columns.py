"""The column kernels of the keyed exchange (`bastion.runtime.columns`): the C ones and
the pure-Python ones against each other and against plain per-item definitions, and
the frame codec that uses them keeping a frame's meaning exactly."""

from __future__ import annotations

import math
import struct

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bastion.protocols.coordinated import Barrier
from bastion.runtime import columns
from bastion.runtime.channel import LocalOutputChannel
from bastion.runtime.records import Batch, EndOfStream, FrameCodec, Watermark, passes_unencoded

KERNELS = [pytest.param(columns, id="native"), pytest.param(None, id="python")]

ints64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
scalars = st.one_of(st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True), st.booleans(), st.none(),
                    st.text(max_size=3), st.binary(max_size=3))


def kernel(module, name):
    return getattr(columns, name) if module is not None else getattr(columns, f"py_{name}")


def test_the_native_kernels_are_built():
    # `make test` builds them (gcc is on every machine this project runs on); without
    # them the exchange silently runs the slower Python kernels
    assert columns.NATIVE, ("bastion.runtime._columns is not built: reinstall with a C "
                            "compiler (`pip install -e .`)")


@pytest.mark.parametrize("module", KERNELS)
@given(keys=st.lists(st.one_of(st.integers(-3, 40), st.text(max_size=2),
                               st.tuples(st.integers(0, 3))), max_size=60),
       n=st.integers(1, 256))
@settings(max_examples=150, deadline=None)
def test_partitions_are_the_memo_entry_of_every_key(module, keys, n):
    memo = {k: (hash(repr(k)) & 0xFFFF) % n for k in keys}
    codes = kernel(module, "partitions")(memo, keys)
    assert type(codes) is bytes
    assert list(codes) == [memo[k] for k in keys]
    assert kernel(module, "partitions")(memo, tuple(keys)) == codes


@pytest.mark.parametrize("module", KERNELS)
@given(keys=st.lists(st.one_of(st.integers(-3, 40), st.booleans(),
                               st.sampled_from([2.0, 7.0, 2**70, -(2**40)]),
                               st.text(max_size=2)), max_size=80),
       codes=st.lists(st.integers(0, 255), min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_the_small_key_table_gives_the_memo_entry_and_remembers_it(module, keys, codes):
    # a table of 32 slots, so that keys fall on both sides of its end; code 255, the
    # table's "unknown", must still route by the memo
    memo = {k: codes[i % len(codes)] for i, k in enumerate(keys)}
    table = bytearray(b"\xff") * 32
    partitions = kernel(module, "partitions")
    for _ in range(2):  # the second pass reads what the first remembered
        assert list(partitions(memo, keys, table)) == [memo[k] for k in keys]
    if module is not None:
        remembered = {k: memo[k] for k in keys
                      if type(k) is int and 0 <= k < 32 and memo[k] != 255}
        assert {k: c for k, c in enumerate(table) if c != 255} == remembered


@pytest.mark.parametrize("module", KERNELS)
def test_partitions_name_a_key_missing_from_the_memo(module):
    with pytest.raises(KeyError):
        kernel(module, "partitions")({1: 0}, [1, (2, 3)])
    with pytest.raises(KeyError):  # not yet in the table either
        kernel(module, "partitions")({1: 0}, [1, 2], bytearray(b"\xff") * 8)
    with pytest.raises(ValueError):
        kernel(module, "partitions")({1: 256}, [1])


@pytest.mark.parametrize("module", KERNELS)
@given(data=st.data(), n=st.integers(1, 256))
@settings(max_examples=150, deadline=None)
def test_split_column_keeps_each_destinations_items_in_order(module, data, n):
    column = data.draw(st.lists(scalars, max_size=80))
    codes = bytes(data.draw(st.lists(st.integers(0, n - 1), min_size=len(column),
                                     max_size=len(column))))
    split = kernel(module, "split_column")(codes, n, column)
    assert len(split) == n
    for p in range(n):
        expected = [v for v, c in zip(column, codes) if c == p]
        assert len(split[p]) == len(expected)
        assert all(a is b for a, b in zip(split[p], expected))  # the same objects


@pytest.mark.parametrize("module", KERNELS)
def test_split_column_refuses_codes_that_do_not_fit(module):
    with pytest.raises(ValueError):
        kernel(module, "split_column")(bytes([0, 2]), 2, [1, 2])
    with pytest.raises(ValueError):
        kernel(module, "split_column")(bytes([0]), 2, [1, 2])


@pytest.mark.parametrize("module", KERNELS)
@given(data=st.data(), n=st.integers(1, 256), width=st.integers(1, 3))
@settings(max_examples=150, deadline=None)
def test_split_columns_cut_every_column_and_tell_whether_all_are_exact_numbers(
        module, data, n, width):
    size = data.draw(st.integers(0, 60))
    items = st.one_of(scalars, ints64, st.floats(allow_nan=False))
    table = [data.draw(st.lists(items, min_size=size, max_size=size)) for _ in range(width)]
    codes = bytes(data.draw(st.lists(st.integers(0, n - 1), min_size=size, max_size=size)))
    counts, cuts, exact = kernel(module, "split_columns")(codes, n, table)
    assert counts == [codes.count(p) for p in range(n)]
    for column, cut in zip(table, cuts):
        assert len(cut) == n
        for p in range(n):
            expected = [v for v, c in zip(column, codes) if c == p]
            assert len(cut[p]) == counts[p]
            assert all(a is b for a, b in zip(cut[p], expected))  # the same objects
    assert exact is all(type(v) is float or (type(v) is int and -(2**63) <= v < 2**63)
                        for column in table for v in column)


@pytest.mark.parametrize("module", KERNELS)
def test_split_columns_refuses_columns_that_do_not_fit_the_codes(module):
    with pytest.raises(ValueError):
        kernel(module, "split_columns")(bytes([0, 1]), 2, ([1, 2], [1]))
    with pytest.raises(ValueError):
        kernel(module, "split_columns")(bytes([0, 2]), 2, ([1, 2],))


@pytest.mark.parametrize("values, stamps, exact", [
    ([1, 2, 3, 4], [0.5] * 4, True),
    ([1.5, -2, 3, 2**63 - 1], [0.5, 0.5, 1.5, 1.5], True),   # stamps that are not one
    ([1, 2, True, 4], [0.5] * 4, False),        # a bool in the other destination's piece
    ([1, 2, 3, 2**63], [0.5] * 4, False),       # beyond 64 bits
    ([1, 2, 3, "4"], [0.5] * 4, False),
    ([1, 2, 3, 4], [0.5, 0.5, 1, True], False),  # a stamp that is not a number
])
def test_the_pieces_of_a_cut_batch_know_whether_they_may_skip_the_codec(values, stamps,
                                                                       exact):
    """The cut finds each piece's exactness while it touches the items; what it finds
    must be what a scan of the piece finds, and a frame of them passes unencoded
    exactly when it may."""
    pieces = Batch([0, 1, 0, 1], values, stamps, stamps).split(bytes([0, 1, 0, 1]), 2)
    for piece in pieces:
        assert piece.exact is exact
        scanned = Batch(piece.keys, piece.values, piece.ts, piece.born)
        assert passes_unencoded([piece]) is passes_unencoded([scanned])
    assert passes_unencoded(pieces) is exact


@pytest.mark.parametrize("module", KERNELS)
@given(values=st.lists(st.one_of(ints64, st.integers(-130, 130), st.integers(-(2**15), 2**15),
                                 st.integers(-(2**31) - 2, 2**31 + 2)), max_size=50))
def test_int_columns_pack_to_their_narrowest_width_and_back(module, values):
    data = kernel(module, "pack_ints")(values)
    width = next(w for w in (1, 2, 4, 8)
                 if all(-(1 << (8 * w - 1)) <= v < 1 << (8 * w - 1) for v in values))
    fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[width]
    assert data == bytes([width]) + struct.pack(f"<{len(values)}{fmt}", *values)
    back = kernel(module, "unpack_ints")(data)
    assert type(back) is tuple and back == tuple(values)
    assert all(type(v) is int for v in back)


@pytest.mark.parametrize("module", KERNELS)
def test_every_one_byte_int_unpacks_to_itself(module):
    # the C kernel decodes one-byte columns from a table of the 256 ints, made once
    column = list(range(-128, 128)) * 2
    data = kernel(module, "pack_ints")(column)
    assert data[0] == 1
    back = kernel(module, "unpack_ints")(data)
    assert back == tuple(column) and all(type(v) is int for v in back)


@pytest.mark.parametrize("module", KERNELS)
@given(values=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=50))
def test_float_columns_pack_their_exact_bits_and_back(module, values):
    data = kernel(module, "pack_float64")(values)
    assert data == struct.pack(f"<{len(values)}d", *values)
    back = kernel(module, "unpack_float64")(data)
    assert struct.pack(f"<{len(back)}d", *back) == data  # NaN payloads, -0.0 included


@pytest.mark.parametrize("module", KERNELS)
@given(values=st.lists(st.one_of(ints64, st.integers(-130, 130)), max_size=50))
@settings(max_examples=150, deadline=None)
def test_int_columns_pack_as_differences_and_add_back_up(module, values):
    data = kernel(module, "pack_int_deltas")(values)
    differences = [b - a for a, b in zip(values, values[1:])]
    if any(not -(2**63) <= d < 2**63 for d in differences):
        assert data is None   # a difference that does not fit a word
        return
    width = next(w for w in (1, 2, 4, 8)
                 if all(-(1 << (8 * w - 1)) <= d < 1 << (8 * w - 1) for d in differences))
    fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[width]
    assert data == bytes([0x80 | width]) + (
        struct.pack(f"<q{len(differences)}{fmt}", values[0], *differences) if values else b"")
    # (without the extension, unpack_int_column is py_unpack_ints)
    for unpack in ("unpack_ints",) + (("unpack_int_column",) if module else ()):
        back = kernel(module, unpack)(data)
        assert list(back) == values
    assert all(type(v) is int for v in kernel(module, "unpack_ints")(data))


@pytest.mark.parametrize("module", KERNELS)
def test_numbers_that_climb_one_by_one_take_a_byte_each_as_differences(module):
    # a count window's firing numbers, two keys taking turns, far past one byte
    numbers = [n for n in range(300_000, 302_000) for _ in range(2)]
    data = kernel(module, "pack_int_deltas")(numbers)
    assert len(data) == 1 + 8 + len(numbers) - 1
    assert len(kernel(module, "pack_ints")(numbers)) == 1 + 4 * len(numbers)


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("data", [b"\x81\x00", b"\x81" + bytes(7), b"\x82" + bytes(9),
                                  b"\x83", b"\x80"])
def test_a_damaged_column_of_differences_is_refused(module, data):
    with pytest.raises(ValueError, match="not a packed int column"):
        kernel(module, "unpack_ints")(data)


@pytest.mark.parametrize("module", KERNELS)
@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                 st.floats(1.6e9, 1.8e9)), max_size=50))
@settings(max_examples=150, deadline=None)
def test_float_columns_pack_as_their_bits_xor_the_one_before_and_back(module, values):
    data = kernel(module, "pack_float64_xor")(values)
    # each item a header and the significant bytes of its bits XOR the last item's
    expected, previous = bytearray(), 0
    for v in values:
        bits = struct.unpack("<Q", struct.pack("<d", v))[0]
        x, previous = bits ^ previous, bits
        significant = x.to_bytes(8, "little").rstrip(b"\0")
        trail = len(significant) - len(significant.lstrip(b"\0"))
        expected.append((8 - len(significant)) << 4 | (len(significant) - trail))
        expected += significant[trail:]
    assert data == bytes(expected)
    back = kernel(module, "unpack_float64_xor")(data)
    assert type(back) is tuple
    assert struct.pack(f"<{len(back)}d", *back) == struct.pack(f"<{len(values)}d", *values)


@pytest.mark.parametrize("module", KERNELS)
def test_event_times_a_record_apart_keep_two_or_three_of_their_eight_bytes(module):
    for times in ([i / 2.0 for i in range(300_000, 304_096)],
                  [1_764_000_000.0 + i * 0.001 for i in range(4096)]):
        assert len(kernel(module, "pack_float64_xor")(times)) <= 3.1 * len(times)


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("data, why", [(b"\x90", "not an item's header"),
                                       (b"\x00", "not an item's header"),
                                       (b"\x09" + bytes(9), "not an item's header"),
                                       (b"\x08\x01\x02", "cut short"),
                                       (b"\x80\x26\x01", "cut short")])
def test_a_damaged_xor_column_is_refused(module, data, why):
    with pytest.raises(ValueError, match=why):
        kernel(module, "unpack_float64_xor")(data)


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("column", [[1.0, 1], [1.0, None], [2.5, "x"]])
def test_a_column_not_exactly_float_is_not_xor_packed(module, column):
    assert kernel(module, "pack_float64_xor")(column) is None


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("column", [[1, True], [1, 2**63], [-(2**63) - 1], [1, 1.0],
                                    [1, "1"], [1, None]])
def test_a_column_not_exactly_int64_is_not_packed(module, column):
    assert kernel(module, "pack_ints")(column) is None


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("column", [[1.0, 1], [1.0, None], [2.5, "x"]])
def test_a_column_not_exactly_float_is_not_packed(module, column):
    assert kernel(module, "pack_float64")(column) is None


@pytest.mark.parametrize("module", KERNELS)
def test_a_torn_packed_column_is_refused(module):
    for torn in (b"", b"\x03\x00\x00\x00", b"\x04\x00\x00"):
        with pytest.raises(ValueError):
            kernel(module, "unpack_ints")(torn)
    with pytest.raises(ValueError):
        kernel(module, "unpack_float64")(b"\x00" * 7)


@pytest.mark.parametrize("module", KERNELS)
@given(rows=st.lists(st.one_of(st.tuples(scalars, scalars, scalars),
                               st.lists(scalars, min_size=3, max_size=4)), max_size=40),
       index=st.integers(-3, 2))
def test_field_column_is_one_field_of_every_row(module, rows, index):
    column = kernel(module, "field_column")(rows, index)
    assert type(column) is list and len(column) == len(rows)
    assert all(item is row[index] for item, row in zip(column, rows))  # the same objects


@pytest.mark.parametrize("module", KERNELS)
def test_field_column_refuses_a_row_without_the_field(module):
    with pytest.raises(IndexError):
        kernel(module, "field_column")([(1, 2), (3,)], 1)
    with pytest.raises(TypeError):
        kernel(module, "field_column")([(1, 2), 5], 1)


@pytest.mark.parametrize("module", KERNELS)
@given(runs=st.lists(st.tuples(st.floats(allow_nan=True, allow_infinity=True),
                               st.integers(1, 4)), max_size=20))
def test_float_runs_store_each_run_of_equal_bits_once(module, runs):
    column = [value for value, length in runs for _ in range(length)]
    # the runs as a brute force finds them: consecutive items with the same bits
    expected: list[list] = []
    for value in column:
        if expected and struct.pack("<d", value) == struct.pack("<d", expected[-1][0]):
            expected[-1][1] += 1
        else:
            expected.append([value, 1])
    values, lengths = kernel(module, "float64_runs")(column)
    assert values == b"".join(struct.pack("<d", value) for value, _ in expected)
    assert lengths == [length for _, length in expected]
    assert all(type(length) is int for length in lengths)


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("column", [[1.0, 1], [1.0, None], [True]])
def test_float_runs_of_a_column_not_exactly_float_are_none(module, column):
    assert kernel(module, "float64_runs")(column) is None


def msgpack_round_trip(column):
    """What a column became before packing: a msgpack array, decoded as a tuple."""
    return msgpack.unpackb(msgpack.packb(column, use_bin_type=True), use_list=False,
                           raw=False, strict_map_key=False)


@given(keys=st.one_of(st.none(), st.lists(ints64, min_size=3, max_size=3),
                      st.lists(scalars, min_size=3, max_size=3)),
       values=st.one_of(st.lists(ints64, min_size=3, max_size=3),
                        st.lists(st.floats(allow_nan=False), min_size=3, max_size=3),
                        st.lists(st.one_of(ints64, st.booleans(), st.text(max_size=2)),
                                 min_size=3, max_size=3)),
       ts=st.lists(st.floats(allow_nan=False), min_size=3, max_size=3))
@example(keys=None, values=[0, 0, 0], ts=[0.0, 0.0, -0.0])  # equal, not one value
def test_a_frame_decodes_to_what_msgpack_alone_gave(keys, values, ts):
    """Packing is invisible: every column decodes to the values and types a msgpack
    array of it decodes to (ints stay ints, bools stay bools, lists become tuples)."""
    codec = FrameCodec()
    batch = Batch(keys, values, ts, [1.5] * 3)
    (decoded,) = codec.decode(codec.encode([batch]))
    for got, sent in ((decoded.keys, keys), (decoded.values, values), (decoded.ts, ts)):
        if sent is None:
            assert got is None
            continue
        expected = msgpack_round_trip(sent)
        # compared as msgpack bytes: NaN is not equal to itself
        assert msgpack.packb(list(got)) == msgpack.packb(list(expected))
        assert [type(v) for v in got] == [type(v) for v in expected]
    assert list(decoded.born) == [1.5] * 3


@pytest.mark.parametrize("born_is_ts", [True, False])
def test_stamps_shared_by_ts_and_born_split_and_travel_as_one(born_is_ts):
    """A source batch's ts and born are one list: cutting, taking and coding it work
    on it once. Stamps that only look alike (equal ts, another born) stay apart."""
    stamps = [7.25] * 6
    batch = Batch([0, 1, 0, 1, 0, 1], list(range(6)), stamps,
                  stamps if born_is_ts else [3.5] * 6)
    born = 7.25 if born_is_ts else 3.5
    pieces = batch.split(bytes([0, 1, 0, 1, 0, 1]), 2)
    taken = batch.take([5, 0])
    for part, size in ((pieces[0], 3), (pieces[1], 3), (taken, 2)):
        assert part.ts == [7.25] * size and part.born == [born] * size
        assert (part.born is part.ts) == born_is_ts
        assert passes_unencoded([part])
    codec = FrameCodec()
    (decoded,) = codec.decode(codec.encode([pieces[1]]))
    assert decoded.values == (1, 3, 5)
    assert list(decoded.ts) == [7.25] * 3 and list(decoded.born) == [born] * 3


def test_big_ints_still_travel_and_still_fail_where_msgpack_fails():
    codec = FrameCodec()
    (decoded,) = codec.decode(codec.encode([Batch([2**63], [2**64 - 1], [0.0], [0.0])]))
    assert decoded.keys == (2**63,) and decoded.values == (2**64 - 1,)
    with pytest.raises(TypeError, match="cannot serialise"):
        codec.encode([Batch(None, [2**64], [0.0], [0.0])])


def test_packed_columns_are_what_makes_the_frame_smaller():
    """A deliberately unpacked frame is larger: the packing is in use, not bypassed,
    and narrow: keys below 100 take a byte, values near a million four."""
    codec = FrameCodec()
    values = list(range(10**6, 10**6 + 512))
    batch = Batch([v % 100 for v in values], values, [0.5] * 512, [0.25] * 512)
    packed = codec.encode([batch])
    plain = msgpack.packb([(0, batch.keys, values, 0.5, 0.25, None, 0)], use_bin_type=True)
    assert len(packed) < len(plain)
    assert math.isclose(len(packed), 5 * 512, rel_tol=0.05)


@pytest.mark.parametrize("module", KERNELS)
@given(column=st.lists(st.one_of(st.integers(-(2**64), 2**64), st.floats(allow_nan=True),
                                 st.booleans(), st.none(), st.text(max_size=1)),
                       max_size=8))
def test_exact_numbers_are_exact_ints_of_64_bits_and_exact_floats(module, column):
    expected = all(type(v) is float or (type(v) is int and -(2**63) <= v < 2**63)
                   for v in column)
    assert kernel(module, "exact_numbers")(column) is expected


# Ints at the edges of CPython's digit counts (30-bit digits: one, two, three) and of
# 64 bits: the native kernels read ints of up to two digits in place and call CPython
# for the rest, so each side of every edge must give what the plain Python gives.
DIGIT_EDGES = [0, 1, -1, 2**30 - 1, 2**30, -(2**30) + 1, -(2**30), 2**60 - 1, 2**60,
               -(2**60) + 1, -(2**60), 2**62, 2**63 - 1, -(2**63)]


@pytest.mark.parametrize("module", KERNELS)
@pytest.mark.parametrize("edge", DIGIT_EDGES)
def test_ints_at_every_digit_edge_pack_check_and_route_as_in_python(module, edge):
    column = [7, edge, -3]
    assert kernel(module, "exact_numbers")(column) is True
    data = kernel(module, "pack_ints")(column)
    assert data is not None and kernel(module, "unpack_ints")(data) == tuple(column)
    assert data[0] == next(w for w in (1, 2, 4, 8)
                           if all(-(1 << (8 * w - 1)) <= v < 1 << (8 * w - 1) for v in column))
    for beyond in (2**63, -(2**63) - 1, 2**64, edge + 2**64):
        assert kernel(module, "exact_numbers")([edge, beyond]) is False
        assert kernel(module, "pack_ints")([edge, beyond]) is None
    # a memo entry is a partition only from 0 to 255, whatever its size in digits
    partitions = kernel(module, "partitions")
    if 0 <= edge < 256:
        assert partitions({"k": edge}, ["k"]) == bytes([edge])
    else:
        with pytest.raises(ValueError, match=r"outside 0\.\.255|range\(0, 256\)"):
            partitions({"k": edge}, ["k"])


def numbers_batch(values, **columns_):
    size = len(values)
    return Batch(columns_.get("keys", list(range(size))), values,
                 columns_.get("ts", [0.5] * size), [0.25] * size, columns_.get("ids"))


@pytest.mark.parametrize("elements, passes", [
    ([numbers_batch([1, 2, 3])], True),
    ([numbers_batch([1.5, 2, -3]), Watermark(1.0), EndOfStream()], True),
    ([numbers_batch([1, 2], keys=None)], True),
    ([numbers_batch([1, True])], False),                  # a bool would stay a bool...
    ([numbers_batch([1, [2]])], False),                   # a list arrives as a tuple
    ([numbers_batch([1, 2**64 - 1])], False),             # beyond the packed ints
    ([numbers_batch([1, 2], keys=["a", "b"])], False),    # str: immutable, but encoded
    ([numbers_batch([1, 2], ids=[(1, 0), (1, 1)])], False),
    ([numbers_batch([1, 2]), Barrier(3)], False),         # a protocol's control record
])
def test_only_frames_that_decode_to_themselves_skip_the_codec(elements, passes):
    assert passes_unencoded(elements) is passes
    if passes:  # and the claim holds: decoding gives the same values and types
        codec = FrameCodec()
        for sent, got in zip(elements, codec.decode(codec.encode(elements))):
            if isinstance(sent, Batch):
                for a, b in ((sent.keys, got.keys), (sent.values, got.values),
                             (sent.ts, got.ts), (sent.born, got.born)):
                    assert (a is None and b is None) or (
                        list(a) == list(b) and list(map(type, a)) == list(map(type, b)))
            else:
                assert got == sent


class Inbox:
    def __init__(self):
        self.frames = []

    async def deliver(self, channel_id, seq, frame):
        self.frames.append((channel_id, seq, frame))


async def test_a_local_channel_passes_numbers_as_they_are_and_encodes_the_rest():
    inbox, codec = Inbox(), FrameCodec()
    channel = LocalOutputChannel(4, 1024, 0.005, inbox.deliver, codec)
    numbers = [numbers_batch([1, 2, 3])]
    words = [numbers_batch([1, 2], keys=["a", "b"])]
    await channel.send(numbers)
    await channel.send(words)
    channel.on_sent = lambda channel_id, seq, payload: None  # a protocol logs frames
    await channel.send(list(numbers))
    (_, seq0, first), (_, seq1, second), (_, seq2, third) = inbox.frames
    assert (seq0, seq1, seq2) == (0, 1, 2)
    assert first is numbers                                # the very elements
    assert type(second) is bytes and list(codec.decode(second)[0].keys) == ["a", "b"]
    assert type(third) is bytes                            # the log needs the bytes
    assert channel.frames_sent == 3
