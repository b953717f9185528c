"""Window specifications: how a keyed stream is cut into finite groups.

A window groups the records of one key so that an aggregation or a join has something
finite to work on. Time windows use *event time* — the ``ts`` each record carries from
its source — and fire when the watermark (the source's promise that no older record is
still coming) passes their end:

- ``Tumbling(size)`` covers ``[k*size, (k+1)*size)``: every record is in exactly one.
- ``Sliding(size, slide)`` starts a window every ``slide`` seconds, each ``size`` long:
  a record is in ``size / slide`` windows.
- ``Count(n)`` is not about time: it fires every ``n`` records of a key and reports the
  event time of the first and the last record in it. An incomplete count window does
  not fire at the end of a bounded stream.

Specs are plain values; `bastion.runtime.windows` assigns records to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from bastion.errors import TopologyError


def _positive(kind: str, field: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise TopologyError(f"{kind} window needs {field} > 0, got {value!r}")


@dataclass(frozen=True)
class Tumbling:
    """Event-time windows ``[k*size, (k+1)*size)``, ``size`` in seconds: each record
    is in exactly one."""

    size: float

    def __post_init__(self) -> None:
        _positive("Tumbling", "size", self.size)


@dataclass(frozen=True)
class Sliding:
    """Event-time windows ``size`` seconds long, one starting every ``slide`` seconds
    (``slide <= size``): a record is in ``size / slide`` of them."""

    size: float
    slide: float

    def __post_init__(self) -> None:
        _positive("Sliding", "size", self.size)
        _positive("Sliding", "slide", self.slide)
        if self.slide > self.size:
            raise TopologyError(
                f"Sliding window slide ({self.slide}) is larger than its size ({self.size}): "
                "records between windows would be dropped; use slide <= size"
            )


@dataclass(frozen=True)
class Count:
    """Windows of ``n`` records of a key, fired as the ``n``-th arrives."""

    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise TopologyError(f"Count window needs n >= 1 (an int), got {self.n!r}")


WindowSpec = Tumbling | Sliding | Count


__all__ = ["Count", "Sliding", "Tumbling"]
