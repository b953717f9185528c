"""NexMark: a seeded online-auction event stream, four NexMark queries, and CheckMate's
cyclic reachability query, as Bastion topologies.

What NexMark is
---------------
NexMark (Tucker et al., "NEXMark – A Benchmark for Queries over Data Streams"; the
Beam and Flink NexMark suites are its common implementations) models an online auction
house. One event stream interleaves three kinds of events:

- a **person** registers (id, name, email, credit card, city, US state);
- an **auction** opens (id, item, initial bid, reserve, expiry, seller = a person id,
  category);
- a **bid** is placed (auction id, bidder = a person id, price, channel).

In every period of 50 events, 1 is a person, 3 are auctions and 46 are bids (the
proportions are configurable). Ids are dense and refer only to what already exists: an
auction's seller is a person generated earlier, a bid's auction and bidder were
generated earlier. As in the reference generators, new auctions go to recently active
sellers and bids to auctions still "in flight" (the most recent ones), so state that
joins on ids stays warm. Event time advances by ``inter_event_s`` per event, i.e. the
stream covers ``1 / inter_event_s`` events per second of *event time* — independent of
how fast the runtime replays it (``rate`` of the source, in wall-clock records/s).

Skew (CheckMate's 10/20/30 % runs): with ``hot_ratio = h`` a fraction ``h`` of the bids
goes to a few *hot auctions* (the first ``hot_auctions`` auctions ever opened), a
fraction ``h`` of bids is placed by *hot bidders* and a fraction ``h`` of auctions is
sold by *hot sellers* (the first ``hot_persons`` persons). Since keyed operators route
a key to one instance, the hot keys load one instance with at least ``h`` of the
records: Q12 (keyed by bidder) and the Q3/Q8 joins (keyed by seller) all feel it.

Every event is a plain dict of str/int/float values (msgpack carries it as is) with
``"kind"`` (``"person"``, ``"auction"``, ``"bid"``) and ``"ts"`` (event time, seconds).
``event(config, i)`` is a pure function of ``(config, i)``: it seeds its own
``random.Random`` from ``(seed, i)`` by integer arithmetic (never ``hash()``, which is
salted per process), so any worker can generate any event, and a source replayed from
an offset after a failure produces exactly the same records.

Event time is non-decreasing unless ``disorder_s > 0``: then each event's time is moved
back by up to ``disorder_s`` (at most `MAX_OUT_OF_ORDERNESS_S`). The stream is then
``disorder_s``-bounded out of order — an event is never more than ``disorder_s`` older
than any event before it — and `nexmark_source` sets the watermark slack to
``disorder_s`` so that no event is ever late.

The queries
-----------
Each ``qN(topo, config, sink, ...)`` adds its own source and operators to ``topo``,
writes to ``sink``, registers a ``topo.query`` named after its prefix, and returns the
sink's name. Several queries can share one topology under different prefixes.

- **Q1 — currency conversion** (stateless map, no shuffle): every bid with its price
  converted from dollars to euros at 0.908. Prices are integer cents and stay integer
  cents, rounded half up: ``(price * 908 + 500) // 1000``.
- **Q3 — local item suggestion** (incremental join): who is selling in category 10 in
  Oregon, Idaho or California? Persons in OR/ID/CA joined with category-10 auctions on
  ``auction.seller == person.id``; emits ``(name, city, state, auction_id)``.
- **Q8 — monitor new users** (windowed join): persons who created an auction in the
  same tumbling window of ``window_s`` in which they registered; emits
  ``(person_id, name, window_start)`` once per person and window, as soon as the first
  matching auction arrives (the "running window" of CheckMate).
- **Q12 — bids per bidder per window** (windowed count): the number of bids each bidder
  placed in every tumbling window of ``window_s``; emits
  ``(bidder, window_start, window_end, count)``. NexMark's Q12 uses processing-time
  windows; here the windows are on event time so that results are reproducible.
- **Reachability — CheckMate's cyclic query** (after FFP): from a stream of directed
  links and a stream of root vertices, find every vertex reachable from each root,
  with a path. Newly reached vertices go around a feedback edge back into the join
  with the links. See `reachability`.
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from bastion import aggregations, sources, windows
from bastion.sinks import Sink
from bastion.topology import Stream, Topology

Event = dict[str, Any]

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
#: The largest ``disorder_s`` a config accepts: how far (in event-time seconds) an event
#: may be older than an event generated before it.
MAX_OUT_OF_ORDERNESS_S = 2.0

EURO_PER_MILLE = 908  # Q1: 1 USD = 0.908 EUR, as in the Flink NexMark suite
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10

FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith",
              "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend",
             "Redmond", "Seattle", "Kent", "Cheyenne")
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

# Every random stream is seeded from (seed, stream, index) packed into disjoint bits, so
# that no two (seed, index) pairs share a generator state (seed * 1_000_003 + i would
# make event i + 1_000_003 of seed s replay event i of seed s + 1).
_INDEX_BITS = 40
_STREAM_BITS = 4
_NEXMARK_STREAM, _LINK_STREAM, _ROOT_STREAM = 0, 1, 2


def _rng(seed: int, stream: int, index: int) -> random.Random:
    return random.Random((((seed << _STREAM_BITS) | stream) << _INDEX_BITS) | index)


def _check_index(i: int, count: int | None) -> None:
    if not 0 <= i < (1 << _INDEX_BITS) or (count is not None and i >= count):
        raise IndexError(f"event index {i} is outside [0, {count})")


# -- the NexMark generator --------------------------------------------------------------


@dataclass(frozen=True)
class NexmarkConfig:
    """What to generate. ``events=None`` makes the stream unbounded.

    ``inter_event_s``: event-time seconds between consecutive events.
    ``hot_ratio``: the fraction of bids on hot auctions, of bids by hot bidders and of
    auctions by hot sellers (0.0 = no skew); ``hot_auctions``/``hot_persons``: how many
    keys are hot. ``active_persons``: sellers and bidders are drawn from this many most
    recent persons; ``in_flight_auctions``: bids go to this many most recent auctions.
    ``disorder_s``: bounded event-time disorder (≤ `MAX_OUT_OF_ORDERNESS_S`).
    ``window_s``: the tumbling window size of Q8 and Q12.
    """

    seed: int = 0
    events: int | None = 10_000
    inter_event_s: float = 0.01
    hot_ratio: float = 0.0
    hot_auctions: int = 1
    hot_persons: int = 1
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    active_persons: int = 1000
    in_flight_auctions: int = 100
    auction_duration_s: float = 60.0
    disorder_s: float = 0.0
    window_s: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if self.events is not None and not 0 <= self.events <= 1 << _INDEX_BITS:
            raise ValueError(f"events must be None or in [0, 2**{_INDEX_BITS}], "
                             f"got {self.events!r}")
        if not self.inter_event_s > 0:
            raise ValueError(f"inter_event_s must be > 0, got {self.inter_event_s!r}")
        if not 0.0 <= self.hot_ratio <= 1.0:
            raise ValueError(f"hot_ratio must be in [0, 1], got {self.hot_ratio!r}")
        for name in ("hot_auctions", "hot_persons", "person_proportion",
                     "auction_proportion", "bid_proportion", "active_persons",
                     "in_flight_auctions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 0.0 <= self.disorder_s <= MAX_OUT_OF_ORDERNESS_S:
            raise ValueError(f"disorder_s must be in [0, {MAX_OUT_OF_ORDERNESS_S}], "
                             f"got {self.disorder_s!r}")
        if not self.window_s > 0 or not self.auction_duration_s > 0:
            raise ValueError("window_s and auction_duration_s must be > 0")

    @property
    def period(self) -> int:
        """Events per person/auction/bid cycle (50 by default)."""
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def event(self, i: int) -> Event:
        """Event number ``i`` (see `event`); a bound method, so it can back a Generator."""
        return event(self, i)


def persons_before(config: NexmarkConfig, i: int) -> int:
    """How many persons events ``0 .. i-1`` contain."""
    epoch, offset = divmod(i, config.period)
    return epoch * config.person_proportion + min(offset, config.person_proportion)


def auctions_before(config: NexmarkConfig, i: int) -> int:
    """How many auctions events ``0 .. i-1`` contain."""
    epoch, offset = divmod(i, config.period)
    in_epoch = min(max(offset - config.person_proportion, 0), config.auction_proportion)
    return epoch * config.auction_proportion + in_epoch


def _pick(rng: random.Random, existing: int, hot: int, recent: int, hot_ratio: float) -> int:
    """A base-0 id among ``existing`` ones: one of the first ``hot`` with probability
    ``hot_ratio``, else one of the ``recent`` newest."""
    if rng.random() < hot_ratio:
        return rng.randrange(min(hot, existing))
    return rng.randrange(max(0, existing - recent), existing)


def _price(rng: random.Random) -> int:
    # Log-uniform between $1 and $1,000,000, in cents, as the reference generators do.
    return round(10.0 ** (rng.random() * 6.0) * 100.0)


def event(config: NexmarkConfig, i: int) -> Event:
    """Event number ``i`` of the stream: a pure function of ``(config, i)``."""
    _check_index(i, config.events)
    rng = _rng(config.seed, _NEXMARK_STREAM, i)
    ts = i * config.inter_event_s
    if config.disorder_s:
        ts = max(0.0, ts - rng.random() * config.disorder_s)
    epoch, offset = divmod(i, config.period)
    if offset < config.person_proportion:
        pid = FIRST_PERSON_ID + epoch * config.person_proportion + offset
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        return {
            "kind": "person", "ts": ts, "id": pid, "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{pid}@example.com",
            "credit_card": " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4)),
            "city": rng.choice(US_CITIES), "state": rng.choice(US_STATES),
        }
    persons = persons_before(config, i)
    if offset < config.person_proportion + config.auction_proportion:
        aid = (FIRST_AUCTION_ID + epoch * config.auction_proportion
               + offset - config.person_proportion)
        seller = FIRST_PERSON_ID + _pick(rng, persons, config.hot_persons,
                                         config.active_persons, config.hot_ratio)
        initial = _price(rng)
        return {
            "kind": "auction", "ts": ts, "id": aid, "item_name": f"item-{aid}",
            "initial_bid": initial, "reserve": initial + _price(rng),
            "expires": ts + config.auction_duration_s * (0.5 + rng.random()),
            "seller": seller,
            "category": FIRST_CATEGORY_ID + rng.randrange(NUM_CATEGORIES),
        }
    auction = FIRST_AUCTION_ID + _pick(rng, auctions_before(config, i), config.hot_auctions,
                                       config.in_flight_auctions, config.hot_ratio)
    bidder = FIRST_PERSON_ID + _pick(rng, persons, config.hot_persons,
                                     config.active_persons, config.hot_ratio)
    return {
        "kind": "bid", "ts": ts, "auction": auction, "bidder": bidder,
        "price": _price(rng), "channel": rng.choice(CHANNELS),
    }


def events(config: NexmarkConfig) -> list[Event]:
    """The whole (bounded) stream, in generation order: the input of references."""
    if config.events is None:
        raise ValueError("events() needs a bounded config (events is None)")
    return [event(config, i) for i in range(config.events)]


def event_time(e: Event) -> float:
    return e["ts"]


def is_person(e: Event) -> bool:
    return e["kind"] == "person"


def is_auction(e: Event) -> bool:
    return e["kind"] == "auction"


def is_bid(e: Event) -> bool:
    return e["kind"] == "bid"


def nexmark_source(topo: Topology, name: str, config: NexmarkConfig, *,
                   rate: float | None = None, parallelism: int = 1) -> Stream:
    """Add the NexMark stream as source ``name``: at most ``rate`` events per wall-clock
    second (as fast as possible when None), event time from ``"ts"``. Instance ``j`` of
    ``p`` generates events ``j, j+p, …``, so each instance's events are in order (up to
    ``disorder_s``), which is what its watermark assumes."""
    return topo.source(name, sources.Generator(config.event, count=config.events, rate=rate),
                       parallelism=parallelism, timestamp=event_time,
                       max_out_of_orderness=config.disorder_s)


# -- Q1: currency conversion -------------------------------------------------------------


def to_euro_cents(dollar_cents: int) -> int:
    """Q1's conversion, in exact integer arithmetic (rounded half up) so that the
    runtime and a reference agree to the cent."""
    return (dollar_cents * EURO_PER_MILLE + 500) // 1000


def q1_convert(bid: Event) -> Event:
    return {**bid, "price": to_euro_cents(bid["price"])}


def q1(topo: Topology, config: NexmarkConfig, sink: Sink, *, parallelism: int = 1,
       rate: float | None = None, prefix: str = "q1") -> str:
    """Q1: every bid, price in euro cents. Source, filter and map share a parallelism,
    so they chain into one task per instance: no shuffle at all."""
    src = nexmark_source(topo, f"{prefix}-events", config, rate=rate,
                         parallelism=parallelism)
    converted = src.filter(f"{prefix}-bids", is_bid).map(f"{prefix}-convert", q1_convert)
    return _finish(topo, converted, sink, prefix)


# -- Q3: local item suggestion (incremental join) ----------------------------------------


def q3_person_filter(e: Event) -> bool:
    return e["kind"] == "person" and e["state"] in Q3_STATES


def q3_auction_filter(e: Event) -> bool:
    return e["kind"] == "auction" and e["category"] == Q3_CATEGORY


def q3_key(e: Event) -> int:
    return e["id"] if e["kind"] == "person" else e["seller"]


Q3State = tuple[Any, tuple[int, ...]]  # ((name, city, state) or None, waiting auction ids)


def q3_join_step(state: Q3State | None, e: Event) -> tuple[Q3State, list[tuple]]:
    """One step of the per-person incremental join. A person is kept forever (any later
    auction of theirs matches); auctions that arrive before their seller — possible
    because persons and auctions reach the join over different channels — wait for it."""
    person, waiting = state if state is not None else (None, ())
    if e["kind"] == "person":
        person = (e["name"], e["city"], e["state"])
        return (person, ()), [(*person, aid) for aid in waiting]
    if person is not None:
        return (person, ()), [(*person, e["id"])]
    return (None, (*waiting, e["id"])), []


def _explode(items: Any) -> Any:
    return items


def q3(topo: Topology, config: NexmarkConfig, sink: Sink, *, parallelism: int = 1,
       rate: float | None = None, prefix: str = "q3") -> str:
    """Q3: ``(name, city, state, auction_id)`` for every category-10 auction sold by a
    person from OR, ID or CA.

    NexMark's Q3 is an *unbounded* incremental join: a match is emitted as soon as both
    sides have arrived, however far apart in time. The DSL's `join` is windowed: a
    window sized to cover a whole bounded run would give the same pairs, but on an
    unbounded stream it loses every pair that straddles a window boundary and buffers
    both sides in full. A keyed `stateful_map` over the union of both sides has the
    exact semantics and keeps the state NexMark's reference implementation keeps (the
    qualifying persons; auctions only until their seller shows up), so Q3 uses that.
    """
    src = nexmark_source(topo, f"{prefix}-events", config, rate=rate,
                         parallelism=parallelism)
    persons = src.filter(f"{prefix}-persons", q3_person_filter)
    auctions = src.filter(f"{prefix}-auctions", q3_auction_filter)
    both = persons.union(auctions, name=f"{prefix}-union")
    matches = both.key_by(q3_key).stateful_map(f"{prefix}-join", q3_join_step, initial=None,
                                               parallelism=parallelism)
    return _finish(topo, matches.flat_map(f"{prefix}-matches", _explode), sink, prefix)


# -- Q8: monitor new users (windowed join) ------------------------------------------------


def window_start(ts: float, size: float) -> float:
    """The start of the tumbling window of ``size`` holding ``ts``, computed exactly as
    the runtime numbers windows (``floor(ts / size) * size`` in floats)."""
    size = float(size)
    return math.floor(ts / size) * size


def person_id(e: Event) -> int:
    return e["id"]


def seller(e: Event) -> int:
    return e["seller"]


def q8_row(window_s: float, joined: tuple) -> tuple[int, str, float]:
    _, person, _auction = joined
    return (person["id"], person["name"], window_start(person["ts"], window_s))


def q8_row_key(row: tuple) -> tuple[int, float]:
    return (row[0], row[2])


def q8_first(seen: bool, row: tuple) -> tuple[bool, tuple | None]:
    return True, (None if seen else row)


def is_not_none(value: Any) -> bool:
    return value is not None


def q8(topo: Topology, config: NexmarkConfig, sink: Sink, *, parallelism: int = 1,
       rate: float | None = None, prefix: str = "q8") -> str:
    """Q8: ``(person_id, name, window_start)`` for every person who opened an auction in
    the tumbling window (``config.window_s``) in which they registered.

    The join emits a pair the moment its second record arrives (a running window) and
    forgets the window when the watermark passes its end. A person selling several
    auctions in one window makes several pairs, so a keyed first-only step keeps the
    output to one row per (person, window) — what NexMark's Q8 (a join of the windowed
    person and auction *groups*) returns. That step's state is one flag per matched
    (person, window) and is never expired: the DSL has no timers for keyed state.
    """
    src = nexmark_source(topo, f"{prefix}-events", config, rate=rate,
                         parallelism=parallelism)
    persons = src.filter(f"{prefix}-persons", is_person).key_by(person_id)
    auctions = src.filter(f"{prefix}-auctions", is_auction).key_by(seller)
    pairs = persons.join(auctions, f"{prefix}-join", window=windows.Tumbling(config.window_s),
                         parallelism=parallelism)
    rows = pairs.map(f"{prefix}-rows", functools.partial(q8_row, config.window_s))
    firsts = rows.key_by(q8_row_key).stateful_map(f"{prefix}-first", q8_first, initial=False)
    return _finish(topo, firsts.filter(f"{prefix}-distinct", is_not_none), sink, prefix)


# -- Q12: bids per bidder per window ------------------------------------------------------


def bidder(e: Event) -> int:
    return e["bidder"]


def q12(topo: Topology, config: NexmarkConfig, sink: Sink, *, parallelism: int = 1,
        rate: float | None = None, prefix: str = "q12") -> str:
    """Q12: ``(bidder, window_start, window_end, count)`` per tumbling event-time window
    of ``config.window_s``, emitted when the watermark passes the window's end."""
    src = nexmark_source(topo, f"{prefix}-events", config, rate=rate,
                         parallelism=parallelism)
    counts = src.filter(f"{prefix}-bids", is_bid).key_by(bidder) \
        .window(windows.Tumbling(config.window_s)) \
        .aggregate(f"{prefix}-count", aggregations.Count(), parallelism=parallelism)
    return _finish(topo, counts, sink, prefix)


