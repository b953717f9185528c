"""Operator behaviour: what one instance of each operator kind does to a batch.

An `Operator` instance turns an input `Batch` into an output batch (or nothing), reacts
to the watermark advancing (time windows fire) and to the end of its input (flush), and
can snapshot and restore its state for checkpoints. A snapshot is stored right away
as a `bastion.runtime.durable` blob, which restores exact Python types, so snapshots
use plain dicts and lists where they can: a tuple or set costs a mark per object.

User functions run over a whole batch in a C-level loop (``map``), and each is called
once per record a batch holds: when one raises, only the failing record goes to the
dead-letter output, with the error, and the batch goes on after it without calling the
function again on the records before it (`_apply_udf`) — unless the job runs with
``fail_fast``, where the first failure stops it with a `UDFError` naming the operator
and the record. A recovery replays records, so user functions must still be
deterministic, and side effects may repeat across a failure of the job; exactly-once
applies to what the sinks commit. Each operator instance counts every record it
dead-letters but keeps only the first `DEAD_LETTER_EXAMPLES` (with their errors) as
examples: a function failing on every record of a long stream costs a counter.

Keyed state is a plain dict per instance: ``{key: state}``, or ``{window: {key: acc}}``
for windows. The key routing upstream guarantees that an instance sees every record of
its keys and no other.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
import traceback
from itertools import accumulate, chain, compress, islice, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from bastion import _batches
from bastion import aggregations as _aggregations
from bastion import windows as window_specs
from bastion.errors import UDFError
from bastion.lineage import (IdRun, NumberedIds, derived_ids, from_wire, ids_of, root_ids,
                             to_wire, union_ids)
from bastion.runtime.metrics import LatencyHistogram
from bastion.runtime.columns import (FOLD_COUNT, FOLD_MAX, FOLD_MEAN, FOLD_MIN, FOLD_SUM,
                                     IntColumn, field_column, float64_runs, fold_int_column,
                                     fold_keyed, pack_float64_xor, pack_int_deltas, pack_ints,
                                     pair_column, unpack_float64, unpack_float64_xor,
                                     unpack_ints)
from bastion.runtime.records import FLOAT64_XOR, Batch, pack_column, unpack_column
from bastion.runtime.windows import TimeWindows
from bastion.topology import OpNode

if TYPE_CHECKING:
    from bastion.runtime.incremental import ChangedKeys

_IMMUTABLE = (int, float, str, bytes, bool, type(None), tuple, frozenset)
_MISSING = object()
# Dead letters an operator instance keeps as examples; the others are only counted, so
# a function that fails on every record of an endless stream does not fill the memory.
DEAD_LETTER_EXAMPLES = 100


class DeadLetter:
    """A record that could not be processed: which operator, what, why."""

    __slots__ = ("operator", "index", "value", "error", "reason")

    def __init__(self, operator: str, index: int, value: Any, error: str, reason: str):
        self.operator = operator
        self.index = index
        self.value = value
        self.error = error
        self.reason = reason

    def __reduce__(self):
        return (DeadLetter, (self.operator, self.index, self.value, self.error, self.reason))

    def __repr__(self) -> str:
        return (f"DeadLetter(operator={self.operator!r}, index={self.index}, "
                f"value={self.value!r}, reason={self.reason!r}, error={self.error!r})")


class OperatorContext:
    """What an operator instance knows about where it runs, and the records it could not
    process: ``dead_letter_count`` counts them all, ``dead_letters`` keeps the first
    ``dead_letter_examples`` of them."""

    def __init__(self, name: str, index: int, parallelism: int, fail_fast: bool,
                 code: int = 0, lineage: bool = False,
                 dead_letter_examples: int = DEAD_LETTER_EXAMPLES):
        self.name = name
        self.index = index
        self.parallelism = parallelism
        self.fail_fast = fail_fast
        self.code = code          # what lineage ids call this operator
        self.lineage = lineage    # sources start ids; the others derive from their input
        self.dead_letter_examples = dead_letter_examples
        self.dead_letters: list[DeadLetter] = []
        self.dead_letter_count = 0

    def dead_letter(self, value: Any, error: BaseException | str, reason: str = "udf",
                    what: str = "") -> None:
        if isinstance(error, BaseException):
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
        else:
            text = error
        if what:
            text = f"{what}: {text}"
        if self.fail_fast and reason == "udf":
            raise UDFError(self.name, self.index, value, text)
        self.dead_letter_count += 1
        if len(self.dead_letters) < self.dead_letter_examples:
            self.dead_letters.append(DeadLetter(self.name, self.index, value, text, reason))


class Operator:
    """One instance of a logical operator."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        self.node = node
        self.ctx = ctx

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        return batch

    def on_watermark(self, watermark: float) -> Batch | None:
        return None

    def on_end(self) -> Batch | None:
        return None

    def snapshot(self) -> Any:
        return None

    # -- parts: the state split into independent pieces (eventual checkpoints) ----------
    #
    # A stateful operator whose state splits into *parts* — one per key of a keyed fold
    # or of a count window, one per window of a time window or join — says so with
    # ``parted = True`` and answers the questions below. `bastion.protocols.cec` writes
    # each part's state into the operator's output log on its own and loads parts back
    # one by one.

    parted = False
    # A record goes into one part (`parts_of`), or, when True, into several: a record
    # of a sliding window is in ``size / slide`` windows, and a replay may find some of
    # them already reflecting it and others not (`windows_of`, `process_into`).
    overlapping = False
    # When a list, `process` appends every part it opens, and `on_watermark` every part
    # it closes (a time window fired; a key's part never closes): a protocol that
    # logs parts as they open and close sets them. The test costs nothing on the hot
    # path: it is made only when a part opens or closes.
    opened: list | None = None
    closed: list | None = None
    # True where every part starts empty, the same for all, before its first input (a
    # time window's or a join's window; a keyed fold's accumulator starts from its
    # first input instead): `empty_part_state` is that state.
    opens_empty = False

    def parts_of(self, batch: Batch) -> Sequence:
        """The part each record of ``batch`` goes into."""
        raise NotImplementedError

    def windows_of(self, batch: Batch) -> list:
        """Of an ``overlapping`` operator: the parts each record of ``batch`` goes into."""
        raise NotImplementedError

    def process_into(self, batch: Batch, parts: list, input_index: int = 0
                     ) -> Batch | None:
        """Of an ``overlapping`` operator: `process` ``batch`` (of input
        ``input_index``) with record ``i`` going into ``parts[i]`` alone, some of the
        parts `windows_of` gives for it."""
        raise NotImplementedError

    def part_state(self, part: Any) -> Any:
        raise NotImplementedError

    def load_part(self, part: Any, state: Any) -> None:
        raise NotImplementedError

    def empty_part_state(self) -> Any:
        """Of an operator whose parts ``opens_empty``: the state `part_state` gives
        of a part before its first input, which `load_part` takes."""
        raise NotImplementedError

    def part_state_tables(self) -> tuple[dict, ...] | None:
        """The batched `part_state`, where a part's state is a row of table lookups:
        tables with ``part_state(p) == [table[p] for table in tables]`` for every open
        part ``p``, which a protocol packs a burst of states from in one C call
        (`bastion.runtime.durable.pack_rows`), no row built per part. None: ask
        `part_state` part by part."""
        return None

    def part_retired(self, part: Any, watermark: float) -> bool:
        """Has ``part`` closed for good once the watermark reached ``watermark``?"""
        return False

    def open_among(self, parts: Iterable[Any]) -> list:
        """Those of ``parts`` that are open now, in their order (one C-level pass: a
        protocol asks it of every part a period opened)."""
        raise NotImplementedError

    def open_parts(self) -> list:
        """Every part open now (a protocol logs them all when the operator starts
        from a savepoint's state)."""
        raise NotImplementedError

    def results_form(self, out: Batch) -> list:
        """``out``, a batch of this operator's results, as plain values for a log (a
        protocol that logs results packs them with the state codec, exact types kept);
        `results_batch` turns them back into the same batch. Ids go as they travel: an
        unbuilt run of a keyed fold's ids is a few ints."""
        return [out.keys, list(out.values), list(out.ts), list(out.born), to_wire(out.ids)]

    def results_batch(self, form: list) -> Batch:
        """The batch `results_form` made ``form`` of."""
        keys, values, ts, born, ids = form
        return Batch(keys, values, ts, born, from_wire(ids))

    def restore(self, state: Any) -> None:
        pass

    # -- keyed tables: incremental checkpoints (`bastion.runtime.incremental`) -----------
    #
    # An operator whose whole state is a few dicts sharing one key space (a keyed
    # fold's ``{key: state}``; a time window's ``{window: ...}`` tables) lists them in
    # `tables`, and takes them back in `load_tables`. While ``changed`` is a set, the
    # operator adds to it every key of those tables it may have changed or removed —
    # per batch, not per record, where it can (a superset is fine: a key unchanged
    # is written again, a key absent is written as removed); a fold, whose table never
    # loses a key, tells it which batches only added keys (`ChangedKeys.folded`). None
    # (the default): no tracking, and the hot path pays one ``is None`` test per batch.

    changed: ChangedKeys | None = None

    def tables(self) -> list[dict] | None:
        """The dicts holding this operator's whole state, or None: not keyed (its
        `snapshot` goes whole into every checkpoint)."""
        return None

    def load_tables(self, tables: list[dict]) -> None:
        """Take ``tables`` (what `tables` gave, rebuilt) as the whole state."""
        raise NotImplementedError

    # -- rescaling: keyed state split by key group (`bastion.runtime.savepoint`) -------
    #
    # A job resumed from a savepoint at another parallelism gives each instance of a
    # keyed operator the snapshots of the old instances whose key groups overlap its
    # own (`bastion.runtime.key_groups`); `restore_keys` keeps the keys it now owns.

    keyed = False  # its whole state is split by record key: it may change parallelism

    def restore_keys(self, snapshots: list[Any], owns: Callable[[Any], bool]) -> None:
        """Take as the whole state the entries, of every snapshot in ``snapshots``
        (what other instances' `snapshot` gave), whose key ``owns`` accepts."""
        raise NotImplementedError


