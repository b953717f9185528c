"""`bn.tune`: pick the checkpoint interval for a bound on total recovery time.

A user who runs a checkpointing protocol has to choose how often to checkpoint. Too
often costs latency all the time; too rarely costs time after every failure, when
everything read since the last checkpoint is read again and the backlog that piled
up meanwhile has to be caught up. ``bn.tune`` chooses from measurements (Chiron; the
model and its equations are in `bastion.scheduler.tuning`):

1. *profiling*: the topology runs once per checkpoint interval of an evenly spaced
   grid between ``min_interval_s`` and ``max_interval_s``, on the same input, each
   with ``failures_per_run`` injected kills (three, as in the paper; each recovery
   completes before the next kill, and each kill is measured on its own), plus once
   with its sources unthrottled (the most it can take). Copies run side by side
   (``parallel``) when the cluster has room;
2. *modelling*: the total recovery time (TRT) of every interval in its best, average
   and worst case, from the medians over its kills, and second-order fits of TRT and
   of latency against the interval;
3. *optimising*: the interval with the least fitted latency whose ``case`` TRT
   (``"max"`` by default: the worst case) stays under ``trt_bound_s`` — or a plain
   statement that none in the range does.

``tune`` returns a frozen `TuningResult`; `write_html` draws its fitted curves, the
measured points and the bound as an HTML page with inline SVG (no network assets)::

    result = bn.tune(topo, trt_bound_s=10, min_interval_s=0.5, max_interval_s=8, points=6)
    result.interval_s, result.trt_s, result.latency_ms
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from bastion.scheduler.tuning import (CASES, DEFAULT_STOP_TERM_S, Capacity, Case, Choice,
                                      Measurement, Model, Profiler, RayProfiler, build_model,
                                      grid, optimise, profile_all, room_for_copies)

if TYPE_CHECKING:
    from bastion.topology import Topology

#: The range ``checkpoint_interval="auto"`` (``bastion run --checkpoint-interval auto``)
#: tunes over, and its grid (`bastion tune` and `tune` take their own).
AUTO_MIN_INTERVAL_S, AUTO_MAX_INTERVAL_S, AUTO_POINTS = 0.5, 8.0, 6
#: ... with intervals up to this share of the run's length: a longer one completes too
#: few checkpoints in the run to be worth having (8 s was once chosen for a 6.7-s job)
AUTO_MAX_INTERVAL_SHARE = 0.25


def auto_range(topology: "Topology", duration_s: float | None = None) -> tuple[float, float]:
    """The (min, max) interval ``checkpoint_interval="auto"`` tunes over for a run of
    ``topology`` lasting ``duration_s`` (default: as long as its paced input). A
    ValueError when the run is too short to tune."""
    from bastion.scheduler.tuning import expected_run_s

    length_s = duration_s or expected_run_s(topology)
    if length_s is None:
        return AUTO_MIN_INTERVAL_S, AUTO_MAX_INTERVAL_S
    max_interval_s = min(AUTO_MAX_INTERVAL_S, AUTO_MAX_INTERVAL_SHARE * length_s)
    if max_interval_s < 2 * AUTO_MIN_INTERVAL_S:
        raise ValueError(f"the job reads its input in {length_s:.1f} s, too short to tune "
                         f"(an interval must be at most {AUTO_MAX_INTERVAL_SHARE:.0%} of "
                         f"it, and the shortest tuned is {AUTO_MIN_INTERVAL_S:g} s)")
    return AUTO_MIN_INTERVAL_S, max_interval_s


@dataclass(frozen=True)
class TuningResult:
    """What `tune` found. ``interval_s`` is None when no interval in the range meets
    the bound (``reason`` says so); ``trt_s`` is the predicted (min, avg, max) total
    recovery time at the chosen interval and ``latency_ms`` its predicted average
    latency."""

    interval_s: float | None
    trt_s: tuple[float, float, float] | None
    latency_ms: float | None
    trt_bound_s: float
    case: str
    reason: str
    measurements: tuple[Measurement, ...]
    capacity: Capacity
    model: Model
    parallel: int = 1

    @property
    def meets_bound(self) -> bool:
        return self.interval_s is not None

    def rows(self) -> list[tuple[str, ...]]:
        """One row per profiled interval: what was measured and the TRT estimate."""
        rows = []
        for p in self.model.points:
            m = p.measurement
            rows.append((f"{m.interval_s:.2f}", f"{m.ingest_avg_per_s:,.0f}",
                         f"{m.latency_avg_ms:.1f}", f"{m.detection_s:.2f}",
                         f"{m.restart_s:.2f}", f"{p.utilisation:.2f}",
                         f"{p.trt.min_s:.2f}", f"{p.trt.avg_s:.2f}", f"{p.trt.max_s:.2f}",
                         "-" if m.measured_trt_s is None else f"{m.measured_trt_s:.2f}"))
        return rows

    HEADER = ("interval s", "I_avg/s", "L_avg ms", "T s", "R s", "U", "TRT min",
              "TRT avg", "TRT max", "TRT seen")

    def fits(self) -> str:
        """The R² of each fit, in one line (``-``: the points did not spread)."""
        def r2(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        model = self.model
        return (f"fits R²: latency {r2(model.latency_r2)}, TRT min/avg/max "
                + "/".join(r2(model.trt_r2.get(c)) for c in CASES))


def tune(topology: "Topology", *, trt_bound_s: float, min_interval_s: float = 0.5,
         max_interval_s: float = 8.0, points: int = 6, repeats: int = 1,
         failures_per_run: int = 3, case: Case = "max",
         protocol: str = "coordinated", parallel: int = 1, duration_s: float | None = None,
         kill_between_s: tuple[float, float] | None = None, max_rate_run_s: float = 4.0,
         stop_term_s: float = DEFAULT_STOP_TERM_S, seed: int = 0,
         progress: Callable[[dict[str, Any]], None] | None = None,
         profiler: Profiler | None = None, keep_profiles: bool = False,
         **run_options: Any) -> TuningResult:
    """Profile ``topology`` at ``points`` checkpoint intervals from ``min_interval_s``
    to ``max_interval_s``, model its TRT and latency, and choose the interval.

    ``repeats``: profiling runs per interval, and ``failures_per_run``: kills in each
    (the paper injects three), each recovery complete before the next kill (a bounded
    input too short for that is read for longer; a ``duration_s`` too short is
    refused, naming the length needed; `RayProfiler`); every kill is one measurement,
    and the medians over an interval's kills and repeats are modelled (the paper ran
    five runs). ``failures_per_run=1`` is one kill per run, in ``kill_between_s``.
    ``case`` is the TRT the bound applies to: ``"max"`` (worst case, the default),
    ``"avg"`` or ``"min"``. ``parallel``: profiling runs side by side, as many as the
    cluster's CPUs hold (1: one after the other). ``duration_s``: seconds per run for
    an unbounded topology. ``kill_between_s``: when the injected kill may fall
    (default: the middle fifth of a run, moved after the first checkpoint of the
    longest interval as far as 80% of the run allows; with several kills, the window
    they are spread over). ``max_rate_run_s``: the unthrottled run's
    length. ``progress`` gets ``{"done", "total", "what"}`` after every run. Other
    keyword arguments go to every `bastion.run` (``storage``, ``heartbeat_timeout_s``,
    ``address``, ...). ``profiler`` replaces the Ray profiler (what it measures is
    modelled the same way). The profiling jobs are deleted from the store once
    measured (about 100 MB for a default tuning), unless ``keep_profiles``: the
    result's job ids then name folders that still exist."""
    if trt_bound_s is None or trt_bound_s <= 0:
        raise ValueError(f"trt_bound_s must be > 0 seconds, got {trt_bound_s}")
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    if (isinstance(failures_per_run, bool) or not isinstance(failures_per_run, int)
            or failures_per_run < 1):
        raise ValueError(f"failures_per_run must be an int >= 1 (kills per profiling run), "
                         f"got {failures_per_run!r}")
    if protocol in ("none", "acks"):
        raise ValueError(f"protocol={protocol!r} takes no checkpoints: tuning the "
                         "checkpoint interval needs a checkpointing protocol, e.g. "
                         "'coordinated'")
    for name in ("checkpoint_interval", "faults"):
        if name in run_options:
            raise ValueError(f"{name} is chosen by tune for each profiling run: do not "
                             "pass it")
    intervals = grid(min_interval_s, max_interval_s, points)
    if profiler is None:
        profiler = RayProfiler(topology, protocol=protocol, duration_s=duration_s,
                               kill_between_s=kill_between_s, max_rate_run_s=max_rate_run_s,
                               capacity_interval_s=intervals[len(intervals) // 2],
                               first_kill_after_s=max_interval_s,
                               seed=seed, run_options=dict(run_options),
                               failures_per_run=failures_per_run)
        if parallel > 1:
            parallel = room_for_copies(topology, run_options, parallel)
    capacity, measurements = profile_all(profiler, intervals, parallel=parallel,
                                         repeats=repeats, progress=progress)
    if isinstance(profiler, RayProfiler) and not keep_profiles:
        _delete_profiles(run_options.get("storage"),
                         [capacity.job_id, *(m.job_id for m in measurements)])
    model = build_model(measurements, capacity, stop_term_s)
    choice: Choice = optimise(model, trt_bound_s, min_interval_s, max_interval_s, case)
    return TuningResult(
        interval_s=choice.interval_s,
        trt_s=None if choice.trt is None else (choice.trt.min_s, choice.trt.avg_s,
                                               choice.trt.max_s),
        latency_ms=choice.latency_ms, trt_bound_s=trt_bound_s, case=case,
        reason=choice.reason, measurements=tuple(measurements), capacity=capacity,
        model=model, parallel=parallel)


def _delete_profiles(storage: str | None, job_ids: list[str]) -> None:
    """Delete the profiling jobs (a measurement of repeated runs names them all,
    space-separated) from ``storage`` (None: `bastion.run`'s default)."""
    import inspect

    from bastion.launcher import run
    from bastion.storage import delete_job, open_store

    store = open_store(storage or inspect.signature(run).parameters["storage"].default)
    for job_id in {j for ids in job_ids for j in ids.split()}:
        delete_job(store, job_id)


# -- the HTML page ----------------------------------------------------------------------------

_W, _H, _PAD = 560, 320, 48
_COLOURS = {"min": "#2a9d8f", "avg": "#e9c46a", "max": "#e76f51", "latency": "#264653",
            "observed": "#000000"}


def _chart(title: str, xs_range: tuple[float, float], curves: dict[str, Callable[[float], float]],
           dots: dict[str, list[tuple[float, float]]], y_label: str,
           hline: tuple[float, str] | None = None, vline: float | None = None) -> str:
    lo, hi = xs_range
    if hi <= lo:
        hi = lo + 1.0
    samples = [lo + (hi - lo) * i / 100 for i in range(101)]
    values = [f(x) for f in curves.values() for x in samples]
    values += [y for pts in dots.values() for _, y in pts]
    if hline is not None:
        values.append(hline[0])
    y_lo, y_hi = min(values + [0.0]), max(values)
    if y_hi <= y_lo:
        y_hi = y_lo + 1.0
    y_hi += 0.05 * (y_hi - y_lo)

    def px(x: float) -> float:
        return _PAD + (x - lo) / (hi - lo) * (_W - 2 * _PAD)

    def py(y: float) -> float:
        return _H - _PAD - (y - y_lo) / (y_hi - y_lo) * (_H - 2 * _PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
             f'role="img" aria-label="{html.escape(title)}">',
             f'<text x="{_W / 2}" y="18" text-anchor="middle" font-weight="bold">'
             f'{html.escape(title)}</text>',
             f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#000"/>',
             f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#000"/>',
             f'<text x="{_W / 2}" y="{_H - 10}" text-anchor="middle">checkpoint interval (s)</text>',
             f'<text x="14" y="{_H / 2}" transform="rotate(-90 14 {_H / 2})" '
             f'text-anchor="middle">{html.escape(y_label)}</text>']
    for i in range(5):
        x = lo + (hi - lo) * i / 4
        y = y_lo + (y_hi - y_lo) * i / 4
        parts.append(f'<text x="{px(x):.1f}" y="{_H - _PAD + 16}" text-anchor="middle" '
                     f'font-size="11">{x:.2f}</text>')
        parts.append(f'<text x="{_PAD - 4}" y="{py(y) + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{y:.1f}</text>')
    for name, f in curves.items():
        path = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(f(x)):.1f}"
                        for i, x in enumerate(samples))
        parts.append(f'<path d="{path}" fill="none" stroke="{_COLOURS[name]}" '
                     f'stroke-width="2"><title>{html.escape(name)} fit</title></path>')
    for name, pts in dots.items():
        for x, y in pts:
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" '
                         f'fill="{_COLOURS[name]}"><title>{name}: {x:.2f} s, '
                         f'{y:.2f}</title></circle>')
    if hline is not None:
        parts.append(f'<line x1="{_PAD}" y1="{py(hline[0]):.1f}" x2="{_W - _PAD}" '
                     f'y2="{py(hline[0]):.1f}" stroke="#c00" stroke-dasharray="6 4"/>'
                     f'<text x="{_W - _PAD}" y="{py(hline[0]) - 4:.1f}" text-anchor="end" '
                     f'fill="#c00" font-size="12">{html.escape(hline[1])}</text>')
    if vline is not None:
        parts.append(f'<line x1="{px(vline):.1f}" y1="{_PAD}" x2="{px(vline):.1f}" '
                     f'y2="{_H - _PAD}" stroke="#555" stroke-dasharray="2 3"/>'
                     f'<text x="{px(vline) + 4:.1f}" y="{_PAD + 12}" font-size="12">'
                     f'chosen {vline:.2f} s</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(result: TuningResult, title: str = "checkpoint-interval tuning") -> str:
    """A self-contained page: the decision, the TRT and latency fits with the
    measured points and the bound, and the table of measurements."""
    model = result.model
    xs = [p.measurement.interval_s for p in model.points]
    span = (min(xs), max(xs))
    trt_chart = _chart(
        "total recovery time (predicted)", span,
        {c: model.trt_fits[c] for c in CASES},
        {**{c: [(p.measurement.interval_s, p.trt.of(c)) for p in model.points] for c in CASES},
         "observed": [(m.interval_s, m.measured_trt_s) for m in result.measurements
                      if m.measured_trt_s is not None]},
        "TRT (s)", hline=(result.trt_bound_s, f"bound {result.trt_bound_s:g} s"),
        vline=result.interval_s)
    latency_chart = _chart(
        "average end-to-end latency", span, {"latency": model.latency_fit},
        {"latency": [(p.measurement.interval_s, p.measurement.latency_avg_ms)
                     for p in model.points]}, "L_avg (ms)", vline=result.interval_s)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TuningResult.HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in result.rows())
    legend = " ".join(f'<span style="color:{_COLOURS[c]}">&#9632; TRT {c}</span>'
                      for c in CASES) + (' <span>&#9679; TRT observed in a profiling run '
                                         '(kill to caught up)</span>')
    cap = result.capacity
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
.verdict{{font-size:1.2em;padding:.5em;background:{'#e8f5e9' if result.meets_bound else '#fdecea'}}}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="verdict">{html.escape(result.reason)}</p>
<p>Bound: {result.case} TRT &le; {result.trt_bound_s:g} s. I_max {cap.ingest_max_per_s:,.0f}
records/s unthrottled, {model.catch_up_per_s:,.0f} records/s as the recoveries read their
backlog (the rate the model uses), warm-up W best/average/worst {"/".join(f"{w:.2f}" for w in model.warmup_s)} s
(cold start {cap.warmup_s:.2f} s). {html.escape(result.fits())}. {legend}</p>
{trt_chart}
{latency_chart}
<h2>Measurements</h2>
<table><tr>{head}</tr>{body}</table>
</body></html>
"""


def write_html(result: TuningResult, path: str | Path, title: str = "checkpoint-interval tuning"
               ) -> Path:
    """Write `render_html` to ``path`` and return it."""
    out = Path(path)
    out.write_text(render_html(result, title), encoding="utf-8")
    return out
