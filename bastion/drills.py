"""Recovery drills: prove, by record identity, that a job loses, duplicates and
corrupts nothing when its processes are killed.

A drill runs a topology failure-free (the *reference*) and again while processes are
killed on a schedule (the *faulty* run), both with lineage ids (`bastion.lineage`):
every committed record carries the identity of the logical tuple it is, the same in
every run that produces it. The verifier then compares, per sink and per id:

- ``lost``: ids the reference committed that the faulty run did not;
- ``duplicated``: extra commits of an id (ids are unique within a sink, so every
  commit of an id after its first is one too many, whatever the reference says);
- ``corrupted``: ids committed with a value other than the reference's.

Why ids and not values: a running aggregate fed by several channels sees its inputs
in an interleaving that changes from run to run, so two *correct* runs commit
different intermediate values; comparing value multisets reports thousands of lost
and duplicated records where there are none. And the opposite error: a recovery that
restores a state already containing an input *and* replays that input commits the
right number of records with wrong values — only an id-by-id value check sees it.

Values are only comparable where the reference is reproducible, so the drill picks a
mode (`DrillReport.verified_by`):

- ``"deterministic"``: whenever the topology can run in deterministic mode
  (`bn.run(deterministic=True)`: every multi-input task merges its inputs in a fixed
  order), reference and faulty run both do, and every id's value must match (under
  ``acks``, which cannot merge in order, only the reference does: it runs stateless
  topologies only, whose values do not depend on the order). A fixed order makes a
  run reproducible only if the functions are pure, and functions that read the clock
  (a processing-time stamp) or draw at random (sampling) are everyday code. So when
  the faulty run lost or corrupted a record, the drill runs the reference a second
  time before it judges: values are then compared only for the operators whose
  values the two references reproduced, and where the references committed
  different records (a random sample) only duplicates are checked. Lost and
  duplicated records are still found where only values differed. What was not
  compared is named (`DrillReport.not_reproduced`): "values not compared: stamp in
  stamped — not reproducible between two failure-free runs". The second reference
  costs one more failure-free run, as long as the first, and only in a drill that
  found a difference: the second run can only take records out of the comparison,
  never add a violation, so a drill that found none needs none;
- ``"ids"``: otherwise (a feedback edge, windows on ingest time, ...) the reference
  runs twice. Ids present in both references must be committed — except ids that
  derive from a window or join on ingest time, which depend on when a run happened
  (two references run within one window share ids no later run makes). Values are
  checked per producing operator (the operator that made the id, its first element), and
  only for operators whose values the two references agreed on for *every* id: one
  disagreement shows the operator's values depend on timing (a running sum behind a
  parallel stage), and then a value that two references happen to share is no
  evidence either — a correct faulty run that saw another interleaving differs
  there (measured: ~800 of 3,600 records of such a sum, in every correct run). The
  report says how much was comparable.

A drill sees values only at sinks. A sink's records carry the id of the operator
that made them, so a disagreement is pinned to that operator and sink; when the
records passed through an operator that another sink shows disagreeing by itself,
the report names that one (`not_reproduced`).

The reference runs under protocol ``"none"`` (no checkpoints, one commit at the end):
a reference produced by the protocol under test would share that protocol's bugs,
and a bug present in both runs cancels out.

A drill must also have tested something. Fault targets are validated before the
reference runs, and after the faulty run each scheduled kill is checked: it *landed*
if it killed a process and the job then detected a failure (or the kill hit a
recovery already in progress, which the restart then covered). The verdict:

- ``"exactly-once"``: every fault landed and lost == duplicated == corrupted == 0;
- ``"at-least-once"``: under a protocol that promises only that (``acks``: it
  replays, so a record may be committed twice), every fault landed and lost ==
  corrupted == 0; the duplicates are counted and reported, not held against it;
- ``"violated"``: a record was lost, duplicated or corrupted — under an at-least-once
  protocol, lost or corrupted (found even when some fault did not land: a violation
  is a violation);
- ``"inconclusive"``: nothing was violated, but a fault did not land (the job ended
  first, the target had nothing to kill) or no reference record was reproducible —
  the drill proves nothing, and never says "exactly once".

For every fault the report gives detection (kill → job master notices), restart
(detection → every task runs again from the recovery line), recovery (kill → sink
output rate back to 90% of its rate before the kill) and total recovery time (kill →
output rate back and sources caught up with the input that arrived meanwhile), as
`bastion.runtime.recovery_times` defines them for every command; docs/metrics.md
lists every figure the summary prints.

`compare` and `fault_outcomes` are plain functions over run outputs and events:
unit-testable without Ray.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Literal, Mapping, Sequence

from bastion import faults as fault_injection
from bastion.faults import ScheduledKill
from bastion.launcher import (OLD_KEYWORDS, RunResult, ensure_ray, refuse_old_keywords,
                              resolve_options, run)
from bastion.lineage import ancestry, format_id, op_codes
from bastion.options import Redundancy
from bastion.protocols import Protocol, default_of, get_protocol
from bastion.runtime.merge import clock_dependent_operators, nondeterminism
from bastion.runtime.metrics import describe_injected
from bastion.runtime.plan import build_plan
from bastion.runtime.recovery_times import RecoveryTimes, recovery_times
from bastion.runtime.redundancy import resolve as resolve_redundancy
from bastion.topology import Topology

Verdict = Literal["exactly-once", "at-least-once", "violated", "inconclusive"]
VERDICTS: tuple[Verdict, ...] = ("exactly-once", "at-least-once", "violated", "inconclusive")
KINDS = ("lost", "duplicated", "corrupted")
GOOD = ("exactly-once", "at-least-once")  # verdicts that keep the protocol's promise
EXAMPLES = 5  # violations of each kind kept as examples
REFERENCE_PROTOCOL = "none"
GLOSSARY = "docs/metrics.md"   # what each printed figure means, one meaning each



# -- comparing committed outputs by id ------------------------------------------------------


@dataclass(frozen=True)
class Committed:
    """What one run committed: per sink, the values and their lineage ids (parallel
    lists, as `RunResult.outputs` and `RunResult.output_ids`)."""

    outputs: dict[str, Sequence[Any]]
    ids: dict[str, Sequence[Any]]

    @classmethod
    def of(cls, result: RunResult) -> "Committed":
        for sink, values in result.outputs.items():
            ids = result.output_ids.get(sink)
            if ids is None or len(ids) != len(values):
                raise ValueError(
                    f"run {result.job_id}: sink {sink!r} committed {len(values)} records "
                    f"but {'no' if ids is None else len(ids)} lineage ids; a drill compares "
                    "runs made with bn.run(..., lineage=True)")
        return cls(result.outputs, result.output_ids)


_ABSENT = object()  # "the reference has no record with this id"


@dataclass(frozen=True)
class Violation:
    """One lost, duplicated or corrupted record: its id, the value the reference
    committed under it (``expected``, None when the reference has no such id, see
    ``unexpected``) and every value the faulty run committed under it (``got``)."""

    kind: str
    sink: str
    record_id: Any
    expected: Any = None
    got: tuple = ()
    unexpected: bool = False  # the faulty run committed an id the reference never did


@dataclass(frozen=True)
class Disagreement:
    """Where two failure-free references disagreed, one per sink, producer and
    ``what``: ``"values"`` (an id committed with different values) or ``"records"``
    (deterministic mode: an id only one reference committed). ``record_id`` is the
    first such id, ``first`` and ``second`` what each reference committed under it
    (``()``: nothing)."""

    sink: str
    producer: Any
    what: Literal["values", "records"]
    record_id: Any
    first: tuple
    second: tuple


@dataclass
class Comparison:
    """The verifier's counts. ``comparable_ids``: reference records whose presence
    was checked (all of them in deterministic mode, unless two references disagreed
    on which records exist; in ids mode those whose id both references committed);
    ``comparable_values``: those whose value was checked too; ``unstable``:
    ``(sink, producer)`` pairs whose values the two references did not reproduce
    (producer: the code of the operator that made the id); ``disagreements``: every
    such pair, and in deterministic mode every pair whose records they did not
    reproduce, with an example."""

    lost: int = 0
    duplicated: int = 0
    corrupted: int = 0
    reference_records: int = 0
    comparable_ids: int = 0
    comparable_values: int = 0
    unverified: int = 0            # faulty-run records no check applies to
    reference_duplicates: int = 0  # ids a failure-free run committed twice (an engine bug)
    unstable: list[tuple[str, Any]] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    examples: dict[str, list[Violation]] = field(
        default_factory=lambda: {kind: [] for kind in KINDS})

    @property
    def violations(self) -> int:
        return self.lost + self.duplicated + self.corrupted

    def _note(self, violation: Violation, limit: int) -> None:
        kept = self.examples[violation.kind]
        if len(kept) < limit:
            kept.append(violation)


def same_value(a: Any, b: Any) -> bool:
    """Equality of committed values, where NaN equals NaN (a float aggregate can be
    NaN in both runs) and a list equals the tuple with the same items."""
    try:
        if a == b:
            return True
    except Exception:  # noqa: BLE001 - a value whose == raises is not "equal"
        pass
    if isinstance(a, float) and isinstance(b, float):
        return math.isnan(a) and math.isnan(b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(map(same_value, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return False


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def producer(record_id: Any) -> Any:
    """The code of the operator that made a record's id (None for a foreign id)."""
    return record_id[0] if isinstance(record_id, tuple) and record_id else None


