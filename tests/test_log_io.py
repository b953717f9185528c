"""Log source and Log sink: committed values go into a segmented log exactly once and
come back out of it, at any parallelism, locally and on S3, across a kill.

``bn.sinks.Log(url)`` applies each commit point once — a marker written ahead of the
append says which seqs the commit point occupies, so a replayed apply only adds what
is missing. ``bn.sources.Log(url)`` reads the log back with its seqs as offsets.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

import bastion as bn
from bastion.connectors.logs import read_layout
from bastion.storage import CorruptRecordError, LogReader, LogWriter, StorageError, open_store

pytestmark = pytest.mark.usefixtures("ray_session")

# Fake credentials for moto. Ray's worker processes inherit the environment of the
# process that starts Ray (the session fixture, after collection), and the Log source
# and sink open s3:// stores inside the workers, like the job's own storage does.
MOTO_ACCESS_KEY = "AKIABASTIONLOGTEST"
MOTO_SECRET_KEY = "bastion-log-test-secret"
os.environ.setdefault("BASTION_S3_ACCESS_KEY", MOTO_ACCESS_KEY)
os.environ.setdefault("BASTION_S3_SECRET_KEY", MOTO_SECRET_KEY)


def read_log(url: str) -> list:
    """Every value of the log(s) at ``url``: sub-logs in index order, each in seq order."""
    store = open_store(url)
    layout = read_layout(store)
    prefixes = [""] if layout in (None, 1) else [f"{i}/" for i in range(layout)]
    return [r[2] for p in prefixes for r in LogReader(store, p).records()]


def read_all(reader, max_records: int = 7) -> list:
    out = []
    while (batch := reader.read(max_records, 0.0)) is not None:
        out += batch
    return out


def write_topology(name: str, items: list, url: str, parallelism: int = 1) -> bn.Topology:
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Collection(items))
    src.map("tag", lambda v: {"n": v, "sq": v * v}, parallelism=parallelism).sink(
        "log", bn.sinks.Log(url), parallelism=parallelism)
    return topo


def read_topology(name: str, url: str, parallelism: int) -> bn.Topology:
    topo = bn.Topology(name)
    topo.source("log", bn.sources.Log(url), parallelism=parallelism).sink(
        "out", bn.sinks.Collect(), parallelism=parallelism)
    return topo


def test_round_trip_through_a_log_keeps_values_in_order(tmp_path):
    url = f"local://{tmp_path}/log"
    storage = f"local://{tmp_path}/jobs"
    written = bn.run(write_topology("log-write", list(range(300)), url),
                     protocol=bn.protocols.Coordinated(interval_s=0.2), storage=storage)
    expected = [{"n": v, "sq": v * v} for v in range(300)]
    assert written.outputs["log"] == expected
    assert read_log(url) == expected  # one log at the URL's root, in commit order

    read = bn.run(read_topology("log-read", url, 1),
                  protocol=bn.protocols.Coordinated(interval_s=0.2),
                  storage=storage)
    assert read.outputs["out"] == expected


def test_parallel_sink_is_read_back_at_any_parallelism(tmp_path):
    url = f"local://{tmp_path}/log"
    storage = f"local://{tmp_path}/jobs"
    written = bn.run(write_topology("log-write2", list(range(400)), url, parallelism=2),
                     protocol=bn.protocols.Coordinated(interval_s=0.2), storage=storage)
    committed = written.outputs["log"]  # instance 0's values, then instance 1's
    assert sorted(v["n"] for v in committed) == list(range(400))
    assert sorted(open_store(url).list(""))[-1] == "layout"
    assert read_log(url) == committed  # sub-logs 0/ and 1/

    topo = bn.Topology("log-read-1-and-2")  # two readers of the same log, one run
    topo.source("log1", bn.sources.Log(url), parallelism=1).sink("one", bn.sinks.Collect())
    topo.source("log2", bn.sources.Log(url), parallelism=2).sink(
        "two", bn.sinks.Collect(), parallelism=2)
    read = bn.run(topo, protocol="coordinated", storage=storage).outputs
    assert read["one"] == committed  # sub-log 0, then sub-log 1, each in order
    assert Counter(map(repr, read["two"])) == Counter(map(repr, committed))


@pytest.mark.parametrize("logs,parallelism", [(1, 3), (2, 3), (3, 2), (2, 2)])
def test_every_record_is_read_by_exactly_one_instance(tmp_path, logs, parallelism):
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(logs)
    expected = []
    for i in range(logs):
        values = [(i, k) for k in range(11)]
        sink.open(i, logs).apply(1, values)
        expected += values
    got = [v for i in range(parallelism)
           for v in read_all(bn.sources.Log(url).open(i, parallelism))]
    assert sorted(got) == sorted(expected)


def test_replayed_apply_appends_a_commit_once(tmp_path):
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(1)
    writer = sink.open(0, 1)
    writer.apply(1, ["a", "b"])
    writer.apply(1, ["a", "b"])
    writer.apply(3, ["c"])
    writer.apply(1, ["a", "b"])  # the runtime re-applies every committed blob on restore
    writer.apply(3, ["c"])
    writer.apply(4, [])
    assert read_log(url) == ["a", "b", "c"]
    fresh = sink.open(0, 1)  # a restarted instance re-applies them all, in order
    for commit, values in [(1, ["a", "b"]), (3, ["c"]), (5, ["d"])]:
        fresh.apply(commit, values)
    assert read_log(url) == ["a", "b", "c", "d"]


@pytest.mark.internal
@pytest.mark.parametrize("crash_point", ["after_marker", "after_half_flushed",
                                         "after_flush"])
def test_crash_inside_apply_does_not_duplicate(tmp_path, crash_point):
    """The failed writer wrote the marker for commit 2 and then died somewhere; the
    restarted instance's replay of commit 2 completes it, once."""
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(1)
    values = [f"v{i}" for i in range(10)]
    crashed = sink.open(0, 1)
    crashed.apply(1, ["first"])
    log = crashed._open()
    crashed._begin(2, log.next_seq, len(values))
    if crash_point == "after_half_flushed":
        log.append_many([(0.0, v) for v in values[:4]])
        log.flush()
    elif crash_point == "after_flush":
        log.append_many([(0.0, v) for v in values])
        log.flush()
    del crashed, log  # the process dies: nothing more of it reaches the store

    restarted = sink.open(0, 1)
    restarted.apply(1, ["first"])
    restarted.apply(2, values)
    restarted.apply(2, values)
    restarted.apply(3, ["last"])
    assert read_log(url) == ["first", *values, "last"]


