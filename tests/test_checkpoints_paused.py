"""A source that finishes before the others stops coordinated checkpoints: it can no
longer inject barriers (a trigger it answers as finished is given up at once), and Bastion does not checkpoint after a task finished (Flink's
FLIP-147 does). Until the job ends no sink output is committed and a failure restores
the last checkpoint, so the job says so: a ``checkpoints_paused`` event naming the
source at once, and a warning on the driver's log once the pause lasted
`PAUSE_WARNING_S` (a bounded job's sources end a little apart, which is no news)."""

from __future__ import annotations

import asyncio
import logging

import pytest

import bastion as bn
from bastion.protocols import coordinated
from bastion.protocols.coordinated import CheckpointCoordinator

pytestmark = pytest.mark.usefixtures("ray_session")

COUNT = 1500


def two_sources(side: bool) -> bn.Topology:
    topo = bn.Topology("paused")
    main = topo.source("main", bn.sources.Generator(lambda i: i, count=COUNT, rate=1000))
    if side:   # a bounded side input: ten records, read at once
        extra = topo.source("side", bn.sources.Collection([-1] * 10))
        main = main.union(extra, name="both")
    main.sink("out", bn.sinks.Collect())
    return topo


def paused_events(side: bool, storage: str) -> tuple[bn.RunResult, list[dict]]:
    result = bn.run(two_sources(side), protocol=bn.protocols.Coordinated(interval_s=0.2),
                    storage=storage)
    return result, [e for e in result.details["events"] if e["kind"] == "checkpoints_paused"]


def test_a_source_that_finishes_first_is_named_when_checkpoints_stop(tmp_path):
    result, paused = paused_events(True, f"local://{tmp_path}")
    assert sorted(result.outputs["out"]) == [-1] * 10 + list(range(COUNT))
    [event] = paused   # once per attempt, however many triggers it skips
    assert event["sources"] == ["side[0]"]
    events = result.details["events"]
    completed = [e["checkpoint_id"] for e in events
                 if e["kind"] == "checkpoint_completed" and e["t"] <= event["t"]]
    assert event["last_checkpoint"] == max(completed, default=None)
    # One worker runs both sources, and a worker reports its tasks finished only once
    # all are: the finished source's answer to the trigger gives the checkpoint up at
    # once, where it used to wait out its 10-s timeout.
    aborted = [e for e in events if e["kind"] == "checkpoint_aborted"]
    assert [e["reason"] for e in aborted] == ["source side[0] had finished"]
    assert not [e for e in events if e["kind"] == "checkpoint_completed"
                and e["t"] > event["t"]]


def test_a_job_whose_sources_run_to_its_end_pauses_nothing(tmp_path):
    result, paused = paused_events(False, f"local://{tmp_path}")
    assert result.outputs["out"] == list(range(COUNT))
    assert paused == []
    assert result.metrics.protocol.checkpoints_completed > 0


class _Master:
    """What the coordinator reads to say which source finished: task 0 the source
    ``side``, task 1 ``main``."""

    checkpoint_interval_s = 0.0
    job_id = "paused"

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def checkpoint_store(self):
        class _Store:
            def list_complete(self):
                return []
        return _Store()

    def instances(self):
        return {0: [("side", 0)], 1: [("main", 0)]}

    def source_tasks(self):
        return {0, 1}

    def record_event(self, kind, **fields):
        self.events.append((kind, fields))


@pytest.mark.internal
def test_the_driver_is_warned_once_the_pause_lasts(monkeypatch, caplog):
    async def scenario():
        master = _Master()
        coordinator = CheckpointCoordinator(master)
        coordinator.interval_s = 0.0
        coordinator.committed = {4, 7}
        with caplog.at_level(logging.WARNING, logger=coordinated.__name__):
            monkeypatch.setattr(coordinated, "PAUSE_WARNING_S", 3600.0)
            coordinator._note_paused({1})
            assert master.events == [("checkpoints_paused", {"sources": ["side[0]"],
                                                             "last_checkpoint": 7})]
            assert not caplog.records   # not yet: sources of a bounded job end apart
            monkeypatch.setattr(coordinated, "PAUSE_WARNING_S", 0.0)
            coordinator._note_paused({1})
            coordinator._note_paused({1})
        [warning] = caplog.records
        assert "source side[0] finished" in warning.getMessage()
        assert "a failure restores checkpoint 7" in warning.getMessage()
        assert len(master.events) == 1

    asyncio.run(scenario())
