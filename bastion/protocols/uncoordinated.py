"""Uncoordinated checkpoints: independent snapshots, in-flight logging, rollback propagation.

Every task checkpoints on its own timer (CheckMate §III-B), at a point between two
frames where its state reflects exactly the frames it processed and produced exactly
the frames it sent: it flushes its output buffers, snapshots its state and records,
per channel, the sequence number of the last frame it *received* and the last one it
*sent*. It also logs every frame it sends; at each checkpoint the log since the
previous one is stored with the checkpoint (*sender-based message logging*). No
barriers, no alignment: tasks never wait for each other.

After a failure the coordinator builds the checkpoint graph from what the tasks
recorded and finds the newest *consistent* recovery line by rollback propagation
(`bastion.protocols.recovery_line`): a set of one checkpoint per task with no orphan
message (received in the line but not sent in it). Every task restores its line
checkpoint; every sender first re-sends, from its logs, the frames its receiver had
not received at the receiver's line checkpoint, then goes on numbering after the last
frame its own line checkpoint sent; receivers drop frames they already have, by
sequence number. Checkpoints above the line are abandoned (and counted *invalid* when
no consistent line can ever contain them).

**Restarting the rollback set only** (`RecoveryLineCoordinator.region_line`). The
failed tasks roll back, and with them what received their frames since: the tasks
downstream of them. Every task upstream keeps its current state — it sent everything
any checkpoint downstream received, so nothing it did is orphaned — and keeps an
*upstream backup* of each output channel, from which it resends, from where each
restarted receiver's line checkpoint stopped, what it sent since. Inside the region the
line is drawn as above, over its own checkpoints only (`region_recovery_line`), and the
restarted tasks replay their logs to each other. Backups are trimmed below the job's
recovery line, which a region's line never lies below.

Sink outputs staged at a sink's checkpoint are committed once that checkpoint is in
the current recovery line — the line only moves forward as checkpoints accumulate, so
a committed output is never rolled back. Feedback cycles are allowed: nothing waits
on a barrier; rollback may propagate around a cycle (the domino effect), which the
communication-induced variant (`cic`) prevents.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from bastion.protocols.knobs import AutoInterval
from bastion.protocols import knobs
from bastion.protocols.base import (Coordinator, MasterContext, Protocol, ProtocolStats,
                                    RegionLine, TaskContext, TaskProtocol, cancel)
from bastion.protocols.recovery_line import (NOTHING, CheckpointGraph,
                                             CheckpointRecord, invalid_checkpoints,
                                             region_recovery_line)

__all__ = ["UncoordinatedProtocol", "IndependentCheckpoints", "RecoveryLineCoordinator",
           "FrameLog"]


def checkpoint_number(attempt: int, incarnation: int, local: int, task_id: int) -> int:
    """Checkpoint numbers grow per task across its restarts and are unique in the job.
    Each restart of a task either starts a new attempt (the whole job restarts) or
    gives the task a new incarnation (it restarts with part of the job:
    `TaskContext.incarnation`), so their sum, the task's *generation*, grows with
    every one; a generation numbers its checkpoints 1, 2, ... (``local``)."""
    return ((attempt + incarnation) << 40) | (local << 16) | task_id


def follows(previous: int | None, number: int) -> bool:
    """Is checkpoint ``number`` the one its task took right after ``previous`` (None:
    before any)? A restored task's first checkpoint follows whatever it restored."""
    local = (number >> 16) & 0xFFFFFF
    if previous is None or previous >> 40 != number >> 40:
        return local == 1
    return local == ((previous >> 16) & 0xFFFFFF) + 1


@dataclass
class TaskRestore:
    """What one task needs to resume from the recovery line."""

    checkpoint: int | None
    expected: dict[int, int] = field(default_factory=dict)   # input channel -> next seq
    next_seq: dict[int, int] = field(default_factory=dict)   # output channel -> next seq
    # output channel -> [(blob key, first seq to re-send, last seq to re-send)]
    replay: dict[int, list[tuple[str, int, int]]] = field(default_factory=dict)
    protocol_state: Any = None   # what the task protocol stored with its checkpoint


class FrameLog:
    """Sender-based message log: the ``(seq, payload)`` of every frame a task sent,
    per output channel, since its last checkpoint."""

    def __init__(self) -> None:
        self.frames: dict[int, list[tuple[int, bytes]]] = {}

    def record(self, channel_id: int, seq: int, payload: bytes) -> None:
        self.frames.setdefault(channel_id, []).append((seq, payload))

    def cut(self) -> dict[int, list[tuple[int, bytes]]]:
        """What was logged since the last cut (channels that sent nothing are absent)."""
        frames, self.frames = self.frames, {}
        return frames


