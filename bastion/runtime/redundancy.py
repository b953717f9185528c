"""Tuple-level redundancy: copies of tuples on a second instance, the first one wins.

A stalled instance (a garbage collection, a noisy neighbour, a slow disk) holds back
every tuple queued behind it: under timing faults the tail latency of a job is the
latency of its slowest instance. Redundancy (Dynamo thesis §3.2.2) sends a share of
the tuples into an operator to two instances: the one its grouping picks and the
*next* one (the picked index + 1 modulo the parallelism; a ratio above 1.0 gives some
tuples a second copy on + 2). Whichever instance is free processes its copy first,
and the operator downstream keeps only the first copy of each tuple id and drops the
later ones.

``bn.run(..., redundancy=r)`` replicates the inputs of every operator that can take
copies (a ratio from 0.0 to 2.0), or ``redundancy={"op": r, ...}`` of the named ones.
What makes it sound:

- **Which tuples get copies.** A keyed edge picks whole *keys* (a share ``r`` of
  them, by a hash of the key), so the next instance sees every tuple of a replicated
  key and keeps a complete replica of its state: its results are the primary's.
  Other edges pick tuples by a hash of their lineage id (`bastion.lineage`). A
  rebalanced edge into the copying operator deals whole batches round-robin, as
  without copies, and sends the picked tuples' copies on to the next instance; an
  edge that carries copies made upstream picks the primary instance by the id hash
  too, so copies of one tuple always meet downstream.
- **Where the copies meet.** An operator that receives copies never shares a chain
  with what follows it: its results cross a channel, and that edge routes an unkeyed
  tuple by its id (a keyed one by its key), so both copies of a result reach the same
  instance, which drops the later one (`FirstCopies`). Sinks never receive copies:
  nothing after a sink could drop the second.
- **How long a copy is remembered.** A receiving task remembers the ids it has seen
  for ``dedup_window_s`` to twice that, in two generations of sets: memory bounded by
  the rate, and a copy later than that is processed again (at-least-once allows it).
  Under protocol ``acks`` the window must be shorter than half the ack timeout, so a
  replayed root is never mistaken for a copy.

Copies give the same results only under protocols that allow a tuple to be processed
twice: ``none`` and ``acks`` (`Protocol.tolerates_copies`). A stateful operator whose
input for one key comes from several upstream instances may see it in another order
on the replica: its per-record results (a running count) may then differ between the
copies, and the first one wins.
"""

from __future__ import annotations

import time
from numbers import Real
from typing import Any, Mapping, cast

from bastion.errors import TopologyError
from bastion.lineage import fold, record_hashes

MAX_RATIO = 2.0   # at most two extra copies of a tuple
_SHARE_SEED = 0x2545F4914F6CDD1D
_SHARE_SCALE = 1.0 / (1 << 32)
_CANNOT_COPY = {"source": "a source reads its input: nothing sends it tuples to copy",
                "sink": "nothing after a sink could drop the second copy it writes"}


def resolve(topology: Any, redundancy: float | Mapping[str, float] | str | None,
            initial_ratio: float = 0.0) -> dict[str, float]:
    """The redundancy ratio of every operator that receives copies.

    A number applies to every operator that can take copies (those above 0 receive
    them); a dict names operators, and one that cannot take copies (a source, a sink,
    parallelism 1, a feedback input) raises `TopologyError` naming it. ``"auto"``:
    every operator that can take copies, at ``initial_ratio`` (0 included), since the
    resiliency manager moves the ratio while the job runs."""
    if redundancy is None:
        return {}
    nodes = topology.nodes
    if isinstance(redundancy, str):
        if redundancy != "auto":
            raise ValueError(f"redundancy must be a number, a dict operator -> number, "
                             f"or 'auto'; got {redundancy!r}")
        copied = {name: initial_ratio for name, node in nodes.items()
                  if _why_not(node) is None}
        if not copied:
            raise TopologyError(f"redundancy='auto': no operator of topology "
                                f"{topology.name!r} can receive copies (each is a source, "
                                "a sink or of parallelism 1)")
        return copied
    if isinstance(redundancy, Mapping):
        unknown = [name for name in redundancy if name not in nodes]
        if unknown:
            raise TopologyError(f"redundancy names {unknown[0]!r}, which is not an operator "
                                f"of topology {topology.name!r} (it has {sorted(nodes)})")
        ratios = {name: _ratio(value, f"redundancy[{name!r}]")
                  for name, value in redundancy.items()}
        for name, ratio in ratios.items():
            reason = _why_not(nodes[name])
            if ratio > 0 and reason is not None:
                raise TopologyError(f"redundancy: operator {name!r} of topology "
                                    f"{topology.name!r} cannot receive copies: {reason}")
    else:
        ratio = _ratio(redundancy, "redundancy")
        ratios = {name: ratio for name, node in nodes.items() if _why_not(node) is None}
    return {name: ratio for name, ratio in ratios.items() if ratio > 0}


def _ratio(value: Any, what: str) -> float:
    # a Real compares as a float does; typeshed's numbers.Real declares only < and <=
    if isinstance(value, bool) or not isinstance(value, Real) \
            or not 0.0 <= cast(float, value) <= MAX_RATIO:
        raise ValueError(f"{what} must be a number from 0.0 to {MAX_RATIO}, got {value!r}")
    return float(value)


def _why_not(node: Any) -> str | None:
    if node.kind in _CANNOT_COPY:
        return _CANNOT_COPY[node.kind]
    if node.parallelism < 2:
        return "it has parallelism 1, so there is no next instance to copy to"
    if any(inp.feedback for inp in node.inputs):
        return "it closes a cycle (feedback edge)"
    return None


def copy_shares(hashes: list[int]) -> list[float]:
    """A number in [0, 1) per record, from its routing hash: a record gets a first copy
    when its share is below the ratio, a second when below the ratio - 1. Mixed apart
    from the hash's low bits, which pick the primary instance."""
    return [(fold(_SHARE_SEED, h) >> 32) * _SHARE_SCALE for h in hashes]


class FirstCopies:
    """Which records of a receiving task are the first copy of their tuple.

    Two generations of hashes: ``current`` since the last turn, ``previous`` the turn
    before; a turn comes every ``window_s``, so an id is remembered for one to two
    windows."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.current: set[int] = set()
        self.previous: set[int] = set()
        self.turned_s = time.monotonic()
        self.dropped = 0
        self.max_remembered = 0

    def peak_remembered(self) -> int:
        """The most ids held at once (the memory the window cost)."""
        return max(self.max_remembered, len(self.current) + len(self.previous))

    def keep(self, ids: Any) -> list[int] | None:
        """Positions of the records of id column ``ids`` to process, or None for all."""
        now_s = time.monotonic()
        if now_s - self.turned_s >= self.window_s:
            self.max_remembered = max(self.max_remembered,
                                      len(self.current) + len(self.previous))
            self.previous, self.current = self.current, set()
            self.turned_s = now_s
        current, previous = self.current, self.previous
        hashes = record_hashes(ids)
        fresh = set(hashes)
        if len(fresh) == len(hashes) and current.isdisjoint(fresh) \
                and previous.isdisjoint(fresh):
            current |= fresh
            return None   # the common case: every record is new
        keep = []
        for i, h in enumerate(hashes):   # a copy may also repeat within one batch
            if h not in current and h not in previous:
                current.add(h)
                keep.append(i)
        self.dropped += len(hashes) - len(keep)
        return keep
