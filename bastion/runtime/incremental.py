"""Incremental keyed state: a checkpoint writes what changed, on a base written now and then.

A full checkpoint writes each task's whole state, so its cost grows with the state
held, not with the work done: a keyed reduce holding millions of keys whose input
touches a thousand writes every key at every checkpoint. With ``bn.State(incremental=
True)`` a task writes, per checkpoint, one *link* of a *chain*:

* a **base** — every keyed operator's tables whole (what a full snapshot holds), or
* a **delta** — for each keyed operator, the keys changed since the task's *parent*
  snapshot with their values now, and the keys removed since.

Restoring reads the base and the deltas after it in order: ``tables = base``, then
for each delta ``table.update(changed)`` and ``table.pop(key)`` for each removed
key. What is not keyed — sources' offsets, sinks, record counters,
watermarks, routers, a deterministic merge — is small and goes whole into every link;
a restore takes it from the newest link only.

Keyed operators (`Operator.tables`) are keyed folds (``reduce``, ``stateful_map``),
count windows (both keyed by record key), time-window aggregates and joins (keyed by
window number: a window touched since the parent goes whole into the delta — its own
``{key: acc}`` dict, or a join's records of each key —, a window fired goes as
removed). Each tracks the keys it may
have changed in ``Operator.changed``, a set it updates once per batch (a superset is
harmless: a delta holds a key's value *now*, or marks it removed when absent). The set
stops growing once it holds the share of the operator's keys that makes the next link
a base (`ChangedKeys`; the share is below): that link is a base whatever else
changes, and a state that grows by millions of keys a second would otherwise pay, at
every record, for a set it never reads.

Appended keys
    A fold's table never loses a key, and a dict keeps its keys in the order they
    were added: the keys added since the parent are the table's newest entries, as
    many as the table grew by. So a fold's batch whose every record added a key of
    its own changes no key held before, and leaves the set alone
    (`ChangedKeys.folded`); the delta holds, beside the keys the set names, the
    table's end from the parent's size on (`bastion.runtime.durable.TableEnd`),
    packed in C straight from the table: no dict of them built, no older entry read,
    about what a base costs per key — so a delta of appended keys never costs its
    writer more than a base, and is encoded on the task's loop (a forked child would
    cost the task its fork and the pages it writes meanwhile, and another core the
    child's CPU). A state that grows by new keys — sessions, ids never seen before —
    then writes what it added, not a base of everything at each checkpoint. The
    appended keys weigh in the trigger below as a base's keys do (a restore adds
    them to its tables as it adds a base's), and do not count in the share of keys
    that makes a base: a chain of 15 such deltas, each adding a 16th of the keys,
    restored in 1.31x and 1.45x a full snapshot's restore at 1 M and 4 M keys
    (`benchmarks/state.py` (c), pattern "growing"), and its deltas encoded at about
    25 ns a key.

When a base: the trigger
    The next link is a base when the task holds no keyed operator (a delta would
    save nothing), when it has no *confirmed* parent (no link of its own stored yet,
    and not restored from a checkpoint), when the parent's chain already holds
    ``max_chain`` deltas, when the deltas of the parent's chain together weigh more
    than a twelfth of its base, or when the delta would hold more than an eighth of
    an operator's keys (of its first table: a fold's keys, a window operator's
    windows: such a delta costs the writer about what a base does) — a 32nd when
    the task encodes its bases in a forked child, which costs it far less than
    encoding them on its loop. So a restore
    reads at most ``1 + max_chain`` blobs and about a twelfth more than a base's
    bytes; applying a delta whose keys are spread over a large table costs about
    five times a base's decode per byte (each key a random access into the table:
    577 ns against 106 ns a key decoded, at 4 M keys), so a restore stays within
    about 1.5 times a full snapshot's (`benchmarks/state.py` (c) measures it: 1.40x
    and 1.48x for keys updated uniformly at 4 M and 1 M keys, where an eighth let
    them reach 1.69x and 1.77x) — while a job
    whose updates touch few keys writes a base once every ``max_chain + 1``
    checkpoints: with the default 64, a base's bytes spread over 65 checkpoints are
    1.5 % of a full snapshot per checkpoint, plus the deltas.

Which snapshot may be a parent
    Only one whose upload is known to have succeeded (`StateChain.stored`): a delta
    is computed against the newest such snapshot, with the keys changed since then —
    the union of the change sets of every snapshot taken after it, kept until a later
    one is stored (`_unstored`). A snapshot whose upload failed, was cancelled, or
    has not finished yet is simply never built on. A task restored from checkpoint N
    is a new object: its chain starts from N's chain as N's manifest lists it (read,
    every link CRC-checked, by the restore itself), so its next delta holds the keys
    changed since N and names N's links — never a link its failed incarnation
    stored after N. A chain that is already long makes that next link a base.

Why a manifest never misses a link
    The blob a task acknowledges is its newest link, as a `ChainRef` naming every
    earlier link of its chain with their CRCs; the coordinator's commit writes them
    all into the checkpoint's manifest (`bastion.storage.checkpoints`). A link stored
    under a checkpoint that never completed is named by the later manifest, so GC,
    which deletes keys and keeps every key a kept manifest names, keeps it.

Compaction, off the task loop
    A delta's encode is synchronous (the state must not change under it) and costs
    what changed. A base written by the task costs a full snapshot's encode. A
    large state's (``State.fork_min_keys``) is encoded in a forked child
    (`bastion.runtime.forked_encode`): the task pays the fork and the pages it
    writes meanwhile, another core one encode of the live state — the cheapest
    base there is, so such a task writes its bases itself when the trigger says.
    A smaller state's base would be encoded on the task's loop, so it is rarely
    written there: once the parent's chain holds half of ``max_chain`` deltas, or
    its deltas weigh a 24th of its base (half of what forces a base), the task has
    the chain *compacted* in another process
    (`bastion.runtime.compaction`): the chain's blobs are read from the store,
    CRC-checked, applied in order by `apply_links` (the restore's own merge) and
    encoded as one new base. That base stands for the links it merged: its
    ``position`` is theirs (the newest's), so the deltas after them follow it as
    they followed those. The task's next link carries it (`Link.compacted`), stored
    beside the link under the same checkpoint and named first in its chain; once
    that link is stored the chain is re-rooted on it. Nothing is adopted that is not
    stored, and a compaction the chain has outgrown (a base was written meanwhile,
    or a restore replaced the chain) is dropped. Only when the chain reaches
    ``max_chain`` before a compaction lands does the task write a base itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from bastion.runtime.durable import TableEnd
from bastion.storage.checkpoints import BlobRef, ChainRef

__all__ = ["StateChain", "ChangedKeys", "Link", "Compacted", "apply_links", "BASE",
           "DELTA"]

BASE = "base"
DELTA = "delta"
_FORMAT = 1
# A new base once the deltas weigh more than a twelfth of the base: a restore decodes
# the deltas and applies them key by key, which costs about five times a base's decode
# per byte when the keys are spread over a large table, so it stays within about 1.5x
# a full snapshot's restore (`benchmarks/state.py` (c))
_RESTORE_BYTES_OVER_BASE = 12
# ... or once the next delta would hold more than an eighth of the keys: encoding it
# on the task's loop (about 150 ns a key: gathered, then encoded) would cost about
# what encoding a base there does (30 ns a key) ...
_DELTA_KEYS_OVER_ENTRIES = 8
# ... or a 32nd, when the task encodes its bases in a forked child: the task then
# pays for a base only the fork and the pages it writes while the child runs, and
# the change set of a state growing by millions of keys a second stays a quarter
# as large (a set of an eighth of 16 M keys, built and dropped every interval, cost
# 18 % more CPU per record while the keys arrived)
_FORKED_DELTA_KEYS_OVER_ENTRIES = 32
# A compaction starts at half of either trigger, so that it lands before the chain
# forces the task to write a base on its own loop.
_COMPACT_AT = 2


class ChangedKeys(set):
    """The keys an operator changed since its last link, until they are too many to
    matter: once they are more than ``1 / keys_over_entries`` of its keys (of its
    first table, as the trigger counts them) the next link is a base, so the set is
    emptied and marked ``full``, and takes nothing more. An operator calls `update`
    once per batch (and `add` per key it removes); checking the size there costs one
    call per batch, where a growing state would otherwise hash every new key into a
    set of millions (and fault in its pages) only for the set to be dropped unread.

    A fold, whose table never loses a key, calls `folded` instead: a batch whose
    every record added a key of its own leaves the set alone (``appended``), since
    the keys added since the parent are the table's newest entries, which a delta
    takes from the table's end (`StateChain`)."""

    __slots__ = ("op", "full", "keys_over_entries", "appended")

    def __init__(self, op: Any, keys_over_entries: int = _DELTA_KEYS_OVER_ENTRIES) -> None:
        super().__init__()
        self.op = op
        self.full = False
        self.keys_over_entries = keys_over_entries
        self.appended = False

    def update(self, *keys: Any) -> None:  # type: ignore[override]
        if not self.full:
            set.update(self, *keys)
            self._cap()

    def add(self, key: Any) -> None:
        if not self.full:
            set.add(self, key)
            if len(self) & 1023 == 0:  # per key: check now and then
                self._cap()

    def folded(self, keys: Any, added: int) -> None:
        """A fold's batch of ``keys`` is done, and its table holds ``added`` more
        keys than before it: as many as the batch's records, each record added a
        key, and no key the table held before changed."""
        if added and added == len(keys):
            self.appended = True
        else:
            self.update(keys)

    def _cap(self) -> None:
        if len(self) * self.keys_over_entries > len(self.op.tables()[0]):
            self.full = True
            self.clear()


