"""A dropped or reset connection heals by reconnecting and resending, with no restart
(`bastion.runtime.transport`, `bastion.faults.DropConnection`).

Unit tests run a `PeerLink` against a real `FrameServer` on 127.0.0.1 whose frames go
through a real `InputGate`, tear the connection in the middle of a frame, and check by
identity — (channel, seq) and payload — that every frame arrived exactly once, in
order. Two of them break the new paths on purpose (a link that does not resend, a gate
that does not deduplicate) and show that this same check then reports the frame lost
or duplicated: the check can fail. The drills run real jobs whose sender and receiver
sit on different workers and tear the connection between them mid-run."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from typing import Callable

import pytest

import bastion as bn
from bastion.drills import reference_runs
from bastion.errors import PeerLostError
from bastion.runtime import transport
from bastion.runtime.channel import InputGate
from bastion.runtime.plan import build_plan
from bastion.runtime.transport import FrameServer, PeerLink, PeerLinks, pusher
from protocol_knobs import with_interval

EPOCH = ("job-heal", 0)
CHANNELS = (3, 4)


def payload(channel_id: int, seq: int) -> bytes:
    # large enough that a frame spans several TCP segments, distinct per frame
    return f"{channel_id}/{seq};".encode() * 2000


class GatedReceiver:
    """A worker's receiving side in miniature: frames go through an `InputGate` (which
    drops a frame it has seen by channel and seq), and a consumer takes them from the
    inbox in the order the task would. ``hold_acks``: a delivered frame is in the inbox
    but its acknowledgment waits, so a connection torn now leaves frames delivered
    and unacknowledged — which the sender resends."""

    def __init__(self) -> None:
        self.gate = InputGate(inbox_frames=1000)
        self.received: list[tuple[int, int, bytes]] = []
        self.acks_released = asyncio.Event()
        self.acks_released.set()

    async def deliver(self, epoch, task_id, channel_id, seq, payload, incarnation=0) -> None:
        assert epoch == EPOCH and task_id == 0
        await self.gate.deliver(channel_id, seq, payload)
        while not self.gate.inbox.empty():
            self.received.append(self.gate.inbox.get_nowait())
        await self.acks_released.wait()


def exactly_once(sent: list[tuple[int, int, bytes]],
                 received: list[tuple[int, int, bytes]]) -> dict[str, list]:
    """What went wrong, by identity (channel, seq): frames sent and never received,
    received more than once, received with other bytes, or out of order per channel."""
    by_id = {(c, s): p for c, s, p in sent}
    seen: dict[tuple[int, int], int] = {}
    problems: dict[str, list] = {"lost": [], "duplicated": [], "corrupted": [],
                                 "out_of_order": []}
    last: dict[int, int] = {}
    for channel_id, seq, data in received:
        key = (channel_id, seq)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            problems["duplicated"].append(key)
        elif by_id.get(key) != data:
            problems["corrupted"].append(key)
        if seq < last.get(channel_id, -1):
            problems["out_of_order"].append(key)
        last[channel_id] = seq
    problems["lost"] = [key for key in by_id if key not in seen]
    return problems


CLEAN = {"lost": [], "duplicated": [], "corrupted": [], "out_of_order": []}


async def started(receiver: GatedReceiver, heal_timeout_s: float = 5.0
                  ) -> tuple[FrameServer, PeerLink]:
    server = RecordingServer(receiver.deliver)
    address = await server.start("127.0.0.1")
    links = PeerLinks(heal_timeout_s=heal_timeout_s)
    await links.connect([address])
    return server, links[address]


class RecordingServer(FrameServer):
    """A `FrameServer` that keeps its connections' writers, so a test can reset one
    from the receiver's end."""

    def __init__(self, deliver) -> None:
        super().__init__(deliver)
        self.writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader, writer) -> None:
        self.writers.append(writer)
        await super()._serve(reader, writer)


async def shutdown(server: FrameServer, *links: PeerLink) -> None:
    """Close the links, then the server once its connections ended (a connection task
    cancelled when the test's loop closes logs an error)."""
    for link in links:
        link.close()
    server._server.close()
    await until(lambda: not [t for t in asyncio.all_tasks() if "_serve" in repr(t)])


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the condition")
        await asyncio.sleep(0.005)


