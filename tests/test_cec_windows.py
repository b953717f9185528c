"""Protocol "cec" over sliding and count windows and sliding joins, with real Ray
processes killed.

A sliding window's parts are its windows: a record goes into ``size / slide`` of them,
each with its own footprint, and a replayed record is taken or dropped by each window
on its own — in an aggregate and in a join alike. A count window's parts are its keys
(a key's current count window and the count of those it fired). Each workload is
checked three ways: a failure-free run against plain Python over the same input (no
engine in the reference), drills that kill the stateful operator mid-stream and must
be exactly-once, and a deliberately broken CEC — one that forgets the windows it
loads — that the drill must catch. The log of the failure-free run is read back too:
every part's ``G_open`` comes before anything else of that part (its G_checks, its
closing, its results), as the paper writes it; the in-process reconstruction and the
Spark job give the same EC; and the footprints hold what plain Python says they do.
"""

from __future__ import annotations

import math

import pytest

import bastion as bn
from bastion.drills import reference_runs
from bastion.protocols import eventual
from bastion.protocols.cec import CecPolicy, CecProtocol, CecTask, log_prefix
from bastion.storage import LogReader, open_store
from protocol_knobs import with_interval

pytestmark = pytest.mark.usefixtures("ray_session")

PAGES = 5
SIZE, SLIDE, N = 1.0, 0.25, 7


# Event times are multiples of 1/1024 — exact binary fractions, as are the windows'
# bounds — so the plain-Python reference puts each record in its windows without
# rounding; records come up to 2/1024 s out of order.
def click(i: int) -> dict:
    return {"page": f"p{(i * 7) % PAGES}", "n": i % 11, "ts": i / 512 - (i % 3) / 1024}


