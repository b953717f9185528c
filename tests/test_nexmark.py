"""The NexMark generator, the NexMark queries through bn.run against plain-Python
references, and CheckMate's cyclic reachability query."""

from __future__ import annotations

import collections
import math
import random
from decimal import Decimal

import msgpack
import pytest

import bastion as bn
from bastion.bench import nexmark as nx

pytestmark = pytest.mark.usefixtures("ray_session")

RUN_CONFIG = nx.NexmarkConfig(seed=7, events=4000, inter_event_s=0.01, window_s=10.0)
# Skewed, out of order and with small windows: Q12 under CheckMate's skew runs.
SKEW_CONFIG = nx.NexmarkConfig(seed=11, events=4000, inter_event_s=0.01, window_s=2.5,
                               hot_ratio=0.3, disorder_s=0.5)


# -- the generator ------------------------------------------------------------------------


def test_same_seed_same_events_and_other_seed_differs():
    a = nx.events(nx.NexmarkConfig(seed=3, events=2000))
    assert a == nx.events(nx.NexmarkConfig(seed=3, events=2000))
    b = nx.events(nx.NexmarkConfig(seed=4, events=2000))
    # the kind of event i depends only on i; its content on the seed
    assert [e["kind"] for e in a] == [e["kind"] for e in b]
    differing = sum(x != y for x, y in zip(a, b))
    assert differing > 1900


def test_event_is_a_pure_function_of_seed_and_index():
    config = nx.NexmarkConfig(seed=5, events=3000, hot_ratio=0.2, disorder_s=0.3)
    stream = nx.events(config)
    order = list(range(3000))
    random.Random(1).shuffle(order)
    for i in order[:500]:  # random access, in any order, matches sequential generation
        assert config.event(i) == stream[i]
    with pytest.raises(IndexError):
        config.event(3000)
    unbounded = nx.NexmarkConfig(seed=5, events=None, hot_ratio=0.2, disorder_s=0.3)
    assert unbounded.event(2999) == stream[2999]
    assert unbounded.event(10**9)["kind"] in ("person", "auction", "bid")


def test_kinds_follow_the_1_3_46_proportions():
    stream = nx.events(nx.NexmarkConfig(seed=1, events=10_000))
    counts = collections.Counter(e["kind"] for e in stream)
    assert counts == {"person": 200, "auction": 600, "bid": 9200}
    # and they are interleaved in every period of 50, not in blocks
    for start in range(0, 10_000, 50):
        period = collections.Counter(e["kind"] for e in stream[start:start + 50])
        assert period == {"person": 1, "auction": 3, "bid": 46}
    other = nx.events(nx.NexmarkConfig(events=1000, person_proportion=2,
                                       auction_proportion=3, bid_proportion=5))
    assert collections.Counter(e["kind"] for e in other) == {
        "person": 200, "auction": 300, "bid": 500}


@pytest.mark.parametrize("hot_ratio", [0.0, 0.3])
def test_ids_refer_only_to_earlier_persons_and_auctions(hot_ratio):
    config = nx.NexmarkConfig(seed=2, events=10_000, hot_ratio=hot_ratio,
                              active_persons=50, in_flight_auctions=20)
    persons: set[int] = set()
    auctions: set[int] = set()
    for e in nx.events(config):
        if e["kind"] == "person":
            assert e["id"] == nx.FIRST_PERSON_ID + len(persons)  # dense, in order
            persons.add(e["id"])
        elif e["kind"] == "auction":
            assert e["id"] == nx.FIRST_AUCTION_ID + len(auctions)
            assert e["seller"] in persons
            assert nx.FIRST_CATEGORY_ID <= e["category"] < nx.FIRST_CATEGORY_ID + 5
            assert e["reserve"] > e["initial_bid"] > 0 and e["expires"] > e["ts"]
            auctions.add(e["id"])
        else:
            assert e["auction"] in auctions and e["bidder"] in persons
            assert e["price"] >= 100
    assert len(persons) == 200 and len(auctions) == 600


def test_recent_window_keeps_bids_on_in_flight_auctions():
    config = nx.NexmarkConfig(seed=2, events=10_000, in_flight_auctions=20)
    opened = 0
    for e in nx.events(config):
        if e["kind"] == "auction":
            opened += 1
        elif e["kind"] == "bid":
            assert e["auction"] >= nx.FIRST_AUCTION_ID + opened - 20


