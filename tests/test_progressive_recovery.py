"""Progressive, query-centric recovery (`bastion.scheduler.recovery`): the planners
against brute force, the burst grouping of the failure detector, the held channels of
adaptive buffering, the per-query availability metric, and runs through ``bn.run``
on the session's Ray. The multi-node drills (nodes lost and added on a simulated
cluster) run in their own driver: `correlated_drill.py`, from the slow test below."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import bastion as bn
from bastion.bench import correlated
from bastion.runtime.channel import HeldOutputChannel, OutputChannel
from bastion.runtime.metrics import query_availability
from bastion.runtime import priority
from bastion.runtime.plan import build_plan
from bastion.scheduler.detector import CorrelatedFailures
from bastion.scheduler.recovery import (BlockingRecovery, Capacity, ProgressiveRecovery,
                                        QueryNeeds, RecoveryPlan, RecoveryPlanError,
                                        check_plan, profit_densities, queries_needs)
from bastion.storage import CorruptBlobError, open_store


# -- the planners ---------------------------------------------------------------------


def scenario_queries() -> list[QueryNeeds]:
    """The correlated scenario's queries over its 12 tasks: chain 0 (bids+parse)
    is tasks 0-2 and shared; alerts, per_auction, per_bidder own 3 tasks each."""
    shared = {0, 1, 2}
    return [QueryNeeds("alerts", 3, frozenset(shared | {3, 4, 5})),
            QueryNeeds("per_auction", 2, frozenset(shared | {6, 7, 8})),
            QueryNeeds("per_bidder", 1, frozenset(shared | {9, 10, 11}))]


LOST = [1, 2, 4, 5, 7, 8, 10, 11]  # instances 1 and 2 of every chain


def brute_density(query: QueryNeeds, hit: list[QueryNeeds], lost: set[int]) -> float:
    """Su & Zhou's profit density, from its definition: the priority over the lost
    tasks the query needs, each weighted by one over the number of hit queries that
    need it."""
    cost = 0.0
    for task in query.tasks:
        if task in lost:
            cost += 1.0 / len([q for q in hit if task in q.tasks])
    return float("inf") if cost == 0 else query.priority / cost


def test_profit_density_matches_its_definition():
    queries = scenario_queries()
    densities = profit_densities(queries, set(LOST))
    for q in queries:
        assert densities[q.name] == pytest.approx(brute_density(q, queries, set(LOST)))
    # the shared parse tasks count a third each: 3 / (2/3 + 2)
    assert densities["alerts"] == pytest.approx(3 / (2 / 3 + 2))


@pytest.mark.parametrize("free,picked", [
    (0, []), (3, []), (4, ["alerts"]), (6, ["alerts", "per_auction"]),
    (8, ["alerts", "per_auction", "per_bidder"]), (None, ["alerts", "per_auction",
                                                          "per_bidder"])])
def test_progressive_recovers_whole_queries_by_density_as_slots_allow(free, picked):
    plan = ProgressiveRecovery().plan(LOST, scenario_queries(), Capacity(free))
    check_plan(plan, LOST, free)
    assert list(plan.queries) == picked
    recovered = set().union(*[q.tasks for q in scenario_queries() if q.name in picked]) \
        & set(LOST)
    assert set(plan.recover) == recovered


@pytest.mark.parametrize("free", [0, 4, 7, 8, None])
def test_blocking_recovers_all_or_nothing(free):
    plan = BlockingRecovery().plan(LOST, scenario_queries(), Capacity(free))
    check_plan(plan, LOST, free)
    if free is not None and free < len(LOST):
        assert plan.recover == () and sorted(plan.pending) == LOST
    else:
        assert sorted(plan.recover) == LOST and plan.pending == ()


def random_instance(rng: random.Random) -> tuple[list[QueryNeeds], list[int], int]:
    tasks = list(range(rng.randint(3, 9)))
    queries = [QueryNeeds(f"q{i}", rng.choice([1, 2, 3, 5]),
                          frozenset(rng.sample(tasks, rng.randint(1, len(tasks)))))
               for i in range(rng.randint(1, 5))]
    lost = sorted(rng.sample(tasks, rng.randint(1, len(tasks))))
    return queries, lost, rng.randint(0, len(lost))


def check_greedy_by_density(planner, queries, lost, free) -> None:
    """What a progressive plan must be, checked by brute force: within the slots,
    only whole queries, each pick the densest query that still fits (densities over
    what is still lost), and nothing more fits at the end."""
    plan = planner.plan(lost, queries, Capacity(free))
    check_plan(plan, lost, free)
    remaining, left = set(lost), free
    waiting = [q for q in queries if q.tasks & set(lost)]
    for name in plan.queries:
        fits = [q for q in waiting if len(q.tasks & remaining) <= left]
        best = max(brute_density(q, waiting, remaining) for q in fits)
        chosen = next(q for q in waiting if q.name == name)
        assert len(chosen.tasks & remaining) <= left, f"{name} did not fit"
        assert brute_density(chosen, waiting, remaining) == pytest.approx(best), \
            f"{name} was picked over a denser query that fit"
        left -= len(chosen.tasks & remaining)
        remaining -= chosen.tasks
        waiting.remove(chosen)
    assert set(plan.recover) == set(lost) - remaining
    assert not [q for q in waiting if len(q.tasks & remaining) <= left], \
        "a query that still fits was left out"


def test_progressive_plans_are_greedy_by_density_on_random_instances():
    rng = random.Random(7)
    for _ in range(300):
        check_greedy_by_density(ProgressiveRecovery(), *random_instance(rng))


class ByLowestPriority(ProgressiveRecovery):
    """A deliberately wrong planner: it recovers the least valuable query first."""

    def plan(self, lost_tasks, queries, capacity):
        return super().plan(lost_tasks, [QueryNeeds(q.name, 1.0 / q.priority, q.tasks)
                                         for q in queries], capacity)


def test_the_density_check_catches_a_planner_that_picks_the_wrong_query():
    with pytest.raises(AssertionError, match="denser query"):
        check_greedy_by_density(ByLowestPriority(), scenario_queries(), LOST, 4)


@pytest.mark.parametrize("plan,complaint", [
    (RecoveryPlan(recover=(1,), pending=()), "decides on tasks [1], but the lost tasks are [1, 2]"),
    (RecoveryPlan(recover=(1, 2), pending=(2,)), "decides on tasks [1, 2, 2]"),
    (RecoveryPlan(recover=(1, 2), pending=()), "recovers 2 tasks on 1 free task slots"),
])
def test_a_plan_the_job_master_cannot_carry_out_is_refused(plan, complaint):
    with pytest.raises(RecoveryPlanError) as refused:
        check_plan(plan, [1, 2], 1)
    assert complaint in str(refused.value)


def test_query_needs_are_the_tasks_upstream_of_the_outputs():
    topo = correlated.topology(100, None, "low_priority_hit")
    plan = build_plan(topo, workers=3)
    upstream = {name: [i.upstream for i in node.inputs] for name, node in topo.nodes.items()}
    tasks_of_op = {op: [t.task_id for t in plan.tasks if t.chain_id == c.chain_id]
                   for c in plan.chains for op in c.ops}
    needs = {q.name: q for q in queries_needs(
        {q.name: (q.priority, q.outputs) for q in topo.queries.values()},
        ["alerts", "per_auction", "per_bidder"], upstream, tasks_of_op)}
    # brute force: an operator is needed when some path leads from it to the output
    for name, query in needs.items():
        def reaches(op, target=name):
            return op == target or any(reaches(d) for d in topo.nodes
                                       if op in upstream[d])
        expected = {t for op in topo.nodes if reaches(op) for t in tasks_of_op[op]}
        assert query.tasks == frozenset(expected)
    assert needs["alerts"].priority == 3
    assert len(needs["per_bidder"].tasks) == 1 + 3  # the bids+parse chain, 3 bidders


def test_a_sink_outside_every_query_is_a_query_of_its_own():
    needs = queries_needs({}, ["a", "b"], {"a": ["src"], "b": ["src"], "src": []},
                          {"src": [0], "a": [1], "b": [2]})
    assert sorted((q.name, q.priority, sorted(q.tasks)) for q in needs) == [
        ("a", 1.0, [0, 1]), ("b", 1.0, [0, 2])]


# -- correlated failures -----------------------------------------------------------------


def test_losses_within_the_window_are_one_correlated_failure():
    bursts = CorrelatedFailures(burst_losses=2, burst_window_s=1.0)
    bursts.add(10.0, ["node a"])
    assert not bursts.correlated() and bursts.window_open(10.5)
    bursts.add(10.6, ["node a", "node b"])   # node a again: counted once
    assert bursts.correlated()
    assert [n for _, n in bursts.losses] == ["node a", "node b"]


def test_losses_further_apart_than_the_window_are_not():
    bursts = CorrelatedFailures(burst_losses=2, burst_window_s=1.0)
    bursts.add(10.0, ["worker 1"])
    assert not bursts.window_open(11.2)
    bursts.add(11.2, ["worker 2"])
    assert not bursts.correlated()
    three = CorrelatedFailures(burst_losses=3, burst_window_s=5.0)
    three.add(0.0, ["node a", "node b"])
    assert not three.correlated()
    three.add(1.0, ["worker 4"])
    assert three.correlated()


def test_recovery_policy_refuses_bad_settings():
    for bad, field in [({"mode": "sideways"}, "mode"), ({"burst_losses": 0}, "burst_losses"),
                       ({"burst_window_s": -1}, "burst_window_s"),
                       ({"task_slots_per_cpu": 0}, "task_slots_per_cpu"),
                       ({"held_frames_in_memory": 0}, "held_frames_in_memory"),
                       ({"upstream_backups": "sometimes"}, "upstream_backups")]:
        with pytest.raises(ValueError, match=f"RecoveryPolicy.{field}"):
            bn.RecoveryPolicy(**bad)


def test_add_node_needs_a_simulated_cluster_and_whole_cpus():
    topo = correlated.topology(10, None)
    with pytest.raises(ValueError, match="cluster=ray.cluster_utils.Cluster"):
        bn.run(topo, faults=[bn.faults.AddNode(at=1.0, cpus=2)])
    with pytest.raises(ValueError, match="AddNode: cpus must be an int >= 1"):
        bn.run(topo, faults=[bn.faults.AddNode(at=1.0, cpus=0)], cluster=object())
    with pytest.raises(ValueError, match="recovery must be 'blocking', 'progressive'"):
        bn.run(topo, recovery=3)


# -- adaptive buffering ----------------------------------------------------------------


class Recorder(OutputChannel):
    """A channel's transport that records what reaches it."""

    def __init__(self):
        super().__init__(0, 10, 0.0)
        self.received: list[tuple[int, bytes]] = []

    async def transmit(self, seq, payload):
        self.received.append((seq, payload))


