"""The results page's verdicts (`bastion.bench.results`): each can say "worse".

The page tells a user whether Bastion reproduced a paper's figure; a verdict that
cannot come out against Bastion would be a claim, not a measurement. These feed the
judges and the renderer figures from deliberately bad runs, and check the page's
plumbing (`benchmarks/reproduce.py --render-only`) on figures kept in a directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bastion.bench import results as page
from bastion.bench.results import Verdict

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("reference,measured,higher,within,expected", [
    (100.0, 100.0, True, 0.25, Verdict.REPRODUCED),
    (100.0, 81.0, True, 0.25, Verdict.REPRODUCED),     # 0.81 ≥ 1/1.25
    (100.0, 79.0, True, 0.25, Verdict.WORSE),          # below the band, higher is better
    (100.0, 79.0, False, 0.25, Verdict.BETTER),        # below the band, lower is better
    (100.0, 126.0, True, 0.25, Verdict.BETTER),
    (100.0, 126.0, False, 0.25, Verdict.WORSE),
    (0.0, 3.0, False, 0.25, Verdict.WORSE),            # zero reference: by the difference
    (0.0, 0.0, False, 0.25, Verdict.REPRODUCED),
    (-10.0, -20.0, True, 0.25, Verdict.WORSE),         # both negative: -20 is lower
    (-10.0, -5.0, True, 0.25, Verdict.BETTER),
    (5.0, float("nan"), True, 0.25, Verdict.NOT_MEASURED),
])
def test_judge_compares_within_a_band_and_by_direction(reference, measured, higher, within,
                                                       expected):
    assert page.judge(reference, measured, higher_is_better=higher,
                      within=within).verdict is expected


def test_claims_and_targets_can_fail():
    assert page.judge_claim(True, "PRG restores q1 first").verdict is Verdict.REPRODUCED
    broken = page.judge_claim(False, "PRG restores q1 first", why_not="OPC was first")
    assert broken.verdict is Verdict.WORSE and "OPC was first" in broken.reason
    assert page.judge_target(1.2, 1.0, higher_is_better=True, what="x").verdict is Verdict.BETTER
    missed = page.judge_target(0.5, 1.0, higher_is_better=True, what="batch/SQL")
    assert missed.verdict is Verdict.WORSE and "missed" in missed.reason


def test_a_verdict_needs_a_one_line_reason():
    with pytest.raises(ValueError, match="one-line reason"):
        page.not_comparable("")
    with pytest.raises(ValueError, match="one-line reason"):
        page.not_comparable("two\nlines")


def _row(anchor: str, judgement: page.Judgement) -> page.Row:
    return page.Row(anchor=anchor, ref="Fig 7", experiment="throughput, coordinated",
                    reference_setting="p=8", reference_figure="0.9×",
                    bastion_setting="p=2", bastion_figure="0.8×", ratio=0.89,
                    judgement=judgement)


def test_rows_render_with_their_anchor_and_verdict(tmp_path):
    exp = page.Experiment(key="fig7", title="Fig 7: throughput", script="protocols.py",
                          args=[], quick_args=[], rows=lambda f: [], budget_s=1)
    section = page.Section(key="checkmate", title="CheckMate", source="003", intro="x",
                           experiments=[exp])
    text = page.render_section(section, [
        page.ExperimentResult(exp, rows=[_row("checkmate-fig7-a", page.judge(
            0.9, 0.5, higher_is_better=True, within=0.25))]),
    ], tmp_path)
    assert '<a id="checkmate-fig7-a"></a>' in text and "**worse**" in text
    dated = page.render_section(section, [page.ExperimentResult(
        exp, rows=(), seconds=61.0, date="2026-12-04")], tmp_path)
    assert "`benchmarks/protocols.py`, 61 s, run 2026-12-04." in dated
    failed = page.render_section(section, [page.ExperimentResult(exp, rows=(),
                                                                 error="exited 1")], tmp_path)
    assert "**Not measured:** exited 1" in failed
    with pytest.raises(ValueError, match="twice"):
        page.check_anchors([(section, [page.ExperimentResult(
            exp, rows=[_row("a", page.not_comparable("r")), _row("a", page.not_comparable("r"))])])])
    with pytest.raises(ValueError, match="lower-case"):
        _row("Not An Anchor", page.not_comparable("r"))


def test_figures_files_round_trip_and_refuse_other_formats(tmp_path):
    path = tmp_path / "f.json"
    page.write_figures(path, {"tuples_per_s": {"none": 1.0e6}})
    assert page.read_figures(path) == {"tuples_per_s": {"none": 1.0e6}}
    path.write_text('{"format": 0, "figures": {}}')
    with pytest.raises(ValueError, match="format"):
        page.read_figures(path)
    with pytest.raises(ValueError):
        page.write_figures(path, {"x": float("nan")})  # the page never shows NaN


def test_every_section_renders_from_its_kept_figures(tmp_path):
    """The committed page is what its kept figures render to (nothing typed in)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    if not reproduce.RUN_FILE.exists():
        pytest.skip("docs/results/raw/run.json is not generated yet (make results)")
    import json

    run = json.loads(reproduce.RUN_FILE.read_text())
    text, _ = reproduce.render(reproduce.load_sections(reproduce.SECTIONS), run,
                               plot_dir=tmp_path)
    assert text == reproduce.PAGE.read_text(), (
        "docs/results.md differs from what its figures render to: run "
        "`python benchmarks/reproduce.py --render-only` and commit the page")


