"""The results page: each paper's headline experiment beside the paper's own figure.

`docs/results.md` is written by ``make results`` (``benchmarks/reproduce.py``) and by
nothing else. It has one *section* per paper (and one for the peer engines). A section
is a list of *experiments*; an experiment is one benchmark script of ``benchmarks/``,
run with ``--json PATH`` so that it writes its figures as JSON besides printing them.
From those figures the experiment makes *rows*: one per figure the paper reports.

A row puts side by side

- the reference: the paper's table or figure number, its setting and its figure (or,
  for a peer engine, the peer's setting and the figure measured for it in the same run);
- Bastion's setting (scaled to a 2-core machine) and figure;
- their ratio, and a **verdict**: *reproduced*, *better*, *worse*, *not comparable*
  (with a one-line reason naming the missing mechanism or setting) or *not measured*
  (the experiment did not run to the end; the page says why).

A verdict is a claim the page makes to a user, so it is computed, never typed in:
`judge` compares two numbers within a stated noise band, `judge_claim` checks a
qualitative claim of the paper ("the progressive plan restores the top query first")
against the measured run. Both can say *worse*; the tests feed them broken runs.

The figures a benchmark writes are plain JSON (`write_figures`); the page can be
re-rendered from them without running anything (``reproduce.py --render-only``), and
they are committed under ``docs/results/raw/`` so that every figure on the page can be
traced to the run that produced it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

#: Bumped when the layout of a figures file changes incompatibly.
FIGURES_FORMAT = 1


class Verdict(str, enum.Enum):
    REPRODUCED = "reproduced"
    BETTER = "better"
    WORSE = "worse"
    NOT_COMPARABLE = "not comparable"
    NOT_MEASURED = "not measured"


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A verdict and the one line that says why."""

    verdict: Verdict
    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip() or "\n" in self.reason:
            raise ValueError(f"a {self.verdict.value!r} verdict needs a one-line reason, "
                             f"got {self.reason!r}")


def judge(reference: float, measured: float, *, higher_is_better: bool,
          within: float) -> Judgement:
    """Compare Bastion's figure with the reference's.

    *Reproduced* when ``measured / reference`` lies within ``[1/(1+within), 1+within]``
    (a symmetric band on a log scale: ``within=0.25`` accepts 0.8× to 1.25×); beyond
    the band, *better* or *worse* by ``higher_is_better``. ``within`` is the noise the
    page states for the row: pick it from how far the figure moves between runs.
    """
    if within < 0:
        raise ValueError(f"within must be >= 0, got {within}")
    if not (math.isfinite(reference) and math.isfinite(measured)):
        return Judgement(Verdict.NOT_MEASURED,
                         f"a figure is not finite (reference {reference}, measured {measured})")
    if reference == 0 or measured == 0 or (reference < 0) != (measured < 0):
        # A ratio means nothing across zero or a sign change: compare the difference.
        if measured == reference:
            return Judgement(Verdict.REPRODUCED, "equal")
        ahead = measured > reference if higher_is_better else measured < reference
        return Judgement(Verdict.BETTER if ahead else Verdict.WORSE,
                         f"{measured:g} against {reference:g}")
    ratio = measured / reference
    band = 1.0 + within
    if 1.0 / band <= ratio <= band:
        return Judgement(Verdict.REPRODUCED, f"{_ratio(ratio)} is within ±{within:.0%}")
    ahead = ratio > 1.0 if higher_is_better else ratio < 1.0
    if reference < 0:  # both negative: a larger magnitude is the smaller number
        ahead = not ahead
    side = "higher" if ratio > 1.0 else "lower"
    return Judgement(Verdict.BETTER if ahead else Verdict.WORSE,
                     f"{_ratio(ratio)}: {side} than the reference beyond ±{within:.0%}, "
                     f"and {'higher' if higher_is_better else 'lower'} is better")


