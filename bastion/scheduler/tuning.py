"""Checkpoint-interval tuning for a bound on total recovery time (Chiron).

A checkpointing protocol trades two costs through one knob, the checkpoint interval
CI. Short intervals cost latency while the job runs (barriers, snapshots, uploads);
long intervals cost time after a failure, because everything read since the last
checkpoint is read again. Chiron (Geldenhuys et al.) picks CI from measurements: the
interval with the least latency cost whose *total recovery time* (TRT — from the
failure until the job has caught up with its input again) stays under a user's bound.

**Phases of a recovery** (Chiron §II), in seconds:

- ``E`` — reprocess: input read since the last checkpoint, read again. A failure
  lands anywhere between two checkpoints, so E is 0 (best case), CI/2 (average) or
  CI (worst) — in the paper. A departure: a restart restores the last *completed*
  checkpoint, and a checkpoint completes d after its trigger (its barriers pass,
  its state is written), so a kill in those d seconds restores the one before, and
  E runs from d to CI + d: each case here adds d, the median time the profiled
  runs' checkpoints took (milliseconds on an idle machine, up to 1-2 s under heavy
  load);
- ``T`` — timeout: the failure is noticed (heartbeat timeout, or a process death);
- ``R`` — restart/restore: every task runs again from the recovery line (R ends
  when the restored tasks start, by the workers' clocks: the job master hears of
  it some 40 ms later, once the catch-up lets the workers' event loops reply, and
  taken then R counted that twice in eq 5 and every warm-up read negative);
- ``W`` — warm-up: the sources ramp up from nothing to their full rate;
- ``C`` — catch-up: the backlog that piled up meanwhile is read at the job's
  maximum rate while new input keeps arriving at its average rate.

**The heuristic** (Chiron §III). With ``I_avg`` the average ingest rate and ``I_max``
the most the job can take, the utilisation is (eq 1)::

    U = I_avg / I_max

Reading the outage's backlog takes ``(E+T+R+W)·U``; input arriving meanwhile takes
U times that, and so on: a decreasing geometric series (eq 2)::

    C(1) = (E+T+R+W)·U,    C(n) = C(n-1)·U

cut at the first term below a stopping value ``stop_term_s`` (the paper: "the first
n resulting in a value less than one" — one millisecond, its unit; here 1 ms too).
Its sum is (eqs 3–4) ``S(n) = C(1)·(1 - U^n) / (1 - U)`` and (eq 5)::

    TRT = T + R + S(n)

one value each for E = 0, CI/2 and CI: the minimum, average and maximum TRT.
(Eqs 3–4 as printed start the series at ``E+T+R+W`` without the factor U, which
would count the outage twice once eq 5 adds T and R; we sum the terms of eq 2, which
is what a source catching up at ``I_max`` while input arrives at ``I_avg`` does:
the backlog ``(E+T+R+W)·I_avg`` drains at ``I_max - I_avg``.)

**Profiling** (Chiron §IV-A) runs the user's topology once per interval of an evenly
spaced grid between a minimum and a maximum, each on the same input, with
``failures_per_run`` injected kills (the paper's three; `bastion.tuning.RayProfiler`
spaces them so each recovery completes before the next, reading a bounded input for
longer when it is too short for that), and measures per kill
(`bastion.tuning.measure_kills`): I_avg before it (after the previous recovery caught
up), the average latency L_avg in failure-free operation (the run's, over the whole
checkpoint intervals before its first kill, from the progress timeline's means:
`failure_free_latency_ms`), T and R of its recovery, and its E (how old the
restored checkpoint was); every kill is one
`Measurement`, and the model takes the medians over an interval's kills and
``repeats`` (`median_measurement`); one more run with the source's pacing removed
measures I_max and a cold-start W.
The warm-up after a *restart* is what eq 2 needs, and each profiling run shows it:
eq 5 solved for W with the run's observed TRT (`recovery_warmup_s`). The observed
TRT is the one a drill of the run reports, defined once for every command in
`bastion.runtime.recovery_times` (kill → output rate back and sources caught up:
their backlog back to its level before the fault, to within what the 0.1-s
timeline resolves). W is bounded by what was measured: it is dead time inside the
observed catch-up, so no W exceeds the catch-up that run showed — solved from eq 5
at a low utilisation, the timeline's 0.1-s resolution times (1-U)/U read as
warm-ups of hundreds of seconds beside a TRT of 0.2 s.
Another departure from the paper's single W: the warm-ups differ from recovery to
recovery (on a shared machine, by what else runs), and the cases take that spread
too — the best case uses the least W seen (the cold start's, or a recovery's), the
average case the mean (TRT is linear in W, so the expected TRT is the TRT at the
mean W; the median under-predicted it), the worst case the 90% quantile
(`WORST_CASE_QUANTILE`: the share of recoveries it claims to cover; the largest W of
a dozen runs is one burst of someone else's load). T and R likewise, pooled over
every profiled run (a departure: the paper measures them per interval): the best
case takes the fastest restart, the average case the median T and R, the worst case
the restart at the 90% quantile. A restart redeploys from a checkpoint whose state
does not grow with the interval, so T and R do not depend on it — and three runs of
one interval are too few to say more than the load of the minute they ran in: the
fastest of three restarts at CI 0.5 s took about 0.19 s, the validation's drills
there 0.11-0.22 s, and two of four recovered in less than the minimum it gave (0.29
and 0.31 s against 0.34 s).
`Profiler` is the interface; `bastion.tuning.RayProfiler` runs real jobs with
`bastion.run`, side by side when asked and the cluster has room.

**Where the spread of W came from** — checked phase by phase (T, R and the catch-up
of each validation drill against their predictions): T (a process death, ~0.01 s)
and R (0.1-0.3 s) agreed between profiling and validation; the catch-up did not.
Most recoveries read their backlog at the fitted rate with W near 0, and some took
1-3 s longer. Much of that was the job's own doing: a restart borrowed its new
standby at once, and the standby's process start (about a core-second) took the
cores of the catch-up on a 2-core machine. In alternating pairs of the same kill
(CI 1.9 s, load 11-23) the catch-up beyond the fitted rate had a median of 2.5 s
with the standby borrowed at the restart and 0.0 s with it borrowed 4 s later. The
job master now borrows it once the sources caught up (`bastion.runtime.job`); what
spread is left is other load on the machine, which eq 5's W cannot know of — its
mean is what the average case takes, and the 90% quantile the worst case.

**The catch-up rate** is a further departure: eq 1 takes I_max from the unthrottled run,
but a restarted job reads its backlog slower than a warm job reads unthrottled input (it
checkpoints meanwhile). With one W and the unthrottled I_max, that showed as a W growing
with the interval, and the average TRT came out over-predicted at short intervals and
under-predicted at long ones (measured/predicted 0.62 at 0.5 s, 1.33 at 4 s).
`catch_up_rate` fits the slope of the observed catch-up time against the outage
``E+T+R`` over the profiled recoveries (robustly: Theil-Sen) and the model uses the rate
it implies as I_max; the unthrottled I_max remains the fallback, and the check that the
job can keep up at all.

**Modelling** (§IV-B) fits second-order polynomials to each of the TRT minimum,
average and maximum against CI, and to L_avg — there, a departure: the curve (a
polynomial of degree 0, 1 or 2, or ``c + b/CI``) that predicts best the intervals
left out of the fit (`fit_cross_validated`), because a latency the interval does not
move scatters with the machine's load, and a parabola through the scatter bends most
at the ends of the range; and a latency that checkpoints do cost falls as 1/CI, which
a parabola follows badly.

**Judging a fit.** The paper reports each fit's R² (0.819-0.996), ``1 -
SS_res/SS_tot``: the share of the points' spread about their mean that the curve
explains. It is only a measure where there is a spread to explain. A series that the
interval does not move — the best-case TRT with T and R pooled over every run (its E
is d at every interval, so it is the same figure six times, up to rounding), or the
latency of a job whose checkpoints cost nothing — has an SS_tot made of noise, and
its R² says how much of that noise the curve follows: near 0 for the right answer (a
flat line through the points), near 1 only for a curve that chased the noise (the
benchmark once printed 0.171 for a best-case TRT of 0.05 s at every interval, and
0.744 for a latency of 1.0 ms at every interval, both fits within a few per cent of
every point). So (`fit_quality`): a series whose every point lies within
`FLAT_SHARE` (5%) of its mean is *flat*, gets no R², and its fit is judged by its
largest error as a share of the mean, which must be within that same 5% — a fit
that misses a flat series by more fails, the test a user cares about there (is the
prediction close to what was measured?). A series that varies more needs R² of at
least `MIN_R_SQUARED` (0.8, the low end of the paper's). Why 5%: it is a third of
the 15% the validation holds the predictions to, and about the spread of the
medians of a series the interval does not move on a shared machine, with room
to spare (that benchmark's latency medians: 0.99-1.03 ms, within 2% of their mean;
its single kills' 0.96-1.10 ms).
**Optimisation** (§IV-C) inverts the chosen TRT fit at the bound — the intervals where
``TRT(CI) <= bound`` — and picks among them the one whose fitted latency is least (ties:
the longest interval, the fewest checkpoints). When no interval of the range meets the
bound, it says so.

The model (`trt_estimate`, `fit_quadratic`, `build_model`, `optimise`) is plain
arithmetic, importable and testable without Ray. **What drives a real run is not
here**: the scheduler sits below the launcher and the drills (DESIGN §3), so this
module defines what it needs measured — the `Profiler` interface (a capacity run, and
one profiling run per interval) — and the public front of tuning, `bastion.tuning`,
fills it: its `RayProfiler` runs the jobs with `bastion.run` and matches the kills
with the job master's events through the drills' `fault_outcomes`. What stays here of
profiling is what needs neither: `profile_all` (the order of the runs), the figures
read from a run's timeline and events (`ingest_rate`, `capacity_of`,
`reprocessed_s`, ...), and the copies of a topology a profiling run reads
(`unthrottled`, `lengthened`, `own_outputs`). ``tests/test_import_arrows.py`` keeps it
so: nothing under ``bastion/scheduler/`` imports anything above ``bastion.runtime``.
`Model.at_utilisation` evaluates it again at another input rate — what a live re-tune
does while the job runs (`bastion.scheduler.retune`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import statistics
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Protocol, Sequence

from bastion.errors import BastionError

if TYPE_CHECKING:
    from bastion.topology import Topology

Case = Literal["min", "avg", "max"]
CASES: tuple[Case, ...] = ("min", "avg", "max")
DEFAULT_STOP_TERM_S = 0.001   # the paper's "less than one", in its unit (ms)
# The share of the profiled recoveries whose warm-up the worst case covers: the
# issue's target is a measured TRT inside the predicted [min, max] in >= 90% of drills.
WORST_CASE_QUANTILE = 0.9
_MAX_TERMS = 1_000_000
# Judging a fit (the module's **Judging a fit**): a series whose every point lies
# within this share of its mean is flat, and a flat series' fit must come within this
# share of its mean at every point; a series that varies needs R² of at least
# MIN_R_SQUARED (Chiron's fits: 0.819-0.996).
FLAT_SHARE = 0.05
MIN_R_SQUARED = 0.8
_ROUNDING = 1 + 1e-9   # 1.05 - 1.0 is 0.05000000000000004: on the boundary is within
# A run's start-up settles this long before its failure-free figures (I_avg, L_avg)
# are read; L_avg is read over whole checkpoint intervals before the first kill, so
# the first kill of a profiling run falls after it and LATENCY_INTERVALS of the
# longest interval: over one, a single checkpoint's pause set the point (R² of the
# latency fit 0.74 where it was 0.89).
SETTLE_S = 1.0
LATENCY_INTERVALS = 2


class ProfilingError(BastionError):
    """A profiling run measured nothing usable: its kill did not land, or too little
    ran before it. The message names the job and what to change."""


# -- measurements -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One profiling run at one checkpoint interval. Rates in records per second."""

    interval_s: float
    ingest_avg_per_s: float       # I_avg: source records read per second before the kill
    latency_avg_ms: float         # L_avg: mean end-to-end latency before the kill
    detection_s: float            # T: kill -> failure detected
    restart_s: float              # R: detection -> every task runs from the recovery line
    measured_trt_s: float | None = None   # kill -> sources caught up, as observed
    reprocess_s: float | None = None      # E of this run's kill: kill - restored checkpoint
    checkpoint_s: float | None = None     # d: how long its checkpoints took to complete
    kill_at_s: float | None = None
    job_id: str = ""
    kill_index: int = 0   # which of its run's kills (`failures_per_run`), from 0