def test_events_are_plain_msgpack_values():
    for e in nx.events(nx.NexmarkConfig(seed=9, events=500, disorder_s=1.0)):
        assert isinstance(e["kind"], str) and isinstance(e["ts"], float)
        assert all(v is None or type(v) in (str, int, float) for v in e.values()), e
        assert msgpack.unpackb(msgpack.packb(e)) == e


def test_event_time_advances_at_the_configured_rate():
    stream = nx.events(nx.NexmarkConfig(seed=1, events=2000, inter_event_s=0.002))
    assert [e["ts"] for e in stream] == [i * 0.002 for i in range(2000)]


def test_disorder_is_bounded_and_real():
    config = nx.NexmarkConfig(seed=1, events=5000, inter_event_s=0.01, disorder_s=0.5)
    newest = -math.inf
    behind = 0
    for e in nx.events(config):
        assert e["ts"] > newest - 0.5  # never late for a watermark trailing by 0.5 s
        behind += e["ts"] < newest
        newest = max(newest, e["ts"])
    assert behind > 1000  # disorder actually happens
    with pytest.raises(ValueError):
        nx.NexmarkConfig(disorder_s=nx.MAX_OUT_OF_ORDERNESS_S + 0.1)


def _top_share(values: list[int], k: int) -> float:
    counts = collections.Counter(values)
    return sum(n for _, n in counts.most_common(k)) / len(values)


def test_hot_ratio_skews_auctions_bidders_and_sellers():
    shares = {}
    for ratio in (0.0, 0.1, 0.2, 0.3):
        stream = nx.events(nx.NexmarkConfig(seed=4, events=10_000, hot_ratio=ratio))
        bids = [e for e in stream if e["kind"] == "bid"]
        sellers = [e["seller"] for e in stream if e["kind"] == "auction"]
        shares[ratio] = (_top_share([b["auction"] for b in bids], 1),
                         _top_share([b["bidder"] for b in bids], 1),
                         _top_share(sellers, 1))
    for what in range(3):
        series = [shares[r][what] for r in (0.0, 0.1, 0.2, 0.3)]
        assert series == sorted(series) and series[-1] > series[0] + 0.2, (what, series)
        for ratio in (0.1, 0.2, 0.3):
            assert shares[ratio][what] >= ratio - 0.03, (what, ratio, shares[ratio])
    # without skew no auction gets much: bids spread over the in-flight auctions
    assert shares[0.0][0] < 0.05
    # more hot keys spread the same hot share over them
    stream = nx.events(nx.NexmarkConfig(seed=4, events=10_000, hot_ratio=0.3,
                                        hot_auctions=5))
    hot_bids = [e["auction"] for e in stream if e["kind"] == "bid"]
    assert _top_share(hot_bids, 5) >= 0.28 and _top_share(hot_bids, 1) < 0.15


def test_config_rejects_nonsense():
    for bad in (dict(hot_ratio=1.5), dict(hot_ratio=-0.1), dict(inter_event_s=0),
                dict(seed=-1), dict(bid_proportion=0), dict(hot_auctions=0),
                dict(events=-1), dict(window_s=0)):
        with pytest.raises(ValueError):
            nx.NexmarkConfig(**bad)
    with pytest.raises(ValueError):
        nx.events(nx.NexmarkConfig(events=None))


def test_q1_conversion_rounds_half_up_to_the_cent():
    assert nx.to_euro_cents(1000) == 908
    assert nx.to_euro_cents(100) == 91      # 90.8
    assert nx.to_euro_cents(50) == 45       # 45.4
    assert nx.to_euro_cents(125) == 114     # 113.5
    assert nx.to_euro_cents(1) == 1         # 0.908


def test_q3_join_step_waits_for_the_seller():
    person = {"kind": "person", "id": 1, "name": "Kate Smith", "city": "Bend",
              "state": "OR"}
    state, out = nx.q3_join_step(None, {"kind": "auction", "id": 10, "seller": 1})
    assert out == []
    state, out = nx.q3_join_step(state, {"kind": "auction", "id": 11, "seller": 1})
    state, out = nx.q3_join_step(state, person)
    assert out == [("Kate Smith", "Bend", "OR", 10), ("Kate Smith", "Bend", "OR", 11)]
    # state survives a msgpack round trip (checkpoints) and keeps matching
    state = msgpack.unpackb(msgpack.packb(state))
    state, out = nx.q3_join_step(state, {"kind": "auction", "id": 12, "seller": 1})
    assert out == [("Kate Smith", "Bend", "OR", 12)]


