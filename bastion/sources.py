"""Sources: where records enter a topology, replayable from an offset.

Every source instance reads its own share of the input and knows how far it got — its
*offset*. Exactly-once recovery depends on that: a checkpoint stores each source
instance's offset, and recovery rewinds the source to it and reads the same records
again, in the same order. A source that cannot seek back cannot be made exactly-once.

A source is a descriptor (what to read) that opens one `SourceReader` per instance
(where this instance is). ``read(max_records, now_s)`` returns a list of values — empty
when nothing is due yet (a rate-limited generator) — or ``None`` when the instance has
read all of its share.

``Log(url)`` reads a segmented log in an object store (`bastion.storage.log`), such
as one ``bn.sinks.Log(url)`` wrote. Its offsets are the log's record seqs, so a
checkpoint rewinds it exactly.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable, Iterator, Sequence

from bastion.sinks import _normalise_log_url, _read_layout, _sub_log_prefix
from bastion.storage import CorruptRecordError, LogReader, ObjectStore, StorageError, open_store
from bastion.storage.log import LogRecord


class SourceReader:
    """One instance's cursor over its share of a source."""

    offset: int

    def read(self, max_records: int, now_s: float) -> list | None:
        raise NotImplementedError

    def seek(self, offset: int) -> None:
        self.offset = offset

    def state(self) -> Any:
        """What a checkpoint stores to resume this reader (by default, its offset)."""
        return self.offset

    def restore(self, state: Any) -> None:
        self.seek(state)

    def lag(self, now_s: float) -> int:
        """Records already due but not read yet (a paced source that fell behind)."""
        return 0


class Source:
    """A replayable input; `open` gives instance ``index`` of ``parallelism`` its reader."""

    bounded: bool = True

    def open(self, index: int, parallelism: int) -> SourceReader:
        raise NotImplementedError


class _CollectionReader(SourceReader):
    def __init__(self, items: list):
        self.items = items
        self.offset = 0

    def read(self, max_records: int, now_s: float) -> list | None:
        if self.offset >= len(self.items):
            return None
        chunk = self.items[self.offset : self.offset + max_records]
        self.offset += len(chunk)
        return chunk


class Collection(Source):
    """A finite in-memory sequence. Instance ``i`` of ``p`` reads items ``i, i+p, i+2p, …``."""

    def __init__(self, items: Sequence[Any]):
        self.items = list(items)

    def open(self, index: int, parallelism: int) -> SourceReader:
        return _CollectionReader(self.items[index::parallelism])

    def __repr__(self) -> str:
        return f"Collection({len(self.items)} items)"


class _GeneratorReader(SourceReader):
    def __init__(self, fn: Callable[[int], Any], count: int | None, rate: float | None,
                 index: int, parallelism: int):
        self.fn = fn
        self.index = index
        self.parallelism = parallelism
        # Instance i generates fn(i), fn(i+p), …: its share of [0, count).
        self.share = None if count is None else max(0, math.ceil((count - index) / parallelism))
        self.rate_per_instance = None if rate is None else rate / parallelism
        self.offset = 0
        self.started_s: float | None = None
        self.started_offset = 0

    # Pacing follows the original schedule: after a rewind the records between the
    # restored offset and the schedule are a backlog, read as fast as possible, as
    # from a message queue that kept filling while the job was down.
    def state(self) -> Any:
        return (self.offset, self.started_s, self.started_offset)

    def restore(self, state: Any) -> None:
        self.offset, self.started_s, self.started_offset = state

    def lag(self, now_s: float) -> int:
        if self.rate_per_instance is None or self.started_s is None:
            return 0
        due = self.started_offset + int((now_s - self.started_s) * self.rate_per_instance)
        if self.share is not None:
            due = min(due, self.share)
        return max(0, due - self.offset)

    def read(self, max_records: int, now_s: float) -> list | None:
        if self.share is not None and self.offset >= self.share:
            return None
        n = max_records
        if self.share is not None:
            n = min(n, self.share - self.offset)
        if self.rate_per_instance is not None:
            if self.started_s is None:
                self.started_s, self.started_offset = now_s, self.offset
            due = int((now_s - self.started_s) * self.rate_per_instance) + 1
            n = min(n, self.started_offset + due - self.offset)
            if n <= 0:
                return []
        p, fn = self.parallelism, self.fn
        first = self.index + self.offset * p
        out = list(map(fn, range(first, first + n * p, p)))
        self.offset += n
        return out