class IndependentCheckpoints(TaskProtocol):
    """Per-task half: own timer, frame log per output channel, replay on restart."""

    def __init__(self, task: TaskContext):
        super().__init__(task)
        interval_s = task.checkpoint_interval_s
        assert interval_s is not None   # a checkpointing protocol's run always has one
        self.interval_s: float = interval_s
        # Spread the tasks' timers so they do not checkpoint in lockstep.
        self.rng = random.Random(task.task_id * 7919 + task.attempt)
        self.due_s = time.monotonic() + self.interval_s * self.rng.uniform(0.3, 1.0)
        self.local = 1  # number 0 is every task's implicit initial checkpoint
        self.restored: TaskRestore | None = None
        self.log = FrameLog()

    async def restore(self, recovery_line: Any) -> None:
        if isinstance(recovery_line, RegionLine):  # restarted with part of the job
            recovery_line = recovery_line.line
        info = None if recovery_line is None else recovery_line["tasks"].get(self.task.task_id)
        self.restored = info
        if info is None or info.checkpoint is None:
            await self.task.sinks.reapply_commits()
        else:
            await self.task.state.restore_from(info.checkpoint)
        if info is not None:
            for channel_id, seq in info.expected.items():
                self.task.inputs.expect(channel_id, seq)

    async def on_start(self) -> None:
        task, info = self.task, self.restored
        if info is not None:
            for channel_id, seq in info.next_seq.items():
                task.outputs.set_next_seq(channel_id, seq)
            for channel_id, blobs in info.replay.items():
                for key, first, last in blobs:
                    frames = msgpack.unpackb(await task.state.load_blob(key), use_list=False)
                    for seq, payload in frames:
                        if first <= seq <= last:
                            await task.outputs.resend(channel_id, seq, payload)
        # Replayed frames are logged already, in the checkpoints they came from.
        task.outputs.watch_sent(self.log.record)

    async def between_frames(self) -> None:
        if time.monotonic() >= self.due_s:
            await self.checkpoint()

    async def checkpoint(self, forced: bool = False) -> None:
        task = self.task
        started_s = time.monotonic()
        await task.outputs.flush()    # what the state produced is now sent
        number = checkpoint_number(task.attempt, task.incarnation, self.local, task.task_id)
        self.local += 1
        upload = task.state.checkpoint(number)
        sent = {cid: task.outputs.next_seq(cid) - 1 for cid in task.outputs.ids()}
        received = {cid: task.inputs.last_received(cid) for cid in task.inputs.ids()}
        logs = self.log.cut()
        protocol_state = self.on_checkpoint()
        ref = await upload
        channel_blobs = {}
        for channel_id, frames in logs.items():
            blob = await task.state.store_channel(number, str(channel_id),
                                                  msgpack.packb(frames))
            channel_blobs[channel_id] = (blob, frames[0][0], frames[-1][0])
        task.state.acknowledge(number, ref, {"sent": sent, "received": received,
                                       "channels": channel_blobs,
                                       "protocol_state": protocol_state,
                                       "forced": forced,
                                       "duration_s": time.monotonic() - started_s})
        self.due_s = time.monotonic() + self.interval_s

    def on_checkpoint(self) -> Any:
        """A checkpoint is being taken; return protocol state to store with it."""
        return None


def _latest(graph: CheckpointGraph) -> dict[int, int]:
    """The most recent consistent line of ``graph``: one always exists when it need
    contain no given checkpoint — the initial checkpoints are one."""
    line = graph.recovery_line()
    assert line is not None
    return line


@dataclass
class _Checkpoint:
    record: CheckpointRecord
    refs: list
    channels: dict[int, tuple[Any, int, int]]  # channel -> (blob, first seq, last seq)
    protocol_state: Any = None


