"""Channels: batched, credit-based, sequenced links between two tasks.

A channel carries *frames* — lists of batches and control records — from one upstream
task to one downstream task, in order. Three mechanisms make it fast and safe:

- **Batching.** Records are buffered per channel and sent as one frame when the buffer
  holds ``frame_records`` records or its oldest record has waited
  ``buffer_timeout_s`` (Flink's buffer timeout: the knob between throughput and
  latency). Control records that others wait on (end-of-stream, barriers) flush at once.
- **Credits.** A sender has at most ``max_inflight_frames`` frames unacknowledged per
  channel; the receiver acknowledges a frame only once it is in the task's bounded
  inbox. A slow consumer therefore stalls its producers instead of growing memory:
  backpressure, all the way to the sources.
- **Sequence numbers.** Every frame carries its channel's next sequence number. The
  receiver's `InputGate` hands frames over in sequence order (Ray may start calls of an
  async actor out of order), drops a frame it has already seen (a replay), and gives
  protocols the numbers they log for in-flight recovery.

A channel to a task of the same worker skips the network, not the codec: it puts the
encoded frame straight into the same bounded inbox, so a value behaves the same
wherever its consumer runs (`LocalOutputChannel`).

**A task restarted on its own** (a failover that restarts failed tasks only:
`bastion.scheduler.failover`) meets channels that outlived it, both ways. Incarnation
*k* of a task numbers its frames from ``first_seq(k)`` — a band of 2**40 numbers of its
own — so a receiver that kept running sees a frame of a newer band and starts that
channel over from it (`InputGate`); frames of the incarnation before, still on their
way, fall below it and are dropped. A sender that kept running reaches a restarted
receiver through a `ReroutableOutputChannel`, which numbers its frames from 0 again
for each new receiver.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Awaitable, Callable

import msgpack

from bastion.errors import PeerLostError
from bastion.runtime.durable import open_bytes, seal
from bastion.runtime.records import (Batch, ControlRecord, EndOfStream, FrameCodec,
                                     Watermark, passes_unencoded)


SEQ_BAND_BITS = 40  # the frames of one incarnation of a sender: 2**40 numbers


def first_seq(incarnation: int) -> int:
    """The first frame number of incarnation ``incarnation`` of a sending task."""
    return incarnation << SEQ_BAND_BITS


class OutputChannel:
    """The sending end of one channel: a buffer plus a transport with credits."""

    _codec: FrameCodec  # set by each concrete channel: `send` encodes frames with it

    def __init__(self, channel_id: int, frame_records: int, buffer_timeout_s: float):
        self.channel_id = channel_id
        self.frame_records = frame_records
        self.buffer_timeout_s = buffer_timeout_s
        self.seq = 0  # from `first_seq` of the sending task's incarnation
        # Batches and control records in order; batches are kept as they came (not
        # concatenated): cheaper, and their timestamps often compress to one value.
        self.elements: list = []
        self.records = 0
        self.first_buffered_s = 0.0  # when the oldest unsent element was buffered
        self.frame_buffered_s = 0.0  # the same, of the frame being sent
        self.frames_sent = 0
        self.bytes_sent = 0
        self.records_sent = 0   # data records given to the channel (a tuple per copy)
        # An aged frame waits while the channel is congested, instead of holding up the
        # sending task: set on channels into an operator that receives redundant copies
        # (their tuples have another instance to go to meanwhile). A full frame never
        # waits, so what the channel buffers stays bounded.
        self.defers_when_congested = False
        self.max_inflight_seen = 0
        # a protocol's hook that may add bookkeeping to each frame before it is sent
        self.decorate: Callable[[list], list] | None = None
        # called with (channel_id, seq, payload) for every frame sent, when a protocol
        # logs in-flight messages
        self.on_sent: Callable[[int, int, bytes], None] | None = None
        # the sending task's injected faults (`bastion.runtime.faults`), if any
        self.faults: Any = None
        self.records_offered = 0   # data records of every frame offered (lost ones too)

    # -- buffering --------------------------------------------------------------------

    def has_pending(self) -> bool:
        return bool(self.elements)

    def add_batch(self, batch: Batch) -> bool:
        """Buffer a batch; True when the frame is full and should be sent."""
        if not self.elements:
            self.first_buffered_s = time.monotonic()
        self.elements.append(batch)
        self.records += len(batch)
        self.records_sent += len(batch)
        return self.records >= self.frame_records

    def add_control(self, control: ControlRecord) -> None:
        if not self.elements:
            self.first_buffered_s = time.monotonic()
        elif isinstance(control, Watermark) and isinstance(self.elements[-1], Watermark):
            self.elements[-1] = control  # a newer watermark supersedes an unsent one
            return
        self.elements.append(control)

    def take_frame(self) -> list:
        frame, self.elements, self.records = self.elements, [], 0
        self.frame_buffered_s = self.first_buffered_s  # a lossy outage asks (`send`)
        return frame

    def aged(self, now_s: float) -> bool:
        return (bool(self.elements) and now_s - self.first_buffered_s >= self.buffer_timeout_s
                and not (self.defers_when_congested and self.records < self.frame_records
                         and self.congested()))

    # -- transport --------------------------------------------------------------------

    async def send(self, frame: list) -> None:
        if self.faults is not None and await self._injected_loss(frame):
            return
        if self.decorate is not None:
            frame = self.decorate(frame)
        payload = self._codec.encode(frame)
        seq = self.seq
        self.seq += 1
        if self.on_sent is not None:
            self.on_sent(self.channel_id, seq, payload)
        self.frames_sent += 1
        self.bytes_sent += len(payload)
        await self.transmit(seq, payload)

    async def _injected_loss(self, frame: list) -> bool:
        """Carry out the faults injected before a send: wait out stalls and outages;
        True if the frame is lost. A lost frame takes no sequence number — it is as if
        it had never been sent — so the receiver does not wait for it."""
        records = sum(len(e) for e in frame if type(e) is Batch)
        droppable = all(type(e) in (Batch, Watermark) for e in frame)
        # A frame is named by the records the channel carried before it: frames cut
        # the same way lose the same records, whatever the clock did.
        first_record = self.records_offered
        self.records_offered += records
        wait_s, lost = self.faults.before_send(self.channel_id, first_record, records,
                                               droppable, self.frame_buffered_s)
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        return lost

    async def transmit(self, seq: int, payload: bytes) -> None:
        """Deliver an encoded frame with its sequence number (replay uses this too)."""
        raise NotImplementedError

    async def drain(self) -> None:
        """Wait until every frame sent so far has been acknowledged."""

    def congested(self) -> bool:
        """Would sending a frame now wait (no credit, or the inbox is full)?"""
        return False

    async def flush(self) -> None:
        if self.has_pending():
            frame = self.take_frame()
            await self.send(frame)


class RemoteOutputChannel(OutputChannel):
    """To a task in another worker: msgpack over a Ray actor call, with credits."""

    def __init__(self, channel_id: int, frame_records: int, buffer_timeout_s: float,
                 push: Callable[..., Any], codec: FrameCodec,
                 max_inflight_frames: int):
        super().__init__(channel_id, frame_records, buffer_timeout_s)
        # push(channel_id, seq, payload, tear=False) -> an awaitable acknowledgement
        self._push = push
        self._codec = codec
        self._max_inflight = max_inflight_frames
        self._inflight: collections.deque = collections.deque()

    async def transmit(self, seq: int, payload: bytes) -> None:
        while len(self._inflight) >= self._max_inflight:
            await self._inflight.popleft()
        # An injected `DropConnection` due now tears this frame: part of it is written,
        # then the connection is aborted; the link heals and resends it
        # (`bastion.runtime.transport`). Asked here, where a frame goes over TCP.
        if self.faults is not None and self.faults.tear_due():
            self._inflight.append(self._push(self.channel_id, seq, payload, tear=True))
        else:
            self._inflight.append(self._push(self.channel_id, seq, payload))
        if len(self._inflight) > self.max_inflight_seen:
            self.max_inflight_seen = len(self._inflight)

    async def drain(self) -> None:
        while self._inflight:
            await self._inflight.popleft()

    def congested(self) -> bool:
        return len(self._inflight) >= self._max_inflight and not self._inflight[0].done()


class LocalOutputChannel(OutputChannel):
    """To a task in the same worker: through the bounded inbox, without a Ray call.
    The frame is still encoded, so a value behaves the same wherever its consumer
    runs (it must be serialisable, and a list arrives as a tuple) — unless decoding
    would give back the very same values (`passes_unencoded`: numbers only) and
    nothing needs the encoded bytes (no protocol logs or decorates the frame, no
    injected fault): then the frame's elements go into the inbox as they are."""

    def __init__(self, channel_id: int, frame_records: int, buffer_timeout_s: float,
                 deliver: Callable[[int, int, Any], Awaitable[None]], codec: FrameCodec,
                 inbox_full: Callable[[], bool] = lambda: False):
        super().__init__(channel_id, frame_records, buffer_timeout_s)
        self._deliver = deliver
        self._codec = codec
        self._inbox_full = inbox_full

    async def send(self, frame: list) -> None:
        if (self.decorate is None and self.on_sent is None and self.faults is None
                and passes_unencoded(frame)):
            seq = self.seq
            self.seq += 1
            self.frames_sent += 1
            await self._deliver(self.channel_id, seq, frame)
            return
        await super().send(frame)

    async def transmit(self, seq: int, payload: bytes) -> None:
        await self._deliver(self.channel_id, seq, payload)

    def congested(self) -> bool:
        return self._inbox_full()


