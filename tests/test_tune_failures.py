"""Several failures per profiling run (``failures_per_run``, Chiron injects three):
each kill is its own measurement, the model takes the medians over an interval's kills
and repeats, the kills of a run are spaced so each recovery completes before the next,
and a run too short for them is read for longer — or, when the user fixed its length,
refused with the length it needs.

(a) plain Python: the grouping and the medians against medians taken by hand, the
kill layout, the refusals, the timeline's latency between kills; (b) one small real
profiling run (real Ray, one interval) whose three kills are each measured."""

from __future__ import annotations

import math
import statistics

import pytest

import bastion as bn
from bastion import cli
from bastion import tuning as front
from bastion.scheduler import tuning as tm
from bastion.scheduler.tuning import (Capacity, Measurement, build_model, profile_all,
                                      timeline_latency_ms)
from bastion.tuning import RayProfiler


def paced(count: int = 800, rate: float = 400.0) -> bn.Topology:
    topology = bn.Topology("tune-failures")
    nums = topology.source("nums", bn.sources.Generator(lambda i: i % 101, count=count,
                                                         rate=rate))
    nums.key_by(lambda v: v % 3).reduce("sum", lambda acc, v: acc + v, initial=0).sink(
        "out", bn.sinks.Collect())
    return topology


# -- (a) plain Python -------------------------------------------------------------------


def kills_of(interval_s: float, run: int, figures: list[tuple[float, float, float, float]]
             ) -> list[Measurement]:
    """One run's kills: (latency ms, T, R, TRT) each."""
    return [Measurement(interval_s, 500.0 + run, lat, t, r, measured_trt_s=trt,
                        reprocess_s=0.2 * (i + 1), job_id=f"run{run}-{interval_s:g}",
                        kill_index=i)
            for i, (lat, t, r, trt) in enumerate(figures)]


def test_every_kill_is_a_measurement_and_the_model_takes_medians_over_kills_and_repeats():
    # two intervals, two repeats of three kills each: six measurements per interval
    data = {1.0: [[(1.0, 0.1, 0.2, 1.0), (9.0, 0.1, 5.0, 9.0), (2.0, 0.3, 0.3, 1.2)],
                  [(3.0, 0.2, 0.4, 1.5), (1.5, 0.1, 0.25, 1.1), (2.5, 0.2, 0.3, 1.3)]],
            2.0: [[(1.0, 0.1, 0.2, 2.0), (1.2, 0.1, 0.2, 2.2), (1.1, 0.1, 0.2, 2.1)],
                  [(0.9, 0.1, 0.2, 1.9), (7.0, 0.4, 3.0, 6.0), (1.3, 0.1, 0.2, 2.3)]]}
    runs = [m for interval, repeats in data.items() for run, figures in enumerate(repeats)
            for m in kills_of(interval, run, figures)]
    model = build_model(runs, Capacity(1000.0, 0.0))
    assert [p.measurement.interval_s for p in model.points] == [1.0, 2.0]
    for point in model.points:
        flat = [f for figures in data[point.measurement.interval_s] for f in figures]
        m = point.measurement
        # by hand: the median of six values is the mean of the middle two
        for got, column in ((m.latency_avg_ms, 0), (m.detection_s, 1), (m.restart_s, 2),
                            (m.measured_trt_s, 3)):
            middle = sorted(f[column] for f in flat)[2:4]
            assert got == pytest.approx(sum(middle) / 2)
        assert m.ingest_avg_per_s == pytest.approx(500.5)
        # each run named once, though three kills came from it
        assert m.job_id.split() == [f"run0-{m.interval_s:g}", f"run1-{m.interval_s:g}"]
    # T and R of the cases pool every kill of every run: the median over all twelve
    assert model.points[0].trt.avg_s == pytest.approx(tm.trt_s(
        1.0, "avg", detection_s=statistics.median(m.detection_s for m in runs),
        restart_s=statistics.median(m.restart_s for m in runs),
        warmup_s=model.warmup_s[1], u=model.points[0].utilisation,
        completion_lag_s=model.completion_lag_s))


class ThreeKills:
    """A `Profiler` whose every run measured three kills."""

    def capacity(self):
        return Capacity(1000.0, 0.0, "cap")

    def profile(self, interval_s, seed):
        return kills_of(interval_s, seed, [(20.0 - interval_s, 0.1, 0.2 + 0.1 * k, None)
                                           for k in range(3)])


def test_profile_all_keeps_every_kill_of_every_run():
    seen = []
    capacity, measured = profile_all(ThreeKills(), [1.0, 2.0], repeats=2,
                                     progress=seen.append)
    assert len(measured) == 2 * 2 * 3
    assert [m.kill_index for m in measured] == [0, 1, 2] * 4
    assert [p["done"] for p in seen] == [0, 1, 2, 3, 4, 5, 6]   # runs, not kills
    result = bn.tune(None, trt_bound_s=10, min_interval_s=1, max_interval_s=2, points=2,
                     profiler=ThreeKills())
    assert len(result.measurements) == 6 and len(result.model.points) == 2


