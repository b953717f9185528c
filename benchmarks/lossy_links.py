"""Lossy link outages under ``acks``, with and without copies (Dynamo thesis, Fig 3.31).

The thesis's correlated communication faults (§3.1.2.2): an operator instance's link
goes down at exponential times and stays down for a Gaussian time, and every tuple
and acknowledgment it sends meanwhile is lost; the sources replay what was not
acknowledged within the timeout. With tuple-level redundancy at the spout's outputs
(the first bolt's computation is redundant) a tuple whose copy went through an
instance with a live link needs no replay. Fig 3.31: on DataClean, redundancy 1.0
cuts the failed tuples by more than 51 %.

**DataClean** (Intel's Storm Benchmark, which the thesis runs as is): a spout of
page-view log lines -> ``PageViewBolt`` (parses a line into its HTTP status and the
view; shuffle grouping) -> ``FilterBolt(404)`` (drops the 404s; fields grouping on
the status). A tuple ratio of 1:1 at every bolt. Here: a paced ``Generator`` of
lines -> ``map`` "view" (p=2, parses) -> ``key_by`` status -> ``filter`` "clean"
(p=2, drops 404) -> ``map`` "stamp" (chained to "clean": notes when the record got
through) -> ``Collect`` sink (p=1). Redundancy on "view" alone (``redundancy={"view":
r}``), as the thesis's at the spout outputs; the lossy outages (``LinkOutage(...,
lose=True)``) on every instance of "view", each laid out from the same seed in every
run: up-times exponential with mean ``--mtbf-s`` held within [``--mtbf-min-s``,
``--mtbf-max-s``], outages Gaussian (``--mttr-ms``, ``--mttr-sd-ms``) held within
[``--mttr-min-ms``, ``--mttr-max-ms``]. The thesis's MTBF of 20-60 s is shortened to
a few seconds so that a run of ``--seconds`` sees several outages per instance.

**Failed tuples** (`count_failed`): a source record is failed when it was *replayed*
or missed its *deadline* — the time from its first arrival (when its source first
read it; a replay keeps the value, and with it that time) until it came out of
"clean" is over ``--deadline-ms``. The run cannot see a replay directly, so the
deadline is held below the ack timeout: a replayed record either came out more than
once (its first attempt got through, its acknowledgment did not) or came out first
from a replay, at least an ack timeout after it arrived — late. (A copy later than
the receiver's dedup window would come out twice as well; a lossy outage delays
nothing, so here none is.) A record that never came out (none should: acks replays
until it does) is failed too. The ack timeout is 2 s: this shared host stalls for a
second now and then, and a shorter one replays roots that were only slow.

What no copy can save: a tuple whose two copies both went through an instance whose
link was down. The benchmark prints the share of the run in which both instances'
seeded outages overlap, and with it the most that redundancy 1.0 could cut.

For each ratio (0, 0.5, 1.0) the job runs ``--repeats`` times, the ratios
interleaved, and the table shows the medians: tuples, failed, failed %, p50/p99 of
the per-record latency, CPU seconds per source record across the job's processes,
the frames and acknowledgments the outages lost and the roots the sources replayed.
The last line is the headline: failed tuples at r=1.0 against r=0 (target: at least
50 % fewer).

    .venv/bin/python benchmarks/lossy_links.py [--seconds S] [--rate R] [--repeats K] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402

STATUSES = (200, 200, 404, 200, 301, 200, 500, 200, 404, 200, 200, 304)
PAGES = ("/", "/cart", "/item/7", "/search?q=fox", "/login", "/item/42")
RATIOS = (0.0, 0.5, 1.0)


# -- the failed-tuple count: plain Python, unit-tested (tests/test_lossy_links.py) -------


@dataclass(frozen=True)
class FailedTuples:
    """What `count_failed` found; ``failed`` counts each source record once."""

    tuples: int
    failed: int
    late: int          # first came out after the deadline
    replayed: int      # came out more than once
    missing: int       # never came out
    latencies_s: tuple[float, ...]   # first arrival -> first out, one per record out

    @property
    def failed_share(self) -> float:
        return self.failed / self.tuples if self.tuples else 0.0


def count_failed(expected: Iterable[Any], outputs: Iterable[tuple[Any, float, float]],
                 deadline_s: float) -> FailedTuples:
    """The failed records among ``expected`` (source record ids), from ``outputs``:
    one ``(record id, first arrival s, out s)`` per time a record came out. A record is
    failed if it came out more than once (replayed), first came out more than
    ``deadline_s`` after its first arrival (late), or never (missing). An output whose
    id is not expected is an error: the count would be of something else."""
    expected = set(expected)
    times: dict[Any, list[float]] = {}
    arrival: dict[Any, float] = {}
    for rid, first_arrival_s, out_s in outputs:
        if rid not in expected:
            raise ValueError(f"record {rid!r} came out but no source record has that id")
        known = arrival.setdefault(rid, first_arrival_s)
        if known != first_arrival_s:
            raise ValueError(f"record {rid!r} came out with two first arrivals, {known!r} "
                             f"and {first_arrival_s!r}: a replay must keep the first")
        times.setdefault(rid, []).append(out_s)
    late = replayed = failed = 0
    latencies = []
    for rid, outs in times.items():
        latency_s = min(outs) - arrival[rid]
        latencies.append(latency_s)
        is_late, is_replayed = latency_s > deadline_s, len(outs) > 1
        late += is_late
        replayed += is_replayed
        failed += is_late or is_replayed
    missing = len(expected) - len(times)
    return FailedTuples(len(expected), failed + missing, late, replayed, missing,
                        tuple(sorted(latencies)))


def percentile(sorted_values: tuple[float, ...], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# -- DataClean ------------------------------------------------------------------------------


def page_view(i: int) -> tuple[int, str, float]:
    """Record ``i``: its id, a log line, and when the source read it (its first arrival:
    a replay sends the value the source kept, this time included)."""
    line = f"10.0.{i % 256}.{i % 7} GET {PAGES[i % len(PAGES)]} {STATUSES[i % len(STATUSES)]}"
    return i, line, time.time()


def parse(record: tuple[int, str, float]) -> tuple[int, int, str, float]:
    """PageViewBolt: the status and the view."""
    rid, line, arrived_s = record
    _, _, page, status = line.split(" ")
    return int(status), rid, page, arrived_s


def stamp(view: tuple[int, int, str, float]) -> tuple[int, float, float]:
    """When a record got through "clean": (id, first arrival, out)."""
    return view[1], view[3], time.time()


def dataclean(count: int, rate: float) -> bn.Topology:
    topo = bn.Topology("dataclean")
    views = topo.source("views", bn.sources.Generator(page_view, count=count, rate=rate))
    views.map("view", parse, parallelism=2).key_by(lambda v: v[0]).filter(
        "clean", lambda v: v[0] != 404, parallelism=2).map(
        "stamp", stamp, parallelism=2).sink("out", bn.sinks.Collect(), parallelism=1)
    return topo


def kept(count: int) -> list[int]:
    """The ids "clean" lets through, in plain Python."""
    return [i for i in range(count) if STATUSES[i % len(STATUSES)] != 404]


def outages(args: argparse.Namespace) -> list[bn.faults.LinkOutage]:
    mttr = bn.faults.Gaussian(mean=args.mttr_ms / 1000, stddev=args.mttr_sd_ms / 1000,
                              min=args.mttr_min_ms / 1000, max=args.mttr_max_ms / 1000)
    return [bn.faults.LinkOutage("view", mtbf_s=args.mtbf_s, mtbf_min_s=args.mtbf_min_s,
                                 mtbf_max_s=args.mtbf_max_s, mttr=mttr,
                                 mttr_s=args.mttr_ms / 1000, lose=True, seed=args.seed)]


def down_periods(fault: bn.faults.LinkOutage, index: int, until_s: float
                 ) -> list[tuple[float, float]]:
    """The outages instance ``index`` carries out in its first ``until_s`` seconds,
    laid out from the seed as the task lays them out."""
    from bastion.runtime.faults import TaskFaults

    outage = TaskFaults.for_task([fault], [fault.op], index).outages[0]
    periods = []
    while outage.down_from_s < until_s:
        periods.append((outage.down_from_s, min(outage.down_until_s, until_s)))
        outage.down_for_s(outage.down_until_s)   # on to the next period
    return periods


def link_shares(fault: bn.faults.LinkOutage, until_s: float) -> tuple[float, float]:
    """The share of ``until_s`` each of the two instances' links is down (their mean),
    and the share both are: then neither copy of a tuple gets through."""
    first, second = down_periods(fault, 0, until_s), down_periods(fault, 1, until_s)
    each = sum(b - a for a, b in first + second) / 2 / until_s
    both = sum(max(0.0, min(b, d) - max(a, c)) for a, b in first for c, d in second)
    return each, both / until_s


def one_run(args: argparse.Namespace, ratio: float, storage: str) -> dict[str, Any]:
    count = int(args.rate * args.seconds)
    options: dict[str, Any] = {}
    if ratio > 0:
        options["redundancy"] = {"view": ratio}
    result = bn.run(dataclean(count, args.rate),
                    bn.protocols.Acks(timeout_s=args.ack_timeout_s,
                                      interval_s=args.checkpoint_interval_s),
                    faults=outages(args), storage=storage, **options)
    m = result.metrics
    counted = count_failed(kept(count), result.outputs["out"], args.deadline_ms / 1000)
    injected = m.extra.get("faults_injected", {})
    counters = m.extra.get("protocol_counters", {})
    return {"counted": counted, "cpu_per_record_s": m.cpu_s / count,
            "frames_lost": injected.get("outage_frames_lost", 0),
            "acks_lost": injected.get("outage_acks_lost", 0),
            "replayed_roots": counters.get("roots_replayed", 0),
            "copies": m.extra.get("redundancy", {}).get("copies_sent", 0)}


def median(runs: list[dict[str, Any]], figure: Any) -> float:
    return statistics.median(figure(r) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="of input per run")
    parser.add_argument("--rate", type=float, default=300.0, help="records/s")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7, help="of the outages, every run")
    parser.add_argument("--mtbf-s", type=float, default=5.0)
    parser.add_argument("--mtbf-min-s", type=float, default=1.0)
    parser.add_argument("--mtbf-max-s", type=float, default=20.0)
    parser.add_argument("--mttr-ms", type=float, default=500.0, help="the thesis's shortest")
    parser.add_argument("--mttr-sd-ms", type=float, default=125.0)
    parser.add_argument("--mttr-min-ms", type=float, default=250.0)
    parser.add_argument("--mttr-max-ms", type=float, default=1000.0)
    parser.add_argument("--ack-timeout-s", type=float, default=2.0,
                        help="a shared host stalls for a second now and then: a shorter "
                             "timeout replays roots that were only slow")
    parser.add_argument("--checkpoint-interval-s", type=float, default=0.2,
                        help="how often the sink commits and acknowledges")
    parser.add_argument("--deadline-ms", type=float, default=500.0,
                        help="from a record's first arrival; below the ack timeout")
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS),
                        help="redundancy ratios on 'view' (0 and 1 always)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures as JSON (the results page)")
    args = parser.parse_args()
    ratios = tuple(sorted({0.0, 1.0} | {float(r) for r in args.ratios.split(",") if r}))
    if args.deadline_ms >= args.ack_timeout_s * 1000:
        parser.error("--deadline-ms must be below the ack timeout: a replay is seen "
                     "only as a second output or as a first one after the timeout")
    print(f"DataClean under acks, lossy outages on 'view' (both instances): MTBF exp "
          f"{args.mtbf_s:g} s in [{args.mtbf_min_s:g}, {args.mtbf_max_s:g}], MTTR "
          f"Gaussian {args.mttr_ms:g}±{args.mttr_sd_ms:g} ms in [{args.mttr_min_ms:g}, "
          f"{args.mttr_max_ms:g}], seed {args.seed}; {args.rate:g} records/s for "
          f"{args.seconds:g} s; ack timeout {args.ack_timeout_s:g} s; deadline "
          f"{args.deadline_ms:g} ms from first arrival; median of {args.repeats} runs")
    each, both = link_shares(outages(args)[0], args.seconds)
    print(f"seeded outages over the input's {args.seconds:g} s (timed from each task's "
          f"start): a link down {each:.1%} of the time, both at once {both:.1%} — "
          f"what no copy can save: at most {1 - both / each:.0%} fewer failed tuples"
          if each else "no outage within the run")
    runs: dict[float, list[dict[str, Any]]] = {r: [] for r in ratios}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ratios[repeat % len(ratios):] + ratios[:repeat % len(ratios)]
            for ratio in order:
                runs[ratio].append(one_run(args, ratio, f"local://{tmp}/{repeat}-{ratio}"))
    print(f"\n  {'r':>4} {'tuples':>7} {'failed':>7} {'failed %':>9} {'late':>5} "
          f"{'replayed':>8} {'p50 ms':>7} {'p99 ms':>8} {'CPU ms/rec':>10} "
          f"{'frames lost':>11} {'acks lost':>9} {'roots replayed':>14}")
    for ratio, done in runs.items():
        print(f"  {ratio:>4.1f} {median(done, lambda r: r['counted'].tuples):>7,.0f} "
              f"{median(done, lambda r: r['counted'].failed):>7,.0f} "
              f"{median(done, lambda r: r['counted'].failed_share):>9.2%} "
              f"{median(done, lambda r: r['counted'].late):>5,.0f} "
              f"{median(done, lambda r: r['counted'].replayed):>8,.0f} "
              f"{median(done, lambda r: percentile(r['counted'].latencies_s, .5)) * 1e3:>7.1f} "
              f"{median(done, lambda r: percentile(r['counted'].latencies_s, .99)) * 1e3:>8.1f} "
              f"{median(done, lambda r: r['cpu_per_record_s']) * 1e3:>10.3f} "
              f"{median(done, lambda r: r['frames_lost']):>11,.0f} "
              f"{median(done, lambda r: r['acks_lost']):>9,.0f} "
              f"{median(done, lambda r: r['replayed_roots']):>14,.0f}")
    print("  per run, failed:", {r: [d["counted"].failed for d in done]
                                 for r, done in runs.items()})
    base = median(runs[0.0], lambda r: r["counted"].failed)
    full = median(runs[1.0], lambda r: r["counted"].failed)
    cut = 1 - full / base if base else float("nan")
    if args.json:
        from bastion.bench import results as page

        page.write_figures(args.json, {
            "seconds": args.seconds, "rate": args.rate, "repeats": args.repeats,
            "mtbf_s": args.mtbf_s, "mttr_ms": args.mttr_ms,
            "link_down_share": each, "both_down_share": both,
            "ratios": [{
                "ratio": ratio,
                "tuples": median(done, lambda r: r["counted"].tuples),
                "failed": median(done, lambda r: r["counted"].failed),
                "failed_share": median(done, lambda r: r["counted"].failed_share),
                "replayed_roots": median(done, lambda r: r["replayed_roots"]),
                "cpu_per_record_s": median(done, lambda r: r["cpu_per_record_s"]),
                "failed_per_run": [d["counted"].failed for d in done]}
                for ratio, done in runs.items()]})
    print(f"\nfailed tuples at r=1.0 vs r=0: {full:,.0f} vs {base:,.0f} "
          f"({cut:.0%} fewer; target >= 50 % fewer: {'met' if cut >= 0.5 else 'missed'})")


if __name__ == "__main__":
    main()
