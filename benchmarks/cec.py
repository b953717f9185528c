"""CEC benchmark: how fast eventual checkpoints are rebuilt from logs, in-process and by
Spark, and how fast the log they live in takes records.

Three figures, each against the target of issue 12:

(a) **Python reconstruction** — `eventual.read_eventual_checkpoint` (the in-process
    path a restart takes: the log's block-checked backward reader feeding
    `Reconstruction`) on one instance's log of ``--python-records`` (2 million) log
    records of a keyed reduce: one part per key, each opened by a ``G_open`` spread
    evenly through the log from its first record (one per 20 records), a ``G_check``
    of a random other part every 1,000 records, results between them. The oldest
    part's only footprint is record 0, so the extent is the whole log and the
    backward pass reads every record. Rate: extent records per second of wall time,
    best of ``--repeats``. Beside it, the same with Python's garbage collector off,
    and the two halves: the backward read alone and `reconstruct` fed from memory.
    Target ≥ 500,000/s.
(b) **Spark reconstruction** — `bastion.spark_jobs.reconstruct.reconstruct_operator`
    over an operator of ``--instances`` (4) instances holding ``--spark-records``
    (10 million) records in all, in sealed segments of 2 MiB (~40 per instance), once
    with ``local[1]`` and once with ``local[2]`` (a session each, started before the
    clock runs, warmed up on a small log), best of ``--repeats``; the rate counts the
    log records the tasks read, and the ratio is how the job scales with executor
    cores (target ≥ 1.6× on two), printed beside what two busy processes get done
    against one on the machine at that moment (a CPU-bound loop; 2.0 on two free
    cores): the ratio cannot beat it. Every instance's Spark EC is compared with the
    Python path's (``to_wire()``), printed as "same EC".
(c) **Log append** — `LogWriter.append_many` of 100-byte values in batches of 1,000 on
    local storage, ``close()`` included (every record sealed and stored), 1 million
    records, best of ``--repeats``. Target ≥ 1 M records/s.

Logs are written with `LogWriter.append_many` in batches of 100,000 straight from
prepared values (the CEC model of the tests would take minutes for 10 million), into a
temporary directory that is removed afterwards. It prints figures and asserts nothing;
the headline is the last line. This machine may be shared: best-of figures, and the
load average is printed with them.

Run: ``.venv/bin/python benchmarks/cec.py`` (about 5-10 minutes on two cores;
``--spark-records 2000000 --repeats 1`` for a quick look, ``--no-spark`` for (a) and
(c) only).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

from bastion.protocols import eventual
from bastion.protocols.eventual import read_eventual_checkpoint, reconstruct
from bastion.storage import LocalStore, LogReader, LogWriter, ObjectStore

WRITE_BATCH_RECORDS = 100_000
APPEND_BATCH_RECORDS = 1_000
SPARK_SEGMENT_BYTES = 2 * 1024 * 1024
RECORDS_PER_KEY = 20         # a G_open per 20 records: 5% of the log opens a part
CHECK_EVERY_RECORDS = 1_000  # one G_check per this many records
JOB, OPERATOR = "cec-bench", "reduce"


def write_reduce_log(store: ObjectStore, prefix: str, records: int, keys: int, seed: int,
                     segment_bytes: int = 8 * 1024 * 1024) -> None:
    """A keyed reduce's CEC log of exactly ``records`` records: key k's ``G_open`` at
    record ``k * records // keys`` (key 0's at record 0: the extent is the whole log),
    a ``G_check`` of a random open part other than key 0 every
    ``CHECK_EVERY_RECORDS``, results everywhere else. Result values come from a small
    pool: what they hold does not change how fast they are read."""
    rng = random.Random(seed)
    results = [eventual.result([k, rng.randrange(10**6)]) for k in range(4096)]
    opens_at = {k * records // keys: k for k in range(keys)}
    opened = 0
    totals: dict[int, int] = {}
    with LogWriter(store, prefix, max_segment_bytes=segment_bytes) as writer:
        batch: list[tuple[float, list]] = []
        for seq in range(records):
            position = None
            if seq in opens_at:
                k, kind = opens_at[seq], eventual.G_OPEN
                opened += 1
            elif seq % CHECK_EVERY_RECORDS == 0 and opened > 1:
                k, kind = rng.randrange(1, opened), eventual.G_CHECK
            else:
                batch.append((seq * 1e-4, results[seq & 4095]))
                k = -1
            if k >= 0:
                totals[k] = totals.get(k, 0) + seq
                position = {"src/0": seq, "src/1": seq // 2}
                batch.append((seq * 1e-4, eventual.footprint(
                    kind, msgpack.packb(k), msgpack.packb(totals[k]), opened, position,
                    seq * 1e-4 - 1.0)))
            if len(batch) == WRITE_BATCH_RECORDS:
                writer.append_many(batch)
                batch = []
        writer.append_many(batch)


def best_of(repeats: int, fn: Callable[[], int]) -> tuple[float, int]:
    """(fastest wall seconds, what ``fn`` counted) over ``repeats`` calls."""
    best = (float("inf"), 0)
    for _ in range(repeats):
        start = time.perf_counter()
        count = fn()
        best = min(best, (time.perf_counter() - start, count))
    return best


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


_SPIN = "n = 0\nfor i in range(20_000_000): n += i"


def two_core_factor(repeats: int = 3) -> float:
    """How much two busy processes get done at once against one, on this machine now:
    2.0 with two free cores, less when other work shares them. The Spark ratio is
    bounded by it."""
    def wall(processes: int) -> float:
        start = time.perf_counter()
        running = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(processes)]
        for p in running:
            p.wait()
        return time.perf_counter() - start

    # alternating, and the fastest of each: a burst of other work then spoils one
    # measurement, not a whole side
    ones, twos = [], []
    for _ in range(repeats):
        ones.append(wall(1))
        twos.append(wall(2))
    return 2 * min(ones) / min(twos)


def python_reconstruction(root: Path, records: int, repeats: int) -> float:
    store = LocalStore(root / "python")
    prefix = "log/"
    start = time.perf_counter()
    write_reduce_log(store, prefix, records, records // RECORDS_PER_KEY, seed=1)
    print(f"(a) wrote {records:,} records in {time.perf_counter() - start:.1f} s ({load()})")

    def rebuild() -> int:
        ec, damage = read_eventual_checkpoint(store, prefix)
        if damage or not ec.complete or ec.extent_records != records:
            print(f"    note: unexpected EC (extent {ec.extent_records:,}, damage {damage})")
        return ec.extent_records

    def read_only() -> int:
        return sum(len(batch) for batch in LogReader(store, prefix).read_backward())

    seconds, extent = best_of(repeats, rebuild)
    rate = extent / seconds

    def rebuild_without_gc() -> int:
        gc.disable()
        try:
            return rebuild()
        finally:
            gc.enable()

    # The backward pass allocates a tuple per record while the EC keeps a footprint
    # per part: the collector walks them again and again. Not a fix made here (the
    # call is the runtime's), but how much it costs is worth a line.
    no_gc_s, _ = best_of(repeats, rebuild_without_gc)
    read_s, read_n = best_of(repeats, read_only)
    in_memory = [r for batch in LogReader(store, prefix).read_backward() for r in batch]
    feed_s, _ = best_of(repeats, lambda: reconstruct(iter(in_memory)).extent_records)
    del in_memory
    print(f"(a) Python reconstruction: extent {extent:,} records in {seconds:.2f} s = "
          f"{rate:,.0f} records/s (target 500,000)")
    print(f"    the same with the garbage collector off: {extent / no_gc_s:,.0f} records/s")
    print(f"    its halves: backward read {read_n / read_s:,.0f} records/s, "
          f"reconstruct fed from memory {extent / feed_s:,.0f} records/s ({load()})")
    return rate


def spark_reconstruction(root: Path, records: int, instances: int, repeats: int
                         ) -> dict[str, float]:
    from bastion.spark_jobs.reconstruct import log_prefix, reconstruct_operator
    from bastion.spark_jobs.session import build_session

    store = LocalStore(root / "spark")
    start = time.perf_counter()
    for i in range(instances):
        share = records // instances + (1 if i < records % instances else 0)
        write_reduce_log(store, log_prefix(JOB, OPERATOR, str(i)), share,
                         share // RECORDS_PER_KEY, seed=10 + i,
                         segment_bytes=SPARK_SEGMENT_BYTES)
    objects = len(store.list(f"jobs/{JOB}/logs/"))
    print(f"(b) wrote {records:,} records ({instances} instances, {objects} objects) in "
          f"{time.perf_counter() - start:.1f} s ({load()})")
    write_reduce_log(store, log_prefix(JOB, "warmup", "0"), 20_000, 100, seed=0)

    rates: dict[str, float] = {}
    spark_ecs: dict[str, dict] = {}
    for master in ("local[1]", "local[2]"):
        spark = build_session(master, app_name="bastion cec benchmark")
        try:
            reconstruct_operator(spark, store, JOB, "warmup", write=False)

            def rebuild() -> int:
                found = reconstruct_operator(spark, store, JOB, OPERATOR, write=False)
                spark_ecs.update({r.instance: r.ec.to_wire() for r in found})
                return sum(r.records for r in found)

            seconds, read = best_of(repeats, rebuild)
        finally:
            spark.stop()
        rates[master] = read / seconds
        print(f"(b) Spark {master}: {read:,} records in {seconds:.2f} s = "
              f"{rates[master]:,.0f} records/s ({load()})")
    factor = two_core_factor()
    same = all(spark_ecs[str(i)] == read_eventual_checkpoint(
        store, log_prefix(JOB, OPERATOR, str(i)))[0].to_wire() for i in range(instances))
    print(f"(b) local[2]/local[1] = {rates['local[2]'] / rates['local[1]']:.2f}x "
          f"(target 1.6x); this machine's two-busy-processes factor now: {factor:.2f}x; "
          f"same EC as the Python path for every instance: {'yes' if same else 'NO'}")
    return rates


def log_append(root: Path, records: int, repeats: int) -> float:
    store = LocalStore(root / "append")
    rng = random.Random(7)
    values = [rng.randbytes(100) for _ in range(256)]
    batches = [[(float(i), values[i & 255]) for i in range(s, min(s + APPEND_BATCH_RECORDS,
                                                                  records))]
               for s in range(0, records, APPEND_BATCH_RECORDS)]
    run = 0

    def append() -> int:
        nonlocal run
        run += 1
        with LogWriter(store, f"append-{run}/") as writer:
            for batch in batches:
                writer.append_many(batch)
        return records

    seconds, _ = best_of(repeats, append)
    rate = records / seconds
    print(f"(c) log append, 100-byte values: {records:,} records in {seconds:.2f} s = "
          f"{rate / 1e6:.2f} M records/s (target 1 M) ({load()})")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-records", type=int, default=2_000_000)
    parser.add_argument("--spark-records", type=int, default=10_000_000)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--append-records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bastion-cec-bench-"))
    try:
        python_rate = python_reconstruction(root, args.python_records, args.repeats)
        spark = None if args.no_spark else spark_reconstruction(
            root, args.spark_records, args.instances, min(args.repeats, 2))
        append_rate = log_append(root, args.append_records, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    headline = (f"CEC: Python reconstruction {python_rate:,.0f} records/s (target 500,000); ")
    if spark:
        headline += (f"Spark {spark['local[1]']:,.0f} / {spark['local[2]']:,.0f} records/s "
                     f"on local[1] / local[2] = {spark['local[2]'] / spark['local[1]']:.2f}x "
                     "(target 1.6x); ")
    headline += f"log append {append_rate / 1e6:.2f} M records/s (target 1 M)"
    print(headline)


if __name__ == "__main__":
    main()
