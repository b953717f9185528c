"""The vectorized DSL is typed (issue 41): ``reduce`` of an aggregation is a stream of
``(key, result)`` with the aggregation's result type, ``map_batches`` /
``key_by_batch`` / ``Generator(batch_fn=...)`` take only the formats there are, and
``Generator`` takes ``fn`` or ``batch_fn``. Checked as `test_typed_dsl` checks the
DSL: every line marked ``# E: text`` must get an error containing ``text``, no other
line any, and every ``assert_type`` holds."""

from __future__ import annotations


from test_typed_dsl import assert_reports_each_marked_error
from test_typed_dsl import mypy  # noqa: F401 - the fixture that runs mypy --strict

VECTOR = '''\
from typing import Any, assert_type

import bastion as bn
from bastion.topology import KeyedStream, Stream

topo = bn.Topology("typed-vector")
words = topo.source("words", bn.sources.Collection(["to", "be", "or"]))
by_word = words.key_by(lambda w: w)
assert_type(by_word.reduce("n", bn.aggregations.Count()), Stream[tuple[str, int]])
assert_type(by_word.reduce("n2", bn.aggregations.Count), Stream[tuple[str, int]])
assert_type(by_word.reduce("mean", bn.aggregations.Mean(len)),
            Stream[tuple[str, float | None]])
assert_type(by_word.reduce("r", lambda acc, w: acc + len(w), initial=0),
            Stream[tuple[str, int]])
nums = topo.source("nums", bn.sources.Generator(batch_fn=lambda ks: ks * 2, count=5))
assert_type(nums, Stream[Any])
assert_type(nums.map_batches("m", lambda c: c + 1, format="arrow"), Stream[Any])
assert_type(words.key_by_batch(lambda c: c), KeyedStream[Any, str])
assert_type(words.filter_batches("f", lambda c: c != "be"), Stream[str])
assert_type(topo.source("g", bn.sources.Generator(lambda k: str(k), count=2)), Stream[str])
by_word.reduce("both", bn.aggregations.Count(), 0)  # E: No overload variant of "reduce"
nums.map_batches("pandas", lambda c: c, format="pandas")  # E: Argument "format" to "map_batches" of "Stream" has incompatible type
words.key_by_batch(lambda c: c, format="polars")  # E: Argument "format" to "key_by_batch" of "Stream" has incompatible type
bn.sources.Generator(count=3)  # E: No overload variant of "Generator" matches
'''


def test_the_vectorized_dsl_is_typed(mypy, tmp_path):  # noqa: F811 - the fixture
    assert_reports_each_marked_error(mypy, tmp_path / "vector.py", VECTOR)
