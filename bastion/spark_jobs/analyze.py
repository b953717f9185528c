"""``bastion analyze``: run analytics over the event logs that job masters leave in a
store, as a Spark job — Parquet tables out, and an HTML page comparing the jobs.

**What is read.** Every job master writes its events (``started``, ``fault``,
``failure_detected``, ``restarted``, ``recovery``, ``checkpoint_completed``, ...) and
its progress timeline (a ``kind: "progress"`` point several times a second: records
read and written since the previous point, source lag, sink latency p50/p99) to
``jobs/<job>/events/`` as concatenated msgpack maps: numbered chunks
``job-master.<n>`` written while it runs, then a final ``job-master``
(`bastion.runtime.events`). A minute of run is about six hundred points; a store
that served a benchmark of many protocols, or a soak test of hours, holds far more
than one process should decode — which is what Spark is for.

**How it is spread out.** The driver only *lists*: it finds the jobs and the keys of
their event objects. The keys are distributed with ``sc.parallelize``, and each
Spark task opens the store itself (``open_store`` on the store's credential-free URL:
a directory, or S3 through the minio SDK with the credentials of the executor's own
environment) and fetches and decodes its share of the objects in ``mapPartitions``.
Nothing goes through Hadoop's ``s3a://`` — its jars are not installable here, and the
SDK path works the same on a cluster. Credentials never travel in a task, a URL or a
log line. Decoded records become DataFrames, and Spark SQL does the aggregating.

**What comes out** (one Parquet table per directory in ``--out``):

- ``per_second`` — per job and second since its start: records read and written
  (``sink_records_per_s`` is the throughput), sink latency, the largest source lag
  (records due but not yet read). Progress points cover sub-second intervals and
  percentiles of intervals do not combine exactly, so ``latency_p50_ms`` is the median
  of the points' p50 and ``latency_p99_ms`` the largest of their p99 — an upper bound.
- ``checkpoints`` — every ``checkpoint_completed`` event: id, task (uncoordinated
  protocols checkpoint per task), when, ``duration_s``, ``state_bytes``.
- ``failures`` — every failure the job recovered from: the injected fault if there was
  one, detection (fault → job master notices), restart (detection → every task runs
  from the recovery line), recovery (failure → sink rate back to 90% of before) and
  the total recovery time ``trt_s`` (failure → sink rate back and sources caught up
  with the input that arrived meanwhile); the failure is the injected fault, or the
  detection without one. One definition for every command:
  `bastion.runtime.recovery_times`, applied here to the job's collected rows.
- ``jobs`` — one row per job: totals, typical latency, checkpoint and failure figures,
  whether its log was complete and how many objects were skipped. Its
  ``sink_records`` (the summary's "sink received") counts the records the sinks
  *received*, from the progress points: after a restart the sinks receive again
  the records replayed since the recovery line, and a failed attempt's records
  never commit, so a drill that committed 55 records with no duplicate can show
  65 here. Committed records are in the store's outputs, which this job does not
  read; ``bastion run`` and ``bastion drill`` print them.

and ``report.html``: the jobs side by side (throughput, latency, lag over time,
checkpoint durations, recovery times), plots embedded so the page stands alone.

**Damaged input is reported, never loaded.** An object that does not decode to whole
event maps (`bastion.runtime.events.decode_events`) is skipped as a whole — msgpack
carries no checksum, so records before the damage cannot be vouched for either — and
named with the reason in `Analysis.skipped`; a job whose final object is missing
(still running, or its job master died) is analysed from its chunks and listed in
`Analysis.incomplete`. Why this module imports ``bastion.runtime.events``, though the
design lets Spark jobs use only storage and ``runtime.records``: that module *is*
the event log's format (names, order, decoding), imports nothing but storage and
msgpack, and a second copy of the format here would drift from the writer's; and
``bastion.runtime.recovery_times`` — what a recovery time *is*, which imports only
the standard library, and a second copy of it here had drifted (TRT from another
rule, recovery from the detection rather than the fault).
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from bastion.runtime.events import decode_events, event_keys, events_prefix
from bastion.runtime.recovery_times import failures_in, recovery_times
from bastion.storage import CorruptRecordError, ObjectStore, StorageError, open_store
from bastion.storage.errors import BastionError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOBS_PREFIX = "jobs/"
TABLES = ("jobs", "per_second", "checkpoints", "failures")
#: Event kinds the failure table is built from (progress points too, for the TRT).
_FAILURE_KINDS = frozenset({"fault", "failure_detected", "restarted"})
#: Keys per Spark task: few enough to spread a job's objects over the executors,
#: many enough that opening a store client per task does not dominate.
_KEYS_PER_TASK = 8


class AnalyzeError(BastionError):
    """The analysis cannot run: a job that is not in the store, a store without
    jobs, an event object that cannot be read. The message says which and why."""


@dataclass(frozen=True)
class EventLog:
    """One job's event log in the store: its objects in write order, and whether
    the final object (which vouches for the others) is there."""

    job: str
    keys: tuple[str, ...]
    complete: bool


@dataclass(frozen=True)
class Skipped:
    """A stored event object the analysis left out, and why."""

    job: str
    key: str
    reason: str


@dataclass
class Analysis:
    """What `analyze` wrote and found: the tables as rows (also in ``out_dir``),
    the objects it skipped and the jobs whose log had no final object."""

    out_dir: Path
    storage_url: str
    tables: dict[str, list[dict[str, Any]]]
    skipped: list[Skipped] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.html"

    def table_path(self, name: str) -> Path:
        return self.out_dir / f"{name}.parquet"


# -- the driver: which objects ----------------------------------------------------------


def find_event_logs(store: ObjectStore, jobs: Sequence[str] | None = None
                    ) -> list[EventLog]:
    """The event logs of ``jobs`` (default: every job in the store that has one), in
    the order asked (default: by job id). `AnalyzeError` names every asked-for job
    that has no event log, and a store without any."""
    if jobs:
        logs, missing = [], []
        for job in dict.fromkeys(jobs):  # once each, in the order given
            if not job or "/" in job:
                raise AnalyzeError(f"invalid job id {job!r}: a job id is one path "
                                   "component, e.g. wordcount-1a2b3c4d")
            keys, complete = event_keys(store.list(events_prefix(job)), job)
            if keys:
                logs.append(EventLog(job, tuple(keys), complete))
            else:
                missing.append(job)
        if missing:
            known = sorted(log.job for log in find_event_logs(store)) if _has_jobs(store) \
                else []
            shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
            raise AnalyzeError(
                f"no event log for job{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(repr, missing))} in {store.url}: "
                + (f"jobs with events there: {shown}" if known else "it has no job events")
                + "; run without --job to analyse every job")
        return logs
    by_job: dict[str, list[str]] = {}
    for key in store.list(JOBS_PREFIX):
        job, _, rest = key[len(JOBS_PREFIX):].partition("/")
        if rest.startswith("events/"):
            by_job.setdefault(job, []).append(key)
    logs = []
    for job in sorted(by_job):
        keys, complete = event_keys(by_job[job], job)
        if keys:
            logs.append(EventLog(job, tuple(keys), complete))
    if not logs:
        raise AnalyzeError(f"no job events in {store.url}: run a job with "
                           f"--storage {store.url} first")
    return logs


def _has_jobs(store: ObjectStore) -> bool:
    return bool(store.list(JOBS_PREFIX))


# -- the tasks: fetch and decode --------------------------------------------------------


def _read_objects(url: str) -> Callable[[Iterable[tuple[str, int, str]]], Iterator[tuple]]:
    """The ``mapPartitions`` function: for each ``(job, position, key)`` of its share,
    ``("record", job, position, index, record)`` per event, or one ``("skipped", job,
    key, reason)`` for a damaged object, or ``("unreadable", ...)`` when the store
    failed (after its own retries). Only ``url`` is shipped: the store is opened in
    the task, with the credentials of the executor's environment."""

    def read(partition: Iterable[tuple[str, int, str]]) -> Iterator[tuple]:
        store = None
        for job, position, key in partition:
            try:
                store = store or open_store(url)
                data = store.get(key)
            except StorageError as exc:
                yield ("unreadable", job, key, str(exc))
                continue
            try:
                records = decode_events(data, key)
            except CorruptRecordError as exc:
                yield ("skipped", job, key, str(exc))
                continue
            for index, record in enumerate(records):
                yield ("record", job, position, index, record)
        if store is not None:
            store.close()

    return read