def _finish(topo: Topology, stream: Stream, sink: Sink, prefix: str) -> str:
    name = f"{prefix}-out"
    stream.sink(name, sink)
    topo.query(prefix, [name])
    return name


# -- CheckMate's cyclic query: reachability ----------------------------------------------


@dataclass(frozen=True)
class ReachabilityConfig:
    """A random directed graph, streamed: ``links`` links between ``vertices`` vertices
    (no self-loops) and ``roots`` root vertices, each stream advancing ``inter_event_s``
    of event time per event."""

    seed: int = 0
    vertices: int = 64
    links: int = 128
    roots: int = 2
    inter_event_s: float = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if self.vertices < 2 or self.links < 0 or self.roots < 0:
            raise ValueError("need vertices >= 2, links >= 0, roots >= 0")
        if not self.inter_event_s > 0:
            raise ValueError(f"inter_event_s must be > 0, got {self.inter_event_s!r}")

    def link(self, i: int) -> Event:
        """Link number ``i``: ``{"kind": "link", "src", "dst", "ts"}``."""
        _check_index(i, self.links)
        rng = _rng(self.seed, _LINK_STREAM, i)
        src = rng.randrange(self.vertices)
        dst = (src + 1 + rng.randrange(self.vertices - 1)) % self.vertices
        return {"kind": "link", "ts": i * self.inter_event_s, "src": src, "dst": dst}

    def root(self, i: int) -> Event:
        """Root number ``i``: ``{"kind": "root", "node", "ts"}``."""
        _check_index(i, self.roots)
        rng = _rng(self.seed, _ROOT_STREAM, i)
        return {"kind": "root", "ts": i * self.inter_event_s,
                "node": rng.randrange(self.vertices)}


