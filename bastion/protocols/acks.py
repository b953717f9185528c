"""At-least-once by acknowledgments and replay (protocol ``acks``), as in Storm and Heron.

Every record a source reads is a *root*. Its descendants are the tuples it becomes on
the way to the sinks; a tuple that crosses a channel is an *intermediate* tuple (inside
a chain nothing is lost that the whole task does not lose with it). After every frame
each task tells the source instances whose roots it touched, directly and batched,
what it did: "these tuples I took in, these I emitted" — one message per source task
per frame, so a tuple's acknowledgment and its children's emission arrive together.
The source keeps, per pending root, what is still outstanding:

- ``Acks(mode="fine")`` (the default, Dynamo §3.2.3.2): the intermediate tuples
  emitted and not yet acknowledged, as a count per tuple token (a 64-bit name of the
  tuple within its root, `bastion.lineage.token`): emissions minus acknowledgments.
  A tuple is outstanding while its count is above 0. Messages may arrive in any
  order: a tuple acknowledged before its emission is reported counts below 0, and
  its parent, whose acknowledgment travels in the same message as that emission, is
  still outstanding meanwhile. Copies of a tuple (tuple-level redundancy) share its
  token: the first copy acknowledged brings the count to 0 — a stalled instance's
  copy is not waited for — and the later one to -1, which holds nothing back;
- ``Acks(mode="xor")`` (Storm's acker): one 64-bit value per root, every token XORed
  in once when emitted and once when acknowledged. A token is salted with the
  channel the tuple crossed, so the two copies of a redundant tuple (and their
  results, which cross different channels) are distinct tuples: the root completes
  only once *every* copy is acknowledged, as in the thesis's coarse mode.

A root is complete when nothing is outstanding (fine: no count above 0; xor: the
value 0). Sinks acknowledge only once what they staged is committed: a task with
sinks holds its messages back and sends them after its sinks' next commit, which it
makes every ``checkpoint_interval_s`` (the job master writes the commit marker before
it returns). A root not complete ``ack_timeout_s`` after it was emitted is replayed: the
source keeps each pending root's value and sends it again under the same lineage id;
its outstanding set starts over (copies still in flight may complete it first: one
complete copy of every tuple is all at-least-once needs). ``max_pending`` bounds the
pending roots of a source instance: at the bound the source stops reading (Storm's
``max.spout.pending``), which is also its backpressure. A source whose input is
exhausted waits for its pending roots before it ends, and meanwhile asks the tasks
with sinks to commit now (its last roots' acknowledgments wait in them, up to a
checkpoint interval: in a short job, as long as the job itself).

A source keeps its pending roots in columns, a block per source batch
(`bastion.protocols.pending`): some ten acknowledgments per root, applied one entry
(one id column) at a time with array operations, not one root at a time.

**Failures.** A killed instance restarts alone (``restart_scope = "task"``, Dynamo's
crashed instance; `bastion.scheduler.failover.RestartFailed`): every other task runs
on with its pending roots. What the instance held is gone — the tuples in its inbox,
what its sinks staged and had not committed, and what its senders sent it while it
was down (dropped: `bastion.runtime.channel.ReroutableOutputChannel`) — and none of it
is acknowledged, so the sources replay those roots when they time out; with tuple-level
redundancy their copies, sent to another instance, are usually through already. A
restarted source instance lost its pending roots: it reads on from its *frontier* —
the position below which every root is complete, which each source instance reports
now and then — so the roots that were pending are read again, and those complete above
the frontier are duplicated. ``failover="global"`` restarts every task from the
frontiers instead. Committed outputs stay. Nothing is lost; duplicates are allowed,
and a drill reports them separately.

**What it needs of a topology** (`AcksProtocol.check` refuses the rest, naming the
operator): every tuple descends from exactly one root and replaying a root gives the
same tuples — so no windows or joins (a window's result has many roots), and no
operator state (``reduce``, ``stateful_map``), which a replay would count twice and a
restart would lose: Storm's at-least-once is for stateless bolts, and so is this one;
an exactly-once protocol is for state. Lineage ids are turned on for the run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from bastion.errors import TopologyError
from bastion.lineage import IdRun, fold, path_token, source_root, token
from bastion.protocols import knobs
from bastion.protocols.base import (Coordinator, MasterContext, Protocol, RegionLine,
                                    TaskContext, TaskProtocol)
from bastion.protocols.pending import PendingRoots, pack_positions, pack_tokens
from bastion.runtime.records import Batch

MODES = ("fine", "xor")
_STATEFUL = ("reduce", "stateful_map", "window", "join")
# How often a source reports its frontier to the coordinator: a Ray call each, which
# cost a source some 2% of its time at 0.1 s; a frontier older by this much only
# makes a restart read this much more again (duplicates, which at-least-once allows).
_REPORT_INTERVAL_S = 0.5
_END_POLL_S = 0.005        # how often an exhausted source looks at its pending roots
_END_NUDGE_S = 0.02        # how often it asks the sinks to commit meanwhile
_COMMIT_NOW = 0            # the sign of the one entry of such a request


def _channel_salt(channel_id: int | None) -> int:
    """What XOR mode mixes into the token of a tuple that crossed ``channel_id`` (None,
    salt 0: a root, taken in by its own source task)."""
    return 0 if channel_id is None else fold(0x27D4EB2F165667C5, channel_id + 1)


class AcksTask(TaskProtocol):
    def __init__(self, task: TaskContext, mode: str, ack_timeout_s: float, max_pending: int):
        super().__init__(task)
        self.mode = mode
        self.ack_timeout_s = ack_timeout_s
        self.max_pending = max_pending
        self.kinds = task.chain.op_kinds()
        # (id column, channel) taken in / emitted since the last message
        self.inputs: list[tuple[Any, int | None]] = []
        self.outputs: list[tuple[Any, int | None]] = []
        self.salts: dict[int | None, int] = {}
        self.path_tokens: dict[tuple, int] = {}
        self.root_token = path_token(())
        self.held: dict[int, list] = {}  # source task -> entries waiting for a commit
        self.commits = 0
        self.committer: asyncio.Task | None = None
        self.commit_requested = asyncio.Event()  # a source at its end waits for us
        # a source task's pending roots, in columns (`bastion.protocols.pending`)
        self.pending = PendingRoots(mode == "fine", self.root_token)
        self.read_up_to = -1             # the newest position read
        self.last_report_s = 0.0
        self.replayed = 0
        self.completed = 0
        self.max_pending_seen = 0
        self.messages_sent = 0

    # -- restore and start ---------------------------------------------------------------

    async def restore(self, recovery_line: Any) -> None:
        await self.task.sinks.reapply_commits()
        if isinstance(recovery_line, RegionLine):  # restarted alone
            recovery_line = recovery_line.line
        if recovery_line is not None:
            self.task.sources.rewind(recovery_line["replay_from"])

    async def on_start(self) -> None:
        if self.task.chain.has_sinks():
            self.committer = asyncio.ensure_future(self._commit_periodically())

    def on_stop(self) -> None:
        if self.committer is not None:
            self.committer.cancel()

    # -- what goes in and out -------------------------------------------------------------

    def on_source_batch(self, batch: Batch) -> None:
        ids = cast(IdRun, batch.ids)   # a source's batch: a run of its positions
        self._register(ids.positions, batch.values, batch.ts, batch.born)
        self.read_up_to = max(self.read_up_to, ids.positions[-1])
        self.inputs.append((ids, None))

    def on_batch(self, channel_id: int, batch: Batch) -> Batch | None:
        # every copy is acknowledged, the ones dropped as later copies too: XOR mode
        # counts each copy; in fine mode a later copy takes its count below 0, which
        # holds nothing back
        if batch.ids is not None and len(batch):
            self.inputs.append((batch.ids, channel_id))
        return batch

    def on_emit(self, batch: Batch, channel_id: int, copy: bool) -> None:
        # Fine mode counts a tuple once, whichever copy is acknowledged first; XOR mode
        # counts every copy, each a tuple of its own on its channel.
        if batch.ids is not None and len(batch) and (not copy or self.mode == "xor"):
            self.outputs.append((batch.ids, channel_id))

    def source_room(self) -> float:
        return self.max_pending - len(self.pending)

    async def between_frames(self) -> None:
        self._report_frame()
        if self.pending or self.task.chain.is_source():
            await self._replay_overdue()
            self._report_frontier()

    async def before_source_end(self) -> None:
        # The last records' frames are not full: send them, or nothing acknowledges them.
        await self.task.outputs.flush()
        nudged_s = 0.0
        while self.pending:
            await self._replay_overdue()
            self._report_frontier()
            now_s = time.monotonic()
            if now_s - nudged_s >= _END_NUDGE_S:
                self._ask_sinks_to_commit()
                nudged_s = now_s
            await asyncio.sleep(_END_POLL_S)
        self._report_frontier()

    def _ask_sinks_to_commit(self) -> None:
        """What keeps an exhausted source waiting are mostly acknowledgments the sinks
        hold until their next commit: ask for it now rather than up to a checkpoint
        interval later (the job ends that much sooner)."""
        for task_id in self.task.sinks.tasks():
            self.task.send_acks(task_id, [[_COMMIT_NOW]])

    # -- messages ---------------------------------------------------------------------------

    def _report_frame(self) -> None:
        """What the frame did, as one message per source task: entries ``[+1 or -1,
        root positions, tokens]`` — emitted (+1) or taken in (-1); ``tokens`` one int
        for a whole unbuilt column, else one per tuple. Positions and per-tuple tokens
        are packed (`bastion.protocols.pending.pack_positions`): one blob each."""
        if not self.inputs and not self.outputs:
            return
        by_task: dict[int, list] = {}
        salted = self.mode == "xor"
        for sign, columns in ((1, self.outputs), (-1, self.inputs)):
            for column, channel_id in columns:
                salt = self._salt(channel_id) if salted else 0
                if type(column) is IdRun:  # one source instance's: positions are roots
                    by_task.setdefault(self.task.sources.task_of(column.source, column.instance),
                                       []).append([sign, pack_positions(column.positions),
                                                   self._path_token(column.path) ^ salt])
                    continue
                kinds = self.kinds
                per_source: dict[Any, Any] = {}
                for rid in column:
                    source, instance, position = source_root(rid, kinds)
                    entry = per_source.get((source, instance))
                    if entry is None:
                        per_source[source, instance] = entry = [sign, [], []]
                    entry[1].append(position)
                    entry[2].append(token(rid) ^ salt)
                for (source, instance), (_, positions, tokens) in per_source.items():
                    by_task.setdefault(self.task.sources.task_of(source, instance), []).append(
                        [sign, pack_positions(positions), pack_tokens(tokens)])
        self.inputs, self.outputs = [], []
        if self.task.chain.has_sinks():
            for task_id, listed in by_task.items():
                self.held.setdefault(task_id, []).extend(listed)
        else:
            self._send(by_task)

    def _salt(self, channel_id: int | None) -> int:
        known = self.salts.get(channel_id)
        if known is None:
            known = self.salts[channel_id] = _channel_salt(channel_id)
        return known

    def _path_token(self, path: tuple) -> int:
        known = self.path_tokens.get(path)
        if known is None:
            known = self.path_tokens[path] = path_token(path)
        return known

    def _send(self, by_task: dict[int, list]) -> None:
        for task_id, entries in by_task.items():
            self.task.send_acks(task_id, entries)
        self.messages_sent += len(by_task)

    def on_acks(self, entries: list) -> None:
        """A message from a task (this one included) about this source's roots. Its
        entries apply together, before any root is checked: a tuple taken in and its
        children emitted arrive in one message, so a root never looks complete halfway
        (`PendingRoots.apply`). ``[[_COMMIT_NOW]]`` asks a task with sinks to commit
        now, if it holds acknowledgments (`before_source_end`)."""
        if entries and entries[0][0] == _COMMIT_NOW:
            if self.held:
                self.commit_requested.set()
            return
        born_s = self.pending.apply(entries)
        if len(born_s):
            # Storm's "complete latency" of each root completed: from its birth at its
            # source until now — what the fine and XOR modes differ in under redundancy
            self.completed += len(born_s)
            self.task.observe_latencies("complete_latency", time.time() - born_s)

    # -- a source's roots -----------------------------------------------------------------

    def _register(self, positions: Any, values: Any, ts: Any, born: Any) -> None:
        """Roots that go out now: each outstanding until it is itself taken in."""
        self.pending.register(positions, values, ts, born, time.monotonic())
        self.max_pending_seen = max(self.max_pending_seen, len(self.pending))

    async def _replay_overdue(self) -> None:
        """Send the roots not complete ``ack_timeout_s`` after they went out again,
        under the same ids; their outstanding sets start over."""
        now_s = time.monotonic()
        overdue = self.pending.overdue(now_s - self.ack_timeout_s, now_s)
        if overdue is None:
            return
        positions, values, ts, born = overdue
        source, instance = self.task.sources.identity()
        ids = IdRun(source, instance, tuple(positions))
        self.inputs.append((ids, None))
        self.replayed += len(positions)
        await self.task.sources.replay(Batch(None, values, ts, born, ids))
        self._report_frame()
        await self.task.outputs.flush()  # a source waiting at its end flushes nothing else

    def _report_frontier(self) -> None:
        now_s = time.monotonic()
        if now_s - self.last_report_s < _REPORT_INTERVAL_S and self.pending:
            return
        self.last_report_s = now_s
        frontier = self.pending.frontier(self.read_up_to)
        source, instance = self.task.sources.identity()
        self.task.state.acknowledge(0, None, {"frontier": {f"{source}/{instance}": frontier}})

    # -- sinks commit, then acknowledge -------------------------------------------------------

    async def _commit_periodically(self) -> None:
        interval_s = self.task.checkpoint_interval_s
        while True:
            try:   # every interval, or sooner when a source at its end asks
                await asyncio.wait_for(self.commit_requested.wait(), interval_s)
            except asyncio.TimeoutError:
                pass
            self.commit_requested.clear()
            await self.commit_and_acknowledge()

    async def commit_and_acknowledge(self) -> None:
        # Only entries of frames processed in full (a frame half done would acknowledge
        # its inputs before their children are emitted), taken before staging: every
        # record they acknowledge is staged now.
        held, self.held = self.held, {}
        task = self.task
        # unique per attempt, incarnation and commit: a task restarted alone must not
        # stage over what its incarnation before committed
        commit = (((task.attempt * 1_000 + task.incarnation) * 1_000_000 + self.commits)
                  * task.task_count + task.task_id + 1)
        self.commits += 1
        if await task.sinks.commit(commit):
            self._send(held)
        # else: the attempt is over; the roots are read again by the next one

    async def on_finished(self) -> None:
        self._report_frame()
        if self.task.chain.has_sinks():
            await self.commit_and_acknowledge()

    def counters(self) -> dict[str, float]:
        counters: dict[str, float] = {"ack_messages": self.messages_sent}
        if self.task.chain.is_source():
            counters.update(roots_replayed=self.replayed, roots_completed=self.completed,
                            roots_pending=len(self.pending),
                            max_pending_roots=self.max_pending_seen)
        return counters


class AcksCoordinator(Coordinator):
    """Keeps every source instance's frontier; after a failure the sources read on
    from there."""

    def __init__(self, master: MasterContext):
        super().__init__(master)
        self.frontier: dict[str, int] = {}

    def on_acknowledge(self, attempt: int, task_id: int, checkpoint_id: int,
                       ref: Any, meta: Any) -> None:
        if meta and "frontier" in meta:
            for source, position in meta["frontier"].items():
                # a late report of an earlier attempt never moves the frontier back
                self.frontier[source] = max(self.frontier.get(source, -1), position)

    async def recovery_line(self) -> Any:
        self.master.record_event("replay_from_frontier", frontier=dict(self.frontier))
        return {"replay_from": dict(self.frontier)}

    async def region_line(self, tasks: set[int]) -> RegionLine:
        # A restarted source reads on from its frontier; no channel position is kept:
        # what the restarted tasks lost is replayed from the sources.
        return RegionLine(await self.recovery_line(), {})


class AcksProtocol(Protocol):
    """Tuple acknowledgments (Storm's), ``bn.protocols.Acks``: at-least-once for
    stateless topologies; an unacknowledged root is replayed from its source."""

    name = "acks"
    exactly_once = False
    at_least_once = True
    acknowledges_tuples = True
    nondeterministic_merge = (
        "a source ends only once its roots are acknowledged, while a deterministic merge "
        "downstream waits for that source's turn to fill or end: neither would move; "
        "the tuples of a stateless topology do not depend on the order anyway")
    needs_checkpoint_interval = True   # how often sinks commit (and acknowledge)
    needs_lineage = True
    tolerates_copies = True
    restart_scope = "task"

    interval_s: Any = 1.0
    mode: str = "fine"
    ack_timeout_s: float = 5.0
    max_pending: int = 100_000

    def __init__(self, mode: str = "fine", timeout_s: float = 5.0,
                 max_pending: int = 100_000, *, interval_s: float | None = None):
        """``mode``: how acknowledgments are tracked, ``"fine"`` (per tuple) or
        ``"xor"`` (Storm's XOR ledger); ``timeout_s``: how long a source root may
        stay unacknowledged before it is replayed, in seconds; ``max_pending``: the
        most unacknowledged roots per source before it waits; ``interval_s``: how
        often sinks commit (and acknowledge), in seconds (None: 1 s) — shorter than
        ``timeout_s``, checked here when it is given and when a run starts."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0 (the seconds a root may "
                             f"stay unacknowledged), got {timeout_s!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) \
                or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        self.mode = mode
        self.ack_timeout_s = float(timeout_s)
        self.max_pending = max_pending
        if interval_s is not None:
            self.interval_s = knobs.interval(interval_s, what="how often sinks commit")
            if not isinstance(self.interval_s, knobs.AutoInterval):
                self.check_interval(self.interval_s)

    @property
    def timeout_s(self) -> float:
        """How long a source root may stay unacknowledged before it is replayed."""
        return self.ack_timeout_s

    def check(self, topology: Any) -> None:
        for node in topology.nodes.values():
            if node.kind in _STATEFUL:
                raise TopologyError(
                    f"protocol 'acks' cannot run {node.kind} {node.name!r} of topology "
                    f"{topology.name!r}: it replays tuples, so operator state would "
                    "count a replayed tuple twice and a restart would lose it; use an "
                    "exactly-once protocol (coordinated, uncoordinated, cic, cec) for "
                    "stateful operators")
            if any(inp.feedback for inp in node.inputs):
                raise TopologyError(f"protocol 'acks' cannot run {node.name!r} of topology "
                                    f"{topology.name!r}: it closes a cycle (feedback edge)")

    def check_interval(self, checkpoint_interval_s: float | None) -> None:
        if checkpoint_interval_s is not None and self.ack_timeout_s <= checkpoint_interval_s:
            raise ValueError(
                f"Acks(timeout_s={self.ack_timeout_s:g}) must be longer than its "
                f"interval_s={checkpoint_interval_s:g}: sinks acknowledge only "
                "when they commit, so every root would be replayed before it could "
                "complete, and the replays would flood the job")

    def dedup_window_s(self) -> float:
        return min(5.0, self.ack_timeout_s / 3)   # see check_copies

    def check_copies(self, dedup_window_s: float) -> None:
        if 2 * dedup_window_s >= self.ack_timeout_s:
            raise ValueError(
                f"Redundancy(dedup_window_s={dedup_window_s:g}) must be shorter than half "
                f"of Acks(timeout_s={self.ack_timeout_s:g}): a receiver remembers a tuple id "
                "for up to twice the window, and would drop a replayed root's tuples as "
                "copies of the ones it replaces")

    def task_protocol(self, task: TaskContext) -> TaskProtocol:
        return AcksTask(task, self.mode, self.ack_timeout_s, self.max_pending)

    def coordinator(self, master: MasterContext) -> Coordinator:
        return AcksCoordinator(master)