class HeldOutputChannel(OutputChannel):
    """To a task that is not running yet: *adaptive buffering*.

    After a failure that left some tasks pending (no capacity for them yet, see
    `bastion.scheduler.recovery`), their upstream tasks keep running for the queries
    that are available. Frames for a pending task are numbered and encoded as usual
    but held here: the newest ``in_memory_frames`` in memory, older ones spilled to
    the job's store, each spilled blob sealed with a checksum. The sender never waits
    on a pending task, so a healthy query it also feeds is never held up by it. When
    the task joins the running attempt, `attach` hands every held frame, in sequence
    order, to the real channel and forwards from then on — the receiver sees frames
    that were late, not replayed, so nothing is processed twice."""

    def __init__(self, channel_id: int, frame_records: int, buffer_timeout_s: float,
                 codec: FrameCodec, in_memory_frames: int, store: Any, spill_prefix: str):
        super().__init__(channel_id, frame_records, buffer_timeout_s)
        self._codec = codec
        self._in_memory_frames = in_memory_frames
        self._store = store
        self._spill_prefix = spill_prefix
        self._held: list[tuple[int, bytes]] = []
        # keys of spilled blobs, oldest first (a `ReplayableOutputChannel` keeps
        # (key, last seq, bytes) tuples here instead)
        self._spilled: list[Any] = []
        self._target: OutputChannel | None = None
        self._lock = asyncio.Lock()     # a transmit and the attach never interleave
        self.attaching = False
        self.frames_held = 0
        self.frames_spilled = 0

    async def transmit(self, seq: int, payload: bytes) -> None:
        async with self._lock:
            if self._target is not None:
                await self._target.transmit(seq, payload)
                return
            self._held.append((seq, payload))
            self.frames_held += 1
            if len(self._held) >= self._in_memory_frames:
                key = f"{self._spill_prefix}/{len(self._spilled):08d}"
                await self._store.aput(key, seal(msgpack.packb(self._held)))
                self._spilled.append(key)
                self.frames_spilled += len(self._held)
                self._held = []

    async def attach(self, target: OutputChannel) -> None:
        """The receiving task runs now: send it everything held, then forward."""
        self.attaching = True
        async with self._lock:
            for key in self._spilled:
                frames = msgpack.unpackb(open_bytes(await self._store.aget(key), key))
                for seq, payload in frames:
                    await target.transmit(seq, payload)
            for seq, payload in self._held:
                await target.transmit(seq, payload)
            for key in self._spilled:
                await self._store.adelete(key)
            self._held, self._spilled, self._target = [], [], target

    @property
    def attached(self) -> bool:
        return self._target is not None

    @property
    def replaying(self) -> bool:
        """Sending a receiver that joined what it missed, not forwarding live yet (the
        receiver is catching up: `bastion.scheduler.catchup`)."""
        return self.attaching and self._target is None

    async def drain(self) -> None:
        if self._target is not None:
            await self._target.drain()

    def congested(self) -> bool:
        return self._target is not None and self._target.congested()


