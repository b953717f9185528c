"""Faults: which processes of a job to kill, and when — described, not carried out.

A drill proves a protocol by killing real processes while a job runs. The faults a
user passes to ``bn.run(faults=...)`` or ``bn.drill`` are descriptions, like a
topology: they name *what* to kill and *when* (seconds after the job started) and
import nothing of Ray, so writing them costs nothing and a fault that names no
operator or worker fails before anything is deployed (`validate`). The job master
hands the schedule to the injector (`bastion.scheduler.injector`), which carries each
kill out with ``ray.kill``: that terminates the worker actor's process — every task it
hosts dies with it, as when a machine disappears — and the job master then has to
detect the loss and recover like after any other failure.

- ``KillInstance(op, index, at, during_checkpoint=False)``: the worker hosting
  instance ``index`` of ``op``; with ``during_checkpoint`` the kill waits after ``at``
  until a checkpoint is in progress, to prove an interrupted checkpoint is never used;
- ``KillWorker(worker, at)``: one worker process (a slot) by number;
- ``KillNode(node, at)``: every worker process Ray placed on a node — the job's
  workers and its standby — at once, as when the machine is lost. ``node`` is the
  node's position among the cluster's live nodes sorted by node id (``0`` on a
  single-machine Ray) or its node id (hex);
- ``RandomKills(count, between, seed)``: ``count`` kills of random instances at random
  times in ``between = (first_s, last_s)``, reproducible from ``seed``;
- ``AddNode(at, cpus)``: not a kill but capacity that *arrives*: a Ray node with
  ``cpus`` CPUs joins the simulated cluster the run was given (``bn.run(...,
  cluster=...)``, a `ray.cluster_utils.Cluster` on 127.0.0.1) — the replacement
  slots a progressive recovery waits for after a `KillNode`
  (`bastion.scheduler.recovery`). The driver adds it, as an operator or an
  autoscaler would on a real cluster.

Each fault turns into kills (`ScheduledKill`) against a physical plan (``schedule``):
the schedule the injector follows and a drill compares with what happened.

**Beyond kills** (the fault classes of Tran's Dynamo, §3.1): faults that leave the
processes alive but make an instance slow or its links unreliable. Each names an
operator and the instances it hits (``instances=None``: all), and is carried out
inside the task that runs the instance (`bastion.runtime.faults`):

- ``Timing(op, phase, magnitude, mtbf_records | mtbf_s)``: a *computational
  performance* fault — the instance stalls for ``magnitude`` seconds (a distribution:
  `Constant`, `Gaussian` with optional min/max, `Uniform`, `Exponential`) at
  occurrences whose gaps are exponential with mean ``mtbf_records`` records the
  instance processed (reproducible at the same records, but an instance that
  processes more — copies under redundancy — stalls more often per second), or with
  mean ``mtbf_s`` seconds of the instance's running time (the thesis's model: the
  same stalls per second whatever the instance processes); in
  the ``"execute"`` phase (after its operator processed a batch), the ``"emit"``
  phase (before its task sends a frame) or the ``"ack"`` phase (its acknowledgments
  of tuples arrive that much later; protocol ``acks`` only); ``active_s=(from, to)``
  lets it strike only between those seconds after the task started (a fault profile
  that varies in time, as in the thesis's Figs 4.9–4.10, §4.2.1; a restarted task starts over);
- ``DropFrames(op, probability)``: a *single-shot communication* fault — each data
  frame the instance's task sends is lost with that probability. Bastion's channels
  are otherwise reliable, and only a protocol that replays by acknowledgments can
  make up for the loss: under any other the drill verdict reports it;
- ``LinkOutage(op, mtbf_s, mttr_s, lose=False)``: a *correlated communication*
  fault — the instance's outgoing links go down for periods exponential with mean
  ``mttr_s`` (or drawn from ``mttr``, e.g. the thesis's Gaussian), separated by
  up-times exponential with mean ``mtbf_s``; frames wait for the link (as TCP
  retransmits), so an outage delays, it does not lose. With ``lose=True`` (the
  thesis's model) every tuple the instance emits and every acknowledgment it sends
  while its link is down is lost (watermarks too: the next supersedes them) — under
  ``acks``, whose sources replay what was not
  acknowledged in time; under the other protocols the link heals by resending what
  it did not deliver (`bastion.runtime.transport`), so there too the outage delays;
- ``DropConnection(op, at_s=(...) | mtbf_s)``: a *dropped connection* — at those
  seconds after the task started (or at exponential times of mean ``mtbf_s``), the
  next frame the instance's task sends over TCP to another worker is cut: part of it
  is written, then the connection is aborted, so the receiver reads a torn frame. The
  link heals (`bastion.runtime.transport`): it reconnects and resends what was not
  acknowledged, and nothing is lost, duplicated or restarted. Only channels to another
  worker go over TCP, so only those carry the fault (inside an upstream backup or a
  rerouting channel too);
- ``Crash(op, mtbf_s, mttr_s, max_crashes)``: an *instance* fault — the instance's
  worker is killed at exponential times, and its replacement may start only after a
  repair time exponential with mean ``mttr_s``.

Randomness is seeded per fault, operator and instance from the fault's ``seed`` (0
when none is given; `load` takes the file's), never from the clock: the same seed
injects the same faults at the same record counts (stalls, drops) or times (outages,
crashes), run after run. `load` reads them from a YAML file, naming the line and
field of any mistake, in either of two shapes:

- Bastion's: ``operators:`` -> operator -> ``instances`` ("all" or indexes) and
  ``faults``, a list of ``{kind: {field: value}}`` with the fields above, in seconds
  (``timing``, ``drop_frames``, ``link_outage``, ``drop_connection``, ``crash``);
- the thesis's (Tran, Listing 3.1, loaded as printed): operator names at the top,
  each with ``enabled`` (instance ids) and ``faults`` -> kind -> ``parameters``, in
  *microseconds*, distributions as lists — ``exponential: [min, max, mean]`` for an
  MTBF (gaps held within min and max: ``mtbf_min_s``/``mtbf_max_s``), ``gaussian:
  [min, max, mean, std]``. Its kinds: ``timing`` (``mtbf``, ``magnitude``),
  ``message`` (a single-shot loss: ``probability``), ``link`` (a correlated outage that
  loses what is sent meanwhile: ``mtbf``, ``mttr`` — Gaussian in the thesis) and ``instance`` (a crash: ``mtbf``,
  ``mttr: {exponential: [mean]}``, ``max_crashes``).

The two load to the same faults: Listing 3.1 and its Bastion-shape twin inject the
same stalls for the same seed (tests/test_fault_file_thesis.py).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True, order=True)
class ScheduledKill:
    """One kill the injector carries out: a worker slot, or a whole Ray node."""

    at_s: float
    what: str
    worker: int | None = None
    node: int | str | None = None
    during_checkpoint: bool = False
    repair_s: float = 0.0   # no replacement for the killed processes before this


@dataclass(frozen=True)
class KillInstance:
    """Kill the worker hosting instance ``index`` of operator ``op`` ``at`` seconds
    after the job started; with ``during_checkpoint``, wait after ``at`` until a
    checkpoint is in progress (an interrupted checkpoint must never be used)."""

    op: str
    index: int = 0
    at: float = 1.0
    during_checkpoint: bool = False

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        task = plan.task_of(self.op, self.index)
        return [ScheduledKill(self.at, f"kill {self.op}[{self.index}]", worker=task.worker,
                              during_checkpoint=self.during_checkpoint)]


@dataclass(frozen=True)
class KillWorker:
    """Kill worker process (slot) number ``worker`` ``at`` seconds after the job
    started."""

    worker: int
    at: float = 1.0

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        if not 0 <= self.worker < plan.workers:
            raise ValueError(f"KillWorker: worker {self.worker} does not exist "
                             f"(the job has {plan.workers})")
        return [ScheduledKill(self.at, f"kill worker {self.worker}", worker=self.worker)]


@dataclass(frozen=True)
class KillNode:
    """Kill every worker process Ray placed on a node ``at`` seconds after the job
    started, as when the machine is lost. ``node``: the node's position among the live
    nodes sorted by node id (``0`` on a single-machine Ray), or its node id (hex)."""

    node: int | str = 0
    at: float = 1.0

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        if isinstance(self.node, bool) or not isinstance(self.node, (int, str)) or (
                isinstance(self.node, int) and self.node < 0):
            raise ValueError(f"KillNode: node must be a position (0, 1, ...) among the "
                             f"cluster's live nodes or a node id, not {self.node!r}")
        return [ScheduledKill(self.at, f"kill node {self.node}", node=self.node)]


@dataclass(frozen=True)
class AddNode:
    """Capacity that arrives: a Ray node with ``cpus`` CPUs joins the simulated
    cluster (``bn.run(..., cluster=...)``) ``at`` seconds after the job started."""

    at: float = 1.0
    cpus: int = 1

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus < 1:
            raise ValueError(f"AddNode: cpus must be an int >= 1, not {self.cpus!r}")
        _number("AddNode", "at", self.at, minimum=0)
        return []  # nothing to kill: the driver adds the node (`node_additions`)


def node_additions(faults: Any) -> list[AddNode]:
    """The `AddNode` faults among ``faults``, by time."""
    return sorted((f for f in faults if isinstance(f, AddNode)), key=lambda f: f.at)


@dataclass(frozen=True)
class RandomKills:
    """``count`` kills of random instances at random times in ``between = (first_s,
    last_s)``, reproducible from ``seed``."""

    count: int = 1
    between: tuple[float, float] = (1.0, 3.0)
    seed: int | None = None  # a drill fills in its own seed

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        rng = random.Random(0 if self.seed is None else self.seed)
        instances = [(op, t.index, t.worker) for c in plan.chains for op in c.ops[:1]
                     for t in plan.tasks if t.chain_id == c.chain_id]
        kills = []
        for _ in range(self.count):
            op, index, worker = rng.choice(instances)
            at = round(rng.uniform(*self.between), 3)
            kills.append(ScheduledKill(at, f"kill {op}[{index}]", worker=worker))
        return kills


# -- distributions of magnitudes ------------------------------------------------------------


def _number(owner: str, name: str, value: Any, minimum: float | None = None,
            above: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{owner}.{name} must be a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value!r}")
    if above is not None and value <= above:
        raise ValueError(f"{owner}.{name} must be > {above}, got {value!r}")


@dataclass(frozen=True)
class Constant:
    """Always ``value`` (seconds)."""
    value: float

    def __post_init__(self) -> None:
        _number("Constant", "value", self.value, minimum=0)

    def sample(self, rng: random.Random) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Gaussian:
    """Normal with ``mean`` and ``stddev`` (seconds), clipped to [min, max] and never
    below 0 (a duration)."""
    mean: float
    stddev: float
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        _number("Gaussian", "mean", self.mean)
        _number("Gaussian", "stddev", self.stddev, minimum=0)
        for name in ("min", "max"):
            if getattr(self, name) is not None:
                _number("Gaussian", name, getattr(self, name), minimum=0)
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"Gaussian.min ({self.min}) must not exceed max ({self.max})")

    def sample(self, rng: random.Random) -> float:
        value = rng.gauss(self.mean, self.stddev)
        if self.min is not None:
            value = max(value, self.min)
        if self.max is not None:
            value = min(value, self.max)
        return max(value, 0.0)


@dataclass(frozen=True)
class Uniform:
    """Uniform between ``min`` and ``max`` (seconds)."""
    min: float
    max: float

    def __post_init__(self) -> None:
        _number("Uniform", "min", self.min, minimum=0)
        _number("Uniform", "max", self.max, minimum=0)
        if self.min > self.max:
            raise ValueError(f"Uniform.min ({self.min}) must not exceed max ({self.max})")

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.min, self.max)


@dataclass(frozen=True)
class Exponential:
    """Exponential with ``mean`` (seconds)."""
    mean: float

    def __post_init__(self) -> None:
        _number("Exponential", "mean", self.mean, above=0)

    def sample(self, rng: random.Random) -> float:
        return rng.expovariate(1.0 / self.mean)


Distribution = Constant | Gaussian | Uniform | Exponential
_DISTRIBUTIONS = {"constant": Constant, "gaussian": Gaussian, "uniform": Uniform,
                  "exponential": Exponential}


# -- faults that leave the processes alive ------------------------------------------------------

PHASES = ("execute", "emit", "ack")


def _check_target(owner: str, op: Any, instances: Any) -> None:
    if not isinstance(op, str) or not op:
        raise ValueError(f"{owner}.op must name an operator, got {op!r}")
    if instances is not None:
        if (not isinstance(instances, tuple) or not instances
                or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                       for i in instances)):
            raise ValueError(f"{owner}.instances must be None (all) or a non-empty tuple "
                             f"of instance indexes >= 0, got {instances!r}")


def _check_seed(owner: str, seed: Any) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"{owner}.seed must be an int or None, got {seed!r}")


def _as_instances(instances: Any) -> Any:
    return tuple(instances) if isinstance(instances, list) else instances


def _check_bounds(owner: str, lo: Any, hi: Any) -> None:
    """``mtbf_min_s``/``mtbf_max_s``: optional bounds on every drawn gap."""
    if lo is not None:
        _number(owner, "mtbf_min_s", lo, minimum=0)
    if hi is not None:
        _number(owner, "mtbf_max_s", hi, above=0)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{owner}.mtbf_min_s ({lo}) must not exceed mtbf_max_s ({hi})")


def bounded_gap(rng: random.Random, mean: float, lo: float | None, hi: float | None
                ) -> float:
    """A gap between occurrences: exponential with ``mean``, held within [lo, hi] (the
    thesis's ``exponential: [min, max, mean]``). One draw per gap whatever the
    bounds, so a bound never shifts the draws after it."""
    gap = rng.expovariate(1.0 / mean)
    if lo is not None:
        gap = max(gap, lo)
    if hi is not None:
        gap = min(gap, hi)
    return gap


@dataclass(frozen=True)
class Timing:
    """A computational performance fault: instances of ``op`` stall for ``magnitude``
    seconds (a distribution) in ``phase`` (``"execute"``, ``"emit"`` or ``"ack"``), at
    gaps exponential with mean ``mtbf_records`` records or ``mtbf_s`` seconds,
    optionally only within ``active_s = (from_s, to_s)`` (see the module)."""

    op: str
    instances: tuple[int, ...] | None = None
    phase: str = "execute"
    magnitude: Distribution = Constant(0.1)
    mtbf_records: float | None = None   # 10,000 when neither this nor mtbf_s is given
    seed: int | None = None
    active_s: tuple[float, float] | None = None
    mtbf_s: float | None = None
    mtbf_min_s: float | None = None
    mtbf_max_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", _as_instances(self.instances))
        _check_target("Timing", self.op, self.instances)
        _check_bounds("Timing", self.mtbf_min_s, self.mtbf_max_s)
        if self.mtbf_s is None and (self.mtbf_min_s, self.mtbf_max_s) != (None, None):
            raise ValueError("Timing.mtbf_min_s and mtbf_max_s bound gaps in seconds: give "
                             "mtbf_s with them")
        if self.mtbf_records is not None and self.mtbf_s is not None:
            raise ValueError("Timing.mtbf_s must be None when mtbf_records is given: the "
                             "gaps are counted in records or in seconds, not both")
        if self.mtbf_s is not None:
            _number("Timing", "mtbf_s", self.mtbf_s, above=0)
        elif self.mtbf_records is None:
            object.__setattr__(self, "mtbf_records", 10_000)
        if self.active_s is not None:
            if not isinstance(self.active_s, (tuple, list)) or len(self.active_s) != 2:
                raise ValueError("Timing.active_s must be (from_s, to_s), got "
                                 f"{self.active_s!r}")
            object.__setattr__(self, "active_s", tuple(self.active_s))
            _number("Timing", "active_s[0]", self.active_s[0], minimum=0)
            _number("Timing", "active_s[1]", self.active_s[1], above=self.active_s[0])
        if self.phase not in PHASES:
            raise ValueError(f"Timing.phase must be one of {list(PHASES)}, got {self.phase!r}")
        if not isinstance(self.magnitude, tuple(_DISTRIBUTIONS.values())):
            raise ValueError("Timing.magnitude must be a distribution (bn.faults.Constant, "
                             f"Gaussian, Uniform or Exponential), got {self.magnitude!r}")
        if self.mtbf_s is None:
            _number("Timing", "mtbf_records", self.mtbf_records, above=0)
        _check_seed("Timing", self.seed)


@dataclass(frozen=True)
class DropFrames:
    """A single-shot communication fault: each data frame instances of ``op`` send is
    lost with ``probability``; only a protocol that replays by acknowledgments makes
    up for it."""

    op: str
    instances: tuple[int, ...] | None = None
    probability: float = 0.01
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", _as_instances(self.instances))
        _check_target("DropFrames", self.op, self.instances)
        _number("DropFrames", "probability", self.probability, above=0)
        if self.probability > 1:
            raise ValueError(f"DropFrames.probability must be <= 1, got {self.probability!r}")
        _check_seed("DropFrames", self.seed)


@dataclass(frozen=True)
class LinkOutage:
    """A correlated communication fault: the outgoing links of instances of ``op`` go
    down for ``mttr_s`` (mean; or drawn from ``mttr``) every ``mtbf_s`` (mean). Frames
    wait for the link; with ``lose=True`` what is sent meanwhile is lost."""

    op: str
    instances: tuple[int, ...] | None = None
    mtbf_s: float = 5.0
    mttr_s: float = 0.5
    seed: int | None = None
    mtbf_min_s: float | None = None
    mtbf_max_s: float | None = None
    # the length of each outage, when not exponential with mean ``mttr_s`` (the
    # thesis's MTTR is Gaussian)
    mttr: Distribution | None = None
    # True: what the instance sends while its link is down is lost (the thesis's
    # correlated model), not held back
    lose: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", _as_instances(self.instances))
        _check_target("LinkOutage", self.op, self.instances)
        _number("LinkOutage", "mtbf_s", self.mtbf_s, above=0)
        _number("LinkOutage", "mttr_s", self.mttr_s, above=0)
        _check_bounds("LinkOutage", self.mtbf_min_s, self.mtbf_max_s)
        if not isinstance(self.lose, bool):
            raise ValueError(f"LinkOutage.lose must be True or False, got {self.lose!r}")
        if self.mttr is not None and not isinstance(self.mttr, tuple(_DISTRIBUTIONS.values())):
            raise ValueError("LinkOutage.mttr must be a distribution (bn.faults.Constant, "
                             f"Gaussian, Uniform or Exponential) or None, got {self.mttr!r}")
        _check_seed("LinkOutage", self.seed)

    def repair_s(self, rng: random.Random) -> float:
        """How long one outage lasts."""
        if self.mttr is not None:
            return self.mttr.sample(rng)
        return rng.expovariate(1.0 / self.mttr_s)


@dataclass(frozen=True)
class DropConnection:
    """A dropped connection: at ``at_s`` seconds after the task started (or at
    exponential times of mean ``mtbf_s``) the next frame instances of ``op`` send over
    TCP is torn and the connection aborted; the link heals and resends."""

    op: str
    instances: tuple[int, ...] | None = None
    at_s: tuple[float, ...] | None = None   # (1.0,) when mtbf_s is not given either
    mtbf_s: float | None = None
    seed: int | None = None
    mtbf_min_s: float | None = None
    mtbf_max_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", _as_instances(self.instances))
        _check_target("DropConnection", self.op, self.instances)
        _check_bounds("DropConnection", self.mtbf_min_s, self.mtbf_max_s)
        if self.at_s is not None and self.mtbf_s is not None:
            raise ValueError("DropConnection.mtbf_s must be None when at_s is given: the "
                             "drops come at given times or at random ones, not both")
        if self.mtbf_s is not None:
            _number("DropConnection", "mtbf_s", self.mtbf_s, above=0)
        else:
            at_s = (1.0,) if self.at_s is None else self.at_s
            if isinstance(at_s, (int, float)) and not isinstance(at_s, bool):
                at_s = (at_s,)
            if not isinstance(at_s, (tuple, list)) or not at_s:
                raise ValueError("DropConnection.at_s must be a non-empty tuple of seconds "
                                 f"after the task started, got {self.at_s!r}")
            for i, value in enumerate(at_s):
                _number("DropConnection", f"at_s[{i}]", value, minimum=0)
            object.__setattr__(self, "at_s", tuple(sorted(at_s)))
        _check_seed("DropConnection", self.seed)


@dataclass(frozen=True)
class Crash:
    """An instance fault: the worker of each targeted instance of ``op`` is killed at
    exponential times (mean ``mtbf_s``), its replacement starting only after a repair
    time exponential with mean ``mttr_s``; ``max_crashes`` in all."""

    op: str
    instances: tuple[int, ...] | None = None
    mtbf_s: float = 10.0
    mttr_s: float = 1.0
    max_crashes: int = 1
    seed: int | None = None
    mtbf_min_s: float | None = None
    mtbf_max_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "instances", _as_instances(self.instances))
        _check_target("Crash", self.op, self.instances)
        _check_bounds("Crash", self.mtbf_min_s, self.mtbf_max_s)
        _number("Crash", "mtbf_s", self.mtbf_s, above=0)
        _number("Crash", "mttr_s", self.mttr_s, minimum=0)
        if isinstance(self.max_crashes, bool) or not isinstance(self.max_crashes, int) \
                or self.max_crashes < 1:
            raise ValueError("Crash.max_crashes must be an int >= 1 (a schedule must end), "
                             f"got {self.max_crashes!r}")
        _check_seed("Crash", self.seed)

    def schedule(self, plan: Any) -> list[ScheduledKill]:
        """Each targeted instance crashes at exponential times (mean ``mtbf_s``), each
        crash repaired after an exponential time (mean ``mttr_s``), the next one
        counted from the repair; ``max_crashes`` in all, earliest first."""
        kills = []
        for index in _instances_of(self, plan):
            rng = fault_rng(self.seed, "crash", self.op, index)
            at_s = 0.0
            for _ in range(self.max_crashes):
                at_s += bounded_gap(rng, self.mtbf_s, self.mtbf_min_s, self.mtbf_max_s)
                repair_s = rng.expovariate(1.0 / self.mttr_s) if self.mttr_s > 0 else 0.0
                task = plan.task_of(self.op, index)
                kills.append(ScheduledKill(round(at_s, 3), f"crash {self.op}[{index}]",
                                           worker=task.worker, repair_s=round(repair_s, 3)))
                at_s += repair_s
        return sorted(kills)[:self.max_crashes]


Injected = Timing | DropFrames | LinkOutage | DropConnection
# carried out inside the tasks
INJECTED_KINDS = (Timing, DropFrames, LinkOutage, DropConnection)


def fault_rng(seed: int | None, *what: Any) -> random.Random:
    """A generator for one fault at one instance, from a stable hash of ``seed`` and
    ``what`` (never Python's salted `hash`): reproducible in any process."""
    key = repr((0 if seed is None else seed, *what)).encode()
    return random.Random(zlib.crc32(key) << 32 | zlib.crc32(key[::-1]))


def _instances_of(fault: Any, plan: Any) -> list[int]:
    """The instance indexes ``fault`` hits; a clear error for a name or index the plan
    does not have."""
    name = type(fault).__name__
    parallelism = _parallelism(plan, fault.op)
    if parallelism is None:
        raise ValueError(f"{name}: no operator named {fault.op!r}")
    if fault.instances is None:
        return list(range(parallelism))
    for index in fault.instances:
        if index >= parallelism:
            raise ValueError(f"{name}: operator {fault.op!r} has no instance {index} "
                             f"(parallelism {parallelism})")
    return sorted(set(fault.instances))


def _parallelism(plan: Any, op: str) -> int | None:
    node = plan.topology.nodes.get(op)
    return None if node is None else node.parallelism


def injections(faults: Any, op: str, index: int) -> list[tuple[int, Injected]]:
    """The faults (with their position in ``faults``) that instance ``index`` of
    operator ``op`` carries out itself."""
    return [(i, f) for i, f in enumerate(faults)
            if isinstance(f, INJECTED_KINDS) and f.op == op
            and (f.instances is None or index in f.instances)]


Fault = KillInstance | KillWorker | KillNode | AddNode | RandomKills | Crash | Injected


def validate(faults: Any, plan: Any) -> list[ScheduledKill]:
    """Every fault's kills, sorted by time; a fault naming nothing fails here."""
    kills = []
    for fault in faults:
        if isinstance(fault, INJECTED_KINDS):
            _instances_of(fault, plan)  # names an operator and instances that exist
            continue
        if not hasattr(fault, "schedule"):
            raise ValueError(f"not a fault: {fault!r}; use bn.faults.KillInstance, "
                             "KillWorker, KillNode, AddNode, RandomKills, Crash, Timing, "
                             "DropFrames, LinkOutage or DropConnection")
        try:
            kills.extend(fault.schedule(plan))
        except KeyError as exc:
            raise ValueError(f"{fault!r}: no operator named {exc.args[0]!r}") from None
        except StopIteration:
            raise ValueError(f"{fault!r}: the operator has no instance {fault.index}") from None
    return sorted(kills)


def live_nodes() -> list[str]:
    """The ids of the cluster's live Ray nodes, sorted as placement counts them: what
    `KillNode` positions index."""
    from bastion.scheduler import placement  # imports Ray: only when a fault needs it

    return placement.live_nodes()


def resolve_node(node: int | str, nodes: list[str]) -> str:
    """The node id a `KillNode` names; a clear error when the cluster has no such node."""
    if isinstance(node, int):
        if node >= len(nodes):
            raise ValueError(f"KillNode: node {node} does not exist (the cluster has "
                             f"{len(nodes)} live node{'s' if len(nodes) != 1 else ''})")
        return nodes[node]
    if node not in nodes:
        raise ValueError(f"KillNode: no live Ray node has id {node!r}")
    return node


# -- fault files ---------------------------------------------------------------------------------
#
# The shape of Dynamo's Listing 3.1 — operator -> enabled instances -> faults — with the
# units in the field names:
#
#     seed: 7
#     operators:
#       count:
#         instances: [0, 1]          # or "all" (the default)
#         faults:
#           - timing: {phase: execute, mtbf_records: 5000,
#                      magnitude: {gaussian: {mean: 0.45, stddev: 0.05, min: 0.0}}}
#           - timing: {phase: execute, mtbf_s: 1.0,        # gaps in seconds instead
#                      magnitude: {constant: {value: 0.15}}}
#           - drop_frames: {probability: 0.01}
#           - link_outage: {mtbf_s: 5.0, mttr_s: 0.5}
#           - drop_connection: {at_s: [1.0, 2.5]}      # or {mtbf_s: 2.0}
#           - crash: {mtbf_s: 10.0, mttr_s: 1.0, max_crashes: 1}

_FILE_KEYS = ("seed", "operators")
# The thesis's shape: operator -> enabled (instance ids), faults -> kind -> parameters
# (microseconds). Its kinds: a computational performance fault (``timing``), a lost
# tuple or acknowledgment (``message``, single-shot), a link down for a while
# (``link``, correlated: MTBF exponential, MTTR Gaussian) and a failed instance
# (``instance``).
_THESIS_OPERATOR_KEYS = ("enabled", "faults")
_THESIS_KINDS = {"timing": ("mtbf", "magnitude"), "message": ("probability",),
                 "link": ("mtbf", "mttr"), "instance": ("mtbf", "mttr", "max_crashes")}
_MICROSECONDS_PER_S = 1e6


def _mean_of(distribution: Distribution) -> float:
    """The mean a fault's ``mttr_s`` states for a repair-time distribution."""
    if isinstance(distribution, Constant):
        return distribution.value
    if isinstance(distribution, Uniform):
        return (distribution.min + distribution.max) / 2
    return distribution.mean
_OPERATOR_KEYS = ("instances", "faults")
_FAULT_KINDS = {"timing": Timing, "drop_frames": DropFrames, "link_outage": LinkOutage,
                "drop_connection": DropConnection, "crash": Crash}


class FaultFileError(ValueError):
    """A fault file (or dict) that does not describe faults: names where and why."""


@dataclass
class _Item:
    """A value of a fault document with the line it starts on (None for a dict)."""
    value: Any
    line: int | None
    children: Any = None   # dict key -> (key _Item, value _Item), or list of _Item


def _from_yaml_node(node: Any, construct: Any) -> _Item:
    import yaml

    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        children = {}
        for key_node, value_node in node.value:
            key = _from_yaml_node(key_node, construct)
            children[key.value] = (key, _from_yaml_node(value_node, construct))
        return _Item({k: v.value for k, (_, v) in children.items()}, line, children)
    if isinstance(node, yaml.SequenceNode):
        items = [_from_yaml_node(n, construct) for n in node.value]
        return _Item([i.value for i in items], line, items)
    return _Item(construct.construct_object(node, deep=True), line)


def _from_python(value: Any) -> _Item:
    if isinstance(value, dict):
        children = {k: (_Item(k, None), _from_python(v)) for k, v in value.items()}
        return _Item(value, None, children)
    if isinstance(value, (list, tuple)):
        return _Item(list(value), None, [_from_python(v) for v in value])
    return _Item(value, None)


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, item: _Item, path: str, message: str) -> FaultFileError:
        where = self.source if item.line is None else f"{self.source} line {item.line}"
        return FaultFileError(f"{where}: {path}: {message}" if path else f"{where}: {message}")

    def mapping(self, item: _Item, path: str, allowed: tuple[str, ...]) -> dict:
        if not isinstance(item.value, dict):
            raise self.fail(item, path, f"must be a mapping with keys {list(allowed)}, "
                                        f"got {item.value!r}")
        for key, (key_item, _) in item.children.items():
            if key not in allowed:
                raise self.fail(key_item, f"{path}.{key}" if path else str(key),
                                f"unknown field; allowed: {list(allowed)}")
        return {k: v for k, (_, v) in item.children.items()}

    def faults(self, root: _Item) -> list:
        if isinstance(root.value, dict) and "operators" not in root.value:
            return self.thesis_faults(root)
        fields_ = self.mapping(root, "", _FILE_KEYS)
        seed = None
        if "seed" in fields_:
            seed = fields_["seed"].value
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise self.fail(fields_["seed"], "seed", f"must be an int, got {seed!r}")
        if "operators" not in fields_:
            raise self.fail(root, "", "missing field 'operators' (operator -> faults)")
        operators = fields_["operators"]
        if not isinstance(operators.value, dict) or not operators.value:
            raise self.fail(operators, "operators", "must map operator names to their "
                                                    f"faults, got {operators.value!r}")
        out = []
        for op, (_, spec) in operators.children.items():
            out.extend(self.operator(str(op), spec, f"operators.{op}", seed))
        return out

    def operator(self, op: str, spec: _Item, path: str, seed: int | None) -> list:
        fields_ = self.mapping(spec, path, _OPERATOR_KEYS)
        instances = None
        if "instances" in fields_:
            item = fields_["instances"]
            if item.value != "all":
                if (not isinstance(item.value, list) or not item.value
                        or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                               for i in item.value)):
                    raise self.fail(item, f"{path}.instances", "must be \"all\" or a list "
                                    f"of instance indexes >= 0, got {item.value!r}")
                instances = tuple(item.value)
        if "faults" not in fields_:
            raise self.fail(spec, path, "missing field 'faults'")
        listed = fields_["faults"]
        if not isinstance(listed.value, list) or not listed.value:
            raise self.fail(listed, f"{path}.faults", "must be a non-empty list of faults "
                                                      f"({list(_FAULT_KINDS)})")
        return [self.fault(op, instances, item, f"{path}.faults[{i}]", seed)
                for i, item in enumerate(listed.children)]

    def fault(self, op: str, instances: Any, item: _Item, path: str, seed: int | None) -> Any:
        kinds = self.mapping(item, path, tuple(_FAULT_KINDS))
        if len(kinds) != 1:
            raise self.fail(item, path, f"must hold exactly one of {list(_FAULT_KINDS)}")
        (kind, body), = kinds.items()
        path = f"{path}.{kind}"
        cls = _FAULT_KINDS[kind]
        names = tuple(f.name for f in fields(cls) if f.name not in ("op", "instances", "seed"))
        given = self.mapping(body, path, names)
        values = {}
        for name, value in given.items():
            if name in ("magnitude", "mttr"):
                values[name] = self.distribution(value, f"{path}.magnitude")
            else:
                values[name] = value.value
        try:
            return cls(op=op, instances=instances, seed=seed, **values)
        except (ValueError, TypeError) as exc:
            raise self._field_error(exc, body, given, path) from None

    def distribution(self, item: _Item, path: str) -> Distribution:
        kinds = self.mapping(item, path, tuple(_DISTRIBUTIONS))
        if len(kinds) != 1:
            raise self.fail(item, path, f"must hold exactly one of {list(_DISTRIBUTIONS)}")
        (kind, body), = kinds.items()
        cls = _DISTRIBUTIONS[kind]
        path = f"{path}.{kind}"
        given = self.mapping(body, path, tuple(f.name for f in fields(cls)))
        try:
            return cls(**{name: value.value for name, value in given.items()})
        except (ValueError, TypeError) as exc:
            raise self._field_error(exc, body, given, path) from None

    # -- the thesis's shape (Tran, Listing 3.1) -------------------------------------------------

    def thesis_faults(self, root: _Item) -> list:
        seed = None
        out = []
        for op, (key, spec) in root.children.items():
            if op == "seed":
                seed = spec.value
                if isinstance(seed, bool) or not isinstance(seed, int):
                    raise self.fail(spec, "seed", f"must be an int, got {seed!r}")
                continue
            fields_ = self.mapping(spec, str(op), _THESIS_OPERATOR_KEYS)
            instances = None
            if "enabled" in fields_:
                item = fields_["enabled"]
                if (not isinstance(item.value, list) or not item.value
                        or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                               for i in item.value)):
                    raise self.fail(item, f"{op}.enabled", "must list the instance ids to "
                                    f"inject faults into (ints >= 0), got {item.value!r}")
                instances = tuple(item.value)
            listed = fields_.get("faults")
            if listed is None or listed.value is None:
                continue  # an operator listed with no injector: nothing to inject
            groups = listed.children if isinstance(listed.value, list) else [listed]
            for i, group in enumerate(groups):
                path = f"{op}.faults" + (f"[{i}]" if isinstance(listed.value, list) else "")
                for kind, body in self.mapping(group, path, tuple(_THESIS_KINDS)).items():
                    out.append(self.thesis_fault(str(op), instances, kind, body,
                                                 f"{path}.{kind}", seed))
        if not out:
            raise self.fail(root, "", "missing field 'operators' (operator -> instances, "
                                      "faults), and no operator at the top has faults "
                                      "(the thesis's shape: operator -> enabled, faults)")
        return out

    def thesis_fault(self, op: str, instances: Any, kind: str, body: _Item, path: str,
                     seed: int | None) -> Any:
        fields_ = self.mapping(body, path, ("parameters", "phase"))
        if "parameters" not in fields_:
            raise self.fail(body, path, "missing field 'parameters' (in microseconds)")
        params = self.mapping(fields_["parameters"], f"{path}.parameters",
                              _THESIS_KINDS[kind])
        path = f"{path}.parameters"

        def need(name: str) -> _Item:
            if name not in params:
                raise self.fail(fields_["parameters"], path, f"missing field {name!r}")
            return params[name]

        phase = fields_["phase"].value if "phase" in fields_ else "execute"
        try:
            if kind == "timing":
                lo, hi, mean = self.thesis_mtbf(need("mtbf"), f"{path}.mtbf")
                return Timing(op=op, instances=instances, phase=phase, seed=seed,
                              mtbf_s=mean, mtbf_min_s=lo, mtbf_max_s=hi,
                              magnitude=self.thesis_distribution(need("magnitude"),
                                                                 f"{path}.magnitude"))
            if kind == "message":
                return DropFrames(op=op, instances=instances, seed=seed,
                                  probability=need("probability").value)
            mttr = self.thesis_distribution(need("mttr"), f"{path}.mttr")
            lo, hi, mean = self.thesis_mtbf(need("mtbf"), f"{path}.mtbf")
            if kind == "link":
                return LinkOutage(op=op, instances=instances, seed=seed, mtbf_s=mean,
                                  mtbf_min_s=lo, mtbf_max_s=hi, mttr=mttr,
                                  mttr_s=_mean_of(mttr), lose=True)
            if not isinstance(mttr, (Exponential, Constant)):
                raise self.fail(params["mttr"], f"{path}.mttr", "an instance's repair time "
                                "is exponential: [mean] (or constant: [value])")
            crashes = params["max_crashes"].value if "max_crashes" in params else 1
            return Crash(op=op, instances=instances, seed=seed, mtbf_s=mean,
                         mtbf_min_s=lo, mtbf_max_s=hi, mttr_s=_mean_of(mttr),
                         max_crashes=crashes)
        except (ValueError, TypeError) as exc:
            if isinstance(exc, FaultFileError):
                raise
            raise self.fail(body, path, str(exc)) from None

    def thesis_mtbf(self, item: _Item, path: str) -> tuple[float | None, float | None, float]:
        """``exponential: [min, max, mean]`` (or ``[mean]``) in microseconds: the
        bounds and mean of the gaps, in seconds."""
        kinds = self.mapping(item, path, ("exponential",))
        if "exponential" not in kinds:
            raise self.fail(item, path, "must be exponential: [min, max, mean] "
                                        "(microseconds)")
        values = self.thesis_values(kinds["exponential"], f"{path}.exponential", (1, 3))
        return (None, None, values[0]) if len(values) == 1 else tuple(values)  # type: ignore

    def thesis_distribution(self, item: _Item, path: str) -> Distribution:
        """A distribution as the thesis writes it, in microseconds: ``gaussian: [min,
        max, mean, std]``, ``exponential: [min, max, mean]`` or ``[mean]``,
        ``uniform: [min, max]``, ``constant: [value]``."""
        kinds = self.mapping(item, path, tuple(_DISTRIBUTIONS))
        if len(kinds) != 1:
            raise self.fail(item, path, f"must hold exactly one of {list(_DISTRIBUTIONS)}")
        (kind, body), = kinds.items()
        path = f"{path}.{kind}"
        arity = {"gaussian": (4,), "exponential": (1, 3), "uniform": (2,), "constant": (1,)}
        values = self.thesis_values(body, path, arity[kind])
        try:
            if kind == "gaussian":
                lo, hi, mean, std = values
                return Gaussian(mean=mean, stddev=std, min=lo, max=hi)
            if kind == "exponential":
                if len(values) == 3:
                    raise self.fail(body, path, "bounds on a duration's exponential are "
                                    "not supported: give [mean]")
                return Exponential(mean=values[0])
            if kind == "uniform":
                return Uniform(min=values[0], max=values[1])
            return Constant(value=values[0])
        except ValueError as exc:
            if isinstance(exc, FaultFileError):
                raise
            raise self.fail(body, path, str(exc)) from None

    def thesis_values(self, item: _Item, path: str, arity: tuple[int, ...]) -> list[float]:
        values = item.value
        if (not isinstance(values, list) or len(values) not in arity
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)):
            raise self.fail(item, path, f"must be a list of {' or '.join(map(str, arity))} "
                                        f"numbers in microseconds, got {values!r}")
        return [v / _MICROSECONDS_PER_S for v in values]

    def _field_error(self, exc: Exception, body: _Item, given: dict, path: str
                     ) -> FaultFileError:
        """The constructor's message (``Cls.field must ...``) at the field's own line."""
        message = str(exc)
        head = message.split(" ", 1)[0]
        field_name = head.split(".", 1)[1] if "." in head else None
        if field_name in given:
            return self.fail(given[field_name], f"{path}.{field_name}",
                             message.split(" ", 1)[1])
        return self.fail(body, path, message)


def load(path: str | Path) -> list:
    """The faults a YAML fault file describes (see above); `FaultFileError` naming
    the file, line and field of the first mistake."""
    import yaml
    from yaml.constructor import SafeConstructor

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FaultFileError(f"{path}: cannot read the fault file: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FaultFileError(f"{path}{line}: not valid YAML: {problem}") from None
    if node is None:
        raise FaultFileError(f"{path}: the fault file is empty")
    try:
        root = _from_yaml_node(node, SafeConstructor())
    except yaml.YAMLError as exc:
        raise FaultFileError(f"{path}: {exc}") from None
    return _Reader(str(path)).faults(root)


def from_dict(doc: Any, source: str = "<dict>") -> list:
    """The faults a document shaped like a fault file describes (``load`` without
    the file)."""
    return _Reader(source).faults(_from_python(doc))


__all__ = ["AddNode", "Constant", "Crash", "DropConnection", "DropFrames", "Exponential",
           "FaultFileError", "Gaussian", "KillInstance", "KillNode", "KillWorker",
           "LinkOutage", "RandomKills", "Timing", "Uniform", "from_dict", "load"]