# -- pure per-record and per-job functions (run in the tasks) ----------------------------


def _float(value: Any) -> float | None:
    """A number field as a float; None when absent or not a number (a field of an
    older or newer writer is not a reason to drop the record)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


def progress_row(job: str, p: dict[str, Any]) -> tuple:
    return (job, float(p["t_s"]), _int(p.get("source_records")) or 0,
            _int(p.get("sink_records")) or 0, _int(p.get("source_lag")),
            _float(p.get("latency_p50_ms")), _float(p.get("latency_p99_ms")))


def checkpoint_row(job: str, e: dict[str, Any]) -> tuple:
    forced = e.get("forced")
    return (job, _int(e.get("checkpoint_id")), _int(e.get("task")), float(e["t_s"]),
            _float(e.get("duration_s")), _int(e.get("state_bytes")),
            forced if isinstance(forced, bool) else None)


def failures_of(job: str, records: Iterable[tuple[int, int, dict[str, Any]]]
                ) -> list[tuple]:
    """The failure rows of one job from its fault/failure/restart events and its
    progress points, given as ``(position, index, record)`` in any order: which
    events make a failure (`failures_in`) and its figures (`recovery_times`) are
    the job master's and the drill's own definitions, so ``analyze`` reports the
    same detection, restart, recovery and TRT for a run as ``drill`` and ``tune``."""
    ordered = [r for _, _, r in sorted(records, key=lambda x: (x[0], x[1]))]
    timeline = sorted((r for r in ordered if r["kind"] == "progress"),
                      key=lambda p: p["t_s"])
    rows: list[tuple] = []
    for fault, detected, restarted in failures_in(ordered):
        times = recovery_times(timeline, float((fault or detected)["t_s"]),
                               float(detected["t_s"]), float(restarted["t_s"]))
        rows.append((
            job, len(rows) + 1, str(detected.get("reason", "")),
            None if fault is None else str(fault.get("what", "")),
            None if fault is None else float(fault["t_s"]),
            float(detected["t_s"]), times.detection_s, times.restart_s,
            times.recovery_s, times.trt_s,
            None if restarted.get("checkpoint") is None else str(restarted.get("checkpoint"))))
    return rows


# -- schemas -----------------------------------------------------------------------------


def _schemas() -> dict[str, Any]:
    from pyspark.sql.types import (BooleanType, DoubleType, LongType, StringType,
                                   StructField, StructType)

    def struct(*fields: tuple[str, Any]) -> StructType:
        return StructType([StructField(name, kind(), True) for name, kind in fields])

    return {
        "progress": struct(("job", StringType), ("t_s", DoubleType),
                           ("source_records", LongType), ("sink_records", LongType),
                           ("source_lag", LongType), ("latency_p50_ms", DoubleType),
                           ("latency_p99_ms", DoubleType)),
        "checkpoints": struct(("job", StringType), ("checkpoint_id", LongType),
                              ("task", LongType), ("at_s", DoubleType),
                              ("duration_s", DoubleType), ("state_bytes", LongType),
                              ("forced", BooleanType)),
        "failures": struct(("job", StringType), ("failure", LongType),
                           ("reason", StringType), ("fault", StringType),
                           ("fault_at_s", DoubleType), ("detected_at_s", DoubleType),
                           ("detection_s", DoubleType), ("restart_s", DoubleType),
                           ("recovery_s", DoubleType), ("trt_s", DoubleType),
                           ("recovery_line", StringType)),
        "meta": struct(("job", StringType), ("started_at", DoubleType),
                       ("last_t_s", DoubleType), ("complete", BooleanType),
                       ("objects", LongType), ("skipped_objects", LongType)),
    }


# -- the Spark job -----------------------------------------------------------------------


def analyze(spark: "SparkSession", store: ObjectStore, logs: Sequence[EventLog],
            out_dir: str | Path) -> Analysis:
    """Read the event logs ``logs`` of ``store`` in Spark tasks, write the tables
    and ``report.html`` to ``out_dir`` (created; tables there are replaced) and return
    them. `AnalyzeError` if an object cannot be read from the store."""
    from pyspark.sql import functions as F

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sc = spark.sparkContext
    schemas = _schemas()
    url = store.url  # never holds credentials: the tasks take theirs from the environment
    keys = [(log.job, position, key) for log in logs
            for position, key in enumerate(log.keys)]
    slices = max(1, min(len(keys) // _KEYS_PER_TASK + 1, sc.defaultParallelism * 4))
    parsed = sc.parallelize(keys, slices).mapPartitions(_read_objects(url)).cache()
    try:
        problems = parsed.filter(lambda x: x[0] != "record").collect()
        unreadable = [p for p in problems if p[0] == "unreadable"]
        if unreadable:
            _, job, key, reason = unreadable[0]
            raise AnalyzeError(f"cannot read {key} of job {job} from {url}: {reason}"
                               + (f" (and {len(unreadable) - 1} more objects)"
                                  if len(unreadable) > 1 else ""))
        skipped = [Skipped(job, key, reason) for _, job, key, reason in problems]
        records = parsed.filter(lambda x: x[0] == "record").map(lambda x: x[1:])

        progress = spark.createDataFrame(
            records.filter(lambda x: x[3]["kind"] == "progress")
                   .map(lambda x: progress_row(x[0], x[3])), schemas["progress"])
        checkpoints = spark.createDataFrame(
            records.filter(lambda x: x[3]["kind"] == "checkpoint_completed")
                   .map(lambda x: checkpoint_row(x[0], x[3])), schemas["checkpoints"])
        failures = spark.createDataFrame(
            records.filter(lambda x: x[3]["kind"] in _FAILURE_KINDS
                           or x[3]["kind"] == "progress")
                   .map(lambda x: (x[0], (x[1], x[2], x[3])))
                   .groupByKey()
                   .flatMap(lambda kv: failures_of(kv[0], kv[1])), schemas["failures"])
        skipped_per_job = {s.job: 0 for s in skipped}
        for s in skipped:
            skipped_per_job[s.job] += 1
        spans = dict(records.map(lambda x: (x[0], (_started_at(x[3]), float(x[3]["t_s"]))))
                     .reduceByKey(lambda a, b: (a[0] if a[0] is not None else b[0],
                                                max(a[1], b[1])))
                     .collect())
        meta = spark.createDataFrame(
            [(log.job, *spans.get(log.job, (None, None)), log.complete, len(log.keys),
              skipped_per_job.get(log.job, 0)) for log in logs], schemas["meta"])

        per_second = (progress.withColumn("second", F.floor("t_s").cast("long"))
                      .groupBy("job", "second")
                      .agg(F.sum("source_records").alias("source_records_per_s"),
                           F.sum("sink_records").alias("sink_records_per_s"),
                           F.percentile_approx("latency_p50_ms", 0.5).alias("latency_p50_ms"),
                           F.max("latency_p99_ms").alias("latency_p99_ms"),
                           F.max("source_lag").alias("source_lag_max"),
                           F.count(F.lit(1)).alias("progress_points"))
                      .orderBy("job", "second"))
        totals = progress.groupBy("job").agg(
            F.sum("source_records").alias("source_records"),
            F.sum("sink_records").alias("sink_records"),
            F.percentile_approx("latency_p50_ms", 0.5).alias("latency_p50_ms"),
            F.percentile_approx("latency_p99_ms", 0.5).alias("latency_p99_ms"),
            F.max("latency_p99_ms").alias("latency_p99_ms_max"),
            F.max("source_lag").alias("source_lag_max"))
        checkpoint_totals = checkpoints.groupBy("job").agg(
            F.count(F.lit(1)).alias("checkpoints"),
            F.avg("duration_s").alias("checkpoint_duration_s_mean"),
            F.max("duration_s").alias("checkpoint_duration_s_max"),
            F.avg("state_bytes").alias("checkpoint_bytes_mean"))
        failure_totals = failures.groupBy("job").agg(
            F.count(F.lit(1)).alias("failures"), F.avg("trt_s").alias("trt_s_mean"),
            F.max("trt_s").alias("trt_s_max"))
        jobs = (meta.withColumnRenamed("last_t_s", "duration_s")
                .join(totals, "job", "left").join(checkpoint_totals, "job", "left")
                .join(failure_totals, "job", "left")
                .fillna(0, ["source_records", "sink_records", "checkpoints", "failures"])
                .withColumn("throughput_rps", F.when(
                    F.col("duration_s") > 0, F.col("sink_records") / F.col("duration_s")))
                .orderBy("job"))
        frames = {"jobs": jobs, "per_second": per_second,
                  "checkpoints": checkpoints.orderBy("job", "at_s"),
                  "failures": failures.orderBy("job", "failure")}
        tables: dict[str, list[dict[str, Any]]] = {}
        for name in TABLES:
            frame = frames[name].cache()
            # One file per table: these tables are small, and many part files of a
            # few rows each only slow every reader down.
            frame.coalesce(1).write.mode("overwrite").parquet(str(out / f"{name}.parquet"))
            tables[name] = [row.asDict() for row in frame.collect()]
            frame.unpersist()
    finally:
        parsed.unpersist()
    analysis = Analysis(out, url, tables, skipped,
                        [log.job for log in logs if not log.complete])
    analysis.report_path.write_text(render_html(analysis))
    return analysis


def _started_at(record: dict[str, Any]) -> float | None:
    """The job's start (seconds since the epoch) from its ``started`` event."""
    if record["kind"] == "started" and _float(record.get("t")) is not None:
        return float(record["t"]) - float(record["t_s"])
    return None


