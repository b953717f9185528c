"""Drill verdicts on real runs: right on order-sensitive topologies, and able to fail.

Two halves, both through `bn.drill`:

- Order-sensitive topologies — a running sum behind a parallel filter next to an
  event-time tumbling Sum (the topology of issue 9), and a running sum over a keyed
  join of two parallel streams — commit different intermediate values in two correct
  runs. They must pass a failure-free drill with 0/0/0 and random-kill drills under
  every exactly-once protocol. A variant on ingest time cannot run deterministic and
  is verified by ids.
- The verifier can fail: runs under deliberately broken protocols (test-only
  subclasses, shipped to the workers as objects) — a commit applied twice, a staged
  commit dropped, a frame dropped on a channel, sources restored from an older
  checkpoint than the rest — must give ``exactly_once is False`` with the right
  counter, and a kill that never lands must give an inconclusive drill.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import bastion as bn
import bastion.drills
from bastion.drills import reference_runs
from bastion.protocols.coordinated import CoordinatedProtocol
from bastion.runtime.records import Batch
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

PROTOCOLS = ["coordinated", "uncoordinated", "cic"]


def txn(i: int) -> dict:
    return {"account": f"a{(i * 7) % 11}", "merchant": f"m{i % 5}",
            "amount": (i * 13) % 97 + 1, "ts": i * 0.001}


def accounts(event_time: bool = True, count: int = 4000, rate: float = 2000) -> bn.Topology:
    """Issue 9's topology: transactions → parallel filter → per-account running
    balance, and per-merchant Sum in 0.5 s tumbling windows of the same stream."""
    topo = bn.Topology("drill-accounts" if event_time else "drill-accounts-ingest-time")
    txns = topo.source("txns", bn.sources.Generator(txn, count=count, rate=rate),
                       timestamp=(lambda t: t["ts"]) if event_time else None)
    valid = txns.filter("valid", lambda t: t["amount"] % 10 != 0, parallelism=2)
    valid.key_by(lambda t: t["account"]).reduce(
        "balance", lambda acc, t: acc + t["amount"], initial=0, parallelism=2).sink(
        "balances", bn.sinks.Collect())
    valid.key_by(lambda t: t["merchant"]).window(bn.windows.Tumbling(0.5)).aggregate(
        "per-merchant", bn.aggregations.Sum(lambda t: t["amount"]), parallelism=2).sink(
        "merchants", bn.sinks.Collect())
    return topo


def join_then_sum(count: int = 2000, rate: float = 1000) -> bn.Topology:
    """Orders and payments, two sources of parallelism 2, joined per user in 0.2 s
    windows; a running sum per user over the matches."""
    topo = bn.Topology("drill-join-sum")
    orders = topo.source("orders", bn.sources.Generator(
        lambda i: {"user": i % 29, "amount": i % 17 + 1, "ts": i * 0.001},
        count=count, rate=rate), parallelism=2, timestamp=lambda o: o["ts"])
    pays = topo.source("payments", bn.sources.Generator(
        lambda i: {"user": (i * 3) % 29, "fee": i % 5, "ts": i * 0.001 + 0.0005},
        count=count, rate=rate), parallelism=2, timestamp=lambda p: p["ts"])
    matched = orders.key_by(lambda o: o["user"]).join(
        pays.key_by(lambda p: p["user"]), "match", window=bn.windows.Tumbling(0.2),
        parallelism=2)
    matched.key_by(lambda m: m[0]).reduce(
        "spent", lambda acc, m: acc + m[1]["amount"] * 10 + m[2]["fee"], initial=0,
        parallelism=2).sink("totals", bn.sinks.Collect())
    return topo


SHAPES = {"accounts": accounts, "join-sum": join_then_sum,
          "accounts-ingest-time": lambda: accounts(event_time=False)}
_references: dict[str, list] = {}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('verdicts')}"


def reference(shape: str, storage: str) -> list:
    if shape not in _references:
        _references[shape] = reference_runs(SHAPES[shape](), storage=storage)
    return _references[shape]


def show(report: bn.DrillReport) -> str:
    """What a failing assertion prints: the verdict and the first violations."""
    examples = [report.describe(v) for kind in ("lost", "duplicated", "corrupted")
                for v in report.comparison.examples[kind][:3]]
    return "\n".join([report.verdict_reason, *examples])


# -- the verdict is right on order-sensitive topologies ---------------------------------


@pytest.mark.parametrize("shape,verified_by", [("accounts", "deterministic"),
                                               ("join-sum", "deterministic"),
                                               ("accounts-ingest-time", "ids")])
def test_a_failure_free_drill_of_an_order_sensitive_topology_is_clean(shape, verified_by,
                                                                       storage):
    report = bn.drill(SHAPES[shape](), protocol=bn.protocols.Coordinated(interval_s=0.4),
                      reference=reference(shape, storage), storage=storage)
    assert report.verified_by == verified_by
    assert (report.lost, report.duplicated, report.corrupted) == (0, 0, 0), show(report)
    assert report.verdict == "exactly-once" and report.exactly_once
    c = report.comparison
    assert c.reference_records > 1000
    if verified_by == "deterministic":
        assert c.comparable_ids == c.comparable_values == c.reference_records
    else:
        # the running balance's values depend on the interleaving: ids only; the
        # ingest-time windows differ between runs: not even their ids are comparable
        assert report.nondeterminism and "ingest time" in report.nondeterminism
        assert c.comparable_ids > 0 and c.comparable_values == 0
        assert "balance in balances" in report.verification()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("shape", ["accounts", "join-sum"])
def test_random_kills_on_an_order_sensitive_topology_are_exactly_once(shape, protocol,
                                                                      storage):
    report = bn.drill(SHAPES[shape](), protocol=with_interval(protocol, interval_s=0.4),
                      faults=[bn.faults.RandomKills(1, between=(0.6, 1.4))], seed=3,
                      reference=reference(shape, storage), storage=storage)
    assert report.verified_by == "deterministic"
    [fault] = report.faults
    assert fault.landed, fault.note
    assert fault.detection_s is not None and fault.restart_s is not None
    assert (report.lost, report.duplicated, report.corrupted) == (0, 0, 0), show(report)
    assert report.exactly_once


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("seed", [11, 12])
def test_more_kill_schedules_on_order_sensitive_topologies(protocol, seed, storage):
    for shape in ("accounts", "join-sum"):
        report = bn.drill(SHAPES[shape](), protocol=with_interval(protocol, interval_s=0.3),
                          faults=[bn.faults.RandomKills(2, between=(0.5, 1.6))], seed=seed,
                          reference=reference(shape, storage), storage=storage)
        assert report.faults_landed, [f.note for f in report.faults]
        assert report.exactly_once, show(report)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_random_kills_verified_by_ids_are_exactly_once(protocol, storage):
    report = bn.drill(SHAPES["accounts-ingest-time"](),
                      protocol=with_interval(protocol, interval_s=0.4),
                      seed=5,
                      faults=[bn.faults.RandomKills(1, between=(0.6, 1.4))],
                      reference=reference("accounts-ingest-time", storage), storage=storage)
    assert report.verified_by == "ids"
    assert report.faults_landed, [f.note for f in report.faults]
    assert report.exactly_once, show(report)


# -- the verifier can fail ---------------------------------------------------------------


class BrokenCoordinated(CoordinatedProtocol):
    """Coordinated checkpoints with one deliberate defect, planted in every task as
    it is built. The task half stays the real one (aligned barriers, or unaligned in
    deterministic mode): the defect sits in the task mechanics it calls — the views of
    its context (``ctx``) or the runtime task behind them (``task``)."""

    def task_protocol(self, ctx):
        half = super().task_protocol(ctx)
        self.plant(ctx, ctx._task)
        return half

    def plant(self, ctx, task) -> None:
        raise NotImplementedError


def restage(task, staged) -> None:
    """Hand records taken from the sinks back to them, ids included."""
    for sink, values, ids in staged:
        if values:
            now = time.time()
            sink.process(Batch(None, values, [now] * len(values), [now] * len(values), ids),
                         0)


class CommitTwice(BrokenCoordinated):
    """A sink task stages the outputs of its first checkpoint under that checkpoint
    and again under the next commit point: one commit applied twice."""

    def plant(self, ctx, task) -> None:
        if not task.sinks:
            return
        checkpoint, done = ctx.state.checkpoint, []

        def twice(checkpoint_id):
            staged = [(sink, *sink.take_staged()) for sink in task.sinks]
            restage(task, staged)
            upload = checkpoint(checkpoint_id)       # stages them under this commit
            if not done and any(values for _, values, _ in staged):
                done.append(checkpoint_id)
                restage(task, staged)                # ... and under the next one
            return upload

        ctx.state.checkpoint = twice


class DropStagedCommit(BrokenCoordinated):
    """A sink task loses what it staged for its first checkpoint: the state moves on,
    the records are never committed."""

    def plant(self, ctx, task) -> None:
        if not task.sinks:
            return
        checkpoint, done = ctx.state.checkpoint, []

        def dropping(checkpoint_id):
            if not done and any(sink.writer.staged for sink in task.sinks):
                done.append(checkpoint_id)
                for sink in task.sinks:
                    sink.take_staged()
            return checkpoint(checkpoint_id)

        ctx.state.checkpoint = dropping


class DropFrame(BrokenCoordinated):
    """The task of operator ``op`` empties the first data frame it sends on its first
    channel; the frame still goes out with its sequence number (otherwise the
    receiver would wait for it for ever), only its records are gone."""

    def __init__(self, op: str):
        self.op = op

    def plant(self, ctx, task) -> None:
        if task.op_names[0] != self.op or task.index != 0:
            return
        connect, done = task.connect, []

        def empty_once(frame):
            if not done and any(type(e) is Batch and len(e) for e in frame):
                done.append(True)
                return [e for e in frame if type(e) is not Batch]
            return frame

        def connecting(route, channels):
            if not task.channels and channels:
                channels[0].decorate = empty_once
            connect(route, channels)

        task.connect = connecting


class SourcesRestoreOlder(BrokenCoordinated):
    """After a failure, source tasks restore from the retained checkpoint before the
    recovery line — or, when none is retained yet (a busy machine completed only one
    before the kill), not at all: they replay from the beginning — while every other
    task restores the line: the others' state already holds input the sources replay."""

    def plant(self, ctx, task) -> None:
        if task.source is None:
            return
        restore_from = ctx.state.restore_from

        async def older(checkpoint_id):
            complete = await asyncio.to_thread(task.checkpoints.list_complete)
            earlier = [c for c in complete if c < checkpoint_id]
            if earlier:
                await restore_from(max(earlier))

        ctx.state.restore_from = older


