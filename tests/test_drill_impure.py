"""Drills of topologies whose functions are not pure: a map that stamps
``time.time()`` or draws ``random.random()``, a filter that samples at random.

Two failure-free runs of such a topology disagree, so the values (or, for the
sample, the records) of those operators are not evidence against a protocol. The
drill must say so by name and never call a correct run "violated" for them — and
still find what it can: a lost or duplicated record of the impure sink, a corrupted
value of a pure sink beside it. The broken protocols are `test_drill_verdicts`'s.
"""

from __future__ import annotations

import random
import re
import time

import pytest

import bastion as bn
from bastion.cli import EXIT_OK, main
from bastion.drills import NOT_REPRODUCIBLE, reference_runs
from bastion.report import render_html

from test_drill_verdicts import CommitTwice, DropStagedCommit, SourcesRestoreOlder, show

pytestmark = pytest.mark.usefixtures("ray_session")


def numbers(name: str, stamp, count: int = 3000, rate: float = 1500):
    """``nums`` → ``stamp`` → sink ``stamped``. ``stamp`` calls ``time.time()`` or
    ``random.random()`` through the module, as a job does: a bound method passed as
    a value (``draw=random.random``) would ship its generator's state to the workers,
    so every failure-free run would draw the same numbers."""
    topo = bn.Topology(name)
    nums = topo.source("nums", bn.sources.Generator(lambda i: i, count=count, rate=rate))
    stamped = nums.map("stamp", stamp, parallelism=2)
    stamped.sink("stamped", bn.sinks.Collect())
    return topo, nums, stamped


def with_sums(nums) -> None:
    """A pure running sum per key beside the impure branch: its values stay compared."""
    nums.key_by(lambda i: i % 7).reduce("sum", lambda acc, i: acc + i, initial=0,
                                        parallelism=2).sink("sums", bn.sinks.Collect())


def clock() -> bn.Topology:
    """Stamps with the wall clock, then a map of the stamped records (``label``): its
    values differ because ``stamp``'s do."""
    topo, nums, stamped = numbers("drill-clock", lambda i: (i, time.time()))
    stamped.map("label", lambda t: {"i": t[0], "at": t[1]}).sink(
        "labelled", bn.sinks.Collect())
    with_sums(nums)
    return topo


def dice() -> bn.Topology:
    """Random draws, and a random half of the numbers (``sample``): which records
    exist differs between runs."""
    topo, nums, _ = numbers("drill-dice", lambda i: (i, random.random()))
    nums.filter("sample", lambda i: random.random() < 0.5).sink(
        "sampled", bn.sinks.Collect())
    with_sums(nums)
    return topo


def stamp_only() -> bn.Topology:
    """Nothing but the impure sink: every lost or duplicated record is one of it."""
    return numbers("drill-stamp-only", lambda i: (i, time.time()))[0]


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('impure')}"


@pytest.fixture(scope="module")
def stamp_only_references(storage):
    # made up front (runs=2), as for a topology known to read the clock
    return reference_runs(stamp_only(), runs=2, storage=storage)


def named(report: bn.DrillReport) -> set[tuple]:
    return {(n.sink, n.operator, n.what, n.suspects) for n in report.not_reproduced}


# -- a correct recovery is never "violated" -------------------------------------------------