# -- the queries through bn.run -------------------------------------------------------------


@pytest.fixture(scope="module")
def query_run():
    """Q1, Q3, Q8 and Q12 (plus Q12 under skew and disorder) side by side in one job:
    the queries share nothing but the topology, and one job costs one deployment."""
    topo = bn.Topology("nexmark")
    sinks = {
        "q1": nx.q1(topo, RUN_CONFIG, bn.sinks.Collect(), parallelism=2),
        "q3": nx.q3(topo, RUN_CONFIG, bn.sinks.Collect(), parallelism=2),
        "q8": nx.q8(topo, RUN_CONFIG, bn.sinks.Collect(), parallelism=2),
        "q12": nx.q12(topo, RUN_CONFIG, bn.sinks.Collect(), parallelism=2),
        "q12-skew": nx.q12(topo, SKEW_CONFIG, bn.sinks.Collect(), parallelism=2,
                           prefix="q12-skew"),
    }
    assert set(topo.queries) == set(sinks)
    result = bn.run(topo)
    return result, {q: result.outputs[name] for q, name in sinks.items()}


def test_queries_lose_nothing_to_lateness_or_errors(query_run):
    result, _ = query_run
    assert result.dead_letters == []


def test_q1_matches_reference(query_run):
    _, outputs = query_run
    expected = []
    for e in nx.events(RUN_CONFIG):
        if e["kind"] == "bid":
            euro = int(Decimal(e["price"]) * Decimal("0.908") + Decimal("0.5"))
            expected.append({**e, "price": euro})
    key = lambda b: (b["ts"], b["auction"], b["bidder"])  # noqa: E731
    assert sorted(outputs["q1"], key=key) == sorted(expected, key=key)


def test_q3_matches_reference(query_run):
    _, outputs = query_run
    stream = nx.events(RUN_CONFIG)
    persons = {e["id"]: e for e in stream if e["kind"] == "person"}
    expected = sorted(
        (persons[a["seller"]]["name"], persons[a["seller"]]["city"],
         persons[a["seller"]]["state"], a["id"])
        for a in stream
        if a["kind"] == "auction" and a["category"] == 10
        and persons[a["seller"]]["state"] in ("OR", "ID", "CA"))
    assert len(expected) >= 10  # the test must have something to join
    assert sorted(outputs["q3"]) == expected


def test_q8_matches_reference(query_run):
    _, outputs = query_run
    stream = nx.events(RUN_CONFIG)
    w = RUN_CONFIG.window_s
    persons = [e for e in stream if e["kind"] == "person"]
    auctions = [e for e in stream if e["kind"] == "auction"]
    expected = {(p["id"], p["name"], math.floor(p["ts"] / w) * w)
                for p in persons for a in auctions
                if a["seller"] == p["id"] and math.floor(a["ts"] / w) == math.floor(p["ts"] / w)}
    assert len(expected) >= 10
    got = outputs["q8"]
    assert len(got) == len(set(got)), "one row per person and window"
    assert set(got) == expected
    # the window matters: some sellers only sold outside the window they joined in
    assert {row[0] for row in expected} < {a["seller"] for a in auctions}


def _q12_reference(config):
    counts = collections.Counter(
        (e["bidder"], math.floor(e["ts"] / config.window_s))
        for e in nx.events(config) if e["kind"] == "bid")
    w = float(config.window_s)
    return sorted((bidder, k * w, k * w + w, n) for (bidder, k), n in counts.items())


def test_q12_matches_reference(query_run):
    _, outputs = query_run
    expected = _q12_reference(RUN_CONFIG)
    assert len({row[1] for row in expected}) == 4  # 40 s of event time, 10 s windows
    assert sorted(outputs["q12"]) == expected


def test_q12_under_skew_and_disorder_matches_reference(query_run):
    _, outputs = query_run
    expected = _q12_reference(SKEW_CONFIG)
    assert sorted(outputs["q12-skew"]) == expected
    total = sum(row[3] for row in expected)
    hot = sum(row[3] for row in expected if row[0] == nx.FIRST_PERSON_ID)
    assert hot / total >= 0.3


# -- the cyclic reachability query ----------------------------------------------------------


