"""The resiliency manager: how much redundancy a job runs with, period by period.

**Why redundancy helps.** A *timing fault* — a worker stalled by a GC pause, a
contended core, a slow link — does not lose a tuple, it delays it, and one delayed
tuple is enough to push the tail of the latency distribution (p90, p99) past a
deadline. Sending a share of the tuples to more than one worker instance and taking
whichever copy finishes first hides such a delay as long as one copy misses the
slow worker. The *redundancy ratio* is that share: 0.0 sends every tuple once, 1.0
sends every tuple twice, 2.0 three times (the runtime supports at most two extra
copies).

**Why not always run the maximum.** Every copy costs CPU and network (the thesis
measures about 40% more computation and 100% more communication for static
redundancy), and past some point the extra load itself queues tuples and *raises*
latency. Tail latency against redundancy is thus concave upward: faults lift the
curve, the input rate shifts it sideways, and the fault rate changes from minute
to minute. A static ratio is either wasted in calm periods or too low in bad ones, so
a controller that follows the workload pays off (the thesis reports 98% fewer
windows over the bound than no redundancy, at 0.13x-0.31x the overhead of a static
ratio).

**What the controller does.** Every period it compares a windowed latency percentile
with the user's bound, ``Δl = latency - bound``, and takes one additive step:

- *over the bound* (``Δl >= 0``): it hill-climbs towards lower latency. The first
  period over the bound it adds redundancy; after that it keeps the direction of the
  last step while that step brought the latency closer to the bound, and reverses it
  when it did not. On the left of the curve this climbs to the point where the curve
  crosses the bound; when the whole curve is over the bound it ends up circling the
  curve's minimum, the best the degraded system can do;
- *under the bound by more than the margin* (``-Δl > perf_margin * bound``): it
  removes redundancy, so it walks down to the *leftmost* ratio that still meets the
  bound — the cheapest one;
- *under the bound but within the margin*: it holds. The margin is a dead band that
  keeps a little slack against noise, and it is what lets the search settle instead
  of stepping across the bound forever.

A step is proportional to how far the latency is from the bound
(``|Δl| / bound * gain``) but never smaller than ``step_min``, so that every move
makes a change the next measurement can see.

This is Algorithm 2 (DynamoRedundancySearch) of G. P. C. Tran, *Data and Computation
Redundancy in Stream Processing Applications for Improved Fault Resiliency and
Real-Time Performance*, PhD thesis, USC, 2020, §4.2. The pseudo-code there is garbled
in places; where this module reads it rather than copies it, a comment says which
line and why.

The controllers here are pure: no clock, no I/O, no Ray. The caller measures the
percentile over its window (``policy.percentile``) and calls ``decide`` once every
``policy.period_s`` with its own clock; the decision carries the new ratio and a
sentence for the job's events.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from numbers import Real

INCREASE = "increase"
DECREASE = "decrease"
HOLD = "hold"
_ING = {INCREASE: "increasing", DECREASE: "decreasing"}


def _check(name: str, value: object, *, low: float, high: float = math.inf,
           low_open: bool = False, high_open: bool = False) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is a finite real number in
    the given range. Booleans are refused: ``True`` would pass as 1.0 and hide a bug."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < low or (low_open and value == low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value!r}")
    if value > high or (high_open and value == high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high:g}, got {value!r}")


def _ms(value: float) -> str:
    """A latency for a sentence: ``412``, ``12.5``."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _r(value: float) -> str:
    return f"{value:.2f}"


@dataclass(frozen=True)
class ResiliencyPolicy:
    """The user's goal and the controller's tuning (names after Algorithm 2).

    ``latency_bound_ms``: the bound the ``percentile``-th windowed latency should stay
    under. ``period_s``: how often the caller decides (the controller itself has no
    clock). ``step_min`` (δmin): the smallest change of ratio per step.
    ``gain_increase``/``gain_decrease`` (δi/δd): ratio per unit of ``|Δl| / bound``.
    ``perf_margin``: the dead band under the bound, as a share of the bound.
    ``max_ratio``: the ceiling of the ratio; ``initial_ratio``: where it starts.

    The defaults are the thesis's settings (§4.2.1: δmin = 10%, δi = δd = 5, p90),
    whose redundancy is in percent: δi = 5 is 5 percentage points per bound of excess
    latency, 0.05 in the ratio this policy counts in (1.0 = every tuple copied once).
    """

    latency_bound_ms: float
    percentile: float = 90.0
    period_s: float = 1.0
    step_min: float = 0.1
    gain_increase: float = 0.05
    gain_decrease: float = 0.05
    perf_margin: float = 0.1
    max_ratio: float = 2.0
    initial_ratio: float = 0.0

    def __post_init__(self) -> None:
        _check("latency_bound_ms", self.latency_bound_ms, low=0.0, low_open=True)
        _check("percentile", self.percentile, low=0.0, high=100.0, low_open=True)
        _check("period_s", self.period_s, low=0.0, low_open=True)
        # A zero minimum step would let the search stall on a step too small to show up
        # in the next measurement — exactly what δmin is there to prevent.
        _check("step_min", self.step_min, low=0.0, low_open=True)
        _check("gain_increase", self.gain_increase, low=0.0)
        _check("gain_decrease", self.gain_decrease, low=0.0)
        # A margin of the whole bound would forbid every decrease.
        _check("perf_margin", self.perf_margin, low=0.0, high=1.0, high_open=True)
        _check("max_ratio", self.max_ratio, low=0.0, low_open=True)
        _check("initial_ratio", self.initial_ratio, low=0.0, high=self.max_ratio)


