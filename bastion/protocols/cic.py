"""Communication-induced checkpoints (HMNR): uncoordinated, minus the useless checkpoints.

Independent checkpoints can be *useless*: a checkpoint on a Z-cycle belongs to no
consistent recovery line, and with cyclic dataflows rollback can propagate around the
cycle again and again (the domino effect). Communication-induced checkpointing
(CheckMate §III-C) keeps the independence — tasks still checkpoint on their own
timers — but piggybacks a few clocks on every frame (HMNR: a Lamport clock, the
checkpoint vector and the ``taken``/``greater`` flags, `bastion.protocols.hmnr`) and,
when a frame would close a Z-cycle, makes the receiver take a *forced checkpoint*
before processing it. Recovery is the uncoordinated protocol's: rollback propagation
over the recorded checkpoints, replay from the senders' frame logs, deduplication by
sequence number — with fewer (ideally no) checkpoints rolled past.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from bastion.protocols.base import (Coordinator, MasterContext, ProtocolStats, TaskContext,
                                    TaskProtocol)
from bastion.protocols.hmnr import HmnrState
from bastion.protocols.uncoordinated import (IndependentCheckpoints,
                                             RecoveryLineCoordinator,
                                             UncoordinatedProtocol)
from bastion.runtime.records import ControlRecord, control_record


@control_record
@dataclass(frozen=True)
class ProtocolClock(ControlRecord):
    """Protocol bookkeeping piggybacked at the head of a frame (HMNR clocks)."""

    data: Any
    code: ClassVar[int] = 4

    def payload(self) -> Any:
        return self.data

    @classmethod
    def from_payload(cls, payload: Any) -> "ProtocolClock":
        return cls(payload)


class HmnrCheckpoints(IndependentCheckpoints):
    def __init__(self, task: TaskContext):
        super().__init__(task)
        self.hmnr = HmnrState(task.task_id, task.task_count)

    async def restore(self, recovery_line: Any) -> None:
        await super().restore(recovery_line)
        if self.restored is not None and self.restored.protocol_state is not None:
            self.hmnr = HmnrState.restore(self.restored.protocol_state)

    async def on_start(self) -> None:
        await super().on_start()
        self.task.outputs.piggyback(lambda dst: ProtocolClock(self.hmnr.on_send(dst)))

    async def on_frame(self, channel_id: int, seq: int, frame: list) -> None:
        if frame and isinstance(frame[0], ProtocolClock):
            clock = frame[0].data
            if self.hmnr.must_force(clock):
                await self.checkpoint(forced=True)
            self.hmnr.on_receive(clock)

    async def on_control(self, channel_id: int, control: ControlRecord) -> None:
        if not isinstance(control, ProtocolClock):  # clocks were handled in on_frame
            await super().on_control(channel_id, control)

    def on_checkpoint(self) -> Any:
        self.hmnr.on_checkpoint()
        return self.hmnr.snapshot()


class HmnrCoordinator(RecoveryLineCoordinator):
    def __init__(self, master: MasterContext):
        super().__init__(master)
        self.forced = 0

    def on_acknowledge(self, attempt: int, task_id: int, checkpoint_id: int, ref: Any,
                       meta: Any) -> None:
        super().on_acknowledge(attempt, task_id, checkpoint_id, ref, meta)
        if attempt == self.attempt and meta.get("forced"):
            self.forced += 1

    def stats(self, final_counters: Any = None) -> ProtocolStats:
        return dataclasses.replace(super().stats(final_counters),
                                   forced_checkpoints=self.forced)


class CicProtocol(UncoordinatedProtocol):
    """Communication-induced checkpoints (HMNR), ``bn.protocols.Cic``: uncoordinated
    checkpoints plus the forced ones that keep every checkpoint on a recovery line.
    Its knobs are `UncoordinatedProtocol`'s: ``interval_s`` and
    ``retained_checkpoints``."""

    name = "cic"

    def task_protocol(self, task: TaskContext) -> TaskProtocol:
        return HmnrCheckpoints(task)

    def coordinator(self, master: MasterContext) -> Coordinator:
        return HmnrCoordinator(master)
