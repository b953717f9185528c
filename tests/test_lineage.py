"""Lineage ids through the public API, checked against plain-Python enumerations of
the tuples a topology must produce: every committed record has the id of the tuple
it is, ids are unique per sink, and the same in every run."""

from __future__ import annotations

import collections
import math

import pytest

import bastion as bn
from bastion.lineage import format_id, op_codes, source_root

pytestmark = pytest.mark.usefixtures("ray_session")

LINES = [f"w{i % 7} w{i % 3} w{i % 5}" + (" extra" if i % 4 == 0 else "") for i in range(300)]


def wordcount() -> bn.Topology:
    topo = bn.Topology("lineage-wordcount")
    lines = topo.source("lines", bn.sources.Collection(LINES))
    words = lines.flat_map("split", str.split, parallelism=2)
    words.key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0,
                                     parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def test_every_running_count_carries_the_id_of_the_word_it_counts():
    topo = wordcount()
    code = op_codes(topo)
    result = bn.run(topo, lineage=True)
    outputs, ids = result.outputs["out"], result.output_ids["out"]
    assert len(ids) == len(outputs)
    # The ids are exactly the words of the input, enumerated in plain Python.
    want = {(code["count"], (code["split"], (code["lines"], 0, i), j))
            for i, line in enumerate(LINES) for j, _ in enumerate(line.split())}
    assert len(set(ids)) == len(ids)
    assert set(ids) == want
    # Each output is the running count of the word its id names.
    per_word = collections.defaultdict(list)
    for (word, count), (_, (_, (_, _, i), j)) in zip(outputs, ids):
        assert word == LINES[i].split()[j]
        per_word[word].append(count)
    totals = collections.Counter(w for line in LINES for w in line.split())
    assert {w: sorted(c) for w, c in per_word.items()} == {
        w: list(range(1, n + 1)) for w, n in totals.items()}
    assert "count(split(lines[0]@" in format_id(ids[0], topo)


def test_ids_are_the_same_in_every_run_and_absent_without_lineage():
    first = bn.run(wordcount(), lineage=True).output_ids["out"]
    second = bn.run(wordcount(), lineage=True).output_ids["out"]
    assert sorted(first) == sorted(second)
    assert bn.run(wordcount()).output_ids == {}


def test_union_and_broadcast_make_distinct_tuples_of_one_input():
    topo = bn.Topology("lineage-fanout")
    src = topo.source("src", bn.sources.Collection(list(range(200))))
    evens = src.filter("evens", lambda x: x % 2 == 0)
    small = src.filter("small", lambda x: x < 50)
    evens.union(small, name="both").sink("union", bn.sinks.Collect())
    src.broadcast().map("copy", lambda x: -x, parallelism=2).sink(
        "copies", bn.sinks.Collect(), parallelism=2)
    code = op_codes(topo)
    result = bn.run(topo, lineage=True)
    union_ids = result.output_ids["union"]
    # a record that passed both filters is two tuples of the union
    assert sorted(union_ids) == sorted(
        [(code["both"], 0, (code["src"], 0, x)) for x in range(200) if x % 2 == 0]
        + [(code["both"], 1, (code["src"], 0, x)) for x in range(50)])
    copies = result.output_ids["copies"]
    assert len(copies) == 400 and len(set(copies)) == 400
    assert set(copies) == {(code["copy"], (code["copy"], -1 - d, (code["src"], 0, x)))
                           for x in range(200) for d in (0, 1)}


def test_windows_and_joins_are_named_by_what_they_cover():
    topo = bn.Topology("lineage-windows")
    orders = topo.source("orders", bn.sources.Collection(
        [{"user": i % 4, "n": i, "ts": i * 0.1} for i in range(60)]),
        timestamp=lambda o: o["ts"])
    pays = topo.source("pays", bn.sources.Collection(
        [{"user": i % 3, "n": i, "ts": i * 0.1 + 0.05} for i in range(60)]),
        timestamp=lambda p: p["ts"])
    orders.key_by(lambda o: o["user"]).window(bn.windows.Tumbling(1.0)).aggregate(
        "per-user", bn.aggregations.Count(), parallelism=2).sink("windows", bn.sinks.Collect())
    orders.key_by(lambda o: o["user"]).window(bn.windows.Count(4)).aggregate(
        "fours", bn.aggregations.Count()).sink("fours-out", bn.sinks.Collect())
    orders.key_by(lambda o: o["user"]).join(pays.key_by(lambda p: p["user"]), "match",
                                            window=bn.windows.Tumbling(1.0),
                                            parallelism=2).sink("pairs", bn.sinks.Collect())
    code = op_codes(topo)
    result = bn.run(topo, lineage=True)
    for (key, start, end, _), rid in zip(result.outputs["windows"], result.output_ids["windows"]):
        assert rid == (code["per-user"], key, start, end)
    fired = collections.Counter()
    for (key, *_), rid in zip(result.outputs["fours-out"], result.output_ids["fours-out"]):
        assert rid == (code["fours"], key, fired[key])
        fired[key] += 1
    pairs = result.output_ids["pairs"]
    window = math.floor  # Tumbling(1.0): window k covers [k, k + 1)
    want = {(code["match"], (code["orders"], 0, a), (code["pays"], 0, b), window(a * 0.1))
            for a in range(60) for b in range(60)
            if a % 4 == b % 3 and window(a * 0.1) == window(b * 0.1 + 0.05)}
    assert len(pairs) == len(set(pairs)) and set(pairs) == want
    for (_, a, b), (_, (_, _, i), (_, _, j), _) in zip(result.outputs["pairs"], pairs):
        assert (a["n"], b["n"]) == (i, j)


