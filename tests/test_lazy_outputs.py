"""Outputs that stay in the store: File and Log sinks' committed records are read
lazily, and neither `bn.run` nor `bastion run` loads them into the driver.

A ``File`` or ``Log`` sink sends its records out of the job, perhaps far more of them
than the driver could hold, so `RunResult.outputs[sink]` (and ``output_ids[sink]``)
is a `CommittedOutputs`: ``len()`` from the commit records, records streamed from the
store part by part. ``Collect`` keeps its list. The memory targets are measured in a
subprocess, whose peak RSS is the driver's alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import bastion as bn
from bastion.runtime.durable import DurableCodec
from bastion.runtime.outputs import (CommittedOutputs, committed_outputs, encode_part,
                                     encode_staged, marker_key, part_key, part_ref,
                                     read_committed, staged_key)
from bastion.storage import open_store

pytestmark = pytest.mark.usefixtures("ray_session")

SPILL = 40  # records a sink instance holds before it writes a part


def numbers(name: str, count: int, sink: bn.sinks.Sink, parallelism: int = 1
            ) -> bn.Topology:
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Collection(range(count)))
    src.map("pair", lambda v: (v, v * v), parallelism=parallelism).sink(
        "out", sink, parallelism=parallelism)
    return topo


class CountingStore:
    """A store that remembers which keys were read (everything else passes through)."""

    def __init__(self, store: Any):
        self._store = store
        self.read: list[str] = []

    def get(self, key: str, *args: Any, **kwargs: Any) -> bytes:
        self.read.append(key)
        return self._store.get(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_log_outputs_are_lazy_and_equal_the_committed_records(tmp_path):
    storage = f"local://{tmp_path}/jobs"
    result = bn.run(numbers("lazy-log", 500, bn.sinks.Log(f"local://{tmp_path}/log"), 2),
                    protocol=bn.protocols.Coordinated(interval_s=0.1), storage=storage,
                    limits=bn.Limits(sink_spill_records=SPILL), lineage=True)
    out, ids = result.outputs["out"], result.output_ids["out"]
    assert isinstance(out, CommittedOutputs) and isinstance(ids, CommittedOutputs)
    values, stored_ids = read_committed(open_store(storage), result.job_id, "out")
    assert len(out) == len(values) == 500 and len(ids) == len(stored_ids) == 500
    assert out == values and values == out and list(ids) == stored_ids
    assert sorted(out) == [(v, v * v) for v in range(500)]
    # indexing reads the part that holds the record; slices and negative indices too
    assert [out[i] for i in (0, 39, 40, 41, 250, 499, -1, -500)] == [
        values[i] for i in (0, 39, 40, 41, 250, 499, -1, -500)]
    assert out[37:123:5] == values[37:123:5] and out[-3:] == values[-3:]
    assert out[1000:] == []
    with pytest.raises(IndexError, match="committed 500"):
        out[500]
    assert (7, 49) in out and out != values[:-1] and out != values[::-1]
    assert "500 committed records of sink 'out'" in repr(out)


def test_file_outputs_are_lazy_and_collect_keeps_its_list(tmp_path):
    storage = f"local://{tmp_path}/jobs"
    topo = bn.Topology("lazy-file")
    src = topo.source("src", bn.sources.Collection(range(300)))
    src.sink("file", bn.sinks.File(tmp_path / "out.jsonl"))
    src.map("copy", lambda v: v).sink("kept", bn.sinks.Collect())
    result = bn.run(topo, storage=storage, limits=bn.Limits(sink_spill_records=SPILL))
    assert isinstance(result.outputs["file"], CommittedOutputs)
    assert result.outputs["file"] == list(range(300))
    assert type(result.outputs["kept"]) is list and result.outputs["kept"] == list(range(300))
    assert (tmp_path / "out.jsonl").read_text().split() == [str(v) for v in range(300)]


def test_length_comes_from_the_commit_records_not_from_the_parts(tmp_path):
    storage = f"local://{tmp_path}/jobs"
    result = bn.run(numbers("lazy-count", 1010, bn.sinks.Log(f"local://{tmp_path}/log")),
                    storage=storage, limits=bn.Limits(sink_spill_records=SPILL),
                                                      data_plane=bn.DataPlane(source_batch_records=10))
    store = CountingStore(open_store(storage))
    values, _ = committed_outputs(store, result.job_id, "out")
    assert len(values) == 1010
    assert store.read and not any("/part-" in key for key in store.read)
    store.read.clear()
    assert values[SPILL * 3 + 1] == (SPILL * 3 + 1, (SPILL * 3 + 1) ** 2)
    assert len(store.read) == 1 and "/part-" in store.read[0]  # that part alone
    store.read.clear()
    assert sum(1 for _ in values) == 1010
    # every part once, and the commit blob (for its own 10 records)
    parts = [k for k in open_store(storage).list(f"jobs/{result.job_id}/outputs/out/")
             if "/part-" in k]
    assert len(parts) > 1
    assert sorted(store.read) == sorted(set(store.read)) and len(store.read) == len(parts) + 1


def test_counts_blobs_written_by_hand_and_part_references_without_counts(tmp_path):
    """Commit blobs as a worker writes them, with tuples (durable blobs mark them) and
    lineage ids; a part reference of the older form ``(key, crc)`` is counted by
    reading the header of its part."""
    store = open_store(f"local://{tmp_path}")
    codec = DurableCodec()
    refs = []
    for n, chunk in enumerate([[(i, "x") for i in range(5)], [(i, "y") for i in range(3)]]):
        key = part_key("job", "out", 0, 0, n)
        blob = encode_part(codec, chunk, [("id", i) for i in range(len(chunk))])
        store.put(key, blob)
        refs.append(part_ref(key, blob) if n == 0 else part_ref(key, blob)[:2])
    store.put(staged_key("job", "out", 0, 7),
              encode_staged(codec, [(9, "z")], [("id", 9)], refs))
    store.put(staged_key("job", "out", 0, 8), encode_staged(codec, [(10, "u")], None, []))
    store.put(staged_key("job", "out", 0, 9), encode_staged(codec, [(99, "never")], None, []))
    for commit in (7, 8):  # commit point 9 never completed
        store.put(marker_key("job", commit), b"")
    values, ids = committed_outputs(store, "job", "out")
    assert len(values) == 10 and values[-1] == (10, "u") and values[5] == (0, "y")
    assert values == read_committed(store, "job", "out")[0]
    assert list(ids[:9]) == [("id", i) for i in (0, 1, 2, 3, 4, 0, 1, 2, 9)]
    with pytest.raises(ValueError, match="stored without lineage ids"):
        ids[9]


# -- the driver's memory -------------------------------------------------------------------

RSS_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import bastion as bn

    storage, url = sys.argv[1], sys.argv[2]
    report = {}
    for n in map(int, sys.argv[3:]):
        topo = bn.Topology(f"lazy-rss-{n}")
        topo.source("gen", bn.sources.Generator(int, n)).sink("log", bn.sinks.Log(url))
        out = bn.run(topo, storage=storage).outputs["log"]
        report[n] = {"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                     "type": type(out).__name__, "len": len(out), "last": out[-1]}
    print(json.dumps(report))
""")

