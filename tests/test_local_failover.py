"""A failure restarts only what it must (`bastion.scheduler.failover`).

The strategies first, against brute force on random task graphs: a pipelined region
is a connected component of the channels taken both ways; downstream is what a path
of channels reaches. Then end to end, with real Ray workers and a real kill: a job
of two independent branches under ``coordinated``, one of whose instances dies. Only
that instance's pipelined region restarts — the report names it — and the other
branch never rolls back: its sink receives each record it commits exactly once
(a sink restarted from a checkpoint receives again what it had received since, so
over the run it receives more than it commits). The same drill with
``failover="global"`` restarts every task, and that measure sees it: the check can
fail."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest

import bastion as bn
from bastion.errors import PeerLostError
from bastion.runtime.channel import OutputChannel, ReroutableOutputChannel, first_seq
from bastion.runtime.records import Batch, EndOfStream, FrameCodec, Watermark
from bastion.drills import reference_runs
from bastion.protocols.base import RegionLine
from bastion.protocols.cec import CecProtocol, CecTask
from bastion.protocols.uncoordinated import RecoveryLineCoordinator, UncoordinatedProtocol
from bastion.scheduler.failover import (RestartAll, RestartDownstream, RestartFailed,
                                        RestartPipelinedRegion, TaskGraph, check_failover,
                                        failover_strategy)
from bastion.scheduler.recovery import RecoveryPolicy
from protocol_knobs import with_interval


# -- the strategies ----------------------------------------------------------------------


def random_graph(rng: random.Random) -> TaskGraph:
    tasks = rng.randint(1, 9)
    pairs = [(s, d) for s, d in itertools.product(range(tasks), repeat=2) if s != d]
    channels = dict(enumerate(rng.sample(pairs, rng.randint(0, min(len(pairs), 12)))))
    return TaskGraph(frozenset(range(tasks)), channels)


def reaches(edges: set[tuple[int, int]], src: int, dst: int) -> bool:
    seen, frontier = {src}, {src}
    while frontier:
        frontier = {d for s, d in edges if s in frontier} - seen
        seen |= frontier
    return dst in seen


def test_a_pipelined_region_is_every_task_connected_to_a_failed_one_either_way():
    rng = random.Random(34)
    for _ in range(300):
        graph = random_graph(rng)
        failed = set(rng.sample(sorted(graph.tasks), rng.randint(1, len(graph.tasks))))
        both_ways = set(graph.channels.values()) | {(d, s) for s, d in graph.channels.values()}
        want = {t for t in graph.tasks if any(reaches(both_ways, f, t) for f in failed)}
        assert RestartPipelinedRegion().tasks_to_restart(failed, graph) == want
        # the region is closed: no channel crosses its edge
        assert all((s in want) == (d in want) for s, d in graph.channels.values())


def test_downstream_is_what_a_path_of_channels_reaches_and_all_is_everything():
    rng = random.Random(35)
    for _ in range(300):
        graph = random_graph(rng)
        failed = set(rng.sample(sorted(graph.tasks), rng.randint(1, len(graph.tasks))))
        edges = set(graph.channels.values())
        want = {t for t in graph.tasks if any(reaches(edges, f, t) for f in failed)}
        assert RestartDownstream().tasks_to_restart(failed, graph) == want
        assert RestartAll().tasks_to_restart(failed, graph) == graph.tasks


def test_the_strategy_follows_the_run_and_the_protocol():
    capacity = RecoveryPolicy(task_slots_per_cpu=1.0)
    pick = failover_strategy
    assert isinstance(pick("local", "region", None), RestartPipelinedRegion)
    assert isinstance(pick("local", "region", RecoveryPolicy()), RestartPipelinedRegion)
    assert isinstance(pick("local", "region", capacity), RestartDownstream)
    assert isinstance(pick("local", "task", None), RestartFailed)
    assert isinstance(pick("local", "task", capacity), RestartAll)
    # a protocol whose line rewinds every task, or a run that asks for it
    assert isinstance(pick("local", "job", capacity), RestartAll)
    assert isinstance(pick("global", "region", None), RestartAll)
    assert isinstance(pick("global", "task", None), RestartAll)
    # what a channel into a restarted task must do while its sender runs on
    strategies = (RestartAll(), RestartPipelinedRegion(), RestartDownstream(),
                  RestartFailed())
    assert [s.backs_up_channels for s in strategies] == [False, False, True, False]
    assert [s.reroutes_channels for s in strategies] == [False, False, False, True]
    assert [s.partial for s in strategies] == [False, True, True, True]
    graph = TaskGraph(frozenset(range(4)), {0: (0, 1), 1: (1, 2), 2: (2, 3)})
    assert RestartFailed().tasks_to_restart({1}, graph) == {1}
    with pytest.raises(ValueError, match="failover must be one of"):
        check_failover("regional")
    with pytest.raises(ValueError, match="restart_scope must be one of"):
        pick("local", "operator", None)


def test_bn_run_refuses_an_unknown_failover_before_it_deploys():
    topo = bn.Topology("bad-failover")
    topo.source("src", bn.sources.Collection([1, 2])).sink("out", bn.sinks.Collect())
    with pytest.raises(ValueError, match="failover must be one of"):
        bn.run(topo, recovery=bn.Recovery(failover="nearby"))


# -- a channel into a task that restarts alone ----------------------------------------------


class Receiver(OutputChannel):
    """What reaches one incarnation of a receiver; ``gone``: its peer died."""

    def __init__(self, gone: bool = False):
        super().__init__(0, 10, 0.0)
        self.received: list[tuple[int, bytes]] = []
        self.gone = gone

    async def transmit(self, seq, payload):
        if self.gone:
            raise PeerLostError("the peer died")
        self.received.append((seq, payload))


def test_a_reroutable_channel_drops_frames_while_its_receiver_is_down_then_starts_at_0():
    """The sender runs on: while the receiver is down its frames are dropped (the
    protocol replays their roots), and a new incarnation gets frames numbered from 0,
    the first holding the newest watermark and the end of stream sent meanwhile —
    which no replay would send again."""
    codec = FrameCodec()

    def batch(i: int) -> Batch:
        return Batch(None, [i], [0.0], [0.0], None)

    async def scenario():
        first, dead, again = Receiver(), Receiver(gone=True), Receiver()
        channel = ReroutableOutputChannel(3, 10, 0.0, codec, first)
        channel.seq = first_seq(2)   # the sender's incarnation 2: its band shows
        for i in range(3):
            await channel.send([batch(i), Watermark(float(i))])
        channel.detach()                       # the job master restarts the receiver
        await channel.send([batch(3), EndOfStream()])
        await channel.attach(dead)             # attached, but its peer is gone too
        assert not channel.attached
        await channel.send([batch(4)])
        await channel.attach(again)
        await channel.send([batch(5)])
        return first, again, channel

    first, again, channel = asyncio.run(scenario())
    band = first_seq(2)
    assert [seq for seq, _ in first.received] == [band, band + 1, band + 2]
    assert [seq for seq, _ in again.received] == [0, 1]   # a fresh receiver's numbers
    assert codec.decode(again.received[0][1]) == [Watermark(2.0), EndOfStream()]
    [data] = codec.decode(again.received[1][1])
    assert list(data.values) == [5]
    # frame 3 (detached), the dead incarnation's frame 0, frame 4 (no receiver)
    assert channel.frames_dropped == 3


def test_a_receiver_lost_without_a_restart_fails_the_sender_after_the_timeout():
    """A link that broke while both ends live: nobody restarts the receiver, so the
    channel does not drop for ever — after ``unattached_timeout_s`` its next send
    fails the sending task (whose restart connects again). A receiver the job master
    restarts (`detach`) is waited for as long as it takes."""
    def batch(i: int) -> Batch:
        return Batch(None, [i], [0.0], [0.0], None)

    async def scenario(announced: bool) -> bool:
        channel = ReroutableOutputChannel(3, 10, 0.0, FrameCodec(), Receiver(gone=True),
                                          unattached_timeout_s=0.05)
        await channel.send([batch(0)])          # the link is gone: dropped
        if announced:
            channel.detach()
        await asyncio.sleep(0.1)
        try:
            await channel.send([batch(1)])
        except PeerLostError:
            return True
        return False

    assert asyncio.run(scenario(announced=False)) is True
    assert asyncio.run(scenario(announced=True)) is False


# -- end to end: two branches, one hit -----------------------------------------------------

COUNT = 4000
RATE = 1000.0  # records per second per source: the job runs about four seconds


def two_branches() -> bn.Topology:
    """Branch ``a`` (a keyed sum, instance 0 only) and branch ``b`` (a forward-only
    pipeline of two instances): worker 1 runs nothing but ``b``'s instance 1."""
    topo = bn.Topology("two-branches")
    a = topo.source("a_src", bn.sources.Generator(lambda i: i, count=COUNT, rate=RATE),
                    parallelism=1)
    a.key_by(lambda v: v % 7).reduce("a_sum", lambda acc, v: acc + v, initial=0,
                                     parallelism=1).sink("a_out", bn.sinks.Collect(),
                                                         parallelism=1)
    b = topo.source("b_src", bn.sources.Generator(lambda i: i, count=COUNT, rate=RATE),
                    parallelism=2)
    b.map("b_map", lambda v: v * 2, parallelism=2).sink("b_out", bn.sinks.Collect(),
                                                        parallelism=2)
    topo.query("a", outputs=["a_out"])
    topo.query("b", outputs=["b_out"])
    return topo