@dataclass(frozen=True)
class Capacity:
    """The unthrottled run: the most the job takes (I_max) and how long it takes to
    get there (W)."""

    ingest_max_per_s: float
    warmup_s: float
    job_id: str = ""


# -- the heuristic (eqs 1-5) ------------------------------------------------------------------


def utilisation(ingest_avg_per_s: float, ingest_max_per_s: float) -> float:
    """U = I_avg / I_max (eq 1). A job at or over capacity never catches up: an error."""
    if ingest_max_per_s <= 0:
        raise ValueError(f"ingest_max_per_s must be > 0 records/s, got {ingest_max_per_s}")
    if ingest_avg_per_s < 0:
        raise ValueError(f"ingest_avg_per_s must be >= 0 records/s, got {ingest_avg_per_s}")
    u = ingest_avg_per_s / ingest_max_per_s
    if u >= 1:
        raise ValueError(f"utilisation U = I_avg / I_max = {ingest_avg_per_s:,.0f} / "
                         f"{ingest_max_per_s:,.0f} = {u:.2f} >= 1: the job runs at or over "
                         "its capacity and never catches up after a failure; lower the "
                         "source's rate")
    return u


def reprocess_s(interval_s: float, case: Case, completion_lag_s: float = 0.0) -> float:
    """E: 0, CI/2 or CI for the best, average and worst case, each plus the time a
    checkpoint takes to complete (``completion_lag_s``, d): a kill restores the last
    *completed* checkpoint, and one that lands in the d after a trigger restores the
    one before — E is d to CI + d, CI/2 + d on average."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    return completion_lag_s + {"min": 0.0, "avg": interval_s / 2.0, "max": interval_s}[case]


def catch_up_terms(first_term_s: float, u: float,
                   stop_term_s: float = DEFAULT_STOP_TERM_S) -> list[float]:
    """The terms C(1), C(2), ... of eq 2, up to and including the first one below
    ``stop_term_s``: ``C(1) = first_term_s``, ``C(n) = C(n-1)·U``."""
    if not 0 <= u < 1:
        raise ValueError(f"utilisation must be in [0, 1), got {u}")
    if stop_term_s <= 0:
        raise ValueError(f"stop_term_s must be > 0 seconds, got {stop_term_s}")
    terms = [first_term_s]
    while terms[-1] >= stop_term_s and len(terms) < _MAX_TERMS:
        terms.append(terms[-1] * u)
    return terms


def catch_up_s(outage_s: float, u: float, stop_term_s: float = DEFAULT_STOP_TERM_S
               ) -> tuple[float, int]:
    """S(n) (eq 4) for an outage ``E+T+R+W`` and the number of terms n: the closed
    form ``C(1)·(1 - U^n)/(1 - U)`` with ``C(1) = outage·U``, n from eq 3's loop."""
    n = len(catch_up_terms(outage_s * u, u, stop_term_s))
    return outage_s * u * (1 - u ** n) / (1 - u), n


