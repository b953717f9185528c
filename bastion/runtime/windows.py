"""Window assignment: which windows an event time falls in, and when they end.

Time windows are numbered: window ``k`` of ``Tumbling(size)`` covers
``[k*size, (k+1)*size)``; window ``k`` of ``Sliding(size, slide)`` covers
``[k*slide, k*slide + size)``. Operators keep their per-window state under ``k`` (an
int, so state keys are exact even when sizes are not binary fractions), fire a window
once the watermark reaches its end, and forget it afterwards.
"""

from __future__ import annotations

import math

from bastion.windows import Sliding, Tumbling


class TimeWindows:
    """Numbers, bounds and assignment for a Tumbling or Sliding spec."""

    def __init__(self, spec: Tumbling | Sliding):
        self.size = float(spec.size)
        self.slide = float(spec.slide) if isinstance(spec, Sliding) else float(spec.size)

    def start(self, k: int) -> float:
        return k * self.slide

    def end(self, k: int) -> float:
        return k * self.slide + self.size

    def assign(self, ts: float) -> range:
        """The numbers of every window containing ``ts``."""
        last = math.floor(ts / self.slide)
        if self.slide == self.size:
            return range(last, last + 1)
        first = math.floor((ts - self.size) / self.slide) + 1
        # Float rounding can put a boundary window on the wrong side; check its bounds.
        while first <= last and not (self.start(first) <= ts < self.end(first)):
            first += 1
        return range(first, last + 1)

