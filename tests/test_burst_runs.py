"""A CEC burst's keys and states as *runs* (`bastion.runtime.durable`, `pack_run`,
`pack_rows`, `split_run`) and the bursts made of them (`bastion.protocols.eventual`,
`burst`): every value comes back exactly, a run is byte for byte what the codec packs
value by value (so a part is named by the same bytes in either layout, and the EC is
the same), and damage is never loaded — a flipped byte fails the burst's CRC32, and
bytes that are not a run are refused even when a checksum was made over them.

The C loops are compared with the codec on random values (hypothesis); the
pure-Python splitter with the C one. Each check is shown able to fail: a run with a
wrong flags byte, a value cut short or bytes after the last value is refused."""

from __future__ import annotations

import math
import random
import sys

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.errors import UnserialisableError
from bastion.protocols import eventual
from bastion.protocols.eventual import CLOSED, G_CHECK, G_OPEN, reconstruct
from bastion.runtime import durable
from bastion.runtime.durable import DurableCodec, pack_rows, pack_run, split_run

from test_durable_encoding import typed

CODEC = DurableCodec()

# Plain values (what the C loop packs) and the keys a part may have.
scalars = (st.none() | st.booleans()
           | st.integers(-2**63, 2**64 - 1)
           | st.sampled_from([0, -1, 127, 128, -32, -33, 255, 256, 65535, 65536,
                              2**32 - 1, 2**32, -2**31, -2**31 - 1, 2**63 - 1, -2**63])
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=300) | st.binary(max_size=300))
keys = st.recursive(scalars, lambda inner: st.tuples(inner, inner) | st.tuples(inner),
                    max_leaves=6).filter(lambda k: _hashable(k))
plain = st.recursive(scalars, lambda inner: (
    st.lists(inner, max_size=20) | st.tuples(inner, inner)
    | st.dictionaries(st.integers(-5, 5) | st.text(max_size=4), inner, max_size=18)),
    max_leaves=40)
# Values the C loop leaves to the codec: ints beyond 64 bits, sets, bytearrays.
others = (st.integers(2**64, 2**80) | st.integers(-2**80, -2**63 - 1)
          | st.frozensets(st.integers(0, 9), max_size=3) | st.sets(st.text(max_size=2), max_size=3)
          | st.binary(max_size=5).map(bytearray))


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(values=st.lists(plain | keys, min_size=1, max_size=30))
def test_a_run_is_the_codecs_bytes_value_by_value_and_comes_back_exactly(values):
    run = pack_run(CODEC, values)
    assert run == b"".join(CODEC.pack(v) for v in values)
    items = split_run(run)
    assert items == tuple(CODEC.pack(v) for v in values)
    assert durable.py_split_run(run) == items
    assert typed(CODEC.unpack_many(list(items), "run")) == typed(values)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(plain | others, min_size=1, max_size=10))
def test_values_the_c_loop_leaves_to_the_codec_come_back_exactly_too(values):
    run = pack_run(CODEC, values)
    assert run == b"".join(CODEC.pack(v) for v in values)
    assert typed(CODEC.unpack_many(list(split_run(run)), "run")) == typed(
        [bytes(v) if type(v) is bytearray else v for v in values])


@pytest.mark.internal
def test_the_c_loop_is_built_and_declines_what_it_does_not_pack():
    assert durable.NATIVE, "bastion.runtime._durable is not built: reinstall (setup.py)"
    from bastion.runtime import _durable
    assert _durable.pack_run([1, (2, "a"), {"b": [None, 1.5]}]) is not None
    for other in [2**64, -2**63 - 1, {1}, frozenset(), bytearray(b"x"), int, "\ud800",
                  _nested(600), [1, 2, {3}], {"k": (1, 2**70)}]:
        assert _durable.pack_run([other]) is None, other


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_value_no_codec_covers_is_refused_with_the_users_error():
    with pytest.raises(UnserialisableError, match="object"):
        pack_run(CODEC, [1, object()])
    with pytest.raises(UnserialisableError):
        pack_rows(CODEC, [0], ({0: object()},))


