"""The metrics exporter (`bastion.runtime.export`) in the job master's process: what it
records from a poll and from events, that a job runs the same with it off, and that
an error inside it never fails a job. Reading the series back from Ray's Prometheus
endpoint is tests/test_local_cluster.py's (the test session's Ray has no known port).
"""

from __future__ import annotations

from collections import Counter

import pytest
import ray

import bastion as bn
from bastion.runtime.plan import build_plan


def keyed(n: int = 2000) -> bn.Topology:
    topo = bn.Topology("export")
    src = topo.source("src", bn.sources.Collection(list(range(n))), parallelism=2)
    src.key_by(lambda x: x % 7).reduce("count", lambda acc, _: acc + 1, initial=0,
                                       parallelism=2).sink("out", bn.sinks.Collect())
    return topo


@ray.remote(num_cpus=0)
class Probe:
    """A `MetricsExporter` where `ray.util.metrics` objects may live: a Ray actor."""

    def __init__(self, plan) -> None:
        from bastion.runtime.export import MetricsExporter
        from bastion.runtime.progress import ProgressTally

        self.exporter = MetricsExporter(plan, "probe-job", 4)
        self.tally = ProgressTally({}, [], set())
        self.now_s = 0.0
        # what the exporter added to its record counters, beside Ray's own series
        self.counted: Counter = Counter()
        for name in ("source_records", "sink_records"):
            series = getattr(self.exporter, name)
            series.inc = self._counting(name, series.inc)

    def _counting(self, name, inc):
        def counted(value, tags):
            self.counted[name] += value
            inc(value, tags)
        return counted

    def feed(self, replies: list, events: list = (), sinks_told: tuple = ()) -> dict:
        """Two polls of ``replies``, through the job master's tally; ``sinks_told``:
        (task, attempt, incarnation, records) a commit point told before them."""
        for task_id, attempt, incarnation, records in sinks_told:
            self.tally.at_least(task_id, (attempt, incarnation), records)
        for _ in range(2):
            self.now_s += 0.1
            self.exporter.observe_poll(self.tally.add(replies), replies, self.now_s)
        for event in events:
            self.exporter.observe_event(event)
        return {"broken": self.exporter.broken, "detected": self.exporter._detected_s,
                "counted": dict(self.counted)}

    def feed_malformed(self, replies: list, events: list) -> dict:
        from bastion.runtime.progress import Poll

        self.exporter.observe_poll(Poll(), replies, 1.0)
        for event in events:
            self.exporter.observe_event(event)
        return {"broken": self.exporter.broken, "detected": self.exporter._detected_s}


@pytest.fixture
def plan():
    return build_plan(keyed())


def reply(plan, attempt: int = 0, sink_records: int = 50, incarnation: int = 0) -> dict:
    tasks = {t.task_id: {"source_records": 100, "sink_records": sink_records,
                         "source_lag": 0, "latency": {300: 4, 310: 2}, "late_copies": {},
                         "busy_s": 0.0, "incarnation": incarnation} for t in plan.tasks}
    return {"attempt": attempt, "tasks": tasks,
            "quiescence": {t.task_id: {"sent": {}, "processed": {}} for t in plan.tasks}}


@pytest.mark.internal
def test_a_poll_and_events_are_recorded_and_a_restart_closes_the_failure(ray_session,
                                                                         plan):
    probe = Probe.remote(plan)
    outcome = ray.get(probe.feed.remote([reply(plan), RuntimeError("no answer")], [
        {"kind": "checkpoint_completed", "t": 5.0, "checkpoint_id": 1,
         "duration_s": 0.2, "state_bytes": 1024},
        {"kind": "failure_detected", "t": 6.0, "reason": "worker 0 died"},
        {"kind": "restarted", "t": 6.4, "attempt": 1},
        {"kind": "recovery", "t": 9.0, "recovery_s": 1.5}]))
    assert not outcome["broken"]
    # two source and two sink instances; the second poll of the same counters adds
    # nothing
    assert outcome["counted"] == {"source_records": 200, "sink_records": 100}
    assert outcome["detected"] is None  # the restart ended the failure it timed


