"""Checkpoints: operator state blobs plus a manifest that makes them one snapshot.

A *checkpoint* is a consistent snapshot of a job, numbered by an increasing integer
id. Each operator instance writes its own state as an opaque *blob*; in-flight
messages captured on channels (the channel state of Chandy–Lamport style snapshots, or
the logs of uncoordinated checkpointing) are blobs too. Layout under the store::

    jobs/<job>/checkpoints/<id, 20 digits>/<operator>/<instance>   state blob
    jobs/<job>/checkpoints/<id, 20 digits>/channels/<channel>      channel-state blob
    jobs/<job>/checkpoints/<id, 20 digits>/MANIFEST                written last

Writing a blob returns a :class:`BlobRef` (key, size, CRC32) small enough to send to
the job master, which collects every instance's refs and calls :meth:`commit`: that
checks each blob is stored with its recorded size and only then writes the
*manifest* — the blob list plus free-form metadata such as source offsets.

What makes a checkpoint complete
    Its manifest exists and every blob the manifest names exists with the size (and,
    when verified, the CRC32) the manifest records. Nothing else counts: blobs without
    a manifest are an unfinished (or abandoned) checkpoint; a manifest whose blobs are
    missing or cut short is a damaged one. Sizes come from one listing, so
    :meth:`~CheckpointStore.list_complete` is cheap; ``verify_crc=True`` also reads
    every blob. Recovery restores the newest complete checkpoint, and
    :meth:`~CheckpointStore.load` re-checks each blob's CRC32, so corrupt state is
    never restored. A checkpoint found damaged only then (a blob rotted or was deleted
    after its manifest was written) is given up: ``latest_complete(exclude=...)``
    skips the checkpoints a recovery could not read, and :meth:`checkpoint_of` tells
    which checkpoint a failed blob key belongs to. The manifest itself is msgpack framed like a log record (u32
    length, u32 CRC32, little-endian), so a damaged manifest is detected too.

A manifest may name a blob stored under an older checkpoint (an operator whose state
did not change can hand back its previous :class:`BlobRef`). Garbage collection
therefore deletes keys, not directories: it never deletes a blob that a kept
checkpoint's manifest names.

Chains: incremental state
    A task checkpointing incrementally (`bastion.runtime.incremental`) stores at each
    checkpoint one blob, a base (its whole state) or a delta (the keys changed since
    its previous one), under ``<operator>/<instance>.inc`` (:meth:`put_chain`). The
    :class:`ChainRef` it acknowledges names that blob and, in order, the earlier blobs
    it builds on — stored under older checkpoints, some of which may never have
    completed. :meth:`commit` writes them all into the manifest: the newest as
    ``<operator>/<instance>``, the ones before it as ``<operator>/<instance>#0``
    (the base), ``#1``, … — each with its size and CRC32, so a checkpoint whose
    chain lost a blob is incomplete like one that lost its own, and a rotten one is
    caught by the CRC when read (:meth:`load_chain`, which names the checkpoint's own
    blob when any link fails: the failure then excludes *that* checkpoint, not the
    older one the link was stored under). GC keeps every key a kept manifest names,
    and :meth:`discard` every chain blob (``.inc``) another manifest still names —
    and deletes the links of the discarded checkpoint's chain that no manifest names
    any more and whose own checkpoint was discarded before.

Garbage collection and concurrent checkpoints
    :meth:`CheckpointStore.gc` keeps the newest ``keep`` complete checkpoints and
    deletes every other checkpoint whose id is *below the newest complete id* — older
    complete ones and abandoned incomplete ones. Checkpoints above the newest complete
    id are never touched, so a checkpoint being written while GC runs keeps all its
    blobs. Deletion removes the manifest first, so a half-deleted checkpoint is never
    mistaken for a complete one. :meth:`CheckpointStore.discard` deletes one named
    checkpoint the same way, for protocols whose checkpoints are per task and become
    useless one by one (uncoordinated checkpoints below the recovery line).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import msgpack

from .errors import (
    CorruptBlobError,
    IncompleteCheckpointError,
    KeyNotFoundError,
    StorageError,
)
from .store import ObjectStore

__all__ = ["BlobRef", "ChainRef", "Manifest", "GcReport", "CheckpointStore"]

_log = logging.getLogger(__name__)


_MANIFEST = "MANIFEST"
_CHANNELS = "channels"
_FORMAT = 1
_ID_DIGITS = 20
# A chain blob's key ends so: `discard` tells by the name alone that another
# checkpoint's manifest may name it (a full snapshot's blob never is).
_CHAIN_SUFFIX = ".inc"
# `commit` names a chain's earlier links ``<name>#<position>``.
_LINK = "#"
# The manifest is framed like a log record (u32 length, u32 CRC32, little-endian), so
# a damaged manifest is detected rather than half-parsed.
_FRAME = struct.Struct("<II")


@dataclass(frozen=True)
class BlobRef:
    """A stored blob: its name in the checkpoint (``<operator>/<instance>`` or
    ``channels/<channel>``), its store key, size in bytes and CRC32."""

    name: str
    key: str
    size: int
    crc32: int


@dataclass(frozen=True)
class ChainRef(BlobRef):
    """A chain blob (a base or a delta) with the blobs before it in its chain, base
    first: what a task checkpointing incrementally acknowledges. `CheckpointStore.commit`
    lists ``chain`` in the manifest too (see the module docstring)."""

    chain: tuple[BlobRef, ...] = ()


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint: its blobs by name, plus the caller's metadata."""

    checkpoint_id: int
    job: str
    created_at: float  # wall-clock seconds since the epoch
    blobs: dict[str, BlobRef]
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GcReport:
    """What :meth:`CheckpointStore.gc` did: kept ids (newest first), deleted ids,
    and how many objects it removed."""

    kept: list[int]
    deleted: list[int]
    deleted_objects: int


