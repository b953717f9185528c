"""The ObjectStore contract, run on both the local directory and S3 (moto or MinIO)."""

from __future__ import annotations

import asyncio
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

from bastion.storage import KeyNotFoundError, ObjectStore, StorageError, open_store


def test_put_get_overwrite_and_bytes_like_inputs(store: ObjectStore) -> None:
    store.put("a/b/one", b"hello")
    assert store.get("a/b/one") == b"hello"
    store.put("a/b/one", bytearray(b"replaced"))
    assert store.get("a/b/one") == b"replaced"
    store.put("a/two", memoryview(b"xxview")[2:])
    assert store.get("a/two") == b"view"
    store.put("empty", b"")
    assert store.get("empty") == b"" and store.size("empty") == 0 and store.exists("empty")


def test_ranged_get(store: ObjectStore) -> None:
    data = bytes(range(256)) * 4
    store.put("r", data)
    assert store.get("r", 10) == data[10:]
    assert store.get("r", 10, 5) == data[10:15]
    assert store.get("r", 0, 1) == data[:1]
    assert store.get("r", 1020, 100) == data[1020:]  # range runs past the end
    assert store.get("r", 1024) == b""                # starts at the end
    assert store.get("r", 5000, 3) == b""             # starts past the end
    assert store.get("r", 7, 0) == b""
    with pytest.raises(ValueError):
        store.get("r", -1)


def test_missing_keys(store: ObjectStore) -> None:
    with pytest.raises(KeyNotFoundError) as info:
        store.get("no/such/key")
    assert isinstance(info.value, KeyError) and isinstance(info.value, StorageError)
    assert "no/such/key" in str(info.value) and info.value.key == "no/such/key"
    with pytest.raises(KeyNotFoundError):
        store.get("no/such/key", 3, 4)
    with pytest.raises(KeyNotFoundError):
        store.get("no/such/key", 0, 0)
    with pytest.raises(KeyNotFoundError):
        store.size("no/such/key")
    assert not store.exists("no/such/key")
    store.delete("no/such/key")  # idempotent


def test_size_exists_delete(store: ObjectStore) -> None:
    store.put("d/x", b"12345")
    assert store.size("d/x") == 5 and store.exists("d/x")
    store.delete("d/x")
    assert not store.exists("d/x")
    assert store.list("d/") == []
    store.put("d/x", b"back")  # the emptied "directory" can be reused at once
    assert store.get("d/x") == b"back"


def test_list_is_sorted_and_filters_by_prefix(store: ObjectStore) -> None:
    keys = ["jobs/j/b", "jobs/j/a/2", "jobs/j/a/10", "jobs/k/z", "jobs/j2/a", "top"]
    for i, key in enumerate(keys):
        store.put(key, b"x" * i)
    assert store.list() == sorted(keys)
    assert store.list("jobs/j/") == ["jobs/j/a/10", "jobs/j/a/2", "jobs/j/b"]
    assert store.list("jobs/j") == ["jobs/j/a/10", "jobs/j/a/2", "jobs/j/b", "jobs/j2/a"]
    assert store.list("jobs/j/a/1") == ["jobs/j/a/10"]
    assert store.list("nothing/") == []
    assert store.list_sizes("jobs/j/") == {"jobs/j/a/10": 2, "jobs/j/a/2": 1, "jobs/j/b": 0}


def test_list_paginates_past_1000_keys(store: ObjectStore) -> None:
    # S3 lists at most 1,000 keys per request; the store must follow continuations.
    keys = [f"many/{i:05d}" for i in range(1100)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, b"."), keys))
    assert store.list("many/") == keys
    assert len(store.list_sizes("many/")) == 1100


def test_invalid_keys_are_rejected(store: ObjectStore) -> None:
    for bad in ["", "/abs", "a//b", "a/./b", "a/../b", "trailing/", ".tmp/x"]:
        with pytest.raises(ValueError):
            store.put(bad, b"x")
    with pytest.raises(ValueError):
        store.list("../up")


def test_large_object_round_trip(store: ObjectStore) -> None:
    # Above MinioStore's default part size would take too long on moto; 11 MiB with the
    # minimum 5 MiB part size exercises a 3-part multipart upload.
    data = os.urandom(11 * 1024 * 1024)
    if store.url.startswith("s3://"):
        store = open_store(store.url + "&part_size_bytes=5242880")
    store.put("big/blob", data)
    assert store.size("big/blob") == len(data)
    assert store.get("big/blob") == data
    assert store.get("big/blob", 6 * 1024 * 1024, 10) == data[6 * 1024 * 1024:][:10]


def test_async_variants(store: ObjectStore) -> None:
    async def scenario() -> None:
        await asyncio.gather(*(store.aput(f"as/{i}", bytes([i])) for i in range(5)))
        assert await store.alist("as/") == [f"as/{i}" for i in range(5)]
        assert await store.alist_sizes("as/") == {f"as/{i}": 1 for i in range(5)}
        assert await store.aget("as/3") == b"\x03"
        assert await store.aget("as/3", 0, 0) == b""
        assert await store.asize("as/4") == 1
        assert await store.aexists("as/4")
        await store.adelete("as/4")
        assert not await store.aexists("as/4")
        with pytest.raises(KeyNotFoundError):
            await store.aget("as/4")

    asyncio.run(scenario())


def test_pickled_store_reconnects(store: ObjectStore) -> None:
    store.put("p/k", b"before")
    store.get("p/k")  # builds the client that pickling must drop
    clone = pickle.loads(pickle.dumps(store))
    assert clone.url == store.url
    assert clone.get("p/k") == b"before"
    clone.put("p/k2", b"from clone")
    assert store.get("p/k2") == b"from clone"


def test_url_reopens_the_same_store(store: ObjectStore) -> None:
    store.put("u/k", b"v")
    again = open_store(store.url)
    assert again.get("u/k") == b"v"
    assert repr(again) == repr(store)
