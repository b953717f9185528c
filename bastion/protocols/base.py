"""The protocol interface: what the data plane asks a fault-tolerance protocol.

A fault-tolerance protocol has two halves, as in Flink: a per-task half that sees every
frame a task receives and sends (it may hold, drop, log or answer them — barrier
alignment, deduplication, in-flight logging, acknowledgments) and decides when the
task's state is snapshotted; and a coordinator half in the job master that decides
what counts as a complete checkpoint and what to restore after a failure (the recovery
line). The task loop calls the hooks below and never asks which protocol it runs.

Hooks run on the task's event loop and must not block it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bastion.runtime.records import Batch, ControlRecord

if TYPE_CHECKING:  # pragma: no cover
    from bastion.runtime.instance import Task
    from bastion.runtime.plan import InputChannel
    from bastion.topology import Topology


class TaskProtocol:
    """Per-task half. The defaults pass everything through unchanged."""

    def __init__(self, task: "Task"):
        self.task = task

    def on_batch(self, channel: "InputChannel", batch: Batch) -> Batch | None:
        """A data batch arrived on ``channel``; return what to process (None: nothing)."""
        return batch

    async def on_control(self, channel: "InputChannel", control: ControlRecord) -> None:
        """A protocol control record (not a watermark or end-of-stream) arrived."""
        raise ValueError(f"task {self.task.name!r} received {control!r}, which protocol "
                         f"{type(self).__name__} does not handle")

    async def on_finished(self) -> None:
        """Every input ended and every output was flushed: commit what is final."""
        for sink in self.task.sinks:
            sink.writer.commit()


class Protocol:
    """A fault-tolerance protocol, chosen by name in `bn.run(protocol=...)`."""

    name: str = ""
    exactly_once: bool = False

    def check(self, topology: "Topology") -> None:
        """Raise `TopologyError` if this protocol cannot run ``topology``."""

    def task_protocol(self, task: "Task") -> TaskProtocol:
        return TaskProtocol(task)

    def describe(self) -> dict[str, Any]:
        return {"protocol": self.name, "exactly_once": self.exactly_once}
