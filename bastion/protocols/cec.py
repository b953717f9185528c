"""Continuous eventual checkpoints (CEC, Sebeou & Magoutis): the runtime protocol.

A stateful operator under CEC never stops to snapshot its state. Its state is split into
independent *parts* — one per key of ``reduce`` / ``stateful_map`` and of a count
window aggregate (a key's current count window, with the count of those it fired:
such a part never closes), one per window instance of a tumbling or sliding window
aggregate or join — and it writes its results and small *control tuples* into its
own persisted output log, ``jobs/<job>/logs/<operator>/<instance>/``
(`bastion.protocols.eventual` defines them and the reconstruction):

- ``G_open``, a part's first footprint, as the part opens (paper §III, case 1): the
  batch that opened parts writes one G_open for them all — their state after the
  batch, at the position after it; for windows, which open empty, that empty state
  (once for all of them) at the position before it — followed by the batch's
  results, in one log append, which the log stores whole or not at all. So a part's
  G_open precedes every other control tuple of it and every result it produces, and
  no recovery finds a G_open reflecting inputs whose results it lacks. Every open
  part has a footprint: N, the parts open, is the number of footprinted parts, as in
  the paper;
- ``G_check`` for the parts whose last footprint is oldest, for at most
  `CecPolicy.check_interval_s` (CI) every `CecPolicy.period_s` (CP), while the
  *extent* (log records a recovery reads back, q) exceeds ``extent_target`` (Q) or the
  inputs to replay (u) exceed ``replay_target`` (U) — the paper's targets policy
  (§III). The CI is spent in slices of a millisecond with the task's batches
  processed between them: the paper's response time "reflecting the fraction of
  operator time spent on checkpointing", without a record waiting behind the whole CI;
- ``closed`` when parts close (windows fired), after their results.

Each burst — the G_opens of one batch, the G_checks of one slice, the parts one
watermark closed — is one control tuple holding all its parts: a recovery checks and
decodes it in a few C calls, not a Python pass per part. Its parts' keys and states
are written as two *runs* (`bastion.runtime.durable`), each packed in one C call —
a time window's states straight from its tables (`Operator.part_state_tables`) — for
on fast windows a part opens every other record, and a bytes object and a packer
call per part cost a third of such a job's CPU (`benchmarks/cec.py` (d)). Windows
opened or closed together are numbered one by one: their keys are a *range* (first
and count), and the windows' G_open one state for all (`eventual`).

Every control tuple carries the operator's *position*: per upstream source instance
(``"<op code>/<index>"``), the offset of the last record processed, taken from the
records' lineage ids; and, for the deterministic merge, the records merged per input
channel (``"#<channel>"``) and the channels that had ended (``"!<channel>"``). A
footprint's state reflects exactly the inputs at or below its position.

**Recovery** (of every stateful instance when the whole job restarts; of the failed
ones alone, with what they feed, otherwise — see *Restarting the failed instance* below):

1. The coordinator reads every stateful instance's log backwards until the newest
   footprint of each of the N parts open at the failure is found (the *EC-load*) and
   takes, per source instance, the minimum position of all of them: the sources
   replay from there (an instance whose log is empty or incomplete makes them replay
   everything).
2. Each stateful instance loads its parts, restores its watermark (the minimum of its
   footprints'), and drops replayed records: those at or below the position its
   oldest footprint reflects (before they reach its merge), those a part already
   reflects (at or below that part's position), those of parts that closed after
   the footprints were written, and those of windows that had fired before. A record
   of a sliding window is in several windows, each with its own footprint: each of
   them takes it or drops it on its own (`PartedOperator.process_into`).
3. It sends its logged results downstream again, first: a result the sinks never
   committed is not lost, whatever the failure hit.
4. Sinks drop every record whose lineage id they committed before or staged since:
   results sent again, or computed again from the replay, are committed once.

Sinks commit on their own, every `checkpoint_interval_s`: a commit point holds what a
sink staged, and the lineage ids in it are what a restarted sink drops (it keeps them
in memory: a set of every id it committed).

**Restarting the failed instance** (`CecCoordinator.region_line`). A failed stateful
instance restarts with what it feeds, everything else runs on: it loads its eventual
checkpoint as in step 2, sends its logged results again (3), and its region's sinks
drop what they committed (4). Its sources keep their positions; each keeps an
*upstream backup* of its channel into it, and resends what the backup holds — the
restored instance takes the first resent frame as the channel's first and drops what
it reflects by position. The instance itself trims the backups: once a period, the
frames that hold only records at or below the offsets its flushed log would replay
after (`CecOperator.replay_position`) are no longer needed by any restart. A failure
that would need more — a failed source (every instance it feeds), a task without
state fed from outside the region, a damaged or incomplete log — restarts the job.

**Resuming** (`bn.run(..., resume_from=JOB)`): the first attempt of a new job restores
as above from an earlier job's state — the EC `bastion reconstruct` stored for it, else
its logs — copies that state (results, footprints, closings) into its own log, so its
own failures need nothing of the earlier job's, and drops what the earlier job's sinks
committed. Damage is worked around, and reported (a ``resume_set_aside`` event, a
warning of the run): a stored EC that fails its check is set aside for the log, as if
none were stored; an instance whose log is damaged starts from nothing and the sources
replay everything, since the results in a damaged record can be neither sent again
nor told apart (`resumed_state`).

**What it needs of a topology** (`CecProtocol.check` refuses the rest, naming the
operator): lineage ids (turned on for the run); at most one stateful operator on any
path; between a source and the stateful operator only ``map`` / ``filter`` in one
chain with the source, then the key edge into it — so every channel into it carries
one source instance's records in offset order, which is what makes a position per
source instance exact; keyed reduce / stateful_map, window aggregates of any window
(tumbling, sliding, count) and joins over tumbling or sliding windows (a record of a
sliding window is in several window instances, each a part: a pair is emitted once
per window the two records share, and a replayed record pairs again only in the
windows whose footprints do not reflect it);
after it, no rebalance edge (a result sent again must reach the sink instance that
may have committed it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Sequence

from bastion.errors import TopologyError, UnserialisableError, UnstorableValueError
from bastion.lineage import IdRun
from bastion.protocols import eventual
from bastion.protocols.eventual import eventual_prefix, log_prefix
from bastion.protocols.base import (Coordinator, MasterContext, PartedOperator, Protocol,
                                    ProtocolStats, RegionLine, TaskContext, TaskProtocol)
from bastion.runtime.durable import pack_rows, pack_run
from bastion.runtime.records import Batch, EndOfStream
from bastion.storage import (CorruptRecordError, LogReader, LogWriter, StorageError,
                             StoreUnavailableError)
from bastion.storage.log import gc_paused
from bastion.topology import AUTO, BROADCAST, FORWARD, HASH

_STATEFUL = ("reduce", "stateful_map", "window", "join")
_SAFE_UPSTREAM = ("map", "filter")
_NOWHERE: dict[str, int] = {}  # the position of a part without a footprint
# Parts a G_check burst packs between two looks at the clock (its slice's end).
_CHECK_CHUNK = 256
# The longest a G_check burst holds the task's loop at once: a period's CI is spent in
# slices this long, the task's batches processed between them, so a record waits
# behind one slice at most, not the whole CI.
_CHECK_SLICE_S = 0.001


@dataclass(frozen=True)
class CecPolicy:
    """When a stateful operator writes ``G_check`` tuples (paper §III–IV).

    Every ``period_s`` the operator spends at most ``check_interval_s`` writing
    ``G_check`` tuples for its parts with the oldest footprints, while the extent
    (log records from the oldest footprint to now) exceeds ``extent_target`` or the
    inputs processed since the oldest footprint exceed ``replay_target``; in slices
    of a millisecond, processing its inputs between them, so a long
    ``check_interval_s`` costs throughput, not a record's wait.
    ``CecPolicy.open_only()`` writes no ``G_check`` at all (``G_open`` and ``closed``
    only: the least overhead, the longest recovery)."""

    extent_target: float = 10_000
    replay_target: float = 100_000
    check_interval_s: float = 0.01
    period_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("extent_target", "replay_target", "check_interval_s", "period_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"CecPolicy.{name} must be a number > 0, got {value!r}")
        if self.check_interval_s > self.period_s:
            raise ValueError(f"CecPolicy.check_interval_s ({self.check_interval_s}) must "
                             f"not exceed period_s ({self.period_s})")

    @classmethod
    def open_only(cls) -> "CecPolicy":
        return cls(extent_target=math.inf, replay_target=math.inf)


#: Log bytes a task may hold not yet durable before it waits for the store: two open
#: segments' worth, what a blocking writer held at most.
MAX_UNDURABLE_BYTES = 16 * 1024 * 1024


# -- the stateful operator, wrapped ---------------------------------------------------------


class _Guard:
    """What a restored instance drops of the replay (see the module docstring, 2)."""

    def __init__(self, ec: eventual.EventualCheckpoint, parts: dict[Any, dict[str, int]],
                 closed: set, replay_from: dict[str, int], watermark: float):
        self.replay_from = replay_from      # the oldest footprint's position
        self.parts = parts                  # part -> its footprint's position
        self.closed = closed                # parts closed after the footprints
        self.watermark = watermark          # windows ending at or below it had fired
        # Once every source instance is past the newest footprint, nothing replayed
        # is left to drop: the guard switches itself off.
        positions = [*parts.values(), ec.newest_position]
        self.until = {s: max(p.get(s, -1) for p in positions)
                      for s in set().union(*positions) if "/" in s}


class CecOperator:
    """A parted stateful operator under CEC: logs its results and control tuples,
    tracks its position, drops what a replay brings that it already reflects."""

    def __init__(self, inner: PartedOperator, task: TaskContext, policy: CecPolicy,
                 log: LogWriter):
        self.inner = inner
        # The parts each call opens and closes: each gets its G_open, or its place in
        # a ``closed``, in the same log append as the call's results.
        inner.opened, inner.closed = [], []
        self.ctx = inner.ctx
        self.node = inner.node
        self.task = task
        self.policy = policy
        self.log = log
        self.codec = task.state_codec
        # The position now: a new dict per batch, never changed after (a burst's
        # footprints share it). "#<channel>" and "!<channel>" come from
        # `channel_counts`, which the task half keeps as the merge consumes.
        self.position: dict[str, int] = {}
        self.channel_counts: dict[str, int] = {}
        self.guard: _Guard | None = None
        # Every open part -> the log seq of its newest footprint, oldest first: a part
        # has one from the batch that opened it (its G_open). Nothing else per part:
        # a burst packs its parts' keys afresh, in one run (the same bytes each time).
        self.footprints: dict[Any, int] = {}
        # The operator's batched part state, if it has one (a time window's tables).
        self.state_tables = getattr(inner, "part_state_tables", None)
        # Where parts open empty, the one state every G_open names (`_g_open`), packed.
        self.empty_state = (self._run([inner.empty_part_state()], "its state")
                            if inner.opens_empty else None)
        self.records_in = 0
        self.dropped = 0
        self.checks_written = 0
        self.next_period_s = time.monotonic() + policy.period_s
        self.check_left_s = 0.0  # of this period's CI (`check`)
        # The position each burst of footprints carried and the inputs processed by
        # then, by the log seq its parts note (`footprints`), and the newest control
        # tuple's position: what a recovery from the log as it stands would replay
        # after (`replay_position`), and how much (`check`).
        self.bursts: dict[int, tuple[dict[str, int], int]] = {}
        self.newest_control: dict[str, int] | None = None

    # the operator interface the task calls
    parted = False

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        ids = batch.ids
        if type(ids) is not IdRun:
            raise TopologyError(
                f"operator {self.ctx.name!r} received records without their source "
                "positions (a flat_map, join or union upstream): protocol 'cec' needs "
                "map/filter only between a source and a stateful operator")
        # A record the guard drops is reflected already (or belongs nowhere): the
        # position moves past it all the same, in step with the merge's counts.
        before = (self.position, self.records_in)
        position = dict(self.position)
        position[f"{ids.source}/{ids.instance}"] = ids.positions[-1]
        position.update(self.channel_counts)
        self.position = position
        inner = self.inner
        into = None
        guard = self.guard
        if guard is not None:
            source = f"{ids.source}/{ids.instance}"
            if inner.overlapping:
                batch, into = self._drop_replayed_windows(guard, batch, ids.positions, source)
            else:
                batch = self._drop_replayed(guard, batch, ids.positions, source)
            if not len(batch):
                return None
        self.records_in += len(batch)
        out = (inner.process(batch, input_index) if into is None
               else inner.process_into(batch, into, input_index))
        records = []
        opened = inner.opened
        if opened:
            # The paper's G_open, written as the part opens: one burst for the parts
            # this batch opened (`_g_open`). It goes first, then the batch's results,
            # in one append — which the log stores whole or not at all (a flush or a
            # seal takes what the appends before it left), so no recovery finds a
            # G_open reflecting inputs whose results it lacks.
            inner.opened = []
            opening = self._g_open(opened, before)
            if opening is not None:
                records.append(opening)
        if out is not None:
            records += self._results(out)
        self._append(records)
        return out

    def on_watermark(self, watermark: float) -> Batch | None:
        return self._closing(lambda: self.inner.on_watermark(watermark))

    def on_end(self) -> Batch | None:
        return self._closing(self.inner.on_end)

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, state: Any) -> None:
        self.inner.restore(state)

    @property
    def keyed(self) -> bool:
        return self.inner.keyed

    def _closing(self, fire: Any) -> Batch | None:
        out = fire()
        records = self._results(out)
        gone = self.inner.closed
        if gone:
            # Every open part has a footprint (its G_open at least): those that
            # closed leave N in one control tuple, after their results.
            # (A part without one — none so far — is left out, in one C pass.)
            seqs = list(map(self.footprints.pop, gone, repeat(None)))
            closing = gone if None not in seqs else [
                part for part, seq in zip(gone, seqs) if seq is not None]
            if closing:
                self.newest_control = self.position
                records.append(eventual.burst(
                    eventual.CLOSED, self._keys(closing), None,
                    len(self.footprints), self.position, self.task_watermark()))
            gone.clear()
        self._append(records)
        return out

    # -- the log ------------------------------------------------------------------------------

    def task_watermark(self) -> float:
        return float(self.task.watermark)

    # A part's key and state are packed, not sealed: the control tuple's CRC covers them.
    def _pack_many(self, values: list, what: str = "its state") -> list[bytes]:
        try:
            return self.codec.pack_many(values)
        except UnserialisableError as exc:  # a user error: name the operator and type
            raise UnstorableValueError(self.ctx.name, self.ctx.index, exc.type_name,
                                       f"{what} cannot be logged", str(exc)) from None

    def _append(self, records: list) -> None:
        """Append log record values in order, one call for all of them."""
        if records:
            now_s = time.time()
            self.log.append_many([(now_s, value) for value in records])

    def _results(self, out: Batch | None) -> list:
        """The log record of a batch of results (one record holds the whole batch), in
        the operator's own form of them (`PartedOperator.results_form`); packed, not
        sealed: the log checks every record's CRC."""
        if out is None or not len(out):
            return []
        return [eventual.result(self._pack_many([self.inner.results_form(out)],
                                                "its results")[0])]

    def _run(self, values: list, what: str) -> bytes:
        """``values`` as a run (`durable.pack_run`): the user's error if one cannot be
        logged, naming the operator."""
        try:
            return pack_run(self.codec, values)
        except UnserialisableError as exc:
            raise UnstorableValueError(self.ctx.name, self.ctx.index, exc.type_name,
                                       f"{what} cannot be logged", str(exc)) from None

    def _keys(self, parts: list) -> bytes:
        """The column of ``parts``' keys: a range where they are consecutive ints (the
        windows a batch opened or a watermark closed), else a run. (A G_check joins
        runs of chunks: its keys are a run.)"""
        return eventual.key_column(parts) or self._run(parts, "its keys")

    def _states(self, parts: list) -> bytes | None:
        """The run of ``parts``' states as they are now: from the operator's tables
        in one C call where it has them (None if a part is not in them: not open),
        else part by part."""
        tables = None if self.state_tables is None else self.state_tables()
        if tables is not None:
            try:
                return pack_rows(self.codec, parts, tables)
            except UnserialisableError as exc:
                raise UnstorableValueError(self.ctx.name, self.ctx.index, exc.type_name,
                                           "its state cannot be logged", str(exc)) from None
        part_state = self.inner.part_state
        return self._run([part_state(part) for part in parts], "its state")

    def _g_open(self, opened: list, before: tuple[dict[str, int], int]) -> list | None:
        """The G_open burst of the parts a batch opened; None if none is open. Parts
        that open empty (windows) are named with that state at the position
        ``before`` the batch (and the inputs processed by then): what each was then,
        not having opened yet — the paper's G_open is the state after the input
        that opened the part, and this is the same recovery point one batch earlier,
        whose state, the same for all, is written once for the burst instead of a
        state per part (half the log of fast sliding windows: `benchmarks/cec.py`
        (d)). A window lists each part it opens once, and it is open until a
        watermark comes. Other parts (a keyed fold's) are named with their state as
        it is now: as the operator's tables have it, or — a fold lists a key whose
        first input the function refused, which has no state, and may list it
        twice — those `open_among` finds."""
        empty = self.empty_state
        if empty is not None:
            return self._burst(eventual.G_OPEN, opened, self._keys(opened), empty,
                               at=before)
        if self.state_tables is not None:
            states = self._states(opened)
            if states is not None:
                return self._burst(eventual.G_OPEN, opened, self._keys(opened), states)
        parts = self.inner.open_among(dict.fromkeys(opened))
        if not parts:
            return None
        states = self._states(parts)
        assert states is not None   # open_among found each in the operator's state
        return self._burst(eventual.G_OPEN, parts, self._keys(parts), states)

    def _burst(self, kind: int, parts: list, keys: bytes, states: bytes,
               at: tuple[dict[str, int], int] | None = None) -> list:
        """The value of a burst of footprints of ``parts`` (distinct; the caller
        appends it), whose keys and states are the runs ``keys`` and ``states`` (one
        state: every part's), at the position now or at ``at``'s, with the inputs
        processed by then. Their seq is noted as the log's next one: a few records
        early at most, which only the policy's estimate of the extent sees."""
        seq, footprinted = self.log.next_seq, self.footprints
        position, records_in = (self.position, self.records_in) if at is None else at
        self.bursts[seq] = (position, records_in)
        self.newest_control = position
        if kind == eventual.G_CHECK:
            for part in parts:  # refreshed: to the end of the order
                del footprinted[part]
            self.checks_written += len(parts)
        footprinted |= dict.fromkeys(parts, seq)   # in C, no pair per part
        return eventual.burst(kind, keys, states, len(footprinted), position,
                              self.task_watermark())

    def check(self) -> None:
        """Between batches: in each period, spend up to the policy's CI refreshing the
        oldest footprints while the extent or the replay exceeds its target — in slices
        of at most `_CHECK_SLICE_S`, one G_check burst each, with the batches that
        arrive meanwhile processed between them. One 10 ms burst held the task's loop
        for all of it: every record arriving during it waited (a p99 of 10 ms where
        `none` has 1.4, `benchmarks/cec.py` (g))."""
        now_s = time.monotonic()
        policy = self.policy
        if now_s >= self.next_period_s:
            if self.check_left_s > 0:
                # The last period's burst did not end (few batches came to run its
                # slices between): its budget lapses, and what it wrote is stored now,
                # so the log is stored once a period whatever the input's pace.
                self._flush()
            self.next_period_s = now_s + policy.period_s
            self.check_left_s = policy.check_interval_s
        if self.check_left_s <= 0:
            return
        slice_end_s = now_s + min(self.check_left_s, _CHECK_SLICE_S)
        # The burst's parts, oldest footprint first, packed a chunk at a time as they
        # are chosen so that the slice's end bounds the work (runs joined are one
        # run); their footprints are refreshed (moved to the end of `footprints`) by
        # the one control tuple that holds them all.
        stale: list = []
        keys: list[bytes] = []
        states: list[bytes] = []
        chunk: list = []
        bursts, next_seq, records_now = self.bursts, self.log.next_seq, self.records_in
        met = True   # no part left that a target wants refreshed
        for part, seq in self.footprints.items():
            if (next_seq - seq <= policy.extent_target
                    and records_now - bursts[seq][1] <= policy.replay_target):
                break
            chunk.append(part)
            if len(chunk) == _CHECK_CHUNK:
                self._pack_chunk(chunk, stale, keys, states)
                chunk = []
                if time.monotonic() >= slice_end_s:
                    met = False
                    break
        if chunk:
            self._pack_chunk(chunk, stale, keys, states)
        if stale:
            self._append([self._burst(eventual.G_CHECK, stale, b"".join(keys),
                                      b"".join(states))])
        self.check_left_s = 0.0 if met else self.check_left_s - (time.monotonic() - now_s)
        if self.check_left_s <= 0:
            self._flush()   # the period's burst is over

    def _flush(self) -> None:
        """What the log holds becomes durable once a period: a recovery finds the
        footprints written up to here (and replays what came after). Stored in the
        background: the task's loop runs every task of its worker, and the store may
        take seconds (`CecTask.between_frames` waits when it falls behind)."""
        if self.log.durable_seq < self.log.next_seq - 1:
            self.log.flush_in_background()

    def _pack_chunk(self, chunk: list, stale: list, keys: list[bytes],
                    states: list[bytes]) -> None:
        """Add ``chunk``, open parts, to a G_check burst under way."""
        packed = self._states(chunk)
        assert packed is not None   # every part with a footprint is open
        stale += chunk
        keys.append(self._run(chunk, "its keys"))
        states.append(packed)

    def replay_position(self) -> dict[str, int] | None:
        """Per source instance, the offset a recovery would replay after if the
        instance failed now, with its log durable up to here: the eventual
        checkpoint's ``replay_from`` (`eventual.EventualCheckpoint.replay_from`). A
        position only grows along the log, so the minimum over the parts'
        footprints and the newest control tuple is the oldest footprint's, or the
        newest control tuple's when it is older or no part has one. None while the
        log holds no control tuple, or a loaded footprint's position is not known
        here: a recovery then replays more than this instance can say."""
        newest = self.newest_control
        if newest is None or self.log.durable_seq < self.log.next_seq - 1:
            return None
        positions = [newest]
        if self.footprints:
            oldest_seq = next(iter(self.footprints.values()))
            oldest = self.bursts.get(oldest_seq)
            if oldest is None:
                return None
            for seq in [s for s in self.bursts if s < oldest_seq]:
                del self.bursts[seq]  # no footprint notes it any more
            positions.append(oldest[0])
        return {s: min(p.get(s, -1) for p in positions)
                for s in set().union(*positions) if "/" in s}

    # -- a restored instance -------------------------------------------------------------------

    def load(self, ec: eventual.EventualCheckpoint, replay_from: dict[str, int]) -> None:
        parts: dict[Any, dict[str, int]] = {}
        # Two objects per part, by the hundred thousand, none in a cycle: the
        # collector would walk them all again and again (2-3x the load time).
        with gc_paused():
            for part, state, fp in zip(*eventual.decode_parts(self.codec, ec)):
                self.inner.load_part(part, state)
                parts[part] = fp.position
                self.footprints[part] = fp.seq
                self.bursts.setdefault(fp.seq, (fp.position, 0))
        self.newest_control = ec.newest_position
        closed = set(self.codec.unpack_many(list(ec.closed), "eventual checkpoint part"))
        self.position = {s: p for s, p in replay_from.items() if "/" in s}
        # no watermark in the checkpoint: the operator starts from nothing, and no
        # window has fired yet
        self.guard = _Guard(ec, parts, closed, replay_from,
                            -math.inf if ec.watermark is None else ec.watermark)

    def adopt_savepoint(self, position: dict[str, int]) -> None:
        """Start this (empty) log from a savepoint's state, which the operator holds
        already (`bastion.runtime.savepoint`): one G_open burst of every open part at
        the savepoint's ``position`` — what a recovery reads back for each part until
        it has a newer footprint, and why the job's restarts need no savepoint."""
        self.position = dict(position)
        self.newest_control = self.position
        parts = self.inner.open_parts()
        if parts:
            states = self._states(parts)
            assert states is not None  # every part is open
            self._append([self._burst(eventual.G_OPEN, parts, self._keys(parts),
                                      states)])
        self.log.flush()

    def adopt(self, logged: list, ec: eventual.EventualCheckpoint | None) -> None:
        """Start this (empty) log from an earlier job's: its results, then the loaded
        footprints as they were, then the parts closed after them — what a recovery of
        this job reads back as long as it has written no newer footprint."""
        now_s = time.time()
        if logged:
            self.log.append_many([(now_s, value) for value in logged])
        if ec is not None and ec.complete and ec.parts:
            n_open = len(ec.parts)
            # a burst per record they came from: its parts share a position and a
            # watermark
            bursts: dict[int, list] = {}
            for part, fp in reversed(ec.parts.items()):  # oldest first (see decode_parts)
                bursts.setdefault(fp.seq, []).append((part, fp))
            for burst in bursts.values():
                first = burst[0][1]
                seq = self.log.append(now_s, eventual.footprints(
                    eventual.G_CHECK, [part for part, _ in burst],
                    [fp.state for _, fp in burst], n_open, first.position,
                    first.watermark))
                self.bursts[seq] = (first.position, 0)
                for part, _ in burst:
                    self.footprints[self.codec.unpack(part, "part")] = seq
            if ec.closed:
                self.log.append(now_s, eventual.closed(sorted(ec.closed), n_open,
                                                       ec.newest_position,
                                                       ec.newest_watermark))
        self.log.flush()

    def _drop_replayed(self, guard: _Guard, batch: Batch, positions: Sequence[int],
                       source: str) -> Batch:
        if positions[0] > guard.until.get(source, -1):
            if all(self.position.get(s, -1) >= p for s, p in guard.until.items()):
                self.guard = None
            return batch
        base = guard.replay_from.get(source, -1)
        parts, closed, watermark = guard.parts, guard.closed, guard.watermark
        retired = self.inner.part_retired
        keep = []
        for i, (part, pos) in enumerate(zip(self.inner.parts_of(batch), positions)):
            if pos <= base or part in closed or retired(part, watermark):
                continue
            footprint = parts.get(part)
            if footprint is not None and pos <= footprint.get(source, -1):
                continue
            keep.append(i)
        if len(keep) < len(batch):
            self.dropped += len(batch) - len(keep)
            batch = batch.take(keep)
        return batch

    def _drop_replayed_windows(self, guard: _Guard, batch: Batch, positions: Sequence[int],
                               source: str) -> tuple[Batch, list | None]:
        """`_drop_replayed` for an operator whose records go into several parts (a
        sliding window): each of a record's windows keeps or drops it on its own, as
        its footprint's position, its closing and the watermark say. The batch of the
        records some window keeps, and the windows each goes into (None: all of them,
        the guard having switched itself off)."""
        if positions[0] > guard.until.get(source, -1):
            if all(self.position.get(s, -1) >= p for s, p in guard.until.items()):
                self.guard = None
            return batch, None
        base = guard.replay_from.get(source, -1)
        parts, closed, watermark = guard.parts, guard.closed, guard.watermark
        retired = self.inner.part_retired
        keep, into = [], []
        for i, (windows, pos) in enumerate(zip(self.inner.windows_of(batch), positions)):
            if pos <= base:
                continue
            kept = [k for k in windows
                    if not (k in closed or retired(k, watermark)
                            or pos <= parts.get(k, _NOWHERE).get(source, -1))]
            if kept:
                keep.append(i)
                into.append(kept)
        if len(keep) < len(batch):
            self.dropped += len(batch) - len(keep)
            batch = batch.take(keep)
        return batch, into


