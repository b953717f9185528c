"""The S3 server goes away: retries with backoff, a clear error when they run out, and
nothing reported durable or complete that is not. Each test runs its own moto server
(real S3 over HTTP on 127.0.0.1) so stopping it disturbs no other test."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from bastion.storage import (
    CheckpointStore,
    LogReader,
    LogWriter,
    MinioStore,
    StorageError,
    StoreUnavailableError,
    open_store,
)

if TYPE_CHECKING:
    from conftest import MotoServer


def url(server: MotoServer, attempts: int, base_delay_s: float, bucket: str) -> str:
    return (f"s3://{bucket}/faults?endpoint={server.endpoint}&secure=false"
            f"&retry_attempts={attempts}&retry_base_delay_s={base_delay_s}&timeout_s=5")


@pytest.fixture
def bucket() -> str:
    # moto keeps one state per process, shared by every server it runs: a fresh
    # bucket keeps tests apart.
    return f"faults-{uuid.uuid4().hex[:12]}"


def test_server_down_during_checkpoint_leaves_it_incomplete(
        own_moto: MotoServer, bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(url(own_moto, attempts=4, base_delay_s=0.1, bucket=bucket))
    cs = CheckpointStore(store, "wc")
    cs.commit(1, [cs.put_state(1, "count", 0, b"one")], {"offsets": [10]})
    first_blob = cs.put_state(2, "count", 0, b"two")  # checkpoint 2 is under way...

    own_moto.stop()                                   # ...when the store dies
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="bastion.storage"):
        with pytest.raises(StoreUnavailableError) as info:
            cs.put_state(2, "count", 1, b"two, second instance")
    elapsed = time.monotonic() - started
    # Three backoff sleeps of at least half their nominal 0.1, 0.2 and 0.4 s.
    assert elapsed >= (0.1 + 0.2 + 0.4) / 2
    err = info.value
    assert (err.attempts, err.operation) == (4, "put")
    assert err.key == "jobs/wc/checkpoints/00000000000000000002/count/1"
    assert f"s3://{bucket}/faults?endpoint={own_moto.endpoint}" in str(err)
    assert "after 4 attempts" in str(err) and own_moto.secret_key not in str(err)
    assert len([r for r in caplog.records if "retrying" in r.getMessage()]) == 3
    # The job master never gets both refs, so it never commits checkpoint 2; a
    # commit with only what was stored would also fail while the store is down.
    with pytest.raises(StoreUnavailableError):
        cs.commit(2, [first_blob])

    own_moto.restart()
    assert cs.list_complete() == [1]
    assert not cs.is_complete(2)
    assert cs.load(1, "count", 0) == b"one"


def test_retries_ride_out_a_short_outage(own_moto: MotoServer, bucket: str) -> None:
    store = open_store(url(own_moto, attempts=8, base_delay_s=0.1, bucket=bucket))
    store.put("before", b"1")
    own_moto.stop()
    restarter = threading.Timer(0.4, own_moto.restart)
    restarter.start()
    started = time.monotonic()
    try:
        store.put("during", b"2")  # fails until the server is back, then succeeds
    finally:
        restarter.join()
    assert time.monotonic() - started >= 0.4
    assert store.get("during") == b"2" and store.get("before") == b"1"


def test_log_flush_during_outage_is_not_durable_until_it_succeeds(
        own_moto: MotoServer, bucket: str) -> None:
    store = open_store(url(own_moto, attempts=2, base_delay_s=0.01, bucket=bucket))
    seen: list[int] = []
    w = LogWriter(store, "jobs/wc/logs/out/0/", on_durable=seen.append)
    w.append_many([(float(i), i) for i in range(10)])
    assert w.flush() == 9
    w.append_many([(float(i), i) for i in range(10, 15)])
    own_moto.stop()
    with pytest.raises(StoreUnavailableError):
        w.flush()
    assert w.durable_seq == 9 and seen == [9]
    own_moto.restart()
    assert [r[0] for r in LogReader(store, "jobs/wc/logs/out/0/").records()] == list(range(10))
    assert w.flush() == 14 and seen == [9, 14]
    assert [r[0] for r in LogReader(store, "jobs/wc/logs/out/0/").records()] == list(range(15))


def test_pickled_store_survives_a_restart(own_moto: MotoServer, bucket: str) -> None:
    import pickle

    store = open_store(url(own_moto, attempts=5, base_delay_s=0.05, bucket=bucket))
    store.put("k", b"v")
    own_moto.restart()
    clone = pickle.loads(pickle.dumps(store))
    assert isinstance(clone, MinioStore) and clone.get("k") == b"v"
    assert store.get("k") == b"v"  # the original's pooled connection died with the server


def test_a_refusal_is_not_retried_and_says_what_happened(
        own_moto: MotoServer, bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    from minio import Minio

    store = open_store(url(own_moto, attempts=5, base_delay_s=1.0, bucket=bucket))
    # The URL carries the non-default tunables, so reopening it gives the same store.
    assert "retry_base_delay_s=1.0&timeout_s=5.0" in store.url
    assert open_store(store.url).url == store.url
    admin = Minio(own_moto.endpoint, own_moto.access_key, own_moto.secret_key,
                  secure=False, region="us-east-1")
    admin.remove_bucket(bucket)  # behind the store's back
    with caplog.at_level(logging.WARNING, logger="bastion.storage"):
        with pytest.raises(StorageError) as info:
            store.put("k", b"v")
    # no retry (retrying cannot help): every retry logs "retrying" (see the outage
    # test above), and a wall-clock bound would measure the machine instead
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]
    assert not isinstance(info.value, StoreUnavailableError)
    message = str(info.value)
    assert "NoSuchBucket" in message and "deleted after the store was opened" in message


def test_every_storage_error_crosses_a_process_boundary_with_its_fields() -> None:
    # A worker finds the damaged blob, the job master decides what to do: the error is
    # pickled in between and must still name the key (and offset, url, attempts...).
    import pickle
    import subprocess
    import sys

    from bastion.storage.errors import (CorruptBlobError, CorruptRecordError,
                                        IncompleteCheckpointError, KeyNotFoundError,
                                        StoreUnavailableError)

    raised = [CorruptBlobError("crc mismatch", key="jobs/j/checkpoints/3/count/0"),
              KeyNotFoundError("no such key", "jobs/j/x"),
              StoreUnavailableError("down", url="s3://b", operation="get", key="k",
                                    attempts=5),
              CorruptRecordError("bad record", key="log/0001", offset=77),
              IncompleteCheckpointError("blob missing")]
    code = ("import pickle, sys; e = pickle.loads(sys.stdin.buffer.read()); "
            "sys.stdout.buffer.write(pickle.dumps((type(e).__name__, str(e), vars(e))))")
    for error in raised:
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(error),
                             capture_output=True, check=True).stdout
        assert pickle.loads(out) == (type(error).__name__, str(error), vars(error))
