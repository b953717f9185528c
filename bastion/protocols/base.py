"""The protocol seam: what a fault-tolerance protocol asks of the engine, and the reverse.

A fault-tolerance protocol has two halves, as in Flink:

- the **task half** (`TaskProtocol`), one per task, sees every data batch and control
  record the task receives and decides when the task snapshots its state — barrier
  alignment, deduplication, in-flight logging and acknowledgments live here;
- the **coordinator half** (`Coordinator`), in the job master, decides what counts as
  a complete checkpoint, makes sink outputs of complete checkpoints visible, and after
  a failure names the *recovery line*: the checkpoint every task restores from.

Each half reaches the engine through one narrow interface, and through nothing else:

- a task half gets a `TaskContext`: its channels' sequence numbers and the frames it
  sends, a way to hold an input back, to send control records and piggyback them on
  frames, to snapshot, store, restore and acknowledge, and the hooks of the
  deterministic merge;
- a coordinator gets a `MasterContext`: the checkpoint store, the plan's shape (tasks,
  channels, sources, sinks), the job's events, and the two actions a coordinator takes
  — trigger the sources, commit outputs.

So the runtime can change its tasks, channels and gates without touching a protocol,
and a new protocol is one module that never reads engine internals. The engine calls
the hooks and never asks which protocol it runs (`Protocol` answers the questions it
has, such as `Protocol.needs_standby`). Hooks run on the event loop of their actor and
must not block it.
"""

from __future__ import annotations

import abc
import asyncio
import math
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Coroutine, Iterable, Sequence,
                    Protocol as Structural)

from bastion.runtime.records import Batch, ControlRecord, FrameCodec

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from bastion.storage import BlobRef, CheckpointStore, ObjectStore
    from bastion.topology import Topology


class InputMerge(Structural):
    """The deterministic merge as an unaligned checkpoint sees it (`bastion.runtime.merge`):
    record what arrives on some inputs after a snapshot, and queue it again on restore."""

    ended_on_arrival: set[int]   # inputs whose end-of-stream is queued, not yet merged

    def capture(self, channel_ids: Iterable[int]) -> dict[int, list]: ...

    def end_capture(self, capture: dict[int, list], channel_id: int) -> list: ...

    def extend(self, channel_id: int, elements: Iterable[Any]) -> None: ...

    def resume(self, consumed: dict[int, int], ended: set[int]) -> None:
        """Set the cursor where it stood once ``consumed[c]`` records of each channel
        were merged and the channels ``ended`` had ended (a replay from there)."""


