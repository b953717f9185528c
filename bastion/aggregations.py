"""Aggregations for windows: how the records of one key in one window become a result.

An aggregation is any object with four methods:

- ``create()`` → a fresh accumulator,
- ``add(acc, value)`` → the accumulator with one more value folded in,
- ``merge(a, b)`` → two accumulators combined (for partial aggregates),
- ``result(acc)`` → what the window emits.

Accumulators must be values msgpack can carry (they are part of a checkpoint). The
built-ins take an optional ``fn`` that extracts the number to aggregate from a value.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

# For a type checker: an aggregation reads values (V), folds them into an accumulator
# (A) and emits a result (R). It consumes V and produces R, hence the variances.
V_contra = TypeVar("V_contra", contravariant=True)
A = TypeVar("A")
R_co = TypeVar("R_co", covariant=True)


@runtime_checkable
class Aggregation(Protocol[V_contra, A, R_co]):
    """What a window aggregate needs; ``Aggregation[V, A, R]`` to a type checker."""

    def create(self) -> A: ...
    def add(self, acc: A, value: V_contra) -> A: ...
    def merge(self, a: A, b: A) -> A: ...
    def result(self, acc: A) -> R_co: ...


def _identity(value: Any) -> Any:
    return value


class Count:
    """Number of records."""

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, acc: int) -> int:
        return acc


class Sum:
    """Sum of ``fn(value)`` (of the value itself without ``fn``)."""

    def __init__(self, fn: Callable[[Any], Any] | None = None):
        self.fn = fn or _identity

    def create(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + self.fn(value)

    def merge(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, acc: Any) -> Any:
        return acc


class _Extreme:
    """Smallest or largest ``fn(value)``; ``None`` for an empty accumulator."""

    def __init__(self, fn: Callable[[Any], Any] | None, pick: Callable[[Any, Any], Any]):
        self.fn = fn or _identity
        self.pick = pick

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        x = self.fn(value)
        return x if acc is None else self.pick(acc, x)

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return self.pick(a, b)

    def result(self, acc: Any) -> Any:
        return acc


class Min(_Extreme):
    """Smallest ``fn(value)``; ``None`` for an empty accumulator."""

    def __init__(self, fn: Callable[[Any], Any] | None = None):
        super().__init__(fn, min)


class Max(_Extreme):
    """Largest ``fn(value)``; ``None`` for an empty accumulator."""

    def __init__(self, fn: Callable[[Any], Any] | None = None):
        super().__init__(fn, max)


class Mean:
    """Arithmetic mean of ``fn(value)``; the accumulator is ``(sum, count)``."""

    def __init__(self, fn: Callable[[Any], Any] | None = None):
        self.fn = fn or _identity

    def create(self) -> tuple[Any, int]:
        return (0, 0)

    def add(self, acc: tuple[Any, int], value: Any) -> tuple[Any, int]:
        return (acc[0] + self.fn(value), acc[1] + 1)

    def merge(self, a: tuple[Any, int], b: tuple[Any, int]) -> tuple[Any, int]:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: tuple[Any, int]) -> float | None:
        return acc[0] / acc[1] if acc[1] else None


__all__ = ["Aggregation", "Count", "Max", "Mean", "Min", "Sum"]