def reachability_inputs(config: ReachabilityConfig) -> tuple[list[Event], list[Event]]:
    """All links and all roots, in generation order."""
    return ([config.link(i) for i in range(config.links)],
            [config.root(i) for i in range(config.roots)])


def reachability_reference(config: ReachabilityConfig,
                           max_hops: int | None = None) -> set[tuple[int, int]]:
    """``(root, vertex)`` for every vertex at most ``max_hops`` links from a root
    (any distance when None), the root itself included: breadth-first search."""
    links, roots = reachability_inputs(config)
    out_links: dict[int, set[int]] = {}
    for link in links:
        out_links.setdefault(link["src"], set()).add(link["dst"])
    reached: set[tuple[int, int]] = set()
    for root in {r["node"] for r in roots}:
        seen = {root}
        frontier = [root]
        hops = 0
        while frontier and (max_hops is None or hops < max_hops):
            frontier = [d for v in frontier for d in out_links.get(v, ()) if d not in seen]
            seen.update(frontier)
            hops += 1
        reached.update((root, v) for v in seen)
    return reached


def root_fact(root: Event) -> Event:
    """A root reaches itself by the empty path: the fact that starts its search."""
    node = root["node"]
    return {"kind": "reach", "root": node, "node": node, "path": (node,)}


