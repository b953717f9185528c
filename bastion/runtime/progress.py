"""Progress polls: what the job master learns from its workers, and the loops it feeds.

Every ``progress_interval_s`` the job master asks each worker for its tasks' counters
(`ProgressPoller.poll_once`). A worker's counters are cumulative and restart with every
attempt and with every incarnation of a task (a regional restart rebuilds a task); a
worker that does not answer in time is simply counted at the next poll. So
`ProgressTally` keeps, per task, what it saw last and the attempt and incarnation it
belonged to, and turns each round of replies into *increments*: a `Poll` — records
read and written since the last poll, the latency of what sinks received meanwhile
(as a histogram: the difference of two cumulative ones), per query, and the sources'
backlog. A killed worker's history is never lost: only what it gained counts — and
what its sinks received up to their last commit point counts even when the worker
dies before the next poll (`ProgressTally.at_least`), so "received" never falls
below what they committed.

Three control loops read the polls, each an object with its own state, so the job
master's poll is a sequence of named steps:

- `RedundancyLoop` — ``redundancy="auto"``: the resiliency manager
  (`bastion.scheduler.resiliency`) gets the latency sinks saw in each period and the
  late copies tasks dropped, decides a redundancy ratio, and is told at once of a
  task with copies in its input that sits on one frame longer than the bound;
- `RetuneLoop` — ``checkpoint_interval="auto"`` with ``retune_every_s``: the re-tuner
  (`bastion.scheduler.retune`) gets the input rate of each period — the records read
  plus the growth of the sources' backlog, failure-free seconds only — and may move
  the coordinator's interval;
- `LoopTermination` — topologies with feedback edges: a loop has no end of input of
  its own, so the job master detects when nothing can circulate any more
  (distributed termination) and tells the loop heads to finish.

The decisions are the scheduler's; these objects only feed them and carry out what
they return, through the callbacks the job master gives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from bastion.runtime.metrics import LatencyHistogram
from bastion.scheduler.resiliency import Exposure, RedundancyDecision, ResiliencyManager
from bastion.scheduler.retune import RetuneDecision, Retuner

RecordEvent = Callable[..., None]


def caught_up(source_lag_records: int, read_records: int, elapsed_s: float,
              within_s: float) -> bool:
    """Whether the sources have caught up with their input, from one progress poll:
    the records due and not yet read (the sources' summed lag) would be read within
    ``within_s`` at the rate they read at since the poll before (``read_records`` in
    ``elapsed_s``). Within a fixed time, not within one poll: polls stretch to
    tenths of a second on a busy machine, and the catch-up's last poll-worth of
    backlog is what a standby's process start would slow down. Sources that are not
    paced have no lag, and are always caught up."""
    return source_lag_records * elapsed_s <= read_records * within_s


@dataclass
class TaskGain:
    """What one task gained since the last poll (a task that did not answer: what a
    commit point told of its sinks, if anything)."""

    source_records: int = 0
    sink_records: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)


@dataclass
class Poll:
    """One round of replies, as increments since the round before."""

    source_records: int = 0          # records the sources read since the last poll
    sink_records: int = 0            # records the sinks received since the last poll
    source_lag: int = 0              # records due at the sources and not yet read, now
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    late: LatencyHistogram = field(default_factory=LatencyHistogram)  # late copies dropped
    # per query: records its sinks received, and their latency
    by_query: dict[str, tuple[int, LatencyHistogram]] = field(default_factory=dict)
    # per task, what it gained (the metrics exporter's series are per instance)
    by_task: dict[int, TaskGain] = field(default_factory=dict)
    # how long each task with copies in its input has been on its current frame
    busy_s: list[float] = field(default_factory=list)
    answering: int = 0               # workers that answered
    asked: int = 0                   # workers asked

    @property
    def complete(self) -> bool:
        return self.answering == self.asked


class ProgressTally:
    """Per-task counters seen so far, and the job's totals: turns cumulative counters
    that restart with each attempt and incarnation into increments (`Poll`)."""

    def __init__(self, sink_queries: Mapping[int, list[str]], queries: Iterable[str],
                 copied_tasks: set[int]):
        self.sink_queries = sink_queries      # task -> the queries its sinks serve
        self.queries = list(queries)
        self.copied_tasks = copied_tasks      # tasks whose input holds redundant copies
        # task -> (attempt, incarnation) and its last counters
        self._counts: dict[int, tuple[Any, int, int]] = {}
        self._latency_seen: dict[int, tuple[Any, dict]] = {}
        self._late_seen: dict[int, tuple[Any, dict]] = {}
        self._noted_sink_records: dict[int, int] = {}   # task -> gained since the last poll
        self.totals = {"source_records": 0, "sink_records": 0}

    def at_least(self, task_id: int, stamp: Any, sink_records: int) -> None:
        """Task ``task_id`` of ``stamp`` (attempt, incarnation) has received at least
        ``sink_records`` at its sinks, told outside a poll (with a commit point): the
        gain counts at the next poll, even if the task dies before it answers one."""
        attempt, src, snk = self._counts.get(task_id, (stamp, 0, 0))
        if attempt != stamp:
            src, snk = 0, 0
        if sink_records > snk:
            self._noted_sink_records[task_id] = (
                self._noted_sink_records.get(task_id, 0) + sink_records - snk)
            snk = sink_records
        self._counts[task_id] = (stamp, src, snk)

    def add(self, replies: list) -> Poll:
        """The increments of one round of replies (an exception: a worker that did not
        answer, counted at the next poll)."""
        poll = Poll(asked=len(replies))
        records_by_query = dict.fromkeys(self.queries, 0)
        latency_by_query = {name: LatencyHistogram() for name in self.queries}
        noted, self._noted_sink_records = self._noted_sink_records, {}
        for task_id, gained in noted.items():
            poll.by_task[task_id] = TaskGain(sink_records=gained)
            poll.sink_records += gained
            for name in self.sink_queries.get(task_id, ()):
                records_by_query[name] += gained
        for reply in replies:
            if isinstance(reply, BaseException):
                continue
            poll.answering += 1
            for task_id, p in reply["tasks"].items():
                stamp = (reply["attempt"], p["incarnation"])
                queries = self.sink_queries.get(task_id, ())
                attempt, src, snk = self._counts.get(task_id, (stamp, 0, 0))
                if attempt != stamp:
                    src, snk = 0, 0
                # a commit point may have told more than this reply, sent before it
                gained = max(0, p["sink_records"] - snk)
                poll.source_records += p["source_records"] - src
                poll.sink_records += gained
                for name in queries:
                    records_by_query[name] += gained
                self._counts[task_id] = (stamp, p["source_records"], snk + gained)
                new = self._increment(self._latency_seen, task_id, stamp, p["latency"])
                task_gain = poll.by_task.setdefault(task_id, TaskGain())
                task_gain.source_records += p["source_records"] - src
                task_gain.sink_records += gained
                task_gain.latency.merge(new)
                poll.latency.merge(new)
                for name in queries:
                    latency_by_query[name].merge(new)
                poll.late.merge(self._increment(self._late_seen, task_id, stamp,
                                                p["late_copies"]))
                if task_id in self.copied_tasks:
                    poll.busy_s.append(p["busy_s"])
                poll.source_lag += p["source_lag"]
        poll.by_query = {name: (records_by_query[name], latency_by_query[name])
                         for name in self.queries}
        self.totals["source_records"] += poll.source_records
        self.totals["sink_records"] += poll.sink_records
        return poll

    @staticmethod
    def _increment(seen_by_task: dict[int, tuple[Any, dict]], task_id: int, stamp: Any,
                   buckets: dict) -> LatencyHistogram:
        seen_stamp, seen = seen_by_task.get(task_id, (stamp, {}))
        seen_by_task[task_id] = (stamp, buckets)
        return LatencyHistogram(buckets).minus(seen if seen_stamp == stamp else {})


class RedundancyLoop:
    """Feeds the resiliency manager each poll; sends every new ratio to the workers
    (``send``) and records a ``redundancy_changed`` event."""

    def __init__(self, manager: ResiliencyManager, send: Callable[[float], None],
                 record_event: RecordEvent):
        self.manager = manager
        self.policy = manager.policy
        self.send = send
        self.record_event = record_event
        self._window = LatencyHistogram()
        self._hidden = LatencyHistogram()   # the late copies' latency, same window
        self._window_s: float | None = None  # when the current window began

    def observe(self, poll: Poll, now_s: float, run_s: float) -> None:
        """Add what sinks saw since the last poll, and the late copies tasks dropped,
        to the window; tell the manager at once of a task with copies in its input
        that has been on one frame longer than the bound (a stall in progress); once
        a period is over, let it decide. ``run_s``: seconds since the job started."""
        policy = self.policy
        if self._window_s is None:
            self._window_s = now_s
        self._window.merge(poll.latency)
        self._hidden.merge(poll.late)
        stalled_ms = [b * 1000.0 for b in poll.busy_s if b * 1000.0 > policy.latency_bound_ms]
        if stalled_ms:
            self._apply(self.manager.on_stall(run_s, max(stalled_ms), len(stalled_ms)))
        if now_s - self._window_s < policy.period_s:
            return
        seen = self._window.percentile(policy.percentile)
        # the latency the copies hid tells a calm window from one with hidden faults
        hidden = (None if policy.hidden_percentile is None
                  else self._hidden.percentile(policy.hidden_percentile))
        bound_s = policy.latency_bound_ms / 1000.0
        late_copies = self._hidden.count
        exposure = Exposure(self._window.share_above(bound_s), self._window.count,
                            self._hidden.share_above(bound_s) if late_copies else None,
                            late_copies)
        self._apply(self.manager.decide(run_s, None if seen is None else seen * 1000.0,
                                        None if hidden is None else hidden * 1000.0,
                                        exposure))
        self._window = LatencyHistogram()
        self._hidden = LatencyHistogram()
        self._window_s = now_s

    def _apply(self, decision: RedundancyDecision | None) -> None:
        if decision is not None and decision.ratio != decision.ratio_before:
            self.send(decision.ratio)
            self.record_event("redundancy_changed", ratio=decision.ratio,
                              ratio_before=decision.ratio_before,
                              latency_ms=decision.latency_ms, reason=decision.reason)


class RetuneLoop:
    """Feeds the re-tuner the input rate of each period; moves the coordinator's
    interval (``set_interval``) when it says so, with an ``interval_retuned`` event."""

    def __init__(self, retuner: Retuner, progress_interval_s: float,
                 set_interval: Callable[[float], Any], record_event: RecordEvent):
        self.retuner = retuner
        self.progress_interval_s = progress_interval_s
        self.set_interval = set_interval
        self.record_event = record_event
        self._window = (0, 0.0)            # arrived records, seconds: this period so far
        self._lag: int | None = None       # the sources' backlog at the last poll
        self._hold: str | None = None      # "recovering", then "catching_up"

    def on_event(self, kind: str) -> None:
        """A recovery's seconds are no input rate: from ``failure_detected`` until the
        sources caught up after the ``restarted`` that follows, nothing is counted."""
        if kind not in ("failure_detected", "restarted"):
            return
        if kind == "failure_detected" or self._hold is not None:
            self._hold = "recovering" if kind == "failure_detected" else "catching_up"
        self._window, self._lag = (0, 0.0), None

    def observe(self, poll: Poll, elapsed_s: float, sources_finished: bool,
                run_s: float) -> None:
        """Add one poll to the period — what arrived: the records read plus the growth
        of the sources' backlog, so a job falling behind its input still sees the
        input's rate — and once a period is full, let the re-tuner decide. A poll some
        worker did not answer, or during a recovery, is left out (a recovery is over
        once the sources caught up after it), and so is the end of a bounded input
        (``sources_finished``): a source that finished reads nothing more, which is no
        input rate."""
        read, lag = poll.source_records, poll.source_lag
        if not poll.complete or sources_finished:
            self._lag = None
            return
        if self._lag is None and read == 0 and lag == 0:
            return   # the sources have not started: no input rate before they do
        if self._hold is not None:
            if self._hold == "catching_up" and caught_up(lag, read, elapsed_s,
                                                         self.progress_interval_s):
                self._hold = None
            self._lag = lag
            return
        if self._lag is not None:
            records, seconds = self._window
            self._window = (records + read + lag - self._lag, seconds + elapsed_s)
        self._lag = lag
        records, seconds = self._window
        if seconds < self.retuner.policy.period_s:
            return
        self._window = (0, 0.0)
        self._apply(self.retuner.decide(run_s, max(0.0, records / seconds)))

    def _apply(self, decision: RetuneDecision | None) -> None:
        if decision is None:
            return
        fields = {"interval_s": decision.interval_s,
                  "interval_before_s": decision.interval_before_s,
                  "ingest_avg_per_s": decision.ingest_avg_per_s,
                  "utilisation": decision.utilisation,
                  "predicted_trt_s": decision.predicted_trt_s,
                  "predicted_trt_before_s": decision.predicted_trt_before_s,
                  "trt_bound_s": self.retuner.policy.trt_bound_s,
                  "meets_bound": decision.meets_bound, "reason": decision.reason}
        if decision.moved:
            self.set_interval(decision.interval_s)
            self.record_event("interval_retuned", **fields)
        elif not decision.meets_bound:   # at the shortest already: it can only say so
            self.record_event("trt_bound_unreachable", **fields)


class LoopTermination:
    """Distributed termination of feedback loops. When every unfinished task has
    consumed all of its ordinary input, holds nothing back, and every frame sent on
    every channel was processed — twice in a row with the same counters, so no frame
    was on its way between the two looks — no record can appear in the loops any
    more: the loop heads may finish."""

    def __init__(self, channel_destinations: Mapping[int, int], source_tasks: set[int]):
        self.channel_destinations = channel_destinations  # channel -> receiving task
        self.source_tasks = source_tasks
        self._quiet_since: Any = None  # the counters seen at the last quiet poll

    def heads_to_finish(self, replies: list) -> list[int]:
        """The loop heads to tell to finish after this round of replies (none yet:
        an empty list)."""
        if any(isinstance(r, BaseException) for r in replies):
            self._quiet_since = None
            return []
        states = {t: q for r in replies for t, q in r["quiescence"].items()}
        heads = sorted(t for t, q in states.items() if q["loop_head"])
        sent: dict[int, int] = {}
        processed: dict[int, int] = {}
        for q in states.values():
            sent.update(q["sent"])
            processed.update(q["processed"])
        quiet = heads and not (self.source_tasks & states.keys()) and all(
            q["idle"] for q in states.values()) and all(
            processed.get(cid, 0) == n for cid, n in sent.items()
            if self.channel_destinations[cid] in states)
        snapshot = (sorted(sent.items()), sorted(processed.items()))
        if not quiet:
            self._quiet_since = None
        elif self._quiet_since != snapshot:
            self._quiet_since = snapshot
        else:
            self._quiet_since = None
            return heads
        return []
