"""Recovery drills with real process kills: exactly-once under failure.

Every exactly-once protocol must commit exactly the reference run's records — by
lineage id: nothing lost, nothing duplicated, nothing corrupted — when worker
processes are killed mid-stream. Each drill runs a seeded kill schedule; the first
schedules of each workload run in every CI run, the rest are marked slow (CI runs
them too). The failure-free reference runs under protocol "none" (see
`bastion.drills`), so one reference per workload serves every protocol.

The tests assert what the code guarantees — a kill forced a restart, every fault
landed, the verdict holds, detection and restart were measured — and never how fast:
on a busy machine a detection takes longer and a heartbeat may be missed, which costs
a restart more but must never cost a record. `benchmarks/protocols.py` prints the
detection, restart and recovery times.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bastion as bn
from bastion.drills import reference_runs
from bastion.storage import CheckpointStore, open_store
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

PROTOCOLS = ["coordinated", "uncoordinated", "cic"]
WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis"]


def wordcount(rate=1500, count=3000):
    topo = bn.Topology("drill-wordcount")
    lines = topo.source("lines", bn.sources.Generator(
        lambda i: " ".join(WORDS[(i * k + k) % len(WORDS)] for k in range(1, 4)),
        count=count, rate=rate))
    words = lines.flat_map("split", str.split, parallelism=2)
    words.key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0,
                                     parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def tumbling_count(rate=1500, count=3000):
    topo = bn.Topology("drill-tumbling")
    clicks = topo.source("clicks", bn.sources.Generator(
        lambda i: {"page": f"p{(i * 7) % 5}", "ts": i * 0.01 - (i % 3) * 0.004},
        count=count, rate=rate), timestamp=lambda c: c["ts"], max_out_of_orderness=0.05)
    clicks.key_by(lambda c: c["page"]).window(bn.windows.Tumbling(2.0)).aggregate(
        "per-page", bn.aggregations.Count(), parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def keyed_join(rate=1000, count=2000):
    topo = bn.Topology("drill-join")
    orders = topo.source("orders", bn.sources.Generator(
        lambda i: {"user": f"u{i % 13}", "order": i, "ts": i * 0.01}, count=count,
        rate=rate), timestamp=lambda o: o["ts"])
    pays = topo.source("payments", bn.sources.Generator(
        lambda i: {"user": f"u{(i * 5) % 13}", "pay": i, "ts": i * 0.01 + 0.005},
        count=count, rate=rate), timestamp=lambda p: p["ts"])
    joined = orders.key_by(lambda o: o["user"]).join(
        pays.key_by(lambda p: p["user"]), "match", window=bn.windows.Tumbling(1.0),
        parallelism=2)
    joined.map("ids", lambda t: (t[0], t[1]["order"], t[2]["pay"])).sink(
        "out", bn.sinks.Collect())
    return topo


WORKLOADS = {"wordcount": wordcount, "tumbling": tumbling_count, "join": keyed_join}
_references: dict[str, list] = {}


def reference(workload: str, storage: str) -> list:
    """The failure-free runs a drill of ``workload`` compares with, made once."""
    if workload not in _references:
        _references[workload] = reference_runs(WORKLOADS[workload](), storage=storage)
    return _references[workload]


# Ten seeded kill schedules per protocol in every run (spread over the workloads), two
# more per workload and protocol under the slow marker.
SCHEDULES = [(w, s) for w, seeds in (("wordcount", range(4)), ("tumbling", range(3)),
                                     ("join", range(3))) for s in seeds]
SLOW_SCHEDULES = [(w, s) for w in WORKLOADS for s in (10, 11)]


@pytest.fixture(scope="module")
def drill_storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('drills')}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("workload,seed", SCHEDULES + [
    pytest.param(w, s, marks=pytest.mark.slow) for w, s in SLOW_SCHEDULES])
def test_random_kills_lose_and_duplicate_nothing(protocol, workload, seed, drill_storage):
    ref = reference(workload, drill_storage)
    assert sum(map(len, ref[0].outputs.values())) > 0
    report = bn.drill(WORKLOADS[workload](), protocol=with_interval(protocol, interval_s=0.4),
                      faults=[bn.faults.RandomKills(count=1, between=(0.6, 1.5))], seed=seed,
                      reference=ref, storage=drill_storage)
    assert [e["kind"] for e in report.events].count("fault") == 1
    # at least one restart: a busy machine may add one (a missed heartbeat), never lose it
    assert report.metrics.protocol.failures, "the kill must have forced a restart"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.corrupted == 0, report.corrupted_examples
    assert report.faults_landed and report.verdict == "exactly-once"
    assert report.exactly_once
    assert report.detection_s is not None and report.detection_s >= 0
    assert report.restart_s is not None and report.restart_s >= 0


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_two_kills_in_one_run(protocol, drill_storage):
    report = bn.drill(wordcount(), protocol=with_interval(protocol, interval_s=0.4),
                      faults=[bn.faults.KillInstance("count", 0, at=0.6),
                              bn.faults.KillInstance("split", 1, at=1.6)],
                      reference=reference("wordcount", drill_storage),
                      storage=drill_storage)
    # two restarts, or one if the second kill hit the first recovery (a slow machine)
    assert report.metrics.protocol.failures
    assert [f.landed for f in report.faults] == [True, True]
    assert all(f.restart_s is not None for f in report.faults)
    assert report.exactly_once, report.verdict_reason


def test_kill_during_a_checkpoint_in_progress_never_completes_it(drill_storage):
    topo = wordcount(rate=1500, count=3000)
    report = bn.drill(topo, protocol=bn.protocols.Coordinated(interval_s=0.3),
                      faults=[bn.faults.KillInstance("count", 1, at=1.0,
                                                     during_checkpoint=True)],
                      reference=reference("wordcount", drill_storage), storage=drill_storage)
    assert report.exactly_once, report.verdict_reason
    fault = next(e for e in report.events if e["kind"] == "fault")
    assert fault["checkpoint_in_progress"] is not None
    # A checkpoint still waiting for acknowledgments when the failure is detected is
    # abandoned (one whose every part was stored just before the kill may complete).
    detected = next(e for e in report.events if e["kind"] == "failure_detected")
    in_flight = detected["checkpoint_in_progress"]
    checkpoints = CheckpointStore(open_store(drill_storage), report.job_id)
    if in_flight is None:
        # Every part of the checkpoint in progress at the kill had been stored before
        # the kill: it completed (manifest written), and that is correct.
        assert checkpoints.is_complete(fault["checkpoint_in_progress"])
        return
    restarted = next(e for e in report.events if e["kind"] == "restarted")
    completed = [e["checkpoint_id"] for e in report.events
                 if e["kind"] == "checkpoint_completed"]
    # the restart resumed from the newest checkpoint before the interrupted one ...
    # (on a loaded machine the kill may come before any checkpoint completed: then
    # from the beginning, None)
    assert restarted["checkpoint"] == max((c for c in completed if c < in_flight),
                                          default=None)
    # ... and the interrupted checkpoint has no manifest: it is never used
    assert in_flight not in completed
    assert not checkpoints.is_complete(in_flight)
    assert in_flight not in checkpoints.list_complete()


def stall_once(n):
    """Identity, except that record 300 holds its task for 3 s: longer than a
    checkpoint may take in the test below (``Coordinated(timeout_s=1.5)``)."""
    if n == 300:
        time.sleep(3)
    return n


@pytest.mark.slow  # 3 s of stall
def test_outputs_staged_under_a_timed_out_checkpoint_are_still_committed(tmp_path):
    # Two branches of one source: the checkpoint in progress at the stall times out.
    # Its barrier still reaches every sink, and each stages its outputs under it —
    # outputs no restore will produce again (there is no failure): they must be
    # committed with the next checkpoint. (Before, 1,875 of 3,000 were lost.)
    topo = bn.Topology("stalled-checkpoint")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=1200, rate=200))
    numbers.map("pass", lambda n: n).sink("direct", bn.sinks.Collect())
    numbers.map("stall", stall_once).sink("stalled", bn.sinks.Collect())
    # the stalled task must not look dead: the test is about a slow checkpoint
    result = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.5, timeout_s=1.5),
                    workers=2,
                    storage=f"local://{tmp_path}", recovery=bn.Recovery(heartbeat_timeout_s=60.0))
    kinds = [e["kind"] for e in result.details["events"]]
    aborted = kinds.index("checkpoint_aborted")
    assert "checkpoint_completed" in kinds[aborted:], "no checkpoint completed after it"
    assert "restarted" not in kinds
    for sink in ("direct", "stalled"):
        assert sorted(result.outputs[sink]) == list(range(1200)), sink


def test_a_checkpoint_with_a_missing_blob_is_never_used(tmp_path):
    storage = f"local://{tmp_path}"
    result = bn.run(wordcount(count=3000), protocol=bn.protocols.Coordinated(interval_s=0.3),
                    storage=storage)
    store = open_store(storage)
    checkpoints = CheckpointStore(store, result.job_id)
    complete = checkpoints.list_complete()
    assert len(complete) >= 2
    newest = checkpoints.manifest(complete[0])
    victim = next(iter(newest.blobs.values()))
    store.delete(victim.key)
    assert checkpoints.list_complete()[0] == complete[1]
    assert checkpoints.latest_complete().checkpoint_id == complete[1]


def test_coordinated_rejects_a_cyclic_topology():
    topo = bn.Topology("cyclic")
    src = topo.source("edges", bn.sources.Collection([(1, 2)]))
    step = src.map("step", lambda e: e)
    step.sink("out", bn.sinks.Collect())
    topo.feedback(step, "step")
    with pytest.raises(bn.TopologyError, match="protocol 'coordinated' cannot run .*"
                                                "feedback edge 'step' -> 'step'.*deadlock"):
        bn.run(topo, protocol="coordinated")


@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated"])
def test_losing_a_whole_node_kills_every_process_on_it_and_loses_nothing(protocol,
                                                                        drill_storage):
    # A single-machine Ray has one node: every worker and the standby die together, so
    # the job comes back on fresh processes from its checkpoints alone.
    report = bn.drill(wordcount(), protocol=with_interval(protocol, interval_s=0.4),
                      faults=[bn.faults.KillNode(0, at=1.0)],
                      reference=reference("wordcount", drill_storage),
                      storage=drill_storage)
    fault = next(e for e in report.events if e["kind"] == "fault")
    assert fault["killed"] == ["standby", "worker 0", "worker 1"]
    assert report.metrics.protocol.failures
    assert report.exactly_once, report.verdict_reason


@pytest.mark.slow
def test_losing_one_node_of_two_kills_only_the_workers_on_it(tmp_path):
    script = Path(__file__).with_name("two_node_drill.py")
    done = subprocess.run([sys.executable, str(script), "coordinated", str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["nodes"] == 2
    # slot i runs on node i mod 2 and the standby after the last slot, on node 0
    assert outcome["killed"] == ["worker 1"]
    assert outcome["failures"] >= 1
    assert outcome["exactly_once"], outcome


def test_a_node_that_does_not_exist_fails_before_the_run():
    with pytest.raises(ValueError, match=r"KillNode: node 7 does not exist \(the cluster "
                                         r"has 1 live node\)"):
        bn.run(wordcount(count=10), protocol="coordinated",
               faults=[bn.faults.KillNode(7, at=1.0)])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_second_kill_during_the_recovery_is_recovered_too(protocol, drill_storage):
    # The second kill lands while the job master replaces workers or redeploys after
    # the first (detection takes ~0.05 s, a restart ~0.2 s).
    report = bn.drill(wordcount(), protocol=with_interval(protocol, interval_s=0.4),
                      faults=[bn.faults.KillWorker(0, at=1.0), bn.faults.KillWorker(1, at=1.08)],
                      reference=reference("wordcount", drill_storage),
                      storage=drill_storage)
    assert [e["kind"] for e in report.events].count("fault") == 2
    assert report.metrics.protocol.failures
    # both kills landed: the second one either failed the recovery in progress or
    # was detected on its own
    assert [f.landed for f in report.faults] == [True, True]
    assert report.exactly_once, report.verdict_reason
    # one failure per kill, or one for both; a missed heartbeat may add another
    assert len(report.metrics.protocol.failures) >= 1