@pytest.mark.internal
def test_failed_apply_is_finished_by_the_next_one(tmp_path, monkeypatch):
    """The runtime does not retry an apply that raised; the writer finishes it first
    when the next commit point is applied."""
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(1)
    writer = sink.open(0, 1)
    writer.apply(1, ["a"])
    store = writer._store
    real_put = store.put

    def failing_put(key, data):
        if key.startswith("part-"):  # the marker is stored, the values are not
            raise StorageError("store unreachable")
        real_put(key, data)

    monkeypatch.setattr(store, "put", failing_put)
    with pytest.raises(StorageError, match="store unreachable"):
        writer.apply(2, ["b", "c"])
    monkeypatch.undo()
    writer.apply(3, ["d"])
    assert read_log(url) == ["a", "b", "c", "d"]


def test_sink_rejects_values_msgpack_cannot_carry(tmp_path):
    writer = bn.sinks.Log(f"local://{tmp_path}/log").open(0, 1)
    with pytest.raises(TypeError, match=r"sink Log\(.*log'\).*type set"):
        writer.write([1, {2, 3}])


def test_prepare_truncates_the_old_log_and_refuses_foreign_objects(tmp_path):
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(2)
    sink.open(1, 2).apply(1, ["old"])
    sink.prepare(1)
    assert open_store(url).list("") == ["layout"]
    assert read_all(bn.sources.Log(url).open(0, 1)) == []

    open_store(url).put("notes.txt", b"mine")
    with pytest.raises(ValueError, match="not part of a log.*notes.txt"):
        sink.prepare(1)
    assert open_store(url).exists("notes.txt")


