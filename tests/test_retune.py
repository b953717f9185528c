"""Live re-tuning of the checkpoint interval (`bastion.scheduler.retune`).

(a) plain Python: the decision against a brute-force optimum — a rate that doubles
moves the interval down to the longest one whose worst-case TRT (the catch-up series
summed term by term) meets the bound; a steady rate leaves it; a rate that halves
moves it up; a bound no interval meets says so and takes the shortest tuned
interval; the re-tuner reports only moves and turned verdicts. The coordinator takes a
new interval in the middle of its wait.
(b) real Ray: a job whose input rate doubles mid-run moves its interval within two
re-tune periods, and the job master records the move; `bastion run --retune-every`
refuses what it cannot do before anything runs. (The TRT after the move, under a
real kill, is measured by ``benchmarks/retune.py``: timing is no test assertion.)"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

import bastion as bn
from bastion import cli
from bastion.protocols import get_protocol
from bastion.scheduler import tuning as tm
from bastion.scheduler.retune import RetunePolicy, Retuner, decide
from bastion.scheduler.tuning import Capacity, Measurement, build_model

I_MAX = 1000.0
T, R = 0.05, 0.2
BOUND_S = 1.6
RANGE = (0.5, 4.0)


def model_at(rate: float = 300.0) -> tm.Model:
    """Profiled at ``rate`` over six intervals: T, R fixed, no warm-up, latency falling
    with the interval (so the longest interval meeting the bound is the best)."""
    runs = [Measurement(ci, rate, 20.0 - 2.0 * ci, T, R) for ci in tm.grid(*RANGE, 6)]
    return build_model(runs, Capacity(I_MAX, 0.0))


def brute_force_trt(interval_s: float, u: float) -> float:
    """Eq 5's worst case, the catch-up terms added one by one."""
    term, total = (interval_s + T + R) * u, 0.0
    while True:
        total += term
        if term < 0.001:
            return T + R + total
        term *= u


def brute_force_optimum(u: float) -> float | None:
    """The longest interval of the range (on a 1-ms grid) whose worst case meets the
    bound: latency falls with the interval."""
    steps = round((RANGE[1] - RANGE[0]) * 1000)
    feasible = [RANGE[0] + i / 1000 for i in range(steps + 1)
                if brute_force_trt(RANGE[0] + i / 1000, u) <= BOUND_S]
    return max(feasible) if feasible else None


def policy(model: tm.Model | None = None, **overrides) -> RetunePolicy:
    return RetunePolicy(**{"model": model or model_at(), "trt_bound_s": BOUND_S,
                           "min_interval_s": RANGE[0], "max_interval_s": RANGE[1],
                           "period_s": 2.0, **overrides})


def tuned_interval() -> float:
    interval = tm.optimise(model_at(), BOUND_S, *RANGE).interval_s
    assert interval == pytest.approx(brute_force_optimum(0.3), abs=0.01)
    return interval


def test_a_rate_that_doubles_moves_the_interval_down_to_the_brute_force_optimum():
    start = tuned_interval()   # about 2.9 s at U = 0.3
    d = decide(policy(), start, 600.0)
    assert d.moved and d.meets_bound
    assert d.interval_s == pytest.approx(brute_force_optimum(0.6), abs=0.01)  # ~0.65 s
    assert d.interval_s < start / 2
    assert d.predicted_trt_before_s == pytest.approx(brute_force_trt(start, 0.6), rel=1e-3)
    # the optimiser inverts the fits through eq 5's values; eq 5 itself at the chosen
    # interval agrees to the fit's error
    assert d.predicted_trt_before_s > BOUND_S
    assert d.predicted_trt_s == pytest.approx(BOUND_S, rel=1e-3)
    assert d.utilisation == pytest.approx(0.6)
    assert "would be" in d.reason and f"{d.interval_s:.2f} s" in d.reason