def instance_ec(store: Any, job: str, operator: str, index: int, stored: bool
                ) -> eventual.EventualCheckpoint:
    """An instance's eventual checkpoint in job ``job``. ``stored``: the job resumes
    an earlier job's state (`resumed_state`: the EC `bastion reconstruct` stored for
    it, at any log time, or else its log); otherwise this job's own log."""
    if stored:
        return resumed_state(store, job, operator, index, results=False).ec
    ec, _ = eventual.read_eventual_checkpoint(store, log_prefix(job, operator, index))
    return ec


@dataclass
class ResumedState:
    """What a resumed job takes of one instance of the earlier job: its EC, the
    result records its log holds up to it, and what was set aside and why (None:
    nothing)."""

    ec: eventual.EventualCheckpoint
    results: list
    set_aside: str | None = None


def resumed_state(store: Any, job: str, operator: str, index: int, *,
                  results: bool = True) -> ResumedState:
    """The state of instance ``index`` of ``operator`` in the earlier job ``job``, as
    a job resuming it loads it (``results``: with the result records to send again).

    The EC `bastion reconstruct` stored is preferred to the log's (it may be of an
    earlier log time); a stored EC that fails its check is set aside and the log's
    read instead, as when none was stored. The log itself is read whole — the results
    it holds go to the sinks again — and must be intact: results lost in a damaged
    record could be neither sent again nor recomputed from a footprint that reflects
    them, so an instance whose log is damaged (or has a record missing) starts from
    nothing instead and the sources replay everything; its sinks still drop what the
    earlier job committed, so every output is committed once. The coordinator and
    each task call this with the same store, so they set aside the same things and
    agree on where the sources replay from."""
    prefix = log_prefix(job, operator, index)
    logged: list[tuple[int, Any]] = []
    try:
        for seq, _, value in LogReader(store, prefix).records():
            if results and eventual.is_result(value):
                logged.append((seq, value))
    except StoreUnavailableError:
        raise  # the store is down, not the log damaged: the job fails and says so
    except StorageError as exc:
        return ResumedState(eventual.EventualCheckpoint(complete=False), [],
                            f"its log is damaged ({exc}): it starts from nothing and the "
                            "sources replay everything")
    set_aside = None
    try:
        ec = eventual.load_eventual_checkpoint(store, eventual_prefix(job, operator,
                                                                      str(index)))
    except CorruptRecordError as exc:
        ec, set_aside = None, f"{exc}; its state was read from its log instead"
    if ec is None:
        ec, _ = eventual.read_eventual_checkpoint(store, prefix)
    return ResumedState(ec, [value for seq, value in logged if seq <= ec.seq], set_aside)


