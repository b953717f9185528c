"""A recovering region catches up on the CPU the healthy queries leave over
(`bastion.scheduler.catchup`, `bastion.runtime.priority`).

The policy's decisions on plain sets; the mechanism on real threads, read back from
the kernel (``os.sched_getscheduler`` of a thread id, not the module's own answer);
a real worker actor lowered and restored; and the signal the job master restores on —
a channel still sending a joined receiver its backlog. The end-to-end check, that the
job master lowers the worker of ``per_bidder``'s recovering tasks in the correlated
scenario and restores it once their replay is over, is in
`test_correlated_regional` (a drill on a simulated cluster)."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import ray

from bastion.runtime import priority
from bastion.runtime.channel import OutputChannel, ReplayableOutputChannel
from bastion.scheduler.catchup import (CAUGHT_UP, TIME_UP, IdleWhileCatchingUp,
                                       NormalPriority)
from bastion.scheduler.recovery import RecoveryPolicy
from bastion.storage import open_store

needs_idle_class = pytest.mark.skipif(not priority.supported(),
                                      reason="the OS has no SCHED_IDLE")


# -- the policy ---------------------------------------------------------------------------


def test_only_a_worker_hosting_nothing_but_recovering_tasks_is_lowered():
    policy = IdleWhileCatchingUp()
    # worker 0 runs the healthy queries and one recovering task, worker 1 only
    # recovering ones, worker 2 nothing
    hosted = {0: {0, 1, 2, 3}, 1: {4, 5}, 2: set()}
    assert policy.to_lower(hosted, recovering={3, 4, 5}, protected={0, 1, 2}) == {1}


def test_nothing_is_lowered_when_every_query_was_hit():
    # the catch-ups are what bring the queries back
    policy = IdleWhileCatchingUp()
    hosted = {0: {0, 1}, 1: {4, 5}}
    assert policy.to_lower(hosted, recovering={4, 5}, protected=set()) == set()
    assert policy.to_lower(hosted, recovering={4, 5}, protected={4, 5}) == set()


def test_a_lowered_worker_is_restored_once_no_replay_feeds_its_tasks():
    policy = IdleWhileCatchingUp(max_lowered_s=10.0)
    assert policy.to_restore({4, 5}, replaying_into={5}, lowered_for_s=1.0) is None
    # a worker did not answer: unknown, wait
    assert policy.to_restore({4, 5}, replaying_into=None, lowered_for_s=1.0) is None
    assert policy.to_restore({4, 5}, replaying_into={7}, lowered_for_s=1.0) == CAUGHT_UP
    assert policy.to_restore({4, 5}, replaying_into=set(), lowered_for_s=1.0) == CAUGHT_UP
    # starved for too long: back to normal, replay or not
    assert policy.to_restore({4, 5}, replaying_into={5}, lowered_for_s=10.0) == TIME_UP
    assert policy.to_restore({4, 5}, replaying_into=None, lowered_for_s=12.0) == TIME_UP


def test_normal_priority_lowers_nothing_and_the_policy_names_are_checked():
    assert NormalPriority().to_lower({1: {4}}, recovering={4}, protected={0}) == set()
    assert isinstance(RecoveryPolicy().catch_up(), IdleWhileCatchingUp)
    assert RecoveryPolicy(catch_up_max_s=3.0).catch_up() == IdleWhileCatchingUp(3.0)
    assert isinstance(RecoveryPolicy(catch_up_priority="normal").catch_up(), NormalPriority)
    with pytest.raises(ValueError, match="catch_up_priority"):
        RecoveryPolicy(catch_up_priority="low")
    with pytest.raises(ValueError, match="catch_up_max_s"):
        RecoveryPolicy(catch_up_max_s=-1)


# -- the mechanism ------------------------------------------------------------------------


@needs_idle_class
def test_set_idle_lowers_the_calling_thread_only_and_restores_it():
    seen: dict[str, int] = {}
    lowered, restore = threading.Event(), threading.Event()

    def catch_up_thread():
        seen["reply"] = priority.set_idle(True)
        seen["tid"] = threading.get_native_id()
        lowered.set()
        restore.wait(10)
        seen["reply_after"] = priority.set_idle(False)
        seen["after"] = os.sched_getscheduler(0)

    thread = threading.Thread(target=catch_up_thread)
    thread.start()
    assert lowered.wait(10)
    try:
        # read back from the kernel, by thread id
        assert os.sched_getscheduler(seen["tid"]) == os.SCHED_IDLE
        assert seen["reply"] == priority.IDLE
        # the other threads of the process (this one) keep their class
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
        assert priority.current() == priority.NORMAL
    finally:
        restore.set()
        thread.join(10)
    assert seen["after"] == os.SCHED_OTHER and seen["reply_after"] == priority.NORMAL


@needs_idle_class
def test_going_back_also_restores_the_helper_threads_started_while_lowered():
    """Threads a lowered thread starts inherit the idle class and outlive the catch-up
    (an executor keeps its threads): going back restores them too, or a pooled
    worker's store writes would run at idle priority for good."""
    seen: dict[str, int] = {}
    started, finish = threading.Event(), threading.Event()

    def helper():
        seen["tid"] = threading.get_native_id()
        started.set()
        finish.wait(10)

    def catch_up_thread():
        priority.set_idle(True)
        child = threading.Thread(target=helper)
        child.start()
        started.wait(10)
        seen["child_lowered"] = os.sched_getscheduler(seen["tid"])
        priority.set_idle(False)
        seen["child_after"] = os.sched_getscheduler(seen["tid"])
        finish.set()
        child.join(10)

    thread = threading.Thread(target=catch_up_thread)
    thread.start()
    thread.join(20)
    assert seen["child_lowered"] == os.SCHED_IDLE
    assert seen["child_after"] == os.SCHED_OTHER


