"""Sources: where records enter a topology, replayable from an offset.

Every source instance reads its own share of the input and knows how far it got — its
*offset*. Exactly-once recovery depends on that: a checkpoint stores each source
instance's offset, and recovery rewinds the source to it and reads the same records
again, in the same order. A source that cannot seek back cannot be made exactly-once.

A source is a descriptor (what to read) that opens one `SourceReader` per instance
(where this instance is). ``read(max_records, now_s)`` returns a list of values — empty
when nothing is due yet (a rate-limited generator) — or ``None`` when the instance has
read all of its share.

**First arrival.** Every record carries ``born``, when it first entered the job, and
every latency figure counts from it. A replay must not make a record young again: a
record a restart re-reads from a checkpointed offset has waited through the outage,
and latency under failure is what a user of the job experiences. So a reader says,
after each ``read``, when the records it returned first arrived:
``arrivals(n, now_s)`` gives their wall-clock times — the same for a record however
often it is read — or ``None`` for "now", the read time. Which one depends on the
source:

- ``Generator(fn, count, rate)`` with a ``rate`` has a schedule: record ``k`` of an
  instance is due at ``started_s + (k - started_offset) / rate_per_instance``, and
  the schedule is part of the reader's checkpointed state, so a replay from a
  checkpoint finds the same due times. Its arrival is that due time (never later
  than the read time). A restart that keeps no source state (protocols ``none`` and
  ``acks``) starts a new schedule.
- ``Log(url)``: a record arrived when it was appended; its arrival is its ``ts`` in
  the log (``bn.sinks.Log`` stamps each record with the wall clock when its commit
  point was appended; a log written another way should carry wall-clock seconds
  there too).
- Unpaced sources — ``Collection`` and ``Generator`` without a rate — have no arrival
  schedule: all of their input is available from the start, and a record arrives
  when it is read (``None``).

Without a ``timestamp`` function the arrival is also a record's event time (the
ingest time, `bastion.runtime.operators.SourceOp`).

``Log(url)`` reads a segmented log in an object store (`bastion.storage.log`), such
as one ``bn.sinks.Log(url)`` wrote. Its offsets are the log's record seqs, so a
checkpoint rewinds it exactly.

The sources here are descriptions, part of the DSL: building one does no I/O and
imports nothing of storage. A reader that opens a store is a connector
(`bastion.connectors`), which ``open`` loads in the worker when the job runs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Generic, Sequence, TypeVar, overload

from bastion import _batches

from bastion.sinks import _normalise_log_url

# SourceReader is defined in bastion.io_interfaces, which the connectors import without
# importing this module back; the public name stays bastion.sources.SourceReader.
from bastion.io_interfaces import SourceReader  # noqa: F401 - re-exported

#: The type of the records a source produces (to a type checker only: ``Source[T]``
#: makes ``Topology.source`` return a ``Stream[T]``).
T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class Source(Generic[T_co]):
    """A replayable input of records of type ``T_co``; `open` gives instance ``index``
    of ``parallelism`` its reader."""

    bounded: bool = True

    def open(self, index: int, parallelism: int) -> SourceReader:
        raise NotImplementedError


class _CollectionReader(SourceReader):
    def __init__(self, items: list[Any]):
        self.items = items
        self.offset = 0

    def read(self, max_records: int, now_s: float) -> list[Any] | None:
        if self.offset >= len(self.items):
            return None
        chunk = self.items[self.offset : self.offset + max_records]
        self.offset += len(chunk)
        return chunk


class Collection(Source[T_co]):
    """A finite in-memory sequence. Instance ``i`` of ``p`` reads items ``i, i+p, i+2p, …``."""

    def __init__(self, items: Sequence[T_co]):
        self.items: list[T_co] = list(items)

    def open(self, index: int, parallelism: int) -> SourceReader:
        return _CollectionReader(self.items[index::parallelism])

    def __repr__(self) -> str:
        return f"Collection({len(self.items)} items)"


class _GeneratorReader(SourceReader):
    def __init__(self, fn: Callable[[int], Any] | None, count: int | None,
                 rate: float | None, index: int, parallelism: int,
                 batch_fn: Callable[[Any], Any] | None = None, format: str = "numpy"):
        self.fn = fn
        self.batch_fn = batch_fn
        self.format = format
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

    def read_backlog(self, max_records: int) -> Sequence[Any] | None:
        # Unpaced, and the schedule not started: pacing starts after the skipped records.
        return self._read(max_records, None)

    def read(self, max_records: int, now_s: float) -> Sequence[Any] | None:
        return self._read(max_records, now_s)

    def arrivals(self, n: int, now_s: float) -> list[float] | None:
        # Record k was due at started_s + (k - started_offset) / rate: one formula
        # on checkpointed numbers, so a replay gets the very same floats.
        started_s, rate = self.started_s, self.rate_per_instance
        if rate is None or started_s is None:
            return None
        start = self.offset - n - self.started_offset
        due = [started_s + k / rate for k in range(start, start + n)]
        if due and due[-1] > now_s:  # only by rounding: a record is read once due
            due = [min(t, now_s) for t in due]
        return due

    def _read(self, max_records: int, now_s: float | None) -> Sequence[Any] | None:
        if self.share is not None and self.offset >= self.share:
            return None
        n = max_records
        if self.share is not None:
            n = min(n, self.share - self.offset)
        if self.rate_per_instance is not None and now_s is not None:
            if self.started_s is None:
                self.started_s, self.started_offset = now_s, self.offset
            due = int((now_s - self.started_s) * self.rate_per_instance) + 1
            n = min(n, self.started_offset + due - self.offset)
            if n <= 0:
                return []
        p, fn = self.parallelism, self.fn
        first = self.index + self.offset * p
        out: Sequence[Any]
        if self.batch_fn is not None:
            out = self._batch(first, n)
        else:
            assert fn is not None  # Generator takes fn or batch_fn
            out = list(map(fn, range(first, first + n * p, p)))
        self.offset += n
        return out

    def _batch(self, first: int, n: int) -> Sequence[Any]:
        """``batch_fn`` of the column of record numbers first, first + p, ... (n)."""
        import numpy

        assert self.batch_fn is not None
        ks = numpy.arange(first, first + n * self.parallelism, self.parallelism,
                          dtype=numpy.int64)
        column = ks if self.format == "numpy" else _batches.to_column(ks, self.format)
        return _batches.from_column(self.batch_fn(column), n, "the Generator's batch_fn")


class Generator(Source[T_co]):
    """``fn(k)`` for ``k`` in ``range(count)`` (forever when ``count`` is None), at most
    ``rate`` records per second over all instances (as fast as possible when None).
    ``fn`` must be deterministic: replay after a failure calls it again."""

    @overload
    def __init__(self: Generator[T], fn: Callable[[int], T], count: int | None = None,
                 rate: float | None = None) -> None: ...

    @overload
    def __init__(self: Generator[Any], fn: None = None, count: int | None = None,
                 rate: float | None = None, *, batch_fn: Callable[[Any], Any],
                 format: _batches.BatchFormat = "numpy") -> None: ...

    def __init__(self, fn: Callable[[int], Any] | None = None, count: int | None = None,
                 rate: float | None = None, *, batch_fn: Callable[[Any], Any] | None = None,
                 format: _batches.BatchFormat = "numpy"):
        """``batch_fn``, instead of ``fn``, makes a column of records at a time:
        called with the column of record numbers ``k`` (a numpy int64 array, or a
        pyarrow one with ``format="arrow"``), it returns a column of as many values
        (`bastion._batches`), one for each ``k`` — a batch function of ``k`` alone,
        deterministic like ``fn``. A column of another length fails the job with a
        `UDFError` naming the source."""
        if count is not None and count < 0:
            raise ValueError(f"Generator count must be >= 0 or None, got {count}")
        if rate is not None and rate <= 0:
            raise ValueError(f"Generator rate must be > 0 records/s or None, got {rate}")
        if (fn is None) == (batch_fn is None):
            raise ValueError("Generator takes fn (a record at a time) or batch_fn (a "
                             "column at a time): one of them")
        if batch_fn is not None:
            _batches.check_format(format)
        self.fn = fn
        self.batch_fn = batch_fn
        self.format = format
        self.count = count
        self.rate = rate
        self.bounded = count is not None

    def open(self, index: int, parallelism: int) -> SourceReader:
        return _GeneratorReader(self.fn, self.count, self.rate, index, parallelism,
                                self.batch_fn, self.format)

    def __repr__(self) -> str:
        return f"Generator(count={self.count}, rate={self.rate})"


class Log(Source[Any]):
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
        from bastion.connectors.logs import LogSourceReader  # I/O: at run time only

        return LogSourceReader(self, index, parallelism)

    def __repr__(self) -> str:
        return f"Log({self.url!r}" + (", follow=True)" if self.follow else ")")


__all__ = ["Collection", "Generator", "Log", "Source", "SourceReader"]
