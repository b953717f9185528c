"""A segmented, append-only record log on an object store.

What a record is
    One appended entry: a sequence number ``seq`` (assigned by the writer: 0, 1, 2, ...
    with no gaps), an event time ``ts`` (float seconds) and a ``value`` (anything
    msgpack carries). Readers get records as plain tuples ``(seq, ts, value)``
    (:data:`LogRecord`); msgpack arrays decode as tuples.

How a record is stored
    ``u32 length | u32 CRC32 | payload``, both integers little-endian, where payload is
    the msgpack encoding of the array ``[seq, ts, value]``, length is its size in bytes
    and CRC32 (zlib's) covers the payload. A reader recomputes the CRC before it
    decodes: a record whose CRC does not match, whose length is impossible (shorter
    than any ``[seq, ts, value]`` array) or whose ``seq`` is not the one expected is
    *corrupt* and raises :class:`CorruptRecordError` naming the object and the byte
    offset. Corrupt bytes are never returned as data.

Segments, parts and the index
    An object store cannot append to an object, so a log is a set of objects under
    one prefix (``jobs/<job>/logs/<operator>/<instance>/``):

    * ``seg-<first seq, 20 digits>`` — a *sealed segment*: a run of consecutive
      records, written once, whole, when it reaches ``max_segment_bytes`` (checked
      after each append call, so a segment may exceed the limit by one batch) or
      ``max_segment_age_s`` (checked on append and flush). A segment filled by an
      append is written by a background thread while appends continue; at most one
      is in flight, and ``flush()``/``close()`` wait for it.
    * ``index`` — names every sealed segment with its first/last seq, min/max event
      time, size and a *block table*: the byte offset, first seq and CRC32 of each
      ~``block_bytes`` run of whole records. It is rewritten (atomically, itself
      framed as one CRC'd record) right after each segment, so a segment exists for
      readers only once the index names it. The block table lets readers fetch a
      segment in ranged chunks from either end and verify a whole chunk with one CRC
      per block instead of one per record, which is what makes reads fast.
    * ``part-<first seq, 20 digits>`` — the *open segment*, durable in pieces. The
      writer keeps the open segment in memory; ``flush()`` stores the records added
      since the last flush as one new immutable part. Each byte is thus written twice
      at most (once in a part, once in the sealed segment): cost linear in the data,
      not quadratic as re-putting the open segment on every flush would be. After a
      seal the segment's parts are deleted; readers ignore leftover parts whose
      records a sealed segment already holds.

What "durable" means
    A record is durable once the object holding it — a part, or a sealed segment and
    then the index naming it — has been stored (``put`` returned).
    :attr:`LogWriter.durable_seq` is the highest durable seq (``-1`` for none); the
    optional ``on_durable`` callback gets each new value, in the writer's thread.
    ``flush()`` makes every appended record durable. Records appended but not yet
    durable are lost by a crash; records up to ``durable_seq`` are not, and readers
    see only durable records.

Torn tails versus corruption
    Store writes are atomic, but a file can still be cut short (a copy interrupted, a
    disk filled, a power cut without fsync). An *incomplete* last record of the log's
    last object — a header or payload cut off at the end — is a *torn tail*: readers
    stop before it and report it (:attr:`LogReader.torn_tail`); :func:`recover_log`
    (run by every :class:`LogWriter` when it opens) truncates it away, reports it in a
    :class:`TornTailReport`, and the writer resumes at the next seq. Anywhere else, an
    incomplete record, and anywhere at all, a complete record with a bad CRC, is
    corruption and raises; so is a missing part (a gap in the seqs). A sealed
    segment's size is in the index, so a cut one is told apart exactly; for the last
    part, a length field damaged to point past its end is indistinguishable from a
    torn tail and is treated as one.

Reading
    :class:`LogReader` reads forward from a seq or an event time (skipping sealed
    segments whose max event time is too old), or backward — newest record first, in
    chunks of ``backward_chunk_bytes`` — which is how continuous eventual checkpoints
    find the newest window footprints. A reader may follow a live log: each call
    reads what is durable at that moment; call again with the next seq for more.

One writer per log: the runtime fences a replaced instance before starting a new one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import gc
import logging
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any, AsyncIterator, Callable, Iterable, Iterator

import msgpack

from .errors import CorruptRecordError, KeyNotFoundError, StorageError
from .store import ObjectStore

__all__ = [
    "LogRecord", "LogWriter", "LogReader", "SegmentInfo", "TornTailReport",
    "RecoveryInfo", "recover_log", "HEADER_BYTES", "Damage", "SalvagedObject",
    "salvage_object", "salvage_log", "log_object_keys", "gc_paused",
]

_log = logging.getLogger(__name__)

LogRecord = tuple[int, float, Any]
"""A record as readers return it: ``(seq, ts, value)``."""

_HEADER = struct.Struct("<II")
HEADER_BYTES = _HEADER.size
# The smallest msgpack [seq, ts, value]: fixarray marker + three 1-byte items.
_MIN_PAYLOAD_BYTES = 4
_INDEX_FORMAT = 1
_SEQ_DIGITS = 20
_KIB = 1024
_MIB = 1024 * _KIB


def frame_records_py(first_seq: int, records: list, pack: Callable[[Any], bytes]) -> bytes:
    """``(ts, value)`` records framed as the log stores them, with seqs from
    ``first_seq``: per record a header (payload length, CRC-32 of the payload) and the
    msgpack of ``[seq, ts, value]`` by ``pack`` (the writer's packer). The reference
    for the C loop (`_logframe.frame_records`), which gives the same bytes."""
    get_ts, get_value = itemgetter(0), itemgetter(1)
    # (seq, ts, value) triples built by zip and packed by map, lengths, CRCs and
    # headers in C-level map() loops: no interpreter loop per record
    payloads = list(map(pack, zip(range(first_seq, first_seq + len(records)),
                                  map(get_ts, records), map(get_value, records))))
    headers = map(_HEADER.pack, map(len, payloads), map(zlib.crc32, payloads))
    return b"".join(chain.from_iterable(zip(headers, payloads)))


try:  # the same framing in C: an optional build (setup.py), same bytes
    from ._logframe import frame_records as _frame_records_c
except ImportError:  # pragma: no cover - a machine without a C compiler
    _frame_records_c = None


def frame_records(first_seq: int, records: list, pack: Callable[[Any], bytes]) -> bytes:
    """`frame_records_py`, by the C loop where it was built and takes the records."""
    if _frame_records_c is not None:
        framed = _frame_records_c(first_seq, records, pack)
        if framed is not None:
            return framed
    return frame_records_py(first_seq, records, pack)


def _unpack_opts() -> dict[str, Any]:
    return {"use_list": False, "raw": False, "strict_map_key": False}


def _frame(payload: bytes) -> bytes:
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _norm_prefix(prefix: str) -> str:
    if prefix and not prefix.endswith("/"):
        return prefix + "/"
    return prefix


def _seq_name(kind: str, seq: int) -> str:
    return f"{kind}-{seq:0{_SEQ_DIGITS}d}"


def _seq_of(name: str) -> int | None:
    kind, sep, digits = name.partition("-")
    if sep and kind in ("seg", "part") and len(digits) == _SEQ_DIGITS and digits.isdigit():
        return int(digits)
    return None


@dataclass(frozen=True)
class SegmentInfo:
    """What the index knows about one sealed segment.

    ``blocks`` lists ``(byte_offset, first_seq, crc32)`` for each run of whole
    records; the runs tile the segment in order, the first at offset 0.
    """

    key: str
    first_seq: int
    last_seq: int
    min_ts: float
    max_ts: float
    size_bytes: int
    blocks: tuple[tuple[int, int, int], ...]

    @property
    def records(self) -> int:
        return self.last_seq - self.first_seq + 1

    def _to_wire(self, prefix: str) -> dict[str, Any]:
        return {"name": self.key[len(prefix):], "first_seq": self.first_seq,
                "last_seq": self.last_seq, "min_ts": self.min_ts, "max_ts": self.max_ts,
                "bytes": self.size_bytes, "blocks": [list(b) for b in self.blocks]}

    @classmethod
    def _from_wire(cls, prefix: str, d: dict[str, Any]) -> SegmentInfo:
        return cls(prefix + d["name"], d["first_seq"], d["last_seq"], d["min_ts"],
                   d["max_ts"], d["bytes"], tuple(tuple(b) for b in d["blocks"]))


@dataclass(frozen=True)
class TornTailReport:
    """An incomplete last record found at the end of the log.

    ``offset`` is where the incomplete record starts in ``key`` (and where the object
    is cut back to); ``dropped_bytes`` how many bytes follow it; ``last_good_seq`` the
    seq of the last complete record in the log (``-1`` if none survives).
    """

    key: str
    offset: int
    dropped_bytes: int
    last_good_seq: int


@dataclass(frozen=True)
class RecoveryInfo:
    """The state of a log after :func:`recover_log`: append next at ``next_seq``."""

    next_seq: int
    torn_tail: TornTailReport | None


# --------------------------------------------------------------------------- decoding


def _corrupt(key: str, offset: int, why: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"corrupt record in {key!r} at byte offset {offset}: {why}", key=key, offset=offset)


@dataclass
class _Scan:
    records: list[LogRecord]
    offsets: list[int]   # start offset of each record, relative to the scanned bytes
    end: int             # end of the last complete record
    torn_at: int | None  # start of an incomplete final record, if any


def _scan_verified(data: bytes | memoryview, key: str, base: int, expect_seq: int | None,
                   ) -> _Scan:
    """Decode records one by one, checking length, CRC and seq continuity.

    The slow, exact path: used where no block CRCs exist (parts), to pinpoint a bad
    record inside a block whose CRC failed, and during recovery.
    """
    mv = memoryview(data)
    n = len(mv)
    unpack_header = _HEADER.unpack_from
    crc32 = zlib.crc32
    unpackb = msgpack.unpackb
    records: list[LogRecord] = []
    offsets: list[int] = []
    off = 0
    while off < n:
        if n - off < HEADER_BYTES:
            return _Scan(records, offsets, off, off)
        length, crc = unpack_header(mv, off)
        if length < _MIN_PAYLOAD_BYTES:
            raise _corrupt(key, base + off, f"impossible length {length}")
        end = off + HEADER_BYTES + length
        if end > n:
            return _Scan(records, offsets, off, off)
        payload = mv[off + HEADER_BYTES:end]
        actual = crc32(payload)
        if actual != crc:
            raise _corrupt(key, base + off,
                           f"CRC32 mismatch (stored {crc:#010x}, computed {actual:#010x})")
        try:
            rec = unpackb(payload, **_unpack_opts())
        except Exception as e:
            raise _corrupt(key, base + off, f"undecodable payload ({e})") from None
        if type(rec) is not tuple or len(rec) != 3 or type(rec[0]) is not int:
            raise _corrupt(key, base + off, "payload is not a [seq, ts, value] record")
        if expect_seq is not None:
            if rec[0] != expect_seq:
                raise _corrupt(key, base + off, f"seq {rec[0]} where {expect_seq} was expected")
            expect_seq += 1
        records.append(rec)
        offsets.append(off)
        off = end
    return _Scan(records, offsets, off, None)


def _decode_trusted(data: bytes | memoryview, key: str, base: int) -> list[LogRecord]:
    """Decode records whose bytes were already verified by block CRCs.

    One streaming unpacker walks the whole buffer, skipping each 8-byte header: no
    per-record slicing or CRC call, which roughly doubles read throughput.
    """
    unpacker = msgpack.Unpacker(None, max_buffer_size=max(len(data), 1),
                                **_unpack_opts())
    unpacker.feed(data)
    skip = unpacker.read_bytes
    unpack = unpacker.unpack
    records: list[LogRecord] = []
    append = records.append
    try:
        while True:
            skip(HEADER_BYTES)
            append(unpack())
    except msgpack.OutOfData:
        pass
    except Exception as e:
        raise _corrupt(key, base + unpacker.tell(), f"undecodable payload ({e})") from None
    if unpacker.tell() != len(data):
        raise _corrupt(key, base + unpacker.tell(), "records do not tile the block")
    return records


# --------------------------------------------------------------------------- layout


@dataclass
class _View:
    """One consistent look at a log: sealed segments from the index, then parts."""

    segments: list[SegmentInfo]
    parts: list[tuple[int, str]]  # (first seq, key) of the open segment's parts
    stale: list[str]              # parts a sealed segment covers; unindexed segments
    orphans: int                  # unindexed segment objects past the index's end

    @property
    def sealed_end(self) -> int:
        return self.segments[-1].last_seq + 1 if self.segments else 0


class _ViewChanged(Exception):
    """Listed parts do not continue one another: the listing raced a seal (or, if it
    persists, records are missing)."""

    def __init__(self, expected: int, found: int) -> None:
        super().__init__(expected, found)
        self.expected = expected
        self.found = found


# A gap that survives this many fresh looks at the log is not a race but lost data.
_VIEW_ATTEMPTS = 5
# Readers decode and hand out records in batches of about this many bytes, however
# much one ranged read fetched: big batches of tuples cost more in garbage
# collection and CPU caches than they save (measured: 2.6 M records/s at 256 KiB
# against 1.5 M at 4 MiB).
_BATCH_BYTES = 256 * _KIB


def _read_index(store: ObjectStore, prefix: str) -> list[SegmentInfo]:
    key = prefix + "index"
    try:
        data = store.get(key)
    except KeyNotFoundError:
        return []
    if len(data) < HEADER_BYTES:
        raise _corrupt(key, 0, "truncated log index")
    length, crc = _HEADER.unpack_from(data, 0)
    payload = memoryview(data)[HEADER_BYTES:]
    if length != len(payload) or zlib.crc32(payload) != crc:
        raise _corrupt(key, 0, "log index fails its length or CRC check")
    doc = msgpack.unpackb(payload, **_unpack_opts())
    if doc.get("format") != _INDEX_FORMAT:
        raise StorageError(f"log index {key!r} has unknown format {doc.get('format')!r}")
    return [SegmentInfo._from_wire(prefix, d) for d in doc["segments"]]


def _write_index(store: ObjectStore, prefix: str, segments: list[SegmentInfo]) -> None:
    doc = {"format": _INDEX_FORMAT, "segments": [s._to_wire(prefix) for s in segments]}
    store.put(prefix + "index", _frame(msgpack.packb(doc, use_bin_type=True)))


def _snapshot(store: ObjectStore, prefix: str) -> _View:
    # The writer seals by: put segment, put index, delete parts. A reader that reads
    # the index just before a seal and lists just after it would see neither the new
    # segment nor its parts; such a gap shows as parts, or a segment object, past the
    # index's end that do not continue it, so look again. A segment object past the
    # end with no parts is an orphan from a crash before its index write (never
    # durable): after a few looks it is taken to be one and ignored.
    for _ in range(3):
        view = _classify(store.list(prefix), prefix, _read_index(store, prefix))
        if (not view.parts and not view.orphans) or \
                (view.parts and view.parts[0][0] == view.sealed_end):
            return view
    return view


def _classify(keys: list[str], prefix: str, segments: list[SegmentInfo]) -> _View:
    sealed = {s.key for s in segments}
    end = segments[-1].last_seq + 1 if segments else 0
    parts: list[tuple[int, str]] = []
    stale: list[str] = []
    orphans = 0
    for key in keys:
        name = key[len(prefix):]
        seq = _seq_of(name)
        if seq is None or key in sealed:
            continue
        if name.startswith("part-") and seq >= end:
            parts.append((seq, key))
            continue
        stale.append(key)
        orphans += name.startswith("seg-") and seq >= end
    parts.sort()
    return _View(segments, parts, stale, orphans)


def _blocks_for(offsets: list[int], seqs: Iterable[int], block_bytes: int,
                ) -> list[tuple[int, int]]:
    """Block starts (offset, first seq) over records at ``offsets``: a new block
    starts at the first record at or past ``block_bytes`` from the previous start."""
    blocks: list[tuple[int, int]] = []
    next_at = 0
    for off, seq in zip(offsets, seqs):
        if off >= next_at:
            blocks.append((off, seq))
            next_at = off + block_bytes
    return blocks


def _segment_info(key: str, data: bytes | bytearray, blocks: list[tuple[int, int]],
                  first_seq: int, last_seq: int, min_ts: float, max_ts: float,
                  ) -> SegmentInfo:
    mv = memoryview(data)
    ends = [b[0] for b in blocks[1:]] + [len(data)]
    table = tuple((off, seq, zlib.crc32(mv[off:end]))
                  for (off, seq), end in zip(blocks, ends))
    return SegmentInfo(key, first_seq, last_seq, min_ts, max_ts, len(data), table)


# --------------------------------------------------------------------------- recovery


@dataclass
class _OpenSegment:
    data: bytearray
    part_keys: list[str]
    blocks: list[tuple[int, int]]
    first_seq: int
    min_ts: float
    max_ts: float


def recover_log(store: ObjectStore, prefix: str, *, block_bytes: int = 64 * _KIB,
                ) -> RecoveryInfo:
    """Bring a log into a state a writer can append to after a crash.

    Removes leftovers of interrupted seals (parts a sealed segment already holds,
    segment objects the index does not name), verifies the open segment's parts,
    and truncates a torn last record away (reported in the result). Raises
    :class:`CorruptRecordError` for corruption anywhere it reads.
    """
    info, _, _ = _recover(store, _norm_prefix(prefix), block_bytes)
    return info


def _recover(store: ObjectStore, prefix: str, block_bytes: int,
             ) -> tuple[RecoveryInfo, list[SegmentInfo], _OpenSegment]:
    view = _snapshot(store, prefix)
    for key in view.stale:
        store.delete(key)
    segments = view.segments
    torn: TornTailReport | None = None
    data = bytearray()
    offsets: list[int] = []
    records: list[LogRecord] = []
    part_keys: list[str] = []
    expect = view.sealed_end
    for i, (first, key) in enumerate(view.parts):
        raw = store.get(key)
        if first != expect:
            raise _corrupt(key, 0, f"part starts at seq {first}, {expect} expected")
        scan = _scan_verified(raw, key, 0, first)
        last = i == len(view.parts) - 1
        if scan.torn_at is not None:
            if not last:
                raise _corrupt(key, scan.torn_at, "incomplete record before the end of the log")
            torn = TornTailReport(key, scan.torn_at, len(raw) - scan.torn_at,
                                  scan.records[-1][0] if scan.records else expect - 1)
            _log.warning("log %s: torn tail in %s at offset %d (%d bytes dropped)",
                         prefix, key, scan.torn_at, torn.dropped_bytes)
            if scan.end:
                store.put(key, raw[:scan.end])
            else:
                store.delete(key)
        if scan.records:
            offsets.extend(len(data) + off for off in scan.offsets)
            data += memoryview(raw)[:scan.end]
            records.extend(scan.records)
            part_keys.append(key)
            expect = scan.records[-1][0] + 1
    if not view.parts and segments:
        segments, torn = _recover_sealed_tail(store, prefix, segments, block_bytes)
        expect = segments[-1].last_seq + 1 if segments else 0
    tss = [r[1] for r in records]
    open_segment = _OpenSegment(
        data, part_keys, _blocks_for(offsets, (r[0] for r in records), block_bytes),
        records[0][0] if records else expect,
        min(tss) if tss else 0.0, max(tss) if tss else 0.0)
    return RecoveryInfo(expect, torn), segments, open_segment


def _recover_sealed_tail(store: ObjectStore, prefix: str, segments: list[SegmentInfo],
                         block_bytes: int) -> tuple[list[SegmentInfo], TornTailReport | None]:
    """The last object of the log is a sealed segment: if it is shorter than the
    index says, it was cut; keep its complete records and re-describe it."""
    last = segments[-1]
    if store.size(last.key) >= last.size_bytes:
        return segments, None
    raw = store.get(last.key)
    scan = _scan_verified(raw, last.key, 0, last.first_seq)
    if scan.torn_at is None:
        # Cut exactly at a record boundary: the missing records are simply gone.
        scan.torn_at = scan.end
    kept = segments[:-1]
    last_good = scan.records[-1][0] if scan.records else last.first_seq - 1
    torn = TornTailReport(last.key, scan.torn_at, len(raw) - scan.torn_at, last_good)
    _log.warning("log %s: torn tail in %s at offset %d", prefix, last.key, scan.torn_at)
    if scan.records:
        body = raw[:scan.end]
        tss = [r[1] for r in scan.records]
        blocks = _blocks_for(scan.offsets, (r[0] for r in scan.records), block_bytes)
        kept.append(_segment_info(last.key, body, blocks, last.first_seq, last_good,
                                  min(tss), max(tss)))
        store.put(last.key, body)
        _write_index(store, prefix, kept)
    else:
        _write_index(store, prefix, kept)
        store.delete(last.key)
    return kept, torn


# --------------------------------------------------------------------------- writer


@dataclass
class _Sealing:
    """A full segment on its way to the store (in the background or inline)."""

    key: str
    data: bytearray
    blocks: list[tuple[int, int]]
    first_seq: int
    last_seq: int
    min_ts: float
    max_ts: float
    part_keys: list[str]
    segments: list[SegmentInfo]  # the sealed segments before this one
    thread: _Upload | None = None
    error: BaseException | None = None
    info: SegmentInfo | None = None  # set once the segment and the index are stored


class _Upload:
    """One store call handed to a writer's upload thread: alive until it returned."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()

    def is_alive(self) -> bool:
        return not self.done.is_set()

    def join(self) -> None:
        self.done.wait()


class _UploadThread:
    """The one thread that runs a writer's uploads, in the order they were started.

    A thread per upload cost the caller a thread's start — waiting until it runs,
    behind the GIL on a busy worker — at every flush (ten a second under ``cec``). This
    one waits for work instead, and ends after ``idle_s`` without any, so a writer
    never closed (its task killed) leaves no thread behind for long."""

    def __init__(self, name: str, idle_s: float = 2.0) -> None:
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._jobs: list[tuple[Callable[..., None], tuple[Any, ...], _Upload]] = []
        self._wake = threading.Condition(self._lock)
        self._running = False

    def start(self, fn: Callable[..., None], *args: Any) -> _Upload:
        upload = _Upload()
        with self._lock:
            self._jobs.append((fn, args, upload))
            if self._running:
                self._wake.notify()
            else:
                self._running = True
                threading.Thread(target=self._serve, name=self._name, daemon=True).start()
        return upload

    def _serve(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._wake.wait(self._idle_s)
                    if not self._jobs:
                        self._running = False   # under the lock: a new start sees it
                        return
                fn, args, upload = self._jobs.pop(0)
            try:
                fn(*args)   # each catches its own errors for the writer to raise
            finally:
                upload.done.set()
                # This frame waits for the next job up to ``idle_s``: holding this
                # one's call, it would keep its writer alive, and the task that owns
                # it after a restart dropped the task.
                del fn, args, upload


@dataclass
class _PartUpload:
    """The records appended since the last flush, on their way to the store as one
    part, in the writer's upload thread (`LogWriter.flush_in_background`)."""

    key: str
    data: bytes  # a copy: the open segment's buffer goes on growing meanwhile
    end_len: int  # the length of the open segment's buffer the part covers
    last_seq: int
    thread: _Upload | None = None
    error: BaseException | None = None


class LogWriter:
    """Appends records to one log; see the module docstring for the design.

    A segment that fills up during an append is sealed by a background thread while
    appends continue into the next one (the store write overlaps the encoding of new
    records); :meth:`flush` and :meth:`close` wait for it, and at most one segment is
    in flight. Memory is thus bounded by two segments (``max_segment_bytes`` plus one
    append call's batch each). Not thread-safe: one caller at a time (the async twins
    run the same calls in a worker thread, one after another).

    A caller on an event loop (a task that logs as it processes) must not wait for
    the store: :meth:`flush_in_background` starts the flush in a thread and returns,
    and :attr:`durable_seq` moves on when a later call of the writer finds it done.
    One upload (a part or a sealed segment) is in flight per log, in order. Such a
    writer is made with ``blocking=False``: an append that fills a segment while an
    upload is in flight does not wait for it, and the segment is sealed by a later
    call once it landed — the caller bounds memory by :attr:`undurable_bytes`.
    """

    def __init__(self, store: ObjectStore, prefix: str, *,
                 max_segment_bytes: int = 8 * _MIB, max_segment_age_s: float = 60.0,
                 block_bytes: int = 64 * _KIB,
                 on_durable: Callable[[int], None] | None = None,
                 blocking: bool = True) -> None:
        if max_segment_bytes <= 0 or block_bytes <= 0 or max_segment_age_s <= 0:
            raise ValueError("max_segment_bytes, block_bytes and max_segment_age_s "
                             "must be positive")
        self._store = store
        self._prefix = _norm_prefix(prefix)
        self._max_segment_bytes = max_segment_bytes
        self._max_segment_age_s = max_segment_age_s
        self._block_bytes = block_bytes
        self._on_durable = on_durable
        self._packer = msgpack.Packer(use_bin_type=True)
        self._closed = False
        self._sealing: _Sealing | None = None
        self._uploads = _UploadThread(f"bastion-log-upload {self._prefix}")
        self._part: _PartUpload | None = None  # `flush_in_background`'s, in flight
        self._blocking = blocking
        # Records are encoded in slices; a block can start only between slices, which
        # keeps the per-record work free of bookkeeping. Slices are sized to about a
        # quarter block (from the last slice's record size), so blocks overshoot
        # block_bytes by at most ~25%.
        self._slice_records = 64
        self.recovery, self._segments, opened = _recover(store, self._prefix, block_bytes)
        self._buf = opened.data
        self._durable_len = len(opened.data)
        self._part_keys = opened.part_keys
        self._blocks = opened.blocks
        self._next_block_at = (opened.blocks[-1][0] + block_bytes) if opened.blocks else 0
        self._seg_first_seq = opened.first_seq
        self._min_ts, self._max_ts = opened.min_ts, opened.max_ts
        self._opened_at = time.monotonic()
        self._next_seq = self.recovery.next_seq
        self._durable_seq = self._next_seq - 1

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def next_seq(self) -> int:
        """The seq the next appended record will get."""
        return self._next_seq

    @property
    def durable_seq(self) -> int:
        """Every record with ``seq <= durable_seq`` is stored; -1 if none is.

        Advanced by the writer's own calls; :meth:`flush` brings it up to date.
        """
        return self._durable_seq

    def append(self, ts: float, value: Any) -> int:
        """Append one record; returns its seq. Prefer :meth:`append_many`."""
        return self.append_many(((ts, value),))

    def append_many(self, records: Iterable[tuple[float, Any]]) -> int:
        """Append ``(ts, value)`` pairs as consecutive records; returns the last seq.

        All-or-nothing: if an event time is not a number or a value cannot be
        encoded, raises (``TypeError``/``ValueError``) and appends none of them. A
        store error while sealing (reported here or by the next call) leaves the
        records appended but not durable; a later flush retries.
        """
        if self._closed:
            raise ValueError(f"log writer for {self._prefix!r} is closed")
        items = records if isinstance(records, list) else list(records)
        if not items:
            return self._next_seq - 1
        get_ts = itemgetter(0)
        lo, hi = min(map(get_ts, items)), max(map(get_ts, items))
        if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
            raise TypeError(f"event times must be numbers, got {type(lo).__name__}")
        buf = self._buf
        start_len, start_blocks = len(buf), len(self._blocks)
        seq = self._next_seq
        pack = self._packer.pack
        try:
            at = 0
            while at < len(items):
                if len(buf) >= self._next_block_at:
                    self._blocks.append((len(buf), seq))
                    self._next_block_at = len(buf) + self._block_bytes
                chunk = items[at:at + self._slice_records]
                at += len(chunk)
                before = len(buf)
                buf += frame_records(seq, chunk, pack)
                seq += len(chunk)
                record_bytes = (len(buf) - before) // len(chunk) or 1
                self._slice_records = max(1, min(512, self._block_bytes // (4 * record_bytes)))
        except Exception:
            del buf[start_len:]
            del self._blocks[start_blocks:]
            self._next_block_at = (self._blocks[-1][0] + self._block_bytes
                                   if self._blocks else 0)
            self._packer.reset()
            raise
        if start_len == 0:
            self._seg_first_seq, self._min_ts, self._max_ts = self._next_seq, lo, hi
            self._opened_at = time.monotonic()
        else:
            self._min_ts, self._max_ts = min(self._min_ts, lo), max(self._max_ts, hi)
        self._next_seq = seq
        if ((len(buf) >= self._max_segment_bytes or self._too_old())
                and (self._blocking or not self._must_wait())):
            self._seal(background=True)
        return seq - 1

    def _too_old(self) -> bool:
        return bool(self._buf) and (
            time.monotonic() - self._opened_at >= self._max_segment_age_s)

    def flush(self) -> int:
        """Make every appended record durable; returns :attr:`durable_seq`.

        Waits for a segment being sealed in the background, then stores the records
        appended since the last flush as one part (or seals the open segment if it
        is due). On a store error nothing more is marked durable; flush again later.
        """
        self._settle()
        if self._too_old() or len(self._buf) >= self._max_segment_bytes:
            self._seal(background=False)
        elif self._durable_len < len(self._buf):
            key = self._prefix + _seq_name("part", self._durable_seq + 1)
            self._store.put(key, memoryview(self._buf)[self._durable_len:])
            self._part_keys.append(key)
            self._durable_len = len(self._buf)
            self._set_durable(self._next_seq - 1)
        return self._durable_seq

    @property
    def undurable_bytes(self) -> int:
        """Bytes appended and not yet durable, counting an upload in flight."""
        sealing = self._sealing
        return (len(self._buf) - self._durable_len
                + (len(sealing.data) if sealing is not None and sealing.info is None else 0))

    def flush_in_background(self) -> bool:
        """Start making every appended record durable, and return at once: the store
        calls run in a thread. False, with nothing started, while an earlier upload
        is still in flight (:meth:`wait_uploaded` waits for it). A failed upload is
        raised by a later call (of this method or another), and its records stay
        appended and not durable: the next flush stores them again."""
        if self._upload_in_flight():
            return False
        self._settle_part()
        sealing = self._sealing
        if sealing is not None:
            if sealing.thread is None and sealing.info is None:
                # failed before (and raised): stored again, in the background
                sealing.thread = self._uploads.start(self._seal_in_background, sealing)
                return True
            self._settle()  # landed: takes its result, raising a failure once
        if self._too_old() or len(self._buf) >= self._max_segment_bytes:
            self._seal(background=True)
        elif self._durable_len < len(self._buf):
            part = _PartUpload(self._prefix + _seq_name("part", self._durable_seq + 1),
                               bytes(memoryview(self._buf)[self._durable_len:]),
                               len(self._buf), self._next_seq - 1)
            self._part = part
            part.thread = self._uploads.start(self._upload_part, part)
        return True

    def wait_uploaded(self) -> None:
        """Block until no upload is in flight (safe from another thread: it only
        waits; the writer's next call takes the result)."""
        for job in (self._part, self._sealing):
            if job is not None and job.thread is not None:
                job.thread.join()

    def _must_wait(self) -> bool:
        """Would sealing now wait for the store: an upload in flight, or a failed
        seal to store again?"""
        sealing = self._sealing
        return self._upload_in_flight() or (
            sealing is not None and sealing.info is None and sealing.thread is None)

    def _upload_in_flight(self) -> bool:
        sealing = self._sealing
        return self._part_in_flight() or (
            sealing is not None and sealing.thread is not None and sealing.thread.is_alive())

    def _part_in_flight(self) -> bool:
        part = self._part
        return part is not None and part.thread is not None and part.thread.is_alive()

    def _upload_part(self, part: _PartUpload) -> None:
        try:
            self._store.put(part.key, part.data)
        except BaseException as e:  # handed to the writer's thread by _settle_part
            part.error = e

    def _settle_part(self) -> None:
        """Take the result of the part upload in flight (waiting for it): its records
        are durable, or its error is raised and they stay appended."""
        part = self._part
        if part is None:
            return
        if part.thread is not None:
            part.thread.join()
        self._part = None
        if part.error is not None:
            raise part.error
        self._part_keys.append(part.key)
        self._durable_len = part.end_len
        self._set_durable(part.last_seq)

    def _seal(self, *, background: bool) -> None:
        self._settle()  # one segment in flight at a time, stored in order
        if not self._buf:
            return
        job = _Sealing(self._prefix + _seq_name("seg", self._seg_first_seq), self._buf,
                       self._blocks, self._seg_first_seq, self._next_seq - 1,
                       self._min_ts, self._max_ts, self._part_keys, list(self._segments))
        self._buf = bytearray()
        self._durable_len = 0
        self._blocks = []
        self._next_block_at = 0
        self._part_keys = []
        self._seg_first_seq = self._next_seq
        self._sealing = job
        if background:
            job.thread = self._uploads.start(self._seal_in_background, job)
        else:
            self._settle()

    def _seal_in_background(self, job: _Sealing) -> None:
        try:
            self._store_segment(job)
        except BaseException as e:  # handed to the writer's thread by _settle
            job.error = e

    def _store_segment(self, job: _Sealing) -> None:
        info = _segment_info(job.key, job.data, job.blocks, job.first_seq, job.last_seq,
                             job.min_ts, job.max_ts)
        self._store.put(job.key, job.data)
        _write_index(self._store, self._prefix, job.segments + [info])
        job.info = info
        for part in job.part_keys:
            try:
                self._store.delete(part)
            except StorageError as e:
                # Harmless: readers skip parts a sealed segment covers, and the next
                # writer to open this log deletes them.
                _log.warning("log %s: could not delete sealed part %s: %s",
                             self._prefix, part, e)

    def _settle(self) -> None:
        """Finish the segment in flight: wait for the background seal, or retry one
        that failed earlier; raise if it fails (it stays pending)."""
        self._settle_part()  # a part precedes any seal: a seal waits for it
        job = self._sealing
        if job is None:
            return
        if job.thread is not None:
            job.thread.join()
            job.thread = None
            if job.error is not None:
                error, job.error = job.error, None
                raise error
        if job.info is None:
            self._store_segment(job)
        assert job.info is not None
        self._sealing = None
        self._segments.append(job.info)
        self._set_durable(job.last_seq)

    def _set_durable(self, seq: int) -> None:
        if seq > self._durable_seq:
            self._durable_seq = seq
            if self._on_durable is not None:
                self._on_durable(seq)

    def close(self) -> None:
        """Seal the open segment (making everything durable) and stop accepting appends."""
        if not self._closed:
            self._seal(background=False)
            self._closed = True

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def aappend_many(self, records: Iterable[tuple[float, Any]]) -> int:
        return await asyncio.to_thread(self.append_many, records)

    async def aflush(self) -> int:
        return await asyncio.to_thread(self.flush)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


# --------------------------------------------------------------------------- reader


class LogReader:
    """Reads one log; each call sees the records durable when it starts (or later).

    Sealed segments are fetched by ranged reads of whole blocks: about
    ``backward_chunk_bytes`` per read going backward (small, since backward scans
    usually stop early) and ``forward_chunk_bytes`` going forward (by default the
    store's ``preferred_read_bytes``: 4 MiB on S3 to keep round trips few, 256 KiB
    locally to stay in CPU caches). Parts of the open segment are read one object at
    a time.
    After each read, :attr:`torn_tail` reports a torn last record if one was met
    (it is skipped, not returned, and not repaired: that is the writer's job).
    """

    def __init__(self, store: ObjectStore, prefix: str, *,
                 backward_chunk_bytes: int = 256 * _KIB,
                 forward_chunk_bytes: int | None = None) -> None:
        forward_chunk_bytes = forward_chunk_bytes or store.preferred_read_bytes
        if backward_chunk_bytes <= 0 or forward_chunk_bytes <= 0:
            raise ValueError("chunk sizes must be positive")
        self._store = store
        self._prefix = _norm_prefix(prefix)
        self._backward_chunk_bytes = backward_chunk_bytes
        self._forward_chunk_bytes = forward_chunk_bytes
        self.torn_tail: TornTailReport | None = None

    def segments(self) -> list[SegmentInfo]:
        """The sealed segments, oldest first, as the index describes them."""
        return _read_index(self._store, self._prefix)

    def next_seq(self) -> int:
        """One past the last durable record's seq (0 for an empty log)."""
        for batch in self.read_backward(chunk_bytes=1):
            return batch[0][0] + 1
        return 0

    # -- forward

    def read_batches(self, from_seq: int = 0, from_ts: float | None = None,
                     ) -> Iterator[list[LogRecord]]:
        """Durable records with ``seq >= from_seq`` (and ``ts >= from_ts`` if given),
        oldest first, in batches."""
        self.torn_tail = None
        gaps = 0
        while True:
            view = _snapshot(self._store, self._prefix)
            for seg in view.segments:
                if seg.last_seq < from_seq or (from_ts is not None and seg.max_ts < from_ts):
                    continue
                for batch in self._segment_forward(seg, from_seq, view):
                    if from_ts is not None:
                        batch = [r for r in batch if r[1] >= from_ts]
                    if batch:
                        yield batch
                from_seq = seg.last_seq + 1
            try:
                for batch in self._parts_forward(view, from_seq):
                    from_seq = batch[-1][0] + 1
                    if from_ts is not None:
                        batch = [r for r in batch if r[1] >= from_ts]
                    if batch:
                        yield batch
            except KeyNotFoundError:
                continue  # a part was sealed meanwhile: its records are in a segment now
            except _ViewChanged as e:
                gaps = self._look_again(gaps, e)
                continue
            return

    def records(self, from_seq: int = 0, from_ts: float | None = None,
                ) -> Iterator[LogRecord]:
        """Like :meth:`read_batches`, one record at a time."""
        for batch in self.read_batches(from_seq, from_ts):
            yield from batch

    def _look_again(self, gaps: int, e: _ViewChanged) -> int:
        if gaps + 1 >= _VIEW_ATTEMPTS:
            raise StorageError(
                f"log {self._prefix!r} is missing records {e.expected}..{e.found - 1}: "
                f"the part starting at seq {e.found} does not continue the log") from None
        return gaps + 1

    def _parts_forward(self, view: _View, from_seq: int) -> Iterator[list[LogRecord]]:
        expect = view.sealed_end
        for i, (first, _) in enumerate(view.parts):
            if first != expect:
                raise _ViewChanged(expect, first)
            if i + 1 < len(view.parts) and view.parts[i + 1][0] <= from_seq:
                expect = view.parts[i + 1][0]
                continue
            records = self._read_part(view, i)
            expect = records[-1][0] + 1 if records else first
            records = records[max(0, from_seq - first):]
            if records:
                yield records

    def _segment_forward(self, seg: SegmentInfo, from_seq: int, view: _View,
                         ) -> Iterator[list[LogRecord]]:
        blocks = seg.blocks
        i = max(0, bisect.bisect_right([b[1] for b in blocks], from_seq) - 1)
        while i < len(blocks):
            j = i + 1
            while j < len(blocks) and blocks[j][0] - blocks[i][0] < self._forward_chunk_bytes:
                j += 1
            for records in self._read_blocks(seg, i, j, view):
                if records and records[0][0] < from_seq:
                    records = records[from_seq - records[0][0]:]
                yield records
            if self.torn_tail is not None:
                return
            i = j

    def _read_blocks(self, seg: SegmentInfo, i: int, j: int, view: _View,
                     ) -> list[list[LogRecord]]:
        """Records of blocks ``[i, j)`` of a sealed segment, fetched in one ranged read,
        every block CRC-checked, in batches of about ``_BATCH_BYTES``, oldest first."""
        blocks = seg.blocks
        base = blocks[i][0]
        end = blocks[j][0] if j < len(blocks) else seg.size_bytes
        try:
            data = self._store.get(seg.key, base, end - base)
        except KeyNotFoundError:
            raise StorageError(f"log segment {seg.key!r} named by the index is missing"
                               ) from None
        mv = memoryview(data)
        for k in range(i, j):
            start = blocks[k][0] - base
            stop = (blocks[k + 1][0] if k + 1 < len(blocks) else seg.size_bytes) - base
            if len(data) < stop or zlib.crc32(mv[start:stop]) != blocks[k][2]:
                return [self._salvage(seg, i, k, data, end - base, view)]
        batches = []
        a = i
        while a < j:
            b = a + 1
            while b < j and blocks[b][0] - blocks[a][0] < _BATCH_BYTES:
                b += 1
            stop = blocks[b][0] if b < len(blocks) else seg.size_bytes
            records = _decode_trusted(mv[blocks[a][0] - base:stop - base], seg.key,
                                      blocks[a][0])
            last = blocks[b][1] - 1 if b < len(blocks) else seg.last_seq
            if not records or records[0][0] != blocks[a][1] or records[-1][0] != last:
                raise _corrupt(seg.key, blocks[a][0],
                               "records do not match the index's block table")
            batches.append(records)
            a = b
        return batches

    def _salvage(self, seg: SegmentInfo, i: int, k: int, data: bytes, expected: int,
                 view: _View) -> list[LogRecord]:
        """Block ``k`` failed its CRC or came back short. Find the exact bad record
        (raises), or, if the log's last object was cut short, report the torn tail
        and return the complete records before it."""
        base = seg.blocks[i][0]
        scan = _scan_verified(data, seg.key, base, seg.blocks[i][1])
        if len(data) == expected:
            # Nothing is missing, so the bytes changed: a damaged length field makes a
            # record run past the end; otherwise the block table itself is damaged.
            if scan.torn_at is not None:
                raise _corrupt(seg.key, base + scan.torn_at,
                               "record length runs past the end of the segment")
            raise _corrupt(seg.key, seg.blocks[k][0], "block CRC32 does not match the index")
        if view.parts or seg is not view.segments[-1]:
            raise _corrupt(seg.key, base + scan.end,
                           "incomplete record: the segment is shorter than the index says")
        cut = scan.end
        last_good = scan.records[-1][0] if scan.records else seg.blocks[i][1] - 1
        self.torn_tail = TornTailReport(seg.key, base + cut, len(data) - cut, last_good)
        return scan.records

    def _read_part(self, view: _View, i: int) -> list[LogRecord]:
        first, key = view.parts[i]
        data = self._store.get(key)
        scan = _scan_verified(data, key, 0, first)
        if scan.torn_at is not None:
            if i != len(view.parts) - 1:
                raise _corrupt(key, scan.torn_at, "incomplete record before the end of the log")
            self.torn_tail = TornTailReport(
                key, scan.torn_at, len(data) - scan.torn_at,
                scan.records[-1][0] if scan.records else first - 1)
        return scan.records

    # -- backward

    def read_backward(self, before_seq: int | None = None, chunk_bytes: int | None = None,
                      ) -> Iterator[list[LogRecord]]:
        """Durable records with ``seq < before_seq`` (all if None), newest first, in
        batches of about ``chunk_bytes`` (default: ``backward_chunk_bytes``) read
        from the end."""
        chunk = chunk_bytes or self._backward_chunk_bytes
        self.torn_tail = None
        gaps = 0
        while True:
            view = _snapshot(self._store, self._prefix)
            try:
                for batch in self._parts_backward(view, before_seq):
                    before_seq = batch[-1][0]
                    yield batch
            except KeyNotFoundError:
                continue  # a part was sealed meanwhile: its records are in a segment now
            except _ViewChanged as e:
                gaps = self._look_again(gaps, e)
                continue
            for seg in reversed(view.segments):
                if before_seq is not None and seg.first_seq >= before_seq:
                    continue
                yield from self._segment_backward(seg, before_seq, chunk, view)
                before_seq = seg.first_seq
            return

    def _parts_backward(self, view: _View, before_seq: int | None,
                        ) -> Iterator[list[LogRecord]]:
        parts = view.parts
        if parts and parts[0][0] != view.sealed_end:
            raise _ViewChanged(view.sealed_end, parts[0][0])
        for i in range(len(parts) - 1, -1, -1):
            first = parts[i][0]
            if before_seq is not None and first >= before_seq:
                continue
            records = self._read_part(view, i)
            if i + 1 < len(parts):
                end = records[-1][0] + 1 if records else first
                if end != parts[i + 1][0]:
                    raise _ViewChanged(end, parts[i + 1][0])
            if before_seq is not None:
                records = records[:before_seq - first]
            if records:
                records.reverse()
                yield records

    def records_backward(self, before_seq: int | None = None) -> Iterator[LogRecord]:
        """Like :meth:`read_backward`, one record at a time."""
        for batch in self.read_backward(before_seq):
            yield from batch

    def _segment_backward(self, seg: SegmentInfo, before_seq: int | None, chunk: int,
                          view: _View) -> Iterator[list[LogRecord]]:
        blocks = seg.blocks
        # Blocks [0, j) hold the seqs below before_seq.
        j = len(blocks) if before_seq is None else \
            bisect.bisect_left([b[1] for b in blocks], before_seq)
        while j > 0:
            end = blocks[j][0] if j < len(blocks) else seg.size_bytes
            i = j - 1
            while i > 0 and end - blocks[i][0] < chunk:
                i -= 1
            for records in reversed(self._read_blocks(seg, i, j, view)):
                if before_seq is not None and records:
                    records = records[:before_seq - records[0][0]]
                records.reverse()
                if records:
                    yield records
            j = i

    # -- async

    async def aread_batches(self, from_seq: int = 0, from_ts: float | None = None,
                            ) -> AsyncIterator[list[LogRecord]]:
        """:meth:`read_batches` with each store access in a worker thread."""
        async for batch in _in_thread(self.read_batches(from_seq, from_ts)):
            yield batch

    async def aread_backward(self, before_seq: int | None = None,
                             chunk_bytes: int | None = None,
                             ) -> AsyncIterator[list[LogRecord]]:
        """:meth:`read_backward` with each store access in a worker thread."""
        async for batch in _in_thread(self.read_backward(before_seq, chunk_bytes)):
            yield batch


async def _in_thread(it: Iterator[list[LogRecord]]) -> AsyncIterator[list[LogRecord]]:
    done: list[LogRecord] = []
    while True:
        batch = await asyncio.to_thread(next, it, done)
        if batch is done:
            return
        yield batch



# -- salvage: what can still be read from a damaged log ------------------------------------


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run a block with Python's cyclic garbage collector off. Reading a log builds a
    tuple per record, and the collector walks every live tuple again each time enough
    have been made, though tuples of numbers and bytes form no cycles: a long read
    (a salvage, a backward pass over an extent) runs 1.5-2x faster without it
    (measured by `benchmarks/cec.py`)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@dataclass
class Damage:
    """A stretch of a log object no record could be read from."""

    key: str
    offset: int
    why: str


@dataclass
class SalvagedObject:
    records: list[LogRecord]
    damaged: list[Damage]


def salvage_object(key: str, data: bytes | memoryview) -> SalvagedObject:
    """Every intact record of one log object (a sealed segment or a part), whatever
    is wrong around it. A record whose CRC fails, or whose payload is not a
    ``[seq, ts, value]`` array, is reported and skipped — its length still frames the
    next record; a length that cannot be right, or a record cut off at the end (a
    torn tail), ends the object's reading there and is reported too. Nothing that
    failed its CRC is ever returned."""
    mv = memoryview(data)
    n = len(mv)
    records: list[LogRecord] = []
    damaged: list[Damage] = []
    off = 0
    while off < n:
        if n - off < HEADER_BYTES:
            damaged.append(Damage(key, off, f"torn: {n - off} bytes of a record header"))
            break
        length, crc = _HEADER.unpack_from(mv, off)
        end = off + HEADER_BYTES + length
        if length < _MIN_PAYLOAD_BYTES:
            damaged.append(Damage(key, off, f"impossible length {length}; the rest of "
                                            f"the object ({n - off} bytes) is unreadable"))
            break
        if end > n:
            damaged.append(Damage(key, off, f"torn: a record of {length} bytes cut off "
                                            f"after {n - off - HEADER_BYTES}"))
            break
        payload = mv[off + HEADER_BYTES:end]
        if zlib.crc32(payload) != crc:
            damaged.append(Damage(key, off, "CRC32 mismatch"))
        else:
            try:
                record = msgpack.unpackb(payload, **_unpack_opts())
            except Exception as exc:  # noqa: BLE001 - any undecodable payload
                damaged.append(Damage(key, off, f"undecodable payload ({exc})"))
            else:
                if type(record) is tuple and len(record) == 3 and type(record[0]) is int:
                    records.append(record)
                else:
                    damaged.append(Damage(key, off, "not a [seq, ts, value] record"))
        off = end
    return SalvagedObject(records, damaged)


def log_object_keys(store: ObjectStore, prefix: str) -> list[str]:
    """Every sealed segment and part of the log under ``prefix``, oldest first; the
    index is not needed (it may be the damaged object)."""
    prefix = _norm_prefix(prefix)
    named = [(_seq_of(key[len(prefix):]), key) for key in store.list(prefix)]
    return [key for seq, key in sorted((s, k) for s, k in named if s is not None)]


def salvage_log(store: ObjectStore, prefix: str) -> SalvagedObject:
    """Every intact record of a log, in seq order, once each (a part and the sealed
    segment that replaced it hold the same records), with what was damaged."""
    by_seq: dict[int, LogRecord] = {}
    damaged: list[Damage] = []
    for key in log_object_keys(store, prefix):
        try:
            salvaged = salvage_object(key, store.get(key))
        except KeyNotFoundError:
            continue  # a part deleted by a seal meanwhile: its records are in a segment
        damaged.extend(salvaged.damaged)
        for record in salvaged.records:
            by_seq.setdefault(record[0], record)
    return SalvagedObject([by_seq[s] for s in sorted(by_seq)], damaged)
