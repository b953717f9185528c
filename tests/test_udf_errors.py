"""A user function that raises is called once per record, not once more per failure.

`map`, `filter` and `flat_map` run their function over a whole batch at C speed; when
it raises on one record, that record is dead-lettered and the batch goes on after it.
Re-running the records before it would run their side effects twice. These tests
count the calls per record, on the operators directly and through `bn.run`.
"""

from __future__ import annotations

import collections
import json
from typing import Any, Callable

import pytest

import bastion as bn
from bastion.lineage import ids_of, root_ids
from bastion.runtime.operators import OperatorContext, make_operator
from bastion.runtime.records import Batch
from bastion.topology import OpNode

BAD = {0, 3, 4, 9}  # the first record, two in a row, the last one


class Counting:
    """A user function that counts its calls per value and raises on ``bad`` values."""

    def __init__(self, result: Callable[[int], Any], bad: set = BAD):
        self.result = result
        self.bad = bad
        self.calls: collections.Counter = collections.Counter()

    def __call__(self, value: int) -> Any:
        self.calls[value] += 1
        if value in self.bad:
            raise ValueError(f"bad {value}")
        return self.result(value)


def run_operator(kind: str, fn: Callable, values: list, fail_fast: bool = False,
                 lineage: bool = False):
    ctx = OperatorContext("op", 0, 1, fail_fast, code=5, lineage=lineage)
    op = make_operator(OpNode("op", kind, 1, params={"fn": fn}), ctx)
    n = len(values)
    ids = root_ids(1, 0, 0, n) if lineage else None
    out = op.process(Batch(None, values, [0.0] * n, [0.0] * n, ids), 0)
    return out, ctx


@pytest.mark.parametrize("kind, result, expected", [
    ("map", lambda v: v * 10, [v * 10 for v in range(10) if v not in BAD]),
    ("filter", lambda v: v % 2 == 1, [v for v in range(10) if v not in BAD and v % 2]),
    ("flat_map", lambda v: [v] * (v % 3), [v for v in range(10) if v not in BAD
                                           for _ in range(v % 3)]),
])
def test_each_record_is_called_once_when_some_fail(kind, result, expected):
    fn = Counting(result)
    out, ctx = run_operator(kind, fn, list(range(10)))
    assert fn.calls == {v: 1 for v in range(10)}
    assert list(out.values) == expected
    assert [d.value for d in ctx.dead_letters] == sorted(BAD)
    assert all(d.error == f"ValueError: bad {d.value}" for d in ctx.dead_letters)


def test_ids_stay_with_their_records_after_failures():
    fn = Counting(lambda v: -v)
    out, _ = run_operator("map", fn, list(range(10)), lineage=True)
    reference, _ = run_operator("map", lambda v: -v, list(range(10)), lineage=True)
    kept = [v for v in range(10) if v not in BAD]
    assert list(out.values) == [-v for v in kept]
    assert list(ids_of(out.ids)) == [list(ids_of(reference.ids))[v] for v in kept]


def test_a_function_raising_stop_iteration_does_not_end_the_batch():
    def fn(value: int) -> int:
        if value == 2:
            raise StopIteration
        return value

    out, ctx = run_operator("map", fn, list(range(5)))
    assert list(out.values) == [0, 1, 3, 4]
    assert len(out.ts) == 4
    assert [d.value for d in ctx.dead_letters] == [2]


def test_fail_fast_stops_at_the_first_failure_after_one_call_each():
    fn = Counting(lambda v: v, bad={5})
    with pytest.raises(bn.UDFError):
        run_operator("map", fn, list(range(10)), fail_fast=True)
    assert fn.calls == {v: 1 for v in range(6)}


def test_through_a_run_every_record_is_called_once(tmp_path, ray_session):
    calls = tmp_path / "calls"

    def logged(value: int) -> int:
        with open(calls, "a", encoding="utf-8") as f:  # a side effect, visible across processes
            f.write(json.dumps(value) + "\n")
        if value % 7 == 3:
            raise ValueError("bad")
        return value

    topo = bn.Topology("udf-once")
    topo.source("src", bn.sources.Collection(range(300))).map("m", logged).sink(
        "out", bn.sinks.Collect())
    result = bn.run(topo)
    seen = collections.Counter(json.loads(line) for line in calls.read_text().splitlines())
    assert seen == {v: 1 for v in range(300)}
    assert sorted(d.value for d in result.dead_letters) == [v for v in range(300) if v % 7 == 3]
    assert result.outputs["out"] == [v for v in range(300) if v % 7 != 3]
