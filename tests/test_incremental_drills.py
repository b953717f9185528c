"""Incremental keyed state in real runs: exactly-once drills with process kills, a
damaged link that recovery must never load, and retention of the links.

Real Ray, real store (a local directory), real kills. The workloads hold many cold
keys and touch a few hot ones, so the checkpoints after the first are deltas on a
base (each test checks the runs wrote chains, so they cannot pass on full snapshots).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import bastion as bn
from bastion.storage import CheckpointStore, open_store
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

PROTOCOLS = ["coordinated", "uncoordinated", "cic"]
STATE = bn.State(incremental=True, max_chain=3)
COLD = 600


def hot_and_cold(count=4000, rate=2000):
    """A keyed sum: the first records are each a key of their own (cold), the rest
    go to 7 hot keys."""
    topo = bn.Topology("inc-keyed")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count,
                                                          rate=rate))
    numbers.key_by(lambda i: i if i < COLD else i % 7).reduce(
        "sum", lambda acc, i: acc + i, initial=0, parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


def windows(count=3000, rate=1500):
    """A tumbling count per key and a Count(7) window per key, off one keyed stream:
    the first records are each a key of their own (cold: a count window that never
    fires), the rest go to 40 hot keys — so the count windows' checkpoints are deltas
    (a time window operator's few open windows are all touched each interval: its
    links are bases)."""
    topo = bn.Topology("inc-windows")
    events = topo.source("events", bn.sources.Generator(
        lambda i: {"k": f"k{i % 40}" if i >= COLD else f"c{i}", "ts": i * 0.01},
        count=count, rate=rate),
        timestamp=lambda e: e["ts"])
    keyed = events.key_by(lambda e: e["k"])
    keyed.window(bn.windows.Tumbling(2.0)).aggregate(
        "per-key", bn.aggregations.Count(), parallelism=2).sink("tumbling", bn.sinks.Collect())
    keyed.window(bn.windows.Count(7)).aggregate(
        "sevens", bn.aggregations.Count(), parallelism=2).sink("counted", bn.sinks.Collect())
    return topo


def growing(count=4000, rate=2000):
    """A keyed sum that takes, in turns of 400 records, a new key per record and one
    of 5 hot keys: its table grows by whole batches of new keys, which its deltas
    take from the table's end (`bastion.runtime.incremental`, appended keys)."""
    topo = bn.Topology("inc-growing")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count,
                                                          rate=rate))
    numbers.key_by(lambda i: i if i // 400 % 2 == 0 else i % 5).reduce(
        "sum", lambda acc, i: acc + i, initial=0, parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


WORKLOADS = {"keyed": hot_and_cold, "windows": windows}


def chain_links(storage: str, job: str) -> list[str]:
    """The names of the earlier links (``name#k``) the job's remaining manifests list."""
    checkpoints = CheckpointStore(open_store(storage), job)
    ids = {checkpoints.checkpoint_of(k)
           for k in open_store(storage).list(f"jobs/{job}/checkpoints/")}
    names = []
    for i in sorted(i for i in ids if i is not None):
        try:
            names += [n for n in checkpoints.manifest(i).blobs if "#" in n]
        except KeyError:
            continue  # no manifest
    return names


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('incremental')}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("workload,seed", [
    ("keyed", 1), pytest.param("windows", 2, marks=pytest.mark.slow)])
def test_random_kills_stay_exactly_once_with_incremental_state(protocol, workload, seed,
                                                                storage):
    report = bn.drill(WORKLOADS[workload](), protocol=with_interval(protocol, interval_s=0.3),
                      faults=[bn.faults.RandomKills(count=1, between=(0.8, 1.6))], seed=seed,
                      storage=storage, state=STATE)
    assert report.metrics.protocol.failures, "the kill must have forced a restart"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.corrupted == 0, report.corrupted_examples
    assert report.exactly_once, report.verdict_reason
    assert chain_links(storage, report.job_id), "no checkpoint of the run was a delta"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_random_kills_stay_exactly_once_with_appended_keys(protocol, storage):
    """A growing state, its bases encoded in forked children from 50 keys on: its
    deltas carry the keys it added, packed from the table's end; a kill and the
    restore of such a chain lose and duplicate nothing."""
    report = bn.drill(growing(), protocol=with_interval(protocol, interval_s=0.3),
                      faults=[bn.faults.RandomKills(count=1, between=(0.8, 1.6))], seed=3,
                      storage=storage, state=bn.State(incremental=True, max_chain=8,
                                                      fork_min_keys=50))
    assert report.metrics.protocol.failures, "the kill must have forced a restart"
    assert report.exactly_once, report.verdict_reason
    assert report.metrics.extra["forked_encodes"] > 0, "no base was encoded in a child"
    assert chain_links(storage, report.job_id), "no checkpoint of the run was a delta"


