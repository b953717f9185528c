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

**Departures for noisy windows.** The thesis ran 33 instances per operator, whose
windowed p90 moves smoothly with the ratio. A job of a few instances has a p90 that
is nearly two-valued — near the failure-free latency when the copies hide the stalls,
several times the bound when they do not — and noisy from window to window. Read
literally, Algorithm 2 then (a) steps down every period under the bound, which in a
fault episode crosses the bound again every few periods, each crossing a violated
window; (b) reverses on any reading a little worse than the last, noise included;
(c) at the ceiling, reverses as soon as one window after a jump is still over the
bound, although it is falling (tuples a stall held back drain into it). So:

- the latency the copies **hide** tells calm from hidden faults: the receivers that
  drop late copies measure those copies' latency (what their tuples would have
  taken without the first copy), and the manager reads its ``hidden_percentile``
  (p90, the percentile it controls) per window. Under the bound with the hidden
  latency under it too, taking the copies away would not break the bound, and the
  manager takes Algorithm 2's full step down; with the hidden latency over the
  bound, the copies are what keeps it, and the manager only *probes*: a step of
  δmin every ``probe_periods`` periods. A probe that brings the p90 over the bound
  doubles the wait for the next one (up to ``max_probe_periods``); a calm window
  resets it. The thesis allows any runtime metric as the feedback (§4.2); this is
  one more of the same window;
- readings within ``noise_share`` of the bound count as unchanged (lines 6, 9, 12
  compare exactly; the default 0 keeps that);
- at the ceiling (which the thesis does not have) a latency that is falling by more
  than the noise holds the ratio instead of reversing;
- a step down while over the bound is δmin, not proportional to the excess (line 22
  would take a step of the excess, all the copies at once, while the bound is
  broken).

**Departures for small jobs: onsets and how much is enough.** With a window's p90 as
its only input, the manager learns of a fault a window after it began — the tuples
a stall holds back reach the sinks when it ends — and that window is already over
the bound; and while copies hide the faults, the latency says nothing about how many
copies are enough, so it can only probe down and break the bound to find out. Two
more inputs, each optional:

- a *stall in progress*: the job master sees, at every progress poll (0.1 s), how
  long each task of a copied operator has been on its current frame; longer than
  the bound is a fault whose tuples will be late. `on_stall` then raises the ratio
  at once to ``stall_ratio`` per stalled task (1.0: every tuple has a copy on
  another instance, so one stalled instance is hidden; two stalled need two
  copies), without waiting for the period to end;
- the *exposure* of a window (`Exposure`): the share of delivered tuples over the
  bound, and of the late copies over it. If each copy of a tuple is late
  independently with probability ``s`` (its instance stalled), a tuple with ``k``
  copies is late with probability ``s^k``; the late copy of a copied pair is over
  the bound when either copy is (``1-(1-s)^2``). Those invert to ``s``
  (`estimate_exposure`), and ``s`` gives the least ratio whose share of late tuples
  stays under ``exposure_share`` of what the percentile allows (`required_ratio`:
  5% for p90 at the default 0.5). The largest of the last ``exposure_periods``
  requirements is a floor: under the bound the manager goes down to it at once
  instead of probing or walking down a step a period, and never below it.

The controllers here are pure: no clock, no I/O, no Ray. The caller measures the
percentiles over its window (``policy.percentile`` of the delivered tuples,
``policy.hidden_percentile`` of the late copies) and calls ``decide`` once every
``policy.period_s`` with its own clock; the decision carries the new ratio and a
sentence for the job's events.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass
from numbers import Real
from typing import cast

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
    # a Real compares as a float does; typeshed's numbers.Real declares only < and <=
    value = cast(float, value)
    if value < low or (low_open and value == low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value!r}")
    if value > high or (high_open and value == high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high:g}, got {value!r}")