@settings(max_examples=100, deadline=None)
@given(rows=st.dictionaries(keys, st.tuples(plain, plain), min_size=1, max_size=20))
def test_pack_rows_is_the_run_of_each_parts_row(rows):
    parts = list(rows)
    tables = ({p: a for p, (a, _) in rows.items()}, {p: b for p, (_, b) in rows.items()})
    assert pack_rows(CODEC, parts, tables) == pack_run(
        CODEC, [[tables[0][p], tables[1][p]] for p in parts])


def test_pack_rows_says_none_for_a_part_missing_from_a_table():
    assert pack_rows(CODEC, [1, 2], ({1: 1, 2: 2}, {1: 1.0})) is None
    assert pack_rows(CODEC, [1, 2], ({1: 1, 2: 2}, {1: 1.0, 2: 2.0})) is not None


@pytest.mark.parametrize("split", [split_run, durable.py_split_run])
def test_bytes_that_are_not_a_run_are_refused(split):
    good = pack_run(CODEC, [1, "two", (3, [4.0])])
    assert split(good) is not None
    for bad in [b"",                       # no item
                b"\x02\x01",               # a flags byte other than 0 or 1
                good[:-1],                 # the last value cut short
                good + b"\x00",            # a flags byte with no value
                good + b"\x00\xc1",        # 0xc1 is no msgpack
                b"\x00\x92\x01",           # an array missing an element
                b"\x00\xdd\xff\xff\xff\xff",  # an array promising 4 G elements
                msgpack.packb([CODEC.pack(1)])]:  # the other layout
        assert split(bad) is None, bad


def _burst_log(parts: list, states: list, layout: str) -> list:
    """A little log: results, a G_open burst of ``parts``, a G_check of the first,
    a closing of the last, in ``layout``."""
    n = len(parts)
    position = {"src/0": 10}
    if layout == "runs":
        opened = eventual.burst(G_OPEN, pack_run(CODEC, parts), pack_run(CODEC, states),
                                n, position, 1.0)
        checked = eventual.burst(G_CHECK, pack_run(CODEC, parts[:1]),
                                 pack_run(CODEC, states[-1:]), n, {"src/0": 11}, 1.5)
        closing = eventual.burst(CLOSED, pack_run(CODEC, parts[-1:]), None, n - 1,
                                 {"src/0": 12}, 2.0)
    else:
        opened = eventual.footprints(G_OPEN, CODEC.pack_many(parts), CODEC.pack_many(states),
                                     n, position, 1.0)
        checked = eventual.footprints(G_CHECK, CODEC.pack_many(parts[:1]),
                                      CODEC.pack_many(states[-1:]), n, {"src/0": 11}, 1.5)
        closing = eventual.closed(CODEC.pack_many(parts[-1:]), n - 1, {"src/0": 12}, 2.0)
    values = [eventual.result(b"r"), opened, eventual.result(b"s"), checked, closing]
    return [(i, float(i), v) for i, v in enumerate(values)]


@settings(max_examples=60, deadline=None)
@given(data=st.dictionaries(keys, plain, min_size=2, max_size=12))
def test_a_burst_of_runs_gives_the_same_ec_as_one_of_items_and_every_value_back(data):
    parts, states = list(data), list(data.values())
    ecs = {layout: reconstruct(reversed(_burst_log(parts, states, layout)))
           for layout in ("runs", "items")}
    assert ecs["runs"].to_wire() == ecs["items"].to_wire()
    ec = ecs["runs"]
    assert ec.complete and ec.skipped == []
    loaded_parts, loaded_states, _ = eventual.decode_parts(CODEC, ec)
    # the first part's newest footprint is the G_check (the last part's state), the
    # last part closed, the others as they opened
    expected = {**{repr(typed(p)): typed(s) for p, s in zip(parts[1:-1], states[1:-1])},
                repr(typed(parts[0])): typed(states[-1])}
    assert {repr(typed(p)): typed(s) for p, s in zip(loaded_parts, loaded_states)} == expected
    assert [typed(k) for k in CODEC.unpack_many(list(ec.closed), "k")] == [typed(parts[-1])]


