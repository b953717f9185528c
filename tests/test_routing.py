"""Routing a batch by key: the router's batch-at-a-time cut (`Batch.split`, a byte mask
per destination for two of them, buckets of positions for more) must put every record
exactly where the straightforward computation — per record, in order, its key group
(its stable hash, mixed, modulo 128) and the instance owning that group, ``group * n
// 128`` (`bastion.runtime.key_groups`) — puts it, with its key, value, times and lineage id."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from bastion.lineage import ids_of, root_ids
from bastion.runtime.channel import OutputChannel
from bastion.runtime.instance import Router
from bastion.runtime.operators import OperatorContext
from bastion.runtime.plan import HASH, EdgePlan, OutputRoute
from bastion.runtime.records import MAX_CODED_DESTINATIONS, Batch, stable_hash


@dataclass(frozen=True)
class Page:
    name: str


def random_key(rng: random.Random):
    kind = rng.randrange(11)
    if kind == 0:
        return rng.randrange(-5, 300)                      # small ints, cached by CPython
    if kind == 1:
        return rng.choice([-(2**63), 2**64 - 1, 2**64, -(2**70), rng.getrandbits(80)])
    if kind == 2:
        return rng.choice([0.0, 1.0, 2.5, -3.0, 1e300, float("inf")])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "".join(rng.choice("aé字🙂b") for _ in range(rng.randrange(4)))
    if kind == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
    if kind == 6:
        return (rng.randrange(3), rng.choice(["x", 1.0, None]), (True,))
    if kind == 7:
        return frozenset({rng.randrange(3), "s"})
    if kind == 8:
        return Page(rng.choice(["home", "cart"]))
    if kind == 9:
        return rng.randrange(100)
    return str(rng.randrange(50))


def key_group_instance(key, n):
    """The router's definition, written out: the key's group (its stable hash through
    murmur3's finalizer, modulo 128) and that group's owner of n."""
    h = stable_hash(key)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return (h % 128) * n // 128


def expected_split(keys, n, destination=key_group_instance):
    """Positions of each destination's records, by the per-record definition."""
    buckets = [[] for _ in range(n)]
    for i, key in enumerate(keys):
        buckets[destination(key, n)].append(i)
    return buckets


class Collecting(OutputChannel):
    def __init__(self, channel_id: int):
        super().__init__(channel_id, frame_records=1 << 30, buffer_timeout_s=1.0)


def make_router(n: int, key_fn=None) -> tuple[Router, list[Collecting]]:
    edge = EdgePlan(0, "src", "count", 0, 1, 0, HASH, key_fn, False)
    channels = [Collecting(c) for c in range(n)]
    ctx = OperatorContext("count", 0, n, False, 1, False)
    return Router(OutputRoute(edge, list(range(n)), list(range(n))), channels, ctx,
                  False, lambda batch, channel_id, copy: None), channels


def check_part(part: Batch | None, batch: Batch, positions: list[int]) -> None:
    if not positions:
        assert part is None
        return
    assert list(part.keys) == [batch.keys[i] for i in positions]
    assert [type(k) for k in part.keys] == [type(batch.keys[i]) for i in positions]
    assert list(part.values) == [batch.values[i] for i in positions]
    assert list(part.ts) == [batch.ts[i] for i in positions]
    assert list(part.born) == [batch.born[i] for i in positions]
    if batch.ids is None:
        assert part.ids is None
    else:
        every = ids_of(batch.ids)
        assert list(ids_of(part.ids)) == [every[i] for i in positions]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 300])
@pytest.mark.parametrize("seed", range(4))
def test_split_puts_every_record_where_its_stable_hash_says(n, seed):
    rng = random.Random(seed * 1000 + n)
    size = rng.choice([1, 2, 5, 1024])
    keys = [random_key(rng) for _ in range(size)]
    values = [rng.random() for _ in range(size)]
    constant = [1.5] * size
    varying = [float(i) for i in range(size)]
    ids = [None, root_ids(3, 1, 7, size), [(9, i) for i in range(size)]][seed % 3]
    batch = Batch(keys, values, constant if seed % 2 else varying, constant, ids)
    parts = [stable_hash(k) % n for k in keys]
    # a router gives up to 256 destinations their codes as bytes
    split = batch.split(bytes(parts) if n <= MAX_CODED_DESTINATIONS and seed % 2 else parts, n)
    assert len(split) == n
    for part, positions in zip(split, expected_split(keys, n,
                                                     lambda k, n: stable_hash(k) % n)):
        check_part(part, batch, positions)


@pytest.mark.parametrize("n", [2, 3, 7, MAX_CODED_DESTINATIONS + 5])
def test_the_router_sends_each_record_to_the_channel_its_stable_hash_names(n):
    rng = random.Random(n)
    router, channels = make_router(n)
    for size in (1024, 3, 1):
        keys = [random_key(rng) for _ in range(size)]
        batch = Batch(keys, list(range(size)), [0.5] * size, [0.25] * size,
                      root_ids(0, 0, 0, size))
        router.route(batch)  # routes keys from its memo the second time round
        router.route(batch)
        expected = expected_split(keys, n)
        for channel, positions in zip(channels, expected):
            frame = channel.take_frame()
            if not positions:
                assert frame == []
                continue
            assert len(frame) == 2
            for part in frame:
                check_part(part, batch, positions)


@pytest.mark.parametrize("n", [2, 7, MAX_CODED_DESTINATIONS + 3])
def test_a_destination_that_gets_every_record_gets_the_batch_itself(n):
    batch = Batch([7] * 10, list(range(10)), [0.0] * 10, [0.0] * 10)
    split = batch.split([stable_hash(7) % n] * 10, n)
    assert split[stable_hash(7) % n] is batch
    assert sum(part is None for part in split) == n - 1


def test_the_router_applies_the_edge_key_function_first():
    router, channels = make_router(2, key_fn=lambda v: v % 10)
    values = list(range(100))
    router.route(Batch(None, values, [0.0] * 100, [0.0] * 100))
    for channel, positions in zip(channels, expected_split([v % 10 for v in values], 2)):
        (part,) = channel.take_frame()
        assert list(part.values) == positions
        assert list(part.keys) == [v % 10 for v in positions]