def broken_drill(protocol, storage, **options) -> bn.DrillReport:
    return bn.drill(accounts(), protocol=with_interval(protocol, interval_s=0.3),
                    reference=reference("accounts", storage), storage=storage, **options)


@pytest.mark.internal  # plants its defect in the task behind the context
def test_a_commit_applied_twice_is_duplicated(storage):
    report = broken_drill(CommitTwice(), storage)
    assert report.exactly_once is False and report.verdict == "violated"
    assert report.duplicated > 0, show(report)
    assert report.lost == 0
    assert all(len(v.got) == 2 for v in report.duplicated_examples)


@pytest.mark.internal  # plants its defect in the task behind the context
def test_a_dropped_staged_commit_is_lost(storage):
    report = broken_drill(DropStagedCommit(), storage)
    assert report.exactly_once is False and report.verdict == "violated"
    assert report.lost > 0, show(report)
    assert report.duplicated == 0


@pytest.mark.internal  # plants its defect in the task behind the context
def test_a_dropped_staged_commit_is_lost_in_ids_mode_too(storage):
    # Ids mode does not require the ids of ingest-time windows; the running balances
    # beside them are still required, so a dropped commit is still seen.
    report = bn.drill(SHAPES["accounts-ingest-time"](),
                      protocol=DropStagedCommit(interval_s=0.3),
                      storage=storage,
                      reference=reference("accounts-ingest-time", storage))
    assert report.verified_by == "ids"
    assert report.exactly_once is False and report.verdict == "violated"
    assert report.lost > 0, show(report)
    assert {v.sink for v in report.lost_examples} == {"balances"}


