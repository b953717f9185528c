"""The frame transport between worker processes (`bastion.runtime.transport`), over
real sockets on 127.0.0.1: frames arrive with their address, the acknowledgment is the
credit (it comes only once the frame is delivered), one blocked channel does not hold
up the others on the same link, and a peer that is gone fails every frame waiting for
its acknowledgment — and every later send — with `PeerLostError` (a connection that
merely dropped heals instead: tests/test_connection_heal.py)."""

from __future__ import annotations

import asyncio

import pytest

from bastion.errors import PeerLostError
from bastion.runtime.transport import FrameServer, PeerLinks, pusher

EPOCH = ("job-1", 0)


class Receiver:
    """A deliver function that records frames and can hold a channel back."""

    def __init__(self) -> None:
        self.frames: list[tuple] = []
        self.held: dict[int, asyncio.Event] = {}

    async def deliver(self, epoch, task_id, channel_id, seq, payload, incarnation=0) -> None:
        if channel_id in self.held:
            await self.held[channel_id].wait()
        self.frames.append((epoch, task_id, channel_id, seq, payload))


async def connected(receiver: Receiver) -> tuple[FrameServer, PeerLinks, tuple[str, int]]:
    server = FrameServer(receiver.deliver)
    address = await server.start("127.0.0.1")
    links = PeerLinks()
    await links.connect([address])
    return server, links, address


async def test_frames_arrive_in_order_with_their_address_and_are_acknowledged():
    receiver = Receiver()
    server, links, address = await connected(receiver)
    push = pusher(links[address], 7, EPOCH)
    acks = [push(3, seq, f"frame {seq}".encode() * 1000) for seq in range(50)]
    await asyncio.wait_for(asyncio.gather(*acks), 10)
    assert [(f[0], f[1], f[2], f[3]) for f in receiver.frames] == \
        [(EPOCH, 7, 3, seq) for seq in range(50)]
    assert [f[4] for f in receiver.frames] == [f"frame {s}".encode() * 1000 for s in range(50)]
    links.close()


async def test_the_acknowledgment_waits_for_delivery_and_a_held_channel_holds_only_itself():
    receiver = Receiver()
    receiver.held[1] = asyncio.Event()
    server, links, address = await connected(receiver)
    link = links[address]
    held = pusher(link, 0, EPOCH)(1, 0, b"held")
    moving = [pusher(link, 0, EPOCH)(2, seq, b"x") for seq in range(5)]
    await asyncio.wait_for(asyncio.gather(*moving), 10)
    await asyncio.sleep(0.05)
    assert not held.done(), "a frame was acknowledged before it was delivered"
    receiver.held[1].set()
    await asyncio.wait_for(held, 10)
    assert [f[2] for f in receiver.frames] == [2] * 5 + [1]
    links.close()


@pytest.mark.internal
async def test_a_lost_peer_fails_waiting_and_later_frames_with_peer_lost():
    receiver = Receiver()
    receiver.held[1] = asyncio.Event()  # never set: the frame waits for ever
    server, links, address = await connected(receiver)
    link = links[address]
    waiting = pusher(link, 0, EPOCH)(1, 0, b"never delivered")
    await asyncio.sleep(0.05)
    # the peer's end goes away, as when its process dies: its connections close, and
    # reconnecting is refused (nothing listens there any more)
    server._server.close()
    for task in [t for t in asyncio.all_tasks() if "FrameServer._serve" in repr(t)]:
        task.cancel()
    with pytest.raises(PeerLostError, match="broke"):
        await asyncio.wait_for(waiting, 10)
    with pytest.raises(PeerLostError):
        await pusher(link, 0, EPOCH)(1, 1, b"after")
    # the next connect replaces the broken link (a new peer at a new address here)
    address2 = await FrameServer(Receiver().deliver).start("127.0.0.1")
    await links.connect([address2])
    await asyncio.wait_for(pusher(links[address2], 0, EPOCH)(1, 0, b"new"), 10)
    links.close()


@pytest.mark.internal
async def test_an_unreachable_peer_is_a_peer_lost_error():
    server = FrameServer(Receiver().deliver)
    host, port = await server.start("127.0.0.1")
    server._server.close()
    await server._server.wait_closed()
    with pytest.raises(PeerLostError, match="cannot reach"):
        await PeerLinks().connect([(host, port)])
