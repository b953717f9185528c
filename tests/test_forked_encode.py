"""Large snapshots encoded in a forked child (`bastion.runtime.forked_encode`): the
child encodes the state as it was at the fork, whatever the parent does after; its
failures reach the task as errors, never as a stored blob; and real runs that encode
every snapshot that way — full and incremental, with a worker killed — stay exactly
once, or fail naming the operator whose state cannot be stored.

Real forks, real Ray, real kills, a real store (a local directory).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

import bastion as bn
from bastion.errors import UnstorableValueError
from bastion.runtime import forked_encode
from bastion.runtime.durable import DurableCodec
from protocol_knobs import with_interval

COLD = 600


@pytest.mark.internal
def test_the_child_encodes_the_state_as_it_was_at_the_fork():
    codec = DurableCodec()
    table = {i: i * i for i in range(50_000)}
    expected = codec.encode({"tables": [table]})
    forked = forked_encode.start(lambda: codec.encode({"tables": [table]}), "task t[0]")
    assert forked is not None, "fork is available on Linux"
    for i in range(0, 50_000, 7):  # the parent goes on changing its state
        table[i] = -1
    table["new"] = 1
    blob = asyncio.run(forked.result())
    assert bytes(blob) == expected
    assert codec.decode(bytes(blob), "blob")["tables"][0] == {i: i * i for i in range(50_000)}
    assert forked.cpu_s > 0


@pytest.mark.internal
def test_a_value_no_codec_stores_is_the_loops_own_error():
    def encode():
        raise UnstorableValueError("sum", 1, "_thread.lock", "its state cannot be stored",
                                   "no codec")

    forked = forked_encode.start(encode, "task sum[1]")
    with pytest.raises(UnstorableValueError) as caught:
        forked.collect()
    assert (caught.value.operator, caught.value.index, caught.value.type_name) == (
        "sum", 1, "_thread.lock")


@pytest.mark.internal
@pytest.mark.parametrize("how,message", [
    ("killed", "was killed by signal 9"),
    ("exits", "exited with status 3"),
    ("raises", "ZeroDivisionError"),
])
def test_a_child_that_fails_delivers_no_blob(how, message):
    def encode():
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "exits":
            os._exit(3)
        return 1 / 0

    forked = forked_encode.start(encode, "task t[0]")
    with pytest.raises(forked_encode.ForkedEncodeError, match=message):
        forked.collect()


@pytest.mark.internal
def test_an_encode_dropped_unread_leaves_no_child_behind():
    forked = forked_encode.start(lambda: b"x" * (1 << 20), "task t[0]")
    pid, fd = forked.pid, forked.fd
    del forked  # its checkpoint abandoned before the upload began
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)  # still there (or a zombie not reaped yet)
        except ProcessLookupError:
            with pytest.raises(OSError):
                os.fstat(fd)  # its file closed
            return
        time.sleep(0.05)
    pytest.fail(f"the child {pid} was not reaped")


def test_fork_min_keys_is_checked_where_made():
    # by default only incremental bases of a million keys or more are forked
    assert bn.State().fork_at_keys is None
    assert bn.State(incremental=True).fork_at_keys == 1_000_000
    assert bn.State(incremental=True, fork_min_keys=None).fork_at_keys is None
    assert bn.State(fork_min_keys=500_000).fork_at_keys == 500_000
    assert bn.State(fork_min_keys=None).fork_at_keys is None
    for wrong in (0, -1, True, 2.5, "always", "1000"):
        with pytest.raises(ValueError, match="fork_min_keys must be an int >= 1, None or"):
            bn.State(fork_min_keys=wrong)


def hot_and_cold(count=4000, rate=2000, fold=lambda acc, i: acc + i, cold=COLD):
    """A keyed sum: the first ``cold`` records are each a key of their own, the rest go
    to 7 hot keys."""
    topo = bn.Topology("forked")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=count,
                                                          rate=rate))
    numbers.key_by(lambda i: i if i < cold else i % 7).reduce(
        "sum", fold, initial=0, parallelism=2).sink("out", bn.sinks.Collect())
    return topo


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_random_kills_stay_exactly_once_with_forked_snapshots(incremental, tmp_path):
    # every snapshot of more than 10 keys is encoded in a child: every full one, and
    # every incremental base — with one delta at most on a base, every other link
    # (deltas, the keys a growing state added among them, are encoded on the loop)
    report = bn.drill(hot_and_cold(cold=4000 if incremental else COLD),
                      protocol=with_interval("coordinated", interval_s=0.3),
                      faults=[bn.faults.RandomKills(count=1, between=(0.8, 1.6))], seed=3,
                      storage=f"local://{tmp_path}",
                      state=bn.State(incremental=incremental, max_chain=1,
                                     fork_min_keys=10))
    assert report.metrics.protocol.failures, "the kill must have forced a restart"
    assert report.metrics.extra["forked_encodes"] > 0, "no snapshot was encoded in a child"
    assert report.lost == 0, report.lost_examples
    assert report.duplicated == 0, report.duplicated_examples
    assert report.exactly_once, report.verdict_reason


@pytest.mark.usefixtures("ray_session")
def test_a_state_no_codec_stores_fails_the_job_naming_the_operator(tmp_path):
    def fold(acc, i):
        return threading.Lock() if i == 3000 else acc + i

    topo = bn.Topology("unstorable")
    numbers = topo.source("numbers", bn.sources.Generator(lambda i: i, count=6000,
                                                          rate=2000))
    numbers.key_by(lambda i: i if i < COLD else i % 7).reduce(
        "sum", fold, initial=0, parallelism=2).filter(
        "numbers-only", lambda kv: type(kv[1]) is int).sink("out", bn.sinks.Collect())
    with pytest.raises(UnstorableValueError) as caught:
        bn.run(topo,
               bn.protocols.Coordinated(interval_s=0.2), storage=f"local://{tmp_path}",
               state=bn.State(fork_min_keys=100))
    assert caught.value.operator == "sum"
    assert "lock" in caught.value.type_name
