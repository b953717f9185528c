"""Dynamo (Tran's dissertation, USC 2020): tuple-level redundancy against runtime faults.

The thesis adds *copies* of tuples to Heron topologies: a share ``r`` of the tuples into
an operator is sent to a second instance as well, and the first copy to finish wins.
It measures, on Intel's Storm Benchmark topologies, what copies buy against three
fault classes — *timing* faults (an instance stalls: GC pauses, a noisy neighbour),
*communication* faults (an instance's link goes down and loses what it carries) and
*failed instances* — and what they cost in CPU and traffic; then (Chapter 4) a
*resiliency manager* that moves ``r`` at run time to keep a latency bound with fewer
copies than a static worst-case level.

Bastion carries the same mechanisms (`bastion.runtime.redundancy`, `bastion.protocols.
acks`, `bastion.faults`, `bastion.scheduler.resiliency`), so each experiment here runs
the thesis's experiment on a 2-core machine: parallelism 2-3 instead of 4-33, a few
seconds of input instead of thousands of tuples over minutes, the fault profiles
compressed in time by the same factor. What is compared is always a figure relative to
a baseline measured in the same run (a reduction against no copies, a ratio of two
modes, an overhead against no copies), never an absolute latency or rate.

The rows, one per figure of the thesis the issue lists:

- **Table 3.5** (§3.2.2.4): per topology, the reductions of tail latency, mean latency
  and missed deadlines that duplicating every tuple (100 %) brings over no copies
  under timing faults, and the claim that more copies miss fewer deadlines;
- **Fig 3.28** (§3.2.3.3): fine-grained (copy-aware) against coarse (Storm/Heron-style)
  acknowledgments on DataClean, failure-free: latency, CPU, throughput;
- **Fig 3.31**: lossy links under acknowledgments, failed tuples with and without
  copies;
- **Figs 3.34-3.35**: failed instances, recoverable (a crash) and persistent;
- **Figs 4.9-4.10** (§4.2.1): the managed ratio against static 1.6 and no copies under
  the thesis's dynamic injection profile: violated windows, and the CPU and traffic
  overheads. Overheads are measured against redundancy 0 *without faults* (decided in
  issue 13): under faults redundancy 0 idles while a stalled instance holds its source
  back, and that saving would count as overhead of every run that keeps the bound.

Every paper figure below is typed from the thesis text (``shared/papers/
001_3a08021797fa1c25.txt``), with the table or figure and the sentence it comes from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from bastion.bench import results as page
from bastion.bench.results import Figures, Judgement, Row

SOURCE_FILE = "shared/papers/001_3a08021797fa1c25.txt"


# -- the thesis's figures --------------------------------------------------------------------

# Table 3.5 ("Performance comparison across redundancy amounts for topologies (uniform at
# all operators)", p. 63): rows "0% (baseline)" and "100%" of each topology, columns
# Mean (ms), Missed Deadlines, Missed Deadline Reduction (%), Tail latency (99%), Tail
# Latency Reduction (%). Setting (§3.2.2.4, pp. 58-60): Heron on three servers, spout
# p=1, bolts p=4, 7,000 tuples a trial at the rates of Table 3.4 (WordCount 44 tuples/s,
# Grep 118), faults "exponentially distributed with a mean of one second and the
# magnitude is Gaussian distributed with a mean of 150 ms", deadline "μ + 2σ of the
# baseline trial".
TABLE_3_5 = {
    # topology: {ratio: (mean ms, missed deadlines, p99 ms)}
    "WordCount": {0.0: (69.513, 422, 299.963), 0.5: (66.372, 349, 293.521),
                  1.0: (61.569, 221, 241.235)},
    "Grep": {0.0: (21.144, 621, 190.606), 0.5: (13.605, 319, 165.011),
             1.0: (7.532, 34, 69.879)},
}
TABLE_3_5_RATE = {"WordCount": 44, "Grep": 118}   # Table 3.4, tuples/s
# Bastion's topologies (benchmarks/redundancy.py) and the operator its stalls hit
TABLE_3_5_SHAPE = {"WordCount": "lines → split p=2 → keyed count p=2 → sink",
                   "Grep": "lines → filter p=2 → sink"}
TABLE_3_5_FAULTED = {"WordCount": "count", "Grep": "filter"}

# Fig 3.28 (§3.2.3.3, p. 76): "The original scheme has a mean of 6.28ms and a 99% tail
# latency of 9.71ms, while our fine-grained system has a mean of 4.27ms and tail
# latency of 6.70ms"; "that amounts to only a 19% increase in total CPU usage for the
# whole topology. We also measure a 1%-2% reduction in throughput." DataClean, failure-
# free, the first 9,000 tuples discarded; 33 instances per bolt on USC's HPC.
FIG_3_28_COARSE_MS = {"mean": 6.28, "p99": 9.71}
FIG_3_28_FINE_MS = {"mean": 4.27, "p99": 6.70}
FIG_3_28_CPU_X = 1.19          # "a 19% increase in total CPU usage"
FIG_3_28_THROUGHPUT_X = 0.985  # "a 1%-2% reduction in throughput": the middle, 1.5 %

# Fig 3.31 (p. 79): "For the DataClean topology, 100% redundancy can reduce the failed
# tuples by more than 51%". Correlated communication faults, MTBF 20/40/60 s
# (exponential), MTTR 500/1000/1500 ms (Gaussian), redundancy at the spout outputs.
FIG_3_31_CUT = 0.51

# Fig 3.34 (p. 84): single recoverable failed instances, MTTR 10/60/120 s, failure at
# 30/60/120 s: "100% redundancy can drive the number of missed deadlines to zero".
FIG_3_34_CUT = 1.0
# Fig 3.35 (p. 84): up to 22 of the bolt instances fail and do not recover: "At 25%
# redundancy, the reductions range from 22.24% to 46.65% while at 100% redundancy,
# the reductions range from 90.47% to 100%."
FIG_3_35_CUT = {0.25: (0.2224, 0.4665), 1.0: (0.9047, 1.0)}

# Figs 4.9-4.10 (§4.2.1, pp. 104-107), Grep: "the managed trial reduces the window
# violations by 98.3% (4 vs 234 windows) while only increasing the computation overhead
# by 10.4% and the communication overhead by 46.0%. While the static redundancy brings
# the violations down to zero, this comes at a cost of 68.5% computation and 359.0%
# communication overhead." Overheads are against "the baseline trial ... with 0%
# redundancy". Static 1.6 ("for every topology in this work, the static redundancy
# level is 160%"), 33 instances per bolt, 18-minute runs, injection periods of 270,
# 180 and 90 s at MTBF 2, 4 and 1 s, magnitude Gaussian, mean 450 ms, bound on the p90
# of 1-s windows. Across Grep, SOL and WordCount the managed overheads are "0.15x -
# 0.29x of the computation overhead that the static redundancy case uses" (abstract
# and §5.3; the ranges follow from the three topologies' figures).
FIG_4_10_WINDOWS = {"r=0": 234, "managed": 4, "static": 0}
FIG_4_10_CPU_OVERHEAD = {"managed": 0.104, "static": 0.685}
FIG_4_10_TRAFFIC_OVERHEAD = {"managed": 0.460, "static": 3.590}


# -- noise bands: how far each figure moved between runs of the full size ---------------

# Reductions against no copies move between runs by the stalls' luck: which stalls of
# two instances overlap, and how many fall in ten seconds of input. Two full runs of
# Grep (a shared 2-core host): missed deadlines -84 % and -86 %, mean -54 % and -62 %
WITHIN_REDUCTION = 0.25
# The p99 of 13,000 records is what two or three stalls did: Grep's p99 fell by 46 % in
# one full run and by 73 % in the next (1.6x)
WITHIN_TAIL = 0.6
# fine / coarse ratios of alternating runs: the mean moved 0.98-1.01x over four runs,
# the p99 0.92-1.13x
WITHIN_ACKS = 0.15
# failed tuples under lossy links: 78 %, 78 % and 68 % fewer at r=1 in three runs (8, 8
# and 5 s; the seeded outages bound it at 77 % of an 8-s run)
WITHIN_FAILED = 0.25
# a reduction near 100 %: 100 %, 100 %, 100 % and 78 % (a 2.5-s quick run) at r=1
WITHIN_INSTANCE = 0.10
# The persistent failure's reduction at 25 % moves far more: one 6-s run a ratio gave
# 16 % and 24 % in two regenerations; averaged over 2-4 runs a ratio, 12 %, 13 %, 18 %,
# 19 % and 22 % in five more (Nov 2026): 17 % +- 4 points, where the r=0 runs' missed
# share moves by 3 % and the r=0.25 runs' by 7 % of itself. The row averages 4 runs a
# ratio and states +-30 %, which still leaves its verdict on the edge of the thesis's
# lowest figure (22.24 % / 1.3 = 17.1 %). Those figures counted a sink's latency
# samples one each, so the backlog the outage released (a few large batches) weighed
# little; counted by the records they stand for, a first run of 3 a ratio gave 22 %
# (per repeat 19-27 %), and the r=0 runs' missed share moved by 1 % instead of 3 %.
WITHIN_PERSISTENT = {0.25: 0.30, 1.0: WITHIN_INSTANCE}
# managed / static overheads over under a minute of a shared host: one round; issue 13
# saw the per-round CPU ratio move by more than this over three rounds of 144 s
WITHIN_OVERHEAD = 0.35
# A missed-deadline share at one ratio moves by ~10 % between runs (WordCount at r=0:
# 5.9 %, 6.9 %, 7.3 % of records in three runs): a claim of a falling trend allows a
# step up that small
WITHIN_SHAPE = 0.10


def _falling(values: Sequence[float]) -> bool:
    """Each value no more than the one before it within ``WITHIN_SHAPE``, and the last
    below the first beyond it: a trend, not a flat line."""
    steps = all(b <= a * (1 + WITHIN_SHAPE) for a, b in zip(values, values[1:]))
    return steps and values[-1] * (1 + WITHIN_SHAPE) < values[0]


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _reduction(new: float | None, old: float | None) -> float | None:
    """How much lower ``new`` is than ``old`` (0.6 = 60 % lower); None without ``old``."""
    if old is None or new is None or old <= 0:
        return None
    return 1.0 - new / old


def _missing(anchor: str, ref: str, experiment: str, reference_setting: str,
             reference_figure: str, why: str) -> Row:
    return Row(anchor, ref, experiment, reference_setting, reference_figure,
               "-", "-", None, page.not_measured(why))


def _judge_range(lo: float, hi: float, measured: float, *, within: float,
                 what: str) -> Judgement:
    """A figure the paper gives as a range over its topologies: *reproduced* inside the
    range widened by ``within``; beyond it, judged against the nearer end."""
    if lo / (1 + within) <= measured <= hi * (1 + within):
        return page.judge_claim(True, f"{what} {measured:.1%} lies in the thesis's "
                                      f"{lo:.1%}-{hi:.1%} (±{within:.0%})")
    return page.judge(lo if measured < lo else hi, measured, higher_is_better=True,
                      within=within)


# -- Table 3.5 --------------------------------------------------------------------------------


def table_3_5_rows(figures: Figures) -> list[Row]:
    rows: list[Row] = []
    seconds, rate = figures.get("seconds"), figures.get("rate")
    table = figures.get("table_3_5", {})
    for topo, paper in TABLE_3_5.items():
        key = topo.lower()
        ref_setting = (f"{topo}, Heron, bolts p=4, {TABLE_3_5_RATE[topo]} tuples/s, 7,000 "
                       "tuples; stalls every ~1 s (exp.), 150 ms (Gaussian); copies of "
                       "every tuple (100%) at all operators")
        measured = table.get(topo)
        runs = {} if measured is None else {r["label"]: r for r in measured["runs"]}
        r0, r1 = runs.get("r=0"), runs.get("r=1")
        setting = (f"{TABLE_3_5_SHAPE[topo]}, protocol none, {rate:g} records/s, "
                   f"{seconds:g} s; stalls on every instance of {TABLE_3_5_FAULTED[topo]} "
                   "every ~1 s of its running time (exp.), Gaussian(150, 37.5) ms in "
                   "[75, 300] ms; copies of every tuple into each operator of p=2"
                   if measured else "-")
        base, full = paper[0.0], paper[1.0]
        specs = [
            ("p99", "tail latency (p99) reduction at 100%", 2, WITHIN_TAIL, "p99_ms"),
            ("missed", "missed deadline reduction at 100% (μ + 2σ of r=0 under faults)",
             1, WITHIN_REDUCTION, "missed_b"),
            ("mean", "mean latency reduction at 100%", 0, WITHIN_REDUCTION, "mean_ms"),
        ]
        for suffix, what, column, within, field in specs:
            anchor = f"dynamo-table3.5-{key}-{suffix}"
            ref_cut = 1.0 - full[column] / base[column]
            ref_fig = (f"{_pct(ref_cut)} ({base[column]:g} → {full[column]:g}"
                       f"{'' if column == 1 else ' ms'})")
            cut = None if r0 is None or r1 is None else _reduction(r1.get(field),
                                                                   r0.get(field))
            if cut is None or r0 is None or r1 is None:
                rows.append(_missing(anchor, "Table 3.5", f"{topo}: {what}", ref_setting,
                                     ref_fig, f"no {field} of r=0 and r=1 in the run"))
                continue
            if field == "missed_b":
                fig = f"{_pct(cut)} ({r0[field]:.2%} → {r1[field]:.2%} of records)"
            else:
                fig = f"{_pct(cut)} ({r0[field]:.1f} → {r1[field]:.1f} ms)"
            rows.append(Row(anchor, "Table 3.5", f"{topo}: {what}", ref_setting, ref_fig,
                            setting, fig, cut / ref_cut,
                            page.judge(ref_cut, cut, higher_is_better=True, within=within)))
        # The thesis (p. 61): "As expected, higher amounts of redundancy improve both the
        # mean latency and amount of missed deadlines"
        anchor = f"dynamo-table3.5-{key}-shape"
        ordered = sorted((r for r in runs.values() if r["label"].startswith("r=")
                          and r.get("missed_b") is not None),
                         key=lambda r: float(r["label"][2:]))
        claim = ("more copies, fewer missed deadlines (each ratio misses no more than the "
                 f"one below, within {WITHIN_SHAPE:.0%})")
        ref_fig = ", ".join(f"{int(r * 100)}%: {paper[r][1]}" for r in sorted(paper))
        if len(ordered) < 2:
            rows.append(_missing(anchor, "Table 3.5", f"{topo}: {claim}", ref_setting,
                                 ref_fig, "fewer than two ratios in the run"))
            continue
        missed = [r["missed_b"] for r in ordered]
        holds = _falling(missed)
        fig = ", ".join(f"{r['label']}: {r['missed_b']:.2%}" for r in ordered)
        rows.append(Row(anchor, "Table 3.5", f"{topo}: {claim}", ref_setting,
                        ref_fig + " missed", setting, fig + " missed", None,
                        page.judge_claim(holds, claim, why_not=fig)))
    return rows


# -- Fig 3.28 ---------------------------------------------------------------------------------


def fig_3_28_rows(figures: Figures) -> list[Row]:
    f = figures.get("fig3_28")
    ref_setting = ("DataClean, Heron, 33 instances a bolt, failure-free, no copies; "
                   "fine (custom) vs coarse (Heron's) tracking")
    rows: list[Row] = []
    paper = {"mean": FIG_3_28_FINE_MS["mean"] / FIG_3_28_COARSE_MS["mean"],
             "p99": FIG_3_28_FINE_MS["p99"] / FIG_3_28_COARSE_MS["p99"],
             "cpu": FIG_3_28_CPU_X, "throughput": FIG_3_28_THROUGHPUT_X}
    paper_fig = {
        "mean": f"{paper['mean']:.2f}× ({FIG_3_28_FINE_MS['mean']} vs "
                f"{FIG_3_28_COARSE_MS['mean']} ms)",
        "p99": f"{paper['p99']:.2f}× ({FIG_3_28_FINE_MS['p99']} vs "
               f"{FIG_3_28_COARSE_MS['p99']} ms)",
        "cpu": f"{paper['cpu']:.2f}× (+19% total)",
        "throughput": f"{paper['throughput']:.3g}× (1-2% lower)"}
    specs = [("mean", "complete latency, mean: fine / coarse", "mean_ms", False),
             ("p99", "complete latency, p99: fine / coarse", "p99_ms", False),
             ("cpu", "CPU of the job: fine / coarse", "cpu_s", False),
             ("throughput", "throughput (unpaced): fine / coarse", "tuples_per_s", True)]
    for suffix, what, field, higher in specs:
        anchor = f"dynamo-fig3.28-{suffix}"
        if not f or f.get(f"{field}_ratio") is None:
            rows.append(_missing(anchor, "Fig 3.28", what, ref_setting, paper_fig[suffix],
                                 "no fine/coarse figures in the run"))
            continue
        ratio = f[f"{field}_ratio"]
        unit = {"mean_ms": " ms", "p99_ms": " ms", "cpu_s": " s", "tuples_per_s": "/s"}[field]
        fmt = "{:,.0f}" if field == "tuples_per_s" else "{:.3g}"
        fig = (f"{ratio:.2f}× ({fmt.format(f['fine_' + field])}{unit} vs "
               f"{fmt.format(f['xor_' + field])}{unit})")
        setting = ("DataClean, parse p=2 → keyed filter p=2, " + (
            "unpaced" if field == "tuples_per_s" else "paced") + ", failure-free, no "
            f"copies; Acks(mode=fine) vs mode=xor (Storm's acker); median of "
            f"{f.get('repeats', '?')} alternating runs")
        rows.append(Row(anchor, "Fig 3.28", what, ref_setting, paper_fig[suffix], setting,
                        fig, ratio / paper[suffix],
                        page.judge(paper[suffix], ratio, higher_is_better=higher,
                                   within=WITHIN_ACKS)))
    # The thesis's own reading of Fig 3.28 (p. 76): "although we implement our progress
    # tracking at a higher level, we do not observe a decrease in performance" — its
    # 32 % it puts down to fewer hops ("an acknowledgment goes directly from the bolt
    # instance to spout"), which Bastion's coarse mode takes as well.
    anchor = "dynamo-fig3.28-no-cost"
    claim = "fine tracking costs no latency over coarse (mean and p99 within the noise)"
    if not f or f.get("mean_ms_ratio") is None or f.get("p99_ms_ratio") is None:
        rows.append(_missing(anchor, "Fig 3.28", claim, ref_setting, "lower latency",
                             "no fine/coarse figures in the run"))
    else:
        fig = f"mean {f['mean_ms_ratio']:.2f}×, p99 {f['p99_ms_ratio']:.2f}×"
        holds = max(f["mean_ms_ratio"], f["p99_ms_ratio"]) <= 1 + WITHIN_ACKS
        rows.append(Row(anchor, "Fig 3.28", claim, ref_setting,
                        "no decrease in performance: 0.68× mean, 0.69× p99",
                        "as above", fig, None, page.judge_claim(holds, claim, why_not=fig)))
    return rows


def fig_3_28_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    f = figures.get("fig3_28") or {}
    if not f:
        return []
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(6, 3.5), dpi=100)
    for ax, (title, coarse, fine) in zip((ax1, ax2), (
            ("thesis (Heron)", FIG_3_28_COARSE_MS, FIG_3_28_FINE_MS),
            ("Bastion", {"mean": f["xor_mean_ms"], "p99": f["xor_p99_ms"]},
             {"mean": f["fine_mean_ms"], "p99": f["fine_p99_ms"]}))):
        xs = range(2)
        ax.bar([x - 0.2 for x in xs], [coarse["mean"], coarse["p99"]], 0.4, label="coarse")
        ax.bar([x + 0.2 for x in xs], [fine["mean"], fine["p99"]], 0.4, label="fine")
        ax.set_xticks(list(xs), ["mean", "p99"])
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("latency (ms)")
    ax1.legend(fontsize=8)
    fig.suptitle("Fig 3.28: fine vs coarse acknowledgments, DataClean", fontsize=10)
    fig.tight_layout()
    path = out_dir / "dynamo-fig3.28.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- Fig 3.31 ---------------------------------------------------------------------------------


def fig_3_31_rows(figures: Figures) -> list[Row]:
    ratios = sorted(figures.get("ratios", []), key=lambda r: r["ratio"])
    by = {r["ratio"]: r for r in ratios}
    ref_setting = ("DataClean under acks, Heron, 33 instances a bolt, 368 tuples/s; lossy "
                   "links, MTBF 20-60 s (exp.), MTTR 500-1500 ms (Gaussian); copies at "
                   "the spout's outputs")
    setting = "-"
    if ratios:
        setting = (f"DataClean under acks (fine), view p=2 → keyed clean p=2, "
                   f"{figures['rate']:g} records/s, {figures['seconds']:g} s; lossy "
                   f"outages on both view instances, MTBF {figures['mtbf_s']:g} s (exp.), "
                   f"MTTR {figures['mttr_ms']:g} ms (Gaussian); copies on view; median of "
                   f"{figures['repeats']} runs; failed = replayed or over 500 ms")
    rows: list[Row] = []
    anchor = "dynamo-fig3.31-failed"
    what = "failed tuples, reduction at 100% redundancy"
    ref_fig = f"> {FIG_3_31_CUT:.0%}"
    cut = None
    if 0.0 in by and 1.0 in by:
        cut = _reduction(by[1.0]["failed"], by[0.0]["failed"])
    if cut is None:
        rows.append(_missing(anchor, "Fig 3.31", what, ref_setting, ref_fig,
                             "no failed tuples at r=0 (no outage landed) or no r=1 run"))
    else:
        fig = (f"{_pct(cut)} ({by[0.0]['failed']:,.0f} → {by[1.0]['failed']:,.0f} of "
               f"{by[0.0]['tuples']:,.0f}; both links down {figures['both_down_share']:.1%} "
               f"of the run, one {figures['link_down_share']:.1%})")
        rows.append(Row(anchor, "Fig 3.31", what, ref_setting, ref_fig, setting, fig,
                        cut / FIG_3_31_CUT,
                        page.judge(FIG_3_31_CUT, cut, higher_is_better=True,
                                   within=WITHIN_FAILED)))
    anchor = "dynamo-fig3.31-shape"
    claim = ("failed tuples fall as redundancy rises (each ratio fails no more than the "
             f"one below, within {WITHIN_SHAPE:.0%})")
    if len(ratios) < 2:
        rows.append(_missing(anchor, "Fig 3.31", claim, ref_setting, "falling curves",
                             "fewer than two ratios in the run"))
    else:
        holds = _falling([r["failed"] for r in ratios])
        fig = ", ".join(f"r={r['ratio']:g}: {r['failed_share']:.2%}" for r in ratios)
        rows.append(Row(anchor, "Fig 3.31", claim, ref_setting,
                        "falling in every panel (0-100%)", setting, fig, None,
                        page.judge_claim(holds, claim, why_not=fig)))
    return rows


def fig_3_31_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    ratios = sorted(figures.get("ratios", []), key=lambda r: r["ratio"])
    if not ratios:
        return []
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([r["ratio"] * 100 for r in ratios], [r["failed_share"] * 100 for r in ratios],
            "o-", label=f"Bastion, DataClean, MTBF {figures['mtbf_s']:g} s, "
                        f"MTTR {figures['mttr_ms']:g} ms")
    base = ratios[0]["failed_share"] * 100
    ax.plot([0, 100], [base, base * (1 - FIG_3_31_CUT)], "k--",
            label="thesis: > 51% fewer at 100% (from Bastion's r=0)")
    ax.set_xlabel("redundancy (%)")
    ax.set_ylabel("failed tuples (%)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("Fig 3.31: failed tuples under lossy links", fontsize=10)
    fig.tight_layout()
    path = out_dir / "dynamo-fig3.31.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- Figs 3.34-3.35 ---------------------------------------------------------------------------


def failed_instance_rows(figures: Figures) -> list[Row]:
    rows: list[Row] = []
    rate, seconds = figures.get("grep_rate"), figures.get("grep_seconds")
    deadline = "missed deadlines (μ + 2σ of r=0 under the fault, the thesis's)"

    def setting(kind: str) -> str:
        return (f"Grep under acks (fine), filter p=3, {rate:g} records/s, {seconds:g} s; "
                f"{kind}; ack timeout {figures.get('ack_timeout_s', 0):g} s")

    def cut_of(section: dict[str, Any], ratio: float) -> tuple[float | None, str]:
        runs = {r["ratio"]: r for r in section.get("runs", [])}
        if 0.0 not in runs or ratio not in runs:
            return None, ""
        cut = _reduction(runs[ratio]["missed_baseline"], runs[0.0]["missed_baseline"])
        fig = (f"{runs[0.0]['missed_baseline']:.2%} → {runs[ratio]['missed_baseline']:.2%} "
               f"of records (failure-free deadline: {runs[0.0]['missed_free']:.2%} → "
               f"{runs[ratio]['missed_free']:.2%})")
        return cut, fig

    rec = figures.get("recoverable") or {}
    anchor = "dynamo-fig3.34-missed"
    what = f"recoverable failed instance: {deadline}, reduction at 100%"
    ref_setting = ("six topologies, Heron, 33 instances a bolt; one instance fails at "
                   "30/60/120 s and recovers after 10/60/120 s")
    cut, fig = cut_of(rec, 1.0)
    if cut is None:
        rows.append(_missing(anchor, "Fig 3.34", what, ref_setting, "100% (to zero)",
                             "no crash runs at r=0 and r=1, or r=0 missed none"))
    else:
        kind = (f"match[1] crashing {figures.get('crashes')} times (MTBF "
                f"{figures.get('mtbf_s'):g} s, repair {figures.get('mttr_s'):g} s, "
                "exp.), restarted alone")
        rows.append(Row(anchor, "Fig 3.34", what, ref_setting, "100% (to zero)",
                        setting(kind), f"{_pct(cut)} ({fig})", cut / FIG_3_34_CUT,
                        page.judge(FIG_3_34_CUT, cut, higher_is_better=True,
                                   within=WITHIN_INSTANCE)))
    per = figures.get("persistent") or {}
    ref_setting = ("five topologies, Heron, up to 22 of 66 bolt instances fail for good "
                   "(three random profiles)")
    for ratio, (lo, hi) in FIG_3_35_CUT.items():
        anchor = f"dynamo-fig3.35-missed-{int(ratio * 100)}"
        what = f"persistently failed instances: {deadline}, reduction at {ratio:.0%}"
        ref_fig = f"{lo:.2%}-{hi:.0%}"
        cut, fig = cut_of(per, ratio)
        if cut is None:
            rows.append(_missing(anchor, "Fig 3.35", what, ref_setting, ref_fig,
                                 f"no persistent runs at r=0 and r={ratio:g}, or r=0 "
                                 "missed none"))
            continue
        kind = (f"match{per.get('instances', [1])} of 3 loses all it emits and "
                "acknowledges from ~1 s to the end of the input (the thesis's model: a "
                "link fault with a long MTTR)"
                + (f"; shares averaged over {per['repeats']} runs a ratio"
                   if per.get("repeats", 1) > 1 else ""))
        rows.append(Row(anchor, "Fig 3.35", what, ref_setting, ref_fig, setting(kind),
                        f"{_pct(cut)} ({fig})", None,
                        _judge_range(lo, hi, cut, within=WITHIN_PERSISTENT[ratio],
                                     what=f"the reduction at {ratio:.0%}")))
    return rows


def failed_instance_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    panels = [(name, figures.get(name) or {}) for name in ("recoverable", "persistent")]
    if not any(p.get("runs") for _, p in panels):
        return []
    fig, axes = plt.subplots(1, 2, figsize=(6, 3.5), dpi=100)
    for ax, (name, section) in zip(axes, panels):
        runs = section.get("runs", [])
        ax.bar([f"{r['ratio']:.0%}" for r in runs],
               [r["missed_baseline"] * 100 for r in runs])
        ax.set_xlabel("redundancy")
        ax.set_ylabel("missed deadlines (% of records)")
        ax.set_title({"recoverable": "Fig 3.34: a crash, recovered",
                      "persistent": "Fig 3.35: failed for good"}[name], fontsize=9)
    fig.tight_layout()
    path = out_dir / "dynamo-failed-instances.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- Figs 4.9-4.10 ----------------------------------------------------------------------------


def _overheads(runs: dict[str, Any], field: str) -> dict[str, float] | None:
    """Each run's overhead over redundancy 0 without faults (0.5 = 50 % more)."""
    calm = runs.get("r=0 calm", {}).get(field)
    if not calm:
        return None
    return {label: r[field] / calm - 1.0 for label, r in runs.items() if field in r}


