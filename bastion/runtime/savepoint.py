"""Savepoints: stop a job with its state, and resume it later — at another parallelism.

A *savepoint* is the state a job leaves when it is stopped on purpose
(`bastion stop JOB --savepoint`, `bn.stop`, `RunHandle.stop`), written so that a new
job — of any checkpointing protocol, with upgraded code, at another parallelism —
resumes from it (`bn.run(..., resume_from=JOB)`). Unlike a checkpoint, which belongs to
its protocol (a coordinated line with channel state, an uncoordinated one with logged
messages, CEC's eventual checkpoints) and to the job's parallelism, a savepoint is
*canonical*: one blob per stateful operator instance holding that operator's whole
state as `Operator.snapshot` gives it, plus every source's position, and nothing in
flight. That is Flink's distinction between checkpoints and savepoints, and what lets
any protocol start from one.

**How a job stops with a savepoint.** The request is an object in the store
(`request_stop`), so a command in another process can make it. The job master
watches for it while the job runs (`JobMaster`), then stops every source: each
reads nothing more and ends its channels with ``EndOfStream(savepoint=True)``.
Channels are FIFO, so a task that has seen the end of every input has processed all
there is — the job is drained, with nothing in flight, at a cut every task agrees on.
Such a task fires nothing for the end of input (its open windows stay open), writes
its operators' state (`write_state`), and ends the same way downstream. The job then
ends as any job does: its protocol commits every output the sinks staged, so every
record up to the cut is committed once, and the master writes the *manifest*
(`write_manifest`): each operator's kind, state type and parallelism, and each
instance's blob with its size and CRC32. Only a manifest makes a savepoint: a job
stopped halfway has none. If a task fails while the job is stopping, the savepoint
fails (`fail`) and the job recovers and runs on as after any failure — a stop is
never carried out from a recovered state it was not asked of.

**Resuming, and rescaling.** A job resumed from a savepoint checks it against its
topology before deploying (`check_resumable`): an operator whose kind or state type
changed, or that the savepoint holds state for and the topology no longer has, is
refused, naming it; an operator the savepoint does not know starts empty. Sources
keep their parallelism (a source instance's position is its own). Keyed operators
may change theirs: keyed state is addressed by *key group*
(`bastion.runtime.key_groups`), so a new instance reads the blobs of the old
instances whose groups overlap its own and keeps the keys of its groups
(`Operator.restore_keys`). Every blob is checked against the manifest's CRC before
the job deploys, and again by the codec's checksum when a task loads it. Until the
resumed job completes a checkpoint of its own, "from the beginning" means from the
savepoint: a task restored from no checkpoint starts from the savepoint's state.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from bastion.errors import TopologyError
from bastion.runtime.key_groups import groups_of, key_group
from bastion.storage import ObjectStore
from bastion.storage.retention import JOBS_PREFIX, SAVEPOINT_MANIFEST

_VERSION = 1
# what a manifest may weigh: it names every instance's blob, a few hundred bytes each
_MAX_MANIFEST_BYTES = 16 << 20


def _prefix(job_id: str) -> str:
    return f"jobs/{job_id}/savepoint/"


def stop_key(job_id: str) -> str:
    """Where a request to stop job ``job_id`` with a savepoint is written."""
    return f"jobs/{job_id}/control/stop"


def manifest_key(job_id: str) -> str:
    return f"{JOBS_PREFIX}{job_id}/{SAVEPOINT_MANIFEST}"  # what a prune keeps


def failed_key(job_id: str) -> str:
    return _prefix(job_id) + "failed.json"


def state_key(job_id: str, operator: str, index: int) -> str:
    return f"{_prefix(job_id)}state/{operator}/{index}"


def request_stop(store: ObjectStore, job_id: str) -> None:
    """Ask the running job ``job_id`` to stop with a savepoint."""
    store.put(stop_key(job_id), json.dumps({"requested_at": time.time()}).encode())


def stop_requested(store: ObjectStore, job_id: str) -> bool:
    return store.exists(stop_key(job_id))


def take_stop_request(store: ObjectStore, job_id: str) -> None:
    """The job acts on the request: it is consumed, so a later attempt of the job
    (after a failure while stopping) does not stop again unasked."""
    store.delete(stop_key(job_id))


def fail(store: ObjectStore, job_id: str, reason: str) -> None:
    """The stop did not end in a savepoint; ``reason`` says why (what `bn.stop` tells)."""
    store.put(failed_key(job_id), json.dumps({"reason": reason, "at": time.time()}).encode())


def failure(store: ObjectStore, job_id: str) -> str | None:
    """Why the last stop of ``job_id`` failed, or None."""
    if not store.exists(failed_key(job_id)):
        return None
    try:
        return str(json.loads(store.get(failed_key(job_id), 0, 65536))["reason"])
    except (ValueError, KeyError, TypeError):
        return "the savepoint failed (its failure record is unreadable)"


def write_state(store: ObjectStore, job_id: str, operator: str, index: int,
                blob: bytes) -> dict[str, Any]:
    """Store one operator instance's encoded state; its entry for the manifest."""
    key = state_key(job_id, operator, index)
    store.put(key, blob)
    return {"operator": operator, "index": index, "key": key, "size": len(blob),
            "crc32": zlib.crc32(blob)}


