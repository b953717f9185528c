"""The deterministic merge on its own: the order it produces depends on the records of
each channel only — never on frame boundaries, arrival interleaving or when it was
snapshotted and restored. Checked against a plain-Python model of the rule."""

from __future__ import annotations

import random

import pytest

from bastion.runtime.merge import DeterministicMerge
from bastion.runtime.records import Batch, EndOfStream, FrameCodec, Watermark


def batch(values: list) -> Batch:
    return Batch(None, list(values), [0.0] * len(values), [0.0] * len(values))


def expected_order(channels: dict[int, list], turn: int) -> list:
    """The rule, written out plainly: channels in id order take turns of ``turn``
    records; a channel with no records left leaves the rotation."""
    left = {c: list(v) for c, v in sorted(channels.items())}
    rotation, out = sorted(left), []
    while rotation:
        for c in list(rotation):
            take, left[c] = left[c][:turn], left[c][turn:]
            out += take
            if not left[c]:
                rotation.remove(c)
    return out


def arrivals(channels: dict[int, list], rng: random.Random) -> list[tuple[int, object]]:
    """Every channel's records cut into random frames with watermarks between, ended
    by an end-of-stream; the channels' frames interleaved at random."""
    per_channel = {}
    for c, values in channels.items():
        elements, i = [], 0
        while i < len(values):
            size = rng.randint(1, 9)
            elements.append(batch(values[i:i + size]))
            if rng.random() < 0.3:
                elements.append(Watermark(float(i)))
            i += size
        elements.append(EndOfStream())
        per_channel[c] = elements
    order = [c for c, elements in per_channel.items() for _ in elements]
    rng.shuffle(order)
    cursors = {c: 0 for c in per_channel}
    out = []
    for c in order:
        out.append((c, per_channel[c][cursors[c]]))
        cursors[c] += 1
    return out


def run_merge(merge: DeterministicMerge, pending: list, restore_at: int | None = None
              ) -> list:
    """Drive the merge as a task does: admit an arrival only while it waits."""
    codec, out, steps = FrameCodec(), [], 0
    pending = list(pending)
    while merge.active:
        if restore_at is not None and steps == restore_at:
            state = merge.snapshot(codec)
            merge = DeterministicMerge(merge.queues, merge.turn_records)
            merge.restore(state, codec)
        step = merge.next()
        steps += 1
        if step is None:
            channel, element = pending.pop(0)
            merge.push(channel, element)
            continue
        _, element = step
        if type(element) is Batch:
            out += list(element.values)
    assert not pending
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_order_depends_on_the_records_only(seed):
    rng = random.Random(seed)
    channels = {c: [(c, i) for i in range(rng.randint(0, 60))]
                for c in rng.sample(range(10), rng.randint(2, 4))}
    turn = rng.choice([1, 3, 7, 256])
    want = expected_order(channels, turn)
    first = run_merge(DeterministicMerge(channels, turn), arrivals(channels, rng))
    again = run_merge(DeterministicMerge(channels, turn), arrivals(channels, rng))
    assert first == want
    assert again == want


@pytest.mark.parametrize("seed", range(20))
def test_a_restored_merge_continues_the_same_order(seed):
    rng = random.Random(1000 + seed)
    channels = {c: [(c, i) for i in range(rng.randint(5, 40))] for c in (2, 5, 7)}
    want = expected_order(channels, 4)
    restored = run_merge(DeterministicMerge(channels, 4), arrivals(channels, rng),
                         restore_at=rng.randint(0, 30))
    assert restored == want


def test_the_model_is_not_arrival_order():
    # The check above could pass with a merge that ignored its rule if every channel
    # arrived in turn; this input would come out interleaved by arrival otherwise.
    channels = {0: [0, 1, 2, 3], 1: [10, 11]}
    merge = DeterministicMerge(channels, 2)
    arrived = [(1, batch([10, 11])), (1, EndOfStream()), (0, batch([0, 1, 2, 3])),
               (0, EndOfStream())]
    assert run_merge(merge, arrived) == [0, 1, 10, 11, 2, 3]


def test_a_capture_records_what_arrives_until_it_ends():
    merge = DeterministicMerge([1, 2])
    capture = merge.capture([2])
    merge.push(1, batch([1]))
    merge.push(2, batch([2]))
    assert merge.end_capture(capture, 2)[0].values == [2]
    merge.push(2, batch([3]))
    assert not merge.captures