@pytest.fixture(scope="module")
def branches(ray_session, tmp_path_factory):
    storage = f"local://{tmp_path_factory.mktemp('local-failover')}"
    return storage, reference_runs(two_branches(), storage=storage)


def drill(storage: str, reference: list, failover: str, chaining: bool = True,
          protocol: str = "coordinated") -> bn.DrillReport:
    return bn.drill(two_branches(), protocol=with_interval(protocol, interval_s=0.3),
                    faults=[bn.faults.KillInstance("b_map", 1, at=1.5)],
                    reference=reference, storage=storage,
                    recovery=bn.Recovery(failover=failover, heartbeat_timeout_s=3.0),
                    data_plane=bn.DataPlane(chaining=chaining))  # see test_acks.acks_drill


def received_and_committed(report: bn.DrillReport, query: str) -> tuple[int, int]:
    timeline = report.metrics.extra["queries"][query]["timeline"]
    return (sum(n for _, n, _ in timeline),
            sum(len(report.outputs[sink]) for sink in
                {"a": ["a_out"], "b": ["b_out"]}[query]))


@pytest.mark.slow
@pytest.mark.parametrize("chaining", [True, False], ids=["chained", "a-task-per-operator"])
def test_a_kill_in_one_branch_restarts_its_region_alone(branches, chaining):
    """Chained, b's instance 1 is one task; unchained, three, and the kill takes down
    both ends of its channels: they restore the positions the checkpoint cut them at."""
    storage, reference = branches
    report = drill(storage, reference, "local", chaining)
    assert report.exactly_once, report.verdict_reason
    [fault] = report.faults
    assert fault.landed and fault.restart_s is not None
    # only b's instance 1 restarted, within the attempt that was running
    assert sorted(fault.restarted_tasks) == ["b_map[1]", "b_out[1]", "b_src[1]"]
    assert report.metrics.extra["attempts"] == 1
    [failure] = report.metrics.protocol.failures
    assert sorted(failure.restarted_tasks) == sorted(fault.restarted_tasks)
    # branch a never rolled back: its sink received each committed record once
    received, committed = received_and_committed(report, "a")
    assert received == committed == COUNT
    # b's restarted instance did roll back: received again what it had since the line
    received, committed = received_and_committed(report, "b")
    assert received > committed == COUNT


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["uncoordinated", "cic"])
def test_uncoordinated_checkpoints_restart_the_rollback_set_alone(branches, protocol):
    """Unchained, the kill takes ``b_map[1]``'s worker: its line rolls back it and
    what it fed (``b_out[1]``); ``b_src[1]``, upstream, keeps running unless it died
    with it, and sends ``b_map[1]`` again what its line checkpoint lacks, from its
    upstream backup. Branch ``a`` never rolls back."""
    storage, reference = branches
    report = drill(storage, reference, "local", chaining=False, protocol=protocol)
    assert report.exactly_once, report.verdict_reason
    [fault] = report.faults
    assert fault.landed and fault.restart_s is not None
    assert report.metrics.extra["attempts"] == 1
    assert {"b_map[1]", "b_out[1]"} <= set(fault.restarted_tasks) \
        <= {"b_map[1]", "b_out[1]", "b_src[1]"}
    received, committed = received_and_committed(report, "a")
    assert received == committed == COUNT


