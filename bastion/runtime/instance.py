"""Tasks and the worker actor that hosts them: the data plane's control loop.

A *task* runs one instance of a chain of operators (see `bastion.runtime.plan`). Its
loop has three phases, repeated until its input ends:

1. **receive** — take the next frame from the task's inbox (or, for a source task,
   poll the source for the next batch);
2. **process** — hand each batch through the chain by plain function calls; feed the
   protocol hook; track the watermark (the minimum over input channels) and, when it
   advances, let windows fire and forward it downstream;
3. **emit** — route output batches to the output channels (forward, rebalance, stable
   key hash, broadcast) and send every frame that is full or older than the buffer
   timeout.

When every input has ended, the task *finishes*: operators flush (open windows fire),
end-of-stream goes out on every channel, the protocol commits the sinks.

A *worker* is one Ray async actor hosting several tasks (slot sharing). All its tasks
share one event loop; a task yields to the loop after each batch, so the others — and
the frames arriving from other workers (`bastion.runtime.transport`) — keep moving.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import sys
import time
import traceback
from functools import partial
from typing import Any, Callable, Coroutine, Sequence, cast

import msgpack
import ray

from bastion._batches import BatchKey, ColumnLengthError
from bastion.errors import PeerLostError, UDFError, UnserialisableError, UnstorableValueError
from bastion.lineage import broadcast_ids, op_codes, record_hashes
from bastion.protocols import get_protocol
from bastion.runtime import allocator, compaction, forked_encode, priority, savepoint
from bastion.runtime.channel import (HeldOutputChannel, InputGate, LocalOutputChannel,
                                     OutputChannel, RemoteOutputChannel,
                                     ReplayableOutputChannel, ReroutableOutputChannel,
                                     first_seq)
from bastion.runtime.columns import partitions
from bastion.runtime.config import JobConfig
from bastion.runtime.durable import DurableCodec
from bastion.runtime.faults import TaskFaults
from bastion.runtime.incremental import BASE, Compacted, StateChain, apply_links
from bastion.runtime.key_groups import instance_of_hash
from bastion.runtime.merge import DeterministicMerge
from bastion.runtime.metrics import LatencyHistogram, OperatorCounts
from bastion.runtime.operators import (OperatorContext, SinkOp, SourceOp, make_operator)
from bastion.runtime.plan import (BROADCAST, FORWARD, HASH, InputChannel, OutputRoute,
                                  PhysicalPlan, TaskPlan)
from bastion.runtime.outputs import (FINAL_COMMIT, committed_blobs, encode_part,
                                     encode_staged, part_key, part_ref, read_staged,
                                     staged_key)
from bastion.runtime.records import (MAX_CODED_DESTINATIONS, Batch, EndOfStream,
                                     FrameCodec, UnstableKeyError, Watermark, stable_hash)
from bastion.runtime.redundancy import FirstCopies, copy_shares
from bastion.runtime.task_context import RuntimeTaskContext
from bastion.runtime.transport import (FrameServer, JobKey, LinkLimits, PeerLinks,
                                       node_address, pusher, tls_from_env)
from bastion.scheduler.failover import FailoverStrategy, failover_strategy
from bastion.sinks import SinkWriter
from bastion.storage import BlobRef, CheckpointStore, ObjectStore, open_store
from bastion.storage.errors import CorruptBlobError

_log = logging.getLogger(__name__)

_STATELESS = ("map", "filter", "flat_map", "union")
_ROUTE_MEMO_KEYS = 65536  # keys whose partition a router remembers before starting over
_SMALL_KEYS = 65536  # int keys below this a router looks up by index, not by hash
_IDLE_SOURCE_SLEEP_S = 0.001
# A busy task loop holds the GIL, and the worker's heartbeat thread needs it to answer.
# An earlier data plane (one Ray call per frame) left that thread waiting up to 2 s
# under CPython's forced switching alone, long enough for the job master to declare a
# live worker dead, so task loops release the GIL on a timer. At CPython's 5-ms switch
# interval forced switching alone answered pings within 35 ms during a busy W1 at p=2
# (a ping every 20 ms), and within 18-30 ms with a release every 50 ms
# (`benchmarks/throughput.py` prints it); workers now switch every
# `_SWITCH_INTERVAL_S`, and the timer stays as a bound. Each release is a syscall that lets other processes onto
# the core: every 5 ms it cost W1 at p=2 2-3% of its CPU seconds.
_GIL_RELEASE_INTERVAL_S = 0.05
# CPython collects its youngest generation every 700 new container objects (tuples,
# lists). A batch of a few thousand records makes that many and keeps them alive until
# its frame leaves, so collections at the default promoted them to older generations
# and full collections walked them (W1 at p=1: 0.26-0.28 CPU s per million records at
# the default, 0.22-0.23 at this threshold). A worker process runs nothing but tasks.
_GC_YOUNG_THRESHOLD = 20_000
# A thread that wants the GIL while a task loop runs gets it after CPython's switch
# interval (5 ms), at each of its steps: a checkpoint's store write in a thread (open,
# write, rename, each a step), Ray's call that triggers a checkpoint, the heartbeat. A
# 6-KB incremental checkpoint of a busy job took 0.05-0.65 s, trigger to stored (4 M
# keys, paced at 1 M records/s); at 0.5 ms, 0.05-0.09 s. A forced switch costs a few
# microseconds, and is asked for only while another thread waits.
_SWITCH_INTERVAL_S = 0.0005
ACKS_CHANNEL = -1  # the channel id of `TaskContext.send_acks` messages on the data plane
_RESET_RECANCEL_S = 0.5  # how long a reset waits for cancelled tasks before cancelling again


def _part_list(memo: dict, keys: Sequence) -> list[int]:
    return list(map(memo.__getitem__, keys))


def apply_key(batch: Batch, key_fn: Any, ctx: OperatorContext) -> Batch:
    """Set ``batch.keys`` to ``key_fn(value)``; a raising key function dead-letters its
    record under the keyed operator's name. A `BatchKey` (``key_by_batch``) keys the
    whole batch in one call."""
    if type(key_fn) is BatchKey:
        try:
            positions, keys = key_fn.keys(batch.values, partial(ctx.dead_letter,
                                                                what="key function"))
        except ColumnLengthError as exc:  # the job's bug: fail it
            raise UDFError(ctx.name, ctx.index, batch.values[0], str(exc)) from None
        if positions is not None:
            batch = batch.take(positions)
        return Batch(keys, batch.values, batch.ts, batch.born, batch.ids)
    try:
        keys = list(map(key_fn, batch.values))
    except Exception:  # noqa: BLE001
        keys, positions = [], []
        for i, v in enumerate(batch.values):
            try:
                keys.append(key_fn(v))
            except Exception as exc:  # noqa: BLE001
                ctx.dead_letter(v, exc, what="key function")
                continue
            positions.append(i)
        batch = batch.take(positions)
    return Batch(keys, batch.values, batch.ts, batch.born, batch.ids)


class Router:
    """Routes a task's output batches on one out-edge to that edge's channels."""

    def __init__(self, route: OutputRoute, channels: list[OutputChannel],
                 key_ctx: OperatorContext, per_record: bool,
                 emitted: Callable[[Batch, int, bool], None],
                 skips_congested: bool = False):
        self.edge = route.edge
        # told every tuple the edge carries (`TaskProtocol.on_emit`): each copy a
        # broadcast makes is a tuple of its own, with an id of its own
        self.emitted = emitted
        self.channels = channels
        self.key_ctx = key_ctx  # the downstream operator: its code and dead letters
        # Deterministic mode deals rebalanced records one by one: whole batches would
        # make where a record goes depend on how the source's reads were cut.
        self.per_record = per_record
        self.next_channel = 0
        self.memo: dict = {}
        # the codes of the int keys 0.._SMALL_KEYS-1 (`columns.partitions`): only a
        # keyed edge into up to 256 instances looks keys up by code
        coded = route.edge.partition == HASH and 1 < len(channels) <= MAX_CODED_DESTINATIONS
        self.small_key_codes = bytearray(b"\xff") * (_SMALL_KEYS if coded else 0)
        self.copies_sent = 0   # redundant copies of tuples (`_route_with_copies`)
        self.copies = route.edge.copies  # the ratio now (`redundancy="auto"` moves it)
        self.skips_congested = skips_congested
        self.sends_skipped = 0  # sends of tuples with copies left out: congested

    def route(self, batch: Batch) -> list[OutputChannel]:
        """Buffer ``batch`` on its channels; return the channels whose frame is full."""
        edge, channels = self.edge, self.channels
        if edge.key_fn is not None:
            batch = apply_key(batch, edge.key_fn, self.key_ctx)
        n = len(channels)
        if edge.partition == BROADCAST and n > 1:
            if batch.ids is None:
                return [c for c in channels if c.add_batch(batch)]
            # every copy is a tuple of its own: the receiving instance tells them apart
            code, full = self.key_ctx.code, []
            for d, channel in enumerate(channels):
                copy = Batch(batch.keys, batch.values, batch.ts, batch.born,
                             broadcast_ids(code, d, batch.ids))
                if self._add(channel, copy):
                    full.append(channel)
            return full
        if n == 1 or edge.partition == FORWARD:
            return [channels[0]] if self._add(channels[0], batch) else []
        if self.copies or edge.by_id:
            return self._route_with_copies(batch)
        if edge.partition != HASH and self.per_record:  # rebalance: record by record
            return self._deal(batch)
        if edge.partition != HASH:  # rebalance: whole batches, round-robin
            channel = channels[self.next_channel]
            self.next_channel = (self.next_channel + 1) % n
            return [channel] if self._add(channel, batch) else []
        return self._split(batch, self._key_parts(batch))

    def _add(self, channel: OutputChannel, batch: Batch, copy: bool = False) -> bool:
        self.emitted(batch, channel.channel_id, copy)
        return channel.add_batch(batch)

    def _split(self, batch: Batch, parts: bytes | list[int], copy: bool = False
               ) -> list[OutputChannel]:
        return [channel for channel, part in zip(self.channels,
                                                 batch.split(parts, len(self.channels)))
                if part is not None and self._add(channel, part, copy)]

    def _key_parts(self, batch: Batch) -> bytes | list[int]:
        """Each record's channel: one byte a record (`columns.partitions`), or a list
        of ints beyond 256 channels."""
        memo, keys, n = self.memo, batch.keys, len(self.channels)
        assert keys is not None  # a hash edge keys its batches (`apply_key`)
        try:
            return self._remembered_parts(keys)
        except KeyError:
            if len(memo) > _ROUTE_MEMO_KEYS:
                memo.clear()
            for i, k in enumerate(keys):
                if k not in memo:
                    memo[k] = instance_of_hash(self._key_hash(k, batch, i), n)
            return self._remembered_parts(keys)

    def _remembered_parts(self, keys: Sequence) -> bytes | list[int]:
        """`_key_parts` from what the router remembers; KeyError for a key it does not."""
        if len(self.channels) <= MAX_CODED_DESTINATIONS:
            return partitions(self.memo, keys, self.small_key_codes)
        return _part_list(self.memo, keys)

    def _key_hash(self, key: Any, batch: Batch, i: int) -> int:
        try:
            return stable_hash(key)
        # a bug of the job, not of one record: fail, fail_fast or not
        except UnstableKeyError as exc:
            ctx = self.key_ctx
            raise UDFError(ctx.name, ctx.index, batch.values[i], str(exc)) from None

    def _route_with_copies(self, batch: Batch) -> list[OutputChannel]:
        """Tuple-level redundancy (`bastion.runtime.redundancy`): the primary instance
        by the key's hash (keyed), the id's (unkeyed, copies made upstream: they must
        meet) or whole batches round-robin (rebalanced), and for a share of the keys or
        tuples a copy on the next instance, and above a ratio of 1.0 a second. Into a
        stateless operator, a tuple with copies skips the instances that cannot take
        a frame now (a stalled one), so long as one of its instances can: waiting for
        the slowest instance would undo what the copies are for."""
        n = len(self.channels)
        edge = self.edge
        if edge.partition == HASH:
            keys = batch.keys
            assert keys is not None  # a hash edge keys its batches (`apply_key`)
            hashes = [self._key_hash(k, batch, i) for i, k in enumerate(keys)]
        else:
            ids = batch.ids
            # copies on an unkeyed edge are told apart by id: lineage is on for them
            assert ids is not None
            hashes = record_hashes(ids)
        ratio = self.copies
        parts: list[int] | None
        if edge.partition == HASH or edge.by_id:
            # a key by its key group's owner; an unkeyed copy by its id
            parts = ([instance_of_hash(h, n) for h in hashes] if edge.partition == HASH
                     else [h % n for h in hashes])
            if not ratio:
                return self._split(batch, parts)
        else:
            # Nothing needs a rebalanced tuple on one instance: the batch goes whole
            # (as without copies), and only its copies are picked out. Cutting it by
            # id instead cost more per batch than the copies themselves.
            primary = self.next_channel
            self.next_channel = (primary + 1) % n
            parts = None
        shares = copy_shares(hashes)
        extras = min(math.ceil(ratio), n - 1)
        congested = ([c.congested() for c in self.channels] if self.skips_congested
                     else [False] * n)
        if not any(congested):
            # the common case, on the hot path: one comprehension per extra copy, no
            # list of instances per record as below
            if parts is None:
                channel = self.channels[primary]
                full = {channel} if self._add(channel, batch) else set()
            else:
                full = set(self._split(batch, parts))
            for extra in range(1, extras + 1):
                bar = ratio - (extra - 1)
                picked = [i for i, u in enumerate(shares) if u < bar]
                if not picked:
                    continue
                self.copies_sent += len(picked)
                copies = batch if len(picked) == len(batch) else batch.take(picked)
                if parts is None:
                    channel = self.channels[(primary + extra) % n]
                    if self._add(channel, copies, True):
                        full.add(channel)
                else:
                    full.update(self._split(copies, [(parts[i] + extra) % n
                                                     for i in picked], True))
            return list(full)
        if parts is None:
            parts = [primary] * len(batch)
        # Each record's instances in order (primary first); those that are congested
        # are left out unless all are, and the first left is its primary now.
        targets = []
        for p, u in zip(parts, shares):
            mine = [p] + [(p + e) % n for e in range(1, extras + 1) if u < ratio - (e - 1)]
            free = [t for t in mine if not congested[t]] or mine[:1]
            self.sends_skipped += len(mine) - len(free)
            targets.append(free)
        full = set(self._split(batch, [t[0] for t in targets]))
        for extra in range(1, extras + 1):
            picked = [i for i, t in enumerate(targets) if len(t) > extra]
            if picked:
                self.copies_sent += len(picked)
                full.update(self._split(batch.take(picked),
                                        [targets[i][extra] for i in picked], True))
        return list(full)

    def _deal(self, batch: Batch) -> list[OutputChannel]:
        """Record ``i`` of the batch goes to channel ``(next_channel + i) % n``."""
        channels, records = self.channels, len(batch)
        n, start = len(channels), self.next_channel
        full = []
        for p, channel in enumerate(channels):
            positions = list(range((p - start) % n, records, n))
            if positions and self._add(channel, batch.take(positions)):
                full.append(channel)
        self.next_channel = (start + records) % n
        return full


class Task:
    """One instance of a chain: its operators, inputs, routes and loop. Its protocol
    sees it only through a `RuntimeTaskContext` (`bastion.runtime.task_context`)."""

    def __init__(self, plan: TaskPlan, physical: PhysicalPlan, config: JobConfig,
                 store: ObjectStore, master: Any, attempt: int, incarnation: int = 0):
        chain = physical.chains[plan.chain_id]
        nodes = physical.topology.nodes
        self.plan = plan
        self.task_id = plan.task_id
        self.index = plan.index
        self.name = f"{chain.name}[{plan.index}]"
        self.config = config
        self.checkpoint_interval_s = config.checkpoint_interval_s
        self.job_id = config.job_id
        self.codec = FrameCodec(config.codecs)
        self.durable = self.state_codec = DurableCodec(config.codecs)  # state, outputs
        self.op_names = chain.ops
        codes = self.op_codes = op_codes(physical.topology)
        self.ops = [make_operator(nodes[name], OperatorContext(
            name, plan.index, plan.parallelism, config.fail_fast, codes[name],
            config.lineage)) for name in chain.ops]
        self.link_keys = chain.link_key_fns
        self.counts = [OperatorCounts() for _ in self.ops]
        self.source: SourceOp | None = self.ops[0] if isinstance(self.ops[0], SourceOp) else None
        self.sinks: list[SinkOp] = [op for op in self.ops if isinstance(op, SinkOp)]
        self._applying = asyncio.Lock()  # one commit applied at a time, in order
        self.parts_written = 0  # numbers this attempt's spilled parts
        self.inputs: dict[int, InputChannel] = {c.channel_id: c for c in plan.inputs}
        self.channel_watermarks = {c.channel_id: -math.inf for c in plan.inputs
                                   if not c.feedback}
        self.open_inputs = {c.channel_id for c in plan.inputs if not c.feedback}
        # A loop head (a task with feedback inputs) keeps consuming its feedback after
        # its other inputs ended, until the job master finds the loop quiescent.
        self.open_feedback = {c.channel_id for c in plan.inputs if c.feedback}
        self.loop_done = False
        # Deterministic mode: inputs are consumed in a fixed order, not as they arrive.
        self.merge: DeterministicMerge | None = (DeterministicMerge(self.open_inputs)
                      if config.deterministic and self.open_inputs else None)
        self.watermark = -math.inf
        self.gate = InputGate(config.inbox_frames)
        self.routers: list[Router] = []
        self.channels: list[OutputChannel] = []
        self.outputs: dict[int, OutputChannel] = {}
        self.store = store
        self.checkpoints = CheckpointStore(store, config.job_id)
        self.master = master
        self.attempt = attempt
        # grows each time a regional restart rebuilds this task within the attempt
        self.incarnation = incarnation
        self.writes: set[asyncio.Future] = set()  # checkpoint uploads still running
        self.held: set[int] = set()         # inputs the protocol holds back
        self.triggers: list[int] = []       # checkpoints a source task is asked to start
        self.triggered_up_to = 0            # the newest of them (`Worker.trigger_checkpoint`)
        self.received_seq: dict[int, int] = {}  # channel -> seq of the last frame processed
        self.acknowledged: list[int] = []   # checkpoints this task stored and reported
        # commit points this task's sinks wrote a blob for: at the end of the job the
        # coordinator commits those even if their checkpoint never completed
        self.staged_commits: list[int] = []
        # Protocol overhead (CheckMate's message overhead): bytes of protocol
        # information inside data frames (barriers, piggybacked clocks) and in the
        # acknowledgments sent to the coordinator.
        self.protocol_frame_bytes = 0
        self.protocol_message_bytes = 0
        self.protocol_latency: dict[str, LatencyHistogram] = {}  # `observe_latencies`
        self.task_count = len(physical.tasks)
        self.channel_destinations: list[int] = []  # task id at the end of each channel
        self.stop_requested = False
        # The job stops with a savepoint (`bastion.runtime.savepoint`): set on a source
        # by the stop, on any other task by an input's ``EndOfStream(savepoint=True)``.
        # The task then keeps its state for a later job instead of ending its input.
        self.savepoint_stop = False
        self.savepoint_entries: list[dict[str, Any]] = []  # the state it stored then
        self.finished = False
        self.started_s: float | None = None
        self.finished_s: float | None = None
        # CPU seconds of this task's whole process (all its threads) when the task
        # started and finished: the launcher takes, per process, the span from its
        # first task's start to its last task's end, so a process counts once.
        self.started_cpu_s: float | None = None
        # snapshots encoded in forked children, and the children's CPU seconds
        self.forked_encodes = 0
        self.forked_cpu_s = 0.0
        self.finished_cpu_s: float | None = None
        self.gil_released_s = time.monotonic()
        self.restored_progress = (0, 0)  # records read and written before a restore
        # incremental keyed state (`bastion.runtime.incremental`): made at the first
        # checkpoint, or by a restore from the restored checkpoint's chain
        self.state_chain: StateChain | None = None
        self.compaction: asyncio.Future | None = None  # a chain being compacted
        self.compactions = 0  # bases made off the loop that landed
        self.physical = physical
        # (source code, instance) -> the task that runs it, for tuple tracking
        self.source_tasks = {(codes[physical.chains[t.chain_id].ops[0]], t.index): t.task_id
                             for t in physical.tasks
                             if nodes[physical.chains[t.chain_id].ops[0]].kind == "source"}
        # how `send_acks` reaches a task: set by the worker that hosts this one
        self.ack_router: Any = None
        # what the protocol sees of this task: narrow views, never the task itself
        self.context = RuntimeTaskContext(self)
        self.protocol = get_protocol(config.protocol).task_protocol(self.context)
        # stalls, lost frames and link outages this task carries out (None: none)
        self.faults = TaskFaults.for_task(config.faults, chain.ops, plan.index)
        if self.faults is not None:
            self.faults.replays_lost = get_protocol(config.protocol).acknowledges_tuples
        # Inputs from a chain that receives redundant copies: both copies of one result
        # come here, and only the first is processed (`bastion.runtime.redundancy`).
        copied = config.redundancy
        self.copied_inputs = {
            c.channel_id for c in plan.inputs
            if copied.keys() & set(physical.chains[physical.tasks[c.src_task].chain_id].ops)}
        self.first_copies = FirstCopies(config.dedup_window_s) if self.copied_inputs else None
        # The latency of the copies this task drops as late: what the tuples would
        # have taken without their first copy. The resiliency manager reads it to
        # tell a calm period from faults the copies are hiding.
        self.late_copies = LatencyHistogram()
        # when this task took the frame it is processing (None: between frames): a
        # stall shows in progress as its age, before any of its tuples come out late
        self.frame_began_s: float | None = None

    # -- wiring ------------------------------------------------------------------------

    def connect(self, route: OutputRoute, channels: list[OutputChannel]) -> None:
        key_ctx = OperatorContext(route.edge.dst_op, self.index, self.plan.parallelism,
                                  self.config.fail_fast,
                                  self.op_codes[route.edge.dst_op])
        # a tuple with copies into a stateless operator may skip a congested instance:
        # no state there misses it
        stateless = self.physical.topology.nodes[route.edge.dst_op].kind in _STATELESS
        self.routers.append(Router(route, channels, key_ctx, self.config.deterministic,
                                   self.protocol.on_emit, skips_congested=stateless))
        copied = stateless and route.edge.dst_op in self.config.redundancy
        for channel in channels:
            channel.faults = self.faults
            channel.defers_when_congested = copied
        self.channels.extend(channels)
        self.outputs.update((c.channel_id, c) for c in channels)
        self.channel_destinations.extend(route.dst_tasks)

    @property
    def dead_letters(self) -> list:
        letters = [d for op in self.ops for d in op.ctx.dead_letters]
        letters += [d for r in self.routers for d in r.key_ctx.dead_letters]
        return letters

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        self.started_s = time.time()
        self.started_cpu_s = time.process_time()
        try:
            await self.protocol.on_start()
            if self.source is not None:
                await self._run_source()
            elif self.merge is not None:
                await self._run_merged()
            else:
                await self._run_inputs()
            await self._finish()
        except (UDFError, PeerLostError, ray.exceptions.RayError):
            # a user error (a function's, or a value no codec stores), or a peer worker
            # that died: the job master decides; a user error's message is all it shows
            raise
        except UnserialisableError as exc:
            # what the chain sends downstream (its last operator's output) has a type
            # no codec encodes: as much a user error as a state that cannot be stored
            raise UnstorableValueError(self.ops[-1].ctx.name, self.index, exc.type_name,
                                       "its output records cannot be sent",
                                       str(exc)) from None
        except Exception as exc:
            raise RuntimeError(f"task {self.name} failed: {exc!r}\n"
                               f"{traceback.format_exc()}") from exc
        finally:
            self.protocol.on_stop()
        self.finished_s = time.time()
        self.finished_cpu_s = time.process_time()
        self.finished = True

    async def _run_source(self) -> None:
        source, batch_records = self.source, self.config.source_batch_records
        assert source is not None  # `run` calls this for a source task only
        counts = self.counts[0]
        protocol = self.protocol
        reads_store = source.reader.reads_store
        while not self.stop_requested:
            while self.triggers:
                await protocol.on_trigger(self.triggers.pop(0))
            room = protocol.source_room()
            if room <= 0:  # its protocol holds it back
                await self._flush_aged()  # what it holds back may wait in a buffer
                await protocol.between_frames()
                await asyncio.sleep(_IDLE_SOURCE_SLEEP_S)
                continue
            # a count of records: the protocol's room is a count or math.inf
            max_records = int(min(batch_records, room))
            # a source's "frame" is the batch it reads, its function's calls included
            self.frame_began_s = time.time()
            if reads_store:                                                 # receive
                batch = await asyncio.to_thread(source.poll, max_records, time.time())
            else:
                batch = source.poll(max_records, time.time())
            if batch is None:
                self.frame_began_s = None
                break
            if len(batch):
                counts.records_out += len(batch)
                protocol.on_source_batch(batch)
                if self.faults is not None:
                    await self._stall(0, counts.records_out)
                await self._process(batch, 1, 0, keyed=False)      # process + emit
            self.frame_began_s = None
            if source.watermark > self.watermark:
                await self._advance_watermark(source.watermark, 1)
            await self._flush_aged()
            await self.protocol.between_frames()
            if len(batch):
                await self._pause()
            else:
                await asyncio.sleep(_IDLE_SOURCE_SLEEP_S)
        await protocol.before_source_end()

    async def _run_inputs(self) -> None:
        gate, inputs, decode = self.gate, self.inputs, self.codec.decode
        timeout_s = self.config.buffer_timeout_s
        while self.open_inputs or (self.open_feedback and not self.loop_done):
            pending = any(c.has_pending() for c in self.channels)
            received = await gate.next_frame(timeout_s if pending else None)  # receive
            if received is None:  # buffered output has aged meanwhile
                await self._flush_aged()
                await self.protocol.between_frames()
                continue
            channel_id, seq, frame = received
            if channel_id is None:  # the job master found the loop quiescent
                self.loop_done = True
                continue
            if type(frame) is bytes:  # else it came unencoded from this worker
                frame = decode(frame)
            await self.protocol.on_frame(channel_id, seq, frame)
            self.frame_began_s = time.time()
            await self.process_frame(inputs[channel_id], frame)      # process
            self.frame_began_s = None
            self.received_seq[channel_id] = seq
            await self._flush_aged()                                # emit
            await self.protocol.between_frames()
            await self._pause()

    async def _run_merged(self) -> None:
        """The loop in deterministic mode: process what the merge says comes next;
        receive only while the channel whose turn it is has nothing queued."""
        merge, gate, inputs, decode = self.merge, self.gate, self.inputs, self.codec.decode
        assert merge is not None  # `run` calls this in deterministic mode only
        timeout_s = self.config.buffer_timeout_s
        while self.open_inputs:
            step = merge.next()
            if step is None:                                        # receive
                pending = any(c.has_pending() for c in self.channels)
                received = await gate.next_frame(timeout_s if pending else None)
                if received is None:
                    await self._flush_aged()
                    await self.protocol.between_frames()
                    continue
                channel_id, seq, frame = received
                await self._admit(inputs[channel_id], seq,
                                  decode(frame) if type(frame) is bytes else frame)
                continue
            channel_id, element = step
            channel = inputs[channel_id]
            kind = type(element)
            if kind is Batch:                                       # process
                batch = self.protocol.on_batch(channel_id, element)
                if batch is not None and len(batch):
                    self.frame_began_s = time.time()
                    await self._process(batch, 0, channel.input_index, keyed=True)
                    self.frame_began_s = None
            elif kind is Watermark:
                await self._on_watermark(channel_id, element.time)
            else:
                await self._end_input(channel, element.savepoint)
            await self._flush_aged()                                # emit
            await self.protocol.between_frames()
            await self._pause()

    async def _admit(self, channel: InputChannel, seq: int, elements: list) -> None:
        """A frame enters the merge's queues: it is now received. Protocol control
        records act on arrival (an unaligned barrier snapshots here)."""
        channel_id = channel.channel_id
        merge = self.merge
        assert merge is not None  # frames are admitted to the merge in deterministic mode
        await self.protocol.on_frame(channel_id, seq, elements)
        for element in elements:
            if type(element) in (Batch, Watermark, EndOfStream):
                merge.push(channel_id, element)
            else:
                await self.protocol.on_control(channel_id, element)
        self.received_seq[channel_id] = seq

    async def _end_input(self, channel: InputChannel, savepoint_stop: bool) -> None:
        channel_id = channel.channel_id
        if savepoint_stop:
            self.savepoint_stop = True
        self.open_inputs.discard(channel_id)
        self.open_feedback.discard(channel_id)
        if self.open_inputs:
            await self._on_watermark(channel_id, math.inf)
        await self.protocol.on_input_ended(channel_id)

    async def _pause(self) -> None:
        """Let the worker's other tasks run, and now and then its other threads."""
        now_s = time.monotonic()
        if now_s - self.gil_released_s >= _GIL_RELEASE_INTERVAL_S:
            time.sleep(0)  # releases the GIL: the heartbeat thread answers
            self.gil_released_s = now_s
        await asyncio.sleep(0)

    async def process_frame(self, channel: InputChannel, elements: list) -> None:
        channel_id = channel.channel_id
        for i, element in enumerate(elements):
            if channel_id in self.held:  # e.g. a barrier: the protocol keeps the rest
                self.protocol.stash(channel_id, elements[i:])
                return
            kind = type(element)
            if kind is Batch:
                batch = self.protocol.on_batch(channel_id, element)
                if batch is not None and channel_id in self.copied_inputs:
                    # made whenever some input is copied, as this one is
                    assert self.first_copies is not None
                    keep = self.first_copies.keep(batch.ids)
                    if keep is not None:
                        kept = set(keep)
                        born = batch.born
                        self.late_copies.add_batch(
                            [born[i] for i in range(len(born)) if i not in kept],
                            time.time())
                        batch = batch.take(keep)
                if batch is not None and len(batch):
                    # Freed once processed, while its items are still in the cache: held
                    # with the rest of the frame until the next frame arrived, every item
                    # of a 16k-record frame was freed after it had left the cache (W1 at
                    # p=2: 3-4% of its CPU seconds). Nobody reads a frame once processed.
                    elements[i] = element = None
                    await self._process(batch, 0, channel.input_index, keyed=True)
                    batch = None
            elif kind is Watermark:
                await self._on_watermark(channel_id, element.time)
            elif kind is EndOfStream:
                await self._end_input(channel, element.savepoint)
            else:
                await self.protocol.on_control(channel_id, element)

    async def _finish(self) -> None:
        if self.savepoint_stop:
            # Stopped, not ended: nothing fires for the end of input (open windows
            # stay open); the state goes to the savepoint for a later job.
            self.savepoint_entries = await self._store_savepoint()
        else:
            for j, op in enumerate(self.ops):
                out = op.on_end()
                if out is not None and len(out):
                    self.counts[j].records_out += len(out)
                    await self._process(out, j + 1, 0, keyed=False)
        await self.stage_outputs(FINAL_COMMIT)
        for channel in self.channels:
            channel.add_control(EndOfStream(self.savepoint_stop))
            await channel.flush()
        for channel in self.channels:
            await channel.drain()
        await self.protocol.on_finished()

    # -- processing ----------------------------------------------------------------------

    async def _process(self, batch: Batch, start: int, input_index: int, keyed: bool) -> None:
        """Run ``batch`` through ops[start:] and emit the result. ``keyed`` says the
        batch's keys are already set for ops[start] (it came through a channel)."""
        ops, counts, link_keys = self.ops, self.counts, self.link_keys
        for j in range(start, len(ops)):
            if not keyed and link_keys[j] is not None:
                batch = apply_key(batch, link_keys[j], ops[j].ctx)
            keyed = False
            c = counts[j]
            c.records_in += len(batch)
            processed = ops[j].process(batch, input_index if j == start else 0)
            if self.faults is not None:
                await self._stall(j, c.records_in)
            if processed is None or not len(processed):
                if self.sinks:  # a sink ends the chain: it may have staged enough
                    await self._spill_full_sinks()
                return
            batch = processed
            c.records_out += len(batch)
        await self._emit(batch)

    async def _stall(self, position: int, records_done: int) -> None:
        """An injected computational fault of the chain's operator at ``position``."""
        faults = self.faults
        assert faults is not None  # called only when the task has faults injected
        stalls = faults.execute.get(position)
        if stalls:
            stall_s = faults.stall_s(stalls, records_done)
            if stall_s > 0:
                await asyncio.sleep(stall_s)

    async def _emit(self, batch: Batch) -> None:
        for router in self.routers:
            for channel in router.route(batch):
                await channel.flush()

    async def _on_watermark(self, channel_id: int, time_s: float) -> None:
        if channel_id not in self.channel_watermarks:
            return
        self.channel_watermarks[channel_id] = time_s
        low = min(self.channel_watermarks.values())
        if low > self.watermark:
            await self._advance_watermark(low, 0)

    async def _advance_watermark(self, watermark: float, start: int) -> None:
        self.watermark = watermark
        for j in range(start, len(self.ops)):
            out = self.ops[j].on_watermark(watermark)
            if out is not None and len(out):
                self.counts[j].records_out += len(out)
                await self._process(out, j + 1, 0, keyed=False)
        if watermark < math.inf:
            mark = Watermark(watermark)
            for channel in self.channels:
                channel.add_control(mark)

    async def _flush_aged(self) -> None:
        now_s = time.monotonic()
        for channel in self.channels:
            if channel.aged(now_s):
                await channel.flush()

    # -- savepoints (`bastion.runtime.savepoint`) ------------------------------------------

    async def _store_savepoint(self) -> list[dict[str, Any]]:
        """Store the state of each operator of the chain that holds any (a source's
        position goes in the task's report: the job master stores every source's,
        those that ended before the stop included)."""
        entries = []
        for op in self.ops:
            if isinstance(op, (SourceOp, SinkOp)):
                continue
            state = op.snapshot()
            if state is None:
                continue
            blob = self._encode_operator_state(op, state)
            entries.append(await asyncio.to_thread(savepoint.write_state, self.store,
                                                   self.job_id, op.ctx.name, self.index,
                                                   blob))
        return entries

    def _encode_operator_state(self, op: Any, state: Any) -> bytes:
        try:
            return self.durable.encode(state)
        except UnserialisableError as exc:
            raise UnstorableValueError(op.ctx.name, self.index, exc.type_name,
                                       "its state cannot be stored", str(exc)) from None

    async def load_savepoint(self, manifest: savepoint.Savepoint) -> None:
        """Start from ``manifest``'s state: each operator from its own instance's
        blob, a keyed operator whose parallelism changed from the old instances that
        share its key groups, keeping its keys (`Operator.restore_keys`)."""
        for op in self.ops:
            if isinstance(op, SinkOp):
                continue
            blobs, owns = savepoint.blobs_for(manifest, op.ctx.name, self.index,
                                              self.plan.parallelism, op.keyed)
            if not blobs:
                continue
            states = [self.durable.decode(await self.store.aget(blob["key"]), blob["key"])
                      for blob in blobs]
            if owns is None:
                op.restore(states[0])
            else:
                op.restore_keys(states, owns)

    # -- checkpoints (the mechanics; protocols decide when) ---------------------------------

    def snapshot(self) -> bytes:
        """Every operator's state and record counters, encoded now (a durable blob:
        exact Python types, checksummed), with the task's own position: watermarks,
        round-robin cursors and, in deterministic mode, the merge with the input it
        holds. The counters travel with the state so that after a recovery they
        describe the history the outputs come from, as in a failure-free run."""
        return self._encode_snapshot([op.snapshot() for op in self.ops])

    def _encode_snapshot(self, operators: list[Any], link: Any = None) -> bytes:
        """`snapshot` with the operators' states given; ``link``: an incremental
        chain's link (`bastion.runtime.incremental.Link`) holding the keyed ones."""
        state: dict[str, Any] = {
            "operators": operators,
            "counts": [[c.records_in, c.records_out] for c in self.counts],
            "routers": [r.next_channel for r in self.routers],
            "watermarks": [self.watermark, self.channel_watermarks]}
        if self.merge is not None:
            state["merge"] = self.merge.snapshot(self.codec)
        if link is not None:
            state["operators"] = None
            state["link"] = link.value
            operators = link.value["operators"]
        try:
            return self.durable.encode(state)
        except UnserialisableError:
            # The user's state holds a value no codec stores (a lock, an object of a
            # class without a codec): a user error naming the operator and the type,
            # which ends the job — a restart would only meet it again.
            for op, op_state in zip(self.ops, operators):
                try:
                    self.durable.encode(op_state)
                except UnserialisableError as exc:
                    raise UnstorableValueError(op.ctx.name, self.index, exc.type_name,
                                               "its state cannot be stored",
                                               str(exc)) from None
            raise

    def restore(self, data: bytes, key: str) -> None:
        """Restore a snapshot read from ``key``; `CorruptBlobError` if it fails its
        checksum (then nothing is restored)."""
        snapshot = self.durable.decode(data, key)
        for op, state in zip(self.ops, snapshot["operators"]):
            op.restore(state)
        self._restore_task_state(snapshot)

    def restore_chain(self, blobs: list[bytes], refs: list[BlobRef]) -> None:
        """Restore an incremental chain (base first; ``refs``: where its links are
        stored), every link decoded and the chain checked before any state changes:
        `CorruptBlobError` naming the newest link's key if one fails. The task's next
        link builds on this chain (`bastion.runtime.incremental`)."""
        key = refs[-1].key
        snapshots = [self.durable.decode(data, key) for data in blobs]
        keyed = [op.tables() is not None for op in self.ops]
        try:
            states = apply_links([snapshot.get("link") for snapshot in snapshots], keyed)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptBlobError(f"the state chain of {key!r} does not restore: {exc}",
                                   key=key) from None
        for op, is_keyed, state in zip(self.ops, keyed, states):
            if is_keyed:
                op.load_tables(state)
            else:
                op.restore(state)
        self.state_chain = StateChain(self.ops, self.config.max_chain, refs,
                                      snapshots[-1]["link"]["position"],
                                      bases_forked=self._snapshots_fork)
        self._restore_task_state(snapshots[-1])

    def _restore_task_state(self, snapshot: dict) -> None:
        for counts, (records_in, records_out) in zip(self.counts, snapshot["counts"]):
            counts.records_in, counts.records_out = records_in, records_out
        for router, next_channel in zip(self.routers, snapshot["routers"]):
            router.next_channel = next_channel
        self.watermark, self.channel_watermarks = snapshot["watermarks"]
        if self.merge is not None:
            self.merge.restore(snapshot["merge"], self.codec)
            self.open_inputs = set(self.merge.active)
        self.restored_progress = self._records_read_and_written()

    async def store_state(self, checkpoint_id: int, state: bytes | memoryview) -> BlobRef:
        return await asyncio.to_thread(self.checkpoints.put_state, checkpoint_id,
                                       self.op_names[0], self.index, state)

    async def stage_outputs(self, commit: int) -> None:
        """Pre-commit: store what each sink staged since the last commit point. Stored
        even when empty: an attempt that failed after its sinks finished may have
        left a blob under the same end-of-stream key, which must not be read."""
        for sink in self.sinks:
            key = staged_key(self.config.job_id, sink.ctx.name, self.index, commit)
            await self.store.aput(key, self._encode_staged(sink, *sink.take_staged(),
                                                           sink.take_parts()))

    def _encode_staged(self, sink: SinkOp, values: list, ids: list | None,
                       parts: list | None = None) -> bytes:
        """A commit point's blob (``parts`` given) or a part, for ``sink``; a value no
        codec covers fails naming the sink."""
        try:
            if parts is None:
                return encode_part(self.durable, values, ids)
            return encode_staged(self.durable, values, ids, parts)
        except UnserialisableError as exc:
            raise UnstorableValueError(sink.ctx.name, self.index, exc.type_name,
                                       "its records cannot be stored", str(exc),
                                       kind="sink") from None

    async def _spill_full_sinks(self) -> None:
        """Write what a sink staged as a part of the current commit point once it
        holds ``sink_spill_records`` records, so that staging stays bounded."""
        for sink in self.sinks:
            if sink.staged_records >= self.config.sink_spill_records:
                values, ids = sink.take_staged()
                key = part_key(self.config.job_id, sink.ctx.name, self.index, self.attempt,
                               self.parts_written, self.incarnation)
                self.parts_written += 1
                blob = self._encode_staged(sink, values, ids)
                await self.store.aput(key, blob)
                # Listed only once stored: a checkpoint taken from now on includes it.
                sink.add_part(part_ref(key, blob))

    def checkpoint(self, checkpoint_id: int) -> Coroutine[Any, Any, BlobRef]:
        """Snapshot now; the returned awaitable stores the snapshot and this task's
        staged sink outputs, and yields the state blob to acknowledge (with
        incremental state, a `ChainRef`: this checkpoint's link and the ones before)."""
        if self.config.incremental_state:
            return self._checkpoint_link(checkpoint_id)
        forked = self._encode_in_child(self.snapshot)
        state = self.snapshot() if forked is None else b""
        staged = self._take_staged()

        async def store() -> BlobRef:
            await self._store_staged(staged, checkpoint_id)
            blob = state if forked is None else await self._forked_blob(forked)
            return await self.store_state(checkpoint_id, blob)

        return self._tracked_upload(store)

    def _checkpoint_link(self, checkpoint_id: int) -> Coroutine[Any, Any, BlobRef]:
        """`checkpoint` with incremental state: the next link of the task's chain,
        encoded now; it becomes the parent of later links once it is stored."""
        if self.state_chain is None:  # the first checkpoint, or the first since a restore
            self.state_chain = StateChain(self.ops, self.config.max_chain,
                                          bases_forked=self._snapshots_fork)
        chain = self.state_chain
        link = chain.link([None if keyed else op.snapshot()
                           for op, keyed in zip(self.ops, chain.keyed)])
        # a delta costs what changed; a base, the whole state: in a child if large
        forked = (self._encode_in_child(partial(self._encode_snapshot, [], link))
                  if link.kind == BASE else None)
        state = self._encode_snapshot([], link) if forked is None else b""
        staged = self._take_staged()

        async def store() -> BlobRef:
            await self._store_staged(staged, checkpoint_id)
            blob = state if forked is None else await self._forked_blob(forked)
            ref = await asyncio.to_thread(
                self.checkpoints.put_chain, checkpoint_id, self.op_names[0], self.index,
                blob, link.parent, None if link.compacted is None else link.compacted.data)
            if self.state_chain is chain:  # not restored meanwhile
                chain.stored(link, ref)
                self._compact_if_due(chain)
            return ref

        return self._tracked_upload(store)

    def _encode_in_child(self, encode: Callable[[], bytes]
                         ) -> forked_encode.ForkedEncode | None:
        """A snapshot of ``State.fork_min_keys`` keys or more, encoded by ``encode``
        in a forked child off the loop (`bastion.runtime.forked_encode`); None: the
        caller encodes it now (a smaller state, or no ``fork`` here)."""
        if not self._snapshots_fork():
            return None
        return forked_encode.start(encode, f"task {self.name}")

    def _snapshots_fork(self) -> bool:
        """Whether a snapshot taken now would be encoded in a forked child: the
        tables hold ``State.fork_min_keys`` keys or more, and ``fork`` is here."""
        limit = self.config.fork_min_keys
        if limit is None or not forked_encode.available():
            return False
        keys = sum(len(table) for op in self.ops if (tables := op.tables()) is not None
                   for table in tables)
        return keys >= limit

    async def _forked_blob(self, forked: forked_encode.ForkedEncode) -> memoryview:
        try:
            return await forked.result()
        finally:
            self.forked_encodes += 1
            self.forked_cpu_s += forked.cpu_s

    def _compact_if_due(self, chain: StateChain) -> None:
        """Have the chain merged into a new base in another process when it is
        half-way to forcing one (`bastion.runtime.compaction`) and the task would
        write that base on its loop; the base lands in the chain for its next link
        to carry."""
        refs = chain.compaction_wanted()
        if refs is None:
            return

        async def run() -> None:
            compacted = None
            try:
                data = await compaction.compact(self.config.storage_url,
                                                self.config.codecs, refs, chain.keyed)
                compacted = Compacted(refs, data)
                self.compactions += 1
            except Exception as exc:  # noqa: BLE001 - the task writes a base itself
                # A chain outgrown meanwhile (a base written, or a restore) no longer
                # needs the compaction, and GC may have deleted the links it read.
                current = self.state_chain is chain and chain.builds_on(refs)
                log = _log.warning if current else _log.debug
                log("%s: compacting its state chain failed (%s: %s); it will write a "
                    "base itself if the chain gets too long", self.name,
                    type(exc).__name__, exc)
            chain.compaction_landed(compacted)

        # kept referenced until it ends; a reset does not wait for it (its base would
        # land in a chain no one builds on any more)
        self.compaction = asyncio.ensure_future(run())

    def _tracked_upload(self, store: Callable[[], Coroutine[Any, Any, BlobRef]]
                        ) -> Coroutine[Any, Any, BlobRef]:

        async def upload() -> BlobRef:
            # Shielded, and tracked: a task reset on its own (a regional restart)
            # waits for its uploads before its next incarnation writes the same keys.
            storing = asyncio.ensure_future(store())
            self.writes.add(storing)
            storing.add_done_callback(_retrieved)
            storing.add_done_callback(self.writes.discard)
            return await asyncio.shield(storing)

        return upload()

    def _take_staged(self) -> list[tuple[SinkOp, list, list | None, list]]:
        return [(sink, *sink.take_staged(), sink.take_parts()) for sink in self.sinks]

    async def _store_staged(self, staged: list[tuple[SinkOp, list, list | None, list]],
                            commit: int) -> bool:
        """Store each sink's staged outputs that hold anything as commit point
        ``commit``; whether any did."""
        stored = False
        for sink, values, ids, parts in staged:
            # A task rebuilt by a regional restart takes again the checkpoint that was
            # in progress, under the same id: its empty blob must replace the one its
            # earlier incarnation may have stored, or that one would be committed.
            if values or parts or self.incarnation:
                key = staged_key(self.config.job_id, sink.ctx.name, self.index, commit)
                await self.store.aput(key, self._encode_staged(sink, values, ids, parts))
                self.staged_commits.append(commit)
                stored = True
        return stored

    async def stage_sink_outputs(self, commit: int) -> bool:
        """Store what the sinks staged since their last commit point as ``commit``."""
        return await self._store_staged(self._take_staged(), commit)

    # -- what the protocol's views (`bastion.runtime.task_context`) run --------------------

    async def emit_after(self, name: str, batch: Batch, counted: bool = True) -> None:
        """Send ``batch`` on from operator ``name`` as if it had just produced it
        (``counted``: as its output; a source's replay is not read again)."""
        j = self.op_names.index(name)
        if counted:
            self.counts[j].records_out += len(batch)
        await self._process(batch, j + 1, 0, keyed=False)

    async def restore_from(self, checkpoint_id: int) -> None:
        if self.config.incremental_state:
            blobs, refs = await asyncio.to_thread(self.checkpoints.load_chain,
                                                  checkpoint_id, self.op_names[0],
                                                  self.index)
            # a link that fails to decode names the checkpoint's own blob: the
            # failure gives up this checkpoint, whichever older one stored the link
            self.restore_chain(blobs, refs)
            await self.reapply_commits()
            return
        data = await asyncio.to_thread(self.checkpoints.load, checkpoint_id,
                                       self.op_names[0], self.index)
        self.restore(data, f"checkpoint {checkpoint_id}, state of {self.name}")
        await self.reapply_commits()

    async def reapply_commits(self, only: int | None = None) -> None:
        """Sinks with an outside effect apply committed outputs they may have missed
        (each writer skips what it already applied); ``only``: just that commit.
        Applied in a thread, one at a time: a writer stores what it applies (a Log
        sink's records), and the store may take seconds, which the loop running the
        worker's tasks and the job's progress polls must not wait for."""
        async with self._applying:
            for sink in self.sinks:
                if type(sink.writer).apply is SinkWriter.apply:
                    continue
                if only is not None:
                    key = staged_key(self.config.job_id, sink.ctx.name, self.index, only)
                    if await self.store.aexists(key):
                        await asyncio.to_thread(sink.writer.apply, only,
                                                (await self.read_staged_blob(key))[0])
                    continue
                blobs = await asyncio.to_thread(committed_blobs, self.store,
                                                self.config.job_id, sink.ctx.name, self.index)
                for _, commit, key in blobs:
                    await asyncio.to_thread(sink.writer.apply, commit,
                                            (await self.read_staged_blob(key))[0])

    async def read_staged_blob(self, key: str) -> tuple[list, list | None]:
        return await asyncio.to_thread(read_staged, self.store, self.durable, key)

    # -- reporting -----------------------------------------------------------------------

    def quiescence(self) -> dict[str, Any]:
        """What loop termination needs: does this task hold nothing (no queued frame,
        no buffered output), is it a loop head whose ordinary inputs all ended, and how
        many frames went each way on its channels."""
        return {
            "idle": (self.gate.inbox.empty()
                     and not any(c.has_pending() for c in self.channels)),
            "sent": {c.channel_id: c.seq for c in self.channels},
            "processed": {cid: seq + 1 for cid, seq in self.received_seq.items()},
            "loop_head": (bool(self.open_feedback) and not self.loop_done
                          and not self.open_inputs),
        }

    def finish_loop(self) -> None:
        self.gate.inbox.put_nowait((None, -1, None))

    def _records_read_and_written(self) -> tuple[int, int]:
        return (self.counts[0].records_out if self.source else 0,
                sum(self.counts[j].records_in for j, op in enumerate(self.ops)
                    if isinstance(op, SinkOp)))

    def sink_records_received(self) -> int | None:
        """Records this task's sinks received in this attempt (as `progress` counts
        them); None for a task without sinks."""
        if not self.sinks:
            return None
        return self._records_read_and_written()[1] - self.restored_progress[1]

    def progress(self) -> dict[str, Any]:
        """Counters of this attempt (not those restored with the state): the job
        master adds their increments to the timeline."""
        latency: dict[int, int] = {}
        for sink in self.sinks:
            latency.update(sink.latency.buckets)
        source_records, sink_records = self._records_read_and_written()
        return {
            "source_records": source_records - self.restored_progress[0],
            "source_lag": self.source.reader.lag(time.time()) if self.source else 0,
            "sink_records": sink_records - self.restored_progress[1],
            "latency": latency,  # cumulative bucket counts; the job master diffs them
            "late_copies": self.late_copies.buckets,   # the same, of late copies
            "busy_s": 0.0 if self.frame_began_s is None else time.time() - self.frame_began_s,
            "incarnation": self.incarnation,  # counters restart with each incarnation
        }

    def report(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "index": self.index,
            "savepoint": self.savepoint_entries,
            "savepoint_stop": self.savepoint_stop,
            # a source's state and position: a savepoint stores every source's,
            # whether it was stopped or had ended (`bastion.runtime.savepoint`)
            "source_state": (None if self.source is None else {
                "operator": self.source.ctx.name, "position": self.source.position,
                "blob": self._encode_operator_state(self.source, self.source.snapshot())}),
            "operators": {name: (c.records_in, c.records_out)
                          for name, c in zip(self.op_names, self.counts)},
            "sinks": {op.ctx.name: {"latency": op.latency.buckets,
                                    "timeline": op.timeline,
                                    "latency_by_second": {
                                        second: h.buckets
                                        for second, h in op.latency_by_second.items()},
                                    "spilled_parts": op.spilled_parts,
                                    "max_staged_records": op.max_staged_records}
                      for op in self.sinks},
            "dead_letters": self.dead_letters,  # the examples each context kept
            "dead_letter_count": sum(c.dead_letter_count for c in [op.ctx for op in self.ops]
                                     + [r.key_ctx for r in self.routers]),
            "started_s": self.started_s,
            "finished_s": self.finished_s,
            "process": _process_id(),
            "started_cpu_s": self.started_cpu_s,
            "finished_cpu_s": self.finished_cpu_s,
            "forked_encodes": self.forked_encodes,
            "forked_cpu_s": self.forked_cpu_s,
            "frames_sent": sum(c.frames_sent for c in self.channels),
            "bytes_sent": sum(c.bytes_sent for c in self.channels),
            "records_sent": sum(c.records_sent for c in self.channels),
            "protocol_frame_bytes": self.protocol_frame_bytes,
            "protocol_message_bytes": self.protocol_message_bytes,
            "max_inflight_frames": max((c.max_inflight_seen for c in self.channels),
                                       default=0),
            "max_inbox_frames": self.gate.max_queued_seen,
            "faults_injected": None if self.faults is None else self.faults.report(),
            "protocol_counters": self.protocol.counters(),
            "protocol_histograms": {name: h.buckets
                                    for name, h in self.protocol_latency.items()},
            "copies_sent": sum(r.copies_sent for r in self.routers),
            # adaptive buffering: frames held for pending tasks, and of those spilled
            "frames_held": sum(c.frames_held for c in self.channels
                               if isinstance(c, HeldOutputChannel)),
            "frames_spilled": sum(c.frames_spilled for c in self.channels
                                  if isinstance(c, HeldOutputChannel)),
            # upstream backups (`ReplayableOutputChannel`): frames and bytes ever
            # logged for a restart to send again, and the bytes still kept. Under
            # adaptive buffering a task that is not a source logs only during the
            # recovery of a burst.
            "is_source": self.source is not None,
            "backup_frames_logged": sum(c.frames_logged for c in self.channels
                                        if isinstance(c, ReplayableOutputChannel)),
            "backup_bytes_logged": sum(c.bytes_logged for c in self.channels
                                       if isinstance(c, ReplayableOutputChannel)),
            "backup_bytes_kept": sum(c.kept_bytes for c in self.channels
                                     if isinstance(c, ReplayableOutputChannel)),
            "sends_skipped": sum(r.sends_skipped for r in self.routers),
            "copies_dropped": 0 if self.first_copies is None else self.first_copies.dropped,
            "max_remembered_ids": (0 if self.first_copies is None
                                   else self.first_copies.peak_remembered()),
            "task_id": self.task_id,
            "acknowledged": list(self.acknowledged),
            "staged_commits": list(self.staged_commits),
            "final_sent": {c.channel_id: c.seq - 1 for c in self.channels},
            "final_received": dict(self.received_seq),
        }