def reach_key(item: Event) -> int:
    """Links meet facts at the vertex they leave from / the fact reached."""
    return item["src"] if item["kind"] == "link" else item["node"]


ReachState = tuple[tuple[int, ...], tuple[tuple[int, tuple[int, ...]], ...]]


def reach_join_step(state: ReachState | None, item: Event) -> tuple[ReachState, list[tuple]]:
    """The join of Figure 6, per vertex ``v``: state is ``v``'s out-links and, per root
    that reached ``v``, the path by which it first did.

    A new link ``v → d`` pairs with every stored fact; a fact pairs with every stored
    link. Pairs are ``("pair", root, path, d)``. A fact whose root already reached ``v``
    is dropped — that bounds the facts in the loop by roots × vertices, so the
    iteration terminates on any graph — and a fact that is new is also emitted as
    ``("reached", root, v, path)``: the query's output, once per (root, vertex)."""
    links, facts = state if state is not None else ((), ())
    if item["kind"] == "link":
        dst = item["dst"]
        if dst in links:
            return (links, facts), []
        return ((*links, dst), facts), [("pair", root, path, dst) for root, path in facts]
    root, node, path = item["root"], item["node"], tuple(item["path"])
    if any(known == root for known, _ in facts):
        return (links, facts), []
    out: list[tuple] = [("reached", root, node, path)]
    out.extend(("pair", root, path, dst) for dst in links)
    return (links, (*facts, (root, path))), out


