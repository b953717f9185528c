"""Peers on the results page: Bastion against the engines a user would pick instead.

No paper here: the reference column is another engine, run on the same jobs, on the
same machine, in the same script run (issue 40, item 3). Two experiments:

- ``spark`` (``benchmarks/peers.py``): Spark Structured Streaming 4.x in local mode
  (``local[2]``, one SparkSession for the run; the recovery runs start processes of
  their own, since the query's process is what gets killed). A keyed running count
  (``i % 100``) with the key as a SQL expression, a pandas UDF and a plain Python UDF,
  and a sum per key over tumbling 1-s event-time windows; their rates; end-to-end
  latency at half of each engine's own maximum rate, from each record's arrival (its
  due time on a paced source) to its output at the sink; and recovery after a SIGKILL
  of the query's process and a restart from its checkpoint. Bastion runs the same
  jobs with coordinated 1-s checkpoints, and its recovery kills a worker process.
- ``bytewax`` (``benchmarks/throughput.py --peers``): Bytewax 0.21, W0 (two maps) and
  W1 (a keyed running count) at parallelism 1, without and with fault tolerance
  (Bastion coordinated 1-s checkpoints, Bytewax 1-s epochs snapshotted into its
  SQLite recovery store), and recovery after a SIGKILL of Bytewax's process and a
  restart on its recovery store.

Each row states the guarantee of each side. Both engines' rates are medians of the
repeats in one run; absolute rates depend on this machine, the ratio of two engines
in the same run is the figure judged. The issue's targets are shown with
`judge_target` and never softened: Bastion ahead of Spark on Python-function
throughput at equal guarantees, and ≥ 100× lower end-to-end latency at half its
maximum rate.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bastion.bench import results as page
from bastion.bench.results import Experiment, Figures, Row, Section

# -- targets (issues, not papers) --------------------------------------------------------

# Issue 40, "Targets": "The peer table shows Bastion ahead of Spark Structured Streaming
# on Python-function throughput at equal guarantees".
PYTHON_THROUGHPUT_TARGET = 1.0
# Issue 40, "Targets": "... and ≥ 100× lower end-to-end latency at half its maximum rate".
LATENCY_TARGET = 100.0
# Issue 41, "Targets": "Keyed count with 1-s checkpoints, batch path: ≥ 1.5× Spark's
# pandas-UDF rate and ≥ 1.0× Spark's SQL-native rate, in the same run."
BATCH_VS_PANDAS_TARGET = 1.5
BATCH_VS_SQL_TARGET = 1.0

# -- noise bands ------------------------------------------------------------------------

# Rates are medians of three rounds, the engines alternating. On this shared 2-core VM
# (load 11-16 from other work during our runs) single rounds moved by up to 1.7x on
# either side (Bastion W0 2.8-4.8 M/s, Bytewax W1 0.5-1.05 M/s); the medians' ratio
# moved less: W0 0.55x and 0.71x, W1 2.5x and 3.6x in two runs. ±30% for Bytewax.
RATE_WITHIN = 0.30
# Spark's micro-batch rates are the noisier side: its rounds moved by 1.8x (window sum
# 2.95 and 1.67 M/s; the SQL key up to 8x while its batch size was still being raised),
# and the window-sum ratio came out 0.98x and 1.37x in two short runs: ±50%.
SPARK_RATE_WITHIN = 0.50
# Recovery times: one kill per run, the start-up of a JVM or a Python process under
# whatever else the machine does (Spark's came out 105 s at load 16). The measured
# ratios lie far outside this band (0.002x-0.2x), which it only keeps from flipping
# on a near tie.
RECOVERY_WITHIN = 0.50

# -- guarantees, stated per row ---------------------------------------------------------

SPARK_GUARANTEE = ("exactly-once state (offsets and state store checkpointed each "
                   "micro-batch), at-least-once output")
BASTION_GUARANTEE = ("exactly-once state (coordinated 1-s checkpoints), at-least-once "
                     "output (a non-committing sink)")
BYTEWAX_GUARANTEE = ("exactly-once state (1-s epochs snapshotted to its recovery store), "
                     "at-least-once output")
NO_GUARANTEE = "none: state lost on a crash"


def _rate(value: float) -> str:
    return f"{value / 1e6:.2f} M records/s"


def _num(figures: Any, *keys: str) -> float:
    """A number of the figures, NaN when missing (the verdict then says not measured)."""
    value: Any = figures
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return math.nan
        value = value[key]
    if value is None:
        return math.nan
    return float(value)


def _ratio(measured: float, reference: float) -> float | None:
    if not (math.isfinite(measured) and math.isfinite(reference)) or reference == 0:
        return None
    return measured / reference


def _target(ratio: float | None, target: float, what: str) -> page.Judgement:
    if ratio is None:
        return page.not_measured(f"{what}: a figure is missing or zero")
    return page.judge_target(ratio, target, higher_is_better=True, what=what)


def _seconds(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value:.2f} s"


# -- Spark Structured Streaming ---------------------------------------------------------


def spark_rows(figures: Figures) -> list[Row]:
    median = figures.get("median", {})
    p = int(_num(figures, "parallelism")) if math.isfinite(_num(figures, "parallelism")) else 2
    ckpt = "1-s trigger, a checkpoint each micro-batch"
    rows = []
    batch_path = "key_by_batch (numpy), int64 columns end to end, Count folded in words"
    for anchor, spark_key, spark_what, bastion_key, bastion_what, target, source in [
        ("peers-spark-python-udf", "spark_python_udf", "key as a plain Python UDF",
         "bastion_per_record", "key and fold as Python lambdas (a call per record)",
         PYTHON_THROUGHPUT_TARGET, "issue 40: ahead on Python functions"),
        ("peers-spark-pandas-udf", "spark_pandas_udf", "key as a pandas UDF",
         "bastion_batch", batch_path,
         BATCH_VS_PANDAS_TARGET, "issue 41: batch path vs pandas UDF"),
        ("peers-spark-sql", "spark_sql", "key as a SQL expression",
         "bastion_batch", batch_path,
         BATCH_VS_SQL_TARGET, "issue 41: batch path vs SQL"),
    ]:
        theirs, ours = _num(median, spark_key), _num(median, bastion_key)
        ratio = _ratio(ours, theirs)
        rows.append(Row(
            anchor=anchor, ref="Spark SS", experiment=f"keyed running count, {spark_what}",
            reference_setting=f"local[2], rate-micro-batch source, {ckpt}, noop sink; "
                              f"{SPARK_GUARANTEE}",
            reference_figure=_rate(theirs) if math.isfinite(theirs) else "–",
            bastion_setting=f"p={p}, {bastion_what}, discard sink; {BASTION_GUARANTEE}",
            bastion_figure=_rate(ours) if math.isfinite(ours) else "–",
            ratio=ratio,
            judgement=_target(ratio, target, f"Bastion/Spark ({source})")))

    theirs, ours = _num(median, "spark_window"), _num(median, "bastion_window_sum")
    ratio = _ratio(ours, theirs)
    rows.append(Row(
        anchor="peers-spark-window-sum", ref="Spark SS",
        experiment="sum per key over tumbling 1-s event-time windows",
        reference_setting=f"local[2], key as SQL, window() with a 0-s watermark, append "
                          f"mode, each micro-batch one window, {ckpt}; {SPARK_GUARANTEE}",
        reference_figure=_rate(theirs) if math.isfinite(theirs) else "–",
        bastion_setting=f"p={p}, key and event time as Python lambdas, Tumbling(1 s) "
                        f"with Sum folded in C, {_num(figures, 'window_records'):,.0f} "
                        f"records a window; {BASTION_GUARANTEE}",
        bastion_figure=_rate(ours) if math.isfinite(ours) else "–",
        ratio=ratio,
        judgement=(page.judge(theirs, ours, higher_is_better=True, within=SPARK_RATE_WITHIN)
                   if ratio is not None else page.not_measured("a rate is missing"))))

    spark = figures.get("spark_latency", {})
    for p_ours in sorted({p, 1}, reverse=True):
        ours_lat = figures.get(f"bastion_latency_p{p_ours}", {})
        setting = ("the keyed exchange between two workers" if p_ours > 1 else
                   "one worker, the whole job chained into it (its lowest-latency setting)")
        for pct in ("p50", "p99"):
            theirs, ours = _num(spark, f"{pct}_ms"), _num(ours_lat, f"{pct}_ms")
            unfinished = _num(spark, "unfinished_records")
            lower = _ratio(theirs, ours)  # how many times lower Bastion's latency is
            rows.append(Row(
                anchor=f"peers-spark-latency-{pct}-p{p_ours}", ref="Spark SS",
                experiment=f"end-to-end latency {pct} at half the maximum rate "
                           "(keyed count, Python key)",
                reference_setting=f"Python UDF key, {_num(spark, 'rate'):,.0f} records/s "
                                  f"(half the {_num(spark, 'max_rate'):,.0f} it reaches "
                                  "on this source and aggregation), paced source, "
                                  "micro-batches back to "
                                  "back (its lowest-latency trigger), output collected by "
                                  f"foreachBatch; {SPARK_GUARANTEE}",
                reference_figure=(f"{theirs:,.0f} ms" + (
                    f" (a lower bound: {unfinished:,.0f} records not output when the run "
                    "stopped)" if unfinished > 0 else "") if math.isfinite(theirs) else "–"),
                bastion_setting=f"p={p_ours}, {setting}, "
                                f"{_num(ours_lat, 'rate'):,.0f} records/s (half "
                                + (f"the {_num(ours_lat, 'max_rate'):,.0f} it reaches on this "
                                   "paced source" if "max_rate" in ours_lat else "its max")
                                + "), "
                                + (f"frames out of their buffer within "
                                   f"{ours_lat['buffer_timeout_ms']:g} ms (its lowest-latency "
                                   "setting), " if "buffer_timeout_ms" in ours_lat else "")
                                + "latency at the sink"
                                + (f" after its first {ours_lat['warmup_s']:g} s (as "
                                   "Spark's)" if "warmup_s" in ours_lat else "")
                                + (f", median of {ours_lat['runs']} runs"
                                   if ours_lat.get("runs", 1) > 1 else "")
                                + f"; {BASTION_GUARANTEE}",
                bastion_figure=(f"{ours:.2f} ms" + (f" ({lower:,.0f}× lower)" if lower else "")
                                if math.isfinite(ours) else "–"),
                ratio=None if lower is None else 1.0 / lower,
                judgement=_target(lower, LATENCY_TARGET,
                                  f"Spark/Bastion {pct} (issue 40: ≥ 100× lower)")))

    theirs_rec, ours_rec = figures.get("spark_recovery", {}), figures.get("bastion_recovery", {})
    rows.append(_recovery_row(
        "peers-spark-recovery", "Spark SS", theirs_rec, ours_rec,
        reference_setting=(f"the query's process (Python driver and JVM) SIGKILLed, "
                           f"restarted at once from its checkpoint, "
                           f"{_num(figures, 'recovery_rate'):,.0f} records/s, Python UDF "
                           f"key; {SPARK_GUARANTEE}"),
        bastion_setting=(f"p={p}, the worker process hosting count[0] killed "
                         f"(ray.kill), detected and restarted from the last checkpoint "
                         f"by the job master, same rate; {BASTION_GUARANTEE}")))
    return rows


def _recovery_row(anchor: str, ref: str, theirs: Any, ours: Any, *,
                  reference_setting: str, bastion_setting: str) -> Row:
    """Kill → caught up (output again and the backlog worked off), both sides."""
    theirs_s, ours_s = _num(theirs, "caught_up_s"), _num(ours, "caught_up_s")
    exact = theirs.get("state_exact") if isinstance(theirs, dict) else None
    ratio = _ratio(ours_s, theirs_s)
    if ratio is None:
        judgement = page.not_measured("a recovery did not catch up, or did not run")
    elif exact is False:
        judgement = page.not_comparable(f"{ref}'s counts after the restart did not sum to "
                                        "the records it read: not exactly-once state")
    else:
        judgement = page.judge(theirs_s, ours_s, higher_is_better=False,
                               within=RECOVERY_WITHIN)
    return Row(
        anchor=anchor, ref=ref, experiment="recovery: kill → caught up",
        reference_setting=reference_setting,
        reference_figure=(f"{_seconds(theirs_s)} (first output "
                          f"{_seconds(_num(theirs, 'first_output_s'))}; state exact: "
                          f"{'yes' if exact else 'no' if exact is False else '–'})"),
        bastion_setting=bastion_setting,
        bastion_figure=(f"{_seconds(ours_s)} (running again "
                        f"{_seconds(_num(ours, 'running_again_s'))})"
                        + (f"; {1 / ratio:,.0f}× sooner" if ratio else "")),
        ratio=ratio, judgement=judgement)


def spark_plot(figures: Figures, out_dir: Path) -> list[Path]:
    """End-to-end latency at half the maximum rate, p50 and p99, Spark against Bastion at
    p=2 and p=1, on a log scale (they differ by orders of magnitude)."""
    import matplotlib.pyplot as plt

    series = [("Spark (Python UDF)", figures.get("spark_latency", {})),
              ("Bastion p=2", figures.get("bastion_latency_p2", {})),
              ("Bastion p=1", figures.get("bastion_latency_p1", {}))]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    width = 0.38
    for offset, pct in ((-width / 2, "p50"), (width / 2, "p99")):
        values = [_num(lat, f"{pct}_ms") for _, lat in series]
        ax.bar([i + offset for i in range(len(series))],
               [v if math.isfinite(v) and v > 0 else 0 for v in values], width, label=pct)
    ax.set_xticks(range(len(series)), [name for name, _ in series])
    ax.set_yscale("log")
    ax.set_ylabel("arrival → sink (ms)")
    ax.set_title("Keyed count at half each engine's maximum rate")
    ax.legend()
    fig.tight_layout()
    path = out_dir / "peers-spark-latency.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- Bytewax ----------------------------------------------------------------------------


def bytewax_rows(figures: Figures) -> list[Row]:
    rows = []
    for anchor, key, what, guarantee_theirs, guarantee_ours in [
        ("peers-bytewax-w0", "w0", "W0: source → map → map → sink", NO_GUARANTEE,
         "none (protocol none: at-most-once)"),
        ("peers-bytewax-w1", "w1", "W1: keyed running count (i % 100)", NO_GUARANTEE,
         "none (protocol none: at-most-once)"),
        ("peers-bytewax-w1-recoverable", "w1_recoverable",
         "W1 with fault tolerance, 1-s interval", BYTEWAX_GUARANTEE, BASTION_GUARANTEE),
    ]:
        theirs, ours = _num(figures, key, "bytewax"), _num(figures, key, "bastion")
        ratio = _ratio(ours, theirs)
        recoverable = key == "w1_recoverable"
        rows.append(Row(
            anchor=anchor, ref="Bytewax", experiment=what,
            reference_setting=("one worker, run_main, "
                               + ("a snapshotting partitioned source, 1-s epochs, "
                                  "SQLite recovery store; " if recoverable else
                                  "no recovery store; ")
                               + guarantee_theirs),
            reference_figure=_rate(theirs) if math.isfinite(theirs) else "–",
            bastion_setting=("p=1, Python lambdas, "
                             + ("coordinated 1-s checkpoints; " if recoverable else "")
                             + guarantee_ours),
            bastion_figure=_rate(ours) if math.isfinite(ours) else "–",
            ratio=ratio,
            judgement=(page.judge(theirs, ours, higher_is_better=True, within=RATE_WITHIN)
                       if ratio is not None else page.not_measured("a rate is missing"))))
    rows.append(_recovery_row(
        "peers-bytewax-recovery", "Bytewax", figures.get("bytewax_recovery", {}),
        figures.get("bastion_recovery", {}),
        reference_setting=(f"W1 with recovery (as above) at "
                           f"{_num(figures, 'recovery_rate'):,.0f} records/s, its process "
                           f"SIGKILLed and restarted at once on its recovery store; "
                           f"{BYTEWAX_GUARANTEE}"),
        bastion_setting=("W1 p=1 at the same rate, its worker process killed (ray.kill), "
                         f"restarted from the last checkpoint; {BASTION_GUARANTEE}")))
    return rows


SECTION = Section(
    key="peers",
    title="Peers: Bastion against Spark Structured Streaming and Bytewax",
    source=("no paper: the engines a user would pick instead (issue 40, item 3; the keyed "
            "count of issue 41), each measured in the same run on this machine"),
    intro=(
        "The reference column is another engine, run on the same job in the same script "
        "run on this 2-core machine: Spark Structured Streaming in local[2] (one "
        "SparkSession; the recovery runs kill and restart a process of its own) and "
        "Bytewax with one worker. Bastion runs with the same checkpoint interval (1 s) "
        "and the guarantee each row states for both sides. Latency counts from a "
        "record's arrival (its due time on a paced source, the same schedule on both "
        "engines) to its output at the sink; recovery, from the kill to the restarted "
        "job's output having caught up with the arrivals."),
    reference="peer",
    experiments=[
        Experiment(
            key="spark", title="Spark Structured Streaming (local[2])",
            script="peers.py",
            args=["--records", "10000000", "--repeats", "3", "--spark-batches", "3",
                  "--latency-s", "8"],
            # quick: no recovery runs (a JVM to start, 25 s for Spark to catch up:
            # a third of the quick pass's 160 s here)
            quick_args=["--records", "2000000", "--repeats", "1", "--spark-batches", "1",
                        "--spark-warmup", "1", "--latency-s", "3", "--latency-repeats", "1",
                        "--no-recovery"],
            # 318-342 s on this 2-core machine at load ~3: three rounds of eight rates,
            # the latency runs, two JVM starts for the recovery; three latency runs a
            # parallelism add ~45 s
            rows=spark_rows, budget_s=400, plot=spark_plot),
        Experiment(
            key="bytewax", title="Bytewax (one worker)",
            script="throughput.py",
            args=["--peers", "--records", "2000000", "--repeats", "3"],
            quick_args=["--peers", "--records", "500000", "--repeats", "1"],
            rows=bytewax_rows, budget_s=60),   # 38 s at load ~3, 89 s at load 12
    ],
)
