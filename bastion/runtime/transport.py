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

**Who may send (docs/security.md).** The port listens on the node's address, where
other users of a shared cluster can reach it, so a worker's server only takes frames
from links that prove they know the key of the job it is bound to — a fresh random
key per job (`bastion.runtime.config.with_frame_key`), made by the job master and
carried to the workers inside their `JobConfig`, through Ray's authenticated control
plane only. On connect the server sends a fresh nonce; the link answers with its own
nonce and ``HMAC-SHA256(key, context)``; the server answers with an HMAC of its own
(a different role in the context), so the link trusts acknowledgments only from a
server that knows the key too. The context names the job, the server's advertised
address and both nonces: an answer recorded on one connection is worthless on the
next (the server's nonce is new), and a rogue process that took a dead worker's port
cannot relay a link to another worker of the same job (the address differs). A link
that has not proved the key within ``HANDSHAKE_TIMEOUT_S`` is closed, and so is one
whose proof is wrong — silently, to give a guesser nothing. After the handshake every
frame must name the link's job; one naming another is a protocol violation. A server
rebound to another job closes the links of the job before, and a worker's links are
replaced when its job changes: a link never outlives the key it proved.

**Every length read from the wire is bounded before anything is buffered.** A header
longer than ``LinkLimits.max_header_bytes`` (64 KiB; a header is a few dozen bytes) or
a payload longer than ``LinkLimits.max_payload_bytes`` (derived from the job's
``frame_records``: `JobConfig.frame_bytes_limit`) closes the link as soon as its
8-byte length prefix is read; so does a header that is not the msgpack array below.
Each such link is counted (`FrameServer.rejected_links`, by reason in
`FrameServer.rejections`) and logged once per peer host. A sender refuses to send a
frame over the limit (`FrameTooLargeError`), so a job with big records fails with an
error that names the knob instead of having its links closed. At most
``LinkLimits.max_deliveries`` frames of one link are being delivered at once: then the
server stops reading that link until one is done (TCP backpressure onto its sender,
not a drop). A bad link never takes the process or the job with it: its connection is
closed and the others carry on.

**TLS between hosts** (optional, the model is Flink's ``security.ssl.internal.*``):
with ``BASTION_TLS_CERT``, ``BASTION_TLS_KEY`` and ``BASTION_TLS_CA`` set in the
workers' environment (`tls_from_env`), a link between two hosts runs in mutual TLS —
both ends present a certificate signed by the CA, as with Flink's shared internal
keystore (hostnames are not checked: the job key and the address in the handshake
say which worker is at the other end). A link within one host stays in the clear
unless ``BASTION_TLS_SAME_HOST=1``: it never leaves the machine. The HMAC handshake
runs inside TLS.

Wire format, little-endian. A worker's server first sends ``MAGIC``; then, between
hosts with TLS on, both ends start TLS; then the server sends a 32-byte nonce, the
link answers ``its 32-byte nonce, its 32-byte HMAC`` and the server answers its own
32-byte HMAC (`_proof`). From then on ``u32 header length, u32 payload length, header,
payload`` from sender to receiver, the header a msgpack array ``[message id, job id,
attempt, task id, channel id, seq, incarnation]`` (the incarnation of the destination
task: a task restarted on its own, in a regional restart, drops frames meant for the
incarnation before it); ``u64 message id`` from receiver to sender. (A `FrameServer`
made with ``authenticate=False`` and no TLS — tests and benchmarks of the transport
alone — skips straight to the frames.)
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import ssl
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

import msgpack

from bastion.errors import BastionError, PeerLostError

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


# -- authentication and bounds (see the module docstring) ----------------------------------

# What a worker's server sends first: the protocol and its version. A link that reads
# anything else is not talking to a Bastion worker (`LinkAuthError`).
MAGIC = b"BSTN\x01"
_NONCE_BYTES = 32
_MAC_BYTES = 32   # HMAC-SHA256
# A link proves the key within this long after its connection is accepted, or is
# closed: a handshake takes a round trip and two HMACs (about a millisecond, TLS a
# few); the bound the issue sets is 2 s, this leaves a margin for a busy event loop.
HANDSHAKE_TIMEOUT_S = 1.5
# A frame header is a msgpack array of six ints and a job id (a few dozen bytes).
MAX_HEADER_BYTES = 64 * 1024
_HEADER_FIELDS = 7
_U64 = 1 << 64
_I64 = 1 << 63
# Peer hosts a server has logged a rejected link of: each is logged once. Bounded, so
# a scan from many addresses cannot grow it without end (later ones are only counted).
_LOGGED_PEERS_MAX = 1024

logger = logging.getLogger(__name__)


class FrameTooLargeError(BastionError, ValueError):
    """A frame larger than the job's links carry (`JobConfig.frame_bytes_limit`)."""


class LinkAuthError(BastionError):
    """The worker at a link's address could not prove it knows the job's key."""


class _Violation(Exception):
    """A link broke the protocol: its server closes it (``reason`` is counted, and
    ``detail`` logged once per peer host)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class JobKey:
    """The data-plane key of one job: links of the job prove they know ``secret``."""
    job_id: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            raise ValueError(f"the data-plane key of job {self.job_id!r} must be at least "
                             "16 random bytes (a JobConfig gets one from its job master: "
                             "bastion.runtime.config.with_frame_key)")


@dataclass(frozen=True)
class LinkLimits:
    """What one link may make its server hold: header and payload bytes of a frame, and
    frames being delivered at once (beyond that the server stops reading it)."""
    max_header_bytes: int = MAX_HEADER_BYTES
    max_payload_bytes: int = 64 * 1024 * 1024
    max_deliveries: int = 1024

    @classmethod
    def of(cls, config: Any) -> "LinkLimits":
        """The limits of a job's links, from its `JobConfig`."""
        return cls(max_payload_bytes=config.frame_bytes_limit,
                   max_deliveries=config.link_inflight_frames)


@dataclass(frozen=True)
class TlsSettings:
    """Mutual TLS for links between hosts: PEM files of this process's certificate, its
    private key and the CA that signed every worker's certificate. ``same_host``: links
    within one host too (tests; otherwise they never leave the machine)."""
    cert_path: str
    key_path: str
    ca_path: str
    same_host: bool = False

    def wanted(self, local: Any, peer: Any) -> bool:
        """Whether a connection between socket names ``local`` and ``peer`` runs in TLS:
        both ends see the same pair of hosts, so they agree."""
        return self.same_host or local[0] != peer[0]

    def context(self, server_side: bool) -> ssl.SSLContext:
        purpose = ssl.Purpose.CLIENT_AUTH if server_side else ssl.Purpose.SERVER_AUTH
        context = ssl.create_default_context(purpose, cafile=self.ca_path)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_path, self.key_path)
        # Both ends present a certificate of the cluster's CA (Flink's internal SSL).
        # Hostnames are not checked: a worker's address is an IP, and which worker is
        # at the other end is proven by the job key and its address in the handshake.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        return context


TLS_ENV = ("BASTION_TLS_CERT", "BASTION_TLS_KEY", "BASTION_TLS_CA")


def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsSettings | None:
    """TLS settings from ``BASTION_TLS_CERT``, ``BASTION_TLS_KEY``, ``BASTION_TLS_CA``
    (paths of PEM files) and ``BASTION_TLS_SAME_HOST`` (``1``: links within one host
    too); None when none of the three paths is set. Half a setting is an error, not a
    silent fall back to the clear."""
    environ = os.environ if environ is None else environ
    paths = {name: environ.get(name, "") for name in TLS_ENV}
    if not any(paths.values()):
        return None
    missing = [name for name, path in paths.items() if not path]
    if missing:
        raise ValueError(f"TLS for frame links needs {', '.join(TLS_ENV)}; "
                         f"{', '.join(missing)} is not set")
    unreadable = [f"{name}={path}" for name, path in paths.items()
                  if not os.access(path, os.R_OK)]
    if unreadable:
        raise ValueError(f"TLS for frame links: cannot read {', '.join(unreadable)}")
    cert_path, key_path, ca_path = (paths[name] for name in TLS_ENV)
    settings = TlsSettings(cert_path, key_path, ca_path,
                           same_host=environ.get("BASTION_TLS_SAME_HOST", "") == "1")
    settings.context(server_side=True)  # a bad file fails here, naming itself
    return settings


def _proof(key: JobKey, role: bytes, server: tuple[str, int], server_nonce: bytes,
           link_nonce: bytes) -> bytes:
    """HMAC-SHA256 under the job's key of everything the handshake binds: who proves
    (link or server, so one's proof is never the other's), the job, the server's
    advertised address and both nonces (msgpack: an unambiguous encoding)."""
    context = msgpack.packb([role, key.job_id, server[0], server[1], server_nonce,
                             link_nonce])
    return hmac.new(key.secret, context, hashlib.sha256).digest()


async def _start_tls(writer: asyncio.StreamWriter, tls: TlsSettings | None,
                     server_side: bool) -> None:
    if tls is not None and tls.wanted(writer.get_extra_info("sockname"),
                                      writer.get_extra_info("peername")):
        await writer.start_tls(tls.context(server_side))


async def _prove_to_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           address: tuple[str, int], key: JobKey | None,
                           tls: TlsSettings | None) -> None:
    """A link's side of the handshake. `LinkAuthError`: the server is not a worker of
    this job; a connection error or timeout: it broke (or the server refused us)."""
    magic = await reader.readexactly(len(MAGIC))
    if magic != MAGIC:
        raise LinkAuthError(f"{_name(address)} is not a Bastion frame port")
    await _start_tls(writer, tls, server_side=False)
    if key is None:
        return
    server_nonce = await reader.readexactly(_NONCE_BYTES)
    link_nonce = secrets.token_bytes(_NONCE_BYTES)
    writer.write(link_nonce + _proof(key, b"link", address, server_nonce, link_nonce))
    answer = await reader.readexactly(_MAC_BYTES)
    if not hmac.compare_digest(answer, _proof(key, b"server", address, server_nonce,
                                              link_nonce)):
        raise LinkAuthError(f"the worker at {_name(address)} could not prove it knows "
                            f"the key of job {key.job_id!r}")