@dataclass(frozen=True)
class TrtEstimate:
    """Total recovery time in seconds for the best, average and worst case."""

    min_s: float
    avg_s: float
    max_s: float

    def of(self, case: Case) -> float:
        return {"min": self.min_s, "avg": self.avg_s, "max": self.max_s}[case]


def trt_s(interval_s: float, case: Case, *, detection_s: float, restart_s: float,
          warmup_s: float, u: float, stop_term_s: float = DEFAULT_STOP_TERM_S,
          completion_lag_s: float = 0.0) -> float:
    """TRT = T + R + S(n) (eq 5) for one case of E (`reprocess_s`)."""
    outage = (reprocess_s(interval_s, case, completion_lag_s) + detection_s + restart_s
              + warmup_s)
    return detection_s + restart_s + catch_up_s(outage, u, stop_term_s)[0]


def trt_estimate(interval_s: float, *, detection_s: float, restart_s: float,
                 warmup_s: float | tuple[float, float, float], u: float,
                 stop_term_s: float = DEFAULT_STOP_TERM_S) -> TrtEstimate:
    """TRT minimum, average and maximum at ``interval_s``; ``warmup_s`` is one W for
    every case, or (best, average, worst)."""
    warmups = (warmup_s,) * 3 if isinstance(warmup_s, (int, float)) else tuple(warmup_s)
    values = [trt_s(interval_s, c, detection_s=detection_s, restart_s=restart_s,
                    warmup_s=w, u=u, stop_term_s=stop_term_s) for c, w in zip(CASES, warmups)]
    return TrtEstimate(*values)


# -- second-order fits ------------------------------------------------------------------------


@dataclass(frozen=True)
class Quadratic:
    """``y = a·x² + b·x + c`` (a least-squares fit)."""

    a: float
    b: float
    c: float

    def __call__(self, x: float) -> float:
        return (self.a * x + self.b) * x + self.c

    def solve(self, y: float) -> list[float]:
        """Every real x where the curve equals ``y``, ascending."""
        a, b, c = self.a, self.b, self.c - y
        if abs(a) < 1e-12:
            return [] if abs(b) < 1e-12 else [-c / b]
        disc = b * b - 4 * a * c
        if disc < 0:
            return []
        root = math.sqrt(disc)
        return sorted({(-b - root) / (2 * a), (-b + root) / (2 * a)})

    def vertex(self) -> float | None:
        return None if abs(self.a) < 1e-12 else -self.b / (2 * self.a)


@dataclass(frozen=True)
class Reciprocal:
    """``y = c + b/x`` (a least-squares fit): a cost paid once per checkpoint and
    spread over the interval, as the latency a checkpoint adds to records around it
    is. Monotone on x > 0, so no interior extremum (`vertex` None)."""

    b: float
    c: float

    def __call__(self, x: float) -> float:
        return self.c + self.b / x

    def solve(self, y: float) -> list[float]:
        """Every x > 0 where the curve equals ``y``."""
        if abs(y - self.c) < 1e-12 or abs(self.b) < 1e-12:
            return []
        x = self.b / (y - self.c)
        return [x] if x > 0 else []

    def vertex(self) -> float | None:
        return None


#: A latency fit: a polynomial of degree 0-2 or a reciprocal (`fit_cross_validated`).
Curve = Quadratic | Reciprocal


def fit_reciprocal(xs: Sequence[float], ys: Sequence[float]) -> Reciprocal:
    """Least squares of ``c + b/x`` (every x > 0): a line in ``1/x``."""
    if len(xs) != len(ys) or not xs or min(xs) <= 0:
        raise ValueError(f"fit_reciprocal needs as many x > 0 as y values, and some: got "
                         f"{len(xs)} and {len(ys)}")
    line = fit_polynomial([1.0 / x for x in xs], ys, 1)
    return Reciprocal(line.b, line.c)


def fit_quadratic(xs: Sequence[float], ys: Sequence[float]) -> Quadratic:
    """Least squares of degree 2 (degree 1 from two points, a constant from one),
    solved from the normal equations: no numpy needed."""
    return fit_polynomial(xs, ys, 2)


def fit_polynomial(xs: Sequence[float], ys: Sequence[float], degree: int) -> Quadratic:
    """Least squares of ``degree`` 0, 1 or 2 (lower when fewer distinct x's than that
    needs), as a `Quadratic` whose higher coefficients are 0."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"fit_polynomial needs as many x as y values, and some: got "
                         f"{len(xs)} and {len(ys)}")
    if degree not in (0, 1, 2):
        raise ValueError(f"degree must be 0, 1 or 2, got {degree}")
    distinct = len(set(xs))
    degree = min(degree, distinct - 1)
    if degree == 0:
        return Quadratic(0.0, 0.0, sum(ys) / len(ys))
    # Centre and scale x for a well-conditioned system, then expand back.
    mean = sum(xs) / len(xs)
    scale = max(abs(x - mean) for x in xs) or 1.0
    us = [(x - mean) / scale for x in xs]
    k = degree + 1
    matrix = [[sum(u ** (i + j) for u in us) for j in range(k)] for i in range(k)]
    rhs = [sum(y * u ** i for u, y in zip(us, ys)) for i in range(k)]
    coef = _solve_linear(matrix, rhs) + [0.0] * (3 - k)   # in u: c0 + c1·u + c2·u²
    c0, c1, c2 = coef
    # u = (x - m)/s: c2/s²·x² + (c1/s - 2·c2·m/s²)·x + (c0 - c1·m/s + c2·m²/s²)
    return Quadratic(c2 / scale ** 2, c1 / scale - 2 * c2 * mean / scale ** 2,
                     c0 - c1 * mean / scale + c2 * mean ** 2 / scale ** 2)


def fit_cross_validated(xs: Sequence[float], ys: Sequence[float]) -> Curve:
    """The least-squares curve — a polynomial of degree 0, 1 or 2, or ``c + b/x`` —
    that best predicts points it was not fitted to: leave-one-out cross-validation
    over the points (one per interval), the least sum of squared prediction errors
    winning, and on a tie the simpler (degree 0, 1, the reciprocal, degree 2). With
    fewer than four distinct x's there is too little to leave out: `fit_quadratic`.

    Why not always the second-order fit of the paper: six medians of a latency that
    does not depend on the interval (a paced job whose checkpoints take milliseconds)
    scatter by the load of a shared machine, and a parabola through them invents a
    curvature that is largest at the ends of the range, where the fit is least held
    (a benchmark run: medians 0.83-1.25 ms, mean 1.00, and the parabola said 1.12 at
    the 4 s end, where the validation drills then measured 0.76). Cross-validation
    keeps the parabola where the points bend (the latency of frequent checkpoints, in
    the paper) and drops it where it only follows noise.

    Why the reciprocal: a checkpoint's cost to latency is paid once per interval, so
    the latency falls as 1/CI towards what the job costs without checkpoints. A job
    holding a 1 M-entry table measured 3.4, 1.4, 1.2, 1.1, 1.2 and 1.3 ms at 0.5-4 s:
    the parabola, the best polynomial, predicted 0.63-1.26 of what drills at other
    intervals measured; ``c + b/x`` predicts the left-out points with 0.69 of the
    parabola's squared error."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"fit_cross_validated needs as many x as y values, and some: "
                         f"got {len(xs)} and {len(ys)}")
    if len(set(xs)) < 4:
        return fit_quadratic(xs, ys)

    def degree(d: int) -> Callable[[Sequence[float], Sequence[float]], Curve]:
        return lambda fx, fy: fit_polynomial(fx, fy, d)

    # simplest first: on a tie the first of them wins
    candidates: list[Callable[[Sequence[float], Sequence[float]], Curve]] = [
        degree(0), degree(1)]
    if min(xs) > 0:
        candidates.append(fit_reciprocal)
    candidates.append(degree(2))

    def left_out_error(fit_of: Callable[[Sequence[float], Sequence[float]], Curve]
                       ) -> float:
        error = 0.0
        for x, y in zip(xs, ys):
            rest = [j for j in range(len(xs)) if xs[j] != x]   # an x's every point
            fit = fit_of([xs[j] for j in rest], [ys[j] for j in rest])
            error += (fit(x) - y) ** 2
        return error

    errors = [left_out_error(fit_of) for fit_of in candidates]
    least = min(errors)
    chosen = next(fit_of for fit_of, e in zip(candidates, errors)
                  if e <= least * (1 + 1e-9) + 1e-300)
    return chosen(xs, ys)


