"""State benchmark (issue 39, item 6, a first cut): bytes a checkpoint writes per task,
full snapshot against incremental, for a keyed reduce holding many keys whose input
touches a few hot ones.

Two figures:

(a) **Codec, in process** — a `KeyedFoldOp`-shaped state of ``--keys`` int keys
    (200,000) holding int sums; between checkpoints ``--updates`` records (20,000)
    land on ``--hot`` keys (1,000). Per checkpoint: the bytes of the task's full
    snapshot (the state encoded whole, as `Task.snapshot` does) against the bytes of
    the incremental link (`bastion.runtime.incremental.StateChain`: a base, then
    deltas of the changed keys; ``--max-chain`` deltas on a base), and the time each
    encode takes on the task loop. Median over ``--checkpoints`` (12) checkpoints;
    a base's bytes and time are printed apart from the deltas'.
(b) **A real run** (``--run``): the same keyed sum as a job under ``coordinated``
    (a checkpoint every ``--interval-s``, 0.5 s) on local storage, full and
    incremental, each run reading ``--run-records`` (1 M) at ``--run-rate`` records
    per second (100 k: the first ``--keys`` make the cold keys); the mean ``state_bytes`` of its
    ``checkpoint_completed`` events (every task's blob of one checkpoint) after the
    first. Slower (Ray), and shares the machine's cores.

The last line is the headline: incremental bytes per checkpoint as a share of a full
snapshot's, the issue's target being ≤ 2 % at 4 M keys.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

from bastion.runtime.durable import DurableCodec
from bastion.runtime.incremental import StateChain
from bastion.storage.checkpoints import ChainRef


class _Fold:
    """The state and change tracking of a keyed fold, without a topology."""

    changed: set | None = None

    def __init__(self, keys: int) -> None:
        self.state = {k: 0 for k in range(keys)}

    def tables(self) -> list[dict]:
        return [self.state]

    def feed(self, keys: list[int]) -> None:
        state = self.state
        for k in keys:
            state[k] += 1
        if self.changed is not None:
            self.changed.update(keys)


def codec_figure(args: argparse.Namespace) -> tuple[float, float]:
    codec = DurableCodec()
    rng = random.Random(7)
    fold = _Fold(args.keys)
    chain = StateChain([fold], args.max_chain)
    hot = rng.sample(range(args.keys), args.hot)
    full_bytes, full_s, delta_bytes, delta_s, base_bytes, base_s = [], [], [], [], [], []
    for n in range(args.checkpoints):
        fold.feed([rng.choice(hot) for _ in range(args.updates)])
        started = time.perf_counter()
        full = codec.encode({"operators": [fold.state]})
        full_s.append(time.perf_counter() - started)
        full_bytes.append(len(full))
        started = time.perf_counter()
        link = chain.link([None])
        data = codec.encode({"operators": None, "link": link.value})
        took = time.perf_counter() - started
        (base_bytes if link.kind == "base" else delta_bytes).append(len(data))
        (base_s if link.kind == "base" else delta_s).append(took)
        chain.stored(link, ChainRef("sum/0", f"k{n}", len(data), 0, link.parent))
    full_b, delta_b = statistics.median(full_bytes), statistics.median(delta_bytes)
    print(f"(a) codec: {args.keys:,} keys, {args.hot:,} hot, {args.updates:,} updates "
          f"per interval, max_chain={args.max_chain}, {args.checkpoints} checkpoints")
    print(f"    full snapshot   {full_b / 1e6:8.3f} MB  encode "
          f"{statistics.median(full_s) * 1e3:7.2f} ms")
    print(f"    incremental     base {statistics.median(base_bytes) / 1e6:8.3f} MB  encode "
          f"{statistics.median(base_s) * 1e3:7.2f} ms  ({len(base_bytes)} bases)")
    print(f"                    delta {delta_b / 1e6:7.3f} MB  encode "
          f"{statistics.median(delta_s) * 1e3:7.2f} ms  ({len(delta_bytes)} deltas)")
    per_checkpoint = (sum(base_bytes) + sum(delta_bytes)) / args.checkpoints
    print(f"    per checkpoint, bases included: {per_checkpoint / 1e6:.3f} MB "
          f"({per_checkpoint / full_b:.1%} of full)")
    return delta_b / full_b, per_checkpoint / full_b


def run_figure(args: argparse.Namespace) -> None:
    import bastion as bn

    keys, hot, records = args.keys, args.hot, args.run_records
    for state in (bn.State(), bn.State(incremental=True, max_chain=args.max_chain)):
        topo = bn.Topology("state-bench")
        numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=records,
                                                              rate=args.run_rate))
        numbers.key_by(lambda i: i if i < keys else i % hot).reduce(
            "sum", lambda acc, i: acc + 1, initial=0, parallelism=2).filter(
            "none", lambda kv: False).sink("out", bn.sinks.Collect())
        with tempfile.TemporaryDirectory() as directory:
            result = bn.run(topo, bn.protocols.Coordinated(interval_s=args.interval_s),
                            storage=f"local://{directory}", state=state)
        sizes = [e["state_bytes"] for e in result.details["events"]
                 if e["kind"] == "checkpoint_completed"][1:]
        label = "incremental" if state.incremental else "full       "
        mean = statistics.mean(sizes) / 1e6 if sizes else float("nan")
        print(f"(b) run, {label}: {len(sizes)} checkpoints after the first, "
              f"{mean:.3f} MB each on average")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--hot", type=int, default=1_000)
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--checkpoints", type=int, default=12)
    parser.add_argument("--max-chain", type=int, default=8)
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--run-records", type=int, default=1_000_000)
    parser.add_argument("--run-rate", type=float, default=100_000.0)
    parser.add_argument("--interval-s", type=float, default=0.5)
    args = parser.parse_args()
    delta_share, overall_share = codec_figure(args)
    if args.run:
        run_figure(args)
    print(f"headline: incremental checkpoint at {args.keys:,} keys / {args.hot:,} hot = "
          f"{delta_share:.2%} of a full snapshot's bytes per delta, {overall_share:.1%} "
          f"with its bases (max_chain={args.max_chain})")


if __name__ == "__main__":
    main()