async def tear_mid_run(link: PeerLink, receiver: GatedReceiver, before: int = 20,
                       after: int = 20) -> tuple[list, list]:
    """Send ``before`` frames per channel and wait until they are all delivered (their
    acknowledgments held back), tear the connection in the middle of the next frame,
    then send ``after`` more per channel while the link heals. What was sent, and the
    acknowledgment futures."""
    sent, acks = [], []
    for seq in range(before):
        for channel_id in CHANNELS:
            sent.append((channel_id, seq, payload(channel_id, seq)))
            acks.append(link.send(EPOCH, 0, channel_id, seq, payload(channel_id, seq)))
    await until(lambda: len(receiver.received) == len(sent))
    torn = (CHANNELS[0], before, payload(CHANNELS[0], before))
    sent.append(torn)
    acks.append(link.send(EPOCH, 0, *torn, tear=True))
    for seq in range(before, before + after):
        for channel_id in CHANNELS:
            if (channel_id, seq) == torn[:2]:
                continue
            sent.append((channel_id, seq, payload(channel_id, seq)))
            acks.append(link.send(EPOCH, 0, channel_id, seq, payload(channel_id, seq)))
    # the acknowledgments written to the torn connection go nowhere, and must not raise
    receiver.acks_released.set()
    return sent, acks