class StateCodec(Structural):
    """Encodes operator state exactly (`bastion.runtime.durable`): sealed blobs, or
    packed bytes that a checksum of the caller's own covers."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes, what: str) -> Any: ...

    def pack(self, value: Any) -> bytes: ...

    def pack_many(self, values: list) -> list[bytes]: ...

    def unpack(self, data: bytes, what: str) -> Any: ...

    def unpack_many(self, datas: list[bytes], what: str) -> list: ...


class PartedOperator(Structural):
    """A stateful operator whose state splits into independent *parts* (a key of a
    keyed fold or count window, a time window), as a protocol that checkpoints part by
    part sees it; `TaskContext.replace_operator` takes a wrapper with the same calls."""

    ctx: Any                      # name, index, code: for messages and dead letters
    node: Any                     # the topology node it runs
    opened: list | None           # a list: `process` appends each part it opens
    closed: list | None           # a list: `on_watermark` appends each part it closes
    overlapping: bool             # a record goes into several parts (a sliding window)
    keyed: bool                   # its state splits by record key (it may rescale)
    opens_empty: bool             # every part starts from `empty_part_state()` (a window)

    def process(self, batch: Batch, input_index: int) -> Batch | None: ...

    def on_watermark(self, watermark: float) -> Batch | None: ...

    def on_end(self) -> Batch | None: ...

    def parts_of(self, batch: Batch) -> list: ...

    def windows_of(self, batch: Batch) -> list: ...

    def process_into(self, batch: Batch, parts: list, input_index: int = 0
                     ) -> Batch | None: ...

    def part_state(self, part: Any) -> Any: ...

    def load_part(self, part: Any, state: Any) -> None: ...

    def empty_part_state(self) -> Any: ...

    def part_retired(self, part: Any, watermark: float) -> bool: ...

    def open_among(self, parts: Iterable[Any]) -> list: ...

    def open_parts(self) -> list: ...

    def results_form(self, out: Batch) -> list: ...

    def results_batch(self, form: list) -> Batch: ...

    def snapshot(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


class TaskInputs(abc.ABC):
    """A task's input channels, as a protocol sees them: where each stands, and a way
    to hold one back. Channels are named by their channel ids; sequence numbers count
    frames per channel from 0."""

    @abc.abstractmethod
    def ids(self) -> list[int]:
        """Every input channel, feedback channels included."""

    @abc.abstractmethod
    def open_ids(self) -> set[int]:
        """The ordinary (not feedback) inputs that have not delivered end-of-stream."""

    @abc.abstractmethod
    def sender_of(self, channel_id: int) -> int:
        """The task that sends on input ``channel_id``."""

    @abc.abstractmethod
    def last_received(self, channel_id: int) -> int:
        """Sequence number of the last frame taken from an input (-1: none)."""

    @abc.abstractmethod
    def expect(self, channel_id: int, seq: int) -> None:
        """The restored state reflects the input's frames below ``seq``: drop them when
        they arrive again, and count ``seq - 1`` as the last received."""

    @abc.abstractmethod
    def resync(self, channel_id: int) -> None:
        """The input's next frame, whatever its number, is the first this task takes
        (`InputGate.resync`): its sender's upstream backup resends what it kept."""

    @abc.abstractmethod
    def end(self, channel_ids: set[int]) -> None:
        """Inputs that had ended at the point a replay restores (their end-of-stream
        arrives again, and is ignored)."""

    @abc.abstractmethod
    def hold_back(self, channel_id: int) -> None:
        """Take no more frames from an input (its senders stall on their credits). The
        rest of a frame being processed goes to `TaskProtocol.stash`."""

    @abc.abstractmethod
    def is_held(self, channel_id: int) -> bool: ...

    @abc.abstractmethod
    def let_through(self, channel_id: int) -> None:
        """Take frames from a held input again."""

    @abc.abstractmethod
    async def process(self, channel_id: int, elements: list) -> None:
        """Process elements the protocol stashed, as if they had just arrived."""


class TaskOutputs(abc.ABC):
    """A task's output channels, as a protocol sees them: their sequence numbers, the
    frames they keep for a resend, and control records sent in order with the data."""

    @abc.abstractmethod
    def ids(self) -> list[int]:
        """Every output channel."""

    @abc.abstractmethod
    def next_seq(self, channel_id: int) -> int:
        """The sequence number the next frame sent on an output gets."""

    @abc.abstractmethod
    def set_next_seq(self, channel_id: int, seq: int) -> None:
        """Number the output's frames from ``seq`` on (a restored sender)."""

    @abc.abstractmethod
    async def trim_sent(self, channel_id: int, below_seq: int) -> None:
        """The output's frames below ``below_seq`` are reflected in a completed
        checkpoint of their receiver: its upstream backup (kept when the job restarts
        failed regions only) may forget them."""

    @abc.abstractmethod
    async def resend(self, channel_id: int, seq: int, payload: bytes) -> None:
        """Send an encoded frame again with its original sequence number (replay)."""

    @abc.abstractmethod
    def watch_sent(self, listener: Callable[[int, int, bytes], None]) -> None:
        """Call ``listener(channel_id, seq, payload)`` for every frame sent from now on
        (sender-based message logging)."""

    @abc.abstractmethod
    def piggyback(self, make: Callable[[int], ControlRecord]) -> None:
        """Put ``make(destination task id)`` at the head of every frame sent from now
        on; its bytes count as protocol overhead."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Send every buffered output frame now."""

    @abc.abstractmethod
    async def send_control(self, control: ControlRecord) -> None:
        """Send a control record on every output channel, now, in order with the data;
        its bytes count as protocol overhead."""