def _ratio_in_and_out(decisions: Sequence[Sequence[float]],
                      periods: Sequence[Sequence[float]], seconds: float
                      ) -> tuple[float, float] | None:
    """The managed ratio's time-weighted mean inside the injection periods and outside
    them, over the run: each decision's ratio holds until the next one (0 before the
    first)."""
    steps = sorted((float(t), float(r)) for t, r in decisions)
    if not steps or seconds <= 0:
        return None
    bounds = [0.0] + [t for t, _ in steps] + [max(seconds, steps[-1][0])]
    values = [0.0] + [r for _, r in steps]
    weight = {True: 0.0, False: 0.0}
    total = {True: 0.0, False: 0.0}
    for (a, b), ratio in zip(zip(bounds, bounds[1:]), values):
        # split [a, b) at the periods' edges
        cuts = sorted({a, b, *(x for p in periods for x in p[:2] if a < x < b)})
        for lo, hi in zip(cuts, cuts[1:]):
            mid = (lo + hi) / 2
            faulty = any(p[0] <= mid < p[1] for p in periods)
            weight[faulty] += hi - lo
            total[faulty] += (hi - lo) * ratio
    if not weight[True] or not weight[False]:
        return None
    return total[True] / weight[True], total[False] / weight[False]


def managed_rows(figures: Figures) -> list[Row]:
    m = figures.get("managed") or {}
    runs = m.get("runs", {})
    ref_setting = ("Grep, Heron, 33 instances a bolt, 18 min: stalls (450 ms mean) in "
                   "periods of 270/180/90 s at MTBF 2/4/1 s; bound on the p90 of 1-s "
                   "windows; static 1.6; overheads vs r=0")
    setting = "-"
    if m:
        setting = (f"Grep, filter p=3, the thesis's profile / {1080 / m['seconds']:.0f} "
                   f"({m['seconds']:.0f} s a run), stalls Gaussian(450, 100) ms; bound "
                   f"{m['bound_ms']:.0f} ms on the p90 of 1-s windows (3× failure-free "
                   f"p90); static 1.6; {m['rounds']} round(s); overheads vs r=0 without "
                   "faults")
    rows: list[Row] = []
    zero, managed, static = (runs.get(k, {}) for k in ("r=0", "managed", "static 1.6"))
    for anchor, label, run, ref_windows in (
            ("dynamo-fig4.10-violated-managed", "managed", managed,
             FIG_4_10_WINDOWS["managed"]),
            ("dynamo-fig4.10-violated-static", "static 1.6", static,
             FIG_4_10_WINDOWS["static"])):
        ref_cut = 1 - ref_windows / FIG_4_10_WINDOWS["r=0"]
        what = f"violated windows, {label} vs r=0: reduction"
        ref_fig = f"{_pct(ref_cut)} ({FIG_4_10_WINDOWS['r=0']} → {ref_windows})"
        cut = _reduction(run.get("violated"), zero.get("violated"))
        if cut is None:
            rows.append(_missing(anchor, "Fig 4.10", what, ref_setting, ref_fig,
                                 "r=0 violated no window (or a run is missing)"))
            continue
        fig = (f"{_pct(cut)} ({zero['violated']} → {run['violated']} of "
               f"{run['windows']} windows)")
        rows.append(Row(anchor, "Fig 4.10", what, ref_setting, ref_fig, setting, fig,
                        cut / ref_cut,
                        page.judge(ref_cut, cut, higher_is_better=True,
                                   within=WITHIN_REDUCTION)))
    for anchor, what, field, paper in (
            ("dynamo-fig4.10-cpu-overhead", "CPU overhead, managed / static", "cpu_s",
             FIG_4_10_CPU_OVERHEAD),
            ("dynamo-fig4.10-traffic-overhead", "traffic overhead (tuples sent), "
             "managed / static", "records", FIG_4_10_TRAFFIC_OVERHEAD)):
        ref_ratio = paper["managed"] / paper["static"]
        ref_fig = (f"{ref_ratio:.2f}× (+{paper['managed']:.1%} vs "
                   f"+{paper['static']:.1%})")
        over = _overheads(runs, field)
        if not over or "managed" not in over or "static 1.6" not in over \
                or over["static 1.6"] <= 0:
            rows.append(_missing(anchor, "Fig 4.10", what, ref_setting, ref_fig,
                                 "no run without faults, or static cost nothing over it"))
            continue
        # A managed run that spent less than r=0 without faults (CPU noise of a shared
        # host) cost nothing measurable: its share of static's overhead is 0, not below
        ratio = max(0.0, over["managed"]) / over["static 1.6"]
        fig = (f"{ratio:.2f}× ({over['managed']:+.1%} vs {over['static 1.6']:+.1%}; "
               f"r=0 under faults {over.get('r=0', float('nan')):+.1%})")
        rows.append(Row(anchor, "Fig 4.10", what, ref_setting, ref_fig, setting, fig,
                        ratio / ref_ratio,
                        page.judge(ref_ratio, ratio, higher_is_better=False,
                                   within=WITHIN_OVERHEAD)))
    # Fig 4.9: "the resiliency manager seeks out redundancy levels where the injection
    # periods with more severe faults have a higher redundancy level" and reduces it to
    # zero without faults
    anchor = "dynamo-fig4.9-adapts"
    claim = "the managed ratio is higher while faults are injected than in the calm"
    means = _ratio_in_and_out(m.get("decisions", []), m.get("periods", []),
                              m.get("seconds", 0.0))
    if means is None:
        rows.append(_missing(anchor, "Fig 4.9", claim, ref_setting,
                             "up in each injection period, to 0 between",
                             "no decisions of the manager both in and out of faults"))
    else:
        mean_in, mean_out = means
        fig = f"mean ratio {mean_in:.2f} in faults, {mean_out:.2f} in calm"
        rows.append(Row(anchor, "Fig 4.9", claim, ref_setting,
                        "up in each injection period, to 0 between", setting, fig, None,
                        page.judge_claim(mean_in > mean_out, claim, why_not=fig)))
    return rows