def _by_id(committed: Committed, sink: str) -> dict[Any, list]:
    """id -> every value committed under it, ids in order of first commit."""
    values = committed.outputs.get(sink, [])
    ids = committed.ids.get(sink, [])
    index: dict[Any, list] = {}
    for rid, value in zip(ids, values):
        try:
            index.setdefault(rid, []).append(value)
        except TypeError:  # an id holding an unhashable key (never in Bastion's ids)
            index.setdefault(_hashable(rid), []).append(value)
    return index


def compare(reference: Committed, faulty: Committed,
            second_reference: Committed | None = None, *, examples: int = EXAMPLES,
            clocked: Callable[[Any], bool] = lambda record_id: False,
            deterministic: bool | None = None) -> Comparison:
    """Compare a faulty run's committed records with the reference's, id by id.

    ``deterministic`` (default: without ``second_reference``): the runs merged in a
    fixed order, so ids are reproducible: every id the reference committed must be
    committed once with the same value, and an id it never committed counts as
    corrupted (a record that should not exist).

    With ``second_reference`` values are only checked for producers (see `producer`)
    whose every value the two references agreed on, per sink. In deterministic mode
    that discounts functions that are not pure (a map that stamps ``time.time()``):
    their ids are still checked; and where the references committed different ids
    of a producer (a filter that samples at random), only duplicates are checked for
    it. In ids mode (not ``deterministic``) only ids both references committed are
    checked for presence, and faulty ids not both had are counted as ``unverified``.
    An id ``clocked`` says derives from a window on ingest time is never required
    (ids mode): which window a record falls in depends on when the run happened, so
    two references that ran within one window share ids no later run can make.
    """
    result = Comparison()
    if deterministic is None:
        deterministic = second_reference is None
    sinks = list(dict.fromkeys([*reference.outputs, *faulty.outputs]))
    for sink in sinks:
        want = _by_id(reference, sink)
        other = want if second_reference is None else _by_id(second_reference, sink)
        got = _by_id(faulty, sink)
        result.reference_records += len(reference.outputs.get(sink, []))
        result.reference_duplicates += sum(len(v) - 1 for v in want.values())
        unstable: set = set()    # producers whose values the references disagree on
        unrecorded: set = set()  # deterministic: producers whose ids they disagree on
        if second_reference is not None:
            result.reference_duplicates += sum(len(v) - 1 for v in other.values())
            unstable, unrecorded = _disagreements(result, sink, want, other, deterministic)
        for rid, expected_values in want.items():
            if (rid not in other or producer(rid) in unrecorded
                    or (not deterministic and clocked(rid))):
                continue  # this id is not reproducible, nothing to check
            result.comparable_ids += 1
            expected = expected_values[0]
            values_agree = producer(rid) not in unstable
            result.comparable_values += values_agree
            committed = got.get(rid)
            if committed is None:
                result.lost += 1
                result._note(Violation("lost", sink, rid, expected), examples)
            elif values_agree and not all(same_value(v, expected) for v in committed):
                result.corrupted += 1
                result._note(Violation("corrupted", sink, rid, expected, tuple(committed)),
                             examples)
        for rid, committed in got.items():
            if len(committed) > 1:
                result.duplicated += len(committed) - 1
                expected = want[rid][0] if rid in want else None
                result._note(Violation("duplicated", sink, rid, expected, tuple(committed),
                                       unexpected=rid not in want), examples)
            reproducible = producer(rid) not in unrecorded
            if rid in want and rid in other and reproducible and (
                    deterministic or not clocked(rid)):
                continue
            if deterministic and reproducible:
                result.corrupted += 1
                result._note(Violation("corrupted", sink, rid, None, tuple(committed),
                                       unexpected=True), examples)
            else:
                result.unverified += 1
    return result


