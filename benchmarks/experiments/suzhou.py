"""Su & Zhou (progressive recovery of correlated failures) on the results page.

The paper recovers a *correlated* failure — many nodes lost at once — while the
replacement nodes arrive one by one (its Fig 3: attaching a node takes 2 to 6
minutes). Blocking, operator-centric recovery (*OPC*) waits for every replacement
before it restarts anything; progressive, query-centric recovery (*PRG*) restarts
whole queries as capacity arrives, the most valuable per slot first (§5, "profit
density"); the *BestCase* gets every replacement at once. Its headline, §6 Fig 5,
plots after the failure (a) the average relative latency of the recovered queries
and (b) the number of available queries — a query is *available* when its relative
latency, averaged over an interval Δ_T, is under Θ = 1.2 — for the three.

One experiment, one run of ``benchmarks/recovery.py --fig5``: section (1)'s
correlated scenario (`bastion.bench.correlated`, ``all_hit``) on simulated 3-node
Ray clusters on 127.0.0.1 — three queries of priority 3/2/1 over one bid stream at
1,000 bids/s, two of the three nodes lost 0.2 s apart (8 of the 12 tasks, every
query hit), replacement capacity arriving as a 4-CPU node 1 s after the failure
and 2-CPU nodes 3 s apart after it (blocking and progressive), or as one 8-CPU node
at once (the best case). Its figures (per strategy: the two curves since the
failure's detection, and the summary figures the rows judge) are what the rows
read; the plot draws Fig 5's two panels from them.

Every constant typed from the paper cites §6 and the sentence it comes from; Fig 5
itself carries no numbers in the text but the one the text states (OPC "nearly 50%
higher" than the best case when the recovery starts), so the other rows judge the
shapes the text describes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bastion.bench import results as page
from bastion.bench.results import Experiment, Figures, Row, Section

PAPER = "002_07b0794f3a97f62e.txt"

# -- the paper's figures ------------------------------------------------------------

# §6: "Within a time interval Δ_T, if the average RL_i of Q_i is smaller than Θ, e.g.,
# Θ = 1.2 in this set of experiments, Q_i is considered as an Available Query".
THRESHOLD = 1.2
# §6, on Fig 5: "The relative latency of OPC is nearly 50% higher than that of
# BestCase at the beginning of the recovery".
OPC_OVER_BEST_AT_START = 1.5
# §6: "The cluster initially consists of 10 nodes, and we manually kill the 8 nodes
# where the sink operators of the 15 queries are deployed ... and then 8 new nodes are
# acquired"; "The Source operator emits tweets in the rate of 1000 tuples per second";
# "BestCase denotes the case where all the new nodes become available simultaneously
# after 3 minutes"; §6 on Fig 3: "The time to attach a new node varies from 2 minutes
# to 6 minute".
PAPER_SETTING = ("Storm-based DSPE, 10 nodes, 8 killed at once, 8 new nodes attached "
                 "2–6 min apart (BestCase: all after 3 min); 15 queries over 1,000 "
                 "tweets/s, parallelism 5")
# The sentences each row checks (§6, on Fig 5).
CLAIM_BETWEEN = ("The relative recovery latency and the number of available queries with "
                 "progressive recovery are between those of BestCase and OPC")
CLAIM_OPC_SLOWER = ("it also takes more time for the average relative latency of OPC to "
                    "return to the stable level than BestCase")
# §1: progressive recovery is scheduled "to recover the outputs of queries as early as
# possible"; §5: the recovery plan maximises "the sum of the priorities of the
# recovered queries" — the highest-priority query is the first to come back.
CLAIM_PRIORITY = ("recover the outputs of queries as early as possible ... the sum of the "
                  "priorities of the recovered queries is maximized")

# -- noise bands (runs of 10,000-24,000 bids on the shared 2-core machine at load
# 2-12, Nov 2026) --------------------------------------------------------------------

# Available query-seconds: the best case restarts all 8 tasks on one node at once, which
# on a 2-core machine can take seconds, while progressive's first restart is 2 tasks; so
# the best case's first query came back anywhere from 2.9 to 6.5 s after the detection,
# once after progressive's top query (16,000 bids: 21.4 against 19.9 query-seconds),
# otherwise well ahead (24,000 bids: 56.2 against 46.6). The best case counts as
# ahead of progressive within this band; progressive must lead blocking by more than
# it (it did by 1.75-2.2x where blocking came back within the window at all).
AREA_NOISE = 0.15
# When every query is available again: progressive's last query waits for the same last
# node as blocking does, so the two can be within a second of each other (16,000 bids:
# 10.6 against 11.1 s; 24,000: 9.5 against 13.1 s). One Δ_T — the interval the
# availability is averaged over — is the tolerance.
ORDER_TOLERANCE_S = 1.0
# The relative latency at the recovery's start (the peak of the average, a 1-s mean of
# 100-ms points): the best case's peak moved 50-97 between runs, OPC's 223-273, and OPC
# over the best case came out 2.3-5.4x; OPC must lie above the best case beyond this
# band. The magnitude is shown against the paper's 1.5x but not judged (see _start_row).
PEAK_NOISE = 0.2

STRATEGIES = {"best": "BestCase", "progressive": "PRG", "blocking": "OPC"}


_NEVER = float("inf")


def _summary(figures: Figures, key: str, *more: str,
             strategies: tuple[str, ...] = tuple(STRATEGIES)) -> dict[str, float] | None:
    """``key`` (then ``more``) of each strategy's summary, or None when any strategy's
    summary lacks it (the run wrote nothing). A time written as null is a query that
    never got there within the run: infinitely late, which still orders."""
    found = {}
    for s in strategies:
        node = page.lookup(figures, "strategies", s, "summary", key, *more[:-1])
        last = more[-1] if more else None
        if last is not None:
            if not isinstance(node, dict) or last not in node:
                return None
            value = node[last]
        else:
            summary = page.lookup(figures, "strategies", s, "summary")
            if not isinstance(summary, dict) or key not in summary:
                return None
            value = summary[key]
        found[s] = _NEVER if value is None else float(value)
    return found


def _secs(value: float) -> str:
    return "never" if value == _NEVER else f"{value:.1f} s"


def _setting(figures: Figures) -> str:
    records = page.lookup(figures, "records") or 0
    repeats = page.lookup(figures, "repeats") or 0
    return (f"simulated 3-node Ray on 127.0.0.1 (2 cores), 2 of 3 nodes lost (8 of 12 "
            f"tasks), a 4-CPU node 1 s after, 2-CPU nodes every "
            f"{page.lookup(figures, 'arrival_gap_s') or '?'} s (best case: 8 CPUs at once); 3 "
            f"queries (priority 3/2/1), {records:,} bids at 1,000/s; median of {repeats} "
            f"run(s) each")


def _missing(anchor: str, experiment: str, reference_figure: str, what: str) -> Row:
    return Row(anchor=anchor, ref="Fig 5", experiment=experiment,
               reference_setting=PAPER_SETTING, reference_figure=reference_figure,
               bastion_setting="–", bastion_figure="–", ratio=None,
               judgement=page.not_measured(f"the run wrote no {what}"))


def _area_row(figures: Figures) -> Row:
    anchor = "suzhou-fig5b-available-queries"
    what = "available query-seconds over the recovery window"
    ref_figure = "BestCase ≥ PRG > OPC"
    area = _summary(figures, "available_query_s")
    window_s = page.lookup(figures, "window_s")
    queries = page.lookup(figures, "queries") or 3
    if area is None or window_s is None or _NEVER in area.values():
        return _missing(anchor, what, ref_figure, "available query-seconds of every strategy")
    best, prg, opc = (float(area[s]) for s in STRATEGIES)
    holds = best >= prg / (1 + AREA_NOISE) and prg > opc * (1 + AREA_NOISE)
    figure = (f"BestCase {best:.1f}, PRG {prg:.1f}, OPC {opc:.1f} of {queries * window_s:.1f} "
              f"query-seconds (the first {window_s:.1f} s after the detection)")
    return Row(
        anchor=anchor, ref="Fig 5(b)", experiment=what, reference_setting=PAPER_SETTING,
        reference_figure=ref_figure, bastion_setting=_setting(figures),
        bastion_figure=figure, ratio=prg / opc if opc > 0 else None,
        judgement=page.judge_claim(
            holds, f"{CLAIM_BETWEEN} (best ≥ PRG within ±{AREA_NOISE:.0%}, PRG > OPC beyond "
            "it)", why_not=figure))


def _start_row(figures: Figures) -> Row:
    anchor = "suzhou-fig5a-latency-at-start"
    what = "relative latency at the recovery's start, OPC against BestCase"
    ref_figure = f"OPC ≈ {OPC_OVER_BEST_AT_START:g}× BestCase (\"nearly 50% higher\")"
    peak = _summary(figures, "relative_latency_at_start")
    if peak is None or _NEVER in peak.values():
        return _missing(anchor, what, ref_figure, "relative latency at the recovery's start")
    best, prg, opc = (float(peak[s]) for s in STRATEGIES)
    ratio = opc / best if best > 0 else float("inf")
    figure = (f"OPC {opc:.1f}, PRG {prg:.1f}, BestCase {best:.1f} (the peak of the 1-s "
              f"average): OPC {ratio:.2f}× BestCase")
    # The claim is the shape, OPC above the best case; the paper's 1.5x comes from a
    # 3-minute outage, ours from seconds on a 2-core machine, where a backlog's
    # latency grows with the wait over the catch-up rate: the ratio column shows how
    # far the magnitude lies from the paper's, which the verdict does not judge.
    return Row(
        anchor=anchor, ref="Fig 5(a)", experiment=what, reference_setting=PAPER_SETTING,
        reference_figure=ref_figure,
        bastion_setting=_setting(figures) + "; relative latency averaged over 1 s per query, "
        "then over the queries with output",
        bastion_figure=figure,
        ratio=ratio / OPC_OVER_BEST_AT_START if best > 0 else None,
        judgement=page.judge_claim(
            ratio > 1 + PEAK_NOISE,
            f"OPC's relative latency at the beginning of the recovery is above BestCase's "
            f"(beyond ±{PEAK_NOISE:.0%})", why_not=f"{ratio:.2f}×"))


def _order_rows(figures: Figures) -> list[Row]:
    rows = []
    anchor = "suzhou-fig5-back-under-threshold"
    what = f"time until every query's relative latency is back under {THRESHOLD:g}"
    ref_figure = "BestCase ≤ PRG ≤ OPC"
    back = _summary(figures, "all_available_s")
    if back is None:
        rows.append(_missing(anchor, what, ref_figure,
                             "time to every query's availability for every strategy"))
    else:
        best, prg, opc = (back[s] for s in STRATEGIES)
        tol = ORDER_TOLERANCE_S
        figure = (f"BestCase {_secs(best)}, PRG {_secs(prg)}, OPC {_secs(opc)} after the "
                  "detection")
        rows.append(Row(
            anchor=anchor, ref="Fig 5", experiment=what, reference_setting=PAPER_SETTING,
            reference_figure=ref_figure,
            bastion_setting=_setting(figures) + f"; a query is available at the first "
            f"100-ms point after the restart with all its tasks running and relative "
            f"latency < {THRESHOLD:g}",
            bastion_figure=figure,
            ratio=prg / opc if 0 < opc < _NEVER and prg < _NEVER else None,
            judgement=page.judge_claim(
                # PRG must get there within the run: "never" on both is no order
                prg < _NEVER and best <= prg + tol and prg <= opc + tol,
                f"{CLAIM_OPC_SLOWER}, PRG in between (within {tol:g} s, one Δ_T)",
                why_not=figure)))
    anchor = "suzhou-fig5-top-priority-first"
    what = "the highest-priority query available again, PRG against OPC"
    ref_figure = "PRG earlier than OPC"
    top = page.lookup(figures, "priorities")
    name = max(top, key=lambda n: top[n]) if isinstance(top, dict) and top else None
    again = (None if name is None else
             _summary(figures, "available_again_s", name,
                      strategies=("progressive", "blocking")))
    if name is None or again is None:
        rows.append(_missing(anchor, what, ref_figure,
                             "availability of the highest-priority query under PRG and OPC"))
    else:
        prg, opc = again["progressive"], again["blocking"]
        figure = f"{name} (priority {top[name]:g}): PRG {_secs(prg)}, OPC {_secs(opc)}"
        rows.append(Row(
            anchor=anchor, ref="§5, Fig 5(b)", experiment=what,
            reference_setting=PAPER_SETTING + "; queries with priorities",
            reference_figure=ref_figure, bastion_setting=_setting(figures),
            bastion_figure=figure,
            ratio=prg / opc if 0 < opc < _NEVER and prg < _NEVER else None,
            judgement=page.judge_claim(prg < opc, CLAIM_PRIORITY, why_not=figure)))
    return rows


def _exact_row(figures: Figures) -> Row:
    anchor = "suzhou-exactly-once"
    what = "every recovery exactly once"
    ref_figure = "– (the paper states no output check)"
    runs = [(s, r) for s in STRATEGIES
            for r in (page.lookup(figures, "strategies", s, "runs") or [])]
    if not runs or any(page.lookup(figures, "strategies", s, "runs") is None for s in STRATEGIES):
        return _missing(anchor, what, ref_figure, "drill verdicts for every strategy")
    bad = [f"{STRATEGIES[s]}: {r.get('verdict', '?')} (lost {r.get('lost', '?')}, duplicated "
           f"{r.get('duplicated', '?')}, corrupted {r.get('corrupted', '?')})"
           for s, r in runs if r.get("exactly_once") is not True]
    return Row(
        anchor=anchor, ref="Fig 5", experiment=what, reference_setting=PAPER_SETTING,
        reference_figure=ref_figure,
        bastion_setting=_setting(figures) + "; each run a drill, its output compared "
        "with a failure-free run's by lineage id",
        bastion_figure=f"{len(runs) - len(bad)} of {len(runs)} drills exactly once",
        ratio=None,
        judgement=page.judge_claim(not bad, "every drill's output is exactly once: 0 lost, "
                                   "0 duplicated, 0 corrupted", why_not="; ".join(bad)))


def fig5_rows(figures: Figures) -> list[Row]:
    return [_area_row(figures), _start_row(figures), *_order_rows(figures),
            _exact_row(figures)]


def fig5_plot(figures: Figures, out_dir: Path) -> list[Path]:
    """Fig 5's two panels, one line per strategy (each strategy's first run)."""
    import matplotlib.pyplot as plt

    shown = {s: page.lookup(figures, "strategies", s, "runs") for s in STRATEGIES}
    shown = {s: runs[0]["series"] for s, runs in shown.items()
             if isinstance(runs, list) and runs and runs[0].get("series")}
    if not shown:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.5), dpi=100)
    for strategy, series in shown.items():
        label = STRATEGIES[strategy]
        xs = [p[0] for p in series if p[1] is not None]
        left.plot(xs, [p[1] for p in series if p[1] is not None], lw=1.2, label=label)
        right.step([p[0] for p in series], [p[2] for p in series], where="post", lw=1.2,
                   label=label)
    left.axhline(THRESHOLD, color="grey", ls=":", lw=1, label=f"Θ = {THRESHOLD:g}")
    left.set_yscale("log")
    left.set_xlabel("seconds since the failure's detection", fontsize=8)
    left.set_ylabel("average relative latency", fontsize=8)
    left.set_title("Fig 5(a): relative latency (Bastion)", fontsize=9)
    right.set_xlabel("seconds since the failure's detection", fontsize=8)
    right.set_ylabel("available queries", fontsize=8)
    right.set_yticks(range(int(page.lookup(figures, "queries") or 3) + 1))
    right.set_title("Fig 5(b): available queries (Bastion)", fontsize=9)
    for ax in (left, right):
        ax.legend(fontsize=7)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    path = out_dir / "suzhou-fig5.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


SECTION = Section(
    key="suzhou",
    title="Progressive recovery of correlated failures (Su & Zhou)",
    source=f"`{PAPER}` — L. Su, Y. Zhou, *Progressive Recovery of Correlated Failures in "
           "Distributed Stream Processing Engines*",
    intro=(
        "The paper kills 8 of 10 nodes of a Storm-based engine and attaches 8 new ones "
        "minutes apart, then plots the average relative latency of the recovered queries "
        "and the number of available queries (relative latency under 1.2) over time for "
        "progressive, query-centric recovery (PRG), blocking, operator-centric recovery "
        "(OPC) and the best case, all new nodes at once (Fig 5). Here the same three run "
        "as drills on a simulated 3-node Ray cluster on one 2-core VM: two nodes lost, "
        "capacity arriving seconds apart instead of minutes, three queries of distinct "
        "priority instead of 15. The rows judge the shapes §6 describes and, where the "
        "text gives a number, show how far the magnitude lies from it."),
    experiments=[
        Experiment(
            key="fig5",
            title="Fig 5: relative latency and available queries after a correlated failure",
            script="recovery.py",
            args=["--fig5", "--records", "24000"],
            # the runs cost ~15-25 s each besides their bids (a simulated cluster
            # to start and stop, the drill's comparison), and at 14,000 bids
            # blocking's queries were not back under 1.2 before the run ended: the
            # quick pass keeps enough bids for every row to mean something
            quick_args=["--fig5", "--records", "18000"],
            # full: 152 s measured at load 12 (Nov 2026)
            rows=fig5_rows, plot=fig5_plot, budget_s=180),
    ],
)
