"""Local recovery: a failure restarts only what it must (`bastion.scheduler.failover`).

Every figure is measured in this run, in one Ray session, and every faulty run is a
drill, so its verdict (lost, duplicated, corrupted by lineage id against a
failure-free reference) is printed beside its timings.

(1) **Per protocol, a kill, the default failover against ``failover="global"``** —
    for each protocol, on two jobs: *two branches* (branch ``a``: a source, a keyed
    map and a sink at p=1; branch ``b``: a forward-only source, map and sink at p=2,
    whose instance 1 is the only thing worker 1 runs) with ``b_map[1]`` killed, and
    *three stages* (source and map at p=3, a keyed map and its sink at p=4, four
    workers) with ``keyed[3]``, alone on its worker, killed: the restart time of a
    one-task failure, local against global (CheckMate's Fig 11 point: it should
    depend on what rolls back, not on the job's size; target for ``uncoordinated``
    <= 0.5x).
    Printed: the operator instances restarted, restart time (detection → every
    restarted task running), TRT (the drill's total recovery time: kill → output
    rate back and sources caught up, `bastion.runtime.recovery_times`), and for the two branches what branch ``a`` (never hit) did again —
    the records its sink received beyond those it committed, 0 when it never rolled
    back — and the largest gap between two progress points (0.1 s apart) at which its
    sink received records, against the same figure of a failure-free run of the same
    protocol (target: within 3x under a local failover). A restart here takes tens of
    milliseconds (a warm standby), so a global one meets the gap target too: what
    tells the two apart is the work redone.
(2) **Dynamo's failed instances, recoverable** (thesis Fig 3.34) — Grep (paced lines
    → ``filter`` at p=3 → sink) under ``protocol="acks"``, instance 1 of the filter
    crashing ``--crashes`` times (`bn.faults.Crash`, exponential MTBF and MTTR), at
    the redundancy ratios ``--ratios`` (0 and 1.0): the share of records whose
    latency, measured from the record's first arrival (`born`, kept across replays),
    missed the deadline of a failure-free run without copies (its mean + 2 sigma),
    and of the thesis's baseline trial (the crashing run without copies). Target:
    redundancy 1.0 misses >= 90 % fewer.
(3) **Dynamo's failed instances, persistent** (thesis Fig 3.35, ``--sections 3``) —
    the same Grep, the thesis's model of a failed instance (§3.1.3: a correlated
    communication fault whose MTTR is tens to hundreds of seconds): the link of
    ``--persist-instances`` (instance 1 of 3; the thesis failed up to 22 of 66)
    goes down a second or two into the run (`bn.faults.LinkOutage(lose=True)`) and
    stays down until the input has ended, losing what the instance emits and
    acknowledges; at ratios ``--persist-ratios`` (0, 0.25, 1.0: the thesis reports
    25 % and 100 %). Under ``acks`` a replayed root keeps its lineage id, and with it
    its instance, so without a copy elsewhere its records wait for the link.
    ``--persist-repeats N`` runs each ratio N times and averages the missed shares
    against one baseline-trial deadline (the results page takes 4: one run's cut at
    25 % moves by tens of percent).

``--json PATH`` writes the figures of sections 2 and 3 for the results page.
Asserts nothing; the headline is the last line.

    .venv/bin/python benchmarks/local_recovery.py [--quick] [--protocols P,...] [--sections 1,2,3]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bastion as bn  # noqa: E402
from bastion.drills import reference_runs  # noqa: E402
from bastion.launcher import ensure_ray  # noqa: E402

PROTOCOLS = ("coordinated", "uncoordinated", "cic", "cec", "acks")
WORDS = "the quick brown fox jumps over a lazy dog and again away".split()


def every(protocol: str, interval_s: float) -> "str | bn.protocols.Protocol":
    """Protocol ``protocol`` checkpointing (or committing) every ``interval_s`` seconds:
    its object with that knob; ``"none"`` has no interval, and stays a name."""
    cls = type(bn.protocols.get_protocol(protocol))
    return protocol if protocol == "none" else cls(interval_s=interval_s)


def two_branches(rate: float, seconds: float) -> bn.Topology:
    count = int(rate * seconds)
    topo = bn.Topology("two-branches")
    a = topo.source("a_src", bn.sources.Generator(lambda i: i, count=count, rate=rate))
    a.key_by(lambda v: v % 7).map("a_keyed", lambda v: v + 1).sink("a_out",
                                                                     bn.sinks.Collect())
    b = topo.source("b_src", bn.sources.Generator(lambda i: i, count=count, rate=rate),
                    parallelism=2)
    b.map("b_map", lambda v: v * 2, parallelism=2).sink("b_out", bn.sinks.Collect(),
                                                        parallelism=2)
    topo.query("a", outputs=["a_out"])
    topo.query("b", outputs=["b_out"])
    return topo


def three_stages(rate: float, seconds: float) -> bn.Topology:
    """Source and map at p=3 (one chain), a keyed map at p=4 and its sink: worker 3
    of four runs ``keyed[3]`` (chained with ``out[3]``) and nothing else, so its kill
    is a one-task failure; the sources feed it over a keyed exchange. The source
    count is split so the job sends as much as at p=4."""
    topo = bn.Topology("three-stages")
    src = topo.source("src", bn.sources.Generator(
        lambda i: i, count=int(rate * seconds * 4 / 3), rate=rate * 4 / 3), parallelism=3)
    src.map("map", lambda v: v * 3, parallelism=3).key_by(lambda v: v % 101).map(
        "keyed", lambda v: v + 1, parallelism=4).sink("out", bn.sinks.Collect(),
                                                      parallelism=4)
    return topo


def grep(rate: float, seconds: float) -> bn.Topology:
    topo = bn.Topology("grep-p3")
    lines = topo.source("lines", bn.sources.Generator(
        lambda i: " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8)),
        count=int(rate * seconds), rate=rate))
    lines.filter("match", lambda s: "fox" in s, parallelism=3).sink(
        "out", bn.sinks.Discard(), parallelism=1)
    return topo


def largest_gap_s(metrics: Any, query: str) -> float | None:
    """The longest time between two progress points at which ``query``'s sinks
    received records, from its first output to its last."""
    times = [t for t, n, _ in metrics.extra["queries"][query]["timeline"] if n > 0]
    return max((b - a for a, b in zip(times, times[1:])), default=None)


def received(metrics: Any, query: str) -> int:
    """The records ``query``'s sinks received over the run: those they commit, plus
    what they received again after a restart rolled them back to a checkpoint."""
    return sum(n for _, n, _ in metrics.extra["queries"][query]["timeline"])


def secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def section_per_protocol(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    print("(1) one kill per job; default failover ('local') against failover='global'")
    print(f"  {'protocol':<13} {'job':<13} {'failover':<8} {'verdict':<14} "
          f"{'restarted':>9} {'restart s':>9} {'TRT s':>6} {'a redone':>8} {'a gap s':>8} "
          f"{'free gap s':>10}")
    jobs = {"two-branches": (two_branches, "b_map", 1),
            "three-stages": (three_stages, "keyed", 3)}
    references = {name: reference_runs(build(args.rate, args.seconds), storage=storage)
                  for name, (build, _, _) in jobs.items()}
    results: dict[str, Any] = {}
    for protocol in args.protocols:
        for name, (build, victim, instance) in jobs.items():
            free_gap = None
            if name == "two-branches":
                free = bn.run(build(args.rate, args.seconds),
                              every(protocol, args.interval), storage=storage)
                free_gap = largest_gap_s(free.metrics, "a")
            for failover in ("local", "global"):
                report = bn.drill(build(args.rate, args.seconds),
                                  every(protocol, args.interval), storage=storage,
                                  reference=references[name],
                                  recovery=bn.Recovery(failover=failover),
                                  faults=[bn.faults.KillInstance(victim, instance,
                                                                  at=args.kill_at)])
                fault = report.faults[0]
                gap = redone = None
                if name == "two-branches":
                    gap = largest_gap_s(report.metrics, "a")
                    redone = received(report.metrics, "a") - len(report.outputs["a_out"])
                results[(protocol, name, failover)] = {
                    "verdict": report.verdict, "restarted": len(fault.restarted_tasks),
                    "restart_s": fault.restart_s, "trt_s": fault.trt_s, "gap_s": gap,
                    "free_gap_s": free_gap, "redone": redone}
                print(f"  {protocol:<13} {name:<13} {failover:<8} {report.verdict:<14} "
                      f"{len(fault.restarted_tasks):>9} {secs(fault.restart_s):>9} "
                      f"{secs(fault.trt_s):>6} {'-' if redone is None else redone:>8} "
                      f"{secs(gap):>8} {secs(free_gap):>10}", flush=True)
    for protocol in args.protocols:
        local, whole = (results[(protocol, "three-stages", f)] for f in ("local", "global"))
        if local["restart_s"] and whole["restart_s"]:
            ratio = local["restart_s"] / whole["restart_s"]
            local["restart_ratio"] = ratio
            target = " (target <= 0.5x)" if protocol == "uncoordinated" else ""
            print(f"  {protocol}: a one-task kill in three stages restarts "
                  f"{local['restarted']} of {whole['restarted']} operator instances, in "
                  f"{ratio:.2f}x the global restart's time{target}")
    for protocol in args.protocols:
        r = results[(protocol, "two-branches", "local")]
        if r["gap_s"] is not None and r["free_gap_s"]:
            within = r["gap_s"] <= 3 * r["free_gap_s"]
            print(f"  {protocol}: the unhit branch's largest gap {r['gap_s']:.2f} s, "
                  f"{r['gap_s'] / r['free_gap_s']:.1f}x failure-free (target <= 3x: "
                  f"{'met' if within else 'missed'})")
    return results


FREE_RUNS: dict[str, Any] = {}


def failed_instances(args: argparse.Namespace, storage: str, title: str,
                     faults_of: Callable[[int], list[Any]], ratios: list[float],
                     repeats: int = 1) -> dict[str, Any]:
    """Grep under ``acks`` with the faults ``faults_of(seed)`` at each ratio of
    ``ratios``, and failure-free without copies: the share of records that missed each
    deadline, by ratio. With ``repeats`` > 1 every ratio runs that many times (repeat
    ``k``'s faults seeded with ``args.seed + k``) and a ratio's share is the mean over
    its runs, each holding the same records."""
    print(title)
    protocol = bn.protocols.Acks(interval_s=0.2, timeout_s=args.ack_timeout_s)
    free = FREE_RUNS.get("grep")   # sections 2 and 3 share it
    if free is None:
        free = FREE_RUNS["grep"] = bn.run(grep(args.grep_rate, args.grep_seconds), protocol,
                                          storage=storage, redundancy=0.0).metrics
    runs: dict[float, list[Any]] = {ratio: [] for ratio in ratios}
    for repeat in range(repeats):
        faults = faults_of(args.seed + repeat)
        for ratio in ratios:
            runs[ratio].append(bn.run(grep(args.grep_rate, args.grep_seconds), protocol,
                                      storage=storage, redundancy=ratio,
                                      faults=faults).metrics)
    # Two deadlines, each mean + 2 sigma: of the failure-free run without copies (what
    # the job promises when nothing fails), and of the faulted runs without copies
    # (the thesis's "baseline trial", section 3.2.2.4), one for the experiment as the
    # thesis has one baseline trial: the mean of its repeats'.
    deadlines = {"failure-free": free.deadline_ms() or 0.0,
                 "baseline trial": statistics.fmean(m.deadline_ms() or 0.0
                                                    for m in runs[0.0])}
    print("  deadlines: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in deadlines.items()))
    print(f"  {'repeat':>6} {'redundancy':>10} {'faults':>6} {'p50 ms':>8} {'p99 ms':>9} "
          f"{'missed (free)':>13} {'missed (baseline)':>17} {'restarted':>9} {'replayed':>8}")
    samples: dict[float, list[dict[str, Any]]] = {ratio: [] for ratio in ratios}
    shown = [(0, None, free)] + [(k, ratio, runs[ratio][k]) for k in range(repeats)
                                 for ratio in ratios]
    for repeat, ratio, m in shown:
        failures = m.protocol.failures
        restarted = sorted({name for f in failures for name in f.restarted_tasks})
        replayed = m.extra.get("protocol_counters", {}).get("roots_replayed", 0)
        missed = {name: m.missed_deadlines(d) for name, d in deadlines.items()}
        print(f"  {repeat:>6} {'-' if ratio is None else f'{ratio:.2f}':>10} "
              f"{'no' if ratio is None else 'yes':>6} "
              f"{m.latency_ms['p50']:>8.1f} {m.latency_ms['p99']:>9.1f} "
              f"{missed['failure-free']:>13.2%} {missed['baseline trial']:>17.2%} "
              f"{','.join(restarted) or '-':>9} {replayed:>8,.0f}", flush=True)
        if ratio is not None:
            samples[ratio].append({
                "p50_ms": m.latency_ms["p50"], "p99_ms": m.latency_ms["p99"],
                "crashes": len(failures), "replayed": replayed,
                "missed_free": missed["failure-free"],
                "missed_baseline": missed["baseline trial"]})
    rows = [{"ratio": ratio, "repeats": len(of),
             **{key: statistics.fmean(r[key] for r in of) for key in of[0]},
             "missed_baseline_runs": [r["missed_baseline"] for r in of]}
            for ratio, of in samples.items()]
    by_ratio = {row["ratio"]: row for row in rows}
    cuts: dict[str, dict[str, float]] = {}
    for name, key in (("failure-free", "missed_free"), ("baseline trial", "missed_baseline")):
        base = by_ratio[0.0][key]
        cuts[name] = {f"{ratio:g}": 1 - by_ratio[ratio][key] / base if base else float("nan")
                      for ratio in ratios[1:]}
        print(f"  against r=0, {name} deadline"
              + (f" (mean of {repeats} runs)" if repeats > 1 else "") + ": "
              + ", ".join(f"r={r} {c:.0%} fewer missed" for r, c in cuts[name].items())
              + f" (target at r=1 >= 90%: {'met' if cuts[name]['1'] >= 0.9 else 'missed'})")
    return {"deadlines_ms": deadlines, "repeats": repeats, "runs": rows, "cuts": cuts}


def section_dynamo(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    def crash(seed: int) -> list[Any]:
        return [bn.faults.Crash("match", instances=(1,), mtbf_s=args.mtbf_s,
                                mttr_s=args.mttr_s, max_crashes=args.crashes, seed=seed)]

    return failed_instances(
        args, storage,
        f"\n(2) Dynamo failed instances, recoverable (Fig 3.34): Grep p=3 under acks, "
        f"match[1] crashing {args.crashes} times (MTBF {args.mtbf_s:g} s, MTTR "
        f"{args.mttr_s:g} s), latency from first arrival", crash, args.ratios)


def section_persistent(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    """The thesis models a failed instance as a correlated communication fault whose
    MTTR is tens to hundreds of seconds (section 3.1.3): the instance's link goes down
    and what it emits and acknowledges is lost. Here it goes down between
    ``--persist-from-s`` and twice that after its task started and stays down until
    the input has ended (the run could not end while a root's every copy leads to it:
    under ``acks`` a replay keeps its lineage id, and so its instance)."""
    down_from = args.persist_from_s

    def outage(seed: int) -> list[Any]:
        return [bn.faults.LinkOutage(
            "match", instances=tuple(args.persist_instances), mtbf_s=down_from * 1.5,
            mtbf_min_s=down_from, mtbf_max_s=2 * down_from, lose=True, seed=seed,
            mttr=bn.faults.Constant(args.grep_seconds), mttr_s=args.grep_seconds)]

    out = failed_instances(
        args, storage,
        f"\n(3) Dynamo failed instances, persistent (Fig 3.35): Grep p=3 under acks, "
        f"match{list(args.persist_instances)} losing what it emits and acknowledges from "
        f"{down_from:g}-{2 * down_from:g} s to the end of the input"
        + (f", {args.persist_repeats} runs a ratio" if args.persist_repeats > 1 else ""),
        outage, args.persist_ratios, repeats=args.persist_repeats)
    out["instances"] = list(args.persist_instances)
    return out


def ratio_list(text: str) -> list[float]:
    """Redundancy ratios from "0,0.5,1": sorted, 0 and 1 always among them."""
    return sorted({0.0, 1.0} | {float(r) for r in text.split(",") if r.strip()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter jobs, two protocols")
    parser.add_argument("--sections", default="1,2",
                        help="which sections to run: 1, 2 and 3 (default 1,2)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--rate", type=float, default=1500.0, help="records/s per source")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.3, help="checkpoint interval, s")
    parser.add_argument("--kill-at", type=float, default=2.0)
    parser.add_argument("--grep-rate", type=float, default=3000.0)
    parser.add_argument("--grep-seconds", type=float, default=15.0)
    parser.add_argument("--crashes", type=int, default=3)
    parser.add_argument("--mtbf-s", type=float, default=3.0)
    parser.add_argument("--mttr-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--ack-timeout-s", type=float, default=5.0,
                        help="sections 2 and 3: acks' replay timeout")
    parser.add_argument("--ratios", default="0,1",
                        help="section 2: redundancy ratios under crashes (0 and 1 always)")
    parser.add_argument("--persist-ratios", default="0,0.25,1",
                        help="section 3: redundancy ratios (0 and 1 always; the thesis "
                             "reports 25%% and 100%%)")
    parser.add_argument("--persist-instances", default="1",
                        help="section 3: the instances of match (of 3) that fail")
    parser.add_argument("--persist-from-s", type=float, default=1.0,
                        help="section 3: the failure comes between this and twice this "
                             "many seconds after the task started")
    parser.add_argument("--persist-repeats", type=int, default=1,
                        help="section 3: runs of each ratio, their shares averaged (repeat "
                             "k's outage seeded with --seed + k)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures of sections 2 and 3 as JSON (the "
                             "results page)")
    args = parser.parse_args()
    args.protocols = [p for p in args.protocols.split(",") if p]
    args.ratios = ratio_list(args.ratios)
    args.persist_ratios = ratio_list(args.persist_ratios)
    args.persist_instances = [int(i) for i in args.persist_instances.split(",") if i]
    sections = set(args.sections.split(","))
    if args.quick:
        args.seconds, args.grep_seconds = 4.0, 10.0
        args.protocols = [p for p in args.protocols if p in ("coordinated", "acks")]
    ensure_ray()
    results: dict[Any, Any] = {}
    dynamo: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bastion-local-recovery-") as tmp:
        storage = f"local://{tmp}"
        if "1" in sections:
            results = section_per_protocol(args, storage)
        if "2" in sections:
            dynamo["recoverable"] = section_dynamo(args, storage)
        if "3" in sections:
            dynamo["persistent"] = section_persistent(args, storage)
    if args.json:
        from bastion.bench import results as page

        page.write_figures(args.json, {
            "grep_rate": args.grep_rate, "grep_seconds": args.grep_seconds,
            "crashes": args.crashes, "mtbf_s": args.mtbf_s, "mttr_s": args.mttr_s,
            "ack_timeout_s": args.ack_timeout_s, **_finite(dynamo)})
    parts = []
    if results:
        unhit = [r for (p, job, f), r in results.items()
                 if job == "two-branches" and f == "local" and r["free_gap_s"]]
        within = sum(r["gap_s"] is not None and r["gap_s"] <= 3 * r["free_gap_s"]
                     for r in unhit)
        untouched = [p for p in args.protocols
                     if results[(p, "two-branches", "local")]["redone"] == 0]
        parts.append(
            f"a kill in one branch leaves the other untouched (0 records redone) "
            f"under {len(untouched)}/{len(args.protocols)} protocols "
            f"({', '.join(untouched) or 'none'}), its largest gap within 3x failure-free "
            f"under {within}/{len(unhit)}" + (
                f"; uncoordinated one-task restart "
                f"{results[('uncoordinated', 'three-stages', 'local')]['restart_ratio']:.2f}x "
                "global's" if "restart_ratio" in results.get(
                    ("uncoordinated", "three-stages", "local"), {}) else ""))
    for name, what in (("recoverable", "Dynamo's crashed instance"),
                       ("persistent", "Dynamo's persistently failed instance")):
        if name in dynamo:
            cuts = dynamo[name]["cuts"]
            parts.append(f"{what}: redundancy 1.0 misses {cuts['baseline trial']['1']:.0%} "
                         f"fewer deadlines than 0 (thesis's baseline-trial deadline), "
                         f"{cuts['failure-free']['1']:.0%} fewer (failure-free deadline)")
    print("\nheadline: " + "; ".join(parts))


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


if __name__ == "__main__":
    main()