def judge_claim(holds: bool, claim: str, *, why_not: str = "") -> Judgement:
    """A qualitative claim of the paper, checked on the measured run.

    *Reproduced* if it holds; otherwise *worse*, stating the claim and, when given,
    what the run showed instead.
    """
    if holds:
        return Judgement(Verdict.REPRODUCED, f"holds: {claim}")
    return Judgement(Verdict.WORSE, f"does not hold: {claim}"
                     + (f" ({why_not})" if why_not else ""))


def judge_target(measured: float, target: float, *, higher_is_better: bool,
                 what: str) -> Judgement:
    """A target set by an issue rather than a paper (the peer table's "≥ 1.0×")."""
    met = measured >= target if higher_is_better else measured <= target
    bound = "≥" if higher_is_better else "≤"
    return Judgement(Verdict.BETTER if met else Verdict.WORSE,
                     f"{what}: {measured:.3g} against the target {bound} {target:g}"
                     + ("" if met else " — missed"))


def not_comparable(reason: str) -> Judgement:
    return Judgement(Verdict.NOT_COMPARABLE, reason)


def not_measured(reason: str) -> Judgement:
    return Judgement(Verdict.NOT_MEASURED, reason)


@dataclasses.dataclass(frozen=True)
class Row:
    """One figure of the paper (or peer) against Bastion's.

    ``anchor`` is unique on the page (``checkmate-fig7-coordinated``): README and docs
    link to it. ``ratio`` is Bastion's figure over the reference's on the compared
    quantity, or None where no single ratio means anything.
    """

    anchor: str
    ref: str
    experiment: str
    reference_setting: str
    reference_figure: str
    bastion_setting: str
    bastion_figure: str
    ratio: float | None
    judgement: Judgement

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9.]+)*", self.anchor):
            raise ValueError(f"row anchor {self.anchor!r}: use lower-case words joined by '-'")


#: An experiment's figures, as its benchmark wrote them.
Figures = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One benchmark run and the rows it yields.

    ``script`` is a file of ``benchmarks/``, run as ``python script *args --json PATH``
    (``quick_args`` under ``reproduce.py --quick``). ``rows`` turns its figures into the
    page's rows; ``plot``, when given, draws the paper's figure from them into the
    directory it is given and returns the files it wrote. ``budget_s`` is what the full
    run may take on a 2-core machine; the run is stopped at three times that.
    """

    key: str
    title: str
    script: str
    args: Sequence[str]
    quick_args: Sequence[str]
    rows: Callable[[Figures], list[Row]]
    budget_s: float
    plot: Callable[[Figures, Path], list[Path]] | None = None


@dataclasses.dataclass(frozen=True)
class Section:
    """One paper (or the peer engines): what it is, and its experiments.

    ``reference`` names the reference column ("paper" or "peer").
    """

    key: str
    title: str
    source: str
    intro: str
    experiments: Sequence[Experiment]
    reference: str = "paper"


def paired_differences(runs: Mapping[str, Any], variant: str, baseline: str) -> list[float]:
    """``variant``'s figure minus ``baseline``'s, repeat by repeat, sorted: ``runs``
    maps each to its figure per repeat (the two run next to each other in each), or
    to one figure (a run stored before repeats were). On a machine whose speed moves
    within seconds, a difference of runs next to each other is steadier than the
    difference of each one's best, which a lucky run of either moves."""
    def repeats(figure: Any) -> list[float]:
        return [float(x) for x in figure] if isinstance(figure, list) else [float(figure)]

    return sorted(v - b for v, b in zip(repeats(runs[variant]), repeats(runs[baseline])))


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def lookup(figures: Any, *path: Any) -> Any:
    """``figures[path[0]][path[1]]...`` (an int step indexes a list), or None where any
    step is missing: a benchmark cut short wrote only part of its figures, and its
    rows then say "not measured" instead of failing the page."""
    node: Any = figures
    for step in path:
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and -len(node) <= step < len(node):
            node = node[step]
        else:
            return None
    return node


def write_figures(path: str | Path, figures: Mapping[str, Any]) -> None:
    """What a benchmark calls at its end under ``--json PATH``."""
    payload = {"format": FIGURES_FORMAT, "figures": figures}
    Path(path).write_text(json.dumps(payload, indent=1, sort_keys=True, allow_nan=False)
                          + "\n")