class Generator(Source):
    """``fn(k)`` for ``k`` in ``range(count)`` (forever when ``count`` is None), at most
    ``rate`` records per second over all instances (as fast as possible when None).
    ``fn`` must be deterministic: replay after a failure calls it again."""

    def __init__(self, fn: Callable[[int], Any], count: int | None = None,
                 rate: float | None = None):
        if count is not None and count < 0:
            raise ValueError(f"Generator count must be >= 0 or None, got {count}")
        if rate is not None and rate <= 0:
            raise ValueError(f"Generator rate must be > 0 records/s or None, got {rate}")
        self.fn = fn
        self.count = count
        self.rate = rate
        self.bounded = count is not None

    def open(self, index: int, parallelism: int) -> SourceReader:
        return _GeneratorReader(self.fn, self.count, self.rate, index, parallelism)

    def __repr__(self) -> str:
        return f"Generator(count={self.count}, rate={self.rate})"


def _log_shares(logs: int, parallelism: int, index: int) -> list[tuple[int, int, int]]:
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


class _LogSourceReader(SourceReader):
    """One instance's cursor over its shares of a log; opens the store at first use.

    State: ``(next seq per share, end seq per share)``. The end seqs are fixed when
    the reader first opens and travel with every checkpoint, so a restored instance
    reads exactly the records the failed one would have read, however much the log
    grew meanwhile.
    """

    def __init__(self, source: "Log", index: int, parallelism: int):
        self.source = source
        self.index = index
        self.parallelism = parallelism
        self._store: ObjectStore | None = None
        self._shares: list[_LogShare] | None = None
        self._restored: Any = None  # state handed to restore() before opening
        self._turn = 0

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
        logs = _read_layout(store)
        if logs is None:
            if not (store.exists("index") or store.list("part-") or store.list("seg-")):
                raise StorageError(f"{src!r}: no log at {store.url} (no layout, index, "
                                   "segment or part object)")
            logs = 1
        shares = []
        for log, modulus, remainder in _log_shares(logs, self.parallelism, self.index):
            prefix = _sub_log_prefix(log, logs)
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
        n = len(shares)
        for step in range(n):
            share = shares[(self._turn + step) % n]
            while len(out) < max_records and (share.buffer or self._fill(share, now_s)):
                buffer = share.buffer
                for _ in range(min(max_records - len(out), len(buffer))):
                    _, ts, value = buffer.popleft()
                    out.append((ts, value) if with_ts else value)
            if len(out) >= max_records:
                break
        if self.source.follow:
            self._turn = (self._turn + 1) % n  # no sub-log starves the others
            return out
        return out if out or not all(s.done for s in shares) else None

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


class Log(Source):
    """The records of a segmented log (`bastion.storage.log`) in an object store.

    ``url`` is the log's home, a store URL: ``local://PATH`` or
    ``s3://BUCKET/PREFIX?endpoint=HOST:PORT`` — the same URL given to
    ``bn.sinks.Log``. The store opened at it holds either

    * the output of ``bn.sinks.Log(url)`` at any parallelism ``q`` (an object
      ``layout`` names ``q``; with ``q > 1`` sub-log ``<j>/`` holds instance ``j``'s
      output), or
    * one log at its root (``LogWriter(open_store(url), "")``).

    Instance ``i`` of parallelism ``p`` reads, when there are ``q >= p`` logs, whole
    logs ``i, i+p, …``, one after the other; when there are fewer, the instances
    sharing a log split it by seq: with one log, instance ``i`` reads the records
    whose ``seq % p == i``. Each log is read in seq order.

    Values are the records' values, as appended (msgpack arrays come back as tuples);
    with ``with_ts=True`` they are ``(ts, value)`` pairs, ``ts`` being the record's
    time in seconds (for logs the sink wrote: when its commit point was applied). Use
    the topology's ``timestamp=`` callable for event time.

    Bounded by default: each instance reads up to the end its logs had when it first
    read them (their durable end at open time); records appended later are not read.
    That end is part of the checkpointed offset, so a recovered instance reads the
    same records. With ``follow=True`` the source is unbounded: it reads on as records
    become durable, looking for new ones every ``poll_interval_s`` seconds once it has
    caught up (``bn.run`` then needs ``duration_s``).

    The store is opened inside each worker at the first read: the descriptor holds
    only the URL (credentials for ``s3://`` come from the workers' environment, as for
    the job's own storage). A corrupt record raises `CorruptRecordError` naming the
    URL and the log; a URL with no log raises `StorageError`.
    """

    def __init__(self, url: str, *, follow: bool = False, poll_interval_s: float = 0.2,
                 with_ts: bool = False):
        if poll_interval_s <= 0:
            raise ValueError(f"Log poll_interval_s must be > 0 seconds, got {poll_interval_s}")
        self.url = _normalise_log_url(url, "bn.sources.Log")
        self.follow = follow
        self.poll_interval_s = poll_interval_s
        self.with_ts = with_ts
        self.bounded = not follow

    def open(self, index: int, parallelism: int) -> SourceReader:
        return _LogSourceReader(self, index, parallelism)

    def __repr__(self) -> str:
        return f"Log({self.url!r}" + (", follow=True)" if self.follow else ")")
