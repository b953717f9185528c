"""Incremental keyed state (`bastion.runtime.incremental`) without a cluster: chains of
a base and deltas restore exactly the live state, and the store never lets a broken
chain pass for a checkpoint.

The state is checked against plain Python: a dict updated and pruned at random, its
copy taken at each checkpoint. Every link goes through the real state codec and the
real store (a local directory), as a task writes it.
"""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bastion as bn
from bastion.runtime.durable import DurableCodec
from bastion.runtime.compaction import merge_chain
from bastion.runtime.incremental import Compacted, StateChain, apply_links
from bastion.storage import CheckpointStore, open_store
from bastion.storage.checkpoints import BlobRef, ChainRef
from bastion.storage.errors import CorruptBlobError


class Tables:
    """An operator holding two tables over one key space (like a count window's
    ``state`` and ``fired``), tracking the keys it changes as a real one does."""

    changed: set | None = None

    def __init__(self) -> None:
        self.a: dict = {}
        self.b: dict = {}

    def tables(self) -> list[dict]:
        return [self.a, self.b]

    def load_tables(self, tables: list[dict]) -> None:
        self.a, self.b = tables

    def put(self, key, value) -> None:
        self.a[key] = value
        self.b[key] = [value, str(value)]  # a mutable value, changed in place later
        if self.changed is not None:
            self.changed.add(key)

    def bump(self, key) -> None:
        if key in self.b:
            self.b[key][0] += 1
            if self.changed is not None:
                self.changed.add(key)

    def remove(self, key) -> None:
        self.a.pop(key, None)
        if self.changed is not None:
            self.changed.add(key)


class Whole:
    """An operator that is not keyed: its snapshot goes whole into every link."""

    changed = None

    def __init__(self) -> None:
        self.offset = 0

    def tables(self):
        return None

    def snapshot(self):
        return {"offset": self.offset}


def ops_pair():
    return [Whole(), Tables()]


CODEC = DurableCodec()

# one step: ("put", key, value) | ("bump", key) | ("remove", key) | ("checkpoint", stored?)
# | ("compact", landed?): a compaction the chain asks for (if it does) ends, with its
# base or failed
steps = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 30), st.integers(-5, 5)),
    st.tuples(st.just("bump"), st.integers(0, 30)),
    st.tuples(st.just("remove"), st.integers(0, 30)),
    st.tuples(st.just("checkpoint"), st.booleans()),
    st.tuples(st.just("compact"), st.booleans())), min_size=1, max_size=80)


def play(actions, max_chain):
    """Run ``actions`` against a live operator; return every link written (encoded,
    as a `ChainRef` to its blob in a dict 'store') and the plain state at each."""
    whole, keyed = ops = ops_pair()
    chain = StateChain(ops, max_chain)
    blobs: dict[str, bytes] = {}
    taken = []
    for n, action in enumerate(actions):
        if action[0] == "put":
            keyed.put(action[1], action[2])
        elif action[0] == "bump":
            keyed.bump(action[1])
        elif action[0] == "remove":
            keyed.remove(action[1])
        elif action[0] in ("compact", "ask"):
            asked = chain.compaction_wanted()
            if asked is not None:
                # what `compaction.compact` runs in its own process, on the blobs stored
                pending = asked, merge_chain([blobs[r.key] for r in asked], asked, CODEC,
                                             [False, True])
            if action[0] == "compact" and asked is not None:
                chain.compaction_landed(Compacted(*pending) if action[1] else None)
        elif action[0] == "land":  # the compaction asked for earlier ends now
            chain.compaction_landed(Compacted(*pending))
        else:
            whole.offset = n
            link = chain.link([whole.snapshot(), None])
            data = CODEC.encode({"link": link.value})
            key = f"link-{n}"
            blobs[key] = data
            parent = link.parent
            if link.compacted is not None:  # stored first, as `put_chain` does
                blobs[f"base-{n}"] = link.compacted.data
                parent = (BlobRef("op/0", f"base-{n}", len(link.compacted.data), 0),
                          *parent)
            ref = ChainRef("op/0", key, len(data), 0, parent)
            expected = (copy.deepcopy(keyed.a), copy.deepcopy(keyed.b), n)
            if action[1]:  # the upload succeeded: it may be a parent
                chain.stored(link, ref)
            taken.append((ref, expected, link.kind))
    return blobs, taken