class TaskState(abc.ABC):
    """Snapshots of a task's state and of its channels, in the job's store, and the
    acknowledgment that tells the coordinator one is stored."""

    @abc.abstractmethod
    def checkpoint(self, checkpoint_id: int) -> Coroutine[Any, Any, "BlobRef"]:
        """Snapshot the task now; the coroutine stores the snapshot and the sinks'
        staged outputs and yields the state blob to acknowledge (close it unawaited
        to drop the snapshot)."""

    @abc.abstractmethod
    async def restore_from(self, checkpoint_id: int) -> None:
        """Load the task's state from a complete checkpoint (and re-apply commits)."""

    @abc.abstractmethod
    async def store_channel(self, checkpoint_id: int, name: str, data: bytes) -> "BlobRef":
        """Store in-flight input or output with checkpoint ``checkpoint_id``."""

    @abc.abstractmethod
    async def load_channel(self, checkpoint_id: int, name: str) -> bytes:
        """Channel state stored with a complete checkpoint, CRC-verified."""

    @abc.abstractmethod
    async def load_blob(self, key: str) -> bytes:
        """A stored blob by key (channel state of a checkpoint not yet complete)."""

    @abc.abstractmethod
    def acknowledge(self, checkpoint_id: int, ref: "BlobRef | None", meta: Any = None) -> None:
        """Tell the coordinator this task stored its part of ``checkpoint_id`` (``ref``:
        the blob it stored; None: nothing to store, as a sink's commit point)."""

    @abc.abstractmethod
    def object_store(self) -> "ObjectStore":
        """The job's store (a protocol that keeps logs of its own writes them here)."""

    @abc.abstractmethod
    def savepoint_position(self) -> dict[str, int] | None:
        """Of a job resumed from a savepoint (`bastion.runtime.savepoint`), whose
        state the task's operators hold when it first starts: per source instance
        (``"<source code>/<instance>"``) the last position that state reflects.
        None: the job starts from no savepoint."""


class TaskChain(abc.ABC):
    """The chain of operators a task runs, for protocols that checkpoint state part by
    part (CEC) and for those that track tuples through the topology (acks)."""

    @abc.abstractmethod
    def parted_operator(self) -> tuple[str, PartedOperator] | None:
        """The chain's stateful operator whose state splits into parts (see
        `bastion.runtime.operators.Operator.parted`), with its name, or None."""

    @abc.abstractmethod
    def replace_operator(self, name: str, operator: Any) -> None:
        """Run ``operator`` in place of the chain's operator ``name`` (a wrapper)."""

    @abc.abstractmethod
    async def emit_after(self, name: str, batch: Batch) -> None:
        """Send ``batch`` on as if operator ``name`` had just produced it: through the
        rest of the chain and out on the task's channels."""

    @abc.abstractmethod
    def set_watermark(self, watermark: float) -> None:
        """Restore the task's watermark (and its inputs') to ``watermark``."""

    @abc.abstractmethod
    def op_kinds(self) -> list[str]:
        """Every operator's kind in the topology, by operator code (`bastion.lineage`)."""

    @abc.abstractmethod
    def is_source(self) -> bool: ...

    @abc.abstractmethod
    def has_sinks(self) -> bool: ...


class TaskSources(abc.ABC):
    """Where the job's sources stand: rewinding this task's source to a replay point,
    and finding any source instance's task (to acknowledge its tuples)."""

    @abc.abstractmethod
    def identity(self) -> tuple[int, int]:
        """``(source operator code, instance)`` of this source task."""

    @abc.abstractmethod
    def task_of(self, source_code: int, instance: int) -> int:
        """The task that runs instance ``instance`` of source ``source_code``."""

    @abc.abstractmethod
    def rewind(self, replay_from: dict[str, int]) -> None:
        """Source instances read on after the offset ``replay_from["<op code>/<index>"]``
        (from the beginning when missing): what they read before is skipped."""

    @abc.abstractmethod
    async def replay(self, batch: Batch) -> None:
        """Send records this source task read before (with their ids) through its
        chain again; they are not counted as read again."""


