"""Protocol "cec" (continuous eventual checkpoints) through the public API, with real
Ray processes killed mid-stream, on local storage and on S3 (moto on loopback).

Drills compare, by lineage id and (in deterministic mode) by value, with a
failure-free reference under protocol "none" (`bastion.drills`). Two deliberately
broken variants show the drills catch a CEC that replays what its state already holds
and one whose sinks keep what they see twice. The merge cursor a restored instance
resumes from is checked against the merge itself, and the control tuples the runtime
writes are read back by the in-process reconstruction and by the Spark job.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings, strategies as st

import bastion as bn
from bastion.drills import reference_runs
from bastion.protocols import eventual
from bastion.protocols.cec import CecPolicy, CecProtocol, CecTask, log_prefix
from bastion.runtime.merge import DeterministicMerge
from bastion.runtime.records import Batch, EndOfStream
from bastion.storage import LogReader, open_store
from test_drills import keyed_join as join
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

# Fake credentials for moto, in the environment before Ray starts (its workers inherit
# it); the same names and values as the other S3 tests of this directory.
os.environ.setdefault("BASTION_S3_ACCESS_KEY", "AKIABASTIONLOGTEST")
os.environ.setdefault("BASTION_S3_SECRET_KEY", "bastion-log-test-secret")

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis"]


def keyed_sum(count=4000, rate=2000):
    """A running sum per word over two source instances: each reducer instance merges
    two channels, so in deterministic mode its merge cursor must resume exactly."""
    topo = bn.Topology("cec-sum")
    nums = topo.source("nums", bn.sources.Generator(lambda i: i, count=count, rate=rate),
                       parallelism=2)
    nums.map("word", lambda i: (WORDS[(i * 7) % len(WORDS)], i)).key_by(
        lambda t: t[0]).reduce("sum", lambda acc, t: acc + t[1], initial=0,
                               parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def tumbling(count=4000, rate=2000):
    topo = bn.Topology("cec-tumbling")
    clicks = topo.source("clicks", bn.sources.Generator(
        lambda i: {"page": f"p{(i * 7) % 5}", "ts": i * 0.005 - (i % 3) * 0.002},
        count=count, rate=rate), timestamp=lambda c: c["ts"], max_out_of_orderness=0.05,
        parallelism=2)
    clicks.key_by(lambda c: c["page"]).window(bn.windows.Tumbling(1.0)).aggregate(
        "per-page", bn.aggregations.Count(), parallelism=2).sink("out", bn.sinks.Collect())
    return topo


WORKLOADS = {"sum": keyed_sum, "tumbling": tumbling, "join": join}
_references: dict[str, list] = {}


def reference(workload: str, storage: str) -> list:
    if workload not in _references:
        _references[workload] = reference_runs(WORKLOADS[workload](), storage=storage)
    return _references[workload]


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('cec')}"


def cec_drill(workload, storage, *, reference_storage=None, protocol="cec", seed=None,
              faults=None):
    return bn.drill(WORKLOADS[workload](), protocol=with_interval(protocol, interval_s=0.3),
                    faults=faults or [bn.faults.RandomKills(count=1, between=(0.5, 1.4))],
                    seed=seed, reference=reference(workload, reference_storage or storage),
                    storage=storage)


def loaded(report) -> list[dict]:
    return [e for e in report.events if e["kind"] == "eventual_checkpoint_loaded"]


def restarted(report) -> bool:
    """Whether tasks restarted: the whole job in a new attempt, or the failed part of
    it within the attempt that ran."""
    return any(e["kind"] == "restarted" for e in report.events)


@pytest.mark.parametrize("workload,seed", [(w, s) for w in WORKLOADS for s in (0, 1)] + [
    pytest.param(w, s, marks=pytest.mark.slow) for w in WORKLOADS for s in (2, 3, 4)])
def test_random_kills_under_cec_lose_and_duplicate_nothing(workload, seed, storage):
    report = cec_drill(workload, storage, seed=seed)
    assert restarted(report), "the kill must have forced a restart"
    assert loaded(report), "the restart must have gone through the eventual checkpoints"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.corrupted == 0, report.corrupted_examples
    assert report.faults_landed and report.exactly_once, report.verdict_reason


@pytest.mark.parametrize("workload", ["sum", "tumbling", "join"])
def test_cec_drill_on_s3(workload, storage, moto_endpoint):
    s3 = f"s3://bastion-cec-drills/{workload}?endpoint={moto_endpoint}&secure=false"
    report = cec_drill(workload, s3, reference_storage=storage, seed=7)
    assert restarted(report)
    assert report.exactly_once, report.verdict_reason


def test_a_restart_loads_parts_and_replays_only_after_them(storage):
    """A kill well after the first footprints: the restart reads a non-empty extent
    and the sources do not replay from the beginning, and still nothing is off."""
    report = cec_drill("sum", storage,
                       faults=[bn.faults.KillInstance("sum", 0, at=1.2)])
    assert report.exactly_once, report.verdict_reason
    event = loaded(report)[0]
    assert event["extent_records"] > 0 and not event["replay_everything"]


def test_losing_every_process_at_once_loses_nothing(storage):
    """A whole node (every worker, the standby) dies: nothing survives in memory, the
    state comes back from the logs alone."""
    report = cec_drill("tumbling", storage, faults=[bn.faults.KillNode(0, at=1.0)])
    fault = next(e for e in report.events if e["kind"] == "fault")
    assert len(fault["killed"]) >= 2
    assert loaded(report) and not loaded(report)[0]["replay_everything"]
    assert report.exactly_once, report.verdict_reason


# -- resuming a job that failed for good -------------------------------------------------


def _committed_by_id(store, job) -> dict:
    from bastion.runtime.outputs import read_committed
    values, ids = read_committed(store, job, "out")
    by_id: dict = {}
    for rid, value in zip(ids, values):
        by_id.setdefault(rid, []).append(value)
    return by_id


@pytest.mark.parametrize("stored", ["logs", "spark-ec-at-T"])
def test_a_failed_job_resumed_from_its_logs_commits_the_rest_exactly_once(
        stored, tmp_path, request):
    """Job A dies for good (no restarts allowed); job B resumes from what A logged —
    its logs, or an EC `bastion reconstruct` stored for an earlier log time T. What
    A committed plus what B committed is the reference, id by id and value by value,
    each once."""
    storage = f"local://{tmp_path}"
    store = open_store(storage)
    reference = bn.run(keyed_sum(), protocol="none", lineage=True, deterministic=True,
                       storage=storage)
    with pytest.raises(bn.JobFailedError) as failed:
        bn.run(keyed_sum(), protocol="cec", deterministic=True, storage=storage,
               recovery=bn.Recovery(max_restarts=0),
               faults=[bn.faults.KillInstance("sum", 1, at=1.2)])
    first = failed.value.job_id
    if stored == "spark-ec-at-T":
        from bastion.spark_jobs.reconstruct import reconstruct_operator
        times = [ts for _, ts, _ in LogReader(store, log_prefix(first, "sum", 0)).records()]
        at = times[len(times) // 2]
        ecs = reconstruct_operator(request.getfixturevalue("spark"), store, first, "sum",
                                   at=at)
        assert all(r.key for r in ecs)  # stored where the resumed job looks first
    second = bn.run(keyed_sum(), protocol="cec", deterministic=True, storage=storage,
                    resume_from=first)
    event = next(e for e in second.details["events"]
                 if e["kind"] == "eventual_checkpoint_loaded")
    assert event["job"] == first and not event["replay_everything"]
    before, after = _committed_by_id(store, first), _committed_by_id(store, second.job_id)
    assert before and after
    assert not set(before) & set(after), "an id committed by both jobs"
    expected = dict(zip(reference.output_ids["out"], reference.outputs["out"]))
    union = {**{k: v for k, v in before.items()}, **after}
    assert all(len(v) == 1 for v in union.values())
    assert {k: v[0] for k, v in union.items()} == expected


def test_resume_from_is_refused_where_it_cannot_work(tmp_path):
    storage = f"local://{tmp_path}"
    (tmp_path / "jobs" / "some-job").mkdir(parents=True)
    (tmp_path / "jobs" / "some-job" / "events").write_bytes(b"")
    with pytest.raises(ValueError, match="left no savepoint .* protocol 'coordinated' "
                                         "cannot start from"):
        bn.run(keyed_sum(count=10), protocol="coordinated", storage=storage,
               resume_from="some-job")
    with pytest.raises(ValueError, match="holds no job 'no-such-job'"):
        bn.run(keyed_sum(count=10), protocol="cec", storage=storage,
               resume_from="no-such-job")


# -- the drills can fail -----------------------------------------------------------------


class ReplaysWhatItHolds(CecTask):
    """Loads the eventual checkpoint but drops nothing the replay brings: the parts
    count again inputs their footprints already reflect."""

    async def restore(self, recovery_line):
        await super().restore(recovery_line)
        self.drop_below = None
        if self.operator is not None:
            self.operator.guard = None


class SinksKeepEverything(CecTask):
    """Sinks that do not drop what they committed before: results the restored
    instances send again from their logs are committed twice."""

    async def restore(self, recovery_line):
        deduplicate, self.task.sinks.deduplicate = self.task.sinks.deduplicate, None

        async def nothing(jobs):
            return None

        self.task.sinks.deduplicate = nothing
        try:
            await super().restore(recovery_line)
        finally:
            self.task.sinks.deduplicate = deduplicate


class Broken(CecProtocol):
    def __init__(self, task_half):
        super().__init__()
        self.task_half = task_half

    def task_protocol(self, task):
        return self.task_half(task, self.policy)


@pytest.mark.parametrize("defect,violation", [(ReplaysWhatItHolds, "corrupted"),
                                              (SinksKeepEverything, "duplicated")])
def test_the_drill_says_violated_when_cec_is_broken(defect, violation, storage):
    report = cec_drill("sum", storage, protocol=Broken(defect),
                       faults=[bn.faults.KillInstance("sum", 0, at=1.2)])
    assert loaded(report) and not loaded(report)[0]["replay_everything"]
    assert report.verdict == "violated"
    assert getattr(report, violation) > 0


# -- what cec refuses, before anything runs ------------------------------------------------


def test_cec_refuses_topologies_it_cannot_recover_exactly():
    topo = bn.Topology("flat")
    lines = topo.source("lines", bn.sources.Collection(["a b"]))
    lines.flat_map("split", str.split).key_by(lambda w: w).reduce(
        "count", lambda a, _: a + 1, initial=0).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="operator 'count'.*flat_map 'split'"):
        bn.run(topo, protocol="cec")

    # (sliding and count window aggregates and sliding joins run:
    # tests/test_cec_windows.py)
    topo = bn.Topology("two")
    src = topo.source("s", bn.sources.Collection([1]))
    summed = src.key_by(lambda v: v).reduce("a", lambda a, v: a + v, initial=0)
    summed.key_by(lambda t: t[0]).reduce("b", lambda a, t: a + 1, initial=0).sink(
        "out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="operator 'b'.*one stateful operator per path"):
        bn.run(topo, protocol="cec")

    topo = bn.Topology("rebalanced")
    src = topo.source("s", bn.sources.Collection([1]))
    summed = src.key_by(lambda v: v).reduce("a", lambda a, v: a + v, initial=0,
                                           parallelism=2)
    summed.map("m", lambda t: t, parallelism=3).sink("out", bn.sinks.Collect())
    with pytest.raises(bn.TopologyError, match="operator 'm'.*rebalance edge"):
        bn.run(topo, protocol="cec")


def test_cec_policy_is_validated_and_belongs_to_cec():
    with pytest.raises(ValueError, match="extent_target must be a number > 0"):
        CecPolicy(extent_target=0)
    with pytest.raises(ValueError, match="check_interval_s .* must not exceed period_s"):
        CecPolicy(check_interval_s=1.0, period_s=0.5)
    # the policy is a knob of the cec protocol object, and of no other
    with pytest.raises(TypeError, match="policy"):
        bn.protocols.Coordinated(policy=CecPolicy())


# -- the log the runtime writes ---------------------------------------------------------------


def control_kinds(store, job, operator, instance) -> list[int]:
    """The kind of every record, a control tuple's once per part it names."""
    return [value[0] for _, _, value in
            LogReader(store, log_prefix(job, operator, instance)).records()
            for _ in (eventual.parts_of(value) if eventual.is_control(value) else [None])]