def _keys_of(batch: Batch) -> Sequence:
    """The keys of a batch into a keyed operator: the plan partitions every input of
    one by key, so each batch it is given carries them."""
    keys = batch.keys
    assert keys is not None, "a keyed operator was given a batch without keys"
    return keys


def _apply_udf(batch: Batch, ctx: OperatorContext, fn: Callable[[Any], Any]
               ) -> tuple[list[int] | None, list]:
    """Call ``fn`` once on every value of ``batch``; a call that raises dead-letters its
    record. Returns the positions that succeeded (None: all of them) and their results.

    ``list.extend`` consumes ``map(fn, values)`` in C and keeps what it appended when
    the iterator raises (CPython's ``list_extend``), so after a failure ``results``
    tells how far the batch got: the failing record is dead-lettered with the error
    it raised — never called again — and the batch resumes, still in C, after it.
    A user function that raises ``StopIteration`` ends ``map`` as if the batch were
    over; the short count gives it away and its record is dead-lettered too.
    """
    values = batch.values
    n = len(values)
    results: list = []
    positions: list[int] | None = None  # stays None while nothing failed
    start = 0
    while True:
        before = len(results)
        error: Exception | None = None
        try:
            results.extend(map(fn, values) if start == 0 else
                           map(fn, islice(values, start, None)))
        except Exception as exc:  # noqa: BLE001 - any user error is a dead letter
            error = exc
        done = len(results) - before
        failed = start + done
        if error is None and failed == n:
            if positions is None:
                return None, results
            positions.extend(range(start, n))
            return positions, results
        if positions is None:
            positions = list(range(failed))
        else:
            positions.extend(range(start, failed))
        ctx.dead_letter(values[failed], error if error is not None else StopIteration(
            "the function raised StopIteration"))
        start = failed + 1


class _UdfOp(Operator):
    """An operator around one user function, ``node.params["fn"]``."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.fn = node.params["fn"]


class MapOp(_UdfOp):

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        positions, values = _apply_udf(batch, self.ctx, self.fn)
        if positions is not None:
            batch = batch.take(positions)
        ids = batch.ids
        return Batch(batch.keys, values, batch.ts, batch.born,
                     None if ids is None else derived_ids(self.ctx.code, ids))


class MapBatchesOp(_UdfOp):
    """map with a batch function (`bastion._batches`): ``fn`` once per batch, on its
    values as one column; the records and their lineage are those of a map."""

    what = "the map_batches function"  # how a length error names the function

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.format = node.params["batch_format"]

    def _apply(self, batch: Batch) -> tuple[list[int] | None, Sequence]:
        """`_batches.apply` of ``fn`` to ``batch``'s values; a column of the wrong
        length fails the job with a `UDFError` naming this operator."""
        try:
            return _batches.apply(self.fn, batch.values, self.format, self.what,
                                  self.ctx.dead_letter)
        except _batches.ColumnLengthError as exc:
            ctx = self.ctx  # the job's bug: fail it, before anything goes downstream
            raise UDFError(ctx.name, ctx.index, batch.values[0], str(exc)) from None

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        if not len(batch):
            return batch
        positions, values = self._apply(batch)
        if positions is not None:
            batch = batch.take(positions)
        ids = batch.ids
        return Batch(batch.keys, values, batch.ts, batch.born,
                     None if ids is None else derived_ids(self.ctx.code, ids))


class FilterBatchesOp(MapBatchesOp):
    """filter with a batch function: ``fn(column)`` is a column of truth values; the
    records whose value is true go on, ids and all, as a filter's do."""

    what = "the filter_batches function"

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        if not len(batch):
            return batch
        positions, verdicts = self._apply(batch)
        keep = list(compress(range(len(verdicts)) if positions is None else positions,
                             verdicts))
        if len(keep) == len(batch):
            return batch
        return batch.take(keep)


class FilterOp(_UdfOp):

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        positions, verdicts = _apply_udf(batch, self.ctx, self.fn)
        keep = list(compress(range(len(verdicts)) if positions is None else positions,
                             verdicts))
        if len(keep) == len(batch):
            return batch
        return batch.take(keep)


class FlatMapOp(_UdfOp):

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        positions, outs = _apply_udf(batch, self.ctx, self.fn)
        values: list = []
        source_pos: list[int] = []
        emit_index: list[int] = []
        for i, out in zip(range(len(outs)) if positions is None else positions, outs):
            try:
                items = list(out)
            except Exception as exc:  # noqa: BLE001 - fn returned something not iterable
                self.ctx.dead_letter(batch.values[i], exc, what="flat_map result")
                continue
            values.extend(items)
            source_pos.extend([i] * len(items))
            if batch.ids is not None:
                emit_index.extend(range(len(items)))
        out_batch = batch.take(source_pos)
        out_batch.values = values
        if out_batch.ids is not None:  # `take` keeps ids when the batch has them
            out_batch.ids = list(zip(repeat(self.ctx.code), ids_of(out_batch.ids), emit_index))
        return out_batch


def _fresh(initial: Any) -> Any:
    return initial if isinstance(initial, _IMMUTABLE) else copy.deepcopy(initial)