@pytest.mark.slow
def test_a_global_failover_restarts_every_task_and_the_measure_sees_it(branches):
    storage, reference = branches
    report = drill(storage, reference, "global")
    assert report.exactly_once, report.verdict_reason
    [fault] = report.faults
    assert sorted(fault.restarted_tasks) == ["a_out[0]", "a_src[0]", "a_sum[0]",
                                             "b_map[0]", "b_map[1]", "b_out[0]",
                                             "b_out[1]", "b_src[0]", "b_src[1]"]
    assert report.metrics.extra["attempts"] == 2
    received, committed = received_and_committed(report, "a")
    assert received > committed == COUNT


# -- end to end: a keyed exchange, survivors upstream -----------------------------------------


def keyed_sum(name: str, total: str, parallelism: int) -> bn.Topology:
    """Two source instances chained with a map, then a keyed sum (named ``total``) and
    its sink at ``parallelism``: worker *i* runs instance *i* of each."""
    topo = bn.Topology(name)
    src = topo.source("src", bn.sources.Generator(lambda i: i, count=COUNT, rate=RATE),
                      parallelism=2)
    src.map("map", lambda v: v * 3, parallelism=2).key_by(lambda v: v % 101).reduce(
        total, lambda acc, v: acc + v, initial=0, parallelism=parallelism).sink(
        "out", bn.sinks.Collect(), parallelism=parallelism)
    return topo