def _disagreements(result: Comparison, sink: str, want: dict[Any, list],
                   other: dict[Any, list], deterministic: bool) -> tuple[set, set]:
    """The producers whose values, and (deterministic mode) whose ids, two references
    of ``sink`` disagree on; notes the first disagreement of each in ``result``.

    One disagreement disqualifies the producer: its values (or ids) depend on
    something besides the input — the clock, a random draw, the interleaving — and
    then one that two references happen to share is no evidence either."""
    unstable: dict[Any, Disagreement] = {}
    unrecorded: dict[Any, Disagreement] = {}
    for rid, first in want.items():
        second = other.get(rid)
        code = producer(rid)
        if second is None:
            if deterministic and code not in unrecorded:
                unrecorded[code] = Disagreement(sink, code, "records", rid, tuple(first), ())
        elif code not in unstable and not (len(first) == len(second) == 1
                                           and same_value(first[0], second[0])):
            unstable[code] = Disagreement(sink, code, "values", rid, tuple(first),
                                          tuple(second))
    if deterministic:
        for rid, second in other.items():
            if rid not in want and producer(rid) not in unrecorded:
                unrecorded[producer(rid)] = Disagreement(sink, producer(rid), "records", rid,
                                                         (), tuple(second))
    values = [d for code, d in unstable.items() if code not in unrecorded]
    noted = sorted([*values, *unrecorded.values()], key=lambda d: repr(d.producer))
    result.disagreements += noted
    result.unstable += [(sink, d.producer) for d in noted if d.what == "values"]
    return set(unstable), set(unrecorded)


# -- did every fault land? ----------------------------------------------------------------


