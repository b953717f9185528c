"""The frame transport: how a frame travels from one worker process to another.

Ray is Bastion's control plane — deploys, checkpoints triggers, heartbeats — but not
its data plane. A Ray actor call costs about a millisecond of CPU on each side here
(measured: ``benchmarks/throughput.py``, the exchange section), whatever its size; a
keyed exchange sends hundreds of frames a second per channel, so with one call per
frame the exchange cost as much CPU as all the operators of the job. Flink and Storm
move their data over their own TCP connections (Netty) for the same reason, and so
does Bastion: a write to a socket costs tens of microseconds.

- Every worker process runs a `FrameServer` on its node's address (127.0.0.1 in tests
  and on one machine), on a port the OS picks, for the process's lifetime: the warm
  pool lends the same process to job after job, and its server and connections stay.
- A worker opens one `PeerLink` per peer process it sends to, shared by all its
  channels to that peer, and keeps it across attempts and jobs. A message is a frame
  with its address: the job and attempt it belongs to (frames of an earlier attempt
  or job are dropped on arrival), the destination task, the channel and its sequence
  number.
- **Credits keep their meaning.** The receiver answers each message with an
  acknowledgment once the frame is in the task's inbox (or dropped as stale), exactly
  when a Ray call to ``push`` used to return; a channel holds at most
  ``max_inflight_frames`` unacknowledged frames. A blocked channel (barrier alignment)
  therefore holds back its own sender only: the link is read continuously, so the
  other channels on it keep moving.
- **A lost peer is a failure like a dead actor.** When a link's connection breaks,
  every frame waiting for its acknowledgment — and every later send — raises
  `PeerLostError`; the task ends with it and the failure detector recovers the job as
  from the peer's death. The link is dropped and the next deploy connects again.

Wire format, little-endian: ``u32 header length, u32 payload length, header, payload``
from sender to receiver, the header a msgpack array ``[message id, job id, attempt,
task id, channel id, seq, incarnation]`` (the incarnation of the destination task:
a task restarted on its own, in a regional restart, drops frames meant for the
incarnation before it); ``u64 message id`` from receiver to sender.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Awaitable, Callable

import msgpack

from bastion.errors import PeerLostError

_LENGTHS = struct.Struct("<II")
_ACK = struct.Struct("<Q")

# Called with (epoch, task id, channel id, seq, payload, incarnation); returns once the
# frame is in the task's inbox or dropped.
Deliver = Callable[[tuple[str, int], int, int, int, bytes, int], Awaitable[None]]


class FrameServer:
    """Accepts links from peer workers and hands their frames to ``deliver``."""

    def __init__(self, deliver: Deliver):
        self._deliver = deliver
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None
        self._pending: set[asyncio.Task] = set()

    async def start(self, host: str) -> tuple[str, int]:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0)
            self.address = (host, self._server.sockets[0].getsockname()[1])
        return self.address

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header_len, payload_len = _LENGTHS.unpack(await reader.readexactly(8))
                message_id, job_id, attempt, task_id, channel_id, seq, incarnation = \
                    msgpack.unpackb(await reader.readexactly(header_len))
                payload = await reader.readexactly(payload_len)
                # Delivered concurrently, like Ray calls: a frame waiting for its turn
                # or for room in one inbox must not hold up the link's other channels.
                delivery = asyncio.ensure_future(self._deliver_and_ack(
                    writer, message_id, (job_id, attempt), task_id, channel_id, seq, payload,
                    incarnation))
                self._pending.add(delivery)
                delivery.add_done_callback(self._pending.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the sending process ended or closed the link
        finally:
            writer.close()

    async def _deliver_and_ack(self, writer: asyncio.StreamWriter, message_id: int,
                               epoch: tuple[str, int], task_id: int, channel_id: int,
                               seq: int, payload: bytes, incarnation: int) -> None:
        try:
            await self._deliver(epoch, task_id, channel_id, seq, payload, incarnation)
        except asyncio.CancelledError:
            # The receiving task was reset (`InputGate.close`): the frame is dropped,
            # and acknowledged all the same — its sender may keep running (a regional
            # restart) and must get its credit back.
            pass
        if not writer.is_closing():
            writer.write(_ACK.pack(message_id))


class PeerLink:
    """One connection to a peer worker's `FrameServer`, shared by every channel this
    worker has to it; `send` returns a future that completes with the frame's
    acknowledgment."""

    def __init__(self, address: tuple[str, int]):
        self.address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._acks: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._ack_reader: asyncio.Task | None = None
        self.broken: PeerLostError | None = None

    async def connect(self) -> None:
        try:
            self._reader, self._writer = await asyncio.open_connection(*self.address)
        except OSError as exc:
            raise PeerLostError(f"cannot reach the worker at {_name(self.address)}: "
                                f"{exc}") from None
        self._ack_reader = asyncio.ensure_future(self._read_acks())

    def send(self, epoch: tuple[str, int], task_id: int, channel_id: int, seq: int,
             payload: bytes, incarnation: int = 0) -> asyncio.Future:
        ack = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            _fail(ack, self.broken)
            return ack
        message_id = self._next_id
        self._next_id += 1
        self._acks[message_id] = ack
        header = msgpack.packb([message_id, epoch[0], epoch[1], task_id, channel_id, seq,
                                incarnation])
        self._writer.writelines((_LENGTHS.pack(len(header), len(payload)), header, payload))
        return ack

    async def _read_acks(self) -> None:
        try:
            while True:
                (message_id,) = _ACK.unpack(await self._reader.readexactly(_ACK.size))
                ack = self._acks.pop(message_id, None)
                if ack is not None and not ack.done():
                    ack.set_result(None)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._break(f"the link to the worker at {_name(self.address)} broke: "
                        f"{type(exc).__name__}")

    def _break(self, reason: str) -> None:
        self.broken = PeerLostError(reason)
        acks, self._acks = self._acks, {}
        for ack in acks.values():
            if not ack.done():
                _fail(ack, self.broken)
        self._writer.close()

    def close(self) -> None:
        if self._ack_reader is not None:
            self._ack_reader.cancel()
        if self._writer is not None:
            self._writer.close()


class PeerLinks:
    """The links of one worker process, by peer address; a broken one is replaced on
    the next `connect`."""

    def __init__(self) -> None:
        self._links: dict[tuple[str, int], PeerLink] = {}

    async def connect(self, addresses: list[tuple[str, int]]) -> None:
        """Links to exactly ``addresses``: a link to another peer (of an earlier job,
        or a peer since replaced) is closed."""
        wanted = set(addresses)
        for address in [a for a in self._links if a not in wanted]:
            self._links.pop(address).close()
        for address in dict.fromkeys(addresses):
            link = self._links.get(address)
            if link is not None and link.broken is None:
                continue
            if link is not None:
                link.close()
            link = PeerLink(address)
            await link.connect()
            self._links[address] = link

    def __getitem__(self, address: tuple[str, int]) -> PeerLink:
        return self._links[address]

    def get(self, address: tuple[str, int]) -> PeerLink | None:
        """The link to ``address``; None once it was closed for a peer replaced."""
        return self._links.get(address)

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links = {}


def _fail(ack: asyncio.Future, error: PeerLostError) -> None:
    ack.set_exception(error)
    # Marked as retrieved: a channel awaits its oldest frame's acknowledgment first,
    # and the task then ends with that error; the others are never awaited.
    ack.exception()


def _name(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def node_address() -> str:
    """The address this process's `FrameServer` listens on: its Ray node's."""
    import ray

    return ray.util.get_node_ip_address()


def pusher(link: PeerLink, dst_task: int, epoch: tuple[str, int], incarnation: int = 0
           ) -> Callable[[int, int, bytes], Any]:
    """A channel's way to send a frame to incarnation ``incarnation`` of task
    ``dst_task`` over ``link``."""
    def push(channel_id: int, seq: int, payload: bytes) -> asyncio.Future:
        return link.send(epoch, dst_task, channel_id, seq, payload, incarnation)
    return push
