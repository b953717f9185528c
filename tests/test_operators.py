"""Every operator and window through bn.run with real Ray actors, against plain Python."""

from __future__ import annotations

import collections
import math

import pytest

import bastion as bn

pytestmark = pytest.mark.usefixtures("ray_session")

WORDS = ["apple", "banana", "cherry", "date", "elder", "fig", "grape"]
SENTENCES = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(i % 5 + 1))
             for i in range(400)]


def final_counts(pairs):
    final = {}
    for key, count in pairs:
        final[key] = max(final.get(key, 0), count)
    return final


def per_key_sequences(pairs):
    seqs = collections.defaultdict(list)
    for key, value in pairs:
        seqs[key].append(value)
    return dict(seqs)


def test_map_filter_flat_map_union():
    topo = bn.Topology("stateless")
    nums = topo.source("nums", bn.sources.Collection(range(1000)), parallelism=2)
    doubled = nums.map("double", lambda x: x * 2, parallelism=2)
    odd = nums.filter("odd", lambda x: x % 2 == 1, parallelism=1)
    spread = odd.flat_map("spread", lambda x: [x, -x], parallelism=2)
    doubled.union(spread, name="both", parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = [x * 2 for x in range(1000)]
    expected += [y for x in range(1000) if x % 2 == 1 for y in (x, -x)]
    assert sorted(result.outputs["out"]) == sorted(expected)
    ops = result.metrics.operators
    assert ops["nums"].records_out == 1000
    assert ops["odd"].records_in == 1000 and ops["odd"].records_out == 500
    assert ops["spread"].records_out == 1000
    assert result.metrics.sink_records == 2000


def test_wordcount_reduce_emits_every_running_count():
    topo = bn.Topology("wordcount")
    lines = topo.source("lines", bn.sources.Collection(SENTENCES))
    words = lines.flat_map("split", str.split, parallelism=2)
    counts = words.key_by(lambda w: w).reduce("count", lambda acc, w: acc + 1, initial=0,
                                               parallelism=2)
    counts.sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = collections.Counter(w for s in SENTENCES for w in s.split())
    out = result.outputs["out"]
    assert len(out) == sum(expected.values())
    assert final_counts(out) == dict(expected)
    # every key's running counts arrive in order 1, 2, ..., n
    for key, seq in per_key_sequences(out).items():
        assert seq == list(range(1, expected[key] + 1)), key


def test_stateful_map_keeps_per_key_state_in_order():
    values = [(i % 7, i) for i in range(2000)]
    topo = bn.Topology("running-max")
    src = topo.source("src", bn.sources.Collection(values))

    def running_max(state, value):
        state = max(state, value[1])
        return state, (value[0], value[1], state)

    src.key_by(lambda v: v[0]).stateful_map("max", running_max, initial=-1,
                                            parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = []
    best = {}
    for k, v in values:
        best[k] = max(best.get(k, -1), v)
        expected.append((k, v, best[k]))
    assert sorted(result.outputs["out"]) == sorted(expected)
    by_key = collections.defaultdict(list)
    for k, v, m in result.outputs["out"]:
        by_key[k].append(v)
    for k, seq in by_key.items():
        assert seq == sorted(seq), f"key {k} out of order"


def test_reduce_with_mutable_initial_gets_a_fresh_copy_per_key():
    topo = bn.Topology("lists")
    src = topo.source("src", bn.sources.Collection([("a", 1), ("b", 2), ("a", 3)]))
    src.key_by(lambda v: v[0]).reduce("collect", lambda acc, v: acc + [v[1]], initial=[]) \
        .sink("out", bn.sinks.Collect())
    out = bn.run(topo).outputs["out"]
    assert sorted(out, key=repr) == sorted([("a", [1]), ("b", [2]), ("a", [1, 3])], key=repr)


EVENTS = [(f"page{i % 5}", i * 0.37 % 60.0, i) for i in range(3000)]  # (page, ts, n)


def reference_windows(events, size, slide, agg_fn):
    out = {}
    for page, ts, n in events:
        last = math.floor(ts / slide)
        k = last
        while k * slide + size > ts and k * slide <= ts:
            out.setdefault((page, k * slide, k * slide + size), []).append(n)
            k -= 1
    return sorted((key[0], key[1], key[2], agg_fn(vals)) for key, vals in out.items())


@pytest.mark.parametrize("agg,ref", [
    (bn.aggregations.Count(), len),
    (bn.aggregations.Sum(lambda e: e[2]), sum),
    (bn.aggregations.Min(lambda e: e[2]), min),
    (bn.aggregations.Max(lambda e: e[2]), max),
    (bn.aggregations.Mean(lambda e: e[2]), lambda xs: sum(xs) / len(xs)),
])
def test_tumbling_window_aggregations(agg, ref):
    events = sorted(EVENTS, key=lambda e: e[1])
    topo = bn.Topology("tumbling")
    src = topo.source("events", bn.sources.Collection(events), timestamp=lambda e: e[1])
    src.key_by(lambda e: e[0]).window(bn.windows.Tumbling(10)).aggregate(
        "agg", agg, parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = reference_windows(events, 10.0, 10.0, ref)
    got = sorted(result.outputs["out"])
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for g, e in zip(got, expected):
        assert g[3] == pytest.approx(e[3])


def test_sliding_window_sum_over_two_source_instances():
    events = sorted(EVENTS, key=lambda e: e[1])
    topo = bn.Topology("sliding")
    src = topo.source("events", bn.sources.Collection(events), timestamp=lambda e: e[1],
                      parallelism=2)
    src.key_by(lambda e: e[0]).window(bn.windows.Sliding(10, 5)).aggregate(
        "sum", bn.aggregations.Sum(lambda e: e[2]), parallelism=2).sink(
        "out", bn.sinks.Collect())
    result = bn.run(topo)
    assert sorted(result.outputs["out"]) == reference_windows(events, 10.0, 5.0, sum)


def test_count_window_fires_every_n_and_drops_incomplete():
    values = [(i % 3, float(i)) for i in range(100)]
    topo = bn.Topology("count-window")
    src = topo.source("src", bn.sources.Collection(values), timestamp=lambda v: v[1])
    src.key_by(lambda v: v[0]).window(bn.windows.Count(4)).aggregate(
        "sum4", bn.aggregations.Sum(lambda v: v[1]), parallelism=2).sink(
        "out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = []
    for key in range(3):
        mine = [v for v in values if v[0] == key]
        for start in range(0, len(mine) - len(mine) % 4, 4):
            chunk = mine[start:start + 4]
            expected.append((key, chunk[0][1], chunk[-1][1], sum(v[1] for v in chunk)))
    assert sorted(result.outputs["out"]) == sorted(expected)


class Distinct:
    """A custom aggregation: the set of distinct values, as a sorted tuple."""

    def create(self):
        return ()

    def add(self, acc, value):
        return tuple(sorted(set(acc) | {value[2] % 4}))

    def merge(self, a, b):
        return tuple(sorted(set(a) | set(b)))

    def result(self, acc):
        return acc


def test_custom_aggregation():
    events = sorted(EVENTS, key=lambda e: e[1])
    topo = bn.Topology("custom")
    src = topo.source("events", bn.sources.Collection(events), timestamp=lambda e: e[1])
    src.key_by(lambda e: e[0]).window(bn.windows.Tumbling(20)).aggregate(
        "distinct", Distinct()).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = reference_windows(events, 20.0, 20.0, lambda ns: tuple(sorted({n % 4 for n in ns})))
    assert sorted(result.outputs["out"]) == expected


def test_keyed_windowed_join_matches_nested_loop_reference():
    orders = [(f"u{i % 6}", i * 0.5, f"order{i}") for i in range(300)]
    payments = [(f"u{i % 4}", i * 0.75, f"pay{i}") for i in range(200)]
    topo = bn.Topology("join")
    o = topo.source("orders", bn.sources.Collection(orders), timestamp=lambda e: e[1])
    p = topo.source("payments", bn.sources.Collection(payments), timestamp=lambda e: e[1])
    o.key_by(lambda e: e[0]).join(p.key_by(lambda e: e[0]), "match",
                                  window=bn.windows.Tumbling(10), parallelism=2) \
        .map("ids", lambda t: (t[0], t[1][2], t[2][2])).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    expected = sorted((a[0], a[2], b[2]) for a in orders for b in payments
                      if a[0] == b[0] and math.floor(a[1] / 10) == math.floor(b[1] / 10))
    assert sorted(result.outputs["out"]) == expected


def test_sliding_join_emits_a_pair_once_per_shared_window():
    left = [("k", 1.0, "a"), ("k", 7.0, "b")]
    right = [("k", 4.0, "x")]
    topo = bn.Topology("sliding-join")
    a = topo.source("a", bn.sources.Collection(left), timestamp=lambda e: e[1])
    b = topo.source("b", bn.sources.Collection(right), timestamp=lambda e: e[1])
    a.key_by(lambda e: e[0]).join(b.key_by(lambda e: e[0]), "j",
                                  window=bn.windows.Sliding(6, 3)) \
        .map("names", lambda t: (t[1][2], t[2][2])).sink("out", bn.sinks.Collect())
    out = bn.run(topo).outputs["out"]
    # windows of size 6 every 3: [0,6) holds a,x; [3,9) holds b,x; [-3,3) only a; [6,12) only b
    assert sorted(out) == [("a", "x"), ("b", "x")]
