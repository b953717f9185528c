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

**Which slots must restart.** Today every slot must, whatever the planner would like:
the runtime numbers channel frames by attempt (a worker drops frames of another
attempt) and every protocol's recovery line rewinds every task — a coordinated
checkpoint is one global snapshot, and an uncoordinated line gives every task the
sequence numbers to expect and to resend from. A survivor left running would keep
the state and the channel positions of the failed attempt, and nothing it sent would
be taken. So `check_plan` refuses a plan that keeps a slot running
(`RecoveryPlanError`) rather than leaving that slot silently out of sync; keeping
survivors running needs per-task attempts in the runtime and a protocol that can
recover a part of the job, which progressive recovery will bring.
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


class RecoveryPlanError(Exception):
    """A planner's plan that the job master cannot carry out (a bug in the planner)."""


def check_plan(plan: RecoveryPlan, lost: Sequence[int], slots: int) -> None:
    """Raise `RecoveryPlanError` unless ``plan`` replaces exactly the ``lost`` slots,
    each once, and restarts every one of the ``slots`` (see the module docstring for
    why every slot must restart today)."""
    replaced = list(plan.to_standby) + list(plan.to_fresh)
    if len(plan.to_standby) > 1:
        raise RecoveryPlanError(f"recovery plan {plan} gives {len(plan.to_standby)} slots "
                                "to the one standby worker")
    if sorted(replaced) != sorted(set(lost)):
        raise RecoveryPlanError(f"recovery plan {plan} replaces slots {sorted(replaced)}, "
                                f"but the lost slots are {sorted(set(lost))}: each lost "
                                "slot needs exactly one new worker")
    kept = sorted(set(range(slots)) - set(plan.restart))
    if kept or not set(plan.restart) <= set(range(slots)):
        raise RecoveryPlanError(
            f"recovery plan {plan} restarts slots {sorted(plan.restart)} of {slots}: every "
            "slot must restart from the recovery line (the runtime drops the frames of "
            f"another attempt, so slots {kept} would run out of step with the others)")


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
