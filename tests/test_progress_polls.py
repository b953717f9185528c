"""The job master's progress polls as increments, and the termination of feedback loops,
checked on hand-made replies (`bastion.runtime.progress`); the runs that use them are
in test_cycles, test_resiliency and test_retune."""

from __future__ import annotations

from bastion.runtime.progress import LoopTermination, ProgressTally


def reply(attempt: int, tasks: dict[int, tuple[int, int, int]], lag: int = 0) -> dict:
    """A worker's answer: task -> (incarnation, records read, records written); the
    tasks that read records have ``lag`` records due and not yet read."""
    return {"attempt": attempt, "tasks": {
        t: {"incarnation": inc, "source_records": src, "sink_records": snk,
            "latency": {}, "late_copies": {}, "busy_s": 0.0, "source_lag": lag if src else 0}
        for t, (inc, src, snk) in tasks.items()}}


def test_counters_become_increments_and_restart_with_each_attempt_and_incarnation():
    tally = ProgressTally({1: ["q"]}, ["q"], set())
    first = tally.add([reply(0, {0: (0, 100, 0), 1: (0, 0, 80)}, lag=5)])
    assert (first.source_records, first.sink_records, first.source_lag) == (100, 80, 5)
    assert first.by_query["q"][0] == 80 and first.complete
    # a worker that did not answer is counted at the next poll, from what it gained
    missed = tally.add([TimeoutError(), reply(0, {1: (0, 0, 90)})])
    assert (missed.source_records, missed.sink_records) == (0, 10)
    assert not missed.complete and missed.answering == 1
    later = tally.add([reply(0, {0: (0, 150, 0), 1: (0, 0, 120)})])
    assert (later.source_records, later.sink_records) == (50, 30)
    # a new attempt, or a rebuilt task (its incarnation), counts from zero again
    restarted = tally.add([reply(1, {0: (0, 20, 0), 1: (1, 0, 7)})])
    assert (restarted.source_records, restarted.sink_records) == (20, 7)
    assert tally.totals == {"source_records": 170, "sink_records": 127}


def test_what_sinks_received_by_a_commit_point_counts_though_their_worker_dies():
    """CI once printed a drill whose sinks "received 3163 records but committed 3194":
    the worker holding a sink was killed after a commit and before the next poll, and
    its receipts since the last poll died with it. A commit point now tells them."""
    tally = ProgressTally({1: ["q"]}, ["q"], set())
    assert tally.add([reply(0, {1: (0, 0, 50)})]).sink_records == 50
    tally.at_least(1, (0, 0), 80)        # a commit point: 80 received by now
    tally.at_least(1, (0, 0), 70)        # an older one, arriving late, adds nothing
    # the worker died: it answers no more polls, and the 30 count all the same
    died = tally.add([TimeoutError()])
    assert died.sink_records == 30 and died.by_query["q"][0] == 30
    assert tally.add([TimeoutError()]).sink_records == 0    # ... once
    # a reply sent before the commit point, read after it, takes nothing back
    assert tally.add([reply(0, {1: (0, 0, 75)})]).sink_records == 0
    assert tally.add([reply(0, {1: (0, 0, 95)})]).sink_records == 15
    # a rebuilt task's commit point counts from zero, before its first poll
    tally.at_least(1, (0, 1), 12)
    assert tally.add([reply(0, {1: (1, 0, 20)})]).sink_records == 20
    assert tally.totals["sink_records"] == 50 + 30 + 15 + 20


def quiescence(sent: dict[int, int], processed: dict[int, int], idle: bool = True,
               head: bool = True) -> dict:
    return {"attempt": 0, "quiescence": {
        1: {"loop_head": head, "idle": idle, "sent": sent, "processed": {}},
        2: {"loop_head": False, "idle": idle, "sent": {}, "processed": processed}}}


def test_loops_finish_only_after_two_quiet_polls_with_the_same_counters():
    loops = LoopTermination({7: 2}, source_tasks=set())
    assert loops.heads_to_finish([quiescence({7: 10}, {7: 10})]) == []   # first look
    # the counters moved between the looks: a frame was on its way, look again
    assert loops.heads_to_finish([quiescence({7: 12}, {7: 12})]) == []
    assert loops.heads_to_finish([quiescence({7: 12}, {7: 12})]) == [1]
    # a frame sent and not processed, a busy task, or a worker that did not answer
    # is no quiet poll
    for replies in ([quiescence({7: 13}, {7: 12})], [quiescence({7: 13}, {7: 13}, idle=False)],
                    [TimeoutError()]):
        loops = LoopTermination({7: 2}, source_tasks=set())
        loops.heads_to_finish([quiescence({7: 13}, {7: 13})])
        assert loops.heads_to_finish(replies) == []
        assert loops.heads_to_finish(replies) == []
    # a source still running feeds the loop
    loops = LoopTermination({7: 2}, source_tasks={1})
    for _ in range(3):
        assert loops.heads_to_finish([quiescence({7: 10}, {7: 10})]) == []