def test_full_snapshots_write_no_chain(tmp_path):
    """The default is today's snapshot: one blob per task, no link, no ``.inc`` key."""
    storage = f"local://{tmp_path}"
    result = bn.run(hot_and_cold(count=2000), bn.protocols.Coordinated(interval_s=0.2),
                    storage=storage, state=bn.State())
    keys = open_store(storage).list(f"jobs/{result.job_id}/checkpoints/")
    assert keys and not [k for k in keys if k.endswith(".inc")]
    assert chain_links(storage, result.job_id) == []


def test_retention_keeps_every_link_a_retained_manifest_names_and_nothing_else(tmp_path):
    storage = f"local://{tmp_path}"
    result = bn.run(hot_and_cold(count=4000), bn.protocols.Coordinated(interval_s=0.15),
                    storage=storage, state=STATE)
    store = open_store(storage)
    checkpoints = CheckpointStore(store, result.job_id)
    complete = checkpoints.list_complete()
    assert complete
    named = {ref.key for i in complete for ref in checkpoints.manifest(i).blobs.values()}
    assert any(".inc" in k for k in named) and chain_links(storage, result.job_id)
    # every blob a retained manifest names exists with its size and CRC ...
    for i in complete:
        checkpoints.verify(i)
    # ... and every state blob left is one of them (or of a checkpoint above the newest
    # complete one, which GC never touches: one the job's end overtook)
    newest = complete[0]
    left = [k for k in store.list(f"jobs/{result.job_id}/checkpoints/")
            if not k.endswith("/MANIFEST") and checkpoints.checkpoint_of(k) <= newest]
    assert set(left) <= named, sorted(set(left) - named)
    assert sum(map(len, result.outputs.values())) == 4000


# -- a damaged link is never loaded ---------------------------------------------------


