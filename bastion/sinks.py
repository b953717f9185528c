"""Sinks: where results leave a topology, exactly once.

A sink instance receives records and *stages* them; they become visible only when the
commit point covering them — a checkpoint, or the end of a bounded stream — is
complete. This is the two-phase commit that keeps outputs exactly-once: records
staged after the last complete checkpoint are thrown away on recovery and produced
again by the replay (see `bastion.runtime.outputs`).

- ``Collect()`` keeps committed values in memory; `RunResult.outputs[name]` lists them,
  in order per sink instance, instances in index order.
- ``File(path)`` appends committed values as JSON lines, each commit point once even
  when a crash interrupts the append (a marker written ahead says which bytes it
  owns); with parallelism > 1 instance ``i`` writes ``<stem>-<i><suffix>``.
- ``Discard()`` only counts (for benchmarks).
- ``Log(url)`` appends committed values to a segmented log in an object store
  (`bastion.storage.log`), which ``bn.sources.Log(url)`` reads back.

What `RunResult.outputs[name]` holds depends on where the records go. A ``Collect``
sink's are a list, in the driver's memory. A ``File`` or ``Log`` sink's records live
outside the job, perhaps far more of them than the driver could hold, so its outputs
are *lazy* (``lazy_outputs``): a `bastion.runtime.outputs.CommittedOutputs`, a
read-only sequence whose ``len()`` comes from the commit records and whose records
are streamed from the job's store as they are iterated or indexed.

The classes here are descriptions, part of the DSL: building one does no I/O and
imports nothing of storage. The writers that touch files and stores are connectors
(`bastion.connectors`), which ``prepare`` and ``open`` load when a job runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# SinkWriter is defined in bastion.io_interfaces, which the connectors import without
# importing this module back; the public name stays bastion.sinks.SinkWriter.
from bastion.io_interfaces import SinkWriter  # noqa: F401 - re-exported


class Sink:
    # True for sinks whose records leave the job (files, logs): `bn.run` then does not
    # read their committed records into the driver, and `RunResult.outputs[name]` is a
    # lazy view of them in the store (`bastion.runtime.outputs.CommittedOutputs`).
    lazy_outputs = False

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
    keeps_values = False

    def write(self, values: list[Any]) -> None:
        pass


class Discard(Sink):
    """Drop every value; the run's metrics still count them."""

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _DiscardWriter()

    def __repr__(self) -> str:
        return "Discard()"


class File(Sink):
    """Append committed values to a JSON-lines file (one file per instance), each
    commit point exactly once (see `bastion.connectors.files.FileWriter`);
    ``<path>.commit`` beside it is the sink's commit marker."""

    lazy_outputs = True

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).absolute()

    def prepare(self, parallelism: int) -> None:
        from bastion.connectors.files import remove_outputs  # I/O: at run time only

        remove_outputs(self.path_for(index, parallelism) for index in range(parallelism))

    def path_for(self, index: int, parallelism: int) -> Path:
        if parallelism == 1:
            return self.path
        return self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}")

    def open(self, index: int, parallelism: int) -> SinkWriter:
        from bastion.connectors.files import FileWriter  # I/O: at run time only

        return FileWriter(self.path_for(index, parallelism))

    def __repr__(self) -> str:
        return f"File({str(self.path)!r})"


# --------------------------------------------------------------------------- logs


def _normalise_log_url(url: str, what: str) -> str:
    """Check a log URL's scheme (no I/O) and make a ``local://`` path absolute, so the
    URL means the same directory in every worker process, whatever its cwd."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"{what}: {url!r} is not a store URL; use local://PATH or "
                         "s3://BUCKET/PREFIX?endpoint=HOST:PORT")
    parts = urlsplit(url)
    if parts.scheme.lower() == "local":
        path = os.path.abspath(os.path.expanduser(parts.netloc + parts.path))
        return f"local://{path}" + (f"?{parts.query}" if parts.query else "")
    if parts.scheme.lower() != "s3":
        raise ValueError(f"{what}: unknown scheme {parts.scheme!r} in {url!r}; use "
                         "local://PATH or s3://BUCKET/PREFIX?endpoint=HOST:PORT")
    return url


class Log(Sink):
    """Append committed values to a segmented log in an object store, exactly once.

    ``url`` names the log's home, a store URL (``local://PATH`` or
    ``s3://BUCKET/PREFIX?endpoint=HOST:PORT``) used by nothing else: the store opened
    at that URL holds only this log. With parallelism 1 the sink writes one log at
    the root of that store, which any ``LogReader(open_store(url), "")`` reads; with
    parallelism ``p > 1`` instance ``i`` writes the sub-log ``<i>/``. The object
    ``layout`` records ``p`` so that ``bn.sources.Log(url)`` reads the sink's output
    back at any parallelism.

    Each record is ``(seq, ts, value)``: ``value`` is the committed value (it must be
    msgpack-serialisable; msgpack arrays come back as tuples) and ``ts`` the wall-clock
    time, in seconds, at which its commit point was applied — keep event time in the
    value if a reader needs it. Values become records only when their commit point is
    complete, each commit point exactly once (see `bastion.connectors.logs`): a marker
    object ``commit`` per log, written before the append, lets a replayed commit point
    append only what is missing. Credentials for ``s3://`` come from the workers'
    environment, as for the job's own storage.

    ``prepare`` (once per job, before any instance opens) deletes the log objects a
    previous run left at ``url`` and writes ``layout``: a rerun starts from an empty
    log, as ``File`` truncates its file. It refuses to touch a URL holding objects that
    are not part of a log, so a typo cannot wipe unrelated data.
    """

    lazy_outputs = True

    def __init__(self, url: str):
        self.url = _normalise_log_url(url, "bn.sinks.Log")

    def prepare(self, parallelism: int) -> None:
        from bastion.connectors.logs import prepare_log  # I/O: at run time only

        prepare_log(self.url, parallelism, repr(self))

    def open(self, index: int, parallelism: int) -> SinkWriter:
        from bastion.connectors.logs import LogSinkWriter, sub_log_prefix

        return LogSinkWriter(self.url, sub_log_prefix(index, parallelism),
                             f"sink {self!r} (instance {index})")

    def __repr__(self) -> str:
        return f"Log({self.url!r})"


__all__ = ["Collect", "Discard", "File", "Log", "SinkWriter"]
