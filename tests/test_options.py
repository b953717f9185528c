"""The options objects of `bn.run` and `bn.drill` (issue 38, item 1; `bastion.options`).

- Each object (`DataPlane`, `Recovery`, `Redundancy`, `Limits`, `Storage`,
  `AutoInterval`) and each protocol object (`bn.protocols.Coordinated`, ``Acks``, …)
  refuses a bad value when it is made, with a `ValueError` naming the field.
- A run given an object does what the setting says: small real runs on the session's
  Ray, compared on what the setting changes (tasks, frames, checkpoints, restarts,
  copies), each beside a run without the setting, so the comparison is shown able to
  fail.
- A keyword of earlier releases is a one-line `TypeError` naming the object and field
  that hold its setting now — checked to exist and take that field — raised before
  anything runs; a keyword that never existed is one too.
- `bn.drill` takes a protocol object: its knobs reach the faulty run, and the
  reference runs under ``"none"`` without them.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

import bastion as bn
from bastion.options import EventLimits

from test_drills import wordcount

pytestmark = pytest.mark.usefixtures("ray_session")


# --- every object checks its fields where it is made ----------------------------------

BAD_VALUES = [
    (bn.DataPlane, {"frame_records": 0}, "frame_records"),
    (bn.DataPlane, {"max_inflight_frames": 1.5}, "max_inflight_frames"),
    (bn.DataPlane, {"source_batch_records": -1}, "source_batch_records"),
    (bn.DataPlane, {"buffer_timeout_ms": -1.0}, "buffer_timeout_ms must be a number of "
                                                "milliseconds"),
    (bn.DataPlane, {"chaining": "yes"}, "chaining"),
    (bn.Recovery, {"policy": "eager"}, "policy"),
    (bn.Recovery, {"failover": "regional"}, "failover"),
    (bn.Recovery, {"heartbeat_timeout_s": 0}, "heartbeat_timeout_s must be a number of "
                                              "seconds"),
    (bn.Recovery, {"max_restarts": -1}, "max_restarts"),
    (bn.Redundancy, {"ratio": 2.5}, "ratio must be a ratio from 0.0 to 2.0"),
    (bn.Redundancy, {"ratio": {"count": -0.1}}, r"ratio\['count'\]"),
    (bn.Redundancy, {"ratio": "some"}, "ratio must be"),
    (bn.Redundancy, {"ratio": "auto"}, "needs latency_bound_ms"),
    (bn.Redundancy, {"ratio": 0.5, "latency_bound_ms": 50.0}, "latency_bound_ms and policy"),
    (bn.Redundancy, {"dedup_window_s": 0}, "dedup_window_s must be a number of seconds"),
    (bn.Redundancy, {"ratio": "auto", "latency_bound_ms": -5}, "latency_bound_ms must be a "
                                                               "number of milliseconds"),
    (bn.Limits, {"commit_attempts": 0}, "commit_attempts"),
    (bn.Limits, {"commit_backoff_s": -0.1}, "commit_backoff_s must be a number of seconds"),
    (bn.Limits, {"events": {"first_points": 10}}, "events must be an EventLimits"),
    (bn.Limits, {"sink_spill_records": 0}, "sink_spill_records"),
    (bn.Limits, {"pool_idle_timeout_s": 0}, "pool_idle_timeout_s must be a number of seconds"),
    (bn.Storage, {"url": "/tmp/x"}, "url must be a storage URL"),
    (bn.Storage, {"url": "ftp://host/x"}, "unknown scheme 'ftp'"),
    (bn.AutoInterval, {"trt_bound_s": 0}, "trt_bound_s .* must be a number of seconds"),
    (bn.AutoInterval, {"trt_bound_s": 5, "retune_every_s": -1}, "retune_every_s"),
    (bn.AutoInterval, {"trt_bound_s": 5, "tuning": "fast"}, "tuning must be"),
    (bn.protocols.Coordinated, {"interval_s": 0}, "interval_s .* must be a number of seconds"),
    (bn.protocols.Coordinated, {"retained_checkpoints": 0}, "retained_checkpoints"),
    (bn.protocols.Coordinated, {"timeout_s": -1}, "timeout_s .* must be a number of seconds"),
    (bn.protocols.Uncoordinated, {"interval_s": "often"}, "interval_s"),
    (bn.protocols.Cic, {"retained_checkpoints": 1.0}, "retained_checkpoints"),
    (bn.protocols.Acks, {"mode": "fast"}, "mode must be one of"),
    (bn.protocols.Acks, {"timeout_s": 0}, "timeout_s must be a number > 0"),
    (bn.protocols.Acks, {"max_pending": 0}, "max_pending"),
    (bn.protocols.Acks, {"timeout_s": 1.0, "interval_s": 2.0}, "must be longer than"),
    (bn.protocols.Cec, {"interval_s": 0}, "interval_s"),
]


@pytest.mark.parametrize("cls,fields,message", BAD_VALUES,
                         ids=[f"{c.__name__}-{next(iter(f))}" for c, f, _ in BAD_VALUES])
def test_a_bad_value_is_refused_where_the_object_is_made_naming_the_field(cls, fields,
                                                                          message):
    with pytest.raises(ValueError, match=message):
        cls(**fields)


def test_good_values_make_objects_that_hold_them():
    assert bn.DataPlane(frame_records=64, chaining=False).frame_records == 64
    assert bn.Recovery("progressive", failover="global").recovery_policy().mode == \
        "progressive"
    assert bn.Redundancy("auto", latency_bound_ms=40.0).resiliency_policy() \
        .latency_bound_ms == 40.0
    assert bn.Redundancy(0.5).resiliency_policy() is None
    assert bn.Limits(events=EventLimits(first_points=10)).events.first_points == 10
    assert bn.Storage.of("local://x") == bn.Storage("local://x")
    coordinated = bn.protocols.Coordinated(bn.AutoInterval(5.0), timeout_s=30)
    assert coordinated.interval_s == bn.AutoInterval(trt_bound_s=5.0)
    assert coordinated.timeout_s == 30.0
    assert bn.protocols.Acks(timeout_s=3.0).timeout_s == 3.0
    # frozen: a changed copy is checked again
    with pytest.raises(dataclasses.FrozenInstanceError):
        bn.DataPlane().frame_records = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="frame_records"):
        dataclasses.replace(bn.DataPlane(), frame_records=0)


# --- a keyword of earlier releases says where its setting lives now -------------------

#: a value for each old keyword, for the message checks
OLD_VALUES = {"checkpoint_interval": 0.4, "retained_checkpoints": 3, "trt_bound_s": 5.0,
              "retune_every_s": 2.0, "tuning": {"points": 3}, "cec": bn.CecPolicy(),
              "acks_mode": "xor", "ack_timeout_s": 3.0, "max_pending": 10,
              "buffer_timeout_ms": 1.0, "frame_records": 64, "max_inflight_frames": 2,
              "source_batch_records": 32, "chaining": False, "heartbeat_timeout_s": 2.0,
              "max_restarts": 3, "failover": "global", "dedup_window_s": 0.5,
              "latency_bound_ms": 30.0, "resiliency": bn.ResiliencyPolicy(latency_bound_ms=30.0),
              "sink_spill_records": 100, "master_limits": None, "pool_idle_timeout_s": 9.0}


def new_home(name: str) -> tuple[type, str]:
    """The class and the field an old keyword's message points to, read from the
    message itself: ``protocol=bn.protocols.Acks(timeout_s=…)`` -> (Acks, "timeout_s");
    the innermost call names the field (``Coordinated(interval_s=bn.AutoInterval(
    trt_bound_s=…))`` -> (AutoInterval, "trt_bound_s"))."""
    import re

    from bastion.launcher import OLD_KEYWORDS

    calls = re.findall(r"bn\.([\w.]+)\((\w+)=", OLD_KEYWORDS[name])
    path, field = calls[-1]
    holder = bn
    for part in path.split("."):
        holder = getattr(holder, part)
    return holder, field


@pytest.mark.parametrize("function", ["run", "drill"])
def test_every_old_keyword_is_a_type_error_naming_a_home_that_takes_it(function, tmp_path):
    import inspect

    from bastion.launcher import OLD_KEYWORDS

    assert set(OLD_VALUES) == set(OLD_KEYWORDS)
    for name, value in OLD_VALUES.items():
        with pytest.raises(TypeError) as refused:
            getattr(bn, function)(wordcount(count=10), storage=f"local://{tmp_path}",
                                  **{name: value})
        message = str(refused.value)
        assert message.startswith(f"bn.{function}() no longer takes {name}=: use "), message
        assert "\n" not in message
        # the object and field it points to exist and take a value
        cls, field = new_home(name)
        assert field in inspect.signature(cls).parameters, (name, cls, field)
    assert not list(tmp_path.iterdir())   # refused before the store was opened
    with pytest.raises(TypeError, match="unexpected keyword argument 'frame_rekords'"):
        getattr(bn, function)(wordcount(count=10), frame_rekords=64)


def test_the_pointer_check_fails_on_a_home_that_does_not_take_the_field(monkeypatch):
    import inspect

    from bastion import launcher

    monkeypatch.setitem(launcher.OLD_KEYWORDS, "frame_records",
                        "data_plane=bn.DataPlane(frame_recs=…)")
    cls, field = new_home("frame_records")
    assert cls is bn.DataPlane and field not in inspect.signature(cls).parameters


def test_tune_refuses_an_old_keyword_in_its_run_options():
    with pytest.raises(TypeError, match=r"bn.tune\(\) no longer takes heartbeat_timeout_s=: "
                                        r"use recovery=bn.Recovery"):
        bn.tune(wordcount(count=10), trt_bound_s=5.0, heartbeat_timeout_s=2.0)


# --- an object does in a real run what its setting says --------------------------------

def test_a_data_plane_object_changes_the_tasks_and_frames(tmp_path):
    storage = f"local://{tmp_path}"
    topo = wordcount(rate=None, count=600)
    new = bn.run(topo, storage=storage,
                 data_plane=bn.DataPlane(frame_records=8, chaining=False))
    default = bn.run(topo, storage=storage)
    assert sorted(new.outputs["out"]) == sorted(default.outputs["out"])
    # unchained: a task per operator instance
    assert new.metrics.extra["tasks"] > default.metrics.extra["tasks"]
    # smaller frames, and more channels: more frames than the default sends
    assert new.metrics.extra["frames_sent"] > default.metrics.extra["frames_sent"]


def test_coordinated_object_carries_interval_retention_and_timeout(tmp_path):
    from bastion.storage import CheckpointStore, open_store

    storage = f"local://{tmp_path}"
    topo = wordcount(count=3000)
    new = bn.run(topo, bn.protocols.Coordinated(interval_s=0.15, retained_checkpoints=1),
                 storage=storage)
    default = bn.run(topo, "coordinated", storage=storage)   # every 1 s, two kept
    assert new.metrics.protocol.checkpoints_completed > max(
        3, default.metrics.protocol.checkpoints_completed)
    kept = CheckpointStore(open_store(storage), new.job_id).list_complete()
    assert len(kept) == 1


def slow_pipeline() -> bn.Topology:
    """A map that takes 2 ms a record behind a source of 1000 records/s: a backlog
    builds, and a barrier waits behind it for seconds."""
    def slow(x: int) -> int:
        time.sleep(0.002)
        return x

    topo = bn.Topology("slow")
    topo.source("src", bn.sources.Generator(lambda i: i, count=1500, rate=1000)).map(
        "slow", slow).sink("out", bn.sinks.Collect())
    return topo


def test_the_coordinator_takes_its_checkpoint_timeout_from_the_protocol_object(tmp_path):
    storage = f"local://{tmp_path}"
    plane = bn.DataPlane(frame_records=64)
    # the default timeout (10 s) waits for the slow checkpoint; one of 1 ms aborts
    # every checkpoint still running at the next trigger
    patient = bn.run(slow_pipeline(), bn.protocols.Coordinated(interval_s=0.1),
                     storage=storage, data_plane=plane)
    short = bn.run(slow_pipeline(), bn.protocols.Coordinated(interval_s=0.1, timeout_s=0.001),
                   storage=storage, data_plane=plane)
    def timed_out(result: bn.RunResult) -> list[dict]:
        return [e for e in result.details["events"] if e.get("kind") == "checkpoint_aborted"
                and "timed out after 0.001 s" in e.get("reason", "")]

    assert len(timed_out(short)) >= 3
    assert short.metrics.protocol.checkpoints_aborted > patient.metrics.protocol \
        .checkpoints_aborted
    assert timed_out(patient) == []
    assert sorted(short.outputs["out"]) == sorted(patient.outputs["out"]) == list(range(1500))


def test_a_recovery_object_bounds_the_restarts_and_picks_the_failover(tmp_path):
    storage = f"local://{tmp_path}"
    kill = [bn.faults.KillInstance("count", 0, at=0.8)]
    with pytest.raises(bn.JobFailedError):
        bn.run(wordcount(), "coordinated", storage=storage, faults=kill,
               recovery=bn.Recovery(max_restarts=0))
    restarted = bn.run(wordcount(), "coordinated", storage=storage, faults=kill,
                       recovery=bn.Recovery(failover="global", max_restarts=2))
    assert len(restarted.metrics.protocol.failures) == 1
    assert restarted.metrics.extra["attempts"] == 2


def test_redundancy_and_acks_objects_send_copies_and_change_no_result(tmp_path):
    storage = f"local://{tmp_path}"
    topo = bn.Topology("copies")
    topo.source("src", bn.sources.Collection(list(range(400)))).map(
        "double", lambda x: 2 * x, parallelism=2).sink("out", bn.sinks.Collect())
    new = bn.run(topo, bn.protocols.Acks(timeout_s=2.0), storage=storage,
                 redundancy=bn.Redundancy(0.5, dedup_window_s=0.5))
    plain = bn.run(topo, "acks", storage=storage)
    assert sorted(new.outputs["out"]) == sorted(plain.outputs["out"])
    assert new.metrics.extra["redundancy"]["copies_sent"] > 0
    assert plain.metrics.extra["redundancy"]["copies_sent"] == 0


def test_limits_and_storage_objects_run(tmp_path):
    result = bn.run(wordcount(rate=None, count=300), storage=bn.Storage(f"local://{tmp_path}"),
                    limits=bn.Limits(sink_spill_records=5, commit_attempts=2))
    assert len(result.outputs["out"]) == 900   # three words a line
    assert (tmp_path / "jobs" / result.job_id).is_dir()


# --- drill ----------------------------------------------------------------------------

def test_drill_takes_a_protocol_object_for_the_faulty_run_only(tmp_path):
    storage = f"local://{tmp_path}"
    report = bn.drill(wordcount(), bn.protocols.Coordinated(interval_s=0.2),
                      faults=[bn.faults.KillInstance("count", 0, at=1.0)], storage=storage)
    assert report.exactly_once, report.verdict_reason
    assert report.protocol == "coordinated"
    # the faulty run checkpointed at 0.2 s: several checkpoints in its ~2 s
    assert report.metrics.protocol.checkpoints_completed >= 4
    # a protocol's knobs never reach the reference runs, which run under "none"
    topo = bn.Topology("acks-drill")
    topo.source("src", bn.sources.Generator(lambda i: i, count=1500, rate=1000)).map(
        "inc", lambda x: x + 1, parallelism=2).sink("out", bn.sinks.Collect())
    acks = bn.drill(topo, bn.protocols.Acks(timeout_s=1.5, interval_s=0.3),
                    faults=[bn.faults.KillInstance("inc", 0, at=0.7)], storage=storage)
    assert acks.verdict in ("exactly-once", "at-least-once"), acks.verdict_reason