class TaskSinks(abc.ABC):
    """The task's sinks' commit points: staging, committing, re-applying and
    deduplicating what they write."""

    @abc.abstractmethod
    def tasks(self) -> list[int]:
        """The job's tasks whose chain holds a sink."""

    @abc.abstractmethod
    async def stage(self, commit: int) -> bool:
        """Store what the sinks staged since their last commit point as commit point
        ``commit`` (nothing else: no state). False when they staged nothing."""

    @abc.abstractmethod
    async def commit(self, commit: int) -> bool:
        """Stage as `stage`, then have the job master commit it now; True once it is
        committed (or nothing was staged), False when the attempt is over and it was
        not."""

    @abc.abstractmethod
    async def reapply_commits(self) -> None:
        """Starting from nothing: sinks with outside effects re-apply committed outputs."""

    @abc.abstractmethod
    async def deduplicate(self, jobs: list[str]) -> None:
        """From now on the task's sinks drop records whose lineage id they committed
        before in any of ``jobs`` (read back now) or staged since."""


class TaskContext(abc.ABC):
    """What a task protocol may see and do in its task: who the task is, and six
    narrow views, one per concern — ``inputs`` and ``outputs`` (channels, sequence
    numbers, holding back, control records), ``state`` (snapshots, channel state,
    acknowledgments), ``chain`` (the operators it runs), ``sources`` and ``sinks``
    (replay points and commit points) — plus the two calls that reach other tasks and
    the metrics (`send_acks`, `observe_latencies`)."""

    task_id: int
    name: str                    # for messages: "<chain>[<index>]"
    index: int                   # the chain instance this task runs
    job_id: str
    attempt: int                 # grows with every restart of the job
    incarnation: int             # grows each time this task restarts on its own
    task_count: int              # tasks in the job (task ids are 0..task_count-1)
    checkpoint_interval_s: float | None
    codec: FrameCodec            # encodes elements the protocol stores (channel state)
    state_codec: StateCodec      # encodes operator state exactly (sealed blobs)
    merge: InputMerge | None     # the deterministic merge, None unless deterministic

    inputs: TaskInputs
    outputs: TaskOutputs
    state: TaskState
    chain: TaskChain
    sources: TaskSources
    sinks: TaskSinks

    @property
    @abc.abstractmethod
    def watermark(self) -> float:
        """The task's event-time watermark now."""

    @abc.abstractmethod
    def send_acks(self, task_id: int, entries: list) -> None:
        """Deliver ``entries`` (msgpack-able) to task ``task_id``'s
        `TaskProtocol.on_acks` — this task's own at once, another's over the data
        plane — without waiting; lost if either task's attempt ends first."""

    @abc.abstractmethod
    def observe_latencies(self, name: str, latencies_s: "Sequence[float] | np.ndarray"
                          ) -> None:
        """Add latencies (seconds; a list or an array) the protocol measured to the
        task's histogram ``name``; merged over tasks into ``RunResult.metrics.extra[
        "protocol_latency_ms"][name]`` (mean, p50, p90, p99)."""