def is_reached(item: tuple) -> bool:
    return item[0] == "reached"


def is_pair(item: tuple) -> bool:
    return item[0] == "pair"


def reach_select(pair: tuple) -> bool:
    """Figure 6's select: drop a link that leads back onto the fact's own path."""
    return pair[3] not in pair[2]


def reach_project(pair: tuple) -> Event:
    """Figure 6's project: the fact that the link's end is reachable from the root."""
    _, root, path, dst = pair
    return {"kind": "reach", "root": root, "node": dst, "path": (*path, dst)}


def reach_output(item: tuple) -> tuple[int, int, tuple[int, ...]]:
    """``(root, vertex, path)`` of a newly reached vertex."""
    return (item[1], item[2], tuple(item[3]))


def _reach_sources(topo: Topology, config: ReachabilityConfig, prefix: str,
                   rate: float | None = None) -> tuple[Stream, Stream]:
    # ``rate``: links per second (wall clock) in total, the roots paced to arrive over
    # the same span; None streams both unpaced.
    root_rate = (None if rate is None or not config.roots or not config.links
                 else rate * config.roots / config.links)
    links = topo.source(f"{prefix}-links",
                        sources.Generator(config.link, count=config.links, rate=rate),
                        timestamp=event_time)
    roots = topo.source(f"{prefix}-roots",
                        sources.Generator(config.root, count=config.roots, rate=root_rate),
                        timestamp=event_time)
    return links, roots.map(f"{prefix}-seed", root_fact)


