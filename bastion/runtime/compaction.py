"""Compaction: a task's incremental state chain merged into one base, off its loop.

A task that checkpoints incrementally (`bastion.runtime.incremental`) writes deltas on
a base; a restore reads the base and every delta after it. The chain must be cut now
and then by a new base, and a base written by the task on its loop costs a full
snapshot's encode (about 30 ns a key) while no record moves. A task whose state is
large enough to fork its bases (`State.fork_min_keys`) writes them in a child, which
costs less than any merge; any other has its chain *compacted* elsewhere: in a Ray
task of its own (another process, so another GIL), `compact` reads the chain's blobs
from the store — each checked against the size and CRC32 its reference names, as a
restore checks them —, applies them in order with `apply_links`, the restore's own
merge, and encodes the result as a base.

The base made is what a restore of those links would load, key for key: the keyed
operators' tables merged, and everything else (sources' offsets, counters,
watermarks) as the newest link holds it. Its ``position`` is the newest link's, so it
can stand in for them: the deltas written after them follow it in a chain
(`incremental.apply_links` checks that). It is not stored here: the task stores it
beside its next link, under that link's checkpoint, so that checkpoint GC — which
keeps only what a manifest names or what a checkpoint still being written holds —
never deletes it before a manifest names it.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import ray

from bastion.codecs import Codec
from bastion.runtime.durable import DurableCodec
from bastion.runtime.incremental import BASE, apply_links
from bastion.storage.checkpoints import BlobRef, read_blob
from bastion.storage.errors import CorruptBlobError
from bastion.storage.store import ObjectStore, open_store

__all__ = ["merge_chain", "compact"]


def merge_chain(blobs: Sequence[bytes], refs: Sequence[BlobRef], codec: DurableCodec,
                keyed: Sequence[bool]) -> bytes:
    """The encoded base standing for the chain ``blobs`` (base first, as stored at
    ``refs``). `CorruptBlobError` naming the newest link if the links do not make a
    chain."""
    key = refs[-1].key
    snapshots = [codec.decode(data, ref.key) for data, ref in zip(blobs, refs)]
    links = [snapshot.get("link") for snapshot in snapshots]
    try:
        states = apply_links(links, keyed)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptBlobError(f"the state chain of {key!r} does not merge: {exc}",
                               key=key) from None
    newest = snapshots[-1]
    operators = [["tables", state] if is_keyed else ["whole", state]
                 for state, is_keyed in zip(states, keyed)]
    newest["link"] = {**links[-1], "kind": BASE, "operators": operators}
    return codec.encode(newest)


def _compact_from(store: ObjectStore, codecs: Iterable[Codec], refs: Sequence[BlobRef],
                  keyed: Sequence[bool]) -> bytes:
    blobs = [read_blob(store, ref) for ref in refs]
    return merge_chain(blobs, refs, DurableCodec(codecs), keyed)


@ray.remote(num_cpus=0, max_retries=0)
def _compact_remote(storage_url: str, codecs: list[Codec], refs: list[BlobRef],
                    keyed: list[bool]) -> bytes:
    return _compact_from(open_store(storage_url), codecs, refs, keyed)


async def compact(storage_url: str, codecs: Sequence[Codec], refs: Sequence[BlobRef],
                  keyed: Sequence[bool]) -> bytes:
    """`merge_chain` of the chain at ``refs``, read from the store at ``storage_url``,
    in a Ray task of its own: the caller's loop and GIL stay free."""
    result: bytes = await _compact_remote.remote(
        storage_url, list(codecs), [BlobRef(r.name, r.key, r.size, r.crc32) for r in refs],
        list(keyed))
    return result
