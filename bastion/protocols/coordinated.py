"""Coordinated checkpoints: aligned barriers (Chandy–Lamport, as Flink's ABS).

Every ``checkpoint_interval`` seconds the coordinator picks a new checkpoint id and
asks each source task to start it. The interval may change while the job runs
(`Coordinator.set_interval`, a live re-tune: `bastion.scheduler.retune`): the wait for
the next checkpoint is measured against the new interval at once. A source snapshots its offset, then sends a
*barrier* on every output channel: everything it sent before the barrier belongs to
the checkpoint, everything after does not. A task with several inputs *aligns*: once
a barrier arrived on one input it holds that input back (its senders stall, since the
channel keeps their credits) until the barrier arrived on every input; then the task's
state reflects exactly the records before the barriers. It snapshots, forwards the
barrier, lets the held-back records through, and stores its state and its sinks'
staged outputs. The coordinator completes the checkpoint when every task has
acknowledged: it writes the manifest (the commit point of the state) and then the
output marker (the commit point of the sinks).

In deterministic mode a task may not hold an input back: its merge takes the inputs
in a fixed order, and blocking one would change it. There the barriers are
*unaligned* (as Flink's unaligned checkpoints): the first barrier to arrive makes the
task snapshot at once — its state, its merge position and the input queued in the
merge, all of which precedes the barriers — and forward the barrier; what arrives on
the other inputs until their barrier is recorded as *channel state* and stored with
the checkpoint. A restored task queues that recorded input again, after the queue it
snapshotted, and resumes the same merge order.

With aligned barriers no records are in flight across a barrier, so no channel state
is stored. Either way the latest complete checkpoint is a consistent recovery line: after a failure every
task restores it and the sources rewind to its offsets. A failure while a checkpoint
is in progress leaves it without a manifest, so it is never used. A checkpoint that
takes longer than its timeout is given up too, without a failure: its barriers still
pass every task, and the sinks stage their outputs under its id, which no restore
will produce again — they are committed with the next checkpoint that completes.

**Restarting the failed region only** (`Coordinator.region_line`, whichever tasks the
failover strategy restarts: `bastion.scheduler.failover`). A barrier cuts every channel at
a frame: a task acknowledges checkpoint C with ``sent[channel]``, the number of the
first frame it sent after barrier C on each output. The receiver's state at C
reflects exactly the frames below that number (aligned: nothing crosses a barrier).
So the tasks a failure lost, with everything downstream of them, can restore C alone
while the others keep running: each restored task numbers its outputs from
``sent`` and expects its inputs from there, and every sender outside the region sends
its frames from ``sent`` on again out of its upstream backup (kept since the last
completed checkpoint, trimmed when one completes). Outside the region nothing was
fed by the region, so nothing there rolls back; the region's sinks discard what they
staged since C, as in any restart. A checkpoint in progress at the failure is not
given up: the region's tasks must take it again (their earlier acknowledgments no
longer count), the barriers outside the region reach them again through the backup,
and a source in the region is triggered again once it runs — so the checkpoint the
tasks outside already took completes, consistently, and their staged outputs with
it. Unaligned barriers cut the channels at the same frames: what a task received
after its snapshot up to each barrier is its channel state, restored with it. Barriers cannot be
aligned around a cycle (a task would wait for a barrier that waits for it), so this
protocol rejects topologies with feedback edges.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import msgpack

from bastion.errors import TopologyError
from bastion.protocols import knobs
from bastion.protocols.base import (Coordinator, MasterContext, Protocol, ProtocolStats,
                                    RegionLine, TaskContext, TaskProtocol, cancel)
from bastion.runtime.records import ControlRecord, control_record
from bastion.storage import BlobRef, StorageError

if TYPE_CHECKING:
    from bastion.protocols.knobs import AutoInterval

_log = logging.getLogger(__name__)

# How long checkpoints may stay stopped by a finished source before the driver is
# warned (`CheckpointCoordinator._note_paused`).
PAUSE_WARNING_S = 30.0


@control_record
@dataclass(frozen=True)
class Barrier(ControlRecord):
    """Checkpoint ``checkpoint_id``: everything before it on this channel belongs to
    the checkpoint, everything after it does not (Chandy–Lamport marker)."""

    checkpoint_id: int
    code: ClassVar[int] = 3

    def payload(self) -> Any:
        return self.checkpoint_id

    @classmethod
    def from_payload(cls, payload: Any) -> "Barrier":
        return cls(payload)


class AlignedBarriers(TaskProtocol):
    def __init__(self, task: TaskContext):
        super().__init__(task)
        self.aligning: dict[int, set[int]] = {}  # checkpoint id -> channels with barrier
        # checkpoint id -> the first frame after its barrier, per output: what the
        # upstream backup may forget once the checkpoint completes
        self.sent_at: dict[int, dict[int, int]] = {}
        # The alignment stash: what held-back inputs delivered after their barrier, in
        # order, until the checkpoint is taken.
        self.stashed: dict[int, collections.deque] = collections.defaultdict(
            collections.deque)
        # checkpoint id -> its snapshot being stored, acknowledged once it is (one at
        # a time: `_checkpoint` waits for the previous one)
        self.storing: dict[int, asyncio.Future] = {}

    async def restore(self, recovery_line: Any) -> None:
        if not isinstance(recovery_line, RegionLine):
            await super().restore(recovery_line)
            return
        task, resume = self.task, recovery_line.resume
        await super().restore(recovery_line.line)
        for channel_id in task.inputs.ids():
            task.inputs.expect(channel_id, resume[channel_id])
        for channel_id in task.outputs.ids():
            task.outputs.set_next_seq(channel_id, resume[channel_id])

    async def on_trigger(self, checkpoint_id: int) -> None:
        await self._checkpoint(checkpoint_id)

    async def on_checkpoint_completed(self, checkpoint_id: int) -> None:
        for done in [c for c in self.sent_at if c <= checkpoint_id]:
            sent = self.sent_at.pop(done)
            if done == checkpoint_id:
                for channel_id, seq in sent.items():
                    await self.task.outputs.trim_sent(channel_id, seq)

    async def on_control(self, channel_id: int, control: ControlRecord) -> None:
        if not isinstance(control, Barrier):
            await super().on_control(channel_id, control)
            return
        arrived = self.aligning.setdefault(control.checkpoint_id, set())
        arrived.add(channel_id)
        self.task.inputs.hold_back(channel_id)
        await self._maybe_aligned()

    def stash(self, channel_id: int, elements: list) -> None:
        self.stashed[channel_id].append(elements)

    async def on_input_ended(self, channel_id: int) -> None:
        # An input that ended sends no barrier: it no longer holds alignment up.
        await self._maybe_aligned()

    async def _maybe_aligned(self) -> None:
        for checkpoint_id in sorted(self.aligning):
            arrived = self.aligning[checkpoint_id]
            if not self.task.inputs.open_ids() <= arrived:
                return
            del self.aligning[checkpoint_id]
            await self._checkpoint(checkpoint_id)
            await self._release(arrived)

    async def _release(self, channel_ids: set[int]) -> None:
        """Let the aligned inputs through: first what was held back, in order (it may
        hold an input back again, at the next barrier)."""
        task = self.task
        for channel_id in channel_ids:
            task.inputs.let_through(channel_id)
            stash = self.stashed[channel_id]
            while stash and not task.inputs.is_held(channel_id):
                await task.inputs.process(channel_id, stash.popleft())

    async def _checkpoint(self, checkpoint_id: int) -> None:
        # One snapshot being stored at a time: a task whose snapshots take longer
        # than the interval waits here for the previous one rather than piling up
        # encodes and uploads that all then miss the checkpoint timeout.
        await self._settle_stored(wait=True)
        upload = self.task.state.checkpoint(checkpoint_id)      # snapshot, synchronously
        try:
            await _forward(self.task, checkpoint_id)
        except BaseException:
            upload.close()  # the attempt ended meanwhile: the snapshot is not stored
            raise
        # the barrier went out as one frame on each output: what follows is after C
        sent = {c: self.task.outputs.next_seq(c) for c in self.task.outputs.ids()}
        self.sent_at[checkpoint_id] = sent
        # The task goes on with its input while its snapshot is encoded (a large one
        # in a forked child) and stored, as a Flink task's asynchronous part does;
        # the checkpoint is acknowledged once it is stored. A failed store fails the
        # task at its next frame.
        self.storing[checkpoint_id] = asyncio.ensure_future(
            self._acknowledge_stored(checkpoint_id, upload, sent))

    async def _acknowledge_stored(self, checkpoint_id: int, upload: Any,
                                  sent: dict[int, int]) -> None:
        ref = await upload                                 # state + staged outputs stored
        self.task.state.acknowledge(checkpoint_id, ref, {"sent": sent})

    async def _settle_stored(self, wait: bool) -> None:
        """Forget the snapshots stored and acknowledged (all of them, waiting, if
        ``wait``); a store's error is raised here, in the task."""
        for checkpoint_id, storing in list(self.storing.items()):
            if wait:
                await asyncio.wait([storing])
            if storing.done():
                del self.storing[checkpoint_id]
                storing.result()

    async def between_frames(self) -> None:
        if self.storing:
            await self._settle_stored(wait=False)

    async def on_finished(self) -> None:
        await self._settle_stored(wait=True)

    def on_stop(self) -> None:
        for storing in self.storing.values():
            storing.cancel()  # nothing acknowledged after the task stopped
        self.storing.clear()


