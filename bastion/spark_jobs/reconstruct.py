"""``bastion reconstruct``: an operator's eventual checkpoints rebuilt from its output
logs by a Spark job, and written to the store in the form a restart loads.

**What an eventual checkpoint is** (`bastion.protocols.eventual` explains it whole):
under continuous eventual checkpointing (CEC) a stateful operator never snapshots its
state. It writes *control tuples* into its output log instead — ``G_open`` when a part
of its state (a window, a key) opens, ``G_check`` now and then with a part's current
state, ``closed`` when a window fires — each with N, the number of parts open. The
checkpoint at a log time T is found by reading the log backwards from T until the
newest footprint of each of the N open parts is found. Every instance of an operator
has its own log, ``jobs/<job>/logs/<operator>/<instance>/`` (`bastion.storage.log`:
sealed segments ``seg-*``, parts ``part-*`` of the open segment, an ``index``).

**Why Spark.** The in-process path (`eventual.read_eventual_checkpoint`) reads one
instance's log backwards on one core. Offline — to check a store, to prepare a
restart, to rebuild the checkpoints of a damaged log — every instance's whole log may
have to be read, and the work is embarrassingly parallel per log object: only the
control tuples matter, and they are a small fraction of the records.

**How it is spread out.**

- The *driver* lists: for each instance of the operator, its log objects
  (`log_object_keys`; the index is not needed, it may be the damaged object).
- The keys go out with ``sc.parallelize``; each task opens the store itself
  (``open_store`` on the store's credential-free URL: a directory, or S3 through the
  minio SDK with the credentials of the executor's own environment — never in a
  task, a URL or a log line) and reads its objects with `salvage_object`: every
  record whose CRC checks out, whatever is damaged around it. A task returns, per
  object, only the control tuples, the newest seq with ``ts <= T`` (the newest
  overall without ``--at``), and the damage found.
- A second stage groups the scans by instance (partitioned by the instance's
  index, not by a salted string hash) and, per instance, dedupes the control tuples by
  seq (a part and the sealed segment that replaced it hold the same records), sorts
  them newest first and runs `eventual.Reconstruction` over them with ``newest_seq``
  set — the same code as the in-process path, which is why the two give the same
  checkpoint, ``to_wire()`` for ``to_wire()``: the result records the in-process path
  also reads on the way only move ``newest_seq`` and the extent's end, which the
  tasks report. This runs on the executors, not the driver, because an operator
  whose parts never close (a keyed reduce, a count window) keeps a ``G_open`` per key: hundreds of
  thousands of control tuples whose serial rebuild on the driver would cap how well
  the job scales with executors. The driver only collects one checkpoint per
  instance and writes it.

**Damage.** A record that fails its CRC, a length that cannot be right, a record cut
off at the end of an object (a torn tail) are reported with the object, the byte
offset and why, and never loaded; the checkpoint is built from the intact records,
exactly as the in-process path does when its fast reader meets damage
(`salvage_log`). A control tuple whose own checksum fails is skipped and counted in
the EC (``skipped``). The in-process path reads only as far back as the extent, so it
may not notice damage older than that; this job reads everything and reports it all.

**What is written.** Each instance's EC goes to
``jobs/<job>/eventual/<operator>/<instance>/ec-<seq, 20 digits>`` through
`eventual.store_eventual_checkpoint` (msgpack of ``to_wire()`` behind a length and a
CRC32); `eventual.load_eventual_checkpoint` reads it back. An instance whose log is
empty (or has nothing at or before T) has no EC and nothing is written for it.

Why this module imports ``bastion.protocols.eventual`` although a Spark job should
use the store and nothing of a running engine: that module *is* the control-tuple
format and the reconstruction, pure logic over log records that imports storage and
msgpack only; a copy here would drift from the protocol's. Its package loads the other
protocol modules, but no Ray (checked by the tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from bastion.protocols.eventual import (EventualCheckpoint, Reconstruction, eventual_prefix,
                                        is_control, log_prefix, parts_of,
                                        store_eventual_checkpoint, valid)
from bastion.storage import KeyNotFoundError, ObjectStore, StorageError, open_store
from bastion.storage.errors import BastionError
from bastion.storage.log import (Damage, LogRecord, gc_paused, log_object_keys,
                                 salvage_object)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark tasks per executor core: log objects are of similar size (a sealed segment
#: is ``max_segment_bytes``), so a few tasks per core balance the load and keep the
#: per-task cost (a store client, a Python worker round trip) small against the reading.
_TASKS_PER_CORE = 4


class ReconstructError(BastionError):
    """The reconstruction cannot run: no log for the operator, a store that failed
    under the tasks. The message says which and why."""


def _instance_order(name: str) -> tuple[int, int | str]:
    # "2" before "10": instances are numbered, but any name is accepted
    return (0, int(name)) if name.isdigit() else (1, name)


def find_instances(store: ObjectStore, job: str, operator: str) -> list[str]:
    """The instances of ``operator`` that have a log, in instance order;
    `ReconstructError` naming the operators that do have logs if it has none."""
    for name, what in ((job, "job"), (operator, "operator")):
        if not name or "/" in name:
            raise ReconstructError(f"invalid {what} {name!r}: it is one path component")
    base = log_prefix(job, operator)
    instances = {key[len(base):].partition("/")[0] for key in store.list(base)}
    instances.discard("")
    if not instances:
        logs = f"jobs/{job}/logs/"
        known = sorted({key[len(logs):].partition("/")[0] for key in store.list(logs)})
        raise ReconstructError(
            f"no log of operator {operator!r} of job {job!r} in {store.url}: "
            + (f"operators with logs in that job: {', '.join(known)}" if known
               else "that job has no operator logs"))
    return sorted(instances, key=_instance_order)


# -- the tasks: read objects, keep the control tuples ------------------------------------


@dataclass
class ObjectScan:
    """What a task found in one log object: its control tuples, the newest seq with
    ``ts <= at`` (-1: none), the damage; or, if the store failed, ``error``."""

    instance: str
    key: str
    controls: list[LogRecord] = field(default_factory=list)
    newest_seq: int = -1
    records: int = 0
    damaged: list[Damage] = field(default_factory=list)
    error: str | None = None


def scan_object(instance: str, key: str, data: bytes, at: float | None) -> ObjectScan:
    """The control tuples and the newest seq (with ``ts <= at``) of one log object's
    intact records; damage reported, never loaded."""
    # measured on a 100,000-record segment: 157,000 -> 245,000 records/s of CPU
    with gc_paused():
        salvaged = salvage_object(key, data)
    records = salvaged.records
    if at is None:
        newest = max((r[0] for r in records), default=-1)
    else:
        newest = max((r[0] for r in records if r[1] <= at), default=-1)
    return ObjectScan(instance, key, _newest_per_part(records, at), newest, len(records),
                      salvaged.damaged)


def _newest_per_part(records: list[LogRecord], at: float | None) -> list[LogRecord]:
    """Of one object's control tuples (at or before ``at``), only what the backward
    pass can use: per part the newest that checks out — it hides every older one of
    the same part — and the damaged ones newer than it (the pass reports those as
    skipped). Checking here, per object, leaves the per-instance stage a few tuples
    per part instead of every footprint ever written, and the shuffle little to move."""
    kept: list[LogRecord] = []
    decided: set[bytes] = set()
    for record in reversed(records):
        value = record[2]
        if not is_control(value) or (at is not None and record[1] > at):
            continue
        parts = parts_of(value) if valid(value) else None
        if parts is None:
            kept.append(record)
            continue
        # A burst names many parts: it is of use while one of them is undecided.
        if not decided.issuperset(parts):
            decided.update(parts)
            kept.append(record)
    kept.reverse()
    return kept


def _scan_partition(url: str, at: float | None
                    ) -> Callable[[Iterable[tuple[str, str]]], Iterator[ObjectScan]]:
    """The ``mapPartitions`` function over ``(instance, key)`` pairs. Only ``url``
    and ``at`` are shipped: the store is opened in the task, with the credentials of
    the executor's environment."""

    def scan(partition: Iterable[tuple[str, str]]) -> Iterator[ObjectScan]:
        store = None
        try:
            for instance, key in partition:
                try:
                    store = store or open_store(url)
                    data = store.get(key)
                except KeyNotFoundError:
                    # a part deleted by a seal after the listing: its records are in
                    # the sealed segment, which is listed too
                    yield ObjectScan(instance, key)
                    continue
                except StorageError as exc:
                    yield ObjectScan(instance, key, error=str(exc))
                    continue
                yield scan_object(instance, key, data, at)
        finally:
            if store is not None:
                store.close()

    return scan


