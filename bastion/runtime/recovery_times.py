"""Recovery times: what "recovered" and "caught up" mean, defined once.

Every command that reports how a job came back from a failure — ``bastion drill``
(`bastion.drills`), ``bastion run`` (the job master's ``recovery`` events,
`bastion.runtime.job`), ``bastion tune`` (`bastion.scheduler.tuning`, which fits its
model to these figures) and ``bastion analyze`` (`bastion.spark_jobs.analyze`, over
the stored event logs) — computes them here, from the same two inputs: the job
master's events (``fault``, ``failure_detected``, ``restarted``) and its progress
timeline (a point every ~0.1 s: records the sources read and the sinks received since
the point before, and the sources' backlog ``source_lag`` — input due by the
sources' schedule and not yet read). So the same run reads the same in every command.

**The failure** is when it happened as the job saw it: the injected kill when there
was one (the first ``fault`` since the previous restart), else its detection — a
real crash leaves no earlier trace. Every figure below is seconds, and each is one
milestone, measured from the failure except the restart:

- *detection* — failure → the job master noticed (None without an injected fault:
  the failure *is* its detection);
- *restart* — detection → every task runs again from the recovery line (a phase, as
  Chiron's R: `bastion.scheduler.tuning` adds T and R in its eq 5);
- *recovery* — failure → the sinks' output rate, over `RATE_SAMPLES` consecutive
  points after the restart, is back to `RECOVERED_RATE_SHARE` of its rate in the
  `STEADY_WINDOW_S` before the failure (`rate_recovered_at`): the service is back;
- *total recovery time* (TRT) — failure → the job is where it would have been
  without the failure: its output rate is back (recovery) *and* the sources have
  *caught up* (`caught_up_at`). The later of the two, so recovery ≤ TRT always.

**Caught up** means the backlog the outage piled up is read: the sources' lag is
back to its level before the failure, as the sources report it, while the sinks
write again. Not "lag 0": a paced source always has a few records due and unread
between two reads, so the level to return to is the largest lag of the
`STEADY_WINDOW_S` before the failure. And not the first point at that level: a
restarted job has hiccups of its own a few tenths of a second after its catch-up (a
new standby process starts beside it), which moved the end of a catch-up that had
left 9 records behind (7 ms of input) by a second, so the same kill measured 0.5 s
or 3 s at random. The rule takes the first point (of those every worker answered:
a source too busy to answer reports no backlog and would look caught up in the
middle of its catch-up) whose backlog is within what the timeline can resolve —
at most that level, or one point's worth of input — and moves it to where the
backlog meets the level, at the drain rate the catch-up showed (the fastest read
rate since the restart less the rate input arrived at before the failure): after the
point while some is left, within it when it shows none. Taken at the point itself,
every recovery measured up to ``period·U/(1-U)`` short of the backlog's end — the
TRT that Chiron's model predicts — and tuning read that as a negative warm-up.

Why TRT includes the output rate: a source that is not paced has no backlog to
measure (it reads as fast as the job takes), so it "caught up" at the first point
after the restart, while its output was still a trickle; and a drill that printed
``recovery 0.80 s, total recovery 0.22 s`` said the whole took less than its part.

Laws that hold by construction and that `RecoveryTimes.violations` checks (a
report that breaks one was not made here, or was edited): every figure ≥ 0;
detection + restart ≤ recovery ≤ TRT where they are defined (the rate is judged
only on points after the restart, and TRT is the later milestone).

Two things named alike are not figures: the job master borrows a new standby once a
poll says the backlog *would be read within one poll interval*
(`bastion.runtime.progress.caught_up`, a scheduling decision that wants to start the
standby slightly early), and `bastion.scheduler.catchup` restores a worker's CPU
priority once no replay feeds its tasks.

This module imports only the standard library: the analysis imports it in Spark
tasks (a pure-Python function over one job's collected rows).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

#: The seconds before a failure whose rate and backlog are "normal".
STEADY_WINDOW_S = 1.5
#: "Normal execution again": this share of the output rate before the failure.
RECOVERED_RATE_SHARE = 0.9
#: Consecutive progress points the output rate is judged over (one is noise).
RATE_SAMPLES = 3
#: Points this early are the job starting, not its normal rate.
_STARTING_S = 0.3
#: Rounding slack for the laws: events and points are stamped by different clocks'
#: subtraction (``t - started``), which may differ in the last digits.
_SLACK_S = 1e-6

Point = Mapping[str, Any]
Event = Mapping[str, Any]


def _count(p: Point, name: str) -> int:
    """A count of a progress point; 0 when absent (an older writer's point)."""
    return p.get(name) or 0


def _answered_by_all(timeline: Sequence[Point]) -> list[bool]:
    """Per point, whether every worker answered its poll (points without the field,
    from an older writer, count as answered)."""
    everyone = max((p.get("workers_answering", 0) for p in timeline), default=0)
    return [p.get("workers_answering", everyone) >= everyone for p in timeline]


def rate_before(timeline: Sequence[Point], failed_at_s: float) -> float | None:
    """The sinks' output rate (records/s) in the `STEADY_WINDOW_S` before the
    failure; None when no point is there (the failure came first)."""
    before = [p for p in timeline if failed_at_s - STEADY_WINDOW_S <= p["t_s"] < failed_at_s
              and p["t_s"] > _STARTING_S]
    if not before:
        return None
    span_s = max(before[-1]["t_s"] - before[0]["t_s"], 1e-9) + 0.1
    return sum(_count(p, "sink_records") for p in before) / span_s


def rate_recovered_at(timeline: Sequence[Point], failed_at_s: float,
                      restarted_at_s: float) -> float | None:
    """When (seconds since the job started) the sinks' output rate, over
    `RATE_SAMPLES` consecutive points after the restart, is back to
    `RECOVERED_RATE_SHARE` of `rate_before`; None when it never is, or when nothing
    was written before the failure to compare with."""
    before_per_s = rate_before(timeline, failed_at_s)
    if not before_per_s:
        return None
    after = [p for p in timeline if p["t_s"] >= restarted_at_s]
    for i in range(len(after) - RATE_SAMPLES + 1):
        window = after[i:i + RATE_SAMPLES]
        span_s = max(window[-1]["t_s"] - window[0]["t_s"], 1e-9) + 0.1
        if (sum(_count(p, "sink_records") for p in window) / span_s
                >= RECOVERED_RATE_SHARE * before_per_s):
            return window[0]["t_s"]
    return None


def caught_up_at(timeline: Sequence[Point], failed_at_s: float, restarted_at_s: float
                 ) -> float | None:
    """When the sources caught up after a restart (seconds since the job started;
    the module says what that means and why), or None when they never did."""
    answered = _answered_by_all(timeline)
    before = [p for p, full in zip(timeline, answered)
              if full and failed_at_s - STEADY_WINDOW_S <= p["t_s"] < failed_at_s]
    steady = max((_count(p, "source_lag") for p in before), default=0)
    one_point = (statistics.median(_count(p, "source_records") for p in before)
                 if before else 0)
    tolerance = max(steady, one_point)
    spacing = [b["t_s"] - a["t_s"] for a, b in zip(before, before[1:])]
    arriving_per_s = one_point / statistics.median(spacing) if spacing else None
    fastest_per_s = 0.0  # the sources' read rate while catching up: the fastest seen
    for i, p in enumerate(timeline):
        if not answered[i] or p["t_s"] < restarted_at_s:
            continue
        # the point's reads: since the poll before it, or the restart if later
        began_s = max(restarted_at_s, timeline[i - 1]["t_s"] if i else restarted_at_s)
        reading_s = p["t_s"] - began_s
        if reading_s > 0:
            fastest_per_s = max(fastest_per_s, _count(p, "source_records") / reading_s)
        lag = _count(p, "source_lag")
        if lag > tolerance or _count(p, "sink_records") <= 0:
            continue
        draining_per_s = 0.0 if arriving_per_s is None else fastest_per_s - arriving_per_s
        if draining_per_s <= 0:  # no drain to go by: the point itself
            return p["t_s"]
        if lag > steady:  # the rest drains after the point
            return p["t_s"] + (lag - steady) / draining_per_s
        # back at the steady level within the point: its backlog when its reads
        # began was what the reads beyond the input arriving meanwhile took off
        drained = max(0.0, _count(p, "source_records") - arriving_per_s * reading_s)
        return min(p["t_s"], began_s + max(0.0, drained + lag - steady) / draining_per_s)
    return None


@dataclass(frozen=True)
class RecoveryTimes:
    """One failure's figures, in seconds (the module defines each); None where the
    run does not show it."""

    failed_at_s: float            # since the job started: the fault, or the detection
    detection_s: float | None     # failure -> detected
    restart_s: float | None       # detected (or the failure) -> every task runs again
    recovery_s: float | None      # failure -> output rate back
    trt_s: float | None           # failure -> output rate back and sources caught up

    def violations(self) -> list[str]:
        """The laws this record breaks, in words ([] for any record `recovery_times`
        made): every figure >= 0, detection + restart <= recovery <= TRT."""
        broken = [f"{name} {value:.3f} s < 0" for name, value in (
            ("detection", self.detection_s), ("restart", self.restart_s),
            ("recovery", self.recovery_s), ("total recovery", self.trt_s))
            if value is not None and value < -_SLACK_S]
        running_s = (self.detection_s or 0.0) + (self.restart_s or 0.0)
        for name, value in (("recovery", self.recovery_s), ("total recovery", self.trt_s)):
            if (value is not None and self.restart_s is not None
                    and value < running_s - _SLACK_S):
                broken.append(f"{name} {value:.3f} s < detection + restart "
                              f"{running_s:.3f} s")
        if (self.recovery_s is not None and self.trt_s is not None
                and self.trt_s < self.recovery_s - _SLACK_S):
            broken.append(f"total recovery {self.trt_s:.3f} s < recovery "
                          f"{self.recovery_s:.3f} s")
        return broken


def recovery_times(timeline: Sequence[Point], failed_at_s: float,
                   detected_at_s: float | None, restarted_at_s: float | None
                   ) -> RecoveryTimes:
    """The figures of a failure at ``failed_at_s``, detected at ``detected_at_s``
    (None: not detected by itself — a kill that hit a recovery in progress, which
    that recovery's restart covers) and running again at ``restarted_at_s`` (None:
    never), all in seconds since the job started, from the progress ``timeline``."""
    detection_s = (None if detected_at_s is None or detected_at_s == failed_at_s
                   else detected_at_s - failed_at_s)
    if restarted_at_s is None:
        return RecoveryTimes(failed_at_s, detection_s, None, None, None)
    restart_s = restarted_at_s - (failed_at_s if detected_at_s is None else detected_at_s)
    recovered = rate_recovered_at(timeline, failed_at_s, restarted_at_s)
    caught_up = caught_up_at(timeline, failed_at_s, restarted_at_s)
    if caught_up is None:
        back_s = None
    elif recovered is not None:
        back_s = max(caught_up, recovered)
    elif rate_before(timeline, failed_at_s):
        back_s = None    # there was a rate to come back to, and it never did
    else:
        back_s = caught_up   # nothing written before the failure to compare with
    return RecoveryTimes(failed_at_s, detection_s, restart_s,
                         None if recovered is None else recovered - failed_at_s,
                         None if back_s is None else back_s - failed_at_s)


def failures_in(events: Iterable[Event]) -> list[tuple[Event | None, Event, Event]]:
    """``(fault or None, failure_detected, restarted)`` of every failure a job
    recovered from, from its events in the order they happened. A failure is a
    ``failure_detected`` that starts a recovery and the ``restarted`` that ends it;
    one detected during a recovery extends that recovery. Its fault is the first
    injected ``fault`` since the previous restart (None: a real failure)."""
    found = []
    faults: list[Event] = []
    detected = None
    for event in events:
        kind = event["kind"]
        if kind == "fault":
            faults.append(event)
        elif kind == "failure_detected" and detected is None:
            detected = event
        elif kind == "restarted" and detected is not None:
            found.append((faults[0] if faults else None, detected, event))
            detected, faults = None, []
    return found

