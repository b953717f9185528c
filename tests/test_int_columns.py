"""Columns of words: IntColumn and PairColumn, and the fold that keeps a job's numbers
out of Python objects (issue 41).

A numpy batch function's column of ints travels as an `IntColumn` (int64 words), and a
built-in Count, Sum, Min or Max over such columns folds in words and emits a
`PairColumn`. The tests hold them to what they stand for:

- an IntColumn is, to Python, the tuple of its ints: items, slices, equality,
  iteration, pickling, a numpy view — and it takes only ints of 64 bits;
- the word fold gives exactly the results, state and opened keys of the object fold
  (`columns.py_fold_keyed`, the pure-Python twin of the C fold), or declines with the
  state untouched (an accumulator beyond 64 bits, a float, a bool), and the operator
  then folds through the object path to the same results;
- on the wire and in the store they mean what they meant;
- a job of batch functions and built-in aggregations gives the running results plain
  Python computes, also when a sum leaves 64 bits mid-batch.
"""

from __future__ import annotations

import pickle
from collections import Counter

import numpy
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bastion as bn
from bastion.runtime import columns

pytestmark = pytest.mark.skipif(not columns.NATIVE, reason="IntColumns need the C kernels")

INT64 = st.integers(-(2**63), 2**63 - 1)
WORD_KINDS = {"count": columns.FOLD_COUNT, "sum": columns.FOLD_SUM,
              "min": columns.FOLD_MIN, "max": columns.FOLD_MAX}


