"""Correlated-failure drills on a simulated three-node Ray cluster, run as their own
process: the test session shares one single-node Ray, and a simulated cluster needs a
driver of its own. `test_progressive_recovery` runs this and reads the JSON line it
prints last.

1. The scenario of `bastion.bench.correlated` under progressive recovery: two nodes
   lost, three nodes arriving one by one; the drill verdict must be exactly once.
2. The same drill with a deliberately broken runtime: held channels drop the data
   they should hold (the parse function breaks the worker it runs in, on its first
   record; every upstream of a held channel runs it). The verdict must say records
   were lost.

Both keep 4 held frames per channel in memory, so that held frames are spilled.

With ``--shape low_priority_hit`` it runs instead the scenario where the same loss
hits only the lowest-priority query (`test_correlated_regional`): progressive
recovery, and per query what its sink received over the run (the job master's
per-query timeline) beside what it committed.

With ``--shape relayed`` (`test_adaptive_buffering`): a second wave whose restored
tasks are fed by a task that is not a source, out of the backup the burst turned on.

With ``--shape second_wave`` (`test_adaptive_buffering`): the scenario's burst
leaves every lost task pending; the first node to arrive brings ``alerts`` back, and
its worker is then killed — a second wave while ``per_auction`` and ``per_bidder``
still wait — before the last node arrives. What it prints: the verdict, the plans,
any restart of the whole job and why, and when adaptive buffering turned on and off.

    python tests/correlated_drill.py STORAGE_DIR [--shape low_priority_hit|second_wave|relayed]
"""

from __future__ import annotations

import json
import sys


RECORDS = 18_000


def drop_what_pending_tasks_miss() -> None:
    """A broken adaptive buffer: a held channel drops the data frames it should hold
    (before they are numbered, so the receiver waits for no gap: the records are
    simply never processed), keeping only control records (barriers, end of
    stream)."""
    from bastion.runtime.channel import HeldOutputChannel, OutputChannel
    from bastion.runtime.records import Batch, Watermark

    if getattr(HeldOutputChannel, "broken", False):
        return

    async def send(self, frame):
        if not self.attached and all(type(e) in (Batch, Watermark) for e in frame):
            self.frames_held += 1  # counted as held, never sent
            return
        await OutputChannel.send(self, frame)

    HeldOutputChannel.send = send
    HeldOutputChannel.broken = True


def breaking_parse(bid):
    """`parse`, breaking the worker's held channels the first time it runs there."""
    from bastion.bench.correlated import parse

    drop_what_pending_tasks_miss()
    return parse(bid)


def summary(report) -> dict:
    return {
        "exactly_once": report.exactly_once, "lost": report.lost,
        "duplicated": report.duplicated,
        "progressed": [e["queries"] for e in report.events
                       if e["kind"] in ("recovery_planned", "recovery_progressed")
                       and e.get("queries")],
        "available_again_s": {name: q["available_again_s"]
                              for name, q in report.metrics.extra["queries"].items()},
        "frames_held": report.metrics.extra["frames_held"],
        "frames_spilled": report.metrics.extra["frames_spilled"],
        "nodes_added_nice": [e.get("nice") for e in report.events
                             if e["kind"] == "node_added"],
    }


def unhit(storage_dir: str) -> None:
    """Only ``per_bidder`` hit: what each query's sink received and committed, and
    when, around the failure."""
    from bastion.bench import correlated

    shape = "low_priority_hit"
    reference = correlated.references(shape, storage_dir=storage_dir, records=RECORDS)
    # The nodes' loss is seen from their workers' deaths; the scenario's heartbeat
    # timeout (`correlated.HEARTBEAT_TIMEOUT_S`) lets a busy survivor stay silent
    # for a while: counted as lost, it would restart the queries this drill watches
    # keep running.
    # A catch-up is never cut short here: the lowered worker gets its priority back
    # only once its tasks' backlog was replayed, which the test checks.
    report = correlated.run_case(correlated.Case("progressive", "staggered", shape),
                                 reference=reference, storage_dir=storage_dir,
                                 records=RECORDS, catch_up_max_s=600.0)
    detected = next(e["t_s"] for e in report.events if e["kind"] == "failure_detected")
    # when per_bidder's tasks were given capacity again (planned at the failure, or
    # on a node's arrival)
    back = max(e["t_s"] for e in report.events
               if e["kind"] in ("recovery_planned", "recovery_progressed") and e.get("queries"))
    queries = report.metrics.extra["queries"]
    print(json.dumps({
        "exactly_once": report.exactly_once, "lost": report.lost,
        "duplicated": report.duplicated, "corrupted": report.corrupted,
        "restarted": [e.get("region") for e in report.events if e["kind"] == "restarted"],
        "received": {name: sum(n for _, n, _ in q["timeline"]) for name, q in queries.items()},
        "received_while_down": {name: sum(n for t, n, _ in q["timeline"]
                                          if detected < t < back)
                                for name, q in queries.items()},
        "committed": {name: len(report.outputs[name]) for name in queries},
        # when each query was available again (seconds since the job started)
        "available_at": {name: None if q["available_again_s"] is None
                         else detected + q["available_again_s"]
                         for name, q in queries.items()},
        # a worker hosting only recovering tasks catches up at the lowest priority
        "catch_up": [{k: e.get(k) for k in ("kind", "t_s", "tasks", "priority",
                                                        "reason")}
                     for e in report.events if e["kind"].startswith("catch_up_")],
        "events": [{k: e.get(k) for k in ("kind", "t_s", "reason", "region", "lost", "checkpoint_id",
                                          "pending", "queries")}
                   for e in report.events if e["kind"] in (
                       "failure_detected", "losses_grouped", "recovery_planned",
                       "restarted", "recovery_progressed", "checkpoint_aborted",
                       "checkpoint_completed")],
    }))