def held_channel(tmp_path, in_memory=3) -> tuple[HeldOutputChannel, object]:
    store = open_store(f"local://{tmp_path}")
    return HeldOutputChannel(7, 10, 0.0, None, in_memory, store, "jobs/j/held/1/7"), store


def test_held_frames_spill_and_arrive_in_order_once_attached(tmp_path):
    async def scenario():
        channel, store = held_channel(tmp_path)
        for seq in range(8):
            await channel.transmit(seq, f"frame {seq}".encode())
        assert channel.frames_spilled == 6 and len(store.list("jobs/j/held/")) == 2
        target = Recorder()
        await channel.attach(target)
        await channel.transmit(8, b"frame 8")   # after the attach: forwarded
        return channel, store, target

    channel, store, target = asyncio.run(scenario())
    assert target.received == [(s, f"frame {s}".encode()) for s in range(9)]
    assert store.list("jobs/j/held/") == []    # spilled blobs are gone once sent
    assert channel.frames_held == 8 and channel.attached


def test_a_damaged_spilled_blob_is_detected_not_sent(tmp_path):
    async def scenario():
        channel, store = held_channel(tmp_path, in_memory=2)
        for seq in range(4):
            await channel.transmit(seq, b"x" * 20)
        key = store.list("jobs/j/held/")[0]
        data = bytearray(store.get(key))
        data[-3] ^= 0xFF
        store.put(key, bytes(data))
        target = Recorder()
        with pytest.raises(CorruptBlobError):
            await channel.attach(target)
        return target

    assert asyncio.run(scenario()).received == []