def state_type(node: Any) -> str:
    """What an operator's state is, for telling a resumed topology's operator apart
    from the savepoint's: its kind, and for windows the window and aggregation kinds
    (a sum's accumulator cannot be read as a mean's)."""
    params = node.params
    parts = [node.kind]
    if "spec" in params:
        parts.append(type(params["spec"]).__name__)
    if "agg" in params:
        parts.append(type(params["agg"]).__name__)
    return ":".join(parts)


@dataclass(frozen=True)
class Savepoint:
    """A savepoint's manifest: per operator, its state type, parallelism and the
    blobs of its instances (each ``{"index", "key", "size", "crc32"}``, and a source
    instance's ``"position"``: the records it had read)."""

    job_id: str
    created_at: float
    operators: dict[str, dict[str, Any]]

    def blobs(self) -> list[dict[str, Any]]:
        return [blob for op in self.operators.values() for blob in op["instances"]]


def write_manifest(store: ObjectStore, job_id: str, topology: Any,
                   entries: list[dict[str, Any]]) -> Savepoint:
    """The savepoint of ``job_id``, made of every instance's ``entries``
    (`write_state`): written last, so a savepoint without one is no savepoint."""
    operators: dict[str, dict[str, Any]] = {
        name: {"kind": node.kind, "state_type": state_type(node),
               "parallelism": node.parallelism, "instances": []}
        for name, node in topology.nodes.items()}
    for entry in sorted(entries, key=lambda e: (e["operator"], e["index"])):
        operators[entry["operator"]]["instances"].append(
            {k: entry[k] for k in ("index", "key", "size", "crc32", "position")
             if k in entry})
    savepoint = Savepoint(job_id, time.time(), operators)
    store.put(manifest_key(job_id), json.dumps({
        "version": _VERSION, "job": job_id, "created_at": savepoint.created_at,
        "operators": operators}).encode())
    return savepoint


def read_manifest(store: ObjectStore, job_id: str) -> Savepoint | None:
    """The savepoint of ``job_id``; None if it has none. A manifest that is not one
    (damaged, or of another version) is a `ValueError` naming it."""
    key = manifest_key(job_id)
    sizes = store.list_sizes(key)
    if key not in sizes:
        return None
    if sizes[key] > _MAX_MANIFEST_BYTES:
        raise ValueError(f"savepoint manifest {key!r} is {sizes[key]} bytes, more than a "
                         f"manifest may be ({_MAX_MANIFEST_BYTES}): it is not one")
    try:
        doc = json.loads(store.get(key))
        if doc["version"] != _VERSION:
            raise ValueError(f"version {doc['version']!r}, this Bastion reads {_VERSION}")
        operators = {str(name): {
            "kind": str(op["kind"]), "state_type": str(op["state_type"]),
            "parallelism": int(op["parallelism"]),
            "instances": [{"index": int(b["index"]), "key": str(b["key"]),
                           "size": int(b["size"]), "crc32": int(b["crc32"]),
                           # a source instance's: the records it had read
                           **({"position": int(b["position"])} if "position" in b else {})}
                          for b in op["instances"]]}
            for name, op in doc["operators"].items()}
        return Savepoint(str(doc["job"]), float(doc["created_at"]), operators)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"savepoint manifest {key!r} is damaged: {exc}") from None


def check_resumable(savepoint: Savepoint, topology: Any) -> None:
    """Refuse, before anything deploys, a topology that cannot resume ``savepoint``
    (`TopologyError` naming the operator)."""
    nodes = topology.nodes
    for name, old in savepoint.operators.items():
        node = nodes.get(name)
        if node is None:
            if old["instances"]:
                raise TopologyError(
                    f"operator {name!r}: the savepoint of job {savepoint.job_id!r} holds "
                    "its state, and the topology has no operator of that name; put it "
                    "back (or rename the new one to it)")
            continue
        if state_type(node) != old["state_type"]:
            raise TopologyError(
                f"operator {name!r}: its state is {state_type(node)!r} now and "
                f"{old['state_type']!r} in the savepoint of job {savepoint.job_id!r}; "
                "an operator keeps its kind (and window and aggregation) across a "
                "resume — give a changed operator a new name to start it empty")
        if node.parallelism != old["parallelism"] and old["instances"]:
            if node.kind == "source":
                raise TopologyError(
                    f"source {name!r}: parallelism {node.parallelism}, and "
                    f"{old['parallelism']} in the savepoint of job {savepoint.job_id!r}; "
                    "a source instance resumes from its own position, so a source keeps "
                    "its parallelism (keyed operators may change theirs)")
            if node.kind not in KEYED_KINDS:
                raise TopologyError(
                    f"operator {name!r}: parallelism {node.parallelism}, and "
                    f"{old['parallelism']} in the savepoint of job {savepoint.job_id!r}; "
                    "its state is not split by key, so it keeps its parallelism")