class KeyedFoldOp(Operator):
    """reduce and stateful_map: per-key state, one output per input.

    reduce: ``acc = fn(acc, value)``, emits ``(key, acc)``;
    stateful_map: ``state, out = fn(state, value)``, emits ``out``.
    A record whose function raises leaves its key's state unchanged.
    """

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.fn = node.params["fn"]
        self.initial = node.params["initial"]
        self.emits_pairs = node.kind == "reduce"
        self.state: dict = {}

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        changed = self.changed
        if changed is None:
            return self._fold_batch(batch)
        before = len(self.state)
        try:
            return self._fold_batch(batch)
        finally:
            # a key only ever added: a batch of new keys changed no key held before
            # (a failing record's key is unchanged, and noted as changed: harmless)
            changed.folded(_keys_of(batch), len(self.state) - before)

    def _fold_batch(self, batch: Batch) -> Batch | None:
        keys, values = batch.keys, batch.values
        out: list = []
        try:
            self._fold(keys, values, out)
        except Exception:  # noqa: BLE001 - a record failed: finish record by record
            return self._fold_slow(batch, out)
        ids = batch.ids
        return Batch(keys, out, batch.ts, batch.born,
                     None if ids is None else derived_ids(self.ctx.code, ids))

    def _fold(self, keys: Any, values: Any, out: list) -> None:
        """The fast path: one output per input, appended to ``out``."""
        state, initial, fn, opened = self.state, self.initial, self.fn, self.opened
        get, append = state.get, out.append
        if self.emits_pairs:
            for key, value in zip(keys, values):
                acc = get(key, _MISSING)
                if acc is _MISSING:
                    acc = _fresh(initial)
                    if opened is not None:
                        opened.append(key)
                acc = fn(acc, value)
                state[key] = acc
                append((key, acc))
        else:
            for key, value in zip(keys, values):
                acc = get(key, _MISSING)
                if acc is _MISSING:
                    acc = _fresh(initial)
                    if opened is not None:
                        opened.append(key)
                acc, result = fn(acc, value)
                state[key] = acc
                append(result)

    def _fold_slow(self, batch: Batch, out: list) -> Batch:
        # Every record before the failing one succeeded and produced one output each.
        kept = list(range(len(out)))
        for i in range(len(out), len(batch)):
            before = len(out)
            try:
                self._fold((_keys_of(batch)[i],), (batch.values[i],), out)
            except Exception as exc:  # noqa: BLE001
                del out[before:]
                self.ctx.dead_letter(batch.values[i], exc)
                continue
            kept.append(i)
        out_batch = batch.take(kept)
        out_batch.values = out
        if out_batch.ids is not None:
            out_batch.ids = derived_ids(self.ctx.code, out_batch.ids)
        return out_batch

    def snapshot(self) -> Any:
        return self.state  # the task encodes it at once, before the state changes

    def restore(self, state: Any) -> None:
        self.state = state

    def tables(self) -> list[dict]:
        return [self.state]

    def load_tables(self, tables: list[dict]) -> None:
        self.state, = tables

    keyed = True

    def restore_keys(self, snapshots: list[Any], owns: Callable[[Any], bool]) -> None:
        self.state = {k: v for state in snapshots for k, v in state.items() if owns(k)}

    parted = True  # a part per key, never closed

    def parts_of(self, batch: Batch) -> Sequence:
        return _keys_of(batch)

    def part_state(self, part: Any) -> Any:
        return self.state[part]

    def load_part(self, part: Any, state: Any) -> None:
        self.state[part] = state

    def open_among(self, parts: Iterable[Any]) -> list:
        return list(filter(self.state.__contains__, parts))

    def open_parts(self) -> list:
        return list(self.state)


# The built-in aggregations `fold_keyed` folds, by exact type: a subclass may change
# what ``add`` does, so it takes the Python path.
_FOLD_KINDS: dict[type, int] = {
    _aggregations.Count: FOLD_COUNT, _aggregations.Sum: FOLD_SUM,
    _aggregations.Min: FOLD_MIN, _aggregations.Max: FOLD_MAX,
    _aggregations.Mean: FOLD_MEAN,
}


_WORD_FOLDS = (FOLD_COUNT, FOLD_SUM, FOLD_MIN, FOLD_MAX)


