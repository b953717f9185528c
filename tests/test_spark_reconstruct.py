"""`bastion reconstruct`: the Spark job that rebuilds an operator's eventual checkpoints
(`bastion.spark_jobs.reconstruct`), checked against the in-process Python path
(`eventual.read_eventual_checkpoint`) on the same logs.

The logs are real: the plain-Python window/reduce model of
``tests/test_eventual_checkpoint.py`` (`run_model`) produces the records a CEC operator
writes — results, ``G_open``, ``G_check``, ``closed`` — and a real `LogWriter` stores
them under ``jobs/<job>/logs/<operator>/<instance>/``, in many append calls and
flushes, so that a log has sealed segments and parts. The instances of one operator
have different shapes (windowed and reduce, one or two sources, segments of 600 bytes
to 50 kB), and each burst stores its parts in one of the two layouts at random (runs,
as a running operator writes them, or arrays of items), so the job reads both; on a
local directory and on moto's S3 server (127.0.0.1). Real Spark in
local mode (the session's `spark` fixture) reads them in its tasks.

The check is equality of ``to_wire()``: every part's footprint (kind, seq, state,
position, watermark), the closed parts, N, the extent, the skipped control tuples,
completeness. The model's own bookkeeping anchors it to the truth (N is the number of
parts the model holds), and a test shows the comparison fails for a checkpoint that
is not the instance's own. Damage — a torn tail, a byte flipped in a sealed segment —
is reported with the object and offset, never loaded, and the checkpoint is still the
Python path's.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bastion.protocols.eventual import (load_eventual_checkpoint, read_eventual_checkpoint,
                                        store_eventual_checkpoint)
from bastion.spark_jobs.reconstruct import (ReconstructError, eventual_prefix, log_prefix,
                                            reconstruct_operator)
from bastion.storage import CorruptRecordError, LocalStore, open_store
from bastion.storage.log import LogWriter, log_object_keys
from test_eventual_checkpoint import dec, run_model

# Fake credentials for moto, in the environment before Spark starts: the Spark tasks
# open the S3 store in their own Python workers, which inherit it. Same names and
# values as the other Spark test module's.
os.environ.setdefault("BASTION_S3_ACCESS_KEY", "AKIABASTIONLOGTEST")
os.environ.setdefault("BASTION_S3_SECRET_KEY", "bastion-log-test-secret")

JOB = "cec-test"
OP = "window"

# (seed, inputs, sources, keys, windowed, max_segment_bytes): one operator instance each
SHAPES = [
    (1, 600, 2, 12, True, 2_000),     # windows, two interleaved sources, small segments
    (2, 400, 1, 8, False, 50_000),    # reduce: one big open segment of parts
    (3, 800, 1, 4, True, 600),        # windows, tiny segments: many objects
    (4, 600, 2, 30, False, 5_000),    # reduce over many keys, two sources
]


def write_instance(store, prefix: str, records: list, segment_bytes: int) -> None:
    """``records`` (``(ts, value)``) through a real `LogWriter`, in append calls of 37
    records and a flush after every third: sealed segments, then parts."""
    writer = LogWriter(store, prefix, max_segment_bytes=segment_bytes, block_bytes=256)
    for n, i in enumerate(range(0, len(records), 37)):
        writer.append_many(records[i:i + 37])
        if n % 3 == 0:
            writer.flush()
    writer.close()


def write_operator(store, shapes=SHAPES, job: str = JOB, op: str = OP) -> dict[str, object]:
    """One instance per shape; the model of each (its true state at the log's end)."""
    models = {}
    for instance, (seed, n, sources, keys, windowed, segment_bytes) in enumerate(shapes):
        model, *_ = run_model(seed, n, sources, keys, windowed, crash_at=n)
        write_instance(store, log_prefix(job, op, str(instance)), model.records,
                       segment_bytes)
        models[str(instance)] = model
    return models


def python_ecs(store, instances, at=None, job: str = JOB, op: str = OP) -> dict:
    return {i: read_eventual_checkpoint(store, log_prefix(job, op, i), at)[0].to_wire()
            for i in instances}


@pytest.fixture(scope="module", params=["local", "s3"])
def logs(request, tmp_path_factory):
    """The operator's logs on a local directory or on moto's S3, with the models."""
    if request.param == "local":
        store = open_store(f"local://{tmp_path_factory.mktemp('cec-store')}")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        store = open_store(f"s3://bastion-cec/logs?endpoint={endpoint}&secure=false")
    models = write_operator(store)
    yield store, models
    store.close()


def test_the_spark_ec_is_the_python_ec_for_every_instance_and_loads_back(spark, logs):
    store, models = logs
    found = reconstruct_operator(spark, store, JOB, OP)
    assert [r.instance for r in found] == ["0", "1", "2", "3"]
    expected = python_ecs(store, models)
    for r in found:
        model = models[r.instance]
        # anchored to the truth: N and the parts are the model's open parts
        assert r.ec.complete and r.ec.n_open == len(model.parts) > 0
        assert {tuple(dec(p)) for p in r.ec.parts} == set(model.parts)
        assert r.ec.seq == len(model.records) - 1 and r.damaged == []
        assert r.ec.to_wire() == expected[r.instance]
        # written where a restart looks, and it loads back the same
        assert r.key == eventual_prefix(JOB, OP, r.instance) + f"ec-{r.ec.seq:020d}"
        loaded = load_eventual_checkpoint(store, eventual_prefix(JOB, OP, r.instance))
        assert loaded is not None and loaded.to_wire() == expected[r.instance]
    # the shapes differ where it matters: objects per log, extents, sources
    assert len({r.objects for r in found}) > 1 and len({r.ec.extent_records for r in found}) > 1
    assert {len(r.ec.replay_from) for r in found} == {1, 2}


def test_the_spark_ec_at_earlier_times_is_the_python_ec_then(spark, logs):
    store, models = logs
    # log times inside every log, and one before any record (nothing to restore)
    for at in (-1.0, 0.73, 1.9, 3.05):
        found = reconstruct_operator(spark, store, JOB, OP, at=at, write=False)
        expected = python_ecs(store, models, at)
        assert {r.instance: r.ec.to_wire() for r in found} == expected
        if at < 0:
            assert all(r.empty and r.key is None for r in found)
        else:
            assert all(not r.empty and r.key is None for r in found)
            assert all(r.ec.seq < len(models[r.instance].records) - 1 for r in found)


def test_the_equality_check_can_fail(spark, logs):
    """Another instance's EC, or one at another time, is told apart: the comparison
    is not vacuous."""
    store, models = logs
    found = {r.instance: r.ec.to_wire()
             for r in reconstruct_operator(spark, store, JOB, OP, write=False)}
    expected = python_ecs(store, models)
    for i in found:
        for j in expected:
            assert (found[i] == expected[j]) == (i == j)
    earlier = python_ecs(store, models, at=1.9)
    assert all(found[i] != earlier[i] for i in found)


def record_offsets(data: bytes) -> dict[int, int]:
    """seq -> byte offset of each record of a log object (read by hand, not by the
    code under test)."""
    offsets, off = {}, 0
    while off + 8 <= len(data):
        length, _ = struct.unpack_from("<II", data, off)
        seq = msgpack.unpackb(data[off + 8:off + 8 + length], strict_map_key=False)[0]
        offsets[seq] = off
        off += 8 + length
    return offsets


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_torn_tail_and_a_corrupt_record_are_reported_and_never_loaded(
        spark, where, tmp_path, request):
    if where == "local":
        store = open_store(f"local://{tmp_path}")
    else:
        endpoint = request.getfixturevalue("moto_endpoint")
        store = open_store(f"s3://bastion-cec/damaged-{tmp_path.name}?endpoint={endpoint}"
                           "&secure=false")
    models = write_operator(store, SHAPES[:3])
    clean = reconstruct_operator(spark, store, JOB, OP, write=False)

    # instance 0: its last object cut short by 3 bytes (a torn tail)
    torn_key = log_object_keys(store, log_prefix(JOB, OP, "0"))[-1]
    torn_data = store.get(torn_key)
    store.put(torn_key, torn_data[:-3])
    torn_at = max(record_offsets(torn_data).values())

    # instance 2: a byte flipped in the newest footprint that lies in a sealed segment
    ec2 = clean[2].ec
    located = []
    for key in log_object_keys(store, log_prefix(JOB, OP, "2")):
        if "/seg-" in key:
            offsets = record_offsets(store.get(key))
            located += [(f.seq, key, offsets[f.seq]) for f in ec2.parts.values()
                        if f.seq in offsets]
    victim, victim_key, victim_at = max(located)
    data = bytearray(store.get(victim_key))
    data[victim_at + 12] ^= 0xFF
    store.put(victim_key, bytes(data))

    found = {r.instance: r for r in reconstruct_operator(spark, store, JOB, OP)}
    expected = python_ecs(store, models)
    assert {i: r.ec.to_wire() for i, r in found.items()} == expected

    [torn] = found["0"].damaged
    assert (torn.key, torn.offset) == (torn_key, torn_at) and torn.why.startswith("torn")
    assert found["0"].ec.seq == len(models["0"].records) - 2  # the cut record is gone

    [corrupt] = found["2"].damaged
    assert (corrupt.key, corrupt.offset, corrupt.why) == (victim_key, victim_at,
                                                          "CRC32 mismatch")
    assert victim not in {f.seq for f in found["2"].ec.parts.values()}  # never loaded
    # the same damage as the Python path's salvage, which read the whole log too
    assert read_eventual_checkpoint(store, log_prefix(JOB, OP, "2"))[1] == [corrupt]
    assert found["1"].damaged == [] and found["1"].ec.to_wire() == clean[1].ec.to_wire()
    # the written EC is the damaged log's, and still loads
    loaded = load_eventual_checkpoint(store, eventual_prefix(JOB, OP, "2"))
    assert loaded is not None and loaded.to_wire() == expected["2"]
    store.close()


def test_a_stored_ec_that_fails_its_crc_is_never_loaded(tmp_path):
    model, *_ = run_model(9, 300, 2, 5, True, crash_at=300)
    store = open_store(f"local://{tmp_path}")
    write_instance(store, "log/", model.records, 2_000)
    ec, _ = read_eventual_checkpoint(store, "log/")
    key = store_eventual_checkpoint(store, "ec/", ec)
    assert load_eventual_checkpoint(store, "ec/", ec.seq).to_wire() == ec.to_wire()
    assert load_eventual_checkpoint(store, "ec/", ec.seq - 1) is None
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0x01
    store.put(key, bytes(data))
    with pytest.raises(CorruptRecordError, match="CRC32"):
        load_eventual_checkpoint(store, "ec/")


shapes = st.lists(st.tuples(st.integers(0, 10_000), st.integers(20, 500), st.integers(1, 2),
                            st.integers(1, 12), st.booleans(),
                            st.sampled_from([600, 2_000, 50_000])), min_size=1, max_size=3)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes=shapes, at=st.one_of(st.none(), st.floats(0, 3)))
