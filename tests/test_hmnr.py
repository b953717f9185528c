"""HMNR forced checkpoints: every checkpoint stays usable for recovery.

Executions are simulated event by event — sends, FIFO receives, basic checkpoints — with
every process running `HmnrState`. Each checkpoint is recorded the way the uncoordinated
protocol records it (last sent / last received per channel), so `recovery_line` can
judge the outcome: with HMNR's forced checkpoints no checkpoint is invalid, while the
same execution with only the basic checkpoints has invalid ones.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import msgpack
import pytest

from bastion.protocols.hmnr import HmnrState
from bastion.protocols.recovery_line import CheckpointRecord, invalid_checkpoints


@dataclass
class Checkpoint:
    process: int
    forced: bool
    sent: dict
    received: dict


@dataclass
class Run:
    checkpoints: list[Checkpoint]
    channels: dict
    forced_before: list[tuple]   # (receiver, message label) for every forced checkpoint

    def records(self, with_forced: bool) -> list[CheckpointRecord]:
        """The checkpoint records, or those of the basic checkpoints only."""
        numbers: dict[int, int] = {}
        records = []
        for c in self.checkpoints:
            if c.forced and not with_forced:
                continue
            numbers[c.process] = numbers.get(c.process, 0) + 1
            records.append(CheckpointRecord(c.process, numbers[c.process], c.sent, c.received))
        return records

    def invalid(self, with_forced: bool) -> set:
        return invalid_checkpoints(self.records(with_forced), self.channels)


def simulate(n: int, events: list[tuple]) -> Run:
    """Run ``events``: ("send", src, dst, label), ("recv", src, dst), ("ckpt", p).

    Every process takes a final basic checkpoint at the end, as HMNR's guarantee is
    about checkpoints: a message received before a checkpoint but sent after the
    sender's last one would otherwise leave the receiver's checkpoint without partner.
    """
    states = [HmnrState(p, n) for p in range(n)]
    channels = {(p, q): (p, q) for p in range(n) for q in range(n) if p != q}
    queues = {c: deque() for c in channels}
    sent = dict.fromkeys(channels, -1)
    received = dict.fromkeys(channels, -1)
    run = Run([], channels, [])

    def checkpoint(p: int, forced: bool) -> None:
        states[p].on_checkpoint()
        run.checkpoints.append(Checkpoint(
            p, forced, {c: sent[c] for c in channels if c[0] == p},
            {c: received[c] for c in channels if c[1] == p}))

    for kind, *args in [*events, *(("ckpt", p) for p in range(n))]:
        if kind == "send":
            src, dst, label = args
            queues[(src, dst)].append((label, states[src].on_send(dst)))
            sent[(src, dst)] += 1
        elif kind == "recv":
            src, dst = args
            label, piggyback = queues[(src, dst)].popleft()
            if states[dst].must_force(piggyback):
                checkpoint(dst, forced=True)
                run.forced_before.append((dst, label))
            states[dst].on_receive(piggyback)
            received[(src, dst)] += 1
        else:
            checkpoint(args[0], forced=False)
    return run


def test_forced_checkpoint_breaks_a_z_cycle_in_a_ring():
    # p0 -> p1 -> p2 -> p0. p1 checkpoints between receiving m1 and sending m2. When m3
    # comes back to p0 in the interval in which p0 sent m1, delivering it would close
    # the Z-cycle m2, m3, m1 through p1's checkpoint: restoring that checkpoint needs
    # m1 sent, hence p0 past m3's receipt, hence p2 past m3's send and p1 past m2's send.
    events = [("send", 0, 1, "m1"), ("recv", 0, 1), ("ckpt", 1),
              ("send", 1, 2, "m2"), ("recv", 1, 2),
              ("send", 2, 0, "m3"), ("recv", 2, 0)]
    run = simulate(3, events)
    assert run.forced_before == [(0, "m3")]
    assert run.invalid(with_forced=False) == {(1, 1)}
    assert run.invalid(with_forced=True) == set()


def test_non_causal_clause_catches_a_z_cycle_no_causal_path_reveals():
    # p1 sends b to p2, then receives c, sent by p0 after its checkpoint C(0,1). The
    # Z-path c -> b -> a leaves C(0,1) and comes back before it (p2 sent a to p0 in the
    # interval in which it receives b), though no message's causal past shows it. p1's
    # clock is behind c's and p0 knew it was ahead of p2: HMNR forces p1 before c.
    events = [("send", 2, 0, "a"), ("recv", 2, 0), ("send", 1, 2, "b"), ("ckpt", 0),
              ("send", 0, 1, "c"), ("recv", 0, 1), ("recv", 1, 2)]
    run = simulate(3, events)
    assert run.forced_before == [(1, "c")]
    assert run.invalid(with_forced=False) == {(0, 1)}
    assert run.invalid(with_forced=True) == set()


def test_causal_clause_hears_of_a_checkpoint_by_any_path():
    # p2 first hears of p1 directly (b), then again through p0, which checkpointed after
    # receiving a from p1 (c). Both carry the same count of p1's checkpoints; only the
    # second says a checkpoint lies on the way, and p2 must keep that (OR) so that d,
    # closing the cycle back to p1, forces p1 to checkpoint before it.
    events = [("send", 1, 0, "a"), ("recv", 1, 0), ("ckpt", 0),
              ("send", 1, 2, "b"), ("recv", 1, 2), ("send", 0, 2, "c"), ("recv", 0, 2),
              ("send", 2, 1, "d"), ("recv", 2, 1)]
    run = simulate(3, events)
    assert run.forced_before == [(1, "d")]
    assert run.invalid(with_forced=False) == {(0, 1)}
    assert run.invalid(with_forced=True) == set()


def test_hmnr_prevents_the_domino_of_checkmate_figure_5():
    # The execution of CheckMate Fig. 5 (see test_recovery_line), on processes 0, 1, 2.
    events = [("ckpt", 0), ("ckpt", 1), ("ckpt", 2),
              ("send", 0, 1, "m1"), ("send", 0, 1, "m2"), ("recv", 0, 1), ("recv", 0, 1),
              ("ckpt", 1),
              ("send", 2, 0, "m3"), ("recv", 2, 0), ("ckpt", 0),
              ("send", 0, 1, "m4"), ("send", 1, 2, "m5"), ("recv", 1, 2), ("ckpt", 2),
              ("recv", 0, 1), ("ckpt", 1), ("send", 2, 0, "m6"), ("recv", 2, 0), ("ckpt", 0)]
    run = simulate(3, events)
    # Without forcing, the second checkpoints of all three are on Z-cycles (the final
    # checkpoints rescue the third ones, unlike in the figure).
    assert run.invalid(with_forced=False) == {(0, 2), (1, 2), (2, 2)}
    assert run.forced_before
    assert run.invalid(with_forced=True) == set()


def random_events(rng: random.Random, n: int, checkpoint_rate: float) -> list[tuple]:
    events: list[tuple] = []
    in_flight = {(p, q): 0 for p in range(n) for q in range(n) if p != q}
    for step in range(rng.randint(20, 60)):
        roll = rng.random()
        if roll < checkpoint_rate:
            events.append(("ckpt", rng.randrange(n)))
        elif roll < 0.6:
            src, dst = rng.choice(list(in_flight))
            events.append(("send", src, dst, step))
            in_flight[(src, dst)] += 1
        else:
            pending = [c for c, count in in_flight.items() if count]
            if pending:
                channel = rng.choice(pending)
                events.append(("recv", *channel))
                in_flight[channel] -= 1
    return events


def test_no_invalid_checkpoints_with_hmnr_on_random_executions():
    useless_without = 0
    for seed in range(150):
        rng = random.Random(seed)
        n = rng.randint(2, 4)
        run = simulate(n, random_events(rng, n, checkpoint_rate=0.2))
        assert run.invalid(with_forced=True) == set(), seed
        useless_without += len(run.invalid(with_forced=False))
    assert useless_without > 20   # the forcing is what made the difference


def test_no_forcing_without_basic_checkpoints():
    # Forced checkpoints only protect basic ones: with no basic checkpoint in the way,
    # no message closes a Z-cycle and HMNR stays out of the way.
    for seed in range(50):
        run = simulate(4, random_events(random.Random(seed), 4, checkpoint_rate=0.0))
        assert run.forced_before == [], seed


def busy_state() -> tuple[HmnrState, list]:
    """Process 1 of 3 after some traffic, and messages that may come next."""
    p0, p1, p2 = HmnrState(0, 3), HmnrState(1, 3), HmnrState(2, 3)
    p0.on_checkpoint()
    p1.on_receive(p0.on_send(1))
    p1.on_send(2)
    p2.on_checkpoint()
    p2.on_checkpoint()
    upcoming = [p0.on_send(1), p2.on_send(1)]
    p0.on_checkpoint()
    upcoming.append(p0.on_send(1))
    return p1, upcoming


def test_piggyback_round_trips_through_msgpack():
    sender = HmnrState(0, 3)
    sender.on_checkpoint()
    piggyback = sender.on_send(2)
    wire = msgpack.unpackb(msgpack.packb(piggyback))
    assert wire == [1, [2, 0, 0], [False, True, True], [False, True, True]]
    # p2 sent to p1 in this interval and p0 is ahead of p1: both copies force.
    direct, via_wire = HmnrState(2, 3), HmnrState(2, 3)
    for receiver, message in ((direct, piggyback), (via_wire, wire)):
        receiver.on_send(1)
        assert receiver.must_force(message)
        receiver.on_checkpoint()
        receiver.on_receive(message)
    assert direct.snapshot() == via_wire.snapshot()


def test_snapshot_restore_round_trips_and_behaves_the_same():
    state, upcoming = busy_state()
    saved = msgpack.unpackb(msgpack.packb(state.snapshot()))
    restored = HmnrState.restore(saved)
    assert restored.snapshot() == state.snapshot()
    assert restored.index == 1 and restored.checkpoint_number == 0
    decisions = [state.must_force(m) for m in upcoming]
    assert decisions == [restored.must_force(m) for m in upcoming]
    assert True in decisions and False in decisions   # the comparison is not vacuous


def test_delivering_before_the_forced_checkpoint_is_refused():
    state, upcoming = busy_state()
    forcing = next(m for m in upcoming if state.must_force(m))
    with pytest.raises(RuntimeError, match="forced checkpoint"):
        state.on_receive(forcing)
    state.on_checkpoint()
    state.on_receive(forcing)
    assert state.checkpoint_number == 1


def test_malformed_input_is_rejected():
    with pytest.raises(ValueError, match="outside 0..2"):
        HmnrState(3, 3)
    state = HmnrState(0, 3)
    with pytest.raises(ValueError, match="no peer 0"):
        state.on_send(0)
    with pytest.raises(ValueError, match="2 entries for 3 processes"):
        state.must_force((0, [0, 0], [False] * 3, [False] * 3))