def restore(blobs, ref):
    links = [CODEC.decode(blobs[r.key], r.key)["link"] for r in (*ref.chain, ref)]
    return apply_links(links, [False, True])


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(1, 4))
def test_every_chain_restores_the_state_at_its_checkpoint(actions, max_chain):
    blobs, taken = play(actions, max_chain)
    for ref, (a, b, offset), kind in taken:
        assert len(ref.chain) <= max_chain  # at most max_chain deltas on a base
        (whole, (got_a, got_b)) = restore(blobs, ref)
        assert whole == {"offset": offset}
        assert got_a == a and got_b == b


def test_deltas_hold_only_what_changed_and_a_base_comes_back():
    whole, keyed = ops = ops_pair()
    chain = StateChain(ops, max_chain=2)
    for k in range(1000):
        keyed.put(k, k)
    kinds, sizes = [], []
    for n in range(7):
        keyed.put(n, -n)
        keyed.remove(500 + n)
        link = chain.link([whole.snapshot(), None])
        data = CODEC.encode(link.value)
        chain.stored(link, ChainRef("op/0", f"k{n}", len(data), 0, link.parent))
        kinds.append(link.kind)
        sizes.append(len(data))
    assert kinds == ["base", "delta", "delta", "base", "delta", "delta", "base"]
    assert max(sizes[1], sizes[2]) * 50 < sizes[0]


def test_changed_keys_stop_at_an_eighth_of_the_keys_and_the_next_link_is_a_base():
    """A state growing faster than an eighth of its keys per checkpoint writes a base
    at each one; its change set stops growing (and is emptied) once that is certain,
    and the base it forces still restores the live state."""
    whole, keyed = ops = ops_pair()
    chain = StateChain(ops, max_chain=8)
    for k in range(800):
        keyed.put(k, k)
    blobs: dict[str, bytes] = {}

    def checkpoint(name):
        link = chain.link([whole.snapshot(), None])
        blobs[name] = CODEC.encode({"link": link.value})
        ref = ChainRef("op/0", name, len(blobs[name]), 0, link.parent)
        chain.stored(link, ref)
        return link, ref

    assert checkpoint("base")[0].kind == "base"
    keyed.changed.update(range(100))  # 100 * 8 = 800: not more than an eighth
    assert not keyed.changed.full and len(keyed.changed) == 100
    assert checkpoint("delta")[0].kind == "delta"
    keyed.changed.update(range(100))
    keyed.changed.update([800])  # a key more: 101 of 800
    assert keyed.changed.full and len(keyed.changed) == 0
    for k in range(800, 1200):  # taken no more
        keyed.put(k, -k)
    assert len(keyed.changed) == 0
    link, ref = checkpoint("grown")
    assert link.kind == "base"
    (_, (got_a, got_b)) = restore(blobs, ref)
    assert got_a == keyed.a and got_b == keyed.b


def test_a_link_whose_upload_failed_is_never_a_parent():
    whole, keyed = ops = ops_pair()
    chain = StateChain(ops, max_chain=5)
    for k in range(100, 200):  # cold keys: a delta of a few keys is worth writing
        keyed.put(k, k)
    keyed.put(1, 1)
    base = chain.link([whole.snapshot(), None])
    chain.stored(base, ChainRef("op/0", "base", 10, 0, ()))
    keyed.put(2, 2)
    lost = chain.link([whole.snapshot(), None])   # never stored
    keyed.put(3, 3)
    after = chain.link([whole.snapshot(), None])
    assert after.parent == base.parent + (ChainRef("op/0", "base", 10, 0, ()),)
    # the lost link's change (key 2) is in the next delta: it builds on the base alone
    [_, [(changed_a, _), _]] = after.value["operators"][1]
    assert changed_a == {2: 2, 3: 3}
    assert lost.kind == "delta"


