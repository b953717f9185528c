"""The peers section's verdicts (`benchmarks/experiments/peers.py`) can say "worse".

Each experiment's ``rows`` gets the figures of a good run and of a deliberately broken
one, in the shape ``benchmarks/peers.py --json`` and ``benchmarks/throughput.py --peers
--json`` write them; no benchmark runs here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bastion.bench.results import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from experiments import peers  # noqa: E402


def spark_figures() -> dict:
    return {
        "records": 10_000_000, "repeats": 3, "parallelism": 2, "keys": 100,
        "checkpoint_interval_s": 1.0, "window_records": 1_000_000, "recovery_rate": 100_000,
        "median": {"bastion_per_record": 3.0e6, "bastion_batch": 8.0e6,
                   "bastion_window_sum": 2.0e6, "bastion_per_record_p1": 1.5e6,
                   "spark_sql": 4.0e6, "spark_pandas_udf": 2.5e6,
                   "spark_python_udf": 1.0e6, "spark_window": 1.8e6},
        "bastion_latency_p2": {"parallelism": 2, "rate": 1.5e6, "p50_ms": 2.0, "p99_ms": 8.0},
        "bastion_latency_p1": {"parallelism": 1, "rate": 0.75e6, "p50_ms": 0.05,
                               "p99_ms": 3.0},
        "spark_latency": {"rate": 0.5e6, "p50_ms": 600.0, "p99_ms": 1200.0,
                          "max_ms": 1500.0, "batches": 12},
        "bastion_recovery": {"detection_s": 0.05, "running_again_s": 0.1,
                             "caught_up_s": 0.3, "rate_back_s": 0.3, "sink_records": 800_000},
        "spark_recovery": {"first_output_s": 12.0, "caught_up_s": 15.0, "state_exact": True,
                           "records_before_kill": 500_000, "caught_up_threshold_s": 0.6},
    }


def bytewax_figures() -> dict:
    def pair(ours: float, theirs: float) -> dict:
        return {"bastion": ours, "bytewax": theirs,
                "samples": {"bastion": [ours], "bytewax": [theirs]}}

    return {
        "records": 2_000_000, "repeats": 3, "keys": 100, "checkpoint_interval_s": 1.0,
        "recovery_rate": 100_000,
        "w0": pair(3.0e6, 1.0e6), "w1": pair(1.5e6, 0.5e6),
        "w1_recoverable": pair(1.2e6, 0.3e6),
        "bastion_recovery": {"detection_s": 0.05, "running_again_s": 0.1,
                             "caught_up_s": 0.2, "rate_back_s": 0.2, "sink_records": 800_000},
        "bytewax_recovery": {"first_output_s": 3.0, "caught_up_s": 4.0, "state_exact": True,
                             "records_before_kill": 500_000, "caught_up_threshold_s": 0.5},
    }


def verdicts(rows) -> dict[str, Verdict]:
    return {row.anchor: row.judgement.verdict for row in rows}


def test_spark_rows_of_a_good_run():
    got = verdicts(peers.spark_rows(spark_figures()))
    assert got == {
        "peers-spark-python-udf": Verdict.BETTER,     # 3.0x >= 1.0
        "peers-spark-pandas-udf": Verdict.BETTER,     # 3.2x >= 1.5
        "peers-spark-sql": Verdict.BETTER,            # 2.0x >= 1.0
        "peers-spark-window-sum": Verdict.REPRODUCED,  # 1.11x within ±50%
        "peers-spark-latency-p50-p2": Verdict.BETTER,  # 300x
        "peers-spark-latency-p99-p2": Verdict.BETTER,  # 150x
        "peers-spark-latency-p50-p1": Verdict.BETTER,
        "peers-spark-latency-p99-p1": Verdict.BETTER,  # 400x
        "peers-spark-recovery": Verdict.BETTER,
    }


def test_spark_rows_of_a_broken_run_say_worse():
    figures = spark_figures()
    figures["median"].update(bastion_per_record=0.5e6, bastion_batch=3.0e6,
                             bastion_window_sum=0.5e6)
    figures["bastion_latency_p2"].update(p50_ms=20.0, p99_ms=900.0)
    figures["bastion_recovery"]["caught_up_s"] = 40.0
    rows = {row.anchor: row for row in peers.spark_rows(figures)}
    got = {anchor: row.judgement.verdict for anchor, row in rows.items()}
    assert got["peers-spark-python-udf"] is Verdict.WORSE          # 0.5x: behind Spark
    assert got["peers-spark-pandas-udf"] is Verdict.WORSE          # 1.2x < 1.5
    assert got["peers-spark-sql"] is Verdict.WORSE                 # 0.75x < 1.0
    assert got["peers-spark-window-sum"] is Verdict.WORSE
    assert got["peers-spark-latency-p50-p2"] is Verdict.WORSE      # 30x < 100x
    assert got["peers-spark-latency-p99-p2"] is Verdict.WORSE
    assert "missed" in rows["peers-spark-latency-p50-p2"].judgement.reason
    assert got["peers-spark-recovery"] is Verdict.WORSE


def test_spark_rows_without_figures_are_not_measured():
    figures = spark_figures()
    del figures["spark_latency"]
    figures["bastion_recovery"]["caught_up_s"] = None   # never caught up
    got = verdicts(peers.spark_rows(figures))
    assert got["peers-spark-latency-p50-p2"] is Verdict.NOT_MEASURED
    assert got["peers-spark-recovery"] is Verdict.NOT_MEASURED


def test_a_peer_whose_state_is_not_exact_is_not_compared():
    figures = spark_figures()
    figures["spark_recovery"]["state_exact"] = False
    row = {r.anchor: r for r in peers.spark_rows(figures)}["peers-spark-recovery"]
    assert row.judgement.verdict is Verdict.NOT_COMPARABLE


def test_bytewax_rows_of_a_good_and_a_broken_run():
    assert set(verdicts(peers.bytewax_rows(bytewax_figures())).values()) == {Verdict.BETTER}
    figures = bytewax_figures()
    figures["w0"]["bastion"] = 0.5e6
    figures["w1"]["bastion"] = 0.45e6                       # 0.9x: within the band
    figures["w1_recoverable"]["bastion"] = 0.1e6
    figures["bastion_recovery"]["caught_up_s"] = 10.0
    got = verdicts(peers.bytewax_rows(figures))
    assert got == {"peers-bytewax-w0": Verdict.WORSE,
                   "peers-bytewax-w1": Verdict.REPRODUCED,
                   "peers-bytewax-w1-recoverable": Verdict.WORSE,
                   "peers-bytewax-recovery": Verdict.WORSE}


@pytest.mark.parametrize("rows,figures", [(peers.spark_rows, spark_figures),
                                          (peers.bytewax_rows, bytewax_figures)])
def test_every_row_states_both_guarantees(rows, figures):
    for row in rows(figures()):
        for setting in (row.reference_setting, row.bastion_setting):
            assert any(word in setting for word in ("exactly-once", "none")), setting


def test_the_section_names_its_experiments():
    assert peers.SECTION.key == "peers" and peers.SECTION.reference == "peer"
    assert [e.key for e in peers.SECTION.experiments] == ["spark", "bytewax"]


def test_latency_counts_records_not_output_with_their_age_then():
    import peers as peers_benchmark   # benchmarks/peers.py: the figures, no Spark run

    # 100 records/s from t0 = 0; measured: records that arrived in [0.5 s, 1.5 s]
    done = peers_benchmark.latency_percentiles_ms(
        [(0, 99, 10.0), (100, 199, 11.0)], 0.0, 100.0, 0.5, 1.5, stopped_s=20.0)
    assert done["unfinished"] == 0 and 9400 < done["p50"] < 9600
    cut = peers_benchmark.latency_percentiles_ms(
        [(0, 99, 10.0)], 0.0, 100.0, 0.5, 1.5, stopped_s=20.0)
    assert cut["unfinished"] == 51 and cut["max"] == pytest.approx(19_000.0)  # record 100, at 1 s


def test_bastions_latency_leaves_out_the_same_warm_up_as_sparks():
    import types

    import peers as peers_benchmark
    from bastion.runtime.metrics import LatencyHistogram

    def second(latency_s: float, records: int) -> LatencyHistogram:
        histogram = LatencyHistogram()
        histogram.add(latency_s, records)
        return histogram

    # a start-up backlog of 0.5-s latencies in the first two seconds, then 2 ms
    windows = {100: second(0.5, 5000), 101: second(0.5, 5000),
               **{s: second(0.002, 1000) for s in range(102, 110)}}
    run = types.SimpleNamespace(latency_windows=windows, duration_s=10.0)
    steady = peers_benchmark.steady_latency_ms(run, 3.0, 5.0)
    assert 1.8 < steady["p50"] < 2.2 and 1.8 < steady["p99"] < 2.2
    # without the warm-up the backlog is the tail (and the median): it would be counted
    whole = peers_benchmark.steady_latency_ms(run, 0.0, 10.0)
    assert 450 < whole["p99"] < 550 and 450 < whole["p50"] < 550
    with pytest.raises(RuntimeError, match="no output between 3 and 5 s"):
        peers_benchmark.steady_latency_ms(types.SimpleNamespace(
            latency_windows={100: second(0.5, 10)}, duration_s=1.0), 3.0, 2.0)


def test_a_spark_latency_that_is_a_lower_bound_says_so():
    figures = spark_figures()
    figures["spark_latency"]["unfinished_records"] = 1000
    row = {r.anchor: r for r in peers.spark_rows(figures)}["peers-spark-latency-p50-p2"]
    assert "lower bound" in row.reference_figure


def test_the_latency_plot_is_drawn(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    paths = peers.spark_plot(spark_figures(), tmp_path)
    assert [p.name for p in paths] == ["peers-spark-latency.png"] and paths[0].stat().st_size
