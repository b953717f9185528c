"""Fault injection: carry out a schedule of kills against a running job, for real.

The faults a user describes (`bastion.faults`) become a sorted list of
`ScheduledKill` records before the job is deployed. `inject` follows that list while the
job runs: it sleeps until each kill is due — for a ``during_checkpoint`` kill, until a
checkpoint is also in progress, so that a drill proves an interrupted checkpoint is
never restored — picks the processes the kill takes down, records a ``fault`` event
and terminates them with ``ray.kill``. A terminated worker is not restarted by Ray:
the job master has to notice the loss and recover, exactly as after a machine failure.

The injector knows nothing of the job master. It is handed what it needs as callables:
the job's processes by name (they change when a recovery replaces workers, so it asks
at each kill), whether a checkpoint is in progress, and where events go.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Sequence

import ray

from bastion.faults import ScheduledKill, resolve_node
from bastion.scheduler import placement

_CHECKPOINT_POLL_S = 0.002  # how often a during-checkpoint kill looks for a checkpoint


async def inject(kills: Sequence[ScheduledKill], started_s: float,
                 processes: Callable[[], dict[str, Any]],
                 checkpoint_in_progress: Callable[[], int | None],
                 record_event: Callable[..., None],
                 under_repair: Callable[[list[str], float], None] = lambda names, s: None,
                 node_lost: Callable[[str], None] = lambda node_id: None) -> None:
    """Carry out ``kills`` (sorted by time), timed from ``started_s`` (wall clock, s).
    ``processes()`` names every worker actor of the job a kill may take down —
    ``"worker <slot>"`` for each slot and ``"standby"`` when there is one. A kill with
    a repair time (a `bastion.faults.Crash`) reports the processes it took down and
    the wall-clock time their repair ends to ``under_repair``: no replacement for
    them may start before. A node kill reports the node's id to ``node_lost``: the
    node is gone, and offers no capacity to a recovery."""
    for kill in kills:
        delay_s = started_s + kill.at_s - time.time()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        # the id of the checkpoint in progress (ids start at 1), None when there is none
        while kill.during_checkpoint and not checkpoint_in_progress():
            await asyncio.sleep(_CHECKPOINT_POLL_S)
        victims = await victims_of(kill, processes())
        record_event("fault", what=kill.what, worker=kill.worker, killed=sorted(victims),
                     checkpoint_in_progress=checkpoint_in_progress())
        if kill.repair_s > 0:
            under_repair(sorted(victims), time.time() + kill.repair_s)
        if kill.node is not None:
            node_lost(resolve_node(kill.node, placement.live_nodes()))
        for handle in victims.values():
            ray.kill(handle, no_restart=True)


async def victims_of(kill: ScheduledKill, processes: dict[str, Any]) -> dict[str, Any]:
    """The processes ``kill`` takes down, by name: one worker slot, or every process of
    the job (standby included) that Ray placed on the node."""
    if kill.node is None:
        name = f"worker {kill.worker}"
        return {name: processes[name]}
    node_id = resolve_node(kill.node, placement.live_nodes())
    placed = await asyncio.gather(*[w.node_id.remote() for w in processes.values()],
                                  return_exceptions=True)
    return {name: w for (name, w), node in zip(processes.items(), placed) if node == node_id}
