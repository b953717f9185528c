"""A sink that fails to apply a commit is asked again, and fails the job when it keeps
failing — naming the sink and the commit — instead of being ignored.

The sinks here write JSON lines to a file like `bn.sinks.File`, but their ``apply``
raises for the first calls (a transient fault: a full disk being cleaned, a network
share reconnecting) or for every call (a permanent one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bastion as bn
from bastion.errors import SinkCommitError
from bastion.sinks import Sink, SinkWriter

pytestmark = pytest.mark.usefixtures("ray_session")

COUNT = 2000
FAST_RETRIES = bn.Limits(commit_attempts=4, commit_backoff_s=0.01)


class _FlakyWriter(SinkWriter):
    """Appends each commit's values once; its first ``failures`` calls raise."""

    def __init__(self, path: Path, failures: int | None):
        super().__init__()
        self.path = path
        self.failures = failures       # None: every call raises
        self.calls = 0
        self.applied: set[int] = set()

    def apply(self, commit: int, values: list) -> None:
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise OSError(f"{self.path.name}: device not ready (call {self.calls})")
        if commit in self.applied:
            return
        with self.path.open("a") as f:
            f.writelines(json.dumps(v) + "\n" for v in values)
        self.applied.add(commit)


class FlakyFile(Sink):
    def __init__(self, directory: Path, failures: int | None):
        self.directory = directory
        self.failures = failures

    def open(self, index: int, parallelism: int) -> SinkWriter:
        return _FlakyWriter(self.directory / f"part-{index}.jsonl", self.failures)


def topology(directory: Path, failures: int | None) -> bn.Topology:
    topo = bn.Topology("flaky-sink")
    topo.source("numbers", bn.sources.Generator(lambda i: i, count=COUNT, rate=2000)) \
        .map("square", lambda i: i * i).sink("out", FlakyFile(directory, failures))
    return topo


def test_a_commit_that_fails_for_a_while_is_applied_after_retries(tmp_path):
    result = bn.run(topology(tmp_path, failures=2),
                    protocol=bn.protocols.Coordinated(interval_s=0.2),
                    storage=f"local://{tmp_path / 'store'}",
                    limits=FAST_RETRIES)
    expected = [i * i for i in range(COUNT)]
    written = [json.loads(line) for line in (tmp_path / "part-0.jsonl").open()]
    assert written == expected
    assert result.outputs["out"] == expected
    retried = [e for e in result.details["events"] if e["kind"] == "commit_retried"]
    assert retried and all(e["sinks"] == ["'out' [0]"] for e in retried)
    assert "device not ready" in retried[0]["error"]


@pytest.mark.parametrize("protocol", ["none", "coordinated"])
def test_a_commit_that_keeps_failing_fails_the_job_naming_the_sink(protocol, tmp_path):
    # under "none" the one commit is the end of the stream (the finish phase); under
    # "coordinated" the first checkpoint's (the watch phase)
    with pytest.raises(SinkCommitError) as failed:
        bn.run(topology(tmp_path, failures=None),
               protocol=(bn.protocols.Coordinated(interval_s=0.2)
                         if protocol == "coordinated" else protocol),
               storage=f"local://{tmp_path / 'store'}", limits=FAST_RETRIES)
    message = str(failed.value)
    assert "sink 'out' [0]" in message
    assert "after 4 attempts" in message
    assert "device not ready" in message
    assert ("end-of-stream commit" if protocol == "none" else "commit point") in message
