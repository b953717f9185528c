"""Sinks: where results leave a topology, exactly once.

A sink instance receives records and *stages* them; it only exposes them when told to
``commit`` — by the fault-tolerance protocol once the checkpoint covering them is
complete, or at the end of a bounded stream. This is the two-phase commit that keeps
outputs exactly-once: records staged after the last complete checkpoint are thrown
away on recovery (``abort``) and produced again by the replay.

- ``Collect()`` keeps committed values in memory; `RunResult.outputs[name]` lists them,
  in order per sink instance, instances in index order.
- ``File(path)`` appends committed values as JSON lines; with parallelism > 1 instance
  ``i`` writes ``<stem>-<i><suffix>``.
- ``Discard()`` only counts (for benchmarks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class SinkWriter:
    """One sink instance: stage, commit, abort."""

    def write(self, values: list) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        """Expose everything staged so far."""

    def abort(self) -> None:
        """Forget everything staged since the last commit."""

    def committed(self) -> list | None:
        """The committed values kept in memory, or None for sinks that keep none."""
        return None

    def close(self) -> None:
        pass


class Sink:
    def prepare(self, parallelism: int) -> None:
        """Called once per job before any instance opens (e.g. to truncate old output)."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        raise NotImplementedError


class _CollectWriter(SinkWriter):
    def __init__(self) -> None:
        self.staged: list = []
        self.done: list = []

    def write(self, values: list) -> None:
        self.staged.extend(values)

    def commit(self) -> None:
        self.done.extend(self.staged)
        self.staged = []

    def abort(self) -> None:
        self.staged = []

    def committed(self) -> list:
        return self.done


class Collect(Sink):
    """Keep committed values in memory and return them in `RunResult.outputs`."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _CollectWriter()

    def __repr__(self) -> str:
        return "Collect()"


class _DiscardWriter(SinkWriter):
    def write(self, values: list) -> None:
        pass


class Discard(Sink):
    """Drop every value; the run's metrics still count them."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _DiscardWriter()

    def __repr__(self) -> str:
        return "Discard()"


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"value of type {type(value).__name__} is not JSON serialisable")


class _FileWriter(SinkWriter):
    def __init__(self, path: Path):
        self.path = path
        self.staged: list[str] = []

    def write(self, values: list) -> None:
        self.staged.extend(json.dumps(v, default=_json_default) for v in values)

    def commit(self) -> None:
        if not self.staged:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(self.staged) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.staged = []

    def abort(self) -> None:
        self.staged = []


class File(Sink):
    """Append committed values to a JSON-lines file (one file per instance)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).absolute()

    def prepare(self, parallelism: int) -> None:
        for index in range(parallelism):
            self.path_for(index, parallelism).unlink(missing_ok=True)

    def path_for(self, index: int, parallelism: int) -> Path:
        if parallelism == 1:
            return self.path
        return self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}")

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _FileWriter(self.path_for(index, parallelism))

    def __repr__(self) -> str:
        return f"File({str(self.path)!r})"
