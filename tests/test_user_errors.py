"""User errors the first-user tour of issue 36 met, each as a user meets it: one line on
stderr naming what is wrong and what to do, exit 2, no traceback, no terminal colour
codes — or, where the README promises a way around, that way taken.

- a ``stateful_map`` state holding a lock (made by the function, or the initial state
  itself), and sink records holding one: a value no codec stores names the operator
  and the type (`bastion.errors.UnstorableValueError`), exit 2;
- ``--resume-from`` a CEC job whose stored eventual checkpoint is damaged falls back to
  the log, and one whose log is damaged (what ``bastion reconstruct`` reports "not
  loaded") starts that instance from nothing with a full replay: the run succeeds and
  says, in one warning line each, what it set aside;
- a message from the library names ``bastion.run``'s keywords; on the command line it
  names the flags (``--protocol cec``, ``--resume-from``), and a job master's error
  reaches the driver without Ray's colour codes;
- a worker's unexpected error (here a user codec that raises) fails the job (exit 1)
  in one line, its traceback kept in `JobFailedError.details` for a bug report.

The errors found before anything runs are checked in-process with nothing started;
those that need a running job share the session's Ray and run jobs of a second or
less. (Ctrl-C, exit 130, and the many usage errors of flags are in test_cli.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bastion as bn
from bastion.cli import EXIT_JOB_FAILED, EXIT_OK, EXIT_USAGE, as_flags, main
from bastion.errors import UnstorableValueError
from bastion.protocols import eventual
from bastion.protocols.cec import resumed_state
from bastion.storage import LogWriter, open_store

PROGRESS = re.compile(r"^\[ *\w+\] ")  # a progress line, not a message
RUNNING = re.compile(r"job \S+ running \(`bastion stop ")


def cli(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exit_info:
        return exit_info.code


def messages(err: str) -> list[str]:
    """The lines of stderr that are messages (progress lines, and the line naming a
    running job for `bastion stop`, left out), each checked for what no message may
    hold."""
    assert "Traceback" not in err and "\x1b[" not in err, err
    return [line for line in err.splitlines() if line.strip() and not PROGRESS.match(line)
            and not RUNNING.match(line)]


def assert_one_line(err: str, pattern: str) -> str:
    lines = messages(err)
    assert len(lines) == 1, err
    assert lines[0].startswith("bastion: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def job_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text("import threading\nimport bastion as bn\n\n"
                    "topology = bn.Topology('user-errors')\n"
                    "nums = topology.source('nums', bn.sources.Generator(\n"
                    "    lambda i: i, count=600, rate=2000))\n" + body)
    return str(path)


KEYED_SUM = ("nums.key_by(lambda i: i % 3).reduce('sum', lambda acc, i: acc + i,\n"
             "    initial=0, parallelism=2).sink('out', bn.sinks.Collect())\n")
STATELESS = "nums.map('square', lambda i: i * i).sink('out', bn.sinks.Collect())\n"
CYCLE = ("step = nums.map('step', lambda x: x)\nstep.sink('out', bn.sinks.Collect())\n"
         "topology.feedback(step, 'step')\n")


# -- found before anything runs: no Ray ---------------------------------------------------


@pytest.mark.parametrize("body,argv,pattern", [
    # resume from a job the storage does not hold: the flags, not resume_from=...
    (KEYED_SUM, ["--protocol", "coordinated", "--resume-from", "old-job"],
     r"cannot resume from job 'old-job': storage local://\S+ holds no job 'old-job'"),
    (KEYED_SUM, ["--protocol", "cec", "--resume-from", "no-such-job"],
     r"cannot resume from job 'no-such-job': storage local://\S+ holds no job "
     r"'no-such-job'"),
    # the protocol's own check, worded in keywords by the library
    (STATELESS, ["--protocol", "acks", "--ack-timeout", "1", "--checkpoint-interval", "2"],
     r"--ack-timeout 1 must be longer than its --checkpoint-interval 2: sinks acknowledge"),
    (CYCLE, ["--protocol", "coordinated", "--checkpoint-interval", "1"],
     r"closes a cycle.*use --protocol uncoordinated or cic$"),
])
def test_refusals_before_a_run_name_flags(body, argv, pattern, tmp_path, capsys):
    assert cli("run", job_file(tmp_path, body), *argv,
               "--storage", f"local://{tmp_path}/s") == EXIT_USAGE
    line = assert_one_line(capsys.readouterr().err, pattern)
    assert "resume_from" not in line and "protocol='" not in line


def test_keywords_become_flags_and_colour_codes_go():
    assert as_flags("use protocol='uncoordinated' or 'cic'") == \
        "use --protocol uncoordinated or cic"
    assert as_flags("resume_from='j': no") == "--resume-from j: no"
    # an options object's field is the flag that sets it, its parenthesis included
    assert as_flags("Acks(timeout_s=0.5) must be longer than its interval_s=1: x") == \
        "--ack-timeout 0.5 must be longer than its --checkpoint-interval 1: x"
    assert as_flags("interval_s=AutoInterval(…): no fit") == "--checkpoint-interval auto: no fit"
    assert as_flags("AutoInterval(trt_bound_s=9) contradicts") == "--trt-bound 9 contradicts"
    # a field no flag sets, or a protocol's own knob inside its object, stays
    assert as_flags("Redundancy(dedup_window_s=0.6) and Coordinated(interval_s=2)") == \
        "Redundancy(dedup_window_s=0.6) and Coordinated(interval_s=2)"
    assert as_flags("\x1b[36mray::JobHost.run()\x1b[39m failed") == "ray::JobHost.run() failed"
    # prose that merely names a keyword stays as it is
    assert as_flags("pass duration_s to bn.run") == "pass duration_s to bn.run"


@pytest.mark.internal
def test_a_job_masters_error_reaches_the_driver_without_colour_codes():
    import ray

    from bastion.launcher import _master_error
    from bastion.storage import CorruptRecordError

    damaged = CorruptRecordError("eventual checkpoint 'k' fails its CRC32 check",
                                 key="k", offset=0)
    wrapped = ray.exceptions.RayTaskError("JobHost.run", "\x1b[36mTraceback ...", damaged)
    assert _master_error(wrapped, "j-1") is damaged  # ours: its own one-line message
    crashed = ray.exceptions.RayTaskError("JobHost.run", "Traceback ...",
                                          RuntimeError("\x1b[31mx\x1b[0m\nmore"))
    error = _master_error(crashed, "j-1")
    assert isinstance(error, bn.JobFailedError) and error.job_id == "j-1"
    assert str(error) == "job j-1 failed: its job master raised RuntimeError: x"


# -- resuming from damaged state: the README's fallback ---------------------------------


def _flip(store, key: str, at: int) -> None:
    data = bytearray(store.get(key))
    data[at] ^= 0xFF
    store.put(key, bytes(data))


def _log(store, prefix: str) -> list[str]:
    """A small log of one part's footprints and results, flushed as several parts."""
    writer = LogWriter(store, prefix)
    for i in range(6):
        writer.append(float(i), eventual.footprint(
            eventual.G_OPEN if i == 0 else eventual.G_CHECK, b"k", b"%d" % i, 1,
            {"nums/0": i}, 0.0))
        writer.append(float(i), eventual.result(b"r%d" % i))
        writer.flush()
    return sorted(k for k in store.list(prefix))


