"""Savepoints: stop a running job with its state, resume it at another parallelism.

Real Ray, a real store (a local directory). A job is started in the background
(`bn.start`), stopped mid-stream with a savepoint (`RunHandle.stop`), and resumed with
its keyed operators at another parallelism (`bn.run(..., resume_from=...)`); the
outputs both jobs committed, together, must equal — as multisets — what plain Python
computes for a run that never stopped: a running sum per key, a tumbling count per
key and a Count(7) window per key. Then the refusals: what a savepoint cannot be
resumed into, and a damaged blob.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import bastion as bn
from bastion.runtime import savepoint as savepoints
from bastion.storage import open_store

pytestmark = pytest.mark.usefixtures("ray_session")

COUNT = 4000
KEYS = 23
RATE = 1500          # records/s: the stop lands mid-stream
WINDOW_S = 2.0


def event(i: int) -> dict:
    return {"k": f"k{i % KEYS}", "v": i, "ts": i * 0.01}


def topology(parallelism: int, *, source_parallelism: int = 1, agg=None,
             with_sums: bool = True, count: int = COUNT, rate: float | None = RATE
             ) -> bn.Topology:
    topo = bn.Topology("savepoints")
    events = topo.source("events", bn.sources.Generator(event, count=count, rate=rate),
                         parallelism=source_parallelism, timestamp=lambda e: e["ts"])
    keyed = events.key_by(lambda e: e["k"])
    if with_sums:
        keyed.reduce("sums", lambda acc, e: acc + e["v"], initial=0,
                     parallelism=parallelism).sink("summed", bn.sinks.Collect())
    keyed.window(bn.windows.Tumbling(WINDOW_S)).aggregate(
        "per-key", agg or bn.aggregations.Count(), parallelism=parallelism).sink(
        "tumbling", bn.sinks.Collect())
    keyed.window(bn.windows.Count(7)).aggregate(
        "sevens", bn.aggregations.Count(), parallelism=parallelism).sink(
        "counted", bn.sinks.Collect())
    return topo


def expected(count: int = COUNT) -> dict[str, Counter]:
    """A run that never stopped, in plain Python."""
    sums: dict[str, int] = defaultdict(int)
    summed, tumbling, sevens = [], Counter(), defaultdict(list)
    counted = []
    for i in range(count):
        e = event(i)
        sums[e["k"]] += e["v"]
        summed.append((e["k"], sums[e["k"]]))
        start = (e["ts"] // WINDOW_S) * WINDOW_S
        tumbling[(e["k"], start, start + WINDOW_S)] += 1
        sevens[e["k"]].append(e["ts"])
        if len(sevens[e["k"]]) == 7:
            counted.append((e["k"], sevens[e["k"]][0], e["ts"], 7))
            sevens[e["k"]] = []
    return {"summed": Counter(summed),
            "tumbling": Counter((k, s, e, n) for (k, s, e), n in tumbling.items()),
            "counted": Counter(counted)}


def stop_midway(topo: bn.Topology, protocol, storage: str,
                after_records: int = 800) -> bn.RunResult:
    """Start ``topo``, stop it with a savepoint once its sinks took
    ``after_records`` records, and return the stopped run's result."""
    seen = threading.Event()

    def progress(now: dict) -> None:
        if now.get("sink_records", 0) >= after_records:
            seen.set()

    handle = bn.start(topo, protocol, storage=storage, progress=progress)
    assert seen.wait(60), "the job never got going"
    return handle.stop()


def protocol_of(name: str):
    if name == "cec":
        return bn.protocols.Cec()
    return bn.protocols.named(name, interval_s=0.3)


