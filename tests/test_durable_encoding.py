"""Durable bytes: state, staged outputs and channel state are msgpack with exact types,
checksummed, and never unpickled (`bastion.runtime.durable`)."""

from __future__ import annotations

import datetime
import math
import pickle
import random
import struct
from pathlib import Path

import msgpack
import pytest

import bastion as bn
from bastion.runtime.columns import pack_ints, unpack_float64_xor, unpack_ints
from bastion.runtime.config import JobConfig
from bastion.errors import UnserialisableError
from bastion.runtime.durable import (RESERVED_CODES, DurableCodec, open_bytes, seal)
from bastion.runtime.instance import Task
from bastion.runtime.outputs import committed_blobs, read_committed
from bastion.runtime.plan import build_plan
from bastion.storage import open_store
from bastion.storage.errors import CorruptBlobError


def typed(value):
    """``value`` with the exact type of every part spelled out: equal only if the
    types are equal too (``1 == 1.0 == True`` and ``[1] != (1,)`` say too little)."""
    kind = type(value)
    if kind in (list, tuple):
        return (kind.__name__, [typed(v) for v in value])
    if kind in (set, frozenset):
        return (kind.__name__, sorted((typed(v) for v in value), key=repr))
    if kind is dict:
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if kind is float and math.isnan(value):
        return ("float", "nan")
    return (kind.__name__, value)


def random_hashable(rng: random.Random, depth: int):
    choice = rng.randrange(9 if depth > 0 else 7)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        return rng.choice([0, -1, 2**63 - 1, -2**63, 2**64 - 1, 2**64, -2**64 - 5,
                          3**90, -(7**70), rng.randrange(-10**6, 10**6)])
    if choice == 3:
        return rng.choice([0.0, -0.0, 1.5, math.inf, -math.inf, 1e308, rng.random()])
    if choice == 4:
        return rng.choice(["", "a", "ü€𝄞", "key" + str(rng.randrange(100))])
    if choice == 5:
        return rng.choice([b"", b"\x00\xff", b"bytes"])
    if choice == 6:
        return float("nan") if rng.random() < 0.1 else rng.randrange(5)
    if choice == 7:
        return tuple(random_hashable(rng, depth - 1) for _ in range(rng.randrange(4)))
    return frozenset(random_hashable(rng, depth - 1) for _ in range(rng.randrange(4)))


def random_value(rng: random.Random, depth: int):
    choice = rng.randrange(6 if depth > 0 else 1)
    if choice == 0:
        return random_hashable(rng, depth)
    size = rng.randrange(5)
    if choice == 1:
        return [random_value(rng, depth - 1) for _ in range(size)]
    if choice == 2:
        return tuple(random_value(rng, depth - 1) for _ in range(size))
    if choice == 3:
        return {random_hashable(rng, depth - 1) for _ in range(size)}
    if choice == 4:
        return frozenset(random_hashable(rng, depth - 1) for _ in range(size))
    return {random_hashable(rng, depth - 1): random_value(rng, depth - 1)
            for _ in range(size)}


def test_every_supported_type_comes_back_exactly():
    codec = DurableCodec()
    rng = random.Random(20261123)
    for _ in range(3000):
        value = random_value(rng, 4)
        assert typed(codec.decode(codec.encode(value), "k")) == typed(value)


def test_packed_values_come_back_exactly_too():
    """`pack` is `encode` without the seal (for bytes another CRC covers): the same
    exact types, and an empty packing is refused, never read as a value."""
    codec = DurableCodec()
    rng = random.Random(20261124)
    for _ in range(3000):
        value = random_value(rng, 4)
        packed = codec.pack(value)
        assert typed(codec.unpack(packed, "k")) == typed(value)
        assert len(packed) < len(codec.encode(value))
    with pytest.raises(CorruptBlobError, match="holds no packed value"):
        codec.unpack(b"", "k")


def test_values_unpacked_together_come_back_as_unpacked_one_by_one():
    """`unpack_many` (an EC-load's keys and states in one pass) gives what `unpack`
    gives item by item, marks and big integers included; a damaged item is refused
    naming the key, as by `unpack`."""
    codec = DurableCodec()
    rng = random.Random(20261125)
    for _ in range(200):
        values = [random_value(rng, 3) for _ in range(rng.randrange(0, 20))]
        packed = [codec.pack(v) for v in values]
        assert typed(codec.unpack_many(packed, "k")) == typed(values)
    plain = [codec.pack(i) for i in range(5)]
    for damaged in (b"", b"\x00", b"\x00\xc1", codec.pack(1) + codec.pack(2)):
        with pytest.raises(CorruptBlobError, match="'parts'"):
            codec.unpack_many(plain + [damaged], "parts")