def logged_results(store: Any, job: str, operator: str, index: int,
                   ec: eventual.EventualCheckpoint) -> list:
    """The result records of an instance's log up to its EC (the whole log is read:
    which of them the sinks committed only the sinks know)."""
    if ec.seq < 0:
        return []
    return [value for seq, _, value in
            LogReader(store, log_prefix(job, operator, index)).records()
            if seq <= ec.seq and eventual.is_result(value)]


# -- the task half ---------------------------------------------------------------------------


class CecTask(TaskProtocol):
    def __init__(self, task: TaskContext, policy: CecPolicy):
        super().__init__(task)
        self.policy = policy
        # Upstream backups (kept when a failure restarts part of the job): per input,
        # the frames taken since the last trim, (seq, newest source position in it),
        # and the trim last sent to the input's sender.
        self.frames_in: dict[int, deque[tuple[int, float, str | None]]] = {}
        self.trimmed: dict[int, int] = {}
        self.trims: set[asyncio.Future] = set()
        self.next_trim_s = time.monotonic()
        self.operator: CecOperator | None = None
        self.operator_name: str | None = None
        self.drop_below: dict[str, int] | None = None  # before the merge, on restore
        self.resend: list[Batch] = []
        self.consumed: dict[int, int] = {}   # records merged per input channel
        self.ended: set[int] = set()
        self.last_commit_s = time.monotonic()
        self.commits = 0

    async def restore(self, recovery_line: Any) -> None:
        task = self.task
        if isinstance(recovery_line, RegionLine):  # restarted with part of the job
            recovery_line = recovery_line.line
            for channel_id in recovery_line["resync"].get(task.task_id, ()):
                task.inputs.resync(channel_id)
        found = task.chain.parted_operator()
        if found is not None:
            name, inner = found
            store = task.state.object_store()
            ec, logged = None, []
            if recovery_line is not None:
                # this job's own log after a failure, or the earlier job's it resumes
                state_job = recovery_line["state_job"]
                if state_job != task.job_id:  # resuming: the log is read once, whole
                    resumed = await asyncio.to_thread(resumed_state, store, state_job,
                                                      name, task.index)
                    ec, logged = resumed.ec, resumed.results
                else:
                    ec = await asyncio.to_thread(instance_ec, store, state_job, name,
                                                 task.index, False)
                    logged = await asyncio.to_thread(logged_results, store, state_job,
                                                     name, task.index, ec)
            log = await asyncio.to_thread(LogWriter, store,
                                          log_prefix(task.job_id, name, task.index),
                                          blocking=False)
            self.operator = CecOperator(inner, task, self.policy, log)
            self.operator_name = name
            task.chain.replace_operator(name, self.operator)
            self.resend = [self._batch(value) for value in logged]
            if ec is not None and ec.complete and ec.seq >= 0:
                self._load(ec)
            if recovery_line is not None and recovery_line["state_job"] != task.job_id:
                # A resumed job's log must stand on its own for its own failures: it
                # starts with the earlier job's results and the footprints loaded.
                await asyncio.to_thread(self.operator.adopt, logged, ec)
        if recovery_line is None:
            savepoint_position = task.state.savepoint_position()
            if savepoint_position is not None and self.operator is not None:
                await asyncio.to_thread(self.operator.adopt_savepoint, savepoint_position)
            await task.sinks.reapply_commits()
            return
        task.sources.rewind(recovery_line["replay_from"])
        await task.sinks.deduplicate(recovery_line["dedup_jobs"])

    def _load(self, ec: eventual.EventualCheckpoint) -> None:
        task, replay_from, operator = self.task, ec.replay_from, self.operator
        # only a complete checkpoint of a stateful instance is loaded
        assert operator is not None and replay_from is not None
        operator.load(ec, replay_from)
        task.chain.set_watermark(-math.inf if ec.watermark is None else ec.watermark)
        self.drop_below = {s: p for s, p in replay_from.items() if "/" in s}
        self.consumed = {int(s[1:]): p for s, p in replay_from.items() if s.startswith("#")}
        self.ended = {int(s[1:]) for s, p in replay_from.items()
                      if s.startswith("!") and p > 0}
        counts = operator.channel_counts
        counts.update({f"#{c}": n for c, n in self.consumed.items()})
        counts.update({f"!{c}": 1 for c in self.ended})
        operator.position = {**operator.position, **counts}
        if task.merge is not None:
            task.merge.resume(self.consumed, self.ended)
            task.inputs.end(self.ended)

    def _batch(self, value: Any) -> Batch:
        assert self.operator is not None   # logged results: a stateful instance's
        form = self.task.state_codec.unpack(value[1], "logged results")
        return self.operator.inner.results_batch(form)

    async def on_start(self) -> None:
        # Results the log holds go downstream again first: the sinks keep each once.
        resend, self.resend = self.resend, []
        if resend:
            assert self.operator_name is not None   # results: a stateful instance's
            for batch in resend:
                await self.task.chain.emit_after(self.operator_name, batch)

    async def on_frame(self, channel_id: int, seq: int, frame: list) -> None:
        if self.operator is not None:
            self._note_frame(channel_id, seq, frame)
        drop_below = self.drop_below
        if drop_below is None:
            return
        # Replayed records this instance reflects in full never enter the merge: it
        # resumes where the oldest footprint left it (`CecOperator.load`).
        for i, element in enumerate(frame):
            if type(element) is Batch and type(element.ids) is IdRun and len(element):
                ids = element.ids
                below = drop_below.get(f"{ids.source}/{ids.instance}", -1)
                if ids.positions[0] <= below:
                    keep = [j for j, p in enumerate(ids.positions) if p > below]
                    frame[i] = element.take(keep)

    def _note_frame(self, channel_id: int, seq: int, frame: list) -> None:
        """Remember the newest source position a frame of an input carried (a frame
        with an end of stream counts as never reflected: a restored instance must
        get it again)."""
        newest: float = -1
        source: str | None = None
        for element in frame:
            if type(element) is Batch:
                ids = element.ids
                if type(ids) is IdRun and len(element):
                    newest, source = ids.positions[-1], f"{ids.source}/{ids.instance}"
            elif type(element) is EndOfStream:
                newest = math.inf
        self.frames_in.setdefault(channel_id, deque()).append((seq, newest, source))

    def _trim_senders(self) -> None:
        """Tell each input's sender which frames no restart of this task will ask
        for again, so its upstream backup forgets them. A stateful instance needs
        again the frames that hold records after the offsets its log would replay
        after (`CecOperator.replay_position`); a task without state restarts only
        with what feeds it, so it needs none it took."""
        task = self.task
        trims: dict[int, list] = {}
        if self.operator is None:
            for channel_id in task.inputs.ids():
                below = task.inputs.last_received(channel_id) + 1
                if below > self.trimmed.get(channel_id, 0):
                    self.trimmed[channel_id] = below
                    trims.setdefault(task.inputs.sender_of(channel_id), []).append(
                        [channel_id, below])
        else:
            replay = self.operator.replay_position()
            if replay is None:
                return
            for channel_id, frames in self.frames_in.items():
                below = None
                # a frame without a source position is never reflected ("" is no source)
                while frames and frames[0][1] <= replay.get(frames[0][2] or "", -1):
                    below = frames.popleft()[0] + 1
                if below is not None and below > self.trimmed.get(channel_id, 0):
                    self.trimmed[channel_id] = below
                    trims.setdefault(task.inputs.sender_of(channel_id), []).append(
                        [channel_id, below])
        for sender, entries in trims.items():
            task.send_acks(sender, entries)

    def on_acks(self, entries: list) -> None:
        # Trims from this task's receivers (`_trim_senders`).
        for channel_id, below in entries:
            trim = asyncio.ensure_future(self.task.outputs.trim_sent(channel_id, below))
            self.trims.add(trim)
            trim.add_done_callback(self.trims.discard)

    def on_batch(self, channel_id: int, batch: Batch) -> Batch | None:
        if self.operator is not None:
            self.consumed[channel_id] = count = self.consumed.get(channel_id, 0) + len(batch)
            self.operator.channel_counts[f"#{channel_id}"] = count
        return batch

    async def on_input_ended(self, channel_id: int) -> None:
        if self.operator is not None:
            self.operator.channel_counts[f"!{channel_id}"] = 1

    async def between_frames(self) -> None:
        if self.operator is not None:
            self.operator.check()
            log = self.operator.log
            if log.undurable_bytes > MAX_UNDURABLE_BYTES:
                # The store fell behind the task: this task waits for its upload (its
                # coroutine, not the loop — other tasks and heartbeats go on), so
                # what a crash would lose stays bounded.
                await asyncio.to_thread(log.wait_uploaded)
        now_s = time.monotonic()
        if now_s >= self.next_trim_s:
            self.next_trim_s = now_s + self.policy.period_s
            self._trim_senders()
        interval_s = self.task.checkpoint_interval_s
        if interval_s is not None and now_s - self.last_commit_s >= interval_s:
            self.last_commit_s = now_s
            task = self.task
            # Unique per task and generation (attempt + incarnation: each restart of
            # the task moves one on): sinks commit on their own, no alignment.
            generation = task.attempt + task.incarnation
            commit = ((generation * 1_000_000 + self.commits) * task.task_count
                      + task.task_id + 1)
            self.commits += 1
            if await task.sinks.stage(commit):
                task.state.acknowledge(commit, None, {"commit": True})

    async def on_finished(self) -> None:
        if self.operator is not None:
            # Durable, not sealed: a flush stores only what came since the last
            # period (and waits for a seal under way), where a close rewrote the
            # whole open segment (up to 8 MiB) in the task's last moment — a fixed
            # cost of tens of ms on every run (benchmarks/cec.py (d)). Readers and the
            # next writer take the parts as they are. In a thread: the task's loop
            # runs the worker's other tasks.
            await asyncio.to_thread(self.operator.log.flush)

    def on_stop(self) -> None:
        if self.operator is not None:
            try:
                # Failed or cancelled: what was appended is stored if nothing is in
                # flight, without waiting (finished: `on_finished` stored it all).
                self.operator.log.flush_in_background()
            except StorageError:
                # The tail stays not durable: a recovery replays from an older
                # footprint. The task is ending already; its own error (if any) is
                # the one to report.
                pass


