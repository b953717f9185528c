"""Correlated-failure drills on a simulated three-node Ray cluster, run as their own
process: the test session shares one single-node Ray, and a simulated cluster needs a
driver of its own. `test_progressive_recovery` runs this and reads the JSON line it
prints last.

1. The scenario of `bastion.bench.correlated` under progressive recovery: two nodes
   lost, three nodes arriving one by one; the drill verdict must be exactly once.
2. The same drill with a deliberately broken runtime: held channels forget the frames
   they spilled to the store (installed in every worker by Ray's setup hook). The
   verdict must say records were lost.

Both keep 4 held frames per channel in memory, so that held frames are spilled.

    python tests/correlated_drill.py STORAGE_DIR
"""

from __future__ import annotations

import json
import sys


def forget_spilled_frames() -> None:
    """A broken adaptive buffer: `attach` sends only the frames held in memory."""
    from bastion.runtime.channel import HeldOutputChannel

    attach = HeldOutputChannel.attach

    async def forgetful(self, target):
        self._spilled = []
        await attach(self, target)

    HeldOutputChannel.attach = forgetful


def summary(report) -> dict:
    return {
        "exactly_once": report.exactly_once, "lost": report.lost,
        "duplicated": report.duplicated,
        "progressed": [e["queries"] for e in report.events
                       if e["kind"] in ("recovery_planned", "recovery_progressed")
                       and e.get("queries")],
        "available_again_s": {name: q["available_again_s"]
                              for name, q in report.metrics.extra["queries"].items()},
        "frames_held": report.metrics.extra["frames_held"],
        "frames_spilled": report.metrics.extra["frames_spilled"],
    }


def main(storage_dir: str) -> None:
    from bastion.bench import correlated
    from bastion.report import write_html

    reference = correlated.references(storage_dir=storage_dir)
    case = correlated.Case("progressive", "staggered")
    # 4 frames a channel in memory: held frames are spilled to the store
    good = correlated.run_case(case, reference=reference, storage_dir=storage_dir,
                               held_frames_in_memory=4)
    broken = correlated.run_case(case, reference=reference, storage_dir=storage_dir,
                                 held_frames_in_memory=4,
                                 runtime_env={"worker_process_setup_hook":
                                              forget_spilled_frames})
    page = write_html(good, f"{storage_dir}/report.html", compared={"broken": broken})
    text = page.read_text()
    print(json.dumps({"progressive": summary(good), "broken": summary(broken),
                      "report_plots": [alt for alt in ("relative latency per query",
                                                       "available queries over time",
                                                       "Recoveries compared")
                                       if alt in text]}))


if __name__ == "__main__":
    main(sys.argv[1])