def test_format_id_names_every_kind_of_tuple():
    topo = bn.Topology("lineage-format")
    src = topo.source("src", bn.sources.Collection([1]))
    src.key_by(lambda x: -x).window(bn.windows.Count(1)).aggregate(
        "ones", bn.aggregations.Count()).sink("out", bn.sinks.Collect())
    src.broadcast().map("copy", lambda x: x, parallelism=2).sink("copies", bn.sinks.Collect())
    code = op_codes(topo)
    root = (code["src"], 0, 4)
    assert format_id(root, topo) == "src[0]@4"
    assert format_id((code["ones"], -3, 2), topo) == "ones(key -3, firing 2)"
    assert format_id((code["copy"], (code["copy"], -2, root)), topo) == \
        "copy(copy<broadcast to [1]>(src[0]@4))"
    assert format_id("not an id", topo) == "'not an id'"


def test_source_root_walks_every_single_parent_shape_to_its_source():
    kinds = ["source", "map", "flat_map", "union", "filter"]
    src = (0, 1, 42)
    mapped = (1, src)
    split = (2, mapped, 3)
    joined = (3, 1, split)
    broadcast_into_flat_map = (2, -2, joined)   # a broadcast copy for instance 1
    deeper = (1, (4, -1, broadcast_into_flat_map))
    for rid in (src, mapped, split, joined, broadcast_into_flat_map, deeper):
        assert source_root(rid, kinds) == src
    assert source_root((2, (0, 0, 7), 0), kinds) == (0, 0, 7)


def test_a_count_windows_unbuilt_ids_read_as_the_tuples_they_stand_for():
    from bastion.lineage import (NumberedIds, from_wire, ids_of, record_hashes, take_ids,
                                 to_wire)
    from bastion.runtime.records import Batch

    keys = ["a", 7, ("t", 1), "a", 7]
    numbers = [0, 0, 0, 1, 1]
    ids = NumberedIds(3, keys, numbers)
    built = [(3, k, n) for k, n in zip(keys, numbers)]
    assert list(ids) == list(ids_of(ids)) == built and len(ids) == 5
    assert ids[2] == (3, ("t", 1), 0) and ids[-1] == (3, 7, 1)
    assert list(ids[1:4]) == built[1:4] and list(take_ids(ids, [4, 0])) == [built[4], built[0]]
    assert ids == built and ids != built[:4] and ids != NumberedIds(3, keys, [0] * 5)
    assert from_wire(to_wire(ids)) == built
    assert record_hashes(ids) == record_hashes(built)
    batch = Batch(keys, list(range(5)), [0.0] * 5, [0.0] * 5, ids)
    assert list(batch.slice(1, 3).ids) == built[1:3]
    parts = batch.split([0, 1, 0, 1, 0], 2)
    assert [list(p.ids) for p in parts] == [[built[0], built[2], built[4]],
                                            [built[1], built[3]]]


def test_count_window_ids_survive_the_wire_to_another_parallelism():
    topo = bn.Topology("lineage-count-wire")
    src = topo.source("src", bn.sources.Collection(list(range(90))))
    fired = src.key_by(lambda x: x % 3).window(bn.windows.Count(2)).aggregate(
        "pairs", bn.aggregations.Sum())
    fired.key_by(lambda r: r[3] % 2).map("again", lambda r: r, parallelism=2).sink(
        "out", bn.sinks.Collect())
    code = op_codes(topo)
    result = bn.run(topo, lineage=True)
    ids = result.output_ids["out"]
    # per key k, the j-th firing sums the (2j)-th and (2j+1)-th inputs of k
    want = {(code["again"], (code["pairs"], k, j)) for k in range(3) for j in range(15)}
    assert len(ids) == 45 and set(ids) == want
    for (key, _, _, total), (_, (_, k, j)) in zip(result.outputs["out"], ids):
        assert key == k and total == (k + 6 * j) + (k + 6 * j + 3)
