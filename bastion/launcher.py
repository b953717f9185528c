"""`bn.run`: validate, plan, deploy and run a topology, and return what it produced.

``bn.run`` is synchronous: it returns when a bounded job has consumed all of its input
(or an unbounded one has run for ``duration_s``) and every sink has committed. It
starts a local Ray if none is running — bound to 127.0.0.1 only — or connects to
``address`` (``"auto"`` or ``"ray://head:10001"``). The job master's host and the
workers are borrowed from the cluster's pool (`bastion.scheduler.pool`): the first job
of a Ray session starts them, the next ones find them warm.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import re
import socket
import sys
import sysconfig
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

import ray
from ray import cloudpickle
from ray._private import ray_constants

from bastion import faults as fault_injection
from bastion.options import (AutoInterval, DataPlane, Limits, Recovery, Redundancy,
                             State, Storage)
from bastion.errors import BastionError, JobFailedError, TopologyError, UDFError
from bastion.protocols import Protocol, get_protocol
from bastion.runtime import priority
from bastion.runtime.config import JobConfig
from bastion.runtime.instance import Worker
from bastion.runtime.job import JobHost, MasterLimits
from bastion.runtime.merge import nondeterminism
from bastion.runtime.metrics import (LatencyHistogram, OperatorCounts, ProtocolMetrics,
                                     RunMetrics)
from bastion.runtime.outputs import committed_outputs, read_committed
from bastion.runtime.plan import PhysicalPlan, build_plan
from bastion.runtime import savepoint as savepoints
from bastion.runtime.redundancy import resolve as resolve_redundancy
from bastion.scheduler.pool import get_pool
from bastion.scheduler.failover import failover_strategy
from bastion.scheduler.recovery import RecoveryPolicy
from bastion.storage import ObjectStore, open_store
from bastion.topology import Topology

_PROGRESS_INTERVAL_S = 0.5
_NODE_POLL_S = 0.05  # how often the driver looks whether a node is due (`AddNode`)


@dataclass
class RunResult:
    """What a run produced: committed sink outputs, metrics and dead letters. With
    ``lineage=True``, ``output_ids[sink]`` lists the lineage id of every committed
    record, parallel to ``outputs[sink]`` (empty without lineage). ``warnings`` says
    what went wrong without failing the job, e.g. run events the store did not take.

    ``outputs[sink]`` is a list for sinks that keep records in memory (``Collect``).
    For a sink whose records leave the job (``File``, ``Log``: `Sink.lazy_outputs`)
    it is a `CommittedOutputs`, and so is ``output_ids[sink]``: a read-only sequence
    with the length of the committed records, which streams them from the job's
    store when it is iterated or indexed — the driver never holds them all, however
    many the job wrote."""

    job_id: str
    outputs: dict[str, Sequence[Any]]
    metrics: RunMetrics
    dead_letters: list = field(default_factory=list)
    plan: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    output_ids: dict[str, Sequence[Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # True when the job was stopped with a savepoint (`bn.stop`, `RunHandle.stop`)
    # rather than ending: ``bn.run(..., resume_from=job_id)`` resumes it
    savepoint: bool = False


# Ray's own processes (its dashboard probes cloud metadata services over plain HTTP at
# start-up) get a proxy that points at a closed loopback port, so a local Ray sends
# nothing off the machine; worker processes get the caller's proxy settings back.
_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")
_DEAD_PROXY = "http://127.0.0.1:9"
_LOOPBACK = "127.0.0.1,localhost,::1"


def ensure_ray(address: str | None = None) -> None:
    """Connect to Ray, starting a loopback-only local instance when none is running."""
    if ray.is_initialized():
        return
    if address:
        _check_reachable(address)
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
        return
    saved = {k: os.environ.get(k) for k in _PROXY_VARS}
    # Without these a local Ray binds to the machine's network address and reports
    # usage; with them (and the explicit node address) every socket stays on 127.0.0.1.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # This process imported Ray before the variable was set: apply it here too.
    ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
    os.environ.update(http_proxy=_DEAD_PROXY, HTTP_PROXY=_DEAD_PROXY,
                      no_proxy=_LOOPBACK, NO_PROXY=_LOOPBACK)
    notice = _AuthNotice()
    handlers = list(logging.getLogger("ray").handlers)
    for handler in handlers:
        handler.addFilter(notice)
    try:
        ray.init(
            # A new instance of its own: without an address, Ray would join any cluster
            # a `ray start` left running on this machine.
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=True,
            logging_level="WARNING",   # type: ignore[arg-type]  # Ray takes a name too
            runtime_env={"env_vars": {k: v or "" for k, v in saved.items()}},
        )
    finally:
        for handler in handlers:
            handler.removeFilter(notice)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """A head's ``HOST:PORT`` must accept a connection before Ray is asked to join it:
    Ray itself retries for a minute, printing its log lines, when nothing listens
    there. ``auto`` and ``ray://`` addresses are Ray's to resolve."""
    if address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except ValueError:
        raise ValueError(f"address {address!r}: the port must be a number") from None
    except OSError as exc:
        raise ConnectionError(f"nothing accepts connections at {address} "
                              f"({exc.strerror or exc})") from None