def keyed_stages() -> bn.Topology:
    """A keyed sum at p=2: each worker runs a source, a map, a sum and a sink."""
    return keyed_sum("keyed-stages", "keyed", 2)


@pytest.fixture(scope="module")
def keyed(ray_session, tmp_path_factory):
    storage = f"local://{tmp_path_factory.mktemp('keyed-failover')}"
    return storage, reference_runs(keyed_stages(), storage=storage)


@pytest.mark.slow
def test_a_killed_receiver_of_a_keyed_exchange_is_fed_again_by_senders_that_ran_on(keyed):
    """The kill takes the worker of ``keyed[1]``: every keyed instance received what
    it sent since its line checkpoint, so the rollback set is the keyed sums and the
    sinks, with what died beside them. The source instance that survived keeps its
    state and position, and sends each keyed instance again, from its upstream
    backup, what the checkpoint the instance restored lacked: nothing is lost or
    counted twice, by identity."""
    storage, reference = keyed
    report = bn.drill(keyed_stages(), protocol=bn.protocols.Uncoordinated(interval_s=0.3),
                      faults=[bn.faults.KillInstance("keyed", 1, at=1.5)],
                      reference=reference, storage=storage,
                      recovery=bn.Recovery(heartbeat_timeout_s=3.0))
    assert report.exactly_once, report.verdict_reason
    [fault] = report.faults
    assert report.metrics.extra["attempts"] == 1
    restarted = set(fault.restarted_tasks)
    assert {"keyed[0]", "keyed[1]", "out[0]", "out[1]"} <= restarted
    # one source instance ran on: the backup path fed the restarted sums
    assert len(restarted & {"src[0]", "src[1]"}) == 1


# -- the drills catch a regional restart that is broken ----------------------------------------


class _ShiftedLine(RecoveryLineCoordinator):
    """Moves where the restarted receivers resume a channel from outside, and where
    its sender resends from, by ``shift`` frames; keeps every frame backed up."""

    shift = 0

    def _trim(self, replay_from):
        pass

    async def region_line(self, tasks):
        line = await super().region_line(tasks)
        if line is None:
            return None
        resume = {c: max(0, seq + self.shift) for c, seq in line.resume.items()}
        for info in line.line["tasks"].values():
            for channel_id in info.expected.keys() & resume.keys():
                info.expected[channel_id] = resume[channel_id]
        return RegionLine(line.line, resume, line.retake)


class SkipsFrames(_ShiftedLine):
    """A sender that does not send again what the receiver's checkpoint lacks."""
    shift = 3


class TakesFramesAgain(_ShiftedLine):
    """A receiver that takes again frames its checkpoint reflects."""
    shift = -3


class BrokenUncoordinated(UncoordinatedProtocol):
    def __init__(self, coordinator, **knobs):
        super().__init__(**knobs)
        self.broken = coordinator

    def coordinator(self, master):
        return self.broken(master)


class TrimsWhatItStillNeeds(CecTask):
    """A stateful instance that lets its senders forget every frame it took, as if
    its state were durable the moment it changed."""

    def _trim_senders(self):
        operator, self.operator = self.operator, None
        try:
            super()._trim_senders()
        finally:
            self.operator = operator


class BrokenCec(CecProtocol):
    def task_protocol(self, task):
        return TrimsWhatItStillNeeds(task, self.policy)


@pytest.mark.slow
@pytest.mark.parametrize("broken,violation", [(SkipsFrames, "lost"),
                                              (TakesFramesAgain, "corrupted")])
