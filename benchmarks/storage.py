"""Storage benchmark: how fast the record log appends and reads, locally and over S3.

For 100-byte and 1 KiB values, on the local store (a temporary directory) and on an S3
server (moto, started by this script as a separate process on 127.0.0.1), it measures:

* append    — ``LogWriter.append_many`` in batches of 1,000 records, then ``close()``
              (every record sealed into a stored segment: the time includes the I/O);
* forward   — ``LogReader.read_batches()`` over the whole log (CRC-verified);
* backward  — ``LogReader.read_backward()`` over the whole log, newest first.

Local figures are the best of three runs (this machine may be shared); S3 figures are
one run. MB/s counts the bytes stored (8-byte header + msgpack ``[seq, ts, value]``).
It prints a table and asserts nothing. Run: ``.venv/bin/python benchmarks/storage.py``.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bastion.storage import LocalStore, LogReader, LogWriter, ObjectStore, open_store

BATCH_RECORDS = 1_000
# (value bytes, records on the local store, records on S3)
CASES = [(100, 1_000_000, 200_000), (1024, 200_000, 40_000)]


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in its own process; yields its HOST:PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def make_batches(value_bytes: int, records: int) -> list[list[tuple[float, bytes]]]:
    rng = random.Random(7)
    values = [rng.randbytes(value_bytes) for _ in range(256)]
    return [[(float(i), values[i & 255]) for i in range(start, min(start + BATCH_RECORDS,
                                                                   records))]
            for start in range(0, records, BATCH_RECORDS)]


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    count = fn()
    return time.perf_counter() - start, count


def run_case(store: ObjectStore, value_bytes: int, records: int, repeats: int,
             ) -> list[tuple[str, int, float, int]]:
    """[(operation, records, seconds, stored bytes)], best of ``repeats`` runs each."""
    best: dict[str, tuple[float, int]] = {}
    stored = 0
    for _ in range(repeats):
        prefix = f"bench/{uuid.uuid4().hex[:8]}/"
        batches = make_batches(value_bytes, records)

        def append() -> int:
            with LogWriter(store, prefix) as writer:
                for batch in batches:
                    writer.append_many(batch)
            return records

        def forward() -> int:
            return sum(len(b) for b in LogReader(store, prefix).read_batches())

        def backward() -> int:
            return sum(len(b) for b in LogReader(store, prefix).read_backward())

        for name, fn in (("append", append), ("forward", forward), ("backward", backward)):
            seconds, count = timed(fn)
            if count != records:
                raise RuntimeError(f"{name} saw {count} records, expected {records}")
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, count)
            # A million live input tuples would make every garbage collection during
            # the reads walk them; a reader in a real job does not carry them.
            batches.clear()
        stored = sum(s.size_bytes for s in LogReader(store, prefix).segments())
        for key in store.list(prefix):
            store.delete(key)
    return [(name, count, seconds, stored) for name, (seconds, count) in best.items()]


def main() -> None:
    # moto accepts any credentials; real ones, if set, are left alone.
    os.environ.setdefault("BASTION_S3_ACCESS_KEY", "bench")
    os.environ.setdefault("BASTION_S3_SECRET_KEY", "bench-secret")
    rows: list[tuple[str, str, str, int, float, float, float]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bastion-bench-") as tmp, moto_server() as endpoint:
        targets = [
            ("local", LocalStore(tmp), 3, 1),
            ("s3/moto", open_store(f"s3://bench/log?endpoint={endpoint}&secure=false"), 1, 2),
        ]
        for label, store, repeats, column in targets:
            for value_bytes, *counts in CASES:
                records = counts[column - 1]
                for op, count, seconds, stored in run_case(store, value_bytes, records,
                                                           repeats):
                    rows.append((label, f"{value_bytes} B", op, count, seconds,
                                 count / seconds, stored / seconds / 1e6))
    print(f"\nBastion storage benchmark — python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at the end), "
          f"batches of {BATCH_RECORDS} records, {time.perf_counter() - started:.0f} s total")
    header = ("store", "value", "operation", "records", "seconds", "records/s", "MB/s")
    print(f"{header[0]:<9}{header[1]:>8}  {header[2]:<10}{header[3]:>10}{header[4]:>9}"
          f"{header[5]:>13}{header[6]:>9}")
    for label, value, op, count, seconds, rate, mbps in rows:
        print(f"{label:<9}{value:>8}  {op:<10}{count:>10,}{seconds:>9.2f}{rate:>13,.0f}"
              f"{mbps:>9.1f}")


if __name__ == "__main__":
    main()