@dataclass(frozen=True)
class Compacted:
    """A base made off the loop from the links ``covered`` (base first): its encoded
    blob, to be stored with the next link."""

    covered: tuple[BlobRef, ...]
    data: bytes


@dataclass
class Link:
    """One link being written: its sequence number in this task, what it is, the
    blob's value (encoded by the task), and the confirmed chain it builds on."""

    seq: int
    kind: str
    value: dict
    parent: tuple[BlobRef, ...]
    parent_delta_bytes: int
    base_bytes: int
    position: int
    #: the keyed tables' sizes when the link was taken
    lengths: tuple[tuple[int, ...], ...] = ()
    #: the share of the link's keys that are keys added since its parent, taken
    #: from the tables' ends (a base: 0)
    appended_share: float = 0.0
    #: a compacted base to store first; ``parent`` then holds the links after it
    compacted: Compacted | None = None
    #: of ``parent``'s deltas: their bytes of appended keys
    parent_appended_bytes: int = 0


@dataclass
class _Stored:
    chain: tuple[BlobRef, ...]  # base first, this snapshot's own blob last
    seq: int
    base_bytes: int
    delta_bytes: int  # of the deltas of ``chain``, but for their appended keys
    position: int  # of its newest link
    lengths: tuple[tuple[int, ...], ...]  # the keyed tables' sizes when it was taken
    appended_bytes: int = 0  # of the deltas of ``chain``: their appended keys


