"""Sinks: where results leave a topology, exactly once.

A sink instance receives records and *stages* them; they become visible only when the
commit point covering them — a checkpoint, or the end of a bounded stream — is
complete. This is the two-phase commit that keeps outputs exactly-once: records
staged after the last complete checkpoint are thrown away on recovery and produced
again by the replay (see `bastion.runtime.outputs`).

- ``Collect()`` keeps committed values in memory; `RunResult.outputs[name]` lists them,
  in order per sink instance, instances in index order.
- ``File(path)`` appends committed values as JSON lines, each commit point once even
  when a crash interrupts the append (a marker written ahead says which bytes it
  owns); with parallelism > 1 instance ``i`` writes ``<stem>-<i><suffix>``.
- ``Discard()`` only counts (for benchmarks).
- ``Log(url)`` appends committed values to a segmented log in an object store
  (`bastion.storage.log`), which ``bn.sources.Log(url)`` reads back.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgpack

from bastion.storage import KeyNotFoundError, LogWriter, ObjectStore, StorageError, open_store


class SinkWriter:
    """One sink instance. It stages records (`write`); at each commit point the
    runtime takes what was staged (`take_staged`) and stores it durably; once the
    commit point is complete it calls `apply` with those records, in commit order,
    for sinks with an outside effect (a file). `apply` must be idempotent per commit
    point: after a failure it may be called again for a commit it already applied."""

    # False for writers that drop values (Discard): lineage ids are not kept for them.
    keeps_values = True

    def __init__(self) -> None:
        self.staged: list = []

    def write(self, values: list) -> None:
        self.staged.extend(values)

    def take_staged(self) -> list:
        staged, self.staged = self.staged, []
        return staged

    def apply(self, commit: int, values: list) -> None:
        """Make the committed ``values`` of commit point ``commit`` visible outside."""


class Sink:
    def prepare(self, parallelism: int) -> None:
        """Called once per job before any instance opens (e.g. to truncate old output)."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        raise NotImplementedError


class Collect(Sink):
    """Keep committed values; `RunResult.outputs[name]` lists them."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return SinkWriter()

    def __repr__(self) -> str:
        return "Collect()"


class _DiscardWriter(SinkWriter):
    keeps_values = False

    def write(self, values: list) -> None:
        pass


class Discard(Sink):
    """Drop every value; the run's metrics still count them."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _DiscardWriter()

    def __repr__(self) -> str:
        return "Discard()"


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"value of type {type(value).__name__} is not JSON serialisable")


class _FileWriter(SinkWriter):
    """Appends each committed commit point to the file exactly once.

    Before it appends the values of commit point ``c`` the writer stores, in a
    sidecar file ``<path>.commit``, the marker "``c`` occupies bytes ``[start, end)``
    of the file" (write-ahead, like `_LogSinkWriter`), then appends and fsyncs. A
    crash anywhere in between leaves a marker that describes the file: a replayed
    ``apply(c)`` — by this writer or by the one a replacement worker opens — cuts the
    file back to ``start`` and writes ``c`` again, so a record half-written or
    written whole before the crash is never there twice. A commit older than the
    marker's was applied whole before the marker moved on and is skipped. Bytes past
    the marker's ``end`` belong to no complete commit and are cut off before the
    next commit is appended. Commits with no values change nothing and are not
    recorded.
    """

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.marker = path.with_name(path.name + ".commit")

    def _read_marker(self) -> tuple[int, int, int] | None:
        """The marker (commit, start, end), or None before the first commit."""
        try:
            doc = json.loads(self.marker.read_text())
        except FileNotFoundError:
            return None
        return int(doc["commit"]), int(doc["start"]), int(doc["end"])

    def _write_marker(self, commit: int, start: int, end: int) -> None:
        # tmp + fsync + rename: a crash leaves the old marker or the new one, whole.
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"commit": commit, "start": start, "end": end}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.marker)

    def apply(self, commit: int, values: list) -> None:
        if not values:
            return
        payload = "".join(json.dumps(v, default=_json_default) + "\n"
                          for v in values).encode("utf-8")
        marker = self._read_marker()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = self.path.stat().st_size if self.path.exists() else 0
        if marker is not None and commit < marker[0]:
            return  # applied whole before the marker moved on
        if marker is not None and commit == marker[0]:
            start = marker[1]  # replayed: whatever of it reached the file is redone
        else:
            start = 0 if marker is None else marker[2]
        if marker != (commit, start, start + len(payload)):
            self._write_marker(commit, start, start + len(payload))
        if size < start:
            raise OSError(f"{self.path} ends at byte {size}, before the {start} bytes its "
                          f"commit marker {self.marker.name} accounts for: it was cut by "
                          "something other than this sink")
        with open(self.path, "r+b" if size else "wb") as f:
            f.truncate(start)
            f.seek(start)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())


