"""The scaling section's verdicts (`benchmarks/experiments/scaling.py`) can say "worse".

``growth_rows`` gets the figures of a run that bears out `docs/scaling.md`'s claims and
of deliberately broken ones, in the shape ``benchmarks/scaling.py --json`` writes them;
the line fit is checked against numpy's. No benchmark runs here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bastion.bench.results import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from experiments import scaling  # noqa: E402


def figures(state_kib=(244, 195, 196, 196), requests=(10.1, 15.8, 19.8, 31.6),
            restart_s=(0.15, 0.16, 0.17, 0.53)) -> dict:
    ps = (1, 2, 3, 6)
    return {
        "keys": 50_000, "seconds": 6.0, "interval_s": 0.5, "rate": 30_000, "nodes": 3,
        "cores": 2,
        "runs": [{"parallelism": p, "tuples_per_s": 1e6, "checkpoints": 11,
                  "state_bytes": kib * 1024, "checkpoint_s": 0.1,
                  "requests_per_s": {"PUT": 10.0}, "requests_per_checkpoint": req}
                 for p, kib, req in zip(ps, state_kib, requests)],
        "recoveries": [{"parallelism": p, "restart_s": t, "recovery_s": 2 * t}
                       for p, t in zip(ps, restart_s)],
    }


def verdicts(figs: dict) -> dict[str, Verdict]:
    return {row.anchor: row.judgement.verdict for row in scaling.growth_rows(figs)}


def test_a_run_that_bears_out_the_claims_reproduces_them():
    assert verdicts(figures()) == {"scaling-state": Verdict.REPRODUCED,
                                   "scaling-requests": Verdict.REPRODUCED,
                                   "scaling-restart": Verdict.REPRODUCED}


def test_each_claim_fails_on_a_run_that_breaks_it():
    # the state doubles with p; requests jump instead of growing along a line; the
    # restart at p=6 is no slower than at p=1
    broken = verdicts(figures(state_kib=(100, 200, 300, 600),
                              requests=(10, 10, 10, 60), restart_s=(0.5, 0.3, 0.3, 0.4)))
    assert broken == {"scaling-state": Verdict.WORSE, "scaling-requests": Verdict.WORSE,
                      "scaling-restart": Verdict.WORSE}
    reasons = {row.anchor: row.judgement.reason
               for row in scaling.growth_rows(figures(requests=(10, 10, 10, 60)))}
    assert "does not hold" in reasons["scaling-requests"]


def test_the_line_fit_is_numpys_least_squares():
    xs, ys = [1.0, 2.0, 3.0, 6.0], [10.1, 15.8, 19.8, 31.6]
    a, b, r2 = scaling._fit(xs, ys)
    slope, intercept = np.polyfit(xs, ys, 1)
    predicted = np.polyval([slope, intercept], xs)
    expected_r2 = 1 - np.sum((ys - predicted) ** 2) / np.sum((ys - np.mean(ys)) ** 2)
    assert np.allclose([a, b, r2], [intercept, slope, expected_r2])


def test_a_run_cut_short_is_not_measured():
    rows = scaling.growth_rows({"runs": [], "recoveries": []})
    assert {row.judgement.verdict for row in rows} == {Verdict.NOT_MEASURED}