def test_any_shape_gives_the_python_ec(spark, tmp_path_factory, shapes, at):
    store = open_store(f"local://{tmp_path_factory.mktemp('shape')}")
    models = write_operator(store, shapes, job="prop")
    found = reconstruct_operator(spark, store, "prop", OP, at=at, write=False)
    assert {r.instance: r.ec.to_wire() for r in found} == python_ecs(store, models, at, "prop")


def test_an_operator_without_a_log_is_named_with_those_that_have_one(spark, tmp_path):
    store = open_store(f"local://{tmp_path}")
    write_operator(store, SHAPES[:1])
    with pytest.raises(ReconstructError, match=r"no log of operator 'nope'.*: window"):
        reconstruct_operator(spark, store, JOB, "nope")


class _TasksElsewhere(LocalStore):
    """A store the driver lists here while its URL, the only thing the tasks get, sends
    them to another directory: there, the objects can fail to read."""

    def __init__(self, root: Path, tasks_root: Path) -> None:
        super().__init__(root)
        self._tasks_url = f"local://{tasks_root}"

    @property
    def url(self) -> str:
        return self._tasks_url


def test_an_object_the_tasks_cannot_read_fails_the_job_naming_the_first(spark, tmp_path):
    """A read that fails under a task (not a missing part: the store itself) stops
    the job with the object and the reason; with several, the first in log order is
    named, whichever task met its failure first."""
    store = _TasksElsewhere(tmp_path / "lists", tmp_path / "reads")
    write_operator(store, SHAPES[:3])
    shutil.copytree(tmp_path / "lists", tmp_path / "reads")
    first, later = (log_object_keys(store, log_prefix(JOB, OP, i))[0] for i in ("0", "2"))
    for key in (later, first):  # a symlink to itself: reading it is ELOOP, an OSError
        path = tmp_path / "reads" / key
        path.unlink()
        path.symlink_to(path)
    with pytest.raises(ReconstructError, match=rf"cannot read {re.escape(first)} from "
                       rf"local://.*reads: .*symbolic links"):
        reconstruct_operator(spark, store, JOB, OP, write=False)


