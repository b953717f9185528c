"""The knobs of one job run, shipped to the job master and every worker."""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from typing import Any

from bastion.codecs import Codec

# Records a sink instance stages in memory before it writes them to the store as a
# part of the current commit point (`bastion.runtime.outputs`). At tens of bytes a
# record a part is a few MB: its store write costs little next to its bytes, and a
# sink under protocol ``none`` (one commit point, at the end) holds no more than that.
SINK_SPILL_RECORDS = 50_000

# The data plane's bounds (`bastion.runtime.transport`, docs/security.md). A frame holds
# at most ``frame_records`` records; what a record weighs is the user's business, so
# the largest frame a link accepts is derived from ``frame_records`` at a generous
# ``FRAME_BYTES_PER_RECORD`` (a few times a typical record of tens to hundreds of
# bytes), never below ``MIN_FRAME_BYTES``: 64 MiB at the default 16,384 records. A
# sender refuses to send a larger frame with an error that names the knob, so a job
# with big records fails clearly instead of having its links closed under it.
FRAME_BYTES_PER_RECORD = 4096
MIN_FRAME_BYTES = 16 * 1024 * 1024
# Frames a receiver delivers at once per link before it stops reading from it
# (backpressure): well above what well-behaved senders have in flight
# (``max_inflight_frames`` per channel crossing the link), so a channel blocked by
# barrier alignment never holds up the other channels sharing its link.
LINK_INFLIGHT_FRAMES = 1024