# Ray's stubs list no concurrency_groups among @ray.remote's options
@ray.remote(num_cpus=0, concurrency_groups={"liveness": 1})  # type: ignore[call-overload]
class Worker:
    """A Ray actor hosting the tasks of one slot (instance ``i`` of every chain with
    ``i % workers == worker_index``). After a failure the job master resets it and
    deploys again with a new *attempt* number; frames of an older attempt that are
    still travelling are dropped on arrival.

    The process outlives its job (`bastion.scheduler.pool`): a job `bind`s it, deploys
    and runs its tasks, and `release`s it — every task, channel and per-job field
    dropped — before the pool lends it to the next job. Frames carry the job's id with
    the attempt, so a frame of an earlier job still travelling is dropped too."""

    def __init__(self) -> None:
        gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        allocator.keep_freed_memory()
        self.worker_index: int | None = None
        self.config: JobConfig | None = None
        self.store: ObjectStore | None = None
        self.master: Any = None  # the bound job's `MasterLink`
        self.tasks: dict[int, Task] = {}
        self.runners: list[asyncio.Task] = []
        self.runner_of: dict[int, asyncio.Task] = {}  # task id -> its loop
        # the `wait` calls pending: what ends one (`_end_waits`) -> set once it returned
        self.waits: dict[asyncio.Future, asyncio.Future] = {}
        self.unstarted: list[Task] = []  # tasks that joined, started by `attach`
        # the incarnation of every task of the job (a regional restart bumps those of
        # the tasks it rebuilds): frames carry their destination's
        self.incarnations: list[int] | None = None
        self.failover: FailoverStrategy | None = None  # the bound job's (`bind`)
        # Adaptive buffering is on (`set_buffering`): the channels of tasks that are
        # not sources keep an upstream backup, those built from now on too.
        self.buffering = False
        self.attempt = -1
        self.epoch: tuple[str, int] | None = None  # (job id, attempt) frames must carry
        # The data plane (`bastion.runtime.transport`): frames from peers arrive
        # through the server, frames to peers leave through the links. Both outlive
        # jobs, like the process. The server takes only links that prove the bound
        # job's key (docs/security.md); TLS between hosts if the environment says so.
        tls = tls_from_env()
        self.frames = FrameServer(self._deliver, authenticate=True, tls=tls)
        self.links = PeerLinks(tls=tls)
        # What the process holds before any job (Ray, the imports, ~80 k objects)
        # lives as long as it does: out of the collector's sight, a full collection
        # (`_collect_dropped_tasks`, on a restart's path) walks the jobs' objects
        # only — 50 ms less on this machine.
        gc.freeze()

    async def frame_address(self) -> tuple[str, int]:
        """Where peers send this worker frames (its server starts on first call)."""
        return await self.frames.start(node_address())

    def bind(self, config: JobConfig, worker_index: int, master: Any) -> None:
        """Serve job ``config.job_id`` as slot ``worker_index`` (`placement.STANDBY`:
        its standby) until `release`; its tasks reach the job master through
        ``master`` (a `MasterLink`). Taken here, not at deploy: the first time a
        process unpacks an actor handle, Ray looks the actor up (tens of ms), which
        a standby should have done before it takes over a slot."""
        self.config = config
        self.master = master
        self.store = open_store(config.storage_url)
        self.worker_index = worker_index
        # The job's key (a fresh one per job, from its master): the server takes links
        # of this job only from now on, and links of the job before are not reused.
        # JobKey refuses a config without its key (None), naming where one comes from
        key = JobKey(config.job_id, cast(bytes, config.frame_key))
        limits = LinkLimits.of(config)
        self.frames.bind(key, limits)
        self.links.bind(key, limits)
        # which tasks a failure restarts: what the channels into them must survive
        self.failover = failover_strategy(config.failover,
                                          get_protocol(config.protocol).restart_scope,
                                          config.recovery)
        self.buffering = False

    async def release(self) -> None:
        """Forget the job: stop its tasks and drop everything it left here."""
        await self.reset()
        self.worker_index = self.config = self.store = self.epoch = self.master = None
        self.attempt = -1
        # An idle process proves no job's key: links of the job it served close now,
        # not when the next job binds it.
        self.frames.bind(None)
        self.links.bind(None)
        # an idle worker does not hold a large job's peak (`keep_freed_memory`)
        allocator.release_freed_memory()

    @ray.method(concurrency_group="liveness")
    def ping(self) -> int | None:
        """Heartbeat. It runs on its own thread, so a user function that keeps the
        tasks' event loop busy does not make a live process look dead."""
        return self.worker_index

    @ray.method(concurrency_group="liveness")
    def frame_ages(self) -> dict[int, float | None]:
        """Per task, how long it has been on the frame (a source: the batch) it is
        processing, in seconds; None between frames. On the heartbeat's thread: a
        user function that holds the task loop is what it is asked for
        (`bastion.scheduler.stall`)."""
        now_s = time.time()
        # list(): the loop's thread may add tasks meanwhile
        return {task.task_id: None if (began_s := task.frame_began_s) is None
                else now_s - began_s for task in list(self.tasks.values())}

    @ray.method(concurrency_group="liveness")
    def node_id(self) -> str:
        """The Ray node this worker runs on (what `KillNode` matches)."""
        return ray.get_runtime_context().get_node_id()

    async def deploy(self, plan: PhysicalPlan, peers: list[tuple[str, int]],
                     attempt: int, restore: Any, worker_index: int,
                     assignment: list[int | None] | None = None,
                     incarnations: list[int] | None = None) -> None:
        """Build this attempt's tasks for slot ``worker_index`` (a standby worker takes
        over the slot of a dead one); each task's protocol restores it from
        ``restore``, the recovery line its coordinator chose (None: from the start).
        ``peers`` are the frame addresses of every worker, ``assignment`` the worker
        of every task (default: the plan's; None: a task that is pending, whose
        inputs are held upstream — `HeldOutputChannel`)."""
        await self.reset()
        assert self.config is not None  # `bind` comes before any deploy
        self.worker_index = worker_index
        self.attempt = attempt
        self.epoch = (self.config.job_id, attempt)
        self.incarnations = incarnations
        await self._add_tasks(plan, peers, restore, assignment,
                              [t.task_id for t in plan.tasks
                               if _worker_of(plan, assignment, t.task_id) == worker_index])

    async def join(self, epoch: tuple[str, int], plan: PhysicalPlan,
                   peers: list[tuple[str, int]], restore: Any,
                   assignment: list[int | None], task_ids: list[int],
                   incarnations: list[int] | None = None) -> None:
        """Pending tasks ``task_ids`` join the running attempt on this worker,
        restored from ``restore`` (the attempt's recovery line, or a regional
        restart's line); they start at the `attach` that follows, once every joining
        task of every worker exists (a frame for a task not built yet would have
        nowhere to go)."""
        if self.epoch is None:  # a fresh worker: it joins the attempt that runs
            self.epoch, self.attempt = epoch, epoch[1]
        elif epoch != self.epoch:
            return
        self.incarnations = incarnations
        self.unstarted.extend(
            await self._add_tasks(plan, peers, restore, assignment, task_ids))

    async def attach(self, epoch: tuple[str, int], plan: PhysicalPlan,
                     peers: list[tuple[str, int]], assignment: list[int | None],
                     resume: dict[int, int] | None = None,
                     incarnations: list[int] | None = None) -> int:
        """Tasks that were pending run now (``assignment``): the tasks that joined
        this worker start, and every channel held for a task that runs now sends
        what it held, in the background (its sender waits meanwhile), and forwards
        from then on — a channel with upstream backup from frame ``resume[channel]``
        on, where its restored receiver resumes. How many channels it attached."""
        if epoch != self.epoch:
            return 0
        self.incarnations = incarnations
        resume = resume or {}
        await self.links.connect([address for slot, address in enumerate(peers)
                                  if slot != self.worker_index])
        # Started first: a held channel into a task of this worker drains only as
        # fast as that task takes frames.
        for task in self.unstarted:
            self._run(task)
        self.unstarted = []
        route_acks = self._ack_router(plan, peers, assignment)
        attached = 0
        for task in self.tasks.values():
            task.ack_router = route_acks
            for channel, dst in zip(task.channels, task.channel_destinations):
                if isinstance(channel, ReroutableOutputChannel) and not channel.attached \
                        and assignment[dst] is not None:
                    await channel.attach(self._channel(task, plan, peers, assignment,
                                                       channel.channel_id, dst, wrapped=False))
                    attached += 1
                elif isinstance(channel, HeldOutputChannel) and not channel.attached \
                        and not channel.attaching and assignment[dst] is not None:
                    target = self._channel(task, plan, peers, assignment,
                                           channel.channel_id, dst, wrapped=False)
                    channel.attaching = True  # now: a later attach must not start another
                    self.runners.append(asyncio.ensure_future(
                        channel.attach(target, resume.get(channel.channel_id, 0))
                        if isinstance(channel, ReplayableOutputChannel)
                        else channel.attach(target)))
                    attached += 1
        return attached

    async def _add_tasks(self, plan: PhysicalPlan, peers: list[tuple[str, int]],
                         restore: Any, assignment: list[int | None] | None,
                         task_ids: list[int]) -> list["Task"]:
        config, store = self.config, self.store
        assert config is not None and store is not None  # `bind` set both
        # Links to every other worker: frames go to the workers downstream, and a
        # protocol that acknowledges tuples sends to the workers of their sources.
        await self.links.connect([address for slot, address in enumerate(peers)
                                  if slot != self.worker_index])
        added = [Task(plan.tasks[t], plan, config, store, self.master, self.attempt,
                      self._incarnation(t))
                 for t in task_ids]
        self.tasks.update((task.task_id, task) for task in added)
        route_acks = self._ack_router(plan, peers, assignment)
        for task in self.tasks.values():
            task.ack_router = route_acks
        for task in added:
            for route in task.plan.routes:
                channels = [self._channel(task, plan, peers, assignment, channel_id, dst)
                            for channel_id, dst in zip(route.channel_ids, route.dst_tasks)]
                for channel in channels:  # a receiver that ran on sees it started over
                    channel.seq = first_seq(task.incarnation)
                task.connect(route, channels)
            if config.savepoint is not None and (
                    restore is None or get_protocol(config.protocol).savepoint_under_restarts):
                # "from the beginning" is from the savepoint; a checkpoint of this
                # job, if the line names one, replaces it
                await task.load_savepoint(config.savepoint)
            await task.protocol.restore(restore)
        return added

    def _incarnation(self, task_id: int) -> int:
        return 0 if self.incarnations is None else self.incarnations[task_id]

    def _channel(self, task: "Task", plan: PhysicalPlan, peers: list[tuple[str, int]],
                 assignment: list[int | None] | None, channel_id: int,
                 dst: int, wrapped: bool = True) -> OutputChannel:
        """The sending end of ``channel_id`` from ``task`` to task ``dst``: in this
        worker, to a peer, or held while ``dst`` is pending — ``wrapped`` in what the
        job's failover strategy needs to outlive a restart of ``dst``: an upstream
        backup (`ReplayableOutputChannel`) or a channel that drops frames while it
        is down (`ReroutableOutputChannel`)."""
        config, failover, epoch = self.config, self.failover, self.epoch
        # `bind` set the config and the failover, `deploy` the epoch, before any channel
        assert config is not None and failover is not None and epoch is not None
        dst_worker = _worker_of(plan, assignment, dst)
        recovery = config.recovery
        held_frames_in_memory = 64 if recovery is None else recovery.held_frames_in_memory
        if wrapped and failover.backs_up_channels:
            return ReplayableOutputChannel(
                channel_id, config.frame_records, config.buffer_timeout_s, task.codec,
                held_frames_in_memory, self.store,
                f"jobs/{config.job_id}/held/{self.attempt}/{channel_id}/{task.incarnation}",
                None if dst_worker is None else self._channel(
                    task, plan, peers, assignment, channel_id, dst, wrapped=False),
                logs=(not failover.adaptive_buffering or self.buffering
                      or task.source is not None))
        if wrapped and failover.reroutes_channels and dst_worker is not None:
            # a receiver lost for much longer than the job master takes to notice a
            # death and restart it was not lost: the link to it broke
            return ReroutableOutputChannel(
                channel_id, config.frame_records, config.buffer_timeout_s, task.codec,
                self._channel(task, plan, peers, assignment, channel_id, dst, wrapped=False),
                unattached_timeout_s=10 * config.heartbeat_timeout_s)
        if dst_worker is None:
            return HeldOutputChannel(
                channel_id, config.frame_records, config.buffer_timeout_s, task.codec,
                held_frames_in_memory, self.store,
                f"jobs/{config.job_id}/held/{self.attempt}/{channel_id}")
        if dst_worker == self.worker_index and dst in self.tasks:
            gate = self.tasks[dst].gate
            return LocalOutputChannel(channel_id, config.frame_records, config.buffer_timeout_s,
                                      gate.deliver, task.codec, gate.inbox.full)
        remote = RemoteOutputChannel(channel_id, config.frame_records, config.buffer_timeout_s,
                                     pusher(self.links[peers[dst_worker]], dst, epoch,
                                            self._incarnation(dst)),
                                     task.codec, config.max_inflight_frames)
        # Inside a wrapper too: a connection dropped by an injected fault is this
        # channel's (its stalls and lost frames are the wrapper's `send`'s).
        remote.faults = task.faults
        return remote

    async def reset(self) -> None:
        """Stop every task of the current attempt (their state is discarded)."""
        await self._end_waits()
        await _cancel(set(self.runners))
        # frames of the failed attempt still waiting to enter (gates, not tasks, as
        # the loop variable: a task bound in this frame would outlive the collection)
        for gate in [task.gate for task in self.tasks.values()]:
            gate.close()
        dropped = bool(self.tasks or self.unstarted)
        self.runners, self.tasks, self.unstarted, self.runner_of = [], {}, [], {}
        priority.set_idle(False)  # a catch-up's lowered priority ends with its tasks
        if dropped:
            _collect_dropped_tasks()

    async def start(self) -> float:
        """Start the tasks' loops; return when they began (this host's wall clock).
        The job master's reply comes later — the sources' first batches run on this
        event loop before it is sent (~40 ms into a catch-up) — and a recovery's
        restart ends when the tasks run, not when the master hears of it."""
        self.runners = []
        for task in self.tasks.values():
            self._run(task)
        return time.time()

    def _run(self, task: "Task") -> None:
        runner = asyncio.ensure_future(task.run())
        self.runners.append(runner)
        self.runner_of[task.task_id] = runner

    async def restart_region(self, epoch: tuple[str, int], task_ids: list[int]) -> None:
        """A regional restart: the tasks ``task_ids`` restart while the others keep
        running. Every channel of this worker into one of them stops forwarding (its
        upstream backup keeps logging, for the restarted receiver), and those of them
        that run here stop — their state is discarded, their inbox closed — once
        their checkpoint uploads are done (the next incarnation writes the same
        keys). They are built again by `join`."""
        if epoch == self.epoch and await self._stop_region(set(task_ids)):
            _collect_dropped_tasks()

    async def _stop_region(self, region: set[int]) -> bool:
        """`restart_region` up to the collection, which must wait until this frame,
        which holds the stopped tasks and their cancelled loops, is gone; whether it
        dropped a task."""
        for task in self.tasks.values():
            for channel, dst in zip(task.channels, task.channel_destinations):
                if dst in region and isinstance(channel, (ReplayableOutputChannel,
                                                          ReroutableOutputChannel)):
                    channel.detach()
        stopping = [self.tasks.pop(t) for t in sorted(region) if t in self.tasks]
        stopped = {runner for t in stopping
                   if (runner := self.runner_of.pop(t.task_id, None)) is not None}
        self.unstarted = [t for t in self.unstarted if t.task_id not in region]
        self.runners = [r for r in self.runners if r not in stopped]
        await self._end_waits()
        await _cancel(stopped)
        for task in stopping:
            task.gate.close()
            await asyncio.gather(*task.writes, return_exceptions=True)
        return bool(stopping)

    async def set_buffering(self, job_id: str, on: bool) -> int:
        """Adaptive buffering on or off (`bastion.scheduler.failover`): the channels
        of this worker's tasks that are not sources start keeping an upstream backup,
        or stop and free it (a channel to a receiver not attached keeps its log). A
        worker that has not joined an attempt yet takes it for the tasks it builds.
        The bytes freed."""
        if self.config is None or self.config.job_id != job_id:
            return 0
        self.buffering = on
        freed = 0
        for task in list(self.tasks.values()):
            if task.source is not None:
                continue  # a source's backup is always on
            for channel in task.channels:
                if isinstance(channel, ReplayableOutputChannel):
                    if on:
                        channel.start_logging()
                    else:
                        freed += await channel.stop_logging()
        return freed

    def set_catch_up(self, epoch: tuple[str, int], lowered: bool) -> str:
        """Run this worker's tasks (its event loop's thread: this method runs on it)
        at the OS's lowest CPU priority while they catch up (``lowered``), or
        normally again (`bastion.scheduler.catchup`); what the thread runs at
        afterwards (`bastion.runtime.priority`). A fresh worker bound to the job
        takes it before it joins the attempt: its restore is catch-up work too."""
        fresh = (self.epoch is None and self.config is not None and epoch is not None
                 and self.config.job_id == epoch[0])
        if epoch != self.epoch and not fresh:
            return priority.current()
        return priority.set_idle(lowered)

    async def _deliver(self, epoch: tuple[str, int], task_id: int, channel_id: int, seq: int,
                       payload: bytes, incarnation: int = 0) -> None:
        """A frame from a peer worker: into its task's inbox, in sequence order."""
        if epoch != self.epoch:
            return  # a frame of a failed attempt (replayed) or of an earlier job
        task = self.tasks.get(task_id)
        if channel_id == ACKS_CHANNEL:
            if task is not None:
                task.protocol.on_acks(msgpack.unpackb(payload))
            return
        if task is None or incarnation != task.incarnation:
            return  # for a task restarted since (or not rebuilt yet): its upstream
            # backup sends it again, to the task's next incarnation
        await task.gate.deliver(channel_id, seq, payload)

    def _ack_router(self, plan: PhysicalPlan, peers: list[tuple[str, int]],
                    assignment: list[int | None] | None = None) -> Any:
        """How this worker's tasks reach any task's `TaskProtocol.on_acks`: a task of
        this worker directly, another's over the link to its worker (no credits: an
        acknowledgment never waits for room in an inbox)."""
        tasks, epoch, links = self.tasks, self.epoch, self.links
        assert epoch is not None  # made by deploy, join and attach, once the epoch is set

        def route(task_id: int, entries: list) -> None:
            if self.epoch != epoch:
                # called late (a slow acknowledgment's timer) by a task of an attempt
                # or job this worker has left: its roots are replayed or gone
                return
            local = tasks.get(task_id)
            if local is not None:
                local.protocol.on_acks(entries)
                return
            worker = _worker_of(plan, assignment, task_id)
            if worker is None:  # a pending source: it replays once it runs
                return
            link = links.get(peers[worker])
            if link is None:
                # its worker was replaced, and this router not yet (`attach`): the
                # acknowledgments are lost with the source they were for, or its
                # roots are replayed — what acknowledgments lost on a link come to
                return
            # Not resent when the connection heals: the protocol XORs ids, so a copy
            # would corrupt its ledger.
            sent = link.send(epoch, task_id, ACKS_CHANNEL, 0, msgpack.packb(entries),
                             resend=False)
            # A lost link ends the attempt, or its receiver restarts, or the connection
            # dropped with it on the way: the roots whose acknowledgments it carried
            # are replayed.
            sent.add_done_callback(lambda f: f.cancelled() or f.exception())
        return route

    # Calls from the job master carry the job's epoch, (job id, attempt), like frames:
    # a late call of a failed attempt, or of the job this pooled worker served before,
    # must not act on the tasks it runs now.

    def trigger_checkpoint(self, epoch: tuple[str, int], task_ids: list[int],
                           checkpoint_id: int) -> list[int]:
        """The sources ``task_ids`` take checkpoint ``checkpoint_id``; those of them
        that had finished, which never will (a worker reports its tasks finished
        only once all of them are)."""
        if epoch != self.epoch:
            return []
        finished = []
        for task_id in task_ids:
            task = self.tasks.get(task_id)
            # A source is triggered once per checkpoint, in id order. A source joining
            # after a regional restart can be asked twice for the checkpoint in
            # progress — by the trigger loop while it is being built, and by the
            # job master once it is — and a second barrier would make its
            # receivers take the checkpoint again: a receiver with other inputs
            # would wait for their second barrier forever, and one without would
            # store its staged outputs again under the same id, replacing the ones
            # it stored at the first.
            if task is not None and task.finished:
                finished.append(task_id)
            elif task is not None and checkpoint_id > task.triggered_up_to:
                task.triggered_up_to = checkpoint_id
                task.triggers.append(checkpoint_id)
        return finished

    async def trim_upstream_backups(self, epoch: tuple[str, int], below: dict[int, int]
                                    ) -> None:
        """The upstream backups of this worker's tasks forget the frames below
        ``below[channel]`` (`MasterContext.trim_upstream_backups`)."""
        if epoch != self.epoch:
            return
        for task in list(self.tasks.values()):
            outputs = task.context.outputs
            for channel_id in outputs.ids():
                if channel_id in below:
                    await outputs.trim_sent(channel_id, below[channel_id])

    async def apply_commit(self, epoch: tuple[str, int], commit: int) -> None:
        """Commit point ``commit`` is complete: sinks with outside effects apply it."""
        if epoch != self.epoch:
            return
        for task in self.tasks.values():
            await task.reapply_commits(only=commit)
            await task.protocol.on_checkpoint_completed(commit)

    def set_redundancy(self, epoch: tuple[str, int], ratio: float) -> None:
        """The resiliency manager's new redundancy ratio, for every copying edge."""
        if epoch != self.epoch:
            return
        for task in self.tasks.values():
            for router in task.routers:
                if router.edge.dst_op in task.config.redundancy:
                    router.copies = ratio

    def stop_sources(self, epoch: tuple[str, int], savepoint_stop: bool = False) -> None:
        """Every source of the attempt stops reading; ``savepoint_stop``: the job
        stops with a savepoint, which its sources' ends of stream tell downstream."""
        if epoch != self.epoch:
            return
        for task in self.tasks.values():
            task.stop_requested = True
            if savepoint_stop and task.source is not None:
                task.savepoint_stop = True

    async def wait(self, epoch: tuple[str, int]) -> dict[str, Any]:
        """Wait until every task finished, or one failed: then report the failure.
        A restart here, whole or regional, ends the wait as stale: the job master
        that asked has moved on to the restart (every restart follows a failure its
        watch reported) and asks again, and a wait left pending would hold the
        stopped tasks' loops, so the tasks and all their state, until the job ends."""
        if not self.runners:
            return {"worker": self.worker_index, "failure": None}
        restarted = asyncio.get_running_loop().create_future()
        returned = asyncio.get_running_loop().create_future()
        self.waits[restarted] = returned
        try:
            return await self._wait(epoch, restarted)
        finally:
            del self.waits[restarted]
            returned.set_result(None)

    async def _wait(self, epoch: tuple[str, int], restarted: asyncio.Future) -> dict[str, Any]:
        running: set[asyncio.Future] = set(self.runners)
        while running:
            done, running = await asyncio.wait(running | {restarted},
                                               return_when=asyncio.FIRST_COMPLETED)
            if restarted.done() or epoch != self.epoch:
                return {"worker": self.worker_index, "failure": None, "stale": True}
            running.discard(restarted)
            for runner in done:
                if not runner.cancelled() and (error := runner.exception()) is not None:
                    return {"worker": self.worker_index, "failure": error}
        return {"worker": self.worker_index, "failure": None}

    async def _end_waits(self) -> None:
        """End every pending `wait` (see there), and return once they returned."""
        for restarted in self.waits:
            if not restarted.done():   # a restart already under way ended it
                restarted.set_result(None)
        if self.waits:
            await asyncio.wait(list(self.waits.values()))

    def progress(self) -> dict[str, Any]:
        per_task = {t.task_id: t.progress() for t in self.tasks.values()}
        return {"attempt": self.attempt, "tasks": per_task,
                "quiescence": {t.task_id: t.quiescence() for t in self.tasks.values()
                               if not t.finished},
                # the tasks a channel of this worker is still sending a backlog to
                "replaying": sorted({dst for t in self.tasks.values()
                                     for channel, dst in zip(t.channels,
                                                             t.channel_destinations)
                                     if isinstance(channel, HeldOutputChannel)
                                     and channel.replaying}),
                "cpu_priority": priority.current()}

    def finish_loops(self, epoch: tuple[str, int], task_ids: list[int]) -> None:
        if epoch != self.epoch:
            return
        for task_id in task_ids:
            task = self.tasks.get(task_id)
            if task is not None and not task.finished:
                task.finish_loop()

    def report(self) -> list[dict[str, Any]]:
        return [t.report() for t in self.tasks.values()]


