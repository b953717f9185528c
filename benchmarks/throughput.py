"""Throughput and latency of the core data plane, against Bytewax in the same run.

Workloads (each over ``--records`` tuples, default 2,000,000):

- W0: source -> map -> map -> counting sink;
- W1: keyed running count (key = i % 100) -> counting sink, at parallelism 1 and 2.

Both engines' sources make record i by one call of the same Python function (Bastion's
``Generator(identity)``, a Bytewax partition mapping it over a range), so both do the
same work per record.

For each, the median of ``--repeats`` runs (default 3) in tuples/s; Bastion's figure is
measured from the moment the job starts (after its worker actors are up), Bytewax's
around ``run_main``. Then p50/p99 end-to-end latency of W0 and W1 (parallelism 1) with
a rate-limited source at half of the measured maximum rate and the default 5 ms buffer
timeout. Then CPU seconds per million records of W1 at parallelism 1, 2 and 4
(`RunMetrics.cpu_s`: user + system time of the job's worker processes while their
tasks ran, summed), which depends neither on how many cores the machine has nor on
how busy they are; its p=2 / p=1 ratio is what the keyed exchange between workers
costs (the median over ``--cpu-repeats`` runs, default 7, of each repeat's own ratio;
the table's "vs p=1" column divides medians). Then the cost of drill-grade runs: W1 at
parallelism 1 and 2 with lineage ids (``lineage=True``) and in deterministic mode
(``deterministic=True``), as ratios to plain W1 measured alternately in the same run.
Then W1 of 1,000,000 records (`START_TO_FINISH_RECORDS`, whatever ``--records`` says)
start to finish: the wall time of a whole `bn.run` on the warm pool (deploy and
teardown included) against Bytewax's ``run_main`` on the same records. Then what one
frame costs to move between two processes: CPU per message of a Ray actor call and of
Bastion's frame transport (`bastion.runtime.transport`), each on both sides. Then
how fast busy workers answer heartbeats: the driver pings W1's workers every 20 ms
while W1 at parallelism 2 keeps their task loops busy (a task loop holds the GIL that
the heartbeat thread needs: `instance._GIL_RELEASE_INTERVAL_S`). Then job-start times,
cold and warm. Prints figures and ratios; asserts nothing; the last line is the
headline.

CPU seconds are not always free of the machine: on some of the 2-core VMs this project
has run on, a process busy while another was busy on the other core got less done per
CPU second (1.6–1.8× once, when the virtual cores shared a physical one; 0.99–1.05×
on others). The CPU section therefore measures that factor in the same run — a
pure-Python loop alone, then two copies at once — and prints the p=2 / p=1 ratio both
as measured and divided by it: the second is what the exchange itself costs.

    .venv/bin/python benchmarks/throughput.py [--records N] [--repeats K] [--cpu-repeats K]
        [--no-bytewax] [--cpu-only]
    .venv/bin/python benchmarks/throughput.py --cpu-threads [--records N]
    .venv/bin/python benchmarks/throughput.py --peers [--records N] [--repeats K]
        [--recovery-rate R] [--json PATH]

``--cpu-threads`` prints, instead, W1's CPU seconds per thread of its worker processes
at parallelism 1 and 2 (Linux: read from /proc), to tell the data plane's cost from
Ray's own threads'.

``--peers`` runs, instead, the Bytewax rows of the results page (`peer_figures`): W0
and W1 at parallelism 1 on both engines, without fault tolerance and (W1) with it —
Bastion's coordinated 1-s checkpoints against Bytewax's 1-s epochs snapshotted into its
SQLite recovery store, from a source that snapshots its position — and recovery:
Bastion's worker process killed by `bastion.faults`, Bytewax's process SIGKILLed and
started again at once on its recovery store (`peers.killed_and_restarted`), both at
``--recovery-rate`` records/s, measured from the kill to the output having caught up
with the arrivals. ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402
from bastion.launcher import ensure_ray  # noqa: E402

KEYS = 100
#: Bastion's checkpoint interval and Bytewax's epoch (snapshot) interval in the peer rows.
CHECKPOINT_INTERVAL_S = 1.0
# W1 start to finish is judged on a job of this many records: the shorter the job, the
# more of its wall time is deploy and teardown
START_TO_FINISH_RECORDS = 1_000_000


def identity(i: int) -> int:
    return i


def w0(n: int, rate: float | None = None) -> bn.Topology:
    topo = bn.Topology("w0")
    src = topo.source("src", bn.sources.Generator(identity, count=n, rate=rate))
    src.map("m1", lambda x: x + 1).map("m2", lambda x: x * 2).sink("out", bn.sinks.Discard())
    return topo


def w1(n: int, parallelism: int, rate: float | None = None) -> bn.Topology:
    topo = bn.Topology(f"w1-p{parallelism}")
    src = topo.source("src", bn.sources.Generator(identity, count=n, rate=rate),
                      parallelism=parallelism)
    src.key_by(lambda x: x % KEYS).reduce("count", lambda acc, _: acc + 1, initial=0,
                                          parallelism=parallelism).sink(
        "out", bn.sinks.Discard())
    return topo


def bastion_rate(topo: bn.Topology, **options) -> float:
    return bn.run(topo, **options).metrics.tuples_per_s


def bastion_cpu_s_per_million(topo: bn.Topology) -> float:
    return bn.run(topo).metrics.cpu_s_per_million_records


# -- Bytewax -------------------------------------------------------------------------------


def bytewax_flows(n: int):
    from bytewax import operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import DynamicSource, StatelessSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class RangePartition(StatelessSourcePartition):
        def __init__(self, count: int, batch: int = 1024):
            self.next, self.count, self.batch = 0, count, batch

        def next_batch(self):
            if self.next >= self.count:
                raise StopIteration()
            stop = min(self.next + self.batch, self.count)
            # the same records made the same way as Bastion's Generator(identity):
            # one call of a Python function per record
            items = list(map(identity, range(self.next, stop)))
            self.next = stop
            return items

    class RangeSource(DynamicSource):
        def __init__(self, count: int):
            self.count = count

        def build(self, step_id, worker_index, worker_count):
            return RangePartition(self.count)

    class CountingPartition(StatelessSinkPartition):
        def __init__(self):
            self.seen = 0

        def write_batch(self, items):
            self.seen += len(items)

    class CountingSink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return CountingPartition()

    def flow_w0():
        flow = Dataflow("w0")
        s = op.input("src", flow, RangeSource(n))
        s = op.map("m1", s, lambda x: x + 1)
        s = op.map("m2", s, lambda x: x * 2)
        op.output("out", s, CountingSink())
        return flow

    def flow_w1():
        flow = Dataflow("w1")
        s = op.input("src", flow, RangeSource(n))
        keyed = op.key_on("key", s, lambda x: str(x % KEYS))

        def count(state, _):
            state = (state or 0) + 1
            return state, state

        op.output("out", op.stateful_map("count", keyed, count), CountingSink())
        return flow

    return flow_w0, flow_w1


def bytewax_recoverable_w1(n: int | None, rate: float | None = None,
                           t0_file: Path | None = None, out: Path | None = None):
    """W1 as Bytewax runs it with recovery: a source that snapshots its position (a
    ``FixedPartitionedSource``: after a restart it resumes from the last snapshot), the
    running count per key, and a sink. ``n`` records as fast as possible, or (``rate``)
    records arriving at ``t0 + v / rate`` from the time written in ``t0_file``, for ever,
    each output batch appended to ``out`` as ``batch newest output_time sum`` (the
    sum of the running counts, -1 until every key has shown up) for
    `peers.killed_and_restarted`."""
    from bytewax import operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class Partition(StatefulSourcePartition):
        def __init__(self, resume: int | None) -> None:
            self.next = resume or 0
            self.t0 = float(t0_file.read_text()) if t0_file is not None else 0.0

        def next_batch(self):
            stop = min(self.next + 1024, n) if n is not None else min(
                self.next + 1024, int((time.time() - self.t0) * rate))
            if n is not None and self.next >= n:
                raise StopIteration()
            items = list(map(identity, range(self.next, stop)))
            self.next = max(self.next, stop)
            return items

        def next_awake(self):
            if rate is None or self.next < int((time.time() - self.t0) * rate):
                return None
            from datetime import datetime, timedelta, timezone
            # nothing due: come back when the next record arrives
            return datetime.now(timezone.utc) + timedelta(seconds=1 / rate)

        def snapshot(self) -> int:
            return self.next

    class Source(FixedPartitionedSource):
        def list_parts(self):
            return ["only"]

        def build_part(self, step_id, for_part, resume_state):
            return Partition(resume_state)

    class SinkPartition(StatelessSinkPartition):
        def __init__(self) -> None:
            self.batches, self.counts = 0, {}
            self.lines = open(out, "a", buffering=1) if out is not None else None

        def write_batch(self, items) -> None:
            if self.lines is None or not items:
                return
            for key, (count, _value) in items:
                self.counts[key] = count
            newest = max(value for _key, (_count, value) in items)
            total = sum(self.counts.values()) if len(self.counts) == KEYS else -1
            self.lines.write(f"{self.batches} {newest} {time.time()!r} {total}\n")
            self.batches += 1

    class Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return SinkPartition()

    def count(state, value):
        state = (state or 0) + 1
        return state, (state, value)

    flow = Dataflow("w1-recoverable")
    keyed = op.key_on("key", op.input("src", flow, Source()), lambda x: str(x % KEYS))
    op.output("out", op.stateful_map("count", keyed, count), Sink())
    return flow


def bytewax_run_recoverable(flow, db_dir: Path) -> None:
    """Run ``flow`` with Bytewax's recovery: a snapshot of every state each 1-s epoch
    into the SQLite store in ``db_dir`` (the same interval as Bastion's checkpoints)."""
    from datetime import timedelta

    from bytewax.recovery import RecoveryConfig
    from bytewax.testing import run_main

    run_main(flow, epoch_interval=timedelta(seconds=CHECKPOINT_INTERVAL_S),
             recovery_config=RecoveryConfig(str(db_dir)))


def bytewax_recoverable_rate(n: int) -> float:
    import tempfile

    from bytewax.recovery import init_db_dir

    with tempfile.TemporaryDirectory(prefix="bytewax-recovery-") as db_dir:
        init_db_dir(Path(db_dir), 1)
        flow = bytewax_recoverable_w1(n)
        t0 = time.perf_counter()
        bytewax_run_recoverable(flow, Path(db_dir))
        return n / (time.perf_counter() - t0)


def bytewax_recovery_child(rate: float, t0_file: str, db_dir: str, out: str) -> None:
    """The job's process (``--bytewax-recovery-child``): paced W1 with recovery, until
    it is killed. The first run fixes the arrival schedule (``t0_file``)."""
    t0_path = Path(t0_file)
    if not t0_path.exists():
        t0_path.with_suffix(".tmp").write_text(repr(time.time()))
        t0_path.with_suffix(".tmp").rename(t0_path)
    bytewax_run_recoverable(bytewax_recoverable_w1(None, rate, t0_path, Path(out)),
                            Path(db_dir))


def bytewax_rate(make_flow, n: int) -> float:
    from bytewax.testing import run_main

    flow = make_flow()
    t0 = time.perf_counter()
    run_main(flow)
    return n / (time.perf_counter() - t0)


def _spin(iterations: int, start: Any = None, results: Any = None) -> float:
    if start is not None:
        start.wait()  # both copies begin together
    started_s = time.process_time()
    total = 0
    for i in range(iterations):
        total += i
    used_s = time.process_time() - started_s
    if results is not None:
        results.put(used_s)
    return used_s


def machine_concurrency_factor(iterations: int = 10_000_000, repeats: int = 3
                               ) -> float | None:
    """CPU seconds of a pure-Python loop run as two processes at once, over the same
    loop alone: how much less a CPU second buys when both cores are busy. Other load
    only ever inflates a measurement, so each is the minimum of ``repeats``; None when
    the machine was too busy to tell (two at once came out cheaper than one alone)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")

    def measure(copies: int) -> float:
        start, results = context.Barrier(copies), context.Queue()
        processes = [context.Process(target=_spin, args=(iterations, start, results))
                     for _ in range(copies)]
        for process in processes:
            process.start()
        used_s = max(results.get() for _ in processes)
        for process in processes:
            process.join()
        return used_s

    alone_s = min(measure(1) for _ in range(repeats))
    together_s = min(measure(2) for _ in range(repeats))
    factor = together_s / alone_s
    return factor if factor >= 1.0 else None


def exchange_cost_figures(messages: int = 2000, frame_bytes: int = 20_000) -> dict[str, float]:
    """CPU ms per frame moved from one actor process to another, sender and receiver,
    by a Ray actor call and by the frame transport, with 4 frames in flight (the
    default credits) either way."""
    import ray

    @ray.remote(num_cpus=0)
    class Receiver:
        def __init__(self):
            from bastion.runtime.transport import FrameServer

            async def deliver(epoch, task_id, channel_id, seq, payload, incarnation):
                pass
            self.server = FrameServer(deliver)

        async def address(self):
            return await self.server.start("127.0.0.1")

        async def push(self, epoch, task_id, channel_id, seq, payload):
            pass

        def cpu_s(self):
            return time.process_time()

    @ray.remote(num_cpus=0)
    class Sender:
        async def send(self, receiver, address, how: str) -> float:
            import collections

            from bastion.runtime.transport import PeerLinks, pusher
            payload = b"x" * frame_bytes
            links = PeerLinks()
            if how == "transport":
                await links.connect([address])
                push = pusher(links[address], 0, ("bench", 0))
            else:
                def push(channel_id, seq, frame):
                    return receiver.push.remote(("bench", 0), 0, channel_id, seq, frame)
            inflight = collections.deque()
            started_s = time.process_time()
            for seq in range(messages):
                if len(inflight) >= 4:
                    await inflight.popleft()
                inflight.append(push(0, seq, payload))
            while inflight:
                await inflight.popleft()
            used_s = time.process_time() - started_s
            links.close()
            return used_s

    receiver, sender = Receiver.remote(), Sender.remote()
    address = ray.get(receiver.address.remote())
    costs = {}
    for how in ("ray call", "transport"):
        before_s = ray.get(receiver.cpu_s.remote())
        sender_s = ray.get(sender.send.remote(receiver, address, how))
        receiver_s = ray.get(receiver.cpu_s.remote()) - before_s
        costs[how] = (sender_s + receiver_s) / messages * 1e3
        print(f"{how:<10} {sender_s / messages * 1e3:>9.3f} "
              f"{receiver_s / messages * 1e3:>9.3f} {costs[how]:>9.3f}")
    for actor in (receiver, sender):
        ray.kill(actor)
    return costs


def cpu_figures(n: int, k: int) -> tuple[float, str]:
    """Print CPU seconds per million records of W1 at parallelism 1, 2 and 4 and the
    machine's two-busy-cores factor; return the p=2 / p=1 ratio and its adjusted form."""
    print(f"\nCPU seconds per million records, W1, {n:,} tuples, median of {k}")
    # The parallelisms alternate within each repeat: this machine's speed drifts by up
    # to 2x over minutes, and measuring all p=1 runs before all p=2 runs would put
    # the drift into the ratio. For the same reason the ratio is the median of each
    # repeat's own p=2 / p=1 (runs seconds apart), not a ratio of two medians: one
    # slow p=1 run would otherwise move it by as much as the target's margin.
    runs: dict[int, list[float]] = {1: [], 2: [], 4: []}
    for _ in range(k):
        for p, measured in runs.items():
            measured.append(bastion_cpu_s_per_million(w1(n, p)))
    cpu_s_per_million = {p: statistics.median(measured) for p, measured in runs.items()}
    paired = [two / one for one, two in zip(runs[1], runs[2])]
    print("p=2 / p=1 of each repeat: " + ", ".join(f"{r:.2f}x" for r in paired))
    factor = machine_concurrency_factor()
    if factor is None:
        print("(the machine was too busy to measure what two busy cores cost: no "
              "adjusted ratio)")
    else:
        print(f"(this machine: a CPU second with both cores busy does the work of "
              f"{1 / factor:.2f} s alone; 'adjusted' divides by {factor:.2f})")
    print(f"{'workload':<10} {'CPU s/M':>10} {'vs p=1':>8} {'adjusted':>9}")
    for p, cpu in cpu_s_per_million.items():
        ratio = cpu / cpu_s_per_million[1]
        adjusted = f"{ratio / factor:>8.2f}x" if p > 1 and factor else f"{'-':>9}"
        print(f"{'W1 p=' + str(p):<10} {cpu:>10.2f} {ratio:>7.2f}x {adjusted}")
    cpu_ratio = statistics.median(paired)
    adjusted_ratio = (f"{cpu_ratio / factor:.2f}x adjusted for the machine"
                      if factor else "no machine adjustment: too busy to measure")
    return cpu_ratio, adjusted_ratio


def _thread_cpu_s() -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, thread id) -> (thread name, user + system CPU seconds) of every thread on
    this machine, from /proc (Linux)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    threads = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                threads[int(pid), int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
    return threads


def thread_cpu_figures(n: int) -> None:
    """Print where W1's worker processes spend CPU, thread by thread, at parallelism 1
    and 2: the CPU seconds of each thread over a whole `bn.run` (deploy and teardown
    included, unlike `RunMetrics.cpu_s`). Ray names its threads (the actor's event
    loop runs in the thread named after the process's first title, e.g. ray::IDLE),
    so this says whether the cost is the data plane or Ray's own threads."""
    for p in (1, 2):
        bn.run(w1(n, p))  # the pool's processes exist and are warm
        before = _thread_cpu_s()
        result = bn.run(w1(n, p))
        after = _thread_cpu_s()
        pids = {int(t["process"].rsplit(":", 1)[1]) for t in result.details["tasks"]}
        print(f"\nW1 p={p}, {n:,} tuples: CPU s per thread of the job's worker processes "
              f"(cpu_s of the run: {result.metrics.cpu_s:.3f})")
        for pid in sorted(pids):
            used: dict[str, float] = {}
            for (owner, tid), (name, cpu_s) in after.items():
                if owner == pid:
                    used[name] = used.get(name, 0.0) + cpu_s - before.get(
                        (owner, tid), (name, 0.0))[1]
            print(f"  process {pid}: {sum(used.values()):.2f} s")
            for name, cpu_s in sorted(used.items(), key=lambda item: -item[1]):
                if cpu_s >= 0.005:
                    print(f"    {name:<20} {cpu_s:>6.2f}")


def heartbeat_figures(n: int, interval_s: float = 0.02) -> float:
    """Print how long W1's busy workers take to answer a ping (`Worker.ping`, which
    runs on a thread of its own) while W1 at parallelism 2 runs: the driver pings each
    worker of the pool every ``interval_s`` during the run. Return the slowest, in
    seconds."""
    import threading

    import ray

    from bastion.scheduler.pool import POOL_NAME, POOL_NAMESPACE

    bn.run(w1(n, 2))  # the pool now holds the processes the next run takes
    pool = ray.get_actor(POOL_NAME, namespace=POOL_NAMESPACE)
    workers = [worker for worker, _ in ray.get(pool.idle.remote())]
    answers_s: list[float] = []
    running = threading.Event()
    running.set()

    def ping() -> None:
        while running.is_set():
            for worker in workers:
                t0 = time.perf_counter()
                ray.get(worker.ping.remote())
                answers_s.append(time.perf_counter() - t0)
            time.sleep(interval_s)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        busy_s = bn.run(w1(10 * n, 2)).metrics.duration_s
    finally:
        running.clear()
        pinger.join()
    answers_s.sort()
    print(f"\nHeartbeats during W1 p=2 ({10 * n:,} tuples, {busy_s:.1f} s): "
          f"{len(answers_s)} pings of {len(workers)} workers, answered in "
          f"p50 {answers_s[len(answers_s) // 2] * 1e3:.1f} ms, "
          f"p99 {answers_s[int(len(answers_s) * 0.99)] * 1e3:.1f} ms, "
          f"max {answers_s[-1] * 1e3:.1f} ms")
    return answers_s[-1]


def startup_figures(warm_repeats: int = 7) -> None:
    """Print `bn.run` wall time, start to finish, of a 10- and a 10,000-record W0:
    cold (the first job in a fresh local Ray: the pool starts its processes, not
    counting Ray's own start) and warm (the median of ``warm_repeats`` jobs after it,
    on the pool's idle processes), with the warm runs' deploy, run and teardown."""
    import ray

    print(f"\nJob start, bn.run wall time (s); warm: median of {warm_repeats}")
    print(f"{'job':<16} {'cold':>7} {'warm':>7} {'deploy':>7} {'run':>7} {'teardown':>9}")
    for n in (10, 10_000):
        ray.shutdown()  # a fresh Ray: no pool, no idle worker
        ensure_ray()
        t0 = time.perf_counter()
        bn.run(w0(n))
        cold_s = time.perf_counter() - t0
        walls, metrics = [], []
        for _ in range(warm_repeats):
            t0 = time.perf_counter()
            metrics.append(bn.run(w0(n)).metrics)
            walls.append(time.perf_counter() - t0)

        def median(field: str) -> float:
            return statistics.median(getattr(m, field) for m in metrics)

        print(f"{f'{n:,} records':<16} {cold_s:>7.3f} {statistics.median(walls):>7.3f} "
              f"{median('deploy_s'):>7.3f} {median('duration_s'):>7.3f} "
              f"{median('teardown_s'):>9.3f}")


def peer_figures(n: int, k: int, recovery_rate: float) -> dict:
    """The results page's Bytewax rows (``--peers``): W0 and W1 at parallelism 1 on both
    engines without fault tolerance (Bastion ``none``, Bytewax without a recovery
    store); W1 with it (Bastion coordinated 1-s checkpoints, Bytewax 1-s epochs
    snapshotted to its recovery store: exactly-once state, at-least-once output on
    both sides); and recovery: Bastion's worker process killed by `bastion.faults`,
    Bytewax's process SIGKILLed and started again on its recovery store, both at
    ``recovery_rate`` records/s. Every rate is the median of ``k`` runs, the engines
    alternating."""
    import tempfile

    from bytewax.recovery import init_db_dir

    from peers import bastion_recovery, killed_and_restarted

    flows = bytewax_flows(n)
    coordinated = bn.protocols.Coordinated(interval_s=CHECKPOINT_INTERVAL_S)
    jobs = {
        "w0": (lambda: bastion_rate(w0(n)), lambda: bytewax_rate(flows[0], n)),
        "w1": (lambda: bastion_rate(w1(n, 1)), lambda: bytewax_rate(flows[1], n)),
        "w1_recoverable": (lambda: bastion_rate(w1(n, 1), protocol=coordinated),
                           lambda: bytewax_recoverable_rate(n)),
    }
    figures: dict = {"records": n, "repeats": k, "keys": KEYS,
                     "checkpoint_interval_s": CHECKPOINT_INTERVAL_S,
                     "recovery_rate": recovery_rate}
    for name, (ours, theirs) in jobs.items():
        samples: dict[str, list[float]] = {"bastion": [], "bytewax": []}
        for _ in range(k):
            samples["bastion"].append(ours())
            samples["bytewax"].append(theirs())
        figures[name] = {engine: statistics.median(values)
                         for engine, values in samples.items()}
        figures[name]["samples"] = samples
        print(f"{name:<16} bastion {figures[name]['bastion']:>12,.0f}/s  bytewax "
              f"{figures[name]['bytewax']:>12,.0f}/s  "
              f"{figures[name]['bastion'] / figures[name]['bytewax']:.2f}x", flush=True)
    figures["bastion_recovery"] = bastion_recovery(recovery_rate, seconds=8.0,
                                                   kill_at_s=3.0, parallelism=1)
    with tempfile.TemporaryDirectory(prefix="bytewax-recovery-") as tmp:
        workdir = Path(tmp)
        db_dir, t0_file = workdir / "db", workdir / "t0"
        db_dir.mkdir()
        init_db_dir(db_dir, 1)
        figures["bytewax_recovery"] = killed_and_restarted(
            lambda out: [str(Path(__file__).resolve()), "--bytewax-recovery-child",
                         repr(recovery_rate), str(t0_file), str(db_dir), out],
            recovery_rate, t0_file, workdir, kill_after_s=3.0)
    ours, theirs = figures["bastion_recovery"], figures["bytewax_recovery"]
    print(f"recovery at {recovery_rate:,.0f} records/s, from the kill: bastion running "
          f"again {ours['running_again_s']:.2f} s, caught up {_secs(ours['caught_up_s'])}; "
          f"bytewax first output {theirs['first_output_s']:.2f} s, caught up "
          f"{theirs['caught_up_s']:.2f} s, state exact: {theirs['state_exact']}", flush=True)
    return figures


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-repeats", type=int, default=7,
                        help="repeats of the CPU section (its ratio is judged against a "
                             "target, so it takes more than the rest)")
    parser.add_argument("--latency-s", type=float, default=5.0,
                        help="seconds of each half-rate latency run")
    parser.add_argument("--no-bytewax", action="store_true")
    parser.add_argument("--cpu-only", action="store_true",
                        help="only the CPU seconds per million records (a few minutes)")
    parser.add_argument("--cpu-threads", action="store_true",
                        help="only W1's CPU seconds per thread of its worker processes")
    parser.add_argument("--peers", action="store_true",
                        help="only the results page's Bytewax rows (`peer_figures`)")
    parser.add_argument("--recovery-rate", type=float, default=50_000,
                        help="records/s of the --peers recovery runs")
    parser.add_argument("--json", default=None,
                        help="with --peers: write the figures to this file")
    parser.add_argument("--bytewax-recovery-child", nargs=4,
                        metavar=("RATE", "T0_FILE", "DB_DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    n, k = args.records, args.repeats
    if args.bytewax_recovery_child:
        rate, t0_file, db_dir, out = args.bytewax_recovery_child
        bytewax_recovery_child(float(rate), t0_file, db_dir, out)
        return
    if args.peers:
        ensure_ray()
        figures = peer_figures(n, k, args.recovery_rate)
        if args.json:
            from bastion.bench import results

            results.write_figures(args.json, figures)
        ratio = {job: figures[job]["bastion"] / figures[job]["bytewax"]
                 for job in ("w0", "w1", "w1_recoverable")}
        print(f"vs Bytewax: W0 {ratio['w0']:.2f}x, W1 {ratio['w1']:.2f}x, W1 with "
              f"recovery {ratio['w1_recoverable']:.2f}x; "
              f"caught up after a kill in {_secs(figures['bastion_recovery']['caught_up_s'])} "
              f"against {figures['bytewax_recovery']['caught_up_s']:.2f} s")
        return
    if args.cpu_threads:
        ensure_ray()
        thread_cpu_figures(n)
        return
    if args.cpu_only:
        ensure_ray()
        cpu_ratio, adjusted_ratio = cpu_figures(n, args.cpu_repeats)
        print(f"CPU s per million records of W1, p=2 / p=1: {cpu_ratio:.2f}x "
              f"({adjusted_ratio})")
        return

    flows = None
    if not args.no_bytewax:
        try:
            flows = bytewax_flows(n)
        except ImportError:
            print("bytewax is not installed (pip install bytewax); skipping the peer")

    def median_of(fn) -> float:
        return statistics.median(fn() for _ in range(k))

    ensure_ray()
    rows = []
    results: dict[str, float] = {}
    for name, make, peer in [("W0", lambda: w0(n), 0), ("W1 p=1", lambda: w1(n, 1), 1),
                             ("W1 p=2", lambda: w1(n, 2), None)]:
        ours = median_of(lambda: bastion_rate(make()))
        results[name] = ours
        theirs = None
        if flows is not None and peer is not None:
            theirs = median_of(lambda: bytewax_rate(flows[peer], n))
        rows.append((name, ours, theirs))

    print(f"\nThroughput, {n:,} tuples, median of {k} (tuples/s)")
    print(f"{'workload':<10} {'Bastion':>12} {'Bytewax':>12} {'ratio':>7}")
    for name, ours, theirs in rows:
        peer = f"{theirs:>12,.0f}" if theirs else f"{'-':>12}"
        ratio = f"{ours / theirs:>6.2f}x" if theirs else f"{'-':>7}"
        print(f"{name:<10} {ours:>12,.0f} {peer} {ratio}")
    print(f"W1 scaling p=2 / p=1: {results['W1 p=2'] / results['W1 p=1']:.2f}x")

    print(f"\nLatency at half the maximum rate ({args.latency_s:.0f} s each, "
          "buffer timeout 5 ms)")
    print(f"{'workload':<10} {'rate/s':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for name, make in [("W0", lambda r, c: w0(c, r)), ("W1 p=1", lambda r, c: w1(c, 1, r))]:
        rate = results[name] / 2
        count = int(rate * args.latency_s)
        m = bn.run(make(rate, count)).metrics
        print(f"{name:<10} {rate:>12,.0f} {m.latency_ms['p50']:>8.2f} {m.latency_ms['p99']:>8.2f}")

    cpu_ratio, adjusted_ratio = cpu_figures(n, args.cpu_repeats)

    print(f"\nDrill-grade runs, W1, {n:,} tuples, median of {k}, modes alternating "
          "(tuples/s)")
    modes = {"plain": {}, "lineage": {"lineage": True}, "deterministic": {"deterministic": True},
             "both": {"lineage": True, "deterministic": True}}
    print(f"{'workload':<10} " + " ".join(f"{m:>14}" for m in modes))
    ratios: dict[int, dict[str, float]] = {}
    for p in (1, 2):
        samples: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(k):
            for mode, options in modes.items():
                samples[mode].append(bastion_rate(w1(n, p), **options))
        rates = {m: statistics.median(v) for m, v in samples.items()}
        ratios[p] = {m: rates[m] / rates["plain"] for m in modes}
        print(f"{'W1 p=' + str(p):<10} " + " ".join(
            f"{rates[m]:>14,.0f}" for m in modes))
        print(f"{'  ratio':<10} " + " ".join(f"{ratios[p][m]:>13.2f}x" for m in modes))

    whole_n = START_TO_FINISH_RECORDS
    print(f"\nW1 p=1 start to finish, {whole_n:,} tuples, median of {k}: whole bn.run "
          "on the warm pool vs Bytewax run_main (s)")
    whole_flows = bytewax_flows(whole_n) if flows is not None else None
    bastion_walls, bytewax_walls = [], []
    for _ in range(k):
        t0 = time.perf_counter()
        bn.run(w1(whole_n, 1))
        bastion_walls.append(time.perf_counter() - t0)
        if whole_flows is not None:
            bytewax_walls.append(whole_n / bytewax_rate(whole_flows[1], whole_n))
    ours_s = statistics.median(bastion_walls)
    end_to_end = ""
    if bytewax_walls:
        theirs_s = statistics.median(bytewax_walls)
        end_to_end = (f"W1 of {whole_n:,} start to finish {theirs_s / ours_s:.2f}x "
                      "Bytewax; ")
        print(f"Bastion {ours_s:.3f}  Bytewax {theirs_s:.3f}  ratio {theirs_s / ours_s:.2f}x")
    else:
        print(f"Bastion {ours_s:.3f}")

    print(f"\nMoving one {20_000:,}-byte frame between two processes, CPU ms per frame")
    print(f"{'how':<10} {'sender':>9} {'receiver':>9} {'both':>9}")
    exchange = exchange_cost_figures()
    slowest_answer_s = heartbeat_figures(n)
    startup_figures()
    print(f"W1 p=2 vs plain: lineage {ratios[2]['lineage']:.2f}x, deterministic "
          f"{ratios[2]['deterministic']:.2f}x, both {ratios[2]['both']:.2f}x; "
          f"{end_to_end}CPU s per million records p=2 / p=1: {cpu_ratio:.2f}x "
          f"({adjusted_ratio}); a frame costs "
          f"{exchange['transport']:.3f} ms of CPU by the transport, "
          f"{exchange['ray call']:.3f} ms by a Ray call; busy workers answer pings "
          f"within {slowest_answer_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
