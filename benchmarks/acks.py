"""Protocol ``acks``: what at-least-once by acknowledgments costs, and what it buys.

Two sections, every figure measured in this run:

(a) **Throughput** of Grep (lines → ``flat_map`` split into words → ``filter`` words
    that start with "a" → ``Discard``) and of a two-stage pipeline with a keyed
    exchange (lines → ``map`` → ``key_by`` → ``map`` → ``Discard``), unpaced, at
    parallelism 1 and 2, under ``none``, ``none`` with lineage ids (which ``acks``
    turns on), ``acks`` fine-grained and ``acks`` XOR; best of ``--repeats``, the
    configurations alternating. Also CPU seconds per million source records (all the
    job's processes). The issue's target: fine-grained acks ≥ 0.7× of ``none``.
(b) **Lost frames**: the pipeline paced, its keyed stage losing a frame with
    probability ``--drop`` — records lost under ``none`` and under ``acks``
    (replayed after ``--ack-timeout`` seconds), by the drill's verdict, with the
    roots replayed and the duplicates committed.

Prints tables and asserts nothing; the headline is the last line.

    .venv/bin/python benchmarks/acks.py [--records N] [--repeats K]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog and again away".split()


def line(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8))


def grep(n: int, parallelism: int) -> bn.Topology:
    topo = bn.Topology(f"grep-p{parallelism}")
    lines = topo.source("lines", bn.sources.Generator(line, count=n), parallelism=parallelism)
    lines.flat_map("split", str.split, parallelism=parallelism).filter(
        "match", lambda w: w.startswith("a"), parallelism=parallelism).sink(
        "out", bn.sinks.Discard())
    return topo


def exchange(n: int, parallelism: int, rate: float | None = None,
             sink: bn.sinks.Sink | None = None) -> bn.Topology:
    topo = bn.Topology(f"exchange-p{parallelism}")
    lines = topo.source("lines", bn.sources.Generator(line, count=n, rate=rate),
                        parallelism=parallelism)
    lines.map("first", lambda s: s.split(" ", 1)[0], parallelism=parallelism).key_by(
        lambda w: w).map("upper", str.upper, parallelism=parallelism).sink(
        "out", sink or bn.sinks.Discard())
    return topo


CONFIGS = [("none", "none", {}), ("none+lineage", "none", {"lineage": True}),
           ("acks fine", bn.protocols.Acks(mode="fine", interval_s=0.2), {}),
           ("acks xor", bn.protocols.Acks(mode="xor", interval_s=0.2), {})]


def throughput(records: int, repeats: int, storage: str) -> float:
    print("(a) throughput, unpaced (records/s of the source; CPU s per million records)")
    print(f"{'workload':<14} {'config':<14} {'records/s':>12} {'vs none':>8} {'CPU s/M':>8}")
    headline = 0.0
    for build in (grep, exchange):
        for parallelism in (1, 2):
            best: dict[str, tuple[float, float]] = {}
            for _ in range(repeats):
                for label, protocol, options in CONFIGS:
                    metrics = bn.run(build(records, parallelism), protocol,
                                     storage=storage, **options).metrics
                    if metrics.tuples_per_s > best.get(label, (0.0, 0.0))[0]:
                        best[label] = (metrics.tuples_per_s,
                                       metrics.cpu_s_per_million_records)
            none_rate = best["none"][0]
            for label, (rate, cpu) in best.items():
                print(f"{build.__name__ + ' p=' + str(parallelism):<14} {label:<14} "
                      f"{rate:>12,.0f} {rate / none_rate:>7.2f}x {cpu:>8.2f}")
            if build is exchange and parallelism == 2:
                headline = best["acks fine"][0] / none_rate
    return headline


def lost_frames(records: int, drop: float, ack_timeout_s: float, storage: str) -> None:
    print(f"\n(b) a keyed stage losing frames (p={drop}), paced at 5,000 records/s")
    print(f"{'protocol':<10} {'verdict':<14} {'lost':>7} {'duplicated':>10} "
          f"{'frames lost':>11} {'roots replayed':>14}")
    faults = [bn.faults.DropFrames("first", probability=drop, seed=1)]
    for protocol in ("none", bn.protocols.Acks(timeout_s=ack_timeout_s, interval_s=0.2)):
        report = bn.drill(exchange(records, 2, rate=5000.0, sink=bn.sinks.Collect()),
                          protocol, faults=faults, storage=storage)
        extra = report.metrics.extra
        print(f"{report.protocol:<10} {report.verdict:<14} {report.lost:>7,} "
              f"{report.duplicated:>10,} {extra['faults_injected']['frames_dropped']:>11,.0f} "
              f"{extra['protocol_counters'].get('roots_replayed', 0):>14,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drop", type=float, default=0.05)
    parser.add_argument("--ack-timeout", type=float, default=0.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"local://{tmp}"
        ratio = throughput(args.records, args.repeats, storage)
        lost_frames(min(args.records, 20_000), args.drop, args.ack_timeout, storage)
    print(f"\nacks fine-grained / none, keyed exchange at p=2: {ratio:.2f}x (target >= 0.7x)")


if __name__ == "__main__":
    main()
