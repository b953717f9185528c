"""The command line as a new user meets it: a mistake is one line and exit code 2,
never a traceback; Ctrl-C is one line and 130; Ray's start-up notices stay out of the
terminal unless ``--verbose``; progress without a terminal is a line every few
seconds; ``run`` takes the protocol, checkpoint interval and storage; a local store
keeps its newest jobs, and ``bastion gc`` prunes any store.

Most tests call `bastion.cli.main` in-process with ``bn.run``/``bn.drill`` replaced by
a function that fails the test, which proves the error was found before anything ran.
The tests about what reaches the terminal run ``bastion`` as a real process, because
Ray writes its notices when it starts, once per process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bastion as bn
from bastion.cli import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_JOB_FAILED, EXIT_OK,
                         EXIT_USAGE, ProgressLine, build_parser, main)
from bastion.storage import LocalStore, list_jobs

BASTION = Path(sys.executable).with_name("bastion")

JOB = '''
import bastion as bn

topology = bn.Topology("cli-job")
nums = topology.source("nums", bn.sources.Generator(lambda i: i, count={count},
                                                    rate={rate}))
nums.map("square", lambda i: i * i, parallelism=2).sink("out", bn.sinks.Collect())
'''

BROKEN_JOBS = {
    # a typo in the topology: the sink is wired to an operator name that is taken
    "topology": ('import bastion as bn\n'
                 'topology = bn.Topology("t")\n'
                 's = topology.source("s", bn.sources.Collection([1]))\n'
                 's.sink("s", bn.sinks.Collect())\n',
                 r"job\.py line 4: operator name 's' is used twice"),
    "name": ('import bastion as bn\n'
             'topology = bn.Topology("t")\n'
             'topology.source("s", bn.sources.Colection([1]))\n',
             r"job\.py line 3: AttributeError: .*Colection.*fix the job file"),
    "syntax": ('import bastion as bn\ntopology = bn.Topology("t"\n',
               r"job\.py line \d: syntax error"),
    "none": ('x = 1\n', r"defines 0 Topology objects"),
}


def write_job(tmp_path: Path, count: int = 600, rate: int = 1000) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB.format(count=count, rate=rate))
    return path


@pytest.fixture
def nothing_runs(monkeypatch):
    """Starting a job fails the test: the error must be found first. (`bn.drill`
    stays real: it checks its fault targets, then calls `run`.)"""
    def no_run(*args, **kwargs):
        raise AssertionError("a job started")

    monkeypatch.setattr(bn, "run", no_run)
    monkeypatch.setattr("bastion.drills.run", no_run)  # what bn.drill's runs call


def cli(*argv: str) -> int:
    """`main` as the console script runs it: argparse's exits become exit codes."""
    try:
        return main(list(argv))
    except SystemExit as exit_info:
        return exit_info.code


