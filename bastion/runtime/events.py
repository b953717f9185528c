"""The job master's events and progress timeline: complete in the store, bounded in memory.

A job master records *events* (``started``, ``checkpoint_completed``, ``fault``,
``failure_detected``, ``restarted``, ...) and, several times a second, a *progress
point* (records per second, source lag, latency). A long run makes many of both, so
the job master keeps only what its report needs in memory and writes everything to
the store as it goes:

- **In the store, everything.** Events and progress points are appended, as
  concatenated msgpack maps (progress points with ``kind: "progress"``), to a
  segmented log under ``jobs/<job>/events/``: every ``chunk_records`` records become
  one object ``job-master.<n>`` (``n`` from 0, six digits), written while the job runs;
  the rest is written at the end as ``job-master``. That last object vouches for the
  others, like every commit point in the store: once it exists the log is complete.
  A short run writes ``job-master`` only. `read_events` reads a log back in order;
  `event_keys` names its objects and `decode_events` decodes one of them, for readers
  that fetch the objects themselves (the Spark analysis, `bastion.spark_jobs.analyze`).
- **Damage is reported, never loaded.** Msgpack has no checksum, so `decode_events`
  checks what it can: the bytes decode to whole maps up to the very end (a truncated
  object leaves half a record), and each map has a text ``kind`` and a numeric
  ``t_s``. Anything else raises `CorruptRecordError` naming the object and the byte
  offset, rather than dropping a torn tail without a word or handing garbage on.
- **In memory, what the report needs.** A count per kind (progress points included);
  every event of the kinds that recovery times and drill verdicts are computed from
  (`KEPT_KINDS`, at most a few per failure, and failures are bounded by
  ``max_restarts``); and the first ``examples_per_kind`` events of any other kind.
  Of the timeline: the first ``first_points`` points, and around each failure the
  ``context_points`` points before it and after it (`Timeline.mark`) — what
  `bastion.runtime.recovery_times` compares. So a ten-minute run holds no more than a
  five-minute one plus a constant per failure.

Writing is retried with backoff (``store_attempts``); an object that still cannot be
stored is counted (`EventLog.not_stored`) and the job goes on: losing the event log
must not fail a job, but the run's result says that it happened.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from bastion.storage import CorruptRecordError, ObjectStore

# Kinds kept in memory whatever their number: recovery times and drill verdicts are
# computed from them, and each is bounded by the fault schedule or ``max_restarts``.
KEPT_KINDS = frozenset({"started", "fault", "failure_detected", "recovery_planned",
                        "restarted", "recovery", "checkpoint_unusable", "commit_failed"})

_FINAL = "job-master"
_CHUNK_DIGITS = 6


@dataclass(frozen=True)
class EventLimits:
    """How much of its events and timeline a job master keeps in memory, how many
    records one stored chunk holds, and how it retries storing one."""

    examples_per_kind: int = 100
    first_points: int = 3000        # 5 minutes at the default 0.1 s progress interval
    context_points: int = 150       # 15 s on each side of a failure
    chunk_records: int = 4096
    store_attempts: int = 5
    store_backoff_s: float = 0.1    # doubles after each failed attempt


def events_prefix(job: str) -> str:
    return f"jobs/{job}/events/"


def event_keys(keys: list[str], job: str) -> tuple[list[str], bool]:
    """Of the keys listed under a job's events prefix, the objects of its event log in
    the order they were written — chunks by number, then the final object if it is
    there — and whether it is (False: the job is still running, or its job master
    died before the end, so the log may lack its last records)."""
    prefix = events_prefix(job)
    chunks = sorted(k for k in keys if k.startswith(prefix + _FINAL + ".")
                    and k[len(prefix + _FINAL) + 1:].isdigit())
    final = prefix + _FINAL in keys
    return chunks + ([prefix + _FINAL] if final else []), final


def decode_events(data: bytes, key: str) -> list[dict[str, Any]]:
    """The records of one stored object of an event log; `CorruptRecordError` (with
    the byte offset of the first bad record) if the bytes are not whole event maps."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    records: list[dict[str, Any]] = []
    offset = 0
    try:
        for record in unpacker:
            if not (isinstance(record, dict) and isinstance(record.get("kind"), str)
                    and isinstance(record.get("t_s"), (int, float))
                    and not isinstance(record.get("t_s"), bool)):
                raise ValueError(f"record {len(records)} is not an event map with a "
                                 f"kind and a t_s: {str(record)[:80]}")
            records.append(record)
            offset = unpacker.tell()
    except (ValueError, msgpack.UnpackException) as exc:  # FormatError, ExtraData, ...
        raise CorruptRecordError(f"corrupt event log object {key} at byte {offset}: "
                                 f"{str(exc) or type(exc).__name__}", key=key,
                                 offset=offset) from None
    if offset != len(data):  # the unpacker waits for the rest of a half record
        raise CorruptRecordError(f"truncated event log object {key}: {len(data) - offset} "
                                 f"bytes of a partial record at byte {offset}",
                                 key=key, offset=offset)
    return records


