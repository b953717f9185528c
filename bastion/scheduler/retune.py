"""Live re-tuning of the checkpoint interval: the Chiron model kept up with the input.

`bn.tune` (`bastion.scheduler.tuning`) picks the checkpoint interval CI for a bound on
total recovery time (TRT) from profiling runs at one input rate. The rate a job sees
changes while it runs, and TRT changes with it: after a failure the backlog of
``E+T+R+W`` seconds of input is read at ``I_max`` while new input keeps arriving at
``I_avg``, so the catch-up (eq 2) sums to ``(E+T+R+W)·U/(1-U)`` with the utilisation
``U = I_avg / I_max`` (eq 1). Doubling the rate of a job at U = 0.3 takes U/(1-U) from
0.43 to 1.5: the same interval then recovers more than three times as slowly, and a
bound the tuned interval met by a margin is broken.

A **re-tune** evaluates the model again at the live rate. Every ``period_s`` the job
master measures the input rate over the period — source records read plus the growth
of the sources' backlog, i.e. what arrived, not only what was read; periods in which
the job recovered from a failure are left out, since a catch-up reads at ``I_max`` —
and hands it to `Retuner.decide`, which computes ``U = I_avg / I_max`` (``I_max``: the
rate the profiled recoveries read their backlog at, `Model.catch_up_per_s`), re-evaluates
eq 5 at every profiled interval with that U (`Model.at_utilisation`) and runs the same
optimiser as the tuning (`optimise`): the interval with the least fitted latency whose
``case`` TRT stays under the bound. It moves the interval when

- the bound would be broken at the current interval (its predicted TRT at this rate is
  above the bound), or
- the interval is far from tight: the optimum moved by more than ``move_fraction`` of
  the current interval (a rate that halved leaves a short interval that costs latency
  for nothing).

Otherwise it stays. A predicted TRT within ``bound_tolerance`` (2%) above the bound
is not a broken bound — the model's resolution, and a rate measured over one period
wobbles by about that — so a tight interval is not moved by a per cent period after
period; a rate that keeps rising moves it down to the optimum of the highest rate
seen, and only an optimum more than ``move_fraction`` (25%) away moves it back up —
at the higher of the last two periods' rates (`Retuner`): a longer interval is the
riskier move, and one period's rate wobbles by several per cent.

When no interval of the tuned range meets the bound at this rate (or the rate is at
or over I_max: the job would never catch up), the decision says so and takes the
shortest tuned interval — E grows with CI, so that is the least TRT the range
offers; the interval never leaves the tuned range, where the model was fitted.

The decision is here, behind `Retuner`; the job master (`bastion.runtime.job`)
measures the rate, applies a moved interval to the running coordinator
(`Coordinator.set_interval`) and records an ``interval_retuned`` event per move (old
and new interval, rate, utilisation, predicted TRT), or ``trt_bound_unreachable`` when
the verdict turns to "no interval meets the bound" without a move. The model's latency
fit is kept as profiled: latency was measured at one rate only.

`RetunePolicy.of` takes a tuning by what it reads of it (`Tuned`: the model, the bound
and the case), not by its class: `bastion.tuning.TuningResult` is defined above the
launcher, and the scheduler imports nothing above the runtime
(``tests/test_import_arrows.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, cast

from bastion.scheduler.tuning import CASES, Case, Model, optimise, utilisation

# Re-tune when the optimum moved by more than this share of the current interval.
DEFAULT_MOVE_FRACTION = 0.25
# A predicted TRT within this share above the bound does not count as a broken bound:
# the model's own resolution (its fits through eq 5 differ from eq 5 by a fraction of
# it) and a period's measured rate wobbling by a per cent would otherwise move a tight
# interval by a per cent, period after period.
DEFAULT_BOUND_TOLERANCE = 0.02


class Tuned(Protocol):
    """What a live re-tune keeps of a tuning (`bastion.tuning.TuningResult` is one):
    its model, the bound it chose for, and the TRT case the bound applies to."""

    @property
    def model(self) -> Model: ...

    @property
    def trt_bound_s(self) -> float: ...   # seconds

    @property
    def case(self) -> str: ...   # "min", "avg" or "max"


@dataclass(frozen=True)
class RetunePolicy:
    """What a live re-tune keeps to: the tuning's ``model``, the bound it chose for
    (``trt_bound_s`` on the ``case`` TRT), the range it profiled (the interval stays
    in it), how often to re-evaluate (``period_s``) and how far the optimum must move
    before a bound-keeping interval is moved (``move_fraction`` of the current one)."""

    model: Model
    trt_bound_s: float
    min_interval_s: float
    max_interval_s: float
    period_s: float
    case: Case = "max"
    move_fraction: float = DEFAULT_MOVE_FRACTION
    bound_tolerance: float = DEFAULT_BOUND_TOLERANCE

    def __post_init__(self) -> None:
        if not self.trt_bound_s > 0:
            raise ValueError(f"trt_bound_s must be > 0 seconds, got {self.trt_bound_s}")
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ValueError(f"need 0 < min_interval_s <= max_interval_s, got "
                             f"{self.min_interval_s} and {self.max_interval_s}")
        if not (isinstance(self.period_s, (int, float)) and self.period_s > 0):
            raise ValueError(f"retune_every_s must be > 0 seconds, got {self.period_s!r}")
        if self.case not in CASES:
            raise ValueError(f"case must be one of {CASES}, got {self.case!r}")
        if not 0 < self.move_fraction <= 1:
            raise ValueError(f"move_fraction must be in (0, 1], got {self.move_fraction}")
        if not 0 <= self.bound_tolerance < 1:
            raise ValueError(f"bound_tolerance must be in [0, 1), got {self.bound_tolerance}")

    @classmethod
    def of(cls, tuning: Tuned, period_s: float,
           move_fraction: float = DEFAULT_MOVE_FRACTION) -> "RetunePolicy":
        """The policy of a `bastion.tuning.TuningResult`: its model, bound, case and
        profiled range."""
        xs = [p.measurement.interval_s for p in tuning.model.points]
        return cls(model=tuning.model, trt_bound_s=tuning.trt_bound_s,
                   min_interval_s=min(xs), max_interval_s=max(xs), period_s=period_s,
                   # __post_init__ checks that it is one of CASES
                   case=cast(Case, tuning.case), move_fraction=move_fraction)


@dataclass(frozen=True)
class RetuneDecision:
    """One re-evaluation: the interval before and after (equal: no move), the live rate
    and utilisation, the ``case`` TRT predicted at this rate for the old and the new
    interval (None: the job would never catch up), whether the new one meets the bound,
    and why, in words."""

    t_s: float
    interval_before_s: float
    interval_s: float
    ingest_avg_per_s: float
    utilisation: float
    predicted_trt_before_s: float | None
    predicted_trt_s: float | None
    meets_bound: bool
    reason: str

    @property
    def moved(self) -> bool:
        return not math.isclose(self.interval_s, self.interval_before_s,
                                rel_tol=1e-9, abs_tol=1e-9)


def decide(policy: RetunePolicy, interval_s: float, ingest_avg_per_s: float,
           t_s: float = 0.0) -> RetuneDecision:
    """The re-tune at an input of ``ingest_avg_per_s`` records per second for a job
    checkpointing every ``interval_s`` (see the module docstring)."""
    model, case, bound = policy.model, policy.case, policy.trt_bound_s
    i_max = model.catch_up_per_s or model.capacity.ingest_max_per_s
    what = {"min": "best-case", "avg": "average", "max": "worst-case"}[case]
    shortest = policy.min_interval_s
    try:
        u = utilisation(ingest_avg_per_s, i_max)
    except ValueError:   # U >= 1: the backlog never drains
        return RetuneDecision(
            t_s, interval_s, shortest, ingest_avg_per_s, ingest_avg_per_s / i_max, None, None,
            False, f"input {ingest_avg_per_s:,.0f} records/s is at or over the rate "
                   f"recoveries read at ({i_max:,.0f}/s): the job would never catch up "
                   f"after a failure, no interval meets the {bound:g}-s bound; checkpoint "
                   f"every {shortest:g} s, the shortest tuned")
    before = model.trt_at(interval_s, u).of(case)
    choice = optimise(model.at_utilisation(u), bound, policy.min_interval_s,
                      policy.max_interval_s, case)
    rate = f"input {ingest_avg_per_s:,.0f} records/s (U {u:.2f})"
    if choice.interval_s is None:
        after = model.trt_at(shortest, u).of(case)
        return RetuneDecision(
            t_s, interval_s, shortest, ingest_avg_per_s, u, before, after, False,
            f"{rate}: no interval in [{policy.min_interval_s:g}, {policy.max_interval_s:g}] "
            f"s meets the {bound:g}-s bound (predicted {what} TRT {after:.2f} s at "
            f"{shortest:g} s, the least in the range); checkpoint every {shortest:g} s")
    target = choice.interval_s
    broken = before > bound * (1 + policy.bound_tolerance)
    if not broken and abs(target - interval_s) <= policy.move_fraction * interval_s:
        return RetuneDecision(
            t_s, interval_s, interval_s, ingest_avg_per_s, u, before, before, True,
            f"{rate}: {interval_s:.2f} s keeps the {what} TRT at {before:.2f} s "
            f"(bound {bound:g} s), and the optimum {target:.2f} s is within "
            f"{policy.move_fraction:.0%} of it")
    after = model.trt_at(target, u).of(case)
    why = (f"the {what} TRT at {interval_s:.2f} s would be {before:.2f} s > {bound:g} s"
           if broken else
           f"the optimum moved from {interval_s:.2f} s by more than "
           f"{policy.move_fraction:.0%}")
    return RetuneDecision(
        t_s, interval_s, target, ingest_avg_per_s, u, before, after, True,
        f"{rate}: {why}; checkpoint every {target:.2f} s (predicted {what} TRT "
        f"{after:.2f} s)")


class Retuner:
    """The job master's re-tuner: the current interval and the decisions that moved it
    or turned the verdict. ``decide`` returns the decision to apply and record, or
    None when nothing changed."""

    def __init__(self, policy: RetunePolicy, interval_s: float):
        self.policy = policy
        self.interval_s = interval_s
        self.meets_bound = True
        self.decisions: list[RetuneDecision] = []
        self._last_rate: float | None = None   # the period before's

    def decide(self, t_s: float, ingest_avg_per_s: float) -> RetuneDecision | None:
        decision = decide(self.policy, self.interval_s, ingest_avg_per_s, t_s)
        if (decision.interval_s > self.interval_s and self._last_rate is not None
                and self._last_rate > ingest_avg_per_s):
            # A longer interval only for a rate two periods agree on: the higher of
            # the two decides. A period's measured rate wobbles by some per cent (the
            # polls that time it stretch on a busy machine), and near U = 0.75 that
            # moves the optimum by a quarter: at the lower of two wobbles the
            # interval went up, and at the next higher one down again.
            decision = decide(self.policy, self.interval_s, self._last_rate, t_s)
        self._last_rate = ingest_avg_per_s
        turned = decision.meets_bound != self.meets_bound
        self.interval_s, self.meets_bound = decision.interval_s, decision.meets_bound
        if not (decision.moved or turned):
            return None
        self.decisions.append(decision)
        return decision
