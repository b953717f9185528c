"""CEC (Sebeou & Magoutis) on the results page.

CEC checkpoints a windowed operator one window at a time: each window's state goes into
the operator's own output log as a control tuple (``G_open`` when it opens, ``G_check``
when the policy refreshes it), and a restart rebuilds the *eventual checkpoint* by
reading the log backwards as far as the oldest footprint (the *extent*). The paper
measures, on Borealis over three quad-core servers, with count windows of an aggregate:

- §IV-A, Fig. 5: what writing the ``G_open`` tuples costs in throughput (and, in the
  text, CPU) against native Borealis, on *fast* (size 1) and *slow* (size 1000) windows
  over two item ids;
- §IV-B, Figs 6 and 7: how the extent target Q and the replay target U trade the
  ``G_check`` tuples written against the extent, the EC-load time and what upstream
  replays, at a crash in the middle of the run (100,000 item ids, ~90,000 windows open);
- §IV-C, Figs 8 and 9: the operator's response time, and the extent, against the
  checkpoint period CP (CI 10 ms, Q = the open windows).

Two experiments, each one run of ``benchmarks/cec.py``:

- ``baseline`` (``--sections d``): Fig. 5 — count windows ``Count(1)`` and
  ``Count(1000)`` over two ids, unthrottled, under ``none`` and CEC with ``G_open``
  only, the runs alternating; throughput and the workers' CPU per record, each as a
  ratio to ``none`` in the same run (absolute rates on a 2-core VM say nothing of the
  paper's cluster);
- ``recovery`` (``--sections efg``): Figs 6–9 — a keyed sum over N parts that never
  close under Q = 1…8 × N and U = 1.25…10 × N (CI 5 ms, CP 100 ms, as the paper), the
  extent averaged over nine crashes in the middle half of each run; the EC-load time of
  extents of Fig. 7's sizes (120,000 and 230,000 tuples), of a keyed sum and of count
  and sliding windows (issue 37's target ≤ 0.4 s); and ``Count(2)`` windows over
  10,000 ids, paced, under ``none`` and CP = 25/50/100 ms with Q = 1 log record.

Every constant typed from the paper cites its figure and the sentence it comes from
(the paper's figures carry no numbers of their own in its text; where only a figure
shows a value, a row uses what the text says of it, or the shape it describes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bastion.bench import results as page
from bastion.bench.results import Experiment, Figures, Row, Section

PAPER = "004_f3957721143f56dc.txt"

# -- the paper's figures ------------------------------------------------------------

# Fig. 5, §IV-A: "Performance of the Gopen/Net configuration drops by less than 10%
# versus native performance across all workloads" and "Performance of the Gopen/Disk
# configuration is nearly identical to Gopen/Net": G_open persisted keeps >= 0.90x.
FIG5_THROUGHPUT_FLOOR = 0.90
# §IV-A (text beside Fig. 5): "native Borealis consumes about 150% (fast-windows) ...
# out of a total capacity of 400%. With CEC (G_open tuples only) the CPU utilization ...
# increases in the Gopen/Disk setup to 200% for the fast-windows workload."
FIG5_FAST_CPU_NATIVE_PCT, FIG5_FAST_CPU_GOPEN_DISK_PCT = 150.0, 200.0
FIG5_FAST_CPU_RATIO = FIG5_FAST_CPU_GOPEN_DISK_PCT / FIG5_FAST_CPU_NATIVE_PCT  # 1.33
# Fig. 6, §IV-B: "the number of G_checks drops sharply for Q > 2 x openwins"; "CEC
# cannot achieve the target of Q = 1 x openwins ... but manages to achieve it in the
# Q = 2, 4 x openwins cases"; EC-load "for a smaller extent (120,000 and 180,000
# tuples) ... varies from 3.5 to 5 seconds. A larger extent leads to EC-load times of
# between 14 and 27 seconds"; replay: "Lower Q values correspond to replaying 25MB to
# 50MB of tuples, whereas higher Q values correspond to replaying more than 200MB".
FIG6_Q = (1, 2, 4, 8)
FIG6_EC_LOAD_S = (3.5, 5.0, 14.0, 27.0)   # Q = 1, 2, 4, 8 x openwins (lower left)
FIG6_REPLAY_MB = (25.0, 50.0, 200.0)      # low Q ... "more than 200MB" at high Q
FIG6_EC_LOAD_GROWTH = FIG6_EC_LOAD_S[-1] / FIG6_EC_LOAD_S[0]   # 7.7x from Q = 1 to 8
# Fig. 7, §IV-B: "we vary the values of U between 125,000 and 10^6 tuples"; "the
# extent size increases from 120,000 tuples to 230,000 tuples"; "EC-load time (bottom
# left) increases from 2.5s to 6.7s"; "higher values of U result to between 20MB
# (200,000 tuples) and 90MB (900,000 tuples) of upstream input replayed".
FIG7_U_TUPLES = (125_000, 1_000_000)
FIG7_EXTENT_TUPLES = (120_000, 230_000)
FIG7_EC_LOAD_S = (2.5, 6.7)
FIG7_REPLAY_TUPLES = (200_000, 900_000)
# §IV-B: "The average value of openwins in the operator is measured to be around
# 90,000" (100,000 item ids, windows of 10 tuples).
PAPER_OPENWINS = 90_000
# Fig. 8, §IV-C: "Operator response time ranges from 16.5s (without CEC), to 18.5ms,
# 21.5ms, and 32.5s (CEC with CP = 100ms, 50ms, 25ms, respectively)" — the text mixes
# s and ms; the ratios to no CEC do not depend on the unit.
FIG8_NONE = 16.5
FIG8_CEC = {25: 32.5, 50: 21.5, 100: 18.5}
FIG8_RATIO = {cp: value / FIG8_NONE for cp, value in FIG8_CEC.items()}
# Fig. 9, §IV-C: "Longer CP values result in longer extent sizes and consequently longer
# recovery times" (no values in the text).

# -- noise bands (from repeated runs on the shared 2-core machine, Nov 2026) ---------

# Throughput of unthrottled runs, best of five each: the fast windows' G_open-only/none
# ratio came out 0.73-0.93x over six runs at load 10-20 (300,000 and 1,000,000 records;
# the median of the back-to-back pairs 0.69-0.83x, noisier still), the slow windows'
# 0.90-1.08x (and 0.48x once at load 22). Bastion's job is CPU-bound where the paper's
# was bound by its source: the +14-22% CPU per record of G_open on fast windows shows
# as throughput, and the row's verdict sits at the edge of its band.
THROUGHPUT_NOISE = 0.15
# The workers' CPU per record (least of the repeats) moved by ~10% between runs, but
# the row compares G_open-only's over none's, measured alternating in the same run, and
# that ratio came out 1.14-1.22x over the runs of Nov 2026 (1.16x and 1.15x in two full
# regenerations on a quiet machine, 1.22x on a busy one): +-3.5% around its middle. At
# +-15% the band's edge (1.33 / 1.15 = 1.157x) sat inside that spread and the verdict
# flipped between two runs that agreed to 1%; +-5% states the ratio's spread.
CPU_NOISE = 0.05
# Response time of 2-3-s paced runs (its mean is set by the tail: a CI's burst of
# G_checks holds the task, and on a shared machine the neighbours take the CPU back as
# preemption): none's mean moved 0.57-1.00 ms between runs, and over nine runs at load
# 3-19 the CP = 100 ms paired ratio of the run's means came out 0.79-1.82x; CP = 25 ms
# 0.81-1.69x (2.9x at load 19). The rows take the level of the per-second means the
# paper plots (the median over the run's seconds), which a second of the neighbours'
# moves less: 1.12x for CP = 100 ms at load 22-31 where the run's mean said 1.60x. A
# +-40% band; the rows' verdicts hold for a machine not shared.
RESPONSE_NOISE = 0.40
# EC-load at Q = 8 x N over Q = 1 x N (2,000 parts, extents of 1,700-10,000 log
# records, tens of ms): 0.67-1.76x over six runs — flat within the noise, the N
# footprints to decode (and at Q = 1 the G_check bursts the extent is full of) weighing
# as much as the results the longer extents skip over.
EC_LOAD_GROWTH_NOISE = 0.6
# EC-load of the 230,000-tuple extent: 0.09-0.20 s between runs at load 7-15 (best of
# one to three): a factor of two, against a paper figure some 30x away.
EC_LOAD_NOISE = 0.50
# Issue 37: G_open only costs at most this share of none's CPU per record.
IN_PROCESS_TARGET = 0.10
IN_PROCESS_SETTING = (
    "{window} over 2 ids: the window operator fed the run's batches in one process, "
    "without lineage ids and wrapped by CEC with G_open only (ids on, the log's uploads "
    "included), 7 repeats, each in the order of the one before turned around; what "
    "CEC adds over none's CPU per record in the runs above, the median of the repeats' "
    "differences")
# Issue 37: the EC-load of Fig 7's extents on sliding and count windows, in seconds.
WINDOW_EC_LOAD_TARGET_S = 0.4


def _missing(anchor: str, ref: str, experiment: str, reference_setting: str,
             reference_figure: str, what: str) -> Row:
    return Row(anchor=anchor, ref=ref, experiment=experiment,
               reference_setting=reference_setting, reference_figure=reference_figure,
               bastion_setting="–", bastion_figure="–", ratio=None,
               judgement=page.not_measured(f"the run wrote no {what}"))


# -- Fig. 5: the baseline impact (G_open only) ----------------------------------------

GOPEN = "cec G_open only"
WORKLOADS = {"count-fast": ("fast", "Count(1)", "size 1"),
             "count-slow": ("slow", "Count(1000)", "size 1000")}
#: Sliding windows, which the paper does not measure (CEC over them is issue 37's), as
#: its fast and slow count windows: a part per window instance, two and four windows
#: over each record
SLIDING_WORKLOADS = {"sliding-fast": ("fast", "Sliding(2, 1)", "2 records per id, slide 1"),
                     "sliding-slow": ("slow", "Sliding(1000, 250)",
                                      "1,000 records per id, slide 250")}
PAPER_FIG5_SETTING = ("Borealis on 3 quad-core Xeons; aggregate over count windows of "
                      "{size}, 2 item ids, G_open persisted to PVFS (Gopen/Disk)")


def _throughput_row(run: Any, workload: str, anchor: str, what: str, ref_setting: str,
                    setting: str, cpu_beside: bool) -> Row:
    """Fig 5's floor: G_open only keeps ≥ 0.90× of none's throughput (less the noise);
    with ``cpu_beside`` the CPU ratio is shown in the figure too."""
    ref_figure = f"≥ {FIG5_THROUGHPUT_FLOOR:.2f}× native (drop < 10%)"
    if run is None or GOPEN not in run or "none" not in run:
        return _missing(anchor, "Fig 5", what, ref_setting, ref_figure,
                        f"{workload} throughput")
    best = float(run[GOPEN]["records_per_s_best"]) / float(run["none"]["records_per_s_best"])
    paired = float(run[GOPEN]["paired_ratio_to_none"])
    cpu = float(run[GOPEN]["cpu_us_per_record"]) / float(run["none"]["cpu_us_per_record"])
    floor = FIG5_THROUGHPUT_FLOOR / (1 + THROUGHPUT_NOISE)
    return Row(
        anchor=anchor, ref="Fig 5", experiment=what,
        reference_setting=ref_setting, reference_figure=ref_figure,
        bastion_setting=setting,
        bastion_figure=(f"{best:.2f}× none ({run[GOPEN]['records_per_s_best']:,.0f} against "
                        f"{run['none']['records_per_s_best']:,.0f} records/s; median of the "
                        f"pairs {paired:.2f}×"
                        + (f"; CPU per record {cpu:.2f}× none's)" if cpu_beside else ")")),
        ratio=best / FIG5_THROUGHPUT_FLOOR,
        judgement=page.judge_claim(
            best >= floor,
            f"G_open only keeps ≥ {FIG5_THROUGHPUT_FLOOR:.2f}× of none's throughput "
            f"(less the ±{THROUGHPUT_NOISE:.0%} noise: ≥ {floor:.2f}×)",
            why_not=f"{best:.2f}×"))


def _in_process_row(run: Any, workload: str, anchor: str, what: str, ref_setting: str,
                    setting: str) -> Row:
    """Issue 37's target, ≤ 10% against none, on the CPU that CEC adds to the window
    operator (`operator_cost`: in one process, free of the rest of the job and of the
    neighbours: the job-level ratios move by ±15% between runs on this machine) over
    none's CPU per record in the runs: the median of the repeats' differences, each
    of two runs next to each other; the log's and the lineage ids' parts, each the
    median of its own pairs, and the rest of the whole beside them (the parts add up
    to it: the noise of the parts lands in the rest). The least of each variant's runs, apart, once put
    fast sliding windows at +7% on a lucky run of CEC's, when the instructions CEC
    adds (callgrind) are ~10% of none's."""
    ref_figure = f"≥ {FIG5_THROUGHPUT_FLOOR:.2f}× native (drop < 10%)"
    us = None if run is None else run.get("in_process_us")
    if us is None or "none" not in run:
        return _missing(anchor, "Fig 5", what, ref_setting, ref_figure,
                        f"{workload} in-process cost")
    none_us = float(run["none"]["cpu_us_per_record"])
    # against the operator without lineage ids, as none runs it: cec turns them on
    added = page.paired_differences(us, "cec", "no ids")
    added_us = page.median(added)
    log_us = page.median(page.paired_differences(us, "cec", "cec, no log"))
    ids_us = page.median(page.paired_differences(us, "alone", "no ids"))
    share = added_us / none_us
    return Row(
        anchor=anchor, ref="Fig 5", experiment=what,
        reference_setting=ref_setting, reference_figure=ref_figure,
        bastion_setting=setting, bastion_figure=(
            f"+{share:.1%} of none's CPU (+{added_us:.3f} µs/record, median of "
            f"{len(added)} pairs, from {added[0]:+.3f} to {added[-1]:+.3f}: the log "
            f"{log_us:+.3f}, lineage ids {ids_us:+.3f}, the rest "
            f"{added_us - log_us - ids_us:+.3f}; none's {none_us:.2f} µs/record)"),
        ratio=None,
        judgement=page.judge_target(share, IN_PROCESS_TARGET, higher_is_better=False,
                                    what="CEC's CPU over none's (issue 37)"))


