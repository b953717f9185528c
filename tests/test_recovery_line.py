"""Recovery lines from uncoordinated checkpoints: rollback propagation (CheckMate Alg. 1).

Hand-built executions check the cases one can reason about (no orphan, one orphan, a
cascade, the domino of CheckMate Fig. 5); random executions check Algorithm 1 against a
brute-force search over every combination of checkpoints.
"""

from __future__ import annotations

import itertools
import random

import pytest

from bastion.protocols.recovery_line import (
    CheckpointGraph, CheckpointRecord, find_recovery_line, invalid_checkpoints,
    is_consistent, region_recovery_line, replay_from)


def record(process, number, sent=None, received=None):
    return CheckpointRecord(process, number, sent or {}, received or {})


# -- hand-built executions ---------------------------------------------------------------

def test_latest_checkpoints_consistent_form_the_line():
    # a sends 0..2 to b; b checkpoints after receiving 0..1 — message 2 is in flight.
    channels = {"ab": ("a", "b")}
    records = [record("a", 1, sent={"ab": 0}), record("a", 2, sent={"ab": 2}),
               record("b", 1, received={"ab": 1})]
    assert find_recovery_line(records, channels) == {"a": 2, "b": 1}
    assert invalid_checkpoints(records, channels) == set()


def test_one_orphan_forces_one_rollback():
    # b's checkpoint 2 received message 3, which a sent after its latest checkpoint.
    channels = {"ab": ("a", "b")}
    records = [record("a", 1, sent={"ab": 2}),
               record("b", 1, received={"ab": 1}), record("b", 2, received={"ab": 3})]
    assert not is_consistent({"a": 1, "b": 2}, records, channels)
    assert find_recovery_line(records, channels) == {"a": 1, "b": 1}


def test_rollback_cascades_across_three_processes():
    # a's orphan pushes b back to checkpoint 1; b has sent less there, which orphans a
    # message c's checkpoint 2 received, so c goes back too — though c never heard from a.
    channels = {"ab": ("a", "b"), "bc": ("b", "c")}
    records = [
        record("a", 1, sent={"ab": 0}),
        record("b", 1, received={"ab": 0}, sent={"bc": 0}),
        record("b", 2, received={"ab": 1}, sent={"bc": 1}),
        record("c", 1, received={"bc": 0}), record("c", 2, received={"bc": 1}),
    ]
    assert find_recovery_line(records, channels) == {"a": 1, "b": 1, "c": 1}
    assert is_consistent({"a": 1, "b": 1, "c": 1}, records, channels)


# CheckMate Fig. 5: O1 -> O2 -> O3 -> O1. The figure itself is not in the text, so the
# messages are placed to match its narrative, numbered by send time:
#   O1: C11, send m1 m2, recv m3, C12, send m4, recv m6, C13
#   O2: C21, recv m1 m2, C22, send m5, recv m4, C23
#   O3: C31, send m3, recv m5, C32, send m6
# Channel "a" is O1->O2 (m1, m2, m4 are its messages 0, 1, 2), "b" is O2->O3 (m5 = 0),
# "c" is O3->O1 (m3 = 0, m6 = 1). Five rollbacks need five messages; the narrative
# names six, so m1 duplicates m2's role (both orphan {C11, C22, C31}).
FIG5_CHANNELS = {"a": (1, 2), "b": (2, 3), "c": (3, 1)}
FIG5_RECORDS = [
    record(1, 1, sent={"a": -1}, received={"c": -1}),
    record(1, 2, sent={"a": 1}, received={"c": 0}),
    record(1, 3, sent={"a": 2}, received={"c": 1}),
    record(2, 1, received={"a": -1}, sent={"b": -1}),
    record(2, 2, received={"a": 1}, sent={"b": -1}),
    record(2, 3, received={"a": 2}, sent={"b": 0}),
    record(3, 1, received={"b": -1}, sent={"c": -1}),
    record(3, 2, received={"b": 0}, sent={"c": 0}),
]