def test_policy_decides_how_many_g_checks_are_written(tmp_path):
    storage = f"local://{tmp_path}"
    store = open_store(storage)
    eager = bn.run(keyed_sum(count=3000, rate=3000),
                   protocol=bn.protocols.Cec(policy=CecPolicy(extent_target=5, replay_target=50,
                                                              period_s=0.02)),
                   storage=storage,
                   deterministic=True)
    lazy = bn.run(keyed_sum(count=3000, rate=3000),
                  protocol=bn.protocols.Cec(policy=CecPolicy.open_only()), storage=storage,
                  deterministic=True)
    assert lazy.outputs["out"] == eager.outputs["out"]
    for instance in (0, 1):
        eager_kinds = control_kinds(store, eager.job_id, "sum", instance)
        lazy_kinds = control_kinds(store, lazy.job_id, "sum", instance)
        assert eager_kinds.count(eventual.G_CHECK) > 0
        assert lazy_kinds.count(eventual.G_CHECK) == 0
        # a keyed reduce opens one part per key it sees, once
        keys = {w for w, _ in eager.outputs["out"]
                if bn.instance_of(w, 2) == instance}
        assert lazy_kinds.count(eventual.G_OPEN) == len(keys)
        assert eager_kinds.count(eventual.G_OPEN) == len(keys)