# -- per-query availability ------------------------------------------------------------


def points(series: dict[str, list[tuple[int, float | None]]],
           down: dict[str, set[int]] | None = None) -> list[dict]:
    """Progress points every 0.5 s from the per-query (records, p50 ms) series;
    ``down``: per query, the indexes of the points where some of its tasks waited."""
    length = len(next(iter(series.values())))
    return [{"t_s": 0.5 * i, "queries": {q: s[i] for q, s in series.items()},
             "down": sorted(q for q, at in (down or {}).items() if i in at)}
            for i in range(length)]


def test_availability_from_relative_latency_and_output():
    quiet = [(0, None)] * 6
    series = {
        # 4 points before the failure at 2.0 (baseline 10 ms), silent, then slow
        # (relative latency 5, then 1.5) and back to normal at t = 6.0
        "hit": [(5, 10.0)] * 4 + quiet + [(9, 50.0), (9, 15.0), (5, 11.0), (5, 10.0)],
        # never interrupted, never slow
        "untouched": [(5, 20.0)] * 14,
        # never back: its output stops at the failure
        "gone": [(5, 10.0)] * 4 + [(0, None)] * 10,
        # hit, but a partition outside the restarted region kept producing, at its
        # usual latency, while the others waited for capacity until t = 5.0
        "partial": [(5, 10.0)] * 14,
    }
    result = query_availability(points(series, down={"partial": set(range(4, 10))}),
                                {"hit": 3, "untouched": 2, "gone": 1, "partial": 1},
                                failed_at_s=2.0, restarted_at_s=2.2)
    hit, untouched, gone = result["hit"], result["untouched"], result["gone"]
    # available once every task runs again, not while part of it produces
    assert result["partial"].available_again_s == pytest.approx(5.0 - 2.0)
    assert result["partial"].max_relative_latency == pytest.approx(1.0)
    assert hit.baseline_latency_ms == 10.0
    assert hit.available_again_s == pytest.approx(6.0 - 2.0)
    assert hit.max_relative_latency == pytest.approx(5.0)
    assert hit.longest_silence_s == pytest.approx(5.0 - 2.0)  # silent from the failure
    assert untouched.available_again_s == pytest.approx(2.5 - 2.0)
    assert untouched.max_relative_latency == pytest.approx(1.0)
    assert gone.available_again_s is None and gone.max_relative_latency is None