def _check_paths(rows, config):
    links, _ = nx.reachability_inputs(config)
    edges = {(link["src"], link["dst"]) for link in links}
    for root, node, path in rows:
        assert path[0] == root and path[-1] == node
        assert len(set(path)) == len(path), f"path {path} revisits a vertex"
        assert all((a, b) in edges for a, b in zip(path, path[1:])), path


def test_reachability_query_is_cyclic_and_validates():
    topo = bn.Topology("reach")
    sink = nx.reachability(topo, nx.ReachabilityConfig(), bn.sinks.Collect(), parallelism=2)
    topo.validate()
    assert topo.has_feedback()
    back = [(node.name, inp) for node in topo.nodes.values() for inp in node.inputs
            if inp.feedback]
    assert len(back) == 1
    to_op, edge = back[0]
    assert (edge.upstream, to_op) == ("reach-project", "reach-join")
    assert edge.key_fn is nx.reach_key and edge.partition == "hash"
    assert topo.nodes[sink].kind == "sink" and topo.queries["reach"].outputs == (sink,)


def test_reach_join_step_pairs_both_ways_and_drops_known_facts():
    fact = {"kind": "reach", "root": 0, "node": 1, "path": (0, 1)}
    link = {"kind": "link", "src": 1, "dst": 2}
    state, out = nx.reach_join_step(None, link)
    assert out == []
    state, out = nx.reach_join_step(state, fact)
    assert out == [("reached", 0, 1, (0, 1)), ("pair", 0, (0, 1), 2)]
    state, out = nx.reach_join_step(state, {"kind": "link", "src": 1, "dst": 3})
    assert out == [("pair", 0, (0, 1), 3)]
    assert nx.reach_join_step(state, link)[1] == []  # a repeated link adds nothing
    again = {"kind": "reach", "root": 0, "node": 1, "path": (0, 4, 1)}
    assert nx.reach_join_step(state, again)[1] == []  # root 0 already reached 1
    other_root = {"kind": "reach", "root": 5, "node": 1, "path": [5, 1]}  # as msgpack gives
    _, out = nx.reach_join_step(msgpack.unpackb(msgpack.packb(state)), other_root)
    assert out[0] == ("reached", 5, 1, (5, 1)) and len(out) == 3
    assert nx.reach_select(("pair", 0, (0, 1, 2), 1)) is False
    assert nx.reach_project(("pair", 0, (0, 1), 2)) == {
        "kind": "reach", "root": 0, "node": 2, "path": (0, 1, 2)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reachability_loop_reaches_the_closure_in_any_interleaving(seed):
    config = nx.ReachabilityConfig(seed=seed, vertices=40, links=90, roots=3)
    links, roots = nx.reachability_inputs(config)
    expected = nx.reachability_reference(config)
    assert len(expected) > 3 * 5  # more than the roots themselves
    mixed = [*links, *roots]
    random.Random(seed).shuffle(mixed)
    for inputs in ([*links, *roots], [*roots, *links], mixed):
        rows = nx.run_reachability_loop(inputs)
        pairs = [(root, node) for root, node, _ in rows]
        assert len(pairs) == len(set(pairs)), "each vertex reported once per root"
        assert set(pairs) == expected
        _check_paths(rows, config)


def test_reachability_reference_limits_hops():
    config = nx.ReachabilityConfig(seed=0, vertices=40, links=90, roots=3)
    assert nx.reachability_reference(config, 0) == {
        (r["node"], r["node"]) for r in nx.reachability_inputs(config)[1]}
    assert nx.reachability_reference(config, 1) < nx.reachability_reference(config)


def test_unrolled_reachability_runs_and_matches_bfs():
    """The runtime cannot run the loop yet, so run the same steps unrolled."""
    config = nx.ReachabilityConfig(seed=0, vertices=40, links=90, roots=3)
    full = nx.reachability_reference(config)
    depth = next(d for d in range(1, 41) if nx.reachability_reference(config, d - 1) == full)
    assert depth >= 4  # several hops, so several stages matter
    topo = bn.Topology("reach-unrolled")
    sink = nx.reachability_unrolled(topo, config, bn.sinks.Collect(), depth=depth,
                                    parallelism=2)
    assert not topo.has_feedback()
    rows = bn.run(topo).outputs[sink]
    assert {(root, node) for root, node, _ in rows} == full
    _check_paths(rows, config)
    # stage k reports k-hop facts only, so no (root, vertex) twice at one distance
    hops = [(root, node, len(path)) for root, node, path in rows]
    assert len(hops) == len(set(hops))
