"""Deterministic merge: a task with several inputs consumes them in a fixed order.

A task fed by several channels normally processes frames in the order they arrive,
which depends on timing: two correct runs of a running ``reduce`` behind a parallel
stage see different interleavings and commit different intermediate values, and a
recovery may legitimately compute another history than the run it replaces.

In *deterministic mode* (``bn.run(topo, deterministic=True)``) a task instead takes
its input channels in turn, a fixed number of records each (``TURN_RECORDS``), in
channel order: a *round robin by record count*. Arrival order, frame boundaries and
batch sizes never change which record comes next, so the task computes the same
sequence in every run; with every other source of nondeterminism also pinned —
sources replay by offset, rebalance edges route record by record round robin, keys
by a stable hash — every task of the job sees the same input sequence in every run,
after every recovery. Control records do not count: a watermark is handled when the
merge reaches it, and an end-of-stream takes its channel out of the rotation.

The merge keeps a queue per channel. Frames are admitted into the queues (and count
as *received*, for the protocols) only while the channel whose turn it is has nothing
queued; frames of the other channels then wait in their queues. That is how a
deterministic merge avoids the deadlock bounded buffers cause on reconvergent paths
(the merge waits for a sparse channel while a busy one has filled its buffer and
stalled the common upstream): senders are never held back by the merge's order, at
the price of queues that grow with the skew between channels.

The merge's position (whose turn, how many records are left in it, which channels
ended) and its queued elements are part of the task's checkpointed state: a restored
task resumes the very sequence it was computing.

Not every topology can be deterministic: a feedback edge makes a task's input depend
on its own output timing, and windows on ingest time depend on the wall clock.
`nondeterminism` says why a topology cannot.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable

from bastion import windows as window_specs
from bastion.runtime.records import Batch, EndOfStream, FrameCodec

# Records a channel contributes per turn. Large enough that a turn costs little next
# to its records, small enough that a sparse channel is not waited on for long.
TURN_RECORDS = 256


def nondeterminism(topology: Any) -> str | None:
    """Why ``topology`` cannot run deterministically, or None if it can."""
    nodes = topology.nodes
    for node in nodes.values():
        for inp in node.inputs:
            if inp.feedback:
                return (f"the feedback edge {inp.upstream!r} -> {node.name!r} closes a "
                        f"cycle: what operator {node.name!r} receives depends on the "
                        "timing of its own output")
    for name, source in clock_dependent_operators(topology).items():
        return (f"operator {name!r} windows on ingest time: source "
                f"{source!r} has no timestamp function, so which window a "
                "record falls in depends on the wall clock; pass "
                f"timestamp=... to topo.source({source!r}, ...)")
    return None


def clock_dependent_operators(topology: Any) -> dict[str, str]:
    """Windows and joins on ingest time: operator name -> a source without a timestamp
    function upstream of it. Which window such an operator puts a record in — and so
    its outputs and their lineage ids — depends on when the run happens."""
    nodes = topology.nodes
    found: dict[str, str] = {}
    for node in nodes.values():
        timed = (node.kind == "join" or (node.kind == "window" and not isinstance(
            node.params["spec"], window_specs.Count)))
        if not timed:
            continue
        for source in _upstream_sources(topology, node.name):
            if nodes[source].params["timestamp"] is None:
                found[node.name] = source
                break
    return found


def _upstream_sources(topology: Any, name: str) -> list[str]:
    nodes, seen, stack, found = topology.nodes, set(), [name], []
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if nodes[current].kind == "source":
            found.append(current)
        stack.extend(inp.upstream for inp in nodes[current].inputs)
    return sorted(found)


class DeterministicMerge:
    """Per-channel queues and the round-robin cursor over them."""

    def __init__(self, channel_ids: Iterable[int], turn_records: int = TURN_RECORDS):
        self.turn_records = turn_records
        self.active: list[int] = sorted(channel_ids)  # channels in the rotation
        self.queues: dict[int, collections.deque] = {c: collections.deque()
                                                      for c in self.active}
        self.turn = 0                    # index into ``active``: whose turn it is
        self.left = turn_records         # records left in the current turn
        self.ended_on_arrival: set[int] = set()  # channels whose end-of-stream is queued
        # Channel captures: records that arrive after a snapshot and belong to it
        # (unaligned checkpoints), per capture: {channel: [elements]} for the channels
        # it still waits on.
        self.captures: list[dict[int, list]] = []

    # -- arrival ------------------------------------------------------------------------

    def push(self, channel_id: int, element: Any) -> None:
        """Queue a batch, watermark or end-of-stream that arrived on ``channel_id``."""
        self.queues[channel_id].append(element)
        if type(element) is EndOfStream:
            self.ended_on_arrival.add(channel_id)
        for capture in self.captures:
            if channel_id in capture:
                capture[channel_id].append(element)

    def waiting(self) -> int | None:
        """The channel the merge waits for (its turn, nothing queued), or None."""
        if not self.active:
            return None
        channel_id = self.active[self.turn]
        return None if self.queues[channel_id] else channel_id

    # -- the fixed order ------------------------------------------------------------------

    def next(self) -> tuple[int, Any] | None:
        """The next element in merge order, or None when the channel whose turn it is
        has nothing queued (admit more frames) or every channel ended."""
        while self.active:
            channel_id = self.active[self.turn]
            queue = self.queues[channel_id]
            if not queue:
                return None
            element = queue[0]
            if type(element) is not Batch:
                queue.popleft()
                if type(element) is EndOfStream:
                    del self.active[self.turn]
                    self._new_turn(self.turn)
                return channel_id, element
            n = len(element)
            if n == 0:
                queue.popleft()
                continue
            if len(self.active) == 1:  # a single channel: its order is the order
                queue.popleft()
                return channel_id, element
            if n < self.left:
                queue.popleft()
                self.left -= n
                return channel_id, element
            if n > self.left:
                head, queue[0] = element.slice(0, self.left), element.slice(self.left, n)
                element = head
            else:
                queue.popleft()
            self._new_turn(self.turn + 1)
            return channel_id, element
        return None

    def _new_turn(self, position: int) -> None:
        self.turn = position % len(self.active) if self.active else 0
        self.left = self.turn_records

    # -- captures for unaligned checkpoints ------------------------------------------------

    def capture(self, channel_ids: Iterable[int]) -> dict[int, list]:
        """Start recording what arrives on ``channel_ids`` from now on."""
        capture: dict[int, list] = {c: [] for c in channel_ids}
        if capture:
            self.captures.append(capture)
        return capture

    def end_capture(self, capture: dict[int, list], channel_id: int) -> list:
        """Stop recording ``channel_id`` for ``capture``; the elements it recorded."""
        recorded = capture.pop(channel_id, [])
        if not capture and capture in self.captures:
            self.captures.remove(capture)
        return recorded

    # -- checkpoints ----------------------------------------------------------------------

    def snapshot(self, codec: FrameCodec) -> Any:
        return {"active": list(self.active), "turn": self.turn, "left": self.left,
                "ended_on_arrival": sorted(self.ended_on_arrival),
                "queues": {c: codec.encode(list(q)) for c, q in self.queues.items() if q}}

    def restore(self, state: Any, codec: FrameCodec) -> None:
        self.active = list(state["active"])
        self.turn, self.left = state["turn"], state["left"]
        self.ended_on_arrival = set(state["ended_on_arrival"])
        for queue in self.queues.values():
            queue.clear()
        for channel_id, data in state["queues"].items():
            for element in codec.decode(data):
                self.push(channel_id, element)

    def resume(self, consumed: dict[int, int], ended: set[int]) -> None:
        """Put the cursor where it stood once ``consumed[c]`` records of each channel
        had been merged (and the channels in ``ended`` had ended), for a replay that
        delivers each channel's records from there on. The order is a round robin by
        record count, so the cursor follows from the counts: play the turns again."""
        remaining = {c: consumed.get(c, 0) for c in self.active}
        active, turn, left = list(self.active), 0, self.turn_records
        while active:
            channel_id = active[turn]
            if remaining[channel_id] == 0:
                if channel_id not in ended:
                    break  # the merge waits for this channel: the cursor is here
                del active[turn]  # its end-of-stream was merged at its turn
                turn, left = (turn % len(active) if active else 0), self.turn_records
                continue
            if len(active) == 1:  # a single channel takes everything, turns unchanged
                remaining[channel_id] = 0
                continue
            take = min(left, remaining[channel_id])
            remaining[channel_id] -= take
            left -= take
            if left == 0:
                turn, left = (turn + 1) % len(active), self.turn_records
        self.active, self.turn, self.left = active, turn, left
        self.ended_on_arrival = {c for c in ended}

    def extend(self, channel_id: int, elements: Iterable[Any]) -> None:
        """Queue elements recorded by a capture (on restore, after the snapshot's)."""
        for element in elements:
            self.push(channel_id, element)