def sabotage(storage: str, done: Path, damage: str):
    """A map that, once the newest complete checkpoint's chain holds a delta stored
    under an older checkpoint, deletes that delta or flips a byte of it, records which
    checkpoints name it, and ends its own worker process. Once."""

    def apply(i: int) -> int:
        if i < 2000 or done.exists():
            return i
        store = open_store(storage)
        [job] = {k.split("/")[1] for k in store.list("jobs/")}
        checkpoints = CheckpointStore(store, job)
        manifest = checkpoints.latest_complete()
        if manifest is None:
            return i
        deltas = [ref for name, ref in manifest.blobs.items()
                  if name.startswith("sum/") and "#" in name and not name.endswith("#0")]
        if not deltas:
            return i  # no delta in a chain yet: try again with the next record
        victim = deltas[0]
        naming = [c for c in checkpoints.list_complete()
                  if victim.key in {r.key for r in checkpoints.manifest(c).blobs.values()}]
        if damage == "delete":
            store.delete(victim.key)
        else:
            data = bytearray(store.get(victim.key))
            data[len(data) // 2] ^= 0x01
            store.put(victim.key, bytes(data))
        done.write_text(json.dumps({"key": victim.key, "naming": naming}))
        os._exit(1)  # the worker process dies here, mid-stream

    return apply


# Not under uncoordinated yet: a damaged checkpoint in its recovery line moves the line
# back below checkpoints already discarded, and the replay then needs their logged
# frames, which are gone — the job fails (the channel log is not found) rather than
# restoring. That holds for full snapshots as much as for chains: a limitation of
# uncoordinated's reclamation, not of the chains.
@pytest.mark.parametrize("protocol,damage", [
    ("coordinated", "delete"), ("coordinated", "flip")])
def test_a_damaged_delta_is_never_loaded_the_run_falls_back(protocol, damage, tmp_path):
    storage = f"local://{tmp_path / 'store'}"
    # The sabotage needs a newest checkpoint whose chain holds an older delta: with
    # the chain's weight trigger, about one checkpoint in three. 5,000 records left it
    # about 2 s to see one, which it missed in about one run in five.
    count = 8000
    topo = bn.Topology("inc-fallback")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count,
                                                          rate=1500))
    mapped = numbers.map("sabotage", sabotage(storage, tmp_path / "done", damage))
    # The sum carries (records, total, last record): a chain loaded without one of
    # its deltas gives other totals. Only the last records are kept, so falling back
    # behind a checkpoint commits no output twice.
    mapped.key_by(lambda i: i if i < COLD else i % 7).reduce(
        "sum", lambda acc, i: (acc[0] + 1, acc[1] + i, i), initial=(0, 0, -1),
        parallelism=2).filter("last", lambda kv: kv[1][2] >= count - 20).sink(
        "out", bn.sinks.Collect())
    result = bn.run(topo, protocol=with_interval(protocol, interval_s=0.15,
                                                 retained_checkpoints=3),
                    storage=storage, state=STATE)
    damaged = json.loads((tmp_path / "done").read_text())
    assert damaged["naming"], "the sabotage found no checkpoint naming the delta"
    # every output of the last records, as plain Python computes it
    got = sorted(result.outputs["out"], key=lambda kv: kv[1][2])
    assert [kv[1][2] for kv in got] == list(range(count - 20, count))
    for key, (n, total, last) in got:
        # the sum of every record of the key up to ``last``
        prefix = [i for i in range(last + 1) if (i if i < COLD else i % 7) == key]
        assert (n, total) == (len(prefix), sum(prefix)), (key, last)
    events = result.details["events"]
    restarted = [e for e in events if e["kind"] == "restarted"]
    assert restarted, "the kill must have forced a restart"
    # the state restored came from checkpoints that do not name the damaged delta
    line = restarted[-1]["checkpoint"]
    restored = set(line.values()) if isinstance(line, dict) else {line}
    assert not restored & set(damaged["naming"]), (restored, damaged["naming"])
    if damage == "flip":  # same size: only a CRC check (verify, or the restore) finds it
        unusable = [e for e in events if e["kind"] == "checkpoint_unusable"]
        assert any(damaged["key"] in e["reason"] for e in unusable), unusable


def heavy_cold_then_hot(count=30000, rate=2500, cold_bytes=600):
    """`hot_and_cold` keeping each key's last value, a cold key's a string of
    ``cold_bytes``: the base weighs hundreds of times an interval's delta (7 hot
    ints), so the chains grow by count to ``max_chain``. (With `hot_and_cold`'s ints,
    a base of 600 keys is a few KB, and one interval's delta already weighs an eighth
    of it: a base every other link, and a compaction, when one is due at all, is
    outgrown before it lands.)"""
    topo = bn.Topology("inc-compaction")
    numbers = topo.source("numbers", bn.sources.Generator(
        lambda i: (i, "c" * cold_bytes if i < COLD else i), count=count, rate=rate))
    numbers.key_by(lambda r: r[0] if r[0] < COLD else r[0] % 7).reduce(
        "last", lambda acc, r: r[1], initial=None, parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


def test_long_chains_are_compacted_off_the_loop_and_a_kill_restores_exactly(tmp_path):
    """With a chain allowed 40 deltas, a compaction is asked for at 20: another process
    merges the stored links into a base, which the task's next link carries. A kill
    later restores from chains that start on such bases, exactly once."""
    storage = f"local://{tmp_path}"
    # 20 intervals (5 s) for the compaction's Ray task to start and land before the
    # chain forces a base. The kill comes after it (9 s); the next compaction is due
    # 5 s after the first landed, near the run's end (12 s).
    report = bn.drill(heavy_cold_then_hot(),
                      protocol=with_interval("coordinated", interval_s=0.25),
                      faults=[bn.faults.RandomKills(count=1, between=(9.0, 9.5))], seed=5,
                      storage=storage, state=bn.State(incremental=True, max_chain=40))
    assert report.metrics.protocol.failures, "the kill must have forced a restart"
    assert report.exactly_once, report.verdict_reason
    store = open_store(storage)
    checkpoints = CheckpointStore(store, report.job_id)
    named = [ref.key for i in checkpoints.list_complete()
             for ref in checkpoints.manifest(i).blobs.values()]
    assert any(k.endswith(".base.inc") for k in named), (
        "no retained chain starts on a compacted base", sorted(named))