class _AuthNotice(logging.Filter):
    """Drops Ray's notice that a new local instance has token authentication on,
    printed on every start of one — from the Python API too, where `bastion`'s command
    line already keeps Ray's start-up notices quiet. Its other warnings pass, and so
    does this one when the ``bastion`` logger is set to DEBUG (``bastion --verbose``
    sets it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return (not record.name.startswith("ray._private.authentication")
                or logging.getLogger("bastion").isEnabledFor(logging.DEBUG))


def _installed_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib",
                                                      "platlib"))


def ship_user_modules(topology: Topology, *extra: Any) -> None:
    """Make the modules that define a topology's functions travel with it.

    Ray pickles functions and classes by reference to their module; a worker process
    can only import modules that are installed or on its path. A topology defined in a
    script loaded by path (``bastion run my_job.py``) or in a test module would not be
    found, so such modules are pickled by value instead.
    """
    roots = _installed_roots()
    objects: list[Any] = list(topology.codecs) + list(extra)
    for node in topology.nodes.values():
        objects.extend(node.params.values())
        objects.extend(inp.key_fn for inp in node.inputs if inp.key_fn is not None)
    seen: set[str] = set()
    for obj in objects:
        for part in [obj, *getattr(obj, "__dict__", {}).values()]:
            name = getattr(part, "__module__", None) or type(part).__module__
            if not name or name in seen or name == "__main__" or name.split(".")[0] == "bastion":
                continue
            seen.add(name)
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None)
            if module is None or path is None:
                continue
            if not os.path.realpath(path).startswith(roots):
                cloudpickle.register_pickle_by_value(module)


_TRACEBACK = "Traceback (most recent call last):"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def plain(text: str) -> str:
    """``text`` without the terminal colour codes Ray puts in a remote error's text
    (``\\x1b[36m``): an error message is read in logs and files too."""
    return _ANSI.sub("", text)


def _master_error(exc: "ray.exceptions.RayTaskError", job_id: str) -> BaseException:
    """The error of a job master that raised instead of reporting a failure: the
    error it raised if it is one of ours (a store problem, a damaged object — its
    message names what is wrong), otherwise a `JobFailedError` naming its type and
    message; never Ray's wrapper, whose text is a remote traceback in colour."""
    cause = exc.cause
    if isinstance(cause, BastionError) and not isinstance(cause, ray.exceptions.RayError):
        if isinstance(cause, JobFailedError):
            cause.job_id = job_id
        return cause
    error = JobFailedError(f"job {job_id} failed: its job master raised "
                           f"{type(cause).__name__}: {plain(str(cause)).splitlines()[0]}"
                           if cause is not None else
                           f"job {job_id} failed: {plain(str(exc)).splitlines()[0]}")
    error.job_id = job_id
    return error


# An operator's parameters (`OpNode.params`) as a message names them.
_PARAM_WORDS = {"fn": "function", "initial": "initial state", "spec": "window"}


def unpicklable(topology: Topology, exc: BaseException) -> TopologyError:
    """The error for a topology Ray could not pickle to send it to the workers: names
    the operator and the type of what cannot be sent (a lock, an open file, a
    connection), found by pickling each operator's parts again, one by one."""
    for node in topology.nodes.values():
        parts = [(f"its {_PARAM_WORDS.get(name, name)}", value)
                 for name, value in node.params.items()]
        parts += [("its key function", inp.key_fn) for inp in node.inputs
                  if inp.key_fn is not None]
        for what, value in parts:
            try:
                cloudpickle.dumps(value)
            except Exception as error:  # noqa: BLE001 - whatever pickling raised
                found = re.search(r"cannot pickle '([^']+)' object", str(error))
                type_name = found.group(1) if found else type(value).__name__
                return TopologyError(
                    f"operator {node.name!r}: {what} holds a value of type {type_name}, "
                    f"which cannot be sent to the worker processes ({plain(str(error))}); "
                    "create such an object inside the operator's function, where it is "
                    "used, and keep operator state to values a codec stores")
    cause = exc.__cause__ or exc
    return TopologyError(f"topology {topology.name!r} cannot be sent to the worker "
                         f"processes: {plain(str(cause)).splitlines()[0]}")


#: Each keyword `bn.run` and `bn.drill` took before the options objects
#: (`bastion.options`), and where its setting lives now: passing one is a `TypeError`
#: that quotes this table (`old_keyword_message`), so code written for an earlier
#: release learns in one line what to write instead.
OLD_KEYWORDS: dict[str, str] = {
    "checkpoint_interval": "protocol=bn.protocols.Coordinated(interval_s=…) (the "
                           "interval_s of the run's protocol object; 'auto' is "
                           "interval_s=bn.AutoInterval(trt_bound_s=…))",
    "retained_checkpoints": "protocol=bn.protocols.Coordinated(retained_checkpoints=…)",
    "trt_bound_s": "protocol=bn.protocols.Coordinated(interval_s=bn.AutoInterval("
                   "trt_bound_s=…))",
    "retune_every_s": "protocol=bn.protocols.Coordinated(interval_s=bn.AutoInterval("
                      "trt_bound_s=…, retune_every_s=…))",
    "tuning": "protocol=bn.protocols.Coordinated(interval_s=bn.AutoInterval("
              "trt_bound_s=…, tuning=…))",
    "cec": "protocol=bn.protocols.Cec(policy=…)",
    "acks_mode": "protocol=bn.protocols.Acks(mode=…)",
    "ack_timeout_s": "protocol=bn.protocols.Acks(timeout_s=…)",
    "max_pending": "protocol=bn.protocols.Acks(max_pending=…)",
    "buffer_timeout_ms": "data_plane=bn.DataPlane(buffer_timeout_ms=…)",
    "frame_records": "data_plane=bn.DataPlane(frame_records=…)",
    "max_inflight_frames": "data_plane=bn.DataPlane(max_inflight_frames=…)",
    "source_batch_records": "data_plane=bn.DataPlane(source_batch_records=…)",
    "chaining": "data_plane=bn.DataPlane(chaining=…)",
    "heartbeat_timeout_s": "recovery=bn.Recovery(heartbeat_timeout_s=…)",
    "max_restarts": "recovery=bn.Recovery(max_restarts=…)",
    "failover": "recovery=bn.Recovery(failover=…)",
    "dedup_window_s": "redundancy=bn.Redundancy(dedup_window_s=…)",
    "latency_bound_ms": "redundancy=bn.Redundancy(ratio='auto', latency_bound_ms=…)",
    "resiliency": "redundancy=bn.Redundancy(ratio='auto', policy=…)",
    "sink_spill_records": "limits=bn.Limits(sink_spill_records=…)",
    "master_limits": "limits=bn.Limits(commit_attempts=…, commit_backoff_s=…, events=…)",
    "pool_idle_timeout_s": "limits=bn.Limits(pool_idle_timeout_s=…)",
}

def old_keyword_message(name: str, function: str = "bn.run") -> str:
    """What `bn.run` (or ``function``) says of the old keyword ``name``: the object
    that holds its setting now."""
    return f"{function}() no longer takes {name}=: use {OLD_KEYWORDS[name]}"


def refuse_old_keywords(given: Mapping[str, Any], function: str = "bn.run") -> None:
    """Raise `TypeError` for the first of ``given`` (keywords a caller passed that the
    function does not take): for a keyword of earlier releases, naming the object that
    holds its setting now (`OLD_KEYWORDS`); for any other, as Python would."""
    for name in given:
        if name in OLD_KEYWORDS:
            raise TypeError(old_keyword_message(name, function))
        raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


@dataclass(frozen=True)
class Options:
    """A run's options objects, the shorthands made objects (`resolve_options`)."""

    data_plane: DataPlane
    recovery: Recovery
    redundancy: Redundancy | None
    limits: Limits


_Made = TypeVar("_Made")


def _shorthand(cls: type[_Made], field: str, value: Any, keyword: str) -> _Made:
    """``cls(field=value)``, a shorthand made its object; a refusal names the field as
    the caller wrote it (``keyword``), not as the object calls it."""
    try:
        return cls(**{field: value})
    except ValueError as exc:
        message = str(exc)
        if message.startswith(field + " "):
            message = keyword + message[len(field):]
        raise ValueError(message) from None


def resolve_options(data_plane: DataPlane | None = None,
                    recovery: "Recovery | str | RecoveryPolicy | None" = None,
                    redundancy: "Redundancy | float | Mapping[str, float] | str | None" = None,
                    limits: Limits | None = None) -> Options:
    """The options objects of a run, defaults for those not given, and the shorthands
    that stay made objects: a recovery mode or `RecoveryPolicy` as ``recovery=``; a
    ratio, a mapping operator -> ratio or ``"auto"`` as ``redundancy=``."""
    made_recovery = (recovery if isinstance(recovery, Recovery)
                     else _shorthand(Recovery, "policy", recovery, "recovery"))
    made_redundancy = (redundancy if redundancy is None or isinstance(redundancy, Redundancy)
                       else _shorthand(Redundancy, "ratio", redundancy, "redundancy"))
    return Options(data_plane or DataPlane(), made_recovery, made_redundancy,
                   limits or Limits())


def run(topology: Topology, protocol: "str | Protocol" = "none", *,
        storage: Storage | str = "local://.bastion",
        data_plane: DataPlane | None = None,
        recovery: "Recovery | str | RecoveryPolicy | None" = None,
        redundancy: "Redundancy | float | Mapping[str, float] | str | None" = None,
        limits: Limits | None = None,
        state: State | None = None,
        faults: Sequence = (), duration_s: float | None = None,
        lineage: bool = False, deterministic: bool = False, fail_fast: bool = False,
        progress: Callable[[dict[str, Any]], None] | None = None,
        resume_from: str | None = None, workers: int | None = None,
        address: str | None = None, cluster: Any = None, export_metrics: bool = True,
        **old_keywords: Any) -> RunResult:
    """Run ``topology`` to completion and return its committed outputs and metrics.

    ``protocol`` is the fault-tolerance protocol: an object of `bastion.protocols`
    that carries its own knobs (``bn.protocols.Coordinated(interval_s=0.5)``,
    ``Acks(timeout_s=…)``, ``Cec(policy)``, …; an `AutoInterval` as ``interval_s``
    tunes the interval for a bound on the total recovery time), or a name
    (``"none"``, ``"acks"``, ``"coordinated"``, ``"uncoordinated"``, ``"cic"``,
    ``"cec"``) for its defaults. ``storage`` is where checkpoints, committed outputs
    and events live (a `Storage`, or its URL: ``local://PATH`` or
    ``s3://BUCKET/PREFIX?endpoint=HOST:PORT``).

    The options objects (`bastion.options`) each gather one concern, checked when
    they are made: ``data_plane`` (`DataPlane`: frames, credits, batches, buffer
    timeout, chaining), ``recovery`` (`Recovery`: the recovery policy — per query
    availability is in ``RunResult.metrics.extra["queries"]`` —, the failover
    scope, the heartbeat timeout, the restarts allowed; a recovery mode or
    `RecoveryPolicy` alone is shorthand), ``redundancy`` (`Redundancy`: redundant
    copies of tuples, protocols ``none`` and ``acks``; a ratio, a mapping operator ->
    ratio or ``"auto"`` alone is shorthand; the resiliency manager's decisions are in
    ``RunResult.metrics.extra["redundancy"]["decisions"]``) and ``limits``
    (`Limits`: commit retries, events kept, sink spilling, the warm-process pool's
    idle timeout) and ``state`` (`State`: whole or incremental keyed state in each
    checkpoint). None: the defaults.

    ``faults`` (``bn.faults.*``) are injected on schedule, for drills; ``duration_s``
    stops an unbounded job; ``lineage`` gives every record a lineage id
    (`bastion.lineage`) and fills ``RunResult.output_ids``; ``deterministic`` merges
    every multi-input task's inputs in a fixed order (`bastion.runtime.merge`), so
    every run commits the same outputs in the same order — a topology that cannot (a
    feedback edge, windows on ingest time) raises `TopologyError` saying why;
    ``fail_fast`` stops the job at the first user-function error instead of sending
    the record to the dead-letter output; ``progress`` is called about twice a
    second with the records read and written so far; ``resume_from`` names an
    earlier job in the same storage whose state this one starts from: its savepoint,
    if it was stopped with one (`stop`, `RunHandle.stop`; under any protocol, and
    keyed operators may change their parallelism: `bastion.runtime.savepoint`),
    else under protocol ``"cec"`` its logged state (the eventual checkpoints
    `bastion reconstruct` stored for it, else its logs; its committed outputs are not
    committed again); ``workers``
    is the number of worker actors (default: the largest parallelism); ``address``
    is a Ray cluster to join (``"auto"``, ``"ray://head:10001"``; default: a local
    Ray on 127.0.0.1); ``cluster`` is a simulated `ray.cluster_utils.Cluster` the
    driver adds `bn.faults.AddNode` nodes to; ``export_metrics`` (default on) has
    the job master record live series (``bastion_*``) through `ray.util.metrics`,
    for Prometheus to scrape from Ray's metrics export port
    (`bastion.runtime.export`).

    A keyword of earlier releases (``checkpoint_interval=``, ``frame_records=``,
    ``ack_timeout_s=``, …) is a `TypeError` that names the object holding its setting
    now (`OLD_KEYWORDS`).

    A job that fails raises `JobFailedError` — `SinkCommitError` when a sink kept
    failing to apply a commit, `NoUsableCheckpointError` when no checkpoint could be
    restored without committing outputs twice — or the `UDFError` of ``fail_fast``.
    """
    refuse_old_keywords(old_keywords)
    if state is not None and not isinstance(state, State):
        raise ValueError(f"state must be a bn.State, got {state!r}")
    options = resolve_options(data_plane, recovery, redundancy, limits)
    data_plane, limits = options.data_plane, options.limits
    recovery_options, redundancy_options = options.recovery, options.redundancy
    storage_url = Storage.of(storage).url
    proto = get_protocol(protocol)
    lineage = lineage or proto.needs_lineage
    ratio = None if redundancy_options is None else redundancy_options.ratio
    policy = None if redundancy_options is None else redundancy_options.resiliency_policy()
    dedup_window_s = (None if redundancy_options is None
                      else redundancy_options.dedup_window_s)
    if dedup_window_s is None:
        dedup_window_s = proto.dedup_window_s()
    copied = resolve_redundancy(topology, ratio,
                                0.0 if policy is None else policy.initial_ratio)
    if copied:
        if not proto.tolerates_copies:
            raise TopologyError(
                f"redundancy={ratio!r} with protocol {proto.name!r}: an exactly-once "
                "protocol processes every tuple once, and a redundant copy is a second "
                "processing; use protocol 'none' or 'acks'")
        if deterministic:
            raise ValueError("redundancy cannot run with deterministic=True: which copy "
                             "of a tuple arrives first is a race")
        proto.check_copies(dedup_window_s)
        lineage = True   # copies are told apart from new tuples by their ids
    plan = build_plan(topology, chaining=data_plane.chaining, workers=workers,
                      redundancy=copied)
    proto.check(topology)
    if deterministic and proto.nondeterministic_merge is not None:
        raise ValueError(f"protocol {proto.name!r} cannot run with deterministic=True: "
                         f"{proto.nondeterministic_merge}")
    if deterministic and (reason := nondeterminism(topology)) is not None:
        raise TopologyError(f"topology {topology.name!r} cannot run with "
                            f"deterministic=True: {reason}")
    recovery_policy = recovery_options.recovery_policy()
    # a bad failover, or a protocol that names no restart scope, fails before deploy
    failover_strategy(recovery_options.failover, proto.restart_scope, recovery_policy)
    retune = None
    interval_s = getattr(proto, "interval_s", None)
    if isinstance(interval_s, AutoInterval):
        interval_s, retune = _auto_interval(
            topology, proto, interval_s, duration_s,
            {"storage": storage_url, "address": address, "workers": workers,
             "data_plane": DataPlane(chaining=data_plane.chaining),
             "recovery": Recovery(failover=recovery_options.failover,
                                  heartbeat_timeout_s=recovery_options.heartbeat_timeout_s)})
        # the workers get the interval the model chose, not the tuning behind it
        proto = copy.copy(proto)
        proto.interval_s = interval_s
        protocol = proto
    if not proto.needs_checkpoint_interval:
        interval_s = None
    elif interval_s is None:   # a protocol object that does not say (a subclass's)
        interval_s = 1.0
    proto.check_interval(interval_s)
    store = open_store(storage_url)  # fails here, naming the URL, if it is unusable
    resumed = None if resume_from is None else _resumed(store, resume_from, proto, topology)
    if resumed is not None:  # a savepoint: every protocol starts from it, not from logs
        resume_from = None
    unbounded = [n.name for n in topology.nodes.values()
                 if n.kind == "source" and not n.params["source"].bounded]
    if unbounded and duration_s is None:
        raise TopologyError(f"source {unbounded[0]!r} is unbounded: pass duration_s to "
                            "bn.run (or --duration to bastion run) to say when to stop")
    master_limits = MasterLimits(commit_attempts=limits.commit_attempts,
                                 commit_backoff_s=limits.commit_backoff_s,
                                 events=limits.events)
    pool_idle_timeout_s = limits.pool_idle_timeout_s
    config = JobConfig(
        job_id=f"{topology.name}-{uuid.uuid4().hex[:8]}",
        protocol=protocol if isinstance(protocol, Protocol) else proto.name,
        lineage=lineage,
        deterministic=deterministic,
        frame_records=data_plane.frame_records,
        buffer_timeout_s=data_plane.buffer_timeout_ms / 1000.0,
        max_inflight_frames=data_plane.max_inflight_frames,
        source_batch_records=data_plane.source_batch_records,
        fail_fast=fail_fast,
        duration_s=duration_s,
        codecs=tuple(topology.codecs),
        storage_url=store.url,
        checkpoint_interval_s=interval_s,
        retained_checkpoints=getattr(proto, "retained_checkpoints", 2),
        heartbeat_timeout_s=recovery_options.heartbeat_timeout_s,
        stall_warning_s=recovery_options.stall_warning_s,
        max_restarts=recovery_options.max_restarts,
        faults=tuple(faults),
        sink_spill_records=limits.sink_spill_records,
        resume_from=resume_from,
        savepoint=resumed,
        redundancy=copied,
        dedup_window_s=dedup_window_s,
        resiliency=policy,
        retune=retune,
        recovery=recovery_policy,
        failover=recovery_options.failover,
        export_metrics=export_metrics,
        incremental_state=state is not None and state.incremental,
        max_chain=State().max_chain if state is None else state.max_chain,
        fork_min_keys=(state or State()).fork_at_keys,
    )
    additions = fault_injection.node_additions(config.faults)
    if additions and cluster is None:
        raise ValueError(f"{additions[0]!r} adds a node to a simulated cluster: pass "
                         "cluster=ray.cluster_utils.Cluster(...) (on a real cluster nodes "
                         "come from the autoscaler or an operator)")
    kills = fault_injection.validate(config.faults, plan)
    for fault in config.faults:
        if (isinstance(fault, fault_injection.Timing) and fault.phase == "ack"
                and not proto.acknowledges_tuples):
            raise ValueError(f"{fault!r}: phase 'ack' stalls acknowledgments of tuples, "
                             f"which protocol {proto.name!r} does not send; use protocol "
                             "'acks', or phase 'execute' or 'emit'")
    for node in topology.nodes.values():
        if node.kind == "sink":
            node.params["sink"].prepare(node.parallelism)
    ensure_ray(address)
    for kill in kills:
        if kill.node is not None:  # a node that does not exist fails here, not mid-run
            fault_injection.resolve_node(kill.node, fault_injection.live_nodes())
    ship_user_modules(topology, proto)
    # The job master's host and the workers are borrowed from the cluster's pool
    # (`bastion.scheduler.pool`): warm processes when an earlier job left them idle.
    lend_started_s = time.time()
    pool = get_pool(Worker, JobHost)
    if pool_idle_timeout_s is not None:
        pool.set_idle_timeout.remote(pool_idle_timeout_s)  # before the lend: calls keep order
    lending = pool.lend_host.remote()
    pending = None
    try:
        host = ray.get(lending)
        lend_host_s = time.time() - lend_started_s
        try:
            pending = host.run.remote(plan, config, master_limits, pool)
        except TypeError as exc:  # Ray could not pickle the plan: a user's object in it
            raise unpicklable(topology, exc) from None
        waiting_s = _NODE_POLL_S if additions else _PROGRESS_INTERVAL_S
        last_progress_s = 0.0
        job_started_s = None  # by this driver's clock: additions keep to it, not to
        while True:           # how quickly a busy job master answers
            ready, _ = ray.wait([pending], timeout=waiting_s)
            if ready:
                break
            if job_started_s is not None:
                while additions and time.time() - job_started_s >= additions[0].at:
                    _add_node(cluster, additions.pop(0), host, config.job_id)
            due = progress is not None and time.time() - last_progress_s >= _PROGRESS_INTERVAL_S
            if not due and (job_started_s is not None or not additions):
                continue
            now = ray.get(host.progress.remote(config.job_id))
            if now is None:
                continue
            if job_started_s is None and now["elapsed_s"] > 0:
                job_started_s = time.time() - now["elapsed_s"]
            if due and progress is not None:
                last_progress_s = time.time()
                progress(now)
        try:
            report = ray.get(pending)
        except ray.exceptions.RayTaskError as exc:
            raise _master_error(exc, config.job_id) from None
    except BaseException:
        # The driver gives up (Ctrl-C, a failing progress callback): so does the job.
        # The host outlives it, so the job is cancelled, not killed with its host; the
        # job master then releases its workers as at any other end. Not recursively:
        # a lend the pool is carrying out must finish, or its worker is never returned.
        if pending is not None:
            ray.cancel(pending, recursive=False)
        raise
    finally:
        pool.give_back_host.remote()
    failure = report["failure"]
    if isinstance(failure, JobFailedError):
        failure.job_id = config.job_id
    if isinstance(failure, (UDFError, JobFailedError)):
        raise failure
    if failure is not None:
        # A worker's unexpected error arrives as text with its traceback: the message
        # keeps what went wrong, and the traceback goes to ``details``.
        text, _, trace = plain(str(failure)).partition(_TRACEBACK)
        error = JobFailedError(f"job {config.job_id} failed: {text.strip()}")
        error.job_id = config.job_id
        error.details = _TRACEBACK + trace if trace else None
        raise error
    return _result(config, plan, report, store, lend_host_s)


def _resumed(store: ObjectStore, job_id: str, proto: Protocol, topology: Topology
             ) -> savepoints.Savepoint | None:
    """The savepoint a job resuming ``job_id`` starts from, checked against
    ``topology`` and every blob against its CRC; None: ``job_id`` has none, and the
    protocol resumes from its logs (``cec``). Worded for both ways in —
    ``resume_from=`` in Python, ``--resume-from`` on the command line — so the
    messages name neither keyword nor flag."""
    if not store.list(f"jobs/{job_id}/"):
        raise ValueError(f"cannot resume from job {job_id!r}: storage {store.url} "
                         f"holds no job {job_id!r} (a job's id is the one a failed "
                         "run reports, or a directory name under jobs/)")
    saved = savepoints.read_manifest(store, job_id)
    if saved is None:
        if not proto.resumable:
            raise ValueError(
                f"cannot resume from job {job_id!r}: it left no savepoint (`bastion stop "
                f"{job_id} --savepoint` or bn.stop makes one), and protocol "
                f"{proto.name!r} cannot start from an earlier job's logged state; only "
                "protocol 'cec' can")
        return None
    savepoints.check_resumable(saved, topology)
    savepoints.check_blobs(store, saved)
    return saved


def process_cpu_s(tasks: list[dict[str, Any]]) -> tuple[float, int]:
    """CPU seconds the tasks' processes spent running them, and how many processes.
    A process's CPU clock is shared by the tasks it hosts, so each process counts once:
    from its first task's start to its last task's end (``started_cpu_s`` and
    ``finished_cpu_s`` of task reports, read from that process's clock) — plus what
    the children that encoded the tasks' large snapshots spent (``forked_cpu_s``)."""
    spans: dict[str, tuple[float, float]] = {}
    for t in tasks:
        started, finished = spans.get(t["process"], (math.inf, -math.inf))
        spans[t["process"]] = (min(started, t["started_cpu_s"]),
                               max(finished, t["finished_cpu_s"]))
    forked_s = sum(t.get("forked_cpu_s", 0.0) for t in tasks)
    return (sum(finished - started for started, finished in spans.values()) + forked_s,
            len(spans))


def _latency_summaries(tasks: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The protocols' latency histograms (`TaskProtocol.histograms`), merged over
    tasks: per name, mean, p50, p90 and p99 in milliseconds."""
    merged: dict[str, LatencyHistogram] = {}
    for task in tasks:
        for name, buckets in task["protocol_histograms"].items():
            merged.setdefault(name, LatencyHistogram()).merge(LatencyHistogram(buckets))
    summaries = {}
    for name, histogram in merged.items():
        stats = histogram.mean_std()
        if stats is None:   # nothing measured under that name
            continue
        summaries[name] = {"mean": stats[0] * 1000.0, **{
            f"p{q}": (histogram.percentile(q) or 0.0) * 1000.0 for q in (50, 90, 99)}}
    return summaries


def _auto_interval(topology: Topology, proto: Protocol, auto: AutoInterval,
                   duration_s: float | None, run_options: dict[str, Any]
                   ) -> tuple[float, Any]:
    """An `AutoInterval` as the protocol's ``interval_s``: the tuned interval, and the
    re-tune policy of its ``retune_every_s`` (None without). Refused before anything
    is profiled: a protocol that takes no checkpoints, or a re-tune its coordinator
    cannot apply."""
    from bastion.scheduler.retune import RetunePolicy
    from bastion.tuning import AUTO_POINTS, TuningResult, auto_range, tune

    trt_bound_s, retune_every_s, tuning = auto.trt_bound_s, auto.retune_every_s, auto.tuning
    if not proto.needs_checkpoint_interval:
        raise ValueError(f"interval_s=AutoInterval(…): protocol {proto.name!r} takes no "
                         "checkpoints; pick a checkpointing protocol, e.g. 'coordinated'")
    if retune_every_s is not None and not proto.live_interval:
        raise ValueError(f"retune_every_s: protocol {proto.name!r} cannot move its "
                         "checkpoint interval while the job runs; use 'coordinated'")
    if isinstance(tuning, TuningResult):
        if tuning.trt_bound_s != trt_bound_s:
            raise ValueError(f"AutoInterval(trt_bound_s={trt_bound_s:g}) contradicts the "
                             f"tuning's bound of {tuning.trt_bound_s:g} s: give one")
        result = tuning
    else:
        options = dict(tuning or {})
        if "min_interval_s" not in options or "max_interval_s" not in options:
            try:
                low, high = auto_range(topology, duration_s)
            except ValueError as exc:
                raise ValueError(f"interval_s=AutoInterval(…): {exc}; give the protocol "
                                 "interval_s=S (seconds)") from exc
            options = {"min_interval_s": low, "max_interval_s": high,
                       "points": AUTO_POINTS, **options}
        result = tune(topology, trt_bound_s=trt_bound_s, protocol=proto.name,
                      duration_s=duration_s, **{**run_options, **options})
    if result.interval_s is None:
        raise ValueError(f"interval_s=AutoInterval(…): {result.reason}")
    policy = None if retune_every_s is None else RetunePolicy.of(result, retune_every_s)
    return result.interval_s, policy


def _add_node(cluster: Any, addition: fault_injection.AddNode, host: Any, job_id: str
              ) -> None:
    """Carry out ``addition``: a node with its CPUs joins the simulated cluster, on
    127.0.0.1; the job's events record it, with the nice value its processes run at.

    The node boots at the lowest CPU priority (`priority.children_niced`): on a real
    cluster a node boots on a machine of its own, but here its Ray agents (two
    Python processes at nice 0, about a second of CPU each) share the cores with the
    job's workers, which Ray runs at nice 15 — and took both cores from them: the
    queries a failure did not hit stalled for 0.3-0.5 s at every node that arrived.
    What runs on the node later inherits that nice value: the job's workers there
    run at 19, not 15, for as long as the node lives."""
    # Not waited for: the node registers with the cluster on its own (the job master
    # sees it then), and the driver stays on time for the next addition.
    with priority.children_niced():
        node = cluster.add_node(wait=False, num_cpus=addition.cpus,
                                node_ip_address="127.0.0.1")
    host.note_event.remote(job_id, "node_added", cpus=addition.cpus, nice=_nice_of(node))


def _nice_of(node: Any) -> int | None:
    """The nice value of ``node``'s raylet, which every process of the node inherits
    (None: unknown)."""
    try:
        raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
        return os.getpriority(os.PRIO_PROCESS, raylet.pid)
    except (AttributeError, IndexError, KeyError, OSError):
        return None


def _summed(tasks: list[dict[str, Any]], field: str) -> dict[str, float]:
    """The counters ``field`` of the last attempt's tasks, summed (a counter named
    ``max_...``: the largest); empty when no task had any. ``faults_injected``: what
    the tasks injected (`bastion.runtime.faults`); ``protocol_counters``: what their
    protocol counted (`TaskProtocol.counters`)."""
    total: dict[str, float] = {}
    for task in tasks:
        for name, value in (task[field] or {}).items():
            total[name] = (max(total.get(name, value), value) if name.startswith("max_")
                           else total.get(name, 0) + value)
    return total


def _result(config: JobConfig, plan: PhysicalPlan, report: dict[str, Any],
            store: ObjectStore, lend_host_s: float) -> RunResult:
    tasks = report["tasks"]
    outputs: dict[str, Sequence[Any]] = {}
    latency = LatencyHistogram()
    timeline: dict[int, int] = {}
    latency_windows: dict[int, LatencyHistogram] = {}
    operators: dict[str, OperatorCounts] = {name: OperatorCounts()
                                            for name in plan.topology.nodes}
    dead_letters = []
    for task in tasks:
        for name, (records_in, records_out) in task["operators"].items():
            operators[name].records_in += records_in
            operators[name].records_out += records_out
        for name, sink in task["sinks"].items():
            latency.merge(LatencyHistogram(sink["latency"]))
            for second, count in sink["timeline"].items():
                timeline[second] = timeline.get(second, 0) + count
            for second, buckets in sink["latency_by_second"].items():
                latency_windows.setdefault(second, LatencyHistogram()).merge(
                    LatencyHistogram(buckets))
        dead_letters.extend(task["dead_letters"])
    output_ids: dict[str, Sequence[Any]] = {}
    for name, node in plan.topology.nodes.items():
        if node.kind != "sink":
            continue
        if node.params["sink"].lazy_outputs:
            # Records that left the job stay in the store: a job that wrote 100 GB to
            # a log must not need 100 GB in the driver. Only their count is read now.
            outputs[name], lazy_ids = committed_outputs(store, config.job_id, name,
                                                        config.codecs)
            if config.lineage:
                output_ids[name] = lazy_ids
            continue
        outputs[name], ids = read_committed(store, config.job_id, name, config.codecs)
        if config.lineage:
            output_ids[name] = ids or []
    duration_s = max(report["finished_s"] - report["started_s"], 1e-9)
    source_records = sum(c.records_out for n, c in operators.items()
                         if plan.topology.nodes[n].kind == "source")
    sink_records = sum(c.records_in for n, c in operators.items()
                       if plan.topology.nodes[n].kind == "sink")

    def pct(q: float) -> float | None:
        v = latency.percentile(q)
        return None if v is None else v * 1000.0

    frame_protocol_bytes = sum(t["protocol_frame_bytes"] for t in tasks)
    cpu_s, cpu_processes = process_cpu_s(tasks)
    protocol = ProtocolMetrics(
        protocol=get_protocol(config.protocol).name,
        **dataclasses.asdict(report["protocol"]),
        protocol_bytes=frame_protocol_bytes + sum(t["protocol_message_bytes"] for t in tasks),
        data_bytes=sum(t["bytes_sent"] for t in tasks) - frame_protocol_bytes,
        failures=report["failures"],
    )
    metrics = RunMetrics(
        duration_s=duration_s,
        deploy_s=lend_host_s + report["deploy_s"],
        teardown_s=report["teardown_s"],
        source_records=source_records,
        sink_records=sink_records,
        tuples_per_s=source_records / duration_s,
        latency_ms={"p50": pct(50), "p95": pct(95), "p99": pct(99)},
        operators=operators,
        dead_letters=sum(task["dead_letter_count"] for task in tasks),  # not just examples
        sink_timeline=dict(sorted(timeline.items())),
        latency_histogram=latency,
        latency_windows=dict(sorted(latency_windows.items())),
        protocol=protocol,
        latency_timeline=[(p["t_s"], p["latency_p50_ms"], p["latency_p99_ms"])
                          for p in report["timeline"]],
        cpu_s=cpu_s,
        cpu_processes=cpu_processes,
        extra={
            "spawn_s": report["spawn_s"],
            "frames_sent": sum(t["frames_sent"] for t in tasks),
            "bytes_sent": sum(t["bytes_sent"] for t in tasks),
            "records_sent": sum(t["records_sent"] for t in tasks),
            "max_inflight_frames": max((t["max_inflight_frames"] for t in tasks), default=0),
            "max_inbox_frames": max((t["max_inbox_frames"] for t in tasks), default=0),
            "workers": plan.workers,
            "tasks": len(plan.tasks),
            "attempts": report["attempts"],
            # per query: when it was available again after the first failure, and its
            # latency relative to before (`bastion.runtime.metrics.QueryAvailability`)
            "queries": {name: dataclasses.asdict(q) for name, q in report["queries"].items()},
            # frames upstream tasks held for pending tasks (and spilled to the store)
            "frames_held": sum(t["frames_held"] for t in tasks),
            "frames_spilled": sum(t["frames_spilled"] for t in tasks),
            # snapshots (full, or incremental bases) encoded in forked children
            "forked_encodes": sum(t["forked_encodes"] for t in tasks),
            "faults_injected": _summed(tasks, "faults_injected"),
            "protocol_counters": _summed(tasks, "protocol_counters"),
            "protocol_latency_ms": _latency_summaries(tasks),
            # tuple-level redundancy: the ratios (redundancy="auto": the manager's
            # last), copies routers made, copies receivers dropped, sends left out at
            # congested instances, and the most tuple ids one receiver remembered
            "redundancy": {"ratios": ({op: report["redundancy_decisions"][-1]["ratio"]
                                       for op in config.redundancy}
                                      if report["redundancy_decisions"]
                                      else dict(config.redundancy)),
                           "copies_sent": sum(t["copies_sent"] for t in tasks),
                           "copies_dropped": sum(t["copies_dropped"] for t in tasks),
                           "sends_skipped": sum(t["sends_skipped"] for t in tasks),
                           "max_remembered_ids": max((t["max_remembered_ids"] for t in tasks),
                                                     default=0),
                           "decisions": report["redundancy_decisions"]},
        },
    )
    warnings = [f"redundancy {ratio:g} for operator {op!r}: a second extra copy needs three "
                f"instances, and it has {plan.topology.nodes[op].parallelism}: its tuples "
                "get one copy at most" for op, ratio in config.redundancy.items()
                if ratio > 1 and plan.topology.nodes[op].parallelism < 3]
    # A resumed job that set part of the earlier job's state aside (a damaged stored
    # EC, a damaged log) ran correctly without it; the user should still hear of it.
    warnings += [f"resuming job {e['job']}: {e['operator']}[{e['instance']}]: "
                 f"{plain(e['reason'])}" for e in report["events"]
                 if e.get("kind") == "resume_set_aside"]
    if report["events_not_stored"] is not None:
        lost = report["events_not_stored"]
        warnings.append(f"{lost['records']} run events of job {config.job_id} could not be "
                        f"stored under {lost['where']} ({lost['error']}): the stored event "
                        "log is incomplete; the result's events are complete")
    return RunResult(config.job_id, outputs, metrics, dead_letters, plan.describe(),
                     {"tasks": tasks, "events": report["events"],
                      "event_counts": report["event_counts"],
                      "timeline": report["timeline"], "started_s": report["started_s"],
                      "workers": report["worker_ids"]},
                     output_ids, warnings, report.get("savepoint") is not None)


class RunHandle:
    """A job `start` runs in the background of this process: its id, a way to stop
    it with a savepoint, and its result."""

    def __init__(self, storage_url: str) -> None:
        self.storage_url = storage_url
        self._job_id: str | None = None
        self._known = threading.Event()   # the job's id is known, or the run ended
        self._ended = threading.Event()
        self._result: RunResult | None = None
        self._error: BaseException | None = None

    @property
    def job_id(self) -> str:
        """The job's id (waits until the job master has started the job)."""
        self._known.wait()
        if self._job_id is None:  # ended before it started: its error says why
            self.result()
            raise RuntimeError("the job ended before it started")
        return self._job_id

    def done(self) -> bool:
        """Has the run ended?"""
        return self._ended.is_set()

    def result(self, timeout_s: float | None = None) -> RunResult:
        """The run's result once it ends (`run`'s, or its error raised here)."""
        if not self._ended.wait(timeout_s):
            raise TimeoutError(f"job {self._job_id} did not end within {timeout_s} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None  # set whenever no error was
        return self._result

    def stop(self, timeout_s: float = 120.0) -> RunResult:
        """Stop the job with a savepoint (`stop`) and return its result, whose
        ``savepoint`` is True: ``bn.run(..., resume_from=handle.job_id)`` resumes it."""
        stop(self.job_id, storage=self.storage_url, timeout_s=timeout_s)
        return self.result(timeout_s)


def start(topology: Topology, protocol: "str | Protocol" = "none", *,
          progress: Callable[[dict[str, Any]], None] | None = None,
          **run_options: Any) -> RunHandle:
    """`run` ``topology`` in a thread of this process, and return at once with a
    `RunHandle`: for a job to stop with a savepoint while it runs (an unbounded one,
    or one to rescale). Takes what `run` takes."""
    handle = RunHandle(Storage.of(run_options.get("storage", "local://.bastion")).url)

    def note(now: dict[str, Any]) -> None:
        if handle._job_id is None:
            handle._job_id = now["job_id"]
            handle._known.set()
        if progress is not None:
            progress(now)

    def body() -> None:
        try:
            handle._result = run(topology, protocol, progress=note, **run_options)
            handle._job_id = handle._result.job_id
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of result()
            handle._error = exc
        finally:
            handle._known.set()
            handle._ended.set()

    threading.Thread(target=body, name="bastion-run", daemon=True).start()
    return handle


def stop(job_id: str, *, storage: Storage | str = "local://.bastion",
         timeout_s: float = 120.0) -> str:
    """Stop the running job ``job_id`` with a savepoint, and return the job id to
    resume it from (``bn.run(..., resume_from=…)``). The request goes through the
    store, so the job may run in another process (`bastion stop JOB --savepoint`).
    Every source stops reading; every record read until then is processed and its
    outputs committed once; every task's state goes into the savepoint with nothing
    in flight (`bastion.runtime.savepoint`). Raises `RuntimeError` saying why if the
    stop did not end in a savepoint (a task failed meanwhile: the job recovered and
    runs on), `TimeoutError` if the job did not stop within ``timeout_s``."""
    store = open_store(Storage.of(storage).url)
    # A job still deploying (its workers starting) may have written nothing yet: the
    # request waits for it; its master acts on it once the job runs.
    if savepoints.read_manifest(store, job_id) is not None:
        return job_id  # stopped already
    store.delete(savepoints.failed_key(job_id))  # of an earlier stop that failed
    savepoints.request_stop(store, job_id)
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        if savepoints.read_manifest(store, job_id) is not None:
            return job_id
        reason = savepoints.failure(store, job_id)
        if reason is not None:
            raise RuntimeError(f"job {job_id} did not stop with a savepoint: {reason}")
        time.sleep(0.1)
    store.delete(savepoints.stop_key(job_id))
    if not store.list(f"jobs/{job_id}/"):
        raise ValueError(f"cannot stop job {job_id!r}: storage {store.url} holds no job "
                         f"{job_id!r}")
    raise TimeoutError(f"job {job_id} did not stop within {timeout_s:g} s: is it running "
                       "(a job that ended has nothing to stop)?")


__all__ = ["RunHandle", "RunResult", "run", "start", "stop"]