async def _forward(task: TaskContext, checkpoint_id: int) -> None:
    await task.outputs.send_control(Barrier(checkpoint_id))


def _channel_state_name(task: TaskContext) -> str:
    return f"inputs-{task.task_id}"


class UnalignedBarriers(AlignedBarriers):
    """Deterministic mode's task half: snapshot at the first barrier, record the
    other inputs until their barrier (channel state), never block an input."""

    def __init__(self, task: TaskContext):
        super().__init__(task)
        # checkpoint id -> (upload of the snapshot, the merge's capture, recorded input)
        self.pending: dict[int, tuple[Any, dict[int, list], dict[int, list]]] = {}

    async def restore(self, recovery_line: Any) -> None:
        await super().restore(recovery_line)
        if isinstance(recovery_line, RegionLine):
            recovery_line = recovery_line.line
        if recovery_line is None:
            return
        data = await self.task.state.load_channel(recovery_line,
                                                  _channel_state_name(self.task))
        merge = self.task.merge
        assert merge is not None   # unaligned barriers run under a deterministic merge only
        # msgpack, never pickle: the task checked the blob's CRC, not who wrote it.
        for channel_id, frame in msgpack.unpackb(data, strict_map_key=False).items():
            merge.extend(channel_id, self.task.codec.decode(frame))

    async def on_control(self, channel_id: int, control: ControlRecord) -> None:
        if not isinstance(control, Barrier):
            await TaskProtocol.on_control(self, channel_id, control)
            return
        task, merge, checkpoint_id = self.task, self.task.merge, control.checkpoint_id
        assert merge is not None   # unaligned barriers run under a deterministic merge only
        entry = self.pending.get(checkpoint_id)
        if entry is None:
            # The first barrier: everything queued in the merge precedes the barriers.
            others = {c for c in task.inputs.open_ids()
                      if c != channel_id and c not in merge.ended_on_arrival}
            # The upload starts now: the other barriers may take a while.
            entry = (asyncio.ensure_future(task.state.checkpoint(checkpoint_id)),
                     merge.capture(others), {})
            self.pending[checkpoint_id] = entry
            await _forward(task, checkpoint_id)
            self.sent_at[checkpoint_id] = {c: task.outputs.next_seq(c) for c in task.outputs.ids()}
        else:
            entry[2][channel_id] = merge.end_capture(entry[1], channel_id)
        upload, capture, recorded = entry
        if capture:
            return  # still waiting for the barrier on another input
        del self.pending[checkpoint_id]
        ref = await upload
        channel_state = msgpack.packb({c: task.codec.encode(elements)
                                       for c, elements in recorded.items() if elements})
        channel_ref = await task.state.store_channel(checkpoint_id, _channel_state_name(task),
                                                     channel_state)
        task.state.acknowledge(checkpoint_id, ref, {"channel_state": channel_ref,
                                              "sent": self.sent_at.get(checkpoint_id)})