#: Where each call of the flat `TaskContext` of earlier releases lives now, for the
#: error a protocol written against it gets (`moved_context_call`).
MOVED_CONTEXT_CALLS: dict[str, str] = {
    "input_ids": "inputs.ids", "open_input_ids": "inputs.open_ids",
    "last_received": "inputs.last_received", "expect": "inputs.expect",
    "resync": "inputs.resync", "sender_of": "inputs.sender_of",
    "hold_back": "inputs.hold_back", "is_held": "inputs.is_held",
    "let_through": "inputs.let_through", "process": "inputs.process",
    "end_inputs": "inputs.end",
    "output_ids": "outputs.ids", "next_seq": "outputs.next_seq",
    "set_next_seq": "outputs.set_next_seq", "trim_sent": "outputs.trim_sent",
    "resend": "outputs.resend", "watch_sent": "outputs.watch_sent",
    "piggyback": "outputs.piggyback", "flush_outputs": "outputs.flush",
    "send_control": "outputs.send_control",
    "checkpoint": "state.checkpoint", "restore_from": "state.restore_from",
    "store_channel_state": "state.store_channel",
    "load_channel_state": "state.load_channel", "load_blob": "state.load_blob",
    "acknowledge": "state.acknowledge", "object_store": "state.object_store",
    "parted_operator": "chain.parted_operator",
    "replace_operator": "chain.replace_operator", "emit_after": "chain.emit_after",
    "set_watermark": "chain.set_watermark", "op_kinds": "chain.op_kinds",
    "is_source": "chain.is_source", "has_sinks": "chain.has_sinks",
    "source_identity": "sources.identity", "source_task": "sources.task_of",
    "rewind_sources": "sources.rewind", "replay_source_records": "sources.replay",
    "sink_tasks": "sinks.tasks", "stage_sink_outputs": "sinks.stage",
    "commit_sink_outputs": "sinks.commit", "reapply_commits": "sinks.reapply_commits",
    "deduplicate_sinks": "sinks.deduplicate",
}


def moved_context_call(name: str) -> str | None:
    """The message for a protocol that asks a `TaskContext` for ``name`` as the flat
    context of earlier releases had it, or None when ``name`` never was one."""
    if name == "count_protocol_bytes":
        return ("TaskContext.count_protocol_bytes() is gone: control records sent with "
                "outputs.send_control() or outputs.piggyback() are counted as they go")
    new = MOVED_CONTEXT_CALLS.get(name)
    return None if new is None else f"TaskContext.{name}() moved: use task.{new}()"


