"""Committed sink outputs: the two-phase commit of sink records into the store.

A sink instance *stages* the records it receives. At each commit point — a checkpoint
barrier, or the end of the stream — it writes what it staged since the previous one
as an immutable blob ``jobs/<job>/outputs/<sink>/<instance>/<commit>``; this is the
*pre-commit*, durable but not yet visible. The job master makes commit point ``c``
visible by writing the marker ``jobs/<job>/outputs/COMMITTED/<c>`` once the checkpoint
is complete (every task has stored its state and staged outputs). A blob whose commit
point never completed — the job failed before — is never read: the records in it
are produced again by the replay and land in a later commit.

**Parts.** A sink does not hold everything it stages until the commit point: once it
has staged ``JobConfig.sink_spill_records`` records (under protocol ``none`` the
commit point is the end of the stream) it writes them as a *part*,
``.../<instance>/part-<attempt>-<n>``, and forgets them. The commit point's blob,
written last, lists its parts (key and CRC32) in order, and a reader reads those parts
and then the blob's own records. A part that no commit blob lists — left by a failed
attempt, perhaps under a commit point that is reused later — is never read.

Blobs are `bastion.runtime.durable` blobs: msgpack with the topology's codecs,
checksummed, verified before decoding. `RunResult.outputs[sink]` is the
concatenation, instance by instance, of the sink's committed commit points in commit
order. With lineage a blob holds the records' ids beside their values, and
`RunResult.output_ids[sink]` is concatenated the same way.

**Outputs that stay in the store.** A sink whose records leave the job (``File``,
``Log``: `bastion.sinks.Sink.lazy_outputs`) may commit far more than the driver can
hold, so `bn.run` does not read them back: `RunResult.outputs[sink]` is then a
`CommittedOutputs`, a read-only sequence that streams the committed records from the
store one part at a time when it is iterated or indexed. Its length comes from the
commit records, not from the records: a commit blob lists each of its parts with the
number of records in it (`part_ref`), and its own records' count is the header of its
value array, read without decoding a record. The view reads the job's folder of the
store when it is used, so it fails with `KeyNotFoundError` once that folder is
deleted (`bastion gc`, ``--keep-jobs``).
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence, overload

import msgpack

from bastion.codecs import Codec
from bastion.runtime.durable import DurableCodec, open_blob
from bastion.storage import ObjectStore
from bastion.storage.errors import CorruptBlobError

FINAL_COMMIT = 10**19  # the end-of-stream commit point: after every checkpoint
_DIGITS = 20


def _root(job: str) -> str:
    return f"jobs/{job}/outputs/"


def staged_key(job: str, sink: str, index: int, commit: int) -> str:
    return f"{_root(job)}{sink}/{index:05d}/{commit:0{_DIGITS}d}"


def part_key(job: str, sink: str, index: int, attempt: int, n: int,
             incarnation: int = 0) -> str:
    """The ``n``-th part a sink instance spilled in ``attempt`` (and, after a regional
    restart rebuilt it, its ``incarnation``): unique per attempt and incarnation, so a
    part is never overwritten by another's."""
    again = f".{incarnation}" if incarnation else ""
    return f"{_root(job)}{sink}/{index:05d}/part-{attempt:06d}{again}-{n:09d}"


def marker_key(job: str, commit: int) -> str:
    return f"{_root(job)}COMMITTED/{commit:0{_DIGITS}d}"


def encode_part(codec: DurableCodec, values: list, ids: list | None) -> bytes:
    """A part: staged values and, with lineage, their ids (parallel lists)."""
    return codec.encode([values, ids])


def encode_staged(codec: DurableCodec, values: list, ids: list | None,
                  parts: list[tuple[str, int]]) -> bytes:
    """A commit point's blob: its last staged values and ids, after ``parts``
    (``(key, crc32)`` of each part, in order)."""
    return codec.encode([values, ids, parts])


def part_ref(key: str, blob: bytes) -> tuple[str, int, int]:
    """What a commit blob records of a part: its key, the CRC32 of the bytes written
    there, so that only those very bytes are ever read as the part, and how many
    records it holds, so that a reader counts committed records without reading them
    (`CommittedOutputs`)."""
    return key, zlib.crc32(blob), _part_records(blob, key)


def _part_records(blob: bytes, key: str) -> int:
    """How many values part ``blob`` (``[values, ids]``) holds: the header of its value
    array, read without decoding a value."""
    _, payload = open_blob(blob, key)
    return _values_count(payload)