# kinds of operator whose state is split by key (`Operator.keyed`): they may rescale
KEYED_KINDS = ("reduce", "stateful_map", "window", "join")


def check_blobs(store: ObjectStore, savepoint: Savepoint) -> None:
    """Every blob of ``savepoint`` is there, of its size and CRC32; else a
    `ValueError` naming the first that is not (nothing of it is loaded)."""
    for blob in savepoint.blobs():
        try:
            data = store.get(blob["key"])
        except (FileNotFoundError, KeyError):
            raise ValueError(f"savepoint of job {savepoint.job_id!r}: blob {blob['key']!r} "
                             "is missing") from None
        if len(data) != blob["size"] or zlib.crc32(data) != blob["crc32"]:
            raise ValueError(f"savepoint of job {savepoint.job_id!r}: blob {blob['key']!r} "
                             "fails its CRC check (damaged); it cannot be resumed")


def blobs_for(savepoint: Savepoint, operator: str, index: int, parallelism: int,
              keyed: bool) -> tuple[list[dict[str, Any]], Callable[[Any], bool] | None]:
    """The blobs instance ``index`` of ``parallelism`` of ``operator`` loads, and
    which keys it keeps of them (None: all — the same instance of an operator whose
    parallelism did not change)."""
    old = savepoint.operators.get(operator)
    if old is None:
        return [], None
    instances = old["instances"]
    old_p = old["parallelism"]
    if not keyed or old_p == parallelism:
        return [b for b in instances if b["index"] == index], None
    mine = groups_of(index, parallelism)
    overlapping = [b for b in instances
                   if set(groups_of(b["index"], old_p)) & set(mine)]
    first, end = mine.start, mine.stop
    return overlapping, lambda key: first <= key_group(key) < end


class StopWatch:
    """The job master's part in a stop: it watches for the request while the job runs
    (`watch`), gives up a stop that a failure interrupted (`on_failure`), and writes
    the manifest once every task has ended (`on_finished`)."""

    def __init__(self, store: ObjectStore, job_id: str, record_event: Callable[..., None],
                 check_interval_s: float = 0.2):
        self.store = store
        self.job_id = job_id
        self.record_event = record_event
        self.check_interval_s = check_interval_s
        self.stopping = False  # the sources were told to stop with a savepoint

    async def watch(self, stop_sources: Callable[[], Awaitable[None]]) -> None:
        """Until cancelled, or until a stop is requested: then the sources stop."""
        while not self.stopping:
            await asyncio.sleep(self.check_interval_s)
            if not await asyncio.to_thread(stop_requested, self.store, self.job_id):
                continue
            await asyncio.to_thread(take_stop_request, self.store, self.job_id)
            self.stopping = True
            self.record_event("savepoint_started")
            await stop_sources()

    async def on_failure(self) -> None:
        """A failure while stopping: the job recovers and runs on; the stop failed."""
        if not self.stopping:
            return
        self.stopping = False
        reason = ("a task failed while the job was stopping; the job recovered and runs "
                  "on — stop it again")
        self.record_event("savepoint_failed", reason=reason)
        await asyncio.to_thread(fail, self.store, self.job_id, reason)

    async def on_finished(self, topology: Any, tasks: list[dict[str, Any]]
                          ) -> Savepoint | None:
        """Every task ended: if the job stopped with a savepoint, store the sources'
        positions and the manifest, and return it."""
        if not self.stopping:
            return None
        if not any(t["savepoint_stop"] for t in tasks):
            reason = "the job's input ended before the stop reached its sources"
            self.record_event("savepoint_failed", reason=reason)
            await asyncio.to_thread(fail, self.store, self.job_id, reason)
            return None
        entries = [entry for t in tasks for entry in t["savepoint"]]
        for t in tasks:
            source = t["source_state"]
            if source is not None:
                entry = await asyncio.to_thread(write_state, self.store, self.job_id,
                                                source["operator"], t["index"],
                                                source["blob"])
                entries.append({**entry, "position": source["position"]})
        saved = await asyncio.to_thread(write_manifest, self.store, self.job_id, topology,
                                        entries)
        self.record_event("savepoint", blobs=len(entries),
                          bytes=sum(e["size"] for e in entries))
        return saved


__all__ = ["KEYED_KINDS", "Savepoint", "blobs_for", "check_blobs", "check_resumable",
           "fail", "failure", "read_manifest", "request_stop", "state_type",
           "stop_requested", "StopWatch", "take_stop_request", "write_manifest",
           "write_state"]
