"""What a run is configured with: one typed, frozen object per concern, checked where it is made.

`bn.run` and `bn.drill` take the topology, the fault-tolerance protocol and a handful
of options objects instead of three dozen loose keywords. Each object gathers the
knobs of one concern, and each refuses a bad value the moment it is built, with a
message that names the field and its unit — not deep inside a run, seconds later, on
another machine. The model is Flink's ``CheckpointConfig`` and Bytewax's
``RecoveryConfig``: the settings of one mechanism travel together, so a reader sees
at once which mechanism a setting belongs to, and a program can build one object and
reuse it for many runs (a drill's reference and faulty runs, a benchmark's sweep)::

    import bastion as bn

    result = bn.run(topo, bn.protocols.Coordinated(interval_s=0.5),
                    storage="local://.bastion",
                    data_plane=bn.DataPlane(buffer_timeout_ms=1.0),
                    recovery=bn.Recovery(failover="global", max_restarts=3))

The concerns:

- `DataPlane`: how records travel between tasks (frames, credits, batches, buffering,
  operator chaining).
- `Recovery`: what happens when a worker is lost (failure detection, restart scope,
  the recovery policy, how many restarts).
- `Redundancy`: tuple-level redundant copies (`bastion.runtime.redundancy`) and the
  resiliency manager that tunes their ratio.
- `Limits`: bounds on the job master and sinks (commit retries, events kept in
  memory, records a sink holds before spilling, the warm-process pool's idle timeout).
- `Storage`: where checkpoints, committed outputs and events live.
- `State`: how a checkpoint writes keyed state — whole every time, or incrementally
  (the keys changed since the last one, on a base written now and then:
  `bastion.runtime.incremental`).
- `AutoInterval`: a checkpoint interval chosen by the Chiron model for a bound on the
  worst-case total recovery time (`bastion.tuning`), given as a protocol's
  ``interval_s``.

The protocol's own knobs (checkpoint interval, retained checkpoints, acknowledgment
timeout, CEC policy) live on the protocol object, ``bn.protocols.Coordinated(...)``
and its siblings (`bastion.protocols`); a protocol's name is shorthand for its
defaults. A string stays shorthand for `Storage` too (``storage="local://.bastion"``),
and so do a bare ratio for `Redundancy` and a recovery mode or `RecoveryPolicy` for
`Recovery`.

The objects are frozen: `dataclasses.replace` makes a changed copy, checked again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from bastion.protocols.knobs import AutoInterval, positive_seconds
from bastion.protocols.knobs import count as _count
from bastion.protocols.knobs import number as _number
from bastion.runtime.config import SINK_SPILL_RECORDS, JobConfig
from bastion.runtime.events import EventLimits
from bastion.scheduler.failover import check_failover
from bastion.scheduler.recovery import RecoveryPolicy
from bastion.scheduler.resiliency import ResiliencyPolicy

@dataclass(frozen=True)
class DataPlane:
    """How records travel between tasks.

    ``frame_records``: the most records one channel message (a frame) carries;
    ``max_inflight_frames``: the frames a channel may have unacknowledged (its
    credits); ``source_batch_records``: the records a source reads at a time;
    ``buffer_timeout_ms``: the longest a record waits in an output buffer before
    its frame goes out, in milliseconds (0: every record at once); ``chaining``:
    fuse operators of equal parallelism into one task (False: every operator is a
    task of its own)."""

    frame_records: int = JobConfig.frame_records
    max_inflight_frames: int = JobConfig.max_inflight_frames
    source_batch_records: int = JobConfig.source_batch_records
    buffer_timeout_ms: float = 5.0
    chaining: bool = True

    def __post_init__(self) -> None:
        for name in ("frame_records", "max_inflight_frames", "source_batch_records"):
            _count(getattr(self, name), name)
        if not _number(self.buffer_timeout_ms) or self.buffer_timeout_ms < 0:
            raise ValueError(f"buffer_timeout_ms must be a number of milliseconds >= 0, "
                             f"got {self.buffer_timeout_ms!r}")
        if not isinstance(self.chaining, bool):
            raise ValueError(f"chaining must be True or False, got {self.chaining!r}")


@dataclass(frozen=True)
class Recovery:
    """What happens when a worker is lost.

    ``policy``: how failures are recovered (`bastion.scheduler.recovery`) —
    ``"blocking"``, ``"progressive"`` or a `RecoveryPolicy` (None: blocking, no
    capacity model); ``failover``: which tasks a failure restarts — ``"local"``, only
    those the protocol's recovery needs, or ``"global"``, every task;
    ``heartbeat_timeout_s``: how long a worker may stay silent before it counts as
    dead, in seconds; ``stall_warning_s``: how long a task may stay on one frame (a
    user function that does not return) before a ``task_stalled`` event and a
    warning name it, in seconds (`bastion.scheduler.stall`; None: not watched) — the
    job is not stopped; ``max_restarts``: how many times the job is restored before
    it fails."""

    policy: str | RecoveryPolicy | None = None
    failover: str = "local"
    heartbeat_timeout_s: float = 1.0
    stall_warning_s: float | None = JobConfig.stall_warning_s
    max_restarts: int = 10

    def __post_init__(self) -> None:
        if self.policy is not None and not isinstance(self.policy, RecoveryPolicy):
            if self.policy not in ("blocking", "progressive"):
                raise ValueError(f"policy must be 'blocking', 'progressive' or a "
                                 f"RecoveryPolicy, got {self.policy!r}")
        check_failover(self.failover)
        positive_seconds(self.heartbeat_timeout_s, "heartbeat_timeout_s")
        if self.stall_warning_s is not None:
            positive_seconds(self.stall_warning_s, "stall_warning_s")
        _count(self.max_restarts, "max_restarts", minimum=0)

    def recovery_policy(self) -> RecoveryPolicy | None:
        """``policy`` as a `RecoveryPolicy` (None when none was given)."""
        if self.policy is None or isinstance(self.policy, RecoveryPolicy):
            return self.policy
        return RecoveryPolicy(mode=self.policy)


def _ratio(value: Any, name: str) -> None:
    if not _number(value) or not 0.0 <= value <= 2.0:
        raise ValueError(f"{name} must be a ratio from 0.0 to 2.0 (the share of tuples "
                         f"sent to a second instance, above 1 to a third too), got {value!r}")


@dataclass(frozen=True)
class Redundancy:
    """Tuple-level redundancy (`bastion.runtime.redundancy`): a share of the tuples
    into an operator goes to a second instance as well, and the first result of each
    is kept (protocols ``none`` and ``acks``).

    ``ratio``: a number from 0.0 to 2.0 for every operator that can take copies, a
    mapping operator -> ratio, or ``"auto"``: the resiliency manager
    (`bastion.scheduler.resiliency`) moves the ratio to keep the windowed p90
    latency under ``latency_bound_ms`` (milliseconds), or follows a whole
    ``policy`` (`ResiliencyPolicy`); those two only go with ``"auto"``.
    ``dedup_window_s``: how long a receiving task remembers tuple ids to drop later
    copies, in seconds (None: the protocol's default — 5 s, under ``acks`` a third of
    its timeout)."""

    ratio: float | Mapping[str, float] | str = 0.0
    dedup_window_s: float | None = None
    latency_bound_ms: float | None = None
    policy: ResiliencyPolicy | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ratio, str):
            if self.ratio != "auto":
                raise ValueError(f"ratio must be a number, a mapping operator -> number, "
                                 f"or 'auto'; got {self.ratio!r}")
        elif isinstance(self.ratio, Mapping):
            for name, value in self.ratio.items():
                _ratio(value, f"ratio[{name!r}]")
        else:
            _ratio(self.ratio, "ratio")
        if self.dedup_window_s is not None:
            positive_seconds(self.dedup_window_s, "dedup_window_s")
        if self.latency_bound_ms is not None and (not _number(self.latency_bound_ms)
                                                  or not self.latency_bound_ms > 0):
            raise ValueError(f"latency_bound_ms must be a number of milliseconds > 0, "
                             f"got {self.latency_bound_ms!r}")
        if self.policy is not None and not isinstance(self.policy, ResiliencyPolicy):
            raise ValueError(f"policy must be a bn.ResiliencyPolicy, got {self.policy!r}")
        if self.ratio != "auto":
            if self.latency_bound_ms is not None or self.policy is not None:
                raise ValueError("latency_bound_ms and policy set the resiliency manager "
                                 f"of ratio='auto'; this one has ratio={self.ratio!r}")
        elif self.policy is None and self.latency_bound_ms is None:
            raise ValueError("ratio='auto' needs latency_bound_ms (the p90 latency to stay "
                             "under, in milliseconds) or a policy=bn.ResiliencyPolicy(...)")
        elif (self.policy is not None and self.latency_bound_ms is not None
              and self.latency_bound_ms != self.policy.latency_bound_ms):
            raise ValueError(f"latency_bound_ms={self.latency_bound_ms!r} contradicts the "
                             f"policy's latency_bound_ms={self.policy.latency_bound_ms!r}: "
                             "give one")

    def resiliency_policy(self) -> ResiliencyPolicy | None:
        """The policy the resiliency manager follows under ``ratio="auto"``; None for a
        fixed ratio."""
        if self.ratio != "auto":
            return None
        if self.policy is not None:
            return self.policy
        assert self.latency_bound_ms is not None   # checked when the object was made
        return ResiliencyPolicy(latency_bound_ms=self.latency_bound_ms)


@dataclass(frozen=True)
class Limits:
    """Bounds on the job master, the sinks and the cluster's pool of warm processes.

    ``commit_attempts``: how often the job master tries to apply a sink's commit
    before the job fails; ``commit_backoff_s``: the wait after the first failed
    attempt, in seconds, doubled after each; ``events``: how many events and progress
    points the job master keeps in memory and how it stores them (`EventLimits`);
    ``sink_spill_records``: the records a sink instance holds in memory before it
    writes them to the store as part of the coming commit point;
    ``pool_idle_timeout_s``: how long the pool (`bastion.scheduler.pool`) keeps an
    idle process before killing it, in seconds (None: as it is, 60 s by default) — a
    setting of the cluster, shared by every later job on it."""

    commit_attempts: int = 5
    commit_backoff_s: float = 0.1
    events: EventLimits = field(default_factory=EventLimits)
    sink_spill_records: int = SINK_SPILL_RECORDS
    pool_idle_timeout_s: float | None = None

    def __post_init__(self) -> None:
        _count(self.commit_attempts, "commit_attempts")
        if not _number(self.commit_backoff_s) or self.commit_backoff_s < 0:
            raise ValueError(f"commit_backoff_s must be a number of seconds >= 0, got "
                             f"{self.commit_backoff_s!r}")
        if not isinstance(self.events, EventLimits):
            raise ValueError(f"events must be an EventLimits, got {self.events!r}")
        _count(self.sink_spill_records, "sink_spill_records")
        if self.pool_idle_timeout_s is not None:
            positive_seconds(self.pool_idle_timeout_s, "pool_idle_timeout_s")


_SCHEMES = ("local", "s3")


@dataclass(frozen=True)
class Storage:
    """Where checkpoints, committed outputs and run events live: ``local://PATH`` (a
    directory; ``local:///abs/path`` for an absolute one) or
    ``s3://BUCKET/PREFIX?endpoint=HOST:PORT`` (see `bastion.storage.open_store` for
    the parameters). The URL's scheme is checked here; whether the store answers is
    checked when a run opens it. A plain URL string passed as ``storage=`` means the
    same as ``Storage(url)``."""

    url: str = "local://.bastion"

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or "://" not in self.url:
            raise ValueError(f"url must be a storage URL, local://PATH or "
                             f"s3://BUCKET/PREFIX?endpoint=HOST:PORT; got {self.url!r}")
        scheme = self.url.split("://", 1)[0].lower()
        if scheme not in _SCHEMES:
            raise ValueError(f"url {self.url.split('?', 1)[0]!r}: unknown scheme "
                             f"{scheme!r}; use local://PATH or "
                             "s3://BUCKET/PREFIX?endpoint=HOST:PORT")

    @classmethod
    def of(cls, storage: "Storage | str") -> "Storage":
        """``storage`` as a `Storage`: a URL string is shorthand for one."""
        return storage if isinstance(storage, Storage) else cls(storage)


#: ``State(fork_min_keys="auto")``: incremental bases of this many keys or more are
#: encoded in a forked child
INCREMENTAL_FORK_MIN_KEYS = 1_000_000


@dataclass(frozen=True)
class State:
    """How a checkpoint writes the tasks' keyed state (`bastion.runtime.incremental`).

    ``incremental``: False (the default) writes each task's whole state at every
    checkpoint; True writes, for the keyed operators (``reduce``, ``stateful_map``,
    time and count windows, joins), only the keys (windows) changed or removed since
    the task's previous checkpoint — a *delta* — on top of a *base* holding the whole
    state, written again now and then. ``max_chain``: the most deltas on one base, so
    the most blobs a restore reads per task is ``1 + max_chain``; a new base also
    comes once a chain's deltas together weigh more than a twelfth of its base (or
    one would hold an eighth of the keys, a 32nd when bases are forked), so a
    restore takes at most about 1.5 times a full snapshot's. A ``reduce`` or
    ``stateful_map`` whose state grows by new keys writes in its deltas the keys it
    added (taken from its table's end, untracked), not a base at every checkpoint;
    they weigh as a base's keys do. Under protocols
    ``coordinated``, ``uncoordinated`` and ``cic``. Off by default: it pays off for
    large states whose updates touch a small share of their keys
    (`benchmarks/state.py` measures the bytes, durations and restores of both); a
    small state gains nothing from it, and tracking the keys each batch changes
    costs a keyed sum CPU on every record.

    ``fork_min_keys``: a task whose keyed tables hold at least this many keys (a
    fold's keys, a window operator's windows) encodes a full snapshot or a base in a
    forked child process, from a copy-on-write image of its memory, while it goes on
    processing (`bastion.runtime.forked_encode`): encoding costs about 30 ns a key,
    which holds the task half a second at 16 M keys. The child's CPU time counts in the
    job's. None: always on the task's loop, as where ``fork`` is not available.
    ``"auto"`` (the default): incremental bases of `INCREMENTAL_FORK_MIN_KEYS` (1 M)
    keys or more are forked, full snapshots stay on the loop. Forking is a trade: the
    task goes on, but the child shares the cores and a task takes one snapshot at a
    time, so a forked snapshot completes later. Incremental state writes a base rarely
    (a growing state's deltas carry its new keys), so the later completion costs it
    little, and a base on the loop holds the task's loop and every task of its
    worker for half a second at 16 M keys, and every record behind it waits that
    out. A full snapshot is taken at every checkpoint, and there the trade went
    either way between runs and state sizes (a forked one also completes later), so
    it stays on the loop unless asked. `benchmarks/state.py` (b) runs each configuration against
    the job without checkpoints."""

    incremental: bool = False
    max_chain: int = JobConfig.max_chain
    fork_min_keys: int | None | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.incremental, bool):
            raise ValueError(f"incremental must be True or False, got {self.incremental!r}")
        _count(self.max_chain, "max_chain")
        keys = self.fork_min_keys
        if keys is not None and not (keys == "auto" or (
                isinstance(keys, int) and not isinstance(keys, bool) and keys >= 1)):
            raise ValueError(f"fork_min_keys must be an int >= 1, None or 'auto', "
                             f"got {keys!r}")

    @property
    def fork_at_keys(self) -> int | None:
        """``fork_min_keys`` resolved: the least keys a task's tables hold for its
        snapshot to be encoded in a forked child, None for never."""
        if self.fork_min_keys == "auto":
            return INCREMENTAL_FORK_MIN_KEYS if self.incremental else None
        return self.fork_min_keys


__all__ = ["AutoInterval", "DataPlane", "EventLimits", "Limits", "Recovery", "Redundancy",
           "State", "Storage"]