class MasterContext(abc.ABC):
    """What a coordinator may see and do in the job master."""

    checkpoint_interval_s: float | None
    retained_checkpoints: int    # complete checkpoints a coordinated store keeps
    job_id: str
    resume_from: str | None      # the earlier job this one starts from, if any

    @property
    @abc.abstractmethod
    def attempt(self) -> int:
        """The attempt running now (it grows with every restart)."""

    @abc.abstractmethod
    def checkpoint_store(self) -> "CheckpointStore": ...

    @abc.abstractmethod
    def object_store(self) -> "ObjectStore": ...

    # -- the plan's shape ------------------------------------------------------------------

    @abc.abstractmethod
    def task_ids(self) -> list[int]: ...

    @abc.abstractmethod
    def channels(self) -> dict[int, tuple[int, int]]:
        """Every channel: ``{channel id: (sending task, receiving task)}``."""

    @abc.abstractmethod
    def instances(self) -> dict[int, list[tuple[str, int]]]:
        """Per task, the operator instances its chain runs, ``(operator, index)``, in
        chain order."""

    @abc.abstractmethod
    def source_tasks(self) -> set[int]: ...

    @abc.abstractmethod
    def sink_tasks(self) -> set[int]:
        """Tasks whose chain holds a sink (they stage outputs)."""

    @abc.abstractmethod
    def operators(self) -> dict[str, tuple[str, int]]:
        """Every operator: ``{name: (kind, parallelism)}``."""

    @abc.abstractmethod
    def unfinished_tasks(self) -> set[int]: ...

    @abc.abstractmethod
    def pending_tasks(self) -> set[int]:
        """Tasks waiting for capacity after a failure (not running yet): a checkpoint
        waits for them instead of timing out — they take it once they run."""

    @abc.abstractmethod
    def all_sources_running(self) -> bool: ...

    # -- actions ----------------------------------------------------------------------------

    @abc.abstractmethod
    def record_event(self, kind: str, **fields: Any) -> None: ...

    @abc.abstractmethod
    async def trigger_sources(self, attempt: int, checkpoint_id: int) -> set[int]:
        """Ask every source task of ``attempt`` to start checkpoint ``checkpoint_id``;
        the sources that had finished and will not take it (a worker that does not
        answer within a second is not waited for)."""

    @abc.abstractmethod
    async def commit_outputs(self, commit: int) -> None:
        """Make the sink outputs staged for commit point ``commit`` visible: final
        once made, whichever attempt staged them."""

    @abc.abstractmethod
    def trim_upstream_backups(self, below: dict[int, int]) -> None:
        """No restart will ask for the frames below ``below[channel]`` again: the
        senders' upstream backups, if the failover keeps them, forget them (in the
        background; a backup that keeps them longer only holds more)."""

    def checkpoint_completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed and its outputs are committed: the
        job master may end what a recovery began (adaptive buffering, which turns
        off at the first checkpoint completed once every lost task runs again)."""


@dataclass(frozen=True)
class RegionLine:
    """What the tasks of a regional restart restore from (`Coordinator.region_line`):
    the protocol's ``line`` (handed to `TaskProtocol.restore` with the rest), and
    where the restored tasks stand on each channel: ``resume[channel]`` is the first
    frame they send on it (an output) or expect on it (an input). The job master
    has every sender outside the region send its receivers inside it the frames
    from there on, out of its upstream backup. ``retake``: checkpoints after the
    line that were given up (timed out) but whose outputs are still to be committed,
    in order: the region's sources are triggered for them again when they run, before
    the checkpoint in progress, so that every restored task takes them again — a
    task downstream of a restored source would otherwise wait for their barriers
    forever, and the outputs its incarnation before staged under them would be
    committed beside their replay."""

    line: Any
    resume: dict[int, int]
    retake: tuple[int, ...] = ()


@dataclass
class ProtocolStats:
    """What a coordinator reports at the end of a job (`bastion.runtime.metrics`
    defines each figure)."""

    checkpoints_completed: int = 0
    checkpoints_aborted: int = 0
    forced_checkpoints: int = 0
    checkpoint_duration_s_avg: float | None = None
    checkpoint_duration_s_max: float | None = None
    invalid_checkpoints: int = 0
    invalid_share: float = 0.0
    log_bytes: int = 0            # in-flight frames stored with checkpoints
    state_bytes_last: int | None = None


class TaskProtocol:
    """Per-task half. The defaults pass everything through and never checkpoint."""

    def __init__(self, task: TaskContext):
        self.task = task

    async def restore(self, recovery_line: Any) -> None:
        """Before the task starts: restore it from the coordinator's recovery line
        (None: start from the beginning, re-applying outputs already committed)."""
        if recovery_line is None:
            await self.task.sinks.reapply_commits()
        else:
            await self.task.state.restore_from(recovery_line)

    async def on_start(self) -> None:
        """The task's loop is about to start (replay in-flight messages here)."""

    async def on_frame(self, channel_id: int, seq: int, frame: list) -> None:
        """A frame is about to be processed (``seq`` is its channel sequence number)."""

    async def between_frames(self) -> None:
        """The task finished a frame (or a source batch): a point where its state is
        consistent with what it sent and received — where it may checkpoint."""

    def on_batch(self, channel_id: int, batch: Batch) -> Batch | None:
        """A data batch arrived on a channel; return what to process (None: nothing)."""
        return batch

    async def on_control(self, channel_id: int, control: ControlRecord) -> None:
        """A protocol control record (not a watermark or end-of-stream) arrived."""
        raise ValueError(f"task {self.task.name!r} received {control!r}, which protocol "
                         f"{type(self).__name__} does not handle")

    def stash(self, channel_id: int, elements: list) -> None:
        """The rest of a frame from an input this protocol holds back: keep it until
        it lets the input through (`TaskContext.process`)."""
        raise RuntimeError(f"{type(self).__name__} held input {channel_id} of task "
                           f"{self.task.name!r} back without keeping what it held")

    async def on_trigger(self, checkpoint_id: int) -> None:
        """The coordinator asks this source task to start checkpoint ``checkpoint_id``."""

    async def on_input_ended(self, channel_id: int) -> None:
        """An input delivered its end-of-stream."""

    async def on_finished(self) -> None:
        """Every input ended and every output was flushed."""

    async def on_checkpoint_completed(self, checkpoint_id: int) -> None:
        """Checkpoint (commit point) ``checkpoint_id`` is complete."""

    def on_stop(self) -> None:
        """The task stopped — finished, failed or cancelled: release what the protocol
        holds (a log writer, a thread). Must not block for long."""

    def counters(self) -> dict[str, float]:
        """What the protocol counted in this task, for `RunResult.metrics`'s
        ``extra["protocol_counters"]`` (summed over tasks; a name ``max_...``: the
        largest)."""
        return {}

    # -- tuple tracking -------------------------------------------------------------------

    def on_source_batch(self, batch: Batch) -> None:
        """A source task read ``batch`` (with its ids); it is processed next."""

    def on_emit(self, batch: Batch, channel_id: int, copy: bool) -> None:
        """``batch`` leaves the task on output channel ``channel_id``; ``copy``: as a
        redundant copy of tuples sent on another channel too
        (`bastion.runtime.redundancy`)."""

    def source_room(self) -> float:
        """How many records the source task may read now (0: it waits, and calls
        `between_frames` meanwhile)."""
        return math.inf

    async def before_source_end(self) -> None:
        """The source's input is exhausted; the task ends once this returns."""

    def on_acks(self, entries: list) -> None:
        """Entries another task (or this one) sent with `TaskContext.send_acks`."""