def test_a_compacted_base_stands_for_the_links_it_merged():
    """Half-way to max_chain the chain asks for a compaction; the base made from the
    stored links (as another process makes it) is carried by the next link, which
    then builds on it alone — and restores the live state. One that failed is asked
    for again; one the chain outgrew (a base was written meanwhile) is dropped."""
    actions = [("put", k, k) for k in range(500)] + [("checkpoint", True)]
    for n in range(3):
        actions += [("put", n, -n), ("checkpoint", True)]
    actions += [("compact", False)]                     # 3 deltas: not due yet at 8
    actions += [("put", 9, 9), ("checkpoint", True)]    # 4 deltas: due
    actions += [("compact", False)]                     # asked, and failed
    actions += [("put", 10, 10), ("checkpoint", True), ("compact", True)]  # asked again
    actions += [("put", 11, 11), ("remove", 12), ("checkpoint", True),
                ("bump", 1), ("checkpoint", True)]
    blobs, taken = play(actions, max_chain=8)
    refs = [ref for ref, _, _ in taken]
    assert [len(r.chain) for r in refs] == [0, 1, 2, 3, 4, 5, 1, 2]
    carried, after = refs[6], refs[7]
    assert carried.chain[0].key.startswith("base-")       # stored with the link
    assert [r.key for r in after.chain] == [carried.chain[0].key, carried.key]
    for ref, (a, b, offset), _ in taken:
        (whole, (got_a, got_b)) = restore(blobs, ref)
        assert (got_a, got_b, whole) == (a, b, {"offset": offset})
    base = CODEC.decode(blobs[carried.chain[0].key], "base")["link"]
    assert base["kind"] == "base" and base["position"] == 5   # the newest link it merged
    # one that lands before the link that would have been a base makes it a delta
    actions = [("put", k, k) for k in range(500)] + [("checkpoint", True)]
    actions += [("put", 1, 1), ("checkpoint", True), ("put", 2, 2), ("checkpoint", True)]
    blobs, taken = play(actions + [("compact", True)] + [("put", 3, 3), ("checkpoint", True)],
                        max_chain=2)   # without it the fourth link would be a base
    assert [kind for _, _, kind in taken] == ["base", "delta", "delta", "delta"]
    # one that lands after a base was written is not used: asked at 2 deltas of 4,
    # outgrown by the base a delta of most keys forces before it lands
    blobs, taken = play(actions + [("ask",)] + [("put", k, -k) for k in range(400)]
                        + [("checkpoint", True), ("land",), ("checkpoint", True)],
                        max_chain=4)
    assert [kind for _, _, kind in taken] == ["base", "delta", "delta", "base", "delta"]
    assert not any(r.key.startswith("base-") for r in taken[-1][0].chain)
    for ref, (a, b, offset), _ in taken:
        (whole, (got_a, got_b)) = restore(blobs, ref)
        assert (got_a, got_b, whole) == (a, b, {"offset": offset})


def test_a_task_that_forks_its_bases_asks_for_no_compaction():
    """A base encoded in a forked child costs less than any merge of the chain, so a
    task that would fork its next base never asks for one; the chain then grows to
    max_chain and the task writes the base itself."""
    whole, keyed = ops = ops_pair()
    forks = [True]
    chain = StateChain(ops, max_chain=4, bases_forked=lambda: forks[0])
    for k in range(500):
        keyed.put(k, k)
    kinds = []
    for n in range(6):
        keyed.put(n, -n)
        link = chain.link([whole.snapshot(), None])
        data = CODEC.encode({"link": link.value})
        chain.stored(link, ChainRef("op/0", f"link-{n}", len(data), 0, link.parent))
        kinds.append(link.kind)
        assert chain.compaction_wanted() is None
        if n == 2:  # half-way: asked for by a task that would encode its base on the loop
            forks[0] = False
            assert chain.compaction_wanted() is not None
            chain.compaction_landed(None)
            forks[0] = True
    assert kinds == ["base", "delta", "delta", "delta", "delta", "base"]