@pytest.mark.internal
def test_kills_of_a_run_are_a_recovery_apart_and_a_short_input_is_read_for_longer():
    profiler = RayProfiler(paced(count=800, rate=400.0), first_kill_after_s=1.0,
                           failures_per_run=3)
    gap = profiler.kill_gap_s(1.0)
    # before the capacity run: U taken as 1/2, so one second of backlog per second
    assert gap == pytest.approx(front.RECOVERY_ALLOWANCE_S + 1.0 + front.OUTAGE_ALLOWANCE_S)
    (lo, hi), length = profiler.kill_layout(1.0)
    assert length > 2.0                 # 800 records at 400/s: 2 s were too short
    assert hi == pytest.approx(length - gap)
    for seed in range(20):
        times = profiler.kill_times(1.0, seed)
        assert len(times) == 3 and lo <= times[0] and times[-1] <= hi + 1e-6
        assert all(b - a >= gap - 1e-3 for a, b in zip(times, times[1:]))
    longer = tm.lengthened(profiler.topology, length)
    source = longer.nodes["nums"].params["source"]
    assert source.count / source.rate >= length and source.rate == 400.0
    assert profiler.topology.nodes["nums"].params["source"].count == 800  # left alone
    # a utilisation of 0.8 (from the capacity run) reads four seconds of backlog a second
    profiler._utilisation = 0.8   # noqa: SLF001 - what capacity() sets
    assert profiler.kill_gap_s(1.0) == pytest.approx(
        front.RECOVERY_ALLOWANCE_S + 4 * (1.0 + front.OUTAGE_ALLOWANCE_S))
    # one kill: the old layout, untouched
    one = RayProfiler(paced(count=4000, rate=400.0), first_kill_after_s=1.0)
    assert one.kill_between_s == pytest.approx((4.0, 6.0))
    # the first kill comes after the settled start and two whole longest intervals:
    # L_avg is read over whole intervals before it
    late = RayProfiler(paced(count=4000, rate=400.0), first_kill_after_s=3.0)
    assert late.kill_between_s[0] >= tm.SETTLE_S + 2 * 3.0
    (lo, _), _ = RayProfiler(paced(count=800, rate=400.0), first_kill_after_s=3.0,
                             failures_per_run=2).kill_layout(3.0)
    assert lo >= tm.SETTLE_S + 2 * 3.0


def test_a_run_length_or_window_given_too_short_is_refused_naming_what_to_change():
    with pytest.raises(ValueError, match=r"duration_s=5: 3 kills .* need runs of at least "
                                         r"[\d.]+ s; raise duration_s, lower failures_per_run"):
        RayProfiler(paced(count=None), duration_s=5.0, first_kill_after_s=2.0,
                    failures_per_run=3)
    with pytest.raises(ValueError, match=r"kill_between_s=\(1.0, 2.0\): 3 kills .* widen it, "
                                         r"or lower failures_per_run"):
        RayProfiler(paced(), kill_between_s=(1.0, 2.0), failures_per_run=3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="failures_per_run must be an int >= 1"):
            bn.tune(paced(), trt_bound_s=5, failures_per_run=bad)
    # long enough: accepted as given
    RayProfiler(paced(count=None), duration_s=60.0, first_kill_after_s=2.0, failures_per_run=3)


