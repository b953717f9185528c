"""The seam between the sources and sinks a topology describes and the connectors that do their I/O.

A source or sink has two halves. The *description* (``bn.sources.Log(url)``,
``bn.sinks.File(path)``) is part of the DSL: it holds a URL or a path, and building it
does no I/O. The *connector* (`bastion.connectors`) opens the store or the file when a
job runs. The two meet in the objects one instance of a job holds:

- `SourceReader` — one source instance's cursor: ``read``, ``seek``, its checkpointed
  ``state``, when its records first arrived (``arrivals``) and how far it fell behind
  (``lag``);
- `SinkWriter` — one sink instance: it stages what it is given and, once a commit
  point is complete, makes it visible outside (``apply``);
- `LogDescription` — what the log connector reads of a ``bn.sources.Log``: its URL and
  how it reads (``follow``, ``poll_interval_s``, ``with_ts``).

They live here, in a module of their own, so that the imports point one way (DESIGN
§3, ``tests/test_import_arrows.py``): a description's ``open`` imports its connector
when the job runs, and a connector imports these interfaces — never the descriptions
back. Were they still defined in ``bastion.sinks`` and ``bastion.sources``, a connector
would import the module that imports it, a circle that only the lazy import inside
``open`` kept from failing. This module is a description itself: it imports nothing of
ours, and nothing that does I/O. ``bastion.sinks.SinkWriter`` and
``bastion.sources.SourceReader`` remain the public names (re-exported there).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, Sequence


class SourceReader:
    """One instance's cursor over its share of a source."""

    offset: int
    #: Whether `read` may call the object store: its task then reads in a thread, so
    #: that a slow store never holds up the loop running the worker's other tasks.
    reads_store: bool = False

    def read(self, max_records: int, now_s: float) -> Sequence[Any] | None:
        raise NotImplementedError

    def arrivals(self, n: int, now_s: float) -> list[float] | None:
        """When each of the ``n`` records the last read returned first arrived, in
        wall-clock seconds, none later than ``now_s`` (that read's time): the same
        times whenever a record is read again. None (the default): at ``now_s``."""
        return None

    def read_backlog(self, max_records: int) -> Sequence[Any] | None:
        """The next records at once, whatever the pacing (a replay skipping what it
        already reflects); None once the share is read."""
        return self.read(max_records, math.inf)

    def seek(self, offset: int) -> None:
        self.offset = offset

    def state(self) -> Any:
        """What a checkpoint stores to resume this reader (by default, its offset)."""
        return self.offset

    def restore(self, state: Any) -> None:
        self.seek(state)

    def lag(self, now_s: float) -> int:
        """Records already due but not read yet (a paced source that fell behind)."""
        return 0


class SinkWriter:
    """One sink instance. It stages records (`write`); at each commit point the
    runtime takes what was staged (`take_staged`) and stores it durably; once the
    commit point is complete it calls `apply` with those records, in commit order,
    for sinks with an outside effect (a file). `apply` must be idempotent per commit
    point: after a failure it may be called again for a commit it already applied."""

    # False for writers that drop values (Discard): lineage ids are not kept for them.
    keeps_values = True

    def __init__(self) -> None:
        self.staged: list[Any] = []

    def write(self, values: list[Any]) -> None:
        self.staged.extend(values)

    def take_staged(self) -> list[Any]:
        staged, self.staged = self.staged, []
        return staged

    def apply(self, commit: int, values: list[Any]) -> None:
        """Make the committed ``values`` of commit point ``commit`` visible outside."""


class LogDescription(Protocol):
    """What `bastion.connectors.logs.LogSourceReader` reads of the ``bn.sources.Log``
    that opened it (its ``repr`` names the source in errors)."""

    @property
    def url(self) -> str: ...          # the log's home, a store URL (normalised)

    @property
    def follow(self) -> bool: ...      # unbounded: read on as records become durable

    @property
    def poll_interval_s(self) -> float: ...   # seconds between looks, once caught up

    @property
    def with_ts(self) -> bool: ...     # values come as (ts, value) pairs