def test_bounded_source_stops_at_the_end_it_opened_with_even_after_restore(tmp_path):
    url = f"local://{tmp_path}/log"
    store = open_store(url)
    writer = LogWriter(store, "")  # a plain log, not written by the sink
    writer.append_many([(float(i), i) for i in range(10)])
    writer.flush()
    reader = bn.sources.Log(url, with_ts=True).open(1, 2)  # odd seqs
    assert reader.read(2, 0.0) == [(1.0, 1), (3.0, 3)]
    state = reader.state()
    writer.append_many([(float(i), i) for i in range(10, 20)])
    writer.flush()
    assert read_all(reader) == [(5.0, 5), (7.0, 7), (9.0, 9)]
    restored = bn.sources.Log(url, with_ts=True).open(1, 2)
    restored.restore(state)
    assert read_all(restored) == [(5.0, 5), (7.0, 7), (9.0, 9)]
    assert read_all(bn.sources.Log(url).open(0, 1)) == list(range(20))


def test_follow_source_reads_records_as_they_become_durable(tmp_path):
    url = f"local://{tmp_path}/log"
    writer = LogWriter(open_store(url), "")
    writer.append_many([(0.0, "a"), (0.0, "b")])
    writer.flush()
    source = bn.sources.Log(url, follow=True, poll_interval_s=0.5)
    assert not source.bounded
    reader = source.open(0, 1)
    assert reader.read(10, 100.0) == ["a", "b"]
    writer.append_many([(0.0, "c")])
    writer.flush()
    assert reader.read(10, 100.1) == []  # caught up at 100.0: next look at 100.5
    assert reader.read(10, 100.6) == ["c"]


def test_corrupt_record_error_names_the_log(tmp_path):
    url = f"local://{tmp_path}/log"
    sink = bn.sinks.Log(url)
    sink.prepare(2)
    sink.open(1, 2).apply(1, ["x" * 20, "y" * 20])
    part = tmp_path / "log" / "1" / "part-00000000000000000000"
    data = bytearray(part.read_bytes())
    data[-3] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"Log\('local://.*/log'\), log '1/'.*CRC32"):
        read_all(bn.sources.Log(url).open(1, 2))


def test_source_without_a_log_fails_naming_the_url(tmp_path):
    with pytest.raises(StorageError, match="no log at"):
        bn.sources.Log(f"local://{tmp_path}/nothing").open(0, 1).read(1, 0.0)


def test_round_trip_over_s3(tmp_path, moto_endpoint):
    url = f"s3://bastion-log-io/clicks?endpoint={moto_endpoint}&secure=false"
    storage = f"local://{tmp_path}/jobs"
    written = bn.run(write_topology("log-s3-write", list(range(200)), url, parallelism=2),
                     protocol=bn.protocols.Coordinated(interval_s=0.2), storage=storage)
    committed = written.outputs["log"]
    assert sorted(v["n"] for v in committed) == list(range(200))
    assert read_log(url) == committed
    read = bn.run(read_topology("log-s3-read", url, 1), protocol="coordinated",
                  storage=storage)
    assert read.outputs["out"] == committed


def test_killed_sink_instance_leaves_the_log_exactly_once(tmp_path):
    url = f"local://{tmp_path}/log"
    count = 1000
    topo = bn.Topology("log-drill")
    src = topo.source("src", bn.sources.Generator(lambda k: k, count=count, rate=500))
    src.map("pair", lambda k: [k, k % 7], parallelism=2).sink(
        "log", bn.sinks.Log(url), parallelism=2)
    expected = [(k, k % 7) for k in range(count)]
    report = bn.drill(topo, protocol=bn.protocols.Coordinated(interval_s=0.3),
                      faults=[bn.faults.KillInstance("log", 0, at=0.8)],
                      storage=f"local://{tmp_path}/jobs")
    assert any(e["kind"] == "fault" for e in report.events)
    # a chained sink receives the map's lists as they are (no frame in between)
    assert sorted(map(tuple, report.reference_outputs["log"])) == expected
    assert report.exactly_once, report.verdict_reason
    assert sorted(read_log(url)) == expected