# -- one reconstruction per instance -----------------------------------------------------


@dataclass
class InstanceEC:
    """One instance's eventual checkpoint, how it was found and where it went."""

    instance: str
    ec: EventualCheckpoint
    objects: int                       # log objects read
    records: int                       # intact records read (a record in a part and a
    #                                    segment counts twice)
    damaged: list[Damage] = field(default_factory=list)
    key: str | None = None             # where the EC was written; None: not written

    @property
    def empty(self) -> bool:
        """No record at or before T: nothing to restore, nothing written."""
        return self.ec.seq < 0


def checkpoint_from_scans(scans: list[ObjectScan], at: float | None
                          ) -> EventualCheckpoint:
    """The EC of one instance from its objects' scans: the control tuples deduped by
    seq and fed newest first to the same `Reconstruction` the in-process path runs."""
    newest = max((s.newest_seq for s in scans), default=-1)
    controls: dict[int, LogRecord] = {}
    for scan in scans:
        for record in scan.controls:
            controls.setdefault(record[0], record)
    rebuild = Reconstruction(at, newest_seq=newest if newest >= 0 else None)
    for seq in sorted(controls, reverse=True):  # tuples newer than T: feed passes them
        _, ts, value = controls[seq]
        if rebuild.feed(seq, ts, value):
            break
    return rebuild.finish()


def build_instance(instance: str, scans: list[ObjectScan], at: float | None
                   ) -> InstanceEC:
    """One instance's EC from the scans of its objects, given in log-object order."""
    return InstanceEC(instance, checkpoint_from_scans(scans, at), len(scans),
                      sum(s.records for s in scans), [d for s in scans for d in s.damaged])


