"""The protocol interface: what the data plane asks a fault-tolerance protocol.

A fault-tolerance protocol has two halves, as in Flink:

- the **task half** (`TaskProtocol`), one per task, sees every data batch and control
  record the task receives and decides when the task snapshots its state — barrier
  alignment, deduplication, in-flight logging and acknowledgments live here;
- the **coordinator half** (`Coordinator`), in the job master, decides what counts as
  a complete checkpoint, makes sink outputs of complete checkpoints visible, and after
  a failure names the *recovery line*: the checkpoint every task restores from.

The state backend (`bastion.storage.checkpoints`) stores; the task and job master call
these hooks and never ask which protocol they run. Hooks run on the event loop of
their actor and must not block it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from bastion.runtime.records import Batch, ControlRecord

if TYPE_CHECKING:  # pragma: no cover
    from bastion.runtime.instance import Task
    from bastion.runtime.job import JobMaster
    from bastion.runtime.plan import InputChannel
    from bastion.storage import BlobRef
    from bastion.topology import Topology


class TaskProtocol:
    """Per-task half. The defaults pass everything through and never checkpoint."""

    def __init__(self, task: "Task"):
        self.task = task

    async def restore(self, recovery_line: Any) -> None:
        """Before the task starts: restore it from the coordinator's recovery line
        (None: start from the beginning, re-applying outputs already committed)."""
        if recovery_line is None:
            await self.task.reapply_commits()
        else:
            await self.task.restore_from(recovery_line)

    async def on_start(self) -> None:
        """The task's loop is about to start (replay in-flight messages here)."""

    async def on_frame(self, channel: "InputChannel", seq: int, frame: list) -> None:
        """A frame is about to be processed (``seq`` is its channel sequence number)."""

    async def between_frames(self) -> None:
        """The task finished a frame (or a source batch): a point where its state is
        consistent with what it sent and received — where it may checkpoint."""

    def on_batch(self, channel: "InputChannel", batch: Batch) -> Batch | None:
        """A data batch arrived on ``channel``; return what to process (None: nothing)."""
        return batch

    async def on_control(self, channel: "InputChannel", control: ControlRecord) -> None:
        """A protocol control record (not a watermark or end-of-stream) arrived."""
        raise ValueError(f"task {self.task.name!r} received {control!r}, which protocol "
                         f"{type(self).__name__} does not handle")

    async def on_trigger(self, checkpoint_id: int) -> None:
        """The coordinator asks this source task to start checkpoint ``checkpoint_id``."""

    async def on_input_ended(self, channel: "InputChannel") -> None:
        """``channel`` delivered its end-of-stream."""

    async def on_finished(self) -> None:
        """Every input ended and every output was flushed."""


class Coordinator:
    """Job-master half. The default takes no checkpoints: a failure restarts the job
    from the beginning, and outputs are committed once, at the end of the stream."""

    def __init__(self, master: "JobMaster"):
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

    async def recovery_line(self) -> Any:
        """What every task restores from after a failure, handed to each task's
        `TaskProtocol.restore` (None: restart from the beginning)."""
        return None

    async def on_job_finished(self, task_reports: list[dict[str, Any]]) -> None:
        """Every task finished: commit what is final before the end-of-stream commit.
        ``task_reports`` list, per task, the checkpoints it acknowledged (an
        acknowledgment may still be on its way)."""

    def stats(self, final_counters: dict[int, tuple[dict, dict]] | None = None
              ) -> dict[str, Any]:
        """Protocol metrics; ``final_counters`` gives each task's last sent and received
        sequence numbers per channel when the job finished."""
        return {}


class Protocol:
    """A fault-tolerance protocol, chosen by name in `bn.run(protocol=...)`."""

    name: str = ""
    exactly_once: bool = False
    needs_checkpoint_interval: bool = False

    def check(self, topology: "Topology") -> None:
        """Raise `TopologyError` if this protocol cannot run ``topology``."""

    def task_protocol(self, task: "Task") -> TaskProtocol:
        return TaskProtocol(task)

    def coordinator(self, master: "JobMaster") -> Coordinator:
        return Coordinator(master)


async def cancel(task: "asyncio.Task | None") -> None:
    """Cancel an asyncio task and wait until it is gone."""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
