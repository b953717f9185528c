"""Stall detection: a task stuck on one frame is named while the job runs.

A user function that never returns — a network call without a timeout, a lock never
released, an endless loop — does not look like a failure. Its worker is alive: the
heartbeat runs on a thread of its own and answers (`bastion.scheduler.detector`).
But the task makes no progress, the task loop it shares with the worker's other
tasks is held, and without a word the job would simply hang.

So the job master also asks each worker, on that same thread, how long each of its
tasks has been on the frame it is processing (a source task: on the batch it read).
A task held longer than ``Recovery.stall_warning_s`` gets one ``task_stalled`` event
naming the task and its operators, and a warning on the driver's log. When it moves
on, a ``task_resumed`` event says how long it was held. The
detector only reports: a restart would call the same function on the same record,
and a slow call that does return is not a fault. A user who wants a hung job ended
watches for the warning (it comes as the stall passes the threshold), or bounds the
call inside the function.

The clock is the worker's own (one process's ``time.time()``): a task's age on a frame
never mixes two machines' clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StallWatch", "Stall"]


@dataclass(frozen=True)
class Stall:
    """A task held on one frame: ``held_s`` seconds so far (``task_stalled``), or in
    all once it moved on (``task_resumed``)."""

    task_id: int
    held_s: float


class StallWatch:
    """Which tasks are newly held past ``warning_s`` on one frame, and which moved on,
    from the ages the workers report; one warning per stall."""

    def __init__(self, warning_s: float) -> None:
        if not warning_s > 0:
            raise ValueError(f"warning_s must be > 0, got {warning_s!r}")
        self.warning_s = warning_s
        self._stalled: dict[int, float] = {}   # task -> the longest age seen on its frame

    @property
    def stalled(self) -> set[int]:
        """The tasks reported stalled and not seen moving since."""
        return set(self._stalled)

    def observe(self, ages_s: dict[int, float | None]) -> tuple[list[Stall], list[Stall]]:
        """``ages_s``: per task, how long it has been on its current frame (None: between
        frames). Tasks absent (their worker did not answer) keep their state. Returns
        the stalls to warn of now and the stalls that ended."""
        began, ended = [], []
        for task_id, age_s in ages_s.items():
            held_s = self._stalled.get(task_id)
            if held_s is not None:
                if age_s is None or age_s < held_s:   # between frames, or on a new one
                    del self._stalled[task_id]
                    ended.append(Stall(task_id, held_s))
                else:
                    self._stalled[task_id] = age_s
            elif age_s is not None and age_s >= self.warning_s:
                self._stalled[task_id] = age_s
                began.append(Stall(task_id, age_s))
        return began, ended
