"""`bn.tune`: pick the checkpoint interval for a bound on total recovery time.

A user who runs a checkpointing protocol has to choose how often to checkpoint. Too
often costs latency all the time; too rarely costs time after every failure, when
everything read since the last checkpoint is read again and the backlog that piled
up meanwhile has to be caught up. ``bn.tune`` chooses from measurements (Chiron; the
model and its equations are in `bastion.scheduler.tuning`):

1. *profiling*: the topology runs once per checkpoint interval of an evenly spaced
   grid between ``min_interval_s`` and ``max_interval_s``, on the same input, each
   with ``failures_per_run`` injected kills (three, as in the paper; each recovery
   completes before the next kill, and each kill is measured on its own), plus once
   with its sources unthrottled (the most it can take). Copies run side by side
   (``parallel``) when the cluster has room;
2. *modelling*: the total recovery time (TRT) of every interval in its best, average
   and worst case, from the medians over its kills, and second-order fits of TRT and
   of latency against the interval;
3. *optimising*: the interval with the least fitted latency whose ``case`` TRT
   (``"max"`` by default: the worst case) stays under ``trt_bound_s`` — or a plain
   statement that none in the range does.

``tune`` returns a frozen `TuningResult`; `write_html` draws its fitted curves, the
measured points and the bound as an HTML page with inline SVG (no network assets)::

    result = bn.tune(topo, trt_bound_s=10, min_interval_s=0.5, max_interval_s=8, points=6)
    result.interval_s, result.trt_s, result.latency_ms

**Who runs the jobs.** The model, the fits and the optimiser belong to the scheduler
(`bastion.scheduler.tuning`), which sits below the launcher and the drills and so
cannot start a job: it defines what it needs measured — the `Profiler` interface, a
capacity run and one profiling run per interval — and this module, above both, fills
it. `RayProfiler` runs each profiling job with `bastion.run` and reads it back
(`measure_kills`) through the drills' matching of kills with the job master's events
(`kill_outcomes_of`, over `bastion.drills.fault_outcomes`); `room_for_copies` asks the
Ray cluster how many runs fit side by side. ``tune(profiler=...)`` takes any other
`Profiler`, and its measurements are modelled the same way.
"""

from __future__ import annotations

import dataclasses
import html
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from bastion.scheduler.tuning import (CASES, DEFAULT_STOP_TERM_S, Capacity, Case, Choice,
                                      KillOutcome, Measurement, Model, Profiler,
                                      ProfilingError, _paced_sources, _plan_of, build_model,
                                      capacity_of, checkpoint_duration_s, discard_outputs,
                                      expected_run_s, grid, ingest_rate, lengthened,
                                      optimise, own_outputs, profile_all, reprocessed_s,
                                      failure_free_latency_ms, failure_free_lead_s,
                                      settle_s_before, unthrottled)

if TYPE_CHECKING:
    from bastion.launcher import RunResult
    from bastion.topology import Topology

#: The range ``interval_s=bn.AutoInterval(…)`` (``bastion run --checkpoint-interval auto``)
#: tunes over, and its grid (`bastion tune` and `tune` take their own).
AUTO_MIN_INTERVAL_S, AUTO_MAX_INTERVAL_S, AUTO_POINTS = 0.5, 8.0, 6
#: ... with intervals up to this share of the run's length: a longer one completes too
#: few checkpoints in the run to be worth having (8 s was once chosen for a 6.7-s job)
AUTO_MAX_INTERVAL_SHARE = 0.25


def auto_range(topology: "Topology", duration_s: float | None = None) -> tuple[float, float]:
    """The (min, max) interval ``interval_s=bn.AutoInterval(…)`` tunes over for a run of
    ``topology`` lasting ``duration_s`` (default: as long as its paced input). A
    ValueError when the run is too short to tune."""
    length_s = duration_s or expected_run_s(topology)
    if length_s is None:
        return AUTO_MIN_INTERVAL_S, AUTO_MAX_INTERVAL_S
    max_interval_s = min(AUTO_MAX_INTERVAL_S, AUTO_MAX_INTERVAL_SHARE * length_s)
    if max_interval_s < 2 * AUTO_MIN_INTERVAL_S:
        raise ValueError(f"the job reads its input in {length_s:.1f} s, too short to tune "
                         f"(an interval must be at most {AUTO_MAX_INTERVAL_SHARE:.0%} of "
                         f"it, and the shortest tuned is {AUTO_MIN_INTERVAL_S:g} s)")
    return AUTO_MIN_INTERVAL_S, max_interval_s