def is_flat(ys: Sequence[float], share: float = FLAT_SHARE) -> bool:
    """Whether a series does not vary: every point within ``share`` of the series'
    mean (`FLAT_SHARE`; an empty series, or all zeros, is flat). Such a series
    gets no R² (`r_squared`), and its fit is judged by its largest error instead
    (`fit_quality`)."""
    if not ys:
        return True
    mean = sum(ys) / len(ys)
    return max(abs(y - mean) for y in ys) <= share * abs(mean) * _ROUNDING


def r_squared(fit: Curve, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """How much of the spread of ``ys`` the fit explains: ``1 - SS_res / SS_tot``
    (1: every point on the curve; 0: no better than their mean; below 0: worse). None
    when there is no spread to explain — fewer than two points, or a flat series
    (`is_flat`: every point within `FLAT_SHARE` of the mean), whose SS_tot is the
    measurement's noise and whose R² says how much noise the curve follows (see
    the module's **Judging a fit**). The paper reports 0.819-0.996 for its fits."""
    if len(ys) < 2 or is_flat(ys):
        return None
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    return 1.0 - sum((fit(x) - y) ** 2 for x, y in zip(xs, ys)) / total


@dataclass(frozen=True)
class FitQuality:
    """How well a fit goes through the points it was fitted to (`fit_quality`).

    A series that varies (``flat`` False) is judged by its R², as the paper does: at
    least `MIN_R_SQUARED`. A flat one (`is_flat`) has no R² (``r_squared`` None) and
    is judged by ``max_error``, the fit's largest distance from a point as a share
    of the series' mean: at most `FLAT_SHARE`, the same share that called it flat."""

    flat: bool
    r_squared: float | None   # None: flat, or fewer than two points
    max_error: float          # max |fit(x) - y| / |mean of y| (inf: mean 0, an error)

    @property
    def good(self) -> bool:
        """R² >= `MIN_R_SQUARED` for a series that varies, the fit within `FLAT_SHARE`
        of every point for a flat one."""
        if self.flat:
            return self.max_error <= FLAT_SHARE * _ROUNDING
        return self.r_squared is not None and self.r_squared >= MIN_R_SQUARED

    def __str__(self) -> str:
        if self.flat:
            return f"flat (off <= {self.max_error:.1%})"
        return "-" if self.r_squared is None else f"{self.r_squared:.3f}"


def fit_quality(fit: Curve, xs: Sequence[float], ys: Sequence[float]) -> FitQuality:
    """`FitQuality` of ``fit`` against the points ``(xs, ys)``."""
    if len(xs) != len(ys) or not ys:
        raise ValueError(f"fit_quality needs as many x as y values, and some: got "
                         f"{len(xs)} and {len(ys)}")
    mean = abs(sum(ys) / len(ys))
    worst = max(abs(fit(x) - y) for x, y in zip(xs, ys))
    max_error = worst / mean if mean > 0 else (0.0 if worst == 0 else math.inf)
    return FitQuality(flat=is_flat(ys), r_squared=r_squared(fit, xs, ys),
                      max_error=max_error)


def _solve_linear(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    n = len(rhs)
    m = [row[:] + [r] for row, r in zip(matrix, rhs)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-15:
            raise ValueError("fit_quadratic: the points do not determine a curve")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


# -- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelPoint:
    """One profiled interval with its TRT estimate."""

    measurement: Measurement
    utilisation: float
    trt: TrtEstimate


@dataclass(frozen=True)
class Model:
    """Fits of latency and TRT (min, avg, max) against the interval."""

    points: tuple[ModelPoint, ...]
    capacity: Capacity
    latency_fit: Curve
    trt_fits: Mapping[str, Quadratic]
    stop_term_s: float = DEFAULT_STOP_TERM_S
    warmup_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # W per case (`build_model`)
    catch_up_per_s: float = 0.0   # the rate recoveries read at (`catch_up_rate`)
    completion_lag_s: float = 0.0   # d: how long a checkpoint takes to complete
    # how well each fit goes through the points it was fitted to (`fit_quality`): the
    # latency's against the measured L_avg, each TRT case's against the model's
    # estimates per interval (None: a Model made without them)
    latency_quality: FitQuality | None = None
    trt_quality: Mapping[str, FitQuality] = field(default_factory=dict)
    # (T, R) per case, pooled over every run (`build_model`): what `at_utilisation`
    # evaluates eq 5 with
    restarts_s: tuple[tuple[float, float], ...] = ((0.0, 0.0),) * 3

    @property
    def latency_r2(self) -> float | None:
        """The latency fit's R² (None: flat, or not judged)."""
        return None if self.latency_quality is None else self.latency_quality.r_squared

    @property
    def trt_r2(self) -> dict[str, float | None]:
        """Each TRT case's R² (None: flat)."""
        return {c: q.r_squared for c, q in self.trt_quality.items()}

    def qualities(self) -> dict[str, FitQuality]:
        """Every judged fit by name: ``"latency"``, ``"TRT min"``, ``"TRT avg"``,
        ``"TRT max"``."""
        named = {f"TRT {c}": q for c, q in self.trt_quality.items()}
        return named if self.latency_quality is None else {"latency": self.latency_quality,
                                                           **named}

    def reprocess_s(self, interval_s: float, case: Case) -> float:
        """The E the model takes for ``case`` at ``interval_s`` (`reprocess_s`)."""
        return reprocess_s(interval_s, case, self.completion_lag_s)

    def trt(self, interval_s: float) -> TrtEstimate:
        return TrtEstimate(*(self.trt_fits[c](interval_s) for c in CASES))

    def latency_ms(self, interval_s: float) -> float:
        return self.latency_fit(interval_s)

    def trt_at(self, interval_s: float, u: float) -> TrtEstimate:
        """Eq 5 at ``interval_s`` for a utilisation ``u`` other than the profiled one:
        the same T, R, W and d per case, the outage's backlog read at ``u``."""
        return TrtEstimate(*(
            trt_s(interval_s, case, detection_s=t, restart_s=r, warmup_s=w, u=u,
                  stop_term_s=self.stop_term_s, completion_lag_s=self.completion_lag_s)
            for case, (t, r), w in zip(CASES, self.restarts_s, self.warmup_s)))

    def at_utilisation(self, u: float) -> "Model":
        """The model re-evaluated for an input rate of ``u · I_max`` (a live re-tune,
        `bastion.scheduler.retune`): every profiled interval's TRT from eq 5 at ``u``
        (`trt_at`) and the TRT fits made again through them; the latency fit is kept —
        the profiling measured latency at one rate only, and `optimise` uses it to
        choose among the intervals that meet the bound."""
        points = tuple(ModelPoint(p.measurement, u, self.trt_at(p.measurement.interval_s, u))
                       for p in self.points)
        xs = [p.measurement.interval_s for p in points]
        at_u = {c: [p.trt.of(c) for p in points] for c in CASES}
        fits: dict[str, Quadratic] = {c: fit_quadratic(xs, at_u[c]) for c in CASES}
        return dataclasses.replace(self, points=points, trt_fits=fits,
                                   trt_quality={c: fit_quality(fits[c], xs, at_u[c])
                                                for c in CASES})


def recovery_warmup_s(m: Measurement, u: float) -> float | None:
    """The warm-up a profiling run's recovery showed: eq 5 solved for W, given the
    run's observed TRT, its kill's E, T and R and the utilisation — the catch-up
    time the series does not explain by the backlog, i.e. the dead time of the
    ramp back to full speed (on a shared machine also what other load took from the
    catch-up). None without an observed TRT and E, or when nothing had to be caught up
    (U = 0). At a low U it is coarse — the timeline's 0.1 s resolution times (1-U)/U:
    seconds at U = 0.02, hundreds at U = 0.0005 — and matters as little, since it
    enters the TRT times U/(1-U). Bounded by what the run measured: W is dead time
    within the catch-up, so it is at most the catch-up the run observed (TRT - T -
    R); a larger solution is that resolution, not a warm-up, and a printed W of 380 s
    beside a TRT of 0.2 s said so to no one."""
    if m.measured_trt_s is None or m.reprocess_s is None or u <= 0:
        return None
    catch_up = m.measured_trt_s - m.detection_s - m.restart_s
    solved = catch_up * (1 - u) / u - (m.reprocess_s + m.detection_s + m.restart_s)
    return min(solved, max(0.0, catch_up))


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (0 <= q <= 1), interpolated linearly between
    the sorted values (q = 1: the largest, q = 0.5: the median)."""
    if not values or not 0 <= q <= 1:
        raise ValueError(f"quantile needs values and 0 <= q <= 1, got {len(values)} "
                         f"values and q = {q}")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def median_measurement(runs: Sequence[Measurement]) -> Measurement:
    """One measurement from several kills of the same interval — the kills of one run
    (`failures_per_run`) and of its ``repeats`` — the median of each figure (of those
    that have it); the job id names each run once."""
    if len(runs) == 1:
        return runs[0]

    def median(name: str) -> Any:
        values = [getattr(m, name) for m in runs if getattr(m, name) is not None]
        return statistics.median(values) if values else None

    return Measurement(interval_s=runs[0].interval_s,
                       ingest_avg_per_s=median("ingest_avg_per_s"),
                       latency_avg_ms=median("latency_avg_ms"),
                       detection_s=median("detection_s"), restart_s=median("restart_s"),
                       measured_trt_s=median("measured_trt_s"),
                       reprocess_s=median("reprocess_s"),
                       checkpoint_s=median("checkpoint_s"),
                       job_id=" ".join(dict.fromkeys(m.job_id for m in runs)))


MIN_OUTAGE_SPREAD_S = 0.25   # two recoveries this far apart in outage give a slope


def catch_up_rate(runs: Sequence[Measurement], ingest_max_per_s: float) -> float:
    """The rate, in records per second, at which the profiled recoveries read their
    backlog — eq 1's I_max as a recovery sees it.

    Eq 2's series sums to ``C = (E+T+R+W)·U/(1-U)``: the catch-up time grows with the
    outage ``x = E+T+R`` at the slope ``k = U/(1-U)``, and W is its intercept. The
    unthrottled run's I_max gives one slope; the recoveries show their own, and it is
    steeper — a restarted job reads its backlog slower than a warm job reads unthrottled
    input (it checkpoints meanwhile): on the benchmark, 86% of I_max. Read with one W
    per recovery and the I_max slope, that steeper slope turns into a W that grows with
    the interval (0.3 s at CI 0.5 s, 1.2-1.7 s at 2-4 s), and any one W then
    over-predicts short intervals and under-predicts long ones (measured/predicted
    average TRT 0.62 at 0.5 s, 1.33 at 4 s). So the slope is fitted to the recoveries:
    the Theil-Sen estimator (the median of the slopes between pairs of recoveries whose
    outages differ by at least `MIN_OUTAGE_SPREAD_S`), which a minority of recoveries a
    burst of load stretched does not move; ``I = I_avg / U`` with ``U = k/(1+k)``.
    Without three recoveries with an observed TRT and E, or a positive slope, the
    unthrottled run's ``ingest_max_per_s``, as in the paper."""
    points = [(m.reprocess_s + m.detection_s + m.restart_s,
               m.measured_trt_s - m.detection_s - m.restart_s, m.ingest_avg_per_s)
              for m in runs if m.measured_trt_s is not None and m.reprocess_s is not None]
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1, _) in enumerate(points)
              for x2, y2, _ in points[i + 1:] if abs(x2 - x1) >= MIN_OUTAGE_SPREAD_S]
    if len(points) < 3 or not slopes or (k := statistics.median(slopes)) <= 0:
        return ingest_max_per_s
    return statistics.median(p[2] for p in points) * (1 + k) / k


def build_model(measurements: Sequence[Measurement], capacity: Capacity,
                stop_term_s: float = DEFAULT_STOP_TERM_S) -> Model:
    """The TRT estimate of every profiled interval (eqs 1–5, with its I_avg — the
    median when it ran more than once —, T and R over every run: for the best case
    the fastest restart, for the average the median T and R, for the worst the
    restart at the `WORST_CASE_QUANTILE` quantile; the rate the recoveries read
    their backlog at as I_max (`catch_up_rate`), and W) and the second-order fits.

    W per case, from the unthrottled run's warm-up (a cold start) and the warm-ups
    every profiling run's recovery showed (`recovery_warmup_s`): best case the least
    of them (at least 0); average case their mean (at least the cold start's) — the
    average TRT is an expectation, and the series sums to ``(E+T+R+W)·U/(1-U)``,
    linear in W, so the expected TRT is the TRT at the mean W (the median of a
    skewed spread of warm-ups under-predicts it); worst case their
    `WORST_CASE_QUANTILE` quantile — the worst case claims to cover that share of
    recoveries, and the largest of a dozen warm-ups is one burst of someone else's
    load on a shared machine (W of 47 s beside 0–4 s), which made every interval's
    worst case 30 s. Without recoveries to read it from, the cold start's W for
    every case, as in the paper."""
    if not measurements:
        raise ValueError("build_model needs at least one measurement")
    runs = sorted(measurements, key=lambda m: m.interval_s)
    # unclipped: a W read below 0 is the timeline's resolution, and clipping it
    # before the mean would bias the mean upwards
    catch_up_per_s = catch_up_rate(runs, capacity.ingest_max_per_s)
    seen = [w for m in runs if (w := recovery_warmup_s(
        m, utilisation(m.ingest_avg_per_s, catch_up_per_s))) is not None]
    # Several runs of one interval (``repeats``): their medians, as in the paper's
    # evaluation (five runs, the median values modelled).
    groups: dict[float, list[Measurement]] = {}
    for m in runs:
        groups.setdefault(m.interval_s, []).append(m)
    ordered = [median_measurement(group) for group in groups.values()]
    us = [utilisation(m.ingest_avg_per_s, catch_up_per_s) for m in ordered]
    # d, the same for every interval: the checkpoint's work (small state here) does
    # not grow with the interval, and one figure over all runs is the steadier one
    lags = [m.checkpoint_s for m in runs if m.checkpoint_s is not None]
    completion_lag_s = statistics.median(lags) if lags else 0.0
    cold = capacity.warmup_s
    warmup_s = ((max(0.0, min(cold, *seen)), max(cold, statistics.mean(seen)),
                 max(cold, quantile(seen, WORST_CASE_QUANTILE))) if seen
                else (cold, cold, cold))
    # T and R per case, from every run: the interval does not move them
    by_restart = sorted(runs, key=lambda r: r.detection_s + r.restart_s)
    fastest = by_restart[0]
    # the nearest rank at or above the quantile: of three runs, the slowest
    worst = by_restart[math.ceil(WORST_CASE_QUANTILE * (len(by_restart) - 1))]
    restarts = ((fastest.detection_s, fastest.restart_s),
                (statistics.median(r.detection_s for r in runs),
                 statistics.median(r.restart_s for r in runs)),
                (worst.detection_s, worst.restart_s))
    points = []
    for m, u in zip(ordered, us):
        estimate = TrtEstimate(*(
            trt_s(m.interval_s, case, detection_s=t, restart_s=r, warmup_s=w, u=u,
                  stop_term_s=stop_term_s, completion_lag_s=completion_lag_s)
            for case, (t, r), w in zip(CASES, restarts, warmup_s)))
        points.append(ModelPoint(m, u, estimate))
    xs = [p.measurement.interval_s for p in points]
    latencies = [p.measurement.latency_avg_ms for p in points]
    latency_fit = fit_cross_validated(xs, latencies)
    trts = {c: [p.trt.of(c) for p in points] for c in CASES}
    trt_fits: dict[str, Quadratic] = {c: fit_quadratic(xs, trts[c]) for c in CASES}
    return Model(
        points=tuple(points), capacity=capacity, warmup_s=warmup_s,
        catch_up_per_s=catch_up_per_s, completion_lag_s=completion_lag_s,
        latency_fit=latency_fit, trt_fits=trt_fits, stop_term_s=stop_term_s,
        latency_quality=fit_quality(latency_fit, xs, latencies),
        trt_quality={c: fit_quality(trt_fits[c], xs, trts[c]) for c in CASES},
        restarts_s=restarts)


# -- optimisation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """The optimiser's answer. ``interval_s`` is None when no interval in the range
    meets the bound; ``reason`` says why, in words, either way."""

    interval_s: float | None
    trt: TrtEstimate | None
    latency_ms: float | None
    case: Case
    trt_bound_s: float
    reason: str


def optimise(model: Model, trt_bound_s: float, min_interval_s: float,
             max_interval_s: float, case: Case = "max") -> Choice:
    """The interval in ``[min_interval_s, max_interval_s]`` with the least fitted
    latency whose fitted ``case`` TRT is at most ``trt_bound_s`` (ties: the longest).

    The feasible set is where the TRT fit lies under the bound: the fit is inverted
    at the bound (its real roots), which cuts the range into pieces, each wholly
    feasible or not. The least latency over the feasible pieces is at an end of a
    piece or at the latency fit's vertex."""
    if trt_bound_s <= 0:
        raise ValueError(f"trt_bound_s must be > 0 seconds, got {trt_bound_s}")
    if not 0 < min_interval_s <= max_interval_s:
        raise ValueError(f"need 0 < min_interval_s <= max_interval_s, got "
                         f"{min_interval_s} and {max_interval_s}")
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    fit = model.trt_fits[case]
    cuts = sorted({min_interval_s, max_interval_s,
                   *(x for x in fit.solve(trt_bound_s) if min_interval_s < x < max_interval_s)})
    tolerance = 1e-9 * max(1.0, trt_bound_s)
    if len(cuts) == 1:   # min == max: one interval to judge
        cuts = cuts * 2
    pieces = [(lo, hi) for lo, hi in zip(cuts, cuts[1:])
              if fit((lo + hi) / 2) <= trt_bound_s]
    candidates: list[float] = []
    vertex = model.latency_fit.vertex()
    for lo, hi in pieces:
        candidates += [lo, hi]
        if vertex is not None and lo < vertex < hi:
            candidates.append(vertex)
    candidates = [x for x in candidates if fit(x) <= trt_bound_s + tolerance]
    what = {"min": "best-case", "avg": "average", "max": "worst-case"}[case]
    if not candidates:
        least = min(cuts + ([v] if (v := fit.vertex()) is not None
                            and min_interval_s < v < max_interval_s else []), key=fit)
        return Choice(None, None, None, case, trt_bound_s,
                      f"no checkpoint interval in [{min_interval_s:g}, {max_interval_s:g}] s "
                      f"meets the bound: the {what} TRT is predicted above "
                      f"{trt_bound_s:g} s everywhere (least {fit(least):.2f} s at "
                      f"{least:.2f} s); raise the bound, lower the minimum interval, or "
                      "make recovery faster")
    best = min(candidates, key=lambda x: (round(model.latency_ms(x), 9), -x))
    trt = model.trt(best)
    return Choice(best, trt, model.latency_ms(best), case, trt_bound_s,
                  f"checkpoint every {best:.2f} s: predicted {what} TRT "
                  f"{trt.of(case):.2f} s <= {trt_bound_s:g} s, latency "
                  f"{model.latency_ms(best):.1f} ms")


def grid(min_interval_s: float, max_interval_s: float, points: int) -> list[float]:
    """``points`` evenly spaced intervals from the minimum to the maximum."""
    if not 0 < min_interval_s <= max_interval_s:
        raise ValueError(f"need 0 < min_interval_s <= max_interval_s, got "
                         f"{min_interval_s} and {max_interval_s}")
    if points < 1 or (points == 1 and min_interval_s != max_interval_s):
        raise ValueError(f"points must be >= 2 for a range (>= 1 when min == max), got {points}")
    if points == 1:
        return [min_interval_s]
    step = (max_interval_s - min_interval_s) / (points - 1)
    return [round(min_interval_s + i * step, 9) for i in range(points)]


# -- profiling --------------------------------------------------------------------------------


class Profiler(Protocol):
    """What the tuner needs measured: the interface through which the scheduler has
    real runs made without importing what makes them (`bastion.tuning.RayProfiler`
    measures it with real jobs; a test hands `profile_all` a scripted one).
    ``capacity`` runs the unthrottled copy once; ``profile`` runs the topology at one
    checkpoint interval with its injected kills and returns one `Measurement` per kill
    of the run (a single one is taken as a list of one)."""

    def capacity(self) -> Capacity: ...

    def profile(self, interval_s: float, seed: int) -> Sequence[Measurement] | Measurement: ...


def _kills_of(measured: Sequence[Measurement] | Measurement) -> list[Measurement]:
    return [measured] if isinstance(measured, Measurement) else list(measured)


def profile_all(profiler: Profiler, intervals: Sequence[float], *, parallel: int = 1,
                repeats: int = 1, progress: Callable[[dict[str, Any]], None] | None = None
                ) -> tuple[Capacity, list[Measurement]]:
    """``repeats`` capacity runs (one after the other: side by side they would share
    the capacity they measure; the medians of I_max and W count), then ``repeats``
    profiling runs per interval, ``parallel`` at a time, in rounds over the grid
    (every interval once, then every interval again): on a shared machine a burst of
    someone else's load then falls on one run of several intervals, which their
    medians drop, instead of on every run of one interval, which bends the fits
    there. ``progress`` gets ``{"done", "total", "what"}`` after every run. The
    measurements are every kill's, run after run (`build_model` takes the medians)."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    intervals = [interval for _ in range(repeats) for interval in intervals]
    total = len(intervals) + repeats
    done = 0

    def report(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress({"done": done, "total": total, "what": what})

    if progress is not None:
        progress({"done": 0, "total": total, "what": "starting"})
    capacities = []
    for _ in range(repeats):
        capacities.append(profiler.capacity())
        report(f"capacity: I_max {capacities[-1].ingest_max_per_s:,.0f}/s")
    capacity = capacities[0] if repeats == 1 else Capacity(
        ingest_max_per_s=statistics.median(c.ingest_max_per_s for c in capacities),
        warmup_s=statistics.median(c.warmup_s for c in capacities),
        job_id=" ".join(c.job_id for c in capacities))
    if parallel == 1:
        measurements = []
        for i, interval in enumerate(intervals):
            measurements += _kills_of(profiler.profile(interval, i))
            report(f"interval {interval:g} s")
        return capacity, measurements
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(profiler.profile, interval, i): interval
                   for i, interval in enumerate(intervals)}
        for future in as_completed(futures):
            future.result()   # a failed run fails the tuning now, not after the others
            report(f"interval {futures[future]:g} s")
        return capacity, [m for future in futures for m in _kills_of(future.result())]


# -- measuring a run --------------------------------------------------------------------------


def ingest_rate(timeline: Sequence[Mapping[str, Any]], start_s: float, end_s: float
                ) -> float | None:
    """Source records per second between ``start_s`` and ``end_s`` (since job start)."""
    points = [p for p in timeline if start_s < p["t_s"] <= end_s]
    if len(points) < 2:
        return None
    earlier = [p for p in timeline if p["t_s"] <= start_s]
    began = earlier[-1]["t_s"] if earlier else points[0]["t_s"]
    span = points[-1]["t_s"] - began
    return sum(p["source_records"] for p in points) / span if span > 0 else None


def capacity_of(timeline: Sequence[Mapping[str, Any]]) -> Capacity:
    """I_max and W from an unthrottled run's timeline, from cumulative counts (a
    sample a busy worker did not answer moves its records to the next one, so
    per-sample rates are noisy but sums are right): I_max is the rate over the
    second half of the run; W is the warm-up as dead time — how much later the run
    ended than it would have at I_max from the start (``t_end - records / I_max``)."""
    points = [p for p in timeline if p["t_s"] > 0]
    while points and points[-1]["source_records"] == 0:   # the end: nothing more read
        points.pop()
    if len(points) < 4:
        raise ValueError("the unthrottled run was too short to measure its rate: give it "
                         "more time (max_rate_run_s)")
    cumulative, total = [], 0
    for p in points:
        total += p["source_records"]
        cumulative.append(total)
    t_end = points[-1]["t_s"]
    mid = min(range(len(points) - 1), key=lambda i: abs(points[i]["t_s"] - t_end / 2))
    span = t_end - points[mid]["t_s"]
    rate = (cumulative[-1] - cumulative[mid]) / span
    if rate <= 0:
        raise ValueError("the unthrottled run read nothing in its second half")
    return Capacity(ingest_max_per_s=rate, warmup_s=max(0.0, t_end - cumulative[-1] / rate))


def latency_avg_ms(latency_windows: Mapping[int, Any], started_s: float, start_s: float,
                   end_s: float) -> float | None:
    """Mean end-to-end latency of the records the sinks received in the whole
    wall-clock seconds between ``start_s`` and ``end_s`` after the job started
    (``started_s``, epoch seconds); ``latency_windows`` is
    `RunMetrics.latency_windows`."""
    from bastion.runtime.metrics import LatencyHistogram

    merged = LatencyHistogram()
    for second, histogram in latency_windows.items():
        if started_s + start_s <= second and second + 1 <= started_s + end_s:
            merged.merge(histogram)
    stats = merged.mean_std()
    return None if stats is None else stats[0] * 1000.0


def started_at(events: Sequence[Mapping[str, Any]]) -> float | None:
    """When a job started (epoch seconds), from its events: each has its epoch time
    ``t`` and its time since the start ``t_s``."""
    for e in events:
        if "t" in e and "t_s" in e:
            return e["t"] - e["t_s"]
    return None


@dataclass(frozen=True)
class KillOutcome:
    """What one injected kill measured (seconds)."""

    at_s: float
    detection_s: float
    restart_s: float
    trt_s: float | None
    reprocess_s: float | None = None


def reprocessed_s(events: Sequence[Mapping[str, Any]], fault_s: float) -> float | None:
    """E of a kill at ``fault_s``: how long before it the checkpoint the restart
    restored was taken (its trigger: completion minus duration). None when the job
    restarted from the beginning — a paced source with no checkpoint starts its
    schedule over, so there is no backlog, and the kill says nothing about E — or
    when the protocol's recovery line is not one checkpoint id (uncoordinated
    protocols)."""
    restarted = next((e for e in events if e["kind"] == "restarted" and e["t_s"] >= fault_s),
                     None)
    if restarted is None:
        return None
    line = restarted.get("checkpoint")
    if line is None or isinstance(line, bool) or not isinstance(line, int):
        return None
    done = next((e for e in events if e["kind"] == "checkpoint_completed"
                 and e.get("checkpoint_id") == line), None)
    if done is None:
        return None
    return max(0.0, fault_s - (done["t_s"] - done.get("duration_s", 0.0)))


def checkpoint_duration_s(events: Sequence[Mapping[str, Any]], before_s: float
                          ) -> float | None:
    """The mean time from trigger to completion of the checkpoints a run completed
    before ``before_s`` (its kill); None when it completed none."""
    durations = [e.get("duration_s", 0.0) for e in events
                 if e["kind"] == "checkpoint_completed" and e["t_s"] < before_s]
    return statistics.mean(durations) if durations else None


def timeline_latency_ms(timeline: Sequence[Mapping[str, Any]], start_s: float,
                        end_s: float) -> float | None:
    """The mean end-to-end latency of what the sinks received between ``start_s`` and
    ``end_s`` (seconds since the start), from the job master's progress timeline: the
    points' means weighted by the records they saw. The timeline spans every attempt —
    a run's latency histograms only its last one's — so this is how a kill before the
    last one gets a latency of its own (None: no point with a mean there)."""
    points = [(p["latency_mean_ms"], p.get("sink_records", 0)) for p in timeline
              if start_s < p["t_s"] <= end_s and p.get("latency_mean_ms") is not None]
    weight = sum(n for _, n in points)
    if not points or weight <= 0:
        return None
    return sum(mean * n for mean, n in points) / weight


def failure_free_lead_s(interval_s: float) -> float:
    """How long a run at ``interval_s`` must have run before its first kill for L_avg to
    be read over `LATENCY_INTERVALS` whole intervals after it settled
    (`failure_free_latency_ms`)."""
    return SETTLE_S + LATENCY_INTERVALS * interval_s


def settle_s_before(kill_at_s: float) -> float:
    """How long a run is left to settle before its failure-free figures are read: 1 s
    (`SETTLE_S`), or 30% of the time to its first kill if that is shorter."""
    return min(SETTLE_S, 0.3 * kill_at_s)


def failure_free_latency_ms(timeline: Sequence[Mapping[str, Any]], metrics: Any,
                            started_s: float, first: KillOutcome,
                            settle_s: float | None = None,
                            interval_s: float | None = None) -> float:
    """L_avg of a run in failure-free operation: the mean latency of what the sinks
    received before its first kill, from the progress timeline — the paper's "average
    latency in failure-free operation", measured where no failure has happened yet.

    Read over whole checkpoint intervals: the most ``interval_s`` that fit between
    ``settle_s`` after the start (`settle_s_before` by default) and the kill, ending
    at the kill. Each checkpoint holds up the records behind it, and its backlog weighs
    in L_avg as many records as it holds; a window of whole intervals holds one such
    pause per interval wherever the kill fell, where a window of, say, 2.55 s at a
    3-s interval held one pause or none by the kill's phase (drills then read 1.1-1.7
    ms against 1.0 predicted). Less than one interval before the kill (or no
    ``interval_s``): the whole window from ``settle_s``.

    Not after a recovery: a job that restores a large state and catches up carries
    the recovery's tail for seconds after its sources caught up (a 1-M-entry table
    read 3-253 ms there at CI 0.5 s, beside 3 ms before its kill), and which of it a
    window catches depends on where the kills fell. Without points before the kill,
    `steady_latency_ms`."""
    if settle_s is None:
        settle_s = settle_s_before(first.at_s)
    start_s = settle_s
    if interval_s:
        whole = math.floor((first.at_s - settle_s) / interval_s + 1e-9)
        if whole >= 1:
            start_s = first.at_s - whole * interval_s
    seen = timeline_latency_ms(timeline, start_s, first.at_s)
    return seen if seen is not None else steady_latency_ms(metrics, started_s, first)


def steady_latency_ms(metrics: Any, started_s: float, outcome: KillOutcome,
                      settle_s: float = 0.5) -> float:
    """L_avg of a run with one kill, in failure-free operation: the mean latency of
    the whole seconds from ``settle_s`` after the sources caught up until the run
    ended. (A run's latency histograms come from its last attempt's tasks — what
    the killed tasks measured before the kill died with them — so the seconds after
    the recovery are the failure-free ones left to measure.) Without such seconds
    (the run ended soon after catching up), the last attempt's whole histogram."""
    if outcome.trt_s is not None:
        latency = latency_avg_ms(metrics.latency_windows, started_s,
                                 outcome.at_s + outcome.trt_s + settle_s, metrics.duration_s)
        if latency is not None:
            return latency
    stats = metrics.latency_histogram.mean_std()
    return stats[0] * 1000.0 if stats else math.nan