class CheckpointCoordinator(Coordinator):
    """Triggers checkpoints on a timer and completes them when every task acked."""

    def __init__(self, master: MasterContext, timeout_s: float | None = None):
        super().__init__(master)
        self.checkpoints = master.checkpoint_store()
        interval_s = master.checkpoint_interval_s
        assert interval_s is not None   # a checkpointing protocol's run always has one
        self.interval_s: float = interval_s
        # A checkpoint not complete after timeout_s is aborted: the protocol object's
        # (`CoordinatedProtocol.timeout_s`), or ten intervals and at least 10 s,
        # following the interval when a re-tune moves it.
        self.fixed_timeout_s = timeout_s
        self.timeout_s = timeout_s if timeout_s is not None else max(10.0, 10 * self.interval_s)
        self.next_id = 1 + max(self.checkpoints.list_complete() or [0])
        self.in_progress: dict[int, dict[str, Any]] = {}
        self.attempt = -1
        self.loop: asyncio.Task | None = None
        # completed checkpoints, as running figures: a long run's memory stays flat
        self.completed = 0
        self.duration_s_total = 0.0
        self.duration_s_max: float | None = None
        self.state_bytes_last: int | None = None
        self.committed: set[int] = set()   # checkpoints whose outputs were committed
        self.unusable: set[int] = set()    # complete, but a recovery could not read them
        self.aborted = 0
        # Checkpoints of this attempt given up (their timeout, or a source that had
        # finished: `_give_up_declined`), whose outputs are not committed yet. A task
        # that took one staged its sink outputs under its id and will never stage
        # them again: they are committed with the next checkpoint that completes,
        # which every task takes after it (as Flink's two-phase-commit sinks commit
        # every pending transaction up to the completed checkpoint), or at the job's
        # end. A restart of the whole job replays them: forgotten then.
        self.timed_out: list[int] = []
        self.completing = asyncio.Lock()  # FIFO: checkpoints complete in id order
        self.completions: set[asyncio.Future] = set()  # fully acknowledged, completing
        # the newest checkpoint completed in this attempt and where it cut each
        # channel (a regional restart's line), or None
        self.newest: tuple[int, dict[int, int]] | None = None
        # set by `set_interval`: the trigger loop's wait is measured again against the
        # new interval at once, not after the old one ran out
        self.interval_changed = asyncio.Event()
        # sources of this attempt that answered a trigger as finished; since when a
        # finished source keeps checkpoints from starting, and whether the driver
        # was warned (`_note_paused`)
        self.finished_sources: set[int] = set()
        self.paused_since_s: float | None = None
        self.paused_warned = False
        self.triggers: set[asyncio.Task] = set()   # waiting for the workers' replies

    def start(self, attempt: int) -> None:
        self.attempt = attempt
        self.finished_sources = set()
        self.paused_since_s, self.paused_warned = None, False
        self.newest = None  # a new attempt numbers its frames from 0 again
        self.timed_out = []  # their outputs are produced again, under new ids
        self.loop = asyncio.ensure_future(self._trigger_loop())

    async def stop(self) -> None:
        self.attempt = -1  # acknowledgments still on their way no longer count
        await cancel(self.loop)
        for triggered in list(self.triggers):
            await cancel(triggered)
        # Each is an event as a timed-out one is: the count the summary prints and the
        # exported counter (`bastion.runtime.export`) are both made from what aborted.
        for checkpoint_id in sorted(self.in_progress):
            self.aborted += 1
            self.master.record_event("checkpoint_aborted", checkpoint_id=checkpoint_id,
                                     reason="a failure or the job's end came first")
        self.in_progress.clear()

    def set_interval(self, interval_s: float) -> bool:
        if not interval_s > 0:
            raise ValueError(f"checkpoint interval must be > 0 seconds, got {interval_s}")
        self.interval_s = interval_s
        if self.fixed_timeout_s is None:
            self.timeout_s = max(10.0, 10 * interval_s)
        self.interval_changed.set()
        return True

    async def _wait_interval(self) -> None:
        """Sleep until ``interval_s`` after this call began — the interval as it is
        at each wake-up: a shorter one set meanwhile (`set_interval`) ends the wait
        at once if it is already over, a longer one extends it."""
        began = time.monotonic()
        while (left := self.interval_s - (time.monotonic() - began)) > 0:
            self.interval_changed.clear()
            try:
                await asyncio.wait_for(self.interval_changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def _trigger_loop(self) -> None:
        while True:
            await self._wait_interval()
            now = time.time()
            for checkpoint_id, cp in list(self.in_progress.items()):
                if self.master.pending_tasks():
                    # pending tasks take it once they run: its clock starts then
                    cp["started_s"] = now
                elif now - cp["started_s"] > self.timeout_s:
                    del self.in_progress[checkpoint_id]
                    self.aborted += 1
                    self.timed_out.append(checkpoint_id)
                    self.master.record_event("checkpoint_aborted", checkpoint_id=checkpoint_id,
                                             reason=f"timed out after {self.timeout_s:g} s")
            if self.in_progress:
                continue  # one checkpoint at a time
            waiting = self.master.unfinished_tasks() - self.finished_sources
            if not waiting:
                continue
            if self.finished_sources or not self.master.all_sources_running():
                # a finished source can no longer inject barriers
                self._note_paused(waiting)
                continue
            checkpoint_id = self.next_id
            self.next_id += 1
            self.in_progress[checkpoint_id] = {"started_s": now, "waiting": set(waiting),
                                               "refs": {}, "sent": {}}
            # Not awaited here: a worker answers once its loop is free, and a user
            # function that holds it must not slow the triggers down.
            triggered = asyncio.ensure_future(self._trigger(self.attempt, checkpoint_id))
            self.triggers.add(triggered)
            triggered.add_done_callback(self.triggers.discard)

    async def _trigger(self, attempt: int, checkpoint_id: int) -> None:
        declined = await self.master.trigger_sources(attempt, checkpoint_id)
        if declined and attempt == self.attempt:
            self._give_up_declined(checkpoint_id, declined)

    def _give_up_declined(self, checkpoint_id: int, declined: set[int]) -> None:
        """Sources that had finished will never take ``checkpoint_id``: give it up now
        rather than at its timeout. The tasks that took it staged their outputs under
        its id, committed with the next checkpoint to complete, as a timed-out one's
        (or at the job's end)."""
        self.finished_sources |= declined
        if self.in_progress.pop(checkpoint_id, None) is None:
            return
        self.aborted += 1
        self.timed_out.append(checkpoint_id)
        self.master.record_event(
            "checkpoint_aborted", checkpoint_id=checkpoint_id,
            reason=f"source {' and '.join(self._names(declined))} had finished")

    def _note_paused(self, unfinished: set[int]) -> None:
        """A source finished before the others, and checkpoints stop while the job
        runs on: a finished source can no longer inject barriers, and a checkpoint
        after a task finished is not supported (Flink's FLIP-147 is). Until the job
        ends no sink output is committed, and a failure restores the last checkpoint
        — the user should know, not find out. An event at once; a warning on the
        driver's log once the pause lasted `PAUSE_WARNING_S` (and ten intervals):
        sources of a bounded job end a little apart, which is no news."""
        now_s = time.monotonic()
        if self.paused_since_s is None:
            self.paused_since_s = now_s
            self.master.record_event("checkpoints_paused",
                                     sources=self._finished_sources(unfinished),
                                     last_checkpoint=max(self.committed, default=None))
        if self.paused_warned or now_s - self.paused_since_s < max(PAUSE_WARNING_S,
                                                                   10 * self.interval_s):
            return
        self.paused_warned = True
        last = max(self.committed, default=None)
        _log.warning(
            "checkpoints have stopped for %.0f s while the job runs on: source %s "
            "finished, and a finished source can no longer start a checkpoint. Until "
            "the job ends no sink output is committed, and a failure restores %s. Keep "
            "every source running until the job ends (a bounded side input as state "
            "loaded by the operator that uses it), or run it as a job of its own",
            now_s - self.paused_since_s, " and ".join(self._finished_sources(unfinished)),
            "nothing: the job starts over" if last is None else f"checkpoint {last}")

    def _finished_sources(self, unfinished: set[int]) -> list[str]:
        return self._names(self.master.source_tasks() - unfinished)

    def _names(self, source_tasks: set[int]) -> list[str]:
        instances = self.master.instances()
        return sorted(f"{instances[t][0][0]}[{instances[t][0][1]}]" for t in source_tasks)

    def on_acknowledge(self, attempt: int, task_id: int, checkpoint_id: int,
                       ref: BlobRef, meta: Any) -> None:
        cp = self.in_progress.get(checkpoint_id)
        if attempt != self.attempt or cp is None:
            return
        cp["waiting"].discard(task_id)
        refs = cp["refs"][task_id] = [ref]
        if meta and meta.get("channel_state") is not None:
            refs.append(meta["channel_state"])
        if meta and meta.get("sent") is not None:
            cp["sent"].update(meta["sent"])
        if not cp["waiting"]:
            del self.in_progress[checkpoint_id]
            completing = asyncio.ensure_future(self._complete(checkpoint_id, cp, attempt))
            self.completions.add(completing)
            completing.add_done_callback(self.completions.discard)

    async def _complete(self, checkpoint_id: int, cp: dict[str, Any], attempt: int) -> None:
        async with self.completing:
            await self._complete_in_order(checkpoint_id, cp, attempt)

    async def _complete_in_order(self, checkpoint_id: int, cp: dict[str, Any],
                                 attempt: int) -> None:
        # ``attempt``: the one the acknowledgments came in, not the one running when
        # the turn of this checkpoint comes (on a slow store, after a failure or the
        # job's end — then recovery or `on_job_finished` commits it).
        refs = [ref for task_refs in cp["refs"].values() for ref in task_refs]
        await asyncio.to_thread(self.checkpoints.commit, checkpoint_id, refs,
                                {"attempt": attempt})
        if attempt != self.attempt:
            return  # a failure came first: recovery commits the outputs it restores
        self.newest = (checkpoint_id, cp["sent"])
        duration_s = time.time() - cp["started_s"]
        state_bytes = sum(r.size for r in refs)
        self.completed += 1
        self.duration_s_total += duration_s
        self.duration_s_max = max(duration_s, self.duration_s_max or 0.0)
        self.state_bytes_last = state_bytes
        self.master.record_event("checkpoint_completed", checkpoint_id=checkpoint_id,
                                 duration_s=duration_s, state_bytes=state_bytes)
        # Outputs staged under checkpoints given up before this one come before it in
        # every task that staged them, and no restore from here on produces them
        # again: commit them first, in order.
        for aborted in sorted(c for c in self.timed_out if c < checkpoint_id):
            self.timed_out.remove(aborted)
            await self.master.commit_outputs(aborted)
            self.committed.add(aborted)
        await self.master.commit_outputs(checkpoint_id)
        self.committed.add(checkpoint_id)
        self.master.checkpoint_completed(checkpoint_id)
        # Older checkpoints are never restored again: keep the newest few, delete the rest.
        await asyncio.to_thread(self.checkpoints.gc, self.master.retained_checkpoints)

    async def on_job_finished(self, task_reports: list[dict[str, Any]]) -> None:
        # The end of the job can overtake a checkpoint: its manifest still being written
        # when the watch ended, or its acknowledgments still on their way (they travel
        # apart from the tasks' end), or never coming (a source that finished before it
        # could inject the barrier, while the other inputs' barriers passed the sinks).
        # Its sinks took their outputs out of staging into its blob all the same, and
        # the end-of-stream commit holds only what came after it: commit every such
        # blob of this attempt, or those outputs are never visible. No failure can
        # follow any more, so they are final.
        staged = set().union(*(r["staged_commits"] for r in task_reports))
        async with self.completing:
            complete = await asyncio.to_thread(self.checkpoints.list_complete)
            newest_committed = max(self.committed, default=0)
            for checkpoint_id in sorted(set(complete) | staged):
                # an excluded checkpoint's records were replayed after it: never commit it
                if checkpoint_id > newest_committed and checkpoint_id not in self.unusable:
                    await self.master.commit_outputs(checkpoint_id)
                    self.committed.add(checkpoint_id)
                    newest_committed = checkpoint_id
            await asyncio.to_thread(self.checkpoints.gc, self.master.retained_checkpoints)

    def checkpoint_in_progress(self) -> int | None:
        return min(self.in_progress, default=None)

    async def recovery_line(self) -> int | None:
        while True:
            manifest = await self.checkpoints.alatest_complete(exclude=self.unusable)
            if manifest is None:
                return None
            checkpoint_id = manifest.checkpoint_id
            if checkpoint_id in self.committed:
                return checkpoint_id
            # A checkpoint can be complete (manifest written) while the failure kept its
            # outputs from being committed: its staged outputs are part of the state we
            # restore, so they must be visible, or they would be lost. Committing is
            # for good, so first make sure every blob of it reads back.
            try:
                await asyncio.to_thread(self.checkpoints.verify, checkpoint_id)
            except StorageError as exc:
                self.exclude(checkpoint_id)
                self.master.record_event("checkpoint_unusable", checkpoint=checkpoint_id,
                                         key=getattr(exc, "key", None),
                                         reason=f"{type(exc).__name__}: {exc}")
                continue
            await self.master.commit_outputs(checkpoint_id)
            self.committed.add(checkpoint_id)
            return checkpoint_id

    async def region_line(self, tasks: set[int]) -> RegionLine | None:
        # A checkpoint every task acknowledged completes first: the region restores
        # it, or its outputs would be committed and produced again. (Acknowledgments
        # still count until this returns: another checkpoint may complete meanwhile.)
        while self.completions:
            await asyncio.gather(*self.completions, return_exceptions=True)
        channels = self.master.channels()
        if self.newest is None or self.newest[0] not in self.committed \
                or not channels.keys() <= self.newest[1].keys():
            return None  # nothing completed in this attempt, or it cut no channel
        checkpoint_id, sent = self.newest
        unfinished = self.master.unfinished_tasks()
        for cp in self.in_progress.values():
            cp["waiting"] |= tasks & unfinished
            for task_id in tasks:
                cp["refs"].pop(task_id, None)
            for channel_id, (src, _) in channels.items():
                if src in tasks:
                    cp["sent"].pop(channel_id, None)
        # Checkpoints given up since the line: the region's tasks took them, staging
        # outputs they produce again now, so they take them again (their blobs
        # replace those of the incarnation before) before these are committed.
        return RegionLine(checkpoint_id, {c: sent[c] for c in channels},
                          tuple(c for c in self.timed_out if c > checkpoint_id))

    def exclude(self, checkpoint_id: int) -> None:
        self.unusable.add(checkpoint_id)

    def rolled_back_commits(self, line: int | None) -> set[int]:
        # Restoring checkpoint ``line`` replays what every later checkpoint committed.
        return {c for c in self.committed if line is None or c > line}

    def stats(self, final_counters: Any = None) -> ProtocolStats:
        return ProtocolStats(
            checkpoints_completed=self.completed,
            checkpoints_aborted=self.aborted,
            checkpoint_duration_s_avg=(self.duration_s_total / self.completed
                                       if self.completed else None),
            checkpoint_duration_s_max=self.duration_s_max,
            state_bytes_last=self.state_bytes_last)


class CoordinatedProtocol(Protocol):
    """Coordinated checkpoints (aligned barriers), ``bn.protocols.Coordinated``:
    exactly-once, a failure restores the failed tasks' pipelined regions.

    ``interval_s``: seconds between checkpoints, or a `bastion.options.AutoInterval`
    (chosen by the Chiron model for a bound on the total recovery time, and re-tuned
    while the job runs if it says so); ``retained_checkpoints``: the newest complete
    checkpoints kept, older ones deleted; ``timeout_s``: how long a checkpoint may
    take before it is aborted, in seconds (None: ten intervals, at least 10 s)."""

    name = "coordinated"
    exactly_once = True
    restart_scope = "region"
    needs_checkpoint_interval = True
    live_interval = True
    needs_standby = True
    interval_s: Any = 1.0
    timeout_s: float | None = None

    def __init__(self, interval_s: "float | AutoInterval" = 1.0, *,
                 retained_checkpoints: int = 2, timeout_s: float | None = None):
        self.interval_s = knobs.interval(interval_s)
        self.retained_checkpoints = knobs.retained(retained_checkpoints)
        self.timeout_s = (None if timeout_s is None else
                          knobs.positive_seconds(timeout_s, "timeout_s",
                                                   "how long a checkpoint may take"))

    def check(self, topology: Any) -> None:
        for node in topology.nodes.values():
            for inp in node.inputs:
                if inp.feedback:
                    raise TopologyError(
                        f"protocol 'coordinated' cannot run topology {topology.name!r}: "
                        f"the feedback edge {inp.upstream!r} -> {node.name!r} closes a "
                        "cycle, and aligned barriers deadlock on cycles (operator "
                        f"{node.name!r} would wait for a barrier that waits for it); use "
                        "protocol='uncoordinated' or 'cic'")

    def task_protocol(self, task: TaskContext) -> TaskProtocol:
        return AlignedBarriers(task) if task.merge is None else UnalignedBarriers(task)

    def coordinator(self, master: MasterContext) -> Coordinator:
        return CheckpointCoordinator(master, self.timeout_s)
