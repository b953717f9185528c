"""Run metrics: end-to-end latency and throughput, cheap enough for the hot path.

End-to-end latency of a record is the wall-clock time from its source emitting it
(``born``) to a sink receiving it. Sinks sample it — at most `SAMPLES_PER_BATCH`
records per batch, evenly spread — into a `LatencyHistogram`: log-spaced buckets 2%
wide, so percentiles are within 2% and histograms of many instances merge by adding
bucket counts. Sinks also count records per wall-clock second (a throughput timeline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SAMPLES_PER_BATCH = 4
_BUCKET_RATIO = 1.02
_LOG_RATIO = math.log(_BUCKET_RATIO)
_MIN_LATENCY_S = 1e-6


class LatencyHistogram:
    """Log-bucketed histogram of latencies in seconds."""

    def __init__(self, buckets: dict[int, int] | None = None):
        self.buckets: dict[int, int] = dict(buckets or {})
        self.count = sum(self.buckets.values())

    def add(self, latency_s: float) -> None:
        b = int(math.log(max(latency_s, _MIN_LATENCY_S) / _MIN_LATENCY_S) / _LOG_RATIO)
        self.buckets[b] = self.buckets.get(b, 0) + 1
        self.count += 1

    def add_batch(self, born: list, now_s: float) -> None:
        n = len(born)
        step = max(1, n // SAMPLES_PER_BATCH)
        for i in range(0, n, step):
            self.add(now_s - born[i])

    def minus(self, earlier: dict[int, int]) -> "LatencyHistogram":
        """What was added since the bucket counts ``earlier`` were copied."""
        return LatencyHistogram({b: c - earlier.get(b, 0) for b, c in self.buckets.items()
                                 if c != earlier.get(b, 0)})

    def merge(self, other: "LatencyHistogram") -> None:
        for b, c in other.buckets.items():
            self.buckets[b] = self.buckets.get(b, 0) + c
        self.count += other.count

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
    extra: dict[str, Any] = field(default_factory=dict)

    def summary_rows(self) -> list[tuple[str, str]]:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} ms"

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
        return rows