def _paced_sources(topology: "Topology") -> dict[str, Any]:
    from bastion.sources import Generator

    sources = {n.name: n.params["source"] for n in topology.nodes.values()
               if n.kind == "source"}
    for name, source in sources.items():
        if not isinstance(source, Generator) or source.rate is None:
            raise ValueError(f"source {name!r} is {source!r}: tuning needs every source to "
                             "be a paced bn.sources.Generator(fn, count, rate=...) — the "
                             "rate is the job's average ingest, and the profiler removes it "
                             "to measure the maximum")
    return sources


def expected_run_s(topology: "Topology") -> float | None:
    """How long a bounded, paced topology reads input: count / rate of its slowest
    source (None when a source is unbounded)."""
    sources = _paced_sources(topology)
    if any(s.count is None for s in sources.values()):
        return None
    return max(s.count / s.rate for s in sources.values())


def unthrottled(topology: "Topology") -> "Topology":
    """A copy of ``topology`` whose generators read as fast as they can, for ever
    (``fn`` is called past ``count``); the original is left alone."""
    from bastion.sources import Generator

    _paced_sources(topology)
    clone = copy.copy(topology)
    clone.nodes = {}
    for name, node in topology.nodes.items():
        node = copy.copy(node)
        node.params = dict(node.params)
        if node.kind == "source":
            node.params["source"] = Generator(node.params["source"].fn, count=None, rate=None)
        clone.nodes[name] = node
    return clone


