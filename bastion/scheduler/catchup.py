"""Catch-up priority: a recovering region must not starve the queries a failure did
not hit (Su & Zhou: the healthy queries keep their latency).

When lost tasks join the running job again (``FailureHandler._join`` in
`bastion.runtime.failures`), they restore a checkpoint and their upstream sends them
again everything since — seconds of input, replayed as fast as the receivers take it.
The catch-up is a burst of work on the same cores as the tasks that never stopped: on a
2-core machine the workers catching up and the healthy workers each get a share, and the
healthy queries' latency rises with it (in the correlated scenario's
``low_priority_hit`` runs, the unhit queries' latency rose 3-8x while ``per_bidder``'s
region caught up).

The fix asks the operating system to run the catch-up on the CPU the healthy tasks
leave over: a worker process that hosts *only* recovering tasks runs, while they
catch up, at the OS's lowest CPU priority (Linux ``SCHED_IDLE``, below every nice
level: workers that already run at nice 19 still take precedence over it), and goes
back to normal once every replay into its tasks is over. The catch-up then runs as
fast as the headroom allows — all of it on an idle machine, a trickle on a saturated
one — without a rate to tune. A worker that also hosts a task that never stopped
keeps its priority: lowering it would slow a healthy query down.

Only while there is something to protect: some query the failure did not hit (none
of its tasks restarted). When every query was hit, a catch-up is what brings a
query back, and it runs at full priority — also once an earlier query is back: a
query recovered from the same failure does not hold back the next one (lowered, the
next one's catch-up was starved on a 2-core machine until its input ended).

A worker may stay lowered at most ``max_lowered_s``: a catch-up that a saturated
machine starves for that long gets its priority back, so that the recovering query
is not held back indefinitely (on a 2-core machine shared with a simulated
cluster's daemons and other jobs, lowered catch-ups of 5-11 s of backlog took 1.7-3.1
s when the machine had headroom, and up to 9 s when it had none).

This module decides *which* workers and *when*; `bastion.runtime.priority` carries
it out in the worker process; the job master asks and tells.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Mapping

CATCH_UP_PRIORITIES = ("idle", "normal")
CAUGHT_UP = "caught up"        # no replay feeds the worker's tasks any more
TIME_UP = "time up"            # lowered for `max_lowered_s`, caught up or not


class CatchUpPriority(abc.ABC):
    """Which workers run at a lowered CPU priority while their tasks catch up."""

    @abc.abstractmethod
    def to_lower(self, tasks_by_worker: Mapping[int, set[int]], recovering: set[int],
                 protected: set[int]) -> set[int]:
        """Of the workers (index -> the tasks running on it once the recovering ones
        joined), those to lower while the ``recovering`` tasks catch up.
        ``protected``: the tasks of the queries the failure did not hit — which
        kept running, and whose latency a catch-up would raise."""

    @abc.abstractmethod
    def to_restore(self, lowered_tasks: set[int], replaying_into: set[int] | None,
                   lowered_for_s: float) -> str | None:
        """Whether a worker lowered ``lowered_for_s`` seconds ago, hosting
        ``lowered_tasks``, gets its priority back now: why (`CAUGHT_UP`,
        `TIME_UP`), or None. ``replaying_into``: the tasks some upstream is still
        sending a backlog to (None: unknown, a worker did not answer)."""


@dataclass(frozen=True)
class IdleWhileCatchingUp(CatchUpPriority):
    """Lower a worker whose every task is recovering, while some query the failure
    did not hit runs beside it, until no replay feeds any of its tasks, or for at
    most ``max_lowered_s``. With no such query (every query was hit) nothing is
    lowered: the catch-ups are then what make queries available again, and they
    take all the CPU there is."""

    max_lowered_s: float = 5.0

    def to_lower(self, tasks_by_worker: Mapping[int, set[int]], recovering: set[int],
                 protected: set[int]) -> set[int]:
        if not protected - recovering:
            return set()
        return {w for w, tasks in tasks_by_worker.items() if tasks and tasks <= recovering}

    def to_restore(self, lowered_tasks: set[int], replaying_into: set[int] | None,
                   lowered_for_s: float) -> str | None:
        if replaying_into is not None and not (lowered_tasks & replaying_into):
            return CAUGHT_UP
        return TIME_UP if lowered_for_s >= self.max_lowered_s else None


class NormalPriority(CatchUpPriority):
    """Never lower a worker: a catch-up competes with the healthy tasks as equals."""

    def to_lower(self, tasks_by_worker: Mapping[int, set[int]], recovering: set[int],
                 protected: set[int]) -> set[int]:
        return set()

    def to_restore(self, lowered_tasks: set[int], replaying_into: set[int] | None,
                   lowered_for_s: float) -> str | None:
        return CAUGHT_UP


def catch_up_priority(name: str, max_lowered_s: float) -> CatchUpPriority:
    """The policy ``RecoveryPolicy.catch_up_priority`` names."""
    if name == "idle":
        return IdleWhileCatchingUp(max_lowered_s)
    if name == "normal":
        return NormalPriority()
    raise ValueError(f"catch_up_priority must be one of {CATCH_UP_PRIORITIES}, got {name!r}")
