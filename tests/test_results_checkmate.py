"""The CheckMate section of the results page: each row's verdict can say "worse".

Every experiment's ``rows`` is fed the figures of a good run and of a deliberately
broken one, in the shape its script writes (`benchmarks/protocols.py --json`,
`benchmarks/restart_parallelism.py --json`); the broken run must not come out
reproduced. No benchmark runs here, and no Ray.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from bastion.bench.results import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from experiments import checkmate  # noqa: E402

GOOD, BAD = {Verdict.REPRODUCED, Verdict.BETTER}, {Verdict.WORSE, Verdict.NOT_MEASURED}


def verdicts(rows) -> dict[str, Verdict]:
    anchors = [r.anchor for r in rows]
    assert len(set(anchors)) == len(anchors)
    return {r.anchor: r.judgement.verdict for r in rows}


def protocol_figures(vs_none: dict[str, float], *, per_frame: float = 1.0007,
                     per_message: float = 1.45, invalid_share: float = 0.0,
                     coor_rounds: int = 4) -> dict:
    queries = {}
    for q in ("q1", "q3", "q8", "q12"):
        by = {}
        for protocol in ("none", "coordinated", "uncoordinated", "cic"):
            networked = q != "q1"   # Q1 chains into one task: no frames between tasks
            by[protocol] = {
                "tuples_per_s": 60_000 * vs_none.get(protocol, 1.0),
                "vs_none": vs_none.get(protocol, 1.0), "p50_ms": 0.0, "p99_ms": 0.0,
                "checkpoints": coor_rounds if protocol == "coordinated" else 12, "tasks": 3,
                "task_checkpoints": 3 * coor_rounds if protocol == "coordinated" else 12,
                "checkpoint_s_avg": 0.5, "invalid": 0,
                "invalid_share": invalid_share if protocol in ("uncoordinated", "cic") else 0,
                "msg_size_per_frame": per_frame if protocol == "cic" else 1.0001,
                "msg_size_per_message": per_message if protocol == "cic" else 1.0001,
                "frames_sent": 1000 if networked else 0, "records_sent": 50_000,
                "data_bytes": 5_000_000 if networked else 0}
        queries[q] = by
    return {"parallelism": 2, "events": 150_000, "interval_s": 0.5, "queries": queries}


def test_protocols_good_run_reproduces_or_betters_every_row():
    rows = checkmate.protocols_rows(protocol_figures(
        {"none": 1.0, "coordinated": 0.95, "uncoordinated": 0.93, "cic": 1.0}))
    v = verdicts(rows)
    assert v["checkmate-fig7-coordinated"] is Verdict.REPRODUCED
    assert v["checkmate-fig7-uncoordinated"] is Verdict.REPRODUCED
    assert v["checkmate-fig7-cic"] is Verdict.BETTER         # 1.0× against < 0.5×
    assert v["checkmate-table2-coordinated"] is Verdict.REPRODUCED
    assert v["checkmate-table2-cic-per-frame"] is Verdict.BETTER
    assert v["checkmate-table2-cic-per-message"] is Verdict.REPRODUCED   # 1.45 vs 1.79
    assert v["checkmate-table3-uncoordinated"] is Verdict.REPRODUCED
    assert v["checkmate-table3-counts"] is Verdict.REPRODUCED
    assert set(v.values()) <= GOOD


def test_protocols_broken_run_is_worse():
    rows = checkmate.protocols_rows(protocol_figures(
        {"none": 1.0, "coordinated": 0.4, "uncoordinated": 0.3, "cic": 0.2},
        per_frame=2.5, per_message=4.0, invalid_share=0.3, coor_rounds=40))
    v = verdicts(rows)
    for anchor in ("checkmate-fig7-coordinated", "checkmate-fig7-uncoordinated",
                   "checkmate-fig7-cic", "checkmate-fig7-q3",
                   "checkmate-table2-cic-per-frame", "checkmate-table2-cic-per-message",
                   "checkmate-table3-uncoordinated", "checkmate-table3-cic",
                   "checkmate-table3-counts"):
        assert v[anchor] is Verdict.WORSE, anchor


def test_checkpoint_counts_need_a_completed_coordinated_round():
    rows = checkmate.protocols_rows(protocol_figures({"none": 1.0}, coor_rounds=0))
    assert verdicts(rows)["checkmate-table3-counts"] is Verdict.NOT_MEASURED


def test_the_hot_instance_load_matches_the_papers_stragglers():
    # Fig. 12(a): 10 workers at 50% of MST, hot 10/20/30%
    loads = [checkmate.hot_instance_load(h, 10, 0.5) for h in (0.1, 0.2, 0.3)]
    assert loads == pytest.approx([0.95, 1.40, 1.85])
    assert checkmate.hot_instance_load(0.3, 2, 0.8) == pytest.approx(1.04)


def test_protocols_without_figures_is_not_measured():
    rows = checkmate.protocols_rows({"queries": {}})
    assert rows and all(r.judgement.verdict is Verdict.NOT_MEASURED for r in rows)


def restart_figures(coor: list[float], unc: list[float], cic: list[float]) -> dict:
    return {"query": "q12", "parallelism": [1, 2, 3], "nodes": 3, "rate": 4000.0,
            "interval_s": 0.5, "restart_s": {"coordinated": coor, "uncoordinated": unc,
                                             "cic": cic},
            "restarted_tasks": {x: [3, 6, 9] for x in ("coordinated", "uncoordinated", "cic")}}


def test_restart_rows():
    good = verdicts(checkmate.restart_rows(restart_figures(
        [0.2, 0.25, 0.3], [0.3, 0.5, 0.9], [0.3, 0.6, 1.0])))
    assert good["checkmate-fig11-coordinated-fastest"] is Verdict.REPRODUCED
    # the widening gap is shown, not judged: at p <= 3 it is within the noise
    assert good["checkmate-fig11-growth"] is Verdict.NOT_COMPARABLE
    broken = verdicts(checkmate.restart_rows(restart_figures(
        [0.9, 1.0, 1.2], [0.3, 0.3, 0.3], [0.3, 0.3, 0.3])))
    assert broken["checkmate-fig11-coordinated-fastest"] is Verdict.WORSE
    missing = verdicts(checkmate.restart_rows(restart_figures(
        [0.2, -1.0, 0.3], [0.3, 0.5, 0.9], [0.3, 0.6, 1.0])))
    assert set(missing.values()) == {Verdict.NOT_MEASURED}


def skew_figures(coor_p50: list[float], coor_ckpt: list[float]) -> dict:
    def entry(p50, ckpt):
        return {"mst_tuples_per_s": 40_000.0, "rate": 20_000.0, "p50_ms": p50,
                "checkpoint_ms": ckpt, "checkpoints": [4, 4, 4]}
    return {"skew": {"query": "q3", "hot": [0.1, 0.2, 0.3], "seconds": 3.0, "protocols": {
        "coordinated": entry(coor_p50, coor_ckpt),
        "uncoordinated": entry([30.0, 35.0, 40.0], [20.0, 22.0, 25.0]),
        "cic": entry([32.0, 36.0, 45.0], [25.0, 30.0, 35.0])}}}


def test_skew_rows():
    good = verdicts(checkmate.skew_rows(skew_figures([50.0, 500.0, 5000.0],
                                                     [100.0, 1000.0, 9000.0])))
    assert good["checkmate-fig12-p50"] is Verdict.REPRODUCED
    assert good["checkmate-fig12-checkpoint-time"] is Verdict.REPRODUCED
    assert set(good) == {"checkmate-fig12-p50", "checkmate-fig12-checkpoint-time"}
    broken = verdicts(checkmate.skew_rows(skew_figures([10.0, 10.0, 10.0], [5.0, 5.0, 5.0])))
    assert broken["checkmate-fig12-p50"] is Verdict.WORSE
    assert broken["checkmate-fig12-checkpoint-time"] is Verdict.WORSE
    assert verdicts(checkmate.skew_rows({}))["checkmate-fig12-p50"] is Verdict.NOT_MEASURED


def cyclic_figures(*, unc_rt: float = 300.0, cic_rt: float = 350.0, unc_ct: float = 2.0,
                   cic_ct: float = 3.0, share: float = 0.02, exact: bool = True,
                   from_start: int = 0) -> dict:
    runs = []
    for p in (1, 2):
        for protocol, ct, rt in (("uncoordinated", unc_ct, unc_rt), ("cic", cic_ct, cic_rt)):
            unc = protocol == "uncoordinated"
            runs.append({"parallelism": p, "protocol": protocol, "duration_s": 6.0,
                         "checkpoints": 100, "checkpoint_ms": ct, "restart_ms": rt,
                         "failures": 1, "tasks": 6 * p,
                         "invalid": int((share if unc else 0.02) * 100),
                         "invalid_share": share if unc else 0.02,
                         "line_tasks_from_start": from_start, "exactly_once": exact})
    return {"cyclic": {"links": 8000, "vertices": 16_000, "roots": 2000, "rate": 2000.0,
                       "runs": runs}}


def test_cyclic_rows():
    good = verdicts(checkmate.cyclic_rows(cyclic_figures()))
    assert set(good.values()) == {Verdict.REPRODUCED}
    broken = verdicts(checkmate.cyclic_rows(cyclic_figures(
        unc_rt=100.0, cic_rt=900.0, unc_ct=50.0, cic_ct=2.0, share=0.4, exact=False,
        from_start=5)))
    assert set(broken.values()) == {Verdict.WORSE}
    # a domino rollback alone, with similar shares, is enough to fail the IC row
    domino = verdicts(checkmate.cyclic_rows(cyclic_figures(from_start=5)))
    assert domino["checkmate-table4-ic"] is Verdict.WORSE
    no_kill = cyclic_figures()
    no_kill["cyclic"]["runs"][0]["restart_ms"] = -1.0
    assert set(verdicts(checkmate.cyclic_rows(no_kill)).values()) == {Verdict.NOT_MEASURED}


@pytest.mark.parametrize("exp", checkmate.SECTION.experiments, ids=lambda e: e.key)
def test_every_experiment_runs_a_script_of_benchmarks(exp):
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    assert (root / exp.script).exists()
    assert "--json" not in exp.args and "--json" not in exp.quick_args
    assert exp.budget_s > 0


def test_plots_draw_from_the_figures(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    paths = checkmate.protocols_plot(protocol_figures({"none": 1.0, "coordinated": 0.9}),
                                     tmp_path)
    paths += checkmate.restart_plot(restart_figures([0.2, 0.2, 0.3], [0.3, 0.4, 0.5],
                                                    [0.3, 0.4, 0.6]), tmp_path)
    paths += checkmate.skew_plot(skew_figures([50.0, 60.0, 70.0], [100.0, 110.0, 120.0]),
                                 tmp_path)
    assert all(p.exists() and p.name.startswith("checkmate-") for p in paths)
    # The section's figures are left untouched by the plots.
    figures = protocol_figures({"none": 1.0})
    before = copy.deepcopy(figures)
    checkmate.protocols_plot(figures, tmp_path)
    assert figures == before
