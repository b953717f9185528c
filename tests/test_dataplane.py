"""Data-plane behaviour through bn.run: event time, dead letters, chaining, backpressure,
stable routing, file sink, codecs, unbounded sources."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import pytest

import bastion as bn
from bastion.runtime.records import stable_hash

pytestmark = pytest.mark.usefixtures("ray_session")


def test_out_of_order_within_lateness_is_counted_and_late_records_are_dead_lettered():
    # Timestamps arrive out of order by up to 3 s; the bound is 5 s, so nothing is late
    # except the two records planted 20 s in the past.
    events = []
    for i in range(200):
        ts = i + (3 if i % 4 == 0 else 0) - (2 if i % 7 == 0 else 0)
        events.append(("k", float(ts), i))
    events.insert(100, ("k", 50.0, "late-1"))    # watermark is ~95 by then
    events.insert(150, ("k", 100.0, "late-2"))
    topo = bn.Topology("lateness")
    src = topo.source("events", bn.sources.Collection(events), timestamp=lambda e: e[1],
                      max_out_of_orderness=5.0)
    src.key_by(lambda e: e[0]).window(bn.windows.Tumbling(10)).aggregate(
        "count", bn.aggregations.Count()).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    on_time = [e for e in events if not isinstance(e[2], str)]
    expected = {}
    for _, ts, _ in on_time:
        start = (ts // 10) * 10
        expected[start] = expected.get(start, 0) + 1
    got = {start: count for _, start, _, count in result.outputs["out"]}
    assert got == expected
    late = [d for d in result.dead_letters if d.reason == "late"]
    assert sorted(d.value[2] for d in late) == ["late-1", "late-2"]
    assert all(d.operator == "events" for d in late)
    assert result.metrics.dead_letters == 2


def test_udf_exception_goes_to_dead_letters_and_the_job_completes():
    def fragile(x):
        if x % 100 == 13:
            raise ValueError(f"bad value {x}")
        return x * 10

    topo = bn.Topology("dead-letters")
    src = topo.source("nums", bn.sources.Collection(range(1000)))
    src.map("fragile", fragile, parallelism=2).key_by(lambda x: x % 3).reduce(
        "sum", lambda acc, x: acc + x, initial=0).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    bad = [x for x in range(1000) if x % 100 == 13]
    assert result.metrics.dead_letters == len(bad)
    assert sorted(d.value for d in result.dead_letters) == bad
    assert all(d.operator == "fragile" and "ValueError: bad value" in d.error
               for d in result.dead_letters)
    totals = {}
    for key, acc in result.outputs["out"]:
        totals[key] = max(totals.get(key, 0), acc)
    good = [x * 10 for x in range(1000) if x % 100 != 13]
    assert totals == {k: sum(v for v in good if v % 3 == k) for k in range(3)}


def test_failing_key_function_and_reduce_are_dead_lettered_under_the_keyed_operator():
    topo = bn.Topology("bad-keys")
    src = topo.source("vals", bn.sources.Collection([1, 2, "x", 4, None, 6]))
    src.key_by(lambda v: v % 2).reduce("sum", lambda acc, v: acc + v, initial=0,
                                       parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo)
    assert sorted(map(repr, (d.value for d in result.dead_letters))) == ["'x'", "None"]
    assert {d.operator for d in result.dead_letters} == {"sum"}
    finals = {}
    for k, acc in result.outputs["out"]:
        finals[k] = max(finals.get(k, 0), acc)
    assert finals == {0: 12, 1: 1}


def test_fail_fast_stops_the_run_naming_operator_and_record():
    def explode(x):
        if x == 77:
            raise RuntimeError("boom")
        return x

    topo = bn.Topology("fail-fast")
    topo.source("nums", bn.sources.Collection(range(200))).map(
        "explode", explode).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.UDFError) as info:
        bn.run(topo, fail_fast=True)
    assert info.value.operator == "explode"
    assert info.value.value == 77
    assert "'explode'" in str(info.value) and "77" in str(info.value) and "boom" in str(info.value)


def pipeline(name):
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Collection(range(5000)), parallelism=2)
    words = src.map("word", lambda i: f"w{i * 7919 % 97}").filter("nonzero", lambda w: w != "w0")
    counts = words.key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0)
    counts.map("fmt", lambda kv: f"{kv[0]}={kv[1]}").sink("out", bn.sinks.Collect())
    return topo


def test_chained_and_unchained_plans_give_the_same_results():
    chained = bn.run(pipeline("chained"))
    unchained = bn.run(pipeline("unchained"), data_plane=bn.DataPlane(chaining=False))
    assert chained.plan.startswith("2 chains") and unchained.plan.startswith("6 chains")
    assert sorted(chained.outputs["out"]) == sorted(unchained.outputs["out"])
    assert len(chained.outputs["out"]) == 5000 - sum(1 for i in range(5000) if i * 7919 % 97 == 0)
    assert chained.metrics.extra["tasks"] < unchained.metrics.extra["tasks"]


def test_slow_sink_keeps_frames_in_flight_bounded():
    def slow(value):
        time.sleep(0.0005)  # per record: 4,000 records per instance take >= 2 s
        return value

    topo = bn.Topology("backpressure")
    src = topo.source("fast", bn.sources.Collection(range(8_000)))
    src.map("slow", slow, parallelism=2).sink("out", bn.sinks.Discard())
    result = bn.run(topo,
                    data_plane=bn.DataPlane(frame_records=256, max_inflight_frames=2,
                                            source_batch_records=256))
    extra = result.metrics.extra
    # The source could produce all 8,000 records in milliseconds; credits held it to
    # at most 2 unacknowledged frames per channel and a bounded inbox.
    assert result.metrics.sink_records == 8_000
    assert 1 <= extra["max_inflight_frames"] <= 2
    assert extra["max_inbox_frames"] <= 16
    assert result.metrics.duration_s > 8_000 / 2 * 0.0005 * 0.8


def test_stable_hash_is_the_same_in_every_process():
    keys = ["apple", "Ünïcode", b"bytes", 42, -7, 2**70, (1, "a"), 3.5, None]
    code = ("from bastion.runtime.records import stable_hash\n"
            f"print([stable_hash(k) for k in {keys!r}])")
    outputs = set()
    for seed in ("1", "2", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout
        outputs.add(out)
    assert len(outputs) == 1
    assert eval(outputs.pop()) == [stable_hash(k) for k in keys]
    assert stable_hash(1) == stable_hash(1.0) == stable_hash(True)


def test_keys_land_on_the_instance_their_key_group_names(tmp_path):
    topo = bn.Topology("routing")
    src = topo.source("src", bn.sources.Collection([f"user{i}" for i in range(300)]))
    src.key_by(lambda u: u).reduce("seen", lambda acc, u: acc + 1, initial=0,
                                   parallelism=3).sink("out", bn.sinks.File(tmp_path / "o.jsonl"))
    bn.run(topo)
    for index in range(3):
        lines = (tmp_path / f"o-{index}.jsonl").read_text().splitlines()
        keys = {json.loads(line)[0] for line in lines}
        assert keys and all(bn.instance_of(k, 3) == index for k in keys)


def test_file_sink_writes_json_lines_and_truncates_old_output(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("stale\n")
    topo = bn.Topology("file")
    topo.source("src", bn.sources.Collection([{"n": i} for i in range(50)])).sink(
        "out", bn.sinks.File(path))
    bn.run(topo)
    assert [json.loads(line) for line in path.read_text().splitlines()] == \
        [{"n": i} for i in range(50)]


def test_registered_codec_carries_custom_types_across_workers():
    topo = bn.Topology("codec")
    topo.register_codec(datetime.date, 7, lambda d: d.isoformat().encode(),
                        lambda b: datetime.date.fromisoformat(b.decode()))
    src = topo.source("days", bn.sources.Collection(range(20)))
    dates = src.map("date", lambda i: datetime.date(2026, 1, 1 + i))
    dates.rebalance().map("next", lambda d: d + datetime.timedelta(days=1),
                          parallelism=2).sink("out", bn.sinks.Collect())
    out = bn.run(topo).outputs["out"]
    assert sorted(out) == [datetime.date(2026, 1, 2 + i) for i in range(20)]


def test_unregistered_type_fails_with_a_clear_error():
    class Point:
        pass

    topo = bn.Topology("no-codec")
    src = topo.source("src", bn.sources.Collection(range(3)))
    src.map("point", lambda i: Point()).rebalance().map(
        "again", lambda p: p, parallelism=2).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.JobFailedError, match="cannot serialise a value of type Point"):
        bn.run(topo)


def test_unbounded_rate_limited_generator_runs_for_duration():
    topo = bn.Topology("unbounded")
    topo.source("gen", bn.sources.Generator(lambda i: i, rate=2000)).map(
        "inc", lambda x: x + 1, parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo, duration_s=2.0)
    out = sorted(result.outputs["out"])
    # the generator is paced at 2,000/s: about 4,000 records, every one exactly once
    assert 2000 <= len(out) <= 6000
    assert out == list(range(1, len(out) + 1))
    assert result.metrics.latency_ms["p99"] is not None