def test_the_runtime_log_rebuilds_the_state_in_python_and_in_spark(tmp_path, spark):
    """The control tuples of a run, read back: Spark's EC equals the in-process one,
    and each footprint is the true running sum of its key at its position — checked
    against plain Python over the input: state + the inputs after the position that
    the EC says to replay = the final sum."""
    from bastion.lineage import op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.spark_jobs.reconstruct import reconstruct_operator

    storage = f"local://{tmp_path}"
    store = open_store(storage)
    topo = keyed_sum(count=3000, rate=3000)
    result = bn.run(topo,
                    protocol=bn.protocols.Cec(policy=CecPolicy(extent_target=20, replay_target=200,
                                                               period_s=0.02)),
                    storage=storage)
    code = op_codes(topo)["nums"]
    word = [WORDS[(i * 7) % len(WORDS)] for i in range(3000)]
    final: dict[str, int] = {}
    for i in range(3000):
        final[word[i]] = final.get(word[i], 0) + i
    by_spark = {r.instance: r.ec for r in reconstruct_operator(spark, store, result.job_id,
                                                               "sum", write=False)}
    decode = DurableCodec().unpack
    seen = set()
    for instance in (0, 1):
        ec, damage = eventual.read_eventual_checkpoint(store, log_prefix(result.job_id,
                                                                         "sum", instance))
        assert not damage and ec.complete and ec.parts
        assert by_spark[str(instance)].to_wire() == ec.to_wire()
        for part, fp in ec.parts.items():
            key = decode(part, "part")
            seen.add(key)
            # source instance j reads i = j, j + 2, ...: position (i - j) // 2
            after = sum(i for i in range(3000) if word[i] == key
                        and (i - i % 2) // 2 > fp.position.get(f"{code}/{i % 2}", -1))
            assert decode(fp.state, "state") + after == final[key], key
    assert seen == set(final)


# -- the merge cursor a restored instance resumes from ------------------------------------------


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 700), min_size=2, max_size=4),
       ends=st.lists(st.booleans(), min_size=4, max_size=4),
       seed=st.integers(0, 10**6), turn=st.sampled_from([3, 7, 256]))
