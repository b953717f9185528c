"""State benchmark (issue 39, item 6): what a checkpoint writes and what a restore reads
per task, full snapshot against incremental (`bastion.runtime.incremental`), for a
keyed reduce holding many keys.

(a) **Bytes per checkpoint, in process** — a `KeyedFoldOp`-shaped state of ``--keys``
    int keys (10 k, 1 M, 4 M and 16 M) holding int sums; between checkpoints
    ``--updates`` records (20,000) land either on ``--hot`` keys (1,000: *hot*) or on
    keys drawn from all of them (*uniform*, for contrast) — or the state *grows*
    from a 16th of the keys by a 16th between checkpoints, every record a new key
    (the deltas' appended keys, packed from the table's end). For each, one full
    cycle of the default chain — checkpoints until the trigger writes a second base,
    at most ``max_chain + 1`` (65); a growing one until it holds every key —
    encoded as `Task` encodes them: the full snapshot's
    bytes and encode time, the median delta's, the base's, and the mean bytes per
    checkpoint with the bases included, as a share of the full snapshot's.
(c) **Restore time** of the longest chain the trigger lets that cycle grow (the base
    and every delta after it, decoded and applied as `Task.restore_chain` does)
    against decoding one full snapshot; best of ``--repeats`` (3).
(b) **A real run** (``--run``): the keyed sum as a job under ``coordinated`` (a
    checkpoint every ``--interval-s``, 1 s) on local storage — and with ``--s3`` on
    moto's S3 server on loopback as well (started by this script) —, full and
    incremental, each with snapshots encoded on the task's loop and in a forked child
    from `INCREMENTAL_FORK_MIN_KEYS` (1 M) keys (`State.fork_min_keys`: the default
    forks incremental bases only; ``--run-configs`` picks some), each reading
    ``--run-records`` records, unpaced unless ``--run-rate`` paces the source (a
    checkpoint's duration then carries no backlog of a saturated job) — the first
    ``--run-keys`` (4 M) make the cold
    keys, the rest go to ``--hot`` hot keys — with a heartbeat timeout of
    ``--heartbeat-timeout-s`` (5 s: a full snapshot of 16 M keys holds the GIL about a
    second, and at the default 1 s its worker is taken for dead): the checkpoints'
    mean bytes after the first, their mean, median and largest duration, and the
    records per second and the job's CPU time per record (its processes', forked
    encoders included) of each run; then each configuration's best rate of
    ``--run-repeats`` (2, the configurations alternating, in reverse order every
    other repeat) against the same job
    without checkpoints, and the median of its repeats' ratios to that job's run
    beside them, of rates and of CPU per record (steadier between runs than the
    rate on a shared machine).

(d) **Change tracking**, in process: CPU per record of a keyed sum over ``--hot`` keys
    with and without the set of changed keys incremental state keeps.

The last line is the headline: at 4 M keys, 1 k hot, the incremental bytes per
checkpoint (bases included) as a share of a full snapshot's — target ≤ 2 % — and the
restore time of the default's longest chain against a full snapshot's — target ≤ 1.5x;
with ``--run``, the median duration of the default's checkpoints (``incr. forked``) on
local storage — target ≤ 0.1 s at 4 M keys — and the median of its paired runs' rates
against the job without checkpoints — target ≥ 0.9x at 16 M keys (``--run-keys
16000000``; ten repeats or so: on this shared machine one run's rate moves by ±20%,
``no checkpoints`` included).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time

from bastion.options import INCREMENTAL_FORK_MIN_KEYS, State
from bastion.runtime.durable import DurableCodec
from bastion.runtime.incremental import ChangedKeys, StateChain, apply_links
from bastion.storage.checkpoints import ChainRef

KEY_COUNTS = (10_000, 1_000_000, 4_000_000, 16_000_000)
#: (b)'s configurations
RUN_CONFIGS = ("no checkpoints", "full", "full forked", "incr. loop", "incr. forked")


class _Fold:
    """The state and change tracking of a keyed fold, without a topology."""

    changed: set | None = None

    def __init__(self, keys: int) -> None:
        self.state = dict.fromkeys(range(keys), 0)

    def tables(self) -> list[dict]:
        return [self.state]

    def feed(self, keys: list[int]) -> None:
        state = self.state
        for k in keys:
            state[k] += 1
        if self.changed is not None:
            self.changed.update(keys)

    def grow(self, count: int, batch: int = 1000) -> None:
        """``count`` new keys, in batches as a `KeyedFoldOp` folds them."""
        state = self.state
        end = len(state) + count
        for first in range(len(state), end, batch):
            keys = range(first, min(first + batch, end))
            state.update(dict.fromkeys(keys, 1))
            if self.changed is not None:
                self.changed.folded(keys, len(keys))


def full_snapshot(codec: DurableCodec, fold: _Fold, repeats: int) -> tuple[bytes, list[float]]:
    """The fold's full snapshot, and the seconds each of ``repeats`` encodes took."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        full = codec.encode({"operators": [fold.state]})
        seconds.append(time.perf_counter() - started)
    return full, seconds


