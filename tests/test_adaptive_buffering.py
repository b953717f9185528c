"""Adaptive buffering and second waves (Su & Zhou §4; `bastion.scheduler.recovery`,
`bastion.scheduler.failover`).

The pieces on plain inputs first: the region a failure restarts when only some
senders keep an upstream backup, against brute force (and a checker that catches the
region the strategy chose when every channel was backed up); the planner asked again
with a second wave's larger set of lost tasks; and a channel whose backup turns on
and off.

Then runs through ``bn.run`` on the session's Ray, checked against plain Python:
a failure-free run keeps no backup outside the sources; a single failure (no burst)
restarts the failed tasks' upstream to the sources and is exactly once; a burst
turns buffering on, and the next checkpoint turns it off and frees it; a failure that
no region can take (no checkpoint completed yet) restarts the job and says why.
Pending tasks and a second wave need capacity to arrive (nodes added to a simulated
cluster): `correlated_drill.py --shape second_wave`, run by the slow test below."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import bastion as bn
from bastion.runtime.channel import OutputChannel, ReplayableOutputChannel
from bastion.scheduler.failover import RestartDownstream, TaskGraph
from bastion.scheduler.recovery import (Capacity, ProgressiveRecovery, QueryNeeds,
                                        check_plan)
from bastion.storage import open_store


# -- the region, when only some senders keep a backup --------------------------------------


def smallest_region(failed: set[int], tasks: int, channels: dict[int, tuple[int, int]],
                    backed_up: set[int]) -> set[int]:
    """Brute force: the smallest set of tasks holding ``failed`` that can restore a
    line alone — nothing outside it receives from it, and every sender outside it
    into it keeps a backup (``backed_up``). Such sets are closed under intersection,
    so the smallest is the intersection of all of them."""
    best = set(range(tasks))
    for size in range(tasks + 1):
        for chosen in itertools.combinations(range(tasks), size):
            region = set(chosen)
            if failed <= region and region_is_correct(region, channels, backed_up):
                best &= region
    return best


def region_is_correct(region: set[int], channels: dict[int, tuple[int, int]],
                      backed_up: set[int]) -> bool:
    return all((src in region) <= (dst in region) for src, dst in channels.values()) \
        and all(src in region or src in backed_up
                for src, dst in channels.values() if dst in region)


def restarted(failed: set[int], tasks: int, channels: dict[int, tuple[int, int]],
              backed_up: set[int] | None) -> set[int]:
    graph = TaskGraph(frozenset(range(tasks)), channels,
                      None if backed_up is None else frozenset(backed_up))
    return set(RestartDownstream(adaptive=True).tasks_to_restart(failed, graph))


def test_the_region_is_the_smallest_one_the_backups_can_feed():
    rng = random.Random(37)
    for _ in range(150):
        tasks = rng.randint(1, 7)
        pairs = [(s, d) for s, d in itertools.product(range(tasks), repeat=2) if s < d]
        channels = dict(enumerate(rng.sample(pairs, rng.randint(0, len(pairs)))))
        failed = set(rng.sample(range(tasks), rng.randint(1, tasks)))
        backed_up = set(rng.sample(range(tasks), rng.randint(0, tasks)))
        assert restarted(failed, tasks, channels, backed_up) == \
            smallest_region(failed, tasks, channels, backed_up)


# A pipeline: source 0 -> map 1, 2 (forward) -> reduce 3, 4 (keyed) -> sink 5, 6
PIPELINE = {0: (0, 1), 1: (0, 2), 2: (1, 3), 3: (1, 4), 4: (2, 3), 5: (2, 4),
            6: (3, 5), 7: (4, 6)}


def test_without_backups_outside_the_sources_a_lost_reduce_restarts_the_maps_too():
    # normal operation: only the source keeps a backup; reduce 3 is lost
    region = restarted({3}, 7, PIPELINE, {0})
    assert region == {1, 2, 3, 4, 5, 6}
    assert region_is_correct(region, PIPELINE, {0})
    # what the strategy restarted when every channel kept a backup is too small now
    always_on = restarted({3}, 7, PIPELINE, None)
    assert always_on == {3, 5}
    assert not region_is_correct(always_on, PIPELINE, {0})


def test_a_second_wave_restarts_less_where_the_burst_turned_backups_on():
    # the burst restored maps 1, 2 from the line with buffering on: they feed a
    # later region from their backups; a survivor of the burst logs only since it
    burst_region = {1, 2, 3, 4, 5, 6}
    assert restarted({4}, 7, PIPELINE, {0} | burst_region) == {4, 6}
    assert restarted({4}, 7, PIPELINE, {0} | {3, 4, 5, 6}) == {1, 2, 3, 4, 5, 6}


# -- the plan, asked again with a second wave -------------------------------------------


def test_a_second_wave_is_planned_with_the_tasks_still_waiting():
    # queries over 6 tasks: 0 is a shared source, a needs 1, b needs 2-3, c needs 4-5
    queries = [QueryNeeds("a", 3, frozenset({0, 1})), QueryNeeds("b", 2, frozenset({0, 2, 3})),
               QueryNeeds("c", 1, frozenset({0, 4, 5}))]
    first = ProgressiveRecovery().plan([2, 3, 4, 5], queries, Capacity(2))
    assert first.recover == (2, 3) and first.pending == (4, 5)
    # the second wave takes task 1 (query a) and task 3 again; 3 slots free up
    waiting, newly_lost = set(first.pending), {1, 3}
    second = ProgressiveRecovery().plan(sorted(waiting | newly_lost), queries, Capacity(3))
    check_plan(second, waiting | newly_lost, 3)
    # a (density 3 per slot), then b (its one lost task, 2), and c no longer fits
    assert second.queries == ("a", "b") and second.recover == (1, 3)
    assert second.pending == (4, 5)


# -- a channel whose backup turns on and off ----------------------------------------------


class Recorder(OutputChannel):
    def __init__(self):
        super().__init__(0, 10, 0.0)
        self.received: list[tuple[int, bytes]] = []

    async def transmit(self, seq, payload):
        self.received.append((seq, payload))


def frames(seqs) -> list[tuple[int, bytes]]:
    return [(s, f"frame {s}".encode()) for s in seqs]


def test_a_backup_kept_only_while_buffering_is_on(tmp_path):
    store = open_store(f"local://{tmp_path}")

    async def scenario():
        receiver = Recorder()
        channel = ReplayableOutputChannel(3, 10, 0.0, None, 2, store, "jobs/j/held/0/3/0",
                                          receiver, logs=False)
        for seq, payload in frames(range(3)):
            await channel.transmit(seq, payload)
        off = (channel.frames_logged, channel.kept_bytes)
        channel.start_logging()                      # a burst
        for seq, payload in frames(range(3, 8)):
            await channel.transmit(seq, payload)
        spilled = len(store.list("jobs/j/held/"))
        channel.detach()                             # its receiver restarts...
        again = Recorder()
        await channel.attach(again, from_seq=4)      # ...from frame 4
        on = (channel.frames_logged, channel.kept_bytes)
        freed = await channel.stop_logging()          # the next checkpoint
        await channel.transmit(8, b"frame 8")
        return receiver, again, off, on, spilled, freed, channel

    receiver, again, off, on, spilled, freed, channel = asyncio.run(scenario())
    assert receiver.received == frames(range(8))
    assert again.received == frames(range(4, 9))
    assert off == (0, 0)                              # nothing kept in normal operation
    assert on == (5, sum(len(p) for _, p in frames(range(3, 8))))
    assert spilled == 2 and freed == on[1]
    assert store.list("jobs/j/held/") == [] and channel.kept_bytes == 0
    assert channel.frames_logged == 5                 # frame 8 came after it turned off


def test_a_channel_to_a_pending_receiver_keeps_everything_whatever_it_is_told(tmp_path):
    async def scenario():
        channel = ReplayableOutputChannel(3, 10, 0.0, None, 8, open_store(
            f"local://{tmp_path}"), "jobs/j/held/0/3/0", None, logs=False)
        for seq, payload in frames(range(3)):
            await channel.transmit(seq, payload)
        assert await channel.stop_logging() == 0     # its receiver still needs them
        late = Recorder()
        await channel.attach(late, from_seq=0)
        return late

    assert asyncio.run(scenario()).received == frames(range(3))


# -- through bn.run, on the session's Ray ---------------------------------------------------

WORDS = ["ant", "bee", "cat", "dog", "eel"]
COUNT = 3000


def shout(word: str) -> str:
    return word.upper()


def pipeline() -> bn.Topology:
    """A source, a map and a keyed count: the map is neither source nor sink."""
    topo = bn.Topology("adaptive")
    topo.source("words", bn.sources.Generator(lambda i: WORDS[i % len(WORDS)], count=COUNT,
                                              rate=1500)) \
        .map("shout", shout, parallelism=2) \
        .key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0,
                                    parallelism=2).sink("out", bn.sinks.Collect())
    return topo


def reference_counts() -> dict[str, list[int]]:
    """Plain Python: every running count each word reaches, once."""
    seen: dict[str, int] = {}
    out: dict[str, list[int]] = {}
    for i in range(COUNT):
        word = shout(WORDS[i % len(WORDS)])
        seen[word] = seen.get(word, 0) + 1
        out.setdefault(word, []).append(seen[word])
    return out


def counts_of(result) -> dict[str, list[int]]:
    per_word: dict[str, list[int]] = {}
    for word, n in result.outputs["out"]:
        per_word.setdefault(word, []).append(n)
    return {w: sorted(ns) for w, ns in per_word.items()}


def events(result, kind: str) -> list[dict]:
    return [e for e in result.details["events"] if e["kind"] == kind]


def run(tmp_path, faults, checkpoint_interval=0.3, **policy) -> "bn.RunResult":
    return bn.run(pipeline(), protocol=bn.protocols.Coordinated(interval_s=checkpoint_interval),
                  storage=f"local://{tmp_path}", workers=3,
                  recovery=bn.RecoveryPolicy("progressive", task_slots_per_cpu=8,
                                             **policy), faults=faults)


@pytest.mark.usefixtures("ray_session")
def test_normal_operation_keeps_backups_at_the_sources_only(tmp_path):
    result = run(tmp_path, faults=[])
    assert counts_of(result) == reference_counts()
    [backups] = events(result, "upstream_backups")
    assert backups["adaptive"] is True
    assert backups["other_frames_logged"] == backups["other_bytes_logged"] == 0
    assert backups["source_bytes_logged"] > 0
    assert not events(result, "adaptive_buffering")


@pytest.mark.usefixtures("ray_session")
def test_a_single_failure_restarts_up_to_the_sources_exactly_once(tmp_path):
    result = run(tmp_path, faults=[bn.faults.KillInstance("count", 1, at=1.0)])
    assert counts_of(result) == reference_counts()
    [planned] = events(result, "recovery_planned")
    assert planned["planner"] == "BlockingRecovery" and planned["pending"] == []
    tasks = {t["task_id"]: t for t in result.details["tasks"]}
    sources = {i for i, t in tasks.items() if t["is_source"]}
    # every task but the sources restarted (a source only if it was lost): the maps
    # keep no backup to feed count[1] from
    assert set(planned["region"]) == (set(tasks) - sources) | (
        sources & set(planned["lost_tasks"])), planned
    assert not events(result, "whole_restart") and not events(result, "adaptive_buffering")
    [backups] = events(result, "upstream_backups")
    assert backups["other_bytes_logged"] == 0 and backups["source_bytes_logged"] > 0


@pytest.mark.usefixtures("ray_session")
def test_a_burst_turns_buffering_on_until_the_next_checkpoint(tmp_path):
    # two workers lost at once: a burst, recovered at once (their slots are free)
    result = run(tmp_path, faults=[bn.faults.KillWorker(1, at=1.0),
                                   bn.faults.KillWorker(2, at=1.0)],
                 burst_losses=2, burst_window_s=1.0)
    assert counts_of(result) == reference_counts()
    [grouped] = events(result, "losses_grouped")
    assert grouped["correlated"] is True, grouped
    on, off = events(result, "adaptive_buffering")
    assert on["on"] is True and on["reason"] == "a burst was detected"
    assert off["on"] is False and off["t_s"] > on["t_s"]
    completed = [e for e in events(result, "checkpoint_completed")
                 if e["checkpoint_id"] == off["checkpoint_id"]]
    assert completed and completed[0]["t_s"] > on["t_s"]
    # the tasks the burst restored kept a backup, freed when it turned off
    assert off["freed_bytes"] > 0
    [backups] = events(result, "upstream_backups")
    assert backups["other_bytes_logged"] > 0 and backups["other_bytes_kept"] == 0


@pytest.mark.usefixtures("ray_session")
def test_a_failure_no_region_can_take_restarts_the_job_and_says_why(tmp_path):
    # no checkpoint completes before the kill: there is no line a region restores
    result = run(tmp_path, faults=[bn.faults.KillInstance("count", 1, at=1.0)],
                 checkpoint_interval=30.0)
    assert counts_of(result) == reference_counts()
    [whole] = events(result, "whole_restart")
    assert "no checkpoint has completed in this attempt yet" in whole["reason"], whole
    assert whole["second_wave"] is False
    assert result.metrics.extra["attempts"] == 2


# -- pending tasks and a second wave: a simulated cluster, in a driver of its own ----------


def drill(tmp_path, shape: str) -> dict:
    """`correlated_drill.py --shape SHAPE` in a driver of its own: its JSON line."""
    script = Path(__file__).with_name("correlated_drill.py")
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "--shape", shape],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(Path(__file__).resolve().parent.parent)]
                             + [p for p in [os.environ.get("PYTHONPATH")] if p])})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(900)  # two runs of 20 s, each on a simulated cluster of its own
def test_a_second_wave_while_tasks_wait_for_capacity_adds_to_the_plan(tmp_path):
    runs = drill(tmp_path, "second_wave")
    report = runs["regional"]
    assert report["exactly_once"], report
    assert report["lost"] == report["duplicated"] == 0, report
    planned = report["planned"]
    # the burst left tasks waiting; the second wave was planned with them, within the
    # attempt that ran (no restart of the whole job)
    assert planned[0]["pending"] and not planned[0]["second_wave"], planned
    [second] = [p for p in planned if p["second_wave"]]
    assert second["waiting"] and set(second["waiting"]) <= set(second["pending"]) | set(
        second["recover"]), second
    assert set(second["lost_tasks"]) <= set(second["recover"]) | set(second["pending"])
    assert report["whole_restarts"] == [] and report["attempts"] == 1, report
    # on at the burst, off once every task ran again and a checkpoint completed
    on, off = report["buffering"]
    assert on["on"] and on["reason"] == "a burst was detected", report
    assert not off["on"] and off["t_s"] > second["t_s"], report
    # (the scenario's tasks that are not sources end in sinks: no output to keep)
    assert report["backups"]["other_bytes_kept"] == 0, report


@pytest.mark.slow
@pytest.mark.timeout(900)  # two runs of 20 s, each on a simulated cluster of its own
def test_a_second_wave_is_fed_from_a_backup_the_burst_turned_on(tmp_path):
    """parse[0] (task 1) is not a source: it restarts with the burst (it kept no
    backup), joins with buffering on, and runs on through the second wave, whose
    restored counts it feeds again from the backup it kept since the line."""
    report = drill(tmp_path, "relayed")
    assert report["exactly_once"], report
    first, second = report["planned"]
    assert 1 in first["region"] and not first["second_wave"], report
    assert second["second_wave"] and second["waiting"] == [8, 9], report
    # the counts (4-6) restore the line; parse[0] does not: its backup feeds them
    assert 1 not in second["region"] and {4, 5, 6} <= set(second["region"]), report
    assert report["whole_restarts"] == [] and report["attempts"] == 1, report
    on, off = report["buffering"]
    assert on["on"] and not off["on"] and off["freed_bytes"] > 0, report
    backups = report["backups"]
    assert backups["other_bytes_logged"] > 0 and backups["other_bytes_kept"] == 0, report
