"""The frame port under attack (`bastion.runtime.transport`, docs/security.md).

A worker's `FrameServer` listens where other users of a shared cluster can reach it.
It takes frames only from links that prove the bound job's key (a mutual HMAC
challenge-response), bounds every length it reads before buffering anything, closes a
link that breaks the protocol (counted, logged once per peer host), bounds the frames
of one link being delivered at once, and runs mutual TLS between hosts when asked.

Unit tests drive a server on 127.0.0.1 directly. The last part fuzzes the frame ports
of a *running job* — 10,000 random byte strings, before and after a valid handshake,
oversize lengths (announcing 4 GiB and streaming into it), truncated frames, malformed
headers, frames naming another job, wrong keys and replayed handshakes — and checks
that the job's output is still exactly what plain Python computes, that each worker
grew by less than 50 MiB, and that the server closed every bad link within 2 s.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import random
import secrets
import threading
import time
from pathlib import Path

import msgpack
import pytest
import ray

import bastion as bn
from bastion.errors import PeerLostError
from bastion.runtime import transport
from bastion.runtime.config import JobConfig, with_frame_key
from bastion.runtime.transport import (HANDSHAKE_TIMEOUT_S, MAGIC, FrameServer,
                                       FrameTooLargeError, JobKey, LinkLimits, PeerLink,
                                       PeerLinks, TlsSettings, tls_from_env)

KEY = JobKey("job-sec", secrets.token_bytes(32))
EPOCH = (KEY.job_id, 0)
CLOSE_WITHIN_S = 2.0


class Receiver:
    def __init__(self) -> None:
        self.frames: list[tuple] = []
        self.held = asyncio.Event()
        self.held.set()
        self.waiting = 0

    async def deliver(self, epoch, task_id, channel_id, seq, payload, incarnation=0) -> None:
        self.waiting += 1
        await self.held.wait()
        self.waiting -= 1
        self.frames.append((epoch, task_id, channel_id, seq, payload))


async def serving(receiver: Receiver, key: JobKey | None = KEY, *,
                  limits: LinkLimits | None = None, tls: TlsSettings | None = None
                  ) -> tuple[FrameServer, tuple[str, int]]:
    server = FrameServer(receiver.deliver, authenticate=True, tls=tls)
    address = await server.start("127.0.0.1")
    server.bind(key, limits)
    return server, address


async def closed_after_s(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> float:
    """Seconds until the other end closed the connection (read to EOF or reset)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
    except (ConnectionError, OSError):
        pass
    except TimeoutError:
        return float("inf")
    return time.monotonic() - started


