"""A keyed running count, a column at a time: batch functions and a C-folded Count.

The source makes a batch of records with one call (``batch_fn`` gets the numpy column
of record numbers), ``map_batches`` transforms a whole column, ``key_by_batch``
computes a column of keys, and the built-in ``Count`` folds each batch per key in C:
no Python call per record anywhere before the sink. The records themselves are the
same as the per-record version's (``lambda k: k * 7 + 3``, ``lambda x: x % 100``,
``reduce(lambda acc, _: acc + 1, initial=0)``), so lineage, drills and every
protocol see the same job.

    bastion run examples/vector_count.py
    bastion drill examples/vector_count.py --protocol coordinated --kill count:0@1.5
"""

from typing import Any

import bastion as bn

KEYS = 100
RECORDS = 200_000


def values_of(ks: Any) -> Any:
    """Record k's value, for a numpy column of k: elementwise, deterministic."""
    return ks * 7 + 3


def keys_of(values: Any) -> Any:
    return values % KEYS


topology = bn.Topology("vector-count")
numbers = topology.source("numbers", bn.sources.Generator(batch_fn=values_of,
                                                           count=RECORDS, rate=100_000))
shifted = numbers.map_batches("shift", lambda column: column - 3)
counts: bn.Stream[tuple[Any, int]] = shifted.key_by_batch(keys_of).reduce(
    "count", bn.aggregations.Count(), parallelism=2)
counts.sink("out", bn.sinks.Collect())
