"""A log writer on an event loop never waits for the store: `LogWriter.flush_in_background`
stores in a thread, appends go on meanwhile, and records count as durable only once
they landed. A gated store holds each put until the test lets it through, so "in
flight" is a state the test controls, not a race it hopes to win."""

from __future__ import annotations

import threading

import pytest

from bastion.storage import LocalStore, LogReader, LogWriter, StorageError

P = "jobs/j/logs/op/0/"
SMALL = {"max_segment_bytes": 4096, "block_bytes": 512}


class GatedStore(LocalStore):
    """A local store whose puts wait for `release` (and fail while `failing`)."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.failing = False

    def put(self, key, data) -> None:
        self.entered.release()
        assert self.gate.wait(10), "the test never released the store"
        if self.failing:
            raise StorageError(f"put {key}: the store is down")
        super().put(key, data)

    def wait_entered(self) -> None:
        assert self.entered.acquire(timeout=10), "no put reached the store"


def values(store, start: int = 0) -> list:
    return [r[2] for r in LogReader(store, P).records(from_seq=start)]


def test_appends_go_on_while_a_flush_is_in_flight(tmp_path) -> None:
    store = GatedStore(tmp_path)
    w = LogWriter(store, P, blocking=False)
    w.append_many([(0.0, "a"), (0.0, "b")])
    assert w.flush_in_background()
    store.wait_entered()  # the put is in flight, held by the gate
    assert w.append(0.0, "c") == 2  # the append did not wait for it
    assert w.durable_seq == -1 and w.undurable_bytes > 0
    assert not w.flush_in_background()  # one upload at a time
    store.gate.set()
    w.wait_uploaded()
    assert w.durable_seq == -1  # taken by the writer's next call, not by a thread
    assert w.flush_in_background()  # takes the first part, starts one for "c"
    assert w.durable_seq == 1
    w.wait_uploaded()
    assert w.flush_in_background() and w.durable_seq == 2
    assert values(store) == ["a", "b", "c"]
    assert w.undurable_bytes == 0


def test_a_failed_upload_is_raised_and_stored_again(tmp_path) -> None:
    store = GatedStore(tmp_path)
    w = LogWriter(store, P, blocking=False)
    w.append(0.0, "a")
    store.failing = True
    store.gate.set()
    assert w.flush_in_background()
    w.wait_uploaded()
    with pytest.raises(StorageError, match="store is down"):
        w.flush_in_background()
    assert w.durable_seq == -1 and values(store) == []
    store.failing = False
    w.append(0.0, "b")
    assert w.flush_in_background()
    w.wait_uploaded()
    w.flush_in_background()
    assert w.durable_seq == 1 and values(store) == ["a", "b"]


def test_a_full_segment_waits_for_the_part_in_flight_then_seals(tmp_path) -> None:
    store = GatedStore(tmp_path)
    w = LogWriter(store, P, blocking=False, **SMALL)
    w.append(0.0, "x" * 100)
    assert w.flush_in_background()
    store.wait_entered()
    # a segment's worth appended while the part is in flight: no seal, no waiting
    for i in range(60):
        w.append(0.0, f"{i:03d}" + "y" * 100)
    assert w.undurable_bytes > SMALL["max_segment_bytes"]
    assert LogReader(store, P).segments() == []
    store.gate.set()
    w.wait_uploaded()
    assert w.flush_in_background()  # the part landed: the full segment is sealed now
    w.wait_uploaded()
    w.flush_in_background()
    assert w.durable_seq == 60
    assert [s.last_seq for s in LogReader(store, P).segments()] == [60]
    assert values(store) == ["x" * 100] + [f"{i:03d}" + "y" * 100 for i in range(60)]
    assert store.list(P + "part-") == []  # the seal took the part's place


def test_a_blocking_writer_still_seals_in_append(tmp_path) -> None:
    """Writers off the loop keep the old bound: a full segment is sealed by the append
    that fills it, even while the previous one is still being stored."""
    store = LocalStore(tmp_path)
    w = LogWriter(store, P, **SMALL)
    for i in range(200):
        w.append(0.0, "z" * 100)
    w.flush()
    assert len(LogReader(store, P).segments()) >= 4
    assert len(values(store)) == 200