@pytest.mark.internal
async def test_a_connection_torn_mid_frame_heals_and_every_frame_arrives_once_in_order():
    receiver = GatedReceiver()
    receiver.acks_released.clear()
    server, link = await started(receiver)
    sent, acks = await tear_mid_run(link, receiver)
    await asyncio.wait_for(asyncio.gather(*acks), 10)
    assert exactly_once(sent, receiver.received) == CLEAN
    assert (link.tears, link.heals, link.broken) == (1, 1, None)
    # the 40 frames delivered before the tear were resent, and dropped as seen
    assert receiver.gate.duplicates_dropped == 40
    # the healed connection carries on
    await asyncio.wait_for(link.send(EPOCH, 0, CHANNELS[1], 40, payload(CHANNELS[1], 40)), 10)
    assert receiver.received[-1] == (CHANNELS[1], 40, payload(CHANNELS[1], 40))
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_reset_by_the_receiver_heals_too():
    """Not a tear of the sender's own: the receiver's end resets the connection (as
    a middlebox or a receiver-side timeout would), with frames unacknowledged."""
    receiver = GatedReceiver()
    receiver.acks_released.clear()
    server, link = await started(receiver)
    sent, acks = [], []
    for seq in range(10):
        sent.append((3, seq, payload(3, seq)))
        acks.append(link.send(EPOCH, 0, 3, seq, payload(3, seq)))
    await until(lambda: len(receiver.received) == 10)
    [connection] = server.writers
    connection.transport.abort()  # a reset from the receiver's end
    for seq in range(10, 15):
        sent.append((3, seq, payload(3, seq)))
        acks.append(link.send(EPOCH, 0, 3, seq, payload(3, seq)))
    receiver.acks_released.set()
    await asyncio.wait_for(asyncio.gather(*acks), 10)
    assert exactly_once(sent, receiver.received) == CLEAN
    assert link.heals == 1
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_frame_half_read_when_its_connection_died_is_never_delivered():
    receiver = GatedReceiver()
    server = FrameServer(receiver.deliver)
    host, port = await server.start("127.0.0.1")
    whole = PeerLink((host, port))
    await whole.connect()
    frame = b"".join(_frame(7, 3, 0, b"complete"))
    torn = b"".join(_frame(8, 3, 1, b"x" * 50_000))
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(frame + torn[:len(torn) // 2])
    await writer.drain()
    writer.close()
    await asyncio.sleep(0.2)
    # the whole frame was delivered, the torn one not; nothing raised on the server
    assert [(c, s) for c, s, _ in receiver.received] == [(3, 0)]
    assert not [t for t in server._pending if not t.done() and t.exception()]
    await shutdown(server, whole)


def _frame(message_id: int, channel_id: int, seq: int, data: bytes) -> tuple[bytes, ...]:
    import msgpack

    header = msgpack.packb([message_id, EPOCH[0], EPOCH[1], 0, channel_id, seq, 0])
    return transport._LENGTHS.pack(len(header), len(data)), header, data


@pytest.mark.internal
async def test_acknowledgment_messages_are_not_resent():
    """An ``acks``-protocol message (``resend=False``) written before a tear is not
    sent again (a copy would corrupt the protocol's XOR ledger); its future is
    cancelled. One sent during the heal was never written: it goes out after it."""
    got: list[tuple[int, int]] = []

    async def deliver(epoch, task_id, channel_id, seq, data, incarnation=0) -> None:
        got.append((channel_id, int(data)))

    server = FrameServer(deliver)
    address = await server.start("127.0.0.1")
    link = PeerLink(address)
    await link.connect()
    before = link.send(EPOCH, 0, -1, 0, b"1", resend=False)
    data = link.send(EPOCH, 0, 3, 0, b"2", tear=True)
    during = link.send(EPOCH, 0, -1, 0, b"3", resend=False)
    await asyncio.wait_for(asyncio.gather(data, during), 10)
    await until(lambda: len(got) >= 3)
    await asyncio.sleep(0.1)  # time for a second copy, if one were sent
    # `before` went whole before the tear (the connection's end was orderly: nothing
    # unread on the sender's side), so it arrived — once
    assert before.cancelled()
    assert sorted(got) == [(-1, 1), (-1, 3), (3, 2)], got
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_peer_gone_for_good_is_still_a_peer_lost_error():
    # Refused: nothing listens at its address any more — its process is gone, and
    # the link breaks at once rather than wait out the heal time.
    receiver = GatedReceiver()
    server, link = await started(receiver, heal_timeout_s=5.0)
    server._server.close()
    await server._server.wait_closed()
    waiting = link.send(EPOCH, 0, 3, 0, payload(3, 0), tear=True)
    started_s = time.monotonic()
    with pytest.raises(PeerLostError, match="refuses connections"):
        await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - started_s < 2.0
    with pytest.raises(PeerLostError):
        await link.send(EPOCH, 0, 3, 1, b"after")
    assert link.heals == 0


async def test_a_peer_that_takes_no_frames_breaks_the_link_after_the_heal_time():
    """A peer that accepts connections and drops them at once never acknowledges
    anything: the heal window spans the reconnections, and the link breaks when it
    ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    accepted = 0

    async def drop_every_connection() -> None:
        nonlocal accepted
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            accepted += 1
            conn.close()

    dropping = asyncio.ensure_future(drop_every_connection())
    link = PeerLink(listener.getsockname(), heal_timeout_s=0.6)
    await link.connect()
    started_s = time.monotonic()
    waiting = link.send(EPOCH, 0, 3, 0, b"never acknowledged")
    with pytest.raises(PeerLostError, match="could not be reconnected within 0.6 s"):
        await asyncio.wait_for(waiting, 10)
    assert 0.5 <= time.monotonic() - started_s < 3.0
    assert accepted >= 2  # it did reconnect, more than once
    dropping.cancel()
    listener.close()


@pytest.mark.internal
@pytest.mark.parametrize("seed", [1, 2])
async def test_many_tears_under_load_lose_and_duplicate_nothing(seed):
    """Four channels, each with its credits (8 frames unacknowledged), frames of random
    sizes, and about one frame in a hundred torn — often while the link is still
    catching up from the tear before."""
    rng = random.Random(seed)
    receiver = GatedReceiver()
    server, link = await started(receiver)
    sent: list[tuple[int, int, bytes]] = []

    async def channel(channel_id: int) -> None:
        inflight: list[asyncio.Future] = []
        for seq in range(1000):
            data = f"{channel_id}:{seq};".encode() * rng.randint(1, 3000)
            while len(inflight) >= 8:
                await inflight.pop(0)
            sent.append((channel_id, seq, data))
            inflight.append(link.send(EPOCH, 0, channel_id, seq, data,
                                      tear=rng.random() < 0.01))
            if rng.random() < 0.1:
                await asyncio.sleep(0)
        await asyncio.gather(*inflight)

    await asyncio.wait_for(asyncio.gather(*(channel(c) for c in range(4))), 60)
    assert exactly_once(sent, receiver.received) == CLEAN
    assert link.tears >= 10 and link.heals == link.tears and link.broken is None
    await shutdown(server, link)


# -- the checks can fail: each new path, broken on purpose, is caught -----------------------


@pytest.mark.internal
async def test_a_sender_that_does_not_resend_is_caught_losing_the_torn_frame(monkeypatch):
    """Break the resend: after reconnecting, the link writes only what it never wrote
    (what was sent during the heal), not what the lost connection carried."""
    heal = PeerLink._heal

    async def heal_without_resend(self, reason):
        for message in self._unacked.values():
            if message.written:
                message.resend = False  # so the heal cancels it instead of resending
        return await heal(self, reason)

    monkeypatch.setattr(PeerLink, "_heal", heal_without_resend)
    receiver = GatedReceiver()
    receiver.acks_released.clear()
    server, link = await started(receiver)
    sent, acks = await tear_mid_run(link, receiver)
    await asyncio.wait(acks, timeout=1.0)
    problems = exactly_once(sent, receiver.received)
    # the torn frame is lost — and with it every later frame of its channel, which
    # the gate holds back waiting for it
    assert problems["lost"] == [(CHANNELS[0], seq) for seq in range(20, 40)], problems
    assert not any(problems[kind] for kind in ("duplicated", "corrupted", "out_of_order"))
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_receiver_that_does_not_deduplicate_is_caught_duplicating(monkeypatch):
    """Break the deduplication: the gate admits every frame, seen or not."""
    async def admit_everything(self, channel_id, seq, frame):
        await self.inbox.put((channel_id, seq, frame))

    monkeypatch.setattr(InputGate, "_deliver", admit_everything)
    receiver = GatedReceiver()
    receiver.acks_released.clear()
    server, link = await started(receiver)
    sent, acks = await tear_mid_run(link, receiver)
    await asyncio.wait_for(asyncio.gather(*acks), 10)
    problems = exactly_once(sent, receiver.received)
    # the 40 frames delivered before the tear, and resent with it
    assert len(problems["duplicated"]) == 40, problems
    assert problems["lost"] == []
    await shutdown(server, link)


# -- drills: real jobs, sender and receiver on different workers ---------------------------

RECORDS = 4000


def two_worker_pipeline() -> bn.Topology:
    """Two source+map instances, then one sink. With two workers (the default: the
    largest parallelism) the sink shares worker 0 with ``double[0]``; ``double[1]``
    runs on worker 1 and reaches it over TCP — the connection the fault drops."""
    topo = bn.Topology("heal-pipeline")
    nums = topo.source("nums", bn.sources.Generator(lambda i: i, count=RECORDS, rate=2000),
                       parallelism=2)
    nums.map("double", lambda i: 2 * i, parallelism=2).sink("out", bn.sinks.Collect(),
                                                            parallelism=1)
    return topo


DROPS = bn.faults.DropConnection("double", instances=(1,), at_s=(0.4, 1.0))


@pytest.fixture(scope="module")
def drill_storage(tmp_path_factory) -> str:
    return f"local://{tmp_path_factory.mktemp('heal')}"


@pytest.fixture(scope="module")
def reference(ray_session, drill_storage):
    plan = build_plan(two_worker_pipeline())
    sender, receiver = plan.task_of("double", 1), plan.task_of("out", 0)
    assert sender.worker != receiver.worker, "the drill needs its channel to cross workers"
    return reference_runs(two_worker_pipeline(), storage=drill_storage)


@pytest.fixture(scope="module")
def coordinated_drill(reference, drill_storage):
    return bn.drill(two_worker_pipeline(),
                    protocol=bn.protocols.Coordinated(interval_s=0.3), faults=[DROPS],
                    reference=reference, storage=drill_storage)


def assert_healed_without_restart(report) -> None:
    injected = report.metrics.extra["faults_injected"]
    assert injected["connections_dropped"] == len(DROPS.at_s), injected
    # by identity: every record of the reference committed once, with its value
    assert (report.lost, report.duplicated, report.corrupted) == (0, 0, 0), (
        report.lost_examples, report.duplicated_examples, report.corrupted_examples)
    assert sum(map(len, report.outputs.values())) == RECORDS
    # and healed, not recovered: one attempt, no failure seen, nothing restarted
    assert report.metrics.extra["attempts"] == 1
    kinds = [e["kind"] for e in report.events]
    assert "failure_detected" not in kinds and "restarted" not in kinds, kinds


def test_a_drill_that_drops_connections_mid_frame_loses_and_duplicates_nothing(
        coordinated_drill):
    assert_healed_without_restart(coordinated_drill)


def test_the_drill_verdict_of_dropped_connections_is_exactly_once(coordinated_drill):
    assert coordinated_drill.verdict == "exactly-once", coordinated_drill.verdict_reason


@pytest.mark.parametrize("protocol", ["cec", "uncoordinated"])
def test_a_drill_that_drops_connections_under_upstream_backups_loses_nothing(
        reference, drill_storage, protocol):
    # These protocols wrap every channel in an upstream backup (a failure restarts the
    # failed tasks and their downstream alone): the TCP channel inside it is torn.
    report = bn.drill(two_worker_pipeline(),
                      protocol=with_interval(protocol, interval_s=0.3), faults=[DROPS],
                      reference=reference, storage=drill_storage)
    assert_healed_without_restart(report)
    assert report.exactly_once, report.verdict_reason