def test_the_drill_says_violated_when_the_upstream_backup_is_misused(keyed, broken,
                                                                     violation):
    storage, reference = keyed
    report = bn.drill(keyed_stages(),
                      protocol=BrokenUncoordinated(broken, interval_s=0.3),
                      faults=[bn.faults.KillInstance("keyed", 1, at=1.5)],
                      reference=reference, storage=storage,
                      recovery=bn.Recovery(heartbeat_timeout_s=3.0))
    assert report.metrics.extra["attempts"] == 1  # the regional path ran
    assert report.verdict == "violated"
    assert getattr(report, violation) > 0, report.verdict_reason


# -- cec: the failed stateful instance alone ---------------------------------------------------


def keyed_three() -> bn.Topology:
    """The keyed sum at p=3: worker 2 (of three) runs ``sum[2]`` and ``out[2]`` and
    nothing else."""
    return keyed_sum("keyed-three", "sum", 3)


@pytest.fixture(scope="module")
def three(ray_session, tmp_path_factory):
    storage = f"local://{tmp_path_factory.mktemp('cec-failover')}"
    return storage, reference_runs(keyed_three(), storage=storage)


def cec_kill(three, protocol="cec") -> bn.DrillReport:
    storage, reference = three
    return bn.drill(keyed_three(), protocol=with_interval(protocol, interval_s=0.3),
                    faults=[bn.faults.KillInstance("sum", 2, at=1.5)],
                    reference=reference, storage=storage,
                    recovery=bn.Recovery(heartbeat_timeout_s=3.0))


@pytest.mark.slow
def test_cec_restarts_the_failed_instance_alone_fed_from_upstream_backups(three):
    """The sum instance that died loads its eventual checkpoint from its log; both
    source instances run on and resend it what they kept since the offsets its log
    replays after; it drops what its parts reflect. Nothing else restarts."""
    report = cec_kill(three)
    assert report.exactly_once, report.verdict_reason
    [fault] = report.faults
    assert sorted(fault.restarted_tasks) == ["out[2]", "sum[2]"]
    assert report.metrics.extra["attempts"] == 1
    loaded = [e for e in report.events if e["kind"] == "eventual_checkpoint_loaded"]
    assert loaded and not loaded[0]["replay_everything"]


@pytest.mark.internal
@pytest.mark.slow
def test_the_drill_says_lost_when_a_cec_backup_forgets_what_a_restart_needs(three):
    report = cec_kill(three, BrokenCec())
    assert report.metrics.extra["attempts"] == 1
    assert report.verdict == "violated"
    assert report.lost > 0, report.verdict_reason


# -- a loss while a restart deploys: the job restarts whole ------------------------------------


def recovery_taken(phase: str) -> list[str]:
    """Which way `FailureHandler.recover` goes for a worker lost in ``phase``, under a
    failover that restarts regions: the failure handler's own method, run on a
    stand-in holding only what the decision reads (each way in records its name and
    stops)."""
    from types import SimpleNamespace

    from bastion.runtime.failures import FailureHandler
    from bastion.scheduler.detector import Failure

    taken: list[str] = []

    async def nothing(*_args) -> None:
        return None

    async def lost(_failure) -> list[int]:
        return [1]

    async def region(_lost) -> None:
        taken.append("region")

    async def whole(_failure, _lost) -> None:
        taken.append("whole")

    handler = SimpleNamespace(
        stage=SimpleNamespace(phase=phase, attempt=1), regional=True, _region_broken=False,
        deployment=SimpleNamespace(pending=set()), job_error=lambda: None,
        region_restarts=0, standby_after_catch_up=False,
        config=SimpleNamespace(max_restarts=10, recovery=None),
        failover=SimpleNamespace(name="local", adaptive_buffering=False),
        protocol=SimpleNamespace(name="uncoordinated"),
        coordinator=SimpleNamespace(checkpoint_in_progress=lambda: None, stop=nothing),
        record_event=lambda kind, **fields: None, _lost_workers=lost,
        poll_progress=nothing, _restart_region=region, _replace_workers=whole,
        _recovery_line=nothing, _restore=None)
    asyncio.run(FailureHandler.recover(handler, Failure(f"a worker died during {phase}")))
    return taken


@pytest.mark.internal
def test_a_loss_while_a_restart_deploys_restarts_the_job_whole():
    """The first kill restarted the job; the second landed while its tasks were being
    deployed. Restarting the lost worker's region alone left the tasks deployed outside
    it never started, and the job waited for them for ever (two random kills under
    uncoordinated and cic timed out at 300 s). Before every task of the attempt ran,
    a loss restarts every task; once they run, only the region."""
    for phase in ("spawn", "deploy", "start"):
        assert recovery_taken(phase) == ["whole"], phase
    assert recovery_taken("watch") == ["region"]