@dataclass
class FaultOutcome:
    """One scheduled kill: whether it landed, and how the job came back from it.
    Times in seconds; ``at_s`` since the job started, ``restart_s`` since the
    detection, the others since the kill (`bastion.runtime.recovery_times`)."""

    what: str
    scheduled_s: float
    landed: bool
    note: str = ""                 # why it did not land, or how it landed
    at_s: float | None = None      # when it was carried out
    killed: list[str] = field(default_factory=list)
    detection_s: float | None = None
    restart_s: float | None = None
    recovery_s: float | None = None
    trt_s: float | None = None
    # the operator instances the recovery restarted ("op[index]"): all of them when
    # the job restarted whole, fewer when only the failure's region did
    restarted_tasks: list[str] = field(default_factory=list)

    def times(self) -> RecoveryTimes | None:
        """The recovery figures, to check their laws (`RecoveryTimes.violations`);
        None when the kill was not carried out."""
        if self.at_s is None:
            return None
        return RecoveryTimes(self.at_s, self.detection_s, self.restart_s, self.recovery_s,
                             self.trt_s)

    def describe(self) -> str:
        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} s"

        head = f"{self.what} at {self.scheduled_s:.2f} s"
        if not self.landed:
            return f"{head}: DID NOT LAND ({self.note})"
        text = (f"{head}: landed (killed {', '.join(self.killed)}); "
                f"detection {secs(self.detection_s)}, restart {secs(self.restart_s)}, "
                f"recovery {secs(self.recovery_s)}, total recovery {secs(self.trt_s)}")
        if self.restarted_tasks:
            text += f"; restarted {_restarted_summary(self.restarted_tasks)}"
        return text + (f" ({self.note})" if self.note else "")


def _restarted_summary(names: Sequence[str], shown: int = 6) -> str:
    """``names`` of restarted operator instances, the first ``shown`` of them named."""
    listed = ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")
    return f"{len(names)} operator instance{'s' if len(names) != 1 else ''} ({listed})"


def fault_outcomes(kills: Sequence[ScheduledKill], events: Sequence[Mapping[str, Any]],
                   timeline: Sequence[Mapping[str, Any]], ended_s: float | None = None
                   ) -> list[FaultOutcome]:
    """Match each scheduled kill with what the job master recorded (``fault``,
    ``failure_detected`` and ``restarted`` events, in the order they happened) and
    decide whether it landed; ``ended_s`` is when the job ended, for the note."""
    timeline = list(timeline)
    consumed: set[int] = set()
    outcomes = []
    for kill in sorted(kills):
        outcome = FaultOutcome(kill.what, kill.at_s, landed=False)
        outcomes.append(outcome)
        found = next((i for i, e in enumerate(events) if e["kind"] == "fault"
                      and i not in consumed and e.get("what") == kill.what), None)
        if found is None:
            ended = "" if ended_s is None else f" after {ended_s:.2f} s"
            outcome.note = f"never carried out: the job ended{ended}, before it was due"
            continue
        consumed.add(found)
        fault = events[found]
        outcome.at_s, outcome.killed = fault["t_s"], list(fault.get("killed") or [])
        if not outcome.killed:
            outcome.note = "there was no process of the job to kill"
            continue
        before = [e for e in events[:found] if e["kind"] in ("failure_detected", "restarted")]
        after = events[found + 1:]
        recovering = bool(before) and before[-1]["kind"] == "failure_detected"
        if recovering:
            # The kill hit a recovery in progress: that recovery's restart covers it.
            detected = None
            restarted = next((e for e in after if e["kind"] == "restarted"), None)
            outcome.note = "during the recovery from an earlier failure"
        else:
            at = next((i for i, e in enumerate(after) if e["kind"] == "failure_detected"),
                      None)
            if at is None:
                outcome.note = ("no failure was detected: the killed processes had "
                                "already finished their work")
                continue
            detected = after[at]
            restarted = next((e for e in after[at + 1:] if e["kind"] == "restarted"), None)
        outcome.landed = detected is not None or restarted is not None
        times = recovery_times(timeline, fault["t_s"],
                               None if detected is None else detected["t_s"],
                               None if restarted is None else restarted["t_s"])
        outcome.detection_s = times.detection_s
        if restarted is None:
            if not outcome.landed:
                outcome.note = "the job never restarted after it"
            continue
        outcome.restart_s, outcome.recovery_s, outcome.trt_s = (
            times.restart_s, times.recovery_s, times.trt_s)
        outcome.restarted_tasks = list(restarted.get("tasks") or [])
    return outcomes


# -- the report --------------------------------------------------------------------------


NOT_REPRODUCIBLE = "not reproducible between two failure-free runs"


@dataclass(frozen=True)
class NotReproduced:
    """What a drill did not compare because two failure-free runs of the topology
    disagreed on it (`DrillReport.not_reproduced`).

    ``what`` is ``"values"`` — the sink's records made by ``operator`` came with
    other values (lost and duplicated records are still found there) — or
    ``"records"`` — the references committed different records of it (a filter that
    samples at random; only duplicates are found there). ``operator`` made the
    records (their lineage ids name it); ``suspects`` are the operators where the
    difference can have started, upstream first: ``(operator,)`` when it is the only
    one; one upstream operator when another sink shows that operator's own records
    differing; else every operator the records passed through, sources excepted (a
    drill replays the same input). ``record_id`` is one id the references disagreed
    on, ``first`` and ``second`` what each committed under it (``()``: nothing)."""

    sink: str
    operator: str
    what: Literal["values", "records"]
    suspects: tuple[str, ...]
    record_id: Any
    first: tuple
    second: tuple

    def describe(self) -> str:
        """``stamp in stamped``, or ``double in out (from stamp)`` when the difference
        comes from upstream."""
        text = f"{self.operator} in {self.sink}"
        if self.suspects == (self.operator,):
            return text
        if len(self.suspects) == 1:
            return f"{text} (from {self.suspects[0]})"
        return f"{text} (from one of {', '.join(self.suspects)})"