@pytest.mark.internal
def test_records_count_from_zero_per_incarnation_and_by_commit_points(ray_session, plan):
    """The exporter takes the job master's increments: a task rebuilt alone counts
    from zero again (its incarnation), and what a killed sink's commit point told
    counts though its worker never answers again."""
    probe = Probe.remote(plan)
    ray.get(probe.feed.remote([reply(plan)]))
    rebuilt = ray.get(probe.feed.remote([reply(plan, sink_records=20, incarnation=1)]))
    # each of the 4 tasks counts from zero: 2 x 100 read, 2 x 20 received
    assert rebuilt["counted"] == {"source_records": 400, "sink_records": 140}
    sinks = [t.task_id for t in plan.tasks if t.inputs]
    told = ray.get(probe.feed.remote([RuntimeError("killed")],
                                     sinks_told=[(sinks[0], 0, 1, 35)]))
    assert told["counted"]["sink_records"] == 140 + 15


@pytest.mark.internal
def test_a_malformed_reply_stops_the_exporter_and_not_the_caller(ray_session, plan):
    probe = Probe.remote(plan)
    outcome = ray.get(probe.feed_malformed.remote([{"attempt": 0, "tasks": {0: {}}}], [
        {"kind": "failure_detected", "t": 1.0, "reason": "x"}]))
    assert outcome["broken"]
    assert outcome["detected"] is None  # quiet after the error: nothing more recorded


@pytest.mark.parametrize("export_metrics", [True, False])
def test_a_job_commits_the_same_with_export_on_or_off(ray_session, tmp_path,
                                                      export_metrics):
    result = bn.run(keyed(), protocol=bn.protocols.Coordinated(interval_s=0.2),
                    storage=f"local://{tmp_path}", export_metrics=export_metrics)
    final = {}
    for key, count in result.outputs["out"]:
        final[key] = max(final.get(key, 0), count)
    assert final == {k: len(range(k, 2000, 7)) for k in range(7)}


def test_every_aborted_checkpoint_is_an_event_the_exporter_counts(ray_session, tmp_path):
    """The summary's aborted count and the exported counter come from the same
    events: checkpoints given up at a failure were counted and never exported, so
    ``bastion_checkpoints_aborted`` stayed absent after a drill that said 1 aborted."""
    topo = bn.Topology("aborts")
    topo.source("src", bn.sources.Generator(lambda i: i, count=4000, rate=2000)).key_by(
        lambda x: x % 7).reduce("count", lambda acc, _: acc + 1, initial=0,
                                parallelism=2).sink("out", bn.sinks.Collect())
    # The kill waits for a checkpoint in flight: timed alone, a kill at 1.0 s found
    # none in flight once in a full CI run (checkpoints of this state take a few ms).
    # Even so the checkpoint may complete: `ray.kill` takes effect a few ms later, by
    # when the victim may have acknowledged it, and a failure found before the next
    # trigger aborts nothing (one full CI run in several). The counts must agree in
    # every drill; a few drills make sure one of them aborted something to count.
    aborted: list = []
    for attempt in range(3):
        report = bn.drill(topo, protocol=bn.protocols.Coordinated(interval_s=0.02),
                          storage=f"local://{tmp_path / str(attempt)}",
                          faults=[bn.faults.KillInstance("count", 0, at=1.0,
                                                         during_checkpoint=True)])
        assert report.exactly_once, report.verdict_reason
        aborted = [e for e in report.events if e["kind"] == "checkpoint_aborted"]
        assert report.metrics.protocol.checkpoints_aborted == len(aborted)
        assert all(e["reason"] for e in aborted)
        if aborted:
            break
    assert aborted, "no drill aborted a checkpoint: the counts were never tested"
