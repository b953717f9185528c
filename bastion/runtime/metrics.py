"""Run metrics: end-to-end latency and throughput, cheap enough for the hot path,
and what fault tolerance cost and bought (CheckMate §V).

End-to-end latency of a record is the wall-clock time from its source emitting it
(``born``) to a sink receiving it. Sinks sample it — at most `SAMPLES_PER_BATCH`
records per batch, evenly spread, each counted for the records it stands for — into a
`LatencyHistogram`: log-spaced buckets 2% wide, so percentiles are within 2% and
histograms of many instances merge by adding bucket counts. The counts are records,
not samples: the backlog an outage releases arrives in a few large batches, and had
each batch weighed as much as a paced one's few records, the records it delayed would
have vanished from the percentiles and the missed deadlines. Sinks also count records
per wall-clock second (a throughput timeline).

The protocol's metrics (`ProtocolMetrics`) follow CheckMate's definitions:

- *checkpoint duration*: coordinated — from the trigger until every task stored its
  part; independent (uncoordinated, cic) — one task's flush, snapshot and upload;
- *invalid checkpoints*: checkpoints no consistent recovery line can contain, or that
  a recovery rolled back past; count and share of all checkpoints;
- *message overhead*: bytes of protocol information (barriers and piggybacked clocks
  inside data frames, acknowledgments to the coordinator) over bytes of data frames;
- per failure (`FailureRecovery`): *restart time* — from detection until every task
  runs again from the recovery line, states and replay loaded; *recovery time* —
  from detection until the sinks' output rate is back to 90% of its rate before the
  failure (it includes the restart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from bastion.protocols.base import ProtocolStats

SAMPLES_PER_BATCH = 4
_BUCKET_RATIO = 1.02
_LOG_RATIO = math.log(_BUCKET_RATIO)
_MIN_LATENCY_S = 1e-6


class LatencyHistogram:
    """Log-bucketed histogram of latencies in seconds."""

    def __init__(self, buckets: dict[int, int] | None = None):
        self.buckets: dict[int, int] = dict(buckets or {})
        self.count = sum(self.buckets.values())

    def add(self, latency_s: float, records: int = 1) -> None:
        """Count ``records`` records of latency ``latency_s``."""
        b = int(math.log(max(latency_s, _MIN_LATENCY_S) / _MIN_LATENCY_S) / _LOG_RATIO)
        self.buckets[b] = self.buckets.get(b, 0) + records
        self.count += records

    def add_many(self, latencies_s: Any) -> None:
        """Add a sequence of latencies at once (vectorised: protocol ``acks`` reports
        every root it completes, 10^5 a second)."""
        latencies = np.maximum(np.asarray(latencies_s, dtype=np.float64), _MIN_LATENCY_S)
        if not len(latencies):
            return
        buckets = (np.log(latencies / _MIN_LATENCY_S) / _LOG_RATIO).astype(np.int64)
        found, counts = np.unique(buckets, return_counts=True)
        histogram = self.buckets
        for b, c in zip(found.tolist(), counts.tolist()):
            histogram[b] = histogram.get(b, 0) + c
        self.count += len(latencies)

    def add_batch(self, born: Sequence[float], now_s: float) -> None:
        """The records of a batch that arrived at ``now_s``: every ``step``-th record's
        latency sampled, each sample counted for the ``step`` records from it on (the
        last for what is left), so the counts add up to the batch's records."""
        n = len(born)
        step = max(1, n // SAMPLES_PER_BATCH)
        for i in range(0, n, step):
            self.add(now_s - born[i], min(step, n - i))

    def minus(self, earlier: dict[int, int]) -> "LatencyHistogram":
        """What was added since the bucket counts ``earlier`` were copied."""
        return LatencyHistogram({b: c - earlier.get(b, 0) for b, c in self.buckets.items()
                                 if c != earlier.get(b, 0)})

    def merge(self, other: "LatencyHistogram") -> None:
        for b, c in other.buckets.items():
            self.buckets[b] = self.buckets.get(b, 0) + c
        self.count += other.count

    def mean_std(self) -> tuple[float, float] | None:
        """Mean and standard deviation in seconds (each sample at its bucket's middle),
        None when empty."""
        if not self.count:
            return None
        mids = {b: _MIN_LATENCY_S * _BUCKET_RATIO ** (b + 0.5) for b in self.buckets}
        mean = sum(mids[b] * c for b, c in self.buckets.items()) / self.count
        variance = sum(c * (mids[b] - mean) ** 2 for b, c in self.buckets.items()) / self.count
        return mean, math.sqrt(variance)

    def share_above(self, latency_s: float) -> float:
        """The share of records above ``latency_s`` (a bucket counts as above when its
        middle is): 0.0 when empty."""
        if not self.count:
            return 0.0
        above = sum(c for b, c in self.buckets.items()
                    if _MIN_LATENCY_S * _BUCKET_RATIO ** (b + 0.5) > latency_s)
        return above / self.count

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0–100) in seconds, None when empty."""
        if not self.count:
            return None
        rank = q / 100.0 * self.count
        seen = 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= rank:
                # the bucket's geometric middle
                return _MIN_LATENCY_S * _BUCKET_RATIO ** (b + 0.5)
        return _MIN_LATENCY_S * _BUCKET_RATIO ** (max(self.buckets) + 0.5)


@dataclass
class OperatorCounts:
    records_in: int = 0
    records_out: int = 0


AVAILABLE_RELATIVE_LATENCY = 1.2  # a query is available again under this (Su & Zhou)


@dataclass
class QueryAvailability:
    """One query through a failure (Su & Zhou's metrics).

    *Relative latency* is a progress point's median latency at the query's sinks over
    its failure-free latency — the median of the points before the first failure.
    A query is *available again* at the first point after the recovery started where
    every task it needs runs, its output flows and its relative latency is under
    `AVAILABLE_RELATIVE_LATENCY`; ``available_again_s`` counts from the failure's
    detection. Every task, because a query's accurate output needs all of its
    partitions (Su & Zhou): when only the failed region restarts, the partitions of
    a hit query outside it keep producing at their usual latency, and without that
    condition the query would look available while most of its tasks still wait for
    capacity. ``timeline`` holds (seconds since the job started, records, relative
    latency or None)."""

    name: str
    priority: float
    baseline_latency_ms: float | None
    available_again_s: float | None
    max_relative_latency: float | None   # after the recovery started
    longest_silence_s: float             # longest gap in its output after the failure
    timeline: list[tuple[float, int, float | None]]


def query_availability(points: list[dict[str, Any]], priorities: dict[str, float],
                       failed_at_s: float | None, restarted_at_s: float | None
                       ) -> dict[str, QueryAvailability]:
    """Each query's availability from the job master's progress ``points`` (``t_s``;
    per query, (records, p50 latency in ms) since the point before; and ``down``, the
    queries some of whose tasks were not running then — absent: none)."""
    result = {}
    for name, priority in priorities.items():
        series = [(p["t_s"], *p["queries"][name]) for p in points if name in p["queries"]]
        down_at = {round(p["t_s"], 3) for p in points if name in p.get("down", ())}
        before = sorted(ms for t, n, ms in series if n > 0 and ms is not None
                        and (failed_at_s is None or t < failed_at_s))
        baseline = before[len(before) // 2] if before else None
        timeline = [(round(t, 3), n, None if ms is None or not baseline else ms / baseline)
                    for t, n, ms in series]
        available_s = None
        worst = None
        silence_s = 0.0
        if failed_at_s is not None and restarted_at_s is not None:
            after = [(t, n, rel) for t, n, rel in timeline if t >= restarted_at_s]
            for t, n, rel in after:
                if n > 0 and rel is not None:
                    worst = rel if worst is None else max(worst, rel)
                    if available_s is None and rel < AVAILABLE_RELATIVE_LATENCY \
                            and t not in down_at:
                        available_s = t - failed_at_s
            last_output_s = failed_at_s
            for t, n, _ in [p for p in timeline if p[0] >= failed_at_s]:
                if n > 0:
                    silence_s = max(silence_s, t - last_output_s)
                    last_output_s = t
        result[name] = QueryAvailability(name, priority, baseline, available_s, worst,
                                         round(silence_s, 3), timeline)
    return result


def relative_latency_max(timeline: list[tuple[float, int, float | None]],
                         baseline_before_s: float, from_s: float,
                         window_s: float | None = None) -> float | None:
    """The largest relative latency of a query's ``timeline`` (`QueryAvailability`'s:
    seconds, records, relative latency) from ``from_s`` on, relative to the median
    of its points before ``baseline_before_s`` — the failure's time for a faulty run,
    the same time for a failure-free one, so that both are measured alike. With
    ``window_s``, each point's value is the average relative latency of the points
    with output in the ``window_s`` seconds up to it: Su & Zhou's average over an
    interval Δ_T, which a single late batch does not decide. None when there are no
    points to compare."""
    points = [(t, rel) for t, n, rel in timeline if n > 0 and rel is not None]
    before = sorted(rel for t, rel in points if t < baseline_before_s)
    if not before:
        return None
    baseline = before[len(before) // 2]
    worst = None
    for i, (t, rel) in enumerate(points):
        if t < from_s:
            continue
        if window_s is None:
            value = rel
        else:
            window = [r for u, r in points[:i + 1] if u > t - window_s]
            value = sum(window) / len(window)
        worst = value / baseline if worst is None else max(worst, value / baseline)
    return worst


@dataclass
class FailureRecovery:
    """One failure and how the job came back from it. Times in seconds."""

    reason: str
    detected_at_s: float          # since the job started
    restart_s: float              # detection -> every task running from the recovery line
    recovery_s: float | None      # failure -> output rate back to normal (None: never)
    recovery_line: Any = None     # what the tasks restored (checkpoint id(s))
    # the operator instances that restarted, as "op[index]": every one after a
    # restart of the job, fewer when only the failure's region restarted
    restarted_tasks: list[str] = field(default_factory=list)
    # the failure: its injected fault, or its detection (`bastion.runtime.recovery_times`)
    failed_at_s: float | None = None
    detection_s: float | None = None   # fault -> detected (None: no injected fault)
    trt_s: float | None = None         # failure -> output rate back and sources caught up


@dataclass
class ProtocolMetrics(ProtocolStats):
    """What the fault-tolerance protocol cost and how recoveries went: the figures
    its coordinator reports (`ProtocolStats`) and what the run measured around it."""

    protocol: str = "none"
    protocol_bytes: int = 0
    # bytes of the encoded data frames; a frame of numbers that a worker passes to its
    # own task unencoded (`records.passes_unencoded`) counts none
    data_bytes: int = 0
    failures: list[FailureRecovery] = field(default_factory=list)

    @property
    def message_overhead(self) -> float:
        """Protocol bytes per data byte (CheckMate Table II reports 1 + this)."""
        return self.protocol_bytes / self.data_bytes if self.data_bytes else 0.0


@dataclass
class RunMetrics:
    """What a run measured. Latencies in milliseconds, rates in records per second."""

    duration_s: float
    source_records: int
    sink_records: int
    tuples_per_s: float
    latency_ms: dict[str, float | None]
    operators: dict[str, OperatorCounts]
    dead_letters: int
    sink_timeline: dict[int, int] = field(default_factory=dict)
    protocol: ProtocolMetrics | None = None
    # (seconds since the start, p50 ms, p99 ms) of records that reached a sink
    # during each progress interval
    latency_timeline: list[tuple[float, float | None, float | None]] = field(
        default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # Every latency sample of the run, and those of each wall-clock second (the
    # real-time metrics of the Dynamo thesis: `deadline_ms`, `missed_deadlines`,
    # `violated_windows`)
    latency_histogram: LatencyHistogram = field(default_factory=LatencyHistogram)
    latency_windows: dict[int, LatencyHistogram] = field(default_factory=dict)
    # Seconds before and after the run (`duration_s`): from borrowing the job's
    # processes until its sources started; from the last task's end until its
    # workers were back in the pool (the final commit included). Process starts, when
    # the pool had no idle ones, are in deploy_s.
    deploy_s: float = 0.0
    teardown_s: float = 0.0
    # CPU seconds (user + system, all threads) the job's worker processes spent from
    # their first task's start to their last task's end, summed over processes: what
    # the run cost, independent of how many cores it had and how busy they were.
    # Process start-up and deploy are not in it; nor is a failed attempt's work.
    cpu_s: float = 0.0
    cpu_processes: int = 0

    @property
    def cpu_s_per_million_records(self) -> float:
        """`cpu_s` per million source records: the data plane's cost per record."""
        return self.cpu_s / self.source_records * 1e6 if self.source_records else 0.0

    def deadline_ms(self) -> float | None:
        """The thesis's per-tuple deadline (§3.2.2.4) if this run is failure-free:
        its mean latency plus two standard deviations."""
        stats = self.latency_histogram.mean_std()
        return None if stats is None else (stats[0] + 2 * stats[1]) * 1000.0

    def missed_deadlines(self, deadline_ms: float) -> float:
        """The share of records whose latency exceeded ``deadline_ms`` (take it from a
        failure-free run's `deadline_ms`), as the sinks sampled them."""
        return self.latency_histogram.share_above(deadline_ms / 1000.0)

    def violated_windows(self, bound_ms: float, percentile: float = 90.0
                         ) -> tuple[int, int]:
        """How many one-second windows with output had their ``percentile`` latency
        above ``bound_ms``, and how many windows had output."""
        percentiles = [h.percentile(percentile) for h in self.latency_windows.values()]
        values = [v for v in percentiles if v is not None]
        return sum(v * 1000.0 > bound_ms for v in values), len(values)

    def summary_rows(self) -> list[tuple[str, str]]:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} ms"

        def secs(v: float | None) -> str:   # docs/metrics.md defines each figure
            return "never" if v is None else f"{v:.2f} s"

        rows = [
            ("duration", f"{self.duration_s:.2f} s"),
            ("source records", f"{self.source_records:,}"),
            ("sink records", f"{self.sink_records:,}"),
            ("throughput", f"{self.tuples_per_s:,.0f} tuples/s"),
            ("latency p50", ms(self.latency_ms.get("p50"))),
            ("latency p95", ms(self.latency_ms.get("p95"))),
            ("latency p99", ms(self.latency_ms.get("p99"))),
            ("dead letters", f"{self.dead_letters:,}"),
        ]
        proto = self.protocol
        if proto is not None and proto.checkpoints_completed:
            duration = proto.checkpoint_duration_s_avg
            rows += [
                ("checkpoints", f"{proto.checkpoints_completed:,} "
                                f"(avg {'-' if duration is None else f'{duration * 1000:.1f} ms'}"
                                f", invalid {proto.invalid_checkpoints} = "
                                f"{proto.invalid_share:.0%})"),
                ("message overhead", f"{proto.message_overhead:.2%}"),
            ]
        for failure in proto.failures if proto is not None else []:
            rows.append(("recovery", f"restart {failure.restart_s:.2f} s, recovery "
                         f"{secs(failure.recovery_s)}, total recovery {secs(failure.trt_s)}"))
        injected = self.extra.get("faults_injected")
        if injected:
            rows.append(("faults injected", describe_injected(injected)))
        copied = self.extra.get("redundancy")
        if copied and copied["ratios"]:
            decisions = copied["decisions"]
            ratio = (f"auto, {len(decisions)} decisions, last ratio "
                     f"{decisions[-1]['ratio']:.2f}" if decisions else
                     ", ".join(f"{op} {r:g}" for op, r in copied["ratios"].items()))
            # A receiver drops every arrival of a tuple it has processed already: the
            # later of a tuple and its copy, and replays (acks re-sends) — so more can
            # be dropped than copies were sent.
            rows.append(("redundancy", f"{ratio}; {copied['copies_sent']:,} copies sent, "
                                       f"{copied['copies_dropped']:,} repeated arrivals "
                                       "dropped"))
        return rows


def describe_injected(injected: dict[str, float]) -> str:
    """What the tasks injected (`bastion.runtime.faults`), in words — the kinds that
    happened: counts from the last attempt's tasks (an attempt that failed took its
    counts with it)."""
    parts = []
    if injected["stalls"]:
        parts.append(f"{injected['stalls']:,.0f} stalls ({injected['stalled_s']:.2f} s)")
    if injected["frames_dropped"]:
        parts.append(f"{injected['frames_dropped']:,.0f} frames lost "
                     f"({injected['records_dropped']:,.0f} records)")
    if injected.get("outage_frames_lost") or injected.get("outage_acks_lost"):
        parts.append(f"{injected['outage_frames_lost']:,.0f} frames and "
                     f"{injected['outage_acks_lost']:,.0f} acknowledgments lost to outages")
    if injected["outage_waits"]:
        parts.append(f"{injected['outage_waits']:,.0f} waits for a link "
                     f"({injected['outage_waited_s']:.2f} s)")
    if injected.get("connections_dropped", 0):
        parts.append(f"{injected['connections_dropped']:,.0f} connections dropped")
    return ", ".join(parts) or "none took effect (no stall, lost frame or outage)"