@dataclass
class DrillReport:
    """What a drill found. ``verdict`` is the answer (see the module docstring);
    ``exactly_once`` is ``verdict == "exactly-once"``."""

    topology: str
    protocol: str
    verified_by: str                       # "deterministic" or "ids"
    comparison: Comparison
    faults: list[FaultOutcome]
    job_id: str                            # the faulty run
    reference_job_ids: list[str]
    outputs: dict[str, Sequence[Any]]
    output_ids: dict[str, Sequence[Any]]
    reference_outputs: dict[str, Sequence[Any]]   # the (first) reference's committed records
    seed: int | None = None
    date: str = ""                         # when the drill started, ISO 8601, UTC
    nondeterminism: str | None = None      # why the topology cannot run deterministic
    timeline: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: Any = None                    # the faulty run's `RunMetrics`
    format_id: Callable[[Any], str] = field(default=repr, repr=False)
    op_names: list[str] = field(default_factory=list)  # operator code -> name
    # faults the tasks carry out themselves (stalls, lost frames, outages) declared
    injections_declared: int = 0
    # what the protocol promises: "exactly-once", or "at-least-once" (duplicates allowed)
    guarantee: str = "exactly-once"
    # what two failure-free references disagreed on, so was not compared: the values
    # of an operator that reads the clock or draws at random (deterministic mode),
    # or that depend on the interleaving (ids mode)
    not_reproduced: list[NotReproduced] = field(default_factory=list)

    # -- the verdict ----------------------------------------------------------------

    @property
    def lost(self) -> int:
        return self.comparison.lost

    @property
    def duplicated(self) -> int:
        return self.comparison.duplicated

    @property
    def corrupted(self) -> int:
        return self.comparison.corrupted

    @property
    def faults_landed(self) -> bool:
        return all(f.landed for f in self.faults)

    @property
    def verdict(self) -> Verdict:
        if self._violations():
            return "violated"
        if not self.faults_landed or self._unverifiable() or self._nothing_injected():
            return "inconclusive"
        return "at-least-once" if self.guarantee == "at-least-once" else "exactly-once"

    def _violations(self) -> int:
        """Records that break the protocol's promise (duplicates break only exactly-once)."""
        c = self.comparison
        return c.lost + c.corrupted + (c.duplicated if self.guarantee == "exactly-once" else 0)

    def _injected(self) -> float:
        injected = self.metrics.extra.get("faults_injected") if self.metrics else None
        return sum((injected or {}).get(k, 0) for k in
                   ("stalls", "frames_dropped", "outage_waits", "outage_frames_lost",
                    "outage_acks_lost", "connections_dropped"))

    def _nothing_injected(self) -> bool:
        """Faults were declared to be injected, and none occurred: nothing was proved."""
        return bool(self.injections_declared) and not self.faults and not self._injected()

    @property
    def exactly_once(self) -> bool:
        return self.verdict == "exactly-once"

    def _unverifiable(self) -> str | None:
        c = self.comparison
        if c.reference_duplicates:
            return (f"the failure-free reference committed {c.reference_duplicates:,} "
                    "record(s) under an id it had already committed")
        if c.reference_records and not c.comparable_ids:
            return "no record of the reference was committed by both reference runs"
        return None

    @property
    def verdict_reason(self) -> str:
        """The evidence for the verdict, in one sentence."""
        verdict, c = self.verdict, self.comparison
        allowed = "" if self.guarantee == "exactly-once" else (
            f"; {c.duplicated:,} duplicated, which {self.guarantee} allows")
        if verdict == "violated":
            return ", ".join(f"{n:,} {kind}" for kind, n in zip(
                KINDS, (c.lost, c.duplicated, c.corrupted))
                if n and (kind != "duplicated" or not allowed)) + allowed
        if verdict == "inconclusive":
            missed = [f for f in self.faults if not f.landed]
            if missed:
                return "; ".join(f"{f.what} at {f.scheduled_s:.2f} s did not land: {f.note}"
                                 for f in missed)
            if self._nothing_injected():
                return ("no declared fault occurred during the run (stalls, lost frames, "
                        "outages and dropped connections all 0): make them more frequent "
                        "or the run longer")
            return self._unverifiable() or ""
        landed = len(self.faults)
        if self._injected():
            landed_text = (f" across {landed} landed kill(s) and the injected faults" if landed
                           else " across the injected faults")
        elif landed:
            landed_text = f" across {landed} landed fault{'s' if landed != 1 else ''}"
        else:
            landed_text = " (no fault was scheduled)"
        if allowed:
            return "nothing lost or corrupted" + landed_text + allowed
        return "nothing lost, duplicated or corrupted" + landed_text

    # -- what the first fault did (most drills have one) ---------------------------------

    def _first(self, name: str) -> float | None:
        landed = [f for f in self.faults if f.landed]
        return getattr(landed[0], name) if landed else None

    @property
    def detection_s(self) -> float | None:
        return self._first("detection_s")

    @property
    def restart_s(self) -> float | None:
        return self._first("restart_s")

    @property
    def recovery_s(self) -> float | None:
        return self._first("recovery_s")

    @property
    def trt_s(self) -> float | None:
        return self._first("trt_s")

    # -- violations ------------------------------------------------------------------

    @property
    def lost_examples(self) -> list[Violation]:
        return self.comparison.examples["lost"]

    @property
    def duplicated_examples(self) -> list[Violation]:
        return self.comparison.examples["duplicated"]

    @property
    def corrupted_examples(self) -> list[Violation]:
        return self.comparison.examples["corrupted"]

    def describe(self, violation: Violation) -> str:
        """One violation, readably: sink, id with operator names, values."""
        rid = self.format_id(violation.record_id)
        if violation.kind == "lost":
            return f"{violation.sink}: {rid}: expected {violation.expected!r}"
        if violation.kind == "duplicated":
            return (f"{violation.sink}: {rid}: committed {len(violation.got)} times: "
                    f"{', '.join(map(repr, violation.got))}")
        if violation.unexpected:
            return (f"{violation.sink}: {rid}: the reference has no such record; got "
                    f"{', '.join(map(repr, violation.got))}")
        return (f"{violation.sink}: {rid}: expected {violation.expected!r}, got "
                f"{', '.join(map(repr, violation.got))}")

    def verification(self) -> str:
        c = self.comparison
        if self.verified_by != "deterministic":
            text = (f"ids: {c.comparable_ids:,} of {c.reference_records:,} reference "
                    f"records committed by both reference runs, values compared for "
                    f"{c.comparable_values:,}")
        elif c.comparable_ids == c.comparable_values == c.reference_records:
            text = (f"deterministic runs: ids and values of all "
                    f"{c.reference_records:,} reference records")
        else:
            text = (f"deterministic runs: ids of {c.comparable_ids:,} and values of "
                    f"{c.comparable_values:,} of {c.reference_records:,} reference records")
        if self.not_reproduced:
            text += f"; {self.not_compared()}"
        if c.unverified:
            text += f"; {c.unverified:,} faulty-run records not verifiable"
        return text + (f" (not deterministic: {self.nondeterminism})"
                       if self.nondeterminism else "")

    def not_compared(self) -> str:
        """What was not compared, for one line: ``values not compared: stamp in
        stamped — not reproducible between two failure-free runs`` ("" if nothing)."""
        parts = []
        for what, heading in (("values", "values not compared"),
                              ("records", "records not compared, only duplicates")):
            named = [n.describe() for n in self.not_reproduced if n.what == what]
            if named:
                parts.append(f"{heading}: {', '.join(named)} — {NOT_REPRODUCIBLE}")
        return "; ".join(parts)

    def describe_not_reproduced(self, entry: NotReproduced) -> str:
        """One disagreement of the references, with its example id and values."""

        def committed(values: tuple) -> str:
            return ", ".join(map(repr, values)) if values else "nothing"

        return (f"{entry.describe()}: {self.format_id(entry.record_id)}: "
                f"{committed(entry.first)} in one run, {committed(entry.second)} in the other")

    def checkpoint_summary(self) -> str:
        proto = getattr(self.metrics, "protocol", None)
        if proto is None:
            return "-"
        avg = proto.checkpoint_duration_s_avg
        return (f"{proto.checkpoints_completed:,} completed, {proto.checkpoints_aborted:,} "
                f"aborted, avg {'-' if avg is None else f'{avg * 1000:.1f} ms'}, "
                f"invalid {proto.invalid_checkpoints} ({proto.invalid_share:.0%})")

    def summary_rows(self) -> list[tuple[str, str]]:
        c = self.comparison
        rows = [
            ("topology", self.topology),
            ("protocol", self.protocol),
            ("verified by", self.verification()),
            ("seed", "-" if self.seed is None else str(self.seed)),
            ("jobs", f"faulty {self.job_id}; reference {', '.join(self.reference_job_ids)}"),
        ]
        rows += [(f"fault {i}", f.describe()) for i, f in enumerate(self.faults, 1)]
        injected = self.metrics.extra.get("faults_injected") if self.metrics else None
        if injected:
            rows.append(("faults injected", describe_injected(injected)))
        elif not self.faults:
            rows.append(("faults", "none scheduled"))
        rows += [
            ("committed records", f"{sum(map(len, self.outputs.values())):,} "
                                  f"(reference {c.reference_records:,})"),
            ("lost", f"{c.lost:,}"),
            ("duplicated", f"{c.duplicated:,}"),
            ("corrupted", f"{c.corrupted:,}"),
            ("checkpoints", self.checkpoint_summary()),
            ("figures", f"defined in {GLOSSARY}"),
            # shouted unless it is good news
            ("verdict", f"{self.verdict if self.verdict in GOOD else self.verdict.upper()}: "
                        f"{self.verdict_reason}"),
        ]
        return rows


