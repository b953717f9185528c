"""Fault-tolerance protocols on NexMark, in the style of CheckMate's Fig. 7 / Tables II–IV.

For each query × protocol (``none``, ``coordinated``, ``uncoordinated``, ``cic``):

- throughput with an unpaced source, and its ratio to ``none`` measured in the same run
  (the maximum-sustainable-throughput proxy on this machine);
- latency p50/p99 at half of the ``none`` throughput;
- checkpoints taken, average checkpoint duration, invalid checkpoints and their
  share, and the message size relative to no protocol (1 + protocol bytes / data
  bytes, CheckMate Table II);
- one kill at half rate: detection, restart, recovery and total recovery time, and
  whether the committed output equals the reference (exactly-once);

then the skewed runs (hot items 10/20/30%) of Q3/Q8/Q12 under each protocol. Also the
W1 keyed count of the core benchmark (``throughput.py``) with coordinated checkpoints
every ``--interval`` against no checkpoints. Prints tables; asserts nothing.

    .venv/bin/python benchmarks/protocols.py [--events N] [--queries q1,q3,q8,q12] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402
from bastion.bench import nexmark  # noqa: E402
from throughput import w1  # noqa: E402  (the core benchmark's W1 workload)

PROTOCOLS = ["none", "coordinated", "uncoordinated", "cic"]
QUERIES = {"q1": nexmark.q1, "q3": nexmark.q3, "q8": nexmark.q8, "q12": nexmark.q12}


def build(query: str, config: nexmark.NexmarkConfig, rate: float | None, sink) -> bn.Topology:
    topo = bn.Topology(f"nexmark-{query}")
    QUERIES[query](topo, config, sink, parallelism=2, rate=rate)
    return topo


def big_state(keys: int = 100_000, rate: float = 40_000.0) -> bn.Topology:
    """A keyed job whose state reaches ~10 MB: every key remembers a 100-byte value."""
    topo = bn.Topology("big-state")
    src = topo.source("numbers", bn.sources.Generator(lambda i: i, count=int(rate * 6),
                                                      rate=rate))
    src.key_by(lambda i: i % keys).reduce(
        "remember", lambda acc, i: f"{i:0100d}", initial="", parallelism=2).filter(
        "every-1000th", lambda kv: int(kv[1]) % 1000 == 0).sink("out", bn.sinks.Collect())
    return topo


def fmt(value, spec: str = ".2f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def every(protocol: str, interval_s: float) -> "str | bn.protocols.Protocol":
    """Protocol ``protocol`` checkpointing (or committing) every ``interval_s`` seconds:
    its object with that knob; ``"none"`` has no interval, and stays a name."""
    cls = type(bn.protocols.get_protocol(protocol))
    return protocol if protocol == "none" else cls(interval_s=interval_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--queries", default="q1,q3,q8,q12")
    parser.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, s")
    parser.add_argument("--quick", action="store_true", help="skip the kill and skew runs")
    args = parser.parse_args()
    queries = args.queries.split(",")
    storage = f"local://{tempfile.mkdtemp(prefix='bastion-bench-')}"
    bn.launcher.ensure_ray()

    def run(topo, protocol, **kw):
        return bn.run(topo, every(protocol, args.interval), storage=storage, **kw)

    config = nexmark.NexmarkConfig(seed=7, events=args.events, inter_event_s=0.001)
    print(f"NexMark, {args.events:,} events, parallelism 2, checkpoint interval "
          f"{args.interval} s, storage {storage}\n")
    header = (f"{'query':<5} {'protocol':<14} {'tuples/s':>10} {'vs none':>8} {'p50 ms':>7} "
              f"{'p99 ms':>7} {'ckpts':>6} {'ckpt s':>7} {'invalid':>8} {'msg size':>9}")
    print(header)
    print("-" * len(header))
    half_rates: dict[str, float] = {}
    for query in queries:
        base = None
        for protocol in PROTOCOLS:
            m = run(build(query, config, None, bn.sinks.Discard()), protocol).metrics
            if protocol == "none":
                base = m.tuples_per_s
                half_rates[query] = base / 2
            paced = nexmark.NexmarkConfig(seed=7, events=min(args.events, int(base * 2)),
                                          inter_event_s=0.001)
            lat = run(build(query, paced, base / 2, bn.sinks.Discard()), protocol).metrics
            x = m.protocol
            invalid = (f"{x.invalid_checkpoints} ({x.invalid_share:.0%})"
                       if protocol in ("uncoordinated", "cic") else "-")
            print(f"{query:<5} {protocol:<14} {m.tuples_per_s:>10,.0f} "
                  f"{m.tuples_per_s / base:>7.2f}x {fmt(lat.latency_ms['p50']):>7} "
                  f"{fmt(lat.latency_ms['p99']):>7} {x.checkpoints_completed:>6} "
                  f"{fmt(x.checkpoint_duration_s_avg, '.3f'):>7} {invalid:>8} "
                  f"{1 + x.message_overhead:>8.4f}x")

    if not args.quick:
        print("\nOne kill at half rate (kill an instance of the last operator at 2 s)")
        print(f"{'query':<5} {'protocol':<14} {'exactly once':>12} {'detect s':>9} "
              f"{'restart s':>9} {'recovery s':>10} {'TRT s':>7}")
        for query in queries:
            rate = half_rates[query]
            paced = nexmark.NexmarkConfig(seed=7, events=int(rate * 5), inter_event_s=0.001)
            for protocol in PROTOCOLS[1:]:
                topo = build(query, paced, rate, bn.sinks.Collect())
                victim = list(topo.nodes)[-2]
                report = bn.drill(topo, every(protocol, args.interval),
                                  faults=[bn.faults.KillInstance(victim, 0, at=2.0)],
                                  storage=storage)
                print(f"{query:<5} {protocol:<14} {'yes' if report.exactly_once else 'NO':>12} "
                      f"{fmt(report.detection_s):>9} {fmt(report.restart_s):>9} "
                      f"{fmt(report.recovery_s):>10} {fmt(report.trt_s):>7}")

        print("\nSkew (hot items): tuples/s relative to none at the same skew")
        print(f"{'query':<5} {'hot':>4} " + " ".join(f"{p:>14}" for p in PROTOCOLS))
        for query in [q for q in queries if q in ("q3", "q8", "q12")]:
            for hot in (0.1, 0.2, 0.3):
                skewed = nexmark.NexmarkConfig(seed=7, events=args.events, inter_event_s=0.001,
                                               hot_ratio=hot)
                rates = [run(build(query, skewed, None, bn.sinks.Discard()), p)
                         .metrics.tuples_per_s for p in PROTOCOLS]
                print(f"{query:<5} {hot:>4.0%} " + " ".join(
                    f"{r:>10,.0f} {r / rates[0]:>3.1f}x" for r in rates))

    print("\nRestart with ~10 MB of keyed state (100,000 keys x 100 B, parallelism 2), "
          "one kill at 3 s, heartbeat timeout 1 s, checkpoint interval 1 s")
    print(f"{'protocol':<14} {'state MB':>8} {'exactly once':>12} {'detect s':>9} "
          f"{'restart s':>9} {'TRT s':>7} {'TRT bound s':>11}")
    for protocol in PROTOCOLS[1:]:
        report = bn.drill(big_state(), every(protocol, 1.0),
                          faults=[bn.faults.KillInstance("remember", 0, at=3.0)],
                          storage=storage)
        p = report.metrics.protocol
        state_mb = (p.state_bytes_last or 0) / 1e6
        bound = (None if report.detection_s is None or report.restart_s is None
                 else 3 * (report.detection_s + report.restart_s + 0.5))
        print(f"{protocol:<14} {fmt(state_mb if state_mb else None, '.1f'):>8} "
              f"{'yes' if report.exactly_once else 'NO':>12} {fmt(report.detection_s):>9} "
              f"{fmt(report.restart_s):>9} {fmt(report.trt_s):>7} {fmt(bound):>11}")

    records = 10_000_000  # long enough that every checkpointed run takes a checkpoint
    print(f"\nW1 keyed running count ({records:,} tuples, parallelism 1), "
          f"checkpoint interval {args.interval} s, median of 3")
    medians: dict[str, float] = {}
    for protocol in ("none", "coordinated"):
        runs = [run(w1(records, parallelism=1), protocol).metrics for _ in range(3)]
        medians[protocol] = statistics.median(m.tuples_per_s for m in runs)
        checkpoints = [m.protocol.checkpoints_completed for m in runs]
        print(f"  {protocol:<12} {medians[protocol]:>12,.0f} tuples/s "
              f"{medians[protocol] / medians['none']:>6.2f}x of none   "
              f"checkpoints per run {checkpoints}")


if __name__ == "__main__":
    main()