# -- the coordinator ---------------------------------------------------------------------------


class CecCoordinator(Coordinator):
    """Commits sink outputs as sinks stage them, and after a failure reads every
    stateful instance's eventual checkpoint to tell the sources where to replay from."""

    def __init__(self, master: MasterContext):
        super().__init__(master)
        self.attempt = -1
        self.committing = asyncio.Lock()
        self.pending: set[asyncio.Task] = set()
        self.committed: set[int] = set()
        self.ec_loads = 0
        self.extent_records_last: int | None = None
        self.ec_load_s_last: float | None = None

    def start(self, attempt: int) -> None:
        self.attempt = attempt

    async def stop(self) -> None:
        self.attempt = -1   # acknowledgments still on their way no longer count
        # A commit under way finishes before the restart reads what is committed.
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    def on_acknowledge(self, attempt: int, task_id: int, checkpoint_id: int,
                       ref: Any, meta: Any) -> None:
        if attempt != self.attempt or not (meta and meta.get("commit")):
            return
        job = asyncio.ensure_future(self._commit(attempt, checkpoint_id))
        self.pending.add(job)
        job.add_done_callback(self.pending.discard)

    async def _commit(self, attempt: int, commit: int) -> None:
        async with self.committing:
            if attempt != self.attempt:
                return
            await self.master.commit_outputs(commit)
            self.committed.add(commit)

    async def on_job_finished(self, task_reports: list[dict[str, Any]]) -> None:
        # A sink's acknowledgment can arrive after the watch ended (the coordinator
        # stopped): its commit point is final all the same — commit it, or its records
        # are never visible.
        staged = set().union(*(r["staged_commits"] for r in task_reports))
        async with self.committing:
            for commit in sorted(staged - self.committed):
                await self.master.commit_outputs(commit)
                self.committed.add(commit)

    async def initial_line(self) -> Any:
        resumed = self.master.resume_from
        return None if resumed is None else await self._line(resumed)

    async def recovery_line(self) -> Any:
        return await self._line(self.master.job_id)

    async def region_line(self, tasks: set[int]) -> RegionLine | None:
        """The line of a restart of ``tasks`` alone: the failed tasks and everything
        downstream of them. Each restored stateful instance loads its eventual
        checkpoint as after any failure; what feeds it from outside — its sources,
        which keep running — is sent again out of their upstream backups, which
        hold every frame after the offsets its log replays after
        (`CecTask._trim_senders`), and it drops what it reflects by position. A
        source in the region rewinds to what the region's stateful instances need,
        and the region's sinks drop what they committed. None — the whole job
        restarts, its sources rewinding — when something outside feeds a task of
        the region that has no state to rebuild (the backup is trimmed as its
        receiver takes frames, not as sinks commit them), or when a restored
        instance's log is damaged or incomplete (its backup may hold less than the
        older position its log now needs)."""
        master = self.master
        kinds = {name: kind for name, (kind, _) in master.operators().items()}
        instances = master.instances()
        resync: dict[int, list[int]] = {}
        for channel_id, (src, dst) in master.channels().items():
            if dst in tasks and src not in tasks:
                if kinds[instances[dst][0][0]] not in _STATEFUL:
                    return None
                resync.setdefault(dst, []).append(channel_id)
        # A commit under way completes first: the region's sinks read what is
        # committed when they restore, and drop it.
        await self._settle_commits()
        line = await self._line(master.job_id, {i for t in tasks for i in instances[t]})
        if line["damaged"] or line["replay_everything"]:
            return None
        await self._settle_commits()
        line["resync"] = resync
        return RegionLine(line, {})

    async def _settle_commits(self) -> None:
        while self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    async def _line(self, state_job: str, only: set[tuple[str, int]] | None = None
                    ) -> dict[str, Any]:
        """Where the sources replay from so that every stateful instance (of
        ``only``, if given), restored from its eventual checkpoint in ``state_job``,
        gets what it lacks."""
        master = self.master
        store = master.object_store()
        started_s = time.monotonic()
        positions: list[dict[str, int]] = []
        everything = damaged = False
        extent = 0
        for name, (kind, parallelism) in master.operators().items():
            if kind not in _STATEFUL:
                continue
            for index in range(parallelism):
                if only is not None and (name, index) not in only:
                    continue
                if state_job != master.job_id:  # resuming an earlier job
                    resumed = await asyncio.to_thread(resumed_state, store, state_job,
                                                      name, index, results=False)
                    ec = resumed.ec
                    if resumed.set_aside is not None:
                        master.record_event("resume_set_aside", job=state_job,
                                            operator=name, instance=index,
                                            reason=resumed.set_aside)
                else:
                    ec = await asyncio.to_thread(instance_ec, store, state_job, name,
                                                 index, False)
                if ec.skipped:
                    damaged = True
                    master.record_event("log_damaged", operator=name, instance=index,
                                        skipped=len(ec.skipped))
                if ec.seq < 0 or ec.replay_from is None:
                    everything = True  # nothing (or not all) of its state is logged
                    continue
                extent += ec.extent_records
                positions.append({s: p for s, p in ec.replay_from.items() if "/" in s})
        # Per source instance, the oldest position any stateful instance needs; one
        # that never heard from a source needs all of it (-1).
        sources = set().union(*positions) if positions else set()
        replay_from = {} if everything else {
            s: min(p.get(s, -1) for p in positions) for s in sources}
        self.ec_loads += 1
        self.extent_records_last = extent
        self.ec_load_s_last = time.monotonic() - started_s
        master.record_event("eventual_checkpoint_loaded", job=state_job,
                            extent_records=extent, seconds=self.ec_load_s_last,
                            replay_everything=everything)
        dedup_jobs = [master.job_id] + ([master.resume_from] if master.resume_from else [])
        return {"replay_from": replay_from, "state_job": state_job,
                "dedup_jobs": dedup_jobs, "summary": "eventual", "damaged": damaged,
                "replay_everything": everything}

    def stats(self, final_counters: Any = None) -> ProtocolStats:
        return ProtocolStats(checkpoints_completed=len(self.committed))