def _instance_builder(order: dict[str, int], at: float | None
                      ) -> Callable[[tuple[int, Any]], tuple[InstanceEC, list]]:
    """The second stage's function over ``(instance index, scans)``: the instance's
    EC, and the scans whose object could not be read with their place in the work
    list (the driver names the first). ``order`` puts the scans back in log-object
    order, which the shuffle does not keep, so that damage is reported in order."""

    def build(group: tuple[int, Any]) -> tuple[InstanceEC, list]:
        scans = sorted(group[1], key=lambda scan: order[scan.key])
        failures = [(order[s.key], s) for s in scans if s.error is not None]
        return build_instance(scans[0].instance, scans, at), failures

    return build


def reconstruct_operator(spark: "SparkSession", store: ObjectStore, job: str,
                         operator: str, at: float | None = None, write: bool = True
                         ) -> list[InstanceEC]:
    """The eventual checkpoint at log time ``at`` (default: the end of each log) of
    every instance of ``operator``, found by a Spark job; written to the store
    (``write``) under `eventual_prefix`. `ReconstructError` if the operator has no
    log or the store fails under the tasks."""
    instances = find_instances(store, job, operator)
    work = [(instance, key) for instance in instances
            for key in log_object_keys(store, log_prefix(job, operator, instance))]
    url = store.url  # never holds credentials: the tasks take theirs from the environment
    sc = spark.sparkContext
    built: dict[str, InstanceEC] = {}
    if work:
        slices = max(1, min(len(work), sc.defaultParallelism * _TASKS_PER_CORE))
        index = {instance: i for i, instance in enumerate(instances)}
        groups = max(1, min(len(instances), sc.defaultParallelism))
        failed: list[tuple[int, ObjectScan]] = []
        for found, failures in (
                sc.parallelize(work, slices).mapPartitions(_scan_partition(url, at))
                .map(lambda scan: (index[scan.instance], scan))
                .groupByKey(groups, partitionFunc=lambda i: i)
                .map(_instance_builder({key: n for n, (_, key) in enumerate(work)}, at))
                .collect()):
            built[found.instance] = found
            failed.extend(failures)
        if failed:
            scan = min(failed, key=lambda f: f[0])[1]
            raise ReconstructError(f"cannot read {scan.key} from {url}: {scan.error}")
    results = []
    for instance in instances:
        found = built.get(instance) or build_instance(instance, [], at)
        if write and not found.empty:
            found.key = store_eventual_checkpoint(
                store, eventual_prefix(job, operator, instance), found.ec)
        results.append(found)
    return results


# -- what a person reads ---------------------------------------------------------------


SUMMARY_HEADER = ("instance", "objects", "records", "open parts", "extent records",
                  "replay_from", "complete", "skipped")


def _positions(position: dict[str, int] | None) -> str:
    """Source instances and offsets; the runtime's entries for the merge (records per
    input channel, ended channels: keys without a ``/``) are left out."""
    if position is None:
        return "everything"
    return " ".join(f"{source}@{offset}" for source, offset in position.items()
                    if "/" in source) or "-"


def summary_rows(results: list[InstanceEC]) -> list[tuple[str, ...]]:
    """One line per instance for the terminal (`SUMMARY_HEADER`)."""
    rows: list[tuple[str, ...]] = []
    for r in results:
        if r.empty:
            rows.append((r.instance, f"{r.objects:,}", f"{r.records:,}", "-", "-",
                         "no record at or before T", "-", "-"))
            continue
        ec = r.ec
        rows.append((r.instance, f"{r.objects:,}", f"{r.records:,}", f"{ec.n_open:,}",
                     f"{ec.extent_records:,}", _positions(ec.replay_from),
                     "yes" if ec.complete else "NO", f"{len(ec.skipped):,}"))
    return rows


def describe(results: list[InstanceEC]) -> list[str]:
    """The lines after the table: damage found, skipped control tuples, where each
    EC was written."""
    lines = []
    for r in results:
        for d in r.damaged:
            lines.append(f"instance {r.instance}: damaged {d.key} at byte {d.offset}: "
                         f"{d.why} (not loaded)")
        if r.ec.skipped:
            seqs = ", ".join(map(str, r.ec.skipped[:10])) + (
                ", ..." if len(r.ec.skipped) > 10 else "")
            lines.append(f"instance {r.instance}: control tuples skipped (checksum "
                         f"fails): seq {seqs}")
        if not r.empty and not r.ec.complete:
            lines.append(f"instance {r.instance}: incomplete — a footprint is missing, "
                         "the instance restarts from nothing and replays everything")
    for r in results:
        where = r.key if r.key else "nothing written (no log record at or before T)"
        lines.append(f"instance {r.instance}: {where}")
    return lines


def wire(results: list[InstanceEC]) -> dict[str, dict[str, Any]]:
    """Each instance's EC in its plain form (for comparisons and scripts)."""
    return {r.instance: r.ec.to_wire() for r in results}