@dataclass(frozen=True)
class TuningResult:
    """What `tune` found. ``interval_s`` is None when no interval in the range meets
    the bound (``reason`` says so); ``trt_s`` is the predicted (min, avg, max) total
    recovery time at the chosen interval and ``latency_ms`` its predicted average
    latency."""

    interval_s: float | None
    trt_s: tuple[float, float, float] | None
    latency_ms: float | None
    trt_bound_s: float
    case: str
    reason: str
    measurements: tuple[Measurement, ...]
    capacity: Capacity
    model: Model
    parallel: int = 1

    @property
    def meets_bound(self) -> bool:
        return self.interval_s is not None

    def rows(self) -> list[tuple[str, ...]]:
        """One row per profiled interval: what was measured and the TRT estimate."""
        rows: list[tuple[str, ...]] = []
        for p in self.model.points:
            m = p.measurement
            rows.append((f"{m.interval_s:.2f}", f"{m.ingest_avg_per_s:,.0f}",
                         f"{m.latency_avg_ms:.1f}", f"{m.detection_s:.2f}",
                         f"{m.restart_s:.2f}", f"{p.utilisation:.2f}",
                         f"{p.trt.min_s:.2f}", f"{p.trt.avg_s:.2f}", f"{p.trt.max_s:.2f}",
                         "-" if m.measured_trt_s is None else f"{m.measured_trt_s:.2f}"))
        return rows

    HEADER = ("interval s", "I_avg/s", "L_avg ms", "T s", "R s", "U", "TRT min",
              "TRT avg", "TRT max", "TRT seen")

    def fits(self) -> str:
        """How well each fit goes through its points, in one line: the R² of a
        series that varies with the interval, and for a flat one (every point within
        5% of its mean, where R² would measure noise) its largest error as a share
        of the mean (`bastion.scheduler.tuning.fit_quality`); ``-``: not judged."""
        qualities = self.model.qualities()

        def judged(name: str) -> str:
            return str(qualities[name]) if name in qualities else "-"

        return (f"fits R²: latency {judged('latency')}, TRT min/avg/max "
                + "/".join(judged(f"TRT {c}") for c in CASES))