@dataclass(frozen=True)
class RedundancyDecision:
    """One period's decision: what the controller saw and what it set.

    ``movement`` is what happened to the ratio: ``"increase"``, ``"decrease"``, or
    ``"hold"`` when it did not change (including a step stopped by the floor or
    ceiling). ``reason`` is one sentence for a human reading the job's events."""

    at_s: float
    latency_ms: float | None
    ratio_before: float
    ratio: float
    movement: str
    reason: str


class RedundancyController(ABC):
    """Decides the redundancy ratio, once per period, from the windowed latency.

    A pluggable policy: the runtime holds one and asks it each period; what it does
    with the answer (how many copies of which tuples) is the runtime's business."""

    @property
    @abstractmethod
    def ratio(self) -> float:
        """The current redundancy ratio (0.0 = no extra copies)."""

    @abstractmethod
    def decide(self, at_s: float, latency_ms: float | None) -> RedundancyDecision:
        """The decision for the period ending at ``at_s`` (the caller's clock), given
        that period's windowed latency percentile, or None when there was none."""


class StaticRedundancy(RedundancyController):
    """A fixed ratio: always holds. The baseline the thesis compares against (a static
    ratio sized for the worst faults), and a job's setting without a latency bound."""

    def __init__(self, ratio: float):
        _check("ratio", ratio, low=0.0)
        self._ratio = float(ratio)
        self.decisions: list[RedundancyDecision] = []

    @property
    def ratio(self) -> float:
        return self._ratio

    def decide(self, at_s: float, latency_ms: float | None) -> RedundancyDecision:
        decision = RedundancyDecision(at_s, latency_ms, self._ratio, self._ratio, HOLD,
                                      f"static redundancy: hold at {_r(self._ratio)}")
        self.decisions.append(decision)
        return decision