def baseline_rows(figures: Figures) -> list[Row]:
    rows: list[Row] = []
    records = page.lookup(figures, "throughput", "records")
    repeats = page.lookup(figures, "throughput", "repeats")
    for workload, (speed, window, size) in WORKLOADS.items():
        ref_setting = PAPER_FIG5_SETTING.format(size=size)
        run = page.lookup(figures, "throughput", "workloads", workload)
        setting = (f"{window} over 2 ids, {records or 0:,} records unthrottled, p=1; "
                   f"G_open to the local log; best of {repeats} runs each, alternating")
        rows.append(_throughput_row(
            run, workload, f"cec-fig5-{speed}-throughput",
            f"{speed} windows: G_open only, throughput against none", ref_setting, setting,
            cpu_beside=False))
        rows.append(_in_process_row(
            run, workload, f"cec-fig5-{speed}-in-process",
            f"{speed} windows: G_open only, the CPU it adds, in process",
            ref_setting, IN_PROCESS_SETTING.format(window=window)))
        if speed != "fast":
            continue  # the text gives the G_open/Disk CPU of fast windows only
        anchor = "cec-fig5-fast-cpu"
        what = "fast windows: G_open only, CPU against none"
        ref_figure = (f"{FIG5_FAST_CPU_RATIO:.2f}× native ({FIG5_FAST_CPU_NATIVE_PCT:.0f}% → "
                      f"{FIG5_FAST_CPU_GOPEN_DISK_PCT:.0f}% of 400%)")
        if run is None or GOPEN not in run or "none" not in run:
            rows.append(_missing(anchor, "Fig 5 (§IV-A text)", what, ref_setting,
                                 ref_figure, f"{workload} CPU"))
            continue
        cpu = float(run[GOPEN]["cpu_us_per_record"]) / float(run["none"]["cpu_us_per_record"])
        rows.append(Row(
            anchor=anchor, ref="Fig 5 (§IV-A text)", experiment=what,
            reference_setting=ref_setting + "; CPU at about the same throughput",
            reference_figure=ref_figure,
            bastion_setting=setting.replace("best of", "least of") + "; workers' CPU "
            "seconds per record",
            bastion_figure=(f"{cpu:.2f}× none ({run[GOPEN]['cpu_us_per_record']:.2f} against "
                            f"{run['none']['cpu_us_per_record']:.2f} µs/record)"),
            ratio=cpu / FIG5_FAST_CPU_RATIO,
            judgement=page.judge(FIG5_FAST_CPU_RATIO, cpu, higher_is_better=False,
                                 within=CPU_NOISE)))
    # Sliding windows, which the paper did not run: its claim, "drops by less than 10%
    # versus native across all workloads", asked of them
    for workload, (speed, window, size) in SLIDING_WORKLOADS.items():
        run = page.lookup(figures, "throughput", "workloads", workload)
        ref_setting = ("Borealis on 3 quad-core Xeons; count windows only (sliding windows "
                       "not measured): the floor its workloads all keep")
        rows.append(_throughput_row(
            run, workload, f"cec-fig5-sliding-{speed}-throughput",
            f"{speed} sliding windows: G_open only, throughput against none", ref_setting,
            f"{window} ({size}) over 2 ids, {records or 0:,} records unthrottled, p=1; a "
            f"part per window instance, G_open to the local log; best of {repeats} runs "
            "each, alternating", cpu_beside=True))
        rows.append(_in_process_row(
            run, workload, f"cec-fig5-sliding-{speed}-in-process",
            f"{speed} sliding windows: G_open only, the CPU it adds, in process",
            ref_setting, IN_PROCESS_SETTING.format(window=window)))
    rows.append(Row(
        anchor="cec-fig5-gopen-net", ref="Fig 5", experiment="Gopen/Net and the Real bar",
        reference_setting=PAPER_FIG5_SETTING.format(size="size 1 and 1000").replace(
            "persisted to PVFS (Gopen/Disk)", "forwarded downstream, not persisted"),
        reference_figure="Gopen/Net ≈ Gopen/Disk; Real = 2× the data tuples",
        bastion_setting="–", bastion_figure="–", ratio=None,
        judgement=page.not_comparable(
            "Bastion writes G_open tuples to the operator's log only, never downstream: "
            "there is no Gopen/Net configuration and no control tuple at the sink")))
    return rows