def cycle(keys: int, pattern: str, args: argparse.Namespace) -> dict:
    """One chain cycle of the default trigger for ``keys`` keys; the figures."""
    codec = DurableCodec()
    rng = random.Random(7)
    growing = pattern == "growing"
    fold = _Fold(keys // 16 if growing else keys)
    chain = StateChain([fold], args.max_chain)
    hot = rng.sample(range(keys), min(args.hot, keys))
    draw = (lambda: rng.choice(hot)) if pattern == "hot" else (lambda: rng.randrange(keys))
    full, full_s = full_snapshot(codec, fold, args.repeats)
    links: list[tuple[str, bytes, float]] = []
    while True:
        if growing:
            fold.grow(keys // 16 if links else 0)
        else:
            fold.feed([draw() for _ in range(args.updates)])
        started = time.perf_counter()
        link = chain.link([None])
        data = codec.encode({"operators": None, "link": link.value})
        took = time.perf_counter() - started
        if link.kind == "base" and links:
            break   # the cycle is over: this base starts the next
        links.append((link.kind, data, took))
        chain.stored(link, ChainRef("sum/0", f"k{len(links)}", len(data), 0, link.parent))
        if growing and len(fold.state) >= keys // 16 * 16:
            break
    if growing:  # the full snapshot of what the state grew to
        full, full_s = full_snapshot(codec, fold, args.repeats)
    deltas = [(len(d), s) for kind, d, s in links if kind == "delta"]
    base_bytes, base_s = len(links[0][1]), links[0][2]
    per_checkpoint = sum(len(d) for _, d, _ in links) / len(links)
    restore_full, restore_chain = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        codec.decode(full, "full")
        restore_full.append(time.perf_counter() - started)
        started = time.perf_counter()
        decoded = [codec.decode(d, "link")["link"] for _, d, _ in links]
        apply_links(decoded, [True])
        restore_chain.append(time.perf_counter() - started)
    return {"full_bytes": len(full), "full_s": min(full_s), "base_bytes": base_bytes,
            "base_s": base_s, "deltas": len(deltas),
            "delta_bytes": statistics.median([b for b, _ in deltas]) if deltas else 0,
            "delta_s": statistics.median([s for _, s in deltas]) if deltas else 0.0,
            "per_checkpoint": per_checkpoint / len(full),
            "restore_full_s": min(restore_full), "restore_chain_s": min(restore_chain)}


def codec_figures(args: argparse.Namespace) -> dict:
    print(f"(a, c) in process: {args.updates:,} updates per interval on {args.hot:,} hot "
          f"keys or uniform over all; max_chain={args.max_chain}; best of {args.repeats}")
    print(f"{'keys':>11} {'pattern':>8} {'full MB':>8} {'enc ms':>7} {'base MB':>8} "
          f"{'deltas':>6} {'delta KB':>9} {'enc ms':>7} {'per ckpt':>9} "
          f"{'restore full':>13} {'chain':>8} {'ratio':>6}")
    figures = {}
    for keys in args.keys:
        for pattern in ("hot", "uniform", "growing"):
            f = cycle(keys, pattern, args)
            figures[keys, pattern] = f
            print(f"{keys:>11,} {pattern:>8} {f['full_bytes'] / 1e6:8.2f} "
                  f"{f['full_s'] * 1e3:7.1f} {f['base_bytes'] / 1e6:8.2f} {f['deltas']:>6} "
                  f"{f['delta_bytes'] / 1e3:9.1f} {f['delta_s'] * 1e3:7.2f} "
                  f"{f['per_checkpoint']:9.2%} {f['restore_full_s']:12.3f}s "
                  f"{f['restore_chain_s']:7.3f}s "
                  f"{f['restore_chain_s'] / f['restore_full_s']:5.2f}x", flush=True)
    return figures


def tracking_figure(args: argparse.Namespace) -> float:
    """(d): what tracking changed keys costs a keyed fold per record, in process —
    a real `KeyedFoldOp` (a reduce summing ints over ``--hot`` keys) fed 1,000-record
    batches, with ``changed`` the runtime's `ChangedKeys` (incremental) and None (full
    snapshots)."""
    import bastion as bn
    from bastion.runtime.operators import OperatorContext, make_operator
    from bastion.runtime.records import Batch

    topo = bn.Topology("tracking")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v).reduce(
        "sum", lambda acc, v: acc + v, initial=0).sink("out", bn.sinks.Discard())
    rng = random.Random(3)
    batches = []
    for _ in range(200):
        keys = [rng.randrange(args.hot) for _ in range(1000)]
        batches.append(Batch(keys, keys, [0.0] * 1000, [0.0] * 1000))
    best = {}
    for _ in range(args.repeats * 2):
        for tracked in (False, True):
            op = make_operator(topo.nodes["sum"], OperatorContext("sum", 0, 1, False))
            op.changed = ChangedKeys(op) if tracked else None
            started = time.process_time()
            for batch in batches:
                op.process(batch, 0)
                if tracked:
                    op.changed = ChangedKeys(op)  # as a checkpoint takes it
            took = (time.process_time() - started) / (len(batches) * 1000)
            best[tracked] = min(best.get(tracked, took), took)
    cost = best[True] / best[False] - 1
    print(f"(d) change tracking: a keyed sum over {args.hot:,} keys costs "
          f"{best[False] * 1e9:.0f} ns/record untracked, {best[True] * 1e9:.0f} tracked "
          f"(+{cost:.0%}): what incremental state adds to a job whose state is small")
    return cost


def run_figures(args: argparse.Namespace, storage: str, label: str
                ) -> tuple[dict[str, float], dict[str, float]]:
    """(b) on ``storage``; returns each configuration's median checkpoint duration
    (seconds) over its repeats' checkpoints, and the median of its repeats' rates
    against the run without checkpoints beside each."""
    import bastion as bn

    keys, hot, records = args.run_keys, args.hot, args.run_records
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}  # the job's CPU (forked encoders included) a record
    all_durations: dict[str, list[float]] = {}
    coordinated = bn.protocols.Coordinated(interval_s=args.interval_s)
    forked = INCREMENTAL_FORK_MIN_KEYS
    configs = [(name, protocol, state) for name, protocol, state in (
        ("no checkpoints", "none", None),
        ("full", coordinated, bn.State(fork_min_keys=None)),
        ("full forked", coordinated, bn.State(fork_min_keys=forked)),
        ("incr. loop", coordinated, bn.State(incremental=True, fork_min_keys=None)),
        ("incr. forked", coordinated, bn.State(incremental=True, fork_min_keys=forked)))
        if name in args.run_configs or name == "no checkpoints"]
    # alternating, best of --run-repeats: the machine's speed moves from run to run,
    # and every other repeat runs the configurations in reverse order, so that a
    # drift over a repeat does not favour the one that always runs first
    order = [c for repeat in range(args.run_repeats)
             for c in (configs if repeat % 2 == 0 else configs[::-1])]
    for name, protocol, state in order:
        topo = bn.Topology("state-bench")
        numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=records,
                                                              rate=args.run_rate))
        numbers.key_by(lambda i: i if i < keys else i % hot).reduce(
            "sum", lambda acc, i: acc + 1, initial=0, parallelism=1).filter(
            "none", lambda kv: False).sink("out", bn.sinks.Discard())
        # a full snapshot of 16 M keys is one ~1-s encode holding the GIL, past the
        # default 1-s heartbeat: its worker would be taken for dead
        result = bn.run(topo, protocol, storage=storage, state=state,
                        recovery=bn.Recovery(heartbeat_timeout_s=args.heartbeat_timeout_s))
        rate = result.metrics.source_records / result.metrics.duration_s
        rates.setdefault(name, []).append(rate)
        events = [e for e in result.details["events"] if e["kind"] == "checkpoint_completed"]
        sizes = [e["state_bytes"] for e in events][1:]
        durations = [e["duration_s"] for e in events if e.get("duration_s") is not None]
        all_durations.setdefault(name, []).extend(durations)
        figures = ""
        if sizes:
            figures = (f", {result.metrics.extra['forked_encodes']} encoded in a child"
                       f", {len(sizes)} checkpoints after the first: "
                       f"{statistics.mean(sizes) / 1e6:.3f} MB each on average, duration "
                       f"mean {statistics.mean(durations):.3f} s, median "
                       f"{statistics.median(durations):.3f} s, largest "
                       f"{max(durations):.3f} s")
        cpu = result.metrics.cpu_s / result.metrics.source_records * 1e9
        cpus.setdefault(name, []).append(cpu)
        print(f"(b) {label} {name:>18}: {rate:,.0f} records/s, CPU {cpu:.0f} ns/record"
              f"{figures}", flush=True)
    # beside the best of each, the median of each repeat's own ratio (the runs next
    # to each other)
    baseline = rates["no checkpoints"]
    paired = {name: statistics.median(a / b for a, b in zip(r, baseline))
              for name, r in rates.items()}
    print(f"(b) {label}, best of {args.run_repeats}: " + ", ".join(
        f"{name} {max(r):,.0f} records/s ({max(r) / max(baseline):.2f}x, paired median "
        f"{paired[name]:.2f}x; CPU a record "
        f"{statistics.median(a / b for a, b in zip(cpus[name], cpus['no checkpoints'])):.2f}x"
        f" paired median)" for name, r in rates.items()), flush=True)
    return ({name: statistics.median(d) for name, d in all_durations.items() if d},
            paired)


