"""A source instance's pending roots under protocol ``acks``, kept in columns.

`bastion.protocols.acks` says *what* a source tracks per root (fine: a count per
tuple token, emissions minus acknowledgments; xor: one 64-bit value) and when a root
completes. This module says *how*, cheaply enough for the hot path: every record a
source reads is a root, every tuple that crosses a channel adds an emission and one
or two acknowledgments, so a source applies some ten updates per root. Kept as a
Python dict per root (a dict of token counts inside), that bookkeeping was most of
the source's time and held fine-grained acks to 0.4x of protocol ``none``.

The shape of the data allows columns instead:

- **Roots come in blocks.** A source reads a batch of records at consecutive
  positions (`bastion.lineage.root_ids`: a range), so one `_Block` holds a whole
  batch's roots: per root, its record (to replay it), when it went out and when it
  was born, and its outstanding state in arrays indexed by ``position - start``.
- **Acknowledgments come in runs.** An entry of an acknowledgment message names many
  roots (the positions of one id column) and, for an unbuilt `IdRun` column, one
  token for all of them. Applying it is one vectorised ``add`` (fine) or ``xor``
  into the array of that token (fine: one array per token; a topology has a handful
  of paths, so a block has a handful of arrays).
- **Completion is a mask.** A root is complete when no token array holds a count
  above 0 for it (fine) or its XOR is 0 (xor). The blocks a message touched are
  checked after the whole message is applied, as before: a tuple taken in and its
  children emitted travel in one message, so a root never looks complete halfway.
  A block whose roots are all complete is dropped at once; a block with few roots
  left keeps only their records (`_Block.compact`), so memory stays bounded by the
  pending roots, which ``max_pending`` bounds.

One case stays per tuple: tokens of *built* ids (after a ``flat_map``, every tuple
has a token of its own) in fine mode, which go into a small dict per root
(``sparse``). XOR mode needs no such case: a token per tuple XORs into the same
array.

Positions and tokens travel as raw little-endian int64 / uint64 bytes (`pack`),
which msgpack copies as one blob and `numpy.frombuffer` reads back without a loop.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from typing import Any, Iterator, Sequence

import numpy as np

_POSITION = np.dtype("<i8")
_TOKEN = np.dtype("<u8")
_COMPACT_SHARE = 4   # a block keeps all its records until 1/4 of its roots are pending


def pack_positions(positions: Sequence[int]) -> bytes:
    """Root positions as they travel in acknowledgment messages."""
    if type(positions) is range:
        return np.arange(positions.start, positions.stop, positions.step,
                         dtype=_POSITION).tobytes()
    return np.asarray(positions, dtype=_POSITION).tobytes()


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """One token per tuple, as it travels (a whole column's single token stays an int)."""
    return np.asarray(tokens, dtype=_TOKEN).tobytes()


def _positions(positions: Any) -> np.ndarray:
    if type(positions) is bytes:
        return np.frombuffer(positions, dtype=_POSITION)
    if type(positions) is range:
        return np.arange(positions.start, positions.stop, positions.step, dtype=_POSITION)
    return np.asarray(positions, dtype=_POSITION)


def _tokens(tokens: Any) -> np.ndarray:
    if type(tokens) is bytes:
        return np.frombuffer(tokens, dtype=_TOKEN)
    return np.asarray(tokens, dtype=_TOKEN)


class _Block:
    """The roots of one source batch: positions ``start .. start + size - 1``."""

    __slots__ = ("start", "size", "pending", "live", "sent_s", "born", "values", "ts",
                 "counts", "sparse", "sparse_busy", "xor")

    def __init__(self, start: int, values: Sequence, ts: Sequence, born: Sequence[float],
                 now_s: float, fine: bool, root_token: int):
        n = len(values)
        self.start, self.size = start, n
        self.pending = np.ones(n, dtype=bool)   # not complete yet
        self.live = n                           # how many are pending
        self.sent_s = np.full(n, now_s)         # when each went out (last replay)
        self.born = np.asarray(born, dtype=np.float64)
        # records to replay: lists indexed by ``position - start``, or after
        # `compact` a dict holding the pending roots' only
        # (typed Any: a list, then a dict, indexed alike)
        self.values: Any = values
        self.ts: Any = ts
        # fine: token -> counts (emissions - acknowledgments) per root; the root's own
        # token starts at 1 (it is outstanding until its source takes it in)
        self.counts: dict[int, np.ndarray] = (
            {root_token: np.ones(n, dtype=np.int32)} if fine else {})
        self.sparse: dict[int, dict[int, int]] = {}  # root -> {built-id token: count}
        self.sparse_busy: np.ndarray | None = None   # per root: sparse tokens above 0
        # xor: per root, the XOR of its tokens
        self.xor = None if fine else np.full(n, root_token, dtype=_TOKEN)

    def restart(self, local: np.ndarray, now_s: float, root_token: int) -> None:
        """Roots replayed: outstanding again from scratch, as when they first went out."""
        self.sent_s[local] = now_s
        if self.xor is not None:
            self.xor[local] = root_token
            return
        for counts in self.counts.values():
            counts[local] = 0
        root_counts = self.counts.get(root_token)
        if root_counts is None:
            root_counts = self.counts[root_token] = np.zeros(self.size, dtype=np.int32)
        root_counts[local] = 1
        if self.sparse:
            for i in local.tolist():
                self.sparse.pop(i, None)
            assert self.sparse_busy is not None   # kept whenever sparse tokens are
            self.sparse_busy[local] = 0

    def add_sparse(self, sign: int, local: np.ndarray, tokens: np.ndarray) -> None:
        """Fine mode, a token per tuple: counted per root in a dict."""
        sparse, dense = self.sparse, self.counts
        if self.sparse_busy is None:
            self.sparse_busy = np.zeros(self.size, dtype=np.int32)
        busy = self.sparse_busy
        for i, t in zip(local.tolist(), tokens.tolist()):
            counts = dense.get(t)
            if counts is not None:   # the same token as a whole column's (by chance)
                counts[i] += sign
                continue
            root = sparse.get(i)
            if root is None:
                root = sparse[i] = {}
            before = root.get(t, 0)
            after = before + sign
            if after:
                root[t] = after
            else:
                del root[t]
            if after > 0 >= before:
                busy[i] += 1
            elif before > 0 >= after:
                busy[i] -= 1

    def complete(self) -> np.ndarray:
        """Mark the pending roots with nothing outstanding complete; their indices."""
        if self.xor is not None:
            done = self.pending & (self.xor == 0)
        else:
            busy: np.ndarray | None = None
            for counts in self.counts.values():
                busy = counts > 0 if busy is None else busy | (counts > 0)
            assert busy is not None   # fine mode: every block counts its roots' own token
            if self.sparse_busy is not None:
                busy |= self.sparse_busy > 0
            done = self.pending & ~busy
        local = np.flatnonzero(done)
        if len(local):
            self.pending[local] = False
            self.live -= len(local)
            if self.live * _COMPACT_SHARE <= self.size and type(self.values) is not dict:
                self.compact()
        return local

    def compact(self) -> None:
        """Keep the records of the pending roots only."""
        keep = np.flatnonzero(self.pending).tolist()
        values, ts = self.values, self.ts
        self.values = {i: values[i] for i in keep}
        self.ts = {i: ts[i] for i in keep}
        if self.sparse:
            self.sparse = {i: self.sparse[i] for i in keep if i in self.sparse}

    def drop(self) -> None:
        """Every root complete: let go of the records (replay entries may still name
        the block until they time out)."""
        self.values = self.ts = None
        self.counts, self.sparse, self.sparse_busy, self.xor = {}, {}, None, None


class PendingRoots:
    """A source instance's pending roots: register, acknowledge, replay (see module)."""

    def __init__(self, fine: bool, root_token: int):
        self.fine = fine
        self.root_token = root_token
        self.blocks: list[_Block] = []   # by start position
        self.starts: list[int] = []
        self.live = 0                    # pending roots
        # (when sent, block, indices in it), oldest first; an index whose root went out
        # again since, or completed, is stale
        self.sent_order: deque[tuple[float, _Block, np.ndarray]] = deque()

    def __len__(self) -> int:
        return self.live

    def __contains__(self, position: int) -> bool:
        block, i = self._find(position)
        return block is not None and bool(block.pending[i])

    def _find(self, position: int) -> tuple[_Block | None, int]:
        at = bisect_right(self.starts, position) - 1
        if at >= 0:
            block = self.blocks[at]
            i = position - block.start
            if i < block.size:
                return block, i
        return None, 0

    def register(self, positions: Sequence[int], values: Sequence, ts: Sequence,
                 born: Sequence[float], now_s: float) -> None:
        """Roots read now, at consecutive positions above every one registered."""
        first = positions[0]
        if positions[-1] - first + 1 != len(positions):
            raise ValueError("a source batch's roots must have consecutive positions")
        # a batch's columns are never mutated (`Batch`): kept as they are, not copied
        block = _Block(first, values, ts, born, now_s, self.fine, self.root_token)
        self.blocks.append(block)
        self.starts.append(first)
        self.live += block.size
        self.sent_order.append((now_s, block, np.arange(block.size)))

    def apply(self, entries: list) -> np.ndarray:
        """Apply one message's entries ``[sign, positions, token(s)]``, then complete
        what has nothing outstanding. Returns the birth times of the roots completed."""
        touched: dict[int, _Block] = {}
        fine = self.fine
        for sign, positions, tokens in entries:
            pos = _positions(positions)
            if not len(pos):
                continue
            per_tuple = type(tokens) is not int
            if per_tuple:
                tokens = _tokens(tokens)
            for block, local, picked in self._locate(pos):
                touched[id(block)] = block
                if not fine:
                    assert block.xor is not None   # xor mode keeps a ledger per block
                    np.bitwise_xor.at(block.xor, local, tokens[picked] if per_tuple
                                      else np.uint64(tokens))
                elif per_tuple:
                    block.add_sparse(sign, local, tokens[picked])
                else:
                    counts = block.counts.get(tokens)
                    if counts is None:
                        counts = block.counts[tokens] = np.zeros(block.size, dtype=np.int32)
                    # an unbuilt column names each root once (its positions are a
                    # selection of one source batch's or replay's): no index repeats
                    counts[local] += sign
        born = []
        for block in touched.values():
            if not block.live:
                continue   # complete already: what still arrives is a late copy's
            local = block.complete()
            if len(local):
                born.append(block.born[local])
                self.live -= len(local)
                if not block.live:
                    self._remove(block)
        return np.concatenate(born) if born else np.empty(0)

    def _locate(self, pos: np.ndarray) -> Iterator[tuple[_Block, np.ndarray, Any]]:
        """The pending blocks ``pos`` falls in: (block, indices in it, which entries of
        ``pos`` — a slice or an index array). Positions of no block (complete, or read
        by an earlier attempt) are skipped."""
        lo, hi = int(np.minimum.reduce(pos)), int(np.maximum.reduce(pos))
        at = bisect_right(self.starts, lo) - 1
        if at >= 0:
            block = self.blocks[at]
            if hi < block.start + block.size:   # the usual case: one batch's roots
                yield block, pos - block.start, slice(None)
                return
        which = np.searchsorted(np.asarray(self.starts), pos, side="right") - 1
        for at in np.unique(which).tolist():
            if at < 0:
                continue
            block = self.blocks[at]
            picked = np.flatnonzero(which == at)
            local = pos[picked] - block.start
            inside = local < block.size
            if not inside.all():
                picked, local = picked[inside], local[inside]
            if len(local):
                yield block, local, picked

    def _remove(self, block: _Block) -> None:
        at = bisect_right(self.starts, block.start) - 1
        del self.blocks[at], self.starts[at]
        block.drop()

    def overdue(self, deadline_s: float, now_s: float
                ) -> tuple[list[int], list, list, list[float]] | None:
        """The pending roots that went out at ``deadline_s`` or before: restarted as
        sent now (outstanding from scratch), and returned as (positions, values, ts,
        born) to be sent again; None when there are none."""
        order = self.sent_order
        found: list[tuple[_Block, np.ndarray]] = []
        while order and order[0][0] <= deadline_s:
            sent_s, block, local = order.popleft()
            if not block.live:
                continue
            local = local[block.pending[local] & (block.sent_s[local] == sent_s)]
            if len(local):
                found.append((block, local))
        if not found:
            return None
        positions: list[int] = []
        values: list = []
        ts: list = []
        born: list[float] = []
        for block, local in found:
            indices = local.tolist()
            positions += [block.start + i for i in indices]
            block_values, block_ts = block.values, block.ts
            values += [block_values[i] for i in indices]
            ts += [block_ts[i] for i in indices]
            born += block.born[local].tolist()
            block.restart(local, now_s, self.root_token)
            order.append((now_s, block, local))
        return positions, values, ts, born

    def frontier(self, read_up_to: int) -> int:
        """The position below which every root is complete, minus one: ``read_up_to``
        when none is pending."""
        if not self.blocks:
            return read_up_to
        first = self.blocks[0]
        return first.start + int(np.argmax(first.pending)) - 1
