"""The options objects of `bn.run` and `bn.drill` (issue 38, item 1; `bastion.options`).

- Each object (`DataPlane`, `Recovery`, `Redundancy`, `Limits`, `Storage`,
  `AutoInterval`) and each protocol object (`bn.protocols.Coordinated`, ``Acks``, …)
  refuses a bad value when it is made, with a `ValueError` naming the field.
- A run given an object behaves as one given the old keyword it replaces: small real
  runs on the session's Ray, compared on what the setting changes (tasks, frames,
  checkpoints, restarts, copies), each beside a run without the setting, so the
  comparison is shown able to fail.
- An old keyword beside the object of its concern is a `TypeError`, raised before
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


# --- old keywords beside the object of their concern clash ----------------------------

CLASHES = [
    ({"data_plane": bn.DataPlane(), "frame_records": 64}, "frame_records= beside data_plane"),
    ({"recovery": bn.Recovery(), "failover": "global"}, "failover= beside recovery"),
    ({"redundancy": bn.Redundancy(0.5), "dedup_window_s": 1.0},
     "dedup_window_s= beside redundancy"),
    ({"limits": bn.Limits(), "sink_spill_records": 10}, "sink_spill_records= beside limits"),
    ({"protocol": bn.protocols.Coordinated(interval_s=0.5), "checkpoint_interval": 0.2},
     r"checkpoint_interval=0.2 beside a protocol object with interval_s=0.5"),
    ({"protocol": bn.protocols.Acks(), "ack_timeout_s": 2.0},
     r"Acks\(timeout_s=…\)"),
    ({"protocol": bn.protocols.Cec(), "cec": bn.CecPolicy()}, r"Cec\(policy=…\)"),
    ({"frame_rekords": 64}, "unexpected keyword argument 'frame_rekords'"),
]


@pytest.mark.parametrize("keywords,message", CLASHES, ids=[m.split("=")[0].split(" ")[0]
                                                           for _, m in CLASHES])
def test_an_old_keyword_beside_its_object_is_a_type_error_before_anything_runs(
        keywords, message, tmp_path):
    keywords = {"protocol": "acks", **keywords}
    with pytest.raises(TypeError, match=message):
        bn.run(wordcount(count=10), storage=f"local://{tmp_path}", **keywords)
    assert not list(tmp_path.iterdir())   # refused before the store was opened


@pytest.mark.internal
def test_an_old_keyword_still_adjusts_a_protocol_object_at_its_default():
    # phase 1: code that made a protocol subclass and passes checkpoint_interval= runs on
    from bastion.launcher import translate_old_keywords
    made = translate_old_keywords(bn.protocols.Coordinated(), {"checkpoint_interval": 0.2,
                                                               "retained_checkpoints": 4})
    assert (made.protocol.interval_s, made.protocol.retained_checkpoints) == (0.2, 4)


@pytest.mark.internal
def test_every_old_keyword_is_translated_to_the_object_its_message_names():
    from bastion.launcher import OLD_KEYWORDS, old_keyword_message, translate_old_keywords
    from bastion.runtime.job import MasterLimits
    from bastion.scheduler.resiliency import ResiliencyPolicy

    values = {"checkpoint_interval": 0.4, "retained_checkpoints": 3, "trt_bound_s": 5.0,
              "retune_every_s": 2.0, "tuning": {"points": 3}, "cec": bn.CecPolicy(),
              "acks_mode": "xor", "ack_timeout_s": 3.0, "max_pending": 10,
              "buffer_timeout_ms": 1.0, "frame_records": 64, "max_inflight_frames": 2,
              "source_batch_records": 32, "chaining": False, "heartbeat_timeout_s": 2.0,
              "max_restarts": 3, "failover": "global", "dedup_window_s": 0.5,
              "latency_bound_ms": 30.0, "resiliency": ResiliencyPolicy(latency_bound_ms=30.0),
              "sink_spill_records": 100, "master_limits": MasterLimits(commit_attempts=2),
              "pool_idle_timeout_s": 9.0}
    assert set(values) == set(OLD_KEYWORDS)
    # where each setting lands: (protocol the keyword needs, the value read back)
    landed = {
        "checkpoint_interval": ("coordinated", lambda o: o.protocol.interval_s),
        "retained_checkpoints": ("coordinated", lambda o: o.protocol.retained_checkpoints),
        "cec": ("cec", lambda o: o.protocol.policy),
        "acks_mode": ("acks", lambda o: o.protocol.mode),
        "ack_timeout_s": ("acks", lambda o: o.protocol.timeout_s),
        "max_pending": ("acks", lambda o: o.protocol.max_pending),
        "dedup_window_s": ("none", lambda o: o.redundancy.dedup_window_s),
        "master_limits": ("none", lambda o: bn.Limits(commit_attempts=2)
                          if o.limits.commit_attempts == 2 else None),
    }
    for name, value in values.items():
        if name in ("trt_bound_s", "retune_every_s", "tuning"):
            auto = {"trt_bound_s": 5.0, name: value}
            made = translate_old_keywords("coordinated", {"checkpoint_interval": "auto",
                                                          **auto})
            assert made.protocol.interval_s == bn.AutoInterval(**auto)
        elif name in ("latency_bound_ms", "resiliency"):
            made = translate_old_keywords("none", {name: value}, redundancy="auto")
            assert made.redundancy.resiliency_policy().latency_bound_ms == 30.0
        elif name in landed:
            protocol, read = landed[name]
            made = translate_old_keywords(protocol, {name: value})
            expected = bn.Limits(commit_attempts=2) if name == "master_limits" else value
            assert read(made) == expected, name
        else:
            made = translate_old_keywords("none", {name: value})
            holder = OLD_KEYWORDS[name].split("=", 1)[0]   # e.g. data_plane
            assert getattr(getattr(made, holder), name) == value, name
        # the message names the object and field that hold the setting now
        assert "no longer takes" in old_keyword_message(name)
        assert OLD_KEYWORDS[name].split("(")[0] in old_keyword_message(name)
    with pytest.raises(TypeError, match="unexpected keyword argument 'acks_timeout'"):
        translate_old_keywords("acks", {"acks_timeout": 2.0})


# --- an object does in a real run what its old keyword did -----------------------------

def test_data_plane_object_runs_as_the_old_keywords(tmp_path):
    storage = f"local://{tmp_path}"
    topo = wordcount(rate=None, count=600)
    new = bn.run(topo, storage=storage,
                 data_plane=bn.DataPlane(frame_records=8, chaining=False))
    old = bn.run(topo, storage=storage, frame_records=8, chaining=False)
    default = bn.run(topo, storage=storage)
    assert sorted(new.outputs["out"]) == sorted(old.outputs["out"]) \
        == sorted(default.outputs["out"])
    assert new.metrics.extra["tasks"] == old.metrics.extra["tasks"] \
        > default.metrics.extra["tasks"]   # unchained: a task per operator instance
    # smaller frames, and more channels: more frames than the default sends
    assert new.metrics.extra["frames_sent"] > default.metrics.extra["frames_sent"]
    assert old.metrics.extra["frames_sent"] > default.metrics.extra["frames_sent"]


def test_coordinated_object_carries_interval_retention_and_timeout(tmp_path):
    from bastion.storage import CheckpointStore, open_store

    storage = f"local://{tmp_path}"
    topo = wordcount(count=3000)
    new = bn.run(topo, bn.protocols.Coordinated(interval_s=0.15, retained_checkpoints=1),
                 storage=storage)
    old = bn.run(topo, protocol="coordinated", checkpoint_interval=0.15,
                 retained_checkpoints=1, storage=storage)
    for result in (new, old):
        assert result.metrics.protocol.checkpoints_completed > 3
        kept = CheckpointStore(open_store(storage), result.job_id).list_complete()
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


def test_recovery_object_runs_as_the_old_keywords(tmp_path):
    storage = f"local://{tmp_path}"
    kill = [bn.faults.KillInstance("count", 0, at=0.8)]
    with pytest.raises(bn.JobFailedError):
        bn.run(wordcount(), "coordinated", storage=storage, faults=kill,
               recovery=bn.Recovery(max_restarts=0))
    with pytest.raises(bn.JobFailedError):
        bn.run(wordcount(), "coordinated", storage=storage, faults=kill, max_restarts=0)
    restarted = bn.run(wordcount(), "coordinated", storage=storage, faults=kill,
                       recovery=bn.Recovery(failover="global", max_restarts=2))
    assert len(restarted.metrics.protocol.failures) == 1
    assert restarted.metrics.extra["attempts"] == 2


def test_redundancy_and_acks_objects_run_as_the_old_keywords(tmp_path):
    storage = f"local://{tmp_path}"
    topo = bn.Topology("copies")
    topo.source("src", bn.sources.Collection(list(range(400)))).map(
        "double", lambda x: 2 * x, parallelism=2).sink("out", bn.sinks.Collect())
    new = bn.run(topo, bn.protocols.Acks(timeout_s=2.0), storage=storage,
                 redundancy=bn.Redundancy(0.5, dedup_window_s=0.5))
    old = bn.run(topo, protocol="acks", ack_timeout_s=2.0, redundancy=0.5,
                 dedup_window_s=0.5, storage=storage)
    plain = bn.run(topo, "acks", storage=storage)
    for result in (new, old):
        assert sorted(result.outputs["out"]) == sorted(plain.outputs["out"])
        assert result.metrics.extra["redundancy"]["copies_sent"] > 0
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
