"""The file connector: JSON-lines files that ``bn.sinks.File`` writes, exactly once.

`FileWriter` is one sink instance's writer; `remove_outputs` clears what an earlier run
left. Both touch the file system, so they live here and not in the description
``bn.sinks.File``, which opens them when a job runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from bastion.io_interfaces import SinkWriter


def marker_path(path: Path) -> Path:
    """The commit marker beside output file ``path``."""
    return path.with_name(path.name + ".commit")


def remove_outputs(paths: Iterable[Path]) -> None:
    """Delete the output files ``paths`` and their commit markers: a run starts empty."""
    for path in paths:
        path.unlink(missing_ok=True)
        marker_path(path).unlink(missing_ok=True)


def json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"value of type {type(value).__name__} is not JSON serialisable")


class FileWriter(SinkWriter):
    """Appends each committed commit point to the file exactly once.

    Before it appends the values of commit point ``c`` the writer stores, in a
    sidecar file ``<path>.commit``, the marker "``c`` occupies bytes ``[start, end)``
    of the file" (write-ahead, like `bastion.connectors.logs.LogSinkWriter`), then
    appends and fsyncs. A crash anywhere in between leaves a marker that describes the
    file: a replayed ``apply(c)`` — by this writer or by the one a replacement worker
    opens — cuts the file back to ``start`` and writes ``c`` again, so a record
    half-written or written whole before the crash is never there twice. A commit older than the
    marker's was applied whole before the marker moved on and is skipped. Bytes past
    the marker's ``end`` belong to no complete commit and are cut off before the
    next commit is appended. Commits with no values change nothing and are not
    recorded.
    """

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.marker = marker_path(path)

    def _read_marker(self) -> tuple[int, int, int] | None:
        """The marker (commit, start, end), or None before the first commit."""
        try:
            doc = json.loads(self.marker.read_text())
        except FileNotFoundError:
            return None
        return int(doc["commit"]), int(doc["start"]), int(doc["end"])

    def _write_marker(self, commit: int, start: int, end: int) -> None:
        # tmp + fsync + rename: a crash leaves the old marker or the new one, whole.
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"commit": commit, "start": start, "end": end}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.marker)

    def apply(self, commit: int, values: list) -> None:
        if not values:
            return
        payload = "".join(json.dumps(v, default=json_default) + "\n"
                          for v in values).encode("utf-8")
        marker = self._read_marker()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = self.path.stat().st_size if self.path.exists() else 0
        if marker is not None and commit < marker[0]:
            return  # applied whole before the marker moved on
        if marker is not None and commit == marker[0]:
            start = marker[1]  # replayed: whatever of it reached the file is redone
        else:
            start = 0 if marker is None else marker[2]
        if marker != (commit, start, start + len(payload)):
            self._write_marker(commit, start, start + len(payload))
        if size < start:
            raise OSError(f"{self.path} ends at byte {size}, before the {start} bytes its "
                          f"commit marker {self.marker.name} accounts for: it was cut by "
                          "something other than this sink")
        with open(self.path, "r+b" if size else "wb") as f:
            f.truncate(start)
            f.seek(start)
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