def test_a_damaged_stored_checkpoint_is_set_aside_for_the_log(tmp_path):
    store = open_store(f"local://{tmp_path}")
    _log(store, eventual.log_prefix("old", "sum", 0))
    from_log, _ = eventual.read_eventual_checkpoint(store, eventual.log_prefix("old", "sum", 0))
    key = eventual.store_eventual_checkpoint(store, eventual.eventual_prefix("old", "sum", 0),
                                             from_log)
    assert resumed_state(store, "old", "sum", 0).set_aside is None
    _flip(store, key, 12)
    state = resumed_state(store, "old", "sum", 0)
    assert state.ec.to_wire() == from_log.to_wire()
    assert len(state.results) == 6
    assert key in state.set_aside and "read from its log instead" in state.set_aside


def test_a_damaged_log_starts_the_instance_from_nothing(tmp_path):
    store = open_store(f"local://{tmp_path}")
    keys = _log(store, eventual.log_prefix("old", "sum", 0))
    part = next(k for k in keys if "/part-" in k)
    _flip(store, part, len(store.get(part)) // 2)
    state = resumed_state(store, "old", "sum", 0)
    # nothing of the damaged log: replay everything (the coordinator reads seq -1 so)
    assert not state.ec.complete and state.ec.seq == -1 and state.results == []
    assert part in state.set_aside and "replay everything" in state.set_aside


# -- found as the job runs: the session's Ray ----------------------------------------------


LOCK_IN_STATE = ("def step(state, value):\n    return threading.Lock(), value\n"
                 "nums.key_by(lambda i: i % 2).stateful_map('locked', step, None).sink(\n"
                 "    'out', bn.sinks.Collect())\n")


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("body,protocol,pattern", [
    # the function's state holds a lock: found at the first checkpoint ...
    (LOCK_IN_STATE, "coordinated",
     r"^bastion: operator 'locked' \(instance 0\): its state cannot be stored: cannot "
     r"serialise a value of type lock: .*register a codec"),
    # ... or, under cec, as its first footprint is logged
    (LOCK_IN_STATE, "cec",
     r"^bastion: operator 'locked' \(instance 0\): its state cannot be logged: cannot "
     r"serialise a value of type lock"),
    # the initial state is a lock: found as the topology is sent to the workers
    ("nums.key_by(lambda i: i % 2).stateful_map('locked', lambda s, v: (s, v),\n"
     "    threading.Lock()).sink('out', bn.sinks.Collect())\n", "coordinated",
     r"^bastion: operator 'locked': its initial state holds a value of type "
     r"_thread.lock, which cannot be sent to the worker processes"),
])
def test_a_state_holding_a_lock_is_one_line_and_exit_2(body, protocol, pattern, tmp_path,
                                                       capsys):
    assert cli("run", job_file(tmp_path, body), "--protocol", protocol,
               "--checkpoint-interval", "0.1", "--storage",
               f"local://{tmp_path}/s") == EXIT_USAGE
    assert_one_line(capsys.readouterr().err, pattern)


@pytest.mark.usefixtures("ray_session")
def test_sink_records_holding_a_lock_fail_bn_run_naming_the_sink_and_type(tmp_path):
    topo = bn.Topology("lock-records")
    topo.source("nums", bn.sources.Collection(range(5))).map(
        "locks", lambda i: __import__("threading").Lock()).sink("out", bn.sinks.Collect())
    with pytest.raises(UnstorableValueError) as caught:
        bn.run(topo, storage=f"local://{tmp_path}")
    error = caught.value
    assert (error.operator, error.kind, error.type_name) == ("out", "sink", "lock")
    assert isinstance(error, bn.JobFailedError) and error.job_id.startswith("lock-records-")
    assert str(error).startswith("sink 'out' (instance 0): its records cannot be stored: "
                                 "cannot serialise a value of type lock")


@pytest.mark.usefixtures("ray_session")
def test_resume_from_damaged_state_falls_back_and_says_so(tmp_path, capsys):
    """The earlier job's instance 0 has a damaged stored EC (its log is read instead),
    instance 1 a damaged log (it starts from nothing): the resumed job runs, commits
    every output, and warns once per instance in one line."""
    from bastion.runtime.durable import DurableCodec

    store = open_store(f"local://{tmp_path}/s")
    # instance 0 logged only the closing of a part no input of this job has (the
    # state a resumed job loads must decode): its EC is complete and empty
    writer = LogWriter(store, eventual.log_prefix("old", "sum", 0))
    writer.append(0.0, eventual.closed([DurableCodec(()).pack("no-such-key")], 0, {}, 0.0))
    writer.flush()
    ec, _ = eventual.read_eventual_checkpoint(store, eventual.log_prefix("old", "sum", 0))
    assert ec.complete and ec.seq == 0
    stored = eventual.store_eventual_checkpoint(store, eventual.eventual_prefix("old", "sum", 0),
                                                ec)
    _flip(store, stored, 12)
    damaged = next(k for k in _log(store, eventual.log_prefix("old", "sum", 1))
                   if "/part-" in k)
    _flip(store, damaged, len(store.get(damaged)) // 2)
    assert cli("run", job_file(tmp_path, KEYED_SUM), "--protocol", "cec",
               "--checkpoint-interval", "0.2", "--resume-from", "old",
               "--storage", f"local://{tmp_path}/s") == EXIT_OK
    captured = capsys.readouterr()
    assert "out: 600 committed records" in captured.out
    first, second = messages(captured.err)
    assert first.startswith("bastion: warning: resuming job old: sum[0]: ")
    assert stored in first and "read from its log instead" in first
    assert second.startswith("bastion: warning: resuming job old: sum[1]: its log is "
                             "damaged") and damaged in second


@pytest.mark.usefixtures("ray_session")
def test_a_workers_unexpected_error_is_one_line_and_its_traceback_a_detail(tmp_path, capsys):
    """A user's codec that raises: the job fails (exit 1) in one line naming the
    error; the worker's traceback is kept in `JobFailedError.details`, not shown."""
    body = ("class Point:\n    pass\n\n"
            "def encode(point):\n    raise ValueError('Point has no encoding yet')\n\n"
            "topology.register_codec(Point, 5, encode, lambda data: Point())\n"
            "nums.map('point', lambda i: Point()).sink('out', bn.sinks.Collect())\n")
    job = job_file(tmp_path, body)
    assert cli("run", job, "--storage", f"local://{tmp_path}/s") == EXIT_JOB_FAILED
    assert_one_line(capsys.readouterr().err,
                    r"failed: .*ValueError\('Point has no encoding yet'\)$")
    from bastion.cli import load_topology

    with pytest.raises(bn.JobFailedError) as caught:
        bn.run(load_topology(job), storage=f"local://{tmp_path}/s")
    assert "Traceback" not in str(caught.value)
    assert caught.value.details.startswith("Traceback (most recent call last):")
    assert "Point has no encoding yet" in caught.value.details