class Coordinator:
    """Job-master half. The default takes no checkpoints: a failure restarts the job
    from the beginning, and outputs are committed once, at the end of the stream."""

    def __init__(self, master: MasterContext):
        self.master = master

    def start(self, attempt: int) -> None:
        """Tasks of ``attempt`` are running."""

    async def stop(self) -> None:
        """A failure was detected or the job finished: abandon checkpoints in flight."""

    def on_acknowledge(self, attempt: int, task_id: int, checkpoint_id: int,
                       ref: "BlobRef", meta: Any) -> None:
        """A task stored its part of ``checkpoint_id``."""

    def checkpoint_in_progress(self) -> int | None:
        """The id of a checkpoint started and not yet complete, if any."""
        return None

    def set_interval(self, interval_s: float) -> bool:
        """Take checkpoints every ``interval_s`` seconds from now on, while the job runs
        (a live re-tune, `bastion.scheduler.retune`). False: this coordinator's interval
        is fixed for the run (`Protocol.live_interval` says so before it starts)."""
        return False

    async def initial_line(self) -> Any:
        """What every task of the first attempt restores from (None: nothing; a
        resumable protocol's line when the job resumes an earlier one)."""
        return None

    async def recovery_line(self) -> Any:
        """What every task restores from after a failure, handed to each task's
        `TaskProtocol.restore` (None: restart from the beginning)."""
        return None

    async def region_line(self, tasks: set[int]) -> "RegionLine | None":
        """Only ``tasks`` restart (a *regional restart*: the tasks a failure lost and
        every task downstream of them); every other task keeps running. The line
        they restore from, or None when this protocol cannot restart a region now —
        the job then restarts whole, from `recovery_line`. Checkpoints in progress
        must now wait for the restarted tasks to take them again."""
        return None

    def exclude(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` cannot be restored (a blob of it is damaged or
        missing): no recovery line from now on may use it. The job master then asks
        for `recovery_line` again. A coordinator that takes no checkpoints never
        names one, so is never asked."""

    def rolled_back_commits(self, line: Any) -> set[int]:
        """The commit points already made whose outputs a restart from ``line`` (what
        `recovery_line` returned) would produce, and commit, again. Normally none:
        a line never lies below a commit; after `exclude` it may."""
        return set()

    async def on_job_finished(self, task_reports: list[dict[str, Any]]) -> None:
        """Every task finished: commit what is final before the end-of-stream commit.
        ``task_reports`` list, per task, the checkpoints it acknowledged (an
        acknowledgment may still be on its way)."""

    def stats(self, final_counters: dict[int, tuple[dict, dict]] | None = None
              ) -> ProtocolStats:
        """Protocol metrics; ``final_counters`` gives each task's last sent and received
        sequence numbers per channel when the job finished."""
        return ProtocolStats()


class Protocol:
    """A fault-tolerance protocol, chosen by name in `bn.run(protocol=...)`. The
    defaults describe a protocol that takes no checkpoints."""

    name: str = ""
    exactly_once: bool = False
    # Nothing is lost, duplicates are allowed: a drill's verdict is "at-least-once"
    # when it finds duplicates only.
    at_least_once: bool = False
    needs_checkpoint_interval: bool = False
    # Why the protocol cannot run with a deterministic merge (None: it can).
    nondeterministic_merge: str | None = None
    # Tasks acknowledge the tuples they take in (`TaskContext.send_acks`): a fault
    # injected in the "ack" phase has something to delay.
    acknowledges_tuples: bool = False
    # Records must carry lineage ids (`bastion.lineage`): the run turns them on.
    needs_lineage: bool = False
    # A tuple may be processed twice without breaking what the protocol promises, so
    # tuple-level redundancy (`bastion.runtime.redundancy`) may send it to two instances.
    tolerates_copies: bool = False
    # A job can start from the state an earlier job left (`bn.run(resume_from=...)`).
    resumable: bool = False
    # A job resumed from a savepoint loads it into every task before the protocol
    # restores the task, whatever the line; False: only at the first start (the
    # protocol's own restarts rebuild the whole state without it — CEC's log holds
    # the savepoint's parts from the first start on, and a time window the job
    # fired since must not come back from the savepoint).
    savepoint_under_restarts: bool = True
    # Which tasks a failure restarts (`bastion.scheduler.failover`): "job", every
    # task (the recovery line rewinds them all); "region", a region no channel
    # crosses downstream (`Coordinator.region_line` restores it); "downstream", the
    # failed tasks and every task downstream of them, fed again from upstream
    # backups; "task", a failed task alone, while its neighbours run on — what it
    # held is replayed.
    restart_scope: str = "job"
    # A standby worker, started ahead, takes over a dead slot without a process start.
    # A protocol that restarts the job from the beginning gains little from it and
    # would pay its start (about a core-second) in every run.
    needs_standby: bool = False
    # The coordinator takes a new checkpoint interval while the job runs
    # (`Coordinator.set_interval`): a live re-tune may move it.
    live_interval: bool = False
    # The protocol's own knobs (`bastion.options`): how often it checkpoints (or
    # commits), in seconds or as a `bastion.options.AutoInterval` — None for a
    # protocol that takes no checkpoints — and how many complete checkpoints it keeps.
    # The launcher copies them into the job's `JobConfig`, where tasks and the
    # coordinator read them.
    interval_s: Any = None
    retained_checkpoints: int = 2

    def check(self, topology: "Topology") -> None:
        """Raise `TopologyError` if this protocol cannot run ``topology``."""

    def check_interval(self, checkpoint_interval_s: float | None) -> None:
        """Raise `ValueError` if this protocol's own options do not fit the run's
        checkpoint (or commit) interval."""

    def dedup_window_s(self) -> float:
        """How long receivers remember tuple ids to drop redundant copies, unless the
        run says: long enough that a copy stuck behind a stalled instance (a pause of
        seconds) still finds its id."""
        return 5.0

    def check_copies(self, dedup_window_s: float) -> None:
        """Raise `ValueError` if receivers that remember tuple ids for
        ``dedup_window_s`` (to drop redundant copies) would break this protocol."""

    def task_protocol(self, task: TaskContext) -> TaskProtocol:
        return TaskProtocol(task)

    def coordinator(self, master: MasterContext) -> Coordinator:
        return Coordinator(master)


async def cancel(pending: "asyncio.Task | None") -> None:
    """Cancel an asyncio task and wait until it is gone."""
    if pending is not None and not pending.done():
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