def test_a_flipped_byte_anywhere_in_a_burst_is_caught_and_never_loaded():
    rng = random.Random(7)
    parts = [(i, f"k{i}") for i in range(5)]
    states = [[{"n": i, "x": rng.random()}, 1.5 * i] for i in range(5)]
    value = eventual.burst(G_OPEN, pack_run(CODEC, parts), pack_run(CODEC, states), 5,
                           {"src/0": 3}, 0.5)
    assert eventual.valid(value)
    for field in (1, 2, 4):            # the keys' run, the states' run, the meta
        for offset in range(len(value[field])):
            damaged = list(value)
            flipped = bytearray(damaged[field])
            flipped[offset] ^= 1 << rng.randrange(8)
            damaged[field] = bytes(flipped)
            assert not eventual.valid(damaged), (field, offset)
            ec = reconstruct([(1, 0.0, damaged), (0, 0.0, eventual.result(b""))])
            assert ec.skipped == [1] and ec.parts == {}


def test_a_run_that_does_not_cut_is_refused_though_its_checksum_holds():
    """The CRC covers the bytes as written: a writer's mistake (a state missing or one
    too many — one for all parts is the one other count — a run cut short) is refused
    by the cut, never loaded."""
    parts, states = pack_run(CODEC, [1, 2]), pack_run(CODEC, [[1], [2]])
    assert eventual.valid(eventual.burst(G_OPEN, parts, states, 2, {}, 0.0))
    for bad_parts, bad_states in [(parts, states[:-1]),
                                  (parts, pack_run(CODEC, [[1], [2], [3]])),
                                  (pack_run(CODEC, [1, 2, 3]), states),
                                  (parts[:-1], states), (parts + b"\x05", states)]:
        bad = eventual.burst(G_OPEN, bad_parts, bad_states, 2, {}, 0.0)
        assert not eventual.valid(bad), (bad_parts, bad_states)
        assert reconstruct([(0, 0.0, bad)]).skipped == [0]


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.integers(-2**63, 2**63 - 1) | st.booleans()
                       | st.floats(-3, 3).map(float), max_size=8)
       | st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(0, 40)).map(
           lambda start: list(range(start[0], min(start[0] + start[1], 2**63)))))
def test_int_range_finds_consecutive_ints_in_c_as_in_python(values):
    found = durable.int_range(values)
    assert found == durable.py_int_range(values)
    consecutive = (len(values) > 1 and all(type(v) is int for v in values)
                   and values == list(range(values[0], values[0] + len(values))))
    assert (found is not None) == consecutive
    if found is not None:
        assert list(range(found[0], found[0] + found[1])) == values


@pytest.mark.parametrize("keys", [[5, 6, 7], [2**63 - 3, 2**63 - 2, 2**63 - 1],
                                  [-2**63, -2**63 + 1], list(range(-40, 300))])
def test_a_range_of_window_numbers_names_the_parts_its_run_names(keys):
    """Consecutive window numbers are stored as their first and count: the parts, and
    the EC, are those of the run of the same numbers."""
    column = eventual.key_column(keys)
    assert column is not None and len(column) < 20
    states = pack_run(CODEC, [[{}, -math.inf]])
    as_range = eventual.burst(G_OPEN, column, states, len(keys), {"src/0": 1}, 0.0)
    as_run = eventual.burst(G_OPEN, pack_run(CODEC, keys), states, len(keys),
                            {"src/0": 1}, 0.0)
    assert eventual.parts_of(as_range) == split_run(pack_run(CODEC, keys))
    assert (reconstruct([(0, 0.0, as_range)]).to_wire()
            == reconstruct([(0, 0.0, as_run)]).to_wire())
    for not_a_range in ([1], [1, 3], [1, 2.0], [True, 2], [2**63 - 1, 2**63], ["a", "b"]):
        assert eventual.key_column(not_a_range) is None


