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
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable

from bastion.codecs import Codec
from bastion.runtime.durable import DurableCodec
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


def part_ref(key: str, blob: bytes) -> tuple[str, int]:
    """What a commit blob records of a part: its key, and the CRC32 of the bytes
    written there, so that only those very bytes are ever read as the part."""
    return key, zlib.crc32(blob)


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
    for part, crc in parts:
        data = store.get(part)
        if zlib.crc32(data) != crc:
            raise CorruptBlobError(f"part {part!r} of staged outputs {key!r} is not the "
                                   "part that was written there (CRC32 differs)", key=part)
        part_values, part_ids = codec.decode(data, part)
        all_values.extend(part_values)
        if all_ids is not None:
            all_ids.extend(part_ids)
    all_values.extend(values)
    if all_ids is not None:
        all_ids.extend(ids)
    return all_values, all_ids


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