@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated", "cec"])
@pytest.mark.parametrize("before,after", [(1, 3), (3, 2)])
def test_stop_and_resume_at_another_parallelism_is_exact(protocol, before, after,
                                                         tmp_path):
    storage = f"local://{tmp_path}"
    stopped = stop_midway(topology(before), protocol_of(protocol), storage)
    assert stopped.savepoint
    # stopped mid-stream: some of the input is left for the resumed job
    assert 0 < len(stopped.outputs["summed"]) < COUNT
    resumed = bn.run(topology(after), protocol_of(protocol), storage=storage,
                     resume_from=stopped.job_id)
    assert not resumed.savepoint
    want = expected()
    for sink, counts in want.items():
        got = Counter(stopped.outputs[sink]) + Counter(resumed.outputs[sink])
        assert got == counts, (sink, sorted((got - counts).items())[:5],
                               sorted((counts - got).items())[:5])
    # the savepoint split the keyed state by key group: at 3 instances each loaded
    # its own share of the one old instance's keys, at 2 from the old ones that
    # overlapped
    manifest = savepoints.read_manifest(open_store(storage), stopped.job_id)
    assert manifest is not None
    assert len(manifest.operators["sums"]["instances"]) == before


@pytest.fixture(scope="module")
def stopped_job(tmp_path_factory):
    storage = f"local://{tmp_path_factory.mktemp('savepoint')}"
    stopped = stop_midway(topology(2), protocol_of("coordinated"), storage)
    return storage, stopped


@pytest.mark.parametrize("changed,message", [
    (lambda: topology(2, source_parallelism=2),
     r"source 'events': parallelism 2, and 1 in the savepoint .* keeps its parallelism"),
    (lambda: topology(2, agg=bn.aggregations.Sum(lambda e: e["v"])),
     r"operator 'per-key': its state is 'window:Tumbling:Sum' now and "
     r"'window:Tumbling:Count' in the savepoint"),
    (lambda: topology(2, with_sums=False),
     r"operator 'sums': the savepoint of job .* holds its state, and the topology has "
     r"no operator of that name"),
])
def test_a_resume_that_cannot_be_is_refused_naming_the_operator(stopped_job, changed,
                                                                 message):
    storage, stopped = stopped_job
    with pytest.raises(bn.TopologyError, match=message):
        bn.run(changed(), protocol_of("coordinated"), storage=storage,
               resume_from=stopped.job_id)


def test_a_job_without_a_savepoint_is_refused(stopped_job):
    storage, _ = stopped_job
    plain = bn.run(topology(1), "coordinated", storage=storage)
    assert not plain.savepoint
    with pytest.raises(ValueError, match=r"it left no savepoint .* only protocol 'cec'"):
        bn.run(topology(1), "coordinated", storage=storage, resume_from=plain.job_id)


def test_a_damaged_savepoint_blob_is_never_loaded(tmp_path):
    storage = f"local://{tmp_path}"
    stopped = stop_midway(topology(1), protocol_of("coordinated"), storage)
    manifest = savepoints.read_manifest(open_store(storage), stopped.job_id)
    blob = manifest.operators["sums"]["instances"][0]
    path = Path(tmp_path) / blob["key"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"blob .*sums/0.* fails its CRC check"):
        bn.run(topology(1), protocol_of("coordinated"), storage=storage,
               resume_from=stopped.job_id)


def test_bastion_stop_stops_a_running_job_and_names_how_to_resume(tmp_path, capsys):
    from bastion import cli

    storage = f"local://{tmp_path}"
    handle = bn.start(topology(1), protocol_of("uncoordinated"), storage=storage)
    job = handle.job_id
    assert cli.main(["stop", job, "--savepoint", "--storage", storage]) == 0
    assert f"--resume-from {job}" in capsys.readouterr().out
    stopped = handle.result(60)
    assert stopped.savepoint and len(stopped.outputs["summed"]) < COUNT
    # a job that is not running has nothing to stop: said, not waited for forever
    assert cli.main(["stop", "no-such-job", "--storage", storage, "--timeout", "1"]) == 2