class StateChain:
    """One task's chain: which link comes next, and what it holds.

    ``ops`` are the task's operators; those with `tables` are tracked from now on.
    ``bases_forked`` says whether the task would encode a base taken now in a forked
    child (`bastion.runtime.forked_encode`), which makes a base cheaper for it than a
    large delta or a compaction. Not thread-safe: the task loop calls `link` and,
    when the upload is done, `stored`.
    """

    def __init__(self, ops: Sequence[Any], max_chain: int,
                 restored: Sequence[BlobRef] = (), position: int = 0,
                 bases_forked: Callable[[], bool] = lambda: False) -> None:
        self.max_chain = max_chain
        self.bases_forked = bases_forked
        self.keyed = [op.tables() is not None for op in ops]
        self.ops = list(ops)
        over = self._delta_keys_over_entries()
        for op, keyed in zip(self.ops, self.keyed):
            if keyed:
                op.changed = ChangedKeys(op, over)
        self.next_seq = 1
        # ``restored``: the chain of the checkpoint the operators were just restored
        # from, whose state they hold now: the parent of the next link
        self.parent: _Stored | None = None if not restored else _Stored(
            tuple(restored), 0, restored[0].size, sum(ref.size for ref in restored[1:]),
            position, self._lengths())
        # change sets of the snapshots taken after the parent: seq -> one set per op
        self._unstored: dict[int, list[ChangedKeys | None]] = {}
        self.compacting = False  # a compaction asked for and not landed yet
        self.compacted: Compacted | None = None

    def _links_after_compaction(self) -> tuple[tuple[BlobRef, ...], Compacted | None]:
        """The parent's chain without the links a landed compaction covers (and that
        compaction), or the whole chain; drops a compaction the chain outgrew."""
        parent = self.parent
        compacted = self.compacted
        if parent is None or compacted is None:
            return (() if parent is None else parent.chain), None
        covered = compacted.covered
        if not self.builds_on(covered):
            self.compacted = None  # a base was stored since, or the chain was replaced
            return parent.chain, None
        return parent.chain[len(covered):], compacted

    def builds_on(self, links: tuple[BlobRef, ...]) -> bool:
        """Whether the parent's chain still starts with ``links`` (a compaction of
        them would still be used)."""
        return self.parent is not None and self.parent.chain[:len(links)] == links

    def _base_due(self, chain: tuple[BlobRef, ...], compacted: Compacted | None) -> bool:
        if self.parent is None or not any(self.keyed):
            return True  # no parent; or nothing keyed, so nothing a delta would save
        base_bytes, appended_bytes, delta_bytes, deltas = self._weights(chain, compacted)
        return (deltas >= self.max_chain
                or delta_bytes * _RESTORE_BYTES_OVER_BASE > base_bytes + appended_bytes)

    def _weights(self, chain: tuple[BlobRef, ...],
                 compacted: Compacted | None) -> tuple[int, int, int, int]:
        """Of the chain the next link builds on: its base's bytes, its deltas' bytes
        of appended keys (which a restore adds to its tables as it adds a base's),
        their other bytes, and their count."""
        parent = self.parent
        assert parent is not None
        if compacted is None:
            return parent.base_bytes, parent.appended_bytes, parent.delta_bytes, len(chain) - 1
        # the links after a compaction are weighed whole: a restore applies them key
        # by key, as far as this chain knows
        return len(compacted.data), 0, sum(r.size for r in chain), len(chain)

    def _lengths(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(map(len, op.tables())) if keyed else ()
                     for op, keyed in zip(self.ops, self.keyed))

    def _delta_keys_over_entries(self) -> int:
        return (_FORKED_DELTA_KEYS_OVER_ENTRIES if self.bases_forked()
                else _DELTA_KEYS_OVER_ENTRIES)

    def compaction_wanted(self) -> tuple[BlobRef, ...] | None:
        """The chain to compact off the loop now, or None: when the parent's chain is
        half-way to forcing a base, no compaction is under way or waiting, and the
        task would write that base on its loop. Never when its bases are forked: a
        forked base costs the task the fork, and another core one encode of the live
        state, where a compaction costs that core reading, decoding and applying the
        whole chain before the same encode (6.4 s of CPU against about 1 at 16 M
        keys), beside a task that may need that core."""
        parent = self.parent
        if (parent is None or self.compacting or self.compacted is not None
                or self.bases_forked()):
            return None
        deltas = len(parent.chain) - 1
        if deltas < 1:
            return None
        if (deltas * _COMPACT_AT >= self.max_chain or parent.delta_bytes
                * _RESTORE_BYTES_OVER_BASE * _COMPACT_AT
                > parent.base_bytes + parent.appended_bytes):
            self.compacting = True
            return parent.chain
        return None

    def compaction_landed(self, compacted: Compacted | None) -> None:
        """The compaction asked for ended: with its base, or None if it failed (the
        next stored link may ask again)."""
        self.compacting = False
        self.compacted = compacted

    def link(self, others: list[Any]) -> Link:
        """The next link, taken now: ``others[i]`` is operator i's `snapshot` (used
        for the operators that are not keyed). The caller encodes ``Link.value``
        before the state changes, stores it and calls `stored` when that succeeded."""
        seq = self.next_seq
        self.next_seq += 1
        forked = self.bases_forked()
        over = _FORKED_DELTA_KEYS_OVER_ENTRIES if forked else _DELTA_KEYS_OVER_ENTRIES
        taken = []
        for op, keyed in zip(self.ops, self.keyed):
            if keyed:
                taken.append(op.changed)
                op.changed = ChangedKeys(op, over)
            else:
                taken.append(None)
        self._unstored[seq] = taken
        lengths = self._lengths()
        chain, compacted = self._links_after_compaction()
        base = self._base_due(chain, compacted)
        parent = self.parent
        changes: list[set] = []
        appended: list[tuple[int, ...]] = []  # per table: keys added since the parent
        for i, keyed in enumerate(self.keyed):
            keys: set = set()
            added: tuple[int, ...] = ()
            if keyed and not base:
                assert parent is not None  # or a base is due
                # a delta of much of the state costs what a base does, and makes a
                # restore read both: decided from each set before any is merged
                sets: list = [taken_sets[i] for taken_sets in self._unstored.values()]
                limit = len(self.ops[i].tables()[0])
                base = any(s.full or len(s) * over > limit for s in sets)
                if not base:
                    keys = sets[0] if len(sets) == 1 else set().union(*sets)
                    if any(s.appended for s in sets):
                        # keys the operator left to its tables' ends: as many as
                        # the tables grew by since the parent
                        added = tuple(now - then for now, then
                                      in zip(lengths[i], parent.lengths[i]))
                    # appended keys are packed straight from the table, as a
                    # base's are: they never cost more than a base would
                    base = min(added, default=0) < 0 or len(keys) * over > limit
            changes.append(keys)
            appended.append(added)
        if base or parent is None:
            chain, compacted, base_bytes, appended_bytes, delta_bytes = (), None, 0, 0, 0
        else:
            base_bytes, appended_bytes, delta_bytes, _ = self._weights(chain, compacted)
        operators: list[Any] = []
        for i, (op, keyed, other, keys, added) in enumerate(zip(
                self.ops, self.keyed, others, changes, appended)):
            if not keyed:
                operators.append(["whole", other])
            elif base:
                operators.append(["tables", op.tables()])
            else:
                assert parent is not None
                operators.append(["delta", [
                    _delta(table, keys, start if added and added[t] else None)
                    for t, (table, start) in enumerate(zip(op.tables(),
                                                           parent.lengths[i]))]])
        position = 0 if base or parent is None else parent.position + 1
        kind = BASE if base else DELTA
        value = {"format": _FORMAT, "kind": kind, "position": position,
                 "operators": operators}
        appended_keys = sum(map(sum, appended))
        delta_keys = appended_keys + sum(map(len, changes))
        return Link(seq, kind, value, chain, delta_bytes, base_bytes, position, lengths,
                    appended_keys / delta_keys if delta_keys else 0.0, compacted,
                    appended_bytes)

    def stored(self, link: Link, ref: ChainRef) -> None:
        """``link`` is stored as ``ref`` (whose ``chain`` names the links before it,
        a compacted base first if the link carried one): it may be the parent of the
        next one (if no later link was stored before it)."""
        if self.parent is not None and self.parent.seq > link.seq:
            return
        if link.kind == BASE:
            self.parent = _Stored((ref,), link.seq, ref.size, 0, link.position,
                                  link.lengths)
        else:
            appended = round(ref.size * link.appended_share)
            self.parent = _Stored((*ref.chain, ref), link.seq, link.base_bytes,
                                  link.parent_delta_bytes + ref.size - appended,
                                  link.position, link.lengths,
                                  link.parent_appended_bytes + appended)
        for seq in [s for s in self._unstored if s <= link.seq]:
            del self._unstored[seq]


