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
- **A dropped connection heals; a lost peer is a failure like a dead actor.** A link
  keeps every message until its acknowledgment arrives. When its connection breaks
  (the acknowledgment stream ends or resets, or the link tore it: `DropConnection`),
  the frames waiting for their acknowledgment stay waiting: the link reconnects to the
  same address — backoff from 50 ms, doubling, at most 1 s apart — and resends every
  unacknowledged data message in its original order, before anything sent meanwhile.
  The receiver drops a frame it already has by (channel, seq) (`InputGate`) and
  acknowledges it all the same, and a frame half-read when the connection died is
  never delivered, so the resend neither loses nor duplicates. (A copy whose first is
  still waiting at the gate is acknowledged at once: that frame's credit comes back
  early, once per heal at most.) Acknowledgment messages of the ``acks`` protocol
  (``resend=False``) are not resent: a duplicate would corrupt its ledger (it XORs
  ids), and the protocol replays what a lost one held. Only a peer that stays
  unreachable for ``heal_timeout_s`` — or refuses the connection: its server lives as
  long as its process, so nothing listening there means the process is gone — breaks
  the link: every frame waiting for its acknowledgment, and every later send, raises
  `PeerLostError`; the task ends with it and the failure detector recovers the job as
  from the peer's death. The link is dropped and the next deploy connects again. A
  link counts its heals (`PeerLink.heals`, `PeerLinks.heals`).

Wire format, little-endian: ``u32 header length, u32 payload length, header, payload``
from sender to receiver, the header a msgpack array ``[message id, job id, attempt,
task id, channel id, seq, incarnation]`` (the incarnation of the destination task:
a task restarted on its own, in a regional restart, drops frames meant for the
incarnation before it); ``u64 message id`` from receiver to sender.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import msgpack

from bastion.errors import PeerLostError

_LENGTHS = struct.Struct("<II")
_ACK = struct.Struct("<Q")

# How long a link tries to reconnect before its peer counts as lost, unless told
# otherwise: longer than a connection takes to come back on a busy machine, short
# against the failure detector's view (a dead process refuses at once; a dead node
# is noticed by heartbeats within ``heartbeat_timeout_s`` and its links closed).
HEAL_TIMEOUT_S = 5.0
RECONNECT_FIRST_S = 0.05   # the first retry's wait; each retry doubles it ...
RECONNECT_MAX_S = 1.0      # ... up to this

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
                # Only a message read whole gets here: one the connection tore in the
                # middle (`IncompleteReadError` below) is never delivered — its sender
                # resends it whole on the connection it reconnects.
                delivery = asyncio.ensure_future(self._deliver_and_ack(
                    writer, message_id, (job_id, attempt), task_id, channel_id, seq, payload,
                    incarnation))
                self._pending.add(delivery)
                delivery.add_done_callback(self._pending.discard)
        except (asyncio.IncompleteReadError, OSError):
            pass  # the sending process ended, closed the link or lost the connection
        finally:
            # Closed here, so the deliveries still running on this connection's frames
            # see it closing and do not acknowledge into it (their sender resends them
            # on its next connection, and gets their acknowledgments there).
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
            try:
                writer.write(_ACK.pack(message_id))
            except (OSError, RuntimeError):
                pass  # the connection died meanwhile: the sender resends, and that copy
                # is acknowledged on the new connection


@dataclass(eq=False)
class _Message:
    """A message kept until its acknowledgment arrives, to be resent after a heal."""
    header: bytes
    payload: bytes
    ack: asyncio.Future
    resend: bool
    written: bool = False  # on the current connection (False: it still has to be)

    def chunks(self) -> tuple[bytes, bytes, bytes]:
        return _LENGTHS.pack(len(self.header), len(self.payload)), self.header, self.payload