needs_thread_nice = pytest.mark.skipif(
    priority.sys.platform != "linux" or not priority._may_return_to(0),
    reason="nice values are not per thread here, or this process may not lower one back")


@pytest.mark.internal
@needs_thread_nice
def test_children_started_inside_run_niced_and_the_thread_goes_back(tmp_path):
    """What a simulated cluster's arriving node is booted with: its processes (and
    theirs) at nice 19, the driver's thread back at its own value — read from the
    kernel, for a child and a grandchild."""
    import subprocess
    import sys

    pids = tmp_path / "pids"
    script = ("import os, subprocess, sys, time; "
              "g = subprocess.Popen(['sleep', '30']); "
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}'); time.sleep(30)")
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with priority.children_niced() as lowered:
        assert lowered
        child = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
        for _ in range(200):
            if pids.exists() and pids.read_text():
                break
            threading.Event().wait(0.05)
        pid, grandchild = map(int, pids.read_text().split())
        assert pid == child.pid
        assert os.getpriority(os.PRIO_PROCESS, pid) == priority.LOWEST_NICE
        assert os.getpriority(os.PRIO_PROCESS, grandchild) == priority.LOWEST_NICE
        os.kill(grandchild, 9)
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.internal
def test_children_are_not_niced_where_the_thread_could_not_go_back(monkeypatch):
    """An unprivileged process may raise its nice value but not lower it again: the
    thread would stay niced, so nothing is lowered, and the caller is told."""
    monkeypatch.setattr(priority, "_may_return_to", lambda nice: False)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with priority.children_niced() as lowered:
        assert not lowered
        assert os.getpriority(os.PRIO_PROCESS, 0) == own


@pytest.mark.internal
def test_the_rlimit_floor_decides_whether_a_thread_may_go_back(monkeypatch):
    monkeypatch.setattr(priority.os, "geteuid", lambda: 1000)
    # a soft RLIMIT_NICE of r allows nice values down to 20 - r
    monkeypatch.setattr(priority.resource, "getrlimit", lambda what: (20, 20))
    assert priority._may_return_to(0)
    monkeypatch.setattr(priority.resource, "getrlimit", lambda what: (0, 0))
    assert not priority._may_return_to(0)
    monkeypatch.setattr(priority.resource, "getrlimit", lambda what: (5, 5))
    assert priority._may_return_to(15) and not priority._may_return_to(14)