def test_cli_refuses_a_failures_per_run_below_one(tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text("import bastion as bn\ntopology = bn.Topology('t')\n")
    with pytest.raises(SystemExit):
        cli.main(["tune", str(job), "--trt-bound", "5", "--failures-per-run", "0"])
    assert "--failures-per-run: 0 is too small" in capsys.readouterr().err


def test_latency_between_kills_comes_from_the_timeline_weighted_by_records():
    timeline = [{"t_s": 0.5, "sink_records": 100, "latency_mean_ms": 1.0},
                {"t_s": 1.0, "sink_records": 300, "latency_mean_ms": 3.0},
                {"t_s": 1.5, "sink_records": 0, "latency_mean_ms": None},
                {"t_s": 2.0, "sink_records": 100, "latency_mean_ms": 50.0}]
    assert timeline_latency_ms(timeline, 0.0, 1.5) == pytest.approx((100 + 900) / 400)
    assert timeline_latency_ms(timeline, 1.0, 1.5) is None
    assert timeline_latency_ms([{"t_s": 1.0, "sink_records": 5}], 0.0, 2.0) is None


def synthetic_run(recoveries: list[tuple[float, float, float, float]], end_s: float = 6.0):
    """A run's events and 0.1-s timeline, written by hand: 400 records/s, and per
    recovery (kill, detected, restarted, caught up) nothing read from the kill to the
    restart, a backlog until caught up (read at 1000/s), checkpoints every 0.5 s."""
    from bastion.faults import ScheduledKill

    events = [{"kind": "checkpoint_completed", "t_s": c / 2 + 0.05, "checkpoint_id": c,
               "duration_s": 0.05} for c in range(1, int(end_s * 2))]
    kills = []
    for i, (kill, detected, restarted, _) in enumerate(recoveries):
        what = f"kill op[{i}]"
        kills.append(ScheduledKill(kill, what, worker=0))
        events += [{"kind": "fault", "t_s": kill, "what": what, "killed": [0]}]
        if detected is not None:
            events.append({"kind": "failure_detected", "t_s": detected})
        events.append({"kind": "restarted", "t_s": restarted,
                       "checkpoint": int((kill - 0.05) * 2)})
    events.sort(key=lambda e: e["t_s"])
    timeline = []
    for k in range(1, int(end_s * 10) + 1):
        t = round(k * 0.1, 3)
        down = any(kill <= t < restarted for kill, _, restarted, _ in recoveries)
        behind = any(restarted <= t < caught for _, _, restarted, caught in recoveries)
        n = 0 if down else 100 if behind else 40
        timeline.append({"t_s": t, "source_records": n, "sink_records": n,
                         "source_lag": 200 if down or behind else 0, "workers_answering": 1,
                         "latency_mean_ms": 1.0})
    return kills, events, timeline


def test_a_kill_before_the_last_recovery_caught_up_leaves_that_recovery_without_a_trt():
    from bastion.drills import fault_outcomes

    # each recovery caught up before the next kill: both measured, each TRT the one
    # the drills' matching gives (`bastion.runtime.recovery_times`)
    kills, events, timeline = synthetic_run([(2.0, 2.01, 2.2, 2.8), (4.0, 4.01, 4.2, 4.8)])
    apart = front.kill_outcomes_of(kills, events, timeline, 6.0)
    drilled = fault_outcomes(kills, events, timeline, 6.0)
    assert [o.at_s for o in apart] == [2.0, 4.0]
    assert [o.trt_s for o in apart] == [d.trt_s for d in drilled]
    assert all(o.trt_s is not None and 2.0 + o.trt_s <= 4.0 for o in apart)
    assert [round(o.reprocess_s, 2) for o in apart] == [0.5, 0.5]
    # the second kill after the restart, before the catch-up: the first TRT is unknown
    kills, events, timeline = synthetic_run([(2.0, 2.01, 2.2, 3.5), (2.6, 2.61, 2.8, 3.5)])
    cut = front.kill_outcomes_of(kills, events, timeline, 6.0)
    assert [o.at_s for o in cut] == [2.0, 2.6]
    # the drills' matching gives the first a TRT that spans the second outage
    assert fault_outcomes(kills, events, timeline, 6.0)[0].trt_s > 0.6
    assert cut[0].trt_s is None and cut[0].restart_s == pytest.approx(0.19)
    assert cut[1].trt_s is not None
    # the second kill inside the first recovery (before its restart): not measured
    kills, events, timeline = synthetic_run([(2.0, 2.01, 2.4, 3.0), (2.1, None, 2.4, 3.0)])
    inside = front.kill_outcomes_of(kills, events, timeline, 6.0)
    assert [o.at_s for o in inside] == [2.0] and inside[0].trt_s is None


# -- (b) one real profiling run with three kills -------------------------------------------


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_real_profiling_run_measures_each_of_its_three_kills(tmp_path):
    result = bn.tune(paced(count=800, rate=400.0), trt_bound_s=30, min_interval_s=0.5,
                     max_interval_s=0.5, points=1, failures_per_run=3, max_rate_run_s=1.5,
                     storage=f"local://{tmp_path}/store")
    kills = sorted(result.measurements, key=lambda m: m.kill_index)
    assert [m.kill_index for m in kills] == [0, 1, 2], kills
    assert len({m.job_id for m in kills}) == 1          # one run, three kills
    ats = [m.kill_at_s for m in kills]
    assert all(b > a for a, b in zip(ats, ats[1:]))
    for m in kills:
        assert m.restart_s > 0 and m.detection_s >= 0 and m.ingest_avg_per_s > 0
        assert math.isfinite(m.latency_avg_ms) and m.reprocess_s is not None
    # each recovery caught up before the next kill (the layout's purpose)
    seen = [m for m in kills if m.measured_trt_s is not None]
    assert len(seen) >= 2, kills
    for a, b in zip(kills, kills[1:]):
        if a.measured_trt_s is not None:
            assert a.kill_at_s + a.measured_trt_s <= b.kill_at_s
    point = result.model.points[0].measurement
    assert point.restart_s == pytest.approx(statistics.median(m.restart_s for m in kills))