def _delta(table: dict, keys: set, appended_from: int | None) -> list:
    """``[changed, removed]`` of ``table`` over ``keys``: the keys present with their
    values now, and the keys absent — and, with ``appended_from`` (the table's size at
    the parent), the keys added since as a third element, a `TableEnd` packed straight
    from the table. In C loops (set operations, ``map``), not a Python pass per key."""
    present = table.keys() & keys
    delta: list[Any] = [dict(zip(present, map(table.__getitem__, present))),
                        list(keys - present)]
    if appended_from is not None:
        delta.append(TableEnd(table, appended_from))
    return delta


def apply_links(links: Sequence[dict], keyed: Sequence[bool]) -> list[Any]:
    """The operators' state from a chain's decoded links, base first: per operator,
    its tables (keyed) or its `snapshot` value from the newest link. `ValueError` if
    the links do not make a chain (a base, then deltas, positions in order)."""
    if not links:
        raise ValueError("an empty state chain")
    first = links[0].get("position") if isinstance(links[0], dict) else None
    if not isinstance(first, int) or first < 0:
        raise ValueError(f"the base of a state chain has no position ({first!r})")
    for i, value in enumerate(links):
        # a compacted base stands for the links it merged: it has the newest one's
        # position, and the deltas after it follow on
        kind = BASE if i == 0 else DELTA
        if (not isinstance(value, dict) or value.get("format") != _FORMAT
                or value.get("kind") != kind or value.get("position") != first + i
                or len(value.get("operators", ())) != len(keyed)):
            raise ValueError(f"link {i} of a state chain is not its {kind} at position "
                             f"{first + i} (kind "
                             f"{value.get('kind') if isinstance(value, dict) else '?'!r}, "
                             f"position {value.get('position') if isinstance(value, dict) else '?'})")
    state: list[Any] = []
    for i, is_keyed in enumerate(keyed):
        if not is_keyed:
            form, value = links[-1]["operators"][i]
            if form != "whole":
                raise ValueError(f"operator {i}: {form!r} state where whole was expected")
            state.append(value)
            continue
        form, tables = links[0]["operators"][i]
        if form != "tables":
            raise ValueError(f"operator {i}: a base holding {form!r}, not tables")
        for link in links[1:]:
            form, deltas = link["operators"][i]
            if form != "delta" or len(deltas) != len(tables):
                raise ValueError(f"operator {i}: a delta holding {form!r}")
            for table, delta in zip(tables, deltas):
                if not isinstance(delta, list) or len(delta) not in (2, 3):
                    raise ValueError(f"operator {i}: a table's delta is not [changed, "
                                     "removed(, appended)]")
                table.update(delta[0])
                for key in delta[1]:
                    table.pop(key, None)
                if len(delta) == 3:
                    table.update(delta[2])
        state.append(tables)
    return state