def _reach_stage(links: Stream, facts: Stream, stage: str, parallelism: int,
                 with_pairs: bool = True) -> tuple[Stream, Stream | None]:
    """join → split: the newly reached facts, and (``with_pairs``) the (link, fact)
    pairs that make the next hop."""
    joined = links.union(facts, name=f"{stage}-in").key_by(reach_key) \
        .stateful_map(f"{stage}-join", reach_join_step, initial=None,
                      parallelism=parallelism) \
        .flat_map(f"{stage}-items", _explode)
    pairs = joined.filter(f"{stage}-pairs", is_pair) if with_pairs else None
    return joined.filter(f"{stage}-reached", is_reached), pairs


def _select_project(pairs: Stream, stage: str) -> Stream:
    return pairs.filter(f"{stage}-select", reach_select).map(f"{stage}-project", reach_project)


def reachability(topo: Topology, config: ReachabilityConfig, sink: Sink, *,
                 parallelism: int = 1, prefix: str = "reach",
                 rate: float | None = None) -> str:
    """CheckMate's cyclic query (§VI, Figure 6, adapted from FFP): ``(root, vertex,
    path)`` once for every vertex reachable from a root.

        links ---------------.
                              +--> union --> join --> items --+--> reached --> sink
        roots --> seed ------'               ^                |
                                             |                '--> pairs --> select
                                             |                                 |
                                             '-- feedback (by vertex) <-- project

    Each projected fact travels the feedback edge back into the join, hash-partitioned
    by its vertex, to meet that vertex's out-links: one trip round the loop per hop.
    Not modelled: CheckMate's link/source *removals* (the join dropping state when a
    link disappears) — the streams here only add. ``rate``: links per second in total
    (wall clock), the roots spread over the same span, as CheckMate paces its
    generator; None: as fast as the loop takes them.
    """
    links, seeds = _reach_sources(topo, config, prefix, rate)
    reached, pairs = _reach_stage(links, seeds, prefix, parallelism)
    assert pairs is not None  # asked with_pairs (the default)
    facts = _select_project(pairs, prefix)
    topo.feedback(facts, f"{prefix}-join", key=reach_key)
    return _finish(topo, reached.map(f"{prefix}-output", reach_output), sink, prefix)