@contextlib.contextmanager
def s3_storage() -> object:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from storage import moto_server  # benchmarks/storage.py

    with moto_server() as endpoint:
        yield f"s3://state-bench/jobs?endpoint={endpoint}&secure=false"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, nargs="+", default=list(KEY_COUNTS))
    parser.add_argument("--hot", type=int, default=1_000)
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--max-chain", type=int, default=State().max_chain)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--s3", action="store_true", help="(b) on moto's S3 server too")
    parser.add_argument("--run-keys", type=int, default=4_000_000)
    parser.add_argument("--run-records", type=int, default=None,
                        help="records a run reads (default: --run-keys cold ones, then "
                             "45 M on the hot keys: about a dozen checkpoints)")
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--run-rate", type=float, default=None,
                        help="(b)'s source rate in records/s (default: unpaced)")
    parser.add_argument("--heartbeat-timeout-s", type=float, default=5.0)
    parser.add_argument("--run-repeats", type=int, default=2)
    parser.add_argument("--run-configs", default=",".join(RUN_CONFIGS),
                        help="(b)'s configurations, comma-separated, of: "
                             + ", ".join(RUN_CONFIGS) + " (no checkpoints always runs)")
    args = parser.parse_args()
    if args.s3:
        # moto takes any credentials; set before Ray starts, so its workers have them
        os.environ.setdefault("BASTION_S3_ACCESS_KEY", "bench")
        os.environ.setdefault("BASTION_S3_SECRET_KEY", "bench-secret")
    args.run_configs = args.run_configs.split(",")
    unknown = set(args.run_configs) - set(RUN_CONFIGS)
    if unknown:
        parser.error(f"--run-configs: unknown {', '.join(sorted(unknown))}")
    if args.run_records is None:
        args.run_records = args.run_keys + 45_000_000
    figures = codec_figures(args)
    tracking_figure(args)
    durations: dict[str, float] = {}
    paired: dict[str, float] = {}
    if args.run:
        with tempfile.TemporaryDirectory() as directory:
            durations, paired = run_figures(args, f"local://{directory}", "local")
        if args.s3:
            with s3_storage() as url:
                run_figures(args, url, "s3/moto")
    headline = figures.get((4_000_000, "hot")) or figures[max(args.keys), "hot"]
    keys = 4_000_000 if (4_000_000, "hot") in figures else max(args.keys)
    print(f"headline: {keys:,} keys, {args.hot:,} hot: incremental writes "
          f"{headline['per_checkpoint']:.2%} of a full snapshot's bytes per checkpoint, "
          f"bases included (target <= 2%); restoring the longest chain "
          f"(1 base + {headline['deltas']} deltas) takes "
          f"{headline['restore_chain_s'] / headline['restore_full_s']:.2f}x a full "
          f"snapshot's restore (target <= 1.5x)"
          + ("" if "incr. forked" not in durations else
             f"; the default's checkpoints at {args.run_keys:,} keys took a median "
             f"{durations['incr. forked']:.3f} s, local storage (target <= 0.1 s at 4 M), "
             f"and it kept {paired['incr. forked']:.2f}x the throughput of the job "
             f"without checkpoints (median of {args.run_repeats} paired "
             f"run{'s' if args.run_repeats > 1 else ''}; target "
             f">= 0.9x at 16 M)"))


if __name__ == "__main__":
    main()
