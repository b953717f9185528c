"""Recovery drills: prove that a job loses nothing and duplicates nothing when it fails.

A drill runs a topology twice on the same (deterministic, seeded) input: a
failure-free *reference* run, and a *faulty* run in which processes are killed on a
schedule. Exactly-once means the committed outputs of the two runs are equal as
multisets: every record the reference committed is committed by the faulty run
exactly once. A drill reports

- ``lost``: records the reference committed and the faulty run did not (counted with
  multiplicity), and ``duplicated``: records the faulty run committed more often;
- ``detection_s``: from the first kill to the job master noticing it;
- ``restart_s``: from detection until every task runs again from the recovery line;
- ``recovery_s``: from the kill until the sinks' output rate is back to 90% of its
  rate before the kill;
- ``trt_s`` (total recovery time): from the kill until the sources have caught up
  with the input that arrived meanwhile (their backlog is back to its level before
  the kill);
- time series of throughput and latency, with the faults marked.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from bastion.launcher import RunResult, run
from bastion.runtime.faults import RandomKills
from bastion.runtime.metrics import rate_recovered_at
from bastion.topology import Topology


@dataclass
class DrillReport:
    protocol: str
    job_id: str
    outputs: dict[str, list]
    reference_outputs: dict[str, list]
    lost: int
    duplicated: int
    lost_examples: list = field(default_factory=list)
    duplicated_examples: list = field(default_factory=list)
    detection_s: float | None = None
    restart_s: float | None = None
    recovery_s: float | None = None
    trt_s: float | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: Any = None

    @property
    def exactly_once(self) -> bool:
        return self.lost == 0 and self.duplicated == 0

    def summary_rows(self) -> list[tuple[str, str]]:
        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} s"

        kills = [e for e in self.events if e["kind"] == "fault"]
        return [
            ("protocol", self.protocol),
            ("faults", ", ".join(f"{e['what']} at {e['t_s']:.2f} s" for e in kills) or "-"),
            ("committed records", f"{sum(map(len, self.outputs.values())):,} "
                                  f"(reference {sum(map(len, self.reference_outputs.values())):,})"),
            ("lost", f"{self.lost:,}"),
            ("duplicated", f"{self.duplicated:,}"),
            ("exactly once", "yes" if self.exactly_once else "NO"),
            ("detection", secs(self.detection_s)),
            ("restart", secs(self.restart_s)),
            ("recovery", secs(self.recovery_s)),
            ("total recovery time", secs(self.trt_s)),
        ]


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a record, so outputs compare as multisets."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, set):
        return frozenset(value)
    return value


def compare(reference: dict[str, list], faulty: dict[str, list]
            ) -> tuple[int, int, list, list]:
    lost = duplicated = 0
    lost_examples: list = []
    duplicated_examples: list = []
    for sink in reference:
        want = collections.Counter(map(_freeze, reference[sink]))
        got = collections.Counter(map(_freeze, faulty.get(sink, [])))
        missing, extra = want - got, got - want
        lost += sum(missing.values())
        duplicated += sum(extra.values())
        lost_examples += [(sink, v) for v in list(missing)[:5]]
        duplicated_examples += [(sink, v) for v in list(extra)[:5]]
    return lost, duplicated, lost_examples, duplicated_examples


def _timings(result: RunResult) -> dict[str, float | None]:
    events = result.details["events"]
    timeline = result.details["timeline"]
    fault = next((e for e in events if e["kind"] == "fault"), None)
    if fault is None:
        return {}
    detected = next((e for e in events if e["kind"] == "failure_detected"
                     and e["t"] >= fault["t"]), None)
    restarted = next((e for e in events if e["kind"] == "restarted"
                      and e["t"] >= fault["t"]), None)
    out: dict[str, float | None] = {
        "detection_s": None if detected is None else detected["t"] - fault["t"],
        "restart_s": None if detected is None or restarted is None
        else restarted["t"] - detected["t"],
        "recovery_s": None, "trt_s": None,
    }
    if restarted is None:
        return out
    t_fault, t_restart = fault["t_s"], restarted["t_s"]
    recovered_at_s = rate_recovered_at(timeline, t_fault, t_restart)
    if recovered_at_s is not None:
        out["recovery_s"] = recovered_at_s - t_fault
    # Caught up: the backlog of input due but not read is back to what it was in
    # steady state before the fault (a paced source is never exactly at zero).
    steady_lag = max((p["source_lag"] for p in timeline
                      if t_fault - 1.5 <= p["t_s"] < t_fault), default=0)
    for p in timeline:
        if p["t_s"] >= t_restart and p["source_lag"] <= steady_lag and p["sink_records"] > 0:
            out["trt_s"] = p["t_s"] - t_fault
            break
    return out


def drill(topology: Topology, *, protocol: str = "coordinated", faults: Sequence = (),
          checkpoint_interval: float | None = None, seed: int | None = None,
          reference_outputs: dict[str, list] | None = None, **run_options: Any
          ) -> DrillReport:
    """Run ``topology`` failure-free and with ``faults``; compare committed outputs.

    ``seed`` seeds `RandomKills` that have none of their own. Pass the outputs of an
    earlier reference run as ``reference_outputs`` to skip the reference run (the
    input must be the same). Other keyword arguments go to `bastion.run`.
    """
    if seed is not None:
        faults = [dataclasses.replace(f, seed=seed) if isinstance(f, RandomKills)
                  and f.seed is None else f for f in faults]
    if reference_outputs is None:
        reference_outputs = run(topology, protocol=protocol,
                                checkpoint_interval=checkpoint_interval,
                                **run_options).outputs
    result = run(topology, protocol=protocol, checkpoint_interval=checkpoint_interval,
                 faults=faults, **run_options)
    lost, duplicated, lost_examples, duplicated_examples = compare(reference_outputs,
                                                                   result.outputs)
    return DrillReport(
        protocol=protocol, job_id=result.job_id, outputs=result.outputs, reference_outputs=reference_outputs,
        lost=lost, duplicated=duplicated, lost_examples=lost_examples,
        duplicated_examples=duplicated_examples, timeline=result.details["timeline"],
        events=result.details["events"], metrics=result.metrics, **_timings(result))
