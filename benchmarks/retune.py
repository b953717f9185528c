"""Live re-tuning of the checkpoint interval when the input rate doubles, and a drill
after the move (issue 37 item 5).

1. Tunes the keyed job of ``benchmarks/tuning.py`` (a paced source at ``--load`` of
   what the job can take; the map waits on each record) with `bn.tune`, three kills
   per profiling run (``failures_per_run``), for a worst-case TRT bound.
2. Runs the same job live with ``bn.protocols.Coordinated(interval_s=
   bn.AutoInterval(...))``: that tuning and ``retune_every_s``, its source's rate doubling ``--surge-at`` seconds in
   (`Surge`), and kills it ``--kills`` times after the re-tune should have moved the
   interval (two periods after the surge, and a recovery apart). Prints the moves
   (``interval_retuned`` events) and each kill's observed TRT (kill -> sources caught
   up, `bastion.runtime.recovery_times`, through the drills' matching of kills) against
   the bound and against the model's prediction at the measured rate.
3. The baseline, in the same run: the same surge and kills at the interval tuned
   for the first rate, never moved.

The headline is the LAST line: the worst observed TRT after the move, with and without
re-tuning, against the bound. Nothing is asserted: on a shared machine the figures move
from run to run, and the output says so when the bound is missed.

    .venv/bin/python benchmarks/retune.py [--bound S] [--load U] [--kills N]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402
from bastion.faults import RandomKills  # noqa: E402
from bastion.scheduler import tuning as tm  # noqa: E402
from bastion.sources import Source, SourceReader  # noqa: E402
from bastion.tuning import RECOVERY_ALLOWANCE_S, RayProfiler, kill_outcomes_of  # noqa: E402


def _tuning_benchmark():
    """``benchmarks/tuning.py``: its workload (not a package: loaded from its path)."""
    name = "tuning_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parent / "tuning.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class Surge(Source):
    """A paced source of ``fn(k)`` for k in range(count) whose rate doubles ``at_s``
    seconds after it started: record k of an instance is due at ``k / rate`` before,
    and at twice the rate after. Its state is its offset and its schedule's start, so
    a replay from a checkpoint finds the same due times (as `bn.sources.Generator`)."""

    bounded = True

    def __init__(self, fn, count: int, rate: float, at_s: float):
        self.fn, self.count, self.rate, self.at_s = fn, count, rate, at_s

    def open(self, index: int, parallelism: int) -> SourceReader:
        return _SurgeReader(self, index, parallelism)

    def __repr__(self) -> str:
        return f"Surge(count={self.count}, rate={self.rate}, doubles at {self.at_s} s)"


class _SurgeReader(SourceReader):
    def __init__(self, source: Surge, index: int, parallelism: int):
        self.fn = source.fn
        self.share = max(0, math.ceil((source.count - index) / parallelism))
        self.rate = source.rate / parallelism
        self.at_s = source.at_s
        self.index, self.parallelism = index, parallelism
        self.offset, self.started_s = 0, None

    def _due(self, now_s: float) -> int:
        t = now_s - self.started_s
        due = self.rate * min(t, self.at_s) + 2 * self.rate * max(0.0, t - self.at_s)
        return min(self.share, int(due) + 1)

    def _due_at(self, k: int) -> float:
        head = self.rate * self.at_s
        return self.started_s + (k / self.rate if k < head
                                 else self.at_s + (k - head) / (2 * self.rate))

    def state(self):
        return (self.offset, self.started_s)

    def restore(self, state) -> None:
        self.offset, self.started_s = state

    def lag(self, now_s: float) -> int:
        return 0 if self.started_s is None else max(0, self._due(now_s) - self.offset)

    def read_backlog(self, max_records: int):
        return self._read(max_records, None)

    def read(self, max_records: int, now_s: float):
        return self._read(max_records, now_s)

    def arrivals(self, n: int, now_s: float):
        if self.started_s is None:
            return None
        return [min(now_s, self._due_at(k)) for k in range(self.offset - n, self.offset)]

    def _read(self, max_records: int, now_s: float | None):
        if self.offset >= self.share:
            return None
        n = min(max_records, self.share - self.offset)
        if now_s is not None:
            if self.started_s is None:
                self.started_s = now_s
            n = min(n, self._due(now_s) - self.offset)
            if n <= 0:
                return []
        p, first = self.parallelism, self.index + self.offset * self.parallelism
        self.offset += n
        return list(map(self.fn, range(first, first + n * p, p)))


def surge_count(rate: float, at_s: float, seconds: float) -> int:
    """Records a `Surge` reads in ``seconds``: ``rate`` until ``at_s``, twice after."""
    return round(rate * at_s + 2 * rate * max(0.0, seconds - at_s))


def surging(fn, rate: float, at_s: float, seconds: float, wait_s: float) -> bn.Topology:
    """``benchmarks/tuning.py``'s workload, its source a `Surge`."""
    bench = _tuning_benchmark()
    topo = bn.Topology("retune-bench")
    src = topo.source("numbers", Surge(fn, surge_count(rate, at_s, seconds), rate, at_s))
    src.map("work", bench.make_work(wait_s)).key_by(lambda kv: kv[0]).reduce(
        "sum", lambda acc, kv: (acc + kv[1]) % 1_000_003, initial=0).sink(
        "out", bn.sinks.Collect())
    return topo


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def live(topo: bn.Topology, kills_at: list[float], options: dict,
         interval_s: "float | bn.AutoInterval") -> tuple:
    """One live run with kills at ``kills_at`` (seconds), checkpointing every
    ``interval_s`` (an `AutoInterval`: re-tuned while it runs); its moves and each
    kill's outcome."""
    faults = [RandomKills(1, between=(t, t), seed=i) for i, t in enumerate(kills_at)]
    run = bn.run(topo, bn.protocols.Coordinated(interval_s=interval_s), faults=faults,
                 **options)
    plan = tm._plan_of(topo, options)  # noqa: SLF001 - the plan the kills target
    scheduled = [k for f in faults for k in f.schedule(plan)]
    events = run.details["events"]
    outcomes = kill_outcomes_of(scheduled, events, run.details["timeline"],
                                run.metrics.duration_s, run.job_id)
    moves = [e for e in events if e["kind"] in ("interval_retuned", "trt_bound_unreachable")]
    return run, moves, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=float, default=4.0, help="worst-case TRT bound (4 s)")
    parser.add_argument("--load", type=float, default=0.3,
                        help="the first rate, as a share of the probed maximum (0.3)")
    parser.add_argument("--min", type=float, default=0.5, help="shortest interval (0.5)")
    parser.add_argument("--max", type=float, default=4.0, help="longest interval (4)")
    parser.add_argument("--points", type=int, default=4, help="profiled intervals (4)")
    parser.add_argument("--period", type=float, default=2.0, help="re-tune period s (2)")
    parser.add_argument("--surge-at", type=float, default=6.0,
                        help="seconds after the source starts when its rate doubles (6)")
    parser.add_argument("--kills", type=int, default=2, help="kills after the move (2)")
    parser.add_argument("--wait-ms", type=float, default=0.2,
                        help="milliseconds the map waits per record (0.2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bench = _tuning_benchmark()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bastion-retune-") as tmp:
        options = {**bench.RUN_OPTIONS, "storage": f"local://{tmp}/store"}
        probe = RayProfiler(bench.workload(1000.0, 10.0, args.wait_ms / 1000),
                            max_rate_run_s=4.0, capacity_interval_s=1.0,
                            run_options=options)
        probed = probe.capacity()
        rate = round(args.load * probed.ingest_max_per_s, -1)
        print(f"workload: paced source {rate:,.0f} records/s ({args.load:.0%} of a probed "
              f"maximum {probed.ingest_max_per_s:,.0f}/s), doubling to {2 * rate:,.0f}/s "
              f"{args.surge_at:g} s in; map waiting {args.wait_ms:g} ms per record, keyed "
              f"sum; protocol coordinated; load {os.getloadavg()[0]:.1f}")

        def progress(p: dict) -> None:
            print(f"  profiling {p['done']}/{p['total']} {p['what']} (load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)

        tuned = bn.tune(bench.workload(rate, 12.0, args.wait_ms / 1000),
                        trt_bound_s=args.bound, min_interval_s=args.min,
                        max_interval_s=args.max, points=args.points, failures_per_run=3,
                        seed=args.seed, progress=progress, **options)
        model = tuned.model
        print(f"\ntuned at {rate:,.0f}/s: {tuned.reason}")
        print(f"recoveries read at {model.catch_up_per_s:,.0f}/s; {len(tuned.measurements)} "
              f"kills measured over {len(model.points)} intervals; {tuned.fits()}")
        if tuned.interval_s is None:
            print("HEADLINE: no interval meets the bound at the first rate; nothing to re-tune")
            return
        u2 = 2 * rate / model.catch_up_per_s
        print(f"at twice the rate (U {u2:.2f}) the model predicts a worst-case TRT of "
              + (f"{model.trt_at(tuned.interval_s, u2).max_s:.2f} s at the tuned "
                 f"{tuned.interval_s:.2f} s" if u2 < 1 else "no catch-up at all"))
        # kills after the move: two periods after the surge, then a recovery apart —
        # the slower one, the fixed interval's (the same kill times for both runs)
        fixed_trt = model.trt_at(tuned.interval_s, u2).max_s if u2 < 1 else 3 * args.bound
        gap = RECOVERY_ALLOWANCE_S + max(args.bound, fixed_trt)
        first = args.surge_at + 2 * args.period + 1.5
        kills_at = [round(first + i * gap, 3) for i in range(args.kills)]
        seconds = kills_at[-1] + gap + 1.0
        topo = surging(bench.value_at, rate, args.surge_at, seconds, args.wait_ms / 1000)
        print(f"\nlive runs: {seconds:.0f} s of input, kills at {kills_at} s after the job "
              f"started")
        worst: dict[str, float | None] = {}
        for name, interval in (("re-tuned", bn.AutoInterval(trt_bound_s=args.bound,
                                                             tuning=tuned,
                                                             retune_every_s=args.period)),
                               ("fixed", tuned.interval_s)):
            run, moves, outcomes = live(topo, kills_at, options, interval)
            read_from = next(p["t_s"] for p in run.details["timeline"] if p["source_records"])
            print(f"\n{name}: job {run.job_id} (load {os.getloadavg()[0]:.1f}); the rate "
                  f"doubled at {read_from + args.surge_at:.2f} s")
            for e in moves:
                print(f"  {e['t_s']:.2f} s {e['kind']}: {e['interval_before_s']:.2f} -> "
                      f"{e['interval_s']:.2f} s at {e['ingest_avg_per_s']:,.0f}/s "
                      f"(U {e['utilisation']:.2f}), predicted worst-case TRT "
                      f"{fmt(e['predicted_trt_before_s'])} -> {fmt(e['predicted_trt_s'])} s")
            if name == "re-tuned":
                # the first move on a period that saw the doubled rate
                doubled = next((e for e in moves if e["kind"] == "interval_retuned"
                                and e["ingest_avg_per_s"] >= 1.8 * rate), None)
                after_s = (None if doubled is None
                           else doubled["t_s"] - read_from - args.surge_at)
                print("  no move saw the doubled rate" if after_s is None else
                      f"  moved to {doubled['interval_s']:.2f} s (the doubled rate's "
                      f"optimum) {after_s:.2f} s = {after_s / args.period:.1f} periods "
                      f"after the surge; {len(moves)} moves in the run")
            seen = []
            for o in outcomes:
                interval_now = next((e["interval_s"] for e in reversed(moves)
                                     if e["t_s"] < o.at_s), None) or tuned.interval_s
                predicted = (model.trt_at(interval_now, u2).max_s if u2 < 1 else None)
                verdict = ("never caught up" if o.trt_s is None else
                           "within the bound" if o.trt_s <= args.bound else "OVER THE BOUND")
                print(f"  kill at {o.at_s:.2f} s (interval {interval_now:.2f} s, E "
                      f"{fmt(o.reprocess_s)} s): TRT {fmt(o.trt_s)} s, predicted worst "
                      f"{fmt(predicted)} s, bound {args.bound:g} s: {verdict}")
                seen.append(math.inf if o.trt_s is None else o.trt_s)
            worst[name] = max(seen) if seen else None
        print(f"\n{time.time() - started:.0f} s in all")
        r, f = worst.get("re-tuned"), worst.get("fixed")
        ratio = "-" if not (r and f and math.isfinite(r) and math.isfinite(f)) else f"{r / f:.2f}"
        held = "held" if r is not None and r <= args.bound else "MISSED"
        print(f"HEADLINE: after the rate doubled, worst observed TRT {fmt(r)} s re-tuned vs "
              f"{fmt(f)} s at the fixed tuned interval (ratio {ratio}); bound {args.bound:g} s "
              f"{held} with re-tuning")


if __name__ == "__main__":
    main()
