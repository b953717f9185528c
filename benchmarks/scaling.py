"""How throughput, checkpoint size, S3 request rates and recovery time grow with
parallelism, on a simulated three-node Ray cluster with its storage on S3.

The cluster is Ray's `cluster_utils.Cluster`: three raylets on 127.0.0.1, one CPU each,
all sharing this machine's cores — so the figures show how Bastion's *costs* grow
with parallelism (requests, bytes, restart work), not how throughput would grow on
machines of their own. The storage is moto's S3 server on loopback behind a WSGI
wrapper that counts requests by method, so every checkpoint blob, manifest,
committed output and event chunk the job writes is counted as the S3 service would
bill it.

The workload is a keyed running count over ``--keys`` keys (default 50,000, so that
operator state is worth checkpointing) into a counting sink, under protocol
``coordinated`` with a checkpoint every ``--interval`` seconds (default 0.5). For
each parallelism p (``--parallelism``, default 1 2 3 6):

- a run of ``--seconds`` (default 6) as fast as it goes: tuples/s, checkpoints, the
  state bytes of the last checkpoint (all instances), the mean checkpoint duration,
  and S3 requests per second of the run by method (POST: multi-object deletes), and
  per checkpoint;
- a run paced at ``--rate`` tuples/s in total where worker 0 is killed 3 s in:
  restart time (detection -> every task runs again) and recovery time (detection ->
  the sink rate back to 90% of before), as `FailureRecovery` measures them.

    .venv/bin/python benchmarks/scaling.py [--seconds S] [--parallelism 1 2 3 6]

Prints a table; asserts nothing. ``--json PATH`` writes the figures for the results
page (`benchmarks/experiments/scaling.py`), whose rows docs/scaling.md cites.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every socket on loopback
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import bastion as bn  # noqa: E402


class CountingS3:
    """moto's S3 server on 127.0.0.1, counting the requests it serves by method."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        app = DomainDispatcherApplication(create_backend_app)

        def counting(environ, start_response):
            method = environ["REQUEST_METHOD"]
            if method == "GET" and not environ.get("PATH_INFO", "/").strip("/").count("/"):
                method = "LIST"  # GET on a bucket (no key): a listing
            with self._lock:
                self.counts[method] += 1
            return app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, counting, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"127.0.0.1:{self._server.server_address[1]}"

    def snapshot(self) -> collections.Counter:
        with self._lock:
            return collections.Counter(self.counts)

    def stop(self) -> None:
        self._server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keyed_count(name: str, n: int | None, parallelism: int, keys: int,
                rate: float | None = None) -> bn.Topology:
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Generator(lambda i: i, count=n, rate=rate),
                      parallelism=parallelism)
    src.key_by(lambda x: x % keys).reduce("count", lambda acc, _: acc + 1, initial=0,
                                          parallelism=parallelism).sink(
        "out", bn.sinks.Discard())
    return topo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=30_000)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[1, 2, 3, 6])
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures as JSON (the results page)")
    args = parser.parse_args()

    s3 = CountingS3()
    # A port and a temp dir of its own: Cluster's default port (6379) may be another
    # Ray's on this machine, and a head node publishes its address in
    # $RAY_TMPDIR/ray/ray_current_cluster (default /tmp/ray), where any ray.init()
    # without an address on the machine would find it and join it.
    temp_dir = tempfile.mkdtemp(prefix="bnsc-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = temp_dir
    os.makedirs(os.path.join(temp_dir, "ray"))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "gcs_server_port": free_port(), "temp_dir": temp_dir})
    for _ in range(2):
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", temp_dir=temp_dir)
    rows, recoveries = [], []
    try:
        ray.init(address=cluster.address, logging_level="WARNING")
        nodes = len([n for n in ray.nodes() if n["Alive"]])
        storage = f"s3://bastion-scaling/run?endpoint={s3.endpoint}&secure=false"
        bn.run(keyed_count("warm", 20_000, max(args.parallelism), 100), storage=storage)
        for p in args.parallelism:
            before, t0 = s3.snapshot(), time.time()
            result = bn.run(keyed_count(f"scale-p{p}", None, p, args.keys),
                            bn.protocols.Coordinated(interval_s=args.interval),
                            storage=storage, duration_s=args.seconds)
            wall_s = time.time() - t0
            requests = s3.snapshot() - before
            m, proto = result.metrics, result.metrics.protocol
            rows.append((p, m.tuples_per_s, proto.checkpoints_completed,
                         proto.state_bytes_last or 0, proto.checkpoint_duration_s_avg or 0.0,
                         {k: v / wall_s for k, v in requests.items()},
                         sum(requests.values()) / max(1, proto.checkpoints_completed)))
            paced = bn.run(keyed_count(f"recover-p{p}", int(args.rate * 8), p, args.keys,
                                       rate=args.rate),
                           bn.protocols.Coordinated(interval_s=args.interval),
                           storage=storage, faults=[bn.faults.KillWorker(0, at=3.0)])
            failures = paced.metrics.protocol.failures
            recoveries.append((p, failures[0].restart_s if failures else None,
                               failures[0].recovery_s if failures else None))
    finally:
        ray.shutdown()
        cluster.shutdown()
        s3.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)

    print(f"keyed count over {args.keys:,} keys, {args.seconds:g} s each, coordinated "
          f"every {args.interval} s, {nodes} simulated nodes, S3 (moto) on loopback, "
          f"{os.cpu_count()} cores")
    print(f"{'p':>3} {'tuples/s':>10} {'ckpts':>6} {'state KiB':>10} {'ckpt ms':>8} "
          f"{'PUT/s':>7} {'GET/s':>7} {'LIST/s':>7} {'DEL/s':>7} {'POST/s':>7} {'req/ckpt':>9}")
    for p, tps, ckpts, state, dur, per_s, per_ckpt in rows:
        print(f"{p:>3} {tps:>10,.0f} {ckpts:>6} {state / 1024:>10.1f} {dur * 1000:>8.1f} "
              f"{per_s.get('PUT', 0):>7.1f} {per_s.get('GET', 0):>7.1f} "
              f"{per_s.get('LIST', 0):>7.1f} {per_s.get('DELETE', 0):>7.1f} "
              f"{per_s.get('POST', 0):>7.1f} {per_ckpt:>9.1f}")
    print(f"\nkill worker 0 at 3 s of a run paced at {args.rate:,.0f} tuples/s")
    print(f"{'p':>3} {'restart s':>10} {'recovery s':>11}")
    for p, restart, recovery in recoveries:
        print(f"{p:>3} {'-' if restart is None else f'{restart:.2f}':>10} "
              f"{'-' if recovery is None else f'{recovery:.2f}':>11}")
    if args.json:
        from bastion.bench import results as page

        page.write_figures(args.json, {
            "keys": args.keys, "seconds": args.seconds, "interval_s": args.interval,
            "rate": args.rate, "nodes": nodes, "cores": os.cpu_count(),
            "runs": [{"parallelism": p, "tuples_per_s": tps, "checkpoints": ckpts,
                      "state_bytes": state, "checkpoint_s": dur, "requests_per_s": per_s,
                      "requests_per_checkpoint": per_ckpt}
                     for p, tps, ckpts, state, dur, per_s, per_ckpt in rows],
            "recoveries": [{"parallelism": p, "restart_s": restart, "recovery_s": recovery}
                           for p, restart, recovery in recoveries]})
    first, last = rows[0], rows[-1]
    print(f"\np={last[0]} vs p={first[0]}: throughput {last[1] / first[1]:.2f}x, "
          f"S3 requests per checkpoint {last[6] / first[6]:.2f}x")


if __name__ == "__main__":
    main()