def test_domino_effect_of_checkmate_figure_5():
    # Each candidate of the paper's narrative is rejected, for the reason it gives.
    narrative = [({1: 3, 2: 3, 3: 2}, "c"),    # m6
                 ({1: 2, 2: 3, 3: 2}, "a"),    # m4
                 ({1: 2, 2: 2, 3: 2}, "b"),    # m5
                 ({1: 2, 2: 2, 3: 1}, "c"),    # m3
                 ({1: 1, 2: 2, 3: 1}, "a")]    # m2, m1
    graph = CheckpointGraph(FIG5_RECORDS, FIG5_CHANNELS)
    for line, orphan_channel in narrative:
        assert graph.orphan_channels(line) == [orphan_channel], line

    assert graph.recovery_line() == {1: 1, 2: 1, 3: 1}
    assert graph.invalid_checkpoints() == {(1, 2), (1, 3), (2, 2), (2, 3), (3, 2)}
    # m6 (sent by O3 after C32, received by O1 before C13) is the edge C32 -> C13.
    assert (1, 3) in graph.successors((3, 2))


def test_replay_from_starts_after_what_the_receiver_has():
    # a sent 0..4 before its checkpoint; b had received 0..2: 3 and 4 are replayed from
    # a's log. Nothing reached c yet, so its channel replays from 0.
    channels = {"ab": ("a", "b"), "ac": ("a", "c")}
    records = [record("a", 1, sent={"ab": 4, "ac": 1}), record("b", 1, received={"ab": 2})]
    line = find_recovery_line(records, channels)
    assert line == {"a": 1, "b": 1, "c": 0}
    assert replay_from(line, records, channels) == {"ab": 3, "ac": 0}
    with pytest.raises(ValueError, match="orphan messages on channels \\['ab'\\]"):
        replay_from({"a": 0, "b": 1, "c": 0}, records, channels)


def test_pinned_checkpoint_yields_latest_line_containing_it():
    graph = CheckpointGraph(FIG5_RECORDS, FIG5_CHANNELS)
    assert graph.recovery_line(containing=[(2, 1)]) == {1: 1, 2: 1, 3: 1}
    assert graph.recovery_line(containing=[(1, 0)]) == {1: 0, 2: 1, 3: 1}
    assert graph.recovery_line(containing=[(3, 2)]) is None
    assert graph.recovery_line(containing=[(1, 1), (1, 0)]) is None


@pytest.mark.parametrize("records, message", [
    ([record("a", 1, sent={"ab": 0}), record("a", 1, sent={"ab": 1})], "two records"),
    ([record("a", 1, sent={"ab": 3}), record("a", 2, sent={"ab": 1})], "goes back from 3 to 1"),
    ([record("b", 1, sent={"ab": 0})], "whose src is 'a'"),
    ([record("a", 1, sent={"zz": 0})], "unknown channel 'zz'"),
])
def test_impossible_records_are_rejected(records, message):
    with pytest.raises(ValueError, match=message):
        CheckpointGraph(records, {"ab": ("a", "b")})


def test_record_numbers_start_at_one():
    with pytest.raises(ValueError, match="number must be an int >= 1"):
        record("a", 0)


# -- random executions against brute force ----------------------------------------------

def random_execution(rng: random.Random, final: bool = False):
    """Records of a random run: FIFO channels, random sends, receives and checkpoints
    (``final``: and what every process had sent and received at the end, apart)."""
    n = rng.randint(2, 4)
    procs = [("op", i) for i in range(n)]
    pairs = [(p, q) for p in procs for q in procs if p != q]
    channels = {k: pair for k, pair in enumerate(rng.sample(pairs, rng.randint(1, len(pairs))))}
    sent = dict.fromkeys(channels, -1)
    received = dict.fromkeys(channels, -1)
    taken = dict.fromkeys(procs, 0)
    records = []
    for _ in range(rng.randint(5, 30)):
        roll = rng.random()
        if roll < 0.4:
            sent[rng.choice(list(channels))] += 1
        elif roll < 0.8:
            pending = [c for c in channels if received[c] < sent[c]]
            if pending:
                received[rng.choice(pending)] += 1
        else:
            p = rng.choice(procs)
            taken[p] += 1
            records.append(CheckpointRecord(
                p, taken[p],
                {c: sent[c] for c, (src, _) in channels.items() if src == p},
                {c: received[c] for c, (_, dst) in channels.items() if dst == p}))
    if final:
        now = [CheckpointRecord(
            p, taken[p] + 1,
            {c: sent[c] for c, (src, _) in channels.items() if src == p},
            {c: received[c] for c, (_, dst) in channels.items() if dst == p})
            for p in procs]
        return records, channels, now
    return records, channels