class File(Sink):
    """Append committed values to a JSON-lines file (one file per instance), each
    commit point exactly once (see `_FileWriter`); ``<path>.commit`` beside it is the
    sink's commit marker."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).absolute()

    def prepare(self, parallelism: int) -> None:
        for index in range(parallelism):
            path = self.path_for(index, parallelism)
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".commit").unlink(missing_ok=True)

    def path_for(self, index: int, parallelism: int) -> Path:
        if parallelism == 1:
            return self.path
        return self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}")

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _FileWriter(self.path_for(index, parallelism))

    def __repr__(self) -> str:
        return f"File({str(self.path)!r})"


# --------------------------------------------------------------------------- logs
#
# The layout of a log at a URL, shared with `bastion.sources.Log`. The URL's store is
# the log's home: ``open_store(url)`` is rooted at it, and every key below is relative
# to it.
#
#   layout              {"format": 1, "parallelism": p}: written by the sink's prepare
#   index, seg-*, part-*  the log itself, when p == 1 (or any log written by a LogWriter
#                         with an empty prefix)
#   <i>/index, ...      sub-log of sink instance i, when p > 1
#   commit, <i>/commit  the commit marker of that log (see _LogSinkWriter)

_LAYOUT_KEY = "layout"
_LAYOUT_FORMAT = 1
_COMMIT_MARKER = "commit"
_LOG_NAMES = ("index", _COMMIT_MARKER)


def _normalise_log_url(url: str, what: str) -> str:
    """Check a log URL's scheme (no I/O) and make a ``local://`` path absolute, so the
    URL means the same directory in every worker process, whatever its cwd."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"{what}: {url!r} is not a store URL; use local://PATH or "
                         "s3://BUCKET/PREFIX?endpoint=HOST:PORT")
    parts = urlsplit(url)
    if parts.scheme.lower() == "local":
        path = os.path.abspath(os.path.expanduser(parts.netloc + parts.path))
        return f"local://{path}" + (f"?{parts.query}" if parts.query else "")
    if parts.scheme.lower() != "s3":
        raise ValueError(f"{what}: unknown scheme {parts.scheme!r} in {url!r}; use "
                         "local://PATH or s3://BUCKET/PREFIX?endpoint=HOST:PORT")
    return url


def _sub_log_prefix(index: int, parallelism: int) -> str:
    """Where instance ``index`` of a sink of ``parallelism`` writes: the root itself
    when the sink is not parallel, else the sub-log ``<index>/``."""
    return "" if parallelism == 1 else f"{index}/"


def _read_layout(store: ObjectStore) -> int | None:
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


class _LogSinkWriter(SinkWriter):
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


class Log(Sink):
    """Append committed values to a segmented log in an object store, exactly once.

    ``url`` names the log's home, a store URL (``local://PATH`` or
    ``s3://BUCKET/PREFIX?endpoint=HOST:PORT``) used by nothing else: the store opened
    at that URL holds only this log. With parallelism 1 the sink writes one log at
    the root of that store, which any ``LogReader(open_store(url), "")`` reads; with
    parallelism ``p > 1`` instance ``i`` writes the sub-log ``<i>/``. The object
    ``layout`` records ``p`` so that ``bn.sources.Log(url)`` reads the sink's output
    back at any parallelism.

    Each record is ``(seq, ts, value)``: ``value`` is the committed value (it must be
    msgpack-serialisable; msgpack arrays come back as tuples) and ``ts`` the wall-clock
    time, in seconds, at which its commit point was applied — keep event time in the
    value if a reader needs it. Values become records only when their commit point is
    complete, each commit point exactly once (see `_LogSinkWriter`): a marker object
    ``commit`` per log, written before the append, lets a replayed commit point
    append only what is missing. Credentials for ``s3://`` come from the workers'
    environment, as for the job's own storage.

    ``prepare`` (once per job, before any instance opens) deletes the log objects a
    previous run left at ``url`` and writes ``layout``: a rerun starts from an empty
    log, as ``File`` truncates its file. It refuses to touch a URL holding objects that
    are not part of a log, so a typo cannot wipe unrelated data.
    """

    def __init__(self, url: str):
        self.url = _normalise_log_url(url, "bn.sinks.Log")

    def prepare(self, parallelism: int) -> None:
        store = open_store(self.url)
        try:
            keys = store.list("")
            foreign = [key for key in keys if not _is_log_key(key)]
            if foreign:
                raise ValueError(
                    f"{self!r}: {store.url} holds objects that are not part of a log "
                    f"(e.g. {foreign[0]!r}); give the sink a location of its own")
            for key in keys:
                store.delete(key)
            store.put(_LAYOUT_KEY, json.dumps({"format": _LAYOUT_FORMAT,
                                              "parallelism": parallelism}).encode())
        finally:
            store.close()

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _LogSinkWriter(self.url, _sub_log_prefix(index, parallelism),
                              f"sink {self!r} (instance {index})")

    def __repr__(self) -> str:
        return f"Log({self.url!r})"
