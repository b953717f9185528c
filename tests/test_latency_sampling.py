"""Sinks sample a few records of each batch, and each sample counts for the records it
stands for (`bastion.runtime.metrics.LatencyHistogram.add_batch`).

The case that matters: an outage holds records back and releases them in a few large
batches, between many small paced ones. Counted per sample, the backlog weighed as
little as one paced batch, and the percentiles and missed deadlines hid it. The
references here are computed in plain Python over every record.
"""

from __future__ import annotations

import random

import pytest

from bastion.runtime.metrics import SAMPLES_PER_BATCH, LatencyHistogram


def paced_then_released(seed: int) -> tuple[list[tuple[list[float], float]], list[float]]:
    """Batches of (born, arrival) and every record's latency: 2,000 paced batches of
    1-3 records at ~5 ms, then one outage's 3,000 records released in 3 batches
    with latencies of 1-3 s (a tenth of the records)."""
    rng = random.Random(seed)
    batches, latencies = [], []
    now = 100.0
    for _ in range(2_000):
        now += 0.005
        born = [now - rng.uniform(0.002, 0.008) for _ in range(rng.randint(1, 3))]
        batches.append((born, now))
        latencies += [now - b for b in born]
    for _ in range(3):
        now += 0.005
        born = [now - rng.uniform(1.0, 3.0) for _ in range(1_000)]
        batches.append((born, now))
        latencies += [now - b for b in born]
    return batches, latencies


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_counts_are_records_and_a_released_backlog_weighs_what_it_holds(seed):
    batches, latencies = paced_then_released(seed)
    histogram = LatencyHistogram()
    for born, now in batches:
        histogram.add_batch(born, now)
    assert histogram.count == len(latencies)
    above = sum(latency > 0.5 for latency in latencies) / len(latencies)
    assert above > 0.3  # the backlog is a third of the records
    assert histogram.share_above(0.5) == pytest.approx(above, abs=0.01)
    # p99 lies in the backlog (1-3 s), not among the paced records (< 10 ms)
    exact_p99 = sorted(latencies)[int(0.99 * len(latencies))]
    assert exact_p99 > 1.0
    assert histogram.percentile(99) == pytest.approx(exact_p99, rel=0.25)


def test_a_batch_is_sampled_evenly_and_its_samples_add_up_to_it():
    for n in (1, 3, SAMPLES_PER_BATCH, 9, 10, 1_001):
        histogram = LatencyHistogram()
        histogram.add_batch([0.0] * n, 1.0)
        assert histogram.count == n
        assert len(histogram.buckets) == 1
