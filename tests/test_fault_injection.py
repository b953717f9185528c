"""Faults beyond kills, carried out in real runs (`bastion.runtime.faults`): stalls slow
an instance and lose nothing, link outages delay and lose nothing, lost frames are
caught by the drill verdict record for record, a crash's replacement waits out its
repair, and `bastion run/drill --faults FILE` reads them from YAML."""

from __future__ import annotations

import re

import pytest

import bastion as bn
from bastion.cli import EXIT_OK, EXIT_USAGE, EXIT_VIOLATED, main

pytestmark = pytest.mark.usefixtures("ray_session")

RECORDS = 6000


def pipeline(records: int = RECORDS, rate: float | None = 6000) -> bn.Topology:
    """Two map instances, then a sink in a task of its own (the edge rebalances): what
    the map instances send crosses a channel, and every record reaches the sink once."""
    topo = bn.Topology("faulty-pipeline")
    nums = topo.source("nums", bn.sources.Generator(lambda i: i, count=records, rate=rate),
                       parallelism=2)
    nums.map("double", lambda i: 2 * i, parallelism=2).sink("out", bn.sinks.Collect(),
                                                            parallelism=1)
    return topo


EXPECTED = sorted(2 * i for i in range(RECORDS))


def test_stalls_slow_the_instance_and_lose_nothing(tmp_path):
    stall = bn.faults.Timing("double", instances=(0,), magnitude=bn.faults.Constant(0.2),
                             mtbf_records=600, seed=1)
    result = bn.run(pipeline(rate=None), faults=[stall], storage=f"local://{tmp_path}")
    injected = result.metrics.extra["faults_injected"]
    assert injected["stalls"] >= 1
    assert injected["stalled_s"] == pytest.approx(0.2 * injected["stalls"])
    # the stalls are sleeps of the run's own tasks: the run lasted at least as long
    assert result.metrics.duration_s >= injected["stalled_s"]
    assert sorted(result.outputs["out"]) == EXPECTED
    assert "faults injected" in dict(result.metrics.summary_rows())


def test_link_outages_delay_frames_and_lose_nothing(tmp_path):
    outage = bn.faults.LinkOutage("double", mtbf_s=0.15, mttr_s=0.1, seed=2)
    result = bn.run(pipeline(), faults=[outage], storage=f"local://{tmp_path}")
    injected = result.metrics.extra["faults_injected"]
    assert injected["outage_waits"] >= 1 and injected["outage_waited_s"] > 0
    assert sorted(result.outputs["out"]) == EXPECTED


def test_lost_frames_are_each_reported_lost_by_the_drill():
    drop = bn.faults.DropFrames("double", probability=0.2)
    # An unpaced source and one source batch per frame: frames are cut by size alone,
    # so the same seed loses the same records.
    options = dict(protocol=bn.protocols.Coordinated(interval_s=0.3), faults=[drop], seed=3,
                   data_plane=bn.DataPlane(frame_records=1024, source_batch_records=1024))
    report = bn.drill(pipeline(rate=None), **options)
    injected = report.metrics.extra["faults_injected"]
    assert injected["frames_dropped"] >= 1
    assert report.verdict == "violated"
    # exactly the records in the lost frames, nothing else
    assert (report.lost, report.duplicated, report.corrupted) == (
        injected["records_dropped"], 0, 0)
    again = bn.drill(pipeline(rate=None), **options)
    assert again.lost == report.lost
    assert {v.record_id for v in again.lost_examples} == \
        {v.record_id for v in report.lost_examples}
    other = bn.drill(pipeline(rate=None), **{**options, "seed": 4})
    assert {v.record_id for v in other.lost_examples} != \
        {v.record_id for v in report.lost_examples}


def test_a_declared_fault_that_never_occurs_leaves_the_drill_inconclusive():
    rare = bn.faults.Timing("double", mtbf_records=10**9, seed=1)
    report = bn.drill(pipeline(records=600),
                      protocol=bn.protocols.Coordinated(interval_s=0.3), faults=[rare])
    assert report.verdict == "inconclusive"
    assert "no declared fault occurred" in report.verdict_reason


def test_a_crash_is_survived_after_its_repair_time():
    crash = bn.faults.Crash("double", instances=(1,), mtbf_s=0.4, mttr_s=0.6, seed=4)
    [kill] = crash.schedule(bn.launcher.build_plan(pipeline()))
    report = bn.drill(pipeline(), protocol=bn.protocols.Coordinated(interval_s=0.3), faults=[crash])
    assert report.verdict == "exactly-once", report.verdict_reason
    events = report.events
    fault = next(e for e in events if e["kind"] == "fault")
    restarted = next(e for e in events if e["kind"] == "restarted")
    assert fault["what"] == kill.what
    # the replacement was not started before the repair was over
    assert restarted["t"] - fault["t"] >= kill.repair_s


def test_an_ack_phase_stall_is_refused_until_there_are_acknowledgments():
    with pytest.raises(ValueError, match="phase 'ack' stalls acknowledgments of tuples, which protocol 'none'"):
        bn.run(pipeline(records=10), faults=[bn.faults.Timing("double", phase="ack")])


JOB = '''
import bastion as bn

topology = bn.Topology("cli-faults")
nums = topology.source("nums", bn.sources.Generator(lambda i: i, count=3000, rate=3000),
                       parallelism=2)
nums.map("double", lambda i: i * 2, parallelism=2).sink("out", bn.sinks.Collect(),
                                                        parallelism=1)
'''


def test_the_cli_reads_faults_from_a_file_and_names_a_mistake_by_line(tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    faults = tmp_path / "faults.yaml"
    faults.write_text("seed: 5\noperators:\n  double:\n    faults:\n"
                      "      - drop_frames: {probability: 0.3}\n")
    store = f"local://{tmp_path}/store"
    code = main(["drill", str(job), "--storage", store, "--faults", str(faults),
                 "--html", str(tmp_path / "r.html"), "--checkpoint-interval", "0.3"])
    out, _ = capsys.readouterr()
    assert code == EXIT_VIOLATED, out
    assert re.search(r"faults injected\s+[1-9][\d,]* frames lost", out)
    assert "stalls" not in out  # only what took effect
    assert main(["run", str(job), "--storage", store, "--faults", str(faults)]) == EXIT_OK
    assert "faults injected" in capsys.readouterr().out
    faults.write_text("operators:\n  double:\n    faults:\n"
                      "      - drop_frames: {probability: 0.3, burst: 2}\n")
    assert main(["run", str(job), "--storage", store, "--faults", str(faults)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{faults} line 4: operators.double.faults[0].drop_frames.burst: unknown field" \
        in err
