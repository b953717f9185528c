"""The log connector: segmented logs in an object store, as sinks and sources.

``bn.sinks.Log(url)`` and ``bn.sources.Log(url)`` describe a log by its URL; this
module does the I/O behind them when a job runs: `prepare_log` empties a log home
before a run, `LogSinkWriter` appends each committed commit point exactly once, and
`LogSourceReader` reads a log back from a checkpointed offset. They open the store
inside the worker at first use, so a description carries only its URL.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import msgpack

from bastion.io_interfaces import LogDescription, SinkWriter, SourceReader
from bastion.storage import (CorruptRecordError, KeyNotFoundError, LogReader, LogWriter,
                             ObjectStore, StorageError, open_store)
from bastion.storage.log import LogRecord

# The layout of a log at a URL, which sinks write and sources read. The URL's store is
# the log's home: ``open_store(url)`` is rooted at it, and every key below is relative
# to it.
#
#   layout              {"format": 1, "parallelism": p}: written by the sink's prepare
#   index, seg-*, part-*  the log itself, when p == 1 (or any log written by a LogWriter
#                         with an empty prefix)
#   <i>/index, ...      sub-log of sink instance i, when p > 1
#   commit, <i>/commit  the commit marker of that log (see LogSinkWriter)

_LAYOUT_KEY = "layout"
_LAYOUT_FORMAT = 1
_COMMIT_MARKER = "commit"
_LOG_NAMES = ("index", _COMMIT_MARKER)


def sub_log_prefix(index: int, parallelism: int) -> str:
    """Where instance ``index`` of a sink of ``parallelism`` writes: the root itself
    when the sink is not parallel, else the sub-log ``<index>/``."""
    return "" if parallelism == 1 else f"{index}/"


def read_layout(store: ObjectStore) -> int | None:
    """The parallelism of the sink that wrote the log (None: no layout object)."""
    try:
        doc = json.loads(store.get(_LAYOUT_KEY))
    except KeyNotFoundError:
        return None
    if doc.get("format") != _LAYOUT_FORMAT:
        raise StorageError(f"{store.url}: log layout has unknown format {doc.get('format')!r}")
    return int(doc["parallelism"])


def _is_log_key(key: str) -> bool:
    """Whether ``key`` is one of the objects a log layout consists of."""
    head, sep, name = key.rpartition("/")
    if sep and not head.isdigit():
        return False
    if not sep and name == _LAYOUT_KEY:
        return True
    return name in _LOG_NAMES or name.startswith(("seg-", "part-"))


@dataclass(frozen=True)
class _Marker:
    """Commit point ``commit`` occupies seqs ``[start_seq, end_seq)`` of the log."""

    commit: int
    start_seq: int
    end_seq: int

    def encode(self) -> bytes:
        return json.dumps({"commit": self.commit, "start_seq": self.start_seq,
                           "end_seq": self.end_seq}).encode()

    @classmethod
    def decode(cls, data: bytes) -> _Marker:
        doc = json.loads(data)
        return cls(int(doc["commit"]), int(doc["start_seq"]), int(doc["end_seq"]))


class LogSinkWriter(SinkWriter):
    """Appends each committed commit point to one log exactly once.

    Before it appends the values of commit point ``c`` the writer stores the marker
    ``commit`` next to the log: "``c`` occupies seqs ``[start, end)``" (write-ahead).
    Then it appends and flushes. A crash anywhere leaves the log between ``start``
    and ``end``; a replayed ``apply(c)`` (the runtime re-applies committed commits
    after a failure) reads the marker and the log's end and appends only the values
    not yet durable — none if the crash came after the flush. A commit older than
    the marker's was applied whole before it and is skipped. Commits with no values
    change nothing and are not recorded. An ``apply`` that raised (the store was
    unreachable) is kept and finished first by the next ``apply``; the log is then
    reopened from the store, so what the writer believes is always what is durable.
    """

    def __init__(self, url: str, prefix: str, name: str):
        super().__init__()
        self.url = url
        self.prefix = prefix
        self.name = name
        self.marker_key = prefix + _COMMIT_MARKER
        self._store: ObjectStore | None = None
        self._log: LogWriter | None = None  # opened at the first apply, in the worker
        self._marker: _Marker | None = None
        self._backlog: list[tuple[int, list]] = []  # applies that raised, oldest first

    def write(self, values: list) -> None:
        try:
            msgpack.packb(values, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            for value in values:
                try:
                    msgpack.packb(value, use_bin_type=True)
                except (TypeError, ValueError, OverflowError) as e:
                    raise TypeError(
                        f"{self.name} cannot store a value of type {type(value).__name__} "
                        f"({e}): log values must be msgpack-serialisable (None, bool, int, "
                        "float, str, bytes, and lists, tuples and dicts of them)") from None
            raise
        super().write(values)

    def apply(self, commit: int, values: list) -> None:
        if not any(c == commit for c, _ in self._backlog):
            self._backlog.append((commit, values))
            self._backlog.sort(key=lambda item: item[0])
        try:
            while self._backlog:
                self._apply(*self._backlog[0])
                self._backlog.pop(0)
        except BaseException:
            self._log = None  # reopen (and recover) from the store next time
            raise

    def _open(self) -> LogWriter:
        if self._log is None:
            if self._store is None:
                self._store = open_store(self.url)
            self._log = LogWriter(self._store, self.prefix)
            try:
                self._marker = _Marker.decode(self._store.get(self.marker_key))
            except KeyNotFoundError:
                self._marker = None
        return self._log

    def _apply(self, commit: int, values: list) -> None:
        if not values:
            return
        log = self._open()
        marker = self._marker
        if marker is not None and commit < marker.commit:
            return  # applied whole before the marker moved on
        if marker is not None and commit == marker.commit:
            self._finish(marker, values)
            return
        expected_end = 0 if marker is None else marker.end_seq
        if log.next_seq != expected_end:
            if marker is not None and log.next_seq < marker.end_seq:
                raise StorageError(
                    f"{self.name}: commit point {marker.commit} was only partly appended "
                    f"(log ends at seq {log.next_seq}, {marker.end_seq} expected) and is "
                    f"not being applied again before commit point {commit}")
            raise StorageError(
                f"{self.name}: the log ends at seq {log.next_seq} but its commit marker "
                f"accounts for {expected_end} records: another writer appended to it")
        self._begin(commit, log.next_seq, len(values))
        assert self._marker is not None  # `_begin` has just set it
        self._finish(self._marker, values)

    def _begin(self, commit: int, start_seq: int, count: int) -> None:
        """Write-ahead: record where commit ``commit`` goes before appending it."""
        marker = _Marker(commit, start_seq, start_seq + count)
        assert self._store is not None
        self._store.put(self.marker_key, marker.encode())
        self._marker = marker

    def _finish(self, marker: _Marker, values: list) -> None:
        """Append the values of ``marker.commit`` not yet in the log; flush."""
        log = self._open()
        if marker.end_seq - marker.start_seq != len(values):
            raise StorageError(
                f"{self.name}: commit point {marker.commit} has {len(values)} values but "
                f"its marker reserved {marker.end_seq - marker.start_seq}")
        done = log.next_seq - marker.start_seq
        if not 0 <= done <= len(values):
            raise StorageError(
                f"{self.name}: the log ends at seq {log.next_seq}, outside commit point "
                f"{marker.commit}'s seqs [{marker.start_seq}, {marker.end_seq})")
        if done < len(values):
            now_s = time.time()
            log.append_many([(now_s, value) for value in values[done:]])
        log.flush()


def prepare_log(url: str, parallelism: int, what: str) -> None:
    """Empty the log home at ``url`` for a sink of ``parallelism`` instances: delete
    the log objects a previous run left and write ``layout``. ``what`` names the sink
    in errors. Refuses a URL holding objects that are not part of a log, so a typo
    cannot wipe unrelated data."""
    store = open_store(url)
    try:
        keys = store.list("")
        foreign = [key for key in keys if not _is_log_key(key)]
        if foreign:
            raise ValueError(
                f"{what}: {store.url} holds objects that are not part of a log "
                f"(e.g. {foreign[0]!r}); give the sink a location of its own")
        for key in keys:
            store.delete(key)
        store.put(_LAYOUT_KEY, json.dumps({"format": _LAYOUT_FORMAT,
                                          "parallelism": parallelism}).encode())
    finally:
        store.close()


def log_shares(logs: int, parallelism: int, index: int) -> list[tuple[int, int, int]]:
    """What instance ``index`` of ``parallelism`` reads of ``logs`` logs:
    ``(log, modulus, remainder)`` triples — the records of ``log`` whose
    ``seq % modulus == remainder``. With at least as many logs as instances, whole
    logs are dealt round-robin (instance ``i`` reads logs ``i, i+p, …``); with fewer,
    the instances that share a log split it by seq."""
    if logs >= parallelism:
        return [(log, 1, 0) for log in range(index, logs, parallelism)]
    log = index % logs
    return [(log, len(range(log, parallelism, logs)), index // logs)]


class _LogShare:
    """One log (the root log or a sub-log) as one source instance reads it.

    ``scanned_seq``: every seq below it has been fetched, into ``buffer`` (records of
    this share not yet handed out) or skipped (another instance's). The next record to
    hand out is thus ``next_seq``: what a checkpoint stores. ``end_seq`` bounds a
    bounded read (None: follow the log).
    """

    def __init__(self, reader: LogReader, prefix: str, modulus: int, remainder: int):
        self.reader = reader
        self.prefix = prefix
        self.modulus = modulus
        self.remainder = remainder
        self.scanned_seq = 0
        self.end_seq: int | None = None
        self.buffer: deque[LogRecord] = deque()
        self.batches: Iterator[list[LogRecord]] | None = None
        self.poll_due_s = 0.0

    @property
    def next_seq(self) -> int:
        return self.buffer[0][0] if self.buffer else self.scanned_seq

    @property
    def done(self) -> bool:
        return (not self.buffer and self.end_seq is not None
                and self.scanned_seq >= self.end_seq)

    def rewind(self, next_seq: int, end_seq: int | None) -> None:
        self.scanned_seq, self.end_seq = next_seq, end_seq
        self.buffer.clear()
        self.batches = None


class LogSourceReader(SourceReader):
    """One instance's cursor over its shares of a log; opens the store at first use.

    State: ``(next seq per share, end seq per share)``. The end seqs are fixed when
    the reader first opens and travel with every checkpoint, so a restored instance
    reads exactly the records the failed one would have read, however much the log
    grew meanwhile. A record arrived when it was appended: `arrivals` gives the
    records' ``ts`` in the log, which a replay reads again.
    """

    reads_store = True

    def __init__(self, source: LogDescription, index: int, parallelism: int):
        self.source = source
        self.index = index
        self.parallelism = parallelism
        self._store: ObjectStore | None = None
        self._shares: list[_LogShare] | None = None
        self._restored: Any = None  # state handed to restore() before opening
        self._turn = 0
        self._arrivals: list[float] = []  # the ts of the records the last read returned

    @property
    def offset(self) -> tuple[int, ...] | None:  # type: ignore[override]
        """The next seq to read in each share (None before the first read)."""
        return None if self._shares is None else tuple(s.next_seq for s in self._shares)

    def state(self) -> Any:
        if self._shares is None:
            return self._restored
        return (tuple(s.next_seq for s in self._shares),
                tuple(s.end_seq for s in self._shares))

    def restore(self, state: Any) -> None:
        self._restored = state
        self._shares = None  # reopened, from the restored seqs, at the next read

    def seek(self, offset: Any) -> None:
        self.restore(offset)

    def _open(self) -> list[_LogShare]:
        src = self.source
        if self._store is None:
            self._store = open_store(src.url)
        store = self._store
        logs = read_layout(store)
        if logs is None:
            if not (store.exists("index") or store.list("part-") or store.list("seg-")):
                raise StorageError(f"{src!r}: no log at {store.url} (no layout, index, "
                                   "segment or part object)")
            logs = 1
        shares = []
        for log, modulus, remainder in log_shares(logs, self.parallelism, self.index):
            prefix = sub_log_prefix(log, logs)
            shares.append(_LogShare(LogReader(store, prefix), prefix, modulus, remainder))
        if self._restored is not None:
            next_seqs, end_seqs = self._restored
            if len(next_seqs) != len(shares):
                raise StorageError(
                    f"{src!r}: the checkpoint of instance {self.index} has {len(next_seqs)} "
                    f"sub-log offsets but the log now has {len(shares)} for it: the log at "
                    f"{store.url} was rewritten with another parallelism")
            for share, next_seq, end_seq in zip(shares, next_seqs, end_seqs):
                share.rewind(next_seq, end_seq)
        elif not src.follow:
            for share in shares:
                share.end_seq = self._guard(share, share.reader.next_seq)
        self._shares = shares
        return shares

    def _guard(self, share: _LogShare, fn: Callable[[], Any]) -> Any:
        """Call ``fn``; a corrupt record's error names the log it is in."""
        try:
            return fn()
        except CorruptRecordError as e:
            raise CorruptRecordError(
                f"{self.source!r}, log {share.prefix or '(root)'!r}: {e}",
                key=e.key, offset=e.offset) from e

    def read(self, max_records: int, now_s: float) -> list | None:
        shares = self._shares if self._shares is not None else self._open()
        with_ts = self.source.with_ts
        out: list = []
        arrivals = self._arrivals = []
        n = len(shares)
        for step in range(n):
            share = shares[(self._turn + step) % n]
            while len(out) < max_records and (share.buffer or self._fill(share, now_s)):
                buffer = share.buffer
                for _ in range(min(max_records - len(out), len(buffer))):
                    _, ts, value = buffer.popleft()
                    out.append((ts, value) if with_ts else value)
                    arrivals.append(ts)
            if len(out) >= max_records:
                break
        if self.source.follow:
            self._turn = (self._turn + 1) % n  # no sub-log starves the others
            return out
        return out if out or not all(s.done for s in shares) else None

    def arrivals(self, n: int, now_s: float) -> list[float] | None:
        arrivals = self._arrivals
        if all(type(ts) is float and ts <= now_s for ts in arrivals):
            return arrivals
        return [min(float(ts), now_s) for ts in arrivals]  # a ts ahead of this clock

    def _fill(self, share: _LogShare, now_s: float) -> bool:
        """Fetch records into ``share.buffer``; False if none is available now."""
        while not share.buffer:
            end = share.end_seq
            if end is not None and share.scanned_seq >= end:
                share.batches = None
                return False
            batches = share.batches
            if batches is None:
                if now_s < share.poll_due_s:
                    return False
                batches = share.batches = share.reader.read_batches(share.scanned_seq)
            batch = self._guard(share, lambda: next(batches, None))
            if batch is None:
                share.batches = None
                if end is not None:
                    raise StorageError(
                        f"{self.source!r}: log {share.prefix or '(root)'!r} ends at seq "
                        f"{share.scanned_seq}, before seq {end} it held when the source "
                        "opened: the log was deleted or rewritten while being read")
                share.poll_due_s = now_s + self.source.poll_interval_s
                return False
            if end is not None and batch[-1][0] >= end:
                batch = batch[:max(0, end - batch[0][0])]
            if not batch:
                share.scanned_seq = end  # type: ignore[assignment]
                continue
            share.scanned_seq = batch[-1][0] + 1
            if share.modulus > 1:
                modulus, remainder = share.modulus, share.remainder
                batch = [r for r in batch if r[0] % modulus == remainder]
            share.buffer.extend(batch)
        return True
