"""A local run listens on loopback only.

`bastion.launcher.ensure_ray` starts a local Ray bound to 127.0.0.1, so that nothing
of a job — Ray's GCS and raylet, the driver's and every worker's gRPC server, the
agents — can be reached from the network. This test lists the listening TCP sockets
of every process of the test's Ray session (this process and all its descendants)
while a job runs, and fails on any address that is not loopback: ``0.0.0.0`` or
``::`` (every interface) included.

Sockets are found the way ``ss -tlnp`` finds them, from Linux's ``/proc``: the
kernel's table of TCP sockets (``/proc/net/tcp``, ``tcp6``) gives each listening
socket's address and inode, and ``/proc/<pid>/fd`` links name the socket inodes each
process holds. Self-checks prove the scan sees a socket that listens on every
interface, so a non-loopback listener cannot pass unnoticed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

import bastion as bn

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(),
                                reason="lists sockets through Linux's /proc")

_LISTEN = "0A"  # TCP_LISTEN in the kernel's socket tables


def is_loopback(address: str) -> bool:
    """Whether ``address`` can only be reached from this machine. A wildcard (0.0.0.0,
    ::) listens on every interface and is not; an IPv4 address mapped into IPv6
    counts as the IPv4 address it carries."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _decode(hex_address: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6}: hex words in host order (little-endian), ':',
    the port in hex."""
    host, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """Every listening TCP socket of this network namespace: inode -> (address, port)."""
    found = {}
    for table in ("tcp", "tcp6"):
        path = Path("/proc/self/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN:
                found[int(fields[9])] = _decode(fields[1])
    return found


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, []))
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes  # ended, or not ours to read
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def listeners_of(pids: set[int]) -> dict[tuple[str, int], str]:
    """The listening addresses the processes ``pids`` hold: (address, port) -> who."""
    table = listening_sockets()
    found = {}
    for pid in pids:
        for inode in socket_inodes(pid) & table.keys():
            found[table[inode]] = f"{process_name(pid)} (pid {pid})"
    return found


# -- self-checks: the classification and the scan can fail ----------------------------

@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.0.0.53", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("10.0.0.7", False),
    ("::ffff:192.168.1.20", False), ("fe80::1", False),
])
def test_addresses_are_classified(address, loopback):
    assert is_loopback(address) is loopback


@pytest.mark.parametrize("hex_address, address, port", [
    ("0100007F:1F90", "127.0.0.1", 8080),
    ("00000000:0016", "0.0.0.0", 22),
    ("1401A8C0:0050", "192.168.1.20", 80),
    ("0000000000000000FFFF00000100007F:8369", "::ffff:127.0.0.1", 0x8369),
    ("00000000000000000000000001000000:0050", "::1", 80),
])
def test_proc_addresses_are_decoded(hex_address, address, port):
    decoded, decoded_port = _decode(hex_address)
    assert ipaddress.ip_address(decoded) == ipaddress.ip_address(address)
    assert decoded_port == port


@pytest.mark.parametrize("family, wildcard", [(socket.AF_INET, "0.0.0.0"),
                                              (socket.AF_INET6, "::")])
def test_the_scan_finds_a_listener_on_every_interface(family, wildcard):
    try:
        server = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        pytest.skip(f"no {family.name} on this machine")
    with server:
        server.bind((wildcard, 0))
        server.listen()
        port = server.getsockname()[1]
        found = listeners_of(descendants(os.getpid()))
    assert (wildcard, port) in found
    assert not is_loopback(wildcard)


# -- the check -----------------------------------------------------------------------

def test_every_socket_of_a_local_run_listens_on_loopback(ray_session):
    seen: dict[tuple[str, int], str] = {}

    def sample(progress: dict) -> None:
        # while the job runs, so that its worker actors' servers are up and listed
        seen.update(listeners_of(descendants(os.getpid())))

    topo = bn.Topology("loopback")
    # rate-limited to last a few progress calls: the job's workers are sampled alive
    src = topo.source("src", bn.sources.Generator(lambda i: i, count=3000, rate=1000),
                      parallelism=2)
    src.key_by(lambda i: i % 10).reduce("count", lambda acc, _: acc + 1, initial=0,
                                        parallelism=2).sink("out", bn.sinks.Collect())
    result = bn.run(topo, progress=sample)
    seen.update(listeners_of(descendants(os.getpid())))

    assert len(result.outputs["out"]) == 3000
    names = {who.split(" ")[0] for who in seen.values()}
    # The scan saw the session: the GCS, the raylet and the job's worker processes.
    assert {"gcs_server", "raylet", "ray::Worker"} <= names, names
    exposed = {f"{address}:{port}": who for (address, port), who in seen.items()
               if not is_loopback(address)}
    assert exposed == {}, f"listening beyond loopback: {exposed}"
