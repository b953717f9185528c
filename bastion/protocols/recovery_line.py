"""Recovery lines for uncoordinated checkpoints: the checkpoint graph and rollback propagation.

Under the uncoordinated protocol (CheckMate §III-B) every task instance — a *process*
here — checkpoints on its own timer, without markers. Each checkpoint records, per
channel, the sequence number of the last message the process had *sent* on each of its
output channels and the last message it had *received* on each of its input channels.
Channels are FIFO with per-channel sequence numbers from 0, so "last received = 4" means
messages 0..4 were received and -1 means none. Every process also has an implicit
initial checkpoint, number 0, with nothing sent or received.

After a failure every process restarts from one of its checkpoints. The chosen set, one
checkpoint per process, is the *recovery line*, and it must describe a state the
execution could have been in:

- A message m on channel p→q is an **orphan** of checkpoints (Cp, Cq) when Cq records m
  as received but Cp does not record it as sent (``received_by_q > sent_by_p``). After
  restarting from the line, q's state would reflect a message that p — having rolled
  back to before sending it — may now never send, or send differently. A line is
  *consistent* iff it has no orphan.
- A message sent before Cp and received after Cq is merely **in flight**; that is fine,
  because the sender logs what it sends, and replay resumes each channel right after
  the receiver's last received message (`replay_from`). Receivers drop replayed
  messages they already have, by sequence number, which makes the result exactly-once.

**Rollback propagates.** If q's latest checkpoint holds an orphan from p, q must roll
back to an earlier checkpoint; but q's earlier checkpoint has sent less, which can
orphan messages that r's checkpoint received, so r rolls back too, and so on.

**The domino effect.** With cyclic communication the propagation can come back around:
q's rollback forces p further back, which forces q further back again, until every
process is at its initial state and all the work since the start is lost (CheckMate
Fig. 5). A checkpoint that belongs to no consistent line at all is *invalid* (useless):
it lies on a Z-cycle (Netzer & Xu). Communication-induced checkpointing (`hmnr`) forces
extra checkpoints to break such cycles before they form.

**Finding the line** (Wang et al., "Checkpoint space reclamation for uncoordinated
checkpointing in message-passing systems", IEEE TPDS 1995 — CheckMate's [47] and its
Algorithm 1). The *checkpoint graph* has a node per checkpoint and an edge

- C(p,i) → C(p,i+1) between consecutive checkpoints of one process, and
- C(p,i) → C(q,j) when some message p sent after C(p,i) was received by q before
  C(q,j): if C(p,i) is in the line, q must be strictly below j.

Rollback propagation puts every process's latest checkpoint in a root set, marks every
node strictly reachable (path of ≥ 1 edge) from a root, replaces each marked root by its
process's latest unmarked checkpoint, marks again, and stops when no root is marked.
The result is the *most recent* consistent line: consistent lines are closed under
taking each process's later checkpoint (sent/received counts only grow), so a unique
maximal one exists, and rollback propagation never skips past it.

The functions below build a `CheckpointGraph` per call; build the graph once to ask it
several questions. Channels are given as ``{channel_id: (src_process, dst_process)}``
(the runtime's integer channel ids fit; `Channel` names the pair), and checkpoints are
named ``(process, number)``. Processes are any hashable ids, e.g. task ids or
``(operator, index)``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, TypeAlias

# Any hashable value (the runtime uses task and channel ids, the tests letters): Any,
# not Hashable, so that a caller's dict[int, ...] is a Mapping[Process, ...] as well
Process: TypeAlias = Any
ChannelId: TypeAlias = Any
CheckpointId: TypeAlias = tuple[Process, int]   # (process, checkpoint number)

NOTHING = -1          # "no message sent / received yet" on a channel
INITIAL = 0           # number of every process's implicit initial checkpoint


class Channel(NamedTuple):
    """The endpoints of a FIFO channel: messages flow from ``src`` to ``dst``."""

    src: Process
    dst: Process


@dataclass(frozen=True)
class CheckpointRecord:
    """What one checkpoint says about the channels of its process.

    ``sent[c]`` is the sequence number of the last message sent on output channel ``c``
    before the checkpoint, ``received[c]`` the last one received on input channel ``c``;
    a channel that is absent (or ``-1``) had nothing sent / received. ``number`` grows
    with every checkpoint of the process and starts at 1 (0 is the implicit initial
    checkpoint); gaps are allowed, e.g. after garbage collection.
    """

    process: Process
    number: int
    sent: Mapping[ChannelId, int] = field(default_factory=dict, hash=False)
    received: Mapping[ChannelId, int] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 1:
            raise ValueError(f"checkpoint of {self.process!r}: number must be an int >= 1 "
                             f"(0 is the implicit initial checkpoint), got {self.number!r}")
        for name in ("sent", "received"):
            counters = dict(getattr(self, name))
            for channel, seq in counters.items():
                if isinstance(seq, bool) or not isinstance(seq, int) or seq < NOTHING:
                    raise ValueError(f"checkpoint {self.number} of {self.process!r}: {name} "
                                     f"on channel {channel!r} must be an int >= -1, got {seq!r}")
            # A read-only copy: the record stays what it was when the checkpoint was taken.
            object.__setattr__(self, name, MappingProxyType(counters))


class CheckpointGraph:
    """The checkpoint graph of one execution, and the questions recovery asks of it."""

    def __init__(self, records: Iterable[CheckpointRecord],
                 channels: Mapping[ChannelId, tuple[Process, Process]],
                 processes: Iterable[Process] = ()):
        """``processes`` names processes the records and channels may not: a process
        with no channel whose every checkpoint is gone (reclaimed, or excluded as
        damaged) is still one, at its initial checkpoint, in every line."""
        self._channels = {cid: Channel(*ends) for cid, ends in channels.items()}
        by_process: dict[Process, dict[int, CheckpointRecord]] = {
            p: {} for p in processes}
        for channel in self._channels.values():
            by_process.setdefault(channel.src, {})
            by_process.setdefault(channel.dst, {})
        for record in records:
            own = by_process.setdefault(record.process, {})
            if record.number in own:
                raise ValueError(f"two records for checkpoint {record.number} of "
                                 f"{record.process!r}")
            own[record.number] = record
            self._check_endpoints(record)

        # Per process, its checkpoint numbers in order (initial first); per channel, the
        # sender's `sent` and the receiver's `received` at each of those checkpoints.
        self._numbers: dict[Process, list[int]] = {
            p: [INITIAL, *sorted(own)] for p, own in by_process.items()}
        self._position = {(p, n): k for p, nums in self._numbers.items()
                          for k, n in enumerate(nums)}
        self._sent: dict[ChannelId, list[int]] = {}
        self._received: dict[ChannelId, list[int]] = {}
        for cid, (src, dst) in self._channels.items():
            self._sent[cid] = self._counters(by_process[src], self._numbers[src], "sent", cid)
            self._received[cid] = self._counters(by_process[dst], self._numbers[dst],
                                                 "received", cid)
        self._outputs: dict[Process, list[ChannelId]] = {p: [] for p in self._numbers}
        for cid, channel in self._channels.items():
            self._outputs[channel.src].append(cid)
        self._successors = {node: tuple(self._edges_from(*node)) for node in self._position}

    # -- the graph ---------------------------------------------------------------------

    @property
    def processes(self) -> tuple[Process, ...]:
        return tuple(self._numbers)

    def checkpoints(self, process: Process) -> tuple[int, ...]:
        """Checkpoint numbers of ``process``, oldest first, starting with the initial 0."""
        return tuple(self._numbers[process])

    def successors(self, checkpoint: CheckpointId) -> tuple[CheckpointId, ...]:
        """Checkpoints with an edge from ``checkpoint``.

        Besides the edge to the process's next checkpoint, there is one edge per output
        channel: to the *earliest* checkpoint of the receiver that holds an orphan of
        ``checkpoint``. The paper draws an edge to every such checkpoint; the later ones
        are reachable from the earliest through the receiver's own chain, so
        reachability — all that rollback propagation looks at — is the same.
        """
        return self._successors[self._node(checkpoint)]

    # -- recovery ----------------------------------------------------------------------

    def recovery_line(self, containing: Iterable[CheckpointId] = ()
                      ) -> dict[Process, int] | None:
        """The most recent consistent line, by rollback propagation (CheckMate Alg. 1).

        With ``containing``, the most recent consistent line that includes those
        checkpoints, or None if there is none (after Y.-M. Wang, "Consistent global
        checkpoints that contain a given set of local checkpoints", IEEE TC 1997: the
        given checkpoints stay pinned in the root set; if one is marked, there is none).

        The paper marks roots reachable from *other* roots; this marks any node reachable
        from a root. The two agree on every real execution, whose checkpoint graph is
        acyclic (each path follows a causal chain of messages), and marking a root that
        reaches itself is right for records that describe an impossible execution.
        """
        pinned: dict[Process, int] = {}
        for process, number in containing:
            self._node((process, number))
            if pinned.setdefault(process, number) != number:
                return None   # one line holds one checkpoint per process
        roots = {p: pinned.get(p, nums[-1]) for p, nums in self._numbers.items()}
        marked: set[CheckpointId] = set()
        newcomers = list(roots.items())
        while True:
            # Marks only grow, and everything reachable from a marked node is marked,
            # so only the roots that just joined need exploring.
            self._mark_strictly_reachable(newcomers, marked)
            stale = [p for p, n in roots.items() if (p, n) in marked]
            if not stale:
                return roots
            if any(p in pinned for p in stale):
                return None
            newcomers = []
            for p in stale:
                roots[p] = self._latest_unmarked(p, marked)
                newcomers.append((p, roots[p]))

    def is_consistent(self, line: Mapping[Process, int]) -> bool:
        """Whether ``line`` (one checkpoint number per process) has no orphan message."""
        return not self.orphan_channels(line)

    def orphan_channels(self, line: Mapping[Process, int]) -> list[ChannelId]:
        """Channels on which ``line`` has an orphan message (none: the line is consistent)."""
        self._check_line(line)
        return [cid for cid in self._channels
                if self._received_at(cid, line) > self._sent_at(cid, line)]

    def invalid_checkpoints(self) -> set[CheckpointId]:
        """Checkpoints that belong to no consistent line (they lie on a Z-cycle).

        Judged against the checkpoints recorded so far: a checkpoint that received a
        message its sender sent after the sender's latest checkpoint is invalid now and
        may become valid once the sender checkpoints again.
        """
        valid: set[CheckpointId] = set()
        invalid: set[CheckpointId] = set()
        for node in self._position:
            if node in valid:
                continue
            line = self.recovery_line(containing=[node])
            if line is None:
                invalid.add(node)
            else:
                valid.update(line.items())   # every member of a consistent line is valid
        return invalid

    def replay_from(self, line: Mapping[Process, int]) -> dict[ChannelId, int]:
        """Per channel, the first sequence number the receiver needs after restoring ``line``.

        That is the receiver's last received message at its line checkpoint + 1: replay
        from the sender's in-flight log starts there, and anything at or below it that
        arrives again is a duplicate to drop. ``line`` must be consistent.
        """
        orphans = self.orphan_channels(line)
        if orphans:
            raise ValueError(f"line {dict(line)!r} is not consistent: orphan messages on "
                             f"channels {orphans!r}")
        return {cid: self._received_at(cid, line) + 1 for cid in self._channels}

    # -- internals ---------------------------------------------------------------------

    def _check_endpoints(self, record: CheckpointRecord) -> None:
        for name, end in (("sent", "src"), ("received", "dst")):
            for cid in getattr(record, name):
                channel = self._channels.get(cid)
                if channel is None:
                    raise ValueError(f"checkpoint {record.number} of {record.process!r} "
                                     f"names unknown channel {cid!r}")
                if getattr(channel, end) != record.process:
                    raise ValueError(f"checkpoint {record.number} of {record.process!r} "
                                     f"reports {name} on channel {cid!r}, whose {end} is "
                                     f"{getattr(channel, end)!r}")

    @staticmethod
    def _counters(records: Mapping[int, CheckpointRecord], numbers: list[int], name: str,
                  cid: ChannelId) -> list[int]:
        values = [NOTHING] + [getattr(records[n], name).get(cid, NOTHING) for n in numbers[1:]]
        for n, before, after in zip(numbers[1:], values, values[1:]):
            if after < before:
                # A process cannot unsend or unreceive; the whole theory (and the
                # uniqueness of the most recent line) rests on counters only growing.
                raise ValueError(f"{name} on channel {cid!r} goes back from {before} to "
                                 f"{after} at checkpoint {n}")
        return values

    def _edges_from(self, process: Process, number: int) -> Iterable[CheckpointId]:
        k = self._position[(process, number)]
        numbers = self._numbers[process]
        if k + 1 < len(numbers):
            yield (process, numbers[k + 1])
        for cid in self._outputs[process]:
            dst = self._channels[cid].dst
            # The first message p sent after this checkpoint is sent[k] + 1; the first
            # receiver checkpoint holding it is the first with received > sent[k].
            j = bisect_right(self._received[cid], self._sent[cid][k])
            if j < len(self._received[cid]):
                yield (dst, self._numbers[dst][j])

    def _mark_strictly_reachable(self, sources: Iterable[CheckpointId],
                                 marked: set[CheckpointId]) -> None:
        stack = [succ for source in sources for succ in self._successors[source]]
        while stack:
            node = stack.pop()
            if node not in marked:
                marked.add(node)
                stack.extend(self._successors[node])

    def _latest_unmarked(self, process: Process, marked: set[CheckpointId]) -> int:
        # The initial checkpoint is never marked: no edge enters it (it has received
        # nothing and has no predecessor), so this always finds one.
        return next(n for n in reversed(self._numbers[process])
                    if (process, n) not in marked)

    def _node(self, checkpoint: CheckpointId) -> CheckpointId:
        if checkpoint not in self._position:
            raise ValueError(f"no checkpoint {checkpoint!r}")
        return checkpoint

    def _check_line(self, line: Mapping[Process, int]) -> None:
        if set(line) != set(self._numbers):
            missing = [p for p in self._numbers if p not in line]
            unknown = [p for p in line if p not in self._numbers]
            raise ValueError(f"a line names one checkpoint per process; missing "
                             f"{missing!r}, unknown {unknown!r}")
        for process, number in line.items():
            self._node((process, number))

    def _sent_at(self, cid: ChannelId, line: Mapping[Process, int]) -> int:
        src = self._channels[cid].src
        return self._sent[cid][self._position[(src, line[src])]]

    def _received_at(self, cid: ChannelId, line: Mapping[Process, int]) -> int:
        dst = self._channels[cid].dst
        return self._received[cid][self._position[(dst, line[dst])]]


def region_recovery_line(records: Iterable[CheckpointRecord],
                         channels: Mapping[ChannelId, tuple[Process, Process]],
                         region: Iterable[Process]) -> dict[Process, int]:
    """The most recent consistent line in which only the processes of ``region``
    roll back, every other process keeping its current state: ``{process: checkpoint
    number}`` for the processes of ``region``. No channel may leave ``region``.

    A process outside has sent, by now, everything any checkpoint of the region
    recorded as received from it, so no message from outside is an orphan, whatever
    the region restores: rollback propagation runs over the region's own checkpoints
    and the channels among them. (A channel out of the region could make an orphan
    of what a process outside received; this refuses it.)"""
    region = set(region)
    leaving = [cid for cid, (src, dst) in channels.items()
               if src in region and dst not in region]
    if leaving:
        raise ValueError(f"channels {leaving!r} leave the region: a process outside "
                         "may have received what the region rolls back")
    inner = {cid: ends for cid, ends in channels.items() if ends[0] in region}
    kept = [CheckpointRecord(r.process, r.number,
                             {c: n for c, n in r.sent.items() if c in inner},
                             {c: n for c, n in r.received.items() if c in inner})
            for r in records if r.process in region]
    line = CheckpointGraph(kept, inner, processes=region).recovery_line()
    assert line is not None   # nothing pinned: the all-initial line is always reachable
    return line


def find_recovery_line(records: Iterable[CheckpointRecord],
                       channels: Mapping[ChannelId, tuple[Process, Process]]
                       ) -> dict[Process, int]:
    """The most recent consistent recovery line: ``{process: checkpoint number}``."""
    line = CheckpointGraph(records, channels).recovery_line()
    assert line is not None   # nothing pinned: the all-initial line is always reachable
    return line


def is_consistent(line: Mapping[Process, int], records: Iterable[CheckpointRecord],
                  channels: Mapping[ChannelId, tuple[Process, Process]]) -> bool:
    """Whether ``line`` has no orphan message."""
    return CheckpointGraph(records, channels).is_consistent(line)


def invalid_checkpoints(records: Iterable[CheckpointRecord],
                        channels: Mapping[ChannelId, tuple[Process, Process]]
                        ) -> set[CheckpointId]:
    """Checkpoints ``(process, number)`` that can belong to no consistent recovery line."""
    return CheckpointGraph(records, channels).invalid_checkpoints()


def replay_from(line: Mapping[Process, int], records: Iterable[CheckpointRecord],
                channels: Mapping[ChannelId, tuple[Process, Process]]
                ) -> dict[ChannelId, int]:
    """Per channel, the first sequence number to replay after restoring ``line``."""
    return CheckpointGraph(records, channels).replay_from(line)