async def authenticated(address: tuple[str, int], key: JobKey = KEY
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection that passed the real handshake (the link's own code)."""
    reader, writer = await asyncio.open_connection(*address)
    await transport._prove_to_server(reader, writer, address, key, None)
    return reader, writer


def frame(header: list | bytes, payload: bytes = b"", *, lengths: tuple | None = None
          ) -> bytes:
    raw = header if isinstance(header, bytes) else msgpack.packb(header)
    header_len, payload_len = lengths or (len(raw), len(payload))
    return transport._LENGTHS.pack(header_len, payload_len) + raw + payload


async def shutdown(server: FrameServer, *links) -> None:
    for link in links:
        link.close()
    server._server.close()
    for writer in list(server._connections):
        writer.transport.abort()
    deadline = time.monotonic() + 10
    while [t for t in asyncio.all_tasks() if "FrameServer._serve" in repr(t)]:
        assert time.monotonic() < deadline, "connections of the server did not end"
        await asyncio.sleep(0.01)


# -- the handshake ---------------------------------------------------------------------------


@pytest.mark.internal
async def test_a_link_with_the_key_sends_frames_and_gets_their_acknowledgments():
    receiver = Receiver()
    server, address = await serving(receiver)
    link = PeerLink(address, key=KEY)
    await link.connect()
    await asyncio.wait_for(asyncio.gather(*[link.send(EPOCH, 1, 2, seq, b"x" * seq)
                                            for seq in range(20)]), 10)
    assert [f[3] for f in receiver.frames] == list(range(20))
    assert server.rejected_links == 0
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_link_that_never_handshakes_is_closed_within_2_s():
    server, address = await serving(Receiver())
    reader, writer = await asyncio.open_connection(*address)
    assert await reader.readexactly(len(MAGIC)) == MAGIC  # the server speaks first
    waited = await closed_after_s(reader)
    assert HANDSHAKE_TIMEOUT_S * 0.9 <= waited < CLOSE_WITHIN_S, waited
    assert server.rejections == {"handshake_timeout": 1}
    writer.close()
    await shutdown(server)


@pytest.mark.internal
async def test_a_correct_handshake_with_the_wrong_key_is_refused():
    receiver = Receiver()
    server, address = await serving(receiver)
    # the protocol followed to the letter, with another key: closed at once
    reader, writer = await asyncio.open_connection(*address)
    with pytest.raises(asyncio.IncompleteReadError):
        await transport._prove_to_server(reader, writer, address,
                                         JobKey(KEY.job_id, secrets.token_bytes(32)), None)
    writer.close()
    # the right key for another job is wrong too
    reader, writer = await asyncio.open_connection(*address)
    with pytest.raises(asyncio.IncompleteReadError):
        await transport._prove_to_server(reader, writer, address,
                                         JobKey("other-job", KEY.secret), None)
    writer.close()
    assert server.rejections == {"bad_proof": 2}
    # a PeerLink with a wrong key keeps being refused and breaks after its heal time
    link = PeerLink(address, heal_timeout_s=0.5, key=JobKey(KEY.job_id, b"w" * 32))
    await link.connect()
    with pytest.raises(PeerLostError, match="could not be reconnected"):
        await asyncio.wait_for(link.send(EPOCH, 0, 0, 0, b"injected"), 10)
    assert receiver.frames == []
    await shutdown(server, link)


class RecordingServer(FrameServer):
    """Keeps what each link sent during its handshake (the bytes the server read)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.transcripts: list[bytes] = []

    async def _handshake(self, reader, writer):
        read = reader.readexactly

        async def recording(n: int) -> bytes:
            data = await read(n)
            self.transcripts.append(data)
            return data

        reader.readexactly = recording
        try:
            return await super()._handshake(reader, writer)
        finally:
            reader.readexactly = read


@pytest.mark.internal
async def test_a_replayed_handshake_is_refused():
    receiver = Receiver()
    server = RecordingServer(receiver.deliver, authenticate=True)
    address = await server.start("127.0.0.1")
    server.bind(KEY)
    link = PeerLink(address, key=KEY)  # a real link's real handshake, recorded
    await link.connect()
    await asyncio.wait_for(link.send(EPOCH, 0, 0, 0, b"genuine"), 10)
    [answer] = server.transcripts
    for _ in range(3):
        reader, writer = await asyncio.open_connection(*address)
        await reader.readexactly(len(MAGIC) + 32)  # a new nonce: the answer is stale
        writer.write(answer + frame([0, KEY.job_id, 0, 0, 0, 1, 0], b"replayed"))
        assert await closed_after_s(reader) < CLOSE_WITHIN_S
        writer.close()
    assert server.rejections == {"bad_proof": 3}
    assert [f[4] for f in receiver.frames] == [b"genuine"]
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_link_relayed_through_another_address_is_refused():
    """A process at another address (one that took a dead worker's port) relays a link
    to a live worker of the same job: the server's address is in the proof."""
    receiver = Receiver()
    server, address = await serving(receiver)

    async def relay(client_reader, client_writer) -> None:
        reader, writer = await asyncio.open_connection(*address)

        async def pipe(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
            except OSError:
                pass
            dst.close()

        await asyncio.gather(pipe(client_reader, writer), pipe(reader, client_writer))

    proxy = await asyncio.start_server(relay, "127.0.0.1", 0)
    link = PeerLink(proxy.sockets[0].getsockname()[:2], heal_timeout_s=0.5, key=KEY)
    await link.connect()
    with pytest.raises(PeerLostError):
        await asyncio.wait_for(link.send(EPOCH, 0, 0, 0, b"relayed"), 10)
    assert receiver.frames == [] and server.rejections["bad_proof"] >= 1
    proxy.close()
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_server_that_cannot_prove_the_key_gets_no_frames_and_forges_no_acks():
    """A rogue process at a worker's address: it speaks the protocol but has no key.
    The link refuses it before sending a frame, so no acknowledgment of it counts."""
    got = asyncio.get_running_loop().create_future()

    async def rogue(reader, writer) -> None:
        writer.write(MAGIC + secrets.token_bytes(32))
        await reader.readexactly(64)
        writer.write(secrets.token_bytes(32))  # a made-up proof
        writer.write(transport._ACK.pack(0))  # ... and a forged acknowledgment
        try:
            got.set_result(await reader.read(65536))
        except ConnectionError:
            got.set_result(b"")

    server = await asyncio.start_server(rogue, "127.0.0.1", 0)
    link = PeerLink(server.sockets[0].getsockname()[:2], key=KEY)
    with pytest.raises(PeerLostError, match="could not prove it knows the key"):
        await link.connect()
    assert await asyncio.wait_for(got, 10) == b""  # it closed without a byte of a frame
    server.close()


@pytest.mark.internal
async def test_a_server_rebound_to_another_job_closes_the_links_of_the_job_before():
    receiver = Receiver()
    server, address = await serving(receiver)
    links = PeerLinks(heal_timeout_s=0.5)
    links.bind(KEY)
    await links.connect([address])
    first = links[address]
    await asyncio.wait_for(first.send(EPOCH, 0, 0, 0, b"job 1"), 10)
    second = JobKey("job-2", secrets.token_bytes(32))
    server.bind(second)
    # the old link's connection is gone; reconnecting with the old key is refused
    with pytest.raises(PeerLostError):
        await asyncio.wait_for(first.send(EPOCH, 0, 0, 1, b"stale"), 10)
    # the worker's links are rebound too: a new link, with the new key
    links.bind(second)
    await links.connect([address])
    assert links[address] is not first and links[address].key == second
    await asyncio.wait_for(links[address].send(("job-2", 0), 0, 0, 0, b"job 2"), 10)
    assert [f[4] for f in receiver.frames] == [b"job 1", b"job 2"]
    # and while no job is bound nobody gets in
    server.bind(None)
    reader, writer = await asyncio.open_connection(*address)
    with pytest.raises(asyncio.IncompleteReadError):
        await transport._prove_to_server(reader, writer, address, second, None)
    writer.close()
    links.close()
    await shutdown(server)


@pytest.mark.internal
async def test_a_message_of_the_job_before_is_not_sent_on_the_next_jobs_link():
    """A slow acknowledgment's timer of a job that ended fired while its process served
    the next job, and its message went out on the new job's link: the server closed
    the link as a protocol violation, losing the new job's acknowledgments in flight,
    whose roots were then replayed (CI: duplicates in a failure-free acks run). The
    link now refuses a message of another job than its own."""
    receiver = Receiver()
    server, address = await serving(receiver)
    link = PeerLink(address, key=KEY)
    await link.connect()
    stale = link.send(("job-before", 0), 1, 2, 0, b"late ack", resend=False)
    assert stale.cancelled()
    await asyncio.wait_for(link.send(EPOCH, 1, 2, 0, b"ours"), 10)
    assert [f[4] for f in receiver.frames] == [b"ours"]
    assert server.rejected_links == 0 and link.heals == 0
    await shutdown(server, link)


# -- bounded input -----------------------------------------------------------------------------


@pytest.mark.internal
async def test_oversize_lengths_close_the_link_before_the_payload_is_read():
    receiver = Receiver()
    server, address = await serving(receiver, limits=LinkLimits(max_payload_bytes=1 << 20))
    for lengths, reason in [(((1 << 32) - 1, 0), "oversize_header"),
                            ((70_000, 0), "oversize_header"),
                            ((20, (1 << 32) - 1), "oversize_payload"),
                            ((20, (1 << 20) + 1), "oversize_payload")]:
        reader, writer = await authenticated(address)
        writer.write(transport._LENGTHS.pack(*lengths))
        streamed = 0
        try:  # announced, then streamed into: the link is reset long before it ends
            for _ in range(256):
                writer.write(b"\0" * (1 << 20))
                await writer.drain()
                streamed += 1 << 20
        except OSError:
            pass
        assert streamed < 64 << 20, f"{streamed} bytes taken after announcing {lengths}"
        assert await closed_after_s(reader) < CLOSE_WITHIN_S
        writer.close()
        assert server.rejections[reason] >= 1
    assert server.rejected_links == 4 and receiver.frames == []
    await shutdown(server)


MALFORMED = [
    b"\xc1",                                     # never valid msgpack
    b"\x97\x00",                                 # an array cut short
    msgpack.packb([0, KEY.job_id, 0, 0, 0, 0]),  # six fields
    msgpack.packb({"job": KEY.job_id}),
    msgpack.packb([0, 7, 0, 0, 0, 0, 0]),        # the job id not a string
    msgpack.packb([-1, KEY.job_id, 0, 0, 0, 0, 0]),  # a negative message id
    msgpack.packb([0, KEY.job_id, "0", 0, 0, 0, 0]),
    msgpack.packb([0, KEY.job_id, 0, 0, 0, 1 << 63, 0]),  # beyond an i64
    msgpack.packb([0, KEY.job_id, 0, 0, True, 0, 0]),
    msgpack.packb([0, KEY.job_id, 0, 0, 0, 0, 0]) + b"\x00",  # trailing bytes
]


@pytest.mark.internal
async def test_malformed_headers_close_the_link_are_counted_and_logged_once_per_peer(caplog):
    receiver = Receiver()
    server, address = await serving(receiver)
    caplog.set_level(logging.WARNING, logger="bastion.runtime.transport")
    for header in MALFORMED:
        reader, writer = await authenticated(address)
        writer.write(frame(header, b"payload"))
        assert await closed_after_s(reader) < CLOSE_WITHIN_S
        writer.close()
    # a frame naming another job than the one its link proved
    reader, writer = await authenticated(address)
    writer.write(frame([0, "another-job", 0, 0, 0, 0, 0], b"payload"))
    assert await closed_after_s(reader) < CLOSE_WITHIN_S
    writer.close()
    assert server.rejections == {"malformed_header": len(MALFORMED), "wrong_job": 1}
    assert receiver.frames == []
    logged = [r for r in caplog.records if "closed a link from 127.0.0.1" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    # the server goes on: a good link still gets through
    link = PeerLink(address, key=KEY)
    await link.connect()
    await asyncio.wait_for(link.send(EPOCH, 0, 0, 0, b"fine"), 10)
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_truncated_frame_is_never_delivered():
    receiver = Receiver()
    server, address = await serving(receiver)
    whole = frame([0, KEY.job_id, 0, 0, 0, 0, 0], b"x" * 1000)
    reader, writer = await authenticated(address)
    writer.write(whole[:-500])
    writer.write_eof()
    assert await closed_after_s(reader) < CLOSE_WITHIN_S
    await asyncio.sleep(0.05)
    assert receiver.frames == []
    await shutdown(server)


@pytest.mark.internal
async def test_deliveries_in_flight_per_link_are_bounded_by_backpressure_not_drops():
    receiver = Receiver()
    receiver.held.clear()  # deliveries wait (a full inbox)
    server, address = await serving(receiver, limits=LinkLimits(max_deliveries=4))
    link = PeerLink(address, key=KEY)
    await link.connect()
    acks = [link.send(EPOCH, 0, c, 0, b"f" * 1000) for c in range(40)]
    await asyncio.sleep(0.3)
    assert receiver.waiting == 4  # the server stopped reading the link
    receiver.held.set()
    await asyncio.wait_for(asyncio.gather(*acks), 10)
    assert sorted(f[2] for f in receiver.frames) == list(range(40))  # none dropped
    assert server.rejected_links == 0
    await shutdown(server, link)


@pytest.mark.internal
async def test_a_frame_the_receiver_cannot_take_closes_its_link_not_the_process():
    async def deliver(*args) -> None:
        raise ValueError("garbage payload")

    server = FrameServer(deliver, authenticate=True)
    address = await server.start("127.0.0.1")
    server.bind(KEY)
    reader, writer = await authenticated(address)
    writer.write(frame([0, KEY.job_id, 0, 0, 0, 0, 0], b"?"))
    assert await closed_after_s(reader) < CLOSE_WITHIN_S
    assert server.rejections == {"undeliverable": 1}
    writer.close()
    await shutdown(server)


@pytest.mark.internal
async def test_a_sender_refuses_a_frame_larger_than_links_carry():
    server, address = await serving(Receiver(), limits=LinkLimits(max_payload_bytes=4096))
    link = PeerLink(address, key=KEY, limits=LinkLimits(max_payload_bytes=4096))
    await link.connect()
    with pytest.raises(FrameTooLargeError, match="frame_records"):
        link.send(EPOCH, 0, 0, 0, b"x" * 4097)
    await asyncio.wait_for(link.send(EPOCH, 0, 0, 0, b"x" * 4096), 10)
    await shutdown(server, link)


def test_a_job_config_derives_its_frame_limit_and_gets_a_fresh_key_from_its_master():
    config = JobConfig("j")
    assert config.frame_key is None and config.frame_bytes_limit == 64 << 20
    assert JobConfig("j", frame_records=1024).frame_bytes_limit == 16 << 20
    assert JobConfig("j", max_frame_bytes=1 << 30).frame_bytes_limit == 1 << 30
    keyed, again = with_frame_key(config), with_frame_key(config)
    assert len(keyed.frame_key) == 32 and keyed.frame_key != again.frame_key
    assert keyed.frame_key.hex() not in repr(keyed)
    limits = LinkLimits.of(keyed)
    assert (limits.max_payload_bytes, limits.max_deliveries) == (64 << 20, 1024)
    with pytest.raises(ValueError, match="at least 16 random bytes"):
        JobKey("j", None)


# -- TLS between hosts -------------------------------------------------------------------------


def _certificates(directory: Path, name: str) -> TlsSettings:
    """A CA and a certificate it signed, as PEM files (the `cryptography` package)."""
    x509 = pytest.importorskip("cryptography.x509",
                               reason="generating test certificates needs `cryptography`")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key, issuer: str, issuer_key, ca: bool):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca = certificate(f"{name} CA", ca_key, f"{name} CA", ca_key, ca=True)
    leaf = certificate(f"{name} worker", leaf_key, f"{name} CA", ca_key, ca=False)
    pem = serialization.Encoding.PEM
    paths = {part: directory / f"{name}-{part}.pem" for part in ("cert", "key", "ca")}
    paths["cert"].write_bytes(leaf.public_bytes(pem))
    paths["key"].write_bytes(leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths["ca"].write_bytes(ca.public_bytes(pem))
    return tls_from_env({"BASTION_TLS_CERT": str(paths["cert"]),
                         "BASTION_TLS_KEY": str(paths["key"]),
                         "BASTION_TLS_CA": str(paths["ca"]), "BASTION_TLS_SAME_HOST": "1"})


@pytest.mark.internal
async def test_tls_links_carry_frames_and_refuse_the_clear_and_foreign_certificates(tmp_path):
    tls = _certificates(tmp_path, "cluster")
    foreign = _certificates(tmp_path, "foreign")
    assert tls.same_host  # on 127.0.0.1 the link is within one host: TLS by request
    receiver = Receiver()
    server, address = await serving(receiver, tls=tls)
    link = PeerLink(address, key=KEY, tls=tls)
    await link.connect()
    await asyncio.wait_for(link.send(EPOCH, 0, 0, 0, b"secret"), 10)
    [connection] = server._connections
    assert connection.get_extra_info("ssl_object") is not None
    # a link in the clear, and one whose certificate another CA signed: refused
    for other in (None, foreign):
        refused = PeerLink(address, heal_timeout_s=0.5, key=KEY, tls=other)
        try:
            await refused.connect()
        except PeerLostError:
            continue
        with pytest.raises(PeerLostError):
            await asyncio.wait_for(refused.send(EPOCH, 0, 1, 0, b"clear"), 10)
    assert [f[4] for f in receiver.frames] == [b"secret"]
    # the link in the clear timed out at the server (the foreign one may have been
    # dropped by its own end first, on the server's certificate)
    assert server.rejections["handshake_timeout"] + server.rejections["tls"] >= 1
    # between hosts only, unless asked: a loopback pair is one host
    between_hosts = TlsSettings(tls.cert_path, tls.key_path, tls.ca_path)
    assert not between_hosts.wanted(("127.0.0.1", 1), ("127.0.0.1", 2))
    assert between_hosts.wanted(("10.0.0.1", 1), ("10.0.0.2", 2))
    await shutdown(server, link)


def test_tls_settings_from_the_environment_are_all_or_nothing(tmp_path):
    assert tls_from_env({}) is None
    with pytest.raises(ValueError, match="BASTION_TLS_KEY, BASTION_TLS_CA is not set"):
        tls_from_env({"BASTION_TLS_CERT": "/x.pem"})
    with pytest.raises(ValueError, match="cannot read"):
        tls_from_env({"BASTION_TLS_CERT": str(tmp_path / "none.pem"),
                      "BASTION_TLS_KEY": str(tmp_path / "none.pem"),
                      "BASTION_TLS_CA": str(tmp_path / "none.pem")})


# -- fuzzing the frame ports of a running job ----------------------------------------------

RECORDS = 24_000
RATE = 2_000   # records per second: the job runs about 12 s
RANDOM_STRINGS = 10_000
CONCURRENCY = 48


def fuzz_topology() -> bn.Topology:
    """Two sources and maps, one sink: ``double[1]`` sends to the sink's worker over a
    frame link, so the job needs its data plane all along."""
    topo = bn.Topology("frame-fuzz")
    nums = topo.source("nums", bn.sources.Generator(lambda i: i, count=RECORDS, rate=RATE),
                       parallelism=2)
    nums.map("double", lambda i: 2 * i + 1, parallelism=2).sink(
        "out", bn.sinks.Collect(), parallelism=1)
    return topo


def _job_workers(prefix: str, timeout_s: float = 60.0) -> list[dict]:
    """The workers the pool lent to the job whose id starts with ``prefix``, once each
    runs an attempt (read through Ray — as anyone with access to the cluster could)."""
    from bastion.scheduler.pool import POOL_NAME, POOL_NAMESPACE

    deadline = time.monotonic() + timeout_s
    views: list[dict] = []
    while time.monotonic() < deadline:
        try:
            pool = ray.get_actor(POOL_NAME, namespace=POOL_NAMESPACE)
        except ValueError:  # the job has not made it yet
            time.sleep(0.1)
            continue
        workers = ray.get(pool.__ray_call__.remote(lambda p: list(p._node_of)))
        # a lambda travels by value: the workers need not import this module
        views = ray.get([w.__ray_call__.remote(lambda w: {
            "pid": os.getpid(), "address": w.frames.address, "epoch": w.epoch,
            "job_id": None if w.config is None else w.config.job_id,
            "key": None if w.config is None else w.config.frame_key}) for w in workers])
        ours = [v for v in views if (v["job_id"] or "").startswith(prefix)
                and v["epoch"] is not None and v["address"] is not None]
        if len(ours) == 2:
            return ours
        time.sleep(0.1)
    raise AssertionError(f"no running job {prefix}*: {views}")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class RssSampler(threading.Thread):
    """The largest resident size of some processes, sampled every 50 ms."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {pid: _rss_bytes(pid) for pid in pids}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], _rss_bytes(pid))


async def _attack(address: tuple[str, int], data: bytes, key: JobKey | None = None, *,
                  handshake: bytes | None = None, stream_bytes: int = 0,
                  end: bool = False) -> float:
    """Connect, optionally hand-shake (with ``key``, or by replaying ``handshake`` to
    the fresh nonce), send ``data`` (then ``stream_bytes`` more, then EOF if ``end``),
    and time how long the server took to close the link after our last byte."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        if key is not None:
            started = time.monotonic()
            try:
                await transport._prove_to_server(reader, writer, address, key, None)
            except (asyncio.IncompleteReadError, ConnectionError):
                return time.monotonic() - started  # a wrong key: refused at once
        elif handshake is not None:
            await reader.readexactly(len(MAGIC) + 32)
            data = handshake + data
        try:
            writer.write(data)
            await writer.drain()
            while stream_bytes > 0:
                writer.write(b"\xff" * (1 << 20))
                await writer.drain()
                stream_bytes -= 1 << 20
            if end:
                writer.write_eof()
        except OSError:
            pass  # already reset: as good as closed
        return await closed_after_s(reader)
    finally:
        writer.transport.abort()


def _attacks(rng: random.Random, address: tuple[str, int], key: JobKey, sink_task: int,
             transcript: bytes) -> list:
    """Every bad link to make against one worker: (kind, coroutine factory)."""
    wrong_key = JobKey(key.job_id, secrets.token_bytes(32))
    good_header = [0, key.job_id, 0, sink_task, 0, 10**9, 0]
    attacks = []
    for _ in range(RANDOM_STRINGS // 4):  # per worker: half before any handshake, half after
        data = rng.randbytes(rng.randint(64, 400))
        attacks.append(("random", lambda d=data: _attack(address, d)))
        data = rng.randbytes(rng.randint(8, 400))
        attacks.append(("random_keyed", lambda d=data: _attack(address, d, key)))
    for lengths in [((1 << 32) - 1, (1 << 32) - 1), (1 << 20, 10), (64, (1 << 32) - 1),
                    (30, 1 << 30)] * 5:
        prefix = transport._LENGTHS.pack(*lengths)
        attacks.append(("oversize", lambda p=prefix: _attack(address, p, key,
                                                             stream_bytes=32 << 20)))
    whole = frame(good_header, b"\x00" * 2000)
    for cut in rng.sample(range(1, len(whole)), 100):
        attacks.append(("truncated", lambda c=cut: _attack(address, whole[:c], key, end=True)))
    for header in MALFORMED * 20:
        attacks.append(("malformed", lambda h=header: _attack(address, frame(h, b"p"), key)))
    for _ in range(100):
        attacks.append(("wrong_job", lambda: _attack(
            address, frame([0, "frame-fuzz-other", 0, sink_task, 0, 0, 0], b"p"), key)))
        attacks.append(("wrong_key", lambda: _attack(address, frame(good_header, b"p"),
                                                     wrong_key)))
        attacks.append(("replayed", lambda: _attack(address, frame(good_header, b"p"),
                                                    handshake=transcript)))
    for _ in range(20):
        attacks.append(("silent", lambda: _attack(address, b"")))
    rng.shuffle(attacks)
    return attacks


async def _transcript(address: tuple[str, int], key: JobKey) -> bytes:
    """A real handshake's answer, as an eavesdropper would record it off the wire."""
    reader, writer = await asyncio.open_connection(*address)
    sent = bytearray()
    write = writer.write
    writer.write = lambda data: (sent.extend(data), write(data))[1]
    await transport._prove_to_server(reader, writer, address, key, None)
    writer.write = write
    writer.close()
    return bytes(sent)


async def _fuzz(workers: list[dict], sink_task: int) -> dict[str, list[float]]:
    rng = random.Random(35)
    attacks = []
    for view in workers:
        address, key = tuple(view["address"]), JobKey(view["job_id"], view["key"])
        transcript = await _transcript(address, key)
        assert len(transcript) == 64
        attacks += _attacks(rng, address, key, sink_task, transcript)
    rng.shuffle(attacks)
    closed: dict[str, list[float]] = {}
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(kind: str, attack) -> None:
        async with slots:
            closed.setdefault(kind, []).append(await attack())

    await asyncio.gather(*(one(kind, attack) for kind, attack in attacks))
    return closed


@pytest.fixture(scope="module")
def fuzzed_job(ray_session, tmp_path_factory):
    storage = f"local://{tmp_path_factory.mktemp('fuzz')}"
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = bn.run(fuzz_topology(), protocol="none", storage=storage)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome["error"] = exc

    job = threading.Thread(target=run, daemon=True)
    job.start()
    workers = _job_workers("frame-fuzz-")
    time.sleep(1.0)  # past the start: the job's own memory has settled
    sampler = RssSampler([w["pid"] for w in workers])
    baseline = {w["pid"]: _rss_bytes(w["pid"]) for w in workers}
    sampler.start()
    from bastion.runtime.plan import build_plan
    sink_task = build_plan(fuzz_topology()).task_of("out", 0).task_id
    started = time.monotonic()
    closed = asyncio.run(_fuzz(workers, sink_task))
    fuzz_s = time.monotonic() - started
    still_running = job.is_alive()
    sampler.stopped.set()
    sampler.join()
    counters = {}
    from bastion.scheduler.pool import POOL_NAME, POOL_NAMESPACE
    pool = ray.get_actor(POOL_NAME, namespace=POOL_NAMESPACE)
    handles = ray.get(pool.__ray_call__.remote(lambda p: list(p._node_of)))
    for view in ray.get([h.__ray_call__.remote(
            lambda w: (os.getpid(), w.frames.rejected_links, dict(w.frames.rejections)))
            for h in handles]):
        counters[view[0]] = view[1:]
    job.join(timeout=120)
    assert not job.is_alive(), "the job did not end"
    return {"outcome": outcome, "closed": closed, "fuzz_s": fuzz_s,
            "still_running": still_running, "baseline": baseline, "peak": sampler.peak,
            "counters": {pid: counters[pid] for pid in baseline}}


@pytest.mark.internal
def test_the_fuzz_ran_against_a_running_job(fuzzed_job):
    closed = fuzzed_job["closed"]
    assert len(closed["random"]) + len(closed["random_keyed"]) == RANDOM_STRINGS
    assert fuzzed_job["still_running"], (
        f"the job ended before the fuzz did ({fuzzed_job['fuzz_s']:.1f} s)")


@pytest.mark.internal
def test_no_fuzzed_frame_is_accepted_the_output_is_exact(fuzzed_job):
    outcome = fuzzed_job["outcome"]
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert sorted(result.outputs["out"]) == sorted(2 * i + 1 for i in range(RECORDS))
    assert result.metrics.extra["attempts"] == 1  # no failure, no restart


@pytest.mark.internal
def test_every_bad_link_was_closed_by_the_server_within_2_s(fuzzed_job):
    slowest = {kind: max(times) for kind, times in fuzzed_job["closed"].items()}
    assert all(s < CLOSE_WITHIN_S for s in slowest.values()), slowest
    counted = sum(n for n, _ in fuzzed_job["counters"].values())
    # every link but the truncated ones (closed by their end) and those whose random
    # bytes stopped short of a whole length prefix broke the protocol, and was counted
    assert counted >= len(fuzzed_job["closed"]["random"]) + sum(
        len(fuzzed_job["closed"][k]) for k in ("oversize", "malformed", "wrong_job",
                                                "wrong_key", "replayed", "silent"))
    reasons = set()
    for _, by_reason in fuzzed_job["counters"].values():
        reasons |= set(by_reason)
    assert {"bad_proof", "handshake_timeout", "oversize_header", "oversize_payload",
            "malformed_header", "wrong_job"} <= reasons


@pytest.mark.internal
def test_the_workers_memory_grew_by_less_than_50_mib(fuzzed_job):
    grown = {pid: (fuzzed_job["peak"][pid] - fuzzed_job["baseline"][pid]) / 2**20
             for pid in fuzzed_job["baseline"]}
    assert all(mib < 50 for mib in grown.values()), grown
