"""Every figure a summary prints obeys its one definition (issue 36; docs/metrics.md).

A drill once printed ``recovery 0.80 s, total recovery 0.22 s``: a total smaller than
its part, because "caught up" was defined four times. The recovery figures now come
from one module (`bastion.runtime.recovery_times`), whose laws — every figure >= 0,
detection + restart <= recovery <= total recovery — hold by construction. These
tests check them where a user reads them, over a drill of each protocol (one kill
each), together with the counts beside them; they check that the checker can fail
(a doctored report is caught); and that drill, tune's measurement and analyze's rule
give the same times for the same run.

`check_figures` is the checker: what it calls a violation is a figure that
contradicts its definition in docs/metrics.md.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest

import bastion as bn
from bastion import faults as fault_injection
from bastion import tuning as front
from bastion.drills import GLOSSARY, FaultOutcome, fault_outcomes, reference_runs
from bastion.runtime.metrics import LatencyHistogram
from bastion.runtime.plan import build_plan
from bastion.runtime.recovery_times import (RecoveryTimes, caught_up_at, failures_in,
                                            rate_recovered_at, recovery_times)
from bastion.scheduler import tuning
from bastion.spark_jobs.analyze import failures_of
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

KILL_AT_S = 1.0


def pipeline() -> bn.Topology:
    """Stateless, so that every protocol runs it (acks runs only stateless ones), and
    paced, so that a kill leaves a backlog to catch up on."""
    topo = bn.Topology("figures")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=2500,
                                                          rate=1000))
    numbers.map("double", lambda n: 2 * n, parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def the_kill() -> list:
    return [bn.faults.KillInstance("double", 0, at=KILL_AT_S)]


def kills_of(faults: list) -> list:
    return fault_injection.validate(faults, build_plan(pipeline()))


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('figures')}"


@pytest.fixture(scope="module")
def reference(storage):
    return reference_runs(pipeline(), storage=storage)


# -- the checker ------------------------------------------------------------------------------


def check_figures(report) -> list[str]:
    """Every figure of a drill report that contradicts its definition, in words."""
    wrong = []
    for i, fault in enumerate(report.faults, 1):
        times = fault.times()
        if times is not None:
            wrong += [f"fault {i}: {v}" for v in times.violations()]
    proto = report.metrics.protocol
    for i, f in enumerate(proto.failures if proto else [], 1):
        times = RecoveryTimes(f.failed_at_s, f.detection_s, f.restart_s, f.recovery_s, f.trt_s)
        wrong += [f"job master failure {i}: {v}" for v in times.violations()]
    # counts and rates are never negative, per progress point or in total
    for p in report.timeline:
        for name in ("source_records", "sink_records", "source_lag"):
            if (p.get(name) or 0) < 0:
                wrong.append(f"timeline {p['t_s']:.2f} s: {name} {p[name]} < 0")
    m = report.metrics
    for name in ("source_records", "sink_records", "tuples_per_s", "dead_letters"):
        if getattr(m, name) < 0:
            wrong.append(f"{name} {getattr(m, name)} < 0")
    for op, c in m.operators.items():
        if c.records_in < 0 or c.records_out < 0:
            wrong.append(f"operator {op}: in {c.records_in}, out {c.records_out}")
    c = report.comparison
    for name in ("lost", "duplicated", "corrupted", "reference_records"):
        if getattr(c, name) < 0:
            wrong.append(f"{name} {getattr(c, name)} < 0")
    if proto is not None:
        for name in ("checkpoints_completed", "checkpoints_aborted", "invalid_checkpoints"):
            if getattr(proto, name) < 0:
                wrong.append(f"{name} {getattr(proto, name)} < 0")
        if not 0 <= proto.invalid_share <= 1:
            wrong.append(f"invalid share {proto.invalid_share} outside [0, 1]")
    # a sink receives every record it commits at least once (analyze's "sink
    # received" counts receipts, replays included, so it is never below the commits)
    committed = sum(map(len, report.outputs.values()))
    received = sum(p.get("sink_records") or 0 for p in report.timeline)
    if received < committed:
        wrong.append(f"sinks received {received} records but committed {committed}")
    copied = m.extra.get("redundancy")
    if copied and copied["copies_sent"] < 0:
        wrong.append(f"copies sent {copied['copies_sent']} < 0")
    return wrong


def analyze_rows(report) -> list[tuple]:
    """Analyze's failure rows for a drill's faulty run, by its own pure function on
    the rows a Spark task collects (events and progress points)."""
    records = [*report.events, *({"kind": "progress", **p} for p in report.timeline)]
    return failures_of(report.job_id, [(0, i, r) for i, r in enumerate(records)])


# -- a drill of each protocol -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", [
    "coordinated", "acks",
    pytest.param("none", marks=pytest.mark.slow),
    pytest.param("uncoordinated", marks=pytest.mark.slow),
    pytest.param("cic", marks=pytest.mark.slow),
    pytest.param("cec", marks=pytest.mark.slow)])
def test_every_printed_figure_of_a_drill_obeys_its_definition(protocol, storage, reference):
    report = bn.drill(pipeline(), protocol=with_interval(protocol, interval_s=0.3),
                      faults=the_kill(), reference=reference, storage=storage,
                      recovery=bn.Recovery(heartbeat_timeout_s=3.0))
    [fault] = report.faults
    assert fault.landed, fault.describe()
    assert check_figures(report) == [], report.summary_rows()
    assert fault.detection_s is not None and fault.restart_s is not None
    # recovery <= total recovery, printed as the report prints them
    described = fault.describe()
    if fault.recovery_s is not None and fault.trt_s is not None:
        assert f"recovery {fault.recovery_s:.2f} s, total recovery {fault.trt_s:.2f} s" \
            in described
        assert round(fault.recovery_s, 2) <= round(fault.trt_s, 2)
    assert ("figures", f"defined in {GLOSSARY}") in report.summary_rows()

    # one definition: the job master, tune's measurement and analyze report the
    # drill's own figures for its kill
    first = report.metrics.protocol.failures[0]
    assert first.failed_at_s == pytest.approx(fault.at_s)
    for name in ("detection_s", "restart_s", "recovery_s", "trt_s"):
        drilled, master = getattr(fault, name), getattr(first, name)
        assert master == (None if drilled is None else pytest.approx(drilled)), name
    outcome = front.kill_outcome_of(kills_of(the_kill()), report.events, report.timeline,
                                    report.metrics.duration_s, report.job_id)
    assert outcome.trt_s == (None if fault.trt_s is None else pytest.approx(fault.trt_s))
    row = analyze_rows(report)[0]
    assert row[3] == fault.what
    for got, drilled in zip(row[6:10], (fault.detection_s, fault.restart_s,
                                        fault.recovery_s, fault.trt_s)):
        assert got == (None if drilled is None else pytest.approx(drilled))


# -- the checker can fail ---------------------------------------------------------------------


def test_the_laws_catch_a_total_smaller_than_its_part():
    # the figures of the issue: recovery 0.80 s, total recovery 0.22 s
    doctored = RecoveryTimes(failed_at_s=1.0, detection_s=0.01, restart_s=0.2,
                             recovery_s=0.8, trt_s=0.22)
    assert doctored.violations() == ["total recovery 0.220 s < recovery 0.800 s"]
    assert RecoveryTimes(1.0, 0.05, 0.3, 0.2, 0.4).violations() == [
        "recovery 0.200 s < detection + restart 0.350 s"]
    assert RecoveryTimes(1.0, -0.1, 0.3, 0.5, 0.6).violations() == ["detection -0.100 s < 0"]
    assert RecoveryTimes(1.0, 0.01, 0.2, 0.5, 0.6).violations() == []
    outcome = FaultOutcome("kill double[0]", 1.0, landed=True, at_s=1.0, detection_s=0.01,
                           restart_s=0.2, recovery_s=0.8, trt_s=0.22)
    assert outcome.times().violations()


def test_the_checker_finds_a_doctored_drill_report(storage, reference):
    report = bn.drill(pipeline(), protocol=bn.protocols.Coordinated(interval_s=0.3),
                      faults=the_kill(), reference=reference, storage=storage,
                      recovery=bn.Recovery(heartbeat_timeout_s=3.0))
    assert check_figures(report) == []
    doctored = copy.deepcopy(report)
    fault = doctored.faults[0]
    fault.recovery_s, fault.trt_s = 0.8, 0.22
    doctored.timeline[5]["sink_records"] = -2009      # the negative rate of the issue
    doctored.metrics.protocol.failures[0].recovery_s = -1.0
    doctored.outputs = {"out": list(range(10 ** 6))}  # more committed than received
    found = check_figures(doctored)
    assert any(v.startswith("fault 1: total recovery 0.220 s < recovery 0.800 s")
               for v in found), found
    assert any("sink_records -2009 < 0" in v for v in found), found
    assert any(v.startswith("job master failure 1: recovery -1.000 s < 0") for v in found)
    assert any(v.startswith("sinks received") for v in found), found


# -- the same run reads the same in every command ---------------------------------------------


def ev(kind: str, t_s: float, **fields) -> dict:
    return {"kind": kind, "t": 1000.0 + t_s, "t_s": t_s, **fields}


def paced_timeline(kill_s: float, restart_s: float, backlog_end_s: float,
                   rate_back_s: float, until_s: float = 6.0) -> list[dict]:
    """0.1-s points of a paced source (100 records per point) and its sink: nothing
    while down, then a backlog that drains by ``backlog_end_s`` while the sinks'
    output stays low until ``rate_back_s`` (a slow sink: the case a "caught up"
    without the output rate would call recovered too early)."""
    points, t = [], 0.1
    backlog = 0
    while t < until_s:
        if kill_s <= t < restart_s:
            backlog += 100
            points.append({"t_s": t, "source_records": 0, "sink_records": 0,
                           "source_lag": backlog, "workers_answering": 1})
        elif t >= restart_s and backlog > 0 and t < backlog_end_s:
            drained = min(backlog, 300)
            backlog -= drained
            points.append({"t_s": t, "source_records": 100 + drained,
                           "sink_records": 100 if t >= rate_back_s else 20,
                           "source_lag": backlog + 3, "workers_answering": 1})
        else:
            backlog = 0
            points.append({"t_s": t, "source_records": 100,
                           "sink_records": 20 if restart_s <= t < rate_back_s else 100,
                           "source_lag": 3, "workers_answering": 1})
        t = round(t + 0.1, 10)
    return points


def test_drill_tune_and_analyze_give_the_same_times_for_one_timeline():
    events = [ev("started", 0), ev("fault", 2.0, what="kill double[0]", killed=["worker 0"]),
              ev("failure_detected", 2.05, reason="worker 0 died"),
              ev("restarted", 2.4, checkpoint=3, tasks=["double[0]"])]
    timeline = paced_timeline(2.0, 2.4, backlog_end_s=2.9, rate_back_s=3.5)
    kills = kills_of([bn.faults.KillInstance("double", 0, at=2.0)])
    [drilled] = fault_outcomes(kills, events, timeline, 6.0)
    # the output rate came back after the backlog was read: TRT is the later milestone
    assert caught_up_at(timeline, 2.0, 2.4) < rate_recovered_at(timeline, 2.0, 2.4)
    assert drilled.recovery_s == pytest.approx(rate_recovered_at(timeline, 2.0, 2.4) - 2.0)
    assert drilled.trt_s == pytest.approx(drilled.recovery_s)
    assert drilled.times().violations() == []

    run = SimpleNamespace(
        job_id="j", details={"events": events, "timeline": timeline, "started_s": 1000.0},
        metrics=SimpleNamespace(duration_s=6.0, latency_windows={},
                                latency_histogram=LatencyHistogram()))
    measured = front.measure_run(run, kills, interval_s=0.5)
    assert measured.detection_s == pytest.approx(drilled.detection_s)
    assert measured.restart_s == pytest.approx(drilled.restart_s)
    assert measured.measured_trt_s == pytest.approx(drilled.trt_s)

    [row] = failures_of("j", [(0, i, r) for i, r in enumerate(
        [*events, *({"kind": "progress", **p} for p in timeline)])])
    assert row[6:10] == pytest.approx((drilled.detection_s, drilled.restart_s,
                                       drilled.recovery_s, drilled.trt_s))
    # and the job master's pairing of the same events
    [(fault, detected, restarted)] = failures_in(events)
    assert recovery_times(timeline, fault["t_s"], detected["t_s"], restarted["t_s"]) \
        == drilled.times()


def test_without_an_injected_fault_the_failure_is_its_detection():
    events = [ev("started", 0), ev("failure_detected", 2.0, reason="worker 0 died"),
              ev("restarted", 2.4, checkpoint=3)]
    timeline = paced_timeline(2.0, 2.4, backlog_end_s=2.9, rate_back_s=2.6)
    [row] = failures_of("j", [(0, i, r) for i, r in enumerate(
        [*events, *({"kind": "progress", **p} for p in timeline)])])
    detection_s, restart_s, recovery_s, trt_s = row[6:10]
    assert detection_s is None and restart_s == pytest.approx(0.4)
    assert restart_s <= recovery_s <= trt_s


def test_a_warm_up_is_never_longer_than_the_catch_up_it_was_read_from():
    # U = 0.001: eq 5 solved for W reads 0.1 s of catch-up as ~100 s of warm-up
    m = tuning.Measurement(1.0, 1.0, 1.0, detection_s=0.01, restart_s=0.1,
                           measured_trt_s=0.21, reprocess_s=0.5)
    w = tuning.recovery_warmup_s(m, 0.001)
    assert w == pytest.approx(0.1) and not math.isclose(w, 0.1 * 999 - 0.61)
    model = tuning.build_model([m], tuning.Capacity(1000.0, 0.0))
    assert max(model.warmup_s) <= m.measured_trt_s
