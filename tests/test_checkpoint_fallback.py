"""A recovery that finds its checkpoint damaged falls back to an older one — or fails
clearly when no older one can be restored without committing outputs twice.

The damage is real: a user function of the job itself, at a moment it picks, flips
bytes of stored state blobs in the local store directory (their size unchanged, so
only the CRC check on restore notices) and then ends its worker process. The
recovery reads the blobs through the real store, as always.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from pathlib import Path

import pytest

import bastion as bn
from bastion.errors import NoUsableCheckpointError
from bastion.protocols.uncoordinated import RecoveryLineCoordinator, checkpoint_number
from bastion.scheduler.detector import unreadable_blob
from bastion.storage import CheckpointStore, StorageError, open_store
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

COUNT = 3000


def corrupt(checkpoints: CheckpointStore, store, checkpoint_id: int) -> list[str]:
    """Flip the first byte of every state blob stored under ``checkpoint_id``."""
    prefix = f"jobs/{checkpoints.job}/checkpoints/{checkpoint_id:020d}/"
    keys = [k for k in store.list(prefix) if not k.endswith("/MANIFEST")]
    for key in keys:
        data = bytearray(store.get(key))
        data[0] ^= 0xFF
        store.put(key, bytes(data))
    return keys


def sabotage(storage: str, done: Path, which: str):
    """A map that, once two checkpoints are complete, damages checkpoints and ends its
    own worker process; it does it once (``done`` remembers it across the restart).

    ``which="newest"`` damages the newest complete checkpoint and the newest one with
    stored blobs (its manifest may still be on its way, the acknowledgment having been
    sent): whichever the recovery picks first is damaged. ``which="all"`` damages
    every checkpoint."""

    def apply(i: int) -> int:
        if i < 1000 or done.exists():
            return i
        store = open_store(storage)
        [job] = {k.split("/")[1] for k in store.list("jobs/")}
        checkpoints = CheckpointStore(store, job)
        complete = checkpoints.list_complete()
        if len(complete) < 2:
            return i  # too early: try again with the next record
        prefix = f"jobs/{job}/checkpoints/"
        stored = sorted({checkpoints.checkpoint_of(k) for k in store.list(prefix)})
        doomed = stored if which == "all" else {complete[0], stored[-1]}
        damaged = {c: corrupt(checkpoints, store, c) for c in sorted(doomed)}
        done.write_text(json.dumps({str(c): keys for c, keys in damaged.items()}))
        os._exit(1)  # the worker process dies here, mid-stream

    return apply


def damaged_by(tmp_path: Path) -> dict[int, list[str]]:
    """The checkpoints the sabotage damaged, and the keys of their damaged blobs."""
    damaged = json.loads((tmp_path / "done").read_text())
    return {int(c): keys for c, keys in damaged.items()}


def run(tmp_path: Path, which: str, keep: bool, protocol: str = "coordinated"
        ) -> bn.RunResult:
    storage = f"local://{tmp_path / 'store'}"
    topo = bn.Topology("fallback")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=COUNT,
                                                          rate=1000))
    mapped = numbers.map("sabotage", sabotage(storage, tmp_path / "done", which))
    # Keeping only the last records makes every checkpoint before them commit nothing
    # (no staged output): falling back behind one of them duplicates no output.
    if not keep:
        mapped = mapped.filter("last", lambda i: i >= COUNT - 10)
    mapped.sink("out", bn.sinks.Collect())
    return bn.run(topo,
                  protocol=with_interval(protocol, interval_s=0.2, retained_checkpoints=3),
                  storage=storage)


@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated"])
def test_a_damaged_newest_checkpoint_is_given_up_for_an_older_one(protocol, tmp_path):
    result = run(tmp_path, "newest", keep=False, protocol=protocol)
    assert result.outputs["out"] == list(range(COUNT - 10, COUNT))
    damaged = damaged_by(tmp_path)
    events = result.details["events"]
    unusable = [e for e in events if e["kind"] == "checkpoint_unusable"]
    assert unusable, "the recovery never met the damaged checkpoint"
    for event in unusable:
        assert event["checkpoint"] in damaged
        assert event["key"] in damaged[event["checkpoint"]]
        assert "CorruptBlobError" in event["reason"]
    [restarted] = [e for e in events if e["kind"] == "restarted"]
    if protocol == "coordinated":   # it keeps the 3 newest: an older one is there
        assert restarted["checkpoint"] is not None
        assert restarted["checkpoint"] not in damaged
    else:
        # the line restores one checkpoint per task, none of them damaged (or the
        # beginning: a task alone reclaims every checkpoint below its newest, and
        # nothing committed before the damage staged an output)
        assert not set(restarted["checkpoint"].values()) & set(damaged)


def test_no_restorable_checkpoint_behind_committed_outputs_fails_the_job_clearly(tmp_path):
    with pytest.raises(NoUsableCheckpointError) as failed:
        run(tmp_path, "all", keep=True)
    message = str(failed.value)
    assert "no checkpoint can be restored" in message
    assert "commit again the outputs" in message
    damaged = damaged_by(tmp_path)
    assert any(f"checkpoint {c} (" in message for c in damaged)


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_blob_that_does_not_read_back_is_named_by_its_key_across_processes(damage,
                                                                              tmp_path):
    store = open_store(f"local://{tmp_path}")
    checkpoints = CheckpointStore(store, "job")
    ref = checkpoints.put_state(7, "count", 0, b"state" * 10)
    checkpoints.commit(7, [ref])
    if damage == "corrupt":
        corrupt(checkpoints, store, 7)
    else:
        store.delete(ref.key)
    with pytest.raises(StorageError) as raised:
        checkpoints.load(7, "count", 0)
    # what the job master gets from Ray: the worker's error, pickled
    error = pickle.loads(pickle.dumps(raised.value))
    blob = unreadable_blob(error)
    assert blob.key == ref.key and checkpoints.checkpoint_of(blob.key) == 7
    assert type(error).__name__ in blob.reason
    assert unreadable_blob(RuntimeError(ref.key)) is None  # a bug is not a damaged blob


class _Master:
    """The little of a job master a recovery-line coordinator reads: two tasks, one
    channel from task 0 to task 1 (a sink), a real checkpoint store — or one task
    alone (``chained``: a whole job chained into one task has no channel)."""

    checkpoint_interval_s = 0.2
    job_id = "line"

    def __init__(self, checkpoints: CheckpointStore, chained: bool = False):
        self.store = checkpoints
        self.chained = chained

    def checkpoint_store(self):
        return self.store

    def channels(self):
        return {} if self.chained else {0: (0, 1)}

    def sink_tasks(self):
        return set()

    def task_ids(self):
        return [0] if self.chained else [0, 1]

    def record_event(self, kind, **fields):
        pass

    def trim_upstream_backups(self, below):
        pass


@pytest.mark.internal
def test_a_fallback_behind_reclaimed_checkpoints_restores_none_of_them(tmp_path):
    """Reclamation deletes the checkpoints below the line, which only moves forward
    — until a damaged checkpoint is excluded and the line falls back behind it."""
    async def scenario():
        checkpoints = CheckpointStore(open_store(f"local://{tmp_path}"), "line")
        coordinator = RecoveryLineCoordinator(_Master(checkpoints))
        coordinator.start(0)
        numbers = {}
        for local in (1, 2):
            for task in (0, 1):
                number = numbers[task, local] = checkpoint_number(0, 0, local, task)
                ref = checkpoints.put_state(number, "op", task, b"state")
                channels = {}
                if task == 0:   # the sender logs the frames it sent since its last one
                    log = checkpoints.put_channel(number, "0", b"frames")
                    channels = {0: (log, 10 * local - 9, 10 * local)}
                meta = {"sent": {0: 10 * local} if task == 0 else {},
                        "received": {0: 10 * local} if task == 1 else {},
                        "channels": channels, "duration_s": 0.0, "forced": False}
                coordinator.on_acknowledge(0, task, number, ref, meta)
        graph = coordinator._graph()
        line = graph.recovery_line()
        assert line == {0: numbers[0, 2], 1: numbers[1, 2]}
        await coordinator._reclaim(line, graph.replay_from(line))
        assert coordinator.reclaimed == {numbers[0, 1], numbers[1, 1]}
        await coordinator.stop()
        coordinator.exclude(numbers[0, 2])   # damaged: task 0 falls back behind it
        restore = await coordinator.recovery_line()
        # task 0 has nothing left it can restore: it starts over, and task 1, which
        # received frames task 0 will send again, with it
        assert restore["summary"] == {0: None, 1: None}
        assert not restore["tasks"][0].replay

    asyncio.run(scenario())


@pytest.mark.internal
def test_a_task_alone_whose_every_checkpoint_is_gone_starts_over(tmp_path):
    """CI once failed the fallback drill with "a line names one checkpoint per
    process; missing [], unknown [0]": a job chained into one task has no channel, so
    once its older checkpoints were reclaimed and its newest excluded as damaged, the
    checkpoint graph knew no such task while the line named it."""
    async def scenario():
        checkpoints = CheckpointStore(open_store(f"local://{tmp_path}"), "line")
        coordinator = RecoveryLineCoordinator(_Master(checkpoints, chained=True))
        coordinator.start(0)
        numbers = [checkpoint_number(0, 0, local, 0) for local in (1, 2)]
        for number in numbers:
            ref = checkpoints.put_state(number, "op", 0, b"state")
            meta = {"sent": {}, "received": {}, "channels": {}, "duration_s": 0.0,
                    "forced": False}
            coordinator.on_acknowledge(0, 0, number, ref, meta)
        graph = coordinator._graph()
        line = graph.recovery_line()
        assert line == {0: numbers[1]}
        await coordinator._reclaim(line, graph.replay_from(line))
        assert coordinator.reclaimed == {numbers[0]}
        await coordinator.stop()
        coordinator.exclude(numbers[1])
        restore = await coordinator.recovery_line()
        assert restore["summary"] == {0: None}

    asyncio.run(scenario())