# -- the protocol ---------------------------------------------------------------------------------


class CecProtocol(Protocol):
    name = "cec"
    exactly_once = True
    resumable = True
    savepoint_under_restarts = False
    restart_scope = "downstream"
    # A failed instance restarts from its log while the rest runs on: a warm process
    # takes its slot in tens of milliseconds, where starting one takes a second.
    needs_standby = True
    needs_checkpoint_interval = True   # how often sinks commit
    needs_lineage = True

    def __init__(self, policy: CecPolicy | None = None, *, interval_s: float = 1.0):
        """``policy``: when control tuples are written (`CecPolicy`); ``interval_s``:
        how often sinks commit, in seconds (CEC itself never stops to checkpoint)."""
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) \
                or not interval_s > 0:
            raise ValueError(f"interval_s (how often sinks commit) must be a number of "
                             f"seconds > 0, got {interval_s!r}")
        self.policy = policy or CecPolicy()
        self.interval_s = float(interval_s)

    def check(self, topology: Any) -> None:
        nodes = topology.nodes
        consumers: dict[str, list[str]] = {n: [] for n in nodes}
        for node in nodes.values():
            for inp in node.inputs:
                consumers[inp.upstream].append(node.name)

        def refuse(operator: str, why: str) -> TopologyError:
            return TopologyError(f"protocol 'cec' cannot run operator {operator!r} of "
                                 f"topology {topology.name!r}: {why}")

        for node in nodes.values():
            if any(inp.feedback for inp in node.inputs):
                raise refuse(node.name, "it closes a cycle (feedback edge)")
            if node.kind not in _STATEFUL:
                continue
            for inp in node.inputs:
                self._check_upstream(nodes, consumers, node.name, inp.upstream, refuse)
            self._check_downstream(nodes, consumers, node.name, refuse)

    @staticmethod
    def _check_upstream(nodes: Any, consumers: Any, stateful: str, name: str,
                        refuse: Any) -> None:
        while nodes[name].kind != "source":
            node = nodes[name]
            if node.kind not in _SAFE_UPSTREAM:
                raise refuse(stateful, f"its input comes through {node.kind} {name!r}; "
                             "only map and filter may stand between a source and a "
                             "stateful operator (positions are per source instance)")
            inp = node.inputs[0]
            up = nodes[inp.upstream]
            if (up.parallelism != node.parallelism or inp.partition not in (AUTO, FORWARD)
                    or len(consumers[inp.upstream]) != 1):
                raise refuse(stateful, f"{node.kind} {name!r} is not chained to its "
                             "upstream one to one (same parallelism, forward edge, "
                             "single consumer): records of a source instance could "
                             "reach it out of order")
            name = inp.upstream

    @staticmethod
    def _check_downstream(nodes: Any, consumers: Any, stateful: str, refuse: Any) -> None:
        todo = [stateful]
        while todo:
            name = todo.pop()
            for consumer in consumers[name]:
                node = nodes[consumer]
                if node.kind in _STATEFUL:
                    raise refuse(consumer, f"it is fed by stateful operator {stateful!r}; "
                                 "CEC supports one stateful operator per path")
                for inp in node.inputs:
                    if inp.upstream != name:
                        continue
                    resolved = inp.partition
                    if resolved == AUTO and nodes[name].parallelism != node.parallelism:
                        resolved = "rebalance"
                    if resolved not in (AUTO, FORWARD, HASH, BROADCAST):
                        raise refuse(consumer, "a rebalance edge follows stateful "
                                     f"operator {stateful!r}: results sent again after a "
                                     "failure could reach another sink instance; key the "
                                     "edge or keep the parallelism")
                todo.append(consumer)

    def task_protocol(self, task: TaskContext) -> TaskProtocol:
        return CecTask(task, self.policy)

    def coordinator(self, master: MasterContext) -> Coordinator:
        return CecCoordinator(master)