@needs_idle_class
def test_a_worker_actor_runs_its_tasks_thread_idle_until_told_or_released(ray_session):
    from bastion.runtime.instance import Worker

    worker = Worker.remote()
    try:
        # an unbound worker's epoch is None: the call is for it
        assert ray.get(worker.set_catch_up.remote(None, True)) == priority.IDLE
        # progress runs on the same thread as the tasks: it reports the lowered class
        assert ray.get(worker.progress.remote())["cpu_priority"] == priority.IDLE
        # a call for another job's attempt changes nothing
        assert ray.get(worker.set_catch_up.remote(("other job", 0), False)) == priority.IDLE
        assert ray.get(worker.set_catch_up.remote(None, False)) == priority.NORMAL
        assert ray.get(worker.progress.remote())["cpu_priority"] == priority.NORMAL
        ray.get(worker.set_catch_up.remote(None, True))
        ray.get(worker.release.remote())  # a worker goes back to the pool at normal
        assert ray.get(worker.progress.remote())["cpu_priority"] == priority.NORMAL
    finally:
        ray.kill(worker, no_restart=True)


# -- the signal: a backlog being replayed -------------------------------------------------


class Receiver(OutputChannel):
    def __init__(self, gate: asyncio.Event):
        super().__init__(0, 10, 0.0)
        self.gate = gate
        self.received: list[int] = []

    async def transmit(self, seq, payload):
        await self.gate.wait()
        self.received.append(seq)


def test_a_channel_is_replaying_while_it_sends_a_joined_receiver_its_backlog(tmp_path):
    async def scenario():
        store = open_store(f"local://{tmp_path}")
        channel = ReplayableOutputChannel(7, 10, 0.0, None, 3, store, "jobs/j/held/0/7/0",
                                          None)
        for seq in range(6):  # logged while the receiver is down
            await channel.transmit(seq, b"x")
        assert not channel.replaying
        gate = asyncio.Event()
        receiver = Receiver(gate)
        channel.attaching = True  # as `Worker.attach` marks it before it starts
        attaching = asyncio.ensure_future(channel.attach(receiver, from_seq=2))
        await asyncio.sleep(0.01)
        during = channel.replaying
        gate.set()
        await attaching
        return during, channel.replaying, receiver.received

    during, after, received = asyncio.run(scenario())
    assert during is True
    assert after is False
    assert received == [2, 3, 4, 5]


# -- the benchmark's measures ---------------------------------------------------------------


def test_relative_latency_max_per_point_agrees_with_the_availability_metric():
    from bastion.runtime.metrics import query_availability, relative_latency_max

    latencies = [10.0, 12.0, 9.0, 10.0, 11.0, 40.0, 10.0, 14.0, 10.0, 10.0]
    points = [{"t_s": 0.1 * i, "queries": {"q": (5, ms)}} for i, ms in enumerate(latencies)]
    q = query_availability(points, {"q": 1}, failed_at_s=0.4, restarted_at_s=0.45)["q"]
    assert relative_latency_max(q.timeline, 0.4, 0.45) == pytest.approx(
        q.max_relative_latency)
    assert q.max_relative_latency == pytest.approx(4.0)


def test_the_interval_average_damps_one_late_point_not_a_sustained_rise():
    from bastion.runtime.metrics import relative_latency_max

    # relative to a 1.0 baseline: one point at 4.0 among ten in a second...
    one_late = [(0.1 * i, 5, 4.0 if i == 25 else 1.0) for i in range(40)]
    assert relative_latency_max(one_late, 2.0, 2.0) == pytest.approx(4.0)
    assert relative_latency_max(one_late, 2.0, 2.0, window_s=1.0) == pytest.approx(1.3)
    # ...while a second at 2.0 stays 2.0 averaged
    sustained = [(0.1 * i, 5, 2.0 if 25 <= i < 36 else 1.0) for i in range(40)]
    assert relative_latency_max(sustained, 2.0, 2.0, window_s=1.0) == pytest.approx(2.0)
    # points without output do not count; no baseline: nothing to compare
    assert relative_latency_max([(0.1, 0, None), (3.0, 5, 2.0)], 2.0, 2.0) is None