def test_a_prune_keeps_every_job_that_holds_a_savepoint(tmp_path):
    from bastion.storage import prune_jobs

    store = open_store(f"local://{tmp_path}")
    for job in ("old-with-savepoint", "old-plain"):
        store.put(f"jobs/{job}/events/0", b"x")
    store.put(savepoints.manifest_key("old-with-savepoint"), b"{}")
    report = prune_jobs(store, keep=0, min_age_s=0)
    assert [f.job for f in report.deleted] == ["old-plain"]
    assert store.exists(savepoints.manifest_key("old-with-savepoint"))


@pytest.mark.parametrize("protocol", ["coordinated", "uncoordinated", "cec"])
def test_a_kill_before_the_resumed_jobs_first_checkpoint_restarts_from_the_savepoint(
        protocol, tmp_path):
    """The resumed job loses a process before it has a checkpoint of its own (the
    checkpointing protocols' interval is longer than the run): "from the beginning"
    must mean from the savepoint — under cec, from the log the first start wrote the
    savepoint's parts into — and the outputs stay exact."""
    storage = f"local://{tmp_path}"
    slow = (bn.protocols.Cec() if protocol == "cec"
            else bn.protocols.named(protocol, interval_s=30.0))
    count = 100 * COUNT  # the resumed job reads the rest unpaced: a few seconds
    stopped = stop_midway(topology(2, count=count), slow, storage)
    resumed = bn.run(topology(3, count=count, rate=None), slow, storage=storage,
                     resume_from=stopped.job_id,
                     faults=[bn.faults.KillInstance("sums", 1, at=0.3)])
    assert len(resumed.metrics.protocol.failures) == 1
    for sink, counts in expected(count).items():
        got = Counter(stopped.outputs[sink]) + Counter(resumed.outputs[sink])
        assert got == counts, (sink, sorted((got - counts).items())[:5],
                               sorted((counts - got).items())[:5])


@pytest.mark.internal
def test_a_stop_that_a_failure_interrupts_is_reported_failed_not_a_savepoint(tmp_path):
    """The job master's side of a stop, against a real store, driven by hand: the
    request is taken, the sources told; a failure while stopping gives the stop up —
    `bn.stop` says why instead of waiting or reporting a savepoint — and a job whose
    input ended before the stop reached it has none either."""
    import asyncio

    store = open_store(f"local://{tmp_path}")
    store.put("jobs/j/events/0", b"x")
    events: list[str] = []
    told: list[bool] = []

    async def drive() -> None:
        watch = savepoints.StopWatch(store, "j", lambda kind, **_: events.append(kind),
                                     check_interval_s=0.01)

        async def stop_sources() -> None:
            told.append(True)

        waiting = asyncio.ensure_future(watch.watch(stop_sources))
        savepoints.request_stop(store, "j")
        await asyncio.wait_for(waiting, 5)
        assert told and watch.stopping and not savepoints.stop_requested(store, "j")
        await watch.on_failure()
        assert not watch.stopping
        # a later attempt finds no request: it runs on instead of stopping again
        assert not savepoints.stop_requested(store, "j")
        # and a stop whose input ended first writes no savepoint
        watch.stopping = True
        assert await watch.on_finished(None, [{"savepoint_stop": False}]) is None

    asyncio.run(drive())
    assert events == ["savepoint_started", "savepoint_failed", "savepoint_failed"]
    assert savepoints.read_manifest(store, "j") is None
    assert "input ended before the stop" in savepoints.failure(store, "j")
    # what bn.stop tells the user: it asks, the job master records the failure
    import time
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(bn.stop, "j", storage=f"local://{tmp_path}", timeout_s=10)
        while not savepoints.stop_requested(store, "j"):
            time.sleep(0.01)
        savepoints.fail(store, "j", "a task failed while the job was stopping")
        with pytest.raises(RuntimeError, match="did not stop with a savepoint: a task "
                                               "failed while the job was stopping"):
            asked.result(10)
