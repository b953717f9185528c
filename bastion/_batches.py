"""Batch functions: user code that takes and returns whole columns, not one record.

Bastion carries records in batches (`bastion.runtime.records.Batch`, a list per
field), and a per-record function (``map``, ``key_by``, a ``Generator``'s ``fn``) is
called once for each: in CPython that call, not the arithmetic in it, is most of
what such a function costs. A *batch function* is called once per batch instead, on
the batch's values as one column — a ``numpy`` array (``format="numpy"``) or a
``pyarrow`` array (``format="arrow"``, with pyarrow installed) — and returns one
column of results, a value per input value in the same order, which becomes records
again: a numpy column of ints is kept as its words (an `IntColumn`,
`bastion.runtime.columns`), which everything downstream reads as exact Python ints
while the data plane's kernels route, pack and fold it without an object per value;
any other numpy or arrow result is turned into Python values (``tolist()``,
``to_pylist()``), and anything else is taken as a sequence. The next batch function
is handed a writable copy of such a column's words, never an array rebuilt from
Python ints.

Everything after a batch function sees records, as before: lineage ids, dead
letters, deterministic mode, the protocols and drills work on them unchanged. So a
batch function must be *elementwise*: the result for a value depends on that value
alone, never on the others in its batch, because how a stream is cut into batches
depends on timing (a replay after a failure cuts it differently). Then a job gives
the same records whatever the batches were.

A batch function that raises is called again on each of its batch's values alone,
as a column of one, so that only the values it fails on are dead-lettered, as a
per-record function's would be. One that returns a column of another length than
its input is a bug of the job, not of a record: it fails the job with a `UDFError`
naming the operator, before anything made from that batch goes downstream.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Literal, Sequence

#: How a batch function sees a column: a numpy array or a pyarrow array.
BatchFormat = Literal["numpy", "arrow"]
FORMATS: tuple[str, ...] = ("numpy", "arrow")


class ColumnLengthError(Exception):
    """A batch function returned a column of another length than its input's."""


def check_format(format: str) -> str:
    """``format`` if it names a column format; else ValueError naming the choices."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(map(repr, FORMATS))}, "
                         f"got {format!r}")
    if format == "arrow":
        try:
            _pyarrow()
        except ImportError as exc:
            raise ValueError("format='arrow' needs pyarrow: pip install pyarrow") from exc
    return format


def to_column(values: Any, format: str) -> Any:
    """``values`` (a sequence or a numpy array) as a column of ``format``."""
    # imported here, as below: building a topology loads no runtime module
    from bastion.runtime.columns import IntColumn

    if type(values) is IntColumn:  # its words: a writable int64 copy, no ints made
        import numpy

        words = numpy.frombuffer(values, dtype=numpy.int64).copy()
        return words if format == "numpy" else _pyarrow().array(words)
    if format == "numpy":
        import numpy

        if type(values) in (list, tuple) and values:
            return _numbers_column(numpy, values)
        return numpy.asarray(values)
    return _pyarrow().array(values)


def _numbers_column(numpy: Any, values: Sequence[Any]) -> Any:
    """``numpy.asarray(values)`` — the same dtype and items — made fast when every
    value is an exact int that fits in 64 bits or every one an exact float: the frame
    codec's C packers (`bastion.runtime.columns`) check and pack them in one pass, a
    few ns a value where asarray's generic conversion takes 20-30."""
    from bastion.runtime.columns import pack_float64, pack_ints

    packed = pack_ints(values)
    if packed is not None:  # a width byte, then little-endian ints of that width
        narrow = numpy.frombuffer(packed, dtype=f"<i{packed[0]}", offset=1)
        return narrow.astype(numpy.int64)  # a copy: writable, int64 as asarray gives
    packed = pack_float64(values)
    if packed is not None:
        return numpy.frombuffer(packed, dtype="<f8").astype(numpy.float64)
    return numpy.asarray(values)


def _pyarrow() -> Any:
    """pyarrow, imported when a job asks for arrow columns (an optional dependency,
    without type stubs: imported by name)."""
    return importlib.import_module("pyarrow")


def from_column(column: Any, size: int, what: str) -> Sequence[Any]:
    """The Python values of ``column`` (a batch function's result), checked to be
    ``size`` of them — an `IntColumn` for a numpy column of ints, else a list;
    `ColumnLengthError` naming ``what`` made it otherwise."""
    if type(column).__module__ == "numpy" and getattr(column, "ndim", None) == 1:
        from bastion.runtime.columns import int_column

        words = int_column(column)  # None: not ints that fit in 64 bits
        if words is not None:
            if len(words) != size:
                raise ColumnLengthError(
                    f"{what} returned {len(words)} values for a batch of {size} values: "
                    "a batch function must return one value per input value")
            return words
    tolist = getattr(column, "tolist", None)  # numpy
    if tolist is None:
        tolist = getattr(column, "to_pylist", None)  # pyarrow
    try:
        out = tolist() if tolist is not None else list(column)
    except TypeError as exc:  # a scalar, None ...
        raise ColumnLengthError(f"{what} returned {type(column).__name__}, not a column "
                                f"of {size} values") from exc
    if type(out) is not list or len(out) != size:
        got = f"{len(out)} values" if type(out) is list else type(out).__name__
        raise ColumnLengthError(f"{what} returned {got} for a batch of {size} values: "
                                "a batch function must return one value per input value")
    return out


def apply(fn: Callable[[Any], Any], values: Sequence[Any], format: str, what: str,
          dead_letter: Callable[[Any, BaseException], None]
          ) -> tuple[list[int] | None, Sequence[Any]]:
    """``fn`` over ``values`` as one column: the positions that succeeded (None: all)
    and their results. When ``fn`` raises, each value is tried alone (a column of
    one) and those it raises on go to ``dead_letter``; `ColumnLengthError` passes
    through: it is the job's bug, not a record's."""
    try:
        column = fn(to_column(values, format))
    except Exception:  # noqa: BLE001 - find the values it fails on, one by one
        positions: list[int] = []
        results: list[Any] = []
        for i, value in enumerate(values):
            try:
                one = fn(to_column([value], format))
            except Exception as exc:  # noqa: BLE001 - a dead letter
                dead_letter(value, exc)
                continue
            results.extend(from_column(one, 1, what))
            positions.append(i)
        return positions, results
    return None, from_column(column, len(values), what)


class BatchKey:
    """A keyed edge's key function that computes a batch's keys as one column
    (``KeyedStream`` made by ``Stream.key_by_batch``). Called with one value it gives
    that value's key, so anything that keys a single record still can."""

    def __init__(self, fn: Callable[[Any], Any], format: str):
        self.fn = fn
        self.format = format

    def keys(self, values: Sequence[Any], dead_letter: Callable[[Any, BaseException], None]
             ) -> tuple[list[int] | None, Sequence[Any]]:
        """The keys of ``values`` (`apply`)."""
        return apply(self.fn, values, self.format, "the key_by_batch function", dead_letter)

    def __call__(self, value: Any) -> Any:
        return from_column(self.fn(to_column([value], self.format)), 1,
                           "the key_by_batch function")[0]

    def __repr__(self) -> str:
        return f"BatchKey({self.fn!r}, format={self.format!r})"
