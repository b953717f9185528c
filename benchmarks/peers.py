"""Keyed running count with 1-s checkpoints: Bastion against Spark Structured Streaming.

One workload, the one Spark users tune: a stream of numbers ``i``, keyed by
``i % 100``, a running count per key, checkpointed every second, its output
discarded. In three forms on each side (issue 41):

- Bastion **per-record**: ``Generator(identity)`` → ``key_by(lambda x: x % 100)`` →
  ``reduce(lambda acc, _: acc + 1, initial=0)``: a Python call per record for the
  source, the key and the fold;
- Bastion **batch**: ``Generator(batch_fn=identity)`` → ``key_by_batch(lambda c: c %
  100)`` → ``reduce(bn.aggregations.Count())``: a numpy call per batch for the source
  and the key, the count folded in C;
- Spark **SQL**, **pandas-UDF** and **Python-UDF**: ``rate-micro-batch`` source →
  ``groupBy(key).count()`` in update mode → ``noop`` sink, the key computed by
  ``value % 100``, by a ``pandas_udf`` or by a ``udf``.

Both engines run on this machine with two cores (Bastion at ``--parallelism``, default
2; Spark ``local[2]``). Bastion checkpoints with protocol ``coordinated`` every 1 s
and its rate is `RunMetrics.tuples_per_s` over ``--records`` records. Spark
checkpoints once per micro-batch (its offset and commit logs and the state store)
with a 1-s processing-time trigger; each micro-batch holds ``rowsPerBatch`` records,
raised until a micro-batch takes at least the trigger interval, so the engine never
idles, and its rate is the records of the measured micro-batches over their
``triggerExecution`` time (the first micro-batches, JVM warm-up, are left out).

Rates are the median over ``--repeats`` interleaved rounds. On a machine whose cores
are shared with other work, wall-clock rates are noisy: so Bastion's CPU seconds per
million records are printed beside them (`RunMetrics.cpu_s_per_million_records`).
The last line gives the ratios the issue's targets are about: batch path against
Spark's pandas-UDF (target ≥ 1.5×) and SQL (target ≥ 1.0×).

    .venv/bin/python benchmarks/peers.py [--records N] [--repeats K] [--parallelism P]
        [--spark-batches B] [--no-spark] [--only per-record|batch]

``--only per-record`` runs just that form and prints its rate and CPU, for an A/B
against another checkout (run this file from that checkout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402

try:  # Spark's pandas UDFs resolve their type hints in this module's globals
    import pandas as pd
except ImportError:  # --no-spark needs neither
    pd = None

KEYS = 100
CHECKPOINT_INTERVAL_S = 1.0


def identity(i: int) -> int:
    return i


def identity_column(ks: Any) -> Any:
    return ks


def keys_column(column: Any) -> Any:
    return column % KEYS


def per_record(n: int, parallelism: int) -> bn.Topology:
    topo = bn.Topology("peers-per-record")
    src = topo.source("src", bn.sources.Generator(identity, count=n), parallelism=parallelism)
    src.key_by(lambda x: x % KEYS).reduce("count", lambda acc, _: acc + 1, initial=0,
                                          parallelism=parallelism).sink(
        "out", bn.sinks.Discard())
    return topo


def batch(n: int, parallelism: int) -> bn.Topology:
    topo = bn.Topology("peers-batch")
    src = topo.source("src", bn.sources.Generator(batch_fn=identity_column, count=n),
                      parallelism=parallelism)
    src.key_by_batch(keys_column).reduce("count", bn.aggregations.Count(),
                                         parallelism=parallelism).sink(
        "out", bn.sinks.Discard())
    return topo


def bastion_figures(make: Callable[[int, int], bn.Topology], n: int, parallelism: int
                    ) -> tuple[float, float]:
    """(records/s, CPU s per million records) of one run."""
    metrics = bn.run(make(n, parallelism), protocol=bn.protocols.Coordinated(
        interval_s=CHECKPOINT_INTERVAL_S)).metrics
    return metrics.tuples_per_s, metrics.cpu_s_per_million_records


# -- Spark Structured Streaming ---------------------------------------------------------


def pandas_key(values: pd.Series) -> pd.Series:
    """The key of a column of values, as a Spark pandas UDF (a series at a time)."""
    return values % KEYS


class SparkPeer:
    """One local[2] session; `rate` runs a keyed count query and measures it."""

    def __init__(self) -> None:
        from bastion.spark_jobs.session import build_session

        self.spark = build_session("local[2]", app_name="bastion peers benchmark")
        self.spark.conf.set("spark.sql.shuffle.partitions", "2")
        self.spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        self.rows_per_batch = {"sql": 2_000_000, "pandas-udf": 1_000_000,
                               "python-udf": 250_000}

    def _key(self, form: str) -> Any:
        from pyspark.sql import functions as F

        if form == "sql":
            return F.col("value") % KEYS
        if form == "pandas-udf":
            return F.pandas_udf(pandas_key, "long")(F.col("value"))

        @F.udf("long")
        def key_py(value: int) -> int:
            return value % KEYS

        return key_py(F.col("value"))

    def rate(self, form: str, batches: int, warmup: int = 2) -> float:
        """Records per second of ``batches`` micro-batches after ``warmup``, each of
        at least the trigger interval (``rowsPerBatch`` doubled until so)."""
        while True:
            rows = self.rows_per_batch[form]
            durations = self._run(form, rows, batches + warmup)[warmup:]
            if min(durations) >= CHECKPOINT_INTERVAL_S or rows >= 64_000_000:
                return rows * len(durations) / sum(durations)
            # a micro-batch shorter than the trigger: the engine idled; more per batch
            self.rows_per_batch[form] = rows * 2

    def _run(self, form: str, rows: int, batches: int) -> list[float]:
        """The triggerExecution seconds of each micro-batch of one query."""
        from pyspark.sql import functions as F

        stream = (self.spark.readStream.format("rate-micro-batch")
                  .option("rowsPerBatch", rows).option("numPartitions", 2).load())
        counts = stream.groupBy(self._key(form).alias("key")).agg(F.count("*"))
        with tempfile.TemporaryDirectory(prefix="peers-spark-") as checkpoints:
            query = (counts.writeStream.outputMode("update").format("noop")
                     .option("checkpointLocation", checkpoints)
                     .trigger(processingTime=f"{CHECKPOINT_INTERVAL_S} seconds").start())
            try:
                seen: dict[int, float] = {}
                while len(seen) < batches:
                    for progress in query.recentProgress:
                        if progress["numInputRows"] == rows:
                            seen[progress["batchId"]] = (
                                progress["durationMs"]["triggerExecution"] / 1000)
                    if query.exception() is not None:
                        raise RuntimeError(str(query.exception()))
                    time.sleep(0.2)
            finally:
                query.stop()
        return [seen[b] for b in sorted(seen)[:batches]]

    def stop(self) -> None:
        self.spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--spark-batches", type=int, default=4)
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--only", choices=["per-record", "batch"])
    args = parser.parse_args()
    forms = {"per-record": per_record, "batch": batch}
    if args.only:
        forms = {args.only: forms[args.only]}
    spark = None if args.no_spark or args.only else SparkPeer()
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    try:
        for round_ in range(args.repeats):
            for name, make in forms.items():
                rate, cpu = bastion_figures(make, args.records, args.parallelism)
                rates.setdefault(f"bastion {name}", []).append(rate)
                cpus.setdefault(f"bastion {name}", []).append(cpu)
                print(f"round {round_ + 1}: bastion {name}: {rate:,.0f} records/s, "
                      f"{cpu:.3f} CPU s per million", flush=True)
            if spark is not None:
                for form in ("sql", "pandas-udf", "python-udf"):
                    rate = spark.rate(form, args.spark_batches)
                    rates.setdefault(f"spark {form}", []).append(rate)
                    print(f"round {round_ + 1}: spark {form}: {rate:,.0f} records/s "
                          f"({spark.rows_per_batch[form]:,} records a micro-batch)",
                          flush=True)
    finally:
        if spark is not None:
            spark.stop()
    median = {name: statistics.median(values) for name, values in rates.items()}
    print()
    print(f"keyed running count, {KEYS} keys, {CHECKPOINT_INTERVAL_S:g}-s checkpoints, "
          f"median of {args.repeats} (Bastion p={args.parallelism}, {args.records:,} "
          f"records; Spark local[2]); load average {os.getloadavg()[0]:.2f}")
    for name, rate in median.items():
        cpu = f"   {statistics.median(cpus[name]):.3f} CPU s/M" if name in cpus else ""
        print(f"  {name:<22} {rate:>14,.0f} records/s{cpu}")
    if args.only:
        print(f"{args.only}: {median[f'bastion {args.only}']:,.0f} records/s, "
              f"{statistics.median(cpus[f'bastion {args.only}']):.3f} CPU s/M")
        return
    line = [f"batch/per-record {median['bastion batch'] / median['bastion per-record']:.2f}x"]
    if spark is not None:
        b = median["bastion batch"]
        line += [f"batch/spark-pandas-udf {b / median['spark pandas-udf']:.2f}x (target 1.5x)",
                 f"batch/spark-sql {b / median['spark sql']:.2f}x (target 1.0x)",
                 f"per-record/spark-python-udf "
                 f"{median['bastion per-record'] / median['spark python-udf']:.2f}x"]
    print("; ".join(line))


if __name__ == "__main__":
    main()