def second_wave(storage_dir: str) -> None:
    """A burst, then a second wave while tasks wait for capacity, with a checkpoint
    completed before the burst: a region restarts at each wave. (Without one, the
    job restarts whole and says why: `test_adaptive_buffering` shows that on the
    session's Ray, without a simulated cluster of its own.)"""
    import bastion as bn
    from bastion.bench import correlated

    records = 20_000
    reference = correlated.references(storage_dir=storage_dir, records=records)
    at_s = correlated.FAILURE_AT_S
    faults = [bn.faults.KillNode(1, at=at_s), bn.faults.KillNode(2, at=at_s + 0.2),
              # 4 slots: alerts comes back on a worker of its own, worker 1 (the
              # survivor of node 0 is worker 0)...
              bn.faults.AddNode(at=at_s + 1.0, cpus=correlated.NODE_CPUS),
              # ...which is lost while per_auction and per_bidder wait (a node boots,
              # and a worker starts on it, in 2-5 s on two busy cores; a kill of a
              # worker that does not exist yet does not land, and the verdict says so)
              bn.faults.KillWorker(1, at=at_s + 7.0),
              bn.faults.AddNode(at=at_s + 9.0, cpus=correlated.NODE_CPUS)]
    with correlated.simulated_cluster() as cluster:
        report = bn.drill(correlated.topology(records),
                          protocol=bn.protocols.Coordinated(interval_s=0.5),
                          faults=faults,
                          cluster=cluster, storage=f"local://{storage_dir}",
                          data_plane=bn.DataPlane(buffer_timeout_ms=50.0), workers=3,
                          reference=reference,
                          recovery=bn.Recovery(policy=bn.RecoveryPolicy(mode="progressive",
                                                     task_slots_per_cpu=1.0), heartbeat_timeout_s=correlated.HEARTBEAT_TIMEOUT_S))
    print(json.dumps({"regional": summary_of(report)}))


def word(i: int) -> str:
    return f"w{i % 50}"


def tag(w: str) -> str:
    return w + "!"


def count_word(acc: int, _w: str) -> int:
    return acc + 1


def relayed_topology(records: int, rate: float | None = 1000.0) -> "bn.Topology":
    """A source feeding ``parse`` (3 instances, not sources), which feeds a keyed
    count: query ``counts`` (priority 3); and ``tags``, a map straight off the source
    (priority 1). On three workers: worker 0 runs the source and instance 0 of
    everything, workers 1 and 2 instances 1 and 2. ``rate=None``: unpaced, for the
    reference (no function reads the clock: the pace changes no record)."""
    import bastion as bn

    topo = bn.Topology("relayed")
    words = topo.source("words", bn.sources.Generator(word, count=records, rate=rate))
    words.map("parse", str.upper, parallelism=3).key_by(lambda w: w) \
        .reduce("count", count_word, initial=0, parallelism=3).sink("counts", bn.sinks.Collect())
    words.map("tag", tag, parallelism=3).sink("tags", bn.sinks.Collect())
    topo.query("counts", ["counts"], priority=3)
    topo.query("tags", ["tags"], priority=1)
    return topo