# -- through bn.run, on the session's Ray ----------------------------------------------

WORDS = ["ant", "bee", "cat", "dog", "eel"]


def counting(count: int, rate: float) -> bn.Topology:
    topo = bn.Topology("policy")
    topo.source("words", bn.sources.Generator(lambda i: WORDS[i % len(WORDS)], count=count,
                                              rate=rate)) \
        .key_by(lambda w: w).reduce("count", lambda acc, _: acc + 1, initial=0,
                                    parallelism=2).sink("out", bn.sinks.Collect())
    return topo


@pytest.mark.usefixtures("ray_session")
def test_with_room_to_spare_a_lost_worker_is_recovered_at_once(tmp_path):
    result = bn.run(counting(3000, 1500), protocol=bn.protocols.Coordinated(interval_s=0.3),
                    storage=f"local://{tmp_path}",
                    recovery=bn.RecoveryPolicy("progressive", task_slots_per_cpu=8),
                    faults=[bn.faults.KillInstance("count", 1, at=1.0)])
    events = {e["kind"]: e for e in result.details["events"]}
    grouped = events["losses_grouped"]
    assert grouped["losses"] == ["worker 1"] and grouped["correlated"] is False
    planned = events["recovery_planned"]
    assert planned["planner"] == "BlockingRecovery"   # one loss: not a burst
    assert planned["recover"] == planned["lost_tasks"] and planned["pending"] == []
    per_word: dict[str, list[int]] = {}
    for word, n in result.outputs["out"]:
        per_word.setdefault(word, []).append(n)
    assert {w: sorted(ns) for w, ns in per_word.items()} == {
        w: list(range(1, 3000 // len(WORDS) + 1)) for w in WORDS}
    assert set(result.metrics.extra["queries"]) == {"out"}


@pytest.mark.usefixtures("ray_session")
def test_tasks_that_never_get_a_slot_fail_the_job_saying_why(tmp_path):
    # two slots per node's CPU... of which the survivors use every one
    with pytest.raises(bn.JobFailedError, match=r"waited 2 s for task slots"):
        bn.run(counting(20_000, 2000), protocol=bn.protocols.Coordinated(interval_s=0.3),
               storage=f"local://{tmp_path}",
               recovery=bn.RecoveryPolicy("progressive", task_slots_per_cpu=0.5,
                                          capacity_timeout_s=2.0),
               faults=[bn.faults.KillInstance("count", 1, at=0.8)])


# -- nodes lost and added: a simulated cluster, in a driver of its own ---------------------


@pytest.mark.internal
@pytest.mark.slow
@pytest.mark.timeout(900)  # three runs of 18 s, each on a cluster of its own
def test_correlated_drills_on_a_simulated_cluster(tmp_path):
    """Progressive recovery of two lost nodes as three nodes arrive: exactly once,
    queries back by priority; and a run whose held frames are lost is caught."""
    script = Path(__file__).with_name("correlated_drill.py")
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=900, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(Path(__file__).resolve().parent.parent)]
                             + [p for p in [os.environ.get("PYTHONPATH")] if p])})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    good, broken = report["progressive"], report["broken"]
    assert good["exactly_once"], good
    assert good["lost"] == 0 and good["duplicated"] == 0
    # queries came back one by one, the most valuable first
    order = [q for e in good["progressed"] for q in e]
    assert order == ["alerts", "per_auction", "per_bidder"], good["progressed"]
    available = good["available_again_s"]
    assert available["alerts"] is not None
    assert all(available["alerts"] <= (t if t is not None else float("inf"))
               for t in available.values())
    assert good["frames_spilled"] > 0
    # the arriving nodes booted below the job's workers (Ray runs those at nice 15)
    assert len(good["nodes_added_nice"]) == 3
    if priority._may_return_to(0):
        assert good["nodes_added_nice"] == [priority.LOWEST_NICE] * 3
    assert not broken["exactly_once"] and broken["lost"] > 0, broken
    assert report["report_plots"] == ["relative latency per query",
                                      "available queries over time", "Recoveries compared"]


# -- the command line ------------------------------------------------------------------


@pytest.mark.parametrize("argv,complaint", [
    (["drill"], "a drill needs a topology FILE, or --scenario correlated"),
    (["drill", "--scenario", "correlated", "job.py"], "--scenario brings its own topology"),
    (["drill", "--scenario", "correlated", "--kill-node", "1@2"],
     "--scenario brings its own topology"),
    (["drill", "--scenario", "correlated", "--address", "auto"], "drop --address"),
    (["drill", "--scenario", "correlated", "--storage", "s3://b/p?endpoint=127.0.0.1:9"],
     "use a local:// --storage"),
])
def test_the_scenario_flag_refuses_what_it_would_ignore(argv, complaint, capsys):
    from bastion.cli import EXIT_USAGE, main

    assert main(argv) == EXIT_USAGE
    assert complaint in capsys.readouterr().err