def test_merge_resume_puts_the_cursor_where_the_merge_had_it(lengths, ends, seed, turn):
    """Run a deterministic merge over random channels fed in random frame sizes; at
    every step, a fresh merge resumed from the counts merged so far (and the channels
    ended) must stand exactly where the running one stands."""
    rng = random.Random(seed)
    channels = list(range(len(lengths)))
    merge = DeterministicMerge(channels, turn)
    pending = {c: lengths[c] for c in channels}
    ended_input = {c for c in channels if ends[c]}
    consumed = {c: 0 for c in channels}
    ended: set[int] = set()
    for _ in range(10_000):
        fed = False
        for c in channels:  # feed frames of random size, end some channels
            if pending[c] and rng.random() < 0.5:
                n = min(pending[c], rng.randint(1, 50))
                pending[c] -= n
                merge.push(c, Batch(None, [0] * n, [0.0] * n, [0.0] * n))
                fed = True
            elif not pending[c] and c in ended_input and c not in merge.ended_on_arrival:
                merge.push(c, EndOfStream())
                fed = True
        step = merge.next()
        if step is None and not fed:
            break
        if step is not None:
            c, element = step
            if type(element) is Batch:
                consumed[c] += len(element)
            else:
                ended.add(c)
            resumed = DeterministicMerge(channels, turn)
            resumed.resume(consumed, ended)
            assert (resumed.active, resumed.turn, resumed.left) == (
                merge.active, merge.turn, merge.left)