class AggregateFoldOp(KeyedFoldOp):
    """reduce with an aggregation object: ``acc = agg.add(acc, value)`` per key from
    ``agg.create()``, emitting ``(key, agg.result(acc))`` after every input.

    The built-in aggregations fold a batch in C (`columns.fold_keyed`) while values and
    accumulators are plain numbers; a record that is not goes through ``agg.add`` in
    Python, and the C fold resumes after it, so every record is folded once, in order,
    with the result the Python aggregation gives. A built-in's ``fn`` runs first over
    the whole batch (one C-level ``map``; a record it raises on is dead-lettered), and
    the numbers it gives are folded. The state is the same ``{key: acc}`` dict as a
    reduce's (snapshots, incremental tables and parts unchanged); a record whose
    ``add`` or ``result`` raises leaves its key's accumulator unchanged."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        Operator.__init__(self, node, ctx)
        agg = node.params["agg"]
        self.agg = agg
        self.kind = _FOLD_KINDS.get(type(agg))
        self.emits_pairs = True
        self.state = {}
        # A built-in's fn is applied to the column first; the numbers it gives are
        # then folded by the same aggregation without one (``plain``).
        fn = getattr(agg, "fn", None)
        self.extract = None if self.kind is None or fn is _aggregations._identity else fn
        self.plain = agg if self.kind is None else type(agg)()
        # Count, Sum, Min and Max of ints fold in words (`columns.fold_int_column`)
        self.words = self.extract is None and self.kind in _WORD_FOLDS

    def _fold_batch(self, batch: Batch) -> Batch | None:
        keys = _keys_of(batch)
        values = batch.values
        if self.words and type(keys) is IntColumn:
            # keys (and values) held as words: folded without an object per record,
            # unless an accumulator is not a 64-bit int (then as below, same results)
            results = fold_int_column(self.kind, self.state, keys, values, self.opened)
            if results is not None:
                ids = batch.ids
                return Batch(keys, pair_column(keys, results), batch.ts, batch.born,
                             None if ids is None else derived_ids(self.ctx.code, ids))
        # (position in the batch, value, error) of every record that failed, dead-
        # lettered at the end in the order of the records, as the Python path would
        failures: list[tuple[int, Any, BaseException]] = []
        positions: list[int] | None = None
        if self.extract is not None:
            errors = _Failures()
            positions, values = _apply_udf(batch, errors, self.extract)  # type: ignore[arg-type]
            if positions is not None:
                kept = set(positions)
                failures.extend((i, batch.values[i], exc) for i, exc in zip(
                    (i for i in range(len(batch)) if i not in kept), errors.errors))
                batch = batch.take(positions)
                keys = _keys_of(batch)
        out: list = []
        failed: list[int] = []
        n, i, kind = len(values), 0, self.kind
        state, opened = self.state, self.opened
        while i < n:
            if kind is not None:
                i = fold_keyed(kind, state, keys, values, i, out, opened)
                if i == n:
                    break
            error = self._fold_python(keys[i], values[i], out)
            if error is not None:
                failed.append(i)
                # a dead letter carries the record's value, not what fn made of it
                failures.append((i if positions is None else positions[i],
                                 batch.values[i], error))
            i += 1
        if failed:
            gone = set(failed)
            batch = batch.take([j for j in range(n) if j not in gone])
        for _, value, error in sorted(failures, key=itemgetter(0)):
            self.ctx.dead_letter(value, error)
        ids = batch.ids
        return Batch(batch.keys, out, batch.ts, batch.born,
                     None if ids is None else derived_ids(self.ctx.code, ids))

    def _fold_python(self, key: Any, value: Any, out: list) -> BaseException | None:
        """One record through the aggregation's methods; the error when one raises
        (the key's accumulator unchanged)."""
        agg, state = self.plain, self.state
        acc = state.get(key, _MISSING)
        new = acc is _MISSING
        try:
            acc = agg.add(agg.create() if new else acc, value)
            result = agg.result(acc)
        except Exception as exc:  # noqa: BLE001 - any user error is a dead letter
            return exc
        state[key] = acc
        out.append((key, result))
        if new and self.opened is not None:
            self.opened.append(key)
        return None


class _Failures:
    """Stands in for an `OperatorContext` to `_apply_udf`: keeps the errors, in
    order, for the caller to dead-letter in the order of its records."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def dead_letter(self, value: Any, error: BaseException) -> None:
        self.errors.append(error)

class _Emitter:
    """Collects output records one by one (for operators whose outputs are sparse)."""

    __slots__ = ("keys", "values", "ts", "born", "ids")

    def __init__(self, lineage: bool) -> None:
        self.keys: list = []
        self.values: list = []
        self.ts: list = []
        self.born: list = []
        self.ids: list | None = [] if lineage else None

    def emit(self, key: Any, value: Any, ts: float, born: float, record_id: Any = None
             ) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.ts.append(ts)
        self.born.append(born)
        if self.ids is not None:
            self.ids.append(record_id)

    def batch(self) -> Batch | None:
        if not self.values:
            return None
        return Batch(self.keys, self.values, self.ts, self.born, self.ids)


class _WindowParts(Operator):
    """The parts of a windowed operator: one per window, keyed by its number in
    ``self.open``. A record of a tumbling window is in one of them; one of a sliding
    window in several (``overlapping``), each of which a replay filters on its own."""

    parted = True
    windows: TimeWindows
    open: dict

    def parts_of(self, batch: Batch) -> list:
        assign = self.windows.assign
        return [assign(ts)[0] for ts in batch.ts]

    def windows_of(self, batch: Batch) -> list:
        return list(map(self.windows.assign, batch.ts))

    def part_retired(self, part: Any, watermark: float) -> bool:
        return self.windows.end(part) <= watermark

    def open_among(self, parts: Iterable[Any]) -> list:
        return list(filter(self.open.__contains__, parts))

    def open_parts(self) -> list:
        return list(self.open)


class TimeWindowOp(_WindowParts):
    """Tumbling/Sliding aggregation per key; fires windows as the watermark passes them.

    Output record: ``(key, window_start, window_end, result)`` with event time just
    below the window end (so a downstream window puts it in the same window) and
    ``born`` of the latest record that went into the window.
    """

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.windows = TimeWindows(node.params["spec"])
        self.overlapping = self.windows.slide != self.windows.size
        self.agg = node.params["agg"]
        self.open: dict[int, dict] = {}   # window number -> {key: acc}
        self.latest_born: dict[int, float] = {}
        self.pending: list[int] = []      # heap of open window numbers

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        return self.process_into(batch, map(self.windows.assign, batch.ts))

    def process_into(self, batch: Batch, parts: Iterable[Iterable[int]],
                     input_index: int = 0) -> Batch | None:
        if self.changed is not None:  # a window's whole table is its delta's unit
            parts = list(parts)
            self.changed.update(chain.from_iterable(parts))
        add, create = self.agg.add, self.agg.create
        open_, latest, ctx = self.open, self.latest_born, self.ctx
        for key, value, born, windows in zip(_keys_of(batch), batch.values, batch.born,
                                             parts):
            for k in windows:
                # `_window`, inlined: this loop runs once per record and window
                accs = open_.get(k)
                if accs is None:
                    accs = open_[k] = {}
                    latest[k] = born
                    heapq.heappush(self.pending, k)
                    if self.opened is not None:
                        self.opened.append(k)
                elif born > latest[k]:
                    latest[k] = born
                try:
                    accs[key] = add(accs[key] if key in accs else create(), value)
                except Exception as exc:  # noqa: BLE001
                    ctx.dead_letter(value, exc)
        return None

    def _window(self, k: int, born: float) -> dict:
        """Window ``k``'s ``{key: acc}``, opened if it is not open, its newest input's
        ``born`` moved up to ``born``."""
        accs = self.open.get(k)
        if accs is None:
            accs = self.open[k] = {}
            self.latest_born[k] = born
            heapq.heappush(self.pending, k)
            if self.opened is not None:
                self.opened.append(k)
        elif born > self.latest_born[k]:
            self.latest_born[k] = born
        return accs

    def on_watermark(self, watermark: float) -> Batch | None:
        out = _Emitter(self.ctx.lineage)
        code = self.ctx.code
        windows, pending = self.windows, self.pending
        while pending and windows.end(pending[0]) <= watermark:
            k = heapq.heappop(pending)
            if self.closed is not None:
                self.closed.append(k)
            if self.changed is not None:
                self.changed.add(k)  # removed: fired
            start, end = windows.start(k), windows.end(k)
            ts = math.nextafter(end, -math.inf)
            born = self.latest_born.pop(k)
            for key, acc in self.open.pop(k).items():
                try:
                    result = self.agg.result(acc)
                except Exception as exc:  # noqa: BLE001
                    self.ctx.dead_letter((key, start, end), exc, what="aggregation result")
                    continue
                out.emit(key, (key, start, end, result), ts, born, (code, key, start, end))
        return out.batch()

    def on_end(self) -> Batch | None:
        return self.on_watermark(math.inf)

    def snapshot(self) -> Any:
        return {"open": self.open, "latest_born": self.latest_born}

    def restore(self, state: Any) -> None:
        self.open, self.latest_born = state["open"], state["latest_born"]
        self.pending = sorted(self.open)

    def tables(self) -> list[dict]:
        return [self.open, self.latest_born]

    def load_tables(self, tables: list[dict]) -> None:
        self.restore({"open": tables[0], "latest_born": tables[1]})

    keyed = True

    def restore_keys(self, snapshots: list[Any], owns: Callable[[Any], bool]) -> None:
        open_: dict[int, dict] = {}
        latest_born: dict[int, float] = {}
        for state in snapshots:
            for window, accs in state["open"].items():
                mine = {k: acc for k, acc in accs.items() if owns(k)}
                if mine:
                    open_.setdefault(window, {}).update(mine)
                    # the newest input of the window among the instances it came from
                    born = state["latest_born"][window]
                    latest_born[window] = max(latest_born.get(window, born), born)
        self.restore({"open": open_, "latest_born": latest_born})

    def part_state(self, part: Any) -> Any:
        return [self.open[part], self.latest_born[part]]

    opens_empty = True

    def empty_part_state(self) -> Any:
        # no input yet: no key, and a born below any input's (the first one raises it)
        return [{}, -math.inf]

    def part_state_tables(self) -> tuple[dict, ...]:
        # fast windows open a part every few records: their G_opens pack from here
        return (self.open, self.latest_born)

    def load_part(self, part: Any, state: Any) -> None:
        self.open[part], self.latest_born[part] = state
        heapq.heappush(self.pending, part)

    # The results of one window share its bounds, their event time and the shape of
    # their ids, all made from the window's start by `on_watermark`: the log form keeps
    # per result only the key, the aggregate, born and the window's start, and
    # `results_batch` computes the rest the way `on_watermark` did. The results are
    # every record protocol "cec" logs, and packing them was most of what it cost a
    # job of fast windows (benchmarks/cec.py (d)), so no column is a msgpack value per
    # item where it can be machine words, and what repeats is stored once: the results
    # of one window come out together with the same start and the same born (its
    # latest input's), so those two columns are run-length encoded, each run's value a
    # double (born is a wall-clock stamp, a start `k * size`: floats always) and the
    # run lengths packed ints; keys and aggregates that are all exact ints (a count) or
    # all exact floats are packed as a frame packs them (`pack_column`), anything else
    # is left to the state codec, exact types kept. Born's runs are few (a source
    # stamps a batch with one read time), its doubles little-endian; the starts' are a
    # run per window, and the starts of windows fired together climb by a slide: each
    # keeps only the bytes in which it differs from the one before
    # (`columns.pack_float64_xor`: 2-3 of 8), which the packing's bit 16 says (without
    # it, little-endian doubles: logs of earlier versions). Every pass is one C loop
    # (`columns`).

    def results_form(self, out: Batch) -> list:
        values = out.values
        code = None if out.ids is None else self.ctx.code
        keys, keys_kind = pack_column(out.keys)
        aggregates, aggregates_kind = pack_column(field_column(values, 3))
        born, born_runs = _float_runs(out.born)
        starts, start_runs = _float_runs(field_column(values, 1))
        return [_WINDOW_RESULTS, code, keys, aggregates, born, pack_ints(born_runs),
                pack_float64_xor(unpack_float64(starts)), pack_ints(start_runs),
                keys_kind | aggregates_kind << 2 | _XOR_STARTS]

    def results_batch(self, form: list) -> Batch:
        name = self.ctx.name
        if len(form) != 9 or form[0] != _WINDOW_RESULTS:
            raise ValueError(f"operator {name!r}: logged results are not a time window's "
                             "(or were written by an older Bastion: run the job afresh)")
        _, code, keys, aggregates, born, born_runs, starts, start_runs, packing = form
        if packing not in range(32) or packing & 3 == 3 or packing >> 2 & 3 == 3:
            raise ValueError(f"operator {name!r}: logged results say their columns are "
                             f"packed in an unknown way ({packing!r})")
        try:
            keys = list(unpack_column(keys, packing & 3))
            aggregates = unpack_column(aggregates, packing >> 2 & 3)
            born = _from_float_runs(born, unpack_ints(born_runs), len(keys))
            starts = _from_float_runs(
                unpack_float64_xor(starts) if packing & _XOR_STARTS else starts,
                unpack_ints(start_runs), len(keys))
        except TypeError as exc:  # a packed column that is not bytes
            raise ValueError(f"operator {name!r}: logged results have a packed column "
                             f"that is not one: {exc}") from exc
        except ValueError as exc:
            raise ValueError(f"operator {name!r}: logged results have a damaged column: "
                             f"{exc}") from exc
        if not len(keys) == len(aggregates) == len(born) == len(starts):
            raise ValueError(f"operator {name!r}: logged results have columns of "
                             "different lengths")
        size = self.windows.size
        ends = [start + size for start in starts]  # TimeWindows.end: start(k) + size
        ts = [math.nextafter(end, -math.inf) for end in ends]
        ids = None if code is None else list(zip(repeat(code), keys, starts, ends))
        return Batch(keys, list(zip(keys, starts, ends, aggregates)), ts, born, ids)


_FAILED = object()  # a record whose aggregation fn raised (FoldedWindowOp.process)


class FoldedWindowOp(TimeWindowOp):
    """A Tumbling or Sliding window's built-in aggregation (Count, Sum, Min, Max,
    Mean), folded in C: the records of a batch that fall in the same windows go
    through `fold_keyed` at once, into each of those windows' ``{key: acc}`` (no
    result is made per record: a window emits when it fires). A value that is not a
    plain number takes the aggregation's Python ``add``, and the fold resumes after
    it, so windows hold, fire and checkpoint exactly what `TimeWindowOp` gives — the
    state, snapshots, parts and results are its own. Window numbers come from numpy
    passes over the event times with the float operations `TimeWindows.assign` does,
    its check of a boundary window's bounds included (or one call when the batch
    shares one stamp, as a source's batch does without a ``timestamp``); a batch with
    a stamp in no window, or one that is not finite, takes the Python path, and so
    does `process_into` (a protocol's replay, parts given)."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.kind = _FOLD_KINDS[type(self.agg)]
        fn = getattr(self.agg, "fn", None)
        self.extract = None if fn is None or fn is _aggregations._identity else fn
        self.plain = type(self.agg)()

    def _window_runs(self, ts: Sequence[float]) -> list[tuple[range, int, int]] | None:
        """The batch's runs of records in the same windows, ``(windows, start, stop)``
        in order; None when an event time is not finite or in no window (the Python
        path decides)."""
        first, n = ts[0], len(ts)
        if ts[-1] == first and ts.count(first) == n:  # one stamp for all
            windows = self.windows.assign(first)
            return [(windows, 0, n)] if windows else None
        import numpy

        column = _batches.to_column(ts, "numpy").astype(numpy.float64)
        if not numpy.isfinite(column).all():
            return None
        slide, size = self.windows.slide, self.windows.size
        # floor(ts / slide) in doubles, as math.floor(ts / slide) does
        lasts = numpy.floor(column / slide).astype(numpy.int64)
        if slide == size:
            firsts = lasts
        else:
            firsts = numpy.floor((column - size) / slide).astype(numpy.int64) + 1
            while True:   # TimeWindows.assign's check of the first window's bounds
                starts = firsts * slide
                wrong = (firsts <= lasts) & ~((starts <= column) & (column < starts + size))
                if not wrong.any():
                    break
                firsts = firsts + wrong
            if (firsts > lasts).any():
                return None
        cuts = numpy.flatnonzero((lasts[1:] != lasts[:-1]) | (firsts[1:] != firsts[:-1])) + 1
        starts_at = [0, *cuts.tolist()]
        return [(range(lo, hi + 1), start, stop) for lo, hi, start, stop in zip(
            firsts[starts_at].tolist(), lasts[starts_at].tolist(), starts_at,
            [*starts_at[1:], n])]

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        n = len(batch)
        if not n:
            return None
        runs = self._window_runs(batch.ts)
        if runs is None:
            return super().process(batch, input_index)
        if self.changed is not None:  # a window's whole table is its delta's unit
            self.changed.update(k for windows, _, _ in runs for k in windows)
        keys, values, born = _keys_of(batch), batch.values, batch.born
        errors: dict[int, BaseException] = {}
        if self.extract is not None:
            collected = _Failures()
            positions, extracted = _apply_udf(batch, collected, self.extract)  # type: ignore[arg-type]
            if positions is not None:
                # a failed record keeps its place (it still opens its window, as in
                # TimeWindowOp) but is not folded: _FAILED is no number, so the C fold
                # stops there and the Python step below dead-letters it
                full: list = [_FAILED] * n
                for position, value in zip(positions, extracted):
                    full[position] = value
                kept = set(positions)
                errors = dict(zip((i for i in range(n) if i not in kept), collected.errors))
                extracted = full
            values = extracted
        failures: list[tuple[int, BaseException]] = []
        kind = self.kind
        for windows, start, stop in runs:
            newest = max(born[start:stop])
            whole = start == 0 and stop == n
            run_keys = keys if whole else keys[start:stop]
            run_values = values if whole else values[start:stop]
            for k in windows:
                accs = self._window(k, newest)
                i = 0
                while True:
                    i = fold_keyed(kind, accs, run_keys, run_values, i, None, None)
                    if i == len(run_values):
                        break
                    value = run_values[i]
                    if value is _FAILED:
                        failures.append((start + i, errors[start + i]))
                    else:
                        key, agg = run_keys[i], self.plain
                        try:
                            accs[key] = agg.add(accs[key] if key in accs else agg.create(),
                                                value)
                        except Exception as exc:  # noqa: BLE001 - a dead letter
                            failures.append((start + i, exc))
                    i += 1
        # in the order of the records (a record in several windows: once for each, as
        # the Python path, which adds it window by window)
        failures.sort(key=itemgetter(0))
        for position, error in failures:
            self.ctx.dead_letter(batch.values[position], error)
        return None


def _float_runs(column: Sequence[float]) -> tuple[bytes, list[int]]:
    """A column of floats run-length encoded (`columns.float64_runs`); any other number
    as the float it equals."""
    runs = float64_runs(column)
    return float64_runs(list(map(float, column))) if runs is None else runs


def _from_float_runs(values: bytes | tuple[float, ...], lengths: Sequence[int],
                     size: int) -> list[float]:
    """The column of ``size`` items `_float_runs` encoded, its run values as
    little-endian doubles or unpacked already (checked before it is built: a damaged
    length must not make a column of billions)."""
    if type(values) is not tuple:
        if len(values) % 8:
            raise ValueError(f"a column of doubles of {len(values)} bytes "
                             "(not a multiple of 8)")
        values = unpack_float64(values)
    if len(values) != len(lengths) or any(length < 1 for length in lengths):
        raise ValueError(f"{len(values)} run values for run lengths {list(lengths)[:8]}")
    if sum(lengths) != size:
        raise ValueError(f"runs of {sum(lengths)} items in all, for {size} results")
    return list(chain.from_iterable(map(repeat, values, lengths)))


_WINDOW_RESULTS = "window results"
# A time window's results' packing bit: the starts' run values are XOR-packed.
_XOR_STARTS = 16


class CountWindowOp(Operator):
    """Count(n) aggregation per key: fires every n records of a key with
    ``(key, first_ts, last_ts, result)``; an incomplete window never fires.

    Its parts are its keys: a key's part is its current count window and the number
    of windows it fired, and it never closes. Which window a record falls in depends
    on how many records of its key came before it, not on the record, so a part that
    closed when its window fired could not be told apart from the next one in a
    replay; a part that lives on carries the count across."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.n = node.params["spec"].n
        self.agg = node.params["agg"]
        self.state: dict = {}  # key -> [count, first_ts, acc]
        self.fired: dict = {}  # key -> windows fired (lineage ids number them); every key

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        # the results' columns, appended to in place (no call per result); their ids
        # are a column of firing numbers beside the keys (`NumberedIds`)
        keys: list = []
        values: list = []
        stamps: list = []
        borns: list = []
        numbers: list[int] = []
        state, n, agg, fired, opened = self.state, self.n, self.agg, self.fired, self.opened
        if self.changed is not None:
            self.changed.update(_keys_of(batch))
        for key, value, ts, born in zip(_keys_of(batch), batch.values, batch.ts, batch.born):
            if key not in fired:
                fired[key] = 0
                if opened is not None:
                    opened.append(key)
            entry = state.get(key)
            try:
                acc = agg.add(agg.create() if entry is None else entry[2], value)
            except Exception as exc:  # noqa: BLE001
                self.ctx.dead_letter(value, exc)
                continue
            if entry is None:
                entry = state[key] = [0, ts, acc]
            entry[0] += 1
            entry[2] = acc
            if entry[0] == n:
                del state[key]
                nth = fired[key]
                fired[key] = nth + 1
                try:
                    result = agg.result(acc)
                except Exception as exc:  # noqa: BLE001
                    self.ctx.dead_letter(value, exc, what="aggregation result")
                    continue
                keys.append(key)
                values.append((key, entry[1], ts, result))
                stamps.append(ts)
                borns.append(born)
                numbers.append(nth)
        if not values:
            return None
        return Batch(keys, values, stamps, borns,
                     NumberedIds(self.ctx.code, keys, numbers) if self.ctx.lineage else None)

    def snapshot(self) -> Any:
        return {"state": self.state, "fired": self.fired}

    def restore(self, state: Any) -> None:
        self.state, self.fired = state["state"], state["fired"]

    def tables(self) -> list[dict]:
        return [self.state, self.fired]

    def load_tables(self, tables: list[dict]) -> None:
        self.state, self.fired = tables

    keyed = True

    def restore_keys(self, snapshots: list[Any], owns: Callable[[Any], bool]) -> None:
        self.restore({name: {k: v for state in snapshots for k, v in state[name].items()
                             if owns(k)} for name in ("state", "fired")})

    parted = True  # a part per key, never closed

    def parts_of(self, batch: Batch) -> Sequence:
        return _keys_of(batch)

    def part_state(self, part: Any) -> Any:
        return [self.fired[part], self.state.get(part)]

    def load_part(self, part: Any, state: Any) -> None:
        self.fired[part], entry = state
        if entry is not None:
            self.state[part] = entry

    def open_among(self, parts: Iterable[Any]) -> list:
        return list(filter(self.fired.__contains__, parts))

    def open_parts(self) -> list:
        return list(self.fired)

    # The log form of the results (`TimeWindowOp.results_form` says why it matters):
    # per result its key, aggregate, first and last event time and its window's number
    # among its key's (its lineage id's last field), each column packed in C where its
    # items are all ints or all floats, and born run-length encoded (a source stamps a
    # batch with one read time); the value tuple (key, first, last, aggregate) and the
    # id are made again, not stored a tuple each. The first event times are left out
    # when they pack to the very bytes of the last ones (``Count(1)``: a window of one
    # record): on fast count windows every input is a result, and the log's bytes —
    # framed, checked and stored — were most of what protocol "cec" cost such a job.
    # So the event times keep only the bytes in which each differs from the one before
    # (`columns.pack_float64_xor`: 2-3 of 8 for times a few records apart), and the
    # window numbers, which climb one by one per key, their differences (a byte each
    # where they took four): about 5 bytes a result on ``Count(1)`` over 2 keys, not 13.8.

    def results_form(self, out: Batch) -> list:
        values = out.values
        code = None if out.ids is None else self.ctx.code
        lasts = _pack_times(out.ts)  # each result's event time is its last record's
        # A window of one record (Count(1)) starts where it ends: its first times are
        # the last ones by construction, and left out without a pass over the values.
        firsts = lasts if self.n == 1 else _pack_times(field_column(values, 1))
        packed = [pack_column(out.keys), pack_column(field_column(values, 3)),
                  None if firsts == lasts else firsts, lasts]
        ids = out.ids
        nths = None
        if ids is not None:
            numbers = ids.numbers if type(ids) is NumberedIds else field_column(ids, 2)
            nths = pack_int_deltas(numbers)
            if nths is None:
                nths = pack_ints(numbers)
        born, born_runs = _float_runs(out.born)
        return [_COUNT_RESULTS, code, nths,
                [None if column is None else column[0] for column in packed],
                [None if column is None else column[1] for column in packed],
                born, pack_ints(born_runs)]

    def results_batch(self, form: list) -> Batch:
        name = self.ctx.name
        if len(form) != 7 or form[0] != _COUNT_RESULTS:
            raise ValueError(f"operator {name!r}: logged results are not a count "
                             "window's (or were written by an older Bastion: run the job "
                             "afresh)")
        _, code, nths, columns, kinds, born, born_runs = form
        try:
            if len(columns) != 4 or len(kinds) != 4 or columns[3] is None:
                raise ValueError(f"{len(columns)} columns, not 4 with the last times")
            if (columns[2] is None) != (kinds[2] is None):
                raise ValueError("the first times are half left out")
            keys, aggregates, lasts = (list(unpack_column(columns[i], kinds[i]))
                                       for i in (0, 1, 3))
            firsts = (lasts if columns[2] is None
                      else list(unpack_column(columns[2], kinds[2])))
            born = _from_float_runs(born, unpack_ints(born_runs), len(keys))
            ids = None if code is None else NumberedIds(code, keys, list(unpack_ints(nths)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"operator {name!r}: logged results have a damaged column: "
                             f"{exc}") from exc
        if not len(keys) == len(aggregates) == len(firsts) == len(lasts) == len(born) or (
                ids is not None and len(ids) != len(keys)):
            raise ValueError(f"operator {name!r}: logged results have columns of "
                             "different lengths")
        return Batch(keys, list(zip(keys, firsts, lasts, aggregates)), lasts, born, ids)


_COUNT_RESULTS = "count window results"


def _pack_times(column: Sequence[float]) -> tuple[Any, int]:
    """A column of event times as the log keeps it: each item's bits XOR the one
    before's when all are floats (`columns.pack_float64_xor`), else as a frame packs it."""
    data = pack_float64_xor(column)
    return pack_column(column) if data is None else (data, FLOAT64_XOR)


class JoinOp(_WindowParts):
    """Windowed equi-join, emitted incrementally: each arriving record pairs with the
    other side's records of the same key already in each of its windows, so a pair is
    emitted once per window the two share, as soon as its second record arrives."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.windows = TimeWindows(node.params["spec"])
        self.overlapping = self.windows.slide != self.windows.size
        # window -> {key: ([a records], [b records])}, each record (value, ts, id)
        self.open: dict[int, dict[Any, tuple[list[tuple], list[tuple]]]] = {}
        self.pending: list[int] = []

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        return self.process_into(batch, map(self.windows.assign, batch.ts), input_index)

    def process_into(self, batch: Batch, parts: Iterable[Iterable[int]],
                     input_index: int = 0) -> Batch | None:
        if self.changed is not None:  # a window's whole table is its delta's unit
            parts = list(parts)
            self.changed.update(chain.from_iterable(parts))
        out = _Emitter(batch.ids is not None)
        open_, code = self.open, self.ctx.code
        left = input_index == 0
        ids = ids_of(batch.ids) if batch.ids is not None else repeat(None)
        for key, value, ts, born, rid, windows in zip(_keys_of(batch), batch.values, batch.ts,
                                                      batch.born, ids, parts):
            for k in windows:
                sides = open_.get(k)
                if sides is None:
                    sides = open_[k] = {}
                    heapq.heappush(self.pending, k)
                    if self.opened is not None:
                        self.opened.append(k)
                pair = sides.get(key)
                if pair is None:
                    pair = sides[key] = ([], [])
                mine, theirs = (pair[0], pair[1]) if left else (pair[1], pair[0])
                for other_value, other_ts, other_id in theirs:
                    if left:
                        joined, pair_id = (key, value, other_value), (code, rid, other_id, k)
                    else:
                        joined, pair_id = (key, other_value, value), (code, other_id, rid, k)
                    out.emit(key, joined, max(ts, other_ts), born, pair_id)
                mine.append((value, ts, rid))
        return out.batch()

    def on_watermark(self, watermark: float) -> Batch | None:
        windows, pending = self.windows, self.pending
        while pending and windows.end(pending[0]) <= watermark:
            k = heapq.heappop(pending)
            del self.open[k]
            if self.closed is not None:
                self.closed.append(k)
            if self.changed is not None:
                self.changed.add(k)  # removed: closed
        return None

    def snapshot(self) -> Any:
        # Each side's (value, ts, id) records as three columns: lists, not a tuple each.
        return {k: self.part_state(k) for k in self.open}

    def restore(self, state: Any) -> None:
        self.open = {k: _sides(sides) for k, sides in state.items()}
        self.pending = sorted(self.open)

    # Incremental checkpoints: the windows, each with its keys' records as they are
    # held — a window touched since the last checkpoint goes whole into the delta.
    def tables(self) -> list[dict]:
        return [self.open]

    def load_tables(self, tables: list[dict]) -> None:
        self.open, = tables
        self.pending = sorted(self.open)

    keyed = True

    def restore_keys(self, snapshots: list[Any], owns: Callable[[Any], bool]) -> None:
        windows: dict[int, dict] = {}
        for state in snapshots:
            for window, sides in state.items():
                mine = {k: columns for k, columns in sides.items() if owns(k)}
                if mine:
                    windows.setdefault(window, {}).update(mine)
        self.restore(windows)

    def part_state(self, part: Any) -> Any:
        return {key: [_columns(a), _columns(b)] for key, (a, b) in self.open[part].items()}

    opens_empty = True

    def empty_part_state(self) -> Any:
        return {}

    def load_part(self, part: Any, state: Any) -> None:
        self.open[part] = _sides(state)
        heapq.heappush(self.pending, part)


def _sides(state: dict) -> dict:
    """A window's sides from their columns (`JoinOp.snapshot`)."""
    return {key: (list(zip(*a)), list(zip(*b))) for key, (a, b) in state.items()}


def _columns(records: list[tuple]) -> list[list]:
    return [[r[0] for r in records], [r[1] for r in records], [r[2] for r in records]]


class UnionOp(Operator):
    """Passes every input through; the output is no longer keyed."""

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        if batch.ids is None:
            return batch
        return Batch(batch.keys, batch.values, batch.ts, batch.born,
                     union_ids(self.ctx.code, input_index, batch.ids))


class SourceOp(Operator):
    """Reads its share of a source, stamps event time and ``born``, tracks the watermark.

    ``born`` is when a record first arrived (`SourceReader.arrivals`: a paced
    generator's due time, a log's append time; the read time for unpaced sources), so
    a record replayed after a failure keeps the age it had and latency counts the
    outage. With a ``timestamp`` function the watermark trails the largest event time
    seen by ``max_out_of_orderness``; a record behind it (older than the watermark
    *before* it) is late and goes to the dead-letter output with reason ``"late"``.
    Deciding lateness here, per record in source order, makes it independent of
    batching and of timing, so a replayed run drops exactly the same records. Without
    a ``timestamp`` function event time is the ingest time — ``born``, held to the
    largest so far so that it never goes back — and nothing is late; a replay of a
    source with arrival times stamps the same event times again.
    """

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.reader = node.params["source"].open(ctx.index, ctx.parallelism)
        self.timestamp = node.params["timestamp"]
        self.out_of_orderness = node.params["max_out_of_orderness"]
        self.max_ts = -math.inf
        self.position = 0  # records read from the share: what lineage root ids count

    @property
    def watermark(self) -> float:
        return self.max_ts - self.out_of_orderness

    def poll(self, max_records: int, now_s: float) -> Batch | None:
        """The next batch (possibly empty), or None once this instance's share is read."""
        reader = self.reader
        try:
            values = reader.read(max_records, now_s)
        except _batches.ColumnLengthError as exc:  # a batch_fn's bug: fail the job
            raise UDFError(self.ctx.name, self.ctx.index, None, str(exc)) from None
        if values is None:
            return None
        n = len(values)
        ctx = self.ctx
        ids = root_ids(ctx.code, ctx.index, self.position, n) if ctx.lineage else None
        self.position += n
        born = reader.arrivals(n, now_s) if n else None
        if self.timestamp is None:
            if born is None:
                if n:
                    self.max_ts = max(self.max_ts, now_s)
                stamps = [now_s] * n  # shared: batches are never mutated
                return Batch(None, values, stamps, stamps, ids)
            return Batch(None, values, self._ingest_times(born), born, ids)
        return self._stamp(values, now_s if born is None else born, ids)

    def _ingest_times(self, born: list[float]) -> list[float]:
        """Event times without a ``timestamp`` function: ``born``, never behind an
        earlier record's (arrivals from several logs interleave); the same list when
        ``born`` is already in order."""
        ts = list(accumulate(born, max, initial=self.max_ts))
        del ts[0]
        self.max_ts = ts[-1]
        return born if ts == born else ts

    def _stamp(self, values: list, born: float | list[float], ids: IdRun | None) -> Batch:
        """Event times by the ``timestamp`` function, dropping late records; ``born``
        is one read time for all or one arrival time per record."""
        fn, ctx = self.timestamp, self.ctx
        max_ts, ooo = self.max_ts, self.out_of_orderness
        kept, stamps, positions = [], [], []
        for i, value in enumerate(values):
            try:
                ts = float(fn(value))
            except Exception as exc:  # noqa: BLE001
                ctx.dead_letter(value, exc, what="timestamp")
                continue
            if ts < max_ts - ooo:
                ctx.dead_letter(value, f"event time {ts} is behind the watermark "
                                       f"{max_ts - ooo}", reason="late")
                continue
            if ts > max_ts:
                max_ts = ts
            kept.append(value)
            stamps.append(ts)
            positions.append(i)
        self.max_ts = max_ts
        if ids is not None and len(positions) < len(ids):
            ids = ids.take(positions)
        if not isinstance(born, list):
            return Batch(None, kept, stamps, [born] * len(kept), ids)
        if len(positions) < len(born):
            born = [born[i] for i in positions]
        return Batch(None, kept, stamps, born, ids)

    def skip(self, position: int, batch_records: int) -> None:
        """Read on to ``position`` at once and drop what is read (a replay that starts
        there). Lateness and the watermark come out as if it had been processed: the
        skipped records go through the same per-record decision."""
        reader = self.reader
        while self.position < position:
            values = reader.read_backlog(min(batch_records, position - self.position))
            if values is None:
                return
            self.position += len(values)
            if not values:
                continue
            if self.timestamp is not None:
                self._stamp(values, time.time(), None)
            else:
                born = reader.arrivals(len(values), time.time())
                if born is not None:
                    self._ingest_times(born)

    def snapshot(self) -> Any:
        return [self.reader.state(), self.max_ts, self.position]

    def restore(self, state: Any) -> None:
        reader_state, self.max_ts, self.position = state
        self.reader.restore(reader_state)


class SinkOp(Operator):
    """Stages records in the sink writer (and, with lineage, their ids beside them);
    samples latency; counts records per second. The runtime takes what was staged at
    each commit point (`take_staged`, `take_parts`), and in between, once
    ``staged_records`` grows large, writes the staged records as a part of the commit
    point (`take_staged`, `add_part`): see `bastion.runtime.outputs`."""

    def __init__(self, node: OpNode, ctx: OperatorContext):
        super().__init__(node, ctx)
        self.writer = node.params["sink"].open(ctx.index, ctx.parallelism)
        self.latency = LatencyHistogram()
        self.timeline: dict[int, int] = {}
        # the latency samples of each wall-clock second, for real-time bounds per window
        self.latency_by_second: dict[int, LatencyHistogram] = {}
        self.keeps_ids = ctx.lineage and self.writer.keeps_values
        self.staged_ids: list = []
        self.staged_records = 0     # records held in memory since the last commit or part
        self.max_staged_records = 0
        self.parts: list[tuple[str, int, int]] = []  # the current commit point's (`part_ref`)
        self.spilled_parts = 0      # parts written in this attempt
        # Lineage ids this sink committed or staged, when a protocol has it drop a
        # record it already has (`deduplicate`); None: keep every record.
        self.seen: set | None = None
        self.duplicates_dropped = 0

    def deduplicate(self, committed_ids: Iterable[Any]) -> None:
        """From now on drop every record whose lineage id is in ``committed_ids`` or
        was staged since: a protocol that replays results downstream (CEC) relies on
        the sink to keep each one once."""
        self.seen = set(committed_ids)

    def take_staged(self) -> tuple[list, list | None]:
        """The values staged since the last commit point or part and, with lineage,
        their ids; the sink forgets them."""
        ids = None
        if self.keeps_ids:
            ids, self.staged_ids = self.staged_ids, []
        self.staged_records = 0
        return self.writer.take_staged(), ids

    def add_part(self, ref: tuple[str, int, int]) -> None:
        """Values taken by `take_staged` are stored as a part: the commit point's blob
        will list it."""
        self.parts.append(ref)
        self.spilled_parts += 1

    def take_parts(self) -> list[tuple[str, int, int]]:
        """The parts of the current commit point, stored before what `take_staged`
        returns now; the next commit point starts without any."""
        parts, self.parts = self.parts, []
        return parts

    def process(self, batch: Batch, input_index: int) -> Batch | None:
        if self.seen is not None and batch.values and batch.ids is not None:
            batch = self._drop_seen(batch)
        if not batch.values:
            return None
        now_s = time.time()
        values = batch.values
        if self.writer.keeps_values and type(values) is not list and type(values) is not tuple:
            values = list(values)  # a sink writer is handed a list (a column of words)
        self.writer.write(values)
        if self.writer.keeps_values:
            self.staged_records += len(batch.values)
            self.max_staged_records = max(self.max_staged_records, self.staged_records)
        if self.keeps_ids:
            ids = batch.ids
            assert ids is not None  # kept with lineage on, and then every batch has ids
            self.staged_ids.extend(ids_of(ids))
        second = int(now_s)
        window = self.latency_by_second.get(second)
        if window is None:
            window = self.latency_by_second[second] = LatencyHistogram()
        window.add_batch(batch.born, now_s)
        self.latency.add_batch(batch.born, now_s)
        self.timeline[second] = self.timeline.get(second, 0) + len(batch.values)
        return None


    def _drop_seen(self, batch: Batch) -> Batch:
        seen, ids = self.seen, batch.ids
        assert seen is not None and ids is not None  # `process` asks only with both
        add = seen.add
        kept = []
        for i, rid in enumerate(ids_of(ids)):
            if rid not in seen:
                add(rid)
                kept.append(i)
        if len(kept) < len(batch):
            self.duplicates_dropped += len(batch) - len(kept)
            batch = batch.take(kept)
        return batch


def make_operator(node: OpNode, ctx: OperatorContext) -> Operator:
    """The behaviour of a non-source, non-sink logical operator."""
    kind = node.kind
    if kind == "map":
        return MapBatchesOp(node, ctx) if "batch_format" in node.params else MapOp(node, ctx)
    if kind == "filter":
        return FilterBatchesOp(node, ctx) if "batch_format" in node.params else FilterOp(
            node, ctx)
    if kind == "flat_map":
        return FlatMapOp(node, ctx)
    if kind == "reduce" and "agg" in node.params:
        return AggregateFoldOp(node, ctx)
    if kind in ("reduce", "stateful_map"):
        return KeyedFoldOp(node, ctx)
    if kind == "window":
        if isinstance(node.params["spec"], window_specs.Count):
            return CountWindowOp(node, ctx)
        if type(node.params["agg"]) in _FOLD_KINDS:
            return FoldedWindowOp(node, ctx)
        return TimeWindowOp(node, ctx)
    if kind == "join":
        return JoinOp(node, ctx)
    if kind == "union":
        return UnionOp(node, ctx)
    if kind == "source":
        return SourceOp(node, ctx)
    if kind == "sink":
        return SinkOp(node, ctx)
    raise ValueError(f"operator {node.name!r}: no behaviour for kind {kind!r}")
