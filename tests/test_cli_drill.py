"""``bastion drill`` end to end, in-process on the session's Ray: the exit code is
the verdict (0 exactly-once, 1 violated, 2 usage error, 3 inconclusive), violations
are printed with their lineage ids, progress is shown for every run, and the HTML
report is one self-contained file."""

from __future__ import annotations

import re

import pytest

import bastion as bn
from bastion.cli import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_USAGE, EXIT_VIOLATED, main

from test_drill_verdicts import DropStagedCommit

pytestmark = pytest.mark.usefixtures("ray_session")

JOB = '''
import bastion as bn

topology = bn.Topology("cli-drill")
nums = topology.source("nums", bn.sources.Generator(lambda i: i, count=3000, rate=1500))
nums.map("double", lambda i: i * 2, parallelism=2).key_by(lambda x: x % 7).reduce(
    "sum", lambda acc, x: acc + x, initial=0, parallelism=2).sink("out", bn.sinks.Collect())
'''


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def drill(job, tmp_path, *args: str) -> int:
    return main(["drill", str(job), "--storage", f"local://{tmp_path}/store",
                 "--checkpoint-interval", "0.3", "--html", str(tmp_path / "report.html"),
                 *args])


def test_a_kill_that_lands_and_loses_nothing_exits_0(job, tmp_path, capsys):
    assert drill(job, tmp_path, "--kill", "sum:0@0.8") == EXIT_OK
    out, err = capsys.readouterr()
    # a long value wraps within 80 columns: compared with its lines joined
    assert re.search(r"verdict\s+exactly-once: nothing lost, duplicated or corrupted "
                     r"across 1 landed fault", " ".join(out.split()))
    assert re.search(r"fault 1\s+kill sum\[0\] at 0.80 s: landed \(killed worker 0\)", out)
    assert re.search(r"verified by\s+deterministic runs", out)
    # progress of both runs, each on lines of its own
    assert "reference 1/1: [" in err and "faulty: [" in err
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png;base64," in page and "exactly-once" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py", "report.html", "store"]


def test_a_kill_after_the_job_ended_is_inconclusive_and_exits_3(job, tmp_path, capsys):
    assert drill(job, tmp_path, "--kill", "sum:0@60") == EXIT_INCONCLUSIVE
    out, _ = capsys.readouterr()
    assert re.search(r"verdict\s+INCONCLUSIVE: kill sum\[0\] at 60.00 s did not land",
                     " ".join(out.split()))
    assert "DID NOT LAND" in out
    assert "exactly-once" not in out and "exactly once" not in out


def test_a_violation_exits_1_and_prints_the_first_records_with_their_ids(
        job, tmp_path, capsys, monkeypatch):
    # The CLI runs whatever bn.drill does: here, with a protocol that drops a commit.
    real_drill = bn.drill
    monkeypatch.setattr(bn, "drill", lambda topology, **options: real_drill(
        topology, **{**options, "protocol": DropStagedCommit()}))
    assert drill(job, tmp_path, "--kill", "sum:0@60", "--show", "2") == EXIT_VIOLATED
    out, _ = capsys.readouterr()
    assert re.search(r"verdict\s+VIOLATED: [\d,]+ lost", out)
    lost = re.search(r"first 2 of [\d,]+ lost records:\n((?:  .*\n){2})", out)
    assert lost, out
    # ids are shown with operator names: sum(double(nums[0]@N)), and the lost value
    for line in lost.group(1).splitlines():
        assert re.fullmatch(r"  out: sum\(double\(nums\[0\]@\d+\)\): expected \(\d, \d+\)",
                            line), line


@pytest.mark.parametrize("args,message", [
    (["--kill", "nope:0@1"], "no operator named 'nope'"),
    (["--kill", "sum:9@1"], "has no instance 9"),
    (["--random-kills", "1", "--between", "4"], "--between: '4': expected FIRST,LAST"),
    ([], "a drill needs faults"),
])
def test_usage_errors_exit_2_before_anything_runs(job, tmp_path, capsys, monkeypatch,
                                                  args, message):
    def no_run(*a, **k):
        raise AssertionError("a run started")

    monkeypatch.setattr("bastion.drills.run", no_run)
    try:
        code = drill(job, tmp_path, *args)
    except SystemExit as exit_info:  # found by the argument parser
        code = exit_info.code
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_malformed_kill_is_rejected_by_the_parser(job, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        drill(job, tmp_path, "--kill", "sum@soon")
    assert exit_info.value.code == EXIT_USAGE
    assert "expected OPERATOR[:INDEX]@SECONDS" in capsys.readouterr().err
