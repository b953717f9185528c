"""Tuple-level redundancy: copies on the next instance, the first copy wins.

Through the public API on real Ray workers:

- copies change no result: failure-free runs with every tuple copied commit what plain
  Python computes, across fan-out (flat_map, broadcast), a union, a keyed running
  count (the replica keeps the replicated keys' state) and a keyed window join —
  under ``none`` and under ``acks`` in both modes; the copies were made and dropped;
- a drill under timing faults with copies finds nothing lost and nothing duplicated,
  and the verdict can fail: receivers that forget ids at once let copies through, and
  the drill reports them;
- the fine acknowledgments complete a root on the first copy, the XOR ones wait for
  every copy (unit level, on real protocol objects);
- ``redundancy="auto"`` decides from the latency it sees and tells the workers;
- what cannot take copies is refused before anything runs, naming the operator.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import permutations

import pytest

import bastion as bn
from bastion.errors import TopologyError
from bastion.lineage import IdRun, path_token
from bastion.protocols.acks import AcksTask, _channel_salt
from bastion.runtime.plan import REBALANCE, build_plan
from bastion.runtime.redundancy import FirstCopies, resolve

from test_acks import expected, pipeline

pytestmark = pytest.mark.usefixtures("ray_session")


def copies(result: bn.RunResult) -> dict:
    return result.metrics.extra["redundancy"]


# -- results are those of a run without copies -------------------------------------------------


@pytest.mark.parametrize("protocol, mode", [("none", None), ("acks", "fine"), ("acks", "xor")])
def test_copies_change_no_result_across_fan_out_broadcast_and_union(protocol, mode, tmp_path):
    if mode is not None:
        # no root may time out: its replay would duplicate, which this test forbids
        protocol = bn.protocols.Acks(mode=mode, interval_s=0.2, timeout_s=120.0)
    result = bn.run(pipeline(), protocol=protocol, redundancy=1.0,
                    storage=f"local://{tmp_path}")
    assert {sink: Counter(values) for sink, values in result.outputs.items()} == expected()
    made = copies(result)
    assert set(made["ratios"]) == {"score", "pairs", "tag", "odd", "even", "both", "total"}
    assert made["copies_sent"] > 0 and made["copies_dropped"] > 0
    # every tuple crossed twice into each copying operator: more tuples were sent
    assert result.metrics.extra["records_sent"] > 2 * 4000
    if protocol == "acks":
        counters = result.metrics.extra["protocol_counters"]
        assert counters["roots_completed"] == 4000 and counters["roots_pending"] == 0
        complete = result.metrics.extra["protocol_latency_ms"]["complete_latency"]
        assert 0 < complete["p50"] <= complete["p99"]   # Storm's complete latency


def words(i: int) -> str:
    return f"w{i % 11} w{i % 5} w{(i * 7) % 13}"


def test_a_replica_keeps_the_state_of_the_keys_it_copies(tmp_path):
    """A keyed running count behind a copied edge: each key's replica sees every tuple
    of the key, in the order of the one upstream instance, so its counts are the
    primary's and the first copy of each result is right."""
    count = 3000
    topo = bn.Topology("copied-count")
    lines = topo.source("lines", bn.sources.Generator(words, count=count))
    lines.flat_map("split", str.split).key_by(lambda w: w).reduce(
        "count", lambda n, w: n + 1, initial=0, parallelism=3).map(
        "pair", lambda n: n, parallelism=1).sink("out", bn.sinks.Collect())
    result = bn.run(topo, redundancy={"count": 2.0}, storage=f"local://{tmp_path}",
                    lineage=True)
    seen: Counter = Counter()
    running = []
    for i in range(count):
        for w in words(i).split():
            seen[w] += 1
            running.append((w, seen[w]))
    assert Counter(map(tuple, result.outputs["out"])) == Counter(running)
    # ratio 2.0 on three instances: every key has a replica on +1 and +2
    assert copies(result)["copies_sent"] == 2 * len(running)
    assert copies(result)["copies_dropped"] == 2 * len(running)
    assert result.warnings == []


