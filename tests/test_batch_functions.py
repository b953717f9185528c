"""Batch functions in the DSL (issue 41, item 1): ``map_batches``, ``key_by_batch`` and
``Generator(batch_fn=...)`` hand user code whole columns, and everything after them
sees the records a per-record job would: the tests run each batch job beside its
per-record twin and compare outputs, lineage ids and dead letters; a column of the
wrong length fails the job with a one-line `UDFError` naming the operator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion as bn

pytestmark = pytest.mark.usefixtures("ray_session")

N = 4000


def per_record_job(name: str) -> bn.Topology:
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Generator(lambda k: k * 3 + 1, count=N))
    shifted = src.map("shift", lambda x: x * 2 - 5).filter("some", lambda x: x % 8 != 1)
    shifted.key_by(lambda x: x % 13).reduce("count", lambda acc, _: acc + 1, initial=0,
                                            parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def batch_job(name: str, format: str = "numpy") -> bn.Topology:
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Generator(batch_fn=lambda k: k * 3 + 1, count=N,
                                                  format=format))  # type: ignore[arg-type]
    shifted = src.map_batches("shift", lambda c: c * 2 - 5,
                              format=format).filter_batches(  # type: ignore[arg-type]
        "some", lambda c: c % 8 != 1, format=format)  # type: ignore[arg-type]
    shifted.key_by_batch(lambda c: c % 13, format=format).reduce(  # type: ignore[arg-type]
        "count", bn.aggregations.Count(), parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def test_a_batch_job_commits_the_records_and_ids_of_its_per_record_twin():
    """The same topology shape, operator names and record numbers: with lineage on,
    every committed record has the same value and the same lineage id, and in
    deterministic mode they come out in the same order."""
    per_record = bn.run(per_record_job("twin-a"), lineage=True, deterministic=True)
    batched = bn.run(batch_job("twin-b"), lineage=True, deterministic=True)
    assert len(batched.outputs["out"]) == sum(1 for k in range(N) if (k * 6 - 3) % 8 != 1)
    assert len(batched.outputs["out"]) > N // 2
    assert batched.outputs["out"] == per_record.outputs["out"]
    assert batched.output_ids["out"] == per_record.output_ids["out"]
    assert all(type(k) is int and type(c) is int for k, c in batched.outputs["out"])


def test_arrow_columns_give_the_same_records():
    pytest.importorskip("pyarrow", reason="format='arrow' needs pyarrow (bench extra)")
    import pyarrow.compute as pc

    topo = bn.Topology("arrow")
    src = topo.source("src", bn.sources.Generator(
        batch_fn=lambda k: pc.add(pc.multiply(k, 3), 1), count=N, format="arrow"))
    src.map_batches("shift", lambda c: pc.subtract(pc.multiply(c, 2), 5),
                    format="arrow").key_by_batch(
        lambda c: pc.divide(c, 1), format="arrow").reduce(
        "count", bn.aggregations.Count(), parallelism=2).sink("out", bn.sinks.Collect())
    arrow = bn.run(topo, deterministic=True).outputs["out"]
    want = [x * 2 - 5 for x in (k * 3 + 1 for k in range(N))]
    counts: dict[int, int] = {}
    expected = []
    for x in want:
        counts[x] = counts.get(x, 0) + 1
        expected.append((x, counts[x]))
    assert sorted(arrow) == sorted(expected)


def test_a_raising_batch_function_dead_letters_only_the_values_it_fails_on():
    def inverse(column):
        if (column == 0).any():
            raise ZeroDivisionError("a zero in the column")
        return 60 // column

    topo = bn.Topology("raising")
    src = topo.source("src", bn.sources.Collection([1, 2, 0, 3, 0, 4]))
    src.map_batches("inverse", inverse).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    assert result.outputs["out"] == [60, 30, 20, 15]
    assert [(d.operator, d.value, d.reason) for d in result.dead_letters] == [
        ("inverse", 0, "udf"), ("inverse", 0, "udf")]
    assert "ZeroDivisionError: a zero in the column" in result.dead_letters[0].error


@pytest.mark.parametrize("where", ["map_batches", "filter_batches", "key_by_batch",
                                   "source"])
def test_a_column_of_the_wrong_length_fails_the_job_naming_the_operator(where):
    topo = bn.Topology(f"short-{where.replace('_', '-')}")
    short = lambda c: c[:-1]  # noqa: E731 - one value too few
    if where == "source":
        src = topo.source("numbers", bn.sources.Generator(batch_fn=short, count=500))
    else:
        src = topo.source("numbers", bn.sources.Collection(list(range(500))))
    if where == "map_batches":
        src = src.map_batches("halve", short)
    if where == "filter_batches":
        src = src.filter_batches("odd", lambda c: (c % 2 == 1)[:-1])
    keyed = src.key_by_batch(short) if where == "key_by_batch" else src.key_by(lambda v: v)
    keyed.reduce("count", bn.aggregations.Count()).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.UDFError) as failure:
        bn.run(topo)
    operator = {"map_batches": "halve", "filter_batches": "odd", "key_by_batch": "count",
                "source": "numbers"}[where]
    assert failure.value.operator == operator
    message = str(failure.value)
    assert "\n" not in message and f"operator {operator!r}" in message
    assert "values for a batch of" in message


@pytest.mark.internal
def test_a_wrong_length_stops_the_batch_before_anything_leaves_the_operator():
    """The operator raises from ``process``: it returns no batch, so nothing made from
    that batch reaches the next operator, a channel or a sink; and it dead-letters
    nothing (it is the job's bug, not a record's)."""
    from bastion.runtime.operators import OperatorContext, make_operator
    from bastion.runtime.records import Batch

    topo = bn.Topology("unit")
    topo.source("src", bn.sources.Collection([])).map_batches(
        "twice", lambda c: np.concatenate([c, c])).sink("out", bn.sinks.Discard())
    op = make_operator(topo.nodes["twice"], OperatorContext("twice", 0, 1, False))
    with pytest.raises(bn.UDFError, match="returned 6 values for a batch of 3"):
        op.process(Batch(None, [1, 2, 3], [0.0] * 3, [0.0] * 3), 0)
    assert op.ctx.dead_letter_count == 0
    # and a right-length function through the same operator passes values through
    ok = make_operator(topo.nodes["twice"], OperatorContext("twice", 0, 1, False))
    ok.fn = lambda c: c * 2
    assert list(ok.process(Batch(None, [1, 2, 3], [0.0] * 3, [0.0] * 3), 0).values) == [2, 4, 6]


def test_the_dsl_checks_formats_and_functions():
    topo = bn.Topology("dsl")
    src = topo.source("src", bn.sources.Collection([1]))
    with pytest.raises(bn.TopologyError, match="format must be one of"):
        src.map_batches("m", lambda c: c, format="pandas")  # type: ignore[arg-type]
    with pytest.raises(bn.TopologyError, match="must be callable"):
        src.map_batches("m2", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one of them"):
        bn.sources.Generator(lambda k: k, batch_fn=lambda c: c)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="one of them"):
        bn.sources.Generator(count=3)  # type: ignore[call-overload]


@pytest.mark.internal
@given(values=st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50),
    st.lists(st.floats(allow_nan=True), max_size=50),
    st.lists(st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                       st.booleans()), max_size=50)),
       as_tuple=st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_numpy_column_is_what_asarray_makes(values, as_tuple):
    """The fast path for exact ints and floats (`_batches._numbers_column`) gives
    asarray's dtype and bits, in a writable array of its own."""
    from bastion._batches import to_column

    column = to_column(tuple(values) if as_tuple else values, "numpy")
    want = np.asarray(values)
    assert column.dtype == want.dtype and column.shape == want.shape
    assert column.tobytes() == want.tobytes() if want.dtype != object else (
        column.tolist() == want.tolist())
    column[...] = column  # writable, and not a view of anything the caller holds