# -- running a drill ----------------------------------------------------------------------


def _labelled(progress: Callable[[dict[str, Any]], None] | None, label: str
              ) -> Callable[[dict[str, Any]], None] | None:
    if progress is None:
        return None
    return lambda p: progress({**p, "run": label})


def reference_runs(topology: Topology, *, runs: int | None = None,
                   progress: Callable[[dict[str, Any]], None] | None = None,
                   protocol: str | Protocol = REFERENCE_PROTOCOL, **run_options: Any
                   ) -> list[RunResult]:
    """The failure-free runs a drill of ``topology`` compares with: one in
    deterministic mode, or two when the topology cannot be deterministic (``runs``
    overrides the count). Pass them to `drill` as ``reference=`` to drill the same
    topology several times for the price of one reference. A deterministic drill
    that finds a record lost or corrupted runs a second reference itself (see the
    module); ``runs=2`` makes it up front, for a topology whose functions are known
    to read the clock or draw at random."""
    deterministic = nondeterminism(topology) is None
    runs = runs if runs is not None else (1 if deterministic else 2)
    return [run(topology, protocol=protocol, lineage=True, deterministic=deterministic,
                progress=_labelled(progress, f"reference {i + 1}/{runs}"), **run_options)
            for i in range(runs)]


def _protocol_name(protocol: str | Protocol) -> str:
    if isinstance(protocol, str):
        return protocol
    if default_of(protocol):   # bn.protocols.Coordinated(...): its knobs are options
        return protocol.name
    return f"{protocol.name} ({type(protocol).__name__})"


