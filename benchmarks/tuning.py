"""Checkpoint-interval tuning (Chiron) validated against measured recoveries.

1. Tunes a job whose map waits on each record (a paced source at 40% of what the
   job can take, so the catch-up after a failure depends on the interval) and
   whose state is a table of a million running sums (so a checkpoint costs
   latency, and the average latency depends on the interval: `workload`)
   with `bn.tune` for a worst-case TRT bound, and prints the profiling table, the
   model and the chosen interval. ``--failures-per-run`` kills per profiling run
   (default 3, as Chiron; 1: one kill per run in the window the drills use).
2. Validation drills: for the chosen interval and two others (the ends of the
   range; ``--validate 1`` or ``2`` keeps the first one or two of these), runs the job with one kill each at a random phase of a checkpoint
   interval (`kill_times`: stratified, seeded), with the same run options as the
   profiling runs, in rounds over the intervals, and measures the actual total
   recovery time (kill -> sources caught up; `bastion.runtime.recovery_times`)
   and the average latency in failure-free operation (over the whole checkpoint
   intervals before the kill, as the profiling runs measure it:
   `bastion.scheduler.tuning.failure_free_latency_ms`). The
   drills are plain `bn.run` jobs with a kill, not `bn.drill`: a drill's lineage ids
   cost every record time, and the latency being validated is that of the job as
   it runs.
3. Prints, per interval, predicted TRT (min/avg/max) against measured, and predicted
   L_avg against measured, and checks the targets:

   - measured TRT inside the predicted [min, max] in >= 90% of the drills;
   - the measured average TRT within 15% of the predicted average (per interval),
     and of the average case moved to the E the drills' kills actually had;
   - the predicted L_avg within 15% of the measured (per interval; the drills'
     median, as the fit goes through the profiling runs' medians);
   - the chosen interval never exceeds the bound in its drills;
   - every fit whose points vary with the interval has R² >= 0.8 (Chiron's fits:
     0.819-0.996), and every flat one (points within 5% of their mean, where R²
     would measure noise) comes within 5% of every point
     (`bastion.scheduler.tuning.fit_quality`).

Every run prints the machine's load average: the machine is shared, and a burst of
someone else's load stretches recoveries by seconds.

The headline is the LAST line. Nothing is asserted and nothing is hard-coded: on a
shared machine the figures move from run to run, and the output says so when a
target is missed.

``--json PATH`` also writes the figures (`bastion.bench.results.write_figures`) for
the results page's Chiron section (`benchmarks/experiments/chiron.py`): the setting,
the profiling table, each fit's R² (and its curve, sampled for the plot), the bound,
the chosen interval with its predicted L_avg and TRT min/avg/max, and per validated
interval the predicted TRT and L_avg, each drill's measured TRT and L_avg and the
L_avg prediction error in % (Chiron's Table II(c): ``|measured - predicted| /
predicted``).

    .venv/bin/python benchmarks/tuning.py [--quick] [--bound S] [--drills N] [--repeats N]
                                          [--json PATH]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402
from bastion.bench.results import write_figures  # noqa: E402
from bastion.faults import RandomKills  # noqa: E402
from bastion.scheduler import tuning as tm  # noqa: E402
from bastion.tuning import RayProfiler, kill_outcome, write_html  # noqa: E402

# Small frames and source batches: a CPU-bound worker answers progress requests
# between batches, so the timeline that measures catch-up has a sample every 0.1 s.
RUN_OPTIONS = {"data_plane": bn.DataPlane(frame_records=256, source_batch_records=128)}


def make_work(wait_s: float):
    def work(v: int) -> tuple[int, int]:
        time.sleep(wait_s)   # a call to an external service: waits, takes no CPU
        return v % 16, v
    return work


def value_at(i: int) -> int:
    return i % 1009


def make_accounts(entries: int):
    """A running sum per account over ``entries`` accounts, held as one table: the
    state a checkpoint snapshots is the whole table (msgpack-encoded on the task's
    thread, ~40 ms per million entries here), whatever the records touched since
    the last one — as a Flink job's full checkpoint of a large keyed state. The table
    is made on the first record (``initial=None``: a prebuilt one would be
    deep-copied per key)."""
    def post(table: dict | None, kv: tuple[int, int]) -> tuple[dict, tuple[int, int]]:
        if table is None:
            table = dict.fromkeys(range(entries), 0)
        account = kv[1] * 7919 % entries
        table[account] = (table[account] + kv[1]) % 1_000_003
        return table, (account, table[account])
    return post


def workload(rate: float, seconds: float, wait_s: float, entries: int) -> bn.Topology:
    """Source (paced) -> map waiting ``wait_s`` per record -> running sums over a
    table of ``entries`` accounts -> collect; parallelism 1 everywhere: one worker,
    the machine is shared. The map waits instead of computing so that the job's
    capacity (I_max) does not move with whatever else the shared machine runs: a
    CPU-bound map measured ±20% between runs minutes apart, and at U ~ 0.6 that
    turns into catch-up times several times the prediction.

    The table is what makes checkpoints cost latency, as they do in Chiron's Flink
    jobs: its snapshot holds up the records behind it for tens of milliseconds, so
    the more often the job checkpoints the higher its average latency (L_avg falls
    with the interval, roughly as 1/CI). With the 16-key sum this benchmark had
    before, a checkpoint cost nothing measurable, L_avg was 1.0 ms at every interval
    and its fit had nothing to explain.

    L_avg is read before each run's first kill (`failure_free_latency_ms`): the
    windows after a recovery held its tail with this state (3-253 ms at CI 0.5 s
    beside 3 ms before the kill), and the latency fit went through that noise (R² 0).
    Measured so (a quiet machine, load 0.5-1.1): L_avg 3.4, 1.4, 1.2, 1.1, 1.2, 1.3 ms
    from CI 0.5 to 4 s, latency fit R² 0.868. The second-order fit of the paper does
    not follow a 1/CI curve well: predicted/measured L_avg 0.78 at 0.5 s, 0.63 at
    2.82 s (the parabola dips below every point there), 1.26 at 4 s — the L_avg target
    (15%), met by the flat 16-key sum, is missed here."""
    topo = bn.Topology("tuning-bench")
    src = topo.source("numbers", bn.sources.Generator(value_at, count=int(rate * seconds),
                                                      rate=rate))
    # one key: the table is one state, snapshotted whole
    src.map("work", make_work(wait_s)).key_by(lambda kv: 0).stateful_map(
        "accounts", make_accounts(entries), initial=None).sink("out", bn.sinks.Collect())
    return topo


def checkpoint_offset_s(measurements: list[tm.Measurement]) -> float:
    """How far after the multiples of the interval the job's checkpoints are taken
    (the timer starts when the job does, not at its t = 0): the median, over the
    profiling runs, of the restored checkpoint's time (kill - E) less the nearest
    multiple of the run's interval."""
    offsets = [t - round(t / m.interval_s) * m.interval_s for m in measurements
               if m.kill_at_s is not None and m.reprocess_s is not None
               for t in [m.kill_at_s - m.reprocess_s]]
    return statistics.median(offsets) if offsets else 0.0


