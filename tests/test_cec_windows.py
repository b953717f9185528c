"""Protocol "cec" over sliding and count windows, with real Ray processes killed.

A sliding window's parts are its windows: a record goes into ``size / slide`` of them,
each with its own footprint, and a replayed record is taken or dropped by each window
on its own. A count window's parts are its keys (a key's current count window and the
count of those it fired). Each workload is checked three ways: a failure-free run
against plain Python over the same input (no engine in the reference), drills that
kill the window operator mid-stream and must be exactly-once, and a deliberately
broken CEC — one that forgets the windows it loads — that the drill must catch. The
footprints a sliding and a count run write are read back by the in-process
reconstruction and by the Spark job, which must agree, and checked against plain
Python too.
"""

from __future__ import annotations

import math

import pytest

import bastion as bn
from bastion.drills import reference_runs
from bastion.protocols import eventual
from bastion.protocols.cec import CecPolicy, CecProtocol, CecTask, log_prefix
from bastion.storage import LogReader, open_store

pytestmark = pytest.mark.usefixtures("ray_session")

PAGES = 5
SIZE, SLIDE, N = 1.0, 0.25, 7


# Event times are multiples of 1/1024 — exact binary fractions, as are the windows'
# bounds — so the plain-Python reference puts each record in its windows without
# rounding; records come up to 2/1024 s out of order.
def click(i: int) -> dict:
    return {"page": f"p{(i * 7) % PAGES}", "n": i % 11, "ts": i / 512 - (i % 3) / 1024}