class ResiliencyManager(RedundancyController):
    """The Dynamo resiliency manager (thesis §4.2, Algorithm 2): searches for the
    least redundancy that keeps the latency percentile under the bound, or for the
    least latency when no redundancy can. See the module docstring."""

    def __init__(self, policy: ResiliencyPolicy):
        self.policy = policy
        self._ratio = float(policy.initial_ratio)
        # Algorithm 2, line 2: the search starts by adding redundancy.
        self._direction = INCREASE
        # Line 1 leaves Δl_old's initial value open; None ("never measured") makes the
        # first measured period count as changed and, if over the bound, as the first
        # period over it.
        self._delta_old: float | None = None
        self.decisions: list[RedundancyDecision] = []

    @property
    def ratio(self) -> float:
        return self._ratio

    def decide(self, at_s: float, latency_ms: float | None) -> RedundancyDecision:
        """Take one period's step (see the module docstring) and record it in
        ``decisions``. ``latency_ms`` None (or NaN, what an empty window's percentile
        often comes out as) means no tuple came out in the window: the controller
        holds and forgets nothing — an empty window says nothing about whether the
        last step helped, and stepping blind could undo a good ratio."""
        missing = latency_ms is None or (isinstance(latency_ms, float) and math.isnan(latency_ms))
        if not missing:
            _check("latency_ms", latency_ms, low=0.0)
        before = self._ratio
        if missing:
            return self._record(at_s, None, before, HOLD,
                                f"no p{self.policy.percentile:g} latency this period "
                                f"(no output in the window): hold at {_r(before)}")
        direction, why = self._choose(latency_ms)
        # Line 18: Δl_old is updated every measured period, whichever branch ran.
        self._delta_old = latency_ms - self.policy.latency_bound_ms
        if direction == HOLD:
            return self._record(at_s, latency_ms, before, HOLD, f"{why}: hold at {_r(before)}")
        self._direction = direction
        self._ratio = self._stepped(latency_ms, direction)
        if self._ratio == before:
            edge = "floor" if direction == DECREASE else "ceiling"
            return self._record(at_s, latency_ms, before, HOLD,
                                f"{why}, but {_r(before)} is already the {edge}: hold")
        return self._record(at_s, latency_ms, before, direction,
                            f"{why} ({_r(before)} -> {_r(self._ratio)})")

    # ------------------------------------------------------------------ the rule

    def _choose(self, latency_ms: float) -> tuple[str, str]:
        """Algorithm 2, lines 4-17: the direction of this period's step (or HOLD) and
        the reason, up to the step's numbers."""
        p = self.policy
        delta = latency_ms - p.latency_bound_ms
        old = self._delta_old
        seen = f"p{p.percentile:g} {_ms(latency_ms)} ms"
        bound = f"the {_ms(p.latency_bound_ms)} ms bound"
        if delta < 0:
            if -delta <= p.perf_margin * p.latency_bound_ms:
                # Line 6 reads "abs(Δl) < perfMargin·latencyBound → decrease", the
                # opposite of the prose ("below the bound, but less than that
                # percentage, then [it] will not reduce the redundancy"). The prose is
                # the intent — a safety margin — so inside the margin we hold. The
                # pseudo-code would instead step on in the last direction, which could
                # add redundancy while meeting the bound.
                return HOLD, f"{seen} under {bound}, within the {p.perf_margin:.0%} margin"
            if old is not None and delta == old:
                # Line 6's "Δl != Δl_old": an identical reading is no new evidence, so
                # the direction is not re-decided and the step continues in the last
                # one (lines 19-22 run regardless). The last direction is a decrease:
                # the period that first measured this Δl was changed, so it set one.
                return self._direction, (f"{seen} under {bound} by more than the margin, "
                                        f"unchanged: keep {_ING[self._direction]}")
            return DECREASE, (f"{seen} under {bound} by more than the {p.perf_margin:.0%} "
                              "margin: decrease")
        # Line 5: Δl = 0 takes the "else" branch — a latency at the bound does not meet it.
        over = f"{seen} over {bound}"
        if old is None or old < 0:
            return INCREASE, f"{over}, the first period over it: increase"
        if self._ratio == (p.max_ratio if self._direction == INCREASE else 0.0):
            # Not in the thesis, which has no ceiling: a step into the floor or ceiling
            # changes nothing, so the latency stays the same, line 9 never re-decides
            # the direction, and the search would push against the edge for ever even
            # when the curve's minimum lies elsewhere. Such a step did not help.
            direction = self._direction_over_bound(False)
            edge = "ceiling" if self._direction == INCREASE else "floor"
            if direction == self._direction:
                return direction, f"{over} and the ratio is at its {edge}: keep {_ING[direction]}"
            return direction, f"{over} and the ratio is at its {edge}: reverse, {direction}"
        if delta == old:
            # Line 9: only adapt if the latency changed; the step still follows the
            # last direction (line 13's no-op), as the pseudo-code falls through to it.
            return self._direction, f"{over}, unchanged: keep {_ING[self._direction]}"
        # Line 12 compares "abs(currentDiff) > abs(Δl)": currentDiff is not defined
        # anywhere; the comment ("last movement moved latency towards bound") makes it
        # the previous period's difference, Δl_old.
        helped = abs(old) > abs(delta)
        direction = self._direction_over_bound(helped)
        verdict = "the last step helped" if helped else "the last step did not help"
        if direction == self._direction:
            return direction, f"{over}; {verdict}: keep {_ING[direction]}"
        return direction, f"{over}; {verdict}: reverse, {direction}"

    def _direction_over_bound(self, helped: bool) -> str:
        """Lines 12-15: keep the direction of a step that brought the latency closer to
        the bound, reverse one that did not. (The hook a test overrides to show that a
        broken rule fails the convergence check.)"""
        if helped:
            return self._direction
        return DECREASE if self._direction == INCREASE else INCREASE

    def _stepped(self, latency_ms: float, direction: str) -> float:
        """Lines 19-22: the ratio after one step in ``direction``, within
        [0, ``max_ratio``]."""
        p = self.policy
        # Lines 20 and 22 write "Δl / latencyBound · δ": under the bound Δl is negative,
        # so taken literally every decrease would be δmin, however far under the bound,
        # and the prose asks for steps proportional to the difference. We use |Δl|, so
        # a step is never negative and always at least δmin.
        distance = abs(latency_ms - p.latency_bound_ms) / p.latency_bound_ms
        if direction == INCREASE:
            # The thesis has no ceiling; ours is what the runtime can carry out.
            return min(p.max_ratio, self._ratio + max(p.step_min, distance * p.gain_increase))
        return max(0.0, self._ratio - max(p.step_min, distance * p.gain_decrease))

    def _record(self, at_s: float, latency_ms: float | None, before: float, movement: str,
                reason: str) -> RedundancyDecision:
        decision = RedundancyDecision(at_s, latency_ms, before, self._ratio, movement, reason)
        self.decisions.append(decision)
        return decision