class RecoveryLineCoordinator(Coordinator):
    """Collects independent checkpoints, commits sink outputs under the recovery
    line, and computes the line by rollback propagation after a failure."""

    def __init__(self, master: MasterContext):
        super().__init__(master)
        self.checkpoints = master.checkpoint_store()
        self.channels = master.channels()
        self.sink_tasks = master.sink_tasks()
        self.history: dict[int, list[_Checkpoint]] = {t: [] for t in master.task_ids()}
        self.taken = 0
        self.abandoned = 0   # checkpoints above a recovery line: rolled back
        self.committed: set[int] = set()
        self.reclaimed: set[int] = set()   # checkpoints deleted from the store
        self.attempt = -1
        self.loop: asyncio.Task | None = None
        interval_s = master.checkpoint_interval_s
        assert interval_s is not None   # a checkpointing protocol's run always has one
        self.interval_s: float = interval_s
        self.log_bytes = 0
        self.durations_s: list[float] = []
        self.trimmed: dict[int, int] = {}  # channel -> upstream backups hold from here

    def start(self, attempt: int) -> None:
        self.attempt = attempt
        self.loop = asyncio.ensure_future(self._commit_loop())

    async def stop(self) -> None:
        self.attempt = -1  # acknowledgments still on their way no longer count
        await cancel(self.loop)

    def on_acknowledge(self, attempt: int, task_id: int, checkpoint_id: int, ref: Any,
                       meta: Any) -> None:
        if attempt != self.attempt:
            return
        record = CheckpointRecord(task_id, checkpoint_id, meta["sent"], meta["received"])
        blobs = [ref] + [b for b, _, _ in meta["channels"].values()]
        # Acknowledgments may arrive out of order: keep each history sorted by number.
        bisect.insort(self.history[task_id], _Checkpoint(record, blobs, meta["channels"],
                                                         meta.get("protocol_state")),
                      key=lambda cp: cp.record.number)
        self.taken += 1
        self.log_bytes += sum(b.size for b, _, _ in meta["channels"].values())
        asyncio.ensure_future(asyncio.to_thread(
            self.checkpoints.commit, checkpoint_id, blobs, {"task": task_id}))
        self.durations_s.append(meta["duration_s"])
        self.master.record_event("checkpoint_completed", checkpoint_id=checkpoint_id,
                                 task=task_id, duration_s=meta["duration_s"],
                                 state_bytes=ref.size, forced=meta["forced"])

    def _graph(self, restorable_only: bool = False) -> CheckpointGraph:
        records = [cp.record for cps in self.history.values() for cp in cps
                   if not (restorable_only and cp.record.number in self.reclaimed)]
        return CheckpointGraph(records, self.channels, processes=self.history)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            graph = self._graph()
            line = _latest(graph)
            replay_from = graph.replay_from(line)
            await self._commit_sinks(line)
            await self._reclaim(line, replay_from)
            self._trim(replay_from)

    def _trim(self, replay_from: dict[int, int]) -> None:
        """No recovery rolls a receiver back below the job's line (a regional line
        only lies above it), so no restart asks again for what it received there."""
        self.trimmed = replay_from
        self.master.trim_upstream_backups(replay_from)

    async def _reclaim(self, line: dict[int, int], replay_from: dict[int, int]) -> None:
        """Delete the stored checkpoints no recovery can use any more (Wang et al.'s
        checkpoint space reclamation). The line only moves forward, so a task's
        checkpoint below its line checkpoint is never restored again, and its logged
        frames are never replayed again once the receiver's line checkpoint has
        received them all. Their records stay in the history: they still count in
        the invalid-checkpoint statistics."""
        for task_id, cps in self.history.items():
            for cp in cps:
                number = cp.record.number
                if number >= line[task_id] or number in self.reclaimed:
                    continue
                if all(last < replay_from.get(channel_id, 0)
                       for channel_id, (_, _, last) in cp.channels.items()):
                    self.reclaimed.add(number)
                    await asyncio.to_thread(self.checkpoints.discard, number)

    async def _commit_sinks(self, line: dict[int, int] | None) -> None:
        """Commit every sink checkpoint at or below the line (all of them if None), in
        the order the sink took them. Sinks with an outside effect skip a commit older
        than one they applied, so a checkpoint whose acknowledgment is still on its way
        holds back the later ones of its task."""
        for task_id in self.sink_tasks:
            previous = None
            for cp in self.history[task_id]:
                number = cp.record.number
                if line is not None and number > line[task_id]:
                    break
                if not follows(previous, number):
                    break  # an acknowledgment in between has not arrived yet
                previous = number
                if number in self.committed:
                    continue
                # Marked only once made: a commit cut short (the loop is cancelled when
                # a failure is detected) is made again by the next attempt.
                await self.master.commit_outputs(number)
                self.committed.add(number)

    async def on_job_finished(self, task_reports: list[dict[str, Any]]) -> None:
        # No failure can come any more: every sink checkpoint of the surviving history
        # is final, including those whose acknowledgment has not arrived yet.
        await self._commit_sinks(None)
        graph = self._graph()
        line = _latest(graph)
        await self._reclaim(line, graph.replay_from(line))
        for report in task_reports:
            if report["task_id"] in self.sink_tasks:
                for number in sorted(report["acknowledged"]):
                    if number not in self.committed:
                        await self.master.commit_outputs(number)
                        self.committed.add(number)

    async def recovery_line(self) -> Any:
        # A reclaimed checkpoint lies below the line, which only moves forward — until
        # a damaged checkpoint is excluded and the line falls back behind it: the
        # reclaimed ones are gone from the store, so the line is drawn without them.
        graph = self._graph(restorable_only=True)
        line = _latest(graph)
        tasks = self._restore_tasks(line, graph.replay_from(line))
        summary = {t: info.checkpoint for t, info in tasks.items()}
        return {"tasks": tasks, "summary": summary}

    def _restore_tasks(self, line: dict[int, int], replay_from: dict[int, int]
                       ) -> dict[int, TaskRestore]:
        """What each task of ``line`` restores: its line checkpoint, and on every
        channel among them (``replay_from``: the first frame the receiver lacks) where
        the receiver resumes and what the sender sends again from its logs. Their
        checkpoints above the line belong to an abandoned history: forgotten."""
        tasks: dict[int, TaskRestore] = {}
        abandoned = []
        for task_id, task_line in line.items():
            cps = self.history[task_id]
            self.history[task_id] = [cp for cp in cps if cp.record.number <= task_line]
            abandoned += [cp.record.number for cp in cps if cp.record.number > task_line]
            kept = self.history[task_id]
            tasks[task_id] = TaskRestore(kept[-1].record.number if kept else None,
                                         protocol_state=kept[-1].protocol_state if kept else None)
        self.abandoned += len(abandoned)
        # off the restart's critical path: nothing reads an abandoned checkpoint
        asyncio.ensure_future(asyncio.to_thread(
            lambda: [self.checkpoints.discard(n) for n in abandoned]))
        for channel_id, first in replay_from.items():
            src, dst = self.channels[channel_id]
            sent = self._sent(src, channel_id)
            tasks[dst].expected[channel_id] = first
            tasks[src].next_seq[channel_id] = sent + 1
            blobs = []
            for cp in self.history[src]:
                entry = cp.channels.get(channel_id)
                # a reclaimed checkpoint's frames all lie below ``first``: never picked
                if entry is not None and entry[2] >= first and entry[1] <= sent:
                    blobs.append((entry[0].key, first, sent))
            if blobs:
                tasks[src].replay[channel_id] = blobs
        return tasks

    async def region_line(self, tasks: set[int]) -> RegionLine | None:
        """The line of a restart of ``tasks`` alone — the failed tasks and everything
        downstream of them: no channel leaves the region. Every task outside keeps
        its current state, which has sent everything any checkpoint of the region
        received, so no frame from outside is an orphan: rollback propagation runs
        over the region's own checkpoints and channels, from each one's newest. A
        receiver in the region resumes a channel from outside where its line
        checkpoint received it; the sender's upstream backup sends it again from
        there. Its line checkpoint never lies below the job's line (the outside's
        current states constrain less than their checkpoints), so every frame a
        backup forgot (`trim_upstream_backups`) stays forgotten — unless a damaged
        checkpoint (`exclude`) put the line below: then the whole job restarts."""
        channels = self.master.channels()
        if any(src in tasks and dst not in tasks for src, dst in channels.values()):
            return None
        inner = {cid: ends for cid, ends in channels.items() if ends[0] in tasks}
        chosen = region_recovery_line(
            [cp.record for t in tasks for cp in self.history[t]
             if cp.record.number not in self.reclaimed], channels, tasks)
        received = {t: self._restored_record(t, chosen[t]) for t in tasks}
        resume = {cid: (received[dst].get(cid, NOTHING) + 1
                        if dst in received else 0)
                  for cid, (src, dst) in channels.items() if dst in tasks}
        if any(seq < self.trimmed.get(cid, 0) for cid, seq in resume.items()):
            return None
        restore = self._restore_tasks(chosen, {c: resume[c] for c in inner})
        for cid, (src, dst) in channels.items():
            if dst in tasks and src not in tasks:
                restore[dst].expected[cid] = resume[cid]
        summary = {t: info.checkpoint for t, info in restore.items()}
        return RegionLine({"tasks": restore, "summary": summary},
                          {c: resume[c] for c, (src, _) in channels.items()
                           if src not in tasks and c in resume})

    def _restored_record(self, task_id: int, number: int) -> dict[int, int]:
        """What the checkpoint ``number`` of ``task_id`` had received, per channel."""
        for cp in self.history[task_id]:
            if cp.record.number == number:
                return dict(cp.record.received)
        return {}

    def exclude(self, checkpoint_id: int) -> None:
        """Its task can restore neither it nor a later checkpoint of its own: those
        later ones may need its logged frames to be replayed. Forgetting them is what
        a failure right before ``checkpoint_id`` would have left, so the next
        `recovery_line` rolls back around it like around any lost checkpoint."""
        for task_id, cps in self.history.items():
            numbers = [cp.record.number for cp in cps]
            if checkpoint_id in numbers:
                dropped = cps[numbers.index(checkpoint_id):]
                self.history[task_id] = cps[:numbers.index(checkpoint_id)]
                self.abandoned += len(dropped)
                return

    def rolled_back_commits(self, line: Any) -> set[int]:
        # A sink checkpoint above its task's line checkpoint is replayed: whatever it
        # committed is produced again.
        restored = {} if line is None else line["summary"]
        rolled_back = set()
        for number in self.committed:
            task_id = number & 0xFFFF   # the low bits of `checkpoint_number`
            if restored.get(task_id) is None or number > restored[task_id]:
                rolled_back.add(number)
        return rolled_back

    def _sent(self, task_id: int, channel_id: int) -> int:
        kept = self.history[task_id]
        return kept[-1].record.sent.get(channel_id, NOTHING) if kept else NOTHING

    def stats(self, final_counters: Any = None) -> ProtocolStats:
        """Invalid checkpoints: those rolled back past at a recovery, plus those of the
        surviving history that no consistent line can contain (CheckMate §V). The
        state every task finished in counts as its last checkpoint: a checkpoint is
        only useless if no line — up to the end of the job — can use it."""
        total = self.taken
        records = [cp.record for cps in self.history.values() for cp in cps]
        last = {r.process: r.number for r in records}
        finals = [CheckpointRecord(task, last.get(task, 0) + 1, sent, received)
                  for task, (sent, received) in (final_counters or {}).items()]
        useless = invalid_checkpoints(records + finals, self.channels) if records else set()
        invalid = self.abandoned + len(useless - {(r.process, r.number) for r in finals})
        durations = self.durations_s
        return ProtocolStats(
            checkpoints_completed=total,
            checkpoint_duration_s_avg=sum(durations) / len(durations) if durations else None,
            checkpoint_duration_s_max=max(durations, default=None),
            invalid_checkpoints=invalid,
            invalid_share=invalid / total if total else 0.0,
            log_bytes=self.log_bytes,
            # the state of every task's newest checkpoint (what a restart loads)
            state_bytes_last=sum(cps[-1].refs[0].size for cps in self.history.values()
                                 if cps) or None)


class UncoordinatedProtocol(Protocol):
    """Uncoordinated checkpoints, ``bn.protocols.Uncoordinated``: every task
    checkpoints on its own timer and logs what it sends; a failure rolls back to a
    consistent recovery line and replays from the logs (exactly-once).

    ``interval_s``: seconds between a task's checkpoints, or a
    `bastion.options.AutoInterval` chosen before the job starts (no live re-tune);
    ``retained_checkpoints``: kept for the interface's sake — what the recovery line
    has passed is deleted whatever it says."""

    name = "uncoordinated"
    exactly_once = True
    restart_scope = "downstream"
    needs_checkpoint_interval = True
    needs_standby = True
    interval_s: Any = 1.0

    def __init__(self, interval_s: "float | AutoInterval" = 1.0, *,
                 retained_checkpoints: int = 2):
        self.interval_s = knobs.interval(interval_s)
        self.retained_checkpoints = knobs.retained(retained_checkpoints)

    def task_protocol(self, task: TaskContext) -> TaskProtocol:
        return IndependentCheckpoints(task)

    def coordinator(self, master: MasterContext) -> Coordinator:
        return RecoveryLineCoordinator(master)