class PeerLink:
    """One connection to a peer worker's `FrameServer`, shared by every channel this
    worker has to it; `send` returns a future that completes with the frame's
    acknowledgment. A broken connection heals (see the module docstring): for up to
    ``heal_timeout_s`` the link reconnects and resends what was not acknowledged."""

    def __init__(self, address: tuple[str, int], heal_timeout_s: float = HEAL_TIMEOUT_S):
        if heal_timeout_s <= 0:
            raise ValueError(f"heal_timeout_s must be > 0, got {heal_timeout_s!r}")
        self.address = address
        self.heal_timeout_s = heal_timeout_s
        # The connection frames are written to; None while it is down (healing): sends
        # then wait here, in order, behind the resends.
        self._writer: asyncio.StreamWriter | None = None
        # Every message not acknowledged yet, by id; ids grow, so this is send order.
        # No bound of its own is needed: a channel has at most ``max_inflight_frames``
        # frames unacknowledged (its credits), so the link keeps at most that many per
        # channel using it, plus acknowledgment messages, which the receiver
        # acknowledges at once (they never wait for room in an inbox).
        self._unacked: dict[int, _Message] = {}
        self._next_id = 0
        self._runner: asyncio.Task | None = None
        self._closed = False
        # when the connection last broke with no acknowledgment since (None: healthy),
        # and when the current connection was made: a heal window spans connections
        # that break again before anything got through (a peer that accepts and drops)
        self._down_since: float | None = None
        self._connected_at = 0.0
        self.broken: PeerLostError | None = None
        self.heals = 0      # connections broken and made again
        self.tears = 0      # connections this link tore itself (`DropConnection`)

    async def connect(self) -> None:
        try:
            reader, self._writer = await asyncio.open_connection(*self.address)
        except OSError as exc:
            raise PeerLostError(f"cannot reach the worker at {_name(self.address)}: "
                                f"{exc}") from None
        self._connected_at = asyncio.get_running_loop().time()
        self._runner = asyncio.ensure_future(self._run(reader))

    def send(self, epoch: tuple[str, int], task_id: int, channel_id: int, seq: int,
             payload: bytes, incarnation: int = 0, *, resend: bool = True,
             tear: bool = False) -> asyncio.Future:
        """Send a message; its future completes with its acknowledgment. ``resend``:
        send it again if the connection breaks before it is acknowledged (False for
        messages a duplicate would harm, which the caller makes up for otherwise: its
        future is then cancelled, its fate unknown). ``tear``: an injected fault — write
        part of the message, then abort the connection, as a network that cuts it
        mid-frame (the link heals and resends it)."""
        ack = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            _fail(ack, self.broken)
            return ack
        message_id = self._next_id
        self._next_id += 1
        message = _Message(msgpack.packb([message_id, epoch[0], epoch[1], task_id,
                                          channel_id, seq, incarnation]),
                           payload, ack, resend)
        self._unacked[message_id] = message
        writer = self._writer
        if writer is not None and writer.transport.is_closing():
            # lost under our feet: the acknowledgment reader is about to see it and
            # heal; the message is written then, in its turn
            writer = None
        if writer is None:
            return ack
        if tear and resend:
            self._tear(writer, message)
        else:
            writer.writelines(message.chunks())
            message.written = True
        return ack

    def _tear(self, writer: asyncio.StreamWriter, message: _Message) -> None:
        data = b"".join(message.chunks())
        writer.write(data[:max(1, len(data) // 2)])
        message.written = True
        # Nothing more goes on this connection: bytes after a torn message would be
        # read as the rest of it. Later sends wait for the heal.
        self._writer = None
        self.tears += 1
        writer.transport.abort()

    async def _run(self, reader: asyncio.StreamReader) -> None:
        """Read acknowledgments; when the connection breaks, heal it and go on."""
        while True:
            reason = await self._read_acks(reader)
            if self._closed:
                return
            healed = await self._heal(reason)
            if healed is None:
                return
            reader = healed

    async def _read_acks(self, reader: asyncio.StreamReader) -> str:
        """Resolve acknowledgments until the connection breaks; why it did."""
        try:
            while True:
                (message_id,) = _ACK.unpack(await reader.readexactly(_ACK.size))
                self._down_since = None  # the connection carries messages: healed
                message = self._unacked.pop(message_id, None)
                if message is not None and not message.ack.done():
                    message.ack.set_result(None)
        except (asyncio.IncompleteReadError, OSError) as exc:
            return type(exc).__name__

    async def _heal(self, reason: str) -> asyncio.StreamReader | None:
        """Reconnect and resend every unacknowledged message in order; None when the
        peer stays unreachable for ``heal_timeout_s`` (or refuses): the link breaks."""
        loop = asyncio.get_running_loop()
        if self._writer is not None:
            self._writer.transport.abort()
            self._writer = None
        now = loop.time()
        if self._down_since is None or now - self._connected_at >= self.heal_timeout_s:
            self._down_since = now
        deadline = self._down_since + self.heal_timeout_s
        # An acknowledgment message the lost connection carried is not sent again.
        for message_id, message in list(self._unacked.items()):
            if message.written and not message.resend:
                del self._unacked[message_id]
                message.ack.cancel()
        delay = RECONNECT_FIRST_S
        lost = f"the link to the worker at {_name(self.address)} broke ({reason})"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                self._break(f"{lost} and could not be reconnected within "
                            f"{self.heal_timeout_s:g} s")
                return None
            try:
                async with asyncio.timeout(remaining):
                    reader, writer = await asyncio.open_connection(*self.address)
                break
            except ConnectionRefusedError:
                # Its server lives as long as its process: nobody listening means the
                # process is gone, and waiting would only delay the recovery.
                self._break(f"{lost} and its worker refuses connections: it is gone")
                return None
            except (OSError, TimeoutError):
                pass
            await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
            delay = min(2 * delay, RECONNECT_MAX_S)
        if self._closed:
            writer.close()
            return None
        # Every unacknowledged message, in send order — those sent during the heal
        # after those sent before — then the link is open again; no await in between,
        # so a send cannot overtake.
        for message in self._unacked.values():
            writer.writelines(message.chunks())
            message.written = True
        self._writer = writer
        self._connected_at = loop.time()
        self.heals += 1
        return reader

    def _break(self, reason: str) -> None:
        self.broken = PeerLostError(reason)
        messages, self._unacked = self._unacked, {}
        for message in messages.values():
            if not message.ack.done():
                _fail(message.ack, self.broken)
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        """Stop using the link (its peer was replaced, or the process stops): what
        waits for an acknowledgment, and every later send, fails as from a lost peer."""
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
        if self.broken is None:
            self._break(f"the link to the worker at {_name(self.address)} was closed")


class PeerLinks:
    """The links of one worker process, by peer address; a broken one is replaced on
    the next `connect`."""

    def __init__(self, heal_timeout_s: float = HEAL_TIMEOUT_S) -> None:
        self._links: dict[tuple[str, int], PeerLink] = {}
        self.heal_timeout_s = heal_timeout_s

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
            link = PeerLink(address, self.heal_timeout_s)
            await link.connect()
            self._links[address] = link

    def __getitem__(self, address: tuple[str, int]) -> PeerLink:
        return self._links[address]

    def get(self, address: tuple[str, int]) -> PeerLink | None:
        """The link to ``address``; None once it was closed for a peer replaced."""
        return self._links.get(address)

    @property
    def heals(self) -> int:
        """Connections healed by the links open now (a closed link takes its count)."""
        return sum(link.heals for link in self._links.values())

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
    def push(channel_id: int, seq: int, payload: bytes, tear: bool = False
             ) -> asyncio.Future:
        return link.send(epoch, dst_task, channel_id, seq, payload, incarnation, tear=tear)
    return push