def test_values_packed_together_are_the_bytes_packed_one_by_one():
    """`pack_many` (a CEC burst's keys and states) packs a tuple without the packer's
    call back: the bytes must be `pack`'s exactly, marks and big integers included,
    and a value with no codec is refused as by `pack`."""
    codec = DurableCodec()
    rng = random.Random(20261127)
    for _ in range(300):
        values = [random_value(rng, 3) for _ in range(rng.randrange(0, 20))]
        values += [tuple(values[:3]), (2**70, {1}), ()]
        assert codec.pack_many(values) == [codec.pack(v) for v in values]
    # the flags byte is the value's own, not the one before it
    assert codec.pack_many([(1,), 2, {3}, 4]) == [codec.pack(v)
                                                 for v in [(1,), 2, {3}, 4]]
    with pytest.raises(UnserialisableError, match="object"):
        codec.pack_many([1, object()])


def test_state_shapes_operators_keep_come_back_exactly():
    codec = DurableCodec()
    state = {
        "list accumulator": {"k": [1, 2, 3]},
        "tuple accumulator": {"k": (1, 2.0, "3")},
        "set": {"k": {1, 2}}, "frozenset": {frozenset({1}): frozenset({(1, 2)})},
        "keys": {(1, "a"): 1, 7: 2, None: 3, 2.5: 4, b"b": 5, True: 6, (): 7},
        "big": [2**64, -(2**64) - 1, 10**40], "floats": [math.inf, -math.inf],
        "bytes vs str": [b"abc", "abc"], "empty": [[], (), set(), frozenset(), {}],
        "nested": [([{(1,): [set()]}],)],
    }
    out = codec.decode(codec.encode(state), "k")
    assert typed(out) == typed(state)
    assert math.isnan(codec.decode(codec.encode(float("nan")), "k"))


def test_registered_codecs_are_used_and_other_types_refused():
    topo = bn.Topology("codecs")
    topo.register_codec(datetime.date, 7, lambda d: d.isoformat().encode(),
                        lambda b: datetime.date.fromisoformat(b.decode()))
    codec = DurableCodec(topo.codecs)
    value = {"day": (datetime.date(2026, 1, 2), [datetime.date(2026, 1, 3)])}
    assert typed(codec.decode(codec.encode(value), "k")) == typed(value)

    class Point:
        pass

    for wrong in (Point(), [1, {"p": Point()}], datetime.datetime(2026, 1, 1)):
        with pytest.raises(TypeError, match="cannot serialise a value of type"):
            codec.encode(wrong)


def test_codes_reserved_for_bastion_are_refused_to_user_codecs():
    assert list(RESERVED_CODES) == list(range(112, 128))
    topo = bn.Topology("reserved")
    for code in RESERVED_CODES:
        with pytest.raises(bn.TopologyError, match="reserved"):
            topo.register_codec(datetime.date, code, bytes, bytes)
    topo.register_codec(datetime.date, RESERVED_CODES.start - 1, bytes, bytes)


def test_any_flipped_byte_or_cut_is_refused_naming_the_key():
    codec = DurableCodec()
    blob = codec.encode({"state": [1, (2, 3), {4}], "text": "x" * 40})
    for i in range(len(blob)):
        broken = bytearray(blob)
        broken[i] ^= 0x40
        with pytest.raises(CorruptBlobError, match="jobs/x/state") as caught:
            codec.decode(bytes(broken), "jobs/x/state")
        assert caught.value.key == "jobs/x/state"
    for cut in (0, 5, len(blob) - 1):
        with pytest.raises(CorruptBlobError):
            codec.decode(blob[:cut], "k")
    with pytest.raises(CorruptBlobError):
        codec.decode(blob + b"\x00", "k")
    assert open_bytes(seal(b"frames"), "k") == b"frames"
    with pytest.raises(CorruptBlobError):
        open_bytes(seal(b"frames")[:-1] + b"X", "k")


