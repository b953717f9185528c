"""A real Ray cluster on one machine: a head and workers, each its own `ray start`.

`ray.cluster_utils.Cluster` (tests/two_node_drill.py) simulates nodes inside one
driver's session; a real deployment starts every node with its own ``ray start``
command, and the driver (``bastion run --address``) joins from outside. This helper
does the latter on 127.0.0.1, the way the README tells a person to, so that a test can
check that what the README says works:

- every node is a ``ray start --block`` process, the leader of its own process
  group, with ``--node-ip-address=127.0.0.1`` (every socket on loopback), a private ``--temp-dir`` (Ray's sessions, sockets and
  logs of this cluster only) and ports of its own: the head's GCS port, each node's
  manager, agent and metrics export ports are picked free, so this cluster never
  meets another Ray running on the machine (the test session's own);
- an S3 server (moto's ``moto_server``) on a free loopback port;
- credentials only in the environment of the processes (``AWS_ACCESS_KEY_ID`` ...,
  and Ray's ``RAY_AUTH_TOKEN``, a token of this cluster's own), never on a command
  line.

Teardown kills only what it started: the process groups of its ``ray start``
processes and of moto, and any process still left whose command line names this
cluster's temp dir (a Ray worker that left its group). Never ``ray stop``, which
kills every Ray of the machine's user.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalCluster:
    """``workers`` worker nodes besides the head, ``cpus`` CPUs each."""

    workers: int = 2
    cpus: int = 1
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="bnlc-",
                                                                   dir="/tmp"))
    gcs_port: int = field(default_factory=free_port)
    s3_port: int = field(default_factory=free_port)
    metrics_ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    # Ray's token authentication, with a token of this cluster's own (in the
    # environment, not in ~/.ray/auth_token, which other Rays on the machine read)
    token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"127.0.0.1:{self.s3_port}"

    def storage(self, bucket: str, prefix: str) -> str:
        return f"s3://{bucket}/{prefix}?endpoint={self.s3_endpoint}&secure=false"

    def env(self, joining: bool = False) -> dict[str, str]:
        """The environment of every process of the cluster and of its drivers
        (``joining``: of a worker node's ``ray start``, which refuses to join a
        cluster under ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; its
        ``--node-ip-address=127.0.0.1`` keeps it on loopback all the same)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "AWS_", "BASTION_S3_"))}
        env.update(CREDENTIALS, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                   RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                   RAY_AUTH_TOKEN=self.token,
                   # workers push their metrics to the node's agent every second
                   # (default 10 s), so a short job's series show up while it runs
                   RAY_metrics_report_interval_ms="1000",
                   # as bastion.launcher.ensure_ray does for a local Ray: Ray's agents
                   # probe cloud metadata services over HTTP at start-up; a proxy on a
                   # closed loopback port keeps that on the machine
                   http_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
                   no_proxy="127.0.0.1,localhost,::1", NO_PROXY="127.0.0.1,localhost,::1")
        if joining:
            del env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
        return env

    def _spawn(self, argv: list[str], log: str, joining: bool = False) -> subprocess.Popen:
        out = open(Path(self.temp_dir) / log, "wb")
        proc = subprocess.Popen(argv, env=self.env(joining), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _node(self, head: bool, n: int) -> None:
        metrics_port = free_port()
        self.metrics_ports.append(metrics_port)
        # a joining node: Ray's `ray start`, loopback kept (see that script)
        start = ([str(BIN / "ray"), "start"] if head
                 else [sys.executable, str(REPO / "deploy" / "ray_start_loopback.py")])
        argv = start + ["--block", "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.cpus}", f"--temp-dir={self.temp_dir}",
                f"--metrics-export-port={metrics_port}",
                f"--node-manager-port={free_port()}",
                f"--object-manager-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}",
                "--object-store-memory=100000000", "--disable-usage-stats"]
        if head:
            argv += ["--head", f"--port={self.gcs_port}", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port()}"]
        else:
            argv += [f"--address={self.address}"]
        self._spawn(argv, f"node-{n}.log", joining=not head)

    def start(self, timeout_s: float = 120.0) -> "LocalCluster":
        try:
            self._spawn([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p",
                         str(self.s3_port)], "moto.log")
            self._node(True, 0)
            self._wait(lambda: self.nodes() >= 1, timeout_s, "the head node")
            # One at a time: nodes sharing a temp dir pick their socket and log
            # names by looking at what exists, and two joining at once collide.
            for n in range(1, self.workers + 1):
                self._node(False, n)
                self._wait(lambda: self.nodes() == n + 1, timeout_s, f"worker node {n}")
            self._wait(self._s3_up, timeout_s, "the S3 server")
        except BaseException:
            self.stop()
            raise
        return self

    def nodes(self) -> int:
        """Live nodes, as the GCS counts them (asked from a subprocess: this process
        may be a driver of another Ray)."""
        code = ("import ray; ray.init(address=%r, logging_level='ERROR'); "
                "print(sum(n['Alive'] for n in ray.nodes()))" % self.address)
        done = subprocess.run([sys.executable, "-c", code], env=self.env(),
                              capture_output=True, text=True, timeout=60)
        try:
            return int(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def _s3_up(self) -> bool:
        try:
            urllib.request.urlopen(f"http://{self.s3_endpoint}/", timeout=2).read()
            return True
        except OSError:
            return False

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[:3]} exited ({proc.returncode}) "
                                       f"while waiting for {what}; logs in {self.temp_dir}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up after {timeout_s:.0f} s; logs in "
                                   f"{self.temp_dir}")
            time.sleep(0.5)

    def metrics_text(self) -> str:
        """What every node's metrics endpoint serves now (Prometheus text format)."""
        texts = []
        for port in self.metrics_ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as answer:
                    texts.append(answer.read().decode())
            except OSError:
                continue
        return "\n".join(texts)

    def pids(self) -> set[int]:
        """Every live process this cluster started: its process groups, their
        descendants, and whatever names its temp dir (read from /proc)."""
        table = _processes()
        groups = {p.pid for p in self.procs}
        found = {pid for pid, (ppid, pgid, cmdline, state) in table.items()
                 if state != "Z" and (pgid in groups or self.temp_dir in cmdline)}
        grew = True
        while grew:  # descendants of what was found
            more = {pid for pid, (ppid, _, _, state) in table.items()
                    if ppid in found and pid not in found and state != "Z"}
            found |= more
            grew = bool(more)
        found.discard(os.getpid())
        return found

    def stop(self) -> None:
        """Kill what this cluster started — SIGTERM, then SIGKILL what is left — and
        delete its temp dir."""
        for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self.pids() & pids:
                time.sleep(0.2)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if os.environ.get("BASTION_KEEP_CLUSTER_LOGS") != "1":
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _processes() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (parent pid, process group, command line, state) of every process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        table[int(entry.name)] = (int(fields[1]), int(fields[2]), cmdline, fields[0])
    return table