def _ms(value: float) -> str:
    """A latency for a sentence: ``412``, ``12.5``."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _r(value: float) -> str:
    return f"{value:.2f}"


def _missing(value: float | None) -> bool:
    """None, or NaN: what an empty window's percentile often comes out as."""
    return value is None or (isinstance(value, float) and math.isnan(value))


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

    Three settings are not the thesis's (see "Departures" in the module docstring):
    ``noise_share``, the share of the bound by which two readings must differ to count
    as a change (lines 6, 9 and 12 compare exactly); ``hidden_percentile``, the
    percentile of the latency of the copies dropped as late in the same window — the
    latency the copies hid — that tells a calm period (under the bound) from faults
    the copies hide (over it; None: not used); and
    ``probe_periods``/``max_probe_periods``, how many periods apart the manager
    probes for less redundancy while faults are hidden, doubling after a probe that
    crossed the bound.

    And the two inputs for onsets and enough copies (module docstring):
    ``exposure_share``, the share of the tuples the percentile lets over the bound
    (10% for p90) that the exposure floor aims at (None: no floor);
    ``exposure_periods``, how many periods' requirements the floor is the largest
    of; ``min_exposure_samples``, the fewest tuples a window's share is read from;
    ``stall_ratio``, the ratio a stall in progress raises it to at once (None: not
    at once).
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
    noise_share: float = 0.0
    hidden_percentile: float | None = 90.0
    probe_periods: int = 4
    max_probe_periods: int = 32
    exposure_share: float | None = 0.5
    exposure_periods: int = 3
    min_exposure_samples: int = 20
    stall_ratio: float | None = 1.0

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
        # A tolerance of the whole bound would call every reading "unchanged".
        _check("noise_share", self.noise_share, low=0.0, high=1.0, high_open=True)
        if self.hidden_percentile is not None:
            _check("hidden_percentile", self.hidden_percentile, low=0.0, high=100.0,
                   low_open=True)
        if self.exposure_share is not None:
            _check("exposure_share", self.exposure_share, low=0.0, high=1.0, low_open=True)
        if self.stall_ratio is not None:
            _check("stall_ratio", self.stall_ratio, low=0.0, low_open=True)
        for name in ("probe_periods", "max_probe_periods", "exposure_periods",
                     "min_exposure_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_probe_periods < self.probe_periods:
            raise ValueError(f"max_probe_periods must be >= probe_periods "
                             f"({self.probe_periods}), got {self.max_probe_periods!r}")


@dataclass(frozen=True)
class Exposure:
    """One period's evidence of how often a fault delays a tuple past the bound:
    ``over_share`` of the ``samples`` tuples delivered, and ``late_over_share`` of
    the ``late_samples`` copies dropped as late (None: none dropped)."""

    over_share: float
    samples: int
    late_over_share: float | None = None
    late_samples: int = 0


def delayed_share(ratio: float, exposure: float) -> float:
    """The share of tuples late at ``ratio`` when every copy is late with
    probability ``exposure``, independently: a tuple is late only when all its
    copies are. A ratio ``n + f`` gives ``n`` extra copies to every tuple and one
    more to a share ``f`` of them."""
    extra = min(math.floor(ratio), 2)
    more = min(ratio - extra, 1.0)
    return (1 - more) * exposure ** (extra + 1) + more * exposure ** (extra + 2)


def estimate_exposure(ratio: float, window: Exposure, min_samples: int) -> float | None:
    """The probability ``s`` that one copy is late, read from a window (the larger
    of two readings, each from at least ``min_samples`` tuples): the delivered
    tuples' share over the bound is `delayed_share` at the ratio they ran at,
    inverted; a late copy of a pair is over the bound when either copy is, so its
    share is ``1-(1-s)^2``. None when neither has enough tuples."""
    readings = []
    if window.samples >= min_samples:
        low, high = 0.0, 1.0
        for _ in range(40):   # delayed_share rises with s: bisect
            mid = (low + high) / 2
            low, high = (mid, high) if delayed_share(ratio, mid) < window.over_share \
                else (low, mid)
        readings.append(high if window.over_share > 0 else 0.0)
    if window.late_over_share is not None and window.late_samples >= min_samples:
        readings.append(1 - math.sqrt(max(0.0, 1 - window.late_over_share)))
    return max(readings) if readings else None


def required_ratio(exposure: float, late_share: float, max_ratio: float) -> float:
    """The least ratio (in hundredths) whose `delayed_share` is at most
    ``late_share``; ``max_ratio`` when none up to it is."""
    for hundredths in range(int(round(max_ratio * 100)) + 1):
        if delayed_share(hundredths / 100, exposure) <= late_share:
            return hundredths / 100
    return max_ratio


@dataclass(frozen=True)
class RedundancyDecision:
    """One period's decision: what the controller saw and what it set.

    ``movement`` is what happened to the ratio: ``"increase"``, ``"decrease"``, or
    ``"hold"`` when it did not change (including a step stopped by the floor or
    ceiling). ``reason`` is one sentence for a human reading the job's events.
    ``hidden_ms``: the late copies' latency percentile the controller was given."""

    at_s: float
    latency_ms: float | None
    ratio_before: float
    ratio: float
    movement: str
    reason: str
    hidden_ms: float | None = None


class RedundancyController(ABC):
    """Decides the redundancy ratio, once per period, from the windowed latency.

    A pluggable policy: the runtime holds one and asks it each period; what it does
    with the answer (how many copies of which tuples) is the runtime's business."""

    @property
    @abstractmethod
    def ratio(self) -> float:
        """The current redundancy ratio (0.0 = no extra copies)."""

    @abstractmethod
    def decide(self, at_s: float, latency_ms: float | None,
               hidden_ms: float | None = None, exposure: Exposure | None = None
               ) -> RedundancyDecision:
        """The decision for the period ending at ``at_s`` (the caller's clock), given
        that period's windowed latency percentile, or None when there was none, and
        optionally the same window's percentile of the late copies' latency and its
        `Exposure`."""

    def on_stall(self, at_s: float, busy_ms: float, stalled: int = 1
                 ) -> RedundancyDecision | None:
        """``stalled`` tasks of a copied operator have been on one frame for up to
        ``busy_ms``, over the bound: a decision taken at once, or None (the default:
        wait for the period)."""
        return None


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

    def decide(self, at_s: float, latency_ms: float | None,
               hidden_ms: float | None = None, exposure: Exposure | None = None
               ) -> RedundancyDecision:
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
        # Probing while copies hide faults (not in the thesis, see the module
        # docstring): periods between probes, periods left until the next one, and
        # whether the last step was a probe.
        self._probe_interval = policy.probe_periods
        self._probe_in = policy.probe_periods
        self._probed = False
        self._hidden_ms: float | None = None   # this period's, for its decision record
        # the ratios the last periods' exposures required; the floor is their largest
        self._required: deque[float] = deque(maxlen=policy.exposure_periods)
        self.decisions: list[RedundancyDecision] = []

    @property
    def ratio(self) -> float:
        return self._ratio

    @property
    def floor(self) -> float:
        """The least ratio the recent exposures require (0.0: none measured)."""
        return max(self._required, default=0.0)

    def on_stall(self, at_s: float, busy_ms: float, stalled: int = 1
                 ) -> RedundancyDecision | None:
        """Raise the ratio at once to ``stall_ratio`` per stalled task — each one a
        copy more to route around it — (or the floor, if higher) when it is lower:
        the tuples behind the stall are late already, those routed from now on get
        copies on other instances. None when it is high enough already."""
        p = self.policy
        if p.stall_ratio is None:
            return None
        target = max(self.floor, min(p.stall_ratio * max(1, stalled), p.max_ratio))
        before = self._ratio
        if before >= target:
            return None
        self._ratio, self._direction = target, INCREASE
        self._hidden_ms = None
        return self._record(at_s, None, before, INCREASE,
                            f"{stalled if stalled > 1 else 'a'} copied task"
                            f"{'s' if stalled > 1 else ''} on one frame for up to "
                            f"{_ms(busy_ms)} ms, over the "
                            f"{_ms(p.latency_bound_ms)} ms bound (a fault in progress): "
                            f"increase at once ({_r(before)} -> {_r(target)})")

    def decide(self, at_s: float, latency_ms: float | None,
               hidden_ms: float | None = None, exposure: Exposure | None = None
               ) -> RedundancyDecision:
        """Take one period's step (see the module docstring) and record it in
        ``decisions``. ``latency_ms`` None (or NaN, what an empty window's percentile
        often comes out as) means no tuple came out in the window: the controller
        holds and forgets nothing — an empty window says nothing about whether the
        last step helped, and stepping blind could undo a good ratio. ``hidden_ms``:
        the same window's ``policy.hidden_percentile`` of the latency of the copies
        dropped as late (None: no late copies, or not measured; the manager then
        decreases as Algorithm 2 does). ``exposure``: the window's evidence for the
        floor (None: no floor)."""
        missing = _missing(latency_ms)
        if not missing:
            _check("latency_ms", latency_ms, low=0.0)
        if _missing(hidden_ms) or self.policy.hidden_percentile is None:
            hidden_ms = None   # nothing known hidden: Algorithm 2's decreases
        else:
            _check("hidden_ms", hidden_ms, low=0.0)
        self._hidden_ms = hidden_ms
        before = self._ratio
        p = self.policy
        if exposure is not None and p.exposure_share is not None:
            s_late = estimate_exposure(before, exposure, p.min_exposure_samples)
            if s_late is not None:
                self._required.append(required_ratio(
                    s_late, p.exposure_share * (100 - p.percentile) / 100, p.max_ratio))
        if missing:
            return self._record(at_s, None, before, HOLD,
                                f"no p{self.policy.percentile:g} latency this period "
                                f"(no output in the window): hold at {_r(before)}")
        assert latency_ms is not None  # not `_missing`, or we returned above
        direction, why, probe = self._choose(latency_ms, hidden_ms)
        # Line 18: Δl_old is updated every measured period, whichever branch ran.
        self._delta_old = latency_ms - self.policy.latency_bound_ms
        self._probed = probe
        floor = self.floor
        if direction == HOLD and before >= floor:
            return self._record(at_s, latency_ms, before, HOLD, f"{why}: hold at {_r(before)}")
        if direction == DECREASE and self._required and latency_ms < p.latency_bound_ms:
            # under the bound, the exposure says how many copies are enough: go there
            # instead of walking down to it a step a period
            self._direction = direction
            self._ratio = min(before, floor)
        elif direction != HOLD:
            self._direction = direction
            self._ratio = self._stepped(latency_ms, direction, probe)
        if self._ratio < floor:
            self._ratio = floor
            why = f"{why}; the exposure floor is {_r(floor)}"
            if self._ratio > before:
                self._direction = INCREASE
                return self._record(at_s, latency_ms, before, INCREASE,
                                    f"{why} ({_r(before)} -> {_r(self._ratio)})")
        if self._ratio == before:
            edge = "floor" if direction == DECREASE else "ceiling"
            return self._record(at_s, latency_ms, before, HOLD,
                                f"{why}, but {_r(before)} is already the {edge}: hold")
        return self._record(at_s, latency_ms, before, direction,
                            f"{why} ({_r(before)} -> {_r(self._ratio)})")

    # ------------------------------------------------------------------ the rule

    def _choose(self, latency_ms: float, hidden_ms: float | None) -> tuple[str, str, bool]:
        """Algorithm 2, lines 4-17: the direction of this period's step (or HOLD), the
        reason, up to the step's numbers, and whether the step is a probe (δmin)."""
        p = self.policy
        delta = latency_ms - p.latency_bound_ms
        old = self._delta_old
        seen = f"p{p.percentile:g} {_ms(latency_ms)} ms"
        bound = f"the {_ms(p.latency_bound_ms)} ms bound"
        # Lines 6, 9 and 12 compare readings exactly; measured latencies always differ
        # a little, so a difference within the noise counts as none.
        noise_ms = p.noise_share * p.latency_bound_ms
        if delta < 0:
            if -delta <= p.perf_margin * p.latency_bound_ms:
                # Line 6 reads "abs(Δl) < perfMargin·latencyBound → decrease", the
                # opposite of the prose ("below the bound, but less than that
                # percentage, then [it] will not reduce the redundancy"). The prose is
                # the intent — a safety margin — so inside the margin we hold. The
                # pseudo-code would instead step on in the last direction, which could
                # add redundancy while meeting the bound.
                return HOLD, f"{seen} under {bound}, within the {p.perf_margin:.0%} margin", False
            if hidden_ms is not None and hidden_ms > p.latency_bound_ms:
                if self._required:
                    # the exposure says how many copies are enough: no need to probe
                    return DECREASE, (f"{seen} under {bound}, late copies' "
                                      f"p{p.hidden_percentile:g} {_ms(hidden_ms)} ms over "
                                      "it (faults hidden): decrease towards the "
                                      "exposure floor"), False
                return self._probe(seen, bound, hidden_ms)
            # calm: nothing over the bound is hidden, the full step of lines 21-22
            self._probe_interval = self._probe_in = p.probe_periods
            return DECREASE, (f"{seen} under {bound} by more than the {p.perf_margin:.0%} "
                              "margin" + ("" if hidden_ms is None else
                                          f" (late copies' p{p.hidden_percentile:g} "
                                          f"{_ms(hidden_ms)} ms too)")
                              + ": decrease"), False
        # Line 5: Δl = 0 takes the "else" branch — a latency at the bound does not meet it.
        over = f"{seen} over {bound}"
        self._probe_in = self._probe_interval
        if old is None or old < 0:
            if self._probed:
                # the probe found the least ratio that hides the faults: wait twice as
                # long before the next one
                self._probe_interval = min(2 * self._probe_interval, p.max_probe_periods)
                self._probe_in = self._probe_interval
                return INCREASE, (f"{over} after a probe: increase, next probe in "
                                  f"{self._probe_interval} periods"), False
            return INCREASE, f"{over}, the first period over it: increase", False
        changed = abs(delta - old) > noise_ms
        # Line 12 compares "abs(currentDiff) > abs(Δl)": currentDiff is not defined
        # anywhere; the comment ("last movement moved latency towards bound") makes it
        # the previous period's difference, Δl_old.
        helped = changed and abs(old) > abs(delta)
        if self._ratio == (p.max_ratio if self._direction == INCREASE else 0.0):
            # Not in the thesis, which has no ceiling: a step into the floor or ceiling
            # changes nothing, so line 9 may never re-decide the direction, and the
            # search would push against the edge for ever even when the curve's
            # minimum lies elsewhere. While the latency still falls (the tuples a
            # stall held back are still draining) it waits; otherwise it reverses.
            edge = "ceiling" if self._direction == INCREASE else "floor"
            if helped:
                return HOLD, f"{over} and falling, the ratio at its {edge}", False
            direction = self._direction_over_bound(False)
            if direction == self._direction:
                return direction, f"{over} and the ratio is at its {edge}: keep {_ING[direction]}", False
            return direction, f"{over} and the ratio is at its {edge}: reverse, {direction}", False
        if not changed:
            # Line 9: only adapt if the latency changed; the step still follows the
            # last direction (line 13's no-op), as the pseudo-code falls through to it.
            return self._direction, f"{over}, unchanged: keep {_ING[self._direction]}", False
        direction = self._direction_over_bound(helped)
        verdict = "the last step helped" if helped else "the last step did not help"
        if direction == self._direction:
            return direction, f"{over}; {verdict}: keep {_ING[direction]}", False
        return direction, f"{over}; {verdict}: reverse, {direction}", False

    def _probe(self, seen: str, bound: str, hidden_ms: float) -> tuple[str, str, bool]:
        """Under the bound while the late copies' latency is over it: copies are
        hiding faults. A step down may expose them, so it is a probe of δmin once every
        ``_probe_interval`` periods instead of a step every period."""
        p = self.policy
        hidden = (f"late copies' p{p.hidden_percentile:g} {_ms(hidden_ms)} ms over it "
                  "(faults hidden)")
        self._probe_in -= 1
        if self._probe_in > 0:
            return HOLD, (f"{seen} under {bound}, {hidden}; probe in {self._probe_in} "
                          f"period{'s' if self._probe_in > 1 else ''}"), False
        self._probe_in = self._probe_interval
        return DECREASE, f"{seen} under {bound}, {hidden}: probe", True

    def _direction_over_bound(self, helped: bool) -> str:
        """Lines 12-15: keep the direction of a step that brought the latency closer to
        the bound, reverse one that did not. (The hook a test overrides to show that a
        broken rule fails the convergence check.)"""
        if helped:
            return self._direction
        return DECREASE if self._direction == INCREASE else INCREASE

    def _stepped(self, latency_ms: float, direction: str, probe: bool = False) -> float:
        """Lines 19-22: the ratio after one step in ``direction``, within
        [0, ``max_ratio``]; a probe is δmin."""
        p = self.policy
        if probe or latency_ms >= p.latency_bound_ms:
            # A probe, or a step down while over the bound (the search reversed, or
            # goes on down the costly side of the curve): δmin. The excess says how
            # far the latency is from the bound, not how far the curve's minimum is,
            # and a step of it — 1.6 for a window five bounds over with δd = 0.34 —
            # would take every copy away while the bound is broken.
            if direction == DECREASE:
                return max(0.0, self._ratio - p.step_min)
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
        decision = RedundancyDecision(at_s, latency_ms, before, self._ratio, movement, reason,
                                      self._hidden_ms)
        self.decisions.append(decision)
        return decision
