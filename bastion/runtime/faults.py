"""Faults a task carries out itself: stalls, lost frames, link outages and dropped
connections.

Kills come from outside (`bastion.scheduler.injector` terminates processes). The other
fault classes of `bastion.faults` act inside the instance they hit, so each task builds
a `TaskFaults` from the faults that name one of its chain's operators at its index,
and its loop asks it at four points:

- after an operator processed a batch, before the task sends a frame, and before it
  sends an acknowledgment message (protocol ``acks``), how long to stall (`stall_s`).
  A `bastion.faults.Timing` counts its gaps one of two ways:

  - in records (``mtbf_records``): occurrences at record counts drawn ahead from its
    seed — exponential gaps — so a call that crosses several occurrences (a whole
    batch) stalls for all of them, and the same seed stalls at the same records in
    every run. Work the instance does makes it stall: copies it receives under
    redundancy make it stall more often per second;
  - in time (``mtbf_s``, the thesis's model: a stall is something that happens to
    the machine, whatever it is processing): the instance runs for an exponential
    gap of that mean, then the next call stalls; the gap after it counts from the
    stall's end, so stalls never pile up on one another (the mean time between
    faults is up-time, as in reliability). The same seed gives the same gaps and
    magnitudes; when they strike depends on the clock;
- before a data frame is sent, whether it is lost (`drop_frame`): a
  `bastion.faults.DropFrames` decides from a stable hash of (seed, operator, instance,
  channel, records the channel carried before the frame): frames cut the same way —
  by size, from an unpaced source — lose the same records in every run;
- before a frame is sent, how long its links stay down (`link_down_for_s`): a
  `bastion.faults.LinkOutage` lays out up and down periods from its seed, timed from
  the task's start; a lossy one (``lose=True``) under a protocol that replays by
  acknowledgments loses the data frames and acknowledgments sent while it lasts
  (`ack_lost`) instead;
- before a frame goes over TCP to another worker, whether to tear its connection
  (`tear_due`): a `bastion.faults.DropConnection` is due at its ``at_s`` (or at
  exponential times from its seed), timed from the task's start; the first such frame
  after that time is cut, and the link heals (`bastion.runtime.transport`).

A task without such faults has no `TaskFaults` at all: the loop pays one ``is None``
test. What was injected is counted (`report`) and lands in `RunResult.metrics`.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

from bastion.faults import (DropConnection, DropFrames, LinkOutage, Timing, bounded_gap,
                            fault_rng, injections)


@dataclass
class _Stalls:
    """One Timing fault at one operator instance: its next occurrence, in records
    (``mtbf_records``) or in seconds since the task started (``mtbf_s``)."""
    fault: Timing
    rng: Any
    next_at: float = 0.0

    def __post_init__(self) -> None:
        self.next_at = self._gap()

    def _gap(self) -> float:
        fault = self.fault
        if fault.mtbf_s is None:
            mtbf_records = fault.mtbf_records
            assert mtbf_records is not None  # Timing.__post_init__ sets it without mtbf_s
            return self.rng.expovariate(1.0 / mtbf_records)
        return bounded_gap(self.rng, fault.mtbf_s, fault.mtbf_min_s, fault.mtbf_max_s)

    def due(self, records_done: int, elapsed_s: float) -> tuple[float, int]:
        """The seconds of the occurrences due now, and how many; none outside the
        fault's ``active_s`` (drawn all the same, so the ones inside strike where they
        would without it)."""
        if self.fault.mtbf_s is not None:
            return self._due_in_time(elapsed_s)
        stall_s, count = 0.0, 0
        active = self.fault.active_s
        while self.next_at <= records_done:
            magnitude_s = self.fault.magnitude.sample(self.rng)
            if active is None or active[0] <= elapsed_s < active[1]:
                stall_s += magnitude_s
                count += 1
            self.next_at += self._gap()
        return stall_s, count

    def _due_in_time(self, elapsed_s: float) -> tuple[float, int]:
        """At most one occurrence: the stall that came due while the instance ran (or
        idled) happens now, and the next gap counts from its end."""
        if self.next_at > elapsed_s:
            return 0.0, 0
        magnitude_s = self.fault.magnitude.sample(self.rng)
        self.next_at = elapsed_s + magnitude_s + self._gap()
        active = self.fault.active_s
        if active is None or active[0] <= elapsed_s < active[1]:
            return magnitude_s, 1
        return 0.0, 0


@dataclass
class _Outages:
    """One LinkOutage: down periods laid out lazily from the seed, in seconds since the
    task started."""
    fault: LinkOutage
    rng: Any
    down_from_s: float = 0.0
    down_until_s: float = 0.0

    def __post_init__(self) -> None:
        self._next_period(0.0)

    def _next_period(self, up_from_s: float) -> None:
        fault = self.fault
        self.down_from_s = up_from_s + bounded_gap(self.rng, fault.mtbf_s, fault.mtbf_min_s,
                                                   fault.mtbf_max_s)
        self.down_until_s = self.down_from_s + fault.repair_s(self.rng)

    @property
    def loses(self) -> bool:
        return self.fault.lose

    def down_for_s(self, elapsed_s: float) -> float:
        """Seconds from ``elapsed_s`` until the link is up (0.0: up now)."""
        while self.down_until_s <= elapsed_s:
            self._next_period(self.down_until_s)
        return self.down_until_s - elapsed_s if elapsed_s >= self.down_from_s else 0.0

    def down_since_s(self, elapsed_s: float) -> float:
        """When the outage under way at ``elapsed_s`` began (infinity: the link is up)."""
        return self.down_from_s if self.down_for_s(elapsed_s) > 0 else math.inf


@dataclass
class _Tears:
    """One DropConnection: when it is next due, in seconds since the task started."""
    fault: DropConnection
    rng: Any
    next_s: float = 0.0
    _given: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.fault.mtbf_s is None:
            at_s = self.fault.at_s
            assert at_s is not None  # DropConnection.__post_init__ sets it without mtbf_s
            self._given = list(at_s)
            self.next_s = self._given.pop(0)
        else:
            self.next_s = self._gap()

    def _gap(self) -> float:
        fault = self.fault
        assert fault.mtbf_s is not None  # asked only of a fault with a mean gap
        return bounded_gap(self.rng, fault.mtbf_s, fault.mtbf_min_s, fault.mtbf_max_s)

    def due(self, elapsed_s: float) -> bool:
        """Is a drop due at ``elapsed_s``? Occurrences that came due together (no frame
        went over TCP meanwhile) make one drop."""
        if self.next_s > elapsed_s:
            return False
        while self.next_s <= elapsed_s:
            if self.fault.mtbf_s is not None:
                self.next_s += self._gap()
            elif self._given:
                self.next_s = self._given.pop(0)
            else:
                self.next_s = float("inf")
        return True


@dataclass
class TaskFaults:
    """The injected faults of one task (see the module docstring)."""

    execute: dict[int, list[_Stalls]] = field(default_factory=dict)  # op position ->
    emit: list[_Stalls] = field(default_factory=list)
    ack: list[_Stalls] = field(default_factory=list)
    drops: list[tuple[int, DropFrames]] = field(default_factory=list)
    outages: list[_Outages] = field(default_factory=list)
    tears: list[_Tears] = field(default_factory=list)
    ident: str = ""
    started_s: float = field(default_factory=time.monotonic)  # outages count from here
    emitted_records: int = 0
    acknowledged_records: int = 0
    # what was injected
    stalls: int = 0               # occurrences of Timing faults
    stalled_s: float = 0.0
    frames_dropped: int = 0
    records_dropped: int = 0
    outage_waits: int = 0
    outage_waited_s: float = 0.0
    outage_frames_lost: int = 0   # frames a lossy outage lost (records_dropped counts theirs)
    outage_acks_lost: int = 0
    # Whether the task's protocol replays what a lossy outage loses (acks): elsewhere
    # the link heals by resending, so a lossy outage holds frames back instead.
    replays_lost: bool = False
    connections_dropped: int = 0

    @classmethod
    def for_task(cls, faults: Any, ops: list[str], index: int) -> "TaskFaults | None":
        """The faults of the chain ``ops`` at ``index``; None when it has none."""
        found = cls(ident=f"{'/'.join(ops)}[{index}]")
        for position, op in enumerate(ops):
            for number, fault in injections(faults, op, index):
                rng = fault_rng(fault.seed, number, type(fault).__name__, op, index)
                if isinstance(fault, Timing):
                    stalls = _Stalls(fault, rng)
                    if fault.phase == "execute":
                        found.execute.setdefault(position, []).append(stalls)
                    elif fault.phase == "emit":
                        found.emit.append(stalls)
                    else:
                        found.ack.append(stalls)
                elif isinstance(fault, DropFrames):
                    found.drops.append((number, fault))
                elif isinstance(fault, DropConnection):
                    found.tears.append(_Tears(fault, rng))
                else:
                    found.outages.append(_Outages(fault, rng))
        if not (found.execute or found.emit or found.ack or found.drops or found.outages
                or found.tears):
            return None
        return found

    def stall_s(self, stalls: list[_Stalls], records_done: int) -> float:
        """Seconds to stall now that ``records_done`` records went through (0.0: none)."""
        total_s = 0.0
        elapsed_s = time.monotonic() - self.started_s
        for stall in stalls:
            seconds, count = stall.due(records_done, elapsed_s)
            total_s += seconds
            self.stalls += count
        self.stalled_s += total_s
        return total_s

    def drop_frame(self, channel_id: int, first_record: int, records: int) -> bool:
        """Is the frame lost that ``channel_id`` offers after ``first_record`` records?"""
        for number, fault in self.drops:
            key = repr((0 if fault.seed is None else fault.seed, number, self.ident,
                        channel_id, first_record)).encode()
            draw = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
            if draw / 2**64 < fault.probability:
                self.frames_dropped += 1
                self.records_dropped += records
                return True
        return False

    def before_send(self, channel_id: int, first_record: int, records: int,
                    droppable: bool, buffered_s: float | None = None
                    ) -> tuple[float, bool]:
        """Before the task sends a frame holding ``records`` data records, the first
        of its elements buffered at ``buffered_s`` (monotonic; None: now): seconds to
        wait (emit stalls, a link down) and whether the frame is lost. Only a
        ``droppable`` frame — data and watermarks alone — is lost: a lost end-of-stream
        or barrier would hang the job instead of showing in its output."""
        wait_s = 0.0
        if self.emit and records:
            self.emitted_records += records
            wait_s += self.stall_s(self.emit, self.emitted_records)
        if self.outages:
            now_s = time.monotonic()
            elapsed_s = now_s - self.started_s + wait_s
            since_s = elapsed_s if buffered_s is None else buffered_s - self.started_s
            # A lossy outage never holds a droppable frame back: it is lost (a frame
            # of watermarks alone too, the next watermark supersedes it) or, emitted
            # before the link went down, goes out. Made to wait for the link, it held
            # the whole task up for the rest of the outage, so that what came in
            # meanwhile was sent late rather than lost: a stall, not the thesis's loss.
            lossy = droppable and self.replays_lost
            if lossy and self._lost_in_outage(elapsed_s, min(since_s, elapsed_s)):
                self.outage_frames_lost += records > 0
                self.records_dropped += records
                return wait_s, True
            wait_s += self.link_down_for_s(elapsed_s, but_lossy=lossy)
        lost = (bool(self.drops) and droppable and records > 0
                and self.drop_frame(channel_id, first_record, records))
        return wait_s, lost

    def _lost_in_outage(self, elapsed_s: float, since_s: float) -> bool:
        """Has one lossy outage been under way from ``since_s`` to ``elapsed_s`` (the
        same instant for an acknowledgment), under a protocol that replays what it
        loses?

        A frame is lost only if its link went down before its first record was
        emitted. The acknowledgment message that reports a record's emission is sent
        as soon as the frame that made the record is processed, while the record may
        wait in a buffer (up to ``buffer_timeout``): a frame lost for being *sent*
        after the link went down could hold a record whose emission was reported
        before — under fine acks, a tuple emitted and never taken in, whose root
        waits for the timeout and is replayed even though its copy on another
        instance got through. Lost by when it was *emitted*, it is lost together
        with that report (the thesis's link carries tuples and acknowledgments in
        order, so neither overtakes the other). A record emitted before the link
        went down still goes out; its report may be lost, which only leaves a count
        below 0."""
        return self.replays_lost and any(o.loses and o.down_since_s(elapsed_s) <= since_s
                                         for o in self.outages)

    def ack_lost(self) -> bool:
        """Is the acknowledgment message about to be sent lost to a lossy outage?"""
        elapsed_s = time.monotonic() - self.started_s
        if self.outages and self._lost_in_outage(elapsed_s, elapsed_s):
            self.outage_acks_lost += 1
            return True
        return False

    def ack_delay_s(self, records: int) -> float:
        """Seconds an acknowledgment message for ``records`` tuples is held up (an
        ``"ack"``-phase stall: the tuples are done, their acknowledgment is late)."""
        if not self.ack:
            return 0.0
        self.acknowledged_records += records
        return self.stall_s(self.ack, self.acknowledged_records)

    def link_down_for_s(self, elapsed_s: float, but_lossy: bool = False) -> float:
        """Seconds the task's links stay down from ``elapsed_s`` on (0.0: up); with
        ``but_lossy``, counting only the outages that hold frames back."""
        wait_s = max((o.down_for_s(elapsed_s) for o in self.outages
                      if not (but_lossy and o.loses)), default=0.0)
        if wait_s > 0:
            self.outage_waits += 1
            self.outage_waited_s += wait_s
        return wait_s

    def tear_due(self) -> bool:
        """Should the frame about to go over TCP tear its connection? (Asked by a
        channel to another worker only: a channel inside the worker has no connection.)"""
        if not self.tears:
            return False
        elapsed_s = time.monotonic() - self.started_s
        if not [tear for tear in self.tears if tear.due(elapsed_s)]:  # each one consumed
            return False
        self.connections_dropped += 1
        return True

    def report(self) -> dict[str, Any]:
        return {"stalls": self.stalls, "stalled_s": round(self.stalled_s, 6),
                "frames_dropped": self.frames_dropped,
                "records_dropped": self.records_dropped,
                "outage_waits": self.outage_waits,
                "outage_waited_s": round(self.outage_waited_s, 6),
                "outage_frames_lost": self.outage_frames_lost,
                "outage_acks_lost": self.outage_acks_lost,
                "connections_dropped": self.connections_dropped}
