"""The faults beyond kills, as descriptions and as the per-task logic that carries them
out (`bastion.faults`, `bastion.runtime.faults`): validation, fault files with errors
that name line and field, and reproducible randomness whose rates match the
declared means. Pure Python: no Ray."""

from __future__ import annotations

import random
import re
import statistics
import time
from dataclasses import dataclass

import pytest

import bastion as bn
from bastion.faults import (Constant, Crash, DropConnection, DropFrames, Gaussian,
                            LinkOutage, Timing)
from bastion.runtime.faults import TaskFaults


# -- declarations ---------------------------------------------------------------------------


@pytest.mark.parametrize("make,message", [
    (lambda: Timing("op", phase="later"), "Timing.phase must be one of"),
    (lambda: Timing("op", mtbf_records=0), "Timing.mtbf_records must be > 0"),
    (lambda: Timing("op", magnitude=0.5), "Timing.magnitude must be a distribution"),
    (lambda: Timing("", mtbf_records=5), "Timing.op must name an operator"),
    (lambda: Timing("op", mtbf_s=0), "Timing.mtbf_s must be > 0"),
    (lambda: Timing("op", mtbf_records=5, mtbf_s=1.0), "Timing.mtbf_s must be None when"),
    (lambda: Timing("op", instances=(-1,)), "Timing.instances must be None"),
    (lambda: DropFrames("op", probability=1.5), "DropFrames.probability must be <= 1"),
    (lambda: DropFrames("op", probability=0), "DropFrames.probability must be > 0"),
    (lambda: LinkOutage("op", mttr_s=-1), "LinkOutage.mttr_s must be > 0"),
    (lambda: DropConnection("op", at_s=(1.0,), mtbf_s=2.0),
     "DropConnection.mtbf_s must be None when at_s is given"),
    (lambda: DropConnection("op", at_s=()), "DropConnection.at_s must be a non-empty tuple"),
    (lambda: DropConnection("op", at_s=(0.5, -1)), "DropConnection.at_s[1] must be >= 0"),
    (lambda: DropConnection("op", mtbf_s=0), "DropConnection.mtbf_s must be > 0"),
    (lambda: DropConnection("", at_s=(1,)), "DropConnection.op must name an operator"),
    (lambda: Crash("op", max_crashes=0), "Crash.max_crashes must be an int >= 1"),
    (lambda: Crash("op", seed="x"), "Crash.seed must be an int or None"),
    (lambda: Gaussian(0.1, -1), "Gaussian.stddev must be >= 0"),
    (lambda: Gaussian(0.1, 0.1, min=0.5, max=0.2), "Gaussian.min (0.5) must not exceed"),
    (lambda: bn.faults.Uniform(2, 1), "Uniform.min (2) must not exceed max (1)"),
    (lambda: bn.faults.Exponential(0), "Exponential.mean must be > 0"),
    (lambda: Constant(float("nan")), "Constant.value must be a number"),
])
def test_a_malformed_declaration_names_its_field(make, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_gaussian_magnitudes_are_clipped_and_never_negative():
    rng = random.Random(1)
    clipped = Gaussian(0.1, 1.0, min=0.05, max=0.2)
    samples = [clipped.sample(rng) for _ in range(2000)]
    assert min(samples) == 0.05 and max(samples) == 0.2
    unclipped = [Gaussian(0.0, 1.0).sample(rng) for _ in range(2000)]
    assert min(unclipped) == 0.0 and max(unclipped) > 1.0


# -- fault files --------------------------------------------------------------------------------

GOOD = """\
seed: 7
operators:
  count:
    instances: [0, 1]
    faults:
      - timing: {phase: execute, mtbf_records: 5000, active_s: [0, 30],
                 magnitude: {gaussian: {mean: 0.45, stddev: 0.05, min: 0.0}}}
      - drop_frames: {probability: 0.01}
  split:
    faults:
      - link_outage: {mtbf_s: 5.0, mttr_s: 0.5}
      - crash: {mtbf_s: 10.0, mttr_s: 1.0, max_crashes: 2}
"""


def test_a_fault_file_reads_into_the_python_declarations(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text(GOOD)
    assert bn.faults.load(path) == [
        Timing("count", (0, 1), "execute", Gaussian(0.45, 0.05, min=0.0), 5000, seed=7,
               active_s=(0, 30)),
        DropFrames("count", (0, 1), 0.01, seed=7),
        LinkOutage("split", None, 5.0, 0.5, seed=7),
        Crash("split", None, 10.0, 1.0, 2, seed=7),
    ]


@pytest.mark.parametrize("text,where", [
    (GOOD.replace("stddev: 0.05", "stddev: x"),
     "line 7: operators.count.faults[0].timing.magnitude.gaussian.stddev: must be a number"),
    (GOOD.replace("mtbf_records: 5000", "mtbf_record: 5000"),
     "line 6: operators.count.faults[0].timing.mtbf_record: unknown field; allowed:"),
    (GOOD.replace("probability: 0.01", "probability: 2"),
     "line 8: operators.count.faults[1].drop_frames.probability: must be <= 1, got 2"),
    (GOOD.replace("instances: [0, 1]", "instances: some"),
     "line 4: operators.count.instances: must be \"all\" or a list of instance indexes"),
    (GOOD.replace("- crash:", "- explode:"),
     "line 12: operators.split.faults[1].explode: unknown field; allowed: ['timing',"),
    (GOOD.replace("max_crashes: 2", "max_crashes: 0"),
     "line 12: operators.split.faults[1].crash.max_crashes: must be an int >= 1"),
    (GOOD.replace("seed: 7", "seed: seven"), "line 1: seed: must be an int, got 'seven'"),
    (GOOD.replace("gaussian:", "lognormal:"),
     "line 7: operators.count.faults[0].timing.magnitude.lognormal: unknown field"),
    ("seed: 1\n", "missing field 'operators'"),
    (GOOD.replace("    faults:\n      - link", "    faults: [\n      - link"),
     "line 11: not valid YAML"),
])
def test_a_mistake_in_a_fault_file_is_named_by_line_and_field(tmp_path, text, where):
    path = tmp_path / "faults.yaml"
    path.write_text(text)
    with pytest.raises(bn.faults.FaultFileError) as error:
        bn.faults.load(path)
    assert str(error.value).startswith(str(path)), error.value
    assert where in str(error.value), error.value


def test_the_same_document_as_a_dict_reads_the_same_and_names_its_source():
    doc = {"seed": 3, "operators": {"op": {"faults": [{"drop_frames": {"probability": 0.5}}]}}}
    assert bn.faults.from_dict(doc) == [DropFrames("op", None, 0.5, seed=3)]
    doc["operators"]["op"]["faults"][0]["drop_frames"]["probability"] = -1
    with pytest.raises(bn.faults.FaultFileError,
                       match=r"^<dict>: operators\.op\.faults\[0\]\.drop_frames\.probability"):
        bn.faults.from_dict(doc)


def test_a_dropped_connection_reads_from_a_file_with_its_times():
    doc = {"seed": 3, "operators": {"op": {"instances": [1], "faults": [
        {"drop_connection": {"at_s": [2.5, 1.0]}}, {"drop_connection": {"mtbf_s": 4}}]}}}
    assert bn.faults.from_dict(doc) == [DropConnection("op", (1,), (1.0, 2.5), seed=3),
                                        DropConnection("op", (1,), None, 4, seed=3)]
    assert DropConnection("op").at_s == (1.0,)  # once, a second in, unless told
    doc["operators"]["op"]["faults"][0]["drop_connection"]["at_s"] = [1.0, -2]
    with pytest.raises(bn.faults.FaultFileError,
                       match=r"operators\.op\.faults\[0\]\.drop_connection: "
                             r"DropConnection\.at_s\[1\] must be >= 0"):
        bn.faults.from_dict(doc)


# -- what a task carries out ----------------------------------------------------------------------


def stall_points(faults: TaskFaults, records: int, step: int) -> list[tuple[int, float]]:
    """(records done, seconds) of every stall while ``records`` go by ``step`` at a time."""
    out = []
    stalls = faults.execute[0]
    for done in range(step, records + 1, step):
        seconds = faults.stall_s(stalls, done)
        if seconds:
            out.append((done, seconds))
    return out


def timing(seed: int, mtbf_records: float = 100, magnitude=Constant(0.01)) -> TaskFaults:
    return TaskFaults.for_task([Timing("op", mtbf_records=mtbf_records, magnitude=magnitude,
                                       seed=seed)], ["op"], 0)


def test_stalls_come_at_the_same_records_with_the_same_seed_and_elsewhere_with_another():
    first = stall_points(timing(seed=5), 20_000, 10)
    assert first == stall_points(timing(seed=5), 20_000, 10)
    assert first != stall_points(timing(seed=6), 20_000, 10)
    # counted in records, not calls: batch by batch or record by record, the same stalls
    by_record = stall_points(timing(seed=5), 20_000, 1)
    assert sum(s for _, s in first) == pytest.approx(sum(s for _, s in by_record))


def test_stall_gaps_follow_the_declared_mean_and_magnitudes_their_distribution():
    faults = timing(seed=1, mtbf_records=50, magnitude=Gaussian(0.2, 0.05))
    points = stall_points(faults, 500_000, 1)
    gaps = [b - a for (a, _), (b, _) in zip(points, points[1:])]
    assert statistics.mean(gaps) == pytest.approx(50, rel=0.1)
    # occurrences, not calls: two may fall on one record
    assert faults.stalls >= len(points)
    assert faults.stalls == pytest.approx(500_000 / 50, rel=0.05)
    assert faults.stalled_s / faults.stalls == pytest.approx(0.2, rel=0.05)


def test_a_stall_strikes_only_inside_its_active_seconds_where_it_would_without_them():
    always = TaskFaults.for_task([Timing("op", mtbf_records=100, seed=5)], ["op"], 0)
    windowed = TaskFaults.for_task([Timing("op", mtbf_records=100, seed=5,
                                           active_s=(10.0, 20.0))], ["op"], 0)
    for faults in (always, windowed):
        faults.started_s -= 5.0          # the task started 5 s ago: before the window
    assert windowed.stall_s(windowed.execute[0], 5_000) == 0.0
    assert always.stall_s(always.execute[0], 5_000) > 0
    for faults in (always, windowed):
        faults.started_s -= 10.0         # 15 s: inside it
    assert windowed.stall_s(windowed.execute[0], 10_000) == pytest.approx(
        always.stall_s(always.execute[0], 10_000))
    assert windowed.stall_s(windowed.execute[0], 10_000) == 0.0 < windowed.stalled_s
    with pytest.raises(ValueError, match=r"Timing.active_s\[1\] must be > 10"):
        Timing("op", active_s=(10, 5))
    with pytest.raises(ValueError, match=r"Timing.active_s must be \(from_s, to_s\)"):
        Timing("op", active_s=3)


def time_stalls(faults: TaskFaults, seconds: float, records_per_s: float,
                step_s: float = 0.001) -> list[tuple[float, float]]:
    """(seconds since the start, seconds) of every stall while the task runs for
    ``seconds`` at ``records_per_s``, a call every ``step_s`` of its clock; a stall
    takes its own length of that clock, as it does in a task."""
    out, now_s = [], 0.0
    stalls = faults.execute[0]
    while now_s < seconds:
        faults.started_s = time.monotonic() - now_s     # the task's clock reads now_s
        stalled = faults.stall_s(stalls, int(now_s * records_per_s))
        if stalled:
            out.append((round(now_s, 3), stalled))
        now_s += step_s + stalled
    return out


def in_time(seed: int, mtbf_s: float = 1.0, magnitude=Constant(0.15)) -> TaskFaults:
    return TaskFaults.for_task([Timing("op", mtbf_s=mtbf_s, magnitude=magnitude,
                                       seed=seed)], ["op"], 0)


def test_stalls_in_time_come_as_often_per_second_however_many_records_the_instance_does():
    # the thesis's model: a stall happens to the machine; an instance that receives
    # copies (twice the records) stalls no more often than without them
    alone = time_stalls(in_time(seed=5), 30.0, 1000)
    with_copies = time_stalls(in_time(seed=5), 30.0, 2000)
    assert alone == with_copies
    assert alone != time_stalls(in_time(seed=6), 30.0, 1000)
    # whereas counted in records, twice the records stall twice as often
    per_record = [TaskFaults.for_task([Timing("op", mtbf_records=1000, seed=5)], ["op"], 0)
                  for _ in range(2)]
    assert len(time_stalls(per_record[1], 30.0, 2000)) > 1.5 * len(
        time_stalls(per_record[0], 30.0, 1000))


def test_stalls_in_time_have_the_declared_up_time_between_them_and_never_overlap():
    faults = in_time(seed=1, mtbf_s=0.5, magnitude=Gaussian(0.3, 0.05))
    points = time_stalls(faults, 600.0, 100)
    # the gap from one stall's end to the next stall is the declared mean up-time
    ups = [b - (a + s) for (a, s), (b, _) in zip(points, points[1:])]
    assert min(ups) >= 0
    assert statistics.mean(ups) == pytest.approx(0.5, rel=0.1)
    assert faults.stalls == len(points)
    assert faults.stalled_s / faults.stalls == pytest.approx(0.3, rel=0.05)


def test_a_fault_file_takes_mtbf_in_seconds():
    faults = bn.faults.from_dict({"operators": {"count": {"faults": [
        {"timing": {"mtbf_s": 2.0, "magnitude": {"constant": {"value": 0.45}}}}]}}})
    assert faults == [Timing("count", mtbf_s=2.0, magnitude=Constant(0.45))]
    assert faults[0].mtbf_records is None
    assert Timing("count").mtbf_records == 10_000 and Timing("count").mtbf_s is None


def test_other_instances_and_operators_carry_nothing():
    faults = [Timing("op", instances=(1,), seed=1), DropFrames("other", probability=0.5)]
    assert TaskFaults.for_task(faults, ["op"], 0) is None
    assert TaskFaults.for_task(faults, ["op"], 1) is not None
    assert TaskFaults.for_task(faults, ["src", "other"], 3).drops


def test_frames_are_lost_at_the_declared_rate_reproducibly_and_only_frames_of_data():
    def lost(seed: int) -> list[int]:
        faults = TaskFaults.for_task([DropFrames("op", probability=0.1, seed=seed)], ["op"], 0)
        return [n for n in range(100_000) if faults.before_send(0, n, 10, True)[1]]

    frames = lost(3)
    assert len(frames) / 100_000 == pytest.approx(0.1, rel=0.05)
    assert frames == lost(3) and frames != lost(4)
    faults = TaskFaults.for_task([DropFrames("op", probability=1.0)], ["op"], 0)
    assert faults.before_send(0, 1, 10, False) == (0.0, False)   # an end-of-stream in it
    assert faults.before_send(0, 2, 0, True) == (0.0, False)     # no data in it
    assert faults.before_send(0, 3, 10, True) == (0.0, True)
    assert (faults.frames_dropped, faults.records_dropped) == (1, 10)


def test_links_are_down_for_the_declared_share_of_the_time():
    outage = LinkOutage("op", mtbf_s=0.9, mttr_s=0.1, seed=2)
    faults = TaskFaults.for_task([outage], ["op"], 0)
    step_s = 0.001
    down = sum(faults.link_down_for_s(i * step_s) > 0 for i in range(2_000_000))
    assert down / 2_000_000 == pytest.approx(0.1, rel=0.1)
    again = TaskFaults.for_task([outage], ["op"], 0)
    assert [again.link_down_for_s(t / 10) for t in range(300)] == \
        [TaskFaults.for_task([outage], ["op"], 0).link_down_for_s(t / 10) for t in range(300)]


def test_connections_drop_once_at_each_given_time_and_at_the_declared_rate():
    faults = TaskFaults.for_task([DropConnection("op", at_s=(1.0, 2.0, 2.1))], ["op"], 0)
    now = time.monotonic()

    def tear_at(elapsed_s: float) -> bool:
        faults.started_s = now - elapsed_s
        return faults.tear_due()

    assert [tear_at(t) for t in (0.5, 1.2, 1.3, 5.0, 6.0)] == [False, True, False, True,
                                                               False]
    # the two times that came due together (no frame went over TCP between them) made
    # one drop
    assert faults.report()["connections_dropped"] == 2

    def drops(seed: int) -> list[float]:
        [tears] = TaskFaults.for_task([DropConnection("op", mtbf_s=0.5, seed=seed)],
                                      ["op"], 0).tears
        return [t / 100 for t in range(100_000) if tears.due(t / 100)]  # 1,000 s

    times = drops(5)
    assert len(times) == pytest.approx(1000 / 0.5, rel=0.1)
    assert times == drops(5) and times != drops(6)


# -- crashes, against a plan ------------------------------------------------------------------------


@dataclass
class _Node:
    parallelism: int


@dataclass
class _Task:
    worker: int


@dataclass
class _Topology:
    nodes: dict


@dataclass
class _Plan:
    """The parts of a physical plan the fault declarations look at."""
    topology: _Topology
    workers: int = 2

    def task_of(self, op: str, index: int) -> _Task:
        return _Task(worker=index)


PLAN = _Plan(_Topology({"src": _Node(2), "count": _Node(2)}))


def test_crashes_are_bounded_repaired_and_reproducible():
    crash = Crash("count", mtbf_s=2.0, mttr_s=0.5, max_crashes=3, seed=9)
    kills = crash.schedule(PLAN)
    assert len(kills) == 3 and kills == sorted(kills)
    assert all(k.repair_s > 0 and k.what.startswith("crash count[") for k in kills)
    assert kills == Crash("count", mtbf_s=2.0, mttr_s=0.5, max_crashes=3, seed=9).schedule(PLAN)
    assert kills != Crash("count", mtbf_s=2.0, mttr_s=0.5, max_crashes=3,
                          seed=10).schedule(PLAN)


def test_validation_names_a_missing_operator_or_instance():
    with pytest.raises(ValueError, match="Timing: no operator named 'nope'"):
        bn.faults.validate([Timing("nope")], PLAN)
    with pytest.raises(ValueError, match=r"DropFrames: operator 'count' has no instance 5"):
        bn.faults.validate([DropFrames("count", instances=(5,))], PLAN)
    with pytest.raises(ValueError, match="Crash: no operator named 'gone'"):
        bn.faults.validate([Crash("gone")], PLAN)
    kills = bn.faults.validate([Timing("count"), Crash("count", max_crashes=2, seed=1)], PLAN)
    assert len(kills) == 2  # the timing fault is the tasks' business, not a kill