@pytest.mark.parametrize("forked, over", [(False, 8), (True, 32)])
def test_a_delta_of_more_than_a_share_of_the_keys_is_a_base(forked, over):
    """A link whose changes hold more than an eighth of the keys is a base — a 32nd
    when the task forks its bases, whose in-loop delta would then cost it more than
    the base — and its change set stops growing there."""
    whole, keyed = ops = ops_pair()
    chain = StateChain(ops, max_chain=64, bases_forked=lambda: forked)
    for k in range(3200):
        keyed.put(k, k)
    kinds = []
    for changed in (None, 3200 // over, 3200 // over + 1, 3200 // 8 + 1):
        if changed is not None:  # the first link: a base, with no parent
            for k in range(changed):
                keyed.a[k] += 1
            keyed.changed.update(range(changed))  # once per batch, as operators do
            assert keyed.changed.full == (changed * over > 3200)
        link = chain.link([whole.snapshot(), None])
        data = CODEC.encode({"link": link.value})
        chain.stored(link, ChainRef("op/0", f"link-{changed}", len(data), 0, link.parent))
        kinds.append(link.kind)
    assert kinds == ["base", "delta", "base", "base"]


def test_a_chain_with_a_link_missing_is_refused_not_loaded():
    # a base heavy enough that three small deltas stay under the chain's weight limit
    actions = [("put", k, k) for k in range(1000)] + [("checkpoint", True)]
    for n in range(3):
        actions += [("put", n, 100 + n), ("remove", 10 + n), ("checkpoint", True)]
    blobs, taken = play(actions, max_chain=5)
    ref = taken[-1][0]
    assert len(ref.chain) == 3
    links = [CODEC.decode(blobs[r.key], r.key)["link"] for r in (*ref.chain, ref)]
    # the full chain restores; one delta dropped out of it must not
    apply_links(links, [False, True])
    with pytest.raises(ValueError, match="link 2"):
        apply_links(links[:2] + links[3:], [False, True])
    with pytest.raises(ValueError, match="link 0"):
        apply_links(links[1:], [False, True])


# -- the store: manifests name every link; broken links are caught --------------------


def committed_chain(tmp_path, length=3):
    """Checkpoints 1..length of one task's chain (1 the base), each committed."""
    store = open_store(f"local://{tmp_path}")
    checkpoints = CheckpointStore(store, "job")
    chain: tuple[BlobRef, ...] = ()
    for checkpoint_id in range(1, length + 1):
        ref = checkpoints.put_chain(checkpoint_id, "op", 0, f"link {checkpoint_id}".encode(),
                                    chain)
        checkpoints.commit(checkpoint_id, [ref])
        chain = (*ref.chain, ref)
    return store, checkpoints, chain


def test_a_manifest_names_every_link_with_its_crc_and_load_reads_them_in_order(tmp_path):
    store, checkpoints, chain = committed_chain(tmp_path)
    blobs = checkpoints.manifest(3).blobs
    assert sorted(blobs) == ["op/0", "op/0#0", "op/0#1"]
    assert [checkpoints.checkpoint_of(blobs[n].key) for n in ("op/0#0", "op/0#1", "op/0")] \
        == [1, 2, 3]
    data, refs = checkpoints.load_chain(3, "op", 0)
    assert data == [b"link 1", b"link 2", b"link 3"]
    assert [checkpoints.checkpoint_of(ref.key) for ref in refs] == [1, 2, 3]
    assert [ref.key for ref in refs] == [ref.key for ref in chain]


@pytest.mark.parametrize("damage", ["delete", "flip"])
def test_a_broken_link_makes_the_checkpoint_unusable_and_names_it(tmp_path, damage):
    store, checkpoints, chain = committed_chain(tmp_path)
    link = chain[1]  # the delta stored under checkpoint 2, a link of 3's chain
    if damage == "delete":
        store.delete(link.key)
        # a missing link: the checkpoints naming it are not complete any more
        assert checkpoints.list_complete() == [1]
        assert checkpoints.latest_complete().checkpoint_id == 1
    else:
        data = bytearray(store.get(link.key))
        data[0] ^= 0x01
        store.put(link.key, bytes(data))
        assert checkpoints.list_complete() == [3, 2, 1]  # same size: only a read tells
        assert checkpoints.list_complete(verify_crc=True) == [1]
    with pytest.raises(CorruptBlobError) as failed:
        checkpoints.load_chain(3, "op", 0)
    # the failure names checkpoint 3's own blob: recovery gives up 3, not 2
    assert checkpoints.checkpoint_of(failed.value.key) == 3
    assert "link 1" in str(failed.value)
    assert checkpoints.load_chain(1, "op", 0)[0] == [b"link 1"]


def test_gc_and_discard_keep_every_link_a_kept_manifest_names(tmp_path):
    store, checkpoints, chain = committed_chain(tmp_path, length=4)
    report = checkpoints.gc(keep=1)
    assert report.kept == [4] and sorted(report.deleted) == [1, 2, 3]
    # 1..3 lost their manifests, but their links are 4's chain: kept
    assert checkpoints.load_chain(4, "op", 0)[0] == [b"link 1", b"link 2", b"link 3",
                                                     b"link 4"]
    # discard (uncoordinated's reclamation) keeps them too ...
    store2, checkpoints2, _ = committed_chain(tmp_path / "b", length=3)
    checkpoints2.discard(1)
    assert checkpoints2.load_chain(3, "op", 0)[0][0] == b"link 1"
    # ... and deletes a link once no manifest names it
    checkpoints2.discard(3)
    checkpoints2.discard(2)
    assert store2.list("jobs/job/checkpoints/00000000000000000001/") == []
    assert store2.list("jobs/job/checkpoints/") == []


def test_state_options_are_checked_where_made():
    assert bn.State() == bn.State(incremental=False)
    with pytest.raises(ValueError, match="max_chain"):
        bn.State(incremental=True, max_chain=0)
    with pytest.raises(ValueError, match="incremental"):
        bn.State(incremental="yes")


def test_random_updates_check_themselves_against_a_broken_restore():
    """The round-trip check above can fail: a restore that skips a delta's removals
    gives a state the plain-Python copy tells apart."""
    rng = random.Random(4)
    actions = [("put", rng.randrange(30), rng.randrange(9)) for _ in range(40)]
    actions += [("checkpoint", True), ("remove", actions[0][1]), ("checkpoint", True)]
    blobs, taken = play(actions, max_chain=3)
    ref, (a, _, _), _ = taken[-1]
    links = [CODEC.decode(blobs[r.key], r.key)["link"] for r in (*ref.chain, ref)]
    for form, deltas in [links[-1]["operators"][1]]:
        for _, removed in deltas:
            removed.clear()  # the broken restore: removals forgotten
    (_, (got_a, _)) = apply_links(links, [False, True])
    assert got_a != a


def test_a_restored_task_builds_on_the_restored_chain_not_on_later_links():
    # the first incarnation: a base and two deltas stored, then a third delta the
    # restore never sees (stored after the checkpoint the recovery picks)
    actions = [("put", k, k) for k in range(500)] + [("checkpoint", True)]
    actions += [("put", 1, -1), ("checkpoint", True), ("remove", 2), ("checkpoint", True)]
    actions += [("put", 3, -3), ("checkpoint", True)]
    blobs, taken = play(actions, max_chain=5)
    line_ref, (a, b, _), _ = taken[2]   # the checkpoint the recovery restores
    restored_refs = [*line_ref.chain, line_ref]
    # the new incarnation: restore that chain, then change other keys
    whole, keyed = ops = ops_pair()
    (_, tables) = restore(blobs, line_ref)
    keyed.load_tables(tables)
    assert (keyed.a, keyed.b) == (a, b)
    chain = StateChain(ops, max_chain=5, restored=restored_refs,
                       position=len(restored_refs) - 1)
    keyed.put(4, -4)
    link = chain.link([whole.snapshot(), None])
    assert link.kind == "delta" and list(link.parent) == restored_refs
    [_, [(changed_a, removed_a), _]] = link.value["operators"][1]
    assert changed_a == {4: -4} and removed_a == []   # key 3's later change is not here
    data = CODEC.encode({"link": link.value})
    blobs["new"] = data
    (_, (got_a, got_b)) = restore(blobs, ChainRef("op/0", "new", len(data), 0, link.parent))
    assert got_a == keyed.a and got_b == keyed.b and got_a[3] == 3
    # a restored chain already at max_chain makes the next link a base
    long = StateChain(ops, max_chain=2, restored=restored_refs)
    assert long.link([whole.snapshot(), None]).kind == "base"


# -- the real keyed operators ---------------------------------------------------------


def real_operator(kind: str):
    from bastion.runtime.operators import OperatorContext, make_operator

    topo = bn.Topology("inc-ops")
    keyed = topo.source("src", bn.sources.Collection([])).key_by(lambda v: v[0])
    if kind == "reduce":
        out = keyed.reduce("op", lambda acc, v: acc + [v[1]] if v[1] % 5 else acc[-2:],
                           initial=[])
    elif kind == "aggregate":
        out = keyed.reduce("op", bn.aggregations.Sum(lambda v: v[1]))
    elif kind == "count":
        out = keyed.window(bn.windows.Count(3)).aggregate(
            "op", bn.aggregations.Sum(lambda v: v[1]))
    elif kind == "join":
        other = topo.source("other", bn.sources.Collection([])).key_by(lambda v: v[0])
        out = keyed.join(other, "op", window=bn.windows.Sliding(1.0, 0.5))
    else:
        out = keyed.window(bn.windows.Tumbling(1.0)).aggregate(
            "op", bn.aggregations.Sum(lambda v: v[1]))
    out.sink("out", bn.sinks.Discard())
    return make_operator(topo.nodes["op"], OperatorContext("op", 0, 1, False))


operator_steps = st.lists(st.one_of(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 40)), min_size=1, max_size=8),
    # a batch of as many keys never seen before, and maybe a few keys of 0-12
    st.tuples(st.integers(1, 12), st.lists(st.integers(0, 12), max_size=3)),
    st.just("checkpoint"), st.just("lost checkpoint"), st.just("watermark")),
    min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["reduce", "aggregate", "count", "tumbling", "join"]), operator_steps,
       st.integers(1, 3), st.booleans())