def sliding(count=4000, rate=2000):
    """A keyed Sliding(1.0, 0.25) sum over two source instances: a window lives a few
    CEC periods, so windows open at a kill have footprints and others none yet."""
    topo = bn.Topology("cec-sliding")
    clicks = topo.source("clicks", bn.sources.Generator(click, count=count, rate=rate),
                         timestamp=lambda c: c["ts"], max_out_of_orderness=0.05,
                         parallelism=2)
    clicks.key_by(lambda c: c["page"]).window(bn.windows.Sliding(SIZE, SLIDE)).aggregate(
        "per-page", bn.aggregations.Sum(lambda c: c["n"]), parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


def counted(count=4000, rate=2000):
    """A keyed Count(7) sum. One source instance: the records of a key reach the
    window in the source's order, which is what says where each count window ends."""
    topo = bn.Topology("cec-count")
    clicks = topo.source("clicks", bn.sources.Generator(click, count=count, rate=rate),
                         timestamp=lambda c: c["ts"], max_out_of_orderness=0.05)
    clicks.key_by(lambda c: c["page"]).window(bn.windows.Count(N)).aggregate(
        "per-page", bn.aggregations.Sum(lambda c: c["n"]), parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


def sliding_expected(count=4000) -> list:
    """``(page, start, end, sum)`` of every sliding window any record falls in (all
    fire: the end of the stream fires what is still open)."""
    sums: dict[tuple[str, int], int] = {}
    for i in range(count):
        c = click(i)
        k = math.floor(c["ts"] / SLIDE)
        while k * SLIDE + SIZE > c["ts"]:   # window k holds ts: k*SLIDE <= ts < k*SLIDE + SIZE
            sums[c["page"], k] = sums.get((c["page"], k), 0) + c["n"]
            k -= 1
    return sorted((page, k * SLIDE, k * SLIDE + SIZE, total)
                  for (page, k), total in sums.items())


def counted_expected(count=4000) -> list:
    """``(page, first ts, last ts, sum)`` of every full run of N records of a page, in
    source order (an incomplete last run never fires)."""
    runs: dict[str, list[dict]] = {}
    out = []
    for i in range(count):
        c = click(i)
        run = runs.setdefault(c["page"], [])
        run.append(c)
        if len(run) == N:
            out.append((c["page"], run[0]["ts"], run[-1]["ts"], sum(r["n"] for r in run)))
            run.clear()
    return sorted(out)


WORKLOADS = {"sliding": sliding, "count": counted}
EXPECTED = {"sliding": sliding_expected, "count": counted_expected}
_references: dict[str, list] = {}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('cec-windows')}"


def reference(workload: str, storage: str) -> list:
    if workload not in _references:
        _references[workload] = reference_runs(WORKLOADS[workload](), storage=storage)
    return _references[workload]


EAGER = CecPolicy(extent_target=5, replay_target=50, period_s=0.02)


def cec_drill(workload, storage, faults, protocol="cec", policy=None):
    return bn.drill(WORKLOADS[workload](), protocol=protocol, checkpoint_interval=0.3,
                    faults=faults, reference=reference(workload, storage), storage=storage,
                    **({} if policy is None else {"cec": policy}))


def loaded(report) -> list[dict]:
    return [e for e in report.events if e["kind"] == "eventual_checkpoint_loaded"]


def control_kinds(store, job, operator, instance) -> list[int]:
    """The kind of every record, a control tuple's once per part it names."""
    return [value[0] for _, _, value in
            LogReader(store, log_prefix(job, operator, instance)).records()
            for _ in (eventual.parts_of(value) if eventual.is_control(value) else [None])]


# -- failure-free: the windows are right, and each writes its own footprints ----------


@pytest.mark.parametrize("workload", ["sliding", "count"])
def test_a_failure_free_run_under_cec_equals_plain_python(workload, tmp_path):
    storage = f"local://{tmp_path}"
    # an eager policy: parts get G_checks as well as G_opens
    result = bn.run(WORKLOADS[workload](), protocol="cec", storage=storage, cec=EAGER)
    assert sorted(result.outputs["out"]) == EXPECTED[workload]()
    store = open_store(storage)
    for instance in (0, 1):
        kinds = control_kinds(store, result.job_id, "per-page", instance)
        assert kinds.count(eventual.G_OPEN) > 0 and kinds.count(eventual.G_CHECK) > 0
        if workload == "count":
            # a part per key of the instance, opened once and never closed
            pages = {p for p, *_ in EXPECTED["count"]() if bn.stable_hash(p) % 2 == instance}
            assert kinds.count(eventual.G_OPEN) == len(pages)
            assert kinds.count(eventual.CLOSED) == 0
        else:
            assert kinds.count(eventual.CLOSED) > 0


# -- drills ----------------------------------------------------------------------------


@pytest.mark.parametrize("workload,at,policy", [
    (w, at, policy) for w in ("sliding", "count") for at, policy in
    ((0.8, None), (1.3, None), (1.3, EAGER))],
    ids=lambda v: "eager" if v is EAGER else "default" if v is None else str(v))
def test_killing_the_window_operator_loses_and_duplicates_nothing(workload, at, policy,
                                                                  storage):
    """Default policy: the parts open at the kill have G_opens; eager: G_checks."""
    report = cec_drill(workload, storage, [bn.faults.KillInstance("per-page", 0, at=at)],
                       policy=policy)
    assert loaded(report), "the restart must have gone through the eventual checkpoints"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.corrupted == 0, report.corrupted_examples
    assert report.faults_landed and report.exactly_once, report.verdict_reason


@pytest.mark.parametrize("workload", ["sliding", "count"])
def test_random_kills_on_windows_under_cec_are_exactly_once(workload, storage):
    report = cec_drill(workload, storage,
                       [bn.faults.RandomKills(count=1, between=(0.5, 1.4), seed=3)])
    assert report.faults_landed and report.exactly_once, report.verdict_reason


class ForgetsLoadedParts(CecTask):
    """Loads the eventual checkpoint's positions but not its parts' states: every
    window (or key) open at the failure starts again empty, and drops the replayed
    records its footprint said it held."""

    async def restore(self, recovery_line):
        found = self.task.parted_operator()
        if found is not None:
            found[1].load_part = lambda part, state: None
        await super().restore(recovery_line)


class Broken(CecProtocol):
    def task_protocol(self, task):
        return ForgetsLoadedParts(task, self.policy)


@pytest.mark.parametrize("workload", ["sliding", "count"])
def test_the_drill_catches_a_cec_that_does_not_restore_its_parts(workload, storage):
    report = cec_drill(workload, storage, [bn.faults.KillInstance("per-page", 0, at=1.3)],
                       protocol=Broken())
    assert loaded(report) and not loaded(report)[0]["replay_everything"]
    assert report.verdict == "violated"
    assert report.corrupted + report.lost > 0


# -- the footprints, read back ---------------------------------------------------------


def test_sliding_footprints_rebuild_the_same_ec_in_python_and_in_spark(tmp_path, spark):
    """Mid-run (log time ``at``), each open window's footprint holds, per page, the sum
    of exactly the records of that window at or below its position — plain Python
    over the input — and Spark's EC equals the in-process one."""
    from bastion.lineage import op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.spark_jobs.reconstruct import reconstruct_operator

    storage = f"local://{tmp_path}"
    store = open_store(storage)
    topo = sliding()
    result = bn.run(topo, protocol="cec", storage=storage,
                    cec=CecPolicy(extent_target=20, replay_target=200, period_s=0.02))
    code = op_codes(topo)["clicks"]
    decode = DurableCodec().unpack
    checked = 0
    for instance in (0, 1):
        prefix = log_prefix(result.job_id, "per-page", instance)
        times = [ts for _, ts, _ in LogReader(store, prefix).records()]
        at = times[len(times) // 2]
        ec, damage = eventual.read_eventual_checkpoint(store, prefix, at=at)
        assert not damage and ec.complete and ec.parts
        by_spark = {r.instance: r.ec for r in reconstruct_operator(
            spark, store, result.job_id, "per-page", at=at, write=False)}
        assert by_spark[str(instance)].to_wire() == ec.to_wire()
        for part, fp in ec.parts.items():
            k = decode(part, "part")
            sums, _ = decode(fp.state, "state")
            expected: dict[str, int] = {}
            for i in range(4000):
                c = click(i)
                # source instance j reads i = j, j + 2, ...: position (i - j) // 2
                if (k * SLIDE <= c["ts"] < k * SLIDE + SIZE
                        and bn.stable_hash(c["page"]) % 2 == instance
                        and i // 2 <= fp.position.get(f"{code}/{i % 2}", -1)):
                    expected[c["page"]] = expected.get(c["page"], 0) + c["n"]
            assert sums == expected, k
            checked += 1
    assert checked > 0


def test_count_footprints_rebuild_the_same_ec_in_python_and_in_spark(tmp_path, spark):
    """At the end of the log every key's part is open (a count window's part never
    closes): its footprint holds the windows the key fired and its current one — plain
    Python over the records of the key at or below the footprint's position — and
    Spark's EC equals the in-process one."""
    from bastion.lineage import op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.spark_jobs.reconstruct import reconstruct_operator

    storage = f"local://{tmp_path}"
    store = open_store(storage)
    topo = counted()
    result = bn.run(topo, protocol="cec", storage=storage, cec=EAGER)
    source = f"{op_codes(topo)['clicks']}/0"   # one source instance: position = i
    decode = DurableCodec().unpack
    by_spark = {r.instance: r.ec for r in reconstruct_operator(
        spark, store, result.job_id, "per-page", write=False)}
    pages = set()
    for instance in (0, 1):
        ec, damage = eventual.read_eventual_checkpoint(
            store, log_prefix(result.job_id, "per-page", instance))
        assert not damage and ec.complete and ec.parts
        assert by_spark[str(instance)].to_wire() == ec.to_wire()
        for part, fp in ec.parts.items():
            page = decode(part, "part")
            pages.add(page)
            mine = [click(i) for i in range(fp.position[source] + 1)
                    if click(i)["page"] == page]
            current = mine[len(mine) - len(mine) % N:]
            expected = [len(mine) // N, [len(current), current[0]["ts"],
                                         sum(c["n"] for c in current)] if current else None]
            assert decode(fp.state, "state") == expected, page
    assert pages == {f"p{p}" for p in range(PAGES)}