def _retrieved(future: asyncio.Future) -> None:
    """Mark an upload's outcome as seen: when its task was cancelled meanwhile, no one
    awaits it any more."""
    if not future.cancelled():
        future.exception()


async def _cancel(runners: set[asyncio.Task]) -> None:
    """Cancel the loops ``runners`` until they end: code that swallows one
    cancellation (a library's timeout racing with it) must not hang a recovery."""
    while runners:
        for runner in runners:
            runner.cancel()
        _, runners = await asyncio.wait(runners, timeout=_RESET_RECANCEL_S)


def _collect_dropped_tasks() -> None:
    """Free the tasks a restart or a release just dropped. A task's operators,
    channels and protocol refer to each other, so dropped they are cyclic garbage,
    which only a full collection frees; and a worker's data path makes few
    long-lived objects, so none may come for a long time. Without this a pooled
    worker held every earlier job's state (a keyed reduce of 16 M keys: 1.2 GB more
    a job, until the node ran out of memory), and every restart added one more copy
    of the state of the tasks it rebuilt beside the one they restore. Collected now,
    while the restarted tasks have not restored yet, the collection frees what a
    later one would have to, instead of pausing their loop in the middle of a run."""
    gc.collect()


def _worker_of(plan: PhysicalPlan, assignment: list[int | None] | None,
               task_id: int) -> int | None:
    """The worker index task ``task_id`` runs on (None: pending)."""
    return plan.tasks[task_id].worker if assignment is None else assignment[task_id]


def _process_id() -> str:
    """Names this process among all of the cluster's: its node and pid."""
    return f"{ray.get_runtime_context().get_node_id()}:{os.getpid()}"