def test_real_keyed_operators_restore_from_every_chain(kind, actions, max_chain, forked):
    """reduce (its state a list changed in place and replaced) and keyed aggregates
    (their tables only growing: a batch of new keys is taken from the table's end),
    count windows (keys removed when their window fires) and tumbling windows
    (windows removed when the watermark fires them), sliding-window joins (records
    appended to a window's sides, windows removed as the watermark passes them),
    with bases encoded on the loop or forked (which moves the share of keys that
    makes a base): restoring each checkpoint's chain into a fresh operator gives the
    very state the live one had then."""
    from bastion.runtime.records import Batch

    op = real_operator(kind)
    chain = StateChain([op], max_chain, bases_forked=lambda: forked)
    blobs: dict[str, bytes] = {}
    taken = []
    clock = 0.0
    fresh_keys = iter(range(1000, 10**6))
    if kind in ("reduce", "aggregate"):
        # keys enough that a change of a few is a delta, not a base
        actions = [[(k, k) for k in range(6 + i, 406, 50)] for i in range(50)] + actions
    for n, action in enumerate(actions):
        if isinstance(action, tuple):
            action = [(next(fresh_keys), v) for v in range(action[0])] + [
                (k, 1) for k in action[1]]
        if isinstance(action, list):
            ts = [clock + 0.1 * i for i in range(len(action))]
            clock += 0.1 * len(action)
            op.process(Batch([k for k, _ in action], [(k, v) for k, v in action], ts,
                             [0.0] * len(action)), n % 2)
        elif action == "watermark":
            op.on_watermark(clock - 0.5)
        else:
            link = chain.link([None])
            data = CODEC.encode(link.value)
            blobs[f"k{n}"] = data
            ref = ChainRef("op/0", f"k{n}", len(data), 0, link.parent)
            if action == "checkpoint":
                chain.stored(link, ref)
            # the live state then, as plain values (a copy: it changes in place)
            taken.append((ref, CODEC.decode(CODEC.encode(op.snapshot()), "live")))
    for ref, expected in taken:
        fresh = real_operator(kind)
        [tables] = apply_links([CODEC.decode(blobs[r.key], r.key)
                                for r in (*ref.chain, ref)], [True])
        fresh.load_tables(tables)
        assert fresh.snapshot() == expected