@pytest.mark.internal
def test_a_range_that_is_not_one_is_refused_though_its_checksum_holds():
    """A range column names two or more ints within 64 bits, at most `_MAX_RANGE` of
    them (a damaged count must not make billions), and nothing after them."""
    states = pack_run(CODEC, [[{}, -math.inf]])
    good = eventual.burst(G_OPEN, b"\x02" + msgpack.packb([7, 3]), states, 3, {}, 0.0)
    assert eventual.valid(good)
    for body in ([7, 1], [7, 0], [7, -2], [7, eventual._MAX_RANGE + 1], [2**63 - 1, 2],
                 [2**64 - 1, 2], [7.0, 3], [7, 3.0], ["7", 3], [7], [7, 3, 1]):
        bad = eventual.burst(G_OPEN, b"\x02" + msgpack.packb(body), states, 3, {}, 0.0)
        assert not eventual.valid(bad), body
        assert reconstruct([(0, 0.0, bad)]).skipped == [0]
    trailing = eventual.burst(G_OPEN, b"\x02" + msgpack.packb([7, 3]) + b"\x00", states,
                              3, {}, 0.0)
    assert not eventual.valid(trailing)


def test_floats_keep_their_bits():
    values = [math.nan, -0.0, math.inf, 5e-324, 1.0000000000000002]
    back = CODEC.unpack_many(list(split_run(pack_run(CODEC, values))), "floats")
    assert [v.hex() for v in back] == [v.hex() for v in values]


def test_without_the_c_loop_the_runs_are_the_same(monkeypatch):
    """A machine without a C compiler packs and cuts runs in Python: same bytes."""
    rng = random.Random(3)
    values = [rng.choice([1, -7, 2**40, 2.5, "s", b"b", None, True, (1, "t"), [1, {2: 3}],
                          {"a": (1,)}, 2**70, {5}]) for _ in range(200)]
    parts = list(range(50))
    tables = ({p: {p: p * 1.5} for p in parts}, {p: (p, "x") for p in parts})
    native = (pack_run(CODEC, values), pack_rows(CODEC, parts, tables),
              eventual.key_column(parts))
    monkeypatch.setattr(durable, "NATIVE", False)
    assert (pack_run(CODEC, values), pack_rows(CODEC, parts, tables),
            eventual.key_column(parts)) == native
    assert native[2] is not None
    assert split_run(native[0]) == tuple(CODEC.pack_many(values))
    assert pack_rows(CODEC, parts + [99], tables) is None


def _window_operator(window):
    import bastion as bn
    from bastion.runtime.operators import OperatorContext, make_operator

    topo = bn.Topology("runs")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v[0]).window(
        window).aggregate("agg", bn.aggregations.Sum(lambda v: v[1])).sink(
        "out", bn.sinks.Discard())
    return make_operator(topo.nodes["agg"], OperatorContext("agg", 0, 1, False, code=1,
                                                            lineage=True))


