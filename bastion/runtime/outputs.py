"""Committed sink outputs: the two-phase commit of sink records into the store.

A sink instance *stages* the records it receives. At each commit point — a checkpoint
barrier, or the end of the stream — it writes what it staged since the previous one
as an immutable blob ``jobs/<job>/outputs/<sink>/<instance>/<commit>``; this is the
*pre-commit*, durable but not yet visible. The job master makes commit point ``c``
visible by writing the marker ``jobs/<job>/outputs/COMMITTED/<c>`` once the checkpoint
is complete (every task has stored its state and staged outputs). A blob whose commit
point never completed — the job failed before — is never read: the records in it
are produced again by the replay and land in a later commit.

`RunResult.outputs[sink]` is the concatenation, instance by instance, of the sink's
committed blobs in commit order. With lineage a blob holds the records' ids beside
their values, and `RunResult.output_ids[sink]` is concatenated the same way.
"""

from __future__ import annotations

import pickle
from typing import Any

from bastion.storage import ObjectStore

FINAL_COMMIT = 10**19  # the end-of-stream commit point: after every checkpoint
_DIGITS = 20


def _root(job: str) -> str:
    return f"jobs/{job}/outputs/"


def staged_key(job: str, sink: str, index: int, commit: int) -> str:
    return f"{_root(job)}{sink}/{index:05d}/{commit:0{_DIGITS}d}"


def marker_key(job: str, commit: int) -> str:
    return f"{_root(job)}COMMITTED/{commit:0{_DIGITS}d}"


def encode_values(values: list, ids: list | None = None) -> bytes:
    """A staged blob: the values and, with lineage, their ids (parallel lists)."""
    return pickle.dumps((values, ids), protocol=5)


def decode_staged(data: bytes) -> tuple[list, list | None]:
    return pickle.loads(data)


def decode_values(data: bytes) -> list:
    return decode_staged(data)[0]


def committed_points(store: ObjectStore, job: str) -> set[int]:
    prefix = f"{_root(job)}COMMITTED/"
    return {int(key[len(prefix):]) for key in store.list(prefix)}


def committed_blobs(store: ObjectStore, job: str, sink: str, index: int | None = None
                    ) -> list[tuple[int, int, str]]:
    """``(instance, commit, key)`` of every committed blob of ``sink``, in read order."""
    committed = committed_points(store, job)
    prefix = f"{_root(job)}{sink}/" + ("" if index is None else f"{index:05d}/")
    found = []
    for key in store.list(prefix):
        instance, commit = key[len(f"{_root(job)}{sink}/"):].split("/")
        if int(commit) in committed:
            found.append((int(instance), int(commit), key))
    return sorted(found)


def read_committed(store: ObjectStore, job: str, sink: str
                   ) -> tuple[list[Any], list[Any] | None]:
    """The committed values of ``sink`` and, if the run kept lineage, their ids."""
    values: list[Any] = []
    ids: list[Any] = []
    with_ids = False
    for _, _, key in committed_blobs(store, job, sink):
        blob_values, blob_ids = decode_staged(store.get(key))
        values.extend(blob_values)
        if blob_ids is not None:
            with_ids = True
            ids.extend(blob_ids)
    return values, (ids if with_ids else None)
