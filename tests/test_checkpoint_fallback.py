"""A recovery that finds its checkpoint damaged falls back to an older one — or fails
clearly when no older one can be restored without committing outputs twice.

The damage is real: a user function of the job itself, at a moment it picks, flips
bytes of stored state blobs in the local store directory (their size unchanged, so
only the CRC check on restore notices) and then ends its worker process. The
recovery reads the blobs through the real store, as always.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

import bastion as bn
from bastion.errors import NoUsableCheckpointError
from bastion.scheduler.detector import unreadable_blob
from bastion.storage import CheckpointStore, StorageError, open_store

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
    return bn.run(topo, protocol=protocol, checkpoint_interval=0.2,
                  retained_checkpoints=3, storage=storage)


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