def _header(data: bytes) -> tuple[int, str, int, int, int, int, int]:
    """A frame header, checked field by field (it comes from the wire)."""
    try:
        header = msgpack.unpackb(data)
    except Exception as exc:  # msgpack raises many types; all mean the same here
        raise _Violation("malformed_header",
                         f"a frame header is not msgpack ({type(exc).__name__})") from None
    if not isinstance(header, list) or len(header) != _HEADER_FIELDS:
        raise _Violation("malformed_header", f"a frame header is not an array of "
                         f"{_HEADER_FIELDS} fields: {type(header).__name__}")
    message_id, job_id, *numbers = header
    if type(message_id) is not int or not 0 <= message_id < _U64:
        raise _Violation("malformed_header", "a frame's message id is not a u64")
    if type(job_id) is not str:
        raise _Violation("malformed_header", "a frame's job id is not a string")
    if not all(type(n) is int and -_I64 <= n < _I64 for n in numbers):
        raise _Violation("malformed_header",
                         "a frame's attempt, task, channel, seq or incarnation is not an i64")
    return (message_id, job_id, *numbers)


class FrameServer:
    """Accepts links from peer workers and hands their frames to ``deliver``.

    ``authenticate``: links must prove the key of the job the server is bound to
    (`bind`; a worker's server always does — until its first job, and between jobs
    with no key, it refuses every link). False only for tests and benchmarks of the
    transport itself. ``tls``: TLS between hosts (`tls_from_env`)."""

    def __init__(self, deliver: Deliver, *, authenticate: bool = False,
                 tls: TlsSettings | None = None, limits: LinkLimits | None = None):
        self._deliver = deliver
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None
        self._pending: set[asyncio.Task] = set()
        self.authenticate = authenticate
        self.tls = tls
        self.limits = limits or LinkLimits()
        self._key: JobKey | None = None
        # open connections -> the key they proved (None: not yet, or no
        # authentication), so a rebind can close those of the job before
        self._connections: dict[asyncio.StreamWriter, JobKey | None] = {}
        self.rejected_links = 0             # links closed for breaking the protocol
        self.rejections: Counter[str] = Counter()   # ... by reason
        self._logged_peers: set[str] = set()

    async def start(self, host: str) -> tuple[str, int]:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0)
            self.address = (host, self._server.sockets[0].getsockname()[1])
        address = self.address
        assert address is not None  # set with ``_server``, here or in an earlier call
        return address

    def bind(self, key: JobKey | None, limits: LinkLimits | None = None) -> None:
        """Serve the job of ``key`` from now on (None: no job; every link is refused):
        the links that proved another key are closed."""
        self.limits = limits or LinkLimits()
        if key == self._key:
            return  # the same job bound again (a standby taking a slot): links stay
        self._key = key
        for writer, proved in list(self._connections.items()):
            if proved is not None:
                writer.transport.abort()

    @property
    def secured(self) -> bool:
        """Whether links handshake at all (`MAGIC` first)."""
        return self.authenticate or self.tls is not None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections[writer] = None
        peer = writer.get_extra_info("peername")
        try:
            key = None
            if self.secured:
                try:
                    async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                        key = await self._handshake(reader, writer)
                except TimeoutError:
                    raise _Violation("handshake_timeout", "no valid handshake within "
                                     f"{HANDSHAKE_TIMEOUT_S:g} s") from None
                self._connections[writer] = key
            await self._read_frames(reader, writer, key)
        except _Violation as violation:
            self._reject(peer, violation)
            writer.transport.abort()  # at once: nothing of ours is worth flushing to it
        except (asyncio.IncompleteReadError, OSError):
            pass  # the sending process ended, closed the link or lost the connection
        finally:
            del self._connections[writer]
            # Closed here, so the deliveries still running on this connection's frames
            # see it closing and do not acknowledge into it (their sender resends them
            # on its next connection, and gets their acknowledgments there).
            writer.close()

    async def _handshake(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> JobKey | None:
        """The server's side: the key the link proved (None without authentication)."""
        writer.write(MAGIC)
        try:
            await _start_tls(writer, self.tls, server_side=True)
        except ssl.SSLError as exc:
            raise _Violation("tls", f"TLS handshake failed: {exc.reason}") from None
        if not self.authenticate:
            return None
        server_nonce = secrets.token_bytes(_NONCE_BYTES)
        writer.write(server_nonce)
        answer = await reader.readexactly(_NONCE_BYTES + _MAC_BYTES)
        link_nonce, proof = answer[:_NONCE_BYTES], answer[_NONCE_BYTES:]
        key = self._key
        if key is None:
            raise _Violation("no_job", "a link connected while no job is bound here")
        address = self.address
        assert address is not None  # links reach us only once `start` bound the server
        if not hmac.compare_digest(proof, _proof(key, b"link", address, server_nonce,
                                                 link_nonce)):
            raise _Violation("bad_proof", f"a link failed to prove the key of job "
                             f"{key.job_id!r} (a wrong key, another job's, or a replay)")
        writer.write(_proof(key, b"server", address, server_nonce, link_nonce))
        return key

    async def _read_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           key: JobKey | None) -> None:
        limits = self.limits
        # Backpressure, not drops: at most this many of the link's frames are being
        # delivered at once; while they are, the link is not read, and TCP holds its
        # sender back.
        slots = asyncio.Semaphore(limits.max_deliveries)
        while True:
            await slots.acquire()
            header_len, payload_len = _LENGTHS.unpack(await reader.readexactly(8))
            # Bounded before anything is buffered: the limits of the job bound now.
            limits = self.limits
            if header_len > limits.max_header_bytes:
                raise _Violation("oversize_header", f"a frame header of {header_len} bytes "
                                 f"(at most {limits.max_header_bytes})")
            if payload_len > limits.max_payload_bytes:
                raise _Violation("oversize_payload", f"a frame payload of {payload_len} "
                                 f"bytes (at most {limits.max_payload_bytes})")
            message_id, job_id, attempt, task_id, channel_id, seq, incarnation = \
                _header(await reader.readexactly(header_len))
            if key is not None:
                if key is not self._key:
                    return  # the server serves another job now: the link is over
                if job_id != key.job_id:
                    raise _Violation("wrong_job", f"a link of job {key.job_id!r} sent a "
                                     f"frame of job {job_id!r}")
            payload = await reader.readexactly(payload_len)
            # Delivered concurrently, like Ray calls: a frame waiting for its turn
            # or for room in one inbox must not hold up the link's other channels.
            # Only a message read whole gets here: one the connection tore in the
            # middle (`IncompleteReadError` below) is never delivered — its sender
            # resends it whole on the connection it reconnects.
            delivery = asyncio.ensure_future(self._deliver_and_ack(
                writer, slots, message_id, (job_id, attempt), task_id, channel_id, seq,
                payload, incarnation))
            self._pending.add(delivery)
            delivery.add_done_callback(self._pending.discard)

    async def _deliver_and_ack(self, writer: asyncio.StreamWriter, slots: asyncio.Semaphore,
                               message_id: int, epoch: tuple[str, int], task_id: int,
                               channel_id: int, seq: int, payload: bytes,
                               incarnation: int) -> None:
        try:
            await self._deliver(epoch, task_id, channel_id, seq, payload, incarnation)
        except asyncio.CancelledError:
            # The receiving task was reset (`InputGate.close`): the frame is dropped,
            # and acknowledged all the same — its sender may keep running (a regional
            # restart) and must get its credit back.
            pass
        except Exception as exc:
            # A frame the receiver could not take (its payload does not decode): the
            # link is closed, never the process — the job's failure handling decides
            # what the lost frame means.
            self._reject(writer.get_extra_info("peername"),
                         _Violation("undeliverable", f"a frame for task {task_id} "
                                    f"could not be delivered: {exc!r}"))
            writer.transport.abort()
            return
        finally:
            slots.release()
        if not writer.is_closing():
            try:
                writer.write(_ACK.pack(message_id))
            except (OSError, RuntimeError):
                pass  # the connection died meanwhile: the sender resends, and that copy
                # is acknowledged on the new connection

    def _reject(self, peer: Any, violation: _Violation) -> None:
        self.rejected_links += 1
        self.rejections[violation.reason] += 1
        host = str(peer[0]) if peer else "?"
        if violation.reason == "no_job":
            # Expected as a job ends: its peers' links heal towards a worker already
            # released. Counted; a warning would reach the user's terminal.
            logger.debug("frame port %s closed a link from %s: %s",
                         _name(self.address) if self.address else "?", host, violation)
            return
        if host not in self._logged_peers and len(self._logged_peers) < _LOGGED_PEERS_MAX:
            self._logged_peers.add(host)
            logger.warning("frame port %s closed a link from %s: %s (further links from "
                           "this host are closed and counted, not logged)",
                           _name(self.address) if self.address else "?", host, violation)


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
    ``heal_timeout_s`` the link reconnects and resends what was not acknowledged.

    ``key``: every connection first proves the job's key, and the server proves it
    back (None: a server with ``authenticate=False``). ``tls``: as its server's.
    ``limits``: the frames it may send (its server's limits, from the same config)."""

    def __init__(self, address: tuple[str, int], heal_timeout_s: float = HEAL_TIMEOUT_S, *,
                 key: JobKey | None = None, tls: TlsSettings | None = None,
                 limits: LinkLimits | None = None):
        if heal_timeout_s <= 0:
            raise ValueError(f"heal_timeout_s must be > 0, got {heal_timeout_s!r}")
        self.address = address
        self.heal_timeout_s = heal_timeout_s
        self.key = key
        self.tls = tls
        self.limits = limits or LinkLimits()
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
        reader: asyncio.StreamReader | None
        try:
            reader, writer = await asyncio.open_connection(*self.address)
        except OSError as exc:
            raise PeerLostError(f"cannot reach the worker at {_name(self.address)}: "
                                f"{exc}") from None
        try:
            await self._secure(reader, writer, HANDSHAKE_TIMEOUT_S)
        except LinkAuthError as exc:
            writer.transport.abort()
            raise PeerLostError(str(exc)) from None
        except (asyncio.IncompleteReadError, OSError, TimeoutError):
            # Accepted, then dropped (or refused our proof, which looks the same to
            # us: a server gives a guesser nothing): the link heals as from any
            # broken connection, and breaks if that goes on for ``heal_timeout_s``.
            writer.transport.abort()
            reader = None
        else:
            self._writer = writer
        self._connected_at = asyncio.get_running_loop().time()
        self._runner = asyncio.ensure_future(self._run(reader))

    async def _secure(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      timeout_s: float) -> None:
        """The handshake on a new connection (nothing to do with no key and no TLS)."""
        if self.key is None and self.tls is None:
            return
        async with asyncio.timeout(timeout_s):
            await _prove_to_server(reader, writer, self.address, self.key, self.tls)

    def send(self, epoch: tuple[str, int], task_id: int, channel_id: int, seq: int,
             payload: bytes, incarnation: int = 0, *, resend: bool = True,
             tear: bool = False) -> asyncio.Future:
        """Send a message; its future completes with its acknowledgment. ``resend``:
        send it again if the connection breaks before it is acknowledged (False for
        messages a duplicate would harm, which the caller makes up for otherwise: its
        future is then cancelled, its fate unknown). A message of a job other than the
        one whose key the link proved is not sent: its future is cancelled. ``tear``:
        an injected fault — write part of the message, then abort the connection, as a
        network that cuts it mid-frame (the link heals and resends it)."""
        if len(payload) > self.limits.max_payload_bytes:
            raise FrameTooLargeError(
                f"a frame of {len(payload)} bytes for task {task_id} exceeds the "
                f"{self.limits.max_payload_bytes} bytes a link carries: records this "
                "large need fewer per frame (frame_records) or a larger "
                "JobConfig.max_frame_bytes")
        ack = asyncio.get_running_loop().create_future()
        if self.broken is not None:
            _fail(ack, self.broken)
            return ack
        if self.key is not None and epoch[0] != self.key.job_id:
            # Code of a job this process served before, still scheduled (a timer):
            # the server would close the link as a protocol violation, and with it
            # lose what the link's own job has in flight that is never resent
            # (acknowledgment messages). Not sent: its job is over.
            ack.cancel()
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

    async def _run(self, reader: asyncio.StreamReader | None) -> None:
        """Read acknowledgments; when the connection breaks, heal it and go on (None:
        the first connection broke in its handshake)."""
        if reader is None:
            reader = await self._heal("its handshake broke")
            if reader is None:
                return
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
            writer = None
            try:
                async with asyncio.timeout(remaining):
                    reader, writer = await asyncio.open_connection(*self.address)
                await self._secure(reader, writer, max(0.001, deadline - loop.time()))
                break
            except ConnectionRefusedError:
                # Its server lives as long as its process: nobody listening means the
                # process is gone, and waiting would only delay the recovery.
                self._break(f"{lost} and its worker refuses connections: it is gone")
                return None
            except LinkAuthError as exc:
                assert writer is not None  # only `_secure` raises it, once connected
                writer.transport.abort()
                self._break(f"{lost}, and on reconnecting: {exc}")
                return None
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                if writer is not None:
                    writer.transport.abort()
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
    the next `connect`, and every one when the process is bound to another job (`bind`):
    a link never carries frames under a key other than the one it proved."""

    def __init__(self, heal_timeout_s: float = HEAL_TIMEOUT_S, *,
                 tls: TlsSettings | None = None) -> None:
        self._links: dict[tuple[str, int], PeerLink] = {}
        self.heal_timeout_s = heal_timeout_s
        self.tls = tls
        self.key: JobKey | None = None
        self.limits = LinkLimits()

    def bind(self, key: JobKey | None, limits: LinkLimits | None = None) -> None:
        """Links from now on prove ``key`` and send within ``limits``; the links of the
        job before are closed (their next `connect` makes new ones)."""
        self.limits = limits or LinkLimits()
        if key != self.key:
            self.close()
            self.key = key

    async def connect(self, addresses: list[tuple[str, int]]) -> None:
        """Links to exactly ``addresses``: a link to another peer (of an earlier job,
        or a peer since replaced) is closed."""
        wanted = set(addresses)
        for address in [a for a in self._links if a not in wanted]:
            self._links.pop(address).close()
        for address in dict.fromkeys(addresses):
            link = self._links.get(address)
            if link is not None and link.broken is None and link.key is self.key:
                continue
            if link is not None:
                link.close()
            link = PeerLink(address, self.heal_timeout_s, key=self.key, tls=self.tls,
                            limits=self.limits)
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
    # A copy for each message: an exception raised takes the frames it passes
    # through, and the link's own, kept while the link is, would keep the task that
    # awaited it (every object of a task the restart dropped) alive with it.
    ack.set_exception(PeerLostError(*error.args))
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