def read_figures(path: str | Path) -> dict[str, Any]:
    payload = json.loads(Path(path).read_text())
    if not isinstance(payload, dict) or payload.get("format") != FIGURES_FORMAT:
        raise ValueError(f"{path}: not a figures file of format {FIGURES_FORMAT}")
    figures = payload["figures"]
    if not isinstance(figures, dict):
        raise ValueError(f"{path}: 'figures' is not an object")
    return figures


# -- rendering ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """What one run of an experiment gave the page: its rows and plots, or why none."""

    experiment: Experiment
    rows: Sequence[Row]
    plots: Sequence[Path] = ()
    seconds: float | None = None
    error: str | None = None
    #: the day it ran (ISO): a page re-run in part mixes days, and says which is which
    date: str | None = None


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ratio(ratio: float | None) -> str:
    if ratio is None:
        return "–"
    # two significant digits below 0.1: a 150x lower latency is 0.0065x, not 0.00x
    if abs(ratio) >= 100:
        return f"{ratio:.0f}×"
    return f"{ratio:.2f}×" if abs(ratio) >= 0.1 or ratio == 0 else f"{ratio:.2g}×"


def render_section(section: Section, results: Sequence[ExperimentResult],
                   page_dir: Path) -> str:
    ref = section.reference
    lines = [f"## {section.title}", "", f"Source: {section.source}", "", section.intro.strip(), ""]
    for result in results:
        exp = result.experiment
        took = ("" if result.seconds is None else f", {result.seconds:.0f} s") + (
            "" if result.date is None else f", run {result.date}")
        lines += [f"### {exp.title}", "",
                  f"`benchmarks/{exp.script}`{took}.", ""]
        if result.error:
            lines += [f"**Not measured:** {_cell(result.error)}", ""]
            continue
        lines += [f"| | {ref} setting | {ref} | Bastion setting | Bastion | ratio | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for row in result.rows:
            j = row.judgement
            lines.append(
                f'| <a id="{row.anchor}"></a>**{_cell(row.ref)}** {_cell(row.experiment)} '
                f"| {_cell(row.reference_setting)} | {_cell(row.reference_figure)} "
                f"| {_cell(row.bastion_setting)} | {_cell(row.bastion_figure)} "
                f"| {_ratio(row.ratio)} | **{j.verdict.value}**: {_cell(j.reason)} |")
        lines.append("")
        for plot in result.plots:
            rel = Path(plot).resolve().relative_to(page_dir.resolve())
            lines += [f"![{exp.title}]({rel.as_posix()})", ""]
    return "\n".join(lines)


def verdict_counts(results: Sequence[ExperimentResult]) -> dict[Verdict, int]:
    counts = {v: 0 for v in Verdict}
    for result in results:
        if result.error:
            counts[Verdict.NOT_MEASURED] += 1
        for row in result.rows:
            counts[row.judgement.verdict] += 1
    return counts


def verdicts_of(results: Sequence[ExperimentResult]) -> dict[str, str]:
    """Each row's verdict by its anchor (an experiment that did not finish has none)."""
    return {row.anchor: row.judgement.verdict.value for result in results
            for row in result.rows}


def verdict_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The rows whose verdict differs between two runs, as ``"anchor: before → after"``,
    in the order of ``after`` and then of the rows only ``before`` had. A row one run
    has and the other lacks is a change too ("–" for the missing side): an experiment
    that stopped early must not pass for a stable one."""
    changed = [f"{anchor}: {before.get(anchor, '–')} → {verdict}"
               for anchor, verdict in after.items() if before.get(anchor) != verdict]
    return changed + [f"{anchor}: {verdict} → –" for anchor, verdict in before.items()
                      if anchor not in after]


def check_anchors(sections: Sequence[tuple[Section, Sequence[ExperimentResult]]]) -> None:
    seen: set[str] = set()
    for _, results in sections:
        for result in results:
            for row in result.rows:
                if row.anchor in seen:
                    raise ValueError(f"row anchor {row.anchor!r} appears twice on the page")
                seen.add(row.anchor)
