"""A task held on one frame is named while the job runs (`bastion.scheduler.stall`).

Through the public API on real Ray workers: a map whose function blocks the task loop
on one record (``time.sleep``, as a call without a timeout would) gets one
``task_stalled`` event naming its task and operator and a ``task_resumed`` when it
returns, and the job's output is whole. The check can fail: the same job with a
function that returns at once, or with the watch off, reports no stall. A source
whose function blocks is named too (the watch covers source batches). The watch's
rule is checked on its own: one warning per stall, a new frame ends it, a worker that
did not answer changes nothing.
"""

from __future__ import annotations

import time

import pytest

import bastion as bn
from bastion.scheduler.stall import Stall, StallWatch

HOLD_S = 2.5


def _held_once(i: int) -> int:
    if i == 150:
        time.sleep(HOLD_S)   # blocks the worker's task loop, as a hung call would
    return i * 2


def _job(fn, *, on_source: bool = False) -> bn.Topology:
    topo = bn.Topology("stall")
    numbers = topo.source("numbers", bn.sources.Generator(fn if on_source else (lambda i: i),
                                                          count=300))
    numbers.map("slow", (lambda i: i * 2) if on_source else fn, parallelism=1).sink(
        "out", bn.sinks.Collect())
    return topo


def _stall_events(result: bn.RunResult) -> list[dict]:
    return [e for e in result.details["events"]
            if e["kind"] in ("task_stalled", "task_resumed")]


@pytest.mark.usefixtures("ray_session")
def test_a_function_holding_the_loop_is_named_and_the_job_completes(tmp_path):
    result = bn.run(_job(_held_once), storage=f"local://{tmp_path}",
                    recovery=bn.Recovery(stall_warning_s=1.0))
    assert sorted(result.outputs["out"]) == [i * 2 for i in range(300)]
    events = _stall_events(result)
    assert [e["kind"] for e in events] == ["task_stalled", "task_resumed"], events
    stalled, resumed = events
    # the task (a chain: its operators are named, any of them may hold it)
    assert "slow" in stalled["operators"] and stalled["task"] == resumed["task"]
    assert stalled["task"].endswith("[0]") and "slow" in stalled["task"]
    assert 1.0 <= stalled["held_s"] <= resumed["held_s"] <= HOLD_S + 0.5
    # the check can fail: a function that returns at once is never reported
    quick = bn.run(_job(lambda i: i * 2), storage=f"local://{tmp_path}/quick",
                   recovery=bn.Recovery(stall_warning_s=1.0))
    assert _stall_events(quick) == []
    # and with the watch off, the held function is not reported either
    unwatched = bn.run(_job(_held_once), storage=f"local://{tmp_path}/off",
                       recovery=bn.Recovery(stall_warning_s=None))
    assert _stall_events(unwatched) == []


@pytest.mark.usefixtures("ray_session")
def test_a_source_function_holding_the_loop_is_named(tmp_path):
    result = bn.run(_job(_held_once, on_source=True), storage=f"local://{tmp_path}",
                    recovery=bn.Recovery(stall_warning_s=1.0))
    assert sorted(result.outputs["out"]) == [i * 4 for i in range(300)]
    stalled = [e for e in _stall_events(result) if e["kind"] == "task_stalled"]
    assert len(stalled) == 1 and stalled[0]["operators"][0] == "numbers", stalled


def test_one_warning_per_stall_and_a_new_frame_ends_it():
    watch = StallWatch(warning_s=5.0)
    assert watch.observe({1: 4.9, 2: None}) == ([], [])
    assert watch.observe({1: 5.2}) == ([Stall(1, 5.2)], [])
    assert watch.observe({1: 9.0}) == ([], [])           # still held: no second warning
    assert watch.observe({}) == ([], [])                 # its worker did not answer
    assert watch.stalled == {1}
    assert watch.observe({1: 0.3}) == ([], [Stall(1, 9.0)])   # on a new frame
    assert watch.observe({1: 6.0}) == ([Stall(1, 6.0)], [])   # held again: warned again
    assert watch.observe({1: None}) == ([], [Stall(1, 6.0)])
    assert watch.stalled == set()
    with pytest.raises(ValueError):
        StallWatch(0)


def test_the_option_is_checked_where_it_is_made():
    assert bn.Recovery().stall_warning_s == 60.0
    with pytest.raises(ValueError, match="stall_warning_s"):
        bn.Recovery(stall_warning_s=0)
