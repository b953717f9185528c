"""Recovery planning: after a failure, which slots get which worker, and what restarts
from where.

A `RecoveryPlanner` is asked once per failure, with the slots whose worker is lost and
the capacity at hand (is the standby alive and idle?), and answers with a
`RecoveryPlan`. The job master carries it out: it kills the lost workers, hands their
slots to the standby or to fresh workers, and redeploys the slots the plan restarts
from the recovery line the protocol's coordinator names.

`BlockingRecovery` is today's plan, and the first implementation: the standby takes
the first lost slot, fresh workers the others (all started at once), and *every* slot
restarts from the recovery line — the whole job pauses until all of it runs again. A
progressive planner (recover whole queries as capacity arrives) is the next one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Capacity:
    """What a recovery can use besides starting fresh workers."""

    standby: bool   # a standby worker is alive and idle


@dataclass(frozen=True)
class RecoveryPlan:
    """Slots the standby takes over, slots that get a fresh worker, and the slots
    that restart from the recovery line (the survivors among them are reset)."""

    to_standby: tuple[int, ...]
    to_fresh: tuple[int, ...]
    restart: tuple[int, ...]


class RecoveryPlanner(abc.ABC):
    @abc.abstractmethod
    def plan(self, lost: Sequence[int], slots: int, capacity: Capacity) -> RecoveryPlan:
        """The plan after ``lost`` slots (in slot order) of ``slots`` lost their worker."""


class BlockingRecovery(RecoveryPlanner):
    """Replace every lost worker — the standby first — and restart every slot."""

    def plan(self, lost: Sequence[int], slots: int, capacity: Capacity) -> RecoveryPlan:
        lost = sorted(lost)
        to_standby = tuple(lost[:1]) if capacity.standby else ()
        return RecoveryPlan(to_standby=to_standby, to_fresh=tuple(lost[len(to_standby):]),
                            restart=tuple(range(slots)))