def baseline_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    runs = page.lookup(figures, "throughput", "workloads") or {}
    kinds = {**WORKLOADS, **SLIDING_WORKLOADS}
    shown = [w for w in kinds if w in runs and GOPEN in runs[w]]
    if not shown:
        return []
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    xs = range(len(shown))
    through = [runs[w][GOPEN]["records_per_s_best"] / runs[w]["none"]["records_per_s_best"]
               for w in shown]
    cpu = [runs[w][GOPEN]["cpu_us_per_record"] / runs[w]["none"]["cpu_us_per_record"]
           for w in shown]
    ax.bar([x - 0.2 for x in xs], through, 0.4, label="throughput, G_open only / none")
    ax.bar([x + 0.2 for x in xs], cpu, 0.4, label="CPU per record, G_open only / none")
    ax.axhline(FIG5_THROUGHPUT_FLOOR, color="k", ls="--", lw=1,
               label="paper: throughput ≥ 0.90× native")
    ax.plot([0.2], [FIG5_FAST_CPU_RATIO], "r*", ms=10, label="paper: CPU 1.33× (fast)")
    ax.set_xticks(list(xs), [f"{kinds[w][0]}\n{kinds[w][1]}" for w in shown], fontsize=8)
    ax.set_ylabel("× none")
    ax.set_title("CEC Fig 5: baseline impact of G_open", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = out_dir / "cec-baseline.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- Figs 6-9: recovery against Q, U and CP --------------------------------------------


def _sweep(figures: Figures, group: str) -> list[dict] | None:
    runs = page.lookup(figures, "sweeps", "runs", group)
    return runs if isinstance(runs, list) and len(runs) >= 2 else None


def _sweep_rows(figures: Figures, group: str) -> list[Row]:
    """Fig. 6 (group "q") or Fig. 7 (group "u"): G_checks, extent, replay (and, for Q,
    EC-load) against the target, as the shapes the paper describes."""
    fig = "Fig 6" if group == "q" else "Fig 7"
    knob = "Q" if group == "q" else "U"
    runs = _sweep(figures, group)
    keys = page.lookup(figures, "sweeps", "u_keys" if group == "u" else "keys")
    records = page.lookup(figures, "sweeps", "records")
    rate = page.lookup(figures, "sweeps", "rate")
    points = page.lookup(figures, "sweeps", "crash_points")
    if group == "q":
        ref_setting = (f"Q = 1…8 × openwins (~{PAPER_OPENWINS:,}), 100,000 ids, count "
                       "windows of 10, CI 5 ms, CP 100 ms, a crash mid-run")
    else:
        ref_setting = (f"U = {FIG7_U_TUPLES[0]:,}…{FIG7_U_TUPLES[1]:,} tuples (1.4…11 × "
                       "openwins), as Fig 6 otherwise")
    span = "1…8" if group == "q" else "1.25…10"
    unit = "log records (the policy's unit)" if group == "q" else "inputs"
    setting = (f"keyed sum over N = {keys or 0:,} parts (never closed), {knob} = {span} × N "
               f"{unit}, {records or 0:,} records at {rate or 0:,.0f}/s, CI 5 ms, CP 100 ms; "
               f"mean of {points} crashes in the run's middle half")
    cells: dict[str, tuple[str, str]] = {}   # metric -> (paper figure, claim)
    if group == "q":
        cells["gchecks"] = ("drop sharply for Q > 2 × openwins",
                            "Q ≥ 4 × N writes at most half the G_checks of Q = 1 × N")
        cells["extent"] = ("grows with Q; target met at Q = 2, 4 × openwins; 500,000 at "
                           "Q = 8", "the extent grows with Q (Q = 8 × N above Q = 1 × N) "
                           "and meets its target at Q = 2 and 4 × N")
        cells["ecload"] = (" → ".join(f"{s:g} s" for s in FIG6_EC_LOAD_S)
                           + f" (Q = 1…8): Q = 8 over Q = 1 is {FIG6_EC_LOAD_GROWTH:.1f}×", "")
        cells["replay"] = ("25–50 MB at low Q → > 200 MB at high Q",
                           "the replay at Q = 8 × N is at least twice that at Q = 1 × N")
    else:
        cells["gchecks"] = ("fewer with growing U (less sharply than with Q)",
                            "U = 10 × N writes fewer G_checks than U = 1.25 × N")
        cells["extent"] = (f"{FIG7_EXTENT_TUPLES[0]:,} → {FIG7_EXTENT_TUPLES[1]:,} tuples "
                           f"({FIG7_EXTENT_TUPLES[1] / FIG7_EXTENT_TUPLES[0]:.1f}×)",
                           "the extent grows with U (U = 10 × N above U = 1.25 × N)")
        cells["replay"] = (f"{FIG7_REPLAY_TUPLES[0]:,} → {FIG7_REPLAY_TUPLES[1]:,} tuples "
                           f"({FIG7_REPLAY_TUPLES[1] / FIG7_REPLAY_TUPLES[0]:.1f}×)",
                           "the replay at U = 10 × N is at least twice that at U = 1.25 × N")
    names = {"gchecks": "G_checks written", "extent": "extent at the crash",
             "ecload": "EC-load time", "replay": "inputs replayed"}
    rows = []
    for metric, (ref_figure, claim) in cells.items():
        anchor = f"cec-{fig.lower().replace(' ', '')}-{metric}"
        what = f"{names[metric]} against {knob}"
        if runs is None:
            rows.append(_missing(anchor, fig, what, ref_setting, ref_figure,
                                 f"{knob} sweep"))
            continue
        labels = [r["label"].split("=")[1] for r in runs]
        if metric == "gchecks":
            series = [r["g_checks"] for r in runs]
            if group == "q":
                holds = series[0] > 0 and max(series[2:]) <= series[0] / 2
            else:
                holds = series[-1] < series[0]
            figure = " → ".join(f"{v:,}" for v in series)
        elif metric == "extent":
            series = [r["extent_tuples"] for r in runs]
            holds = series[-1] > series[0]
            if group == "q":
                within = [r["extent_records"] <= r["value"] * r["keys"] for r in runs
                          if r["value"] in (2, 4)]
                holds = holds and len(within) == 2 and all(within)
            figure = (" → ".join(f"{v:,.0f}" for v in series) + " tuples ("
                      + " → ".join(f"{r['extent_records']:,.0f}" for r in runs)
                      + " log records)")
        elif metric == "ecload":
            # How much EC-load grows from the least to the most lenient Q, against the
            # paper's 7.7x: a number, judged (a flat EC-load is better, not worse)
            series = [r["ec_load_s"] for r in runs]
            figure = " → ".join(f"{v * 1000:.0f} ms" for v in series)
            growth = series[-1] / series[0] if series[0] > 0 else float("nan")
            rows.append(Row(
                anchor=anchor, ref=fig, experiment=what + " (growth from Q = 1 to 8 × N)",
                reference_setting=ref_setting, reference_figure=ref_figure,
                bastion_setting=setting + f" ({knob} = {', '.join(labels)})",
                bastion_figure=f"{figure}: {growth:.2f}×",
                ratio=growth / FIG6_EC_LOAD_GROWTH if series[0] > 0 else None,
                judgement=page.judge(FIG6_EC_LOAD_GROWTH, growth, higher_is_better=False,
                                     within=EC_LOAD_GROWTH_NOISE)))
            continue
        else:
            series = [r["replayed_inputs"] for r in runs]
            holds = series[0] > 0 and series[-1] >= 2 * series[0]
            figure = " → ".join(f"{v:,.0f}" for v in series) + " inputs"
        rows.append(Row(
            anchor=anchor, ref=fig, experiment=what, reference_setting=ref_setting,
            reference_figure=ref_figure,
            bastion_setting=setting + f" ({knob} = {', '.join(labels)})",
            bastion_figure=figure, ratio=None,  # a shape: no single ratio means anything
            judgement=page.judge_claim(bool(holds), claim, why_not=figure)))
    return rows


def _ec_load_rows(figures: Figures) -> list[Row]:
    """Fig. 7's EC-load at its smallest and largest extents, against Bastion's EC-load
    of extents of those sizes (keyed sum, a part per input: the harshest shape)."""
    loads = page.lookup(figures, "ec_load", "keyed_sum")
    repeats = page.lookup(figures, "ec_load", "repeats")
    rows = []
    for size, paper_s, found in zip(FIG7_EXTENT_TUPLES, FIG7_EC_LOAD_S,
                                    loads if isinstance(loads, list) else [None, None]):
        anchor = f"cec-fig7-ec-load-{size // 1000}k"
        what = f"EC-load of a {size:,}-tuple extent"
        ref_setting = (f"Borealis on a 2008 quad-core Xeon X3220; extent of {size:,} tuples "
                       "read from PVFS and loaded (CPU 100% busy)")
        ref_figure = f"{paper_s:g} s"
        if found is None:
            rows.append(_missing(anchor, "Fig 7", what, ref_setting, ref_figure, "EC-load"))
            continue
        seconds = float(found["seconds"])
        rows.append(Row(
            anchor=anchor, ref="Fig 7", experiment=what, reference_setting=ref_setting,
            reference_figure=ref_figure,
            bastion_setting=(f"2-core VM, Python; extent of {found['extent_tuples']:,} tuples "
                             "(a G_open per input: half of them footprints to load) on local "
                             f"storage, read back and every part decoded; best of {repeats}"),
            bastion_figure=f"{seconds:.3f} s", ratio=seconds / paper_s,
            judgement=page.judge(paper_s, seconds, higher_is_better=False,
                                 within=EC_LOAD_NOISE)))
    return rows + _window_ec_load_rows(figures)


# The shape of each window kind's extent (`benchmarks/cec.py` (f), `ec_load_windows`).
_WINDOW_EXTENTS = {
    "count": "Count(1) over a key per input: a part (its G_open) and a result per input, "
             "the EC at the end of the log",
    "sliding": "Sliding(4, 1) over a quarter as many keys, a record per key per time "
               "unit: the EC at a crash halfway, the results of the windows fired since "
               "the oldest open one opened and a footprint per open window",
}


def _window_ec_load_rows(figures: Figures) -> list[Row]:
    """The EC-load of Fig 7's extent sizes on count and sliding windows, against issue
    37's target (≤ 0.4 s, what the keyed sum's rows above meet), the paper's figure
    beside it."""
    loads = page.lookup(figures, "ec_load", "windows")
    repeats = page.lookup(figures, "ec_load", "repeats")
    by_kind: dict[str, list] = {}   # each kind's runs, in the order of the sizes
    for run in loads if isinstance(loads, list) else []:
        by_kind.setdefault(run["kind"], []).append(run)
    rows = []
    for kind, extent in _WINDOW_EXTENTS.items():
        for i, (size, paper_s) in enumerate(zip(FIG7_EXTENT_TUPLES, FIG7_EC_LOAD_S)):
            anchor = f"cec-fig7-ec-load-{kind}-{size // 1000}k"
            what = f"EC-load of a {size:,}-tuple extent, {kind} windows"
            ref_setting = (f"Borealis, count windows of 10; extent of {size:,} tuples "
                           "read from PVFS and loaded")
            ref_figure = f"{paper_s:g} s (issue 37's target for Bastion: ≤ 0.4 s)"
            runs = by_kind.get(kind, [])
            run = runs[i] if i < len(runs) else None
            if run is None:
                rows.append(_missing(anchor, "Fig 7", what, ref_setting, ref_figure,
                                     f"{kind} window EC-load"))
                continue
            seconds = float(run["seconds"])
            rows.append(Row(
                anchor=anchor, ref="Fig 7", experiment=what, reference_setting=ref_setting,
                reference_figure=ref_figure,
                bastion_setting=(f"2-core VM, Python, G_open only; {extent}; extent of "
                                 f"{run['extent_tuples']:,} tuples on local storage, read "
                                 f"back and every part decoded; best of {repeats}"),
                bastion_figure=f"{seconds:.3f} s", ratio=seconds / paper_s,
                judgement=page.judge_target(seconds, WINDOW_EC_LOAD_TARGET_S,
                                            higher_is_better=False,
                                            what="EC-load (issue 37)")))
    return rows


def _response_rows(figures: Figures) -> list[Row]:
    configs = page.lookup(figures, "response", "configs") or {}
    keys = page.lookup(figures, "response", "keys")
    records = page.lookup(figures, "response", "records")
    rate = page.lookup(figures, "response", "rate")
    repeats = page.lookup(figures, "response", "repeats")
    ref_setting = ("count windows of 10 over 100,000 ids (~90,000 open), CI 10 ms, "
                   "Q = openwins; window open to close, per-second averages")
    setting = (f"Count(2) over {keys or 0:,} ids, {records or 0:,} records paced at "
               f"{rate or 0:,.0f}/s, CI 10 ms, Q = 1 log record; a window's last input to "
               "its result at the sink; the median over the run's seconds of each second's "
               f"mean, median of {repeats} runs paired with none's")
    rows = []
    none = configs.get("none")
    for cp in sorted(FIG8_RATIO):
        anchor = f"cec-fig8-cp{cp}"
        what = f"response time, CP = {cp} ms, against no CEC"
        ref_figure = f"{FIG8_CEC[cp]:g} against {FIG8_NONE:g}: {FIG8_RATIO[cp]:.2f}×"
        run = configs.get(f"cec CP={cp} ms")
        if run is None or none is None:
            rows.append(_missing(anchor, "Fig 8", what, ref_setting, ref_figure,
                                 f"CP = {cp} ms response time"))
            continue
        paired = float(run["paired_second_ratio_to_none"])
        rows.append(Row(
            anchor=anchor, ref="Fig 8", experiment=what, reference_setting=ref_setting,
            reference_figure=ref_figure, bastion_setting=setting,
            bastion_figure=(f"{run['second_mean_ms']:.2f} against {none['second_mean_ms']:.2f}"
                            f" ms: {paired:.2f}× (the run's mean {run['mean_ms']:.2f} against "
                            f"{none['mean_ms']:.2f} ms, p99 {run['p99_ms']:.1f} against "
                            f"{none['p99_ms']:.1f})"),
            ratio=paired / FIG8_RATIO[cp],
            judgement=page.judge(FIG8_RATIO[cp], paired, higher_is_better=False,
                                 within=RESPONSE_NOISE)))
    shortest, longest = (configs.get(f"cec CP={cp} ms") for cp in (25, 100))
    what = "response time falls as CP grows"
    ref_figure = (" > ".join(f"{FIG8_RATIO[cp]:.2f}×" for cp in (25, 50, 100))
                  + " (CP 25 > 50 > 100)")
    if shortest is None or longest is None:
        rows.append(_missing("cec-fig8-order", "Fig 8", what, ref_setting, ref_figure,
                             "CP = 25 or 100 ms response time"))
    else:
        a = float(shortest["paired_second_ratio_to_none"])
        b = float(longest["paired_second_ratio_to_none"])
        rows.append(Row(
            anchor="cec-fig8-order", ref="Fig 8", experiment=what,
            reference_setting=ref_setting, reference_figure=ref_figure,
            bastion_setting=setting, bastion_figure=f"CP 25 ms {a:.2f}×, CP 100 ms {b:.2f}×",
            ratio=None,
            judgement=page.judge_claim(a > b, "CP = 25 ms costs more response time than "
                                       "CP = 100 ms", why_not=f"{a:.2f}× against {b:.2f}×")))
    what = "extent against CP"
    found = [configs.get(f"cec CP={cp} ms") for cp in (25, 50, 100)]
    ref_figure = "longer CP, longer extent (no values in the text)"
    ref9 = "as Fig 8; the extent at a crash"
    runs = [r for r in found if r is not None and r.get("extent_records") is not None]
    if len(runs) < len(found):
        rows.append(_missing("cec-fig9-extent", "Fig 9", what, ref9, ref_figure, "extent"))
    else:
        recs = [float(r["extent_records"]) for r in runs]
        tuples = [float(r["extent_tuples"]) for r in runs]
        rows.append(Row(
            anchor="cec-fig9-extent", ref="Fig 9", experiment=what,
            reference_setting=ref9, reference_figure=ref_figure,
            bastion_setting=(setting.split("; a window")[0] + "; the extent in log records "
                             "(the results between refreshes) at 9 crashes in the run's "
                             "middle half, mean; in tuples it is held at its floor by the "
                             "~N footprints"),
            bastion_figure=(" → ".join(f"{v:,.0f}" for v in recs) + " log records (CP 25, "
                            "50, 100 ms); " + " → ".join(f"{v:,.0f}" for v in tuples)
                            + " tuples"),
            ratio=None,
            judgement=page.judge_claim(recs[2] > recs[0],
                                       "the extent grows with CP (CP = 100 ms above 25 ms)",
                                       why_not=" → ".join(f"{v:,.0f}" for v in recs))))
    return rows


def recovery_rows(figures: Figures) -> list[Row]:
    return (_sweep_rows(figures, "q") + _sweep_rows(figures, "u") + _ec_load_rows(figures)
            + _response_rows(figures))


def recovery_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    paths = []
    for group, fig_name in (("q", "fig6"), ("u", "fig7")):
        runs = _sweep(figures, group)
        if runs is None:
            continue
        knob = "Q" if group == "q" else "U"
        xs = [r["value"] for r in runs]
        fig, axes = plt.subplots(2, 2, figsize=(6, 3.5), dpi=100, sharex=True)
        panels = [("G_checks", [r["g_checks"] for r in runs]),
                  ("extent (tuples)", [r["extent_tuples"] for r in runs]),
                  ("EC-load (ms)", [r["ec_load_s"] * 1000 for r in runs]),
                  ("inputs replayed", [r["replayed_inputs"] for r in runs])]
        for ax, (title, ys) in zip(axes.flat, panels):
            ax.plot(xs, ys, "o-")
            ax.set_title(title, fontsize=8)
            ax.set_xscale("log", base=2)
            ax.tick_params(labelsize=7)
        for ax in axes[1]:
            ax.set_xlabel(f"{knob} (× N)", fontsize=8)
        fig.suptitle(f"CEC {fig_name.replace('fig', 'Fig ')}: effect of {knob} (Bastion)",
                     fontsize=9)
        fig.tight_layout()
        path = out_dir / f"cec-recovery-{fig_name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    configs = page.lookup(figures, "response", "configs") or {}
    cps = [cp for cp in (25, 50, 100) if f"cec CP={cp} ms" in configs]
    if cps and "none" in configs:
        fig, (left, right) = plt.subplots(1, 2, figsize=(6, 3.5), dpi=100)
        names = ["none"] + [f"CP {cp}" for cp in cps]
        ours = [1.0] + [configs[f"cec CP={cp} ms"]["paired_second_ratio_to_none"]
                        for cp in cps]
        theirs = [1.0] + [FIG8_RATIO[cp] for cp in cps]
        xs = list(range(len(names)))
        left.bar([x - 0.2 for x in xs], theirs, 0.4, label="paper")
        left.bar([x + 0.2 for x in xs], ours, 0.4, label="Bastion")
        left.set_xticks(list(xs), names, fontsize=7)
        left.set_ylabel("response time × none", fontsize=8)
        left.set_title("Fig 8: response time", fontsize=8)
        left.legend(fontsize=7)
        right.plot(cps, [configs[f"cec CP={cp} ms"]["extent_records"] for cp in cps], "o-")
        right.set_xlabel("CP (ms)", fontsize=8)
        right.set_ylabel("extent (log records)", fontsize=8)
        right.set_title("Fig 9: extent (Bastion)", fontsize=8)
        fig.tight_layout()
        path = out_dir / "cec-recovery-fig8-9.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


# -- the section ----------------------------------------------------------------------

_BASELINE_COMMON = ["--sections", "d", "--runtime-workloads",
                    ",".join([*WORKLOADS, *SLIDING_WORKLOADS]),
                    "--runtime-configs", f"none,{GOPEN}"]
_RECOVERY_COMMON = ["--sections", "efg", "--sweep-groups", "q,u", "--sweep-keys", "2000",
                    "--sweep-u-keys", "10000", "--sweep-rate", "60000", "--crash-points", "9",
                    "--no-ec-load-beyond", "--response-rate", "10000"]

SECTION = Section(
    key="cec",
    title="CEC: continuous eventual checkpointing (Sebeou & Magoutis)",
    source=f"`{PAPER}` — Z. Sebeou, K. Magoutis, *CEC: Continuous Eventual Checkpointing "
           "for Data Stream Processing Operators*",
    intro=(
        "The paper measures CEC in Borealis on three quad-core servers: the throughput and "
        "CPU that writing G_open tuples costs (Fig 5), how the extent target Q and the "
        "replay target U trade G_checks against extent, EC-load and replay at a crash "
        "(Figs 6, 7, ~90,000 open windows), and how the checkpoint period CP trades "
        "response time against extent (Figs 8, 9). Here each runs on one 2-core VM with "
        "the operator at parallelism 1: costs are ratios to protocol none measured in the "
        "same run, the sweeps use 2,000–10,000 open parts instead of 90,000 (Q and U as "
        "multiples of them), and the EC-load of Fig 7's extent sizes is timed as is."),
    experiments=[
        Experiment(
            key="baseline",
            title="Fig 5: baseline impact of G_open (fast and slow windows, count and sliding)",
            script="cec.py",
            # a million records: a slow-window run at 300,000 lasted 0.15 s, and its
            # ratio to none came out anywhere from 0.53x to 1.35x (the script's
            # docstring found the same of 400,000-record runs)
            args=[*_BASELINE_COMMON, "--runtime-records", "1000000", "--runtime-repeats", "5",
                  "--operator-records", "600000"],
            quick_args=[*_BASELINE_COMMON, "--runtime-records", "300000",
                        "--runtime-repeats", "2", "--operator-records", "100000"],
            rows=baseline_rows, plot=baseline_plot, budget_s=260),
        Experiment(
            key="recovery",
            title="Figs 6–9: G_checks, extent, EC-load and replay against Q and U; "
                  "response time and extent against CP",
            script="cec.py",
            args=[*_RECOVERY_COMMON, "--sweep-records", "240000", "--repeats", "3",
                  "--response-keys", "10000", "--response-records", "40000",
                  "--response-repeats", "3"],
            quick_args=[*_RECOVERY_COMMON, "--sweep-records", "120000", "--repeats", "1",
                        "--crash-points", "5", "--response-keys", "10000",
                        "--response-records", "22000", "--response-repeats", "1"],
            rows=recovery_rows, plot=recovery_plot, budget_s=210),
    ],
)