def test_a_steady_rate_leaves_the_interval_and_a_halved_one_moves_it_up():
    start = tuned_interval()
    retuner = Retuner(policy(), start)
    for t_s, rate in ((2.0, 300.0), (4.0, 303.0), (6.0, 297.0), (8.0, 280.0)):
        assert retuner.decide(t_s, rate) is None     # within 1%, or less than 25% away
    assert retuner.interval_s == start and retuner.decisions == []
    # a rise of 4% breaks the tight bound by more than the 2% tolerance: a step down
    up = retuner.decide(10.0, 312.0)
    assert up is not None and up.moved and 0.85 * start < up.interval_s < start
    assert retuner.decide(12.0, 300.0) is None       # and no step back up for 4%
    # a rate that halves: up, but only as far as the higher of two periods allows
    retuner = Retuner(policy(), start)
    assert retuner.decide(2.0, 300.0) is None
    assert retuner.decide(4.0, 150.0) is None        # the period before said 300/s
    up = retuner.decide(6.0, 150.0)                   # two periods at 150/s: up
    assert up is not None and up.interval_s == pytest.approx(RANGE[1])
    d = decide(policy(), start, 150.0)          # U 0.15: the whole range meets it
    assert d.moved and d.interval_s == pytest.approx(RANGE[1])
    assert "optimum moved" in d.reason
    # within move_fraction of the optimum, a bound-keeping interval stays
    near = decide(policy(move_fraction=0.5), 2.2, 300.0)
    assert not near.moved and near.meets_bound


@pytest.mark.parametrize("rate", [950.0, 1000.0, 5000.0])
def test_a_bound_no_interval_meets_says_so_and_keeps_to_the_tuned_range(rate):
    start = tuned_interval()
    retuner = Retuner(policy(), start)
    d = retuner.decide(2.0, rate)
    assert d is not None and not d.meets_bound and d.moved
    assert d.interval_s == RANGE[0]               # the least TRT the range offers
    assert RANGE[0] <= d.interval_s <= RANGE[1]
    assert "no interval" in d.reason or "never catch up" in d.reason
    if rate < I_MAX:
        assert d.predicted_trt_s == pytest.approx(brute_force_trt(RANGE[0], rate / I_MAX),
                                                  rel=1e-3)
        assert d.predicted_trt_s > BOUND_S
    else:
        assert d.predicted_trt_s is None
    # said once: the next period at the same rate changes nothing
    assert retuner.decide(4.0, rate) is None
    # and the rate back down for two periods: it meets the bound again, and moves up
    assert retuner.decide(6.0, 300.0) is None         # the period before was the surge
    back = retuner.decide(8.0, 300.0)
    assert back is not None and back.meets_bound and back.interval_s > 2.0


def test_the_model_at_another_utilisation_is_eq_5_at_every_profiled_interval():
    model = model_at()
    assert model.restarts_s == ((T, R),) * 3
    live = model.at_utilisation(0.6)
    for p in live.points:
        assert p.trt.max_s == pytest.approx(brute_force_trt(p.measurement.interval_s, 0.6),
                                            rel=1e-3)
        assert p.utilisation == 0.6
    assert live.latency_fit == model.latency_fit


def test_a_policy_is_validated_where_it_is_made():
    with pytest.raises(ValueError, match="retune_every_s must be > 0"):
        policy(period_s=0)
    with pytest.raises(ValueError, match="move_fraction"):
        policy(move_fraction=0)
    with pytest.raises(ValueError, match="min_interval_s <= max_interval_s"):
        RetunePolicy(model=model_at(), trt_bound_s=1, min_interval_s=4, max_interval_s=1,
                     period_s=1)


class _Store:
    def list_complete(self):
        return []


class _Master:
    """What `CheckpointCoordinator.__init__` reads of its master context."""

    checkpoint_interval_s = 3600.0

    def checkpoint_store(self):
        return _Store()


