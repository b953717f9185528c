"""`bastion analyze`: the Spark job over job masters' event logs, checked against a
plain-Python reading of the same logs.

Real jobs run on the session's Ray and leave their events in a local directory or
on moto's S3 server (127.0.0.1); real Spark in local mode (the session's `spark`
fixture) reads them in its tasks. Every figure of the Parquet tables is recomputed
here from `read_events` / `decode_events` without Spark: per-second sums and maxima,
the checkpoints, the failures (detection, restart, recovery and total recovery: the
job master's own ``recovery`` events, one definition for both). Event logs are cut into
many small chunks (``chunk_records``) so that a job's objects spread over several
Spark tasks, and damaged objects must be skipped and named, never loaded.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import bastion as bn
from bastion.runtime.events import EventLimits, decode_events, event_keys, events_prefix, \
    read_events
from bastion.spark_jobs.analyze import AnalyzeError, analyze, find_event_logs
from bastion.storage import CorruptRecordError, open_store

pytestmark = pytest.mark.usefixtures("ray_session")

# Fake credentials for moto, in the environment before Ray and Spark start: the job
# master (a Ray actor) and the Spark tasks open the S3 store in their own processes,
# which inherit it. Same names and values as the other S3 tests of this directory.
os.environ.setdefault("BASTION_S3_ACCESS_KEY", "AKIABASTIONLOGTEST")
os.environ.setdefault("BASTION_S3_SECRET_KEY", "bastion-log-test-secret")

# A few records per stored object: a two-second job leaves several chunks.
SMALL_CHUNKS = bn.Limits(events=EventLimits(chunk_records=8))


def counting(name: str, count: int = 2000, rate: float = 1000) -> bn.Topology:
    topo = bn.Topology(name)
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count,
                                                          rate=rate))
    numbers.key_by(lambda i: i % 3).reduce("count", lambda acc, _: acc + 1, initial=0,
                                           parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def run_two_jobs(storage: str) -> dict[str, str]:
    """A coordinated job killed once and an uncoordinated one without faults;
    their job ids by role."""
    killed = bn.run(counting("analyze-killed"), protocol=bn.protocols.Coordinated(interval_s=0.2),
                    storage=storage,
                    faults=[bn.faults.KillInstance("count", 1, at=1.0)],
                    limits=SMALL_CHUNKS)
    calm = bn.run(counting("analyze-calm"), protocol=bn.protocols.Uncoordinated(interval_s=0.2),
                  storage=storage, limits=SMALL_CHUNKS)
    return {"killed": killed.job_id, "calm": calm.job_id}


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory) -> tuple[str, dict[str, str]]:
    storage = f"local://{tmp_path_factory.mktemp('analyze-store')}"
    return storage, run_two_jobs(storage)


# -- the plain-Python reading ----------------------------------------------------------


def expected_per_second(records: list[dict]) -> dict[int, dict]:
    seconds: dict[int, dict] = defaultdict(lambda: {
        "source_records_per_s": 0, "sink_records_per_s": 0, "source_lag_max": None,
        "latency_p99_ms": None, "progress_points": 0})
    for p in records:
        if p["kind"] != "progress":
            continue
        s = seconds[math.floor(p["t_s"])]
        s["source_records_per_s"] += p["source_records"]
        s["sink_records_per_s"] += p["sink_records"]
        s["source_lag_max"] = max(s["source_lag_max"] or 0, p["source_lag"])
        if p["latency_p99_ms"] is not None:
            s["latency_p99_ms"] = max(s["latency_p99_ms"] or 0.0, p["latency_p99_ms"])
        s["progress_points"] += 1
    return dict(seconds)


def expected_checkpoints(records: list[dict]) -> list[tuple]:
    return sorted((e["checkpoint_id"], e.get("task"), e["duration_s"], e["state_bytes"])
                  for e in records if e["kind"] == "checkpoint_completed")


def check_job(analysis, job: str, records: list[dict], objects: int,
              skipped: int = 0, complete: bool = True, failures: bool = True) -> None:
    """The tables of ``analysis`` for ``job`` against ``records`` (the job's event log
    as plain Python decodes it)."""
    [summary] = [j for j in analysis.tables["jobs"] if j["job"] == job]
    progress = [p for p in records if p["kind"] == "progress"]
    assert progress, "the job recorded no progress: nothing would be compared"
    assert (summary["objects"], summary["skipped_objects"], summary["complete"]) == (
        objects, skipped, complete)

    # per second: sums, maxima and counts of the progress points of each second
    rows = {r["second"]: r for r in analysis.tables["per_second"] if r["job"] == job}
    expected = expected_per_second(records)
    assert sorted(rows) == sorted(expected)
    for second, want in expected.items():
        got = rows[second]
        assert {k: got[k] for k in want} == pytest.approx(want), second
        p50s = [p["latency_p50_ms"] for p in progress if math.floor(p["t_s"]) == second
                and p["latency_p50_ms"] is not None]
        if p50s:
            assert min(p50s) <= got["latency_p50_ms"] <= max(p50s)
    sink_total = sum(p["sink_records"] for p in progress)
    assert sum(r["sink_records_per_s"] for r in rows.values()) == sink_total
    assert summary["sink_records"] == sink_total
    assert summary["source_records"] == sum(p["source_records"] for p in progress)

    # checkpoints: every completed one, with its duration and size
    got_checkpoints = sorted((c["checkpoint_id"], c["task"], c["duration_s"],
                              c["state_bytes"])
                             for c in analysis.tables["checkpoints"] if c["job"] == job)
    assert got_checkpoints == expected_checkpoints(records)
    assert summary["checkpoints"] == len(got_checkpoints)
    if not failures:
        return

    # failures: the job master's recovery events, the injected faults, the timeline
    recoveries = [e for e in records if e["kind"] == "recovery"]
    faults = [e for e in records if e["kind"] == "fault"]
    got_failures = sorted((f for f in analysis.tables["failures"] if f["job"] == job),
                          key=lambda f: f["failure"])
    assert len(got_failures) == len(recoveries) == summary["failures"]
    # the same figures as the job master's (one definition: runtime.recovery_times),
    # though analyze reads every stored point and the job master its kept ones
    for got, recovery in zip(got_failures, recoveries):
        assert got["detected_at_s"] == recovery["detected_at_s"]
        assert got["restart_s"] == pytest.approx(recovery["restart_s"])
        [fault] = [f for f in faults if f["t_s"] <= recovery["detected_at_s"]][-1:]
        assert got["fault"] == fault["what"]
        assert got["detection_s"] == pytest.approx(recovery["detected_at_s"] - fault["t_s"])
        assert recovery["failed_at_s"] == pytest.approx(fault["t_s"])
        for figure in ("detection_s", "recovery_s", "trt_s"):
            assert got[figure] == (None if recovery[figure] is None
                                   else pytest.approx(recovery[figure])), figure


def check_against_events(analysis, storage: str, jobs: dict[str, str]) -> None:
    store = open_store(storage)
    assert sorted(j["job"] for j in analysis.tables["jobs"]) == sorted(jobs.values())
    for job in jobs.values():
        keys, complete = event_keys(store.list(events_prefix(job)), job)
        assert complete and len(keys) > 2, "the log should span several objects"
        check_job(analysis, job, read_events(store, job), objects=len(keys))
    failures = [f["job"] for f in analysis.tables["failures"]]
    assert failures.count(jobs["killed"]) >= 1 and jobs["calm"] not in failures
    assert analysis.skipped == [] and analysis.incomplete == []
    page = analysis.report_path.read_text()
    assert all(job in page for job in jobs.values())
    assert page.count("<img src=\"data:image/png;base64,") >= 4


# -- tests -----------------------------------------------------------------------------


def test_two_local_jobs_match_a_plain_reading_of_their_events(spark, local_runs, tmp_path):
    storage, jobs = local_runs
    store = open_store(storage)
    analysis = analyze(spark, store, find_event_logs(store), tmp_path / "out")
    check_against_events(analysis, storage, jobs)
    # the Parquet files hold what the analysis returned
    for name, rows in analysis.tables.items():
        stored = spark.read.parquet(str(analysis.table_path(name))).collect()
        assert sorted(map(repr, (r.asDict() for r in stored))) == sorted(map(repr, rows))


def test_two_jobs_on_s3_match_a_plain_reading_of_their_events(spark, moto_endpoint,
                                                              tmp_path):
    storage = f"s3://bastion-analyze/runs?endpoint={moto_endpoint}&secure=false"
    jobs = run_two_jobs(storage)
    store = open_store(storage)
    # only these two (the bucket may hold others): --job, in any order
    logs = find_event_logs(store, [jobs["calm"], jobs["killed"]])
    analysis = analyze(spark, store, logs, tmp_path / "out")
    check_against_events(analysis, storage, jobs)
    assert os.environ["BASTION_S3_SECRET_KEY"] not in analysis.report_path.read_text()


def test_damaged_objects_are_skipped_and_named_and_a_missing_final_object_reported(
        spark, local_runs, tmp_path):
    storage, jobs = local_runs
    source = open_store(storage)
    damaged_dir = tmp_path / "damaged"
    for job in jobs.values():
        shutil.copytree(Path(source.url.removeprefix("local://")) / "jobs" / job / "events",
                        damaged_dir / "jobs" / job / "events")
    damaged = open_store(f"local://{damaged_dir}")
    killed_keys, _ = event_keys(damaged.list(events_prefix(jobs["killed"])), jobs["killed"])
    garbage_key, torn_key = killed_keys[1], killed_keys[2]
    garbage = damaged_dir / garbage_key
    garbage.write_bytes(b"\xc1" + garbage.read_bytes()[1:])  # 0xc1: never valid msgpack
    torn = damaged_dir / torn_key
    torn.write_bytes(torn.read_bytes()[:-3])                   # half a record at the end
    calm_keys, _ = event_keys(damaged.list(events_prefix(jobs["calm"])), jobs["calm"])
    (damaged_dir / calm_keys[-1]).unlink()                     # the final object

    # plain Python refuses the damaged log rather than load part of a record
    with pytest.raises(CorruptRecordError, match=garbage_key):
        read_events(damaged, jobs["killed"])

    analysis = analyze(spark, damaged, find_event_logs(damaged), tmp_path / "out")
    assert {s.key: s.job for s in analysis.skipped} == {garbage_key: jobs["killed"],
                                                        torn_key: jobs["killed"]}
    reasons = {s.key: s.reason for s in analysis.skipped}
    assert "corrupt" in reasons[garbage_key] and "truncated" in reasons[torn_key]
    assert analysis.incomplete == [jobs["calm"]]
    # what was analysed is exactly the undamaged objects
    good = [r for key in killed_keys if key not in (garbage_key, torn_key)
            for r in decode_events(damaged.get(key), key)]
    check_job(analysis, jobs["killed"], good, objects=len(killed_keys), skipped=2,
              failures=False)
    calm = [r for key in calm_keys[:-1] for r in decode_events(damaged.get(key), key)]
    check_job(analysis, jobs["calm"], calm, objects=len(calm_keys) - 1, complete=False)
    assert garbage_key in analysis.report_path.read_text()


def test_a_job_that_is_not_in_the_store_is_named(local_runs, tmp_path, capsys):
    from bastion.cli import main

    storage, jobs = local_runs
    with pytest.raises(AnalyzeError, match="'no-such-job'") as error:
        find_event_logs(open_store(storage), [jobs["calm"], "no-such-job"])
    assert jobs["killed"] in str(error.value)  # what is there instead
    # the command line says so in one line, exit 2, before any Spark starts
    code = main(["analyze", "--storage", storage, "--job", "no-such-job",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "'no-such-job'" in err
    assert not (tmp_path / "out").exists()


def test_without_java_spark_setup_fails_with_one_sentence(tmp_path):
    python = sys.executable
    no_java = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    no_java["PATH"] = str(tmp_path / "nowhere")
    command = [python, "-m", "bastion.cli", "analyze", "--storage", f"local://{tmp_path}",
               "--out", str(tmp_path / "out")]
    done = subprocess.run(command, env=no_java, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "Spark needs Java" in done.stderr and "install a Java runtime" in done.stderr
    # the library raises the same, before any JVM is started
    done = subprocess.run([python, "-c", "from bastion.spark_jobs.session import "
                           "build_session; build_session()"], env=no_java,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        "bastion.spark_jobs.session.SparkSetupError: Spark needs Java")
    # a JAVA_HOME without a java in it is named
    bad_home = dict(no_java, JAVA_HOME=str(tmp_path))
    done = subprocess.run(command, env=bad_home, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and f"JAVA_HOME={tmp_path} has no bin/java" in done.stderr


@pytest.mark.slow
def test_the_command_prints_a_summary_and_writes_tables_and_report(local_runs, tmp_path):
    """The whole command in its own process: its own SparkSession, started and
    stopped by the command."""
    storage, jobs = local_runs
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "bastion.cli", "analyze", "--storage",
                           storage, "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # quiet: no JVM notices, no Spark log lines
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["job", "duration", "sink", "received"]
    assert {line.split()[0] for line in lines[2:4]} == set(jobs.values())
    assert f"report: {out / 'report.html'}" in lines
    for name in ("jobs", "per_second", "checkpoints", "failures"):
        assert list((out / f"{name}.parquet").glob("part-*.parquet"))
