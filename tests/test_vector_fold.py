"""Built-in aggregations in a keyed ``reduce``, folded in C (issue 41, item 2).

``KeyedStream.reduce(name, agg)`` folds ``bn.aggregations.Count/Sum/Min/Max/Mean``
per key, a batch's column at a time in C while the values are plain numbers
(`columns.fold_keyed`), and in Python for any other value. The tests hold both paths
to the plain Python aggregation — record by record, ``agg.add`` then ``agg.result`` —
with results compared by type and by bits (``1`` is not ``1.0``, ``-0.0`` is not
``0.0``, a NaN is the NaN it was), on columns that mix every kind of value the two
paths split on; and the state to what a reduce's always was: one ``{key: acc}`` dict,
restored from checkpoints and incremental chains.
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bastion as bn

AGGREGATIONS = {"count": bn.aggregations.Count, "sum": bn.aggregations.Sum,
                "min": bn.aggregations.Min, "max": bn.aggregations.Max,
                "mean": bn.aggregations.Mean}

# what the C path folds (small and 64-bit ints, floats of every kind) and what it
# must leave to Python (big ints, bools, None, strings, int subclasses)
numbers = st.one_of(st.integers(-5, 5), st.integers(-(2**63), 2**63 - 1),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 2.0**53, 2**53 + 1, 0.1]))
odd_values = st.one_of(st.integers(2**63, 2**80), st.booleans(), st.none(),
                       st.text(max_size=2))
values = st.one_of(numbers, numbers, numbers, odd_values)
keys = st.one_of(st.integers(0, 4), st.sampled_from(["a", "b"]))
# keys that are equal across types (1, 1.0, True), a NaN (equal only to itself), and
# enough distinct ones to make the kernel's per-batch key table grow
kernel_keys = st.one_of(keys, st.integers(0, 300), st.integers(-(2**70), 2**70),
                        st.sampled_from([1.0, True, float("nan"), (1, 2)]))


def same(a, b) -> bool:
    """Equal by type and value; floats by their bits (NaN and -0.0 included)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(map(same, a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def reference(agg, state: dict, records):
    """The plain Python aggregation, record by record: outputs and dead letters
    (value, error text); ``state`` is updated in place."""
    out, dead = [], []
    for key, value in records:
        try:
            acc = agg.add(state[key] if key in state else agg.create(), value)
            result = agg.result(acc)
        except Exception as exc:  # noqa: BLE001
            dead.append((value, f"{type(exc).__name__}: {exc}"))
            continue
        state[key] = acc
        out.append((key, result))
    return out, dead


def operator(agg):
    """A real reduce operator instance of ``agg``, as a worker makes it."""
    from bastion.runtime.operators import OperatorContext, make_operator

    topo = bn.Topology("fold")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v).reduce(
        "op", agg).sink("out", bn.sinks.Discard())
    return make_operator(topo.nodes["op"], OperatorContext("op", 0, 1, False))


def run_batches(op, batches):
    from bastion.runtime.records import Batch

    out = []
    for batch in batches:
        got = op.process(Batch([k for k, _ in batch], [v for _, v in batch],
                               [0.0] * len(batch), [0.0] * len(batch)), 0)
        assert got is not None and len(got.values) == len(got.keys) == len(got.ts)
        assert [k for k, _ in got.values] == list(got.keys)
        out.extend(got.values)
    return out


def dead_letters(op):
    return [(d.value, d.error) for d in op.ctx.dead_letters]


# -- the kernel against its pure-Python twin ------------------------------------------


@pytest.mark.internal
@given(kind=st.integers(0, 4), records=st.lists(st.tuples(kernel_keys, values),
                                                max_size=300),
       preset=st.dictionaries(keys, st.one_of(values, st.tuples(values, values),
                                               st.tuples(numbers, st.integers(0, 9)))),
       start=st.integers(0, 5))
@settings(max_examples=400, deadline=None)
@example(kind=4, records=[(0, 2**62), (0, 2**62), (0, 1)], preset={}, start=0)
@example(kind=1, records=[(0, 2**63 - 1), (0, 1), (0, 0.5)], preset={}, start=0)
@example(kind=0, records=[(1, 0), (True, 0), (1.0, 0)], preset={True: 5}, start=0)
@example(kind=0, records=[(k, 0) for k in range(200)] + [(3, 0), (199, 0)], preset={},
         start=0)
def test_the_c_kernel_folds_what_its_python_twin_folds(kind, records, preset, start):
    from bastion.runtime import columns

    ks, vs = [k for k, _ in records], [v for _, v in records]
    results = []
    for fold in (columns.fold_keyed, columns.py_fold_keyed):
        state, out, opened = dict(preset), [], []
        stop = fold(kind, state, ks, vs, start, out, opened)
        results.append((stop, state, out, opened))
    (c_stop, c_state, c_out, c_opened), (p_stop, p_state, p_out, p_opened) = results
    assert c_stop == p_stop and same(c_state, p_state) and same(c_out, p_out)
    assert c_opened == p_opened
    assert columns.NATIVE  # else both are the Python one, and this proves nothing


# -- the operator against the plain aggregation ----------------------------------------


@pytest.mark.internal
@given(name=st.sampled_from(sorted(AGGREGATIONS)),
       batches=st.lists(st.lists(st.tuples(keys, values), min_size=1, max_size=12),
                        max_size=6))
@settings(max_examples=400, deadline=None)
@example(name="sum", batches=[[(0, 1), (0, "x"), (0, 2.5), (1, True), (1, 2**70)]])
@example(name="min", batches=[[(0, float("nan")), (0, 1), (1, 1), (1, float("nan"))]])
@example(name="mean", batches=[[(0, 2**53), (0, 1), (0, 0.5)]])
def test_reduce_with_a_builtin_is_the_python_aggregation_exactly(name, batches):
    op = operator(AGGREGATIONS[name]())
    got = run_batches(op, batches)
    state: dict = {}
    want, dead = reference(AGGREGATIONS[name](), state, [r for b in batches for r in b])
    assert same(got, want)
    assert same(op.state, state)
    assert dead_letters(op) == dead


@pytest.mark.internal
@given(batches=st.lists(st.lists(st.tuples(keys, st.one_of(
    st.tuples(st.integers(-9, 9)), st.tuples(st.floats(-1e6, 1e6)), st.tuples(),
    st.tuples(st.text(max_size=1)))), min_size=1, max_size=10), max_size=5),
       name=st.sampled_from(["sum", "min", "max", "mean"]))
@settings(max_examples=200, deadline=None)
def test_a_builtins_fn_runs_on_the_column_first_with_the_same_results(batches, name):
    # fn raises IndexError on an empty tuple: that record is dead-lettered with the
    # record itself, as the Python aggregation's add would
    op = operator(AGGREGATIONS[name](lambda v: v[0]))
    got = run_batches(op, batches)
    state: dict = {}
    want, dead = reference(AGGREGATIONS[name](lambda v: v[0]), state,
                           [r for b in batches for r in b])
    assert same(got, want) and same(op.state, state)
    assert dead_letters(op) == dead


@pytest.mark.internal
def test_the_comparison_fails_on_a_deliberately_broken_fold():
    # the checks above are only as good as `same` and the reference: a fold that
    # gives 1.0 for 1, 0.0 for -0.0, or the max for the min must not pass them
    assert not same([(0, 1)], [(0, 1.0)]) and not same([(0, -0.0)], [(0, 0.0)])
    assert same([(0, math.nan)], [(0, math.nan)])
    op = operator(bn.aggregations.Min())
    from bastion.runtime.columns import FOLD_MAX
    op.kind = FOLD_MAX  # broken on purpose
    got = run_batches(op, [[(0, 3), (0, 1), (0, 2)]])
    want, _ = reference(bn.aggregations.Min(), {}, [(0, 3), (0, 1), (0, 2)])
    assert not same(got, want)


@pytest.mark.internal
def test_a_user_aggregation_in_reduce_takes_the_python_path():
    class Spread:
        """max - min of the values: not a built-in, so no C fold."""

        def create(self):
            return None

        def add(self, acc, value):
            return (value, value) if acc is None else (min(acc[0], value),
                                                       max(acc[1], value))

        def merge(self, a, b):
            raise NotImplementedError

        def result(self, acc):
            return acc[1] - acc[0]

    op = operator(Spread())
    assert op.kind is None
    got = run_batches(op, [[(0, 3), (0, 1), (1, 5), (0, "x")]])
    assert got == [(0, 0), (0, 2), (1, 0)]
    assert [v for v, _ in dead_letters(op)] == ["x"]


# -- state: the reduce's, through snapshots and incremental chains ---------------------


@pytest.mark.internal
@given(actions=st.lists(st.one_of(
    st.lists(st.tuples(st.integers(0, 9), st.one_of(st.integers(-50, 50),
                                                     st.floats(-10, 10))),
             min_size=1, max_size=8),
    st.just("checkpoint"), st.just("lost checkpoint")), min_size=1, max_size=30),
       max_chain=st.integers(1, 3), name=st.sampled_from(sorted(AGGREGATIONS)))
@settings(max_examples=60, deadline=None)
def test_every_checkpoint_chain_restores_a_fold_that_goes_on_exactly(actions, max_chain,
                                                                    name):
    """Each checkpoint (whole snapshot and incremental chain, some uploads lost)
    restored into a fresh operator holds the live state of then — Mean's
    ``(sum, count)`` tuples included — and folds the rest of the input to the very
    results the live operator gave."""
    from bastion.runtime.durable import DurableCodec
    from bastion.runtime.incremental import StateChain, apply_links
    from bastion.storage.checkpoints import ChainRef

    codec = DurableCodec()
    live = operator(AGGREGATIONS[name]())
    chain = StateChain([live], max_chain)
    blobs: dict[str, bytes] = {}
    taken, outputs = [], []
    for n, action in enumerate(actions):
        if isinstance(action, list):
            outputs.append(run_batches(live, [action]))
            continue
        link = chain.link([None])
        blobs[f"k{n}"] = codec.encode(link.value)
        ref = ChainRef("op/0", f"k{n}", len(blobs[f"k{n}"]), 0, link.parent)
        if action == "checkpoint":
            chain.stored(link, ref)
        snapshot = codec.decode(codec.encode(live.snapshot()), "snap")
        taken.append((ref, snapshot, len(outputs)))
    for ref, snapshot, done in taken:
        from_chain, from_snapshot = operator(AGGREGATIONS[name]()), operator(
            AGGREGATIONS[name]())
        [tables] = apply_links([codec.decode(blobs[r.key], r.key)
                                for r in (*ref.chain, ref)], [True])
        from_chain.load_tables(tables)
        from_snapshot.restore(snapshot)
        assert same(from_chain.state, snapshot) and same(from_snapshot.state, snapshot)
        rest = [a for a in actions if isinstance(a, list)][done:]
        assert same(run_batches(from_chain, rest), [r for o in outputs[done:] for r in o])
        assert same(run_batches(from_snapshot, rest), [r for o in outputs[done:] for r in o])


# -- the DSL ---------------------------------------------------------------------------


def test_reduce_takes_an_aggregation_or_a_function_with_initial():
    topo = bn.Topology("dsl")
    keyed = topo.source("src", bn.sources.Collection([1])).key_by(lambda v: v)
    keyed.reduce("by-instance", bn.aggregations.Count())
    keyed.reduce("by-class", bn.aggregations.Sum)
    assert isinstance(topo.nodes["by-class"].params["agg"], bn.aggregations.Sum)
    with pytest.raises(bn.TopologyError, match="drop initial"):
        keyed.reduce("both", bn.aggregations.Count(), 0)  # type: ignore[call-overload]
    with pytest.raises(bn.TopologyError, match="needs initial"):
        keyed.reduce("neither", lambda a, v: a + v)  # type: ignore[call-overload]


@pytest.mark.usefixtures("ray_session")
def test_builtin_reduces_in_a_job_give_the_python_running_results():
    """Through `bn.run` at parallelism 2: for every key, the running Count, Sum, Min,
    Max and Mean of its values in order, as the plain aggregations compute them, with
    the records Sum cannot add dead-lettered."""
    data = [(i % 7, (i * 37) % 101 - 50 if i % 3 else ((i * 13) % 17) / 4)
            for i in range(3000)] + [(3, "not a number")]
    topo = bn.Topology("fold-job")
    src = topo.source("src", bn.sources.Collection(data))

    def make(name):
        return (bn.aggregations.Count() if name == "count"
                else AGGREGATIONS[name](lambda r: r[1]))

    for name in AGGREGATIONS:
        src.key_by(lambda r: r[0]).reduce(name, make(name), parallelism=2).sink(
            f"out-{name}", bn.sinks.Collect())
    result = bn.run(topo)
    for name in AGGREGATIONS:
        want, dead = reference(make(name), {}, [(k, (k, v)) for k, v in data])
        got = result.outputs[f"out-{name}"]
        for key in range(7):
            assert same([r for r in got if r[0] == key], [r for r in want if r[0] == key])
        assert len(got) == len(want)
        mine = [d for d in result.dead_letters if d.operator == name]
        assert [(d.value, d.error) for d in mine] == dead
    assert {d.operator for d in result.dead_letters} == {"sum", "min", "max", "mean"}


# -- tumbling windows: the same windows as TimeWindowOp --------------------------------


def window_operators(agg_factory, spec):
    """The folded window operator make_operator picks, and a plain TimeWindowOp of the
    same node (the Python path it must equal)."""
    from bastion.runtime.operators import (FoldedWindowOp, OperatorContext, TimeWindowOp,
                                           make_operator)

    topo = bn.Topology("windows")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v).window(
        spec).aggregate("op", agg_factory()).sink(
        "out", bn.sinks.Discard())
    folded = make_operator(topo.nodes["op"], OperatorContext("op", 0, 1, False))
    assert type(folded) is FoldedWindowOp
    plain = TimeWindowOp(topo.nodes["op"], OperatorContext("op", 0, 1, False))
    return folded, plain


