"""Bastion on a real three-node Ray cluster on this machine, as the README runs it.

A head and two worker nodes, each its own ``ray start`` process on 127.0.0.1 with a
private temp dir and ports (`tests/local_cluster.py`), an S3 server on loopback
(moto's ``moto_server``), and the ``bastion`` command line joining from outside with
``--address`` and ``--storage s3://...``; credentials only in the environment. The
test session's own Ray is never touched: the cluster is torn down by killing the
processes it started, never by ``ray stop``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_cluster import BIN, REPO, LocalCluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORDCOUNT = str(REPO / "examples" / "wordcount.py")


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(workers=2) as c:
        yield c


def bastion(cluster: LocalCluster, *args: str, timeout_s: float = 300) -> \
        subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "bastion"), *args], env=cluster.env(), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


def _listening(pids: set[int]) -> list[str]:
    """The local addresses the processes ``pids`` listen on (TCP)."""
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            # gRPC listens on IPv6 sockets: 127.0.0.1 shows as [::ffff:127.0.0.1]
            found.append(line.split()[3].replace("[::ffff:", "").replace("]", ""))
    return found


def test_three_nodes_each_a_ray_start_process_all_on_loopback(cluster):
    assert cluster.nodes() == 3
    addresses = _listening(cluster.pids())
    assert any(a.endswith(f":{cluster.gcs_port}") for a in addresses), addresses
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses


def test_run_against_the_cluster_commits_to_s3(cluster):
    done = bastion(cluster, "run", WORDCOUNT, "--protocol", "coordinated",
                   "--address", cluster.address,
                   "--storage", cluster.storage("bastion-cluster", "run"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    committed = re.search(r"^out: ([\d,]+) committed records", done.stdout, re.M)
    assert committed and int(committed.group(1).replace(",", "")) > 0, done.stdout
    assert "secret" not in done.stdout + done.stderr  # no credentials echoed


def test_losing_a_whole_worker_node_of_three_is_exactly_once_on_s3(cluster):
    done = bastion(cluster, "drill", WORDCOUNT, "--protocol", "coordinated",
                   "--kill-node", "1@2", "--address", cluster.address,
                   "--storage", cluster.storage("bastion-cluster", "drill"),
                   "--html", str(Path(cluster.temp_dir) / "drill.html"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"verdict\s+exactly-once", done.stdout), done.stdout
    # the kill landed on the processes of the job on node 1: a worker slot
    assert re.search(r"killed[^\n]*worker", done.stdout), done.stdout
    # the faulty run's master exported the failure and the restart it recovered by
    # (its pooled process lives on; its series reach the endpoint within a push)
    faulty = re.search(r"faulty (\S+);", done.stdout).group(1)
    wanted = ("ray_bastion_failures_total", "ray_bastion_restarts_total",
              "ray_bastion_restart_seconds_count")
    values: dict[str, float] = {}
    for _ in range(40):
        values = _values(cluster.metrics_text(), faulty)
        if all(values.get(name, 0) >= 1 for name in wanted):
            break
        time.sleep(0.5)
    assert all(values.get(name, 0) >= 1 for name in wanted), values


def _values(text: str, job_id: str) -> dict[str, float]:
    """Each series of job ``job_id`` in a metrics page, summed over its other tags."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ray_bastion_") and f'job="{job_id}"' in line:
            name = line.split("{")[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def _jobs_with(text: str, series: str) -> set[str]:
    """The job tags of the samples of ``series`` in a metrics page."""
    return {m.group(1) for line in text.splitlines() if line.startswith(series)
            for m in [re.search(r'job="([^"]+)"', line)] if m}


def test_metrics_endpoint_serves_bastion_series_while_a_job_runs(cluster):
    # Earlier jobs' series stay on the endpoint while the job master's process (a
    # pooled host) lives: this job's are those with a job tag not seen before.
    before = _jobs_with(cluster.metrics_text(), "ray_bastion_")
    job = subprocess.Popen([str(BIN / "bastion"), "run", WORDCOUNT, "--protocol",
                            "coordinated", "--address", cluster.address, "--storage",
                            cluster.storage("bastion-cluster", "metrics")],
                           env=cluster.env(), cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    seen_while_running = ""
    try:
        # The job runs about 7 s, checkpointing every second; its master's series
        # reach the node's agent every second (RAY_metrics_report_interval_ms). Read
        # every node's endpoint until a new job's sink records, latency and
        # checkpoints show up, or the job ended.
        while job.poll() is None:
            text = cluster.metrics_text()
            if all(_jobs_with(text, series) - before for series in (
                    "ray_bastion_sink_records", "ray_bastion_latency_seconds_bucket",
                    "ray_bastion_checkpoints_total")):
                seen_while_running = text
                break
            time.sleep(0.5)
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, out[-2000:] + err[-3000:]
    assert seen_while_running, "no new job's bastion_ series on any node's metrics " \
                               "endpoint while the job ran"
    job_id = re.search(r"^job (\S+):", out, re.M).group(1)
    assert _jobs_with(seen_while_running, "ray_bastion_sink_records") - before == {job_id}
    mine = [line for line in seen_while_running.splitlines()
            if line.startswith("ray_bastion_") and f'job="{job_id}"' in line]
    series = {line.split("{")[0] for line in mine}
    for name in ("ray_bastion_source_records", "ray_bastion_sink_records",
                 "ray_bastion_latency_seconds_bucket", "ray_bastion_source_lag_records",
                 "ray_bastion_throughput_records_per_s", "ray_bastion_inflight_frames",
                 "ray_bastion_checkpoints_total", "ray_bastion_checkpoint_bytes",
                 "ray_bastion_checkpoint_duration_seconds_bucket"):
        assert any(s.startswith(name) for s in series), (name, sorted(series))
    sinks = [line for line in mine if line.startswith("ray_bastion_sink_records")
             and 'operator="out"' in line]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in sinks) > 0, sinks
