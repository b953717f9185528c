"""`bastion.protocols.pending.PendingRoots`: a source's pending roots in columns.

The columnar store must decide exactly what the plain definition decides (a dict of
token counts per root, as protocol ``acks`` describes it): which roots complete after
each message, which are replayed after the timeout, and the frontier. Random
workloads — blocks of consecutive roots, messages of whole-column and per-tuple
tokens in both signs, over several blocks, over roots already complete or never
registered, replays in between — are run through both, and every answer compared.
A store that checks completion after each entry instead of after the whole message
(a root then looks complete halfway) is caught by the same comparison.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from bastion.protocols.pending import PendingRoots, pack_positions, pack_tokens

ROOT = 0x5BD1E995   # any token works as the root's own


class Reference:
    """The definition, one root at a time: fine — {token: emissions - acks}, complete
    when no count is above 0; xor — the XOR of the tokens, complete at 0."""

    def __init__(self, fine: bool):
        self.fine = fine
        self.roots: dict[int, list] = {}   # position -> [state, sent_s, value, born]

    def register(self, first: int, values: list, born: list, now_s: float) -> None:
        for i, (v, b) in enumerate(zip(values, born)):
            self.roots[first + i] = [{ROOT: 1} if self.fine else ROOT, now_s, v, b]

    def apply(self, entries: list) -> list[float]:
        for sign, positions, tokens in entries:
            per_tuple = not isinstance(tokens, int)
            for k, p in enumerate(positions):
                root = self.roots.get(p)
                if root is None:
                    continue
                t = tokens[k] if per_tuple else tokens
                if self.fine:
                    root[0][t] = root[0].get(t, 0) + sign
                else:
                    root[0] ^= t
        done = [p for p, root in self.roots.items()
                if (not any(c > 0 for c in root[0].values()) if self.fine else root[0] == 0)]
        return sorted(self.roots.pop(p)[3] for p in done)

    def overdue(self, deadline_s: float, now_s: float) -> list[int]:
        late = sorted(p for p, root in self.roots.items() if root[1] <= deadline_s)
        for p in late:
            self.roots[p][0] = {ROOT: 1} if self.fine else ROOT
            self.roots[p][1] = now_s
        return late

    def frontier(self, read_up_to: int) -> int:
        return min(self.roots) - 1 if self.roots else read_up_to


class CompletesPerEntry(PendingRoots):
    """Broken on purpose: completes roots after every entry, not after the message."""

    def apply(self, entries: list) -> np.ndarray:
        born = [super(CompletesPerEntry, self).apply([entry]) for entry in entries]
        return np.concatenate(born) if born else np.empty(0)


def divergence(make_store, fine: bool, seed: int, steps: int = 400) -> str | None:
    """Run one random workload through ``make_store`` and the reference; the first
    answer they disagree on, or None."""
    rng = random.Random(seed)
    store, ref = make_store(fine, ROOT), Reference(fine)
    dense_tokens = [ROOT, 11, 12, 13]          # whole columns' tokens: a few paths
    next_position, now_s = 0, 0.0
    for step in range(steps):
        now_s += rng.uniform(0.0, 0.3)
        action = rng.random()
        if action < 0.15 or next_position == 0:
            n = rng.randint(1, 40)
            values = [f"v{next_position + i}" for i in range(n)]
            born = [now_s + i * 1e-3 for i in range(n)]
            store.register(range(next_position, next_position + n), values, values, born,
                           now_s)
            ref.register(next_position, values, born, now_s)
            next_position += n
            continue
        if action < 0.2:
            got = store.overdue(now_s - 1.0, now_s)
            want = ref.overdue(now_s - 1.0, now_s)
            got_positions = sorted(got[0]) if got else []
            if got_positions != want:
                return f"step {step}: overdue {got_positions} != {want}"
            if got and sorted(got[1]) != sorted(f"v{p}" for p in want):
                return f"step {step}: replayed values {got[1]}"
            continue
        plain, packed = [], []   # one message, as the reference and the wire see it
        for _ in range(rng.randint(1, 4)):
            # positions of one column: distinct, possibly beyond the pending ones
            low = max(0, next_position - rng.randint(1, 120))
            span = range(low, next_position + rng.randint(0, 3))
            positions = rng.sample(span, rng.randint(1, min(len(span), 30)))
            if rng.random() < 0.5:
                positions.sort()
            sign = rng.choice((1, -1))
            if rng.random() < 0.7:   # a whole column's token: one of a few paths
                token = rng.choice(dense_tokens)
                plain.append([sign, positions, token])
                packed.append([sign, pack_positions(positions), token])
            else:   # a token per tuple (built ids); after a flat_map a root repeats
                tokens = [rng.choice((21, 22, 23, ROOT)) for _ in positions]
                if rng.random() < 0.5 and len(positions) > 1:
                    positions[1] = positions[0]
                plain.append([sign, positions, tokens])
                packed.append([sign, pack_positions(positions), pack_tokens(tokens)])
        want = ref.apply(plain)
        got = sorted(store.apply(packed).tolist())
        if got != want:
            return f"step {step}: completed born {got} != {want}"
        if len(store) != len(ref.roots):
            return f"step {step}: {len(store)} pending != {len(ref.roots)}"
        if store.frontier(next_position - 1) != ref.frontier(next_position - 1):
            return (f"step {step}: frontier {store.frontier(next_position - 1)} != "
                    f"{ref.frontier(next_position - 1)}")
        if any((p in store) != (p in ref.roots) for p in range(next_position)):
            return f"step {step}: pending sets differ"
    return None


@pytest.mark.parametrize("fine", [True, False], ids=["fine", "xor"])
@pytest.mark.parametrize("seed", range(12))
def test_columns_decide_what_the_per_root_definition_decides(fine, seed):
    assert divergence(PendingRoots, fine, seed) is None


@pytest.mark.parametrize("fine", [True, False], ids=["fine", "xor"])
def test_completing_after_each_entry_instead_of_each_message_is_caught(fine):
    found = [divergence(CompletesPerEntry, fine, seed) for seed in range(12)]
    assert any(found), "the comparison would miss a root completed halfway"


def test_a_block_with_few_pending_roots_keeps_only_their_records():
    store = PendingRoots(True, ROOT)
    store.register(range(100, 200), list(range(100)), [0.0] * 100, [0.0] * 100, 0.0)
    done = store.apply([[-1, range(100, 190), ROOT]])
    assert len(done) == 90 and len(store) == 10
    [block] = store.blocks
    assert isinstance(block.values, dict) and sorted(block.values) == list(range(90, 100))
    positions, values, _, _ = store.overdue(1.0, 2.0)
    assert positions == list(range(190, 200)) and values == list(range(90, 100))
    store.apply([[-1, range(190, 200), ROOT]])
    assert len(store) == 0 and store.blocks == [] and store.frontier(199) == 199


def test_a_source_batch_with_a_gap_is_refused():
    with pytest.raises(ValueError, match="consecutive"):
        PendingRoots(True, ROOT).register([0, 2], ["a", "b"], [0, 0], [0.0, 0.0], 0.0)
