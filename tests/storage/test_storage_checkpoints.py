"""Checkpoints on both stores: completeness, verification, channel state and GC."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bastion.storage import (
    BlobRef,
    CheckpointStore,
    CorruptBlobError,
    IncompleteCheckpointError,
    KeyNotFoundError,
    ObjectStore,
)


def checkpoint(cs: CheckpointStore, cid: int, ops: int = 2, commit: bool = True,
               ) -> list[BlobRef]:
    refs = [cs.put_state(cid, "count", i, f"state {cid}/{i}".encode()) for i in range(ops)]
    refs.append(cs.put_channel(cid, "split.0->count.1", f"inflight {cid}".encode()))
    if commit:
        cs.commit(cid, refs, {"offsets": {"lines": [cid * 10, 7]}})
    return refs


def keys_of(store: ObjectStore, cid: int) -> list[str]:
    return store.list(f"jobs/wc/checkpoints/{cid:020d}/")


def test_commit_then_load_everything_back(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    refs = checkpoint(cs, 7)
    assert cs.list_complete() == [7] and cs.is_complete(7, verify_crc=True)
    manifest = cs.latest_complete()
    assert manifest is not None and manifest.checkpoint_id == 7 and manifest.job == "wc"
    assert manifest.metadata == {"offsets": {"lines": [70, 7]}}
    assert set(manifest.blobs) == {"count/0", "count/1", "channels/split.0->count.1"}
    assert manifest.blobs["count/1"] == refs[1]
    assert cs.load(7, "count", 1) == b"state 7/1"
    assert cs.load_channel(7, "split.0->count.1") == b"inflight 7"
    assert keys_of(store, 7) == [
        "jobs/wc/checkpoints/00000000000000000007/MANIFEST",
        "jobs/wc/checkpoints/00000000000000000007/channels/split.0->count.1",
        "jobs/wc/checkpoints/00000000000000000007/count/0",
        "jobs/wc/checkpoints/00000000000000000007/count/1",
    ]
    with pytest.raises(KeyNotFoundError):
        cs.load(7, "count", 5)
    with pytest.raises(KeyNotFoundError):
        cs.load(8, "count", 0)


def test_newest_first_in_numeric_order(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    for cid in (2, 10, 9, 100):
        checkpoint(cs, cid, ops=1)
    assert cs.list_complete() == [100, 10, 9, 2]
    latest = cs.latest_complete()
    assert latest is not None and latest.checkpoint_id == 100


def test_blobs_without_manifest_are_not_complete(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    checkpoint(cs, 1)
    checkpoint(cs, 2, commit=False)
    assert cs.list_complete() == [1] and not cs.is_complete(2)
    assert cs.latest_complete().checkpoint_id == 1  # type: ignore[union-attr]


def test_commit_refuses_missing_or_wrong_size_blobs(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    refs = checkpoint(cs, 1, commit=False)
    store.delete(refs[0].key)
    with pytest.raises(IncompleteCheckpointError) as info:
        cs.commit(1, refs)
    assert refs[0].key in str(info.value) and "missing" in str(info.value)
    refs = checkpoint(cs, 2, commit=False)
    store.put(refs[1].key, b"shorter")
    with pytest.raises(IncompleteCheckpointError):
        cs.commit(2, refs)
    assert cs.list_complete() == []
    assert not store.exists("jobs/wc/checkpoints/00000000000000000002/MANIFEST")


def test_damaged_after_commit_is_not_complete(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    for cid in (1, 2, 3, 4):
        checkpoint(cs, cid)
    refs2 = cs.manifest(2).blobs
    store.delete(refs2["count/0"].key)                      # missing blob
    refs3 = cs.manifest(3).blobs
    store.put(refs3["count/1"].key, b"a different length")  # size mismatch
    refs4 = cs.manifest(4).blobs
    same_size = bytes(b ^ 1 for b in store.get(refs4["count/1"].key))
    store.put(refs4["count/1"].key, same_size)              # CRC mismatch only
    assert cs.list_complete() == [4, 1]
    assert cs.list_complete(verify_crc=True) == [1]
    assert not cs.is_complete(2) and not cs.is_complete(3)
    assert cs.is_complete(4) and not cs.is_complete(4, verify_crc=True)
    assert cs.latest_complete(verify_crc=True).checkpoint_id == 1  # type: ignore[union-attr]
    with pytest.raises(CorruptBlobError) as info:
        cs.load(4, "count", 1)
    assert info.value.key == refs4["count/1"].key
    assert cs.load(4, "count", 0) == b"state 4/0"
    with pytest.raises(IncompleteCheckpointError):
        cs.load(2, "count", 0)


def test_damaged_manifest_is_not_complete(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    checkpoint(cs, 1)
    checkpoint(cs, 2)
    key = "jobs/wc/checkpoints/00000000000000000002/MANIFEST"
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    assert cs.list_complete() == [1]
    with pytest.raises(CorruptBlobError):
        cs.manifest(2)


def test_gc_keeps_newest_k_and_newer_incomplete(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    checkpoint(cs, 0, commit=False)  # abandoned, older than the newest complete
    for cid in (1, 2, 3, 4, 5):
        checkpoint(cs, cid)
    checkpoint(cs, 6, commit=False)  # in progress, newer than the newest complete
    in_progress = keys_of(store, 6)
    report = cs.gc(keep=2)
    assert report.kept == [5, 4] and sorted(report.deleted) == [0, 1, 2, 3]
    assert report.deleted_objects == 3 + 3 * 4  # 3 blobs each, plus 3 manifests
    assert cs.list_complete() == [5, 4]
    for cid in (0, 1, 2, 3):
        assert keys_of(store, cid) == []
    assert keys_of(store, 6) == in_progress
    assert cs.load(4, "count", 1) == b"state 4/1"
    assert cs.gc(keep=2).deleted == []  # idempotent


def test_gc_never_deletes_a_blob_a_kept_manifest_names(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    first = checkpoint(cs, 1)
    unchanged = first[0]  # count/0 did not change: checkpoint 2 reuses its blob
    cs.commit(2, [unchanged, cs.put_state(2, "count", 1, b"fresh")])
    report = cs.gc(keep=1)
    assert report.deleted == [1] and cs.list_complete() == [2]
    assert keys_of(store, 1) == [unchanged.key]
    assert cs.load(2, "count", 0) == b"state 1/0"
    with pytest.raises(ValueError):
        cs.gc(keep=0)


def test_gc_racing_new_checkpoints_keeps_every_named_blob(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    checkpoint(cs, 1)
    stop = threading.Event()
    failures: list[BaseException] = []

    def collect() -> None:
        try:
            while not stop.is_set():
                cs.gc(keep=1)
        except BaseException as e:  # surfaced by the assertion below
            failures.append(e)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        # Each commit re-checks every blob it names: a GC that deleted a blob of a
        # checkpoint being written would make it raise IncompleteCheckpointError.
        for cid in range(2, 12):
            checkpoint(cs, cid, ops=3)
            assert cs.is_complete(cid)
    finally:
        stop.set()
        collector.join()
    assert not failures
    cs.gc(keep=1)
    assert cs.list_complete(verify_crc=True) == [11]
    assert [cs.load(11, "count", i) for i in range(3)] == [b"state 11/%d" % i
                                                            for i in range(3)]


def test_names_are_validated(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")
    with pytest.raises(ValueError):
        cs.put_state(1, "channels", 0, b"")  # reserved for channel state
    with pytest.raises(ValueError):
        cs.put_state(1, "a/b", 0, b"")
    with pytest.raises(ValueError):
        cs.put_state(-1, "op", 0, b"")
    with pytest.raises(ValueError):
        CheckpointStore(store, "")


def test_async_twins(store: ObjectStore) -> None:
    cs = CheckpointStore(store, "wc")

    async def scenario() -> None:
        refs = await asyncio.gather(cs.aput_state(3, "op", 0, b"s0"),
                                    cs.aput_state(3, "op", 1, b"s1"),
                                    cs.aput_channel(3, "c", b"m"))
        await cs.acommit(3, refs, {"note": "async"})
        latest = await cs.alatest_complete(verify_crc=True)
        assert latest is not None and latest.metadata == {"note": "async"}
        assert await cs.aload(3, "op", 1) == b"s1"
        assert await cs.aload_channel(3, "c") == b"m"
        assert (await cs.agc(keep=1)).kept == [3]

    asyncio.run(scenario())
