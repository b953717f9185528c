"""Drill reports as HTML: a summary table and throughput/latency plots over time.

Each plot marks the drill's faults (red), their detection (orange) and the restart
from the recovery line (green), so a reader sees at a glance how long the job was
down and how long it took to catch up. Plots are PNG files next to the HTML page.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

_MARKS = {"fault": ("red", "fault"), "failure_detected": ("orange", "detected"),
          "restarted": ("green", "restarted")}


def _plot(report: Any, field: str, ylabel: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report.timeline
    fig, ax = plt.subplots(figsize=(8, 3))
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
            color, label = mark
            ax.axvline(event["t_s"], color=color, linestyle="--", linewidth=1,
                       label=None if label in labelled else label)
            labelled.add(label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(ylabel)
    if labelled:
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_html(report: Any, path: str | Path, title: str = "Bastion recovery drill") -> Path:
    """Write the drill report to ``path`` (HTML) with its plots beside it."""
    page = Path(path)
    page.parent.mkdir(parents=True, exist_ok=True)
    throughput_png = page.with_name(page.stem + "-throughput.png")
    latency_png = page.with_name(page.stem + "-latency.png")
    _plot(report, "sink_records", "sink records / s", throughput_png)
    _plot(report, "latency_p99_ms", "latency p99 (ms)", latency_png)
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in report.summary_rows())
    examples = ""
    for name, items in (("lost", report.lost_examples),
                        ("duplicated", report.duplicated_examples)):
        if items:
            examples += f"<h2>First {name} records</h2><ul>" + "".join(
                f"<li>{html.escape(str(sink))}: {html.escape(repr(v))}</li>"
                for sink, v in items) + "</ul>"
    page.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}th{{text-align:left;padding-right:2em}}</style>
</head><body><h1>{html.escape(title)}</h1>
<table>{rows}</table>{examples}
<h2>Throughput</h2><img src="{throughput_png.name}" alt="throughput over time">
<h2>Latency</h2><img src="{latency_png.name}" alt="latency p99 over time">
</body></html>
""", encoding="utf-8")
    return page