def kill_times(interval_s: float, drills: int, window_s: tuple[float, float],
               offset_s: float, seed: int) -> list[float]:
    """When to kill, for ``drills`` validation runs at ``interval_s``: at a phase of a
    checkpoint interval that is uniform at random, stratified — drill k at phase
    ``(k + u)/drills``, u uniform in [0, 1) — in a checkpoint interval drawn from
    those that overlap ``window_s``.

    The model's average case is E = CI/2: a kill uniform within an interval. Kills at
    times uniform in a window a few intervals long are uniform in phase only on
    average, and over four drills their mean E strays by ~15% of CI (the standard
    error of a mean of four uniform phases), which at the longest interval moves the
    measured average TRT by as much as the 15% target. Stratified phases keep every
    drill random and put their mean E within ~4% of CI/2 — still 0.45·CI for the
    seed's drills at 0.5 s, which moved the measured average TRT there by 10%. So
    the strata pair up antithetically: the phase in stratum k is uniform in it at
    ``u``, the one in stratum ``drills-1-k`` at ``1-u`` — each kill still uniform in
    its stratum, and their mean phase exactly 1/2 (with an even number of drills),
    which is the average case the model predicts."""
    rng = random.Random(seed)
    lo, hi = window_s
    # each kill after the settled start and two whole intervals: its L_avg is read over
    # whole intervals (`failure_free_latency_ms`); the first such interval if none of
    # them overlaps the window (an interval longer than the window's span)
    first = max(1, math.ceil((tm.failure_free_lead_s(interval_s) - offset_s) / interval_s
                             - 1e-9))
    cycles = [k for k in range(first, int(hi / interval_s) + 1)
              if (k + 1) * interval_s > lo] or [first]
    within = [rng.random() for _ in range(drills)]
    for k in range(drills // 2):
        within[drills - 1 - k] = 1 - within[k]
    times = [round(rng.choice(cycles) * interval_s + offset_s
                   + (k + within[k]) / drills * interval_s, 3) for k in range(drills)]
    rng.shuffle(times)   # the drills run in rounds: no round gets the early phases only
    return times


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else f"{v:{spec}}"


def latency_error_pct(predicted_ms: float, measured_ms: float | None) -> float | None:
    """The L_avg prediction's error in %, as Chiron's Table II(c) computes it:
    ``|measured - predicted| / predicted`` (its 1625 ms measured against 1447 ms
    predicted is its 12.30 %; Table III divides four of its five by the measured
    instead, which gives the smaller figure when the measured is the larger)."""
    if measured_ms is None or not predicted_ms:
        return None
    return abs(measured_ms - predicted_ms) / predicted_ms * 100.0


def _fit_figures(quality: tm.FitQuality) -> dict:
    return {"r_squared": quality.r_squared, "flat": quality.flat,
            "max_error": quality.max_error if math.isfinite(quality.max_error) else None,
            "good": quality.good}


def figures_of(args: argparse.Namespace, result: "bn.TuningResult", intervals: list[float],
               drill_log: dict[float, list[dict]], *, rate: float, probed_per_s: float,
               points: int, repeats: int, drills: int, seconds: float) -> dict:
    """What ``--json`` writes: everything the results page's Chiron rows and plots
    read (`benchmarks/experiments/chiron.py`), in plain numbers, seconds and ms."""
    model, chosen = result.model, result.interval_s
    # the fits sampled over the profiled range, for Fig 4's curves
    lo, hi = args.min, args.max
    xs = [lo + (hi - lo) * k / 40 for k in range(41)]
    validation = []
    for interval in intervals:
        predicted = model.trt(interval)
        predicted_latency = model.latency_ms(interval)
        drills_seen = [dict(d, latency_error_pct=latency_error_pct(predicted_latency,
                                                                   d["latency_ms"]))
                       for d in drill_log.get(interval, [])]
        latencies = [d["latency_ms"] for d in drills_seen if d["latency_ms"] is not None]
        validation.append({
            "interval_s": interval, "chosen": chosen is not None and interval == chosen,
            "predicted_trt_s": {"min": predicted.min_s, "avg": predicted.avg_s,
                                "max": predicted.max_s},
            "predicted_latency_ms": predicted_latency,
            "measured_latency_ms": statistics.median(latencies) if latencies else None,
            "drills": drills_seen})
    return {
        "quick": bool(args.quick),
        "setting": {"bound_s": args.bound, "min_interval_s": lo, "max_interval_s": hi,
                    "points": points, "repeats": repeats, "drills": drills,
                    "failures_per_run": args.failures_per_run, "input_s": args.seconds,
                    "load": args.load, "rate_per_s": rate, "probed_max_per_s": probed_per_s,
                    "wait_ms": args.wait_ms, "accounts": args.accounts, "seed": args.seed,
                    "case": result.case},
        "capacity": {"ingest_max_per_s": result.capacity.ingest_max_per_s,
                     "warmup_s": result.capacity.warmup_s,
                     "catch_up_per_s": model.catch_up_per_s,
                     "completion_lag_s": model.completion_lag_s},
        "profiling": [{"interval_s": p.measurement.interval_s,
                       "ingest_avg_per_s": p.measurement.ingest_avg_per_s,
                       "latency_avg_ms": p.measurement.latency_avg_ms,
                       "detection_s": p.measurement.detection_s,
                       "restart_s": p.measurement.restart_s,
                       "utilisation": p.utilisation,
                       "measured_trt_s": p.measurement.measured_trt_s,
                       "trt_s": {"min": p.trt.min_s, "avg": p.trt.avg_s, "max": p.trt.max_s}}
                      for p in model.points],
        "kills": [{"interval_s": m.interval_s, "kill_at_s": m.kill_at_s,
                   "reprocess_s": m.reprocess_s, "measured_trt_s": m.measured_trt_s,
                   "latency_avg_ms": m.latency_avg_ms} for m in result.measurements],
        "fits": {name: _fit_figures(q) for name, q in model.qualities().items()},
        "curves": {"interval_s": xs, "latency_ms": [model.latency_ms(x) for x in xs],
                   **{f"trt_{c}_s": [model.trt(x).of(c) for x in xs]
                      for c in ("min", "avg", "max")}},
        "bound_s": args.bound,
        "chosen_interval_s": chosen,
        "predicted_latency_ms": result.latency_ms,
        "predicted_trt_s": (None if result.trt_s is None else
                            dict(zip(("min", "avg", "max"), result.trt_s))),
        "reason": result.reason,
        "validation": validation,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="4 profiling points, 1 run each, 2 drills per interval (else "
                             "6 points, 3 runs each, 4 drills)")
    parser.add_argument("--bound", type=float, default=4.0,
                        help="worst-case TRT bound in seconds (default 4)")
    parser.add_argument("--min", type=float, default=0.5, help="shortest interval (0.5)")
    parser.add_argument("--max", type=float, default=4.0, help="longest interval (4)")
    parser.add_argument("--points", type=int, default=None)
    parser.add_argument("--drills", type=int, default=None, help="drills per interval")
    parser.add_argument("--repeats", type=int, default=None,
                        help="profiling runs per interval (1 with --quick, else 3)")
    parser.add_argument("--load", type=float, default=0.4,
                        help="source rate as a share of the measured maximum (0.4)")
    parser.add_argument("--wait-ms", type=float, default=0.2,
                        help="milliseconds the map waits per record (0.2)")
    parser.add_argument("--seconds", type=float, default=14.0,
                        help="seconds of input per run (14)")
    parser.add_argument("--accounts", type=int, default=1_000_000,
                        help="entries of the table the job's state holds (1,000,000): "
                             "what a checkpoint snapshots, so what it costs in latency")
    parser.add_argument("--failures-per-run", type=int, default=3,
                        help="kills per profiling run (3, as Chiron)")
    parser.add_argument("--validate", type=int, default=3, choices=(1, 2, 3),
                        help="intervals the drills validate: the chosen one, then the "
                             "ends of the range (3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures as JSON (for benchmarks/reproduce.py)")
    args = parser.parse_args()
    # 4 points at least: a quadratic goes through any 3, and its R² is then 1 whatever
    # was measured
    points = args.points or (4 if args.quick else 6)
    drills = args.drills or (2 if args.quick else 4)
    repeats = args.repeats or (1 if args.quick else 3)
    # after the settled start and two whole longest intervals: L_avg is read over whole
    # intervals before the kill (`failure_free_latency_ms`), and a kill before the
    # first checkpoint restarts the job from the beginning, where the paced source
    # starts its schedule over
    lead_s = tm.failure_free_lead_s(args.max)
    kill_between = (lead_s + 0.25, lead_s + 3.25)
    started = time.time()

    with tempfile.TemporaryDirectory(prefix="bastion-tuning-") as tmp:
        options = {**RUN_OPTIONS, "storage": f"local://{tmp}/store"}
        # The source's rate: a share of what this machine takes right now.
        probe = RayProfiler(workload(1000.0, args.seconds, args.wait_ms / 1000,
                                     args.accounts),
                            max_rate_run_s=4.0, capacity_interval_s=1.0,
                            run_options=options)
        probed = probe.capacity()
        rate = round(args.load * probed.ingest_max_per_s, -1)
        topo = workload(rate, args.seconds, args.wait_ms / 1000, args.accounts)
        print(f"workload: paced source {rate:,.0f} records/s ({args.load:.0%} of a probed "
              f"maximum {probed.ingest_max_per_s:,.0f}/s), {args.seconds:g} s of input, "
              f"map waiting {args.wait_ms:g} ms per record, running sums over "
              f"{args.accounts:,} accounts (the state a checkpoint snapshots); "
              "protocol coordinated")
        print(f"tuning: worst-case TRT <= {args.bound:g} s over {points} intervals x "
              f"{repeats} runs in "
              f"[{args.min:g}, {args.max:g}] s, "
              + (f"one kill per run in {kill_between} s\n" if args.failures_per_run == 1
                 else f"{args.failures_per_run} kills per run, each recovery apart\n"))

        def progress(p: dict) -> None:
            print(f"  profiling {p['done']}/{p['total']} {p['what']} (load "
                  f"{os.getloadavg()[0]:.1f}, {time.time() - started:.0f} s in)", flush=True)

        result = bn.tune(topo, trt_bound_s=args.bound, min_interval_s=args.min,
                         max_interval_s=args.max, points=points, repeats=repeats,
                         case="max",
                         failures_per_run=args.failures_per_run,
                         kill_between_s=kill_between if args.failures_per_run == 1 else None,
                         seed=args.seed, progress=progress,
                         **options)
        from bastion.cli import table

        cap = result.capacity
        print(f"\nI_max {cap.ingest_max_per_s:,.0f} records/s unthrottled, recoveries read "
              f"at {result.model.catch_up_per_s:,.0f} records/s, W best/avg/worst "
              f"{'/'.join(f'{w:.2f}' for w in result.model.warmup_s)} s "
              f"(cold start {cap.warmup_s:.2f} s), checkpoints complete "
              f"{result.model.completion_lag_s:.3f} s after their trigger (d)")
        print(table(result.rows(), header=result.HEADER))
        print(result.fits())
        print("\neach profiling run: E of its kill, the TRT it showed, the W eq 5 solved "
              "for W reads from it")
        for m in sorted(result.measurements, key=lambda m: m.interval_s):
            u = tm.utilisation(m.ingest_avg_per_s, cap.ingest_max_per_s)
            w = tm.recovery_warmup_s(m, u)
            print(f"  {m.interval_s:.2f} s: E {fmt(m.reprocess_s)} s, TRT seen "
                  f"{fmt(m.measured_trt_s)} s, W {fmt(w)} s, L_avg {m.latency_avg_ms:.2f} ms")
        print(f"\n{result.reason}")
        page = write_html(result, Path(tempfile.gettempdir()) / "bastion-tuning-bench.html")
        print(f"page: {page}\n")

        model = result.model
        chosen = result.interval_s
        # the chosen interval and two others: the ends of the range, or an end and
        # the middle when the chosen one is an end
        first = chosen if chosen is not None else (args.min + args.max) / 2
        others = [x for x in (args.min, args.max, (args.min + args.max) / 2)
                  if abs(x - first) > 1e-6][:max(0, args.validate - 1)]
        intervals = [first] + others
        plan = tm._plan_of(topo, options)  # noqa: SLF001 - the plan the kills target
        offset_s = checkpoint_offset_s(list(result.measurements))
        u = statistics.median(p.utilisation for p in model.points)
        print(f"validation: {drills} drills per interval, kills at stratified random "
              f"phases of a checkpoint interval (checkpoints taken {offset_s:.3f} s after "
              f"the multiples of the interval)")
        # The drills go in rounds over the intervals (one drill of each, then the
        # next): a burst of someone else's load on the shared machine then falls on
        # one drill of several intervals, not on every drill of one.
        times = {interval: kill_times(interval, drills, kill_between, offset_s,
                                      seed=10_000 + 100 * n + args.seed)
                 for n, interval in enumerate(intervals)}
        seen: dict[float, list[tuple[tm.KillOutcome, float]]] = {x: [] for x in intervals}
        drill_log: dict[float, list[dict]] = {}
        for d in range(drills):
            for interval in intervals:
                predicted = model.trt(interval)
                kill = RandomKills(1, between=(times[interval][d],) * 2, seed=d)
                run = bn.run(topo, bn.protocols.Coordinated(interval_s=interval),
                             faults=[kill], **options)
                outcome = kill_outcome(run, kill.schedule(plan))
                latency = tm.failure_free_latency_ms(run.details["timeline"], run.metrics,
                                                     run.details["started_s"], outcome,
                                                     interval_s=interval)
                seen[interval].append((outcome, latency))
                drill_log.setdefault(interval, []).append(
                    {"kill_at_s": outcome.at_s, "reprocess_s": outcome.reprocess_s,
                     "detection_s": outcome.detection_s, "restart_s": outcome.restart_s,
                     "trt_s": outcome.trt_s, "latency_ms": latency,
                     "load": os.getloadavg()[0]})
                trt = "never caught up" if outcome.trt_s is None else (
                    f"TRT {outcome.trt_s:.2f} s "
                    f"{'inside' if predicted.min_s <= outcome.trt_s <= predicted.max_s else 'OUTSIDE'}"
                    f" [{predicted.min_s:.2f}, {predicted.max_s:.2f}]")
                print(f"  drill {interval:.2f} s #{d}: kill at {outcome.at_s:.2f} s, E "
                      f"{fmt(outcome.reprocess_s)} s, T {outcome.detection_s:.2f} s, R "
                      f"{outcome.restart_s:.2f} s, {trt}, L_avg {fmt(latency, '.2f')} ms "
                      f"(load {os.getloadavg()[0]:.1f}, {time.time() - started:.0f} s in)",
                      flush=True)

        rows, in_range, total = [], 0, 0
        avg_ratios, at_e_ratios, latency_ratios = [], [], []
        bound_kept, bound_drills = 0, 0
        for interval in intervals:
            predicted = model.trt(interval)
            outcomes = [o for o, _ in seen[interval]]
            measured_latency = [lat for _, lat in seen[interval]]
            measured_trt = [o.trt_s for o in outcomes if o.trt_s is not None]
            total += len(outcomes)
            in_range += sum(predicted.min_s <= t <= predicted.max_s for t in measured_trt)
            if chosen is not None and interval == chosen:
                bound_drills += len(outcomes)
                bound_kept += sum(t <= args.bound for t in measured_trt)
            phases = [o.reprocess_s / interval for o in outcomes if o.reprocess_s is not None]
            # The average case's prediction moved to each kill's E (eq 2's series is
            # linear in E: each second of E adds U/(1-U) seconds of catch-up): the
            # checkpoint timer drifts from the multiples of the interval (it sleeps
            # CI, then triggers), so the drills' phases are uniform only roughly,
            # and this compares the model with the drills at the phases they had.
            paired = [(o.trt_s, predicted.avg_s
                       + (o.reprocess_s - model.reprocess_s(interval, "avg")) * u / (1 - u))
                      for o in outcomes if o.trt_s is not None and o.reprocess_s is not None]
            at_e = [p for _, p in paired]
            if paired:
                at_e_ratios.append(sum(t for t, _ in paired) / sum(at_e))
            mean_trt = statistics.mean(measured_trt) if measured_trt else None
            mean_latency = statistics.mean(measured_latency) if measured_latency else None
            median_latency = (statistics.median(measured_latency) if measured_latency
                              else None)
            if mean_trt is not None:
                avg_ratios.append(mean_trt / predicted.avg_s)
            # The prediction is a fit through each interval's median over its profiling
            # runs (`build_model`), so the drills' median is what it predicts; their
            # mean, beside it, is one disturbed drill away from a different figure.
            if median_latency:
                latency_ratios.append(model.latency_ms(interval) / median_latency)
            rows.append((f"{interval:.2f}" + (" *" if interval == chosen else ""),
                         f"{predicted.min_s:.2f}", f"{predicted.avg_s:.2f}",
                         f"{predicted.max_s:.2f}", fmt(mean_trt),
                         fmt(statistics.mean(at_e) if at_e else None),
                         fmt(statistics.mean(phases) if phases else None),
                         " ".join(f"{t:.2f}" for t in measured_trt) or "-",
                         f"{model.latency_ms(interval):.2f}", fmt(median_latency, ".2f"),
                         fmt(mean_latency, ".2f")))

        print("\nvalidation (* = chosen): predicted TRT min/avg/max against measured, "
              "predicted L_avg against measured (the median over the drills, as the "
              "profiling's medians over runs that the fit goes through; the mean beside "
              "it)")
        print("(avg at drills' E: the average case moved to the E the drills' kills had; "
              f"E/CI: their mean phase, 0.5 + d/CI for the model's average case, with "
              f"d = {model.completion_lag_s:.3f} s)")
        print(table(rows, header=("interval s", "TRT min", "TRT avg", "TRT max",
                                  "measured avg", "avg at drills' E", "E/CI",
                                  "measured each", "L_avg pred ms",
                                  "L_avg meas ms", "(mean)")))
        share = in_range / total if total else 0.0
        worst_avg = max((abs(r - 1) for r in avg_ratios), default=None)
        worst_at_e = max((abs(r - 1) for r in at_e_ratios), default=None)
        worst_latency = max((abs(r - 1) for r in latency_ratios), default=None)
        print("\ntargets:")
        print(f"  TRT inside predicted [min,max] in >= 90% of drills: {in_range}/{total} = "
              f"{share:.0%} -> {'met' if share >= 0.9 else 'MISSED'}")
        print(f"  measured average TRT within 15% of predicted average (per interval): "
              f"ratios {', '.join(f'{r:.2f}' for r in avg_ratios)} -> "
              f"{'met' if worst_avg is not None and worst_avg <= 0.15 else 'MISSED'}")
        print(f"    and against the average case at the drills' E: ratios "
              f"{', '.join(f'{r:.2f}' for r in at_e_ratios)} -> "
              f"{'met' if worst_at_e is not None and worst_at_e <= 0.15 else 'MISSED'}")
        print(f"  predicted L_avg within 15% of measured (per interval): ratios "
              f"{', '.join(f'{r:.2f}' for r in latency_ratios)} -> "
              f"{'met' if worst_latency is not None and worst_latency <= 0.15 else 'MISSED'}")
        # Chiron reports R² of 0.819-0.996 for its fits; a fit under 0.8 explains too
        # little of the profiled points for its prediction to be worth the name. A
        # series the interval does not move has no spread for R² to explain (its
        # SS_tot is noise): its fit must instead come within 5% of every point
        # (`bastion.scheduler.tuning.fit_quality`, the module's "Judging a fit").
        qualities = result.model.qualities()
        judged = ", ".join(f"{name} {q}" for name, q in qualities.items())
        print(f"  every fit whose points vary has R² >= {tm.MIN_R_SQUARED:g} (Chiron: "
              f"0.819-0.996), every flat one (points within {tm.FLAT_SHARE:.0%} of their "
              f"mean) is within {tm.FLAT_SHARE:.0%} of every point: {judged} -> "
              f"{'met' if qualities and all(q.good for q in qualities.values()) else 'MISSED'}")
        if chosen is None:
            print("  chosen interval keeps the bound: no interval was chosen "
                  f"({result.reason})")
        else:
            print(f"  chosen interval {chosen:.2f} s keeps the bound {args.bound:g} s in its "
                  f"drills: {bound_kept}/{bound_drills} -> "
                  f"{'met' if bound_kept == bound_drills and bound_drills else 'MISSED'}")
        print(f"  ({time.time() - started:.0f} s in all)")
        print(f"headline: TRT inside predicted range {in_range}/{total} ({share:.0%}); "
              f"measured/predicted avg TRT "
              f"{statistics.mean(avg_ratios) if avg_ratios else float('nan'):.2f} "
              f"(at the drills' E "
              f"{statistics.mean(at_e_ratios) if at_e_ratios else float('nan'):.2f}, "
              f"worst interval off by {fmt(worst_at_e)}); "
              f"predicted/measured L_avg "
              f"{statistics.mean(latency_ratios) if latency_ratios else float('nan'):.2f}; "
              f"chosen {fmt(chosen)} s kept the {args.bound:g} s bound in "
              f"{bound_kept}/{bound_drills} drills; fits: {judged}")
        if args.json:
            # written after the headline, silently: the headline stays the last line
            write_figures(args.json, figures_of(
                args, result, intervals, drill_log, rate=rate,
                probed_per_s=probed.ingest_max_per_s, points=points, repeats=repeats,
                drills=drills, seconds=time.time() - started))


if __name__ == "__main__":
    main()
