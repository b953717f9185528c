"""Reproduce every paper's headline experiment and write ``docs/results.md``.

``make results`` runs this. Each section of the page is a module of
``benchmarks/experiments/`` (one per paper, and ``peers`` for the other engines) that
names its experiments: a benchmark script of ``benchmarks/``, its arguments at a size
that fits a 2-core machine, and how its figures become the page's rows
(`bastion.bench.results`). For each experiment this runs the script with ``--json``,
keeps its figures under ``docs/results/raw/``, draws its plots under
``docs/results/``, and finally writes the page.

    .venv/bin/python benchmarks/reproduce.py             # every experiment (~30 min)
    .venv/bin/python benchmarks/reproduce.py --quick     # each at its least size (~12 min)
    .venv/bin/python benchmarks/reproduce.py --only checkmate,cec.recovery
    .venv/bin/python benchmarks/reproduce.py --render-only   # the page from kept figures

An experiment that fails or overruns three times its budget is shown as *not measured*
with its error, and the script exits 1 once the page is written. Each run compares its
verdicts with those of the figures it replaces and names every row whose verdict
changed, on the page and in its output: the page's verdicts are meant not to move
between runs, and this is how a run shows they did not. The last line printed is the
verdict count.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bastion.bench import results as page  # noqa: E402

#: The page's sections, in the order they appear.
SECTIONS = ["checkmate", "dynamo", "suzhou", "chiron", "cec", "peers", "scaling"]
DOCS = ROOT / "docs"
PAGE = DOCS / "results.md"
ASSETS = DOCS / "results"
RAW = ASSETS / "raw"
RUN_FILE = RAW / "run.json"


def load_sections(names: list[str]) -> list[page.Section]:
    sections = []
    for name in names:
        try:
            module = importlib.import_module(f"experiments.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"experiments.{name}":
                raise
            continue  # a section not written yet is left off the page
        section = module.SECTION
        if section.key != name:
            raise ValueError(f"benchmarks/experiments/{name}.py names its section "
                             f"{section.key!r}")
        sections.append(section)
    return sections


def _raw_path(section: page.Section, exp: page.Experiment) -> Path:
    return RAW / f"{section.key}-{exp.key}.json"


def run_experiment(section: page.Section, exp: page.Experiment, *, quick: bool,
                   log_dir: Path) -> tuple[float, str | None]:
    """Runs the script; returns (seconds, error or None). Keeps its figures file."""
    args = list(exp.quick_args if quick else exp.args)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, str(HERE / exp.script), *args, "--json", str(out)]
        log = log_dir / f"{section.key}-{exp.key}.log"
        print(f"[{section.key}.{exp.key}] {' '.join(cmd[1:])}  (log: {log})", flush=True)
        start = time.monotonic()
        with open(log, "w") as sink:
            try:
                proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                      cwd=ROOT, timeout=3 * exp.budget_s)
            except subprocess.TimeoutExpired:
                return time.monotonic() - start, (
                    f"stopped after {3 * exp.budget_s:.0f} s (three times its budget)")
        seconds = time.monotonic() - start
        if proc.returncode != 0:
            tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
            return seconds, f"`{exp.script}` exited {proc.returncode}: {tail[0][:200]}"
        try:
            figures = page.read_figures(out)
        except (OSError, ValueError) as exc:
            return seconds, f"`{exp.script}` wrote no figures: {exc}"
        RAW.mkdir(parents=True, exist_ok=True)
        page.write_figures(_raw_path(section, exp), figures)
        return seconds, None


def collect(section: page.Section, exp: page.Experiment, run: dict,
            plot_dir: Path | None) -> page.ExperimentResult:
    """The page's rows and plots for one experiment, from its kept figures.

    Plots are drawn into ``plot_dir`` (the tests draw into a temporary one; None draws
    none) and linked from the page as files of ``docs/results/``.
    """
    entry = run.get("experiments", {}).get(f"{section.key}.{exp.key}", {})
    seconds, error, date = entry.get("seconds"), entry.get("error"), entry.get("date")
    if error:
        return page.ExperimentResult(exp, rows=(), seconds=seconds, error=error, date=date)
    path = _raw_path(section, exp)
    if not path.exists():
        return page.ExperimentResult(exp, rows=(), error="not run yet (`make results`)")
    figures = page.read_figures(path)
    rows = exp.rows(figures)
    plots: list[Path] = []
    if exp.plot is not None and plot_dir is not None:
        import matplotlib

        matplotlib.use("Agg")
        plot_dir.mkdir(parents=True, exist_ok=True)
        plots = [ASSETS / Path(p).name for p in exp.plot(figures, plot_dir)]
    return page.ExperimentResult(exp, rows=rows, plots=plots, seconds=seconds, date=date)


def verdicts(chosen: list[tuple[page.Section, page.Experiment]], run: dict) -> dict[str, str]:
    """The verdict of each row of the ``chosen`` experiments, from their kept figures."""
    return page.verdicts_of([collect(s, e, run, None) for s, e in chosen])


def previous_runs(chosen: list[tuple[page.Section, page.Experiment]], run: dict) -> list[dict]:
    """When and how (full or quick) the ``chosen`` experiments' kept figures were made:
    each experiment's own entry, or the header of the whole run for entries older than
    this field."""
    entries = run.get("experiments", {})
    made = []
    for section, exp in chosen:
        entry = entries.get(f"{section.key}.{exp.key}")
        if entry is None:
            continue
        one = {"date": entry.get("date", run.get("date")),
               "quick": entry.get("quick", run.get("quick"))}
        if one not in made:
            made.append(one)
    return made


def compare(before: dict[str, str], after: dict[str, str], previous: list[dict]) -> dict:
    """What ``run.json`` keeps of a run's verdicts against the runs before: the rows
    compared, the changes (`page.verdict_changes`) and which runs made the figures
    replaced (`previous_runs`)."""
    return {"rows": len(after), "changed": page.verdict_changes(before, after),
            "previous": previous}


def _comparison_line(compared: dict) -> str:
    previous = compared["previous"]
    if not previous:
        return "No earlier run to compare the verdicts with."
    runs = ", ".join(f"{'quick pass' if p.get('quick') else 'full run'} of {p.get('date')}"
                     for p in previous)
    against = f"Against the figures of the run before ({runs}): "
    changed = compared["changed"]
    if not changed:
        return against + (f"the {compared['rows']} verdicts of the experiments run again "
                          "are unchanged.")
    return against + (f"{len(changed)} of the {compared['rows']} verdicts changed: "
                      + "; ".join(changed) + ".")


def render(sections: list[page.Section], run: dict,
           plot_dir: Path = ASSETS) -> tuple[str, dict]:
    collected = [(s, [collect(s, e, run, plot_dir) for e in s.experiments])
                 for s in sections]
    page.check_anchors(collected)
    everything = [r for _, results in collected for r in results]
    counts = page.verdict_counts(everything)
    summary = ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
    mode = "quick pass (`--quick`)" if run.get("quick") else "full run"
    header = [
        "# Results: the papers' experiments, and the engines a user would pick instead",
        "",
        "<!-- Written by `make results` (benchmarks/reproduce.py). Do not edit by hand. -->",
        "",
        f"Generated {run.get('date', '?')} by `make results`, {mode}, in "
        f"{run.get('seconds', 0) / 60:.0f} min on {run.get('machine', '?')}.",
        "",
        "Every row puts a paper's figure (or a peer engine's, measured in the same run) "
        "beside Bastion's, at a setting scaled to this machine, with the ratio and a "
        "verdict computed from them: *reproduced* when the ratio lies within the noise "
        "band the row states, *better* or *worse* beyond it, *not comparable* with the "
        "reason, *not measured* when the experiment did not finish. Figures move "
        "between runs on a shared machine; each band states the noise measured for its "
        "row, and the line below names every verdict that moved against the run before "
        "(a figure within its own noise of a band's edge can).",
        "",
        f"Verdicts: {summary}.",
        "",
    ]
    rerun = rerun_since(run)
    if rerun:
        header += [f"Run again alone since then: {rerun}.", ""]
    if "compared" in run:
        header += [_comparison_line(run["compared"]), ""]
    body = [page.render_section(s, results, DOCS) for s, results in collected]
    return "\n".join(header + body).rstrip() + "\n", counts


def rerun_since(run: dict) -> str:
    """The experiments run alone (``--only``) after the whole run the header dates,
    with their days, oldest first: a reader must not take their figures for the
    header's day. Empty if none."""
    since = sorted((entry["date"], key) for key, entry in run.get("experiments", {}).items()
                   if entry.get("date") and entry["date"] != run.get("date"))
    return ", ".join(f"{key} ({date})" for date, key in since)