class _Planted:
    """A pickle whose loading creates a marker file: code run from the bucket."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _task(topo: bn.Topology, tmp_path: Path, **config) -> Task:
    """The first task of ``topo``'s plan, built in this process (no Ray needed)."""
    plan = build_plan(topo)
    job = JobConfig(job_id="durable-test", storage_url=f"local://{tmp_path / 'store'}",
                    codecs=tuple(topo.codecs), **config)
    store = open_store(job.storage_url)
    task_plan = next(t for t in plan.tasks if "count" in plan.chains[t.chain_id].ops)
    return Task(task_plan, plan, job, store, None, 0)


def _counting_topology() -> bn.Topology:
    topo = bn.Topology("durable")
    topo.source("src", bn.sources.Collection(range(10))).key_by(lambda v: v % 3).reduce(
        "count", lambda acc, v: acc + [v], initial=[]).sink("out", bn.sinks.Collect())
    return topo


def test_task_state_round_trips_and_refuses_corrupt_or_planted_state(tmp_path):
    task = _task(_counting_topology(), tmp_path)
    fold = next(op for op in task.ops if op.ctx.name == "count")
    fold.state = {0: [0, 3], (1, "k"): [1], None: []}
    data = task.snapshot()
    fold.state = {}
    task.restore(data, "state-key")
    assert typed(fold.state) == typed({0: [0, 3], (1, "k"): [1], None: []})

    fold.state = {}
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 1
    with pytest.raises(CorruptBlobError, match="state-key"):
        task.restore(bytes(flipped), "state-key")
    marker = tmp_path / "pwned"
    with pytest.raises(CorruptBlobError, match="state-key"):
        task.restore(pickle.dumps(_Planted(marker)), "state-key")
    assert not marker.exists()
    assert fold.state == {}  # nothing was restored from either


def test_state_without_a_codec_names_the_operator(tmp_path):
    class Point:
        pass

    task = _task(_counting_topology(), tmp_path)
    next(op for op in task.ops if op.ctx.name == "count").state = {1: Point()}
    with pytest.raises(TypeError, match=r"operator 'count' \(instance 0\).*cannot "
                                        r"serialise a value of type Point"):
        task.snapshot()


class Account:
    """User state with no msgpack notation."""

    def __init__(self, total: int):
        self.total = total


def _accounts(topo: bn.Topology) -> None:
    def deposit(account, value):
        account = Account(account.total + value)
        return account, (value % 4, account.total)

    src = topo.source("src", bn.sources.Generator(lambda i: i, count=3000, rate=3000))
    src.key_by(lambda v: v % 4).stateful_map("accounts", deposit,
                                             initial=Account(0)).sink(
        "out", bn.sinks.Collect())


@pytest.mark.usefixtures("ray_session")
def test_state_without_codec_fails_the_job_naming_the_operator(tmp_path):
    topo = bn.Topology("no-codec-state")
    _accounts(topo)
    with pytest.raises(bn.JobFailedError, match=r"operator 'accounts'.*cannot serialise "
                                                r"a value of type Account"):
        bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.2),
               storage=f"local://{tmp_path}")


@pytest.mark.usefixtures("ray_session")
def test_state_with_a_registered_codec_is_checkpointed(tmp_path):
    topo = bn.Topology("codec-state")
    topo.register_codec(Account, 9, lambda a: str(a.total).encode(),
                        lambda b: Account(int(b)))
    _accounts(topo)
    result = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.2),
                    storage=f"local://{tmp_path}")
    assert result.metrics.protocol.checkpoints_completed >= 1
    expected_last = {k: sum(range(k, 3000, 4)) for k in range(4)}
    last = {}
    for key, total in result.outputs["out"]:
        last[key] = total
    assert last == expected_last and len(result.outputs["out"]) == 3000


def _staged_run(tmp_path: Path) -> tuple[bn.RunResult, object, str]:
    topo = bn.Topology("staged")
    topo.source("src", bn.sources.Collection(range(100))).map(
        "pair", lambda v: (v, [v], {v})).sink("out", bn.sinks.Collect())
    result = bn.run(topo, storage=f"local://{tmp_path}")
    store = open_store(f"local://{tmp_path}")
    [(_, _, key)] = committed_blobs(store, result.job_id, "out")
    return result, store, key