@pytest.mark.parametrize("forked", [True, False])
def test_a_growing_fold_writes_its_new_keys_from_its_tables_end(forked):
    """A keyed sum whose input brings new keys: batches of new keys only leave the
    change set alone (the keys added since the parent are the table's newest
    entries), the old keys touched are tracked, and the delta holds both — the new
    ones as the table's end, packed from the table. The appended keys weigh as a
    base's do and do not count in the share of keys that makes a base, so a growing
    state is a chain of deltas, not a base at every checkpoint, whether its bases
    are forked or not. Every link restores the live table."""
    from bastion.runtime.durable import TableEnd
    from bastion.runtime.records import Batch

    op = real_operator("aggregate")
    chain = StateChain([op], max_chain=64, bases_forked=lambda: forked)
    blobs: dict[str, bytes] = {}
    fresh = iter(range(10**6))

    def feed(keys):
        op.process(Batch(keys, [(k, 1) for k in keys], [0.0] * len(keys),
                         [0.0] * len(keys)), 0)

    def checkpoint(name):
        link = chain.link([None])
        blobs[name] = CODEC.encode(link.value)
        ref = ChainRef("op/0", name, len(blobs[name]), 0, link.parent)
        chain.stored(link, ref)
        [tables] = apply_links([CODEC.decode(blobs[r.key], r.key)
                                for r in (*ref.chain, ref)], [True])
        assert tables == [op.state]
        return link

    for _ in range(100):
        feed([next(fresh) for _ in range(100)])
    assert checkpoint("base").kind == "base"
    for n in range(3):
        size = len(op.state)
        for _ in range(20):  # 2,000 new keys: a sixth of the table, and more bytes
            feed([next(fresh) for _ in range(100)])  # than a twelfth of the base's
        feed([5, 7, 5])  # old keys
        assert set(op.changed) == {5, 7}
        link = checkpoint(f"grown-{n}")
        assert link.kind == "delta"
        [[changed, removed, end]] = link.value["operators"][0][1]
        assert set(changed) == {5, 7} and removed == []
        assert type(end) is TableEnd and end.start == size
        [[_, _, appended]] = CODEC.decode(blobs[f"grown-{n}"], "k")["operators"][0][1]
        assert appended == {k: op.state[k] for k in range(size, size + 2000)}
        assert link.appended_share == pytest.approx(2000 / 2002)
    feed([1, 2])  # a few old keys: a small delta, nothing appended
    small = checkpoint("small")
    assert small.kind == "delta" and small.appended_share == 0
    assert len(small.value["operators"][0][1][0]) == 2