@dataclass
class JobConfig:
    job_id: str
    # A protocol's name, or a `Protocol` object (tests pass deliberately broken ones).
    protocol: Any = "none"
    # Lineage: records carry composite ids (`bastion.runtime.lineage`). Deterministic:
    # multi-input tasks merge their inputs in a fixed order (`bastion.runtime.merge`).
    lineage: bool = False
    deterministic: bool = False
    # Data plane: a frame is sent when it holds frame_records records or its oldest
    # record has waited buffer_timeout_s; at most max_inflight_frames frames per
    # channel are unacknowledged (credits); a task's inbox holds inbox_frames frames.
    # Sources read source_batch_records at a time. Large batches and frames make a
    # keyed exchange cheap per record (W1 at p=2: 0.31-0.32 CPU s per million records
    # at 4096 / 16384, 0.34-0.41 at 1024 / 4096); at a low rate a frame goes out by
    # age long before it is full.
    frame_records: int = 16384
    buffer_timeout_s: float = 0.005
    max_inflight_frames: int = 4
    inbox_frames: int = 16
    source_batch_records: int = 4096
    fail_fast: bool = False
    duration_s: float | None = None
    codecs: tuple[Codec, ...] = field(default_factory=tuple)
    # Fault tolerance: where checkpoints and committed outputs live, how often the
    # protocol checkpoints, when a silent worker counts as dead, how often to restart.
    storage_url: str = "local://.bastion"
    checkpoint_interval_s: float | None = None
    retained_checkpoints: int = 2   # complete checkpoints kept; older ones are deleted
    heartbeat_timeout_s: float = 1.0
    # a task on one frame this long is reported stalled (None: never asked)
    stall_warning_s: float | None = 60.0
    max_restarts: int = 10
    faults: tuple = field(default_factory=tuple)
    progress_interval_s: float = 0.1
    sink_spill_records: int = SINK_SPILL_RECORDS
    # An earlier job (same storage) whose logged state this job starts from, under a
    # protocol that can (`Protocol.resumable`): see `bastion.protocols.cec`.
    resume_from: str | None = None
    # The savepoint (`bastion.runtime.savepoint.Savepoint`) this job resumes: every
    # task starts from its state unless restored from a checkpoint of this job.
    savepoint: Any = None
    # Tuple-level redundancy (`bastion.runtime.redundancy`): operator -> ratio of the
    # tuples into it that get a copy on the next instance; how long a receiving task
    # remembers the ids it has seen, to drop later copies.
    redundancy: dict[str, float] = field(default_factory=dict)
    dedup_window_s: float = 5.0
    # `redundancy="auto"`: the `bastion.scheduler.resiliency.ResiliencyPolicy` the job
    # master's resiliency manager follows (None: the ratios above stay as they are)
    resiliency: Any = None
    # `checkpoint_interval="auto"` with `retune_every_s`: the
    # `bastion.scheduler.retune.RetunePolicy` the job master's re-tuner follows (None:
    # the interval stays as it started)
    retune: Any = None
    # How failures are recovered: the `bastion.scheduler.recovery.RecoveryPolicy`
    # (None: blocking, no capacity model)
    recovery: Any = None
    # Which tasks a failure restarts (`bastion.scheduler.failover`): "local", only
    # what the protocol's recovery needs; "global", every task.
    failover: str = "local"
    # Live metrics for Prometheus through Ray's metrics agent (`bastion.runtime.export`)
    export_metrics: bool = True
    # Data-plane bounds (see ``FRAME_BYTES_PER_RECORD`` above): the largest frame
    # payload a link carries (None: derived from frame_records), and the frames a
    # receiver delivers at once per link.
    max_frame_bytes: int | None = None
    link_inflight_frames: int = LINK_INFLIGHT_FRAMES
    # The job's data-plane key (docs/security.md): made fresh by the job master
    # (`with_frame_key`), it reaches the workers only inside this config, through Ray's
    # authenticated control plane; never printed.
    frame_key: bytes | None = field(default=None, repr=False)
    # Keyed state checkpointed incrementally (`bastion.runtime.incremental`, set by
    # ``state=bn.State(incremental=True)``): deltas on a base, at most ``max_chain``
    # deltas on one base. False: every checkpoint writes each task's whole state.
    incremental_state: bool = False
    max_chain: int = 64
    # A snapshot (full, or an incremental base) of a task whose keyed tables hold at
    # least this many keys is encoded in a forked child, off the task's loop
    # (`bastion.runtime.forked_encode`); None (the default): always on the loop.
    fork_min_keys: int | None = None

    @property
    def frame_bytes_limit(self) -> int:
        """The largest frame payload a link of this job carries, in bytes."""
        if self.max_frame_bytes is not None:
            return self.max_frame_bytes
        return max(MIN_FRAME_BYTES, FRAME_BYTES_PER_RECORD * self.frame_records)

    def __post_init__(self) -> None:
        for name in ("frame_records", "max_inflight_frames", "inbox_frames",
                     "source_batch_records", "retained_checkpoints", "sink_spill_records",
                     "link_inflight_frames", "max_chain"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.fork_min_keys is not None and (not isinstance(self.fork_min_keys, int)
                                               or self.fork_min_keys < 1):
            raise ValueError(f"fork_min_keys must be an int >= 1 or None, got "
                             f"{self.fork_min_keys!r}")
        if self.buffer_timeout_s < 0:
            raise ValueError(f"buffer_timeout_s must be >= 0, got {self.buffer_timeout_s}")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError("interval_s must be > 0 seconds, got "
                             f"{self.checkpoint_interval_s}")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s}")
        if self.stall_warning_s is not None and not self.stall_warning_s > 0:
            raise ValueError(f"stall_warning_s must be > 0 or None, got "
                             f"{self.stall_warning_s!r}")
        if not self.dedup_window_s > 0:
            raise ValueError(f"dedup_window_s must be > 0 seconds, got {self.dedup_window_s!r}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration_s must be > 0 seconds, got {self.duration_s}")
        if self.max_frame_bytes is not None and (
                not isinstance(self.max_frame_bytes, int) or self.max_frame_bytes < 1024):
            raise ValueError(f"max_frame_bytes must be an int >= 1024, got "
                             f"{self.max_frame_bytes!r}")
        if self.frame_key is not None and (not isinstance(self.frame_key, bytes)
                                           or len(self.frame_key) < 16):
            raise ValueError("frame_key must be at least 16 random bytes")


def with_frame_key(config: JobConfig) -> JobConfig:
    """``config`` with a fresh random data-plane key: the job master calls it once per
    job, so a key never outlives its job and the driver never holds one."""
    return dataclasses.replace(config, frame_key=secrets.token_bytes(32))