CLI_SCRIPT = textwrap.dedent("""
    import contextlib, io, json, resource, sys
    from bastion.cli import main

    storage, *jobs = sys.argv[1:]
    report = {}
    for job in jobs:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = main(["run", job, "--storage", storage, "--show", "2"])
        report[job] = {"code": code, "printed": printed.getvalue(),
                       "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(report))
""")

JOB_FILE = textwrap.dedent("""
    import bastion as bn

    topology = bn.Topology("lazy-cli-{n}")
    topology.source("gen", bn.sources.Generator(int, {n})).sink(
        "log", bn.sinks.Log("local://{log}"))
""")

SMALL, LARGE = 5_000, 5_000_000
MARGIN_MIB = 100


def _start(tmp_path: Path, script: str, *args: str) -> subprocess.Popen:
    """``script`` in a fresh interpreter (its own Ray and its own peak RSS)."""
    path = tmp_path / "measure.py"
    path.write_text(script)
    return subprocess.Popen([sys.executable, str(path), *args], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _json(process: subprocess.Popen) -> dict:
    """The JSON ``process`` prints last."""
    out, err = process.communicate(timeout=240)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """Both measurements, each in a process of its own, side by side: a peak RSS is
    the process's own, and two 5 M-record jobs one after the other cost ~35 s of a
    2-core suite."""
    api, cli = tmp_path_factory.mktemp("api"), tmp_path_factory.mktemp("cli")
    jobs = []
    for n in (SMALL, LARGE):
        job = cli / f"lazy_cli_{n}.py"
        job.write_text(JOB_FILE.format(n=n, log=cli / f"log-{n}"))
        jobs.append(str(job))
    running = {"api": _start(api, RSS_SCRIPT, f"local://{api}/jobs", f"local://{api}/log",
                             str(SMALL), str(LARGE)),
               "cli": _start(cli, CLI_SCRIPT, f"local://{cli}/jobs", *jobs)}
    return {"jobs": jobs, **{name: _json(process) for name, process in running.items()}}


def test_a_5m_record_log_job_does_not_grow_the_driver(measured):
    """The driver's peak RSS after a job that wrote 5 M records to a Log sink stays
    within 100 MiB of its peak after a 5 k-record job (read eagerly, 5 M ints alone
    took ~230 MiB more). Both jobs run in one fresh process, the small one first."""
    report = measured["api"]
    small, large = report[str(SMALL)], report[str(LARGE)]
    print(f"bn.run peak RSS: {small['peak_mib']:.1f} MiB after {SMALL:,} records, "
          f"{large['peak_mib']:.1f} MiB after {LARGE:,}")
    assert large["type"] == "CommittedOutputs"
    assert (large["len"], large["last"]) == (LARGE, LARGE - 1)
    assert large["peak_mib"] - small["peak_mib"] < MARGIN_MIB


def test_bastion_run_prints_the_count_of_a_5m_record_log_without_loading_it(measured):
    jobs, report = measured["jobs"], measured["cli"]
    small, large = report[jobs[0]], report[jobs[1]]
    print(f"bastion run peak RSS: {small['peak_mib']:.1f} MiB after {SMALL:,} records, "
          f"{large['peak_mib']:.1f} MiB after {LARGE:,}")
    assert small["code"] == large["code"] == 0
    assert "log: 5,000,000 committed records, first ones:\n  0\n  1\n" in large["printed"]
    assert large["peak_mib"] - small["peak_mib"] < MARGIN_MIB
