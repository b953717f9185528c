"""The input gate in isolation: ordering, deduplication, and what a reset leaves behind."""

from __future__ import annotations

import asyncio

import pytest

from bastion.runtime.channel import InputGate


async def test_frames_enter_in_sequence_order_and_replays_are_dropped():
    gate = InputGate(inbox_frames=8)
    late = asyncio.ensure_future(gate.deliver(1, 1, "b"))
    await asyncio.sleep(0)
    assert gate.inbox.empty()          # frame 1 waits for frame 0
    await gate.deliver(1, 0, "a")
    await late
    await gate.deliver(1, 0, "a")      # a replay of a frame already admitted
    assert [gate.inbox.get_nowait()[2] for _ in range(2)] == ["a", "b"]
    assert gate.inbox.empty() and gate.duplicates_dropped == 1


async def test_close_ends_every_delivery_left_waiting():
    gate = InputGate(inbox_frames=1)
    await gate.deliver(1, 0, "fills the inbox")
    waiting_for_room = asyncio.ensure_future(gate.deliver(1, 1, "x"))
    waiting_for_turn = asyncio.ensure_future(gate.deliver(2, 3, "y"))
    await asyncio.sleep(0.01)
    assert not waiting_for_room.done() and not waiting_for_turn.done()
    gate.close()
    for delivery in (waiting_for_room, waiting_for_turn):
        with pytest.raises(asyncio.CancelledError):
            await delivery
