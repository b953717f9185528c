"""Drill reports as one self-contained HTML page.

The page is what a drill leaves behind as evidence, so it must survive being mailed,
attached to a ticket or archived: one file, no neighbours. Plots are rendered with
matplotlib into PNG bytes and embedded as base64 ``data:`` URIs; the style sheet is
inline. The page records what is needed to reproduce and to trust the run: the
verdict and how it was verified (``deterministic`` or ``ids``), the seed, the date,
the job ids of the reference and faulty runs, every fault with its detection,
restart and recovery, the checkpoint statistics, what was not compared because two
failure-free runs disagreed on it (a map that reads the clock), and the first lost,
duplicated and corrupted records with their lineage ids.

Each plot marks the faults (red), their detection (orange) and the restart from the
recovery line (green), so a reader sees how long the job was down and how long it
took to catch up. The recovery figures are the drill's own
(`bastion.runtime.recovery_times`); the job master's per failure, in the checkpoint
table, are the same definitions measured from the same failure. A run with several queries (`Topology.query`) also gets Su & Zhou's
two plots: each query's latency relative to its failure-free latency, and how many
queries were available over time; a drill of several recoveries of one scenario
(``bastion drill --scenario correlated``) adds a table comparing them.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

_MARKS = {"fault": ("red", "fault"), "failure_detected": ("orange", "detected"),
          "restarted": ("green", "restarted")}
_VERDICT_COLOURS = {"exactly-once": "#1b7f3b", "at-least-once": "#1b7f3b",
                    "violated": "#b3261e",
                    "inconclusive": "#9a6700"}


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(figsize=(8, 3))


def _png(plt: Any, fig: Any) -> bytes:
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _plot_png(report: Any, field: str, ylabel: str) -> bytes:
    """A time series of the faulty run's timeline as PNG bytes, events marked."""
    plt, (fig, ax) = _figure()
    points = report.timeline
    xs, ys = [], []
    for prev, cur in zip(points, points[1:]):
        value = cur.get(field)
        if cur["t_s"] - prev["t_s"] > 0.5:  # nothing was measured: the job was down
            xs += [prev["t_s"] + 0.05, cur["t_s"] - 0.05]
            ys += [0, 0]
        if value is None:
            continue
        if field == "sink_records":
            value = value / max(cur["t_s"] - prev["t_s"], 1e-6)
        xs.append(cur["t_s"])
        ys.append(value)
    ax.plot(xs, ys, linewidth=1.2)
    labelled = set()
    for event in report.events:
        mark = _MARKS.get(event["kind"])
        if mark:
            colour, label = mark
            ax.axvline(event["t_s"], color=colour, linestyle="--", linewidth=1,
                       label=None if label in labelled else label)
            labelled.add(label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(ylabel)
    if labelled:
        ax.legend(loc="upper right", fontsize="small")
    return _png(plt, fig)


def _queries_png(queries: dict[str, dict[str, Any]], events: list[dict[str, Any]]) -> bytes:
    """Each query's relative latency over time (log scale), the 1.2 line marked."""
    plt, (fig, ax) = _figure()
    for name, q in queries.items():
        xs: list[float] = []
        ys: list[float] = []
        for t, n, rel in q["timeline"]:
            if n > 0 and rel is not None:
                if xs and t - xs[-1] > 0.5:  # no output meanwhile: a gap, not a line
                    xs.append(float("nan"))
                    ys.append(float("nan"))
                xs.append(t)
                ys.append(rel)
        ax.plot(xs, ys, linewidth=1.2, label=f"{name} (priority {q['priority']:g})")
    ax.axhline(1.2, color="grey", linestyle=":", linewidth=1, label="available (1.2)")
    for event in events:
        if event["kind"] in ("fault", "node_added"):
            ax.axvline(event["t_s"], color="red" if event["kind"] == "fault" else "green",
                       linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start (red: faults, green: nodes added)")
    ax.set_ylabel("relative latency")
    ax.legend(loc="upper right", fontsize="small")
    return _png(plt, fig)


def available_over_time(queries: dict[str, dict[str, Any]], failed_at_s: float | None
                        ) -> list[tuple[float, int]]:
    """How many queries were available at each progress point: before the failure
    every query, after it those already available again."""
    times = sorted({t for q in queries.values() for t, _, _ in q["timeline"]})
    counted = []
    for t in times:
        if failed_at_s is None or t < failed_at_s:
            counted.append((t, len(queries)))
            continue
        counted.append((t, sum(q["available_again_s"] is not None
                               and t >= failed_at_s + q["available_again_s"]
                               for q in queries.values())))
    return counted


def _available_png(runs: dict[str, Any]) -> bytes:
    """Available queries over time, one line per run (a recovery planner)."""
    plt, (fig, ax) = _figure()
    for label, report in runs.items():
        failed = next((e["t_s"] for e in report.events if e["kind"] == "failure_detected"),
                      None)
        counts = available_over_time(report.metrics.extra["queries"], failed)
        ax.step([t for t, _ in counts], [n for _, n in counts], where="post", label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("available queries")
    ax.legend(loc="lower right", fontsize="small")
    return _png(plt, fig)


def _queries_section(report: Any, compared: dict[str, Any] | None) -> str:
    queries = (getattr(report.metrics, "extra", None) or {}).get("queries") or {}
    if len(queries) < 2 and not compared:
        return ""
    rows = [(name, f"{q['priority']:g}", _ms(None if q["baseline_latency_ms"] is None
                                              else q["baseline_latency_ms"] / 1000),
             _secs(q["available_again_s"]),
             "-" if q["max_relative_latency"] is None else f"{q['max_relative_latency']:.2f}",
             _secs(q["longest_silence_s"]))
            for name, q in sorted(queries.items(), key=lambda kv: -kv[1]["priority"])]
    section = ("<h2>Queries</h2>" + _table(rows, (
        "query", "priority", "failure-free latency", "available again after",
        "max relative latency", "longest silence"))
        + _img(_queries_png(queries, report.events), "relative latency per query"))
    runs = {"this run": report, **(compared or {})}
    section += _img(_available_png(runs), "available queries over time")
    if compared:
        names = sorted(queries, key=lambda n: -queries[n]["priority"])
        table = [(label, r.verdict, *[_secs(r.metrics.extra["queries"][n]["available_again_s"])
                                      for n in names])
                 for label, r in runs.items()]
        section += "<h3>Recoveries compared</h3>" + _table(
            table, ("run", "verdict", *[f"{n} available after" for n in names]))
    return section


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _table(rows: list[tuple[Any, ...]], header: tuple[str, ...] | None = None) -> str:
    def cells(row: tuple[Any, ...], tag: str) -> str:
        return "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in row)

    head = f"<tr>{cells(header, 'th')}</tr>" if header else ""
    body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows)
    return f"<table>{head}{body}</table>"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def render_html(report: Any, title: str = "Bastion recovery drill",
                compared: dict[str, Any] | None = None) -> str:
    """The drill report as one HTML document (plots embedded); ``compared``: other
    drills of the same scenario, by label, for the query comparison."""
    c = report.comparison
    verdict = report.verdict
    runs = [("date (UTC)", report.date), ("seed", "-" if report.seed is None else report.seed),
            ("faulty run", report.job_id)]
    runs += [(f"reference run {i}", job) for i, job in enumerate(report.reference_job_ids, 1)]
    summary = [
        ("topology", report.topology), ("protocol", report.protocol),
        ("verified by", report.verified_by), ("how", report.verification()),
        ("committed records", f"{sum(map(len, report.outputs.values())):,} "
                              f"(reference {c.reference_records:,})"),
        ("lost", f"{c.lost:,}"), ("duplicated", f"{c.duplicated:,}"),
        ("corrupted", f"{c.corrupted:,}"),
    ]
    if report.not_reproduced:
        summary.append(("not compared", report.not_compared()))
    faults = [(f.what, _secs(f.scheduled_s), "yes" if f.landed else "NO",
               ", ".join(f.killed) or "-", _secs(f.detection_s), _secs(f.restart_s),
               _secs(f.recovery_s), _secs(f.trt_s), ", ".join(f.restarted_tasks) or "-",
               f.note or "")
              for f in report.faults]
    proto = getattr(report.metrics, "protocol", None)
    checkpoints = []
    if proto is not None:
        checkpoints = [
            ("completed", proto.checkpoints_completed), ("aborted", proto.checkpoints_aborted),
            ("forced", proto.forced_checkpoints),
            ("duration avg", _ms(proto.checkpoint_duration_s_avg)),
            ("duration max", _ms(proto.checkpoint_duration_s_max)),
            ("invalid", f"{proto.invalid_checkpoints} ({proto.invalid_share:.0%})"),
            ("message overhead", f"{proto.message_overhead:.2%}"),
            ("in-flight log bytes", f"{proto.log_bytes:,}"),
            ("state bytes (last)", "-" if proto.state_bytes_last is None
             else f"{proto.state_bytes_last:,}"),
        ]
        checkpoints += [(f"failure {i}", f"{f.reason}: restart {_secs(f.restart_s)}, "
                         f"recovery {_secs(f.recovery_s)}, total recovery {_secs(f.trt_s)}, "
                         f"recovery line {f.recovery_line}, "
                         f"restarted {len(f.restarted_tasks)} operator instance(s)")
                        for i, f in enumerate(proto.failures, 1)]
    violations = ""
    for kind, total, items in (("lost", c.lost, report.lost_examples),
                               ("duplicated", c.duplicated, report.duplicated_examples),
                               ("corrupted", c.corrupted, report.corrupted_examples)):
        if items:
            rows: list[tuple[Any, ...]] = [(v.sink, report.format_id(v.record_id),
                     "(none)" if v.unexpected else repr(v.expected),
                     ", ".join(map(repr, v.got)) or "(not committed)") for v in items]
            violations += (f"<h2>First {len(items)} of {total:,} {kind} records</h2>"
                           + _table(rows, ("sink", "lineage id", "reference value",
                                           "committed values")))
    not_compared = ""
    if report.not_reproduced:
        rows = [(n.sink, n.operator, n.what, ", ".join(n.suspects),
                 report.format_id(n.record_id), ", ".join(map(repr, n.first)) or "(none)",
                 ", ".join(map(repr, n.second)) or "(none)") for n in report.not_reproduced]
        not_compared = (
            "<h2>Not compared: not reproducible between two failure-free runs</h2>"
            "<p>The two failure-free reference runs disagreed here, so the faulty run's "
            "values (records: which records exist) are not held against it. Lost and "
            "duplicated records are still found where only values differed; duplicates "
            "where records differed.</p>"
            + _table(rows, ("sink", "made by", "what", "from", "example id",
                            "reference 1", "reference 2")))
    colour = _VERDICT_COLOURS[verdict]
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body{{font-family:sans-serif;margin:2em;max-width:70em}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}
th,td{{text-align:left;padding:.2em 1em .2em 0;vertical-align:top}}
tr+tr td{{border-top:1px solid #ddd}}
.verdict{{color:#fff;background:{colour};padding:.6em 1em;border-radius:4px}}
</style>
</head><body><h1>{html.escape(title)}</h1>
<p class="verdict"><b>{html.escape(verdict)}</b>: {html.escape(report.verdict_reason)}</p>
<h2>Summary</h2>{_table(summary)}
<p>What each figure means: docs/metrics.md in Bastion's source (detection and
restart are phases; recovery and total recovery count from the fault).</p>
<h2>Runs</h2>{_table(runs)}
<h2>Faults</h2>{_table(faults, ("fault", "due", "landed", "killed", "detection", "restart",
                                 "recovery", "total recovery", "restarted", "note"))
                if faults else "<p>none scheduled</p>"}
<h2>Checkpoints</h2>{_table(checkpoints) if checkpoints else "<p>-</p>"}
{not_compared}
{violations}
<h2>Throughput</h2>{_img(_plot_png(report, "sink_records", "sink records / s"),
                          "throughput over time")}
<h2>Latency</h2>{_img(_plot_png(report, "latency_p99_ms", "latency p99 (ms)"),
                       "latency p99 over time")}
{_queries_section(report, compared)}
</body></html>
"""


def write_html(report: Any, path: str | Path, title: str = "Bastion recovery drill",
               compared: dict[str, Any] | None = None) -> Path:
    """Write the drill report to ``path``: one HTML file, nothing beside it."""
    page = Path(path)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render_html(report, title, compared), encoding="utf-8")
    return page


__all__ = ["render_html", "write_html"]