def drill(topology: Topology, protocol: str | Protocol = "coordinated", *,
          faults: Sequence = (), seed: int | None = None,
          reference: RunResult | Sequence[RunResult] | None = None,
          progress: Callable[[dict[str, Any]], None] | None = None,
          redundancy: "Redundancy | float | Mapping[str, float] | str | None" = None,
          **run_options: Any) -> DrillReport:
    """Run ``topology`` failure-free and with ``faults`` under ``protocol``; compare
    the committed records by lineage id and report the verdict.

    ``protocol`` is a protocol object of `bastion.protocols` with its own knobs
    (``bn.protocols.Coordinated(interval_s=0.3)``) or a name for its defaults: the
    faulty run takes it, and the reference runs run under ``"none"``, without it.
    ``redundancy`` (`bastion.options.Redundancy`, or a ratio) goes to the faulty run
    only. ``seed`` seeds `RandomKills` that have none of their own. ``reference``:
    runs from `reference_runs` (or one `RunResult` made with ``lineage=True`` and, if
    the topology allows it, ``deterministic=True``) to compare with instead of
    running the reference again; the input must be the same (in deterministic mode a
    second one, if given, is used too). ``progress`` is called about twice a second
    during every run with the job's progress and ``"run"`` naming the run. Other
    keyword arguments go to `bastion.run` for every run: ``storage``, ``data_plane``,
    ``recovery``, ``limits``, ``state``, ``workers``, ``address``, ``duration_s``, …
    (a keyword of earlier releases, such as ``checkpoint_interval``, is a `TypeError`
    naming its new home). Bad fault targets raise `ValueError` before anything runs.
    """
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    refuse_old_keywords({name: value for name, value in run_options.items()
                         if name in OLD_KEYWORDS}, "bn.drill")
    # The protocol object and redundancy go to the faulty run only (the reference
    # runs under protocol "none", which takes neither); the others to every run.
    options = resolve_options(run_options.pop("data_plane", None),
                              run_options.pop("recovery", None), redundancy,
                              run_options.pop("limits", None))
    redundancy = options.redundancy
    run_options.update(data_plane=options.data_plane, recovery=options.recovery,
                       limits=options.limits)
    if seed is not None:  # every fault that draws at random and has no seed of its own
        faults = [dataclasses.replace(f, seed=seed) if dataclasses.is_dataclass(f)
                  and not isinstance(f, type) and getattr(f, "seed", 0) is None else f
                  for f in faults]
    faults = list(faults)
    # Everything that can be refused is refused before the first run.
    get_protocol(protocol).check(topology)
    plan = build_plan(topology, chaining=options.data_plane.chaining,
                      workers=run_options.get("workers"),
                      redundancy=resolve_redundancy(
                          topology, None if redundancy is None else redundancy.ratio))
    kills = fault_injection.validate(faults, plan)
    if any(kill.node is not None for kill in kills):
        ensure_ray(run_options.get("address"))
        nodes = fault_injection.live_nodes()
        for kill in kills:
            if kill.node is not None:
                fault_injection.resolve_node(kill.node, nodes)

    reason = nondeterminism(topology)
    deterministic = reason is None
    references = [reference] if isinstance(reference, RunResult) else list(reference or [])
    needed = 1 if deterministic else 2
    if len(references) < needed:
        references += reference_runs(topology, runs=needed - len(references),
                                     progress=progress, **run_options)
    references = references[:2]

    # A protocol that cannot merge deterministically (acks) runs only stateless
    # topologies, whose ids carry the same values in any order: the deterministic
    # reference still judges them value by value.
    # Redundant copies race each other: the faulty run cannot merge in order either.
    merge_in_order = (deterministic and get_protocol(protocol).nondeterministic_merge is None
                      and not (redundancy is not None and redundancy.ratio))
    result = run(topology, protocol, faults=faults, lineage=True,
                 deterministic=merge_in_order, redundancy=redundancy,
                 progress=_labelled(progress, "faulty"), **run_options)
    committed = [Committed.of(r) for r in references]
    faulty = Committed.of(result)

    def verify() -> Comparison:
        return compare(committed[0], faulty, committed[1] if len(committed) > 1 else None,
                       clocked=_clock_dependence(topology), deterministic=deterministic)

    comparison = verify()
    if len(committed) == 1 and (comparison.lost or comparison.corrupted):
        # A deterministic reference is trusted to be reproducible, but a function that
        # reads the clock or draws at random makes it differ from any other run. Only
        # a second failure-free run tells the topology's difference from the
        # recovery's; it can only take records out of the comparison, so a drill
        # that found nothing needs none.
        references.append(run(topology, protocol=REFERENCE_PROTOCOL, lineage=True,
                              deterministic=True,
                              progress=_labelled(progress, "second reference"),
                              **run_options))
        committed.append(Committed.of(references[-1]))
        comparison = verify()
    outcomes = fault_outcomes(kills, result.details["events"], result.details["timeline"],
                              result.metrics.duration_s)
    return DrillReport(
        topology=topology.name, protocol=_protocol_name(protocol),
        verified_by="deterministic" if deterministic else "ids",
        comparison=comparison, faults=outcomes, job_id=result.job_id,
        reference_job_ids=[r.job_id for r in references], outputs=result.outputs,
        output_ids=result.output_ids, reference_outputs=references[0].outputs, seed=seed,
        date=date, nondeterminism=reason, timeline=result.details["timeline"],
        events=result.details["events"], metrics=result.metrics,
        format_id=_id_formatter(topology), op_names=list(topology.nodes),
        injections_declared=sum(isinstance(f, fault_injection.INJECTED_KINDS)
                                for f in faults),
        guarantee="at-least-once" if get_protocol(protocol).at_least_once
        else "exactly-once",
        not_reproduced=not_reproduced(comparison.disagreements, topology))


