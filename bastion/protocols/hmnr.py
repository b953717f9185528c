"""HMNR communication-induced checkpointing: forced checkpoints that prevent useless ones.

Uncoordinated checkpoints can be *useless* — part of no consistent recovery line — and
with cyclic communication the rollback can domino back to the start (`recovery_line`).
Netzer & Xu showed exactly when: a checkpoint is useless iff it lies on a **Z-cycle**.
A *Z-path* from checkpoint A (of process p) to checkpoint B is a chain of messages
m1..mk where m1 is sent by p after A, each m(i+1) is sent by the receiver of m(i) *in the
same or a later checkpoint interval* than m(i)'s receipt — possibly before it arrived,
which is what makes Z-paths more than causal paths — and mk is received before B. A
Z-path from A back to A is a Z-cycle: restoring A requires a state of p from after A.

A communication-induced protocol lets processes checkpoint on their own timers (*basic*
checkpoints) and piggybacks a little knowledge on each message, so that a receiver can
tell that delivering the message would close a Z-cycle and take a *forced* checkpoint
first: then the delivery falls into a new interval and the Z-path is broken.

HMNR (J.-M. Hélary, A. Mostefaoui, R. H. B. Netzer, M. Raynal, "Communication-based
prevention of useless checkpoints in distributed computations", Distributed Computing
13(1), 2000; the CIC protocol of CheckMate §III-C) timestamps checkpoints with a Lamport
clock and forces checkpoints so that timestamps grow along every Z-path; no Z-path can
then return to its start. Process i keeps

- ``lc``: its Lamport clock; +1 at every checkpoint, max'ed with every received clock;
- ``ckpt[k]``: how many checkpoints process k has taken, its initial one included, as
  far as i knows — 0 means i has heard nothing from k, so no causal path from k exists;
- ``taken[k]``: a causal path from k's latest known checkpoint to i's present passes
  through some checkpoint;
- ``greater[k]``: i's clock is greater than k's, as far as i knows;
- ``sent_to[k]``: i sent to k since its latest checkpoint (never piggybacked).

Every message carries ``(lc, ckpt, taken, greater)`` of its sender j. Before delivering
message m, process i takes a forced checkpoint iff

    C = (∃k: sent_to[k] ∧ m.greater[k] ∧ m.lc > lc)  ∨  (m.ckpt[i] = ckpt[i] ∧ m.taken[i])

- The left clause catches a **non-causal** Z-path: i already sent to k in this
  interval, so delivering m links the checkpoint j took before sending m (timestamp up
  to m.lc, above i's own clock) to k's next checkpoint — whose timestamp might not
  exceed m.lc, since as far as j knows k's clock is below j's. Forcing keeps the
  timestamp order.
- The right clause catches a **causal** Z-cycle: m's causal past left i in its current
  interval (j knows i's current checkpoint count) and passed through a checkpoint of
  another process; delivering m now would put that checkpoint on a Z-cycle.

This is the predicate of the HMNR paper as CheckMate adopted it (its open-source
testbed evaluates the same condition). After a forced checkpoint C is false for m
(``sent_to`` is cleared and ``ckpt[i]`` moves past ``m.ckpt[i]``), and the receive rule
merges m's vectors: the larger clock wins (and its ``greater``; equal clocks AND them),
and for every other process the newer checkpoint count wins, with its ``taken`` (equal
counts OR them).

Usage by a task (`checkpoint_number` counts like `recovery_line`: the implicit initial
checkpoint is 0, so it is ``ckpt[i] - 1``)::

    state = HmnrState(me, n)
    frame.piggyback = state.on_send(dst)                 # every message sent
    if state.must_force(frame.piggyback):                # every message received
        state.on_checkpoint(); persist(state.snapshot())  # forced, before delivery
    state.on_receive(frame.piggyback); deliver(frame)
    state.on_checkpoint(); persist(state.snapshot())      # every basic checkpoint
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

# (lc, ckpt, taken, greater): plain ints, lists of ints and bools, so msgpack carries it.
# Received piggybacks may come back as lists instead of tuples; both are accepted.
Piggyback: TypeAlias = tuple[int, list[int], list[bool], list[bool]]


class HmnrState:
    """The HMNR protocol state of process ``index`` among ``n`` processes (0..n-1)."""

    def __init__(self, index: int, n: int):
        if not 0 <= index < n:
            raise ValueError(f"process index {index} is outside 0..{n - 1}")
        self._i = index
        self._n = n
        # The state right after the initial checkpoint: nothing heard, nothing sent.
        # Counting the initial checkpoint in ckpt[i] keeps "i's initial checkpoint" apart
        # from "nothing heard from i" (0) in other processes' vectors, so the causal
        # clause cannot fire on a message whose past never touched this process.
        self._lc = 0
        self._ckpt = [0] * n
        self._ckpt[index] = 1
        self._taken = [False] * n
        self._greater = [False] * n
        self._sent_to = [False] * n

    @property
    def index(self) -> int:
        return self._i

    @property
    def checkpoint_number(self) -> int:
        """Number of this process's latest checkpoint (0: the initial one)."""
        return self._ckpt[self._i] - 1

    def on_checkpoint(self) -> None:
        """A checkpoint (basic or forced) is being taken; store `snapshot()` in it."""
        i = self._i
        self._lc += 1
        self._ckpt[i] += 1
        for k in range(self._n):
            self._sent_to[k] = False
            # Every causal path from another process's latest known checkpoint to what
            # comes next here now passes through this checkpoint, and this clock just
            # overtook every clock this process knows of.
            self._taken[k] = k != i
            self._greater[k] = k != i

    def on_send(self, dst: int) -> Piggyback:
        """A message to process ``dst`` is being sent; returns what to piggyback on it."""
        self._check_peer(dst)
        self._sent_to[dst] = True
        return (self._lc, list(self._ckpt), list(self._taken), list(self._greater))

    def must_force(self, piggyback: Sequence[Any]) -> bool:
        """Whether a forced checkpoint must be taken before delivering this message."""
        lc, ckpt, taken, greater = self._unpack(piggyback)
        i = self._i
        non_causal = lc > self._lc and any(
            sent and ahead for sent, ahead in zip(self._sent_to, greater))
        causal_cycle = ckpt[i] == self._ckpt[i] and taken[i]
        return non_causal or causal_cycle

    def on_receive(self, piggyback: Sequence[Any]) -> None:
        """Merge a received message's piggyback, just before delivering the message.

        Raises RuntimeError if `must_force` holds: the forced checkpoint comes first.
        """
        if self.must_force(piggyback):
            raise RuntimeError(f"process {self._i}: HMNR requires a forced checkpoint "
                               f"before delivering this message")
        lc, ckpt, taken, greater = self._unpack(piggyback)
        i = self._i
        if lc > self._lc:
            # Adopting the sender's clock adopts its view of who is behind it; this
            # process is now level with the sender, not ahead of itself.
            self._lc = lc
            self._greater = [ahead and k != i for k, ahead in enumerate(greater)]
        elif lc == self._lc:
            self._greater = [a and b for a, b in zip(self._greater, greater)]
        for k in range(self._n):
            if k == i:
                continue
            if ckpt[k] > self._ckpt[k]:
                self._ckpt[k] = ckpt[k]
                self._taken[k] = taken[k]
            elif ckpt[k] == self._ckpt[k]:
                self._taken[k] = self._taken[k] or taken[k]

    def snapshot(self) -> dict[str, Any]:
        """The protocol state as a msgpack-able dict, to store in a checkpoint."""
        return {"index": self._i, "lc": self._lc, "ckpt": list(self._ckpt),
                "taken": list(self._taken), "greater": list(self._greater),
                "sent_to": list(self._sent_to)}

    @classmethod
    def restore(cls, snapshot: Mapping[str, Any]) -> HmnrState:
        """The state saved by `snapshot` (e.g. when restarting from that checkpoint)."""
        ckpt = [int(c) for c in snapshot["ckpt"]]
        state = cls(int(snapshot["index"]), len(ckpt))
        state._lc = int(snapshot["lc"])
        state._ckpt = ckpt
        state._taken = state._flags(snapshot["taken"], "taken")
        state._greater = state._flags(snapshot["greater"], "greater")
        state._sent_to = state._flags(snapshot["sent_to"], "sent_to")
        return state

    def _check_peer(self, k: int) -> None:
        if not 0 <= k < self._n or k == self._i:
            raise ValueError(f"process {self._i} has no peer {k} among 0..{self._n - 1}")

    def _flags(self, values: Sequence[Any], name: str) -> list[bool]:
        if len(values) != self._n:
            raise ValueError(f"{name} has {len(values)} entries for {self._n} processes")
        return [bool(v) for v in values]

    def _unpack(self, piggyback: Sequence[Any]
                ) -> tuple[int, Sequence[int], list[bool], list[bool]]:
        lc, ckpt, taken, greater = piggyback
        if len(ckpt) != self._n:
            raise ValueError(f"piggyback ckpt has {len(ckpt)} entries for {self._n} "
                             f"processes")
        return lc, ckpt, self._flags(taken, "taken"), self._flags(greater, "greater")