stamps = st.one_of(st.floats(-5, 50, allow_nan=False), st.integers(-5, 50),
                   st.sampled_from([0.0, 1.0, 2.5, 1e-9, -1e-9]))
window_steps = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.lists(st.tuples(keys, values, stamps), min_size=1,
                                         max_size=12), st.booleans()),
    st.tuples(st.just("watermark"), st.floats(-5, 60))), max_size=10)


@pytest.mark.internal
@given(name=st.sampled_from(sorted(AGGREGATIONS)), with_fn=st.booleans(),
       spec=st.sampled_from([bn.windows.Tumbling(1.0), bn.windows.Tumbling(2.5),
                             bn.windows.Tumbling(0.1), bn.windows.Tumbling(7),
                             bn.windows.Sliding(2.0, 1.0), bn.windows.Sliding(2.5, 0.5),
                             bn.windows.Sliding(0.3, 0.1), bn.windows.Sliding(1.0, 0.7),
                             bn.windows.Sliding(7, 7)]),
       steps=window_steps)
@settings(max_examples=400, deadline=None)
def test_a_folded_time_window_is_the_python_window_exactly(name, with_fn, spec, steps):
    """Tumbling and sliding windows (slides that are not binary fractions, one that
    does not divide the size): batches of plain and odd values (a fn that raises on
    some, when ``with_fn``), event times across window bounds or one stamp for a
    whole batch, watermarks in between: the folded operator's snapshot, fired
    results, opened windows, changed windows and dead letters equal TimeWindowOp's
    at every step."""
    from bastion.runtime.records import Batch

    def make():
        if with_fn and name != "count":
            return AGGREGATIONS[name](lambda v: v if v != "x" else {}["fn fails"])
        return AGGREGATIONS[name]()

    folded, plain = window_operators(make, spec)
    for op in (folded, plain):
        op.opened, op.closed, op.changed = [], [], set()
    for step in steps:
        if step[0] == "batch":
            _, records, one_stamp = step
            ts = [float(records[0][2])] * len(records) if one_stamp else [
                float(t) for _, _, t in records]
            for op in (folded, plain):
                assert op.process(Batch([k for k, _, _ in records],
                                        [v for _, v, _ in records], ts,
                                        [float(i) for i in range(len(records))]), 0) is None
        else:
            fired = [op.on_watermark(step[1]) for op in (folded, plain)]
            assert same(*[None if f is None else (f.keys, f.values, f.ts, f.born, f.ids)
                          for f in fired])
        assert same(folded.snapshot(), plain.snapshot())
        assert folded.opened == plain.opened and folded.closed == plain.closed
        assert folded.changed == plain.changed
        assert dead_letters(folded) == dead_letters(plain)