def not_reproduced(disagreements: Sequence[Disagreement], topology: Topology
                   ) -> list[NotReproduced]:
    """The references' disagreements with operator names, each with the operators
    where it can have started (`NotReproduced.suspects`).

    A drill sees values only at sinks, so an operator's own output is seen where it
    made a sink's records. The operators a disagreeing record passed through are
    its id's ancestry (sources excepted: a drill replays the same input); if one of
    them, upstream of the record's maker, is itself seen disagreeing at some sink,
    it is where the difference started. For ``records`` the filters between the
    maker and the sink count too: they decide which records exist but leave no mark
    in the id."""
    names = list(topology.nodes)
    kinds = [node.kind for node in topology.nodes.values()]
    seen = {d.producer for d in disagreements}
    found = []
    for d in disagreements:
        maker = names[d.producer] if isinstance(d.producer, int) else repr(d.producer)
        path = sorted(code for code in ancestry(d.record_id, kinds)
                      if kinds[code] != "source")  # codes go upstream first
        started = [code for code in path if code in seen and code != d.producer]
        if started:
            suspects = [names[started[0]]]
        else:
            suspects = [names[code] for code in path]
            if d.what == "records" and maker in topology.nodes:
                suspects += _filters_between(topology, maker, d.sink)
        found.append(NotReproduced(d.sink, maker, d.what, tuple(suspects or [maker]),
                                   d.record_id, d.first, d.second))
    return found


def _filters_between(topology: Topology, start: str, sink: str) -> list[str]:
    """The filters on the paths from operator ``start`` to ``sink``, upstream first."""
    nodes = topology.nodes
    downstream, stack = set(), [start]
    while stack:
        name = stack.pop()
        for node in nodes.values():
            if node.name not in downstream and any(i.upstream == name for i in node.inputs):
                downstream.add(node.name)
                stack.append(node.name)
    upstream, stack = set(), [sink]
    while stack:
        name = stack.pop()
        for i in nodes[name].inputs if name in nodes else ():
            if i.upstream not in upstream:
                upstream.add(i.upstream)
                stack.append(i.upstream)
    return [name for name in nodes if name in downstream & upstream
            and nodes[name].kind == "filter"]


def _clock_dependence(topology: Topology) -> Callable[[Any], bool]:
    """Whether a lineage id derives from a window or join on ingest time."""
    codes = op_codes(topology)
    clocked = {codes[name] for name in clock_dependent_operators(topology)}
    kinds = [node.kind for node in topology.nodes.values()]
    return lambda record_id: bool(clocked) and not clocked.isdisjoint(
        ancestry(record_id, kinds))


def _id_formatter(topology: Topology) -> Callable[[Any], str]:
    def fmt(record_id: Any) -> str:
        try:
            return format_id(record_id, topology)
        except Exception:  # noqa: BLE001 - a report must not fail on an odd id
            return repr(record_id)

    return fmt


__all__ = ["Committed", "Comparison", "Disagreement", "DrillReport", "FaultOutcome",
           "NotReproduced", "Violation", "compare", "drill", "fault_outcomes",
           "not_reproduced", "producer", "reference_runs", "same_value"]