def _values_count(payload: bytes | memoryview) -> int:
    """How many values a part's or commit blob's payload (``[values, ids, ...]``)
    holds: the header of its value array, read without the values."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(payload[:16])  # two array headers: at most 5 + 5 bytes
    unpacker.read_array_header()
    return unpacker.read_array_header()


def _ref_fields(ref: Any) -> tuple[str, int, int | None]:
    """``(key, crc, records)`` of a part reference; records is None in a reference
    written before part references counted their records."""
    if len(ref) == 2:
        return ref[0], ref[1], None
    return ref[0], ref[1], ref[2]


def read_staged(store: ObjectStore, codec: DurableCodec, key: str
                ) -> tuple[list, list | None]:
    """The values (and ids, or None) of the commit point whose blob is ``key``: its
    parts in order, then the blob's own records. `CorruptBlobError` if a blob or a
    part fails its check."""
    values, ids, parts = codec.decode(store.get(key), key)
    if not parts:
        return values, ids
    all_values: list = []
    all_ids: list | None = None if ids is None else []
    for ref in parts:
        part, crc, _ = _ref_fields(ref)
        part_values, part_ids = _read_part(store, codec, part, crc, key)
        all_values.extend(part_values)
        if all_ids is not None:
            # one sink wrote the blob and its parts: all carry ids, or none does
            assert part_ids is not None
            all_ids.extend(part_ids)
    all_values.extend(values)
    if all_ids is not None:
        all_ids.extend(ids)
    return all_values, all_ids


def _read_part(store: ObjectStore, codec: DurableCodec, part: str, crc: int,
               blob: str) -> tuple[list, list | None]:
    """The values and ids of part ``part`` of commit blob ``blob``, if its bytes are
    those the blob recorded (CRC32 ``crc``)."""
    data = store.get(part)
    if zlib.crc32(data) != crc:
        raise CorruptBlobError(f"part {part!r} of staged outputs {blob!r} is not the "
                               "part that was written there (CRC32 differs)", key=part)
    part_values, part_ids = codec.decode(data, part)
    return part_values, part_ids


def committed_points(store: ObjectStore, job: str) -> set[int]:
    prefix = f"{_root(job)}COMMITTED/"
    return {int(key[len(prefix):]) for key in store.list(prefix)}


def committed_blobs(store: ObjectStore, job: str, sink: str, index: int | None = None
                    ) -> list[tuple[int, int, str]]:
    """``(instance, commit, key)`` of every committed commit blob of ``sink``, in read
    order (parts are read through their commit blob, `read_staged`)."""
    committed = committed_points(store, job)
    prefix = f"{_root(job)}{sink}/" + ("" if index is None else f"{index:05d}/")
    found = []
    for key in store.list(prefix):
        instance, name = key[len(f"{_root(job)}{sink}/"):].split("/")
        if name.isdigit() and int(name) in committed:
            found.append((int(instance), int(name), key))
    return sorted(found)


def read_committed(store: ObjectStore, job: str, sink: str,
                   codecs: Iterable[Codec] = ()) -> tuple[list[Any], list[Any] | None]:
    """The committed values of ``sink`` and, if the run kept lineage, their ids.
    ``codecs``: the topology's registered codecs, which its values were stored with."""
    codec = DurableCodec(codecs)
    values: list[Any] = []
    ids: list[Any] = []
    with_ids = False
    for _, _, key in committed_blobs(store, job, sink):
        blob_values, blob_ids = read_staged(store, codec, key)
        values.extend(blob_values)
        if blob_ids is not None:
            with_ids = True
            ids.extend(blob_ids)
    return values, (ids if with_ids else None)


# --------------------------------------------------------------------------- lazy reads


@dataclass(frozen=True)
class _Segment:
    """Committed records that are stored, and so read, together: a part (``crc``: the
    CRC32 its commit blob recorded) or a commit blob's own records (``crc`` None)."""

    key: str
    crc: int | None
    records: int
    blob: str  # the commit blob that lists it, for errors


def _scan_commit_blob(data: bytes, key: str) -> tuple[int, list[tuple[str, int, int | None]]]:
    """How many records commit blob ``data`` holds itself, and its part references.
    The values and ids are skipped over, not decoded: counting a sink's records
    costs a pass over its commit blobs' bytes, never a Python object per record."""
    _, payload = open_blob(data, key)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                max_buffer_size=max(len(payload), 1024))
    unpacker.feed(payload)
    try:
        fields = unpacker.read_array_header()
        own = _values_count(payload)
        unpacker.skip()  # the values: one call, however many
        unpacker.skip()  # the ids, or None
        refs = unpacker.unpack() if fields >= 3 else []
    except (ValueError, msgpack.UnpackException) as exc:
        # The CRC held: these are bytes Bastion wrote, in a shape this version cannot
        # count, and they are not guessed at.
        raise CorruptBlobError(f"commit blob {key!r} cannot be read as staged outputs: "
                               f"{exc}", key=key) from None
    # A reference is stored as a tuple, which durable blobs mark with an extension value
    # in front (`bastion.runtime.durable`); only the fields matter here.
    return own, [_ref_fields([f for f in ref if not isinstance(f, msgpack.ExtType)])
                 for ref in refs]