@pytest.mark.internal
def test_the_coordinator_takes_a_new_interval_in_the_middle_of_its_wait():
    from bastion.protocols.coordinated import CheckpointCoordinator

    async def scenario():
        coordinator = CheckpointCoordinator(_Master())
        waiting = asyncio.ensure_future(coordinator._wait_interval())  # noqa: SLF001
        await asyncio.sleep(0.05)
        assert not waiting.done()                 # an hour to go
        assert coordinator.set_interval(0.01)     # now already over
        await asyncio.wait_for(waiting, 60)
        assert coordinator.interval_s == 0.01 and coordinator.timeout_s == 10.0
        with pytest.raises(ValueError, match="> 0 seconds"):
            coordinator.set_interval(0)

    asyncio.run(scenario())
    assert get_protocol("coordinated").live_interval
    assert not get_protocol("uncoordinated").live_interval


# -- (b) real Ray ----------------------------------------------------------------------------


BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "retune.py"


def _benchmark():
    """``benchmarks/retune.py`` — its `Surge` source — loaded from its path, once."""
    name = "retune_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARK)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def identity(i: int) -> int:
    return i


def surging(rate: float, at_s: float, seconds: float) -> bn.Topology:
    bench = _benchmark()
    topology = bn.Topology("retune-surge")
    topology.source("nums", bench.Surge(identity, bench.surge_count(rate, at_s, seconds),
                                        rate, at_s)).map("double", lambda v: 2 * v).sink(
        "out", bn.sinks.Collect())
    return topology


@pytest.mark.usefixtures("ray_session")
def test_a_job_whose_input_doubles_moves_its_interval_within_two_periods(tmp_path):
    """The model comes from plain figures (profiled at 300 records/s against an I_max
    of 1000/s); the job reads 300/s, then 600/s from 3 s on. Re-tuned every second,
    the interval moves from about 2.9 s to about 0.65 s by 5 s, and the job master
    records the move with the rate it measured."""
    tuned = bn.tune(None, trt_bound_s=BOUND_S, min_interval_s=RANGE[0],
                    max_interval_s=RANGE[1], points=6, profiler=FixedProfiler())
    assert tuned.interval_s == pytest.approx(tuned_interval())
    period_s, surge_s, seconds = 1.0, 3.0, 8.0
    run = bn.run(surging(300.0, surge_s, seconds),
                 protocol=bn.protocols.Coordinated(interval_s=bn.AutoInterval(
                     trt_bound_s=BOUND_S, tuning=tuned, retune_every_s=period_s)),
                 
                 storage=f"local://{tmp_path}/store")
    count = round(300.0 * surge_s + 600.0 * (seconds - surge_s))
    assert sorted(run.outputs["out"]) == [2 * i for i in range(count)]  # all, once
    events = run.details["events"]
    moves = [e for e in events if e["kind"] == "interval_retuned"]
    assert moves, [e["kind"] for e in events]
    assert moves[0]["interval_before_s"] == pytest.approx(tuned.interval_s)
    # the sources' schedule starts with their first read, after the job's start
    read_from = next(p["t_s"] for p in run.details["timeline"] if p["source_records"])
    surged = read_from + surge_s
    assert all(e["t_s"] > surged - 0.2 for e in moves)   # the steady 300/s moved nothing
    # The period the surge falls in sees a mix of both rates (a first step down, or
    # none); the next one the doubled rate: the optimum at U = 0.6, as brute force
    # finds it, within two periods (and a poll: periods end on the 0.1-s polls).
    settled = [e for e in moves if e["t_s"] <= surged + 2 * period_s + 0.3]
    assert settled, (surged, moves)
    last = settled[-1]
    assert last["interval_s"] == pytest.approx(brute_force_optimum(0.6), abs=0.05)
    assert 540 < last["ingest_avg_per_s"] < 660          # the doubled rate, measured
    assert last["predicted_trt_s"] <= BOUND_S * 1.001 < last["predicted_trt_before_s"]
    assert len(moves) <= 3, moves                        # no flapping at a steady 600/s
    # the coordinator took it: checkpoints every ~0.65 s, where 2.9 s gave one by now
    after = [e for e in events if e["kind"] == "checkpoint_completed"
             and e["t_s"] > last["t_s"]]
    assert len(after) >= 2, after