# -- what a person reads: the summary table and the HTML page ---------------------------


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


#: "sink received": records the sinks received, replays included (the module says
#: why that is not the committed count); docs/metrics.md defines every column.
SUMMARY_HEADER = ("job", "duration", "sink received", "received/s", "p50", "p99",
                  "checkpoints", "ckpt mean", "failures", "TRT mean")


def summary_rows(analysis: Analysis) -> list[tuple[str, ...]]:
    """One line per job for the terminal (`SUMMARY_HEADER`)."""
    rows: list[tuple[str, ...]] = []
    for j in analysis.tables["jobs"]:
        rate = j.get("throughput_rps")
        mean_ckpt = j.get("checkpoint_duration_s_mean")
        rows.append((j["job"], _secs(j.get("duration_s")), f"{j['sink_records']:,}",
                     "-" if rate is None else f"{rate:,.0f}", _ms(j.get("latency_p50_ms")),
                     _ms(j.get("latency_p99_ms")), f"{j['checkpoints']:,}",
                     "-" if mean_ckpt is None else f"{mean_ckpt * 1000:.1f} ms",
                     f"{j['failures']:,}", _secs(j.get("trt_s_mean"))))
    return rows


def _figure_png(draw: Callable[[Any], object], ylabel: str, xlabel: str,
                size: tuple[float, float] = (8, 3)) -> str:
    """An ``<img>`` of what ``draw(ax)`` plots, as an embedded PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to bytes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(ylabel)}">'


def _series(rows: list[dict[str, Any]], column: str) -> dict[str, tuple[list, list]]:
    """Per job, the seconds and values of one per-second column. A second without a
    value — no progress point (the job master was busy recovering) or no latency
    measured — is NaN, which matplotlib draws as a gap: a line across it would claim
    a rate nobody measured."""
    values: dict[str, dict[int, float]] = {}
    for row in rows:
        if row[column] is not None:
            values.setdefault(row["job"], {})[row["second"]] = row[column]
    series: dict[str, tuple[list, list]] = {}
    for job, by_second in values.items():
        xs = list(range(min(by_second), max(by_second) + 1))
        series[job] = (xs, [by_second.get(x, math.nan) for x in xs])
    return series


def _lines(series: dict[str, tuple[list, list]], failures: list[dict[str, Any]]
           ) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        colours = {}
        for job, (xs, ys) in series.items():
            (line,) = ax.plot(xs, ys, linewidth=1.2, label=job, drawstyle="steps-post",
                              marker=".", markersize=4)  # a lone second shows too
            colours[job] = line.get_color()
        for f in failures:  # where each job failed, in its colour
            ax.axvline(f["fault_at_s"] if f["fault_at_s"] is not None
                       else f["detected_at_s"], color=colours.get(f["job"], "red"),
                       linestyle="--", linewidth=1)
    return draw


def _table_html(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    def cells(row: Sequence[Any], tag: str) -> str:
        return "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in row)

    body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows)
    return f"<table><tr>{cells(header, 'th')}</tr>{body}</table>"


def render_html(analysis: Analysis) -> str:
    """The analysis as one self-contained HTML page comparing the jobs."""
    t = analysis.tables
    jobs = [j["job"] for j in t["jobs"]]
    failures = t["failures"]
    plots = []
    for column, label in (("sink_records_per_s", "sink records / s"),
                          ("latency_p99_ms", "latency p99 (ms)"),
                          ("source_lag_max", "source lag (records)")):
        series = _series(t["per_second"], column)
        if series:
            plots.append(_figure_png(_lines(series, failures), label,
                                     "seconds since the job started"))
    durations = {job: [c["duration_s"] * 1000 for c in t["checkpoints"]
                       if c["job"] == job and c["duration_s"] is not None] for job in jobs}
    with_checkpoints = [job for job in jobs if durations[job]]
    if with_checkpoints:
        plots.append(_figure_png(
            lambda ax: (ax.boxplot([durations[j] for j in with_checkpoints]),
                        ax.set_xticks(range(1, len(with_checkpoints) + 1),
                                      with_checkpoints, rotation=15, fontsize="small")),
            "checkpoint duration (ms)", "job", size=(8, 3.5)))
    if failures:
        phases = ("detection_s", "restart_s", "recovery_s", "trt_s")

        def bars(ax: Any) -> None:
            width = 0.8 / len(phases)
            names = [f"{f['job']} #{f['failure']}" for f in failures]
            for i, phase in enumerate(phases):
                ax.bar([k + i * width for k in range(len(failures))],
                       [f[phase] or 0.0 for f in failures], width, label=phase)
            ax.set_xticks([k + 0.4 - width / 2 for k in range(len(failures))], names,
                          rotation=15, fontsize="small")

        plots.append(_figure_png(bars, "seconds", "failure", size=(8, 3.5)))
    problems = ""
    if analysis.skipped or analysis.incomplete:
        items = [f"<li>skipped {html.escape(s.key)}: {html.escape(s.reason)}</li>"
                 for s in analysis.skipped]
        items += [f"<li>{html.escape(job)}: no final event object (still running, or its "
                  "job master died): analysed from its chunks</li>"
                  for job in analysis.incomplete]
        problems = f"<h2>Problems</h2><ul>{''.join(items)}</ul>"
    failure_rows = [(f["job"], f["failure"], f["reason"], f["fault"] or "-",
                     _secs(f["detection_s"]), _secs(f["restart_s"]), _secs(f["recovery_s"]),
                     _secs(f["trt_s"]), f["recovery_line"] or "-") for f in failures]
    created = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Bastion run analysis</title>
<style>
body{{font-family:sans-serif;margin:2em;max-width:72em}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}
th,td{{text-align:left;padding:.2em 1em .2em 0;vertical-align:top}}
tr+tr td{{border-top:1px solid #ddd}}
</style></head><body>
<h1>Bastion run analysis</h1>
<p>{len(jobs)} job{'s' if len(jobs) != 1 else ''} from {html.escape(analysis.storage_url)},
{created}. Tables: {', '.join(f'{n}.parquet' for n in TABLES)}. Dashed lines mark
failures (the fault, or the detection where none was injected).</p>
<h2>Jobs</h2>{_table_html(summary_rows(analysis), SUMMARY_HEADER)}
{problems}
<h2>Over time</h2>{''.join(plots) or '<p>no progress points</p>'}
<h2>Failures</h2>{_table_html(failure_rows, ("job", "#", "reason", "fault", "detection",
                                             "restart", "recovery", "TRT", "recovery line"))
                  if failures else "<p>none</p>"}
</body></html>
"""