class CommittedIndex:
    """Where the committed records of one sink are stored, in read order, and how many
    each place holds: what `CommittedOutputs` reads from. Building it reads the sink's
    commit blobs (`_scan_commit_blob`), not its parts."""

    def __init__(self, store: ObjectStore, job: str, sink: str,
                 codecs: Iterable[Codec] = ()):
        self.store = store
        self.job = job
        self.sink = sink
        self.codecs = tuple(codecs)
        self.segments: list[_Segment] = []
        for _, _, key in committed_blobs(store, job, sink):
            own, refs = _scan_commit_blob(store.get(key), key)
            for part, crc, records in refs:
                if records is None:  # a reference from before parts were counted
                    records = _part_records(store.get(part), part)
                self.segments.append(_Segment(part, crc, records, key))
            self.segments.append(_Segment(key, None, own, key))
        self.segments = [s for s in self.segments if s.records]
        self.starts: list[int] = []  # the position of each segment's first record
        total = 0
        for segment in self.segments:
            self.starts.append(total)
            total += segment.records
        self.records = total
        self._codec: DurableCodec | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The codec holds a msgpack Packer, which does not pickle; it is made again.
        return {**self.__dict__, "_codec": None}

    def read(self, segment: _Segment) -> tuple[list, list | None]:
        """The values and ids (None without lineage) of ``segment``."""
        if self._codec is None:
            self._codec = DurableCodec(self.codecs)
        if segment.crc is not None:
            values, ids = _read_part(self.store, self._codec, segment.key, segment.crc,
                                     segment.blob)
        else:
            values, ids, _ = self._codec.decode(self.store.get(segment.key), segment.key)
        if len(values) != segment.records:
            raise CorruptBlobError(
                f"staged outputs {segment.key!r} of sink {self.sink!r} hold {len(values)} "
                f"records, but commit blob {segment.blob!r} counted {segment.records}",
                key=segment.key)
        return values, ids


class CommittedOutputs(Sequence[Any]):
    """The committed values (or lineage ids) of one sink, read from the store as they
    are used: a read-only sequence for outputs too large for the driver's memory.

    ``len()`` is known without reading a record (`CommittedIndex`); iterating reads
    one part (at most ``sink_spill_records`` records) or commit blob at a time and
    forgets it; ``outputs[i]`` reads only the part holding record ``i`` (the last part
    read is kept, so consecutive indices cost one read per part) and a slice only the
    parts it covers, as a list. It equals any sequence (a list, a tuple, another view)
    with the same items in the same order. ``list(outputs)`` loads everything, which is
    what this class exists to avoid for large outputs.
    """

    def __init__(self, index: CommittedIndex, ids: bool = False):
        self._index = index
        self._ids = ids
        self._cached: tuple[int, list] | None = None  # the segment last indexed into

    @property
    def sink(self) -> str:
        return self._index.sink

    @property
    def job_id(self) -> str:
        return self._index.job

    def __len__(self) -> int:
        return self._index.records

    def _items(self, n: int) -> list:
        segment = self._index.segments[n]
        values, ids = self._index.read(segment)
        if not self._ids:
            return values
        if ids is None:
            raise ValueError(f"sink {self.sink!r} of job {self.job_id}: staged outputs "
                             f"{segment.key!r} were stored without lineage ids; ids exist "
                             "only for runs made with bn.run(..., lineage=True)")
        return ids

    def __iter__(self) -> Iterator[Any]:
        for n in range(len(self._index.segments)):
            yield from self._items(n)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not isinstance(i, int):
            raise TypeError(f"committed outputs are indexed by int or slice, not "
                            f"{type(i).__name__}")
        position = i + len(self) if i < 0 else i
        if not 0 <= position < len(self):
            raise IndexError(f"record {i} of sink {self.sink!r}, which committed "
                             f"{len(self)}")
        n = bisect.bisect_right(self._index.starts, position) - 1
        if self._cached is None or self._cached[0] != n:
            self._cached = (n, self._items(n))
        return self._cached[1][position - self._index.starts[n]]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (str, bytes, bytearray)) or not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        what = "lineage ids" if self._ids else "records"
        return (f"<CommittedOutputs: {len(self):,} committed {what} of sink "
                f"{self.sink!r} in job {self.job_id}, read from {self._index.store.url} "
                "when used>")


def committed_outputs(store: ObjectStore, job: str, sink: str,
                      codecs: Iterable[Codec] = ()
                      ) -> tuple[CommittedOutputs, CommittedOutputs]:
    """Lazy views of the committed values of ``sink`` and of their lineage ids (the
    second is of use only for a run with lineage; reading it otherwise fails)."""
    index = CommittedIndex(store, job, sink, codecs)
    return CommittedOutputs(index), CommittedOutputs(index, ids=True)