def same(a, b) -> bool:
    """Equal by type and value, through lists, tuples and dicts."""
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(map(same, a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


# -- IntColumn is the tuple of its ints --------------------------------------------------


@pytest.mark.internal
@given(items=st.lists(INT64, max_size=50), start=st.integers(-60, 60) | st.none(),
       stop=st.integers(-60, 60) | st.none(), step=st.sampled_from([None, 1, 2, -1, -3]))
@settings(max_examples=300, deadline=None)
def test_an_int_column_reads_as_the_tuple_of_its_ints(items, start, stop, step):
    column = columns.int_column(items)
    as_tuple = tuple(items)
    assert len(column) == len(as_tuple) and bool(column) == bool(as_tuple)
    assert same(list(column), items) and same(column.tolist(), items)
    assert column == as_tuple and column == items and not column != as_tuple
    assert same(tuple(column[start:stop:step]), as_tuple[start:stop:step])
    assert type(column[start:stop:step]) is columns.IntColumn
    for i in range(-len(items), len(items)):
        assert same(column[i], as_tuple[i])
    with pytest.raises(IndexError):
        column[len(items)]
    assert same(tuple(pickle.loads(pickle.dumps(column))), as_tuple)
    view = numpy.frombuffer(column, dtype=numpy.int64)
    assert view.tolist() == items
    with pytest.raises(ValueError):
        view[:1] = 7  # read-only: a column is never mutated
    assert column != as_tuple + (0,)
    with pytest.raises(TypeError):
        hash(column)


@pytest.mark.internal
def test_only_ints_of_64_bits_become_an_int_column():
    assert columns.int_column([1, True]) is None  # a bool is not an int here
    assert columns.int_column([1, 2**63]) is None and columns.int_column([1.0]) is None
    assert columns.int_column(b"abc") is None and columns.int_column(bytearray(3)) is None
    assert columns.int_column(numpy.array([1.5])) is None
    assert columns.int_column(numpy.array([True])) is None
    assert columns.int_column(numpy.array([2**64 - 1], dtype=numpy.uint64)) is None
    for dtype in (numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.uint8,
                  numpy.uint16, numpy.uint32, numpy.uint64):
        array = numpy.array([0, 1, 100, 127], dtype=dtype)
        assert columns.int_column(array) == [0, 1, 100, 127], dtype
    strided = numpy.arange(10, dtype=numpy.int64)[::3]
    assert columns.int_column(strided) == [0, 3, 6, 9]
    assert columns.int_column(numpy.array([-5], dtype=numpy.int8)) == [-5]


# -- the word fold is the object fold ----------------------------------------------------

accumulators = st.one_of(INT64, st.none(), st.integers(2**63, 2**70), st.floats(-9, 9),
                         st.booleans())


@pytest.mark.internal
@given(kind=st.sampled_from(sorted(WORD_KINDS)),
       records=st.lists(st.tuples(st.integers(-3, 3) | INT64, st.integers(-9, 9) | INT64),
                        max_size=200),
       preset=st.dictionaries(st.integers(-3, 3), accumulators, max_size=4),
       opened=st.booleans())
@settings(max_examples=400, deadline=None)
@example(kind="count", records=[(0, 0)], preset={0: 2**63 - 1}, opened=True)
@example(kind="sum", records=[(0, 2**62), (0, 2**62)], preset={}, opened=True)
@example(kind="sum", records=[(1, 1)], preset={1: 0.5}, opened=False)
@example(kind="min", records=[(1, 4), (2, 5), (1, 3)], preset={1: None}, opened=True)
@example(kind="count", records=[(k, 0) for k in range(100)], preset={}, opened=True)
def test_the_word_fold_is_the_object_fold_or_declines(kind, records, preset, opened):
    keys = columns.int_column([k for k, _ in records])
    values = columns.int_column([v for _, v in records])
    state, new = dict(preset), [] if opened else None
    results = columns.fold_int_column(WORD_KINDS[kind], state, keys, values, new)
    want_state, want_out, want_new = dict(preset), [], [] if opened else None
    stop = columns.py_fold_keyed(WORD_KINDS[kind], want_state, [k for k, _ in records],
                                 [v for _, v in records], 0, want_out, want_new)
    touched = {k for k, _ in records}
    words = all(type(a) is int and -(2**63) <= a < 2**63
                or (a is None and kind in ("min", "max"))
                for k, a in preset.items() if k in touched)
    if results is None:  # declined: nothing folded, nothing stored
        assert state == preset and new in ([], None)
        # only where an accumulator is not a word, or one left 64 bits
        assert not words or stop < len(records) or any(
            not -(2**63) <= r < 2**63 for _, r in want_out if type(r) is int)
        return
    assert words and stop == len(records)
    assert same(list(columns.pair_column(keys, results)), want_out)
    assert same(state, want_state) and new == want_new


@pytest.mark.internal
def test_the_fold_comparison_fails_on_a_deliberately_wrong_fold():
    keys, values = columns.int_column([0, 0, 0]), columns.int_column([3, 1, 2])
    results = columns.fold_int_column(columns.FOLD_MAX, {}, keys, values, None)
    want: list = []
    columns.py_fold_keyed(columns.FOLD_MIN, {}, [0, 0, 0], [3, 1, 2], 0, want, None)
    assert not same(list(columns.pair_column(keys, results)), want)


def _reduce_operator(agg):
    from bastion.runtime.operators import OperatorContext, make_operator

    topo = bn.Topology("fold")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v).reduce(
        "op", agg).sink("out", bn.sinks.Discard())
    return make_operator(topo.nodes["op"], OperatorContext("op", 0, 1, False))


@pytest.mark.internal
@given(name=st.sampled_from(sorted(WORD_KINDS)),
       batches=st.lists(st.lists(st.tuples(st.integers(0, 3),
                                           st.integers(-9, 9) | st.sampled_from(
                                               [2**62, 2**63 - 1, -(2**63)])),
                                 min_size=1, max_size=20), max_size=5))
@settings(max_examples=200, deadline=None)
def test_a_reduce_over_word_columns_is_the_python_aggregation(name, batches):
    from bastion.runtime.records import Batch

    agg = {"count": bn.aggregations.Count, "sum": bn.aggregations.Sum,
           "min": bn.aggregations.Min, "max": bn.aggregations.Max}[name]
    op = _reduce_operator(agg())
    got = []
    for batch in batches:
        ks = columns.int_column([k for k, _ in batch])
        vs = columns.int_column([v for _, v in batch])
        out = op.process(Batch(ks, vs, [0.0] * len(batch), [0.0] * len(batch)), 0)
        got.extend(out.values)
    reference, state = agg(), {}
    want = []
    for key, value in (r for b in batches for r in b):
        state[key] = reference.add(state[key] if key in state else reference.create(), value)
        want.append((key, reference.result(state[key])))
    assert same(got, want) and same(op.state, state)  # a sum beyond 64 bits included


# -- the wire and the store ----------------------------------------------------------------


@pytest.mark.internal
def test_word_columns_cross_the_wire_and_the_store_as_what_they_hold():
    from bastion.runtime.durable import DurableCodec
    from bastion.runtime.records import Batch, FrameCodec, passes_unencoded

    keys = columns.int_column([1, 2, 1, -(2**40)])
    counts = columns.int_column([1, 1, 2, 2**50])
    pairs = columns.pair_column(keys, counts)
    batch = Batch(keys, pairs, [1.0] * 4, [1.0] * 4)
    assert passes_unencoded([batch])
    codec = FrameCodec()
    (back,) = codec.decode(codec.encode([batch]))
    assert type(back.keys) is columns.IntColumn and type(back.values) is columns.PairColumn
    assert back.keys == [1, 2, 1, -(2**40)]
    assert list(back.values) == [(1, 1), (2, 1), (1, 2), (-(2**40), 2**50)]
    with pytest.raises(ValueError):  # a pair field that is not two packed columns
        from bastion.runtime.records import PAIRS, unpack_column
        unpack_column((b"\x01\x00",), PAIRS)
    durable = DurableCodec()
    stored = durable.decode(durable.encode({"keys": keys, "out": pairs}), "k")
    assert same(stored, {"keys": [1, 2, 1, -(2**40)],
                         "out": [(1, 1), (2, 1), (1, 2), (-(2**40), 2**50)]})


# -- through the public API ------------------------------------------------------------------


def big_values(column):
    """Values near 2**62: a running sum per key leaves 64 bits within a few records."""
    return column * 0 + (2**62 + column % 5)


def test_a_batch_job_gives_the_running_results_plain_python_computes(ray_session):
    n, groups = 3_000, 7
    topo = bn.Topology("words")
    src = topo.source("src", bn.sources.Generator(batch_fn=big_values, count=n),
                      parallelism=2)
    keyed = src.key_by_batch(lambda column: column % groups)
    keyed.reduce("sum", bn.aggregations.Sum(), parallelism=2).sink("sums", bn.sinks.Collect())
    keyed.reduce("count", bn.aggregations.Count(), parallelism=2).sink(
        "counts", bn.sinks.Collect())
    result = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.2))
    values = [2**62 + k % 5 for k in range(n)]
    # each key's running results in the order its records arrived: check them as
    # per-key sequences, which every arrival order gives the same set of finals for
    finals: dict[str, dict[int, int]] = {"sums": {}, "counts": {}}
    for sink in finals:
        seen: dict[int, list[int]] = {}
        for key, running in result.outputs[sink]:
            assert type(key) is int and type(running) is int
            seen.setdefault(key, []).append(running)
        for key, runs in seen.items():
            assert runs == sorted(runs)  # running results only grow here
            finals[sink][key] = runs[-1]
    assert finals["counts"] == dict(Counter(v % groups for v in values))
    want_sums: dict[int, int] = {}
    for v in values:
        want_sums[v % groups] = want_sums.get(v % groups, 0) + v
    assert finals["sums"] == want_sums
    assert max(want_sums.values()) >= 2**63  # the sums did leave 64 bits
