"""Failover strategies: after a failure, which tasks restart.

A failure takes down the tasks of a worker process (or of every worker on a node).
The simplest answer to "what now?" is to restart every task of the job from the
protocol's recovery line. That is always correct, and it is what a job does when
nothing better is known — but it stops queries the failure never touched, and it
makes a restart cost the whole job's size instead of the failure's.

A *failover strategy* answers the one question Flink's ``FailoverStrategy`` answers:
given the tasks that failed and the shape of the job, which tasks restart? Every
task outside that set keeps running, with its state. Which positions the restarted
tasks restore is the protocol's answer (`bastion.protocols.base.Coordinator.region_line`);
the job master carries both out as its *recover* phase (`bastion.runtime.job`).

Four strategies, each correct under a condition:

- `RestartAll` restarts every task. Always correct; ``bn.run(failover="global")``
  asks for it, and it is what a protocol whose recovery line rewinds every task gets.
- `RestartPipelinedRegion` restarts the *pipelined regions* of the failed tasks
  (Flink's ``RestartPipelinedRegionFailoverStrategy``): the tasks connected to them
  through channels, either way. No channel crosses a region's edge, so a region can
  restore a checkpoint on its own — its sources rewind, its sinks discard what they
  staged since — and nothing outside it sent it anything or got anything from it. A
  job of independent branches, or of forward-only pipelines (instance *i* of every
  operator feeding only instance *i*), has several regions; a keyed exchange joins
  everything it connects into one, so a keyed job still restarts whole.
- `RestartDownstream` restarts the failed tasks and everything downstream of them, to
  the sinks. What a restarted task sent is produced again, so every task that received
  it restarts too; a task upstream keeps running, and sends the restarted ones again
  what they must see, out of its *upstream backup*
  (`bastion.runtime.channel.ReplayableOutputChannel`). Smaller than a region when
  several queries share their sources (Su & Zhou). Uncoordinated checkpoints
  (``uncoordinated``, ``cic``) and CEC always choose it, with a backup on every
  channel at all times (a failed CEC instance rebuilds its state from its log, and
  what it feeds restarts with it). Their recovery line rolls back the failed tasks
  and every task that received a frame they sent after the checkpoints they restore,
  and so on downstream: the *rollback set* (CheckMate). It lies within the failed
  tasks' downstream, and is all of it whenever each of them sent downstream since its
  checkpoint, as a running job does. Every task upstream keeps its state: a
  receiver's rollback orphans nothing a sender did.

  A coordinated job chooses it under a capacity model, where lost tasks may wait for
  capacity while the queries they do not feed run on (`bastion.scheduler.recovery`),
  with *adaptive buffering* (Su & Zhou §4; ``adaptive_buffering``): upstream backups
  are not kept on every channel at all times — the paper rejects that ("upstream
  buffering") for what it costs in normal operation. Only source tasks keep one
  always (the paper's source buffering: what they sent since the last completed
  checkpoint); every other task's backup is on only from a burst's detection until
  the next checkpoint that completes once every lost task runs again. The graph says
  which senders' backups hold everything since the line (`TaskGraph.backed_up`), and
  the region grows *upstream* past every sender whose backup does not — it restarts
  too, fed by its own senders — and downstream again from there, until every sender
  into the region is backed up or a source. A single failure in normal operation
  thus restarts the failed tasks' upstream up to (not including) the source tasks,
  and everything downstream of that; a failure during a burst's recovery (the tasks
  the burst restarted log since the line) restarts what it would have restarted with
  backups everywhere, unless it hits a task upstream of which a survivor of the burst
  does not log since the line. Elsewhere (no capacity model) a coordinated job
  restarts pipelined regions, which need no backup at all.

- `RestartFailed` restarts the failed tasks alone (Dynamo's crashed instance, CEC's
  failed instance). Correct only under a protocol that replays what a restarted task
  lost and tolerates what it did twice (``acks``: the sources replay every root not
  acknowledged in time). Its neighbours never stop: a sender's channel into a
  restarted task drops what it sends while the task is down and then carries on to
  the new incarnation (`bastion.runtime.channel.ReroutableOutputChannel`); a
  receiver sees the restarted sender's frames numbered afresh, in a band of its own
  (`bastion.runtime.channel.first_seq`), and starts that channel over.

`failover_strategy` picks one from what the run asked for and what the protocol can
restart (`Protocol.restart_scope`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Mapping

if TYPE_CHECKING:
    from bastion.scheduler.recovery import RecoveryPolicy

FAILOVER_MODES = ("local", "global")


@dataclass(frozen=True)
class TaskGraph:
    """The job's shape as a failover strategy sees it: every task id, every channel
    as (sending task, receiving task), and ``backed_up``: the tasks whose upstream
    backups hold every frame they sent since the line a restart restores (None: every
    task's — backups on every channel at all times)."""

    tasks: frozenset[int]
    channels: Mapping[int, tuple[int, int]]
    backed_up: frozenset[int] | None = None


class FailoverStrategy(abc.ABC):
    """Decides which tasks restart after ``failed`` tasks were lost."""

    # May restart fewer tasks than the job has: the job master then restarts them
    # within the running attempt, and the others never stop.
    partial: bool = True
    # Senders outside the restarted set keep what they sent since the receivers'
    # last durable state, to send it again (an upstream backup on every channel).
    backs_up_channels: bool = False
    # Only source tasks back up their outputs in normal operation; every other task
    # only from a burst's detection to the next completed checkpoint (Su & Zhou's
    # adaptive buffering): a restart's region grows upstream past senders that did not.
    adaptive_buffering: bool = False
    # Senders outside the restarted set keep running into it: their channels drop
    # what they send while the receiver is down, then carry on to its next incarnation.
    reroutes_channels: bool = False

    @abc.abstractmethod
    def tasks_to_restart(self, failed: AbstractSet[int], graph: TaskGraph) -> frozenset[int]:
        """The tasks that restart: ``failed`` and whatever must roll back with them."""

    @property
    def name(self) -> str:
        return type(self).__name__


class RestartAll(FailoverStrategy):
    """Every task restarts, from the protocol's recovery line."""

    partial = False

    def tasks_to_restart(self, failed: AbstractSet[int], graph: TaskGraph) -> frozenset[int]:
        return graph.tasks


class RestartPipelinedRegion(FailoverStrategy):
    """The failed tasks' pipelined regions restart: the connected components of the
    task graph (channels taken both ways) that hold a failed task."""

    def tasks_to_restart(self, failed: AbstractSet[int], graph: TaskGraph) -> frozenset[int]:
        neighbours: dict[int, set[int]] = {}
        for src, dst in graph.channels.values():
            neighbours.setdefault(src, set()).add(dst)
            neighbours.setdefault(dst, set()).add(src)
        return _closure(failed, neighbours)


class RestartDownstream(FailoverStrategy):
    """The failed tasks and every task downstream of them restart; senders upstream
    resend from their backup. A sender into the region whose backup does not hold
    what it sent since the line (not in ``graph.backed_up``) restarts too, and so
    does everything downstream of it. ``adaptive``: backups are adaptive (only
    sources' always)."""

    backs_up_channels = True

    def __init__(self, adaptive: bool = False):
        self.adaptive_buffering = adaptive

    def tasks_to_restart(self, failed: AbstractSet[int], graph: TaskGraph) -> frozenset[int]:
        edges: dict[int, set[int]] = {}
        for src, dst in graph.channels.values():
            edges.setdefault(src, set()).add(dst)
            if graph.backed_up is not None and src not in graph.backed_up:
                # the receiver restores the line: only a restarted sender sends it
                # again what it must see
                edges.setdefault(dst, set()).add(src)
        return _closure(failed, edges)


class RestartFailed(FailoverStrategy):
    """The failed tasks restart alone; every other task runs on."""

    reroutes_channels = True

    def tasks_to_restart(self, failed: AbstractSet[int], graph: TaskGraph) -> frozenset[int]:
        return frozenset(failed)


def _closure(start: AbstractSet[int], edges: Mapping[int, set[int]]) -> frozenset[int]:
    reached: set[int] = set()
    stack = list(start)
    while stack:
        task = stack.pop()
        if task not in reached:
            reached.add(task)
            stack.extend(edges.get(task, ()))
    return frozenset(reached)


def check_failover(failover: str) -> str:
    """``bn.run``'s ``failover`` argument, checked."""
    if failover not in FAILOVER_MODES:
        raise ValueError(f"failover must be one of {FAILOVER_MODES} ('local': restart "
                         f"only what the failure needs; 'global': every task), got "
                         f"{failover!r}")
    return failover


RESTART_SCOPES = ("job", "region", "downstream", "task")


def failover_strategy(failover: str, restart_scope: str,
                      recovery: "RecoveryPolicy | None") -> FailoverStrategy:
    """The strategy of a run: ``failover`` (`FAILOVER_MODES`) as the run asked, what
    its protocol can restart (`Protocol.restart_scope`, one of `RESTART_SCOPES`), and
    its recovery policy. Under a capacity model (`RecoveryPolicy.task_slots_per_cpu`)
    lost tasks may wait for capacity while the queries they do not feed run on: a
    region restarts with everything downstream of it, fed again from upstream backups
    that are adaptive (sources' always, the others' during a burst's recovery);
    a protocol that restarts failed tasks alone restarts the job whole there, since
    a task waiting for capacity could not receive what its senders drop. A protocol
    whose line rolls back what a failed task fed (``"downstream"``) restarts that,
    fed again from upstream backups, with or without a capacity model."""
    if restart_scope not in RESTART_SCOPES:
        raise ValueError(f"Protocol.restart_scope must be one of {RESTART_SCOPES}, "
                         f"got {restart_scope!r}")
    capacity_model = recovery is not None and recovery.task_slots_per_cpu is not None
    if check_failover(failover) == "global" or restart_scope == "job":
        return RestartAll()
    if restart_scope == "task":
        return RestartAll() if capacity_model else RestartFailed()
    if restart_scope == "downstream":
        return RestartDownstream()
    if not capacity_model:
        return RestartPipelinedRegion()
    assert recovery is not None  # a capacity model is a setting of ``recovery``
    return RestartDownstream(adaptive=recovery.upstream_backups == "adaptive")
