"""CheckMate (Siachamis et al., ICDE 2024) on the results page.

CheckMate compares the three families of checkpointing protocols — coordinated
(aligned markers), uncoordinated (independent checkpoints, a recovery line found
after the failure) and communication-induced (CIC: independent checkpoints plus
forced ones decided from clocks piggybacked on every message) — on NexMark Q1/Q3/Q8/Q12
and on a cyclic reachability query, on 10 to 100 one-CPU workers. Its headline
figures are relative (throughput against a checkpoint-free run of the same query,
message size against the same) or orderings between the protocols, and those are
what the rows compare: absolute rates on a 2-core VM say nothing about its cluster.

Four experiments, each one run of a script:

- ``protocols`` (`benchmarks/protocols.py --parts main`): Fig. 7, Table II, Table III
  — every query under every protocol, unpaced, at parallelism 2;
- ``restart`` (`benchmarks/restart_parallelism.py`): Fig. 11 — restart time against
  parallelism on a simulated three-node Ray cluster on 127.0.0.1;
- ``skew`` (`benchmarks/protocols.py --parts skew-latency`): Fig. 12 — p50 latency and
  checkpoint time at 10/20/30% hot items;
- ``cyclic`` (`benchmarks/protocols.py --parts cyclic`): Table IV — the reachability
  query under uncoordinated and CIC, one instance of its loop killed.

Every constant typed from the paper cites its table or figure and the sentence of
§VII-B it comes from (the paper's figures carry no numbers in its text; where only a
figure shows a value, the row uses what the text says of it).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from bastion.bench import results as page
from bastion.bench.results import Experiment, Figures, Row, Section

PAPER = "003_b4fc92d6697b692f.txt"
CHECKPOINTING = ["coordinated", "uncoordinated", "cic"]
ORDER = ["q1", "q3", "q8", "q12"]
LABEL = {"none": "none", "coordinated": "COOR", "uncoordinated": "UNC", "cic": "CIC"}

# -- the paper's figures ------------------------------------------------------------

# Fig. 7, §VII-B "Maximum Sustainable Throughput": "For Q1, Q8, and Q12, the
# coordinated approach ... reaches the same MST as the checkpoint-free execution until
# we reach 70 workers."
FIG7_COORDINATED = 1.00
# Fig. 7: "The uncoordinated protocol follows closely, achieving an MST around 10%
# lower than the coordinated approach in all cases."
FIG7_UNCOORDINATED = 0.90
# Fig. 7: "the communication-induced protocol fails to keep up and, in higher
# parallelism, can reach an MST lower than 50% of the checkpoint-free MST."
FIG7_CIC = 0.50
# Fig. 7: "the coordinated and uncoordinated protocols achieve an MST higher than 70%
# of the optimal for Q3 in most cases".
FIG7_Q3_FLOOR = 0.70
# Table II, 10 workers: message size relative to no checkpoints, per query.
TABLE2_COOR = {"q1": 1.00, "q3": 1.00, "q8": 1.00, "q12": 1.00}
TABLE2_UNC = {"q1": 1.00, "q3": 1.00, "q8": 1.00, "q12": 1.00}
TABLE2_CIC = {"q1": 2.10, "q3": 1.82, "q8": 1.74, "q12": 1.79}
# Table III, 10 workers: total checkpoints (invalid share) per query.
TABLE3_UNC = {"q1": (303, 0.00), "q3": (455, 0.04), "q8": (384, 0.02), "q12": (282, 0.03)}
TABLE3_CIC = {"q1": (285, 0.00), "q3": (471, 0.03), "q8": (386, 0.03), "q12": (282, 0.04)}
TABLE3_COOR = {"q1": 240, "q3": 400, "q8": 360, "q12": 240}
# Table III, §VII-B "Invalid checkpoints": "the uncoordinated and communication-induced
# protocols introduce very few invalid checkpoints" — at most 4% in the table; a share
# above 5% is a rollback the paper did not see.
TABLE3_FEW = 0.05
# Table IV: average checkpointing time (ms), restart time (ms), invalid checkpoints.
TABLE4 = {5: {"uncoordinated": (0.01, 620.0, 0.014), "cic": (2.73, 347.0, 0.017)},
          10: {"uncoordinated": (1.38, 344.0, 0.014), "cic": (8.39, 399.0, 0.016)}}
# Table IV, §VII-B "Cyclic query": "Neither protocol outperforms the other when employed
# on top of cyclic queries in any meaningful aspect, and the uncoordinated protocol does
# not introduce a domino effect." CIC/UNC restart time was 0.56x (5 workers) and 1.16x
# (10 workers).

# -- noise bands (from repeated runs on this machine; see the module's test) ----------

# Throughput relative to none, best of two unpaced runs of ~2–3 s, median over queries:
# between five runs on this 2-core machine, shared with four other jobs (load average
# 11–16), the medians moved from 0.84× to 1.00× (COOR) and from 0.87× to 1.32× (UNC).
THROUGHPUT_WITHIN = 0.40
# Message sizes are byte counts of the run, not timings: they move by the share of
# frames filled differently (well under 5%).
SIZE_WITHIN = 0.05
# The per-message estimate depends on how full the frames were (clock bytes per frame
# spread over the records): ±10%; the length of the clock vector (tasks of the job, 10
# workers' worth in the paper) is a setting, not noise, and is stated in the row.
PER_MESSAGE_WITHIN = 0.25
# Restart times (tens of ms, the median of three kills per cell) moved by up to ±20%
# between full runs.
RESTART_WITHIN = 0.20


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _queries(figures: Figures, names: list[str]) -> list[str]:
    return [q for q in names if q in figures.get("queries", {})]


# -- protocols: Fig. 7, Table II, Table III ---------------------------------------------


def protocols_rows(figures: Figures) -> list[Row]:
    qs = figures.get("queries", {})
    p = figures.get("parallelism", 2)
    setting = (f"NexMark at parallelism {p} on 2 cores, unpaced, "
               f"{figures.get('events', 0):,} events, checkpoint every "
               f"{figures.get('interval_s', 0):g} s")
    if not qs:
        reason = page.not_measured("the run wrote no query figures")
        return [Row(f"checkmate-{key}", ref, "no figures", "", "", setting, "", None, reason)
                for key, ref in [("fig7", "Fig 7"), ("table2", "Table II"),
                                 ("table3", "Table III")]]
    rows: list[Row] = []

    def vs_none(protocol: str, names: list[str]) -> tuple[float, str]:
        present = _queries(figures, names)
        values = [qs[q][protocol]["vs_none"] for q in present]
        text = ", ".join(f"{q.upper()} {qs[q][protocol]['vs_none']:.2f}×" for q in present)
        return _median(values), text

    simple = ["q1", "q8", "q12"]
    for protocol, reference, paper_text, names in [
        ("coordinated", FIG7_COORDINATED, "1.00× (Q1/Q8/Q12, up to 50 workers)", simple),
        ("uncoordinated", FIG7_UNCOORDINATED, "≈0.90× (10% below COOR, all cases)", simple),
        ("cic", FIG7_CIC, "< 0.50× at high parallelism, the lowest of the three (its "
         "values at 10 workers are only in the plot)",
         ["q1", "q3", "q8", "q12"]),
    ]:
        measured, text = vs_none(protocol, names)
        ran = "/".join(q.upper() for q in _queries(figures, names))
        judgement = page.judge(reference, measured, higher_is_better=True,
                               within=THROUGHPUT_WITHIN)
        rows.append(Row(
            f"checkmate-fig7-{protocol}", "Fig 7",
            f"MST relative to no checkpoints, {LABEL[protocol]}",
            f"10–100 one-CPU workers; {'/'.join(q.upper() for q in names)}",
            paper_text, setting + f"; best of the runs, median over {ran or 'none'}",
            f"{measured:.2f}× ({text})", measured / reference, judgement))
    if "q3" in qs:
        q3 = min(qs["q3"]["coordinated"]["vs_none"], qs["q3"]["uncoordinated"]["vs_none"])
        rows.append(Row(
            "checkmate-fig7-q3", "Fig 7", "Q3 MST relative to no checkpoints, COOR and UNC",
            "10–100 workers", f"> {FIG7_Q3_FLOOR:.2f}× in most cases",
            setting + "; the lower of COOR and UNC",
            f"{q3:.2f}× (COOR {qs['q3']['coordinated']['vs_none']:.2f}×, "
            f"UNC {qs['q3']['uncoordinated']['vs_none']:.2f}×)",
            q3 / FIG7_Q3_FLOOR,
            # the paper's figure is a floor: above it is what it claims, however far
            page.judge_claim(q3 * (1 + THROUGHPUT_WITHIN) >= FIG7_Q3_FLOOR,
                             f"COOR and UNC keep more than {FIG7_Q3_FLOOR:.0%} of the "
                             f"checkpoint-free throughput on Q3 (within the "
                             f"±{THROUGHPUT_WITHIN:.0%} a ratio moves)",
                             why_not=f"the lower is {q3:.2f}×")))

    # Table II: message size relative to no checkpoints.
    networked = [q for q in ORDER if q in qs and qs[q]["cic"].get("frames_sent", 0) > 0
                 and qs[q]["cic"].get("data_bytes", 1) > 0]
    for protocol, sizes in [("coordinated", TABLE2_COOR), ("uncoordinated", TABLE2_UNC)]:
        present = [q for q in networked if q in sizes]
        measured = _median([qs[q][protocol]["msg_size_per_frame"] for q in present])
        reference = _median([sizes[q] for q in present])
        rows.append(Row(
            f"checkmate-table2-{protocol}", "Table II", f"message size, {LABEL[protocol]}",
            "10 workers, relative to no checkpoints", f"{reference:.2f}×",
            setting + f"; bytes sent, median over {'/'.join(q.upper() for q in present)}",
            f"{measured:.4f}×", measured / reference,
            page.judge(reference, measured, higher_is_better=False, within=SIZE_WITHIN)))
    present = [q for q in networked if q in TABLE2_CIC]
    cic_ref = _median([TABLE2_CIC[q] for q in present])
    ref_text = ", ".join(f"{q.upper()} {TABLE2_CIC[q]:.2f}×" for q in present)
    per_frame = _median([qs[q]["cic"]["msg_size_per_frame"] for q in present])
    per_message = _median([qs[q]["cic"]["msg_size_per_message"] for q in present])
    tasks = max((qs[q]["cic"].get("tasks", 0) for q in present), default=0)
    rows.append(Row(
        "checkmate-table2-cic-per-frame", "Table II",
        "message size, CIC: Bastion's clocks once per frame",
        "10 workers, clocks on every message", f"median {cic_ref:.2f}× ({ref_text})",
        setting + "; HMNR clocks once per frame (a batch of records)",
        f"{per_frame:.4f}×", per_frame / cic_ref if cic_ref else None,
        page.judge(cic_ref, per_frame, higher_is_better=False, within=SIZE_WITHIN)))
    rows.append(Row(
        "checkmate-table2-cic-per-message", "Table II",
        "message size, CIC: the same clocks on every message (for comparison)",
        "10 workers, clocks on every message", f"median {cic_ref:.2f}× ({ref_text})",
        setting + f"; an average frame's clock bytes once per record sent (jobs of up to "
        f"{tasks} tasks: a shorter clock vector than 10 workers')",
        f"{per_message:.3f}× ("
        + ", ".join(f"{q.upper()} {qs[q]['cic']['msg_size_per_message']:.2f}×" for q in present)
        + ")", per_message / cic_ref if cic_ref else None,
        page.judge(cic_ref, per_message, higher_is_better=False, within=PER_MESSAGE_WITHIN)))
    if not present:
        rows[-2:] = [dataclasses.replace(r, judgement=page.not_measured(
            "no query sent frames between tasks")) for r in rows[-2:]]

    # Table III: invalid checkpoints, and how many checkpoints each protocol took.
    for protocol, table in [("uncoordinated", TABLE3_UNC), ("cic", TABLE3_CIC)]:
        present = [q for q in ORDER if q in qs and q in table]
        shares = {q: qs[q][protocol]["invalid_share"] for q in present}
        worst = max(shares.values(), default=float("nan"))
        rows.append(Row(
            f"checkmate-table3-{protocol}", "Table III",
            f"invalid checkpoints, {LABEL[protocol]}", "10 workers, 60 s runs",
            ", ".join(f"{q.upper()} {table[q][0]} ({table[q][1]:.0%})" for q in present),
            setting, ", ".join(f"{q.upper()} {qs[q][protocol]['task_checkpoints']} "
                               f"({shares[q]:.0%})" for q in present),
            None, page.judge_claim(
                bool(shares) and worst <= TABLE3_FEW,
                f"few invalid checkpoints, no domino effect (≤ {TABLE3_FEW:.0%} on every query)",
                why_not=f"up to {worst:.0%}")))
    present = [q for q in ORDER if q in qs and q in TABLE3_COOR]
    fewer = [q for q in present
             if qs[q]["coordinated"]["task_checkpoints"]
             > min(qs[q]["uncoordinated"]["task_checkpoints"], qs[q]["cic"]["task_checkpoints"])]
    rows.append(Row(
        "checkmate-table3-counts", "Table III",
        "checkpoints taken: UNC and CIC at least as many as COOR",
        "10 workers, operator checkpoints",
        ", ".join(f"{q.upper()} COOR {TABLE3_COOR[q]}" for q in present),
        setting + "; COOR: rounds × tasks",
        ", ".join(f"{q.upper()} COOR {qs[q]['coordinated']['task_checkpoints']} / UNC "
                  f"{qs[q]['uncoordinated']['task_checkpoints']} / CIC "
                  f"{qs[q]['cic']['task_checkpoints']}" for q in present),
        None, page.judge_claim(
            bool(present) and not fewer,
            "UNC and CIC take at least as many checkpoints as COOR, each task on its own clock",
            why_not="COOR took more on " + "/".join(q.upper() for q in fewer))
        if all(qs[q]["coordinated"]["checkpoints"] > 0 for q in present) else
        page.not_measured("COOR completed no round in a run: the runs were shorter than "
                          "its checkpoint")))
    return rows


def protocols_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    qs = figures.get("queries", {})
    names = [q for q in ("q1", "q3", "q8", "q12") if q in qs]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    width = 0.25
    for i, protocol in enumerate(CHECKPOINTING):
        ax.bar([j + (i - 1) * width for j in range(len(names))],
               [qs[q][protocol]["vs_none"] for q in names], width, label=LABEL[protocol])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(names)), [q.upper() for q in names])
    ax.set_ylabel("MST / MST without checkpoints")
    ax.set_title(f"Fig 7 (Bastion, p={figures.get('parallelism', 2)}): throughput by protocol")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "checkmate-protocols.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- restart: Fig. 11 -------------------------------------------------------------------


def restart_rows(figures: Figures) -> list[Row]:
    ps = figures.get("parallelism", [])
    times = figures.get("restart_s", {})
    setting = (f"NexMark {str(figures.get('query', '?')).upper()} at "
               f"{figures.get('rate', 0):,.0f} events/s, p = "
               f"{'/'.join(str(p) for p in ps)} on {figures.get('nodes', '?')} simulated "
               f"nodes (Ray cluster_utils on 127.0.0.1), one instance killed")
    measured_all = all(len(times.get(x, [])) == len(ps) and all(v >= 0 for v in times[x])
                       for x in CHECKPOINTING) and len(ps) >= 2
    figure = "; ".join(f"{LABEL[x]} " + "/".join(f"{v:.2f}" for v in times.get(x, []))
                       + " s" for x in CHECKPOINTING)
    if not measured_all:
        why = page.not_measured("a run recorded no failure, or fewer than two parallelisms")
        return [Row("checkmate-fig11-coordinated-fastest", "Fig 11", "restart time", "", "",
                    setting, figure, None, why),
                Row("checkmate-fig11-growth", "Fig 11", "restart time", "", "", setting,
                    figure, None, why)]
    means = {x: statistics.mean(times[x]) for x in CHECKPOINTING}
    others = min(means["uncoordinated"], means["cic"])
    # Fig. 11, §VII-B "Recovery & Restart Time": "On average, the coordinated protocol
    # restarts faster than the other two protocols. This is especially evident for a
    # larger number of workers."
    fastest = page.judge_claim(
        means["coordinated"] <= others * (1 + RESTART_WITHIN),
        f"COOR restarts no slower than UNC and CIC on average over the parallelisms "
        f"(within the ±{RESTART_WITHIN:.0%} a restart moves between runs)",
        why_not=f"mean COOR {means['coordinated']:.2f} s, UNC {means['uncoordinated']:.2f} s, "
                f"CIC {means['cic']:.2f} s")
    # Fig. 11: "the restart process for the uncoordinated and communication-induced
    # protocols can take up to 10 times longer than the coordinated for 100 workers":
    # the gap widens with parallelism.
    gap_low = min(times["uncoordinated"][0], times["cic"][0]) / times["coordinated"][0]
    gap_high = min(times["uncoordinated"][-1], times["cic"][-1]) / times["coordinated"][-1]
    # Measured and shown, not judged: between p=1 and p=3 the gap moved from 0.72× to
    # 1.05× between two full runs — restarts of 50–150 ms differ by less than their
    # noise there, and the gap the paper reports opens at 50–100 workers.
    growth = page.not_comparable(
        "the gap opens at 50–100 workers; 3 simulated nodes on 2 cores reach p=3, where "
        "restarts differ by less than their run-to-run noise")
    return [
        Row("checkmate-fig11-coordinated-fastest", "Fig 11",
            "restart time: COOR fastest on average", "10–100 workers, per query",
            "COOR restarts fastest on average", setting, figure,
            means["coordinated"] / others if others else None, fastest),
        Row("checkmate-fig11-growth", "Fig 11",
            "restart time: UNC/CIC against COOR as parallelism grows", "10–100 workers",
            "up to 10× COOR's at 100 workers", setting,
            f"{gap_low:.2f}× at p={ps[0]}, {gap_high:.2f}× at p={ps[-1]}", gap_high, growth),
    ]


def restart_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    ps = figures.get("parallelism", [])
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for protocol in CHECKPOINTING:
        values = figures.get("restart_s", {}).get(protocol, [])
        points = [(p, v) for p, v in zip(ps, values) if v >= 0]
        ax.plot([p for p, _ in points], [v for _, v in points], marker="o",
                label=LABEL[protocol])
    ax.set_xlabel("parallelism (simulated nodes: %s)" % figures.get("nodes", "?"))
    ax.set_ylabel("restart time (s)")
    ax.set_xticks(ps)
    ax.set_title(f"Fig 11 (Bastion, {str(figures.get('query', '')).upper()}): "
                 "restart time after a kill")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "checkmate-restart.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- skew: Fig. 12 -----------------------------------------------------------------------


def hot_instance_load(hot: float, parallelism: int, load: float) -> float:
    """How loaded the instance holding the hot key is, as a fraction of its capacity:
    it gets the hot share plus its 1/p of the rest, at ``load`` of the job's MST."""
    return (hot + (1.0 - hot) / parallelism) * parallelism * load