@pytest.mark.usefixtures("ray_session")
def test_staged_outputs_keep_types_and_refuse_corrupt_or_planted_blobs(tmp_path):
    result, store, key = _staged_run(tmp_path)
    assert typed(result.outputs["out"]) == typed([(v, [v], {v}) for v in range(100)])
    good = store.get(key)

    flipped = bytearray(good)
    flipped[-3] ^= 0x10
    store.put(key, bytes(flipped))
    with pytest.raises(CorruptBlobError, match=key) as caught:
        read_committed(store, result.job_id, "out")
    assert caught.value.key == key

    marker = tmp_path / "pwned"
    store.put(key, pickle.dumps(([_Planted(marker)], None)))
    with pytest.raises(CorruptBlobError, match=key):
        read_committed(store, result.job_id, "out")
    assert not marker.exists()

    # a msgpack payload without Bastion's header is refused too, however plausible
    store.put(key, msgpack.packb([list(range(100)), None, []]))
    with pytest.raises(CorruptBlobError, match="not a Bastion blob"):
        read_committed(store, result.job_id, "out")


@pytest.mark.usefixtures("ray_session")
def test_sink_records_without_codec_fail_the_job_naming_the_sink(tmp_path):
    class Point:
        pass

    topo = bn.Topology("no-codec-sink")
    topo.source("src", bn.sources.Collection(range(3))).map(
        "point", lambda i: Point()).sink("points", bn.sinks.Collect())
    with pytest.raises(bn.JobFailedError, match=r"sink 'points'.*cannot serialise a value "
                                                r"of type Point"):
        bn.run(topo, storage=f"local://{tmp_path}")


class _Last:
    """An aggregation whose result is the window's last value, whatever its type; it
    fails on the value "drop" (the window's result is dead-lettered)."""

    def create(self):
        return None

    def add(self, acc, value):
        return value[1]

    def merge(self, a, b):
        return b

    def result(self, acc):
        if acc == "drop":
            raise ValueError("dropped")
        return acc


@pytest.mark.parametrize("spec", [bn.windows.Tumbling(0.1), bn.windows.Tumbling(7),
                                  bn.windows.Sliding(0.3, 0.1)])
@pytest.mark.parametrize("lineage", [True, False])
def test_window_results_come_back_exactly_from_their_log_form(spec, lineage):
    """A time window logs its results in a form of its own (per result: key, aggregate;
    per run of results of one window: born and the window start;
    `TimeWindowOp.results_form`): packed by the state codec and read back, it gives
    the very batch the window emitted — values, event times, born and lineage ids,
    every type and float bit (keys, aggregates and bounds of any kind, negative
    windows, results a failing aggregate dropped)."""
    from bastion.lineage import root_ids
    from bastion.runtime.operators import OperatorContext, make_operator
    from bastion.runtime.records import Batch

    rng = random.Random(f"{spec}-{lineage}")
    topo = bn.Topology("log-form")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v[0]).window(
        spec).aggregate("agg", _Last()).sink("out", bn.sinks.Discard())
    ctx = OperatorContext("agg", 0, 1, False, code=1, lineage=lineage)
    op = make_operator(topo.nodes["agg"], ctx)
    codec = DurableCodec()
    keys = [random_hashable(rng, 2) for _ in range(12)]
    keys = [k for k in keys if not (isinstance(k, float) and math.isnan(k))]
    fired = stored_starts = start_bytes = 0
    for step in range(40):
        n = rng.randrange(1, 30)
        values = [(rng.choice(keys), "drop" if rng.random() < 0.1 else random_value(rng, 3))
                  for _ in range(n)]
        ts = [rng.uniform(-5.0, 5.0) + step for _ in range(n)]
        born = [rng.random() * 1e9 for _ in range(n)]
        ids = root_ids(0, 0, step * 100, n) if lineage else None
        op.process(Batch([v[0] for v in values], values, ts, born, ids), 0)
        out = op.on_watermark(step - 2.0 + rng.random())
        if out is None:
            continue
        form = op.results_form(out)
        back = op.results_batch(codec.unpack(codec.pack(form), "k"))
        # a window's start is stored once per run of its results, not once per result,
        # each in the bytes it differs from the one before by
        starts = [value[1] for value in out.values]
        runs = sum(1 for i, start in enumerate(starts) if i == 0 or start != starts[i - 1])
        assert form[8] & 16 and len(unpack_float64_xor(form[6])) == runs
        stored_starts += runs
        start_bytes += len(form[6])
        # as logs of earlier versions have it (run values as raw doubles), it reads too
        raw = list(form)
        raw[6], raw[8] = struct.pack(f"<{runs}d", *unpack_float64_xor(form[6])), form[8] - 16
        earlier = op.results_batch(codec.unpack(codec.pack(raw), "k"))
        assert typed(earlier.values) == typed(list(out.values))
        fired += len(out)
        last = out
        assert typed(back.keys) == typed(list(out.keys))
        assert typed(back.values) == typed(list(out.values))
        assert typed(back.ts) == typed(list(out.ts))
        assert typed(back.born) == typed(list(out.born))
        assert typed(back.ids) == typed(out.ids if lineage else None)
    assert fired > 50 and ctx.dead_letter_count > 0 and stored_starts < fired
    assert start_bytes < 8 * stored_starts
    with pytest.raises(ValueError, match="not a time window's"):
        op.results_batch([[1], [(1,)], [0.5], [0.5], None])
    # born and the starts travel as runs of doubles: a column cut short, a run lost, a
    # run longer or empty is refused, never read as other numbers
    form = op.results_form(last)
    lengths = list(unpack_ints(form[7]))
    for column, damaged in [(4, form[4][:-1]), (6, form[6][:-1]), (5, form[5][:-1]),
                            (7, pack_ints(lengths[:-1] + [lengths[-1] + 1])),
                            (7, pack_ints([0] + lengths)), (7, b"\x03"),
                            (7, pack_ints(lengths[:-1] + [2**62]))]:
        broken = list(form)
        broken[column] = damaged
        with pytest.raises(ValueError):
            op.results_batch(broken)


