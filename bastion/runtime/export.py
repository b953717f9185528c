"""Live metrics for Prometheus: what a running job exports, and why.

`bastion.runtime.metrics` describes a run *after* it ended (`RunResult.metrics`). An
operator of a long-running job needs the same figures *while* it runs, in the
monitoring system every other service already uses. Ray ships one: each node's
metrics agent serves whatever the processes on that node record through
`ray.util.metrics` on the node's metrics export port (``ray start
--metrics-export-port=PORT``; the agent needs ``ray[default]``), and Prometheus
scrapes it. So Bastion records its figures there and runs no server of its own.

Only the job master records. It already learns everything once per progress poll
(`ProgressPoller.poll_once`, every ``progress_interval_s``: what each task gained
since the poll before, `ProgressTally`) and once per event (`JobMaster.record_event`):
the data path pays nothing — no call per record or per frame, no extra message — and
the cost of exporting is a few dozen metric updates per poll, in a process that sits
mostly idle.

The series (Ray prefixes each name with ``ray_`` when it serves them; tags ``job``,
and ``operator`` / ``instance`` where one operator instance is meant):

=================================== ========= ============================================
series                              kind      what it tells
=================================== ========= ============================================
bastion_source_records              counter   records sources read (operator, instance)
bastion_sink_records                counter   records sinks received (operator, instance)
bastion_throughput_records_per_s    gauge     sink records per second over the last poll
                                              (operator: the sink)
bastion_latency_seconds             histogram end-to-end latency of sampled sink records
                                              (operator: the sink)
bastion_source_lag_records          gauge     records a paced source is behind schedule:
                                              backpressure reaching the source
bastion_inflight_frames             gauge     frames sent to an instance it has not
                                              processed yet (its input queue)
bastion_input_queue_fill            gauge     that queue over its credit limit (0 to 1):
                                              near 1, the instance holds its producers back
bastion_checkpoints                 counter   checkpoints completed (``operator`` ``*``
                                              for a coordinated, job-wide checkpoint)
bastion_checkpoint_duration_seconds histogram from trigger to stored (coordinated), one
                                              task's snapshot and upload (uncoordinated)
bastion_checkpoint_bytes            gauge     state bytes of the newest checkpoint
bastion_checkpoints_aborted         counter   checkpoints given up
bastion_failures                    counter   failures detected (a dead or silent worker)
bastion_restarts                    counter   restarts from a recovery line
bastion_restart_seconds             histogram failure detected -> every task runs again
bastion_recovery_seconds            histogram failure (its injected fault, else its
                                              detection) -> sink rate back to 90%
                                              (known once the job ends; see
                                              `bastion.runtime.recovery_times`)
bastion_attempt                     gauge     the job's current attempt (0: no restart)
=================================== ========= ============================================

Counters only grow; dashboards take their ``rate()``. Latency is exported from the
sinks' own log-bucketed histograms (`LatencyHistogram`): each poll, the buckets that
grew are observed at their middle value — at most `MAX_LATENCY_OBSERVATIONS` samples
per sink and poll, scaled down alike, so the exported histogram has the shape of the
run's own (its quantiles) while its ``_count`` counts a sample, not records. A `MetricsExporter` is made per job inside the job
master's process (a `ray.util.metrics` object must be created inside a Ray worker or
actor); ``bn.run(..., export_metrics=False)`` turns it off.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from bastion.runtime.metrics import LatencyHistogram
from bastion.runtime.progress import Poll

logger = logging.getLogger(__name__)

# Histogram buckets. Latency: sub-millisecond frames to multi-second stalls.
# Checkpoints: a small state in ms to a large one on S3 in tens of seconds.
LATENCY_BOUNDARIES_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                        1.0, 2.5, 5.0, 10.0]
DURATION_BOUNDARIES_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                         30.0, 60.0, 120.0]
_ALL = "*"  # the operator tag of a figure of the whole job
# Latency samples observed per sink and poll, at most (see `_observe_latency`)
MAX_LATENCY_OBSERVATIONS = 32


def _never_fails_the_job(method: Callable) -> Callable:
    """Metrics are for watching a job, never a reason for it to fail: an error in
    the exporter is logged once and the exporter goes quiet for the rest of the job."""

    @functools.wraps(method)
    def guarded(self: "MetricsExporter", *args: Any) -> None:
        if self.broken:
            return
        try:
            method(self, *args)
        except Exception:  # noqa: BLE001 - anything, see above
            self.broken = True
            logger.exception("metrics export of job %s stopped", self.job_id)

    return guarded


class MetricsExporter:
    """One job's `ray.util.metrics` series, fed by its job master."""

    def __init__(self, plan: Any, job_id: str, credits_per_channel: int):
        from ray.util import metrics  # only in the job master's (Ray actor) process

        self.job_id = job_id
        self.broken = False
        self._credits = max(1, credits_per_channel)
        nodes = plan.topology.nodes
        # task -> (tags of its source op, tags of its sink op, tags of its first op)
        self._task_tags: dict[int, tuple[dict | None, dict | None, dict]] = {}
        self._task_channels: dict[int, int] = {}  # task -> input channels
        self._channel_dst: dict[int, int] = {}
        for t in plan.tasks:
            ops = plan.chains[t.chain_id].ops
            tags = [{"job": job_id, "operator": op, "instance": str(t.index)} for op in ops]
            source = tags[0] if nodes[ops[0]].kind == "source" else None
            sink = next((tg for op, tg in zip(ops, tags) if nodes[op].kind == "sink"), None)
            self._task_tags[t.task_id] = (source, sink, tags[0])
            self._task_channels[t.task_id] = len(t.inputs)
            for c in t.inputs:
                self._channel_dst[c.channel_id] = t.task_id
        self._detected_s: float | None = None  # when the failure being recovered was seen
        self._last_poll_s: float | None = None

        job, op, inst = ("job",), ("job", "operator"), ("job", "operator", "instance")
        self.source_records = metrics.Counter(
            "bastion_source_records", "records read by source instances", inst)
        self.sink_records = metrics.Counter(
            "bastion_sink_records", "records received by sink instances", inst)
        self.throughput = metrics.Gauge(
            "bastion_throughput_records_per_s",
            "records per second received by a sink over the last progress poll", op)
        self.latency = metrics.Histogram(
            "bastion_latency_seconds", "end-to-end latency of sampled records at a sink",
            boundaries=LATENCY_BOUNDARIES_S, tag_keys=op)
        self.source_lag = metrics.Gauge(
            "bastion_source_lag_records",
            "records a paced source instance is behind its schedule (backpressure)", inst)
        self.inflight = metrics.Gauge(
            "bastion_inflight_frames",
            "frames sent to an operator instance that it has not processed yet", inst)
        self.queue_fill = metrics.Gauge(
            "bastion_input_queue_fill",
            "in-flight frames into an instance over its credit limit (1: backpressure)",
            inst)
        self.checkpoints = metrics.Counter(
            "bastion_checkpoints", "checkpoints completed", inst)
        self.checkpoint_duration = metrics.Histogram(
            "bastion_checkpoint_duration_seconds", "how long a checkpoint took",
            boundaries=DURATION_BOUNDARIES_S, tag_keys=inst)
        self.checkpoint_bytes = metrics.Gauge(
            "bastion_checkpoint_bytes", "state bytes of the newest checkpoint", inst)
        self.checkpoints_aborted = metrics.Counter(
            "bastion_checkpoints_aborted", "checkpoints given up", job)
        self.failures = metrics.Counter(
            "bastion_failures", "failures detected (a dead or silent worker)", job)
        self.restarts = metrics.Counter(
            "bastion_restarts", "restarts from a recovery line", job)
        self.restart_seconds = metrics.Histogram(
            "bastion_restart_seconds", "from a failure's detection until every task runs",
            boundaries=DURATION_BOUNDARIES_S, tag_keys=job)
        self.recovery_seconds = metrics.Histogram(
            "bastion_recovery_seconds",
            "from a failure (its injected fault, else its detection) until the sink "
            "rate is back to 90%",
            boundaries=DURATION_BOUNDARIES_S, tag_keys=job)
        self.attempt = metrics.Gauge("bastion_attempt", "the job's current attempt", job)
        self._job_tags = {"job": job_id}

    # -- what the job master calls ------------------------------------------------------

    @_never_fails_the_job
    def observe_poll(self, poll: Poll, replies: list, now_s: float) -> None:
        """One progress poll: its increments per task (`ProgressTally`, which counts
        each attempt and incarnation of a task from zero, and a killed sink's
        receipts up to its last commit point) and the workers' replies
        (`Worker.progress`, exceptions for those that did not answer) for what is a
        level, not a count: the attempt, the sources' lag and the input queues."""
        interval_s = None if self._last_poll_s is None else now_s - self._last_poll_s
        self._last_poll_s = now_s
        per_sink: dict[str, int] = {}
        for task_id, gain in poll.by_task.items():
            tags = self._task_tags.get(task_id)
            if tags is None:
                continue
            source, sink, _ = tags
            if source is not None and gain.source_records > 0:
                self.source_records.inc(gain.source_records, source)
            if sink is not None:
                if gain.sink_records > 0:
                    self.sink_records.inc(gain.sink_records, sink)
                name = sink["operator"]
                per_sink[name] = per_sink.get(name, 0) + gain.sink_records
                self._observe_latency(gain.latency, {"job": self.job_id, "operator": name})
        sent: dict[int, int] = {}
        processed: dict[int, int] = {}
        reporting: set[int] = set()  # unfinished tasks that said what they processed
        for reply in replies:
            if isinstance(reply, BaseException):
                continue
            self.attempt.set(reply["attempt"], self._job_tags)
            for task_id, p in reply["tasks"].items():
                tags = self._task_tags.get(task_id)
                if tags is not None and tags[0] is not None:
                    self.source_lag.set(p["source_lag"], tags[0])
            for task_id, q in reply.get("quiescence", {}).items():
                reporting.add(task_id)
                sent.update(q["sent"])
                processed.update(q["processed"])
        if interval_s:
            for name, n in per_sink.items():
                self.throughput.set(n / interval_s, {"job": self.job_id, "operator": name})
        self._observe_queues(sent, processed, reporting)

    @_never_fails_the_job
    def observe_event(self, event: dict[str, Any]) -> None:
        """One event of the job master's log (`bastion.runtime.events`)."""
        kind = event["kind"]
        if kind == "checkpoint_completed":
            tags = self._checkpoint_tags(event.get("task"))
            self.checkpoints.inc(1, tags)
            if event.get("duration_s") is not None:
                self.checkpoint_duration.observe(event["duration_s"], tags)
            if event.get("state_bytes") is not None:
                self.checkpoint_bytes.set(event["state_bytes"], tags)
        elif kind == "checkpoint_aborted":
            self.checkpoints_aborted.inc(1, self._job_tags)
        elif kind == "failure_detected":
            self.failures.inc(1, self._job_tags)
            if self._detected_s is None:  # a failure during a recovery extends it
                self._detected_s = event["t"]
        elif kind == "restarted":
            self.restarts.inc(1, self._job_tags)
            if self._detected_s is not None:
                self.restart_seconds.observe(event["t"] - self._detected_s, self._job_tags)
                self._detected_s = None
        elif kind == "recovery" and event.get("recovery_s") is not None:
            self.recovery_seconds.observe(event["recovery_s"], self._job_tags)

    # -- helpers ------------------------------------------------------------------------

    def _observe_latency(self, grown: LatencyHistogram, tags: dict[str, str]) -> None:
        """Observe what a sink's histogram gained since the last poll, each sample at
        its bucket's middle — at most `MAX_LATENCY_OBSERVATIONS` of them: a Ray
        observation costs ~8 us, and a busy sink samples hundreds of records per
        poll. Beyond that every bucket is scaled down alike (the remainder carried
        to the next bucket), so the shape is kept and ``_count`` counts a sample."""
        total = grown.count
        if total <= 0:
            return
        scale = min(1.0, MAX_LATENCY_OBSERVATIONS / total)
        carry = 0.0
        for bucket in sorted(grown.buckets):
            owed = grown.buckets[bucket] * scale + carry
            times = int(owed)
            carry = owed - times
            if times > 0:
                value = LatencyHistogram({bucket: 1}).percentile(50)
                assert value is not None  # a histogram of one sample has a median
                for _ in range(times):
                    self.latency.observe(value, tags)

    def _observe_queues(self, sent: dict[int, int], processed: dict[int, int],
                        reporting: set[int]) -> None:
        """Frames in flight into every unfinished task that reported its channels:
        sent by the producer (its channel's sequence number) minus processed."""
        inflight: dict[int, int] = {}
        for cid, n in sent.items():
            dst = self._channel_dst.get(cid)
            if dst in reporting:
                inflight[dst] = inflight.get(dst, 0) + max(0, n - processed.get(cid, 0))
        for task_id, frames in inflight.items():
            tags = self._task_tags[task_id][2]
            self.inflight.set(frames, tags)
            self.queue_fill.set(
                min(1.0, frames / (self._credits * max(1, self._task_channels[task_id]))),
                tags)

    def _checkpoint_tags(self, task_id: int | None) -> dict[str, str]:
        if task_id is None or task_id not in self._task_tags:
            return {"job": self.job_id, "operator": _ALL, "instance": _ALL}
        return self._task_tags[task_id][2]


def for_job(plan: Any, config: Any) -> MetricsExporter | None:
    """The exporter of a job, or None when ``config.export_metrics`` is off (or it
    could not be made: logged, and the job runs on without it)."""
    if not getattr(config, "export_metrics", False):
        return None
    try:
        return MetricsExporter(plan, config.job_id, config.max_inflight_frames)
    except Exception:  # noqa: BLE001 - no metrics is no reason to fail the job
        logger.exception("job %s runs without metrics export", config.job_id)
        return None