def test_the_job_imports_no_ray():
    """What a Spark worker loads to run the tasks: the store and the CEC format, not
    Ray or the runtime that drives a job."""
    done = subprocess.run([sys.executable, "-c",
                           "import sys, bastion.spark_jobs.reconstruct; "
                           "print(sorted(m for m in sys.modules if m == 'ray' or "
                           "m.startswith(('ray.', 'bastion.scheduler', 'bastion.launcher', "
                           "'bastion.drills', 'bastion.runtime.job', "
                           "'bastion.runtime.instance'))))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_command_prints_each_instance_and_writes_its_ec(tmp_path):
    store = open_store(f"local://{tmp_path / 'store'}")
    models = write_operator(store)
    command = [sys.executable, "-m", "bastion.cli", "reconstruct", "--storage",
               f"local://{tmp_path / 'store'}", "--job", JOB, "--operator", OP,
               "--master", "local[1]"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr
    expected = python_ecs(store, models)
    lines = done.stdout.splitlines()
    assert lines[0] == f"eventual checkpoints of {JOB}/{OP} at the end of each log:"
    for instance, wire in expected.items():
        [row] = [line.split() for line in lines if line.startswith(f"{instance} ")]
        assert row[3:5] == [f"{wire['n_open']:,}", f"{wire['extent_records']:,}"]
        key = eventual_prefix(JOB, OP, instance) + f"ec-{wire['seq']:020d}"
        assert f"instance {instance}: {key}" in lines
        assert load_eventual_checkpoint(store, eventual_prefix(JOB, OP, instance)
                                        ).to_wire() == wire
    # a wrong operator: one line naming the ones there are, before Spark starts
    done = subprocess.run(command[:-4] + ["--operator", "nope"], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (f"bastion: no log of operator 'nope' of job '{JOB}' in "
                                   f"{store.url}: operators with logs in that job: {OP}")
