"""The input gate in isolation: ordering, deduplication, and what a reset leaves behind."""

from __future__ import annotations

import asyncio

import pytest

from bastion.runtime.channel import InputGate, first_seq


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


async def test_a_frame_delivered_twice_at_once_enters_once():
    """Two senders of the same frame (a replay overlapping the original), each while
    the other's copy waits: for room in the inbox, or for its turn."""
    gate = InputGate(inbox_frames=1)
    await gate.deliver(1, 0, "fills the inbox")
    for_room = [asyncio.ensure_future(gate.deliver(1, 1, "b")) for _ in range(2)]
    for_turn = [asyncio.ensure_future(gate.deliver(1, 2, "c")) for _ in range(2)]
    await asyncio.sleep(0.01)
    taken = [(await gate.next_frame())[2] for _ in range(3)]
    await asyncio.gather(*for_room, *for_turn)
    assert taken == ["fills the inbox", "b", "c"]
    assert gate.inbox.empty() and gate.duplicates_dropped == 2


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


async def test_next_frame_returns_a_frame_or_none_after_the_timeout():
    gate = InputGate(inbox_frames=4)
    assert await gate.next_frame(timeout_s=0.01) is None
    await gate.deliver(1, 0, "a")
    assert await gate.next_frame(timeout_s=0.01) == (1, 0, "a")
    await gate.deliver(1, 1, "b")
    assert await gate.next_frame() == (1, 1, "b")


@pytest.mark.parametrize("steps_before_cancel", [0, 1, 2, 3])
async def test_a_cancelled_receive_ends_cancelled_and_keeps_its_frame(steps_before_cancel):
    # A reset cancels the task loop while it waits for a frame; the frame may arrive in
    # the same instant. Whatever the interleaving, a cancel that was accepted must end
    # the receive (asyncio.wait_for on Python 3.11 returned the frame instead, and the
    # task loop then waited for ever, hanging the recovery).
    gate = InputGate(inbox_frames=4)
    receive = asyncio.ensure_future(gate.next_frame(timeout_s=10.0))
    await asyncio.sleep(0)
    gate.inbox.put_nowait((1, 0, "x"))
    for _ in range(steps_before_cancel):
        await asyncio.sleep(0)
    if receive.cancel():
        with pytest.raises(asyncio.CancelledError):
            await receive
        assert gate.inbox.get_nowait() == (1, 0, "x")
    else:
        assert receive.result() == (1, 0, "x")


# -- a sender restarted on its own (`bastion.scheduler.failover.RestartFailed`) -----------


@pytest.mark.timeout(10)  # a gate that never starts over leaves frames waiting
async def test_a_restarted_senders_frames_start_the_channel_over_and_stale_ones_drop():
    """Incarnation 1 of a sender numbers its frames from `first_seq(1)`: the gate,
    which expected frame 3 of incarnation 0, takes them in order and drops what the
    incarnation before still had on its way — whether it arrives later or was waiting
    for its turn when the new one came."""
    gate = InputGate(inbox_frames=16)
    for seq in range(3):
        await gate.deliver(1, seq, f"old {seq}")
    waiting = asyncio.ensure_future(gate.deliver(1, 4, "old 4"))  # 3 never came
    await asyncio.sleep(0)
    band = first_seq(1)
    ahead = asyncio.ensure_future(gate.deliver(1, band + 1, "new 1"))
    await asyncio.sleep(0)
    await gate.deliver(1, band, "new 0")
    await asyncio.gather(waiting, ahead)
    await gate.deliver(1, 3, "old 3")   # late: below the new band
    await gate.deliver(1, band + 2, "new 2")
    got = [gate.inbox.get_nowait()[2] for _ in range(gate.inbox.qsize())]
    assert got == ["old 0", "old 1", "old 2", "new 0", "new 1", "new 2"]
    assert gate.duplicates_dropped == 2
    # another channel of the same gate is untouched
    await gate.deliver(2, 0, "other 0")
    assert gate.inbox.get_nowait()[2] == "other 0"


async def test_without_the_band_a_restarted_sender_would_be_dropped_as_a_replay():
    """What the band is for: a new incarnation numbering from 0 again looks like a
    replay of frames the gate already has, and nothing of it gets through."""
    gate = InputGate(inbox_frames=16)
    for seq in range(3):
        await gate.deliver(1, seq, f"old {seq}")
    for seq in range(3):
        await gate.deliver(1, seq, f"new {seq}")
    assert gate.inbox.qsize() == 3 and gate.duplicates_dropped == 3


@pytest.mark.timeout(10)  # a gate that never starts over leaves frames waiting
async def test_a_frame_admitted_while_its_sender_started_over_does_not_move_the_channel_back():
    gate = InputGate(inbox_frames=1)
    await gate.deliver(1, 0, "fills the inbox")
    old = asyncio.ensure_future(gate.deliver(1, 1, "old 1"))   # waits for room
    await asyncio.sleep(0)
    band = first_seq(2)
    new = asyncio.ensure_future(gate.deliver(1, band, "new 0"))
    await asyncio.sleep(0)
    taken = [(await gate.next_frame())[2] for _ in range(3)]
    await asyncio.gather(old, new)
    assert sorted(taken) == sorted(["fills the inbox", "old 1", "new 0"])
    await gate.deliver(1, band + 1, "new 1")   # the channel is at the new band
    assert (await gate.next_frame())[2] == "new 1"