def sliding(count=4000, rate=2000, slide=SLIDE):
    """A keyed Sliding(1.0, 0.25) sum over two source instances: a window lives a few
    CEC periods, so windows open at a kill have G_checks and others only G_opens.
    ``slide=SIZE``: the same over Tumbling(1.0) windows."""
    topo = bn.Topology("cec-sliding")
    clicks = topo.source("clicks", bn.sources.Generator(click, count=count, rate=rate),
                         timestamp=lambda c: c["ts"], max_out_of_orderness=0.05,
                         parallelism=2)
    window = bn.windows.Tumbling(SIZE) if slide == SIZE else bn.windows.Sliding(SIZE, slide)
    clicks.key_by(lambda c: c["page"]).window(window).aggregate(
        "per-page", bn.aggregations.Sum(lambda c: c["n"]), parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


def counted(count=4000, rate=2000):
    """A keyed Count(7) sum. One source instance: the records of a key reach the
    window in the source's order, which is what says where each count window ends."""
    topo = bn.Topology("cec-count")
    clicks = topo.source("clicks", bn.sources.Generator(click, count=count, rate=rate),
                         timestamp=lambda c: c["ts"], max_out_of_orderness=0.05)
    clicks.key_by(lambda c: c["page"]).window(bn.windows.Count(N)).aggregate(
        "per-page", bn.aggregations.Sum(lambda c: c["n"]), parallelism=2).sink(
        "out", bn.sinks.Collect())
    return topo


def sliding_expected(count=4000, slide=SLIDE) -> list:
    """``(page, start, end, sum)`` of every sliding window any record falls in (all
    fire: the end of the stream fires what is still open)."""
    sums: dict[tuple[str, int], int] = {}
    for i in range(count):
        c = click(i)
        k = math.floor(c["ts"] / slide)
        while k * slide + SIZE > c["ts"]:  # window k holds k*slide <= ts < k*slide + SIZE
            sums[c["page"], k] = sums.get((c["page"], k), 0) + c["n"]
            k -= 1
    return sorted((page, k * slide, k * slide + SIZE, total)
                  for (page, k), total in sums.items())


def counted_expected(count=4000) -> list:
    """``(page, first ts, last ts, sum)`` of every full run of N records of a page, in
    source order (an incomplete last run never fires)."""
    runs: dict[str, list[dict]] = {}
    out = []
    for i in range(count):
        c = click(i)
        run = runs.setdefault(c["page"], [])
        run.append(c)
        if len(run) == N:
            out.append((c["page"], run[0]["ts"], run[-1]["ts"], sum(r["n"] for r in run)))
            run.clear()
    return sorted(out)


def order(i: int) -> dict:
    return {"user": f"u{i % USERS}", "order": i, "ts": i / 128}


def payment(i: int) -> dict:
    return {"user": f"u{(i * 5) % USERS}", "pay": i, "ts": i / 128 + 1 / 256}


USERS, JOIN_SIZE, JOIN_SLIDE = 31, 0.5, 0.25


def joined(count=2000, rate=1000):
    """Orders joined with payments of the same user in Sliding(0.5, 0.25) windows: a
    record is in two windows, and a pair is emitted once per window the two share."""
    topo = bn.Topology("cec-sliding-join")
    orders = topo.source("orders", bn.sources.Generator(order, count=count, rate=rate),
                         timestamp=lambda o: o["ts"])
    pays = topo.source("payments", bn.sources.Generator(payment, count=count, rate=rate),
                       timestamp=lambda p: p["ts"])
    orders.key_by(lambda o: o["user"]).join(
        pays.key_by(lambda p: p["user"]), "match",
        window=bn.windows.Sliding(JOIN_SIZE, JOIN_SLIDE), parallelism=2).map(
        "ids", lambda t: (t[0], t[1]["order"], t[2]["pay"])).sink("out", bn.sinks.Collect())
    return topo


def windows_holding(ts: float, size: float, slide: float) -> list[int]:
    """Plain Python: every k with k*slide <= ts < k*slide + size."""
    return [k for k in range(math.floor((ts - size) / slide), math.floor(ts / slide) + 1)
            if k * slide <= ts < k * slide + size]


def joined_expected(count=2000) -> list:
    """``(user, order, pay)`` once per window an order and a payment of the same user
    share."""
    pays: dict[str, list[dict]] = {}
    for i in range(count):
        p = payment(i)
        pays.setdefault(p["user"], []).append(p)
    out = []
    for i in range(count):
        o = order(i)
        mine = set(windows_holding(o["ts"], JOIN_SIZE, JOIN_SLIDE))
        for p in pays.get(o["user"], []):
            shared = mine & set(windows_holding(p["ts"], JOIN_SIZE, JOIN_SLIDE))
            out += [(o["user"], o["order"], p["pay"])] * len(shared)
    return sorted(out)


WORKLOADS = {"sliding": sliding, "count": counted, "join": joined,
             "tumbling": lambda: sliding(slide=SIZE)}
EXPECTED = {"sliding": sliding_expected, "count": counted_expected, "join": joined_expected,
            "tumbling": lambda: sliding_expected(slide=SIZE)}
OPERATOR = {"sliding": "per-page", "count": "per-page", "join": "match",
            "tumbling": "per-page"}
SLIDES = {"sliding": SLIDE, "tumbling": SIZE}
_references: dict[str, list] = {}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return f"local://{tmp_path_factory.mktemp('cec-windows')}"


def reference(workload: str, storage: str) -> list:
    if workload not in _references:
        _references[workload] = reference_runs(WORKLOADS[workload](), storage=storage)
    return _references[workload]


EAGER = CecPolicy(extent_target=5, replay_target=50, period_s=0.02)


def cec_drill(workload, storage, faults, protocol="cec", policy=None):
    knobs = {} if policy is None else {"policy": policy}
    return bn.drill(WORKLOADS[workload](),
                    protocol=with_interval(protocol, interval_s=0.3, **knobs),
                    faults=faults, reference=reference(workload, storage), storage=storage)


def loaded(report) -> list[dict]:
    return [e for e in report.events if e["kind"] == "eventual_checkpoint_loaded"]


# -- failure-free: the windows are right, and each writes its own footprints ----------

_failure_free: dict[str, tuple] = {}


def failure_free(workload: str, storage: str) -> tuple:
    """(topology, result) of one run of ``workload`` under an eager policy — parts get
    G_checks as well as G_opens — shared by the tests that read its outputs and log."""
    if workload not in _failure_free:
        topo = WORKLOADS[workload]()
        _failure_free[workload] = topo, bn.run(topo,
                                               protocol=bn.protocols.Cec(policy=EAGER), storage=storage)
    return _failure_free[workload]


def log_in_order(topo, workload: str, store, job: str, instance: int) -> list[tuple]:
    """An instance's log as ``(what, parts)`` in log order: "open", "check" and
    "closed" with the parts the control tuple names, "result" with the part each
    result came from (a sliding window's number from its start, a count window's key,
    a join pair's window from its lineage id)."""
    from bastion.lineage import ids_of, op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.runtime.operators import OperatorContext, make_operator

    name = OPERATOR[workload]
    op = make_operator(topo.nodes[name], OperatorContext(
        name, instance, 2, False, code=op_codes(topo)[name], lineage=True))
    codec = DurableCodec()
    what = {eventual.G_OPEN: "open", eventual.G_CHECK: "check", eventual.CLOSED: "closed"}
    log = []
    for _, _, value in LogReader(store, log_prefix(job, name, instance)).records():
        if eventual.is_control(value):
            log.append((what[value[0]], codec.unpack_many(list(eventual.parts_of(value)),
                                                          "part")))
            continue
        batch = op.results_batch(codec.unpack(value[1], "results"))
        if workload in SLIDES:
            parts = [round(v[1] / SLIDES[workload]) for v in batch.values]
        elif workload == "count":
            parts = list(batch.keys)
        else:
            parts = [pair_id[3] for pair_id in ids_of(batch.ids)]
        log.append(("result", parts))
    return log


def out_of_paper_order(log: list[tuple]) -> list[str]:
    """What breaks the paper's order in ``log`` (`log_in_order`): a part's G_open
    first — before its G_checks, its closing and its results — and one per opening."""
    open_, wrong = set(), []
    for what, parts in log:
        for part in parts:
            if what == "open":
                if part in open_:
                    wrong.append(f"a second G_open of open part {part!r}")
                open_.add(part)
            elif part not in open_:
                wrong.append(f"a {what} of part {part!r} before its G_open")
            elif what == "closed":
                open_.discard(part)
    return wrong


def test_the_order_check_sees_a_log_out_of_the_papers_order():
    assert out_of_paper_order([("open", [1]), ("result", [1, 1]), ("check", [1]),
                               ("closed", [1]), ("open", [1])]) == []
    assert out_of_paper_order([("result", [3]), ("open", [3])]) == [
        "a result of part 3 before its G_open"]
    assert out_of_paper_order([("open", [1]), ("closed", [1]), ("check", [1])]) == [
        "a check of part 1 before its G_open"]
    assert out_of_paper_order([("open", [2]), ("open", [2])]) == [
        "a second G_open of open part 2"]


@pytest.mark.parametrize("workload", ["sliding", "count", "join", "tumbling"])
def test_a_failure_free_run_equals_plain_python_and_logs_in_the_papers_order(workload,
                                                                             storage):
    topo, result = failure_free(workload, storage)
    assert sorted(result.outputs["out"]) == EXPECTED[workload]()
    store = open_store(storage)
    for instance in (0, 1):
        log = log_in_order(topo, workload, store, result.job_id, instance)
        assert out_of_paper_order(log) == []
        kinds = [what for what, parts in log for _ in parts]
        assert kinds.count("open") > 0 and kinds.count("check") > 0
        if workload == "count":
            # a part per key of the instance, opened once and never closed
            pages = {p for p, *_ in EXPECTED["count"]() if bn.instance_of(p, 2) == instance}
            assert kinds.count("open") == len(pages)
            assert kinds.count("closed") == 0
        else:
            assert kinds.count("closed") > 0


# -- drills ----------------------------------------------------------------------------


@pytest.mark.parametrize("workload,at,policy", [
    (w, at, policy) for w in ("sliding", "count") for at, policy in
    ((0.8, None), (1.3, None), (1.3, EAGER))] + [("join", 1.0, None), ("join", 1.3, EAGER)],
    ids=lambda v: "eager" if v is EAGER else "default" if v is None else str(v))
def test_killing_the_window_operator_loses_and_duplicates_nothing(workload, at, policy,
                                                                  storage):
    """Default policy: the parts open at the kill have G_opens; eager: G_checks."""
    report = cec_drill(workload, storage,
                       [bn.faults.KillInstance(OPERATOR[workload], 0, at=at)],
                       policy=policy)
    assert loaded(report), "the restart must have gone through the eventual checkpoints"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.corrupted == 0, report.corrupted_examples
    assert report.faults_landed and report.exactly_once, report.verdict_reason


@pytest.mark.parametrize("workload", ["sliding", "count", "join"])
def test_random_kills_on_windows_under_cec_are_exactly_once(workload, storage):
    report = cec_drill(workload, storage,
                       [bn.faults.RandomKills(count=1, between=(0.5, 1.4), seed=3)])
    assert report.faults_landed and report.exactly_once, report.verdict_reason


class ForgetsLoadedParts(CecTask):
    """Loads the eventual checkpoint's positions but not its parts' states: every
    window open at the failure starts again empty (a key: from nothing), and drops the
    replayed records its footprint said it held."""

    async def restore(self, recovery_line):
        found = self.task.chain.parted_operator()
        if found is not None:
            operator = found[1]
            load = operator.load_part
            operator.load_part = (
                (lambda part, state: load(part, operator.empty_part_state()))
                if operator.opens_empty else (lambda part, state: None))
        await super().restore(recovery_line)


class Broken(CecProtocol):
    def task_protocol(self, task):
        return ForgetsLoadedParts(task, self.policy)


@pytest.mark.parametrize("workload", ["sliding", "count", "join"])
def test_the_drill_catches_a_cec_that_does_not_restore_its_parts(workload, storage):
    # Eager G_checks: a window's G_open holds the empty state it opened with, so only
    # a G_check gives a loaded window something to forget.
    report = cec_drill(workload, storage,
                       [bn.faults.KillInstance(OPERATOR[workload], 0, at=1.3)],
                       protocol=Broken(), policy=EAGER)
    assert loaded(report) and not loaded(report)[0]["replay_everything"]
    assert report.verdict == "violated"
    assert report.corrupted + report.lost > 0


class OpensAfterTheBatch(CecTask):
    """Writes a window's G_open as the empty state it opened with, but at the position
    after the batch that opened it: a recovery from it drops that batch's records of
    the window, which the window never held."""

    async def restore(self, recovery_line):
        await super().restore(recovery_line)
        operator = self.operator
        if operator is not None:
            burst = operator._burst
            operator._burst = lambda kind, parts, keys, states, at=None: burst(
                kind, parts, keys, states)


class OpensLate(CecProtocol):
    def task_protocol(self, task):
        return OpensAfterTheBatch(task, self.policy)


@pytest.mark.internal
def test_the_drill_catches_an_empty_g_open_placed_after_its_batch(storage):
    report = cec_drill("sliding", storage,
                       [bn.faults.KillInstance(OPERATOR["sliding"], 0, at=1.3)],
                       protocol=OpensLate())
    assert loaded(report) and not loaded(report)[0]["replay_everything"]
    assert report.verdict == "violated"
    assert report.lost + report.corrupted > 0


# -- the footprints, read back ---------------------------------------------------------


@pytest.mark.parametrize("workload", ["sliding", "tumbling"])
def test_window_footprints_rebuild_the_same_ec_in_python_and_in_spark(workload, storage,
                                                                      spark):
    """Mid-run (log time ``at``), each open window's footprint holds, per page, the sum
    of exactly the records of that window at or below its position — plain Python
    over the input — and Spark's EC equals the in-process one."""
    from bastion.lineage import op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.spark_jobs.reconstruct import reconstruct_operator

    store = open_store(storage)
    topo, result = failure_free(workload, storage)
    code = op_codes(topo)["clicks"]
    decode = DurableCodec().unpack
    checked = 0
    for instance in (0, 1):
        # plain Python: the records of each window that reach this instance
        in_window: dict[int, list[dict]] = {}
        for i in range(4000):
            c = click(i)
            if bn.instance_of(c["page"], 2) == instance:
                for k in windows_holding(c["ts"], SIZE, SLIDES[workload]):
                    in_window.setdefault(k, []).append({**c, "i": i})
        prefix = log_prefix(result.job_id, "per-page", instance)
        times = [ts for _, ts, _ in LogReader(store, prefix).records()]
        at = times[len(times) // 2]
        ec, damage = eventual.read_eventual_checkpoint(store, prefix, at=at)
        assert not damage and ec.complete and ec.parts
        by_spark = {r.instance: r.ec for r in reconstruct_operator(
            spark, store, result.job_id, "per-page", at=at, write=False)}
        assert by_spark[str(instance)].to_wire() == ec.to_wire()
        for part, fp in ec.parts.items():
            k = decode(part, "part")
            sums, _ = decode(fp.state, "state")
            expected: dict[str, int] = {}
            for c in in_window.get(k, []):
                # source instance j reads i = j, j + 2, ...: position (i - j) // 2
                if c["i"] // 2 <= fp.position.get(f"{code}/{c['i'] % 2}", -1):
                    expected[c["page"]] = expected.get(c["page"], 0) + c["n"]
            assert sums == expected, k
            checked += 1
    assert checked > 0


def test_count_footprints_rebuild_the_same_ec_in_python_and_in_spark(storage, spark):
    """At the end of the log every key's part is open (a count window's part never
    closes): its footprint holds the windows the key fired and its current one — plain
    Python over the records of the key at or below the footprint's position — and
    Spark's EC equals the in-process one."""
    from bastion.lineage import op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.spark_jobs.reconstruct import reconstruct_operator

    store = open_store(storage)
    topo, result = failure_free("count", storage)
    source = f"{op_codes(topo)['clicks']}/0"   # one source instance: position = i
    decode = DurableCodec().unpack
    by_spark = {r.instance: r.ec for r in reconstruct_operator(
        spark, store, result.job_id, "per-page", write=False)}
    pages = set()
    for instance in (0, 1):
        ec, damage = eventual.read_eventual_checkpoint(
            store, log_prefix(result.job_id, "per-page", instance))
        assert not damage and ec.complete and ec.parts
        assert by_spark[str(instance)].to_wire() == ec.to_wire()
        for part, fp in ec.parts.items():
            page = decode(part, "part")
            pages.add(page)
            mine = [click(i) for i in range(fp.position[source] + 1)
                    if click(i)["page"] == page]
            current = mine[len(mine) - len(mine) % N:]
            expected = [len(mine) // N, [len(current), current[0]["ts"],
                                         sum(c["n"] for c in current)] if current else None]
            assert decode(fp.state, "state") == expected, page
    assert pages == {f"p{p}" for p in range(PAGES)}


def test_sliding_join_footprints_rebuild_the_same_ec_in_python_and_in_spark(storage, spark):
    """Mid-run, each open window's footprint holds, per user, exactly the orders and
    the payments of that window at or below its position — plain Python over the
    input — and Spark's EC equals the in-process one."""
    from bastion.lineage import op_codes
    from bastion.runtime.durable import DurableCodec
    from bastion.spark_jobs.reconstruct import reconstruct_operator

    store = open_store(storage)
    topo, result = failure_free("join", storage)
    codes = op_codes(topo)
    decode = DurableCodec().unpack
    checked = 0
    for instance in (0, 1):
        prefix = log_prefix(result.job_id, "match", instance)
        times = [ts for _, ts, _ in LogReader(store, prefix).records()]
        at = times[len(times) // 2]
        ec, damage = eventual.read_eventual_checkpoint(store, prefix, at=at)
        assert not damage and ec.complete and ec.parts
        by_spark = {r.instance: r.ec for r in reconstruct_operator(
            spark, store, result.job_id, "match", at=at, write=False)}
        assert by_spark[str(instance)].to_wire() == ec.to_wire()
        for part, fp in ec.parts.items():
            k = decode(part, "part")
            state = decode(fp.state, "state")
            for side, (make, source, field) in enumerate(
                    [(order, "orders", "order"), (payment, "payments", "pay")]):
                upto = fp.position.get(f"{codes[source]}/0", -1)
                expected: dict[str, list[int]] = {}
                for i in range(upto + 1):
                    r = make(i)
                    if (k in windows_holding(r["ts"], JOIN_SIZE, JOIN_SLIDE)
                            and bn.instance_of(r["user"], 2) == instance):
                        expected.setdefault(r["user"], []).append(i)
                held = {user: [v[field] for v in sides[side][0]] if sides[side] else []
                        for user, sides in state.items()}
                assert {u: v for u, v in held.items() if v} == expected, (k, source)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("lineage", [True, False])
def test_count_window_results_come_back_exactly_from_their_log_form(lineage, n):
    """A count window logs its results as columns (`CountWindowOp.results_form`):
    packed by the state codec and read back, they give the very batch it emitted —
    keys and aggregates of any type, event times, born and lineage ids. A window of
    one record (``Count(1)``) leaves its first times out (they are its last ones);
    a longer window keeps them, each its first record's."""
    from bastion.lineage import IdRun
    from bastion.runtime.durable import DurableCodec
    from bastion.runtime.operators import OperatorContext, make_operator
    from bastion.runtime.records import Batch

    topo = bn.Topology("count-form")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v).window(
        bn.windows.Count(n)).aggregate("agg", bn.aggregations.Sum(lambda v: v[0])).sink(
        "out", bn.sinks.Discard())
    op = make_operator(topo.nodes["agg"], OperatorContext("agg", 0, 1, False, code=1,
                                                          lineage=lineage))
    keys = ["a", 7, ("t", 1), "a", 7, ("t", 1), 2.5, 2.5]
    ts = [0.5, 1, 2.25, 3.0, 4.5, 5.0, 6.0, -7.0]
    values = [[1], [2.5], [3], [4], [5.5], [6], [7], [8]]  # sums of ints and of floats
    batch = Batch(keys, values, ts, [10.0 + i for i in range(8)],
                  IdRun(0, 0, tuple(range(8))) if lineage else None)
    out = op.process(batch, 0)
    assert len(out) == 8 // n
    codec = DurableCodec()
    form = op.results_form(out)
    assert (form[3][2] is None) == (n == 1)   # the first times' column
    back = op.results_batch(codec.unpack(codec.pack(form), "k"))
    assert (back.keys, back.values, back.ts, back.born, back.ids) == (
        out.keys, out.values, out.ts, out.born, out.ids)
    assert [type(t) for t in back.ts] == [type(t) for t in out.ts]
    with pytest.raises(ValueError, match="operator 'agg': logged results are not a count"):
        op.results_batch([[1], [(1,)], [0.5], [0.5], None])


def test_count_window_results_keep_the_bytes_their_times_and_numbers_differ_by():
    """Event times logged as each one's bits XOR the one before's and firing numbers as
    differences (`CountWindowOp.results_form`): ``Count(1)`` over 2 keys, every input a
    result, logs 5-6 bytes a result where plain columns took 14 — and they come back
    exactly, as do results logged the plain way (by the version before)."""
    from bastion.lineage import IdRun
    from bastion.runtime.columns import pack_float64, pack_ints
    from bastion.runtime.durable import DurableCodec
    from bastion.runtime.operators import OperatorContext, make_operator
    from bastion.runtime.records import FLOAT64, FLOAT64_XOR, Batch

    topo = bn.Topology("count-form-xor")
    topo.source("src", bn.sources.Collection([])).key_by(lambda v: v[0]).window(
        bn.windows.Count(1)).aggregate("agg", bn.aggregations.Count()).sink(
        "out", bn.sinks.Discard())
    op = make_operator(topo.nodes["agg"], OperatorContext("agg", 0, 1, False, code=1,
                                                          lineage=True))
    size = 4096

    def batch(start: int) -> Batch:
        records = range(start, start + size)
        return Batch([i % 2 for i in records], [(i % 2, i) for i in records],
                     [i / 2.0 for i in records], [0.0] * size, IdRun(0, 0, tuple(records)))

    for start in range(0, 140_000, size):   # past 65,536 firings a key
        op.process(batch(start), 0)
    out = op.process(batch(140_000), 0)
    codec = DurableCodec()
    form = op.results_form(out)
    assert form[4][3] == FLOAT64_XOR and form[2][0] & 0x80   # times XOR, numbers differences
    assert len(codec.pack(form)) < 6 * size
    back = op.results_batch(codec.unpack(codec.pack(form), "k"))
    assert (back.keys, back.values, back.ts, back.born, list(back.ids)) == (
        out.keys, out.values, out.ts, out.born, list(out.ids))
    # the plain form, as the version before logged it: 14 bytes a result, read the same
    plain = [*form[:2], pack_ints(out.ids.numbers), [*form[3][:3], pack_float64(out.ts)],
             [*form[4][:3], FLOAT64], *form[5:]]
    assert len(codec.pack(plain)) > 13 * size
    again = op.results_batch(codec.unpack(codec.pack(plain), "k"))
    assert (again.keys, again.values, again.ts, list(again.ids)) == (
        out.keys, out.values, out.ts, list(out.ids))
