"""Machine instructions per record of the keyed exchange's stages, counted by callgrind.

CPU seconds on a shared 2-core VM move by 2x with what the neighbours do; instruction
counts do not (valgrind's callgrind counts the same total for the same program and
input, whatever else runs). This benchmark runs W1's exchange in one process — a
keyed edge from a source into 2 destinations through Bastion's real `Router`,
`Batch.split` and `FrameCodec` — and counts, per record:

- ``chain``: what parallelism 1 does per record anyway, as W1 does it: the source's
  generator function, the key function and a keyed running count by a user function
  (`KeyedFoldOp`'s loop); less than the whole job's per-record work (no sink, no
  task loop), so the ratios below are upper bounds;
- ``partition``: the key's destination (`columns.partitions` through the router's
  table of small int keys and its memo);
- ``split``: cutting the batch for each destination (`Batch.split`);
- ``codec``: each destination's frames on their way: destination 1 is in another
  worker (encoded and decoded), destination 0 in the same one (a frame of numbers
  only passes unencoded, `records.passes_unencoded`), as each worker of W1 at
  parallelism 2 has them;

each as the exchange is now (the C kernels of `bastion.runtime.columns`, packed
columns, local frames unencoded) and as it was before them (pure-Python kernels,
msgpack for every column, every frame encoded), and prints the exchange's cost as a
share of the chain's: the floor of W1's p=2 / p=1 CPU ratio, from the exchange alone.

Then the **whole data plane** (``--job``; on by default): W1 itself at parallelism 1
and 2, its workers built in this one process (the real `Worker` class without its Ray
actor wrapper, frames between the two workers over their real loopback sockets, every
task loop on one event loop), instructions per record as the difference between a run
of ``2N`` and one of ``N`` records (deploy and interpreter start cancel out). This is
what the exchange leaves out: task loops, routing, inboxes, the transport, the
per-batch work of the smaller batches a split makes. Time-based flushes are scaled to
callgrind's slowdown (about 50x): with the real 5 ms a frame would be sent by age
after a few hundred records, as it never is at full speed. What this count cannot
show is what the CPU does with the instructions (cache misses, two processes instead
of one, the kernel's share of the sockets): the CPU-second ratio of
`benchmarks/throughput.py` stays the measure of the target.

    .venv/bin/python benchmarks/exchange.py [--records N] [--no-job]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STAGES = ("base", "chain", "partition", "split", "codec")
JOBS = ("job-p1", "job-p2")
BATCH_RECORDS = 1024
FRAME_RECORDS = 4096
KEYS = 100


def workload(stage: str, exchange: str, records: int) -> None:
    """Run the stages up to ``stage`` over ``records`` records (in this process)."""
    from bastion.runtime import columns, instance, records as recs
    from bastion.runtime.channel import OutputChannel
    from bastion.runtime.instance import Router
    from bastion.runtime.operators import OperatorContext
    from bastion.runtime.plan import HASH, EdgePlan, OutputRoute
    from bastion.runtime.records import Batch, FrameCodec, passes_unencoded

    before = exchange == "before"
    if before:  # Python-level passes, msgpack for every column
        instance.partitions = columns.py_partitions
        recs.split_column = columns.py_split_column
        recs.split_columns = columns.py_split_columns
        recs.pack_ints = recs.pack_float64 = lambda column: None

    class Buffer(OutputChannel):
        def __init__(self, channel_id: int):
            super().__init__(channel_id, FRAME_RECORDS, 1.0)

    def identity(i: int) -> int:
        return i

    def key(value: int) -> int:
        return value % KEYS

    def count(acc: int, _value: int) -> int:
        return acc + 1

    edge = EdgePlan(0, "src", "count", 0, 1, 0, HASH, None, False)
    channels = [Buffer(0), Buffer(1)]
    router = Router(OutputRoute(edge, [0, 1], [0, 1]),
                    channels, OperatorContext("count", 0, 2, False, 1, False), False,
                    lambda batch, channel_id, copy: None)
    codec = FrameCodec()
    state: dict = {}
    order = STAGES.index(stage)
    for start in range(10**6, 10**6 + records, BATCH_RECORDS):
        values = list(range(start, start + BATCH_RECORDS))
        stamps = [start * 1e-3] * BATCH_RECORDS
        batch = Batch(None, values, stamps, stamps)
        if order < 1:
            continue
        values = list(map(identity, values))
        keys = list(map(key, values))
        get, out = state.get, []
        append = out.append
        for k, v in zip(keys, values):  # KeyedFoldOp._fold's loop for a reduce
            acc = count(get(k, 0), v)
            state[k] = acc
            append((k, acc))
        if order < 2:
            continue
        keyed = Batch(keys, values, stamps, stamps)
        codes = router._key_parts(keyed)
        if order < 3:
            continue
        parts = keyed.split(codes, 2)
        if order < 4:
            continue
        for destination, (channel, part) in enumerate(zip(channels, parts)):
            if part is not None and channel.add_batch(part):
                frame = channel.take_frame()
                if before or destination == 1 or not passes_unencoded(frame):
                    codec.decode(codec.encode(frame))


# callgrind runs Python about 50x slower: time-based behaviour scaled by that much
CALLGRIND_SLOWDOWN = 50


def job_workload(parallelism: int, records: int) -> None:
    """Run W1 of ``records`` at ``parallelism`` through real workers in this process."""
    import asyncio

    from bastion.runtime import instance, transport
    from bastion.runtime.config import JobConfig, with_frame_key
    from bastion.runtime.plan import build_plan
    from throughput import w1

    transport.node_address = lambda: "127.0.0.1"  # no Ray node: loopback
    instance._GIL_RELEASE_INTERVAL_S *= CALLGRIND_SLOWDOWN
    # the class `@ray.remote` wrapped: the same methods, called directly
    worker_class = instance.Worker.__ray_metadata__.modified_class

    async def run() -> None:
        plan = build_plan(w1(records, parallelism), workers=parallelism)
        with tempfile.TemporaryDirectory() as tmp:
            config = with_frame_key(JobConfig(
                job_id=f"exchange-p{parallelism}", storage_url=f"local://{tmp}",
                buffer_timeout_s=JobConfig.buffer_timeout_s * CALLGRIND_SLOWDOWN))
            workers = [worker_class() for _ in range(plan.workers)]
            for index, worker in enumerate(workers):
                worker.bind(config, index, None)
            peers = [await worker.frame_address() for worker in workers]
            for index, worker in enumerate(workers):
                await worker.deploy(plan, peers, 0, None, index)
            for worker in workers:
                await worker.start()
            for worker in workers:
                outcome = await worker.wait(worker.epoch)
                if outcome["failure"] is not None:
                    raise outcome["failure"]
            received = sum(t.counts[-1].records_in for w in workers for t in w.tasks.values()
                           if t.sinks)
            if received != records:
                raise AssertionError(f"the sinks received {received} of {records} records")
            for worker in workers:
                await worker.release()
                worker.links.close()
            # the servers' connection handlers are cancelled when the loop closes:
            # nothing left to report
            asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)

    asyncio.run(run())


def instructions(stage: str, exchange: str, records: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
             sys.executable, __file__, "--run", stage, "--exchange", exchange,
             "--records", str(records)], capture_output=True, text=True, check=True,
            # the same dict layouts every run: otherwise importing Ray alone moves the
            # count by more than a stage costs
            env={**os.environ, "PYTHONHASHSEED": "0"})
    return int(re.search(r"Collected : (\d+)", run.stderr).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=262144)
    parser.add_argument("--no-job", action="store_true",
                        help="leave out the whole data plane (W1 through real workers)")
    parser.add_argument("--run", choices=STAGES + JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--exchange", choices=("now", "before"), default="now",
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run in JOBS:
        job_workload(int(args.run[-1]), args.records)
        return
    if args.run:
        workload(args.run, args.exchange, args.records)
        return
    from bastion.runtime import columns
    if not columns.NATIVE:
        sys.exit("the C kernels are not built (pip install -e . with a C compiler)")
    n = args.records
    print(f"Instructions per record (callgrind), {n:,} records, W1's keyed exchange "
          f"into 2 destinations")
    print(f"{'stage':10s} {'now':>8s} {'before':>8s}")
    per_record: dict[str, dict[str, float]] = {}
    for exchange in ("now", "before"):
        totals = [instructions(stage, exchange, n) for stage in STAGES]
        per_record[exchange] = {stage: (totals[i] - totals[i - 1]) / n
                                for i, stage in enumerate(STAGES) if i}
    for stage in STAGES[1:]:
        print(f"{stage:10s} {per_record['now'][stage]:8.0f} {per_record['before'][stage]:8.0f}")
    floors = {}
    for exchange, cost in per_record.items():
        floors[exchange] = 1 + (cost["partition"] + cost["split"] + cost["codec"]) / cost["chain"]
    print(f"floor of W1's p=2/p=1 CPU ratio from the exchange alone: {floors['now']:.2f}x "
          f"now, {floors['before']:.2f}x before the C kernels")
    if args.no_job:
        return
    job = {run: (instructions(run, "now", 2 * n) - instructions(run, "now", n)) / n
           for run in JOBS}
    print(f"\nW1's whole data plane through real workers in one process, instructions "
          f"per record: p=1 {job['job-p1']:.0f}, p=2 {job['job-p2']:.0f}")
    print(f"W1 p=2 / p=1, whole data plane: {job['job-p2'] / job['job-p1']:.2f}x "
          f"instructions (the exchange's floor: {floors['now']:.2f}x)")


if __name__ == "__main__":
    main()