def test_the_header_names_the_experiments_run_again_alone():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    run = {"date": "2026-11-29", "experiments": {
        "cec.recovery": {"date": "2026-12-04"}, "checkmate.skew": {"date": "2026-11-29"},
        "chiron.tuning": {"date": "2026-12-01"}, "peers.spark": {}}}
    assert reproduce.rerun_since(run) == ("chiron.tuning (2026-12-01), "
                                          "cec.recovery (2026-12-04)")
    text, _ = reproduce.render([], run)
    assert "Run again alone since then: chiron.tuning (2026-12-01), " in text
    del run["experiments"]["cec.recovery"], run["experiments"]["chiron.tuning"]
    assert "Run again alone" not in reproduce.render([], run)[0]


def links_to_missing_rows(documents: dict[str, str], page_text: str) -> list[str]:
    """Each ``results.md#anchor`` link of the documents whose anchor the page lacks."""
    import re

    anchors = set(re.findall(r'<a id="([^"]+)"></a>', page_text))
    return [f"{name}: results.md#{anchor}"
            for name, text in sorted(documents.items())
            for anchor in re.findall(r"results\.md#([A-Za-z0-9._-]+)", text)
            if anchor not in anchors]


def test_a_link_to_a_row_the_page_lacks_is_found():
    page_text = '| <a id="dynamo-fig3.31-failed"></a>**Fig 3.31** |'
    good = {"README.md": "see [the row](docs/results.md#dynamo-fig3.31-failed)"}
    bad = {"README.md": "see [the row](docs/results.md#dynamo-fig3.31-lost)"}
    assert links_to_missing_rows(good, page_text) == []
    assert links_to_missing_rows(bad, page_text) == ["README.md: results.md#dynamo-fig3.31-lost"]


def test_every_link_from_readme_and_docs_names_a_row_of_the_page():
    """README and docs quote results only by linking to their rows (issue 40)."""
    page_file = ROOT / "docs" / "results.md"
    if not page_file.exists():
        pytest.skip("docs/results.md is not generated yet (make results)")
    documents = {"README.md": (ROOT / "README.md").read_text()}
    documents.update({f"docs/{p.name}": p.read_text()
                      for p in (ROOT / "docs").glob("*.md") if p.name != "results.md"})
    assert links_to_missing_rows(documents, page_file.read_text()) == []


@pytest.mark.parametrize("ratio,shown", [
    (None, "–"), (1.0, "1.00×"), (0.125, "0.12×"), (0.0065, "0.0065×"), (0.0, "0.00×"),
    (154.2, "154×"), (42.0, "42.00×")])
@pytest.mark.internal
def test_a_small_ratio_keeps_its_digits(ratio, shown):
    assert page._ratio(ratio) == shown


def test_verdict_changes_name_every_moved_or_missing_row():
    before = {"a": "reproduced", "b": "worse", "c": "better"}
    assert page.verdict_changes(before, dict(before)) == []
    assert page.verdict_changes(before, {"a": "worse", "b": "worse", "c": "better"}) == [
        "a: reproduced → worse"]
    # an experiment that stopped early loses its rows: that is a change, not stability
    assert page.verdict_changes(before, {"a": "reproduced", "d": "better"}) == [
        "d: – → better", "b: worse → –", "c: better → –"]


def test_a_second_run_whose_verdict_moved_is_named_on_the_page(tmp_path, monkeypatch):
    """Two runs of one experiment: the second's figures (planted: G_open only at half
    of none's throughput) flip a verdict, and the page's header names that row."""
    import json
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import reproduce

    kept = reproduce.RAW / "cec-baseline.json"
    if not kept.exists():
        pytest.skip("docs/results/raw is not generated yet (make results)")
    monkeypatch.setattr(reproduce, "RAW", tmp_path)
    shutil.copy(kept, tmp_path / "cec-baseline.json")
    section = reproduce.load_sections(["cec"])[0]
    chosen = [(section, e) for e in section.experiments if e.key == "baseline"]
    # the first run's figures: G_open only at 0.95x of none (reproduced whatever the
    # kept run measured)
    figures = page.read_figures(tmp_path / "cec-baseline.json")
    fast = figures["throughput"]["workloads"]["count-fast"]
    fast["cec G_open only"]["records_per_s_best"] = fast["none"]["records_per_s_best"] * 0.95
    page.write_figures(tmp_path / "cec-baseline.json", figures)
    first = {"experiments": {"cec.baseline": {"seconds": 20, "error": None,
                                              "date": "2026-11-01", "quick": False}}}
    before = reproduce.verdicts(chosen, first)
    assert before["cec-fig5-fast-throughput"] == "reproduced"

    same = reproduce.compare(before, reproduce.verdicts(chosen, first),
                             reproduce.previous_runs(chosen, first))
    assert same["changed"] == [] and same["rows"] == len(before)

    fast["cec G_open only"]["records_per_s_best"] = fast["none"]["records_per_s_best"] / 2
    page.write_figures(tmp_path / "cec-baseline.json", figures)
    second = json.loads(json.dumps(first))
    second["compared"] = reproduce.compare(before, reproduce.verdicts(chosen, second),
                                           reproduce.previous_runs(chosen, first))
    assert second["compared"]["changed"] == ["cec-fig5-fast-throughput: reproduced → worse"]
    text, _ = reproduce.render([section], second, plot_dir=tmp_path / "plots")
    assert ("Against the figures of the run before (full run of 2026-11-01): 1 of the "
            f"{len(before)} verdicts changed: cec-fig5-fast-throughput: reproduced → worse."
            ) in text
