"""Retention: a store keeps its newest jobs, not every job it ever served.

Every run writes under ``jobs/<job id>/`` — checkpoints, committed outputs, events —
and leaves that folder behind when it ends, because what it holds is read after the
run (`RunResult.outputs`, the analyses of a run's events). Nothing else ever deletes
it, so a store that serves many runs (``.bastion/`` in a checkout, where every
``bastion run`` goes by default) would grow by one folder per run for ever.

Retention bounds it with two rules, both needed:

* keep the ``keep`` most recently written jobs, whatever their age — the runs a
  user is likely to look at again;
* of the others, delete only those not written for ``min_age_s`` seconds. A job
  that is still running (in another terminal, on another machine sharing the bucket)
  keeps writing checkpoints and events, so it is young and never deleted under it.

A job that holds a savepoint (``jobs/<job>/savepoint/manifest.json``, written by a
stop: `bastion.runtime.savepoint`) is never deleted by a prune: as in Flink, a
savepoint is its user's, kept until they delete it.

A job's time is that of its newest object. Its objects are deleted newest first:
every layout in this package writes its vouching object last (a checkpoint's
manifest, a commit marker, a log's index), so a deletion cut short by a crash leaves
data nothing points at — never a manifest or marker whose data is gone — and the
next prune finishes it (the job's remaining objects are as old as before).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .store import ObjectStore

__all__ = ["JOBS_PREFIX", "JobFolder", "PruneReport", "delete_job", "list_jobs", "prune_jobs"]

#: Where every job's folder lives in a store.
JOBS_PREFIX = "jobs/"
# what makes a job folder hold a savepoint (`bastion.runtime.savepoint.manifest_key`)
SAVEPOINT_MANIFEST = "savepoint/manifest.json"


@dataclass(frozen=True)
class JobFolder:
    """One job's folder: its id, how many objects and bytes it holds, and when its
    newest object was written (seconds since the epoch)."""

    job: str
    objects: int
    bytes: int
    modified: float
    savepoint: bool = False  # it holds a savepoint: a prune keeps it


@dataclass
class PruneReport:
    """What `prune_jobs` kept and deleted (or would delete, with ``dry_run``)."""

    kept: list[JobFolder] = field(default_factory=list)
    deleted: list[JobFolder] = field(default_factory=list)
    dry_run: bool = False

    @property
    def freed_bytes(self) -> int:
        return sum(job.bytes for job in self.deleted)


def list_jobs(store: ObjectStore) -> list[JobFolder]:
    """Every job folder in ``store``, most recently written first."""
    sizes = store.list_sizes(JOBS_PREFIX)
    times = store.list_modified(JOBS_PREFIX)
    jobs: dict[str, list[tuple[int, float]]] = {}
    for key, size in sizes.items():
        job, slash, _ = key[len(JOBS_PREFIX):].partition("/")
        if not slash or key not in times:  # not inside a job folder, or just deleted
            continue
        jobs.setdefault(job, []).append((size, times[key]))
    folders = [JobFolder(job, len(objects), sum(s for s, _ in objects),
                         max(t for _, t in objects),
                         f"{JOBS_PREFIX}{job}/{SAVEPOINT_MANIFEST}" in sizes)
               for job, objects in jobs.items()]
    # newest first; the id breaks ties so that the order is the same on every call
    return sorted(folders, key=lambda f: (-f.modified, f.job))


def prune_jobs(store: ObjectStore, *, keep: int, min_age_s: float = 3600.0,
               now: float | None = None, dry_run: bool = False) -> PruneReport:
    """Delete the job folders of ``store`` beyond the ``keep`` newest that were last
    written more than ``min_age_s`` seconds before ``now`` (default: the clock).
    With ``dry_run`` nothing is deleted; the report says what would be."""
    if keep < 0 or min_age_s < 0:
        raise ValueError(f"prune_jobs: keep ({keep}) and min_age_s ({min_age_s}) must "
                         "be >= 0")
    now = time.time() if now is None else now
    report = PruneReport(dry_run=dry_run)
    for rank, folder in enumerate(list_jobs(store)):
        if rank < keep or now - folder.modified < min_age_s or folder.savepoint:
            report.kept.append(folder)
            continue
        report.deleted.append(folder)
        if not dry_run:
            delete_job(store, folder.job)
    return report


def delete_job(store: ObjectStore, job: str) -> None:
    """Delete every object of job ``job`` (a job that is over)."""
    times = store.list_modified(f"{JOBS_PREFIX}{job}/")
    # Newest first: the objects that vouch for others (manifests, commit markers)
    # were written last and go first; see the module docstring.
    for key in sorted(times, key=lambda k: (-times[k], k)):
        store.delete(key)