@pytest.mark.parametrize("keys, agg, packing", [
    ([3, -7, 2**40], bn.aggregations.Count(), 1 | 1 << 2),         # ints, ints
    ([0.5, -2.25, 1e300], bn.aggregations.Count(), 2 | 1 << 2),    # floats, ints
    ([3, -7, 5], bn.aggregations.Sum(lambda v: v[1]), 1 | 2 << 2),  # ints, floats
    (["a", (1, "b"), None], bn.aggregations.Count(), 0 | 1 << 2),  # as is, ints
    ([True, False, 1], bn.aggregations.Count(), 0 | 1 << 2),       # bools stay bools
])
def test_window_results_of_exact_numbers_are_logged_as_machine_words(keys, agg, packing):
    """Keys and aggregates that are all exact ints or all exact floats are logged packed
    (`pack_column`, the frame's packing) and come back with their exact types and bits;
    any other column is left to the state codec. A packing field that names no packing,
    or a column it says is packed that is not, is refused."""
    from bastion.lineage import root_ids
    from bastion.runtime.operators import OperatorContext, make_operator
    from bastion.runtime.records import Batch

    topo = bn.Topology("log-form-packed")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v[0]).window(
        bn.windows.Tumbling(1.0)).aggregate("agg", agg).sink("out", bn.sinks.Discard())
    op = make_operator(topo.nodes["agg"], OperatorContext("agg", 0, 1, False, code=1,
                                                          lineage=True))
    values = [(k, 0.1 * i) for i, k in enumerate(keys * 3)]
    n = len(values)
    op.process(Batch([v[0] for v in values], values, [0.25 + i for i in range(n)],
                     [1e9 + i for i in range(n)], root_ids(0, 0, 0, n)), 0)
    out = op.on_watermark(float(n))
    codec = DurableCodec()
    form = codec.unpack(codec.pack(op.results_form(out)), "k")
    assert form[-1] == packing | 16   # and the starts' run values XOR-packed
    assert (type(form[2]) is bytes) == bool(packing & 3)
    assert type(form[3]) is bytes
    back = op.results_batch(form)
    assert typed(back.keys) == typed(list(out.keys))
    assert typed(back.values) == typed(list(out.values))
    assert typed(back.ts) == typed(list(out.ts))
    assert typed(back.born) == typed(list(out.born))
    assert typed(back.ids) == typed(out.ids)
    for bad in (3, 3 << 2, 3 | 16, 32, "1"):
        with pytest.raises(ValueError, match="packed in an unknown way"):
            op.results_batch(form[:-1] + [bad])
    with pytest.raises(ValueError, match="packed"):
        op.results_batch(form[:3] + [[1] * len(out)] + form[4:])
