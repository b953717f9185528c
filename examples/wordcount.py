"""Word count: the "hello world" of stream processing.

Lines arrive at 600 a second (about 5 s for the 3,000 lines, long enough to kill a
process mid-run); two instances of ``split`` cut them into words; ``key_by`` routes
every occurrence of a word to the same ``count`` instance (by a stable hash), which
keeps a running count per word and emits ``(word, count)`` after every occurrence.

    bastion run examples/wordcount.py
    bastion drill examples/wordcount.py --protocol coordinated --kill count:0@2.5
"""

import bastion as bn

TEXT = """
It was the best of times, it was the worst of times, it was the age of wisdom,
it was the age of foolishness, it was the epoch of belief, it was the epoch of
incredulity, it was the season of Light, it was the season of Darkness, it was the
spring of hope, it was the winter of despair, we had everything before us, we had
nothing before us, we were all going direct to Heaven, we were all going direct the
other way
"""

LINES = [line.strip() for line in TEXT.strip().splitlines()]
REPEAT = 500
RATE = 600  # lines per second


def line_at(i: int) -> str:
    # deterministic in i: a replay after a failure reads the same line again
    return LINES[i % len(LINES)]


def words_of(line: str) -> list[str]:
    return [w.strip(",.").lower() for w in line.split()]


topology = bn.Topology("wordcount")
lines = topology.source("lines", bn.sources.Generator(line_at, count=len(LINES) * REPEAT,
                                                       rate=RATE), parallelism=1)
words = lines.flat_map("split", words_of, parallelism=2)
counts = words.key_by(lambda w: w).reduce("count", lambda acc, w: acc + 1, initial=0,
                                           parallelism=2)
counts.sink("out", bn.sinks.Collect())
topology.query("word-counts", outputs=["out"], priority=1)

if __name__ == "__main__":
    result = bn.run(topology)
    final: dict[str, int] = {}
    for word, count in result.outputs["out"]:
        final[word] = max(final.get(word, 0), count)
    for word, count in sorted(final.items(), key=lambda kv: -kv[1])[:10]:
        print(f"{word:>12} {count}")
    print(f"{result.metrics.tuples_per_s:,.0f} lines/s, "
          f"p99 latency {result.metrics.latency_ms['p99']:.1f} ms")