class _Retargeted:
    """Half of a channel that forwards to ``_target``, the channel to its receiver's
    current incarnation (None: there is none now), and lets go of a target whose
    receiver turned out to be gone instead of failing the sending task."""

    _target: OutputChannel | None

    def _drop(self, target: OutputChannel) -> None:
        if self._target is target:
            self._target = None

    async def drain(self) -> None:
        target = self._target
        if target is not None:
            try:
                await target.drain()
            except PeerLostError:
                self._drop(target)

    def congested(self) -> bool:
        return self._target is not None and self._target.congested()


class ReplayableOutputChannel(_Retargeted, HeldOutputChannel):
    """A channel with *upstream backup*: the sender keeps every frame it sent since
    the last completed checkpoint, so that a receiver restarted from that checkpoint
    can be sent them again (a regional restart: see `bastion.runtime.job`).

    Frames are numbered and encoded as usual, and logged — the newest
    ``in_memory_frames`` in memory, older ones spilled to the store like a held
    channel's — before they are forwarded to the *target*, the channel to the
    receiver's current incarnation. Without a target (the receiver is pending, or
    was lost) frames are only logged, and the sender never waits on them: the
    queries it also feeds keep running. `attach` gives it a target, first sending the
    logged frames from the receiver's restored position on; `trim` forgets the frames
    a completed checkpoint made unnecessary. A target that turns out to be gone (its
    peer died: `PeerLostError`; its task was reset: the delivery was cancelled) is
    dropped instead of failing the sending task: the job master restarts the receiver
    and attaches it again, and the log still holds what it missed.

    **Adaptive buffering** (Su & Zhou; `bastion.scheduler.failover`): a channel made
    with ``logs=False`` forwards without keeping anything — the backup costs nothing
    in normal operation — until `start_logging` (a burst was detected); `stop_logging`
    frees what it kept (a checkpoint completed once every lost task ran again). Such
    a channel's receiver restarts only with its sender (the region grows upstream past
    a sender that does not log since the line), so a frame it cannot forward is lost
    with a receiver that will be fed by a restarted sender. A channel made without a
    target (its receiver is pending) logs whatever ``logs`` says: the receiver needs
    everything. ``frames_logged`` and ``bytes_logged`` count what was ever kept,
    ``kept_bytes`` what is kept now.
"""

    def __init__(self, channel_id: int, frame_records: int, buffer_timeout_s: float,
                 codec: FrameCodec, in_memory_frames: int, store: Any, spill_prefix: str,
                 target: OutputChannel | None, logs: bool = True):
        super().__init__(channel_id, frame_records, buffer_timeout_s, codec,
                         in_memory_frames, store, spill_prefix)
        self._target = target
        self.logs = logs or target is None
        self._chunks_written = 0   # names spilled chunks: trimming drops the oldest
        self._generation = 0       # grows with each `detach`: ends an `attach`
        self.frames_logged = 0
        self.bytes_logged = 0
        self.kept_bytes = 0        # in memory and spilled, now
        self.frames_dropped = 0    # not logged, and no receiver to forward to

    async def transmit(self, seq: int, payload: bytes) -> None:
        async with self._lock:
            target = self._target
            if target is None:
                self.frames_held += 1
            if self.logs:
                await self._log(seq, payload)
            elif target is None:
                self.frames_dropped += 1
            if target is not None and not await _forward(target, seq, payload):
                self._drop(target)

    async def _log(self, seq: int, payload: bytes) -> None:
        self._held.append((seq, payload))
        self.frames_logged += 1
        self.bytes_logged += len(payload)
        self.kept_bytes += len(payload)
        if len(self._held) >= self._in_memory_frames:
            key = f"{self._spill_prefix}/{self._chunks_written:08d}"
            self._chunks_written += 1
            await self._store.aput(key, seal(msgpack.packb(self._held)))
            self._spilled.append((key, self._held[-1][0],
                                  sum(len(p) for _, p in self._held)))
            self.frames_spilled += len(self._held)
            self._held = []

    def start_logging(self) -> None:
        """Keep every frame sent from now on (a burst: adaptive buffering is on)."""
        self.logs = True

    async def stop_logging(self) -> int:
        """Keep nothing any more, and free what is kept (adaptive buffering is off: a
        checkpoint completed after the burst's recovery). The bytes freed. A channel
        whose receiver is not attached keeps its log: that receiver still needs it."""
        async with self._lock:
            if self._target is None or self.attaching:
                return 0
            self.logs = False
            freed = self.kept_bytes
            for key, _, _ in self._spilled:
                await self._store.adelete(key)
            self._held, self._spilled, self.kept_bytes = [], [], 0
            return freed

    def detach(self) -> None:
        """The receiver restarts: log frames only, until `attach`."""
        self._target = None
        self._generation += 1

    async def attach(self, target: OutputChannel, from_seq: int = 0) -> None:
        """The receiver runs (again), restored to expect frame ``from_seq`` next: send
        it the logged frames from there, in order, then forward. The sender does not
        wait meanwhile — what it sends is logged, and sent in its turn — so the
        queries it also feeds are not held up by a receiver catching up."""
        self.attaching = True
        generation = self._generation
        next_seq = from_seq
        try:
            while generation == self._generation:
                frames = await self._logged_from(next_seq)
                if not frames:  # caught up, and nothing awaited since the look
                    self._target = target
                    return
                for seq, payload in frames:
                    if generation != self._generation:
                        return  # detached meanwhile: this receiver is gone
                    if not await _forward(target, seq, payload):
                        return  # gone again: the job master attaches it once more
                    next_seq = seq + 1
        finally:
            self.attaching = False

    async def _logged_from(self, seq: int) -> list[tuple[int, bytes]]:
        """The oldest logged frames from ``seq`` on, in order: a spilled chunk's or
        those in memory; [] when there are none (returned without awaiting)."""
        for key, last_seq, _ in self._spilled:
            if last_seq >= seq:
                frames = msgpack.unpackb(open_bytes(await self._store.aget(key), key))
                return [(s, payload) for s, payload in frames if s >= seq]
        return [(s, payload) for s, payload in self._held if s >= seq]

    async def trim(self, below_seq: int) -> None:
        """Frames below ``below_seq`` are reflected in a completed checkpoint of the
        receiver: no restart will ask for them again."""
        async with self._lock:
            while self._spilled and self._spilled[0][1] < below_seq:
                key, _, size = self._spilled.pop(0)
                self.kept_bytes -= size
                await self._store.adelete(key)
            kept = [(seq, payload) for seq, payload in self._held if seq >= below_seq]
            self.kept_bytes -= sum(len(p) for _, p in self._held) - sum(
                len(p) for _, p in kept)
            self._held = kept