def tune(topology: "Topology", *, trt_bound_s: float, min_interval_s: float = 0.5,
         max_interval_s: float = 8.0, points: int = 6, repeats: int = 1,
         failures_per_run: int = 3, case: Case = "max",
         protocol: str = "coordinated", parallel: int = 1, duration_s: float | None = None,
         kill_between_s: tuple[float, float] | None = None, max_rate_run_s: float = 4.0,
         stop_term_s: float = DEFAULT_STOP_TERM_S, seed: int = 0,
         progress: Callable[[dict[str, Any]], None] | None = None,
         profiler: Profiler | None = None, keep_profiles: bool = False,
         **run_options: Any) -> TuningResult:
    """Profile ``topology`` at ``points`` checkpoint intervals from ``min_interval_s``
    to ``max_interval_s``, model its TRT and latency, and choose the interval.

    ``repeats``: profiling runs per interval, and ``failures_per_run``: kills in each
    (the paper injects three), each recovery complete before the next kill (a bounded
    input too short for that is read for longer; a ``duration_s`` too short is
    refused, naming the length needed; `RayProfiler`); every kill is one measurement,
    and the medians over an interval's kills and repeats are modelled (the paper ran
    five runs). ``failures_per_run=1`` is one kill per run, in ``kill_between_s``.
    ``case`` is the TRT the bound applies to: ``"max"`` (worst case, the default),
    ``"avg"`` or ``"min"``. ``parallel``: profiling runs side by side, as many as the
    cluster's CPUs hold (1: one after the other). ``duration_s``: seconds per run for
    an unbounded topology. ``kill_between_s``: when the injected kill may fall
    (default: the middle fifth of a run, moved after 1 s and two whole longest
    intervals as far as 80% of the run allows; with several kills, the window
    they are spread over). ``max_rate_run_s``: the unthrottled run's
    length. ``progress`` gets ``{"done", "total", "what"}`` after every run. Other
    keyword arguments go to every `bastion.run` (``storage``, ``heartbeat_timeout_s``,
    ``address``, ...). ``profiler`` replaces the Ray profiler (what it measures is
    modelled the same way). The profiling jobs are deleted from the store once
    measured (about 100 MB for a default tuning), unless ``keep_profiles``: the
    result's job ids then name folders that still exist."""
    if trt_bound_s is None or trt_bound_s <= 0:
        raise ValueError(f"trt_bound_s must be > 0 seconds, got {trt_bound_s}")
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    if (isinstance(failures_per_run, bool) or not isinstance(failures_per_run, int)
            or failures_per_run < 1):
        raise ValueError(f"failures_per_run must be an int >= 1 (kills per profiling run), "
                         f"got {failures_per_run!r}")
    if protocol in ("none", "acks"):
        raise ValueError(f"protocol={protocol!r} takes no checkpoints: tuning the "
                         "checkpoint interval needs a checkpointing protocol, e.g. "
                         "'coordinated'")
    for name in ("checkpoint_interval", "faults"):
        if name in run_options:
            raise ValueError(f"{name} is chosen by tune for each profiling run: do not "
                             "pass it")
    from bastion.launcher import OLD_KEYWORDS, refuse_old_keywords

    refuse_old_keywords({name: value for name, value in run_options.items()
                         if name in OLD_KEYWORDS}, "bn.tune")
    intervals = grid(min_interval_s, max_interval_s, points)
    if profiler is None:
        profiler = RayProfiler(topology, protocol=protocol, duration_s=duration_s,
                               kill_between_s=kill_between_s, max_rate_run_s=max_rate_run_s,
                               capacity_interval_s=intervals[len(intervals) // 2],
                               first_kill_after_s=max_interval_s,
                               seed=seed, run_options=dict(run_options),
                               failures_per_run=failures_per_run)
        if parallel > 1:
            parallel = room_for_copies(topology, run_options, parallel)
    capacity, measurements = profile_all(profiler, intervals, parallel=parallel,
                                         repeats=repeats, progress=progress)
    if isinstance(profiler, RayProfiler) and not keep_profiles:
        _delete_profiles(run_options.get("storage"),
                         [capacity.job_id, *(m.job_id for m in measurements)])
    model = build_model(measurements, capacity, stop_term_s)
    choice: Choice = optimise(model, trt_bound_s, min_interval_s, max_interval_s, case)
    return TuningResult(
        interval_s=choice.interval_s,
        trt_s=None if choice.trt is None else (choice.trt.min_s, choice.trt.avg_s,
                                               choice.trt.max_s),
        latency_ms=choice.latency_ms, trt_bound_s=trt_bound_s, case=case,
        reason=choice.reason, measurements=tuple(measurements), capacity=capacity,
        model=model, parallel=parallel)


def _delete_profiles(storage: str | None, job_ids: list[str]) -> None:
    """Delete the profiling jobs (a measurement of repeated runs names them all,
    space-separated) from ``storage`` (None: `bastion.run`'s default)."""
    import inspect

    from bastion.launcher import run
    from bastion.storage import delete_job, open_store

    store = open_store(storage or inspect.signature(run).parameters["storage"].default)
    for job_id in {j for ids in job_ids for j in ids.split()}:
        delete_job(store, job_id)


# -- profiling with real runs ------------------------------------------------------------------
#
# The scheduler defines what tuning needs measured (`bastion.scheduler.tuning.Profiler`)
# and imports nothing above the runtime; the profiler that runs real jobs, and the
# reading of those runs through the drills' matching of kills with events, live here,
# above the launcher and the drills they use.


# Seconds a recovery is given before the next kill of a run (`RayProfiler.kill_gap_s`):
# detection and restart (0.1-0.3 s here, a heartbeat timeout at worst) plus a warm-up
# and the settling before a latency is measured again ...
RECOVERY_ALLOWANCE_S = 1.5
# ... plus the catch-up of a backlog of up to the interval and the outage, at the
# utilisation the capacity run implies (U/(1-U) seconds per second of backlog, at
# least 1: a utilisation of one half, before the capacity is known)
OUTAGE_ALLOWANCE_S = 1.0


@dataclass
class RayProfiler:
    """Profiles ``topology`` with real `bastion.run` jobs under ``protocol``.

    Each profiling run reads the topology's own input (``duration_s`` for an
    unbounded one) and is killed ``failures_per_run`` times (Chiron injects three),
    at random points, reproducibly from the seed.

    One kill: at a random point of ``kill_between_s`` — by default the middle fifth of
    the run, moved to after the run settled and two whole ``first_kill_after_s`` (the
    longest interval profiled) passed, as far as 80% of the run allows: a kill before
    the first checkpoint restarts the job from the beginning, where a paced source
    starts its schedule over and nothing has to be caught up, and L_avg is read over
    whole intervals before the first kill (`failure_free_latency_ms`).

    Several kills: each recovery must complete before the next kill, so consecutive
    kills are at least `kill_gap_s` apart (a recovery's allowance: it grows with the
    interval, whose backlog is read again, and with the utilisation the capacity run
    implies); the kills fall at random in ``kill_between_s`` (default: from after the
    settled run's first two whole longest intervals until one gap before the end), each
    ``kill_gap_s`` after the one before plus a random share of the window's slack.
    A bounded topology whose input is too short for that is read for longer (its
    generators' ``count`` raised: the same records, and more of them, at the same
    rate); a ``duration_s`` or a ``kill_between_s`` given too short is refused,
    naming the length needed. A kill that still lands before the recovery from the
    one before caught up (a burst of load) is not measured, and that recovery's TRT
    is unknown (`kill_outcomes_of`).

    The capacity run reads the unthrottled copy for ``max_rate_run_s``.
    ``run_options`` go to every `bastion.run` (storage, heartbeat_timeout_s,
    address, ...)."""

    topology: "Topology"
    protocol: str = "coordinated"
    duration_s: float | None = None
    kill_between_s: tuple[float, float] | None = None
    max_rate_run_s: float = 4.0
    capacity_interval_s: float | None = None
    first_kill_after_s: float = 0.0
    seed: int = 0
    run_options: dict[str, Any] = field(default_factory=dict)
    failures_per_run: int = 1
    _utilisation: float | None = field(default=None, init=False, repr=False)
    _window_given: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        _paced_sources(self.topology)
        if (isinstance(self.failures_per_run, bool) or not isinstance(self.failures_per_run, int)
                or self.failures_per_run < 1):
            raise ValueError(f"failures_per_run must be an int >= 1 (kills per profiling "
                             f"run), got {self.failures_per_run!r}")
        length = self.duration_s or expected_run_s(self.topology)
        if length is None:
            raise ValueError("the topology has an unbounded source: pass duration_s, the "
                             "seconds each profiling run lasts")
        self._window_given = self.kill_between_s is not None
        if self.kill_between_s is None:
            first = min(max(0.4 * length, self._first_kill_s()), 0.8 * length)
            self.kill_between_s = (first, min(max(0.6 * length, first + 0.2 * length),
                                              0.8 * length))
        lo, hi = self.kill_between_s
        if not 0 < lo <= hi:
            raise ValueError(f"kill_between_s must be (first, last) seconds with 0 < first "
                             f"<= last, got {self.kill_between_s}")
        if self.max_rate_run_s <= 0:
            raise ValueError(f"max_rate_run_s must be > 0 seconds, got {self.max_rate_run_s}")
        if self.failures_per_run > 1:   # refuse a length given too short before any run
            self.kill_layout(self.first_kill_after_s or lo)

    def kill_gap_s(self, interval_s: float) -> float:
        """The least time between two kills of a run at ``interval_s``: what its
        recovery takes at most, with room to measure the latency after it —
        `RECOVERY_ALLOWANCE_S` plus (the interval + `OUTAGE_ALLOWANCE_S`) times
        ``U/(1-U)`` (at least 1; U from the capacity run once it ran)."""
        u = 0.5 if self._utilisation is None else self._utilisation
        return RECOVERY_ALLOWANCE_S + (interval_s + OUTAGE_ALLOWANCE_S) * max(1.0, u / (1 - u))

    def _first_kill_s(self) -> float:
        """The earliest first kill the default windows allow: the run settled and
        `LATENCY_INTERVALS` of `first_kill_after_s` (the longest interval) passed, so
        that L_avg is read over that many whole intervals at least
        (`failure_free_latency_ms`), and the kill comes after the first checkpoints."""
        return failure_free_lead_s(self.first_kill_after_s) + 0.25

    def kill_layout(self, interval_s: float) -> tuple[tuple[float, float], float]:
        """Where the kills of a run at ``interval_s`` may fall, and how long the run
        must read (seconds): ``failures_per_run`` kills `kill_gap_s` apart and one gap
        after the last. A length or window the caller gave too short: a ValueError
        naming what to change."""
        k = self.failures_per_run
        gap = self.kill_gap_s(interval_s)
        length = self.duration_s or expected_run_s(self.topology)
        assert length is not None and self.kill_between_s is not None
        if self._window_given:
            lo, hi = self.kill_between_s
            if hi - lo < (k - 1) * gap:
                raise ValueError(
                    f"kill_between_s={self.kill_between_s}: {k} kills per profiling run at "
                    f"a {interval_s:g}-s interval must be {gap:.1f} s apart (each recovery "
                    f"completes before the next kill), so the window must span at least "
                    f"{(k - 1) * gap:.1f} s; widen it, or lower failures_per_run")
            return (lo, hi), max(length, hi + gap)
        lo = self._first_kill_s()
        # at least half a gap of slack: the kills' phases against the checkpoints vary
        needed = lo + (k - 1) * gap + gap / 2 + gap
        if self.duration_s is not None and self.duration_s < needed:
            raise ValueError(
                f"duration_s={self.duration_s:g}: {k} kills per profiling run at a "
                f"{interval_s:g}-s interval, each {gap:.1f} s after the one before (its "
                f"recovery completes first) and the first after {lo:.1f} s, need runs of "
                f"at least {needed:.1f} s; raise duration_s, lower failures_per_run or the "
                f"longest interval")
        length = max(length, needed)
        return (lo, length - gap), length

    def _run(self, topology: "Topology", interval_s: float, **options: Any) -> "RunResult":
        from bastion.launcher import run
        from bastion.protocols import named

        own = own_outputs(topology, f"tune-{uuid.uuid4().hex[:8]}")
        try:
            return run(own, named(self.protocol, interval_s=interval_s),
                       **{**self.run_options, **options})
        finally:
            discard_outputs(own)

    def capacity(self) -> Capacity:
        # the capacity run checkpoints as the profiling runs do (the middle of their range)
        interval_s = (1.0 if self.capacity_interval_s is None
                      else self.capacity_interval_s)
        result = self._run(unthrottled(self.topology), interval_s,
                           duration_s=self.max_rate_run_s)
        found = capacity_of(result.details["timeline"])
        rate = sum(s.rate for s in _paced_sources(self.topology).values())
        self._utilisation = min(0.9, rate / found.ingest_max_per_s)
        return Capacity(found.ingest_max_per_s, found.warmup_s, result.job_id)

    def kill_times(self, interval_s: float, seed: int) -> list[float]:
        """When the kills of one run at ``interval_s`` fall (seconds after its start):
        `kill_gap_s` apart, each plus a random share of the window's slack."""
        import random

        (lo, hi), _ = self.kill_layout(interval_s)
        k, gap = self.failures_per_run, self.kill_gap_s(interval_s)
        rng = random.Random(self.seed * 1000 + seed)
        slack = max(0.0, hi - lo - (k - 1) * gap)
        offsets = sorted(rng.uniform(0, slack) for _ in range(k))
        return [round(lo + i * gap + offset, 3) for i, offset in enumerate(offsets)]

    def profile(self, interval_s: float, seed: int) -> list[Measurement]:
        from bastion.faults import RandomKills

        assert self.kill_between_s is not None
        topology = self.topology
        options: dict[str, Any] = {}
        if self.duration_s is not None:
            options["duration_s"] = self.duration_s
        if self.failures_per_run == 1:
            kills = [RandomKills(1, between=self.kill_between_s,
                                 seed=self.seed * 1000 + seed)]
        else:
            _, length = self.kill_layout(interval_s)
            if self.duration_s is not None:
                options["duration_s"] = length
            else:
                topology = lengthened(topology, length)
            kills = [RandomKills(1, between=(at, at), seed=self.seed * 1000 + seed + 7 * i)
                     for i, at in enumerate(self.kill_times(interval_s, seed))]
        options["faults"] = kills
        result = self._run(topology, interval_s, **options)
        plan = _plan_of(topology, self.run_options)
        return measure_kills(result, [k for f in kills for k in f.schedule(plan)], interval_s)


def room_for_copies(topology: "Topology", run_options: Mapping[str, Any], wanted: int
                    ) -> int:
    """How many profiling runs the cluster can hold side by side: its CPUs over the
    worker processes one run uses (at least 1, at most ``wanted``)."""
    import ray

    from bastion.launcher import ensure_ray

    ensure_ray(run_options.get("address"))
    cpus = int(ray.cluster_resources().get("CPU", 1))
    workers = max(1, _plan_of(topology, run_options).workers)
    return max(1, min(wanted, cpus // workers))


def kill_outcome(result: "RunResult", kills: Sequence[Any]) -> KillOutcome:
    """The first landed kill of a run, through the drills' matching of kills with
    the job master's events."""
    events, timeline = result.details["events"], result.details["timeline"]
    return kill_outcome_of(kills, events, timeline, result.metrics.duration_s, result.job_id)


def kill_outcome_of(kills: Sequence[Any], events: Sequence[Mapping[str, Any]],
                    timeline: Sequence[Mapping[str, Any]], ended_s: float | None = None,
                    job_id: str = "") -> KillOutcome:
    """`kill_outcome` from a run's (or a drill report's) events and timeline: the
    figures a drill of the run reports (`bastion.runtime.recovery_times`)."""
    return kill_outcomes_of(kills, events, timeline, ended_s, job_id)[0]


def kill_outcomes_of(kills: Sequence[Any], events: Sequence[Mapping[str, Any]],
                     timeline: Sequence[Mapping[str, Any]], ended_s: float | None = None,
                     job_id: str = "") -> list[KillOutcome]:
    """Every landed kill of a run, in order, each with its own T, R, E and observed
    TRT. A kill that landed while the job was still recovering from the one before
    (its restart is that recovery's) is left out; the one before keeps its T, R and
    E, and its TRT is unknown (None): the second outage is inside its catch-up."""
    from bastion.drills import fault_outcomes

    outcomes = fault_outcomes(kills, events, timeline, ended_s)
    landed = [o for o in outcomes if o.landed and o.restart_s is not None]
    if not landed:
        notes = "; ".join(o.describe() for o in outcomes) or "no kill was scheduled"
        raise ProfilingError(f"job {job_id}: the injected kill did not land ({notes}); "
                           "make the runs longer or kill earlier (kill_between_s)")
    found: list[KillOutcome] = []
    for o in landed:
        at_s = o.at_s if o.at_s is not None else o.scheduled_s
        if found and o.detection_s is None:   # inside the previous recovery
            found[-1] = dataclasses.replace(found[-1], trt_s=None)
            continue
        if found and (found[-1].trt_s is None or found[-1].at_s + found[-1].trt_s > at_s):
            found[-1] = dataclasses.replace(found[-1], trt_s=None)
        assert o.restart_s is not None   # `landed` kept only kills with a restart
        found.append(KillOutcome(at_s=at_s, detection_s=o.detection_s or 0.0,
                                 restart_s=o.restart_s, trt_s=o.trt_s,
                                 reprocess_s=reprocessed_s(events, at_s)))
    return found


def measure_run(result: "RunResult", kills: Sequence[Any], interval_s: float,
                settle_s: float | None = None) -> Measurement:
    """A `Measurement` from a run with one injected kill: I_avg from ``settle_s``
    after the start (default: 1 s, or 30% of the time to the kill if that is
    shorter) until the kill; L_avg over the same failure-free seconds
    (`failure_free_latency_ms`); T, R and the observed TRT of the kill."""
    outcome = kill_outcome(result, kills)
    if settle_s is None:
        settle_s = settle_s_before(outcome.at_s)
    timeline = result.details["timeline"]
    rate = ingest_rate(timeline, settle_s, outcome.at_s)
    if rate is None:
        raise ProfilingError(f"job {result.job_id}: too little ran before the kill at "
                           f"{outcome.at_s:.2f} s to measure the ingest rate; kill later")
    latency = failure_free_latency_ms(timeline, result.metrics, result.details["started_s"],
                                      outcome, settle_s, interval_s)
    return Measurement(interval_s=interval_s, ingest_avg_per_s=rate, latency_avg_ms=latency,
                       detection_s=outcome.detection_s, restart_s=outcome.restart_s,
                       measured_trt_s=outcome.trt_s, kill_at_s=outcome.at_s,
                       reprocess_s=outcome.reprocess_s, job_id=result.job_id,
                       checkpoint_s=checkpoint_duration_s(result.details["events"],
                                                          outcome.at_s))


def measure_kills(result: "RunResult", kills: Sequence[Any], interval_s: float,
                  settle_s: float | None = None) -> list[Measurement]:
    """One `Measurement` per landed kill of a run with several (`failures_per_run`),
    each of its own recovery: T, R, E and the observed TRT of that kill; I_avg from
    ``settle_s`` after the previous recovery caught up (after the start, for the
    first) until the kill — the first kill's rate when that window read too little;
    L_avg, the run's, before its first kill (`failure_free_latency_ms`): the windows
    between recoveries held their tails. One kill: exactly `measure_run`."""
    if len(kills) == 1:
        return [measure_run(result, kills, interval_s, settle_s)]
    events, timeline = result.details["events"], result.details["timeline"]
    outcomes = kill_outcomes_of(kills, events, timeline, result.metrics.duration_s,
                                result.job_id)
    first = outcomes[0]
    if settle_s is None:
        settle_s = settle_s_before(first.at_s)
    first_rate = ingest_rate(timeline, settle_s, first.at_s)
    if first_rate is None:
        raise ProfilingError(f"job {result.job_id}: too little ran before the first kill "
                             f"at {first.at_s:.2f} s to measure the ingest rate; kill later")
    # L_avg is the interval's, not the kill's: every kill of the run gets the run's
    # failure-free latency, before its first kill (`failure_free_latency_ms`)
    latency = failure_free_latency_ms(timeline, result.metrics, result.details["started_s"],
                                      first, settle_s, interval_s)
    measured = []
    for i, o in enumerate(outcomes):
        before = outcomes[i - 1] if i else None
        rate = first_rate
        if before is not None and before.trt_s is not None:
            rate = ingest_rate(timeline, before.at_s + before.trt_s + settle_s,
                               o.at_s) or first_rate
        measured.append(Measurement(
            interval_s=interval_s, ingest_avg_per_s=rate, latency_avg_ms=latency,
            detection_s=o.detection_s, restart_s=o.restart_s, measured_trt_s=o.trt_s,
            kill_at_s=o.at_s, reprocess_s=o.reprocess_s, job_id=result.job_id,
            checkpoint_s=checkpoint_duration_s(events, o.at_s), kill_index=i))
    return measured


# -- the HTML page ----------------------------------------------------------------------------

_W, _H, _PAD = 560, 320, 48
_COLOURS = {"min": "#2a9d8f", "avg": "#e9c46a", "max": "#e76f51", "latency": "#264653",
            "observed": "#000000"}


def _chart(title: str, xs_range: tuple[float, float], curves: dict[str, Callable[[float], float]],
           dots: dict[str, list[tuple[float, float]]], y_label: str,
           hline: tuple[float, str] | None = None, vline: float | None = None) -> str:
    lo, hi = xs_range
    if hi <= lo:
        hi = lo + 1.0
    samples = [lo + (hi - lo) * i / 100 for i in range(101)]
    values = [f(x) for f in curves.values() for x in samples]
    values += [y for pts in dots.values() for _, y in pts]
    if hline is not None:
        values.append(hline[0])
    y_lo, y_hi = min(values + [0.0]), max(values)
    if y_hi <= y_lo:
        y_hi = y_lo + 1.0
    y_hi += 0.05 * (y_hi - y_lo)

    def px(x: float) -> float:
        return _PAD + (x - lo) / (hi - lo) * (_W - 2 * _PAD)

    def py(y: float) -> float:
        return _H - _PAD - (y - y_lo) / (y_hi - y_lo) * (_H - 2 * _PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
             f'role="img" aria-label="{html.escape(title)}">',
             f'<text x="{_W / 2}" y="18" text-anchor="middle" font-weight="bold">'
             f'{html.escape(title)}</text>',
             f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#000"/>',
             f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#000"/>',
             f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle">checkpoint interval (s)</text>',
             f'<text x="14" y="{_H / 2}" transform="rotate(-90 14 {_H / 2})" '
             f'text-anchor="middle">{html.escape(y_label)}</text>']
    for i in range(5):
        x = lo + (hi - lo) * i / 4
        y = y_lo + (y_hi - y_lo) * i / 4
        parts.append(f'<text x="{px(x):.1f}" y="{_H - _PAD + 16}" text-anchor="middle" '
                     f'font-size="11">{x:.2f}</text>')
        parts.append(f'<text x="{_PAD - 4}" y="{py(y) + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{y:.1f}</text>')
    for name, f in curves.items():
        path = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(f(x)):.1f}"
                        for i, x in enumerate(samples))
        parts.append(f'<path d="{path}" fill="none" stroke="{_COLOURS[name]}" '
                     f'stroke-width="2"><title>{html.escape(name)} fit</title></path>')
    for name, pts in dots.items():
        for x, y in pts:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" '
                         f'fill="{_COLOURS[name]}"><title>{name}: {x:.2f} s, '
                         f'{y:.2f}</title></circle>')
    if hline is not None:
        parts.append(f'<line x1="{_PAD}" y1="{py(hline[0]):.1f}" x2="{_W - _PAD}" '
                     f'y2="{py(hline[0]):.1f}" stroke="#c00" stroke-dasharray="6 4"/>'
                     f'<text x="{_W - _PAD}" y="{py(hline[0]) - 4:.1f}" text-anchor="end" '
                     f'fill="#c00" font-size="12">{html.escape(hline[1])}</text>')
    if vline is not None:
        parts.append(f'<line x1="{px(vline):.1f}" y1="{_PAD}" x2="{px(vline):.1f}" '
                     f'y2="{_H - _PAD}" stroke="#555" stroke-dasharray="2 3"/>'
                     f'<text x="{px(vline) + 4:.1f}" y="{_PAD + 12}" font-size="12">'
                     f'chosen {vline:.2f} s</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(result: TuningResult, title: str = "checkpoint-interval tuning") -> str:
    """A self-contained page: the decision, the TRT and latency fits with the
    measured points and the bound, and the table of measurements."""
    model = result.model
    xs = [p.measurement.interval_s for p in model.points]
    span = (min(xs), max(xs))
    trt_chart = _chart(
        "total recovery time (predicted)", span,
        {c: model.trt_fits[c] for c in CASES},
        {**{c: [(p.measurement.interval_s, p.trt.of(c)) for p in model.points] for c in CASES},
         "observed": [(m.interval_s, m.measured_trt_s) for m in result.measurements
                      if m.measured_trt_s is not None]},
        "TRT (s)", hline=(result.trt_bound_s, f"bound {result.trt_bound_s:g} s"),
        vline=result.interval_s)
    latency_chart = _chart(
        "average end-to-end latency", span, {"latency": model.latency_fit},
        {"latency": [(p.measurement.interval_s, p.measurement.latency_avg_ms)
                     for p in model.points]}, "L_avg (ms)", vline=result.interval_s)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TuningResult.HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in result.rows())
    legend = " ".join(f'<span style="color:{_COLOURS[c]}">&#9632; TRT {c}</span>'
                      for c in CASES) + (' <span>&#9679; TRT observed in a profiling run '
                                         '(kill to caught up)</span>')
    cap = result.capacity
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
.verdict{{font-size:1.2em;padding:.5em;background:{'#e8f5e9' if result.meets_bound else '#fdecea'}}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="verdict">{html.escape(result.reason)}</p>
<p>Bound: {result.case} TRT &le; {result.trt_bound_s:g} s. I_max {cap.ingest_max_per_s:,.0f}
records/s unthrottled, {model.catch_up_per_s:,.0f} records/s as the recoveries read their
backlog (the rate the model uses), warm-up W best/average/worst {"/".join(f"{w:.2f}" for w in model.warmup_s)} s
(cold start {cap.warmup_s:.2f} s). {html.escape(result.fits())}. {legend}</p>
{trt_chart}
{latency_chart}
<h2>Measurements</h2>
<table><tr>{head}</tr>{body}</table>
</body></html>
"""


def write_html(result: TuningResult, path: str | Path, title: str = "checkpoint-interval tuning"
               ) -> Path:
    """Write `render_html` to ``path`` and return it."""
    out = Path(path)
    out.write_text(render_html(result, title), encoding="utf-8")
    return out


__all__ = ["TuningResult", "render_html", "tune", "write_html"]
