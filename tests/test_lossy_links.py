"""Lossy link outages under ``acks``, with and without tuple-level redundancy.

The thesis's correlated communication fault (Dynamo §3.1.2.2, Fig 3.31) loses what
an instance emits while its link is down, tuples and acknowledgments alike; the
sources replay what was not acknowledged in time, and a copy of a tuple on another
instance makes the replay unnecessary. Here:

- the injector's rule, in plain Python (`TaskFaults`): a frame is lost when its link
  went down before its first element was emitted, and goes out at once otherwise (a
  lossy outage never holds a frame of data or watermarks back: that made it a stall);
  an acknowledgment sent meanwhile is lost; an end of stream waits for the link; under
  a protocol that does not replay, a lossy outage only holds frames back;
- the failed-tuple count of ``benchmarks/lossy_links.py`` (`count_failed`), on plain
  data: a clean run counts nothing, a broken one (a replayed record, a late one, a
  missing one) counts each, once;
- a real run on Ray workers: one outage on one instance of a copied operator. With
  redundancy 1.0 the sources replay nothing (the copy on the other instance got
  through) and the sink commits every record exactly once, against plain Python;
  without it, the same outage makes the sources replay.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import bastion as bn
from bastion.faults import Constant, LinkOutage
from bastion.runtime.faults import TaskFaults

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "lossy_links.py"


def _benchmark():
    """``benchmarks/lossy_links.py`` (not a package: loaded from its path, once)."""
    name = "lossy_links_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # its dataclass looks its module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


# -- the injector's rule, plain Python --------------------------------------------------------


def lossy_task(replays_lost: bool = True) -> TaskFaults:
    """One instance whose link is down from 1.0 s to 1.5 s after its start, then from
    2.5 s to 3.0 s, and so on (gaps and outages constant)."""
    outage = LinkOutage("op", mtbf_s=1.0, mtbf_min_s=1.0, mtbf_max_s=1.0,
                        mttr=Constant(0.5), lose=True)
    faults = TaskFaults.for_task([outage], ["op"], 0)
    faults.replays_lost = replays_lost
    return faults


def at(faults: TaskFaults, elapsed_s: float) -> float:
    """Make ``elapsed_s`` seconds since the task started be now; return now."""
    now_s = time.monotonic()
    faults.started_s = now_s - elapsed_s
    return now_s


def test_a_frame_emitted_while_the_link_is_down_is_lost_one_emitted_before_goes_out():
    faults = lossy_task()
    now_s = at(faults, 1.2)   # down since 1.0
    # its first record emitted at 0.9, before the link went down: its emission may
    # have been reported already, so it goes out — at once, not after the outage
    assert faults.before_send(0, 0, 10, True, buffered_s=now_s - 0.3) == (0.0, False)
    # emitted at 1.1, within the outage: lost, with the reports sent meanwhile
    assert faults.before_send(0, 10, 10, True, buffered_s=now_s - 0.1) == (0.0, True)
    assert faults.ack_lost()
    # watermarks alone: lost too (the next supersedes them), no data frame counted
    assert faults.before_send(0, 20, 0, True, buffered_s=now_s - 0.1) == (0.0, True)
    # an end of stream is never lost: it waits for the link (0.3 s more)
    wait_s, lost = faults.before_send(0, 20, 0, False, buffered_s=now_s - 0.1)
    assert not lost and wait_s == pytest.approx(0.3, abs=0.05)
    assert (faults.outage_frames_lost, faults.records_dropped, faults.outage_acks_lost) \
        == (1, 10, 1)
    # the link is up again at 1.6: nothing lost, nothing waits
    now_s = at(faults, 1.6)
    assert faults.before_send(0, 20, 10, True, buffered_s=now_s - 0.1) == (0.0, False)
    assert not faults.ack_lost()


def test_a_frame_emitted_during_an_earlier_outage_is_not_lost_to_a_later_one():
    faults = lossy_task()
    now_s = at(faults, 2.6)   # down since 2.5; the frame began at 1.4, in the first
    assert faults.before_send(0, 0, 10, True, buffered_s=now_s - 1.2) == (0.0, False)


def test_a_lossy_outage_only_holds_frames_back_where_nothing_replays():
    faults = lossy_task(replays_lost=False)
    now_s = at(faults, 1.2)
    wait_s, lost = faults.before_send(0, 0, 10, True, buffered_s=now_s - 0.1)
    assert not lost and wait_s == pytest.approx(0.3, abs=0.05)
    assert not faults.ack_lost()


# -- the benchmark's failed-tuple count, plain Python ----------------------------------------


def test_a_clean_run_counts_no_failed_tuple():
    count_failed = _benchmark().count_failed
    outputs = [(i, 10.0 + i, 10.0 + i + 0.05) for i in range(5)]
    counted = count_failed(range(5), outputs, deadline_s=0.5)
    assert (counted.tuples, counted.failed, counted.failed_share) == (5, 0, 0.0)
    assert counted.latencies_s == pytest.approx((0.05,) * 5)


def test_a_replayed_a_late_and_a_missing_record_each_count_once():
    count_failed = _benchmark().count_failed
    outputs = [(0, 10.0, 10.05),
               (1, 11.0, 11.04), (1, 11.0, 12.10),   # replayed: out twice
               (2, 12.0, 13.10),                     # late: first out 1.1 s after arrival
               (3, 13.0, 13.30), (3, 13.0, 14.90),   # replayed and late
               # 4 never came out
               (5, 15.0, 15.50)]                     # on the deadline: in time
    counted = count_failed(range(6), outputs, deadline_s=0.5)
    assert (counted.failed, counted.replayed, counted.late, counted.missing) == (4, 2, 1, 1)
    assert counted.failed_share == pytest.approx(4 / 6)
    # latency counts from the first arrival to the first time out
    assert counted.latencies_s == pytest.approx(sorted([0.05, 0.04, 1.1, 0.3, 0.5]))


def test_an_output_the_count_cannot_place_is_refused():
    count_failed = _benchmark().count_failed
    with pytest.raises(ValueError, match="record 9"):
        count_failed(range(3), [(9, 1.0, 1.1)], deadline_s=0.5)
    with pytest.raises(ValueError, match="two first arrivals"):
        count_failed(range(3), [(1, 1.0, 1.1), (1, 2.0, 2.1)], deadline_s=0.5)


# -- a real run --------------------------------------------------------------------------------

RECORDS = 450
RATE = 300.0   # 1.5 s of input; the outage is at 0.8-1.2 s after the tasks start


def triple(i: int) -> int:
    return 3 * i


def lossy_run(tmp_path, redundancy: float) -> bn.RunResult:
    topo = bn.Topology("one-lossy-outage")
    topo.source("numbers", bn.sources.Generator(lambda i: i, count=RECORDS, rate=RATE)) \
        .map("triple", triple, parallelism=2).sink("out", bn.sinks.Collect(), parallelism=1)
    # one outage on instance 0 of the copied operator, 0.8 s after it started, 0.4 s
    # long; the next would be at 2.0 s, after the input
    outage = LinkOutage("triple", instances=(0,), mtbf_s=0.8, mtbf_min_s=0.8,
                        mtbf_max_s=0.8, mttr=Constant(0.4), lose=True, seed=1)
    # With copies nothing may be replayed: a timeout long enough that a slow moment of
    # a shared host replays nothing either. Without, the replays are the point: soon.
    return bn.run(topo, protocol=bn.protocols.Acks(timeout_s=2.0 if redundancy else 0.6,
                                                   interval_s=0.2),
                  redundancy={"triple": redundancy} if redundancy else None, faults=[outage],
                  storage=f"local://{tmp_path}/r{redundancy}")


@pytest.mark.usefixtures("ray_session")
def test_with_copies_a_lossy_outage_on_one_instance_replays_nothing(tmp_path):
    reference = Counter(triple(i) for i in range(RECORDS))
    copied = lossy_run(tmp_path, 1.0)
    injected = copied.metrics.extra["faults_injected"]
    assert injected["outage_frames_lost"] > 0, injected   # the outage hit data
    # the copy on instance 1 got through: nothing is replayed, nothing duplicated
    assert copied.metrics.extra["protocol_counters"]["roots_replayed"] == 0
    assert Counter(copied.outputs["out"]) == reference
    alone = lossy_run(tmp_path, 0.0)
    assert alone.metrics.extra["faults_injected"]["outage_frames_lost"] > 0
    assert alone.metrics.extra["protocol_counters"]["roots_replayed"] > 0
    assert set(alone.outputs["out"]) == set(reference)   # at least once