@pytest.mark.parametrize("native", [True, False])
def test_a_table_end_holds_every_key_added_with_its_value_now(native, monkeypatch):
    """`TableEnd` packed in C (from the table's entry ``start`` on) and through
    msgpack (the newest entries): every key added since the table held ``start`` keys
    comes back with its value now — also when keys were removed from the table
    before then, which leaves holes in its entries (C may then add a few older keys,
    with their values now: a delta may hold more than changed, never less)."""
    from bastion.runtime import durable
    from bastion.runtime.durable import TableEnd

    if not native:
        monkeypatch.setattr(durable, "NATIVE", False)
    table = {k: [k] for k in range(1000)}
    for k in range(0, 1000, 3):
        del table[k]  # holes
    start = len(table)
    for k in range(5000, 5400):
        table[k] = ("new", k)
    table[1] = ["changed"]  # an old key changed: not the end's to hold
    got = CODEC.decode(CODEC.encode({"end": TableEnd(table, start)}), "k")["end"]
    added = {k: table[k] for k in range(5000, 5400)}
    assert {k: got[k] for k in added} == added
    assert all(got[k] == table[k] for k in got)  # any extra key: its value now
    if not native:
        assert got == added


@pytest.mark.parametrize("kind", ["tumbling", "join"])
def test_a_window_fired_between_checkpoints_is_removed_by_the_delta(kind):
    """A window untouched since the last checkpoint and fired before the next: the
    delta must say it is gone, or a restore brings back a window already fired
    (window 0: tumbling [0, 1), sliding [-0.5, 0.5) and [0, 1))."""
    from bastion.runtime.records import Batch

    op = real_operator(kind)
    chain = StateChain([op], max_chain=4)
    # ten seconds of windows: firing the first is a small change, worth a delta
    ts = [0.1 * i for i in range(100)]
    op.process(Batch([i % 3 for i in range(100)], [(i % 3, i) for i in range(100)], ts,
                     [0.0] * 100), 0)
    refs, blobs = [], {}
    for n, watermark in enumerate((None, 1.0)):
        if watermark is not None:
            op.on_watermark(watermark)
        link = chain.link([None])
        blobs[f"k{n}"] = CODEC.encode(link.value)
        ref = ChainRef("op/0", f"k{n}", len(blobs[f"k{n}"]), 0, link.parent)
        chain.stored(link, ref)
        refs.append(ref)
    assert [len(r.chain) for r in refs] == [0, 1]   # a base, then a delta on it
    fresh = real_operator(kind)
    [tables] = apply_links([CODEC.decode(blobs[r.key], r.key)
                            for r in (*refs[-1].chain, refs[-1])], [True])
    fresh.load_tables(tables)
    assert fresh.snapshot() == op.snapshot() and 0 not in op.open
