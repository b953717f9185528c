"""Eventual checkpoints (`bastion.protocols.eventual`) rebuilt from real logs of many
shapes, checked against a plain-Python model of the operator that wrote them.

The model is a keyed tumbling-window sum (or a reduce: parts that never close) fed
by one or two source instances whose records interleave at random, written through a
real `LogWriter` with small segments so a log has sealed segments and parts. Each burst
stores its parts' keys and states in one of the two layouts, at random: as runs, as a
running operator writes them, or as arrays of items, as a resumed job copies them and
earlier versions wrote them — so one log mixes both. It emits
``G_open`` when a part opens, ``G_check`` for random parts at random moments,
``closed`` when a window fires, and its results. The check is the one recovery makes:
load the EC, replay every input after ``replay_from`` under the EC's rules, and
compare the state with the model's true state at the crash — brute force, from the
model's own bookkeeping, not from another run of the code under test. Then damage:
a torn tail, a corrupt control tuple, a corrupt record inside the extent — skipped
and reported, never loaded, and the state still right (or, with a footprint gone
for good, an EC that says it is incomplete)."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.protocols import eventual
from bastion.protocols.eventual import (G_CHECK, G_OPEN, EventualCheckpoint,
                                        read_eventual_checkpoint, reconstruct)
from bastion.storage import open_store
from bastion.storage.log import LogWriter, log_object_keys, salvage_log


def enc(value) -> bytes:
    return msgpack.packb(value)


def item(value) -> bytes:
    """``value`` as a state codec packs a part's key or state: a flags byte (0: no
    tuple inside), then the msgpack."""
    return b"\x00" + msgpack.packb(value)


def dec(packed: bytes):
    """The value of an `item`."""
    assert packed[0] == 0
    return msgpack.unpackb(packed[1:])


class WindowModel:
    """A keyed tumbling-window sum written the CEC way. ``window_s=None``: a keyed
    reduce (one part per key, never closing). Inputs are ``(source, offset, key, ts,
    value)``; a part is ``(window, key)``."""

    def __init__(self, window_s: float | None, lag_s: float, check_every: int, rng,
                 layouts: random.Random):
        self.window_s, self.lag_s, self.check_every, self.rng = window_s, lag_s, check_every, rng
        self.layouts = layouts        # which layout each burst takes (a stream of its own)
        self.parts: dict = {}         # part -> sum
        self.position: dict[str, int] = {}
        self.watermark = float("-inf")
        self.records: list[tuple[float, list]] = []  # what goes to the log
        self.t_now = 0.0
        self.seen = 0

    def part_of(self, key, ts):
        return (None if self.window_s is None else int(ts // self.window_s), key)

    def process(self, source: str, offset: int, key, ts: float, value: int) -> None:
        before = dict(self.position)
        self.position[source] = offset
        self.t_now = max(self.t_now, ts)
        part = self.part_of(key, ts)
        if self.window_s is not None and (part[0] + 1) * self.window_s <= self.watermark:
            pass  # late: its window fired already
        elif part in self.parts:
            self.parts[part] += value
        elif self.window_s is not None and self.layouts.random() < 0.5:
            # a window opening empty, as the runtime's do: its state before the input,
            # at the position before it
            self.parts[part] = value
            self.records.append((self.t_now, eventual.burst(
                G_OPEN, item(list(part)), item(0), len(self.parts), before,
                self.watermark)))
        else:
            self.parts[part] = value
            self.control(G_OPEN, part)
        self.seen += 1
        if self.seen % self.check_every == 0 and self.parts:
            # a burst of one or of several parts, as the runtime writes them
            self.control(G_CHECK, *self.rng.sample(sorted(self.parts),
                                                   k=min(self.rng.choice([1, 3]),
                                                         len(self.parts))))
        if self.window_s is not None:
            self.advance(self.t_now - self.lag_s)

    def advance(self, watermark: float) -> None:
        self.watermark = max(self.watermark, watermark)
        fired = []
        for part in sorted(self.parts):
            if (part[0] + 1) * self.window_s <= self.watermark:
                total = self.parts.pop(part)
                self.records.append((self.t_now, eventual.result([list(part), total])))
                fired.append(item(list(part)))
        if fired:
            self.records.append((self.t_now, eventual.burst(
                eventual.CLOSED, b"".join(fired), None, len(self.parts),
                dict(self.position), self.watermark) if self.layouts.random() < 0.5
                else eventual.closed(fired, len(self.parts), dict(self.position),
                                     self.watermark)))

    def control(self, kind: int, *parts) -> None:
        keys, states = [item(list(p)) for p in parts], [item(self.parts[p]) for p in parts]
        self.records.append((self.t_now, eventual.burst(
            kind, b"".join(keys), b"".join(states), len(self.parts), dict(self.position),
            self.watermark) if self.layouts.random() < 0.5 else eventual.footprints(
            kind, keys, states, len(self.parts), dict(self.position), self.watermark)))


def make_inputs(rng, n: int, sources: int, keys: int, disorder_s: float):
    """Records of ``sources`` source instances, each in its own offset order, with
    event times roughly increasing, interleaved at random."""
    streams = [[(f"src/{s}", i, f"k{rng.randrange(keys)}",
                 max(0.0, i * 0.01 * sources - rng.random() * disorder_s), rng.randrange(1, 9))
                for i in range(n // sources)] for s in range(sources)]
    merged, heads = [], [0] * sources
    while any(h < len(s) for h, s in zip(heads, streams)):
        s = rng.choice([i for i in range(sources) if heads[i] < len(streams[i])])
        merged.append(streams[s][heads[s]])
        heads[s] += 1
    return merged


def recover(ec: EventualCheckpoint, inputs, crash_at: int, model_args):
    """What recovery does with ``ec``: load it, replay the inputs after
    ``replay_from`` (those processed before the crash), each part ignoring what its
    footprint reflects and closed parts dropping theirs. Returns the open parts."""
    window_s, lag_s = model_args
    assert ec.complete
    parts = {tuple(dec(p)): dec(f.state) for p, f in ec.parts.items()}
    positions = {tuple(dec(p)): f.position for p, f in ec.parts.items()}
    closed_parts = {tuple(dec(p)) for p in ec.closed}
    replay_from = ec.replay_from
    watermark = ec.watermark if ec.watermark is not None else float("-inf")
    t_now = float("-inf")
    for source, offset, key, ts, value in inputs[:crash_at]:
        if offset <= replay_from.get(source, -1):
            continue  # not replayed: reflected in every part's state
        t_now = max(t_now, ts)
        part = (None if window_s is None else int(ts // window_s), key)
        if part in closed_parts:
            continue
        if part in positions and offset <= positions[part].get(source, -1):
            continue  # this part's footprint reflects it
        if window_s is not None and (part[0] + 1) * window_s <= watermark:
            continue  # late
        parts[part] = parts.get(part, 0) + value
        if window_s is not None:
            watermark = max(watermark, t_now - lag_s)
            for p in [p for p in parts if (p[0] + 1) * window_s <= watermark]:
                del parts[p]
    return parts


def write_log(tmp_path, records, segment_bytes: int):
    store = open_store(f"local://{tmp_path}")
    writer = LogWriter(store, "op/0", max_segment_bytes=segment_bytes, block_bytes=256)
    i = 0
    while i < len(records):  # several append calls and flushes: segments and parts
        j = i + 37
        writer.append_many(records[i:j])
        if (i // 37) % 3 == 0:
            writer.flush()
        i = j
    writer.flush()
    return store


def run_model(seed: int, n: int, sources: int, keys: int, windowed: bool,
              crash_at: int | None = None):
    rng = random.Random(seed)
    window_s = 0.5 if windowed else None
    model = WindowModel(window_s, 0.1, check_every=rng.choice([3, 11, 50]), rng=rng,
                        layouts=random.Random(seed))
    inputs = make_inputs(rng, n, sources, keys, disorder_s=0.05)
    crash_at = crash_at or rng.randrange(1, len(inputs) + 1)
    for record in inputs[:crash_at]:
        model.process(*record)
    return model, inputs, crash_at, (window_s, 0.1)


shapes = st.tuples(st.integers(0, 10_000), st.integers(20, 600), st.integers(1, 2),
                   st.integers(1, 12), st.booleans(), st.sampled_from([600, 2_000, 50_000]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=shapes)
def test_the_eventual_checkpoint_brings_the_state_back(tmp_path_factory, shape):
    seed, n, sources, keys, windowed, segment_bytes = shape
    model, inputs, crash_at, args = run_model(seed, n, sources, keys, windowed)
    store = write_log(tmp_path_factory.mktemp("log"), model.records, segment_bytes)
    ec, damage = read_eventual_checkpoint(store, "op/0")
    assert damage == []
    if not model.records:
        assert ec.seq == -1 and ec.parts == {}
        return
    assert ec.complete and ec.n_open == len(model.parts)
    assert {tuple(dec(p)) for p in ec.parts} == set(model.parts)
    assert recover(ec, inputs, crash_at, args) == model.parts
    # the extent is what the backward pass read: from the end to the oldest footprint
    oldest = min((f.seq for f in ec.parts.values()), default=ec.seq)
    assert ec.extent_records == len(model.records) - oldest
    # the same EC from the log's records in memory, and from its salvage
    in_memory = [(i, ts, v) for i, (ts, v) in enumerate(model.records)]
    assert reconstruct(reversed(in_memory)).to_wire() == ec.to_wire()
    assert reconstruct(reversed(salvage_log(store, "op/0").records)).to_wire() == ec.to_wire()


def test_an_ec_at_an_earlier_time_is_the_state_then(tmp_path):
    model, inputs, crash_at, args = run_model(7, 400, 2, 5, True)
    full = model.records
    # the state the model was in after the record at the cut: rerun it to there
    cut = len(full) // 2
    at = full[cut][0]
    cut = max(i for i, (ts, _) in enumerate(full) if ts <= at)
    store = write_log(tmp_path, full, 2_000)
    ec, _ = read_eventual_checkpoint(store, "op/0", at=at)
    assert ec.seq == cut
    assert reconstruct(reversed([(i, ts, v) for i, (ts, v) in enumerate(full[:cut + 1])])
                       ).to_wire() == ec.to_wire()


def corrupt_at(store, key: str, offset: int) -> None:
    data = bytearray(store.get(key))
    data[offset] ^= 0xFF
    store.put(key, bytes(data))


def test_a_torn_tail_is_passed_over(tmp_path):
    model, inputs, crash_at, args = run_model(3, 300, 1, 4, False)
    store = write_log(tmp_path, model.records, 50_000)
    last = log_object_keys(store, "op/0")[-1]
    store.put(last, store.get(last)[:-3])  # the last record cut short
    ec, _ = read_eventual_checkpoint(store, "op/0")
    assert ec.seq == len(model.records) - 2
    # the EC of the log without its last record, whatever that record was
    expected = reconstruct(reversed([(i, ts, v) for i, (ts, v)
                                     in enumerate(model.records[:-1])]))
    assert ec.to_wire() == expected.to_wire()


def test_a_damaged_control_tuple_is_skipped_and_the_older_footprint_used(tmp_path):
    model, inputs, crash_at, args = run_model(11, 500, 1, 6, False)
    records = list(model.records)
    # break the checksum of the newest footprint of some part (the log's CRC is fine)
    newest = max(i for i, (_, v) in enumerate(records) if v[0] == G_CHECK)
    ts, value = records[newest]
    altered = enc([item(10**6)] * len(eventual.parts_of(value)))  # its states altered
    records[newest] = (ts, value[:2] + [altered] + value[3:])
    store = write_log(tmp_path, records, 2_000)
    ec, damage = read_eventual_checkpoint(store, "op/0")
    assert newest in ec.skipped and damage == []
    assert all(f.state != item(10**6) for f in ec.parts.values())
    assert recover(ec, inputs, crash_at, args) == model.parts


def test_a_corrupt_record_is_reported_never_loaded_and_recovery_still_exact(tmp_path):
    model, inputs, crash_at, args = run_model(5, 500, 2, 6, True)
    store = write_log(tmp_path, model.records, 2_000)
    clean, _ = read_eventual_checkpoint(store, "op/0")
    # flip a byte inside the newest footprint's record: its log CRC no longer matches
    victim = max(f.seq for f in clean.parts.values())
    key, offset = locate(store, victim)
    corrupt_at(store, key, offset + 12)
    ec, damage = read_eventual_checkpoint(store, "op/0")
    assert damage and damage[0].key == key and "CRC32" in damage[0].why
    assert victim not in {f.seq for f in ec.parts.values()}
    if ec.complete:
        assert recover(ec, inputs, crash_at, args) == model.parts
    else:  # the part's only footprint was its G_open: nothing to restore from
        assert ec.replay_from is None


def locate(store, seq: int) -> tuple[str, int]:
    """The object and byte offset of record ``seq`` (a sealed segment if it has one)."""
    import struct
    found = None
    for key in log_object_keys(store, "op/0"):
        data, off = store.get(key), 0
        while off + 8 <= len(data):
            length, _ = struct.unpack_from("<II", data, off)
            record = msgpack.unpackb(data[off + 8:off + 8 + length], raw=False,
                                     strict_map_key=False)
            if record[0] == seq and (found is None or "/seg-" in key):
                found = (key, off)
            off += 8 + length
    assert found is not None
    return found


def test_the_checks_can_fail_a_wrong_ec_is_caught_by_the_model():
    """The model check is not vacuous: a part that forgets its position replays
    inputs its state already reflects, and the state comes out wrong."""
    model, inputs, crash_at, args = run_model(13, 400, 2, 4, False, crash_at=390)
    ec = reconstruct(reversed([(i, ts, v) for i, (ts, v) in enumerate(model.records)]))
    assert recover(ec, inputs, crash_at, args) == model.parts
    part = max(ec.parts, key=lambda p: ec.parts[p].seq)
    kind, seq, state, position, watermark = ec.parts[part]
    ec.parts[part] = eventual.Footprint((kind, seq, state, {s: -1 for s in position},
                                         watermark))
    assert recover(ec, inputs, crash_at, args) != model.parts


def test_the_checksum_covers_every_field():
    fields = dict(kind=G_CHECK, parts=[b"p", b"r"], states=[b"state", b"s"], n_open=3,
                  position={"src/0": 4}, watermark=1.5)
    base = eventual.footprints(**fields)
    assert eventual.valid(base) and eventual.parts_of(base) == (b"p", b"r")
    for name, other in [("kind", eventual.G_OPEN), ("parts", [b"p", b"q"]),
                        ("parts", [b"r", b"p"]), ("states", [b"state", b"t"]),
                        ("states", [b"stat", b"es"]), ("n_open", 4),
                        ("position", {"src/0": 5}), ("watermark", 2.5)]:
        changed = eventual.footprints(**{**fields, name: other})
        changed[-1] = base[-1]  # the checksum of the original fields
        assert not eventual.valid(changed), f"{name} is not covered by the checksum"
    closing = eventual.closed([b"p"], 3, {"src/0": 4}, 1.5)
    assert eventual.valid(closing)
    assert not eventual.valid(closing[:-1] + [base[-1]])


def test_one_state_for_a_burst_of_parts_is_each_parts_own():
    """Windows that open empty share their G_open's one state: each part gets it,
    decoded on its own (no two parts hold one object), and a burst with more than one
    state but fewer than its parts is refused."""
    from bastion.runtime.durable import DurableCodec, pack_run

    codec = DurableCodec()
    shared = eventual.burst(G_OPEN, pack_run(codec, [4, 5, 6]), pack_run(codec, [[{}, 0.5]]),
                            3, {"src/0": 9}, 0.0)
    ec = reconstruct([(0, 0.0, shared)])
    assert ec.complete and len(ec.parts) == 3
    parts, states, _ = eventual.decode_parts(codec, ec)
    assert sorted(parts) == [4, 5, 6] and all(state == [{}, 0.5] for state in states)
    assert len({id(state[0]) for state in states}) == 3
    uneven = eventual.burst(G_OPEN, pack_run(codec, [4, 5, 6]),
                            pack_run(codec, [[{}, 0.5], [{}, 0.5]]), 3, {"src/0": 9}, 0.0)
    assert eventual.valid(shared) and not eventual.valid(uneven)
    ec = reconstruct([(1, 0.0, uneven), (0, 0.0, shared)])
    assert ec.skipped == [1] and len(ec.parts) == 3


@pytest.mark.internal
def test_a_burst_whose_arrays_do_not_match_is_refused_though_its_checksum_holds():
    """The checksum covers the bytes as written; bytes of another shape (a state
    missing, a part that is not bytes) are refused all the same, never loaded."""
    good = eventual.footprints(G_OPEN, [b"p", b"q"], [b"1", b"2"], 2, {"src/0": 1}, 0.0)
    assert eventual.valid(good)
    for parts, states in [([b"p", b"q"], [b"1", b"2", b"3"]), (["p", "q"], [b"1", b"2"]),
                          ([], []), ([b"p"], b"1")]:
        packed_parts, packed_states = enc(parts), enc(states)
        bad = [G_OPEN, packed_parts, packed_states, 2, good[4],
               eventual._crc(G_OPEN, packed_parts, packed_states, 2, good[4])]
        assert not eventual.valid(bad), (parts, states)
        ec = reconstruct([(1, 0.0, bad), (0, 0.0, good)])
        assert ec.skipped == [1] and set(ec.parts) == {b"p", b"q"}


@pytest.mark.parametrize("windowed", [True, False])
def test_no_footprint_lost_means_complete_and_a_lost_open_means_incomplete(windowed):
    model, inputs, crash_at, args = run_model(17, 300, 1, 6, windowed, crash_at=290)
    records = [(i, ts, v) for i, (ts, v) in enumerate(model.records)]
    ec = reconstruct(reversed(records))
    assert ec.complete and len(ec.parts) >= 2
    # drop every footprint of the part whose footprint is oldest: its G_open is gone
    part = min(ec.parts, key=lambda p: ec.parts[p].seq)
    stripped = [(i, ts, v) for i, ts, v in records
                if not (eventual.is_control(v) and part in eventual.parts_of(v)
                        and v[0] != eventual.CLOSED)]
    broken = reconstruct(reversed(stripped))
    assert not broken.complete and broken.replay_from is None and broken.watermark is None
    assert broken.extent_records == broken.seq + 1  # read to the beginning