@pytest.mark.parametrize("shape,not_compared", [
    (clock, {("stamped", "stamp", "values", ("stamp",)),
             ("labelled", "label", "values", ("stamp",))}),
    (dice, {("stamped", "stamp", "values", ("stamp",)),
            ("sampled", "nums", "records", ("sample",))}),
], ids=["clock", "random"])
def test_an_exact_drill_of_impure_functions_is_exactly_once_and_names_them(
        shape, not_compared, storage):
    report = bn.drill(shape(), protocol=bn.protocols.Coordinated(interval_s=0.3),
                      faults=[bn.faults.KillInstance("stamp", 0, at=0.8)], storage=storage)
    assert report.verified_by == "deterministic"
    assert report.faults_landed, [f.note for f in report.faults]
    assert report.metrics.protocol.failures, "the kill must have forced a restart"
    assert (report.lost, report.duplicated, report.corrupted) == (0, 0, 0), show(report)
    assert report.verdict == "exactly-once", report.verdict_reason
    # the first reference disagreed with the faulty run: the drill ran a second one
    assert len(report.reference_job_ids) == 2
    assert named(report) == not_compared
    c, reference = report.comparison, report.reference_outputs
    # every value of the pure sum was compared, no other value was
    assert c.comparable_values == len(reference["sums"]) > 0
    sampled = len(reference.get("sampled", []))
    assert c.comparable_ids == c.reference_records - sampled
    how = report.verification()
    assert re.search(rf"values not compared: stamp in stamped[^—]* — {NOT_REPRODUCIBLE}",
                     how), how
    if shape is clock:
        assert "label in labelled (from stamp)" in how
    else:
        assert (f"records not compared, only duplicates: nums in sampled (from sample) "
                f"— {NOT_REPRODUCIBLE}") in how
    page = render_html(report)
    assert f"Not compared: {NOT_REPRODUCIBLE}" in page and "stamp in stamped" in page


# -- what can still be checked is still checked ---------------------------------------------


def test_a_record_lost_from_an_impure_sink_is_still_lost(storage, stamp_only_references):
    report = bn.drill(stamp_only(), protocol=DropStagedCommit(interval_s=0.3),
                      reference=stamp_only_references, storage=storage)
    assert report.verdict == "violated" and report.lost > 0, show(report)
    assert {v.sink for v in report.lost_examples} == {"stamped"}
    # the stamps of the records that were committed are not held against it
    assert report.corrupted == 0 and report.duplicated == 0
    assert named(report) == {("stamped", "stamp", "values", ("stamp",))}
    assert report.verdict_reason == f"{report.lost:,} lost"


def test_a_record_of_an_impure_sink_committed_twice_is_still_duplicated(
        storage, stamp_only_references):
    report = bn.drill(stamp_only(), protocol=CommitTwice(interval_s=0.3),
                      reference=stamp_only_references, storage=storage)
    assert report.verdict == "violated" and report.duplicated > 0, show(report)
    assert report.lost == 0 and report.corrupted == 0
    assert {v.sink for v in report.duplicated_examples} == {"stamped"}


def test_pure_values_beside_an_impure_map_are_still_compared(storage):
    # Sources replay input the restored sums already hold: the sums are corrupted,
    # the stamps are not compared.
    report = bn.drill(clock(), protocol=SourcesRestoreOlder(interval_s=0.3),
                      faults=[bn.faults.KillInstance("sum", 0, at=1.2)], storage=storage)
    assert report.faults_landed, [f.note for f in report.faults]
    assert report.verdict == "violated" and report.corrupted > 0, show(report)
    assert {v.sink for v in report.corrupted_examples} == {"sums"}
    assert ("stamped", "stamp", "values", ("stamp",)) in named(report)


# -- the command line ----------------------------------------------------------------------

JOB = '''
import time
import bastion as bn

topology = bn.Topology("cli-clock")
nums = topology.source("nums", bn.sources.Generator(lambda i: i, count=3000, rate=1500))
nums.map("stamp", lambda i: (i, time.time()), parallelism=2).sink("stamped", bn.sinks.Collect())
'''


def test_the_cli_summary_names_what_was_not_compared(tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    page = tmp_path / "report.html"
    code = main(["drill", str(job), "--storage", f"local://{tmp_path}/store",
                 "--checkpoint-interval", "0.3", "--html", str(page),
                 "--kill", "stamp:0@0.8"])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, out
    assert re.search(r"verdict\s+exactly-once", out), out
    # the table wraps a long value within 80 columns: compared with its lines joined
    assert f"values not compared: stamp in stamped — {NOT_REPRODUCIBLE}" in " ".join(
        out.split())
    assert re.search(r"not compared, the first disagreement of the failure-free runs on "
                     r"each:\n  stamp in stamped: stamp\(nums\[0\]@\d+\): \(\d+, [\d.]+\) "
                     r"in one run, \(\d+, [\d.]+\) in the other\n", out), out
    assert "reference 1/1: [" in err and "second reference: [" in err
    assert f"Not compared: {NOT_REPRODUCIBLE}" in page.read_text()