def own_outputs(topology: "Topology", tag: str) -> "Topology":
    """A copy of ``topology`` whose File and Log sinks write beside the user's, under
    names of their own (``out.<tag>.jsonl``, ``<log url>.<tag>``): a profiling run
    truncates its sinks when it starts, and must neither wipe the user's outputs nor
    those of a run beside it (``parallel``, or another tuning of the same job)."""
    from bastion.sinks import File, Log

    clone = copy.copy(topology)
    clone.nodes = {}
    for name, node in topology.nodes.items():
        sink = node.params.get("sink") if node.kind == "sink" else None
        if isinstance(sink, (File, Log)):
            node = copy.copy(node)
            node.params = dict(node.params)
            if isinstance(sink, File):
                path = sink.path
                node.params["sink"] = File(path.with_name(f"{path.stem}.{tag}{path.suffix}"))
            else:
                base, query = (sink.url.split("?", 1) + [""])[:2]
                node.params["sink"] = Log(f"{base.rstrip('/')}.{tag}"
                                          + (f"?{query}" if query else ""))
        clone.nodes[name] = node
    return clone


def discard_outputs(topology: "Topology") -> None:
    """Delete what the File and Log sinks of ``topology`` (an `own_outputs` copy)
    wrote: a profiling run's outputs are only ever measured."""
    from bastion.connectors.files import remove_outputs
    from bastion.sinks import File, Log
    from bastion.storage import LocalStore, open_store

    for node in topology.nodes.values():
        sink = node.params.get("sink") if node.kind == "sink" else None
        if isinstance(sink, File):
            remove_outputs(sink.path_for(i, node.parallelism)
                           for i in range(node.parallelism))
        elif isinstance(sink, Log):
            store = open_store(sink.url)
            for key in store.list(""):
                store.delete(key)
            if isinstance(store, LocalStore):  # and the folders it made, once empty
                for folder in (os.path.join(store.root, ".tmp"), store.root):
                    with contextlib.suppress(OSError):
                        os.rmdir(folder)


def lengthened(topology: "Topology", length_s: float) -> "Topology":
    """A copy of ``topology`` whose paced generators read for at least ``length_s``
    seconds: each one's ``count`` raised to ``rate · length_s`` (``fn`` is called past
    the original count, as `unthrottled` does); the original is left alone."""
    from bastion.sources import Generator

    sources = _paced_sources(topology)
    clone = copy.copy(topology)
    clone.nodes = {}
    for name, node in topology.nodes.items():
        if node.kind == "source" and sources[name].count is not None:
            source = sources[name]
            node = copy.copy(node)
            node.params = dict(node.params)
            node.params["source"] = Generator(
                source.fn, count=max(source.count, math.ceil(source.rate * length_s)),
                rate=source.rate)
        clone.nodes[name] = node
    return clone


def _plan_of(topology: "Topology", run_options: Mapping[str, Any]) -> Any:
    """The physical plan a run of ``topology`` gets (to turn faults into kills)."""
    from bastion.runtime.plan import build_plan

    plane = run_options.get("data_plane")   # a `bastion.options.DataPlane`, or the old keyword
    chaining = plane.chaining if plane is not None else run_options.get("chaining", True)
    return build_plan(topology, chaining=chaining, workers=run_options.get("workers"))