class ReroutableOutputChannel(_Retargeted, OutputChannel):
    """A channel whose receiver may restart on its own while its sender runs on (a
    failover that restarts failed tasks only: `bastion.scheduler.failover`).

    Frames are numbered and encoded as usual, and forwarded to the *target*, the
    channel to the receiver's current incarnation. When the receiver is gone — its
    peer died (`PeerLostError`), its task was reset (the delivery was cancelled), or
    the job master said it restarts (`detach`) — what the sender sends is dropped, and
    the sender never waits on it: the protocol replays what those frames carried
    (``acks``: every root not acknowledged in time). `attach` gives it the new
    incarnation, whose frames are numbered from 0 again: the receiver starts fresh,
    and its frame 0 holds the newest watermark and the end of stream the channel
    carried so far — which no replay sends again: a sender that ended while its
    receiver was down would otherwise leave the new incarnation waiting for ever.

    A receiver lost without the job master restarting it within
    ``unattached_timeout_s`` — the link broke while both ends live — makes the next
    send raise `PeerLostError`, as a channel without rerouting would at once: the
    sending task fails, and its restart connects again. Dropping for ever would leave
    the job replaying into a channel that leads nowhere."""

    def __init__(self, channel_id: int, frame_records: int, buffer_timeout_s: float,
                 codec: FrameCodec, target: OutputChannel | None,
                 unattached_timeout_s: float = 10.0):
        super().__init__(channel_id, frame_records, buffer_timeout_s)
        self._codec = codec
        self._target = target
        self._unattached_timeout_s = unattached_timeout_s
        self._lost_at_s: float | None = None  # when a receiver was lost unannounced
        # The frame a receiver attached later takes as its frame 0. The first
        # receiver (None) takes the numbers as they are, so that a new incarnation
        # of the sender shows in them (`first_seq`).
        self._first: int | None = None
        self.frames_dropped = 0
        self._carried: dict[type, ControlRecord] = {}  # the newest of each kind sent

    async def send(self, frame: list) -> None:
        for element in frame:
            if type(element) is Watermark or type(element) is EndOfStream:
                self._carried[type(element)] = element
        await super().send(frame)

    async def transmit(self, seq: int, payload: bytes) -> None:
        target, first = self._target, self._first
        if first is not None:
            seq -= first
        if target is None or seq < 0:  # no receiver, or meant for the one before
            self.frames_dropped += 1
            lost_at_s = self._lost_at_s
            if lost_at_s is not None \
                    and time.monotonic() - lost_at_s > self._unattached_timeout_s:
                raise PeerLostError(f"channel {self.channel_id}: its receiver was lost "
                                    f"{self._unattached_timeout_s:g} s ago and no new "
                                    "incarnation of it was attached")
        elif not await _forward(target, seq, payload):
            self.frames_dropped += 1
            self._drop(target)

    def _drop(self, target: OutputChannel) -> None:
        if self._target is target:
            self._target, self._lost_at_s = None, time.monotonic()

    @property
    def attached(self) -> bool:
        return self._target is not None

    def detach(self) -> None:
        """The receiver restarts: drop frames until `attach`."""
        self._target, self._lost_at_s = None, None

    async def attach(self, target: OutputChannel) -> None:
        """The receiver's new incarnation runs: send it, as its frame 0, the newest
        watermark and the end of stream sent so far (or nothing), then forward."""
        seq = self.seq
        self.seq += 1
        self._first, self._target, self._lost_at_s = seq, target, None
        carried = [self._carried[kind] for kind in (Watermark, EndOfStream)
                   if kind in self._carried]
        await self.transmit(seq, self._codec.encode(carried))


