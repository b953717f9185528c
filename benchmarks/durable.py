"""Durable encoding: how long a checkpoint's snapshot and a commit's staged outputs take
to encode and decode (`bastion.runtime.durable`).

A task snapshots every checkpoint interval, on its own event loop, so encoding time is
time the task does not process records. Measured on a real `Task` (built in this
process, no Ray): a reduce with 100k keys and int or list accumulators; and a sink's
100k staged ``(str, int)`` records, without and with lineage ids. Prints the best of
five runs; asserts nothing.

    .venv/bin/python benchmarks/durable.py [--keys N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402
from bastion.runtime.config import JobConfig  # noqa: E402
from bastion.runtime.instance import Task  # noqa: E402
from bastion.runtime.outputs import encode_staged  # noqa: E402
from bastion.runtime.plan import build_plan  # noqa: E402
from bastion.storage import open_store  # noqa: E402


def best_ms(fn: Callable[[], Any], runs: int = 5) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(runs):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000.0, out


def reduce_task(root: Path) -> Task:
    topo = bn.Topology("bench-durable")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v).reduce(
        "count", lambda acc, v: acc + 1, initial=0).sink("out", bn.sinks.Collect())
    plan = build_plan(topo)
    config = JobConfig(job_id="bench-durable", storage_url=f"local://{root}")
    task_plan = next(t for t in plan.tasks if "count" in plan.chains[t.chain_id].ops)
    return Task(task_plan, plan, config, open_store(config.storage_url), None, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    n = parser.parse_args().keys
    with tempfile.TemporaryDirectory() as root:
        task = reduce_task(Path(root))
        fold = next(op for op in task.ops if op.ctx.name == "count")
        print(f"{'what':46} {'encode ms':>10} {'decode ms':>10} {'bytes':>11}")
        for label, state in [("reduce state, str keys -> int", {f"key{i}": i for i in range(n)}),
                             ("reduce state, str keys -> [int, int]",
                              {f"key{i}": [i, i] for i in range(n)}),
                             ("reduce state, (str, int) keys -> int",
                              {(f"k{i}", i): i for i in range(n)})]:
            fold.state = state
            encode_ms, blob = best_ms(task.snapshot)
            decode_ms, _ = best_ms(lambda: task.restore(blob, "bench"))
            print(f"{label:46} {encode_ms:10.1f} {decode_ms:10.1f} {len(blob):11,}")
        values = [(f"w{i}", i) for i in range(n)]
        ids = [(3, (2, (0, 0, i))) for i in range(n)]
        for label, column in [("staged (str, int) records", None),
                              ("staged records with lineage ids", ids)]:
            encode_ms, blob = best_ms(lambda: encode_staged(task.durable, values, column, []))
            decode_ms, _ = best_ms(lambda: task.durable.decode(blob, "bench"))
            print(f"{label:46} {encode_ms:10.1f} {decode_ms:10.1f} {len(blob):11,}")


if __name__ == "__main__":
    main()