def assert_one_line(err: str, pattern: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bastion: ") and "Traceback" not in err, err
    assert re.search(pattern, lines[0]), lines[0]


# -- user errors: one line, exit 2, nothing ran --------------------------------------------


@pytest.mark.parametrize("kind", sorted(BROKEN_JOBS))
def test_a_job_file_that_does_not_load_is_one_line(kind, tmp_path, capsys, nothing_runs):
    source, message = BROKEN_JOBS[kind]
    (tmp_path / "job.py").write_text(source)
    assert cli("run", str(tmp_path / "job.py")) == EXIT_USAGE
    assert_one_line(capsys.readouterr().err, message)


@pytest.mark.parametrize("argv,message", [
    (["run", "JOB", "--protocol", "bogus"],
     r"run: argument --protocol: invalid choice: 'bogus' \(choose from 'none', "
     r"'acks', 'coordinated', .*see `bastion run --help`"),
    (["run", "JOB", "--acks-mode", "xor"],
     r"--acks-mode, --ack-timeout and --max-pending set protocol acks; this run uses "
     r"--protocol none"),
    (["run", "JOB", "--redundancy", "2.5"],
     r"argument --redundancy: 2.5 is too large: a tuple gets at most two extra copies"),
    (["run", "JOB", "--redundancy", "auto"], r"--redundancy auto needs --latency-bound MS"),
    (["drill", "JOB", "--kill", "square:0@1", "--failover", "nearby"],
     r"argument --failover: invalid choice: 'nearby' \(choose from 'local', 'global'\)"),
    (["run", "JOB", "--redundancy", "1", "--latency-bound", "50"],
     r"--latency-bound sets the resiliency manager of --redundancy auto"),
    (["drill", "JOB", "--random-kills", "1", "--between", "a,b"],
     r"--between: 'a,b': expected FIRST,LAST in seconds, e.g. 1,4"),
    (["drill", "JOB", "--random-kills", "1", "--between", "4,1"], r"need 0 <= FIRST <= LAST"),
    (["drill", "JOB", "--kill", "nope:0@1"],
     r"no operator named 'nope'; the operators \(and their instance counts\) are: "
     r"nums\[1\], square\[2\], out\[2\]"),
    (["drill", "JOB", "--kill", "square:5@1"], r"has no instance 5"),
    (["drill", "JOB"], r"a drill needs faults"),
    (["run", "JOB", "--checkpoint-interval", "1"],
     r"no effect under --protocol none; .* --protocol coordinated"),
    (["run", "JOB", "--checkpoint-interval", "0"], r"need > 0"),
    (["run", "JOB", "--storage", "foo://x"], r"unknown scheme 'foo'.*use local://PATH"),
    (["run", "missing.py"], r"no such file: missing.py"),
    ([], r"required: COMMAND; see `bastion --help`"),
])
def test_usage_errors_are_one_line_and_exit_2_before_anything_runs(
        argv, message, tmp_path, capsys, nothing_runs):
    job = str(write_job(tmp_path))
    argv = [job if a == "JOB" else a for a in argv]
    assert cli(*argv, *(["--storage", f"local://{tmp_path}/s"]
                        if argv[:1] == ["drill"] else [])) == EXIT_USAGE
    assert_one_line(capsys.readouterr().err, message)


def test_missing_s3_credentials_are_one_line(tmp_path, capsys, nothing_runs, monkeypatch):
    for var in ("BASTION_S3_ACCESS_KEY", "BASTION_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    url = "s3://bucket-x/p?endpoint=127.0.0.1:9&secure=false"
    assert cli("run", str(write_job(tmp_path)), "--storage", url) == EXIT_USAGE
    assert_one_line(capsys.readouterr().err,
                    r"no S3 credentials for s3://bucket-x/p.*set BASTION_S3_ACCESS_KEY")


def test_an_unreachable_endpoint_is_one_line(tmp_path, capsys, nothing_runs, monkeypatch):
    monkeypatch.setenv("BASTION_S3_ACCESS_KEY", "cli-test-access-key")
    monkeypatch.setenv("BASTION_S3_SECRET_KEY", "cli-test-secret-key")
    with __import__("socket").socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = (f"s3://bucket-x/p?endpoint=127.0.0.1:{port}&secure=false&retry_attempts=2"
           "&retry_base_delay_s=0.01")
    assert cli("drill", str(write_job(tmp_path)), "--kill", "square:0@1",
               "--storage", url) == EXIT_USAGE
    # the retries are not shown either (--verbose shows them): one line in all
    assert_one_line(capsys.readouterr().err,
                    r"after 2 attempts.*check that the S3 endpoint is running and reachable")


def test_an_unbounded_source_without_duration_is_one_line(tmp_path, capsys):
    # bn.run refuses it (TopologyError) before it deploys anything
    (tmp_path / "job.py").write_text(
        "import bastion as bn\ntopology = bn.Topology('u')\n"
        "topology.source('s', bn.sources.Generator(lambda i: i)).sink('o', bn.sinks.Discard())\n")
    assert cli("run", str(tmp_path / "job.py"), "--storage",
               f"local://{tmp_path}/s") == EXIT_USAGE
    assert_one_line(capsys.readouterr().err, r"source 's' is unbounded: .*--duration")


def test_a_drill_the_protocol_refuses_exits_4(tmp_path, capsys):
    (tmp_path / "job.py").write_text(
        "import bastion as bn\ntopology = bn.Topology('loop')\n"
        "step = topology.source('s', bn.sources.Collection([1])).map('step', lambda x: x)\n"
        "step.sink('o', bn.sinks.Collect())\ntopology.feedback(step, 'step')\n")
    assert cli("drill", str(tmp_path / "job.py"), "--kill", "step:0@1",
               "--storage", f"local://{tmp_path}/s") == EXIT_FAILED
    assert_one_line(capsys.readouterr().err, r"protocol 'coordinated' cannot run")


def test_a_failed_job_is_one_line_and_exits_1(tmp_path, capsys, monkeypatch):
    def failing_run(*args, **kwargs):
        raise bn.JobFailedError("job cli-job-1 failed: worker 0 died\n(and more)")

    monkeypatch.setattr(bn, "run", failing_run)
    assert cli("run", str(write_job(tmp_path)), "--storage",
               f"local://{tmp_path}/s") == EXIT_JOB_FAILED
    assert_one_line(capsys.readouterr().err, r"failed: worker 0 died \(and more\)$")


def test_ctrl_c_is_one_line_and_exits_130(tmp_path, capsys, monkeypatch):
    def interrupted_run(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bn, "run", interrupted_run)
    assert cli("run", str(write_job(tmp_path)), "--storage",
               f"local://{tmp_path}/s") == EXIT_INTERRUPTED
    assert_one_line(capsys.readouterr().err, r"^bastion: interrupted$")


def test_a_cluster_that_cannot_be_reached_is_one_line(tmp_path, capsys, monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance")

    monkeypatch.setattr(bn, "run", unreachable)
    assert cli("run", str(write_job(tmp_path)), "--address", "10.0.0.1:6379", "--storage",
               f"local://{tmp_path}/s") == EXIT_USAGE
    warning, error = capsys.readouterr().err.strip().splitlines()
    # a local store with --address is worth a warning: other machines' disks differ
    assert warning.startswith("bastion: warning: --address with --storage local://")
    assert_one_line(error, r"cannot reach the Ray cluster at 10.0.0.1:6379: Could not find "
                           r"any running Ray instance; check --address")


def test_verbose_shows_the_traceback_of_a_user_error(tmp_path, capsys, nothing_runs):
    (tmp_path / "job.py").write_text(BROKEN_JOBS["name"][0])
    assert cli("run", str(tmp_path / "job.py"), "--verbose") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" in err and "Colection" in err


# -- flags ---------------------------------------------------------------------------------


def test_every_flag_has_help_and_protocol_lists_its_choices():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse
    assert set(commands) == {"run", "drill", "tune", "gc", "analyze", "reconstruct", "stop"}
    for name, command in [("bastion", parser), *commands.items()]:
        for action in command._actions:  # noqa: SLF001 - argparse keeps them here
            assert action.help, f"{name} {action.option_strings or action.dest}: no help"
    run_protocol = next(a for a in commands["run"]._actions if "--protocol" in a.option_strings)
    assert run_protocol.choices == ["none", "acks", "coordinated", "uncoordinated", "cic", "cec"]
    assert all(p in run_protocol.help for p in run_protocol.choices)
    for flag in ("--protocol", "--checkpoint-interval", "--storage", "--address",
                 "--verbose", "--keep-jobs"):
        assert any(flag in a.option_strings for a in commands["run"]._actions), flag


def test_version(capsys):
    assert cli("--version") == 0
    assert capsys.readouterr().out.strip() == f"bastion {bn.__version__}"


# -- progress without a terminal -----------------------------------------------------------


class FakeStream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def report(phase: str, elapsed: float, read: int) -> dict:
    return {"phase": phase, "elapsed_s": elapsed, "source_records": read,
            "sink_records": read}


def test_progress_without_a_terminal_prints_every_few_seconds_and_never_repeats():
    stream, now = FakeStream(), [0.0]
    line = ProgressLine(stream, every_s=5.0, clock=lambda: now[0])
    for _ in range(40):  # 20 s of spawning, reported twice a second
        line(report("spawn", 0.0, 0))
        now[0] += 0.5
    for i in range(24):  # 12 s of running
        line(report("watch", i * 0.5, i * 500))
        now[0] += 0.5
    lines = stream.text.splitlines()
    assert [l.split("]")[0] for l in lines] == ["[  spawn", "[  watch", "[  watch",
                                                "[  watch"], lines
    assert len(set(lines)) == len(lines)


def test_progress_on_a_terminal_rewrites_one_line():
    stream = FakeStream()
    line = ProgressLine(stream, tty=True)
    for i in range(3):
        line(report("watch", i * 0.5, i * 10))
    line.close()
    assert stream.text.count("\r") == 3 and stream.text.endswith("\n")
    assert stream.text.count("\n") == 1


# -- the terminal of a real `bastion` process ----------------------------------------------


def bastion_process(*argv: str, cwd: Path) -> subprocess.Popen:
    # Ray's driver in this test process (the session's Ray) exports RAY_AUTH_MODE and
    # RAY_CLIENT_MODE into os.environ; a child that inherits them starts its own Ray
    # differently (no token notice), so it gets the environment a user's shell has.
    return subprocess.Popen([str(BASTION), *argv], cwd=cwd, env=user_environment(),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def user_environment() -> dict[str, str]:
    """This process's environment without what the session's Ray driver exported."""
    return {k: v for k, v in os.environ.items()
            if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_CLIENT_MODE")}


def test_ray_start_up_notices_stay_out_of_the_terminal_unless_verbose(tmp_path):
    """Three fresh processes, each starting a Ray of its own, side by side (a start
    costs seconds of two cores; side by side the waits overlap): `bastion run` prints
    progress lines and nothing else on stderr; ``--verbose`` shows Ray's token notice
    — the proof that the notice exists to be hidden; and a program calling `bn.run`
    does not show it either."""
    job = write_job(tmp_path, count=300, rate=1000)
    (tmp_path / "v").mkdir()
    (tmp_path / "api").mkdir()
    quiet = bastion_process("run", str(job), "--storage", f"local://{tmp_path}/s",
                            cwd=tmp_path)
    verbose = bastion_process("run", str(job), "--storage", f"local://{tmp_path}/v/s",
                              "--verbose", cwd=tmp_path / "v")
    script = ("import bastion as bn\n"
              "t = bn.Topology('quiet')\n"
              "t.source('s', bn.sources.Collection([1, 2, 3])).sink('o', bn.sinks.Collect())\n"
              f"print(len(bn.run(t, storage='local://{tmp_path}/api/s').outputs['o']))\n")
    api = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path / "api", text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=user_environment())
    out, err = quiet.communicate(timeout=240)
    assert quiet.returncode == EXIT_OK, err
    assert "out: 300 committed records" in out
    # every line on stderr is a progress line, or the one naming the job (what
    # `bastion stop` takes): no notice, no warning, no log record
    lines = err.splitlines()
    assert re.fullmatch(r"job \S+ running \(`bastion stop \S+ --savepoint` stops it with "
                        r"a savepoint\)", lines[0]), err
    for line in lines[1:]:
        assert re.fullmatch(r"\[ *\w+\] +[\d.]+ s +in +[\d,]+ +out +[\d,]+ +[\d,]+ rec/s",
                            line), err
    _, err = verbose.communicate(timeout=240)
    assert verbose.returncode == EXIT_OK, err
    assert "Token authentication is enabled" in err
    out, err = api.communicate(timeout=240)
    assert api.returncode == 0, err
    assert out.strip() == "3"
    assert "Token authentication" not in err, err


@pytest.mark.slow
def test_ctrl_c_on_a_running_job_exits_130_with_one_line(tmp_path):
    job = write_job(tmp_path, count=1_000_000, rate=1000)  # ~17 minutes
    errors = tmp_path / "stderr"
    with errors.open("w") as sink:
        process = subprocess.Popen([str(BASTION), "run", str(job), "--storage",
                                    f"local://{tmp_path}/s"], cwd=tmp_path, text=True,
                                   stdout=subprocess.PIPE, stderr=sink)
        deadline = time.monotonic() + 180
        while "watch" not in errors.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, errors.read_text()
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
    err = errors.read_text()
    assert process.returncode == EXIT_INTERRUPTED, err
    assert err.splitlines()[-1] == "bastion: interrupted" and "Traceback" not in err


# -- run with the new flags; retention -----------------------------------------------------


def age_jobs(store: LocalStore, jobs: list[str], modified: float) -> None:
    for job in jobs:
        for key in store.list(f"jobs/{job}/"):
            os.utime(os.path.join(store.root, *key.split("/")), (modified, modified))


@pytest.mark.usefixtures("ray_session")
def test_run_takes_protocol_interval_and_storage_and_keeps_the_store_bounded(tmp_path,
                                                                            capsys):
    store = LocalStore(tmp_path / "store")
    for i in range(3):  # jobs of earlier runs, two hours old
        store.put(f"jobs/old-{i}/events/job-master", b"x")
    age_jobs(store, [f"old-{i}" for i in range(3)], time.time() - 7200)
    job = write_job(tmp_path, count=1500, rate=1500)  # 1 s: several 0.2 s intervals
    assert cli("run", str(job), "--protocol", "coordinated", "--checkpoint-interval",
               "0.2", "--storage", f"local://{store.root}", "--keep-jobs", "2") == EXIT_OK
    out = capsys.readouterr().out
    assert "out: 1,500 committed records" in out
    [new] = [j for j in list_jobs(store) if j.job.startswith("cli-job-")]
    # the run checkpointed into the store it was given ...
    assert store.list(f"jobs/{new.job}/checkpoints/")
    # ... which now holds the two newest jobs: this run and the newest old one
    # (the old ones tie on time; the id breaks the tie)
    assert sorted(j.job for j in list_jobs(store)) == sorted([new.job, "old-0"])


def test_gc_deletes_old_jobs_and_keeps_recent_ones(tmp_path, capsys):
    store = LocalStore(tmp_path)
    for job in ("a", "b", "c", "recent"):
        store.put(f"jobs/{job}/events/job-master", b"x" * 1000)
    age_jobs(store, ["a"], time.time() - 3 * 3600)
    age_jobs(store, ["b"], time.time() - 2 * 3600)
    age_jobs(store, ["c"], time.time() - 0.5 * 3600)  # may still run: kept at any rank
    url = f"local://{tmp_path}"
    assert cli("gc", "--storage", url, "--keep", "1", "--dry-run") == EXIT_OK
    assert "would delete 2 job(s)" in capsys.readouterr().out
    assert len(list_jobs(store)) == 4
    assert cli("gc", "--storage", url, "--keep", "1") == EXIT_OK
    out = capsys.readouterr().out
    assert "deleted b" in out and "deleted a" in out and "kept 2" in out
    assert sorted(j.job for j in list_jobs(store)) == ["c", "recent"]
    assert cli("gc", "--storage", url, "--keep", "0", "--min-age", "0") == EXIT_OK
    assert list_jobs(store) == []


@pytest.mark.usefixtures("ray_session")
def test_keep_jobs_0_keeps_none_but_the_last_hours_as_gc_keep_0_does(tmp_path, capsys):
    store = LocalStore(tmp_path / "store")
    for i in range(2):
        store.put(f"jobs/old-{i}/events/job-master", b"x")
    age_jobs(store, ["old-0", "old-1"], time.time() - 7200)
    job = write_job(tmp_path, count=200, rate=2000)
    assert cli("run", str(job), "--storage", f"local://{store.root}",
               "--keep-jobs", "0") == EXIT_OK
    assert "out: 200 committed records" in capsys.readouterr().out
    [left] = list_jobs(store)  # the old ones went; the run just made is an hour young
    assert left.job.startswith("cli-job-")


def test_a_job_file_named_like_a_module_does_not_replace_it(tmp_path, nothing_runs):
    import json

    path = tmp_path / "json.py"
    path.write_text(JOB.format(count=10, rate=100))
    from bastion.cli import load_topology

    topology = load_topology(str(path))
    assert topology.name == "cli-job"
    assert sys.modules["json"] is json and json.dumps([1]) == "[1]"


def test_a_report_that_cannot_be_written_is_one_line(tmp_path, capsys, nothing_runs):
    job = write_job(tmp_path)
    missing = tmp_path / "no-such-folder" / "r.html"
    assert cli("drill", str(job), "--kill", "square@0.3", "--html", str(missing)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"--html {missing}: no folder" in err and "Traceback" not in err
    assert cli("tune", str(job), "--trt-bound", "10", "--html", str(tmp_path)) == EXIT_USAGE
    assert "is a directory" in capsys.readouterr().err

    from bastion.cli import UsageError, write_page

    def full_disk(report, path, **kwargs):
        raise OSError(28, "No space left on device")

    with pytest.raises(UsageError, match=r"could not write the report r\.html: No space"):
        write_page(full_disk, object(), "r.html", title="t")


def test_summary_tables_wrap_their_text_within_80_columns():
    from bastion.cli import table

    rows = [("duration", "1.00 s"),
            ("faults injected", "3 stalls (0.60 s), 12 frames lost (1,200 records), 4 "
                                "waits for a link (0.40 s), 2 connections dropped")]
    for numbers in (True, False):
        text = table(rows, numbers=numbers)
        assert max(map(len, text.splitlines())) <= 80, text
        assert " ".join(text.split()).endswith("2 connections dropped")
    narrow = [("a", "1"), ("b", "22")]
    assert table(narrow) == "a   1\nb  22"  # what fits is left as it was


def test_progress_after_a_restart_shows_no_negative_rate():
    """A restart rolls the sources' counts back: the rate then restarts, it never
    reads -2,009 rec/s."""
    stream, now = FakeStream(), [0.0]
    line = ProgressLine(stream, tty=False, every_s=0.0, clock=lambda: now[0])
    for read in (0, 1000, 2000, 500, 1500):  # the third report comes after a restart
        line(report("watch", now[0], read))
        now[0] += 1.0
    rates = [l.split("out")[1].split()[1] for l in stream.text.splitlines()]
    assert rates == ["0", "1,000", "1,000", "-", "1,000"], stream.text


def test_read_only_commands_do_not_create_a_missing_store(tmp_path, capsys):
    missing = tmp_path / "no-store"
    for argv in (["gc", "--storage", f"local://{missing}"],
                 ["analyze", "--job", "some-job", "--out", str(tmp_path / "out"),
                  "--storage", f"local://{missing}"]):
        assert cli(*argv) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"no such folder {missing}" in err and len(err.splitlines()) == 1, err
        assert not missing.exists()


def test_auto_interval_refuses_a_job_too_short_to_tune(tmp_path, capsys, nothing_runs):
    job = write_job(tmp_path, count=1000, rate=1000)  # reads its input in 1 s
    assert cli("run", str(job), "--checkpoint-interval", "auto", "--trt-bound", "5",
               "--storage", f"local://{tmp_path}/s") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "too short to tune" in err and "--checkpoint-interval S" in err, err


def test_an_address_where_nothing_listens_fails_in_one_line_at_once(tmp_path):
    """Ray retried a closed port for a minute, printing its own log lines."""
    job = write_job(tmp_path)
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began_s = time.monotonic()
    done = bastion_process("run", str(job), "--address", f"127.0.0.1:{port}",
                           "--storage", f"local://{tmp_path}/s", cwd=tmp_path)
    _, err = done.communicate(timeout=120)
    assert done.returncode == EXIT_USAGE, err
    assert time.monotonic() - began_s < 30
    [*_, last] = err.strip().splitlines()
    assert last == (f"bastion: cannot reach the Ray cluster at 127.0.0.1:{port}: nothing "
                    f"accepts connections at 127.0.0.1:{port} (Connection refused); check "
                    "--address"), err
    assert "Traceback" not in err