def skew_rows(figures: Figures) -> list[Row]:
    skew = figures.get("skew", {})
    by = skew.get("protocols", {})
    hots = skew.get("hot", [])
    p, load = skew.get("parallelism", 2), skew.get("load", 0.5)
    # Fig. 12 ran 10 workers at 50% (a) and 80% (b) of MST: the hot instance carried
    # 0.95x/1.40x/1.85x of its capacity at 10/20/30% in (a) — a straggler. At p=2 the
    # same hot ratios load it far less; the setting says how much.
    straggle = "/".join(f"{hot_instance_load(h, p, load):.2f}×" for h in hots)
    rate = float(next(iter(by.values()))["rate"]) if by else 0.0
    setting = (f"NexMark {str(skew.get('query', '?')).upper()}, p={p}, every protocol at "
               f"{rate:,.0f} events/s ({load:.0%} of "
               f"the lowest protocol's non-skewed MST), hot items "
               + "/".join(f"{h:.0%}" for h in hots)
               + f": the hot instance at {straggle} of its capacity")
    paper_setting = ("Q3/Q8/Q12, 10 workers at 50% and 80% of MST, hot 10/20/30% "
                     "(the hot instance at 0.95×/1.40×/1.85× of its capacity at 50%)")
    if set(by) != set(CHECKPOINTING) or not hots:
        why = page.not_measured("the run wrote no skew figures for every protocol")
        return [Row(f"checkmate-fig12-{k}", "Fig 12", k, "", "", setting, "", None, why)
                for k in ("p50", "checkpoint-time")]

    def series(metric: str) -> str:
        return "; ".join(f"{LABEL[x]} " + "/".join(f"{v:.0f}" for v in by[x][metric])
                         + " ms" for x in CHECKPOINTING)

    rows = []
    # Fig. 12, §VII-B "Skewed NexMark": "the coordinated protocol performs the worst
    # regarding 50th percentile latency and average checkpointing time in both
    # throughputs ... In summary, the uncoordinated and communication-induced protocols
    # can handle skew more effectively in every case."
    for key, metric, what in [("p50", "p50_ms", "p50 latency"),
                              ("checkpoint-time", "checkpoint_ms", "average checkpoint time")]:
        coor = statistics.mean(by["coordinated"][metric])
        other = max(statistics.mean(by["uncoordinated"][metric]),
                    statistics.mean(by["cic"][metric]))
        rows.append(Row(
            f"checkmate-fig12-{key}", "Fig 12", f"{what} under skew", paper_setting,
            "COOR the worst; UNC and CIC stay low", setting, series(metric),
            coor / other if other else None,
            page.judge_claim(other < coor,
                             f"UNC and CIC keep the {what} below COOR's under skew (mean "
                             "over the hot ratios)",
                             why_not=f"COOR {coor:.1f} ms, the higher of UNC/CIC {other:.1f} ms")))
    return rows