def managed_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    m = figures.get("managed") or {}
    if not m:
        return []
    paths = []
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for a, b, mtbf in m["periods"]:
        ax.axvspan(a, b, color="0.9")
        ax.text((a + b) / 2, 0, f"MTBF {mtbf:g} s", ha="center", va="bottom", fontsize=7)
    for label, style in (("r=0", ":"), ("managed", "-")):
        points = m["timeline"].get(label, [])
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=f"p90, {label}")
    ax.axhline(m["bound_ms"], color="r", lw=0.8, label="bound")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("p90 of the 1-s window (ms)")
    ax.set_yscale("log")
    ax2 = ax.twinx()
    ax2.step([d[0] for d in m["decisions"]], [d[1] * 100 for d in m["decisions"]],
             "g-", where="post", lw=0.8, label="managed ratio")
    ax2.set_ylabel("redundancy (%)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("Fig 4.9: the manager seeks the redundancy level (Grep, round 1)",
                 fontsize=10)
    fig.tight_layout()
    paths.append(out_dir / "dynamo-fig4.9.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    runs = m["runs"]
    labels = [label for label in ("r=0", "managed", "static 1.6") if label in runs]
    cpu, tuples = _overheads(runs, "cpu_s") or {}, _overheads(runs, "records") or {}
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    xs = range(len(labels))
    ax.bar([x - 0.25 for x in xs], [runs[k]["violated"] for k in labels], 0.25,
           label="violated windows")
    ax.set_ylabel("violated windows")
    ax2 = ax.twinx()
    ax2.bar(list(xs), [tuples.get(k, 0) * 100 for k in labels], 0.25, color="C1",
            label="traffic overhead %")
    ax2.bar([x + 0.25 for x in xs], [cpu.get(k, 0) * 100 for k in labels], 0.25,
            color="C2", label="CPU overhead %")
    ax2.set_ylabel("overhead over r=0 without faults (%)")
    ax.set_xticks(list(xs), labels)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    # on the twin axes, drawn last, so that no bar covers it
    ax2.legend(handles, [str(h.get_label()) for h in handles], fontsize=7,
               loc="upper center", framealpha=1.0)
    ax.set_title("Fig 4.10: managed vs static redundancy (Grep, sums of rounds)",
                 fontsize=10)
    fig.tight_layout()
    paths.append(out_dir / "dynamo-fig4.10.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


# -- the section ------------------------------------------------------------------------------

TABLE_3_5_ARGS: Sequence[str] = ("--sections", "1", "--topologies", "WordCount,Grep",
                                 "--skip-calm")

SECTION = page.Section(
    key="dynamo",
    title="Dynamo: tuple-level redundancy against runtime faults (Tran, USC 2020)",
    source=(f"`{SOURCE_FILE}`: G. P. C. Tran, *Data and Computation Redundancy in Stream "
            "Processing Applications for Improved Fault Resiliency and Real-Time "
            "Performance*, PhD dissertation, University of Southern California, 2020"),
    intro=(
        "The thesis sends copies of a share of the tuples to a second instance of an "
        "operator on Heron, keeps the first copy to finish, and measures on Intel's Storm "
        "Benchmark topologies (4 to 33 instances a bolt, minutes a trial) what the copies "
        "buy against stalled instances, lossy links and failed instances, and what a "
        "resiliency manager that moves the share at run time saves over a static level. "
        "Bastion runs the same experiments with 2-3 instances an operator and seconds of "
        "input on a 2-core machine, the fault profiles compressed in time; every figure "
        "compared is relative to a baseline of the same run (a reduction against no "
        "copies, a ratio of two modes, an overhead against redundancy 0 without faults)."),
    experiments=[
        page.Experiment(
            key="table3.5", title="Table 3.5: tail latency and missed deadlines against "
                                  "redundancy, per topology",
            script="redundancy.py",
            args=[*TABLE_3_5_ARGS, "--seconds", "10", "--ratios", "0,0.5,1"],
            quick_args=[*TABLE_3_5_ARGS, "--seconds", "3", "--ratios", "0,1"],
            rows=table_3_5_rows, budget_s=100),
        page.Experiment(
            key="fig3.28", title="Fig 3.28: fine vs coarse acknowledgments",
            script="acks.py",
            args=["--sections", "c", "--fig328-repeats", "3", "--fig328-seconds", "5",
                  "--fig328-records", "60000"],
            quick_args=["--sections", "c", "--fig328-repeats", "1", "--fig328-seconds",
                        "2", "--fig328-records", "20000"],
            rows=fig_3_28_rows, plot=fig_3_28_plot, budget_s=60),
        page.Experiment(
            key="fig3.31", title="Fig 3.31: lossy links, failed tuples with and without "
                                 "copies",
            script="lossy_links.py",
            args=["--seconds", "8", "--repeats", "2", "--ratios", "0,0.5,1"],
            quick_args=["--seconds", "5", "--repeats", "1", "--ratios", "0,1"],
            rows=fig_3_31_rows, plot=fig_3_31_plot, budget_s=70),
        page.Experiment(
            key="failed", title="Figs 3.34-3.35: failed instances, recoverable and "
                                "persistent",
            script="local_recovery.py",
            args=["--sections", "2,3", "--grep-seconds", "6", "--crashes", "2",
                  "--mtbf-s", "1.5", "--mttr-s", "1.5", "--ack-timeout-s", "2",
                  "--persist-repeats", "4"],
            quick_args=["--sections", "2,3", "--grep-seconds", "2.5", "--crashes", "1",
                        "--mtbf-s", "1", "--mttr-s", "1", "--ack-timeout-s", "2",
                        "--persist-ratios", "0,0.25,1", "--persist-from-s", "0.5"],
            rows=failed_instance_rows, plot=failed_instance_plot, budget_s=180),
        page.Experiment(
            key="managed", title="Figs 4.9-4.10: managed vs static redundancy",
            script="redundancy.py",
            args=["--sections", "3", "--seconds", "5", "--managed-scale", "27",
                  "--managed-rounds", "1"],
            # the thesis's fault profile / 90: four 12-s runs (/60: 87 s in all)
            quick_args=["--sections", "3", "--seconds", "3", "--managed-scale", "90",
                        "--managed-rounds", "1"],
            rows=managed_rows, plot=managed_plot, budget_s=180),
    ],
)