async def _forward(target: OutputChannel, seq: int, payload: bytes) -> bool:
    """Send one frame to ``target``; False when the receiver is gone. Run apart from
    the sending task, so that resetting the receiver (which cancels the deliveries
    waiting at its gate) cancels the delivery, not the sender."""
    sending = asyncio.ensure_future(target.transmit(seq, payload))
    try:
        await asyncio.wait({sending})
    except asyncio.CancelledError:
        sending.cancel()
        raise
    if sending.cancelled() or isinstance(sending.exception(), PeerLostError):
        return False
    sending.result()
    return True


class InputGate:
    """The receiving side of a task: per-channel ordering into one bounded inbox."""

    def __init__(self, inbox_frames: int):
        self.inbox: asyncio.Queue = asyncio.Queue(maxsize=inbox_frames)
        self._expected: dict[int, int] = collections.defaultdict(int)
        self._waiting: dict[int, dict[int, asyncio.Future]] = collections.defaultdict(dict)
        self._blocked: dict[int, asyncio.Event] = {}
        self._admitting: dict[int, int] = {}  # channel -> the frame entering the inbox
        self.duplicates_dropped = 0
        self.max_queued_seen = 0
        self._delivering: set[asyncio.Task] = set()  # deliveries still waiting
        self._resyncing: set[int] = set()  # channels whose next frame is the first

    async def deliver(self, channel_id: int, seq: int, frame: Any) -> None:
        """Enqueue frame ``seq`` of a channel once every earlier frame is enqueued.
        Returns when it is in the inbox: that return is the sender's credit."""
        delivery = asyncio.current_task()
        assert delivery is not None  # a coroutine awaited by the event loop runs in a task
        self._delivering.add(delivery)
        try:
            await self._deliver(channel_id, seq, frame)
        finally:
            self._delivering.discard(delivery)

    async def next_frame(self, timeout_s: float | None = None) -> tuple[int, int, Any] | None:
        """The next admitted ``(channel_id, seq, frame)``; None after ``timeout_s``
        without one. A cancelled call always raises `CancelledError` and leaves the
        frame in the inbox (unlike `asyncio.wait_for` before Python 3.12, which returns
        a frame that arrived as it was cancelled: the task's loop then never ends)."""
        if timeout_s is None:
            return await self.inbox.get()
        try:
            async with asyncio.timeout(timeout_s):
                return await self.inbox.get()
        except TimeoutError:
            return None

    def close(self) -> None:
        """The task is gone (its attempt failed): end every delivery still waiting for
        its turn or for room in the inbox, so none is left waiting for ever."""
        for delivery in list(self._delivering):
            delivery.cancel()

    async def _deliver(self, channel_id: int, seq: int, frame: Any) -> None:
        if channel_id in self._resyncing:
            self._resyncing.discard(channel_id)
            self._expected[channel_id] = seq
        expected = self._expected[channel_id]
        band = seq >> SEQ_BAND_BITS
        if band > expected >> SEQ_BAND_BITS:  # a new incarnation of the sender
            expected = first_seq(band)
            self._start_over(channel_id, expected)
        # A frame already seen, or being delivered right now (two senders of the same
        # frame: a replay that overlaps the original) is dropped.
        if seq < expected or seq in self._waiting[channel_id] \
                or self._admitting.get(channel_id) == seq:
            self.duplicates_dropped += 1
            return
        if seq > expected:
            turn = asyncio.get_running_loop().create_future()
            self._waiting[channel_id][seq] = turn
            await turn
            if self._expected[channel_id] != seq:  # its sender started over meanwhile
                self.duplicates_dropped += 1
                return
        self._admitting[channel_id] = seq
        while channel_id in self._blocked:  # held back: the sender keeps its credit
            await self._blocked[channel_id].wait()
        await self.inbox.put((channel_id, seq, frame))
        if self.inbox.qsize() > self.max_queued_seen:
            self.max_queued_seen = self.inbox.qsize()
        if self._expected[channel_id] != seq:
            return  # its sender started over while it waited for room: the new one's turn
        self._expected[channel_id] = seq + 1
        nxt = self._waiting[channel_id].pop(seq + 1, None)
        if nxt is not None:
            self._admitting[channel_id] = seq + 1  # from now, not when it resumes
            nxt.set_result(None)

    def _start_over(self, channel_id: int, seq: int) -> None:
        """A new incarnation of the channel's sender numbers its frames from ``seq``
        (`first_seq`, a newer band than the channel's): the channel starts over from
        there. Frames of the incarnations before that still wait for their turn are
        dropped (they wake up to find the channel moved on)."""
        self._expected[channel_id] = seq
        self._admitting.pop(channel_id, None)
        waiting = self._waiting[channel_id]
        for stale in [s for s in waiting if s < seq]:
            turn = waiting.pop(stale)
            if not turn.done():
                turn.set_result(None)

    def block(self, channel_id: int) -> None:
        """Stop admitting frames of a channel (barrier alignment); its senders stall."""
        self._blocked.setdefault(channel_id, asyncio.Event())

    def unblock(self, channel_id: int) -> None:
        event = self._blocked.pop(channel_id, None)
        if event is not None:
            event.set()

    def expect(self, channel_id: int, seq: int) -> None:
        """Frames of the channel below ``seq`` are already reflected in the restored
        state: drop them when a replay sends them again."""
        self._expected[channel_id] = seq

    def resync(self, channel_id: int) -> None:
        """The channel's next frame, whatever its number, comes first: its sender
        resends what its upstream backup kept, oldest first, one frame at a time
        (`ReplayableOutputChannel.attach`), and the receiver's protocol drops what
        its restored state reflects by content, not by number."""
        self._resyncing.add(channel_id)
