"""Sinks: where results leave a topology, exactly once.

A sink instance receives records and *stages* them; they become visible only when the
commit point covering them — a checkpoint, or the end of a bounded stream — is
complete. This is the two-phase commit that keeps outputs exactly-once: records
staged after the last complete checkpoint are thrown away on recovery and produced
again by the replay (see `bastion.runtime.outputs`).

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
    """One sink instance. It stages records (`write`); at each commit point the
    runtime takes what was staged (`take_staged`) and stores it durably; once the
    commit point is complete it calls `apply` with those records, in commit order,
    for sinks with an outside effect (a file). `apply` must be idempotent per commit
    point: after a failure it may be called again for a commit it already applied."""

    def __init__(self) -> None:
        self.staged: list = []

    def write(self, values: list) -> None:
        self.staged.extend(values)

    def take_staged(self) -> list:
        staged, self.staged = self.staged, []
        return staged

    def apply(self, commit: int, values: list) -> None:
        """Make the committed ``values`` of commit point ``commit`` visible outside."""


class Sink:
    def prepare(self, parallelism: int) -> None:
        """Called once per job before any instance opens (e.g. to truncate old output)."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        raise NotImplementedError


class Collect(Sink):
    """Keep committed values; `RunResult.outputs[name]` lists them."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return SinkWriter()

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
    """Appends each committed commit point once: a sidecar file ``<path>.commit``
    remembers the last commit point applied, so a replayed `apply` is skipped."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.marker = path.with_name(path.name + ".commit")

    def _last_applied(self) -> int:
        try:
            return int(self.marker.read_text())
        except (FileNotFoundError, ValueError):
            return -1

    def apply(self, commit: int, values: list) -> None:
        if commit <= self._last_applied():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if values:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(v, default=_json_default) + "\n" for v in values))
                f.flush()
                os.fsync(f.fileno())
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        tmp.write_text(str(commit))
        os.replace(tmp, self.marker)


class File(Sink):
    """Append committed values to a JSON-lines file (one file per instance)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).absolute()

    def prepare(self, parallelism: int) -> None:
        for index in range(parallelism):
            path = self.path_for(index, parallelism)
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".commit").unlink(missing_ok=True)

    def path_for(self, index: int, parallelism: int) -> Path:
        if parallelism == 1:
            return self.path
        return self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}")

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _FileWriter(self.path_for(index, parallelism))

    def __repr__(self) -> str:
        return f"File({str(self.path)!r})"
