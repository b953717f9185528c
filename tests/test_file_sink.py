"""bn.sinks.File applies each commit point exactly once, whatever the crash.

The runtime re-applies committed commit points after a failure (`SinkWriter.apply`
must be idempotent). These tests crash a writer in the middle of an apply — after
its records reached the file, before the apply returned — and replay the commit
with a fresh writer, as the replacement worker does, then read the file back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import bastion as bn


class Crash(Exception):
    """Stands for the worker process dying at this point."""


def crash_when_data_is_synced(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make the next fsync of ``path`` itself (not of its marker) raise: the records
    are in the file, nothing after the append has run."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            monkeypatch.setattr(os, "fsync", real_fsync)  # one crash only
            raise Crash()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def open_writer(sink: bn.sinks.File):
    return sink.open(0, 1)


def test_a_crash_between_the_append_and_the_marker_does_not_duplicate(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    sink = bn.sinks.File(path)
    sink.prepare(1)
    open_writer(sink).apply(1, ["a", "b"])

    crash_when_data_is_synced(monkeypatch, path)
    with pytest.raises(Crash):
        open_writer(sink).apply(2, ["c", "d", "e"])
    assert lines(path)[-1] == "e", "the crash came after the records reached the file"

    replacement = open_writer(sink)
    replacement.apply(1, ["a", "b"])        # the runtime replays every committed commit
    replacement.apply(2, ["c", "d", "e"])
    replacement.apply(3, ["f"])
    assert lines(path) == ["a", "b", "c", "d", "e", "f"]


def test_a_torn_append_is_cut_back_and_written_again(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    sink = bn.sinks.File(path)
    sink.prepare(1)
    open_writer(sink).apply(1, [{"n": 1}])
    crash_when_data_is_synced(monkeypatch, path)
    with pytest.raises(Crash):
        open_writer(sink).apply(2, [{"n": 2}, {"n": 3}])
    # Only part of the append survived the crash: the file ends inside a line.
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 5])

    open_writer(sink).apply(2, [{"n": 2}, {"n": 3}])
    assert lines(path) == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_replayed_complete_commits_change_nothing(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = bn.sinks.File(path)
    sink.prepare(1)
    writer = open_writer(sink)
    writer.apply(1, [1, 2])
    writer.apply(2, [3])
    again = open_writer(sink)
    again.apply(1, [1, 2])
    again.apply(2, [3])
    assert lines(path) == [1, 2, 3]


def test_bytes_past_the_last_complete_commit_are_cut_before_the_next(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = bn.sinks.File(path)
    sink.prepare(1)
    open_writer(sink).apply(1, ["x"])
    with open(path, "a", encoding="utf-8") as f:
        f.write('"half')  # no commit owns these bytes
    open_writer(sink).apply(2, ["y"])
    assert lines(path) == ["x", "y"]


def test_empty_commits_write_nothing(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = bn.sinks.File(path)
    sink.prepare(1)
    writer = open_writer(sink)
    writer.apply(1, [])
    assert not path.exists()
    writer.apply(2, ["z"])
    writer.apply(3, [])
    assert lines(path) == ["z"]