def relayed(storage_dir: str) -> dict:
    """A second wave fed from a backup the burst turned on: nodes 1 and 2 are lost,
    node 0's 4 slots are all taken, so every lost task waits, and so does parse[0]
    (restarted with them: it keeps no backup in normal operation). A 4-slot node
    brings ``counts`` back — parse[0] joins on worker 0, parse and count [1] and [2]
    on worker 1, built together, buffering on — and worker 1 is then lost while
    ``tags`` still waits: the second wave's region is parse[1], parse[2] and the
    counts, and parse[0], which runs on, sends the counts again out of the backup it
    keeps only because the burst turned buffering on. (Without that backup the
    restored counts wait for ever for the frames parse[0] does not send again: the
    run hangs rather than losing records, so no broken variant is drilled here.)"""
    import bastion as bn
    from bastion.bench import correlated
    from bastion.drills import reference_runs

    records = 20_000
    with correlated.simulated_cluster():
        reference = reference_runs(relayed_topology(records, rate=None),
                                   storage=f"local://{storage_dir}",
                                   data_plane=bn.DataPlane(buffer_timeout_ms=50.0),
                                   workers=3)
    at_s = correlated.FAILURE_AT_S
    faults = [bn.faults.KillNode(1, at=at_s), bn.faults.KillNode(2, at=at_s + 0.2),
              bn.faults.AddNode(at=at_s + 1.0, cpus=correlated.NODE_CPUS),
              bn.faults.KillWorker(1, at=at_s + 7.0),
              bn.faults.AddNode(at=at_s + 9.0, cpus=correlated.NODE_CPUS)]
    with correlated.simulated_cluster() as cluster:
        report = bn.drill(relayed_topology(records),
                          protocol=bn.protocols.Coordinated(interval_s=0.5),
                          faults=faults, cluster=cluster,
                          storage=f"local://{storage_dir}",
                          data_plane=bn.DataPlane(buffer_timeout_ms=50.0),
                          workers=3, reference=reference,
                          recovery=bn.Recovery(policy=bn.RecoveryPolicy(mode="progressive",
                                                     task_slots_per_cpu=1.0), heartbeat_timeout_s=correlated.HEARTBEAT_TIMEOUT_S))
    return summary_of(report)


def summary_of(report) -> dict:
    fields = ("t_s", "lost_tasks", "region", "recover", "pending", "queries",
              "second_wave", "waiting")
    return {
        "exactly_once": report.exactly_once, "verdict": report.verdict_reason,
        "corrupted": report.corrupted, "lost": report.lost,
        "duplicated": report.duplicated, "attempts": report.metrics.extra["attempts"],
        "planned": [{k: e.get(k) for k in fields} for e in report.events
                    if e["kind"] == "recovery_planned"],
        "progressed": [{k: e.get(k) for k in ("t_s", "joining", "queries")}
                       for e in report.events if e["kind"] == "recovery_progressed"],
        "whole_restarts": [{k: e.get(k) for k in ("reason", "second_wave", "pending")}
                           for e in report.events if e["kind"] == "whole_restart"],
        "buffering": [{k: e.get(k) for k in ("t_s", "on", "reason", "freed_bytes")}
                      for e in report.events if e["kind"] == "adaptive_buffering"],
        "backups": next((e for e in report.events
                         if e["kind"] == "upstream_backups"), {}),
    }


def main(storage_dir: str) -> None:
    from bastion.bench import correlated
    from bastion.report import write_html

    # 18 s of bids: the last query is back by then; every record is compared
    reference = correlated.references(storage_dir=storage_dir, records=RECORDS)
    case = correlated.Case("progressive", "staggered")
    # 4 frames a channel in memory: held frames are spilled to the store
    good = correlated.run_case(case, reference=reference, storage_dir=storage_dir,
                               records=RECORDS, held_frames_in_memory=4)
    broken = correlated.run_case(case, reference=reference, storage_dir=storage_dir,
                                 records=RECORDS, held_frames_in_memory=4,
                                 parse_fn=breaking_parse)
    page = write_html(good, f"{storage_dir}/report.html", compared={"broken": broken})
    text = page.read_text()
    print(json.dumps({"progressive": summary(good), "broken": summary(broken),
                      "report_plots": [alt for alt in ("relative latency per query",
                                                       "available queries over time",
                                                       "Recoveries compared")
                                       if alt in text]}))


if __name__ == "__main__":
    if sys.argv[2:] == ["--shape", "low_priority_hit"]:
        unhit(sys.argv[1])
    elif sys.argv[2:] == ["--shape", "second_wave"]:
        second_wave(sys.argv[1])
    elif sys.argv[2:] == ["--shape", "relayed"]:
        print(json.dumps(relayed(sys.argv[1])))
    else:
        main(sys.argv[1])