@pytest.mark.internal  # plants its defect in the task behind the context
def test_a_frame_dropped_on_a_channel_is_lost(storage):
    report = broken_drill(DropFrame("txns"), storage)
    assert report.exactly_once is False and report.verdict == "violated"
    assert report.lost > 0, show(report)


@pytest.mark.internal  # plants its defect in the task behind the context
def test_state_restored_from_a_checkpoint_newer_than_the_replay_start_is_corrupted(storage):
    report = broken_drill(SourcesRestoreOlder(), storage,
                          faults=[bn.faults.KillInstance("balance", 0, at=1.2)])
    assert report.faults_landed, [f.note for f in report.faults]
    assert report.exactly_once is False and report.verdict == "violated"
    # the replayed input is counted again by states that already hold it
    assert report.corrupted > 0, show(report)


def test_a_kill_that_never_lands_makes_the_drill_inconclusive(storage):
    report = bn.drill(accounts(), protocol=bn.protocols.Coordinated(interval_s=0.4),
                      faults=[bn.faults.KillInstance("balance", 0, at=60.0)],
                      reference=reference("accounts", storage), storage=storage)
    assert (report.lost, report.duplicated, report.corrupted) == (0, 0, 0)
    assert report.verdict == "inconclusive" and report.exactly_once is False
    [fault] = report.faults
    assert not fault.landed and "job ended" in fault.note
    assert "did not land" in report.verdict_reason


def test_a_bad_fault_target_fails_before_any_run(storage, monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("a run started before the fault targets were checked")

    monkeypatch.setattr(bastion.drills, "run", no_run)
    with pytest.raises(ValueError, match="no operator named 'nope'"):
        bn.drill(accounts(), protocol="coordinated",
                 faults=[bn.faults.KillInstance("nope", 0, at=1.0)], storage=storage)
    with pytest.raises(ValueError, match="has no instance 5"):
        bn.drill(accounts(), protocol="coordinated",
                 faults=[bn.faults.KillInstance("balance", 5, at=1.0)], storage=storage)