def skew_plot(figures: Figures, out_dir: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    skew = figures.get("skew", {})
    hots = [h * 100 for h in skew.get("hot", [])]
    fig, (left, right) = plt.subplots(1, 2, figsize=(6, 3.5), dpi=100)
    for protocol in CHECKPOINTING:
        data = skew.get("protocols", {}).get(protocol)
        if not data:
            continue
        left.plot(hots, data["p50_ms"], marker="o", label=LABEL[protocol])
        right.plot(hots, data["checkpoint_ms"], marker="o", label=LABEL[protocol])
    for ax, label in [(left, "p50 latency (ms)"), (right, "avg checkpoint time (ms)")]:
        ax.set_xlabel("hot items (%)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
    left.legend(fontsize=8)
    fig.suptitle(f"Fig 12 (Bastion, {str(skew.get('query', '')).upper()}, p=2): skew")
    fig.tight_layout()
    path = out_dir / "checkmate-skew.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


# -- cyclic: Table IV -------------------------------------------------------------------


def cyclic_rows(figures: Figures) -> list[Row]:
    cyc = figures.get("cyclic", {})
    runs = cyc.get("runs", [])
    ps = sorted({r["parallelism"] for r in runs})
    setting = (f"reachability with a feedback edge: {cyc.get('links', 0):,} links streamed "
               f"at {cyc.get('rate', 0):,.0f}/s among {cyc.get('vertices', 0):,} vertices "
               f"(mean out-degree < 1, sparse as CheckMate's 1M vertices), "
               f"{cyc.get('roots', 0):,} roots, p = {'/'.join(map(str, ps))}, join[0] "
               f"killed mid-run; {len(runs)} runs")
    by: dict[tuple[int, str], list[dict]] = {}
    for r in runs:
        by.setdefault((r["parallelism"], r["protocol"]), []).append(r)
    complete = bool(ps) and all(
        by.get((p, x)) and all(r["restart_ms"] >= 0 for r in by[(p, x)])
        for p in ps for x in ("uncoordinated", "cic"))
    paper_ct = "; ".join(f"{w} workers: UNC {v['uncoordinated'][0]} ms, CIC {v['cic'][0]} ms"
                         for w, v in TABLE4.items())
    paper_rt = "; ".join(f"{w} workers: UNC {v['uncoordinated'][1]:.0f} ms, "
                         f"CIC {v['cic'][1]:.0f} ms" for w, v in TABLE4.items())
    paper_ic = "; ".join(f"{w} workers: UNC {v['uncoordinated'][2]:.1%}, "
                         f"CIC {v['cic'][2]:.1%}" for w, v in TABLE4.items())
    if not complete:
        why = page.not_measured("a run recorded no failure (the kill came after the end?)")
        return [Row(f"checkmate-table4-{k}", "Table IV", k, "", "", setting, "", None, why)
                for k in ("ct", "rt", "ic", "exact")]

    def med(p: int, x: str, key: str) -> float:
        return statistics.median(r[key] for r in by[(p, x)])

    def figure(key: str, unit: str, spec: str, scale: float = 1.0) -> str:
        return "; ".join(f"p={p}: UNC {med(p, 'uncoordinated', key) * scale:{spec}}{unit}, "
                         f"CIC {med(p, 'cic', key) * scale:{spec}}{unit}" for p in ps)

    pooled = {x: [r for p in ps for r in by[(p, x)]] for x in ("uncoordinated", "cic")}
    rows = []
    # CT, Table IV: "the uncoordinated protocol is faster than the communication-induced
    # protocol since the communication-induced protocol requires checkpointing
    # additional protocol-related information ... the difference ... is practically
    # insignificant."
    unc_ct = statistics.median(r["checkpoint_ms"] for r in pooled["uncoordinated"])
    cic_ct = statistics.median(r["checkpoint_ms"] for r in pooled["cic"])
    rows.append(Row(
        "checkmate-table4-ct", "Table IV", "average checkpoint time (CT), UNC vs CIC",
        "5 and 10 workers, 75–80% of MST", paper_ct, setting,
        figure("checkpoint_ms", " ms", ".1f") + " (medians)",
        cic_ct / unc_ct if unc_ct else None,
        # Checkpoint times of tens of ms moved by 2x between runs here: a factor of two
        # is the noise, and the paper's own gap was "practically insignificant".
        page.judge_claim(unc_ct <= cic_ct * 2.0,
                         "UNC checkpoints no slower than CIC, which also stores its clocks "
                         "(median over the runs, within the 2× a run moves)",
                         why_not=f"UNC {unc_ct:.2f} ms, CIC {cic_ct:.2f} ms")))
    # RT, Table IV: CIC/UNC 0.56x at 5 workers, 1.16x at 10 — "Neither protocol
    # outperforms the other when employed on top of cyclic queries in any meaningful
    # aspect".
    unc_rt = statistics.median(r["restart_ms"] for r in pooled["uncoordinated"])
    cic_rt = statistics.median(r["restart_ms"] for r in pooled["cic"])
    ratio = cic_rt / unc_rt if unc_rt > 0 else float("nan")
    rows.append(Row(
        "checkmate-table4-rt", "Table IV", "restart time (RT), CIC against UNC",
        "5 and 10 workers", paper_rt + " (CIC/UNC 0.56×, 1.16×)", setting,
        figure("restart_ms", " ms", ".0f") + " (medians)", ratio,
        page.judge_claim(0.5 <= ratio <= 2.0,
                         "neither protocol restarts meaningfully faster: the median CIC/UNC "
                         "within 0.5×–2× (the paper's 0.56×–1.16×)",
                         why_not=f"CIC/UNC {ratio:.2f}×")))
    # IC, Table IV: "both protocols unexpectedly share very similar percentages of
    # invalid checkpoints for both parallelisms" (1.4% against 1.6–1.7%) "... and the
    # uncoordinated protocol does not introduce a domino effect" — a recovery line
    # that rolls tasks back to their start.
    unc_ic = statistics.median(r["invalid_share"] for r in pooled["uncoordinated"])
    cic_ic = statistics.median(r["invalid_share"] for r in pooled["cic"])
    domino = [f"p={r['parallelism']} {LABEL[r['protocol']]} {r['line_tasks_from_start']} "
              f"of {r['tasks']} tasks" for r in runs if r.get("line_tasks_from_start", 0) > 0]
    similar = unc_ic <= max(2 * cic_ic, 0.02)
    rows.append(Row(
        "checkmate-table4-ic", "Table IV",
        "invalid checkpoints (IC): similar for UNC and CIC, no domino effect",
        "5 and 10 workers, one failure at 48 s of 60", paper_ic, setting
        + " (a short run: one failure's rollback is a larger share)",
        figure("invalid_share", "", ".1%") + " (medians); "
        + ("no task rolled back to its start" if not domino
           else "rolled back to the start: " + ", ".join(domino)),
        unc_ic / cic_ic if cic_ic > 0 else None,
        page.judge_claim(similar and not domino,
                         "UNC invalidates no more checkpoints than CIC (within 2×, or 2 "
                         "points) and no recovery line puts a task back to its start",
                         why_not=(f"UNC {unc_ic:.1%}, CIC {cic_ic:.1%}" if not similar
                                  else "") + ("; " if not similar and domino else "")
                         + ("domino: " + ", ".join(domino) if domino else ""))))
    wrong = [f"p={r['parallelism']} {LABEL[r['protocol']]}" for r in runs
             if not r["exactly_once"]]
    rows.append(Row(
        "checkmate-table4-exact", "Table IV", "the answer after the kill",
        "5 and 10 workers", "(exactly-once assumed)", setting,
        "every (root, vertex) once" if not wrong else "wrong: " + ", ".join(wrong), None,
        page.judge_claim(not wrong, "the recovered loop reports every reachable vertex "
                         "exactly once", why_not="wrong on " + ", ".join(wrong))))
    return rows


# -- the section ----------------------------------------------------------------------------

SECTION = Section(
    key="checkmate",
    title="CheckMate: checkpointing protocols for streaming dataflows",
    source=(f"`papers/{PAPER}` — G. Siachamis, K. Psarakis, M. Fragkoulis, "
            "A. van Deursen, P. Carbone, A. Katsifodimos, *CheckMate: Evaluating "
            "Checkpointing Protocols for Streaming Dataflows*, ICDE 2024"),
    intro=(
        "CheckMate runs NexMark Q1/Q3/Q8/Q12 and a cyclic reachability query under "
        "coordinated, uncoordinated and communication-induced checkpoints on 10–100 "
        "one-CPU workers, and reports throughput and message size against a "
        "checkpoint-free run, checkpoint counts, restart time, and the effect of skew. "
        "Here the same queries and protocols run at parallelism 2 on a 2-core machine "
        "(restart time on three simulated Ray nodes on 127.0.0.1), so the rows compare "
        "ratios measured within one run and the paper's orderings, never absolute rates."),
    experiments=[
        Experiment(
            key="protocols", title="Fig 7, Tables II–III: throughput, message size, "
            "invalid checkpoints", script="protocols.py",
            args=["--parts", "main", "--events", "250000", "--interval", "0.5",
                  "--repeat", "2", "--paced-seconds", "0"],
            quick_args=["--parts", "main", "--queries", "q3,q12", "--events", "60000",
                        "--interval", "0.1", "--paced-seconds", "0"],
            rows=protocols_rows, plot=protocols_plot, budget_s=120),
        Experiment(
            key="restart", title="Fig 11: restart time against parallelism (simulated nodes)",
            script="restart_parallelism.py",
            args=["--parallelism", "1", "2", "3", "--seconds", "4", "--repeat", "3"],
            quick_args=["--parallelism", "1", "2", "--seconds", "3", "--kill-at", "1.5"],
            rows=restart_rows, plot=restart_plot, budget_s=120),
        Experiment(
            key="skew", title="Fig 12: p50 latency and checkpoint time under skew",
            script="protocols.py",
            # 80% of MST, Fig. 12(b)'s load: at p=2 the hot instance of 30% hot items is
            # then past its capacity, as Fig. 12's stragglers were.
            args=["--parts", "skew-latency", "--skew-query", "q3", "--events", "100000",
                  "--interval", "0.5", "--skew-seconds", "3", "--skew-load", "0.8"],
            quick_args=["--parts", "skew-latency", "--skew-query", "q3", "--events", "40000",
                        "--interval", "0.25", "--skew-seconds", "1.5", "--hot", "0.1,0.3",
                        "--skew-load", "0.8"],
            rows=skew_rows, plot=skew_plot, budget_s=60),
        Experiment(
            key="cyclic", title="Table IV: the cyclic query", script="protocols.py",
            args=["--parts", "cyclic", "--cyclic-parallelism", "1,2", "--interval", "0.25",
                  "--repeat", "2"],
            quick_args=["--parts", "cyclic", "--cyclic-parallelism", "1", "--interval", "0.25",
                        "--cyclic-links", "4000", "--cyclic-kill-at", "1.5"],
            rows=cyclic_rows, budget_s=75),
    ],
)