class FixedProfiler:
    """The figures `model_at` models, as a `Profiler` (`bn.tune` accepts one)."""

    def capacity(self):
        return Capacity(I_MAX, 0.0)

    def profile(self, interval_s, seed):
        return [Measurement(interval_s, 300.0, 20.0 - 2.0 * interval_s, T, R)]


def test_run_refuses_a_retune_it_cannot_do_before_anything_runs(tmp_path, capsys):
    topology = surging(300.0, 1.0, 2.0)
    tuned = bn.tune(None, trt_bound_s=BOUND_S, min_interval_s=RANGE[0],
                    max_interval_s=RANGE[1], points=6, profiler=FixedProfiler())
    with pytest.raises(ValueError, match="protocol 'uncoordinated' cannot move its"):
        bn.run(topology,
               protocol=bn.protocols.Uncoordinated(interval_s=bn.AutoInterval(
                   trt_bound_s=BOUND_S, tuning=tuned, retune_every_s=1.0)))
    with pytest.raises(ValueError, match="contradicts the tuning's bound"):
        bn.run(topology,
               protocol=bn.protocols.Coordinated(interval_s=bn.AutoInterval(
                   trt_bound_s=9.0, tuning=tuned)))
    job = tmp_path / "job.py"
    job.write_text("import bastion as bn\ntopology = bn.Topology('t')\n")
    assert cli.main(["run", str(job), "--retune-every", "2"]) == cli.EXIT_USAGE
    assert "pass --checkpoint-interval auto --trt-bound S" in capsys.readouterr().err
    assert cli.main(["run", str(job), "--checkpoint-interval", "auto", "--trt-bound", "5",
                     "--retune-every", "2", "--protocol", "uncoordinated"]) == cli.EXIT_USAGE
    assert "cannot move its checkpoint interval" in capsys.readouterr().err


RATE_600 = '''
import bastion as bn

topology = bn.Topology("retune-cli")
topology.source("nums", bn.sources.Generator(lambda i: i, count=2400, rate=600)).sink(
    "out", bn.sinks.Collect())
'''


@pytest.mark.internal
@pytest.mark.usefixtures("ray_session")
def test_bastion_run_retune_every_moves_the_interval_of_the_job_it_runs(tmp_path, monkeypatch,
                                                                       capsys):
    """The command line's way in: ``--retune-every`` hands the tuning (here the plain
    figures' — `_auto_interval` profiles for minutes otherwise) to the run, whose job
    master moves the interval at 600 records/s, twice the rate it was tuned for."""
    from bastion.runtime.events import read_events
    from bastion.storage import LocalStore, list_jobs

    tuned = bn.tune(None, trt_bound_s=BOUND_S, min_interval_s=RANGE[0],
                    max_interval_s=RANGE[1], points=6, profiler=FixedProfiler())
    monkeypatch.setattr(cli, "_auto_interval", lambda args: tuned)
    job = tmp_path / "job.py"
    job.write_text(RATE_600)
    store = LocalStore(tmp_path / "store")
    code = cli.main(["run", str(job), "--protocol", "coordinated", "--checkpoint-interval",
                     "auto", "--trt-bound", str(BOUND_S), "--retune-every", "1",
                     "--storage", f"local://{store.root}"])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    [ran] = list_jobs(store)
    moves = [e for e in read_events(store, ran.job) if e["kind"] == "interval_retuned"]
    assert moves and moves[0]["interval_before_s"] == pytest.approx(tuned.interval_s)
    assert moves[-1]["interval_s"] == pytest.approx(brute_force_optimum(0.6), abs=0.05)
