"""Checkpoint-interval tuning (Chiron): the model, the optimiser, and `bn.tune` end to end.

(a) The TRT heuristic (eqs 1–5) is checked against an independent brute-force loop
over the catch-up series, and against numbers worked out by hand. (b) The optimiser
must pick the interval with the least latency whose TRT stays under the bound, and
say so plainly when none does; the checks that say so are also run against
deliberately broken copies of the module (the bound check inverted, the latency
objective reversed, a fit fed reversed data), and each copy must fail them — a test
suite that a broken optimiser passes would prove nothing. (c) `bn.tune` and
`bastion tune` profile a tiny topology on the session's real Ray, with two short
runs and one unthrottled run each; they assert what the tuner guarantees (a
measurement per interval, a decision consistent with its own model, the page
written), never how fast anything ran.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import statistics
import sys
import threading
import types
from pathlib import Path

import pytest

import bastion as bn
from bastion import cli
from bastion import tuning as front
from bastion.runtime.recovery_times import caught_up_at
from bastion.scheduler import tuning as tm
from bastion.scheduler.tuning import (Capacity, Measurement, build_model, catch_up_s,
                                      catch_up_terms, fit_quadratic, grid, optimise,
                                      trt_estimate, utilisation)

# -- (a) the model against a brute force ------------------------------------------------------


def brute_force_trt(interval_s, case, T, R, W, i_avg, i_max, stop):
    """Eqs 1–5 written out the slow way: add the catch-up terms one by one."""
    U = i_avg / i_max                                    # eq 1
    E = {"min": 0.0, "avg": interval_s / 2, "max": interval_s}[case]
    term = (E + T + R + W) * U                           # eq 2, n = 1
    total = 0.0
    while True:
        total += term                                    # eqs 3-4, summed term by term
        if term < stop:                                  # the first term below the stop
            break
        term = term * U                                  # eq 2, n > 1
    return T + R + total                                 # eq 5


HAND_MADE = [  # interval, T, R, W, I_avg, I_max, stop
    (1.0, 1.0, 0.5, 0.2, 500.0, 1000.0, 0.001),
    (8.0, 0.02, 0.07, 0.8, 499.0, 77_552.0, 0.001),
    (4.0, 2.0, 3.0, 0.0, 900.0, 1000.0, 0.001),
    (0.5, 0.1, 0.1, 0.1, 1.0, 3.0, 0.05),
    (3.0, 1.0, 1.0, 0.5, 0.0, 100.0, 0.001),             # idle: nothing to catch up
]


@pytest.mark.parametrize("interval_s, T, R, W, i_avg, i_max, stop", HAND_MADE)
def test_trt_matches_a_brute_force_sum_of_the_catch_up_series(interval_s, T, R, W, i_avg,
                                                              i_max, stop):
    u = utilisation(i_avg, i_max)
    estimate = trt_estimate(interval_s, detection_s=T, restart_s=R, warmup_s=W, u=u,
                            stop_term_s=stop)
    for case in ("min", "avg", "max"):
        expected = brute_force_trt(interval_s, case, T, R, W, i_avg, i_max, stop)
        assert estimate.of(case) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert estimate.min_s <= estimate.avg_s <= estimate.max_s


def test_trt_by_hand():
    # T = R = 1, W = 0, U = 0.5, stop 0.3; best case E = 0: outage 2 s, C(1) = 1.0,
    # C(2) = 0.5, C(3) = 0.25 < 0.3 (the last term): S = 1.75, TRT = 1 + 1 + 1.75.
    assert catch_up_terms(1.0, 0.5, 0.3) == [1.0, 0.5, 0.25]
    assert catch_up_s(2.0, 0.5, 0.3) == (pytest.approx(1.75), 3)
    estimate = trt_estimate(2.0, detection_s=1, restart_s=1, warmup_s=0, u=0.5,
                            stop_term_s=0.3)
    assert estimate.min_s == pytest.approx(3.75)
    # worst case E = 2: outage 4 s, C = 2, 1, 0.5, 0.25: S = 3.75, TRT = 5.75
    assert estimate.max_s == pytest.approx(5.75)


def test_a_job_at_capacity_never_catches_up_and_says_so():
    with pytest.raises(ValueError, match=r"U = I_avg / I_max .* >= 1"):
        utilisation(1000.0, 1000.0)
    with pytest.raises(ValueError, match="ingest_max_per_s"):
        utilisation(10.0, 0.0)


def test_quadratic_fit_recovers_a_parabola_and_inverts_it():
    xs = [0.5, 2.0, 3.5, 5.0, 6.5, 8.0]
    fit = fit_quadratic(xs, [0.25 * x * x - 3 * x + 20 for x in xs])
    assert (fit.a, fit.b, fit.c) == pytest.approx((0.25, -3.0, 20.0))
    assert fit.solve(20.0) == pytest.approx([0.0, 12.0])
    assert fit.vertex() == pytest.approx(6.0)
    line = fit_quadratic([1.0, 2.0], [3.0, 5.0])   # two points: a line
    assert (line.a, line.b, line.c) == pytest.approx((0.0, 2.0, 1.0))
    with pytest.raises(ValueError, match="as many x as y"):
        fit_quadratic([1.0], [1.0, 2.0])


def test_the_latency_fit_keeps_a_parabola_only_where_the_points_bend():
    xs = [0.5, 1.2, 1.9, 2.6, 3.3, 4.0]

    def model(latencies_ms):
        return build_model([Measurement(x, 500.0, lat, 0.1, 0.2)
                            for x, lat in zip(xs, latencies_ms)], Capacity(1000.0, 0.0))

    # a benchmark's medians: a latency the interval does not move, scattered by the
    # load of a shared machine. A parabola through them bends up at the ends (1.12 ms
    # at 4 s); the drills there measure what the points say on average
    noise = [0.86, 1.25, 0.83, 0.93, 0.91, 1.20]
    flat = model(noise).latency_fit
    assert fit_quadratic(xs, noise)(4.0) > 1.1
    assert (flat.a, flat.b) == (0.0, 0.0)
    assert flat(4.0) == pytest.approx(statistics.mean(noise))
    # where the latency does fall with the interval (frequent checkpoints cost it), the
    # fit follows: a line stays a line, and a parabola a parabola
    line = model([5.0 - x for x in xs]).latency_fit
    assert (line.a, line.b, line.c) == pytest.approx((0.0, -1.0, 5.0))
    bend = model([0.5 * x * x - 4 * x + 10 for x in xs]).latency_fit
    assert (bend.a, bend.b, bend.c) == pytest.approx((0.5, -4.0, 10.0))
    # a checkpoint's cost spread over its interval: the latency falls as 1/CI, which
    # no parabola follows (the benchmark's 1 M-entry table: 3.4 ms at 0.5 s, 1.1-1.3
    # beyond 2 s); the reciprocal predicts the points left out best, and is chosen
    falling = model([1.0 + 1.2 / x for x in xs]).latency_fit
    assert falling == tm.Reciprocal(pytest.approx(1.2), pytest.approx(1.0))
    measured = [3.4, 1.4, 1.2, 1.1, 1.2, 1.3]
    assert isinstance(model(measured).latency_fit, tm.Reciprocal)
    assert tm.fit_reciprocal(xs, measured)(0.5) == pytest.approx(3.26, abs=0.01)
    assert fit_quadratic(xs, measured)(0.5) < 3.2   # the parabola, for contrast
    # too few intervals to leave one out: the paper's fit
    assert tm.fit_cross_validated([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == fit_quadratic(
        [1.0, 2.0, 3.0], [1.0, 3.0, 2.0])


def test_grid_is_evenly_spaced_between_the_ends():
    assert grid(0.5, 8, 6) == pytest.approx([0.5, 2.0, 3.5, 5.0, 6.5, 8.0])
    with pytest.raises(ValueError, match="points"):
        grid(0.5, 8, 1)
    with pytest.raises(ValueError, match="min_interval_s"):
        grid(8, 0.5, 3)


def test_capacity_and_ingest_rate_from_a_timeline():
    # 0.1 s samples: ramps 0 -> 1000 -> 2000 records/s, then 3000/s steady
    steps = [0, 100, 200] + [300] * 20
    timeline = [{"t_s": 0.1 * i, "source_records": n, "sink_records": n}
                for i, n in enumerate(steps)]
    cap = tm.capacity_of(timeline)
    assert cap.ingest_max_per_s == pytest.approx(3000.0)
    # the ramp read 300 records in 0.2 s where full speed reads 600: 0.1 s lost
    assert cap.warmup_s == pytest.approx(0.1)
    assert tm.ingest_rate(timeline, 1.0, 2.0) == pytest.approx(3000.0)


def test_warm_up_after_a_restart_is_eq_5_solved_for_w():
    # U = 0.5, T = 0.5, R = 0.5, E = 1: outage without W 2 s; observed TRT 4 s means a
    # catch-up of 3 s = (2 + W) * U / (1 - U): W = 1 s
    m = Measurement(2.0, 500.0, 1.0, 0.5, 0.5, measured_trt_s=4.0, reprocess_s=1.0)
    assert tm.recovery_warmup_s(m, 0.5) == pytest.approx(1.0)
    assert tm.recovery_warmup_s(Measurement(2.0, 500.0, 1.0, 0.5, 0.5), 0.5) is None
    # per case: the least W seen, the mean (or the cold start's when larger), the 90%
    # quantile (between 1 and 6: 1 + 0.8 * 5)
    runs = [Measurement(ci, 500.0, 1.0, 0.5, 0.5, measured_trt_s=trt, reprocess_s=1.0)
            for ci, trt in ((1.0, 4.0), (2.0, 3.0), (3.0, 9.0))]   # W = 1, 0, 6
    assert build_model(runs, Capacity(1000.0, 0.2)).warmup_s == pytest.approx((0, 7 / 3, 5))
    assert build_model(runs, Capacity(1000.0, 2.5)).warmup_s == pytest.approx((0, 2.5, 5))
    model = build_model(runs, Capacity(1000.0, 0.2))
    for p in model.points:   # and the estimates use them, case by case
        m = p.measurement
        for case, w in zip(("min", "avg", "max"), (0.0, 7 / 3, 5.0)):
            assert p.trt.of(case) == pytest.approx(brute_force_trt(
                m.interval_s, case, m.detection_s, m.restart_s, w, 500.0, 1000.0, 0.001))
    assert build_model([Measurement(1.0, 500.0, 1.0, 0.5, 0.5)],
                       Capacity(1000.0, 0.3)).warmup_s == (0.3, 0.3, 0.3)


def test_warm_up_cases_are_the_mean_and_a_quantile_of_the_recoveries():
    # U = 0.5, T = R = 0.5, E = 1: W = TRT - 3 (eq 5 solved for W)
    def run(ci, w):
        return Measurement(ci, 500.0, 1.0, 0.5, 0.5, measured_trt_s=3.0 + w,
                           reprocess_s=1.0)

    # a skewed spread: the expected TRT is the TRT at the mean W, not the median's
    skewed = build_model([run(1.0, 0.0), run(2.0, 0.0), run(3.0, 3.0)],
                         Capacity(1000.0, 0.0))
    assert skewed.warmup_s[1] == pytest.approx(1.0)
    mean_trt = statistics.mean(brute_force_trt(2.0, "avg", 0.5, 0.5, w, 500.0, 1000.0,
                                               0.001) for w in (0.0, 0.0, 3.0))
    assert skewed.points[1].trt.avg_s == pytest.approx(mean_trt, abs=0.01)
    # twenty recoveries, W 0.1 ... 1.9 s and one a burst of load stretched to 40 s: the
    # worst case covers 90% of them (between the 18th and 19th: 1.8 + 0.1 * 0.1), not
    # the one burst; the mean still counts it
    ws = [0.1 * i for i in range(1, 20)] + [40.0]
    disturbed = build_model([run(1.0 + i % 2, w) for i, w in enumerate(ws)],
                            Capacity(1000.0, 0.05))
    assert disturbed.warmup_s == pytest.approx((0.05, statistics.mean(ws), 1.81))
    assert tm.quantile([3.0, 1.0, 2.0], 1.0) == 3.0 and tm.quantile([3.0, 1.0], 0.5) == 2.0


def test_the_catch_up_rate_is_fitted_to_the_recoveries():
    # recoveries that read their backlog at 800 records/s where the unthrottled run
    # read 1000/s, with I_avg 400/s and W 0.3 s: C = (E+T+R+W)·U/(1-U), U = 0.5
    def recovery(ci, e, w=0.3, rate=800.0):
        u = 400.0 / rate
        return Measurement(ci, 400.0, 1.0, 0.1, 0.2, reprocess_s=e,
                           measured_trt_s=0.3 + (e + 0.3 + w) * u / (1 - u))

    runs = [recovery(ci, e) for ci, e in ((1.0, 0.4), (2.0, 1.1), (3.0, 1.6), (4.0, 2.9))]
    assert tm.catch_up_rate(runs, 1000.0) == pytest.approx(800.0)
    model = build_model(runs, Capacity(1000.0, 0.3))   # a cold start of 0.3 s too
    assert model.catch_up_per_s == pytest.approx(800.0)
    assert model.warmup_s == pytest.approx((0.3, 0.3, 0.3))
    for p in model.points:   # eqs 1-5 with the recoveries' rate as I_max
        assert p.utilisation == pytest.approx(0.5)
        for case in ("min", "avg", "max"):
            assert p.trt.of(case) == pytest.approx(brute_force_trt(
                p.measurement.interval_s, case, 0.1, 0.2, 0.3, 400.0, 800.0, 0.001))
    # one recovery of five a burst of load stretched by 5 s does not move the rate
    stretched = recovery(2.0, 1.4)
    stretched = Measurement(2.0, 400.0, 1.0, 0.1, 0.2, reprocess_s=1.4,
                            measured_trt_s=stretched.measured_trt_s + 5.0)
    assert tm.catch_up_rate(runs + [stretched], 1000.0) == pytest.approx(800.0, rel=0.05)
    # without recoveries that differ in their outage, the unthrottled rate (the paper)
    same = [recovery(ci, 1.0) for ci in (1.0, 2.0, 3.0)]
    assert tm.catch_up_rate(same, 1000.0) == 1000.0
    assert tm.catch_up_rate(runs[:2], 1000.0) == 1000.0


def test_restart_cases_pool_every_run_whatever_its_interval():
    # eleven runs over two intervals, T + R from 0.3 s to 1.3 s and one burst of load
    # (5 s): the fastest restart was seen at 2 s, and it is the best case at 1 s too;
    # the average case is the median T and R; the worst the 90% quantile (the 10th of
    # eleven, 1.2 s), not the burst. W = 0 everywhere.
    restarts = [(0.1, 0.2 + 0.1 * i) for i in range(10)] + [(0.5, 4.5)]
    runs = [Measurement(1.0 if i % 2 else 2.0, 500.0, 1.0, t, r)
            for i, (t, r) in enumerate(restarts)]
    model = build_model(runs, Capacity(1000.0, 0.0))
    median_r = statistics.median(r for _, r in restarts)
    for p in model.points:
        ci = p.measurement.interval_s
        for case, (t, r) in zip(("min", "avg", "max"),
                                ((0.1, 0.2), (0.1, median_r), (0.1, 1.1))):
            assert p.trt.of(case) == pytest.approx(brute_force_trt(
                ci, case, t, r, 0.0, 500.0, 1000.0, 0.001)), (ci, case)


def test_repeated_runs_of_an_interval_are_modelled_by_their_medians():
    runs = [Measurement(1.0, 500.0, lat, t, r, measured_trt_s=trt, reprocess_s=0.5,
                        job_id=f"j{i}")
            for i, (lat, t, r, trt) in enumerate([(1.0, 0.1, 0.2, 1.0), (9.0, 0.1, 5.0, 9.0),
                                                   (2.0, 0.3, 0.3, 1.2)])]
    runs.append(Measurement(2.0, 500.0, 3.0, 0.1, 0.2))
    model = build_model(runs, Capacity(1000.0, 0.0))
    assert [p.measurement.interval_s for p in model.points] == [1.0, 2.0]
    one = model.points[0].measurement
    assert (one.latency_avg_ms, one.detection_s, one.restart_s, one.measured_trt_s) == (
        2.0, 0.1, 0.3, 1.2)
    assert one.job_id == "j0 j1 j2"


def test_reprocessed_time_is_the_age_of_the_restored_checkpoint():
    events = [{"kind": "checkpoint_completed", "t_s": 1.1, "checkpoint_id": 1,
               "duration_s": 0.1},
              {"kind": "checkpoint_completed", "t_s": 2.2, "checkpoint_id": 2,
               "duration_s": 0.2},
              {"kind": "fault", "t_s": 2.7},
              {"kind": "restarted", "t_s": 2.9, "checkpoint": 2}]
    assert tm.reprocessed_s(events, 2.7) == pytest.approx(0.7)   # taken at 2.0 s
    events[-1]["checkpoint"] = None     # from the beginning: the schedule starts over
    assert tm.reprocessed_s(events, 2.7) is None


def test_e_counts_from_the_last_completed_checkpoint():
    # checkpoints take d = 0.4 s to complete: a kill in the 0.4 s after a trigger
    # restores the checkpoint before, so E runs from d to CI + d, CI/2 + d on average
    assert [tm.reprocess_s(2.0, c, 0.4) for c in ("min", "avg", "max")] == pytest.approx(
        [0.4, 1.4, 2.4])
    events = [{"kind": "checkpoint_completed", "t_s": t, "checkpoint_id": i,
               "duration_s": d} for i, (t, d) in enumerate([(1.3, 0.3), (2.5, 0.5),
                                                             (3.9, 0.9)], 1)]
    assert tm.checkpoint_duration_s(events, 3.0) == pytest.approx(0.4)  # before the kill
    assert tm.checkpoint_duration_s(events, 1.0) is None
    # the model takes the runs' median d for every case of every interval
    runs = [Measurement(ci, 500.0, 1.0, 0.1, 0.2, checkpoint_s=d)
            for ci, d in ((1.0, 0.3), (2.0, 0.4), (3.0, 2.0))]
    model = build_model(runs, Capacity(1000.0, 0.0))
    assert model.completion_lag_s == pytest.approx(0.4)
    assert model.reprocess_s(3.0, "avg") == pytest.approx(1.9)
    for p in model.points:
        for case in ("min", "avg", "max"):
            # brute_force_trt's E is the paper's; d moves it as W does (both add to
            # the outage E+T+R+W)
            assert p.trt.of(case) == pytest.approx(brute_force_trt(
                p.measurement.interval_s, case, 0.1, 0.2, 0.4, 500.0, 1000.0, 0.001))


def test_catching_up_counts_only_samples_every_worker_answered():
    def point(t, lag, answering=2):
        return {"t_s": t, "source_lag": lag, "sink_records": 10, "source_records": 10,
                "workers_answering": answering}

    timeline = [point(1.0, 5), point(1.5, 3), point(2.0, 400), point(2.5, 0, answering=1),
                point(3.0, 200), point(3.5, 4)]
    # killed at 1.6 s, restarted at 2.0 s: the lone-worker sample at 2.5 s shows no
    # backlog only because the busy source did not answer; caught up at 3.5 s
    assert caught_up_at(timeline, 1.6, 2.0) == 3.5


def test_caught_up_once_the_backlog_is_within_one_samples_input():
    def point(t, lag, read=140):
        return {"t_s": t, "source_lag": lag, "sink_records": read, "source_records": read,
                "workers_answering": 1}

    # 140 records per 0.1 s sample before the kill at 1.05 s, a backlog of a few
    # records at most; restarted at 1.3 s
    before = [point(0.1 * i, i % 5) for i in range(1, 11)]
    after = [point(1.4, 270, 768), point(1.5, 9, 470), point(1.6, 140), point(1.7, 181),
             point(1.8, 0)]
    # 9 records behind at 1.5 s (7 ms of input) is caught up: the hiccup at 1.7 s
    # came after the catch-up and does not lengthen it. The 5 records above the
    # steady level (4) drain at the fastest rate the catch-up showed (768 records
    # in the 0.1 s after the restart) less the 1,400 arriving per second.
    assert caught_up_at(before + after, 1.05, 1.3) == pytest.approx(1.5 + 5 / 6280)
    # a backlog of more than one sample's input is still being caught up
    after[1] = point(1.5, 200, 470)
    assert caught_up_at(before + after, 1.05, 1.3) == pytest.approx(1.6 + 136 / 6280)


@pytest.mark.parametrize("seed", range(20))
def test_caught_up_where_a_draining_backlog_meets_its_steady_level(seed):
    """A source reads a backlog at 3,300/s while input arrives at 1,330/s, sampled
    every 0.1 s at a random phase (the job master's polls): the catch-up ends where
    the backlog line, worked out here in plain arithmetic, meets the pre-fault level
    — not at the first sample within a sample's input, which is up to 70 ms early."""
    rng = random.Random(seed)
    arriving, reading, steady = 1330.0, 3300.0, 1
    restarted_s, backlog = 5.0 + rng.random() * 0.1, rng.uniform(300, 3000)
    truth = restarted_s + (backlog - steady) / (reading - arriving)

    def lag(t):
        return backlog if t < restarted_s else max(
            steady, backlog - (reading - arriving) * (t - restarted_s))

    fault_s = restarted_s - 0.3
    phase = rng.random() * 0.1
    timeline, previous = [], 0.0
    for t in [phase + 0.1 * k for k in range(1, 100)]:
        if t < fault_s:            # running: input read as it arrives
            point = (steady, arriving * (t - previous), 1)
        elif t < restarted_s:      # down: nothing read, nobody answers
            point = (0, 0.0, 0)
        else:                      # catching up: what arrived and what drained
            since = max(previous, restarted_s)
            point = (lag(t), arriving * (t - since) + lag(since) - lag(t), 1)
        timeline.append({"t_s": t, "source_lag": round(point[0]),
                         "source_records": round(point[1]), "sink_records": 1,
                         "workers_answering": point[2]})
        previous = t
    caught = caught_up_at(timeline, fault_s, restarted_s)
    assert caught == pytest.approx(truth, abs=0.004)


# -- (b) the optimiser ------------------------------------------------------------------------

INTERVALS = [0.5, 2.0, 3.5, 5.0, 6.5, 8.0]


def synthetic_model(module=tm):
    """TRT rises with the interval (T = 1, R = 0.5, W = 0, U = 0.5); latency falls
    along an exact parabola (its least value at 8 s)."""
    measurements = [module.Measurement(interval_s=ci, ingest_avg_per_s=500.0,
                                       latency_avg_ms=0.25 * ci * ci - 4.5 * ci + 40.0,
                                       detection_s=1.0, restart_s=0.5)
                    for ci in INTERVALS]
    return module.build_model(measurements, module.Capacity(1000.0, 0.0))


def optimiser_failures(module) -> list[str]:
    """Every expectation of the optimiser that ``module`` breaks (empty: none)."""
    failures = []
    model = synthetic_model(module)
    # Worst case with U = 0.5: TRT ≈ 1.5 + (CI + 1.5) = 3 + CI.
    choice = module.optimise(model, 7.0, 0.5, 8.0, "max")
    if choice.interval_s is None:
        return ["bound 7 s: no interval chosen, but intervals up to ~4 s meet it"]
    if not choice.interval_s == pytest.approx(4.0, abs=0.01):
        failures.append(f"bound 7 s: chose {choice.interval_s}, expected ~4.0 s (the "
                        "longest interval under the bound has the least latency)")
    if choice.trt is None or choice.trt.max_s > 7.0 + 1e-6:
        failures.append(f"bound 7 s: chosen interval's TRT {choice.trt} is over the bound")
    if choice.latency_ms is None or not choice.latency_ms == pytest.approx(
            0.25 * 16 - 4.5 * 4 + 40, abs=0.1):
        failures.append(f"bound 7 s: latency {choice.latency_ms}, expected ~26 ms")
    # The average case is looser: TRT ≈ 3 + CI/2 <= 7 up to CI = 8.
    avg = module.optimise(model, 7.0, 0.5, 8.0, "avg")
    if avg.interval_s is None or not avg.interval_s == pytest.approx(8.0, abs=0.01):
        failures.append(f"average case: chose {avg.interval_s}, expected 8.0 s")
    # Generous bound: every interval qualifies, the least latency is at the maximum.
    wide = module.optimise(model, 100.0, 0.5, 8.0, "max")
    if wide.interval_s is None or not wide.interval_s == pytest.approx(8.0):
        failures.append(f"bound 100 s: chose {wide.interval_s}, expected 8.0 s")
    # Nothing meets a bound below T + R.
    none = module.optimise(model, 1.0, 0.5, 8.0, "max")
    if none.interval_s is not None or "no checkpoint interval" not in none.reason:
        failures.append(f"bound 1 s: chose {none.interval_s} ({none.reason!r}), expected "
                        "'no checkpoint interval ... meets the bound'")
    return failures


def test_the_optimiser_picks_the_least_latency_interval_under_the_bound():
    assert optimiser_failures(tm) == []


def test_no_interval_meeting_the_bound_is_said_plainly():
    choice = optimise(synthetic_model(), 1.0, 0.5, 8.0)
    assert choice.interval_s is None and choice.trt is None and choice.latency_ms is None
    assert choice.reason.startswith("no checkpoint interval in [0.5, 8] s meets the bound")


def test_the_optimiser_refuses_bad_options_by_name():
    model = synthetic_model()
    with pytest.raises(ValueError, match="trt_bound_s"):
        optimise(model, 0.0, 0.5, 8.0)
    with pytest.raises(ValueError, match="min_interval_s <= max_interval_s"):
        optimise(model, 5.0, 8.0, 0.5)
    with pytest.raises(ValueError, match="case"):
        optimise(model, 5.0, 0.5, 8.0, "worst")  # type: ignore[arg-type]


MUTANTS = {
    "bound check inverted": ("if fit((lo + hi) / 2) <= trt_bound_s]",
                             "if fit((lo + hi) / 2) >= trt_bound_s]"),
    "latency objective reversed": ("best = min(candidates,", "best = max(candidates,"),
    "TRT fit fed reversed data": ("trts = {c: [p.trt.of(c) for p in points] for c in CASES}",
                                  "trts = {c: [p.trt.of(c) for p in points][::-1] "
                                  "for c in CASES}"),
    "latency fit fed reversed data": (
        "latencies = [p.measurement.latency_avg_ms for p in points]",
        "latencies = [p.measurement.latency_avg_ms for p in points][::-1]"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_optimiser_is_caught(mutant):
    """The module's own source, with one deliberate bug, loaded as a fresh module:
    the optimiser's checks must fail on it."""
    source = Path(tm.__file__).read_text()
    old, new = MUTANTS[mutant]
    assert source.count(old) == 1, f"mutation point of {mutant!r} not found once"
    name = f"_tuning_mutant_{abs(hash(mutant))}"
    module = types.ModuleType(name)
    module.__file__ = f"<{mutant}>"
    sys.modules[name] = module  # dataclasses look their module up while building
    try:
        exec(compile(source.replace(old, new), module.__file__, "exec"), module.__dict__)
        assert optimiser_failures(module) != [], f"{mutant}: the checks did not notice"
    finally:
        del sys.modules[name]


class RecordingProfiler:
    """A `Profiler` that measures nothing: it returns fixed figures and records how
    many profiling runs were under way at once (the interface `bn.tune` accepts in
    place of the Ray profiler)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.both_started = threading.Barrier(2, timeout=10)

    def capacity(self):
        self.capacity_runs = getattr(self, "capacity_runs", 0) + 1
        return Capacity(900.0 + 100.0 * self.capacity_runs, 0.0)

    def profile(self, interval_s, seed):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            self.both_started.wait()   # only passes when two runs are under way at once
        except threading.BrokenBarrierError:
            pass
        with self.lock:
            self.running -= 1
        return Measurement(interval_s, 500.0, 20.0 - interval_s, 1.0, 0.5)


def test_profiling_runs_side_by_side_when_asked():
    seen = []
    side_by_side = RecordingProfiler()
    result = bn.tune(None, trt_bound_s=10, min_interval_s=1, max_interval_s=4, points=4,
                     parallel=2, profiler=side_by_side, progress=seen.append)
    assert side_by_side.most == 2
    assert [m.interval_s for m in result.measurements] == [1.0, 2.0, 3.0, 4.0]
    assert [p["done"] for p in seen] == [0, 1, 2, 3, 4, 5]
    quick = RecordingProfiler()
    quick.both_started = threading.Barrier(2, timeout=0.05)
    repeated = bn.tune(None, trt_bound_s=10, min_interval_s=1, max_interval_s=4, points=2,
                       repeats=3, profiler=quick)
    # in rounds over the grid: a burst of load hits one run of each interval
    assert [m.interval_s for m in repeated.measurements] == [1.0, 4.0] * 3
    assert len(repeated.model.points) == 2
    assert quick.capacity_runs == 3
    assert repeated.capacity.ingest_max_per_s == 1100.0   # the median of 1000, 1100, 1200
    one_by_one = RecordingProfiler()
    one_by_one.both_started = threading.Barrier(2, timeout=0.05)
    bn.tune(None, trt_bound_s=10, min_interval_s=1, max_interval_s=4, points=4,
            profiler=one_by_one)
    assert one_by_one.most == 1


# -- (c) end to end on real Ray -----------------------------------------------------------

TINY_JOB = '''
import bastion as bn


def value_at(i):
    return i % 101


topology = bn.Topology("tune-tiny")
nums = topology.source("nums", bn.sources.Generator(value_at, count=1000, rate=400))
nums.map("square", lambda v: v * v).key_by(lambda v: v % 3).reduce(
    "sum", lambda acc, v: acc + v, initial=0).sink("out", bn.sinks.Collect())
'''


def tiny_topology():
    namespace: dict = {}
    exec(compile(TINY_JOB, "<tiny>", "exec"), namespace)
    return namespace["topology"]


def check_consistent(result, intervals, bound_s):
    assert [m.interval_s for m in result.measurements] == pytest.approx(intervals)
    for m in result.measurements:
        assert m.ingest_avg_per_s > 0 and m.restart_s >= 0 and m.detection_s >= 0
        assert math.isfinite(m.latency_avg_ms) and m.job_id
    assert result.capacity.ingest_max_per_s > max(m.ingest_avg_per_s
                                                  for m in result.measurements)
    for p in result.model.points:
        assert 0 <= p.utilisation < 1
        assert p.trt.min_s <= p.trt.avg_s <= p.trt.max_s
    if result.interval_s is not None:
        assert intervals[0] <= result.interval_s <= intervals[-1]
        assert result.model.trt(result.interval_s).max_s <= bound_s + 1e-6
        assert result.trt_s == pytest.approx(tuple(
            result.model.trt(result.interval_s).of(c) for c in ("min", "avg", "max")))
    else:
        assert "no checkpoint interval" in result.reason


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_tune_profiles_a_real_topology(tmp_path):
    seen = []
    result = bn.tune(tiny_topology(), trt_bound_s=30, min_interval_s=0.5, max_interval_s=1.5,
                     points=2, max_rate_run_s=2.0, storage=f"local://{tmp_path}/store",
                     progress=seen.append, failures_per_run=1)
    assert isinstance(result, bn.TuningResult)
    check_consistent(result, [0.5, 1.5], 30)
    assert [p["done"] for p in seen] == [0, 1, 2, 3] and seen[-1]["total"] == 3
    # TRT under 30 s is far above what a tiny job needs to recover: an interval is
    # chosen, and the reason says which.
    assert result.interval_s is not None and "checkpoint every" in result.reason
    from bastion.tuning import write_html

    page = write_html(result, tmp_path / "t.html")
    text = page.read_text()
    assert "<svg" in text and "bound 30 s" in text and "http" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_bastion_tune_prints_the_table_and_the_choice(tmp_path, capsys):
    job = tmp_path / "tiny_job.py"
    job.write_text(TINY_JOB)
    html = tmp_path / "tune.html"
    code = cli.main(["tune", str(job), "--trt-bound", "30", "--min", "0.5", "--max", "1.5",
                     "--points", "2", "--max-rate-run", "2", "--failures-per-run", "1",
                     "--storage",
                     f"local://{tmp_path}/store", "--html", str(html)])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_OK, err
    assert "profiling [" in err and "3/3 runs" in err
    assert "TRT max" in out and "checkpoint every" in out and "checkpoint_interval = " in out
    judged = r"([-\d.]+|flat \(off <= [\d.]+%\))"   # an R², or a flat fit's largest error
    assert re.search(rf"fits R²: latency {judged}, TRT min/avg/max {judged}/{judged}/{judged}",
                     out)
    assert "<svg" in html.read_text() and "fits R²" in html.read_text()


def test_cli_tune_and_auto_refuse_bad_options_before_anything_runs(tmp_path, capsys):
    job = tmp_path / "tiny_job.py"
    job.write_text(TINY_JOB)
    assert cli.main(["run", str(job), "--checkpoint-interval", "auto"]) == cli.EXIT_USAGE
    assert "--checkpoint-interval auto needs --trt-bound" in capsys.readouterr().err
    assert cli.main(["run", str(job), "--trt-bound", "5"]) == cli.EXIT_USAGE
    assert "pass --checkpoint-interval auto" in capsys.readouterr().err
    assert cli.main(["tune", str(job), "--trt-bound", "5", "--protocol", "none"]) \
        == cli.EXIT_USAGE
    assert "takes no checkpoints" in capsys.readouterr().err
    assert cli.main(["tune", str(job), "--trt-bound", "5", "--min", "4", "--max", "2"]) \
        == cli.EXIT_USAGE
    assert "--min 4 is above --max 2" in capsys.readouterr().err


def test_tune_refuses_a_topology_it_cannot_profile():
    topo = bn.Topology("unpaced")
    topo.source("s", bn.sources.Collection([1, 2, 3])).sink("out", bn.sinks.Collect())
    with pytest.raises(ValueError, match="source 's' is Collection.*paced"):
        bn.tune(topo, trt_bound_s=5)
    with pytest.raises(ValueError, match="trt_bound_s"):
        bn.tune(tiny_topology(), trt_bound_s=0)
    with pytest.raises(ValueError, match="checkpoint_interval is chosen by tune"):
        bn.tune(tiny_topology(), trt_bound_s=5, checkpoint_interval=1.0)


def test_a_tuning_result_is_frozen():
    capacity = Capacity(1000.0, 0.0)
    measurements = [Measurement(ci, 500.0, 10.0, 1.0, 0.5) for ci in (0.5, 1.0, 1.5)]
    model = build_model(measurements, capacity)
    result = bn.TuningResult(None, None, None, 1.0, "max", "none", tuple(measurements),
                             capacity, model)
    with pytest.raises(AttributeError):
        result.interval_s = 1.0  # type: ignore[misc]
    assert not result.meets_bound and len(result.rows()) == 3


@pytest.mark.usefixtures("ray_session")
def test_a_restarts_standby_is_borrowed_only_once_the_sources_caught_up(tmp_path):
    from bastion.runtime.progress import caught_up

    # within 0.1 s at the rate of the last poll: 100 left at 1,370/s is; 490 left at
    # 512 read in 0.6 s (853/s) is not, though less than the last poll read
    assert caught_up(0, 0, 0.1, 0.1) and caught_up(100, 137, 0.1, 0.1)
    assert not caught_up(1000, 300, 0.1, 0.1) and not caught_up(490, 512, 0.6, 0.1)

    def waiting_map(v: int) -> int:
        import time

        time.sleep(0.0003)   # waits, takes no CPU: a catch-up of a predictable length
        return v

    # a paced source at 1,000 records/s into a map that takes ~2,500/s: a kill 0.9 s
    # after a checkpoint leaves a backlog of about a second's input, read in ~0.7 s
    topo = bn.Topology("standby-after-catch-up")
    topo.source("numbers", bn.sources.Generator(lambda i: i, count=7000, rate=1000.0)).map(
        "wait", waiting_map).sink("out", bn.sinks.Collect())
    run = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=1.0),
                 faults=[bn.faults.KillWorker(0, at=1.9)],
                 storage=f"local://{tmp_path}/store",
                 data_plane=bn.DataPlane(frame_records=256, source_batch_records=128))
    events, timeline = run.details["events"], run.details["timeline"]
    restarted = [e["t_s"] for e in events if e["kind"] == "restarted"]
    borrowed = [e["t_s"] for e in events if e["kind"] == "standby_borrowed"]
    assert len(restarted) == 1 and len(borrowed) == 1, [e["kind"] for e in events]
    first = restarted[0]
    assert first < borrowed[0]
    # there was a backlog after the restart, and every poll answered by the worker
    # between the restart and the standby still showed more than 0.1 s of it left
    # (0.09 s here: the timeline stamps a poll a moment after the job master judged it)
    catching_up = [(p, p["t_s"] - before["t_s"]) for before, p in zip(timeline, timeline[1:])
                   if first <= p["t_s"] < borrowed[0] and p["workers_answering"] == 1]
    assert any(p["source_lag"] > 0 for p, _ in catching_up)
    assert not any(caught_up(p["source_lag"], p["source_records"], elapsed_s, 0.09)
                   for p, elapsed_s in catching_up)
    assert sorted(run.outputs["out"]) == list(range(7000))


@pytest.mark.usefixtures("ray_session")
def test_a_restart_ends_when_the_tasks_run_not_when_the_job_master_hears_of_it(tmp_path):
    """R (eq 5's restart) ends when the restored tasks run. The job master learns of
    it from the workers' start calls, whose replies wait for the worker's event loop
    — which the tasks, once running, keep busy: in a catch-up ~40 ms, here the 0.8 s
    the map's first record takes in every process. Taken at the reply, R would count
    that time twice in eq 5 (as restart, and as backlog the sources did not read)."""
    first_call_s = 0.8

    def busy_on_its_first_record(v: int, seen: list = []) -> int:  # noqa: B006
        import time

        if not seen:   # one list per deserialised copy: once in each worker process
            seen.append(v)
            spin_until = time.perf_counter() + first_call_s
            while time.perf_counter() < spin_until:   # holds the loop (and the GIL)
                pass
        return v

    topo = bn.Topology("restart-ends-when-tasks-run")
    topo.source("numbers", bn.sources.Generator(lambda i: i, count=3000, rate=1000.0)).map(
        "busy", busy_on_its_first_record).sink("out", bn.sinks.Collect())
    kills = [bn.faults.KillWorker(0, at=1.8)]
    run = bn.run(topo, protocol=bn.protocols.Coordinated(interval_s=0.5), faults=kills,
                 storage=f"local://{tmp_path}/store")
    from bastion.runtime.plan import build_plan

    outcome = front.kill_outcome(run, kills[0].schedule(build_plan(topo)))
    assert outcome.restart_s < first_call_s / 2, outcome
    # the restarted event keeps its place after the failure it recovers from
    kinds = [e["kind"] for e in run.details["events"]]
    assert kinds.index("failure_detected") < kinds.index("restarted")
    assert sorted(run.outputs["out"]) == list(range(3000))


@pytest.mark.usefixtures("ray_session")
def test_profiling_runs_write_outputs_of_their_own_and_delete_them(tmp_path):
    """A profiling run truncates its sinks when it starts: on the user's File and Log
    sinks it wiped the user's outputs, and two runs side by side (or two tunings of
    one job) wiped each other's."""
    user_file = tmp_path / "out.jsonl"
    user_file.write_text('"kept"\n')
    log_url = f"local://{tmp_path}/log"
    topo = bn.Topology("own-outputs")
    src = topo.source("src", bn.sources.Generator(lambda i: i, count=400, rate=400))
    src.sink("file", bn.sinks.File(user_file))
    src.sink("log", bn.sinks.Log(log_url))
    own = tm.own_outputs(topo, "tune-x")
    assert own.nodes["file"].params["sink"].path == tmp_path / "out.tune-x.jsonl"
    assert own.nodes["log"].params["sink"].url == f"{log_url}.tune-x"
    assert topo.nodes["file"].params["sink"].path == user_file  # the original is untouched
    profiler = front.RayProfiler(topo, run_options={"storage": f"local://{tmp_path}/store"})
    [measurement] = profiler.profile(0.5, seed=1)   # one kill per run by default
    assert measurement.ingest_avg_per_s > 0
    assert user_file.read_text() == '"kept"\n'
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["out.jsonl", "store"], left  # nothing of the run's own outputs is left


def test_r_squared_is_what_the_fit_explains_and_says_so_when_nothing_spreads():
    xs = [0.5, 1.0, 2.0, 4.0]
    line = tm.fit_quadratic(xs, [1.0, 2.0, 4.0, 8.0])
    assert tm.r_squared(line, xs, [1.0, 2.0, 4.0, 8.0]) == pytest.approx(1.0)
    # by hand: the mean as the fit explains nothing
    flat = tm.Quadratic(0.0, 0.0, 2.5)
    assert tm.r_squared(flat, [1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(0.0)
    # SS_res 1 over SS_tot 2.75
    assert tm.r_squared(tm.Quadratic(0.0, 1.0, 0.0), [1, 2, 3, 4], [2, 2, 3, 4]) == \
        pytest.approx(1 - 1 / 2.75)
    assert tm.r_squared(line, xs, [3.0] * 4) is None
    assert tm.r_squared(line, [1.0], [3.0]) is None


# -- judging a fit: R² where the points vary, the largest error where they are flat ---------

XS = [0.5, 1.2, 1.9, 2.6, 3.3, 4.0]
# a latency the interval does not move (ms), scattering by 2-3% with the machine's load
FLAT_LATENCY = [1.01, 0.98, 1.03, 0.99, 1.02, 0.99]


def test_a_flat_series_with_a_good_fit_passes_on_its_largest_error_not_its_r2():
    fit = tm.fit_cross_validated(XS, FLAT_LATENCY)
    quality = tm.fit_quality(fit, XS, FLAT_LATENCY)
    assert quality.flat and quality.r_squared is None
    assert quality.max_error < 0.03 and quality.good
    assert str(quality).startswith("flat (off <= ")
    # what R² said of it: the fit follows the noise, not what it predicts
    mean = statistics.mean(FLAT_LATENCY)
    ss_tot = sum((y - mean) ** 2 for y in FLAT_LATENCY)
    raw = 1 - sum((fit(x) - y) ** 2 for x, y in zip(XS, FLAT_LATENCY)) / ss_tot
    assert raw < tm.MIN_R_SQUARED   # would have failed a good fit


def test_a_flat_series_with_a_bad_fit_fails():
    off = tm.Quadratic(0.0, 0.0, 1.2)   # 1.2 ms against ~1.01: 19% off
    quality = tm.fit_quality(off, XS, FLAT_LATENCY)
    assert quality.flat and not quality.good
    assert quality.max_error == pytest.approx((1.2 - 0.98) / statistics.mean(FLAT_LATENCY))
    # a curve that leaves the points between them is judged where the points are; one
    # 6% off at a point fails, 4% passes
    mean = statistics.mean(FLAT_LATENCY)
    assert not tm.fit_quality(tm.Quadratic(0, 0, mean * 1.06), XS, [mean] * 6).good
    assert tm.fit_quality(tm.Quadratic(0, 0, mean * 1.04), XS, [mean] * 6).good


def test_a_varying_series_is_judged_by_r2_and_a_poor_fit_fails():
    # latency that falls with the interval, as checkpoints that cost latency make it
    falling = [1.0 + 0.6 / x for x in XS]
    assert not tm.is_flat(falling)
    good = tm.fit_quality(tm.fit_cross_validated(XS, falling), XS, falling)
    assert not good.flat and good.r_squared >= tm.MIN_R_SQUARED and good.good
    # the mean through it explains nothing: R² 0 fails, though it is within 42% of
    # every point
    mean = tm.Quadratic(0.0, 0.0, statistics.mean(falling))
    poor = tm.fit_quality(mean, XS, falling)
    assert not poor.flat and poor.r_squared == pytest.approx(0.0, abs=1e-12)
    assert not poor.good and str(poor) == "0.000"
    # a line through the ends of the range misses the bend: R² under 0.8 fails
    ends = tm.fit_polynomial([XS[0], XS[-1]], [falling[0], falling[-1]], 1)
    assert not tm.fit_quality(ends, XS, falling).good


def test_flatness_is_a_share_of_the_mean():
    assert tm.is_flat([1.0, 1.05, 0.95])          # 5% either side
    assert not tm.is_flat([1.0, 1.06, 0.94])
    assert tm.is_flat([100.0, 104.0, 96.0]) and not tm.is_flat([0.1, 0.104, 0.09])
    assert tm.is_flat([0.0, 0.0]) and not tm.is_flat([-1.0, 1.0])   # mean 0: only zeros
    assert tm.fit_quality(tm.Quadratic(0, 0, 0.1), [1, 2], [0.0, 0.0]).max_error == math.inf


def test_the_model_judges_each_fit_and_the_result_says_how():
    # flat latency, best-case TRT flat by construction (T, R pooled, E = d): judged by
    # their largest error; the average and worst cases vary with the interval: by R²
    measurements = [Measurement(interval_s=ci, ingest_avg_per_s=500.0, latency_avg_ms=lat,
                                detection_s=1.0, restart_s=0.5)
                    for ci, lat in zip(XS, FLAT_LATENCY)]
    model = build_model(measurements, Capacity(1000.0, 0.0))
    q = model.qualities()
    assert list(q) == ["latency", "TRT min", "TRT avg", "TRT max"]
    assert q["latency"].flat and q["TRT min"].flat
    assert not q["TRT avg"].flat and q["TRT avg"].r_squared == pytest.approx(1.0)
    assert all(v.good for v in q.values())
    assert model.latency_r2 is None and model.trt_r2["max"] == pytest.approx(1.0)
    result = front.TuningResult(interval_s=None, trt_s=None, latency_ms=None,
                                trt_bound_s=1.0, case="max", reason="", measurements=(),
                                capacity=model.capacity, model=model)
    assert re.fullmatch(r"fits R²: latency flat \(off <= \d\.\d%\), TRT min/avg/max "
                        r"flat \(off <= 0\.0%\)/1\.000/1\.000", result.fits()), result.fits()
    # a latency that falls with the interval is judged by R², and re-evaluating the
    # model at another rate judges its TRT fits again
    falling = [dataclasses.replace(m, latency_avg_ms=1.0 + 0.6 / m.interval_s)
               for m in measurements]
    varying = build_model(falling, Capacity(1000.0, 0.0))
    assert not varying.latency_quality.flat and varying.latency_quality.good
    assert varying.at_utilisation(0.8).trt_quality["max"].r_squared == pytest.approx(1.0)


def test_failure_free_latency_is_read_over_whole_intervals_wherever_the_kill_fell():
    # 0.1-s points at 1 ms, and a checkpoint every 3 s whose pause leaves one point at
    # 20 ms behind it: over whole intervals L_avg holds one pause per 3 s
    timeline = [{"t_s": round(0.1 * i, 1), "sink_records": 100,
                 "latency_mean_ms": 20.0 if i % 30 == 1 else 1.0} for i in range(1, 120)]
    metrics = types.SimpleNamespace(latency_windows={}, duration_s=12.0,
                                    latency_histogram=None)
    one_per_interval = (29 * 1.0 + 20.0) / 30
    for at_s in (4.05, 4.55, 5.25, 5.95, 7.35, 9.95):
        kill = tm.KillOutcome(at_s=at_s, detection_s=0.05, restart_s=0.2, trt_s=0.5)
        assert tm.failure_free_latency_ms(timeline, metrics, 0.0, kill, 1.0,
                                          3.0) == pytest.approx(one_per_interval), at_s
    # from the settled start instead, the pause's share moved with the kill's phase
    shares = {round(tm.failure_free_latency_ms(
        timeline, metrics, 0.0, tm.KillOutcome(at_s=at_s, detection_s=0.05, restart_s=0.2,
                                               trt_s=0.5), 1.0), 3)
        for at_s in (3.05, 4.05, 5.95)}
    assert len(shares) == 3
    # less than a whole interval before the kill: the window from the settled start
    early = tm.KillOutcome(at_s=3.5, detection_s=0.05, restart_s=0.2, trt_s=0.5)
    assert tm.failure_free_latency_ms(timeline, metrics, 0.0, early, 1.0, 3.0) == \
        pytest.approx(tm.timeline_latency_ms(timeline, 1.0, 3.5))


def test_failure_free_latency_is_read_before_the_first_kill_not_in_a_recoverys_tail():
    # 0.1-s points: 2 ms while the job runs failure-free, then a kill at 3 s whose
    # restore and catch-up leave 80-ms latencies for seconds after the sources caught up
    timeline = [{"t_s": round(0.1 * i, 1), "sink_records": 100,
                 "latency_mean_ms": 2.0 if 0.1 * i <= 3.0 else 80.0} for i in range(1, 80)]
    kill = tm.KillOutcome(at_s=3.0, detection_s=0.05, restart_s=0.2, trt_s=0.5)
    metrics = types.SimpleNamespace(latency_windows={}, duration_s=8.0,
                                    latency_histogram=None)
    assert tm.failure_free_latency_ms(timeline, metrics, 0.0, kill) == pytest.approx(2.0)
    # the window after the recovery, which the profiler read before, holds the tail
    assert tm.timeline_latency_ms(timeline, 3.0 + 0.5 + 0.5, 8.0) == pytest.approx(80.0)
    # a kill before any point: the last attempt's histogram, as before
    from bastion.runtime.metrics import LatencyHistogram

    histogram = LatencyHistogram()
    histogram.add(0.004)
    metrics.latency_histogram = histogram
    early = tm.KillOutcome(at_s=0.05, detection_s=0.05, restart_s=0.2, trt_s=None)
    assert tm.failure_free_latency_ms(timeline, metrics, 0.0, early) == pytest.approx(
        histogram.mean_std()[0] * 1000.0)