def _cec_log(window, tables: bool, tmp_path) -> list:
    """The log values a CecOperator over ``window`` writes for three batches, each
    followed by a period's G_checks of every open window (packed from its
    operator's tables, or part by part)."""
    import time
    import types

    from bastion.lineage import IdRun
    from bastion.protocols.cec import CecOperator, CecPolicy
    from bastion.runtime.records import Batch
    from bastion.storage import LocalStore, LogWriter

    inner = _window_operator(window)
    task = types.SimpleNamespace(state_codec=DurableCodec(), watermark=-math.inf)
    log = LogWriter(LocalStore(tmp_path / f"log-{tables}"), "log/")
    eager = CecPolicy(extent_target=1, replay_target=1, check_interval_s=0.001,
                      period_s=0.001)
    operator = CecOperator(inner, task, eager, log)
    if not tables:
        operator.state_tables = None
    for start in (0, 50, 100):
        ids = range(start, start + 50)
        keys = [("k", i % 3) if i % 2 else f"s{i % 5}" for i in ids]
        batch = Batch(keys, [(k, i * 0.5 if i % 4 else i) for k, i in zip(keys, ids)],
                      [i / 4.0 for i in ids], [1000.0 + i // 10 for i in ids],
                      IdRun(0, 0, tuple(ids)))
        operator.process(batch, 0)
        task.watermark = batch.ts[-1] - 3.0
        operator.on_watermark(task.watermark)
        time.sleep(0.002)   # a period begins: every open window is due a G_check
        operator.check()
    log.flush()
    from bastion.storage import LogReader
    return [value for _, _, value in LogReader(LocalStore(tmp_path / f"log-{tables}"),
                                                "log/").records()]


@pytest.mark.parametrize("window", ["tumbling", "sliding"])
def test_a_windows_g_opens_from_its_tables_are_those_part_by_part(window, tmp_path):
    """`CecOperator` packs a time window's G_check states straight from its tables
    (`part_state_tables`): the log is the very log `part_state` part by part
    writes, and a table that disagrees with `part_state` would show."""
    import bastion as bn

    spec = bn.windows.Tumbling(2.0) if window == "tumbling" else bn.windows.Sliding(4.0, 1.0)
    fast, slow = _cec_log(spec, True, tmp_path), _cec_log(spec, False, tmp_path)
    opens = [v for v in fast if v[0] == G_OPEN]
    checks = [v for v in fast if v[0] == G_CHECK]
    assert len(opens) == 3 and len(checks) == 3 and fast == slow
    inner = _window_operator(spec)
    inner.open, inner.latest_born = {1: {"a": 1}}, {1: 2.0}
    assert pack_rows(CODEC, [1], inner.part_state_tables()) == pack_run(
        CODEC, [inner.part_state(1)])
    assert pack_rows(CODEC, [1], inner.part_state_tables()[::-1]) != pack_run(
        CODEC, [inner.part_state(1)])


def test_a_periods_g_checks_come_in_slices_with_batches_between_them(tmp_path):
    """A period's CI is spent in short slices, one G_check burst each, returning to
    the task's loop between them (`CecOperator.check`), not in one burst that holds
    the loop for all of it: 50,000 stale parts take tens of ms to pack, far more than
    a slice. Together the slices refresh each stale part once, oldest first, and the
    log is flushed once the period's burst is over, not after each slice."""
    import types

    import bastion as bn
    from bastion.lineage import IdRun
    from bastion.protocols.cec import CecOperator, CecPolicy
    from bastion.runtime.records import Batch
    from bastion.storage import LocalStore, LogWriter

    parts = 50_000
    inner = _window_operator(bn.windows.Count(1000))
    task = types.SimpleNamespace(state_codec=DurableCodec(), watermark=-math.inf)
    store = LocalStore(tmp_path)
    log = LogWriter(store, "log/")
    # A CI as long as the period: the refresh ends because no part is stale any more
    # (U: the parts reflect every input but the last batch's), not for lack of time.
    policy = CecPolicy(extent_target=math.inf, replay_target=0.5, check_interval_s=60.0,
                       period_s=60.0)
    operator = CecOperator(inner, task, policy, log)

    def batch(keys: list, first_id: int) -> Batch:
        ids = range(first_id, first_id + len(keys))
        return Batch(keys, [(k, 1) for k in keys], [float(i) for i in ids],
                     [0.0] * len(keys), IdRun(0, 0, tuple(ids)))

    operator.process(batch(list(range(parts)), 0), 0)
    operator.process(batch([parts], parts), 0)   # one more input: the first parts are stale
    log.flush()
    durable = log.durable_seq
    operator.next_period_s = 0.0   # the period starts at the next look
    operator.check()
    assert log.durable_seq == durable   # no flush after a slice
    log.flush()
    first = g_checks(store)
    assert len(first) == 1 and 0 < len(first[0]) < parts   # back before the CI
    calls = 1
    while operator.check_left_s > 0:
        operator.check()
        calls += 1
        assert calls < parts   # a slice always refreshes something
    log.flush()
    checks = g_checks(store)
    assert len(checks) == calls > 1
    refreshed = [key for burst in checks for key in burst]
    assert refreshed == list(pack_run_items(range(parts)))


def test_a_burst_cut_short_by_the_next_period_is_stored_then(tmp_path):
    """Slices run between batches: when too few batches come to finish a period's
    burst, the next period lapses its budget and stores what it wrote, so the log is
    still stored once a period."""
    import types

    import bastion as bn
    from bastion.lineage import IdRun
    from bastion.protocols.cec import CecOperator, CecPolicy
    from bastion.runtime.records import Batch
    from bastion.storage import LocalStore, LogWriter

    parts = 50_000
    store = LocalStore(tmp_path)
    log = LogWriter(store, "log/", blocking=False)
    task = types.SimpleNamespace(state_codec=DurableCodec(), watermark=-math.inf)
    policy = CecPolicy(extent_target=math.inf, replay_target=0.5, check_interval_s=60.0,
                       period_s=60.0)
    operator = CecOperator(_window_operator(bn.windows.Count(1000)), task, policy, log)
    for first, keys in ((0, list(range(parts))), (parts, [parts])):
        ids = range(first, first + len(keys))
        operator.process(Batch(keys, [(k, 1) for k in keys], [float(i) for i in ids],
                               [0.0] * len(keys), IdRun(0, 0, tuple(ids))), 0)
    log.flush()
    stored = set(store.list("log/"))
    operator.next_period_s = 0.0
    operator.check()                     # a slice, then no batch for the rest
    log.wait_uploaded()
    assert set(store.list("log/")) == stored and operator.check_left_s > 0
    operator.next_period_s = 0.0         # the next period comes first
    operator.check()
    log.wait_uploaded()
    assert len(set(store.list("log/")) - stored) == 1   # the first slice's burst, stored
    assert operator.check_left_s > 0                    # and a new period's burst begun
    log.flush()
    assert len(g_checks(store)) == 2


def g_checks(store) -> list[tuple[bytes, ...]]:
    """The parts of each G_check burst in the log, in order."""
    from bastion.storage import LogReader

    return [eventual.parts_of(v) for _, _, v in LogReader(store, "log/").records()
            if v[0] == G_CHECK]


def pack_run_items(values) -> list[bytes]:
    return split_run(pack_run(CODEC, list(values)))


@settings(max_examples=150, deadline=None)
@given(value=plain | others | st.lists(plain | others, max_size=8))
def test_a_blob_packed_in_c_is_the_codecs_blob(value):
    """`DurableCodec.encode` packs plain values in C: the same bytes as msgpack's
    packer, and whatever C declines still goes through the codec."""
    native = CODEC.encode(value)
    durable.NATIVE = False
    try:
        assert native == DurableCodec().encode(value)
    finally:
        durable.NATIVE = True


@pytest.mark.internal
def test_a_big_snapshot_lets_other_threads_run_while_it_is_packed():
    """A snapshot of millions of keys is one C call; the worker's liveness thread must
    still get the GIL during it, or the job master takes the worker for dead. A thread
    counting its wake-ups every millisecond wakes several times during the call
    (without the GIL offers it would wake at most once, at the call's end)."""
    import threading
    import time

    state = {i: (i, float(i)) for i in range(2_000_000)}
    wakeups = 0
    stop = threading.Event()

    def tick() -> None:
        nonlocal wakeups
        while not stop.is_set():
            time.sleep(0.001)
            wakeups += 1

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    time.sleep(0.01)
    # Best of three calls: on a machine loaded past its cores the OS itself may keep
    # the thread off a CPU through one call (seen once at a load average of 13).
    # Without the offers no call lets it run more than twice: once before the call
    # takes the GIL, once at its end.
    during = []
    # A waiting thread asks for the GIL after the switch interval; at 0.2 ms (5 ms by
    # default) the offers every 65,536 items hand it over at nearly each one, however
    # many other threads of the session (Ray's, py4j's) wait too — in a full CI run
    # the ticker got [2, 2, 2] at the default interval, which a lone run never saw.
    interval_s = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        for _ in range(3):
            before = wakeups
            blob = durable._seal_c(state, durable._MAGIC, durable._MARKED)  # `encode`'s
            during.append(wakeups - before)
            if during[-1] >= 3:
                break
    finally:
        sys.setswitchinterval(interval_s)
        stop.set()
        ticker.join()
    assert CODEC.decode(blob, "snapshot") == state
    assert max(during) >= 3, (f"the other thread ran {during} times while 2 M keys were "
                              f"packed; threads: {[t.name for t in threading.enumerate()]}")