def read_events(store: ObjectStore, job: str) -> list[dict[str, Any]]:
    """Every record of a job master's event log, in the order it was recorded (the
    stored chunks, then the final object). A damaged object raises
    `CorruptRecordError`; a log without its final object, `KeyNotFoundError`."""
    prefix = events_prefix(job)
    keys = store.list(prefix)
    ordered, final = event_keys(keys, job)
    if not final:
        store.get(prefix + _FINAL)  # raises KeyNotFoundError naming the missing object
    records: list[dict[str, Any]] = []
    for key in ordered:
        records.extend(decode_events(store.get(key), key))
    return records


class Timeline:
    """The progress points a job master keeps in memory (see the module docstring)."""

    def __init__(self, limits: EventLimits):
        self._limits = limits
        self._kept: list[dict[str, Any]] = []
        self._recent: collections.deque = collections.deque(maxlen=limits.context_points)
        self._keep_next = 0
        self._seen = 0

    def append(self, point: dict[str, Any]) -> None:
        self._seen += 1
        if self._seen <= self._limits.first_points or self._keep_next > 0:
            self._keep_next = max(self._keep_next - 1, 0)
            self._kept.append(point)
        self._recent.append(point)

    def mark(self) -> None:
        """Something happened (a fault, a failure, a restart): keep the points just
        before it and the next ``context_points`` points."""
        self._pin_recent()
        self._keep_next = self._limits.context_points

    def _pin_recent(self) -> None:
        last_s = self._kept[-1]["t_s"] if self._kept else float("-inf")
        self._kept.extend(p for p in self._recent if p["t_s"] > last_s)

    def points(self) -> list[dict[str, Any]]:
        """The kept points and the most recent ones, in time order."""
        last_s = self._kept[-1]["t_s"] if self._kept else float("-inf")
        return self._kept + [p for p in self._recent if p["t_s"] > last_s]


class EventLog:
    """A job master's events and timeline: appended to the store in chunks as they
    come, bounded in memory (see the module docstring)."""

    def __init__(self, store: ObjectStore, job: str, limits: EventLimits):
        self._store = store
        self._prefix = events_prefix(job)
        self._limits = limits
        self.events: list[dict[str, Any]] = []      # in memory: see `KEPT_KINDS`
        self.counts: collections.Counter = collections.Counter()
        self.timeline = Timeline(limits)
        self.not_stored = 0                          # records the store never got
        self.store_error: str | None = None          # the last reason
        self._packer = msgpack.Packer(use_bin_type=True)
        self._pending: list[bytes] = []
        self._chunks = 0
        self._writes: list[asyncio.Task] = []

    def record(self, kind: str, started_s: float | None, *, at: float | None = None,
               **fields: Any) -> dict[str, Any]:
        """Record ``kind`` as happening now, or at wall time ``at`` when the caller
        learnt of it only later (the event still goes after those recorded before)."""
        t = time.time() if at is None else at
        event = {"kind": kind, "t": t, "t_s": t - started_s if started_s else 0.0, **fields}
        self.counts[kind] += 1
        if kind in KEPT_KINDS or self.counts[kind] <= self._limits.examples_per_kind:
            self.events.append(event)
        if kind in ("fault", "failure_detected", "restarted"):
            self.timeline.mark()
        self._append(event)
        return event

    def progress(self, point: dict[str, Any]) -> None:
        self.counts["progress"] += 1
        self.timeline.append(point)
        self._append({"kind": "progress", **point})

    def _append(self, record: dict[str, Any]) -> None:
        self._pending.append(self._packer.pack(record))
        if len(self._pending) >= self._limits.chunk_records:
            data, records = b"".join(self._pending), len(self._pending)
            self._pending = []
            key = f"{self._prefix}{_FINAL}.{self._chunks:0{_CHUNK_DIGITS}d}"
            self._chunks += 1
            self._writes = [w for w in self._writes if not w.done()]
            self._writes.append(asyncio.ensure_future(self._put(key, data, records)))

    async def close(self) -> None:
        """Write what is left as the final object, once every chunk was written."""
        await asyncio.gather(*self._writes)
        data, records = b"".join(self._pending), len(self._pending)
        self._pending = []
        await self._put(self._prefix + _FINAL, data, records)

    async def _put(self, key: str, data: bytes, records: int) -> None:
        delay_s = self._limits.store_backoff_s
        for attempt in range(1, self._limits.store_attempts + 1):
            try:
                await self._store.aput(key, data)
                return
            except Exception as exc:  # noqa: BLE001 - losing events must not fail the job
                error = f"{type(exc).__name__}: {exc}"
            if attempt < self._limits.store_attempts:
                await asyncio.sleep(delay_s)
                delay_s *= 2
        self.not_stored += records
        self.store_error = error

    def summary(self) -> dict[str, Any] | None:
        """What the run's result reports when records could not be stored (None: the
        log is complete)."""
        if not self.not_stored:
            return None
        return {"records": self.not_stored, "error": self.store_error,
                "where": self._prefix}