def test_algorithm_1_matches_brute_force_on_random_executions():
    dominoes = 0
    for seed in range(300):
        records, channels = random_execution(random.Random(seed))
        graph = CheckpointGraph(records, channels)
        procs = graph.processes
        consistent = [dict(zip(procs, combo))
                      for combo in itertools.product(*(graph.checkpoints(p) for p in procs))
                      if graph.is_consistent(dict(zip(procs, combo)))]
        latest = {p: max(line[p] for line in consistent) for p in procs}
        # Consistent lines are closed under per-process max, so this is the unique
        # maximal one; Algorithm 1 must find exactly it.
        assert latest in consistent, seed
        assert graph.recovery_line() == latest, seed
        assert find_recovery_line(records, channels) == latest, seed

        useful = {(p, line[p]) for line in consistent for p in procs}
        every = {(p, n) for p in procs for n in graph.checkpoints(p)}
        assert graph.invalid_checkpoints() == every - useful, seed
        dominoes += bool(every - useful)
    assert dominoes > 10   # the random runs do exercise invalid checkpoints


def test_a_region_rolls_back_alone_to_the_latest_line_with_the_rest_running_on():
    """A failure restarts some processes and everything downstream of them; the rest
    keep their current state — a checkpoint of their own, taken now, that cannot
    roll back. Against brute force over every combination of the region's
    checkpoints, with the others pinned at now: the line is the latest consistent
    one, and a region that many lines fit rolls back less than the whole job does."""
    rolled_back_less = 0
    for seed in range(300):
        rng = random.Random(seed)
        records, channels, now = random_execution(rng, final=True)
        procs = sorted(CheckpointGraph(records, channels).processes)
        downstream = {p: {d for s, d in channels.values() if s == p} for p in procs}
        region, todo = set(), [rng.choice(procs)]
        while todo:
            p = todo.pop()
            if p not in region:
                region.add(p)
                todo.extend(downstream[p])
        outside = [p for p in procs if p not in region]
        full = CheckpointGraph(records + [r for r in now if r.process in outside], channels)
        pinned = {r.process: r.number for r in now if r.process in outside}
        members = sorted(region)
        consistent = []
        for combo in itertools.product(*(full.checkpoints(p) for p in members)):
            line = {**dict(zip(members, combo)), **pinned}
            if full.is_consistent(line):
                consistent.append(dict(zip(members, combo)))
        latest = {p: max(line[p] for line in consistent) for p in members}
        assert latest in consistent, seed
        assert region_recovery_line(records, channels, region) == latest, seed
        whole = find_recovery_line(records, channels)
        assert all(latest[p] >= whole[p] for p in members), seed  # never below the job's
        rolled_back_less += any(latest[p] > whole[p] for p in members)
    assert rolled_back_less > 10
    with pytest.raises(ValueError, match="leave the region"):
        region_recovery_line([], {"ab": ("a", "b")}, {"a"})


def test_sink_commits_wait_for_a_late_acknowledgment():
    """Checkpoints of one task are committed in the order taken: a gap in the numbers
    (an acknowledgment still on its way) holds the later ones back."""
    from bastion.protocols.uncoordinated import checkpoint_number, follows

    def number(attempt, local, task, incarnation=0):
        return checkpoint_number(attempt, incarnation, local, task)

    assert follows(None, number(0, 1, 5)) and not follows(None, number(0, 2, 5))
    assert follows(number(0, 1, 5), number(0, 2, 5))
    assert not follows(number(0, 1, 5), number(0, 3, 5))
    # a restored task numbers the checkpoints of its new attempt from 1 again
    assert follows(number(0, 7, 5), number(1, 1, 5))
    assert not follows(number(0, 7, 5), number(1, 2, 5))
    # and so does a task restarted alone, in a new incarnation of the same attempt;
    # its numbers never meet those of the incarnation before
    assert follows(number(0, 7, 5), number(0, 1, 5, incarnation=1))
    assert number(0, 1, 5, incarnation=1) > number(0, 7, 5)
    # a restart of the job after one of the task alone still moves it on
    assert number(2, 1, 5, incarnation=1) > number(1, 9, 5, incarnation=1)