def read_blob(store: ObjectStore, ref: BlobRef) -> bytes:
    """The blob ``ref`` names, checked against its size and CRC32:
    :class:`IncompleteCheckpointError` if it is missing, :class:`CorruptBlobError` if
    it does not match."""
    try:
        data = store.get(ref.key)
    except KeyNotFoundError:
        raise IncompleteCheckpointError(f"checkpoint blob {ref.key!r} is missing") from None
    if len(data) != ref.size or zlib.crc32(data) != ref.crc32:
        raise CorruptBlobError(
            f"checkpoint blob {ref.key!r} does not match its manifest (size "
            f"{len(data)} vs {ref.size}, CRC32 {zlib.crc32(data):#010x} vs "
            f"{ref.crc32:#010x})", key=ref.key)
    return data


def _check_component(what: str, value: str) -> str:
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError(f"invalid {what} {value!r}: must be a non-empty name without '/'")
    return value


def _check_id(checkpoint_id: int) -> int:
    if not isinstance(checkpoint_id, int) or checkpoint_id < 0:
        raise ValueError(f"checkpoint id must be an int >= 0, got {checkpoint_id!r}")
    return checkpoint_id


class CheckpointStore:
    """Checkpoints of one job on an :class:`~bastion.storage.store.ObjectStore`."""

    def __init__(self, store: ObjectStore, job: str) -> None:
        self._store = store
        self._job = _check_component("job name", job)
        self._root = f"jobs/{job}/checkpoints/"

    @property
    def job(self) -> str:
        return self._job

    def checkpoint_of(self, key: str) -> int | None:
        """The id of the checkpoint of this job that store key ``key`` belongs to
        (a blob or its manifest), or None for a key outside this job's checkpoints."""
        if not key.startswith(self._root):
            return None
        digits = key[len(self._root):].partition("/")[0]
        return int(digits) if len(digits) == _ID_DIGITS and digits.isdigit() else None

    def _dir(self, checkpoint_id: int) -> str:
        return f"{self._root}{_check_id(checkpoint_id):0{_ID_DIGITS}d}/"

    def _put(self, checkpoint_id: int, name: str, data: bytes | bytearray | memoryview,
             ) -> BlobRef:
        key = self._dir(checkpoint_id) + name
        self._store.put(key, data)
        return BlobRef(name, key, len(data), zlib.crc32(data))

    def put_state(self, checkpoint_id: int, operator: str, instance: int | str,
                  data: bytes | bytearray | memoryview) -> BlobRef:
        """Store one operator instance's state for a checkpoint."""
        if operator == _CHANNELS:
            raise ValueError(f"operator name {_CHANNELS!r} is reserved for channel state")
        name = (f"{_check_component('operator name', operator)}/"
                f"{_check_component('instance', str(instance))}")
        return self._put(checkpoint_id, name, data)

    def put_chain(self, checkpoint_id: int, operator: str, instance: int | str,
                  data: bytes | bytearray | memoryview, chain: Iterable[BlobRef] = (),
                  compacted: bytes | None = None) -> ChainRef:
        """Store one instance's chain blob (base or delta) for a checkpoint; ``chain``:
        the blobs it builds on, base first (none for a base). ``compacted``: a base
        made off the task's loop (`bastion.runtime.compaction`) that the chain starts
        from instead, stored first under the same checkpoint (``<instance>.base.inc``),
        where GC keeps it while the checkpoint is being written."""
        links = tuple(_plain(link) for link in chain)
        if compacted is not None:
            base = self.put_state(checkpoint_id, operator,
                                  f"{instance}.base{_CHAIN_SUFFIX}", compacted)
            links = (base, *links)
        ref = self.put_state(checkpoint_id, operator, f"{instance}{_CHAIN_SUFFIX}", data)
        return ChainRef(f"{operator}/{instance}", ref.key, ref.size, ref.crc32, links)

    def put_channel(self, checkpoint_id: int, channel: str,
                    data: bytes | bytearray | memoryview) -> BlobRef:
        """Store one channel's captured in-flight messages for a checkpoint."""
        return self._put(checkpoint_id,
                         f"{_CHANNELS}/{_check_component('channel name', channel)}", data)

    def commit(self, checkpoint_id: int, blobs: Iterable[BlobRef],
               metadata: dict[str, Any] | None = None) -> Manifest:
        """Write the manifest that makes ``checkpoint_id`` complete.

        First checks every blob is stored with its recorded size; raises
        :class:`IncompleteCheckpointError` (and writes nothing) if one is not.
        """
        refs: dict[str, BlobRef] = {}
        for ref in _with_links(blobs):
            if ref.name in refs and refs[ref.name] != ref:
                raise ValueError(f"two different blobs named {ref.name!r} in checkpoint "
                                 f"{checkpoint_id}")
            refs[ref.name] = ref
        sizes = self._sizes_of(refs.values())
        for ref in refs.values():
            if sizes.get(ref.key) != ref.size:
                raise IncompleteCheckpointError(
                    f"cannot commit checkpoint {checkpoint_id} of job {self._job!r}: blob "
                    f"{ref.key!r} is {_describe_size(sizes.get(ref.key))}, expected "
                    f"{ref.size} bytes")
        manifest = Manifest(checkpoint_id, self._job, time.time(), refs, dict(metadata or {}))
        payload = msgpack.packb({
            "format": _FORMAT, "job": self._job, "checkpoint_id": checkpoint_id,
            "created_at": manifest.created_at,
            "blobs": {n: [r.key, r.size, r.crc32] for n, r in refs.items()},
            "metadata": manifest.metadata,
        }, use_bin_type=True)
        self._store.put(self._dir(checkpoint_id) + _MANIFEST,
                        _FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        return manifest

    def _sizes_of(self, refs: Iterable[BlobRef]) -> dict[str, int]:
        # One listing per checkpoint directory involved instead of one call per blob.
        sizes: dict[str, int] = {}
        for directory in sorted({r.key.rsplit("/", 2)[0] + "/" for r in refs}):
            sizes.update(self._store.list_sizes(directory))
        return sizes

    def manifest(self, checkpoint_id: int) -> Manifest:
        """The manifest of ``checkpoint_id``; :class:`KeyNotFoundError` if there is
        none, :class:`CorruptBlobError` if it is damaged."""
        key = self._dir(checkpoint_id) + _MANIFEST
        data = self._store.get(key)
        if len(data) < _FRAME.size:
            raise CorruptBlobError(f"checkpoint manifest {key!r} is truncated", key=key)
        length, crc = _FRAME.unpack_from(data)
        payload = memoryview(data)[_FRAME.size:]
        if length != len(payload) or zlib.crc32(payload) != crc:
            raise CorruptBlobError(f"checkpoint manifest {key!r} fails its length or CRC "
                                   "check", key=key)
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if doc.get("format") != _FORMAT:
            raise StorageError(f"checkpoint manifest {key!r} has unknown format "
                               f"{doc.get('format')!r}")
        blobs = {n: BlobRef(n, k, size, crc32) for n, (k, size, crc32) in doc["blobs"].items()}
        return Manifest(doc["checkpoint_id"], doc["job"], doc["created_at"], blobs,
                        doc["metadata"])

    def _ids(self) -> tuple[list[int], dict[str, int]]:
        """Every checkpoint id with any object, and the size of every object."""
        sizes = self._store.list_sizes(self._root)
        ids = set()
        for key in sizes:
            digits = key[len(self._root):].partition("/")[0]
            if len(digits) == _ID_DIGITS and digits.isdigit():
                ids.add(int(digits))
        return sorted(ids, reverse=True), sizes

    def _complete(self, checkpoint_id: int, sizes: dict[str, int], verify_crc: bool,
                  ) -> Manifest | None:
        """The manifest if the checkpoint is complete, judged against ``sizes``."""
        if self._dir(checkpoint_id) + _MANIFEST not in sizes:
            return None
        try:
            manifest = self.manifest(checkpoint_id)
        except KeyNotFoundError:
            return None  # deleted since the listing
        except CorruptBlobError as e:
            _log.warning("ignoring checkpoint %d of job %r: %s", checkpoint_id, self._job, e)
            return None
        for ref in manifest.blobs.values():
            if sizes.get(ref.key) != ref.size:
                return None
            if verify_crc:
                try:
                    self._read_verified(ref)
                except (CorruptBlobError, IncompleteCheckpointError):
                    return None
        return manifest

    def is_complete(self, checkpoint_id: int, *, verify_crc: bool = False) -> bool:
        """Whether the manifest exists and every blob it names has its recorded size
        (and CRC32, reading every blob, if ``verify_crc``)."""
        ids, sizes = self._ids()
        return checkpoint_id in ids and \
            self._complete(checkpoint_id, sizes, verify_crc) is not None

    def list_complete(self, *, verify_crc: bool = False) -> list[int]:
        """Ids of the complete checkpoints, newest first."""
        ids, sizes = self._ids()
        return [i for i in ids if self._complete(i, sizes, verify_crc) is not None]

    def latest_complete(self, *, verify_crc: bool = False, exclude: Iterable[int] = (),
                        ) -> Manifest | None:
        """The manifest of the newest complete checkpoint not in ``exclude`` (ids a
        caller found it cannot restore), or None."""
        excluded = set(exclude)
        ids, sizes = self._ids()
        for i in ids:
            if i in excluded:
                continue
            manifest = self._complete(i, sizes, verify_crc)
            if manifest is not None:
                return manifest
        return None

    def verify(self, checkpoint_id: int) -> None:
        """Read every blob of a committed checkpoint back and check it against the
        manifest; raise for the first that does not match (:class:`CorruptBlobError`,
        :class:`IncompleteCheckpointError` naming its key) or a missing manifest."""
        for ref in self.manifest(checkpoint_id).blobs.values():
            self._read_verified(ref)

    def _read_verified(self, ref: BlobRef) -> bytes:
        return read_blob(self._store, ref)

    def _load(self, checkpoint_id: int, name: str) -> bytes:
        manifest = self.manifest(checkpoint_id)
        ref = manifest.blobs.get(name)
        if ref is None:
            raise KeyNotFoundError(f"checkpoint {checkpoint_id} of job {self._job!r} has no "
                                   f"blob {name!r}", self._dir(checkpoint_id) + name)
        return self._read_verified(ref)

    def load(self, checkpoint_id: int, operator: str, instance: int | str) -> bytes:
        """One instance's state from a committed checkpoint, CRC-verified."""
        return self._load(checkpoint_id, f"{operator}/{instance}")

    def load_channel(self, checkpoint_id: int, channel: str) -> bytes:
        """One channel's captured messages from a committed checkpoint, CRC-verified."""
        return self._load(checkpoint_id, f"{_CHANNELS}/{channel}")

    def load_chain(self, checkpoint_id: int, operator: str, instance: int | str,
                   ) -> tuple[list[bytes], list[BlobRef]]:
        """One instance's chain from a committed checkpoint, base first, every blob
        CRC-verified against the manifest, and the refs of its links as the chain
        names them (the last is the checkpoint's own blob, its newest link). Any link
        missing, cut short or corrupt raises :class:`CorruptBlobError` whose ``key``
        is that own blob (what `checkpoint_of` maps to ``checkpoint_id``), the failing
        link named in the message: nothing of a partial chain is returned."""
        manifest = self.manifest(checkpoint_id)
        name = f"{operator}/{instance}"
        own = manifest.blobs.get(name)
        if own is None:
            raise KeyNotFoundError(f"checkpoint {checkpoint_id} of job {self._job!r} has no "
                                   f"blob {name!r}", self._dir(checkpoint_id) + name)
        links: list[BlobRef] = []
        while f"{name}{_LINK}{len(links)}" in manifest.blobs:
            links.append(manifest.blobs[f"{name}{_LINK}{len(links)}"])
        links.append(own)
        out = []
        for position, ref in enumerate(links):
            try:
                out.append(self._read_verified(ref))
            except (CorruptBlobError, IncompleteCheckpointError, KeyNotFoundError) as exc:
                raise CorruptBlobError(
                    f"checkpoint {checkpoint_id} of job {self._job!r}: link {position} of "
                    f"the state chain of {name!r} cannot be read ({exc}); the checkpoint "
                    "cannot be restored", key=own.key) from None
        return out, links

    def gc(self, keep: int = 2) -> GcReport:
        """Delete all but the newest ``keep`` complete checkpoints, and abandoned
        incomplete ones older than the newest complete one (see module docstring)."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        ids, sizes = self._ids()
        complete: list[int] = []
        live: set[str] = set()
        for i in ids:
            if len(complete) == keep:
                break
            manifest = self._complete(i, sizes, verify_crc=False)
            if manifest is not None:
                complete.append(i)
                live.update(ref.key for ref in manifest.blobs.values())
        if not complete:
            return GcReport([], [], 0)
        newest = complete[0]
        doomed = [i for i in ids if i < newest and i not in complete]
        removed = sum(self._delete(i, sizes, live) for i in doomed)
        return GcReport(complete, doomed, removed)

    def discard(self, checkpoint_id: int) -> int:
        """Delete one checkpoint (manifest first); returns the number of keys deleted.
        The caller knows no checkpoint it keeps names a blob of this one."""
        _check_id(checkpoint_id)
        keys = self._store.list(self._dir(checkpoint_id))
        if not any(key.endswith(_CHAIN_SUFFIX) for key in keys):
            return self._delete(checkpoint_id, keys, set())  # full snapshots: as always
        # An incremental run's: its chain blobs may be links of a later checkpoint's
        # chain (keep those another manifest names), and the links of its own chain
        # stored under checkpoints discarded before it are deleted with it once no
        # manifest names them any more.
        links: list[str]
        try:
            links = [ref.key for name, ref in self.manifest(checkpoint_id).blobs.items()
                     if _LINK in name]
        except (KeyNotFoundError, CorruptBlobError):
            links = []
        live = self._named_by_others(checkpoint_id)
        removed = self._delete(checkpoint_id, keys, live)
        for key in links:
            owner = self.checkpoint_of(key)
            if key in live or owner is None or owner == checkpoint_id or \
                    self._store.exists(self._dir(owner) + _MANIFEST):
                continue  # still named, or its own checkpoint still stands
            self._store.delete(key)
            removed += 1
        return removed

    def _named_by_others(self, checkpoint_id: int) -> set[str]:
        """Every key the manifests of this job's other checkpoints name."""
        named: set[str] = set()
        ids, sizes = self._ids()
        for i in ids:
            if i == checkpoint_id or self._dir(i) + _MANIFEST not in sizes:
                continue
            try:
                named.update(ref.key for ref in self.manifest(i).blobs.values())
            except (KeyNotFoundError, CorruptBlobError):
                continue  # deleted since the listing, or unreadable: names nothing
        return named

    def _delete(self, checkpoint_id: int, keys: Iterable[str], live: set[str]) -> int:
        directory = self._dir(checkpoint_id)
        doomed = [k for k in keys if k.startswith(directory) and k not in live]
        # Manifest first: from then on the checkpoint reads as incomplete.
        doomed.sort(key=lambda k: k != directory + _MANIFEST)
        for key in doomed:
            self._store.delete(key)
        return len(doomed)

    # -- async twins: the same calls in a worker thread

    async def aput_state(self, checkpoint_id: int, operator: str, instance: int | str,
                         data: bytes | bytearray | memoryview) -> BlobRef:
        return await asyncio.to_thread(self.put_state, checkpoint_id, operator, instance,
                                       data)

    async def aput_channel(self, checkpoint_id: int, channel: str,
                           data: bytes | bytearray | memoryview) -> BlobRef:
        return await asyncio.to_thread(self.put_channel, checkpoint_id, channel, data)

    async def acommit(self, checkpoint_id: int, blobs: Iterable[BlobRef],
                      metadata: dict[str, Any] | None = None) -> Manifest:
        return await asyncio.to_thread(self.commit, checkpoint_id, list(blobs), metadata)

    async def aload(self, checkpoint_id: int, operator: str, instance: int | str) -> bytes:
        return await asyncio.to_thread(self.load, checkpoint_id, operator, instance)

    async def aload_channel(self, checkpoint_id: int, channel: str) -> bytes:
        return await asyncio.to_thread(self.load_channel, checkpoint_id, channel)

    async def alatest_complete(self, *, verify_crc: bool = False, exclude: Iterable[int] = (),
                               ) -> Manifest | None:
        return await asyncio.to_thread(self.latest_complete, verify_crc=verify_crc,
                                       exclude=tuple(exclude))

    async def agc(self, keep: int = 2) -> GcReport:
        return await asyncio.to_thread(self.gc, keep)


def _plain(ref: BlobRef) -> BlobRef:
    return BlobRef(ref.name, ref.key, ref.size, ref.crc32)


def _with_links(blobs: Iterable[BlobRef]) -> Iterable[BlobRef]:
    """``blobs``, each `ChainRef` followed by its chain's earlier links, named
    ``<name>#<position>`` (base at 0), all as plain refs."""
    for ref in blobs:
        if isinstance(ref, ChainRef):
            for position, link in enumerate(ref.chain):
                yield BlobRef(f"{ref.name}{_LINK}{position}", link.key, link.size,
                              link.crc32)
            yield _plain(ref)
        else:
            yield ref


def _describe_size(size: int | None) -> str:
    return "missing" if size is None else f"{size} bytes"
