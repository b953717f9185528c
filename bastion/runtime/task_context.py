"""The runtime's side of the protocol seam: the `TaskContext` a task's protocol sees.

A protocol (`bastion.protocols`) never holds a `Task`. It gets a `TaskContext`, which
answers who the task is and offers six narrow views, one per concern:

- ``inputs`` — the task's input channels: where each stands, holding one back;
- ``outputs`` — its output channels: sequence numbers, the upstream backup, control
  records and piggybacked clocks, both counted as protocol overhead;
- ``state`` — snapshots of the task and of in-flight channel contents in the job's
  store, and the acknowledgment that tells the coordinator one is stored;
- ``chain`` — the operators the task runs (CEC wraps its parted operator);
- ``sources`` and ``sinks`` — replay points and commit points.

Each view is a small object over the task's own fields, here, so `Task` itself keeps
the data plane (its loop, routing, snapshots) and the views keep what a protocol may
do with it. A protocol written against the flat context of earlier releases
(``task.flush_outputs()``) gets an `AttributeError` naming the call's new place.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Sequence

from bastion.protocols.base import (TaskChain, TaskContext, TaskInputs, TaskOutputs,
                                    TaskSinks, TaskSources, TaskState, moved_context_call)
from bastion.runtime.channel import ReplayableOutputChannel
from bastion.runtime.durable import open_bytes, seal
from bastion.runtime.metrics import LatencyHistogram
from bastion.runtime.outputs import committed_blobs
from bastion.runtime.records import Batch, ControlRecord
from bastion.storage import BlobRef, ObjectStore

if TYPE_CHECKING:
    import numpy as np
    from bastion.runtime.instance import Task


class _Inputs(TaskInputs):
    def __init__(self, task: Task):
        self._task = task

    def ids(self) -> list[int]:
        return list(self._task.inputs)

    def open_ids(self) -> set[int]:
        return set(self._task.open_inputs)

    def sender_of(self, channel_id: int) -> int:
        return self._task.inputs[channel_id].src_task

    def last_received(self, channel_id: int) -> int:
        return self._task.received_seq.get(channel_id, -1)

    def expect(self, channel_id: int, seq: int) -> None:
        self._task.gate.expect(channel_id, seq)
        self._task.received_seq[channel_id] = seq - 1

    def resync(self, channel_id: int) -> None:
        self._task.gate.resync(channel_id)

    def end(self, channel_ids: set[int]) -> None:
        task = self._task
        task.open_inputs -= channel_ids
        for channel_id in channel_ids:
            task.channel_watermarks.pop(channel_id, None)

    def hold_back(self, channel_id: int) -> None:
        self._task.held.add(channel_id)
        self._task.gate.block(channel_id)

    def is_held(self, channel_id: int) -> bool:
        return channel_id in self._task.held

    def let_through(self, channel_id: int) -> None:
        self._task.held.discard(channel_id)
        self._task.gate.unblock(channel_id)

    async def process(self, channel_id: int, elements: list) -> None:
        task = self._task
        await task.process_frame(task.inputs[channel_id], elements)


class _Outputs(TaskOutputs):
    def __init__(self, task: Task):
        self._task = task

    def ids(self) -> list[int]:
        return [c.channel_id for c in self._task.channels]

    def next_seq(self, channel_id: int) -> int:
        return self._task.outputs[channel_id].seq

    def set_next_seq(self, channel_id: int, seq: int) -> None:
        self._task.outputs[channel_id].seq = seq

    async def trim_sent(self, channel_id: int, below_seq: int) -> None:
        channel = self._task.outputs[channel_id]
        if isinstance(channel, ReplayableOutputChannel):
            await channel.trim(below_seq)

    async def resend(self, channel_id: int, seq: int, payload: bytes) -> None:
        await self._task.outputs[channel_id].transmit(seq, payload)

    def watch_sent(self, listener: Callable[[int, int, bytes], None] | None) -> None:
        for channel in self._task.channels:
            channel.on_sent = listener

    def piggyback(self, make: Callable[[int], ControlRecord]) -> None:
        task = self._task
        encode = task.codec.encode

        def decorating(dst: int) -> Callable[[list], list]:
            def decorate(frame: list) -> list:
                record = make(dst)
                task.protocol_frame_bytes += len(encode([record]))
                return [record] + frame
            return decorate

        for channel, dst in zip(task.channels, task.channel_destinations):
            channel.decorate = decorating(dst)

    async def flush(self) -> None:
        for channel in self._task.channels:
            await channel.flush()

    async def send_control(self, control: ControlRecord) -> None:
        task = self._task
        task.protocol_frame_bytes += len(task.codec.encode([control])) * len(task.channels)
        for channel in task.channels:
            channel.add_control(control)
            await channel.flush()


class _State(TaskState):
    # Channel state is sealed (checksummed) here, so protocols store plain bytes and
    # read back only bytes that pass the check.

    def __init__(self, task: Task):
        self._task = task

    def checkpoint(self, checkpoint_id: int) -> Coroutine[Any, Any, BlobRef]:
        return self._task.checkpoint(checkpoint_id)

    async def restore_from(self, checkpoint_id: int) -> None:
        await self._task.restore_from(checkpoint_id)

    async def store_channel(self, checkpoint_id: int, name: str, data: bytes) -> BlobRef:
        return await asyncio.to_thread(self._task.checkpoints.put_channel, checkpoint_id,
                                       name, seal(data))

    async def load_channel(self, checkpoint_id: int, name: str) -> bytes:
        data = await asyncio.to_thread(self._task.checkpoints.load_channel, checkpoint_id,
                                       name)
        return open_bytes(data, f"checkpoint {checkpoint_id}, channel state {name!r}")

    async def load_blob(self, key: str) -> bytes:
        return open_bytes(await self._task.store.aget(key), key)

    def acknowledge(self, checkpoint_id: int, ref: BlobRef | None, meta: Any = None) -> None:
        task = self._task
        task.acknowledged.append(checkpoint_id)
        task.protocol_message_bytes += len(pickle.dumps((checkpoint_id, ref, meta),
                                                        protocol=5))
        task.master.acknowledge(task.attempt, task.task_id, checkpoint_id, ref, meta,
                                task.incarnation, task.sink_records_received())

    def object_store(self) -> ObjectStore:
        return self._task.store

    def savepoint_position(self) -> dict[str, int] | None:
        task = self._task
        saved = task.config.savepoint
        if saved is None:
            return None
        codes = task.op_codes
        return {f"{codes[name]}/{blob['index']}": blob["position"] - 1
                for name, op in saved.operators.items() if op["kind"] == "source"
                and name in codes for blob in op["instances"]}


class _Chain(TaskChain):
    def __init__(self, task: Task):
        self._task = task

    def parted_operator(self) -> tuple[str, Any] | None:
        for name, op in zip(self._task.op_names, self._task.ops):
            if op.parted:
                return name, op
        return None

    def replace_operator(self, name: str, operator: Any) -> None:
        self._task.ops[self._task.op_names.index(name)] = operator

    async def emit_after(self, name: str, batch: Batch) -> None:
        await self._task.emit_after(name, batch)

    def set_watermark(self, watermark: float) -> None:
        task = self._task
        task.watermark = watermark
        for channel_id in task.channel_watermarks:
            task.channel_watermarks[channel_id] = watermark

    def op_kinds(self) -> list[str]:
        return [node.kind for node in self._task.physical.topology.nodes.values()]

    def is_source(self) -> bool:
        return self._task.source is not None

    def has_sinks(self) -> bool:
        return bool(self._task.sinks)


class _Sources(TaskSources):
    def __init__(self, task: Task):
        self._task = task

    def identity(self) -> tuple[int, int]:
        source = self._task.source
        assert source is not None  # asked of a source task only
        return source.ctx.code, self._task.index

    def task_of(self, source_code: int, instance: int) -> int:
        return self._task.source_tasks[(source_code, instance)]

    def rewind(self, replay_from: dict[str, int]) -> None:
        task = self._task
        if task.source is None:
            return
        task.source.skip(replay_from.get(f"{task.source.ctx.code}/{task.index}", -1) + 1,
                         task.config.source_batch_records)

    async def replay(self, batch: Batch) -> None:
        await self._task.emit_after(self._task.op_names[0], batch, counted=False)


class _Sinks(TaskSinks):
    def __init__(self, task: Task):
        self._task = task

    def tasks(self) -> list[int]:
        physical = self._task.physical
        nodes = physical.topology.nodes
        return [t.task_id for t in physical.tasks
                if any(nodes[op].kind == "sink" for op in physical.chains[t.chain_id].ops)]

    async def stage(self, commit: int) -> bool:
        return await self._task.stage_sink_outputs(commit)

    async def commit(self, commit: int) -> bool:
        task = self._task
        if not await task.stage_sink_outputs(commit):
            return True
        return bool(await task.master.commit(task.attempt, commit, task.task_id,
                                             task.incarnation, task.sink_records_received()))

    async def reapply_commits(self) -> None:
        await self._task.reapply_commits()

    async def deduplicate(self, jobs: list[str]) -> None:
        task = self._task
        for sink in task.sinks:
            ids: list = []
            for job in jobs:
                for _, _, key in await asyncio.to_thread(committed_blobs, task.store, job,
                                                         sink.ctx.name, task.index):
                    ids.extend((await task.read_staged_blob(key))[1] or ())
            sink.deduplicate(ids)


class RuntimeTaskContext(TaskContext):
    """A `Task` as its protocol sees it (see the module docstring)."""

    def __init__(self, task: Task):
        self._task = task
        self.task_id, self.name, self.index = task.task_id, task.name, task.index
        self.job_id, self.attempt, self.incarnation = task.job_id, task.attempt, task.incarnation
        self.task_count = task.task_count
        self.checkpoint_interval_s = task.checkpoint_interval_s
        self.codec, self.state_codec, self.merge = task.codec, task.state_codec, task.merge
        self.inputs, self.outputs = _Inputs(task), _Outputs(task)
        self.state, self.chain = _State(task), _Chain(task)
        self.sources, self.sinks = _Sources(task), _Sinks(task)

    @property
    def watermark(self) -> float:
        return self._task.watermark

    def send_acks(self, task_id: int, entries: list) -> None:
        task = self._task
        if task.faults is not None and task.faults.ack_lost():
            return  # a lossy link outage: the tuples are replayed after their timeout
        delay_s = 0.0 if task.faults is None else task.faults.ack_delay_s(len(entries))
        if delay_s > 0:  # a slow acknowledgment: the task itself goes on
            asyncio.get_running_loop().call_later(delay_s, task.ack_router, task_id, entries)
        else:
            task.ack_router(task_id, entries)

    def observe_latencies(self, name: str, latencies_s: "Sequence[float] | np.ndarray"
                          ) -> None:
        histograms = self._task.protocol_latency
        histogram = histograms.get(name)
        if histogram is None:
            histogram = histograms[name] = LatencyHistogram()
        histogram.add_many(latencies_s)

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name the context does not have: say where a call of the
        # flat context of earlier releases went.
        moved = moved_context_call(name)
        raise AttributeError(moved if moved is not None
                             else f"TaskContext has no attribute {name!r}", name=name,
                             obj=self)
