"""The segmented record log, on both stores: round trips, durability, torn tails,
corruption, and a reader following a live writer."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import zlib

import msgpack
import pytest

from bastion.storage import (
    CorruptRecordError,
    LocalStore,
    LogReader,
    LogWriter,
    ObjectStore,
    StorageError,
    recover_log,
)

P = "jobs/j/logs/op/0/"
# Small limits so a few hundred records span several segments, blocks and chunks.
SMALL = {"max_segment_bytes": 4096, "block_bytes": 512}


def value_of(seq: int) -> object:
    return {"n": seq, "tag": f"v{seq}", "xs": [seq, seq + 1], "raw": bytes([seq % 256]) * 7}


def expected(seq: int) -> tuple[int, float, object]:
    v = value_of(seq)
    v["xs"] = tuple(v["xs"])  # msgpack arrays decode as tuples
    return (seq, seq * 0.5, v)


def write(writer: LogWriter, start: int, count: int, batch: int = 20) -> None:
    """Append records start..start+count-1 in batches (segments seal between calls)."""
    for first in range(start, start + count, batch):
        last = min(first + batch, start + count)
        writer.append_many([(s * 0.5, value_of(s)) for s in range(first, last)])


def offsets(data: bytes) -> list[int]:
    """Record start offsets, parsed from the documented framing (u32 len, u32 crc)."""
    out, off = [], 0
    while off < len(data):
        out.append(off)
        off += 8 + struct.unpack_from("<I", data, off)[0]
    return out


def flip(store: ObjectStore, key: str, at: int) -> None:
    data = bytearray(store.get(key))
    data[at] ^= 0x40
    store.put(key, bytes(data))


def test_record_framing_matches_the_documented_format(store: ObjectStore) -> None:
    with LogWriter(store, P) as w:
        w.append(1.5, "hello")
    data = store.get(P + "seg-00000000000000000000")
    length, crc = struct.unpack_from("<II", data)
    payload = data[8:8 + length]
    assert len(data) == 8 + length and zlib.crc32(payload) == crc
    assert msgpack.unpackb(payload) == [0, 1.5, "hello"]


def test_round_trip_across_segments_parts_and_chunks(store: ObjectStore) -> None:
    w = LogWriter(store, P, **SMALL)
    for start in range(0, 300, 30):
        write(w, start, 30)
    w.flush()
    write(w, 300, 7)  # a second part in the open segment
    assert w.flush() == 306
    keys = [k[len(P):] for k in store.list(P)]
    assert "index" in keys and sum(k.startswith("seg-") for k in keys) >= 3
    assert sum(k.startswith("part-") for k in keys) >= 1

    r = LogReader(store, P, backward_chunk_bytes=1024, forward_chunk_bytes=1024)
    everything = [expected(s) for s in range(307)]
    assert list(r.records()) == everything
    assert list(r.records(from_seq=123)) == everything[123:]
    assert list(r.records(from_seq=306)) == everything[306:]
    assert list(r.records(from_seq=307)) == []
    assert list(r.records_backward()) == everything[::-1]
    assert list(r.records_backward(before_seq=200)) == everything[:200][::-1]
    assert list(r.records_backward(before_seq=0)) == []
    assert r.next_seq() == 307
    for batch in r.read_backward(chunk_bytes=1024):
        assert [rec[0] for rec in batch] == sorted((rec[0] for rec in batch), reverse=True)

    segs = r.segments()
    assert [s.first_seq for s in segs] == [0] + [s.last_seq + 1 for s in segs[:-1]]
    for s in segs:
        assert (s.min_ts, s.max_ts) == (s.first_seq * 0.5, s.last_seq * 0.5)
        assert store.size(s.key) == s.size_bytes
        assert s.size_bytes >= SMALL["max_segment_bytes"]


def test_read_from_event_time_skips_old_segments(store: ObjectStore) -> None:
    with LogWriter(store, P, **SMALL) as w:
        # Event times out of order within a batch, as sources with lateness produce.
        for start in range(0, 400, 40):
            w.append_many([(float(s) + (3 if s % 2 else -3), s)
                           for s in range(start, start + 40)])
    r = LogReader(store, P)
    got = list(r.records(from_ts=250.0))
    assert got == [(s, float(s) + (3 if s % 2 else -3), s)
                   for s in range(400) if float(s) + (3 if s % 2 else -3) >= 250.0]
    fetched: list[tuple[str, int]] = []
    original_get = store.get

    def spy(key: str, offset: int = 0, length: int | None = None) -> bytes:
        fetched.append((key, offset))
        return original_get(key, offset, length)

    store.get = spy  # type: ignore[method-assign]
    try:
        list(LogReader(store, P).records(from_ts=390.0))
    finally:
        del store.get
    old = [s.key for s in r.segments() if s.max_ts < 390.0]
    assert old and not any(key in old for key, _ in fetched)


def test_backward_reads_fetch_only_the_tail_in_chunks(store: ObjectStore) -> None:
    with LogWriter(store, P, max_segment_bytes=64 * 1024, block_bytes=512) as w:
        write(w, 0, 1500, batch=1500)  # one sealed segment of ~64 KiB
    (seg,) = LogReader(store, P).segments()
    ranges: list[tuple[int, int]] = []
    original_get = store.get

    def spy(key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = original_get(key, offset, length)
        if key == seg.key:
            ranges.append((offset, len(data)))
        return data

    store.get = spy  # type: ignore[method-assign]
    try:
        newest = next(LogReader(store, P, backward_chunk_bytes=4096).read_backward())
    finally:
        del store.get
    assert newest[0] == expected(1499) and [r[0] for r in newest] == list(
        range(1499, 1499 - len(newest), -1))
    # One ranged read, ending at the segment's end, about one chunk long.
    assert len(ranges) == 1
    offset, length = ranges[0]
    assert offset + length == seg.size_bytes and 4096 <= length <= 4096 + 2 * 512


def test_durability_is_reported_only_once_stored(store: ObjectStore) -> None:
    seen: list[int] = []
    w = LogWriter(store, P, on_durable=seen.append)
    assert w.durable_seq == -1 and w.next_seq == 0
    assert w.append_many([(0.0, "a"), (1.0, "b")]) == 1
    assert w.durable_seq == -1 and list(LogReader(store, P).records()) == []
    assert w.flush() == 1 and seen == [1]
    assert [r[2] for r in LogReader(store, P).records()] == ["a", "b"]
    assert w.flush() == 1 and seen == [1]  # nothing new: no write, no callback
    w.append(2.0, "c")
    w.close()
    assert seen == [1, 2] and w.durable_seq == 2
    with pytest.raises(ValueError):
        w.append(3.0, "d")


def test_segments_roll_by_age(store: ObjectStore) -> None:
    w = LogWriter(store, P, max_segment_age_s=0.05)
    w.append(0.0, "old")
    time.sleep(0.06)
    w.flush()
    assert [s.last_seq for s in LogReader(store, P).segments()] == [0]
    w.append(1.0, "new")
    w.flush()
    assert store.list(P + "part-") == [P + "part-00000000000000000001"]


def test_unflushed_records_die_with_the_writer_and_appends_resume(store: ObjectStore,
                                                                  ) -> None:
    a = LogWriter(store, P, **SMALL)
    write(a, 0, 100)
    a.flush()
    write(a, 100, 5)  # never flushed: lost in the "crash" below
    del a
    b = LogWriter(store, P, **SMALL)
    assert b.next_seq == 100 and b.recovery.torn_tail is None
    write(b, 100, 50)
    b.close()
    assert list(LogReader(store, P).records()) == [expected(s) for s in range(150)]
    assert store.list(P + "part-") == []


def test_batches_are_all_or_nothing(store: ObjectStore) -> None:
    w = LogWriter(store, P)
    w.append(0.0, "ok")
    with pytest.raises(TypeError):
        w.append_many([(1.0, "fine"), (2.0, object())])
    with pytest.raises(TypeError):
        w.append_many([(1.0, "fine"), ("late", "bad ts")])
    assert w.next_seq == 1
    w.append(1.0, "next")
    w.close()
    assert [r[:2] for r in LogReader(store, P).records()] == [(0, 0.0), (1, 1.0)]


def test_a_record_bigger_than_a_segment(store: ObjectStore) -> None:
    with LogWriter(store, P, **SMALL) as w:
        w.append(0.0, b"x" * 10_000)
        w.append(1.0, b"y")
    r = LogReader(store, P, backward_chunk_bytes=100, forward_chunk_bytes=100)
    assert [(s, len(v)) for s, _, v in r.records()] == [(0, 10_000), (1, 1)]
    assert [(s, len(v)) for s, _, v in r.records_backward()] == [(1, 1), (0, 10_000)]


def test_empty_log(store: ObjectStore) -> None:
    r = LogReader(store, P)
    assert list(r.records()) == [] and list(r.records_backward()) == []
    assert r.next_seq() == 0 and r.segments() == []
    assert recover_log(store, P).next_seq == 0


# --------------------------------------------------------------------------- torn tails


def test_torn_tail_in_last_part_is_truncated_reported_and_appends_continue(
        store: ObjectStore) -> None:
    w = LogWriter(store, P, **SMALL)
    write(w, 0, 20)
    w.flush()
    write(w, 20, 3)
    w.flush()
    part = P + "part-00000000000000000020"
    data = store.get(part)
    last_start = offsets(data)[-1]
    store.put(part, data[:-3])  # cut inside the last record's payload

    r = LogReader(store, P, backward_chunk_bytes=512, forward_chunk_bytes=512)
    assert list(r.records()) == [expected(s) for s in range(22)]
    assert r.torn_tail is not None and r.torn_tail.key == part
    assert (r.torn_tail.offset, r.torn_tail.last_good_seq) == (last_start, 21)
    assert [rec[0] for rec in r.records_backward()][:2] == [21, 20]

    w2 = LogWriter(store, P, **SMALL)
    torn = w2.recovery.torn_tail
    assert torn is not None and torn.key == part
    assert (torn.offset, torn.dropped_bytes, torn.last_good_seq) == (
        last_start, len(data) - 3 - last_start, 21)
    assert w2.next_seq == 22
    assert store.get(part) == data[:last_start]  # truncated away
    write(w2, 22, 10)
    w2.close()
    r2 = LogReader(store, P)
    assert list(r2.records()) == [expected(s) for s in range(32)]
    assert r2.torn_tail is None


def test_torn_header_of_a_part_holding_one_record(store: ObjectStore) -> None:
    w = LogWriter(store, P)
    write(w, 0, 4)
    w.flush()
    write(w, 4, 1)
    w.flush()
    part = P + "part-00000000000000000004"
    store.put(part, store.get(part)[:5])  # not even a whole header left
    info = recover_log(store, P)
    assert info.next_seq == 4 and info.torn_tail is not None
    assert (info.torn_tail.key, info.torn_tail.offset, info.torn_tail.dropped_bytes) == (
        part, 0, 5)
    assert not store.exists(part)  # nothing complete was left in it
    assert [r[0] for r in LogReader(store, P).records()] == [0, 1, 2, 3]


def test_torn_tail_in_last_sealed_segment(store: ObjectStore) -> None:
    with LogWriter(store, P, **SMALL) as w:
        write(w, 0, 100)
    last = LogReader(store, P).segments()[-1]
    data = store.get(last.key)
    cut_at = offsets(data)[-2] + 11  # inside the second-to-last record
    store.put(last.key, data[:cut_at])
    keep = last.last_seq - 1  # records before the cut one

    r = LogReader(store, P, backward_chunk_bytes=512, forward_chunk_bytes=512)
    assert list(r.records()) == [expected(s) for s in range(keep)]
    assert r.torn_tail is not None and r.torn_tail.last_good_seq == keep - 1
    assert list(r.records_backward()) == [expected(s) for s in range(keep)][::-1]

    w2 = LogWriter(store, P, **SMALL)
    assert w2.recovery.torn_tail is not None
    assert w2.recovery.torn_tail.offset == offsets(data)[-2]
    assert w2.next_seq == keep
    write(w2, keep, 40)
    w2.close()
    assert list(LogReader(store, P).records()) == [expected(s) for s in range(keep + 40)]


# --------------------------------------------------------------------------- corruption


def test_flipped_byte_in_a_sealed_segment_raises_with_key_and_offset(
        store: ObjectStore) -> None:
    with LogWriter(store, P, **SMALL) as w:
        write(w, 0, 200)
    seg = LogReader(store, P).segments()[1]
    data = store.get(seg.key)
    starts = offsets(data)
    victim = starts[len(starts) // 2]
    flip(store, seg.key, victim + 8 + 5)  # inside the payload of a middle record

    for read in (lambda r: list(r.records()), lambda r: list(r.records_backward()),
                 lambda r: list(r.records(from_seq=seg.first_seq + 1))):
        with pytest.raises(CorruptRecordError) as info:
            read(LogReader(store, P, backward_chunk_bytes=512, forward_chunk_bytes=512))
        assert info.value.key == seg.key and info.value.offset == victim
        assert seg.key in str(info.value) and f"offset {victim}" in str(info.value)
    # Records before the damaged segment are still readable.
    got = []
    with pytest.raises(CorruptRecordError):
        for batch in LogReader(store, P).read_batches():
            got.extend(batch)
    assert got == [expected(s) for s in range(seg.first_seq)]


def test_flipped_length_field_in_a_part_raises(store: ObjectStore) -> None:
    w = LogWriter(store, P)
    write(w, 0, 10)
    w.flush()
    part = P + "part-00000000000000000000"
    victim = offsets(store.get(part))[4]
    flip(store, part, victim)  # the low byte of record 4's length
    with pytest.raises(CorruptRecordError) as info:
        list(LogReader(store, P).records())
    assert (info.value.key, info.value.offset) == (part, victim)
    with pytest.raises(CorruptRecordError):
        LogWriter(store, P)  # recovery refuses to build on corrupt data


def test_damaged_length_in_the_last_sealed_segment_is_not_a_torn_tail(
        store: ObjectStore) -> None:
    with LogWriter(store, P, **SMALL) as w:
        write(w, 0, 100)
    last = LogReader(store, P).segments()[-1]
    victim = offsets(store.get(last.key))[3]
    flip(store, last.key, victim + 1)  # length += 16 KiB: now runs past the end
    for read in (lambda r: list(r.records()), lambda r: list(r.records_backward())):
        with pytest.raises(CorruptRecordError) as info:
            read(LogReader(store, P))
        assert (info.value.key, info.value.offset) == (last.key, victim)


def test_a_missing_part_is_reported_not_skipped(store: ObjectStore) -> None:
    w = LogWriter(store, P)
    for start in (0, 5, 10):
        write(w, start, 5)
        w.flush()
    store.delete(P + "part-00000000000000000005")
    for read in (lambda r: list(r.records()), lambda r: list(r.records_backward())):
        with pytest.raises(StorageError) as info:
            read(LogReader(store, P))
        assert "missing records 5..9" in str(info.value)
    with pytest.raises(CorruptRecordError):
        LogWriter(store, P)


def test_truncated_segment_that_is_not_the_tail_is_corruption(store: ObjectStore) -> None:
    w = LogWriter(store, P, **SMALL)
    write(w, 0, 100)
    write(w, 100, 5)
    w.flush()
    assert store.list(P + "part-")  # so the sealed segment is not the log's tail
    first = LogReader(store, P).segments()[0]
    store.put(first.key, store.get(first.key)[:-4])
    with pytest.raises(CorruptRecordError) as info:
        list(LogReader(store, P).records())
    assert info.value.key == first.key


# --------------------------------------------------------------------------- following


def test_reader_follows_a_live_writer(store: ObjectStore) -> None:
    total = 600
    w = LogWriter(store, P, **SMALL)
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for start in range(0, total, 20):
                write(w, start, 20)
                w.flush()
            w.close()
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    writer = threading.Thread(target=produce)
    writer.start()
    r = LogReader(store, P, backward_chunk_bytes=512, forward_chunk_bytes=512)
    got: list[tuple[int, float, object]] = []
    deadline = time.monotonic() + 60
    while len(got) < total and time.monotonic() < deadline:
        for batch in r.read_batches(from_seq=len(got)):
            got.extend(batch)
    writer.join()
    assert not errors
    assert got == [expected(s) for s in range(total)]


async def test_async_reader_follows_async_writer(store: ObjectStore) -> None:
    total = 200
    w = LogWriter(store, P, **SMALL)
    r = LogReader(store, P)

    async def produce() -> None:
        for start in range(0, total, 25):
            await w.aappend_many([(s * 0.5, value_of(s)) for s in range(start, start + 25)])
            await w.aflush()
            await asyncio.sleep(0)
        await w.aclose()

    async def consume() -> list[tuple[int, float, object]]:
        got: list[tuple[int, float, object]] = []
        while len(got) < total:
            async for batch in r.aread_batches(from_seq=len(got)):
                got.extend(batch)
            await asyncio.sleep(0.001)
        return got

    _, got = await asyncio.wait_for(asyncio.gather(produce(), consume()), 60)
    assert got == [expected(s) for s in range(total)]
    newest = [rec async for batch in r.aread_backward(before_seq=5) for rec in batch]
    assert newest == [expected(s) for s in range(4, -1, -1)]


# -- the C framing loop ---------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bastion.storage import log as log_module  # noqa: E402


@pytest.mark.internal
def test_the_c_framing_is_built():
    # `make test` builds it; without it every log append runs the slower Python loop
    assert log_module._frame_records_c is not None, (
        "bastion.storage._logframe is not built: reinstall with a C compiler "
        "(`pip install -e .`)")


_ts = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                st.integers(-2**63, 2**64 - 1), st.booleans())
_sizes = st.sampled_from([0, 1, 127, 255, 256, 65535, 65536])
_values = st.one_of(
    st.binary(max_size=300), _sizes.map(lambda n: b"x" * n), st.text(max_size=40),
    st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False), st.none(),
    st.booleans(), st.lists(st.integers(-5, 5), max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=3))


@pytest.mark.internal
@settings(max_examples=300, deadline=None)
@given(first_seq=st.one_of(st.integers(0, 300), st.integers(0, 2**63 - 1000)),
       records=st.lists(st.tuples(_ts, _values), max_size=30))
def test_the_c_framing_gives_the_python_bytes(first_seq, records):
    """Every kind of ts and value, seqs in each msgpack int width: byte for byte what
    the Python loop (the reference) frames, and every record reads back."""
    pack = msgpack.Packer(use_bin_type=True).pack
    framed = log_module._frame_records_c(first_seq, records, pack)
    assert framed == log_module.frame_records_py(first_seq, records, pack)
    at, seq = 0, first_seq
    while at < len(framed):
        size, crc = struct.unpack_from("<II", framed, at)
        payload = framed[at + 8:at + 8 + size]
        assert zlib.crc32(payload) == crc
        assert msgpack.unpackb(payload, raw=False, strict_map_key=False)[0] == seq
        at, seq = at + 8 + size, seq + 1
    assert seq == first_seq + len(records)


@pytest.mark.internal
def test_records_that_are_not_pairs_are_framed_by_the_python_loop():
    pack = msgpack.Packer(use_bin_type=True).pack
    odd = [(1.0, b"a"), [2.0, b"b"]]  # a list, not a tuple: the C loop declines it
    assert log_module._frame_records_c(0, odd, pack) is None
    assert log_module.frame_records(0, odd, pack) == log_module.frame_records_py(0, odd, pack)


def test_a_value_msgpack_cannot_encode_fails_the_whole_append(tmp_path):
    """All-or-nothing, as before: the C loop's error leaves nothing appended."""
    store = LocalStore(tmp_path)
    with LogWriter(store, "odd/") as writer:
        writer.append_many([(1.0, b"kept")])
        with pytest.raises(TypeError):
            writer.append_many([(2.0, b"fine"), (3.0, object())])
        assert writer.append_many([(4.0, b"next")]) == 1
    assert [(seq, value) for seq, _, value in LogReader(store, "odd/").records()] == [
        (0, b"kept"), (1, b"next")]
