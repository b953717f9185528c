"""Retention: a store keeps its newest jobs and deletes old ones, never a young one.

The ranking rules run on a local directory whose file times the test sets (an S3
server stamps its own times); the listing and the deletion run on both stores."""

from __future__ import annotations

import os
import time

import pytest

from bastion.storage import LocalStore, ObjectStore, list_jobs, prune_jobs

HOUR = 3600.0


def write_job(store: ObjectStore, job: str, keys: tuple[str, ...] = ("checkpoints/1/op/0",
                                                                     "checkpoints/1/MANIFEST",
                                                                     "events/job-master")
              ) -> None:
    for key in keys:
        store.put(f"jobs/{job}/{key}", b"x" * 10)


def age_job(store: LocalStore, job: str, modified: float) -> None:
    """Make every object of ``job`` look last written at ``modified``."""
    for key in store.list(f"jobs/{job}/"):
        os.utime(os.path.join(store.root, *key.split("/")), (modified, modified))


def test_list_modified_gives_each_key_its_write_time(store: ObjectStore) -> None:
    before = time.time()
    store.put("m/a", b"1")
    store.put("m/b/c", b"22")
    times = store.list_modified("m/")
    assert sorted(times) == ["m/a", "m/b/c"]
    # S3 stamps whole seconds on some servers: a second of slack either side
    assert all(before - 1.0 <= t <= time.time() + 1.0 for t in times.values()), times


def test_list_jobs_counts_objects_and_bytes_per_job(store: ObjectStore) -> None:
    write_job(store, "a-1")
    write_job(store, "b-2", ("outputs/out/0/1",))
    store.put("jobs/stray", b"not in a job folder")
    store.put("other/key", b"outside jobs/")
    found = {f.job: (f.objects, f.bytes) for f in list_jobs(store)}
    assert found == {"a-1": (3, 30), "b-2": (1, 10)}


def test_pruning_everything_old_deletes_job_folders_and_nothing_else(
        store: ObjectStore) -> None:
    write_job(store, "a-1")
    write_job(store, "b-2")
    store.put("other/key", b"outside jobs/")
    report = prune_jobs(store, keep=0, min_age_s=0.0, now=time.time() + HOUR)
    assert sorted(f.job for f in report.deleted) == ["a-1", "b-2"]
    assert report.freed_bytes == 60 and report.kept == []
    assert store.list() == ["other/key"]
    assert list_jobs(store) == []


def test_the_newest_jobs_are_kept_and_older_ones_deleted(tmp_path) -> None:
    store = LocalStore(tmp_path)
    start = time.time() - 10 * HOUR
    for i in range(5):
        write_job(store, f"run-{i}")
        age_job(store, f"run-{i}", start + i * 60)
    report = prune_jobs(store, keep=2, min_age_s=HOUR, now=start + 5 * HOUR)
    assert [f.job for f in report.kept] == ["run-4", "run-3"]
    assert [f.job for f in report.deleted] == ["run-2", "run-1", "run-0"]
    assert [f.job for f in list_jobs(store)] == ["run-4", "run-3"]
    # the emptied folders are gone too: the directory does not fill with husks
    assert sorted(os.listdir(tmp_path / "jobs")) == ["run-3", "run-4"]


def test_a_job_written_recently_is_never_deleted(tmp_path) -> None:
    # It may be running in another terminal: keep it, however many jobs are newer.
    store = LocalStore(tmp_path)
    now = time.time()
    write_job(store, "running")
    age_job(store, "running", now - 60)
    write_job(store, "finished")
    age_job(store, "finished", now - 2 * HOUR)
    report = prune_jobs(store, keep=0, min_age_s=HOUR, now=now)
    assert [f.job for f in report.kept] == ["running"]
    assert [f.job for f in report.deleted] == ["finished"]


def test_a_dry_run_deletes_nothing(tmp_path) -> None:
    store = LocalStore(tmp_path)
    write_job(store, "old")
    age_job(store, "old", time.time() - 2 * HOUR)
    report = prune_jobs(store, keep=0, min_age_s=HOUR, dry_run=True)
    assert report.dry_run and [f.job for f in report.deleted] == ["old"]
    assert len(store.list("jobs/old/")) == 3


def test_a_job_is_deleted_newest_object_first(tmp_path, monkeypatch) -> None:
    # The manifest was written after the blob it vouches for: it goes first, so a
    # deletion cut short never leaves a manifest naming a deleted blob.
    store = LocalStore(tmp_path)
    write_job(store, "old", ("checkpoints/1/op/0", "checkpoints/1/MANIFEST"))
    old = time.time() - 2 * HOUR
    for key, t in (("checkpoints/1/op/0", old), ("checkpoints/1/MANIFEST", old + 1)):
        os.utime(tmp_path / "jobs" / "old" / key, (t, t))
    deleted: list[str] = []
    real_delete = store.delete
    monkeypatch.setattr(store, "delete", lambda key: (deleted.append(key), real_delete(key)))
    prune_jobs(store, keep=0, min_age_s=HOUR)
    assert deleted == ["jobs/old/checkpoints/1/MANIFEST", "jobs/old/checkpoints/1/op/0"]


@pytest.mark.parametrize("keep,min_age_s", [(-1, 0.0), (1, -5.0)])
def test_nonsense_limits_are_refused(tmp_path, keep: int, min_age_s: float) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        prune_jobs(LocalStore(tmp_path), keep=keep, min_age_s=min_age_s)
