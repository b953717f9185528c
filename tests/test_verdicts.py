"""The drill verifier without Ray: comparison by lineage id, fault landing, verdicts,
exit codes and the HTML report, on hand-made runs.

The comparison is checked three ways: on small cases whose answer is obvious, against
perturbations whose effect is known by construction (drop these ids, commit those
twice, change those values, shuffle everything), and against a brute-force
restatement of the definitions on random runs.
"""

from __future__ import annotations

import io
import math
import random
import re

import pytest

from bastion.cli import (EXIT_INCONCLUSIVE, EXIT_OK, EXIT_VIOLATED, drill_exit_code,
                         print_drill)
from bastion.drills import (Committed, Comparison, DrillReport, FaultOutcome, compare,
                            fault_outcomes, same_value)
from bastion.faults import ScheduledKill
from bastion.lineage import ancestry
from bastion.launcher import RunResult
from bastion.report import render_html, write_html


def committed(**sinks: list[tuple]) -> Committed:
    """``sink=[(id, value), ...]`` as a run's committed outputs."""
    return Committed({s: [v for _, v in pairs] for s, pairs in sinks.items()},
                     {s: [i for i, _ in pairs] for s, pairs in sinks.items()})


def running_sums(n: int) -> list[tuple]:
    # ids as the engine builds them: (reduce, (source, instance, position))
    return [((2, (0, 0, k)), ("acct", k * (k + 1) // 2)) for k in range(n)]


# -- small cases -------------------------------------------------------------------------


def test_identical_runs_in_any_order_compare_clean():
    ref = committed(out=running_sums(50))
    shuffled = running_sums(50)
    random.Random(1).shuffle(shuffled)
    c = compare(ref, committed(out=shuffled))
    assert (c.lost, c.duplicated, c.corrupted) == (0, 0, 0)
    assert c.reference_records == c.comparable_ids == c.comparable_values == 50


def test_a_missing_id_is_lost_an_extra_commit_duplicated_a_new_value_corrupted():
    ref = running_sums(10)
    faulty = list(ref)
    faulty[7] = (ref[7][0], ("acct", -1))           # same id, other value
    faulty.append(ref[5])                           # committed twice
    del faulty[3]                                   # lost
    c = compare(committed(out=ref), committed(out=faulty))
    assert (c.lost, c.duplicated, c.corrupted) == (1, 1, 1)
    assert [v.record_id for v in c.examples["lost"]] == [ref[3][0]]
    assert c.examples["lost"][0].expected == ref[3][1]
    assert c.examples["duplicated"][0].got == (ref[5][1], ref[5][1])
    corrupted = c.examples["corrupted"][0]
    assert (corrupted.record_id, corrupted.expected, corrupted.got) == (
        ref[7][0], ref[7][1], (("acct", -1),))


def test_same_values_in_another_interleaving_are_not_violations_by_id():
    # The bug the value-multiset verifier had: two sums fed by two channels in another
    # interleaving commit other intermediate values. By id, with a second reference
    # that saw yet another interleaving, nothing is lost or duplicated — and no value
    # of that sum is judged, not even those both references happen to share (3 and
    # 10): the faulty run saw a third interleaving and differs there (4), correctly.
    ids = [(2, (0, 0, k)) for k in range(4)]
    ref1 = committed(out=list(zip(ids, [1, 3, 6, 10])))
    ref2 = committed(out=list(zip(ids, [2, 3, 7, 10])))
    faulty = committed(out=list(zip(ids, [1, 4, 5, 10])))
    c = compare(ref1, faulty, ref2)
    assert (c.lost, c.duplicated, c.corrupted) == (0, 0, 0)
    assert c.comparable_ids == 4 and c.comparable_values == 0
    assert c.unstable == [("out", 2)]


def test_ids_mode_still_judges_the_values_of_operators_the_references_reproduced():
    # operator 2 (a running sum) is unstable; operator 3 (a map of source records)
    # reproduced every value, so its values are evidence
    sums = [((2, (0, 0, k)), v) for k, v in enumerate([1, 3, 6])]
    maps = [((3, (0, 0, k)), k * 10) for k in range(3)]
    ref1 = committed(out=sums + maps)
    ref2 = committed(out=[(i, v + (k == 1)) for k, (i, v) in enumerate(sums)] + maps)
    faulty = committed(out=sums + maps[:2] + [(maps[2][0], -1)])
    c = compare(ref1, faulty, ref2)
    assert (c.lost, c.duplicated, c.corrupted) == (0, 0, 1)
    assert c.comparable_values == 3 and c.examples["corrupted"][0].record_id == maps[2][0]


def test_ids_mode_judges_values_where_both_references_agree():
    ids = [(2, (0, 0, k)) for k in range(3)]
    ref = committed(out=list(zip(ids, ["a", "b", "c"])))
    faulty = committed(out=list(zip(ids, ["a", "B", "c"])))
    c = compare(ref, faulty, ref)
    assert c.corrupted == 1 and c.examples["corrupted"][0].record_id == ids[1]


def test_ids_mode_skips_ids_not_reproducible_and_counts_unverified():
    ref1 = committed(out=[((5, "k", 0, 1), 3), ((5, "k", 1, 2), 4)])
    ref2 = committed(out=[((5, "k", 0, 1), 3), ((5, "k", 2, 3), 4)])
    faulty = committed(out=[((5, "k", 0, 1), 3), ((5, "k", 7, 8), 4)])
    c = compare(ref1, faulty, ref2)
    assert (c.lost, c.duplicated, c.corrupted) == (0, 0, 0)
    assert c.comparable_ids == 1 and c.unverified == 1


def test_ids_mode_does_not_require_ids_of_an_ingest_time_window_both_references_share():
    # Two references that ran within one wall-clock window both committed window
    # (5, "k", 0, 1); a later faulty run cannot make it. It is not lost, but a running
    # sum the references share still is, and a clocked id committed twice still counts.
    ref = running_sums(2) + [((5, "k", 0, 1), 3), ((6, (5, "k", 0, 1)), 3)]
    faulty = committed(out=running_sums(1) + [((5, "k", 8, 9), 4), ((5, "k", 8, 9), 4)])
    clocked = lambda rid: 5 in ancestry(rid, ["source", "filter", "reduce", "map",
                                                   "union", "window", "map"])
    c = compare(committed(out=ref), faulty, committed(out=ref), clocked=clocked)
    assert (c.lost, c.duplicated, c.corrupted) == (1, 1, 0)
    assert c.examples["lost"][0].record_id == running_sums(2)[1][0]
    assert c.comparable_ids == 2 and c.unverified == 1
    # without the clock rule the shared window and its map output would be lost
    assert compare(committed(out=ref), faulty, committed(out=ref)).lost == 3


def test_ancestry_follows_every_kind_of_lineage_id_to_its_roots():
    kinds = ["source", "map", "flat_map", "union", "join", "window", "map"]
    root = (0, 1, 17)
    assert ancestry(root, kinds) == {0}
    assert ancestry((1, root), kinds) == {0, 1}
    assert ancestry((2, (1, root), 3), kinds) == {0, 1, 2}
    assert ancestry((3, 1, (2, (1, root), 0)), kinds) == {0, 1, 2, 3}
    assert ancestry((4, (1, root), (0, 0, 4), 9), kinds) == {0, 1, 4}
    assert ancestry((6, (5, ("k", 1), 0.0, 0.5)), kinds) == {5, 6}  # key not followed
    assert ancestry((1, -2, root), kinds) == {0, 1}  # a broadcast copy


def test_ids_mode_counts_a_duplicate_even_of_an_unreproducible_id():
    ref1 = committed(out=[((5, "k", 0, 1), 3)])
    ref2 = committed(out=[((5, "k", 1, 2), 3)])
    faulty = committed(out=[((5, "k", 9, 9), 3), ((5, "k", 9, 9), 3)])
    assert compare(ref1, faulty, ref2).duplicated == 1


def test_deterministic_mode_counts_an_id_the_reference_never_committed_as_corrupted():
    ref = committed(out=running_sums(3))
    extra = ((2, (0, 0, 99)), ("acct", 1))
    c = compare(ref, committed(out=running_sums(3) + [extra]))
    assert c.corrupted == 1
    violation = c.examples["corrupted"][0]
    assert violation.unexpected and violation.record_id == extra[0]


def test_sinks_are_compared_separately():
    # the same id in two sinks is two records: one lost from sink b
    rid = (0, 0, 0)
    c = compare(committed(a=[(rid, 1)], b=[(rid, 1)]), committed(a=[(rid, 1)], b=[]))
    assert (c.lost, c.duplicated, c.corrupted) == (1, 0, 0)
    assert c.examples["lost"][0].sink == "b"
    # a sink the faulty run lacks entirely loses everything
    assert compare(committed(a=[(rid, 1)]), Committed({}, {})).lost == 1


def test_examples_are_capped_and_in_order():
    ref = running_sums(20)
    c = compare(committed(out=ref), committed(out=[]), examples=3)
    assert c.lost == 20
    assert [v.record_id for v in c.examples["lost"]] == [r[0] for r in ref[:3]]


def test_reference_duplicates_are_reported_not_hidden():
    ref = committed(out=running_sums(3) + running_sums(1))
    assert compare(ref, ref).reference_duplicates == 1


def test_values_compare_with_nan_and_sequences():
    assert same_value(math.nan, math.nan)
    assert same_value(("k", [1.0, math.nan]), ("k", (1.0, math.nan)))
    assert same_value({"a": math.nan}, {"a": math.nan})
    assert not same_value(("k", 1), ("k", 2))
    assert not same_value({"a": 1}, {"b": 1})
    assert not same_value(1.0, math.nan)


def test_a_run_without_lineage_ids_is_refused():
    result = RunResult("job-1", {"out": [1, 2]}, metrics=None, output_ids={})
    with pytest.raises(ValueError, match=r"sink 'out' committed 2 records but no lineage "
                                         r"ids.*lineage=True"):
        Committed.of(result)


# -- perturbations with a known effect, and brute force ---------------------------------


def _perturbed(rng: random.Random, n: int):
    """A reference of ``n`` records on two sinks, and a faulty run made from it by
    dropping, duplicating and altering known ids; returns what the verifier must find."""
    ref_pairs = {s: [((s, k), (s, rng.randrange(1000))) for k in range(n)] for s in "ab"}
    faulty_pairs, lost, duplicated, corrupted = {}, 0, 0, 0
    for sink, pairs in ref_pairs.items():
        out = []
        for rid, value in pairs:
            fate = rng.random()
            if fate < 0.1:
                lost += 1
                continue
            if fate < 0.2:
                value = (value[0], value[1] + 1)
                corrupted += 1
            copies = 1
            if rng.random() < 0.1:
                copies = rng.randrange(2, 4)
                duplicated += copies - 1
            out += [(rid, value)] * copies
        rng.shuffle(out)
        faulty_pairs[sink] = out
    return committed(**ref_pairs), committed(**faulty_pairs), (lost, duplicated, corrupted)


@pytest.mark.parametrize("seed", range(20))
def test_known_perturbations_are_found_exactly(seed):
    reference, faulty, expected = _perturbed(random.Random(seed), 200)
    c = compare(reference, faulty)
    assert (c.lost, c.duplicated, c.corrupted) == expected
    # the same with a second reference that agrees: ids mode finds the same
    c2 = compare(reference, faulty, reference)
    assert (c2.lost, c2.duplicated, c2.corrupted) == expected


def _brute_force(ref, faulty, ref2=None):
    """The definitions, restated naively (quadratic scans over lists)."""
    lost = duplicated = corrupted = 0
    for sink in set(ref.outputs) | set(faulty.outputs):
        r = list(zip(ref.ids.get(sink, []), ref.outputs.get(sink, [])))
        f = list(zip(faulty.ids.get(sink, []), faulty.outputs.get(sink, [])))
        r2 = r if ref2 is None else list(zip(ref2.ids.get(sink, []),
                                             ref2.outputs.get(sink, [])))
        r_ids = []
        for rid, _ in r:
            if rid not in r_ids:
                r_ids.append(rid)
        unstable = []  # producers with an id whose values the references disagree on
        for rid in r_ids:
            want = [v for i, v in r if i == rid]
            want2 = [v for i, v in r2 if i == rid]
            if ref2 is not None and want2 and not (len(want) == len(want2) == 1
                                                   and want == want2):
                unstable.append(rid[0])
        for rid in r_ids:
            if not any(i == rid for i, _ in r2):
                continue
            want = [v for i, v in r if i == rid]
            agree = rid[0] not in unstable
            got = [v for i, v in f if i == rid]
            if not got:
                lost += 1
            elif agree and any(v != want[0] for v in got):
                corrupted += 1
        f_ids = []
        for rid, _ in f:
            if rid not in f_ids:
                f_ids.append(rid)
        for rid in f_ids:
            duplicated += sum(1 for i, _ in f if i == rid) - 1
            if ref2 is None and not any(i == rid for i, _ in r):
                corrupted += 1
    return lost, duplicated, corrupted


def _random_run(rng: random.Random, ids: list, values: int) -> Committed:
    sinks = {}
    for sink in "xy":
        pairs = [(rng.choice(ids), rng.randrange(values)) for _ in range(rng.randrange(25))]
        sinks[sink] = pairs
    return committed(**sinks)


@pytest.mark.parametrize("seed", range(200))
def test_compare_matches_brute_force_on_random_runs(seed):
    rng = random.Random(seed)
    ids = [(rng.randrange(3), rng.randrange(4)) for _ in range(12)]
    ref, ref2, faulty = (_random_run(rng, ids, 3) for _ in range(3))
    c = compare(ref, faulty)
    assert (c.lost, c.duplicated, c.corrupted) == _brute_force(ref, faulty)
    c2 = compare(ref, faulty, ref2)
    assert (c2.lost, c2.duplicated, c2.corrupted) == _brute_force(ref, faulty, ref2)


# -- did the faults land? -----------------------------------------------------------------


def ev(kind: str, t_s: float, **fields) -> dict:
    return {"kind": kind, "t": 1000.0 + t_s, "t_s": t_s, **fields}


def timeline(until_s: float, down: tuple[float, float] | None = None) -> list[dict]:
    points = []
    t = 0.25
    while t < until_s:
        is_down = down is not None and down[0] <= t < down[1]
        points.append({"t_s": t, "sink_records": 0 if is_down else 500,
                       "source_lag": 800 if is_down else 10})
        t += 0.25
    return points


KILL = ScheduledKill(1.0, "kill count[0]", worker=0)


def test_a_kill_followed_by_detection_and_restart_landed_with_its_timings():
    kill = ScheduledKill(2.0, "kill count[0]", worker=0)
    events = [ev("started", 0), ev("fault", 2.0, what="kill count[0]", killed=["worker 0"]),
              ev("failure_detected", 2.05, reason="worker 0 died"),
              ev("restarted", 2.3, checkpoint=3)]
    (outcome,) = fault_outcomes([kill], events, timeline(5.0, down=(2.0, 2.6)), 5.0)
    assert outcome.landed and outcome.killed == ["worker 0"]
    assert outcome.detection_s == pytest.approx(0.05)
    assert outcome.restart_s == pytest.approx(0.25)
    # output is back at full rate, and the backlog gone, from the point at 2.75 s on
    assert outcome.recovery_s == pytest.approx(0.75)
    assert outcome.trt_s == pytest.approx(0.75)


def test_a_kill_due_after_the_job_ended_did_not_land():
    events = [ev("started", 0)]
    late = ScheduledKill(30.0, "kill count[0]", worker=0)
    (outcome,) = fault_outcomes([late], events, timeline(2.0), 2.0)
    assert not outcome.landed
    assert "job ended after 2.00 s" in outcome.note
    assert "DID NOT LAND" in outcome.describe()


def test_a_kill_that_killed_nothing_did_not_land():
    node = ScheduledKill(1.0, "kill node 1", node=1)
    events = [ev("fault", 1.0, what="kill node 1", killed=[])]
    (outcome,) = fault_outcomes([node], events, timeline(3.0), 3.0)
    assert not outcome.landed and "no process" in outcome.note


def test_a_kill_never_detected_did_not_land():
    events = [ev("fault", 1.9, what="kill count[0]", killed=["worker 0"])]
    (outcome,) = fault_outcomes([KILL], events, timeline(2.0), 2.0)
    assert not outcome.landed and "no failure was detected" in outcome.note


def test_every_fault_gets_its_own_detection_restart_and_recovery():
    second = ScheduledKill(2.5, "kill split[1]", worker=1)
    events = [ev("fault", 1.0, what="kill count[0]", killed=["worker 0"]),
              ev("failure_detected", 1.1, reason="r"), ev("restarted", 1.3, checkpoint=2),
              ev("fault", 2.5, what="kill split[1]", killed=["worker 1"]),
              ev("failure_detected", 2.7, reason="r"), ev("restarted", 3.1, checkpoint=5)]
    first, later = fault_outcomes([second, KILL], events, timeline(5.0), 5.0)
    assert (first.what, later.what) == ("kill count[0]", "kill split[1]")
    assert first.landed and later.landed
    assert first.detection_s == pytest.approx(0.1) and first.restart_s == pytest.approx(0.2)
    assert later.detection_s == pytest.approx(0.2) and later.restart_s == pytest.approx(0.4)


def test_a_kill_during_a_recovery_is_covered_by_that_recovery():
    second = ScheduledKill(1.08, "kill worker 1", worker=1)
    first = ScheduledKill(1.0, "kill worker 0", worker=0)
    events = [ev("fault", 1.0, what="kill worker 0", killed=["worker 0"]),
              ev("failure_detected", 1.05, reason="r"),
              ev("fault", 1.08, what="kill worker 1", killed=["worker 1"]),
              ev("restarted", 1.4, checkpoint=2)]
    a, b = fault_outcomes([first, second], events, timeline(3.0), 3.0)
    assert a.landed and b.landed
    assert b.detection_s is None and b.restart_s == pytest.approx(0.32)
    assert "during the recovery" in b.note


# -- verdicts, exit codes, what is printed ------------------------------------------------


def report(comparison: Comparison | None = None, faults: list | None = None,
           **fields) -> DrillReport:
    comparison = comparison or Comparison(reference_records=10, comparable_ids=10,
                                          comparable_values=10)
    return DrillReport(
        topology="t", protocol="coordinated", verified_by="deterministic",
        comparison=comparison, faults=faults if faults is not None else [
            FaultOutcome("kill count[0]", 1.0, landed=True, at_s=1.0, killed=["worker 0"],
                         detection_s=0.05, restart_s=0.2)],
        job_id="t-faulty", reference_job_ids=["t-ref"], outputs={"out": [1] * 10},
        output_ids={"out": list(range(10))}, reference_outputs={"out": [1] * 10}, seed=7,
        date="2026-01-01T00:00:00+00:00",
        timeline=timeline(3.0, down=(1.0, 1.3)),
        events=[ev("fault", 1.0), ev("failure_detected", 1.05), ev("restarted", 1.25)],
        **fields)


def test_verdicts_and_exit_codes():
    clean = report()
    assert clean.verdict == "exactly-once" and clean.exactly_once
    assert drill_exit_code(clean) == EXIT_OK

    missed = report(faults=[FaultOutcome("kill count[0]", 30.0, landed=False,
                                         note="never carried out")])
    assert missed.verdict == "inconclusive" and not missed.exactly_once
    assert drill_exit_code(missed) == EXIT_INCONCLUSIVE
    assert "did not land" in missed.verdict_reason

    lost = Comparison(lost=2, reference_records=10, comparable_ids=10)
    violated = report(lost)
    assert violated.verdict == "violated" and drill_exit_code(violated) == EXIT_VIOLATED
    # a violation is a violation even when a fault did not land
    assert report(lost, faults=missed.faults).verdict == "violated"
    assert len({EXIT_OK, EXIT_VIOLATED, EXIT_INCONCLUSIVE}) == 3


def test_an_inconclusive_drill_never_says_exactly_once():
    missed = report(faults=[FaultOutcome("kill count[0]", 30.0, landed=False,
                                         note="never carried out")])
    text = "\n".join(f"{k} {v}" for k, v in missed.summary_rows())
    assert "exactly-once" not in text.lower() and "exactly once" not in text.lower()
    assert "INCONCLUSIVE" in text
    assert missed.detection_s is None


def test_nothing_reproducible_is_inconclusive():
    nothing = Comparison(reference_records=10, comparable_ids=0)
    assert report(nothing).verdict == "inconclusive"
    assert "no record" in report(nothing).verdict_reason


def test_the_cli_prints_violations_with_formatted_ids():
    comparison = compare(committed(out=running_sums(4)),
                         committed(out=running_sums(2) + [running_sums(4)[1]]))
    r = report(comparison, format_id=lambda rid: f"<id {rid}>")
    out = io.StringIO()
    print_drill(r, show=1, stream=out)
    text = out.getvalue()
    assert "first 1 of 2 lost records" in text
    assert f"out: <id {running_sums(4)[2][0]}>: expected ('acct', 3)" in text
    assert "first 1 of 1 duplicated records" in text and "committed 2 times" in text
    assert re.search(r"verdict\s+VIOLATED: 2 lost, 1 duplicated$", text, re.M)


def test_the_html_report_is_one_self_contained_file(tmp_path):
    comparison = compare(committed(out=running_sums(4)), committed(out=running_sums(3)))
    page = write_html(report(comparison, format_id=lambda rid: f"ID{rid}"),
                      tmp_path / "drill.html", title="Drill: t")
    assert [p.name for p in tmp_path.iterdir()] == ["drill.html"]
    text = page.read_text()
    assert text.count('src="data:image/png;base64,') == 2
    assert not re.search(r'src="(?!data:)', text)   # nothing loaded from elsewhere
    for needle in ("t-faulty", "t-ref", "2026-01-01T00:00:00+00:00", "violated",
                   "<td>7</td>", f"ID{running_sums(4)[3][0]}", "Checkpoints"):
        assert needle in text, needle
    assert render_html(report(), "x").count("exactly-once") >= 1