def reachability_unrolled(topo: Topology, config: ReachabilityConfig, sink: Sink, *,
                          depth: int, parallelism: int = 1, prefix: str = "reach") -> str:
    """The reachability query with its loop unrolled ``depth`` times — an acyclic graph
    that runs on any protocol and exercises the same step functions. Stage ``k`` joins
    the ``k``-hop facts with all links and knows nothing of earlier stages, so a
    ``(root, vertex)`` pair can be reported by several stages — at most once per hop
    count. The distinct pairs are those at most ``depth - 1`` hops apart."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    links, facts = _reach_sources(topo, config, prefix)
    outputs = []
    for k in range(depth):
        stage = f"{prefix}-{k}"
        # The last stage makes no pairs: they would only feed a next hop that does not
        # exist, and an operator whose output nobody consumes fails validation.
        last = k + 1 == depth
        reached, pairs = _reach_stage(links, facts, stage, parallelism, with_pairs=not last)
        outputs.append(reached)
        if pairs is not None:
            facts = _select_project(pairs, stage)
    merged = outputs[0].union(*outputs[1:], name=f"{prefix}-merged") if depth > 1 \
        else outputs[0]
    return _finish(topo, merged.map(f"{prefix}-output", reach_output), sink, prefix)


def run_reachability_loop(inputs: list[Event]) -> list[tuple]:
    """The cyclic query without a runtime: the step functions of `reachability`, with a
    FIFO queue standing in for the feedback edge and one state dict for the keyed join.
    ``inputs`` are link and root events in any interleaving; they all enter before the
    first fact comes back round the loop. Returns the output records in order."""
    state: dict[int, ReachState | None] = {}
    queue: deque[Event] = deque(root_fact(e) if e["kind"] == "root" else e for e in inputs)
    output: list[tuple] = []
    while queue:
        item = queue.popleft()
        key = reach_key(item)
        state[key], items = reach_join_step(state.get(key), item)
        for out in items:
            if is_reached(out):
                output.append(reach_output(out))
            elif reach_select(out):
                queue.append(reach_project(out))
    return output