def machine() -> str:
    return f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="each experiment at its least meaningful size (~12 min)")
    parser.add_argument("--only", default="",
                        help="comma-separated sections or section.experiment keys")
    parser.add_argument("--render-only", action="store_true",
                        help="write the page from the figures kept under docs/results/raw")
    parser.add_argument("--logs", default=None,
                        help="where the scripts' output goes (default: a temporary directory)")
    args = parser.parse_args()

    sections = load_sections(SECTIONS)
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    known = {s.key for s in sections} | {f"{s.key}.{e.key}" for s in sections
                                        for e in s.experiments}
    if wanted - known:
        parser.error(f"--only: unknown {sorted(wanted - known)}; known: {sorted(known)}")

    run = json.loads(RUN_FILE.read_text()) if RUN_FILE.exists() else {}
    chosen = [(s, e) for s in sections for e in s.experiments
              if not wanted or s.key in wanted or f"{s.key}.{e.key}" in wanted]
    if not args.render_only:
        # the verdicts of the figures this run replaces, to say which ones moved
        before, previous = verdicts(chosen, run), previous_runs(chosen, run)
        log_dir = Path(args.logs or tempfile.mkdtemp(prefix="bastion-results-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        entries = run.setdefault("experiments", {})
        for section, exp in chosen:
            key = f"{section.key}.{exp.key}"
            seconds, error = run_experiment(section, exp, quick=args.quick, log_dir=log_dir)
            entries[key] = {"seconds": round(seconds, 1), "error": error, "quick": args.quick,
                            "date": datetime.date.today().isoformat()}
            print(f"[{key}] {'FAILED: ' + error if error else 'done'} in {seconds:.0f} s",
                  flush=True)
        if not wanted:  # a partial run keeps the header of the last whole one
            run.update(quick=args.quick, seconds=round(time.monotonic() - started),
                       date=datetime.date.today().isoformat(), machine=machine())
        run["compared"] = compare(before, verdicts(chosen, run), previous)
        RAW.mkdir(parents=True, exist_ok=True)
        RUN_FILE.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")

    text, counts = render(sections, run)
    PAGE.write_text(text)
    failed = [k for k, e in run.get("experiments", {}).items() if e.get("error")]
    print(f"wrote {PAGE.relative_to(ROOT)}")
    if "compared" in run:
        print(_comparison_line(run["compared"]))
    print("verdicts: " + ", ".join(f"{n} {v.value}" for v, n in counts.items() if n))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
