"""The Su & Zhou section of the results page (`benchmarks/experiments/suzhou.py`): its
verdicts can say "worse".

The rows are fed the figures of a good run, in the shape ``benchmarks/recovery.py
--fig5 --json`` writes them, and deliberately broken ones: progressive recovery slower
than blocking, a blocking recovery no worse than the best case, a drill that lost a
record, and runs that wrote nothing. No benchmark runs here.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from bastion.bench.results import Verdict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from experiments import suzhou  # noqa: E402


def _run(series: list, again: dict, peak: float, exact: bool = True) -> dict:
    return {"verdict": "exactly-once" if exact else "lost records", "exactly_once": exact,
            "lost": 0 if exact else 3, "duplicated": 0, "corrupted": 0, "restart_s": 0.3,
            "recovery_start_s": 7.0, "relative_latency_at_start": peak,
            "all_available_s": max(again.values()),
            "queries": {name: {"priority": p, "available_again_s": again[name]}
                        for name, p in (("alerts", 3.0), ("per_auction", 2.0),
                                        ("per_bidder", 1.0))},
            "series": series}


def _series(times: dict, peak_at: float, peak: float) -> list:
    """A 100-ms series over 14 s: relative latency ~1 but for a decaying peak, and
    the queries counted from the time each became available."""
    points = []
    for i in range(141):
        t = i / 10
        rel = peak / (1 + 10 * (t - peak_at)) if peak_at <= t < peak_at + 1 else 1.0
        points.append([t, round(rel, 3), sum(t >= s for s in times.values())])
    return points


def _strategy(again: dict, peak_at: float, peak: float, exact: bool = True) -> dict:
    run = _run(_series(again, peak_at, peak), again, peak, exact)
    run["available_query_s"] = round(sum(14 - s for s in again.values()), 3)
    return {"summary": {"available_query_s": run["available_query_s"],
                        "relative_latency_at_start": peak,
                        "all_available_s": run["all_available_s"],
                        "recovery_start_s": peak_at,
                        "available_again_s": dict(again), "exactly_once": exact},
            "runs": [run]}


def good_figures() -> dict:
    """What a good 16,000-bid run looked like (Nov 2026)."""
    return {
        "scenario": "all_hit", "records": 16_000, "rate": 1000.0, "repeats": 1,
        "failure_at_s": 2.0, "arrival_gap_s": 3.0, "node_cpus": 4, "delta_t_s": 1.0,
        "threshold": 1.2, "priorities": {"alerts": 3, "per_auction": 2, "per_bidder": 1},
        "queries": 3, "window_s": 14.0,
        "strategies": {
            "best": _strategy({"alerts": 6.5, "per_auction": 7.1, "per_bidder": 7.0},
                              6.5, 96.6),
            "progressive": _strategy({"alerts": 3.7, "per_auction": 7.9,
                                      "per_bidder": 10.6}, 7.3, 99.5),
            "blocking": _strategy({"alerts": 10.8, "per_auction": 11.1,
                                   "per_bidder": 11.1}, 10.6, 223.3)}}


def _verdicts(figures: dict) -> dict[str, Verdict]:
    return {row.anchor: row.judgement.verdict for row in suzhou.fig5_rows(figures)}


ROWS = ["suzhou-fig5b-available-queries", "suzhou-fig5a-latency-at-start",
        "suzhou-fig5-back-under-threshold", "suzhou-fig5-top-priority-first",
        "suzhou-exactly-once"]


def test_a_good_run_reproduces_every_row():
    verdicts = _verdicts(good_figures())
    assert list(verdicts) == ROWS
    assert set(verdicts.values()) == {Verdict.REPRODUCED}


def test_progressive_slower_than_blocking_is_worse():
    figures = good_figures()
    # progressive's queries come back after blocking's, the top one too
    figures["strategies"]["progressive"] = _strategy(
        {"alerts": 12.0, "per_auction": 12.5, "per_bidder": 13.0}, 11.5, 150.0)
    verdicts = _verdicts(figures)
    assert verdicts["suzhou-fig5b-available-queries"] == Verdict.WORSE
    assert verdicts["suzhou-fig5-back-under-threshold"] == Verdict.WORSE
    assert verdicts["suzhou-fig5-top-priority-first"] == Verdict.WORSE
    assert verdicts["suzhou-exactly-once"] == Verdict.REPRODUCED


def test_progressive_ahead_of_the_best_case_beyond_the_noise_is_worse():
    # the best case is the bound: progressive far ahead of it means a broken best case
    figures = good_figures()
    figures["strategies"]["best"] = _strategy(
        {"alerts": 12.0, "per_auction": 12.5, "per_bidder": 12.5}, 11.0, 150.0)
    verdicts = _verdicts(figures)
    assert verdicts["suzhou-fig5b-available-queries"] == Verdict.WORSE
    assert verdicts["suzhou-fig5-back-under-threshold"] == Verdict.WORSE


def test_a_top_query_no_earlier_under_progressive_is_worse():
    figures = good_figures()
    summary = figures["strategies"]["progressive"]["summary"]
    summary["available_again_s"]["alerts"] = 10.8  # as late as under blocking
    assert _verdicts(figures)["suzhou-fig5-top-priority-first"] == Verdict.WORSE


def test_blocking_no_higher_than_the_best_case_at_the_start_is_worse():
    figures = good_figures()
    figures["strategies"]["blocking"]["summary"]["relative_latency_at_start"] = 100.0
    rows = {r.anchor: r for r in suzhou.fig5_rows(figures)}
    row = rows["suzhou-fig5a-latency-at-start"]
    assert row.judgement.verdict == Verdict.WORSE
    assert row.ratio == pytest.approx(100.0 / 96.6 / suzhou.OPC_OVER_BEST_AT_START)


def test_a_drill_that_was_not_exact_fails_the_row():
    figures = good_figures()
    figures["strategies"]["progressive"]["runs"].append(
        copy.deepcopy(figures["strategies"]["progressive"]["runs"][0]))
    figures["strategies"]["progressive"]["runs"][1].update(
        verdict="lost records", exactly_once=False, lost=3)
    rows = {r.anchor: r for r in suzhou.fig5_rows(figures)}
    row = rows["suzhou-exactly-once"]
    assert row.judgement.verdict == Verdict.WORSE
    assert "lost 3" in row.judgement.reason
    assert row.bastion_figure == "3 of 4 drills exactly once"


def test_a_query_never_available_under_blocking_is_later_than_any_time():
    # null: the run ended before the query was back, which still orders the strategies
    figures = good_figures()
    figures["strategies"]["blocking"]["summary"]["all_available_s"] = None
    figures["strategies"]["blocking"]["summary"]["available_again_s"]["alerts"] = None
    rows = {r.anchor: r for r in suzhou.fig5_rows(figures)}
    assert rows["suzhou-fig5-back-under-threshold"].judgement.verdict == Verdict.REPRODUCED
    assert "OPC never" in rows["suzhou-fig5-back-under-threshold"].bastion_figure
    assert rows["suzhou-fig5-top-priority-first"].judgement.verdict == Verdict.REPRODUCED


def test_a_query_never_available_under_progressive_is_worse():
    figures = good_figures()
    for strategy in ("progressive", "blocking"):  # never under either: no order at all
        summary = figures["strategies"][strategy]["summary"]
        summary["all_available_s"] = None
        summary["available_again_s"]["alerts"] = None
    verdicts = _verdicts(figures)
    assert verdicts["suzhou-fig5-back-under-threshold"] == Verdict.WORSE
    assert verdicts["suzhou-fig5-top-priority-first"] == Verdict.WORSE


def test_a_summary_key_the_run_did_not_write_is_not_measured():
    figures = good_figures()
    del figures["strategies"]["blocking"]["summary"]["all_available_s"]
    del figures["strategies"]["blocking"]["summary"]["available_again_s"]["alerts"]
    figures["strategies"]["best"]["summary"]["relative_latency_at_start"] = None
    verdicts = _verdicts(figures)
    assert verdicts["suzhou-fig5-back-under-threshold"] == Verdict.NOT_MEASURED
    assert verdicts["suzhou-fig5-top-priority-first"] == Verdict.NOT_MEASURED
    assert verdicts["suzhou-fig5a-latency-at-start"] == Verdict.NOT_MEASURED


@pytest.mark.parametrize("broken", ["empty", "no_blocking", "no_runs"])
def test_missing_figures_are_not_measured(broken):
    figures = good_figures()
    if broken == "empty":
        figures = {}
    elif broken == "no_blocking":
        del figures["strategies"]["blocking"]
    else:
        for strategy in figures["strategies"].values():
            del strategy["runs"]
    verdicts = _verdicts(figures)
    assert list(verdicts) == ROWS
    if broken == "no_runs":  # the summaries are there, the drills' verdicts are not
        assert verdicts["suzhou-exactly-once"] == Verdict.NOT_MEASURED
        assert verdicts["suzhou-fig5b-available-queries"] == Verdict.REPRODUCED
    else:
        assert set(verdicts.values()) == {Verdict.NOT_MEASURED}


def test_the_plot_draws_fig5s_two_panels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    [path] = suzhou.fig5_plot(good_figures(), tmp_path)
    assert path.name == "suzhou-fig5.png" and path.stat().st_size > 10_000
    assert suzhou.fig5_plot({}, tmp_path) == []


def test_the_section_is_the_one_reproduce_py_names():
    assert suzhou.SECTION.key == "suzhou"
    [exp] = suzhou.SECTION.experiments
    assert exp.script == "recovery.py" and "--fig5" in exp.args
    assert exp.budget_s <= 180