def test_copies_into_a_keyed_window_join_meet_again(tmp_path):
    count = 400
    topo = bn.Topology("copied-join")
    orders = topo.source("orders", bn.sources.Generator(
        lambda i: {"user": i % 7, "order": i, "ts": i * 0.01}, count=count),
        timestamp=lambda o: o["ts"])
    pays = topo.source("pays", bn.sources.Generator(
        lambda i: {"user": (i * 3) % 7, "pay": i, "ts": i * 0.01 + 0.004}, count=count),
        timestamp=lambda p: p["ts"])
    orders.key_by(lambda o: o["user"]).join(
        pays.key_by(lambda p: p["user"]), "match", window=bn.windows.Tumbling(0.5),
        parallelism=2).map("ids", lambda t: (t[1]["order"], t[2]["pay"]), parallelism=2
                           ).sink("out", bn.sinks.Collect())
    result = bn.run(topo, redundancy=1.5, storage=f"local://{tmp_path}")
    # two instances: the half of the tuples due a second copy get one copy only
    assert any("redundancy 1.5 for operator 'match': a second extra copy needs three "
               "instances, and it has 2" in w for w in result.warnings), result.warnings
    brute = Counter()
    for o in range(count):
        for p in range(count):
            same_window = int(o * 0.01 // 0.5) == int((p * 0.01 + 0.004) // 0.5)
            if o % 7 == (p * 3) % 7 and same_window:
                brute[(o, p)] += 1
    assert Counter(map(tuple, result.outputs["out"])) == brute
    assert copies(result)["copies_dropped"] > 0


# -- under timing faults, and the verdict can fail ------------------------------------------------


def grep(count: int = 6000, rate: float | None = 3000) -> bn.Topology:
    topo = bn.Topology("copied-grep")
    lines = topo.source("lines", bn.sources.Generator(
        lambda i: f"line {i} {'needle' if i % 3 == 0 else 'hay'}", count=count, rate=rate))
    lines.map("upper", str.upper, parallelism=2).filter(
        "match", lambda s: "NEEDLE" in s, parallelism=2).sink("out", bn.sinks.Collect())
    return topo


STALLS = [bn.faults.Timing("upper", instances=[0], magnitude=bn.faults.Constant(0.2),
                           mtbf_records=600, seed=3)]


def test_a_drill_under_timing_faults_with_copies_loses_and_duplicates_nothing():
    report = bn.drill(grep(), protocol="none", faults=STALLS, redundancy=1.0, seed=1)
    assert report.verdict == "exactly-once", report.verdict_reason
    assert report.comparison.duplicated == 0 and report.comparison.lost == 0
    assert report.metrics.extra["faults_injected"]["stalls"] > 0
    assert report.metrics.extra["redundancy"]["copies_dropped"] > 0


def test_receivers_that_forget_ids_at_once_let_copies_through_and_the_drill_says_so():
    report = bn.drill(grep(), protocol="none", faults=STALLS,
                      redundancy=bn.Redundancy(ratio=1.0, dedup_window_s=1e-9), seed=1)
    assert report.verdict == "violated"
    assert report.comparison.duplicated > 0 and report.comparison.lost == 0


# -- acknowledgments of copies ---------------------------------------------------------------------


class _Chain:
    def op_kinds(self):
        return ["source", "map", "sink"]


class _Source:
    """The little of a task context the acknowledgment bookkeeping uses."""

    def __init__(self):
        self.latencies: dict[str, list[float]] = {}
        self.chain = _Chain()

    def observe_latencies(self, name, latencies_s):
        self.latencies.setdefault(name, []).extend(latencies_s)


def _root_and_copies(mode: str) -> tuple[AcksTask, list]:
    """One root, read by source 0; its tuple went to map instance 0 over channel 1 and,
    as a redundant copy, to map instance 1 over channel 2; each map instance's result
    crossed to the sink over channel 3 or 4. Returns the task and the messages, as
    `AcksTask._report_frame` builds them: [sign, root positions, token]."""
    task = AcksTask(_Source(), mode, ack_timeout_s=5.0, max_pending=10)
    task._register([0], ["v"], [0.0], [0.0])
    root, tup, result = path_token(()), path_token(()), path_token(((1,),))

    def salted(token: int, channel: int | None) -> int:
        return token ^ _channel_salt(channel) if mode == "xor" else token

    # fine mode reports the copy's emission not at all, XOR mode as a tuple of its own
    copy = [[1, [0], salted(tup, 2)]] if mode == "xor" else []
    source = [[1, [0], salted(tup, 1)], *copy, [-1, [0], salted(root, None)]]
    map1 = [[1, [0], salted(result, 4)], [-1, [0], salted(tup, 2)]]
    sink_of_map1 = [[-1, [0], salted(result, 4)]]
    map0 = [[1, [0], salted(result, 3)], [-1, [0], salted(tup, 1)]]
    sink_of_map0 = [[-1, [0], salted(result, 3)]]
    return task, [source, map1, sink_of_map1, map0, sink_of_map0]


@pytest.mark.internal
@pytest.mark.parametrize("mode, complete_after", [("fine", 3), ("xor", 5)])
def test_fine_acks_complete_on_the_first_copy_xor_on_every_copy(mode, complete_after):
    task, messages = _root_and_copies(mode)
    for n, message in enumerate(messages, start=1):
        task.on_acks(message)
        done = 0 not in task.pending
        assert done == (n >= complete_after), (mode, n)
    [complete_s] = task.task.latencies["complete_latency"]   # one root, completed once
    assert complete_s >= 0


@pytest.mark.internal
def test_a_fine_root_completes_when_its_tuples_are_processed_whatever_the_order():
    """Messages from different tasks race: a root completes exactly once the map's and
    the sink's messages are both applied — never before, in any order (the source's
    own message nets nothing then: its tuple has the root's id)."""
    _, messages = _root_and_copies("fine")
    source, map0, sink = messages[0], messages[3], messages[4]
    for order in permutations([source, map0, sink]):
        task, _ = _root_and_copies("fine")
        applied = []
        for message in order:
            task.on_acks(message)
            applied.append(message)
            done = 0 not in task.pending
            assert done == (map0 in applied and sink in applied), order


# -- the resiliency manager in a run -------------------------------------------------------------


def test_auto_redundancy_raises_the_ratio_when_latency_is_over_the_bound(tmp_path):
    """A bound no run can meet (1 ms): every period is over it, so the manager's first
    decision increases the ratio and the workers are told."""
    result = bn.run(grep(count=9000, rate=3000),
                    redundancy=bn.Redundancy(ratio="auto", latency_bound_ms=1.0),
                    storage=f"local://{tmp_path}")
    assert sorted(result.outputs["out"]) == sorted(
        f"LINE {i} NEEDLE" for i in range(0, 9000, 3))
    decisions = copies(result)["decisions"]
    assert decisions and decisions[0]["movement"] == "increase"
    assert decisions[0]["ratio"] > 0
    changed = [e for e in result.details["events"] if e["kind"] == "redundancy_changed"]
    assert changed and changed[0]["ratio"] == decisions[0]["ratio"]
    assert copies(result)["copies_sent"] > 0   # the routers followed the new ratio


def hidden_latencies(faults: list, tmp_path) -> list[float]:
    """The late copies' p90 each period of a run that keeps every tuple copied (the
    margin holds the ratio), as the resiliency manager was given it."""
    # a margin of all but 1 ms of the bound: every period holds
    policy = bn.ResiliencyPolicy(latency_bound_ms=1e4, initial_ratio=1.0, max_ratio=1.0,
                                 perf_margin=0.9999)
    result = bn.run(grep(count=12_000, rate=3000),
                    redundancy=bn.Redundancy(ratio="auto", policy=policy),
                    faults=faults, storage=f"local://{tmp_path}")
    assert {d["ratio"] for d in copies(result)["decisions"]} == {1.0}
    return [d["hidden_ms"] for d in copies(result)["decisions"] if d["hidden_ms"] is not None]


def test_the_manager_is_told_the_latency_the_copies_hid(tmp_path):
    """The receivers that drop late copies measure their latency: with one instance
    stalling 300 ms now and then, the copies it sends late show it, although the
    tuples' first copies are on time; without stalls the late copies are not late."""
    stalls = [bn.faults.Timing("upper", instances=[0], magnitude=bn.faults.Constant(0.3),
                               mtbf_s=0.5, seed=3)]
    stalled = hidden_latencies(stalls, tmp_path / "stalled")
    calm = hidden_latencies([], tmp_path / "calm")
    assert stalled and calm
    assert max(stalled) >= 250.0, stalled
    assert sorted(calm)[len(calm) // 2] < 100.0, calm


def test_a_stall_in_progress_raises_the_ratio_before_its_tuples_come_out(tmp_path):
    """One instance stalls 0.6 s on a frame: the job master sees the task on that
    frame at its next progress polls and the manager raises the ratio at once —
    before the period whose window the stalled tuples arrive in. Without the
    stall signal, the first increase waits for a window over the bound."""
    def first_increase(stall_ratio):
        policy = bn.ResiliencyPolicy(latency_bound_ms=100.0, max_ratio=1.0,
                                     stall_ratio=stall_ratio)
        stalls = [bn.faults.Timing("upper", instances=[0], magnitude=bn.faults.Constant(0.6),
                                   mtbf_s=1.5, seed=3)]
        result = bn.run(grep(count=12_000, rate=3000),
                        redundancy=bn.Redundancy(ratio="auto", policy=policy),
                        faults=stalls, storage=f"local://{tmp_path}/{stall_ratio}")
        assert sorted(result.outputs["out"]) == sorted(
            f"LINE {i} NEEDLE" for i in range(0, 12_000, 3))
        ups = [d for d in copies(result)["decisions"] if d["movement"] == "increase"]
        assert ups, copies(result)["decisions"]
        return ups[0], result

    at_once, result = first_increase(1.0)
    assert "at once" in at_once["reason"] and at_once["ratio"] == 1.0, at_once
    assert at_once["latency_ms"] is None            # no window was judged for it
    changed = [e for e in result.details["events"] if e["kind"] == "redundancy_changed"]
    assert changed[0]["reason"] == at_once["reason"]
    waited, _ = first_increase(None)
    assert "at once" not in waited["reason"] and waited["latency_ms"] > 100.0, waited


# -- refused before anything runs ------------------------------------------------------------------


def test_what_cannot_take_copies_is_refused_naming_it():
    topo = grep()
    with pytest.raises(TopologyError, match="'out'.*nothing after a sink"):
        resolve(topo, {"out": 1.0})
    with pytest.raises(TopologyError, match="'lines'.*a source"):
        resolve(topo, {"lines": 0.5})
    with pytest.raises(TopologyError, match="'nope', which is not an operator"):
        resolve(topo, {"nope": 0.5})
    with pytest.raises(ValueError, match=r"redundancy\['upper'\] must be a number from 0.0"):
        resolve(topo, {"upper": 2.5})
    with pytest.raises(ValueError, match="redundancy must be a number"):
        resolve(topo, "always")
    # a number applies to every operator that can take copies, and 0 to none
    assert resolve(topo, 0.5) == {"upper": 0.5, "match": 0.5}
    assert resolve(topo, 0.0) == {}
    with pytest.raises(TopologyError, match="exactly-once protocol"):
        bn.run(topo, protocol="coordinated", redundancy=0.5)
    with pytest.raises(ValueError, match="deterministic"):
        bn.run(topo, redundancy=0.5, deterministic=True)
    with pytest.raises(ValueError, match=r"Redundancy\(dedup_window_s=0.6\) must be shorter than half of Acks\(timeout_s=1\)"):
        bn.run(topo,
               protocol=bn.protocols.Acks(timeout_s=1.0),
               redundancy=bn.Redundancy(ratio=0.5, dedup_window_s=0.6))
    with pytest.raises(ValueError, match="needs latency_bound_ms"):
        bn.run(topo, redundancy="auto")


def test_copying_operators_head_chains_that_end_where_copies_meet_on_id_routed_edges():
    topo = grep()
    plan = build_plan(topo, redundancy={"upper": 1.0})
    # "upper" takes its copies over a channel, and its chain goes on through the
    # stateless "match" — but not into the sink, which must not write both copies
    assert [chain.ops for chain in plan.chains] == [["lines"], ["upper", "match"], ["out"]]
    edges = {(e.src_op, e.dst_op): e for c in plan.chains for e in c.inputs}
    # the copies "upper" takes need not meet: its input keeps dealing whole batches
    assert edges["lines", "upper"].copies == 1.0 and not edges["lines", "upper"].by_id
    assert edges["match", "out"].by_id and edges["match", "out"].copies == 0.0
    # both copying: "match" takes copies of its own, so it heads a chain too, and the
    # forward edge between them becomes one routed by id (copies come from both)
    plan = build_plan(topo, redundancy={"upper": 1.0, "match": 0.5})
    assert [chain.ops for chain in plan.chains] == [["lines"], ["upper"], ["match"], ["out"]]
    edge = [e for c in plan.chains for e in c.inputs if e.src_op == "upper"][0]
    assert (edge.partition, edge.by_id, edge.copies) == (REBALANCE, True, 0.5)
    assert [c.ops for c in build_plan(topo).chains] == [["lines"], ["upper", "match", "out"]]


def test_first_copies_are_remembered_for_one_to_two_windows():
    seen = FirstCopies(window_s=3600)
    run = IdRun(0, 0, (1, 2, 3))
    assert seen.keep(run) is None                       # all new
    assert seen.keep(IdRun(0, 0, (3, 4, 4))) == [1]     # 3 seen; 4 kept once
    assert seen.dropped == 2
    seen.turned_s -= 3600                               # a window has passed
    assert seen.keep(IdRun(0, 0, (5,))) is None         # 1-4 are now the previous ones
    assert seen.keep(IdRun(0, 0, (1,))) == []           # still remembered
    seen.turned_s -= 3600
    assert seen.keep(IdRun(0, 0, (9,))) is None         # 5 is previous; 1-4 forgotten
    assert seen.keep(IdRun(0, 0, (1,))) is None         # ... so 1 passes again
    assert seen.peak_remembered() == 5


def test_bastion_run_takes_redundancy_and_reports_the_copies(tmp_path, capsys):
    from bastion.cli import EXIT_OK, main

    job = tmp_path / "job.py"
    job.write_text('''
import bastion as bn

topology = bn.Topology("cli-copies")
nums = topology.source("nums", bn.sources.Generator(lambda i: i, count=2000))
nums.map("double", lambda i: i * 2, parallelism=2).sink("out", bn.sinks.Collect())
''')
    assert main(["run", str(job), "--storage", f"local://{tmp_path}/store",
                 "--redundancy", "1"]) == EXIT_OK
    out = capsys.readouterr().out
    assert re.search(r"redundancy\s+double 1; 2,000 copies sent, 2,000 repeated\s+arrivals "
                     r"dropped", out), out
    assert max(map(len, out.splitlines())) <= 80, out


def test_a_tuple_with_copies_skips_a_congested_instance_unless_state_needs_it():
    """Into a stateless operator, the router leaves a congested (stalled) instance out
    of a tuple's instances while another can take it, and reports the first instance
    left as the tuple's primary; into a keyed stateful one it never does."""
    from bastion.runtime.instance import Router
    from bastion.runtime.operators import OperatorContext
    from bastion.runtime.plan import EdgePlan, OutputRoute
    from bastion.runtime.records import Batch

    from test_routing import Collecting

    class Stalled(Collecting):
        def congested(self):
            return True

    def route(skips: bool):
        edge = EdgePlan(0, "src", "upper", 0, 1, 0, REBALANCE, None, False, 1.0, True)
        channels = [Stalled(0), Collecting(1)]
        emitted = []
        router = Router(OutputRoute(edge, [0, 1], [0, 1]), channels,
                        OperatorContext("upper", 0, 2, False, 1, True), False,
                        lambda batch, channel_id, copy: emitted.append(
                            (channel_id, copy, len(batch))), skips_congested=skips)
        batch = Batch(None, list(range(100)), [0.0] * 100, [0.0] * 100,
                      IdRun(0, 0, tuple(range(100))))
        router.route(batch)
        return channels, emitted, router

    channels, emitted, router = route(skips=True)
    assert channels[0].records == 0 and channels[1].records == 100
    assert emitted == [(1, False, 100)] and router.sends_skipped == 100
    channels, emitted, router = route(skips=False)
    assert channels[0].records == 100 and channels[1].records == 100   # both, waiting
    assert sum(n for _, copy, n in emitted if not copy) == 100
    assert sum(n for _, copy, n in emitted if copy) == 100 and router.sends_skipped == 0


def test_a_rebalanced_edge_deals_whole_batches_and_sends_only_the_picked_copies_on():
    """Into a copying operator over a rebalanced edge nothing needs a tuple on one
    instance: each batch goes whole to the next instance in turn, as without copies,
    and the tuples whose share is under the ratio go on to the instance after it (a
    second copy two after it above 1.0). A stalled instance is skipped only by the
    tuples that have a copy elsewhere."""
    from bastion.runtime.instance import Router
    from bastion.runtime.operators import OperatorContext
    from bastion.runtime.plan import EdgePlan, OutputRoute
    from bastion.runtime.records import Batch
    from bastion.lineage import record_hashes
    from bastion.runtime.redundancy import copy_shares

    from test_routing import Collecting

    class Stalled(Collecting):
        def congested(self):
            return True

    def router(ratio: float, stalled: int | None = None):
        edge = EdgePlan(0, "src", "upper", 0, 1, 0, REBALANCE, None, False, ratio, False)
        channels = [Stalled(c) if c == stalled else Collecting(c) for c in range(3)]
        sent: list = []
        return Router(OutputRoute(edge, [0, 1, 2], [0, 1, 2]), channels,
                      OperatorContext("upper", 0, 3, False, 1, True), False,
                      lambda batch, channel_id, copy: sent.append(
                          (channel_id, copy, list(batch.values))),
                      skips_congested=True), sent

    def batch(first: int) -> Batch:
        values = list(range(first, first + 200))
        return Batch(None, values, [0.0] * 200, [0.0] * 200, IdRun(0, 0, tuple(values)))

    def share(values: list[int]) -> dict[int, float]:
        return dict(zip(values, copy_shares(record_hashes(IdRun(0, 0, tuple(values))))))

    r, sent = router(1.6)
    for k in range(3):
        r.route(batch(200 * k))
    for k in range(3):
        values = list(range(200 * k, 200 * k + 200))
        mine = [s for s in sent if s[2][0] >= 200 * k and s[2][-1] < 200 * k + 200]
        shares = share(values)
        assert mine[0] == (k, False, values)                 # whole, round-robin
        assert mine[1] == ((k + 1) % 3, True, values)        # every tuple: one copy
        second = [v for v in values if shares[v] < 0.6]
        assert mine[2] == ((k + 2) % 3, True, second) and 80 < len(second) < 160
    assert r.copies_sent == sum(len(values) for _, copy, values in sent if copy)

    r, sent = router(0.5, stalled=0)    # the first batch's primary is stalled
    r.route(batch(0))
    shares = share(list(range(200)))
    with_copy = [v for v in range(200) if shares[v] < 0.5]
    assert sent == [(0, False, [v for v in range(200) if v not in with_copy]),
                    (1, False, with_copy)]
    assert r.sends_skipped == len(with_copy) and r.copies_sent == 0
