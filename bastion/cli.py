"""The ``bastion`` command line: run a job, drill its recovery, prune the store.

``bastion run FILE`` loads a Python file that builds a `Topology` (a module-level
variable; name it ``topology`` when the file has several), runs it with a live
progress line, and prints a summary: throughput, latency percentiles, per-operator
record counts, dead letters, and the first committed records of each sink.

``bastion drill FILE --kill OP[:I]@S ...`` runs a recovery drill (`bastion.drills`):
a failure-free reference and a faulty run, with a progress line for each, then a
summary table, the first lost / duplicated / corrupted records with their lineage
ids, and a self-contained HTML report.

``bastion analyze --storage URL [--job JOB ...] --out DIR`` runs a Spark job
(`bastion.spark_jobs.analyze`) over the event logs of one, several or every job in a
store: Parquet tables per second, per checkpoint, per failure and per job in DIR, an
HTML page comparing the jobs, and a summary table. One SparkSession per call
(``local[2]`` unless ``--master`` names a cluster); no Java is a usage error.

``bastion reconstruct --storage URL --job JOB --operator OP [--at T]`` rebuilds the
eventual checkpoint (CEC) of every instance of an operator from the control tuples in
its output logs, with a Spark job (`bastion.spark_jobs.reconstruct`), writes each to
the store in the form a restart loads, and prints what it found: open parts, extent,
where replay starts, damaged log stretches (reported, never loaded).

``bastion tune FILE --trt-bound S --min S --max S --points N`` chooses the
checkpoint interval (`bastion.tuning`, Chiron): a progress bar over the profiling
runs, a table of what they measured with the predicted total recovery time per
interval, the chosen interval — or that none in the range meets the bound (exit 1)
— and an HTML page with the fitted curves. ``bastion run --checkpoint-interval auto
--trt-bound S`` tunes over 0.5–8 s first, then runs with the chosen interval.

``bastion gc`` deletes old job folders from a store (`bastion.storage.retention`);
``run`` and ``drill`` do the same to a local store after every run, keeping the
newest ``--keep-jobs``, so ``.bastion/`` does not grow by a folder per run for ever.

**A user error is one line, never a traceback.** A mistake the user can fix — an
unknown protocol, a malformed flag, a job file that does not load or builds a bad
topology, a store that cannot be reached or has no credentials, a fault naming an
operator that does not exist — prints ``bastion: <what is wrong>; <what to do>`` on
stderr and exits 2, before any job runs wherever it can be found that early.
Ctrl-C prints one line and exits 130 (the shell's code for SIGINT). Tracebacks are
kept for what only a bug in Bastion can cause; ``--verbose`` shows them for user
errors too, with Ray's start-up notices and Bastion's storage retries.

Exit codes, the same for every command where they apply, so scripts and CI can act
on them:

====  ===================================================================
code  meaning
====  ===================================================================
0     done; for a drill: exactly-once, every fault landed, nothing lost,
      duplicated or corrupted (at-least-once under protocol ``acks``: nothing
      lost or corrupted, duplicates counted)
1     ``run``: the job failed; ``drill``: violated — a record was lost,
      duplicated (but under ``acks``) or corrupted
2     usage error: bad arguments, a job file that does not load, an unusable
      store, no faults or a fault target that does not exist (nothing ran)
3     ``drill``: inconclusive — nothing violated, but a fault did not land (the
      job ended first, nothing to kill): the drill proved nothing
4     ``drill``: the drill could not run (the topology was refused, a job failed)
130   interrupted (Ctrl-C)
====  ===================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn, Sequence

from bastion.errors import (BastionError, StorageError, TopologyError,
                            UnstorableValueError)
from bastion.topology import Topology

if TYPE_CHECKING:
    from bastion.scheduler.tuning import Case

EXIT_OK, EXIT_VIOLATED, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_FAILED = 0, 1, 2, 3, 4
EXIT_JOB_FAILED = 1  # `bastion run`: the job failed (a drill's 1 is "violated")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
_EXIT_CODES = {"exactly-once": EXIT_OK, "at-least-once": EXIT_OK, "violated": EXIT_VIOLATED,
               "inconclusive": EXIT_INCONCLUSIVE}

DEFAULT_STORAGE = "local://.bastion"
#: Jobs a local store keeps after ``run``/``drill`` (the newest ones; see `retain`).
DEFAULT_KEEP_JOBS = 20
#: A job written this recently is never deleted: it may be running elsewhere.
RETENTION_MIN_AGE_S = 3600.0
#: Without a terminal (CI logs, a pipe), one progress line per this many seconds:
#: the launcher reports twice a second, which floods a log file.
PIPE_PROGRESS_EVERY_S = 5.0


class UsageError(Exception):
    """A mistake the user can fix; its message says what is wrong and what to do."""


# -- loading the job file ----------------------------------------------------------------


def _user_frame(exc: BaseException, file: Path) -> str:
    """``job.py line 7`` for the deepest frame of ``exc`` inside the user's file."""
    line = None
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename) == file:
        line = exc.lineno
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == file.resolve():
            line = frame.lineno
    return f"{file}" + (f" line {line}" if line else "")


def load_topology(path: str) -> Topology:
    """The topology defined by the Python file at ``path``. Everything that can go
    wrong while the file runs is a `UsageError` naming the file and line: a typo in
    the topology (`TopologyError`), a syntax error, a failing import, any exception
    of the file's own code."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no such file: {path}; pass the Python file that builds the "
                         "topology")
    # A name of its own: a job file called like an installed module (ray.py, json.py)
    # must not replace that module for everything imported after it.
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:8]
    name = f"_bastion_job_{re.sub(r'[^0-9A-Za-z_]', '_', file.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot load {path} as a Python module; pass a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so its functions can be shipped to the workers
    try:
        spec.loader.exec_module(module)
    except TopologyError as exc:
        raise UsageError(f"{_user_frame(exc, file)}: {exc}") from exc
    except SyntaxError as exc:
        raise UsageError(f"{_user_frame(exc, file)}: syntax error: {exc.msg}") from exc
    except Exception as exc:  # the user's own code failed: point at their line
        raise UsageError(f"{_user_frame(exc, file)}: {type(exc).__name__}: {exc}; fix "
                         "the job file (--verbose shows the traceback)") from exc
    if isinstance(getattr(module, "topology", None), Topology):
        return module.topology
    found = [v for v in vars(module).values() if isinstance(v, Topology)]
    if len(found) != 1:
        raise UsageError(f"{path} defines {len(found)} Topology objects at module level; "
                         "define one, or name the one to run `topology`")
    return found[0]


# -- output ------------------------------------------------------------------------------


class ProgressLine:
    """Shows a run's progress: records read and written and the current rate.

    On a terminal it rewrites one line in place at every report (twice a second).
    Without one (a CI log, a pipe) it appends a line at most every
    ``every_s`` seconds, and at once when the phase or the run changes — never a
    line that repeats the previous one. A drill makes several runs; progress that
    names its run (``"run"``) starts a new line for each, and the rate restarts."""

    def __init__(self, stream: Any = None, *, tty: bool | None = None,
                 every_s: float = PIPE_PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic, announce_job: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        # say the job's id once it runs: what `bastion stop` takes
        self.announce_job = announce_job
        self.job_id: str | None = None
        self.enabled = self.stream.isatty() if tty is None else tty
        self.every_s = every_s
        self.clock = clock
        self.last: tuple[float, int] | None = None  # (time, records read) of the rate
        self.run: str | None = None
        self.phase: str | None = None
        self.printed_at: float | None = None
        self.printed: str | None = None
        self.width = 0

    def __call__(self, progress: dict[str, Any]) -> None:
        if self.announce_job and progress.get("job_id", self.job_id) != self.job_id:
            self.close()
            self.job_id = progress["job_id"]
            self.stream.write(f"job {self.job_id} running (`bastion stop {self.job_id} "
                              "--savepoint` stops it with a savepoint)\n")
        run = progress.get("run")
        if run != self.run:
            self.close()
            self.run, self.last, self.phase = run, None, None
        now, read = self.clock(), progress["source_records"]
        rate: float | None = 0.0
        if self.last is not None and now > self.last[0]:
            # fewer read than before: a restart rolled the sources back, and their
            # counts with them — no rate until the next report, never a negative one
            rate = (None if read < self.last[1]
                    else (read - self.last[1]) / (now - self.last[0]))
        self.last = (now, read)
        label = f"{run}: " if run else ""
        counts = (f"{label}[{progress['phase']:>7}] {progress['elapsed_s']:6.1f} s  "
                  f"in {read:>12,}  out {progress['sink_records']:>12,}")
        line = f"{counts}  {'-' if rate is None else f'{rate:,.0f}':>12} rec/s"
        if self.enabled:
            # pad: a shorter line must cover the end of the previous one
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
            self.printed = line
        else:
            new_phase = progress["phase"] != self.phase
            due = self.printed_at is None or now - self.printed_at >= self.every_s
            if not (new_phase or due) or counts == self.printed:
                self.phase = progress["phase"]
                return
            self.stream.write(line + "\n")
            self.printed_at, self.printed = now, counts
        self.phase = progress["phase"]
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.printed is not None:
            self.stream.write("\n")
            self.stream.flush()
        self.last, self.printed, self.printed_at, self.width = None, None, None, 0


TERMINAL_COLUMNS = 80


def table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None,
          numbers: bool = True) -> str:
    """Aligned columns; the first is left-aligned, the others right-aligned as
    numbers, or left-aligned too when they hold text (``numbers=False``). Text in the
    last column wraps onto lines of its own so that the table fits 80 columns."""
    cells = [list(map(str, r)) for r in ([header] if header else []) + list(rows)]
    if cells and len(cells[0]) > 1:
        cells = _wrap_last_column(cells)
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 or not numbers else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _wrap_last_column(cells: list[list[str]]) -> list[list[str]]:
    """Rows whose last cell would end past `TERMINAL_COLUMNS` continue it on rows
    of their own, the other cells blank."""
    lead = sum(max(len(r[i]) for r in cells) + 2 for i in range(len(cells[0]) - 1))
    room = TERMINAL_COLUMNS - lead
    if room < 20 or all(len(r[-1]) <= room for r in cells):
        return cells  # it fits, or the other columns take the line
    wrapped = []
    for row in cells:
        lines = textwrap.wrap(row[-1], room) or [""]
        wrapped.append(row[:-1] + [lines[0]])
        wrapped.extend([""] * (len(row) - 1) + [line] for line in lines[1:])
    return wrapped


def one_line(text: object) -> str:
    """``text`` on one line: an error message must not spill over several."""
    return " ".join(str(text).split())


# Terminal colour codes, which Ray writes into a remote error's text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# What a message from the library names — `bastion.run`'s keywords, and the fields of
# the options objects, written ``Object(field=value)`` — and the flags that set them
# here: on the command line a message names flags.
_FLAGS = {"protocol": "--protocol", "resume_from": "--resume-from",
          "duration_s": "--duration", "redundancy": "--redundancy",
          "interval_s": "--checkpoint-interval",
          "Acks(timeout_s": "--ack-timeout", "Acks(mode": "--acks-mode",
          "Acks(max_pending": "--max-pending",
          "Redundancy(ratio": "--redundancy", "Redundancy(latency_bound_ms": "--latency-bound",
          "Recovery(failover": "--failover",
          "AutoInterval(trt_bound_s": "--trt-bound",
          "AutoInterval(retune_every_s": "--retune-every"}
_KEYWORD = re.compile(r"(?<![\w.(])(" + "|".join(map(re.escape, _FLAGS))
                      + r")=('[^']*'|[^\s:;,()]+)(\))?(?: or '(\w+)')?")
# An automatic interval, as the library names it.
_AUTO_INTERVAL = re.compile(r"\binterval_s=AutoInterval\(…\)")


def as_flags(message: str) -> str:
    """``message`` with ``keyword=value`` of `bastion.run` and ``Object(field=value)``
    of its options written as the flag that sets it (``protocol='cec'`` ->
    ``--protocol cec``, ``Acks(timeout_s=1)`` -> ``--ack-timeout 1``), and without
    colour codes."""
    def flag(found: re.Match) -> str:
        # ``Acks(timeout_s=1)`` is one flag, its parenthesis included
        closing = "" if "(" in found[1] else (found[3] or "")
        text = f"{_FLAGS[found[1]]} {found[2].strip(chr(39))}{closing}"
        return text + (f" or {found[4]}" if found[4] else "")

    message = _AUTO_INTERVAL.sub("--checkpoint-interval auto", _ANSI.sub("", message))
    return _KEYWORD.sub(flag, message)


def _say(message: str) -> None:
    print(f"bastion: {one_line(as_flags(str(message)))}", file=sys.stderr)


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# -- the store: open it early, keep it bounded ---------------------------------------------


def check_report_path(path: str) -> None:
    """Refuse, before a run of minutes, a report path that cannot be written."""
    page = Path(path)
    folder = page.parent if str(page.parent) else Path(".")
    if page.is_dir():
        raise UsageError(f"--html {path} is a directory; name the report file")
    if not folder.is_dir():
        raise UsageError(f"--html {path}: no folder {folder}; create it or choose another "
                         "path")
    if not os.access(folder, os.W_OK) or (page.exists() and not os.access(page, os.W_OK)):
        raise UsageError(f"--html {path}: not writable; choose another path")


def write_page(write: Any, *args: Any, **kwargs: Any) -> Path:
    """``write(*args, **kwargs)`` (a report's ``write_html``); a failure to write the
    page after the run (a full disk) is one line, exit 2 — the run's summary above it
    stands."""
    try:
        return write(*args, **kwargs)
    except OSError as exc:
        raise UsageError(f"could not write the report {args[1]}: "
                         f"{exc.strerror or exc}") from exc


def open_storage(url: str, *, existing: bool = False) -> Any:
    """The store at ``url``, opened before anything runs: a bad URL, missing
    credentials or an unreachable endpoint is a usage error, not a failed job.
    ``existing``: a command that only reads (analyze, gc, reconstruct) refuses a
    local path that does not exist, where opening would create it."""
    from bastion.storage import open_store

    if existing and url.startswith("local://"):
        path = Path(url[len("local://"):].split("?", 1)[0]).expanduser()
        if not path.is_dir():
            raise UsageError(f"--storage {url}: no such folder {path}; name the store "
                             "the jobs ran in")
    try:
        return open_store(url)
    except StorageError as exc:  # its message names the URL and what to check
        raise UsageError(str(exc)) from exc


def retain(store: Any, keep: int) -> None:
    """After a run: a local store keeps its ``keep`` newest jobs (0: none, as for
    ``bastion gc --keep 0``) and any job written in the last hour — the one just run
    among them. A bucket is left alone — it may be shared, and `bastion gc` prunes it
    on request."""
    from bastion.storage import LocalStore, prune_jobs

    if not isinstance(store, LocalStore):
        return
    try:
        prune_jobs(store, keep=keep, min_age_s=RETENTION_MIN_AGE_S)
    except StorageError as exc:  # the run succeeded; a failed clean-up must not hide it
        _say(f"warning: could not delete old jobs from {store.url}: {exc}")


# -- commands ------------------------------------------------------------------------------


def _protocols() -> list[str]:
    """The protocols this version runs (the registry knows names it cannot run yet)."""
    from bastion.protocols import KNOWN, get_protocol

    available = []
    for name in KNOWN:
        try:
            get_protocol(name)
        except (NotImplementedError, ValueError):
            continue
        available.append(name)
    return available


def _warn_local_storage_on_a_cluster(args: argparse.Namespace) -> None:
    if args.address and args.storage.startswith("local://"):
        _say(f"warning: --address with --storage {args.storage}: workers on other "
             "machines write to their own disks, so outputs and checkpoints of a "
             "multi-node run are lost; pass --storage s3://BUCKET/PREFIX?endpoint=HOST:PORT")


def _acks_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of protocol acks that were given, as fields of `bn.protocols.Acks`."""
    options = {name: value for name, value in (
        ("mode", args.acks_mode), ("timeout_s", args.ack_timeout),
        ("max_pending", args.max_pending)) if value is not None}
    if options and args.protocol != "acks":
        raise UsageError("--acks-mode, --ack-timeout and --max-pending set protocol acks; "
                         f"this run uses --protocol {args.protocol}")
    return options


def _protocol(args: argparse.Namespace, interval: Any = None) -> Any:
    """The run's protocol: ``--protocol``'s name alone when no flag sets a knob of it,
    else its object (`bastion.protocols`) with ``--checkpoint-interval`` (or
    ``interval``: the `bastion.options.AutoInterval` of ``--checkpoint-interval auto``)
    and the acks flags. Protocol ``none`` has no knobs: an interval given to a drill
    is its faulty run's, and a drill under ``none`` has none."""
    import bastion as bn

    knobs: dict[str, Any] = _acks_options(args)
    interval = interval if interval is not None else args.checkpoint_interval
    if interval is not None and args.protocol != "none":
        knobs["interval_s"] = interval
    if not knobs:
        return args.protocol
    objects = {"acks": bn.protocols.Acks, "coordinated": bn.protocols.Coordinated,
               "uncoordinated": bn.protocols.Uncoordinated, "cic": bn.protocols.Cic,
               "cec": bn.protocols.Cec}
    return objects[args.protocol](**knobs)


def _redundancy_options(args: argparse.Namespace) -> Any:
    """``--redundancy`` and ``--latency-bound`` as a `bn.Redundancy` (None without)."""
    import bastion as bn

    if args.latency_bound is not None and args.redundancy != "auto":
        raise UsageError("--latency-bound sets the resiliency manager of "
                         "--redundancy auto")
    if args.redundancy == "auto" and args.latency_bound is None:
        raise UsageError("--redundancy auto needs --latency-bound MS (the p90 latency to "
                         "keep under)")
    if args.redundancy is None:
        return None
    return bn.Redundancy(args.redundancy, latency_bound_ms=args.latency_bound)


def cmd_run(args: argparse.Namespace) -> int:
    import bastion as bn

    if args.trt_bound is not None and args.checkpoint_interval != "auto":
        raise UsageError("--trt-bound sets the tuning of --checkpoint-interval auto; "
                         "pass --checkpoint-interval auto too")
    if args.retune_every is not None and args.checkpoint_interval != "auto":
        raise UsageError("--retune-every re-tunes the interval --checkpoint-interval auto "
                         "chose; pass --checkpoint-interval auto --trt-bound S too")
    auto = None   # the AutoInterval of a re-tuning run
    if args.checkpoint_interval == "auto":
        from bastion.protocols import get_protocol

        if (args.retune_every is not None and args.protocol != "none"
                and not get_protocol(args.protocol).live_interval):
            raise UsageError(f"--retune-every: --protocol {args.protocol} cannot move its "
                             "checkpoint interval while the job runs; use --protocol "
                             "coordinated")
        try:
            tuning = _auto_interval(args)
            args.checkpoint_interval = tuning.interval_s
            if args.retune_every is not None:   # the job re-tunes from the model
                auto = bn.AutoInterval(trt_bound_s=args.trt_bound, tuning=tuning,
                                       retune_every_s=args.retune_every)
        except (TopologyError, StorageError, UnstorableValueError):
            raise  # user errors: main prints them as one line, exit 2
        except BastionError as exc:  # a profiling run failed: the job did not run
            _say(f"--checkpoint-interval auto: tuning failed: {exc}")
            return EXIT_JOB_FAILED
    if args.checkpoint_interval is not None and args.protocol == "none":
        raise UsageError("--checkpoint-interval has no effect under --protocol none; "
                         "pick a checkpointing protocol, e.g. --protocol coordinated")
    faults = _fault_file(args)
    topology = load_topology(args.file)
    store = open_storage(args.storage)
    _warn_local_storage_on_a_cluster(args)
    progress = ProgressLine(announce_job=True)
    try:
        result = bn.run(topology, protocol=_protocol(args, auto), faults=faults,
                        storage=store.url,
                        address=args.address, duration_s=args.duration,
                        data_plane=bn.DataPlane(buffer_timeout_ms=args.buffer_timeout_ms,
                                                chaining=not args.no_chaining),
                        recovery=bn.Recovery(failover=args.failover),
                        redundancy=_redundancy_options(args), fail_fast=args.fail_fast,
                        progress=progress, resume_from=args.resume_from)
        # Only the count and the first --show records of each sink, read before
        # retention may delete this job's folder: a File or Log sink's outputs stay
        # in the store (`CommittedOutputs`), however many the job committed.
        shown = [(sink, len(values), list(values[: args.show]))
                 for sink, values in result.outputs.items()]
    except (TopologyError, StorageError, UnstorableValueError):
        raise  # user errors: main prints them as one line, exit 2
    except ValueError as exc:  # refused before it ran (e.g. --address ray:// without
        raise UsageError(str(exc)) from exc  # ray[client]); the message says what to do
    except BastionError as exc:  # the job ran and failed (a UDF error, a lost worker)
        progress.close()
        details = getattr(exc, "details", None)
        if args.verbose and details:
            print(details, file=sys.stderr)  # a worker's traceback, for a bug report
        _say(str(exc))
        return EXIT_JOB_FAILED
    finally:
        progress.close()
        retain(store, args.keep_jobs)
    m = result.metrics
    print(f"\njob {result.job_id}: {result.plan.splitlines()[0]}")
    if result.savepoint:
        print(f"stopped with a savepoint: resume it with --resume-from {result.job_id}")
    print(table(m.summary_rows()))
    print()
    print(table([(name, f"{c.records_in:,}", f"{c.records_out:,}")
                 for name, c in m.operators.items()], header=("operator", "in", "out")))
    for sink, count, first in shown:
        print(f"\n{sink}: {count:,} committed records" + (", first ones:" if count else ""))
        for value in first:
            print(f"  {value!r}")
    if result.dead_letters:
        print(f"\ndead letters: {m.dead_letters:,}, first ones:")
        for letter in result.dead_letters[: args.show]:
            print(f"  {letter.operator}[{letter.index}] {letter.reason}: {letter.value!r} "
                  f"({letter.error})")
    for warning in result.warnings:  # the job succeeded, but not everything was stored
        _say(f"warning: {warning}")
    return EXIT_OK


def drill_exit_code(report: Any) -> int:
    """The exit code of ``bastion drill`` for a drill's verdict."""
    return _EXIT_CODES[report.verdict]


def print_drill(report: Any, show: int, stream: Any = None) -> None:
    """The drill's summary table, what it did not compare (the two failure-free
    references disagreed), then the first violations with their ids."""
    stream = stream or sys.stdout
    print(table(report.summary_rows(), numbers=False), file=stream)
    if report.not_reproduced and show > 0:
        # the evidence beside the table's one line: what the two failure-free runs
        # committed, so a user sees why a value was not held against the protocol
        print("\nnot compared, the first disagreement of the failure-free runs on each:",
              file=stream)
        for entry in report.not_reproduced[:show]:
            print(f"  {report.describe_not_reproduced(entry)}", file=stream)
    for kind, total, items in (("lost", report.lost, report.lost_examples),
                               ("duplicated", report.duplicated, report.duplicated_examples),
                               ("corrupted", report.corrupted, report.corrupted_examples)):
        if items and show > 0:
            print(f"\nfirst {min(show, len(items))} of {total:,} {kind} records:",
                  file=stream)
            for violation in items[:show]:
                print(f"  {report.describe(violation)}", file=stream)


def _fault_file(args: argparse.Namespace) -> list:
    """The faults of ``--faults FILE`` (none without it); a usage error naming the line
    and field of a mistake."""
    if args.faults is None:
        return []
    import bastion as bn

    try:
        return bn.faults.load(args.faults)
    except bn.faults.FaultFileError as exc:
        raise UsageError(str(exc)) from None


def cmd_drill(args: argparse.Namespace) -> int:
    import bastion as bn
    from bastion.report import write_html

    if args.scenario is not None:
        return _drill_scenario(args)
    if args.file is None:
        raise UsageError("a drill needs a topology FILE, or --scenario correlated")
    faults = list(args.kill) + list(args.kill_node) + _fault_file(args)
    if args.random_kills:
        first, last = args.between
        faults.append(bn.faults.RandomKills(args.random_kills, (first, last)))
    if not faults:
        raise UsageError("a drill needs faults: --kill OP[:I]@S, --kill-node N@S, "
                         "--random-kills N or --faults FILE")
    check_report_path(args.html)
    topology = load_topology(args.file)
    store = open_storage(args.storage)
    _warn_local_storage_on_a_cluster(args)
    progress = ProgressLine()
    try:
        # bn.drill checks every fault target against the plan before the first run
        report = bn.drill(topology, protocol=_protocol(args), faults=faults, seed=args.seed,
                          storage=store.url, address=args.address, progress=progress,
                          recovery=bn.Recovery(failover=args.failover),
                          redundancy=_redundancy_options(args))
    except (StorageError, UnstorableValueError):
        raise  # a usage error (exit 2), printed by main
    except TopologyError as exc:  # refused (e.g. a cycle under coordinated): exit 4
        progress.close()
        _say(str(exc))
        return EXIT_FAILED
    except ValueError as exc:  # a fault target that does not exist, ...
        progress.close()
        message = str(exc)
        if "no operator named" in message or "has no instance" in message:
            operators = ", ".join(f"{name}[{node.parallelism}]"
                                  for name, node in topology.nodes.items())
            message += f"; the operators (and their instance counts) are: {operators}"
        raise UsageError(message) from exc
    except BastionError as exc:  # a job failed: exit 4
        progress.close()
        details = getattr(exc, "details", None)
        if args.verbose and details:
            print(details, file=sys.stderr)  # a worker's traceback, for a bug report
        _say(str(exc))
        return EXIT_FAILED
    finally:
        progress.close()
        retain(store, args.keep_jobs)
    print_drill(report, args.show)
    page = write_page(write_html, report, args.html,
                      title=f"Drill: {topology.name} ({args.protocol})")
    print(f"\nreport: {page}")
    return drill_exit_code(report)


def _drill_scenario(args: argparse.Namespace) -> int:
    """``bastion drill --scenario correlated``: every case of the scenario on its own
    simulated cluster, against one failure-free reference; the report compares them."""
    from bastion.bench import correlated
    from bastion.report import write_html

    if args.file or args.kill or args.kill_node or args.random_kills or args.faults:
        raise UsageError("--scenario brings its own topology and faults: drop FILE, "
                         "--kill, --kill-node, --random-kills and --faults")
    if args.address is not None:
        raise UsageError("--scenario starts its own simulated cluster on 127.0.0.1: "
                         "drop --address")
    if not args.storage.startswith("local://"):
        raise UsageError("--scenario runs on a simulated cluster of this machine: use a "
                         "local:// --storage")
    storage_dir = args.storage[len("local://"):]
    check_report_path(args.html)
    progress = ProgressLine()
    try:
        reference = correlated.references(storage_dir=storage_dir)
        reports = {case.label: correlated.run_case(
            case, protocol=args.protocol, storage_dir=storage_dir, reference=reference,
            checkpoint_interval=args.checkpoint_interval, progress=progress)
            for case in correlated.CASES}
    finally:
        progress.close()
    for label, report in reports.items():
        print(f"\n== {label} ==")
        print_drill(report, args.show)
        for name, q in sorted(report.metrics.extra["queries"].items(),
                              key=lambda kv: -kv[1]["priority"]):
            back = q["available_again_s"]
            print(f"  query {name} (priority {q['priority']:g}): available again "
                  + ("never" if back is None else f"{back:.2f} s") + " after the failure")
    first = max(correlated.PRIORITIES, key=lambda name: correlated.PRIORITIES[name])
    times = {label: r.metrics.extra["queries"][first]["available_again_s"]
             for label, r in reports.items()}
    if times["progressive"] is not None and times["blocking"]:
        print(f"\nfirst-query availability progressive/blocking = "
              f"{times['progressive'] / times['blocking']:.2f}")
    main_report = reports["progressive"]
    page = write_page(write_html, main_report, args.html,
                      title="Drill: correlated failure (progressive)",
                      compared={k: v for k, v in reports.items() if k != "progressive"})
    print(f"\nreport: {page}")
    codes = [drill_exit_code(r) for r in reports.values()]
    return 1 if 1 in codes else max(codes)  # a violation says more than a missed fault


class TuneProgress:
    """A progress bar over the profiling runs of `bastion tune` on stderr: rewritten
    in place on a terminal, one line per finished run otherwise."""

    def __init__(self, stream: Any = None, *, tty: bool | None = None, width: int = 24):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if tty is None else tty
        self.width = width
        self.printed = False

    def __call__(self, progress: dict[str, Any]) -> None:
        done, total = progress["done"], progress["total"]
        filled = round(self.width * done / max(total, 1))
        line = (f"profiling [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{done}/{total} runs  {progress['what']}")
        if self.enabled:
            self.stream.write("\r" + line.ljust(78))
            self.printed = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.printed:
            self.stream.write("\n")
            self.stream.flush()
        self.printed = False


def _tune(args: argparse.Namespace, topology: Topology, store: Any, *, trt_bound_s: float,
          min_interval_s: float, max_interval_s: float, points: int, case: Case = "max",
          parallel: int = 1, duration_s: float | None = None, seed: int = 0,
          max_rate_run_s: float = 4.0, repeats: int = 1, keep_profiles: bool = False,
          failures_per_run: int = 3) -> Any:
    """Run `bastion.tune` for a command, with its progress bar; a refused option is a
    usage error, a failed profiling job a `BastionError` for the caller."""
    import bastion as bn

    progress = TuneProgress()
    try:
        return bn.tune(topology, trt_bound_s=trt_bound_s, min_interval_s=min_interval_s,
                       max_interval_s=max_interval_s, points=points, repeats=repeats,
                       failures_per_run=failures_per_run, case=case,
                       protocol=args.protocol, parallel=parallel, duration_s=duration_s,
                       seed=seed, max_rate_run_s=max_rate_run_s, progress=progress,
                       storage=store.url, address=args.address,
                       recovery=bn.Recovery(failover=args.failover),
                       keep_profiles=keep_profiles)
    except (TopologyError, StorageError, BastionError):
        raise
    except ValueError as exc:  # a bad option or a topology tuning cannot profile
        raise UsageError(str(exc)) from exc
    finally:
        progress.close()


def print_tuning(result: Any, stream: Any = None) -> None:
    """The measurements, the model's estimate per interval and the decision."""
    out = stream if stream is not None else sys.stdout
    cap = result.capacity
    print(f"\ncapacity: I_max {cap.ingest_max_per_s:,.0f} records/s (unthrottled run "
          f"{cap.job_id}), recoveries read their backlog at "
          f"{result.model.catch_up_per_s:,.0f} records/s, warm-up W best/average/worst "
          f"{'/'.join(f'{w:.2f}' for w in result.model.warmup_s)} s", file=out)
    print(table(result.rows(), header=result.HEADER), file=out)
    print(result.fits(), file=out)
    print(f"\n{result.reason}", file=out)


def cmd_tune(args: argparse.Namespace) -> int:
    from bastion.tuning import write_html

    if args.protocol in ("none", "acks"):
        raise UsageError(f"--protocol {args.protocol} takes no checkpoints; tune a "
                         "checkpointing protocol, e.g. --protocol coordinated")
    if args.min > args.max:
        raise UsageError(f"--min {args.min:g} is above --max {args.max:g}")
    if args.faults is not None:
        raise UsageError("--faults: tune injects one kill of its own into every profiling "
                         "run; drop --faults")
    if _acks_options(args) or _redundancy_options(args) is not None:
        raise UsageError("--redundancy and --latency-bound are options of protocols none "
                         "and acks, which take no checkpoints; tune does not use them")
    check_report_path(args.html)
    topology = load_topology(args.file)
    store = open_storage(args.storage)
    _warn_local_storage_on_a_cluster(args)
    try:
        result = _tune(args, topology, store, trt_bound_s=args.trt_bound,
                       min_interval_s=args.min, max_interval_s=args.max, points=args.points,
                       case=args.case, parallel=args.parallel, duration_s=args.duration,
                       seed=args.seed, max_rate_run_s=args.max_rate_run,
                       repeats=args.repeats, keep_profiles=args.keep_profiles,
                       failures_per_run=args.failures_per_run)
    except (TopologyError, StorageError):
        raise  # user errors: main prints them as one line, exit 2
    except BastionError as exc:  # a profiling job failed
        _say(str(exc))
        return EXIT_FAILED
    finally:
        retain(store, args.keep_jobs)
    print_tuning(result)
    page = write_page(write_html, result, args.html,
                      title=f"Tuning: {topology.name} ({args.protocol})")
    print(f"report: {page}")
    if result.interval_s is None:
        return EXIT_VIOLATED
    print(f"checkpoint_interval = {result.interval_s:.2f}")
    return EXIT_OK


def _auto_interval(args: argparse.Namespace) -> Any:
    """``run --checkpoint-interval auto``: tune over the default range first
    (`bastion.tuning.auto_range`); the `TuningResult` (``--retune-every`` re-tunes
    from its model while the job runs)."""
    if args.trt_bound is None:
        raise UsageError("--checkpoint-interval auto needs --trt-bound S (the worst-case "
                         "total recovery time to keep under)")
    if args.protocol == "none":
        args.protocol = "coordinated"
        _say("--checkpoint-interval auto: running under --protocol coordinated")
    if args.protocol == "acks":
        raise UsageError("--protocol acks takes no checkpoints; --checkpoint-interval auto "
                         "needs a checkpointing protocol")
    from bastion.tuning import AUTO_POINTS, auto_range

    topology = load_topology(args.file)
    try:
        min_interval_s, max_interval_s = auto_range(topology, args.duration)
    except ValueError as exc:
        raise UsageError(f"--checkpoint-interval auto: {exc}; pass --checkpoint-interval S"
                         ) from exc
    store = open_storage(args.storage)
    result = _tune(args, topology, store, trt_bound_s=args.trt_bound,
                   min_interval_s=min_interval_s, max_interval_s=max_interval_s,
                   points=AUTO_POINTS, duration_s=args.duration)
    print_tuning(result)
    if result.interval_s is None:
        raise UsageError(f"--checkpoint-interval auto: {result.reason}")
    print()
    return result


def cmd_stop(args: argparse.Namespace) -> int:
    from bastion.launcher import stop

    store = open_storage(args.storage, existing=True)
    try:
        job = stop(args.job, storage=store.url, timeout_s=args.timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except (RuntimeError, TimeoutError) as exc:
        print(f"bastion stop: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"job {job} stopped with a savepoint in {store.url}; resume it (its keyed "
          f"operators at any parallelism) with: bastion run FILE --resume-from {job}")
    return EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    from bastion.storage import prune_jobs

    store = open_storage(args.storage, existing=True)
    report = prune_jobs(store, keep=args.keep, min_age_s=args.min_age, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    for job in report.deleted:
        print(f"{verb} {job.job}  ({job.objects:,} objects, {_megabytes(job.bytes)})")
    print(f"{store.url}: {verb} {len(report.deleted)} job(s), "
          f"{_megabytes(report.freed_bytes)}; kept {len(report.kept)}")
    return EXIT_OK


def cmd_analyze(args: argparse.Namespace) -> int:
    from bastion.spark_jobs.analyze import (SUMMARY_HEADER, TABLES, AnalyzeError, analyze,
                                            find_event_logs, summary_rows)
    from bastion.spark_jobs.session import SparkSetupError, build_session, find_java

    try:
        find_java()  # seconds before Spark would fail on it, with a clearer message
    except SparkSetupError as exc:
        raise UsageError(str(exc)) from exc
    store = open_storage(args.storage, existing=True)
    try:
        logs = find_event_logs(store, args.job)
    except AnalyzeError as exc:
        raise UsageError(str(exc)) from exc
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file; pass a directory for the tables "
                         "and the report")
    spark = build_session(args.master, app_name="bastion analyze",
                          driver_host=args.driver_host, verbose=args.verbose)
    try:
        analysis = analyze(spark, store, logs, out)
    except AnalyzeError as exc:  # the store failed under the tasks
        _say(str(exc))
        return EXIT_USAGE
    finally:
        spark.stop()
    for skipped in analysis.skipped:
        _say(f"warning: skipped {skipped.reason}")
    for job in analysis.incomplete:
        _say(f"warning: job {job} has no final event object (still running, or its job "
             "master died): analysed from its chunks")
    print(table(summary_rows(analysis), SUMMARY_HEADER))
    failures = analysis.tables["failures"]
    if failures:
        print()
        print(table([(f["job"], f["failure"],
                      *(("-" if f[k] is None else f"{f[k]:.2f} s")
                        for k in ("detection_s", "restart_s", "recovery_s", "trt_s")),
                      f["fault"] or "-", f["reason"])
                     for f in failures],
                    header=("job", "#", "detection", "restart", "recovery", "TRT",
                            "fault", "reason"), numbers=False))
    # paths as the user wrote --out, not resolved: what they will type next
    print(f"\ntables: {', '.join(str(out / f'{name}.parquet') for name in TABLES)}")
    print(f"report: {out / 'report.html'}")
    return EXIT_OK


def cmd_reconstruct(args: argparse.Namespace) -> int:
    from bastion.spark_jobs.reconstruct import (SUMMARY_HEADER, ReconstructError, describe,
                                                find_instances, reconstruct_operator,
                                                summary_rows)
    from bastion.spark_jobs.session import SparkSetupError, build_session, find_java

    try:
        find_java()  # seconds before Spark would fail on it, with a clearer message
    except SparkSetupError as exc:
        raise UsageError(str(exc)) from exc
    store = open_storage(args.storage, existing=True)
    try:
        find_instances(store, args.job, args.operator)  # a wrong name before Spark starts
    except ReconstructError as exc:
        raise UsageError(str(exc)) from exc
    spark = build_session(args.master, app_name="bastion reconstruct",
                          driver_host=args.driver_host, verbose=args.verbose)
    try:
        results = reconstruct_operator(spark, store, args.job, args.operator, args.at)
    except ReconstructError as exc:  # the store failed under the tasks
        _say(str(exc))
        return EXIT_USAGE
    finally:
        spark.stop()
    at = "the end of each log" if args.at is None else f"log time {args.at:g}"
    print(f"eventual checkpoints of {args.job}/{args.operator} at {at}:")
    print(table(summary_rows(results), SUMMARY_HEADER))
    print()
    print("\n".join(describe(results)))
    return EXIT_OK


# -- arguments -----------------------------------------------------------------------------


def _number(kind: type, *, minimum: float, strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` (int or float) >= ``minimum`` (> with ``strict``)."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(
                f"{text} is too small: need {'>' if strict else '>='} {minimum:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


def _interval_or_auto(text: str) -> float | str:
    """An argparse type: 'auto' or seconds > 0."""
    if text == "auto":
        return text
    return _number(float, minimum=0, strict=True)(text)


def _redundancy(text: str) -> float | str:
    """An argparse type: 'auto' or a ratio from 0 to 2."""
    if text == "auto":
        return text
    ratio = _number(float, minimum=0)(text)
    if ratio > 2:
        raise argparse.ArgumentTypeError(f"{text} is too large: a tuple gets at most two "
                                         "extra copies (2.0)")
    return ratio


def _parse_kill(text: str) -> Any:
    import bastion as bn

    try:
        target, at = text.rsplit("@", 1)
        op, _, index = target.partition(":")
        return bn.faults.KillInstance(op, int(index or 0), at=float(at))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected OPERATOR[:INDEX]@SECONDS, e.g. count:0@2.5") from None


def _parse_kill_node(text: str) -> Any:
    import bastion as bn

    try:
        node, at = text.rsplit("@", 1)
        return bn.faults.KillNode(int(node) if node.isdigit() else node, at=float(at))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NODE@SECONDS (NODE: a position among the live Ray "
            "nodes, or a node id), e.g. 0@2.5") from None


def _parse_between(text: str) -> tuple[float, float]:
    try:
        first, last = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected FIRST,LAST in seconds, e.g. 1,4") from None
    if not 0 <= first <= last:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= FIRST <= LAST, e.g. 1,4")
    return first, last


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line, with where to read more,
    instead of the usage block followed by the error."""

    def error(self, message: str) -> NoReturn:
        _say(f"{self.prog.removeprefix('bastion').strip() + ': ' if ' ' in self.prog else ''}"
             f"{message}; see `{self.prog} --help`")
        self.exit(EXIT_USAGE)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bastion")
    except PackageNotFoundError:  # running from a source tree that is not installed
        import bastion

        return bastion.__version__


def _common(parser: argparse.ArgumentParser, *, default_protocol: str,
            protocols: list[str], file_optional: bool = False) -> None:
    """The flags ``run`` and ``drill`` share."""
    parser.add_argument("file", nargs="?" if file_optional else None,
                        help="Python file that builds a bastion.Topology at module "
                             "level (name it `topology` if there are several)")
    parser.add_argument("--protocol", default=default_protocol, choices=protocols,
                        help="fault-tolerance protocol: " + ", ".join(protocols)
                        + f" (default {default_protocol})")
    parser.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL",
                        help="where checkpoints, committed outputs and events go: "
                             "local://PATH or s3://BUCKET/PREFIX?endpoint=HOST:PORT "
                             f"(default {DEFAULT_STORAGE}; credentials from "
                             "BASTION_S3_ACCESS_KEY/BASTION_S3_SECRET_KEY)")
    parser.add_argument("--address", default=None, metavar="ADDR",
                        help="Ray cluster to join: its head's GCS address HOST:PORT "
                             "(the --port of `ray start --head`, e.g. 127.0.0.1:6390), "
                             "auto (the cluster this machine is a node of) or "
                             "ray://HEAD:10001 (Ray's client, needs ray[client]) "
                             "(default: start a local Ray on 127.0.0.1)")
    parser.add_argument("--keep-jobs", type=_number(int, minimum=0),
                        default=DEFAULT_KEEP_JOBS, metavar="N",
                        help="after the run, delete jobs of a local store beyond the N "
                             "newest, except those written in the last hour (default "
                             f"{DEFAULT_KEEP_JOBS}; 0 keeps none older, as gc --keep 0)")
    parser.add_argument("--faults", default=None, metavar="FILE",
                        help="inject the faults a YAML fault file describes (operator -> "
                             "instances -> timing / drop_frames / link_outage / crash; "
                             "see bastion.faults)")
    parser.add_argument("--acks-mode", choices=["fine", "xor"], default=None,
                        help="--protocol acks: what a source tracks per root tuple: the "
                             "set of pending tuples (fine, the default) or one XOR value "
                             "(xor, Storm's acker)")
    parser.add_argument("--ack-timeout", type=_number(float, minimum=0, strict=True),
                        default=None, metavar="S",
                        help="--protocol acks: seconds before a root tuple not fully "
                             "acknowledged is replayed (default 5)")
    parser.add_argument("--max-pending", type=_number(int, minimum=1), default=None,
                        metavar="N",
                        help="--protocol acks: pending root tuples per source instance "
                             "before it stops reading (default 100000)")
    parser.add_argument("--failover", choices=["local", "global"], default="local",
                        help="which tasks a failure restarts: local (default), only what "
                             "the protocol's recovery needs — the failed tasks' regions "
                             "under coordinated, the failed tasks alone under acks; "
                             "global, every task")
    parser.add_argument("--redundancy", type=_redundancy, default=None, metavar="R",
                        help="send a share R (0 to 2) of the tuples into every operator "
                             "that can take copies to the next instance as well, and keep "
                             "the first result of each (protocols none and acks); 'auto': "
                             "the resiliency manager picks R to meet --latency-bound")
    parser.add_argument("--latency-bound", type=_number(float, minimum=0, strict=True),
                        default=None, metavar="MS",
                        help="--redundancy auto: the p90 latency (ms) of each second to "
                             "keep under")
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's start-up notices, storage retries and the "
                             "traceback of an error")


def build_parser() -> argparse.ArgumentParser:
    protocols = _protocols()
    parser = _Parser(prog="bastion", description="Fault-tolerant stream processing on Ray.",
                     epilog="exit codes: 0 done (drill: exactly-once), 1 the job failed "
                            "(drill: violated), 2 usage error, 3 drill inconclusive, "
                            "4 the drill could not run, 130 interrupted")
    parser.add_argument("--version", action="version", version=f"bastion {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser,
                                help="run, drill, tune, gc, analyze or reconstruct; `bastion COMMAND "
                                     "--help` lists its flags")

    run = sub.add_parser("run", help="run a topology file and print a summary",
                         description="Run the topology FILE builds, with a progress line, "
                                     "then print throughput, latency, per-operator counts "
                                     "and the first committed records of every sink.")
    _common(run, default_protocol="none", protocols=protocols)
    run.add_argument("--checkpoint-interval", type=_interval_or_auto,
                     default=None, metavar="S",
                     help="seconds between checkpoints (default 1.0 under a "
                          "checkpointing protocol); 'auto': tune it first for "
                          "--trt-bound, as `bastion tune` does, then run with it")
    run.add_argument("--trt-bound", type=_number(float, minimum=0, strict=True),
                     default=None, metavar="S",
                     help="--checkpoint-interval auto: the worst-case total recovery "
                          "time (s) the chosen interval must keep under")
    run.add_argument("--retune-every", type=_number(float, minimum=0, strict=True),
                     default=None, metavar="S",
                     help="--checkpoint-interval auto: every S seconds, measure the input "
                          "rate and move the interval when the tuned model says the bound "
                          "would break at it, or that the optimum moved by more than 25%%; "
                          "each move is an interval_retuned event")
    run.add_argument("--duration", type=_number(float, minimum=0, strict=True),
                     default=None, metavar="S",
                     help="seconds to run unbounded sources for (required if any)")
    run.add_argument("--buffer-timeout-ms", type=_number(float, minimum=0), default=5.0,
                     metavar="MS",
                     help="longest time a record waits in an output buffer (default 5)")
    run.add_argument("--no-chaining", action="store_true",
                     help="run every operator as its own task (no operator chaining)")
    run.add_argument("--fail-fast", action="store_true",
                     help="stop at the first user-function error instead of sending the "
                          "record to the dead-letter output")
    run.add_argument("--resume-from", default=None, metavar="JOB",
                     help="start from the state earlier job JOB (same --storage) left "
                          "(--protocol cec: the eventual checkpoints `bastion "
                          "reconstruct` stored, else its logs)")
    run.add_argument("--show", type=_number(int, minimum=0), default=5, metavar="N",
                     help="committed records to print per sink (default 5)")
    run.set_defaults(handler=cmd_run)

    drill = sub.add_parser(
        "drill", help="kill processes mid-run and verify exactly-once",
        description="Run FILE failure-free and with faults, compare the committed records "
                    "by lineage id, print a summary and write an HTML report.",
        epilog="exit codes: 0 exactly-once, 1 violated (lost/duplicated/corrupted "
               "records), 2 usage error, 3 inconclusive (a fault did not land), "
               "4 the drill could not run, 130 interrupted")
    _common(drill, default_protocol="coordinated", protocols=protocols, file_optional=True)
    drill.add_argument("--scenario", choices=["correlated"], default=None,
                       help="instead of FILE and faults: a built-in scenario. correlated: "
                            "three queries over one bid stream on a simulated 3-node "
                            "cluster, two nodes lost at once, nodes arriving one by one; "
                            "recovered progressively, blockingly and with all capacity at "
                            "once (bastion.bench.correlated)")
    drill.add_argument("--checkpoint-interval", type=_number(float, minimum=0, strict=True),
                       default=1.0, metavar="S",
                       help="seconds between checkpoints of the faulty run (default 1.0)")
    drill.add_argument("--kill", type=_parse_kill, action="append", default=[],
                       metavar="OP[:I]@S",
                       help="kill the worker running instance I (default 0) of operator "
                            "OP at S seconds into the faulty run; repeatable")
    drill.add_argument("--kill-node", type=_parse_kill_node, action="append", default=[],
                       metavar="NODE@S",
                       help="kill every process of the job on Ray node NODE (its position "
                            "among the live nodes, or its id) at S seconds; repeatable")
    drill.add_argument("--random-kills", type=_number(int, minimum=0), default=0,
                       metavar="N", help="kill N random workers at random times in "
                                         "--between")
    drill.add_argument("--between", type=_parse_between, default=(1.0, 3.0),
                       metavar="FIRST,LAST",
                       help="window of the random kills, seconds (default 1,3)")
    drill.add_argument("--seed", type=int, default=0,
                       help="seed of the random kills (default 0): same seed, same kills")
    drill.add_argument("--html", default="drill-report.html", metavar="PATH",
                       help="where to write the HTML report (default drill-report.html)")
    drill.add_argument("--show", type=_number(int, minimum=0), default=5, metavar="N",
                       help="violations to print per kind (default 5)")
    drill.set_defaults(handler=cmd_drill)

    tune = sub.add_parser(
        "tune", help="choose the checkpoint interval for a bound on recovery time",
        description="Profile FILE at --points checkpoint intervals from --min to --max "
                    "(one injected kill per run, plus one run with the sources "
                    "unthrottled), model the total recovery time (TRT) and latency of "
                    "each interval (Chiron), and print the interval with the least "
                    "latency whose TRT stays under --trt-bound; write the fitted curves "
                    "to an HTML page.",
        epilog="exit codes: 0 an interval meets the bound, 1 none in the range does, "
               "2 usage error, 4 a profiling run failed, 130 interrupted")
    _common(tune, default_protocol="coordinated", protocols=protocols)
    tune.add_argument("--trt-bound", type=_number(float, minimum=0, strict=True),
                      required=True, metavar="S",
                      help="the total recovery time (s) to keep under")
    tune.add_argument("--min", type=_number(float, minimum=0, strict=True), default=0.5,
                      metavar="S", help="shortest checkpoint interval to try (default 0.5)")
    tune.add_argument("--max", type=_number(float, minimum=0, strict=True), default=8.0,
                      metavar="S", help="longest checkpoint interval to try (default 8)")
    tune.add_argument("--points", type=_number(int, minimum=2), default=6, metavar="N",
                      help="intervals to profile, evenly spaced (default 6)")
    tune.add_argument("--repeats", type=_number(int, minimum=1), default=1, metavar="N",
                      help="profiling runs per interval; the medians over their kills are "
                           "modelled (default 1)")
    tune.add_argument("--failures-per-run", type=_number(int, minimum=1), default=3,
                      metavar="N",
                      help="kills in each profiling run, each recovery complete before the "
                           "next, each measured on its own (default 3, as Chiron; a short "
                           "input is read for longer)")
    tune.add_argument("--case", choices=["max", "avg", "min"], default="max",
                      help="which TRT must stay under the bound: max (worst case, the "
                           "default), avg or min")
    tune.add_argument("--parallel", type=_number(int, minimum=1), default=1, metavar="N",
                      help="profiling runs side by side, as many as the cluster's CPUs "
                           "hold (default 1: one after the other)")
    tune.add_argument("--duration", type=_number(float, minimum=0, strict=True),
                      default=None, metavar="S",
                      help="seconds per profiling run for unbounded sources")
    tune.add_argument("--max-rate-run", type=_number(float, minimum=0, strict=True),
                      default=4.0, metavar="S",
                      help="seconds of the run with the sources unthrottled that measures "
                           "the maximum ingest rate (default 4)")
    tune.add_argument("--seed", type=int, default=0,
                      help="seed of the kills' random times (default 0)")
    tune.add_argument("--html", default="tuning-report.html", metavar="PATH",
                      help="where to write the page with the fitted curves (default "
                           "tuning-report.html)")
    tune.add_argument("--keep-profiles", action="store_true",
                      help="keep the profiling jobs in the store (about 100 MB); by "
                           "default they are deleted once measured")
    tune.set_defaults(handler=cmd_tune)

    stop_ = sub.add_parser(
        "stop", help="stop a running job with a savepoint",
        description="Stop the running job JOB with a savepoint: every source stops "
                    "reading, what was read is processed and committed once, and every "
                    "task's state is written to the store, to resume with `bastion run "
                    "FILE --resume-from JOB` (under any checkpointing protocol, "
                    "keyed operators at any parallelism). Waits until the savepoint is "
                    "complete.")
    stop_.add_argument("job", metavar="JOB", help="the running job's id")
    stop_.add_argument("--savepoint", action="store_true",
                       help="stop with a savepoint (the only way a job stops; accepted "
                            "for the form Flink users know)")
    stop_.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL",
                       help=f"the store the job runs on (default {DEFAULT_STORAGE})")
    stop_.add_argument("--timeout", type=_number(float, minimum=0), default=120.0,
                       metavar="S", help="give up after S seconds (default 120)")
    stop_.add_argument("--verbose", action="store_true", help="show the traceback of an error")
    stop_.set_defaults(handler=cmd_stop)

    gc = sub.add_parser(
        "gc", help="delete old job folders from a store",
        description="Delete the job folders (checkpoints, committed outputs, events) of a "
                    "store beyond the newest --keep, except jobs written within "
                    "--min-age seconds (they may still be running).")
    gc.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL",
                    help=f"the store to prune (default {DEFAULT_STORAGE})")
    gc.add_argument("--keep", type=_number(int, minimum=0), default=DEFAULT_KEEP_JOBS,
                    metavar="N", help="newest jobs to keep (default "
                                      f"{DEFAULT_KEEP_JOBS}, as run's --keep-jobs)")
    gc.add_argument("--min-age", type=_number(float, minimum=0), default=RETENTION_MIN_AGE_S,
                    metavar="S", help="never delete a job written in the last S seconds "
                                      f"(default {RETENTION_MIN_AGE_S:.0f})")
    gc.add_argument("--dry-run", action="store_true",
                    help="list what would be deleted, delete nothing")
    gc.add_argument("--verbose", action="store_true", help="show the traceback of an error")
    gc.set_defaults(handler=cmd_gc)

    analyze = sub.add_parser(
        "analyze", help="analyse the event logs of jobs with Spark",
        description="Read the events and progress timelines that jobs left in a store, "
                    "with a Spark job, and write Parquet tables (per second, per "
                    "checkpoint, per failure, per job) and an HTML page comparing the "
                    "jobs to --out.")
    _spark_store_option(analyze, "the store the jobs ran on")
    analyze.add_argument("--job", action="append", default=[], metavar="JOB",
                         help="a job id to analyse; repeatable (default: every job in "
                              "the store)")
    analyze.add_argument("--out", required=True, metavar="DIR",
                         help="directory for the tables (DIR/<table>.parquet) and "
                              "DIR/report.html; tables there are replaced")
    _spark_session_options(analyze)
    analyze.set_defaults(handler=cmd_analyze)

    rebuild = sub.add_parser(
        "reconstruct", help="rebuild an operator's eventual checkpoints with Spark",
        description="Read the output logs of every instance of --operator with a Spark "
                    "job, rebuild each instance's eventual checkpoint (CEC) from the "
                    "control tuples, write it to jobs/JOB/eventual/OP/INSTANCE/ in the "
                    "store and print what was found. Damaged log records are reported "
                    "and never loaded.")
    _spark_store_option(rebuild, "the store holding the logs")
    rebuild.add_argument("--job", required=True, metavar="JOB", help="the job id")
    rebuild.add_argument("--operator", required=True, metavar="OP",
                         help="the operator whose instances' checkpoints to rebuild")
    rebuild.add_argument("--at", type=float, default=None, metavar="T",
                         help="log time (a record's ts) to rebuild the checkpoint at "
                              "(default: the end of each log)")
    _spark_session_options(rebuild)
    rebuild.set_defaults(handler=cmd_reconstruct)
    for summarised in (run, drill, tune, analyze):   # one meaning per printed figure
        summarised.epilog = ((summarised.epilog + ". ") if summarised.epilog else "") + \
            "What each printed figure means: docs/metrics.md"
    return parser


def _spark_store_option(command: argparse.ArgumentParser, what: str) -> None:
    command.add_argument("--storage", default=DEFAULT_STORAGE, metavar="URL",
                         help=f"{what} (default {DEFAULT_STORAGE}; credentials from "
                              "BASTION_S3_ACCESS_KEY/BASTION_S3_SECRET_KEY, also in the "
                              "Spark executors)")


def _spark_session_options(command: argparse.ArgumentParser) -> None:
    """The options of every command that runs a Spark job."""
    command.add_argument("--master", default="local[2]", metavar="M",
                         help="Spark master: local[N] or a cluster URL such as "
                              "spark://HOST:7077 (default local[2])")
    command.add_argument("--driver-host", default="127.0.0.1", metavar="ADDR",
                         help="address the Spark driver listens on (default 127.0.0.1; "
                              "with a cluster --master, one its executors can reach)")
    command.add_argument("--verbose", action="store_true",
                         help="show Spark's own log and the traceback of an error")


# -- quiet by default ----------------------------------------------------------------------


class _OnlyErrors(logging.Filter):
    """Lets through records of level ERROR and above."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Keep Ray's start-up notices (the token-authentication warning on every
    command, ...) and Bastion's own warnings (storage retries) off the terminal while
    a command runs; errors still show.

    Ray configures its ``ray`` logger and terminal handler when it is imported, and
    ``ray.init`` sets that logger's level again (the launcher asks for WARNING), so a
    level set here would not last: the filter sits on the handler instead, which
    ``ray.init`` keeps. Everything is put back afterwards, for callers of `main`
    that go on in the same process (tests)."""
    import ray  # noqa: F401  (creates the "ray" logger's handlers)

    only_errors = _OnlyErrors()
    handlers = list(logging.getLogger("ray").handlers)
    ours = logging.getLogger("bastion")
    level = ours.level
    for handler in handlers:
        handler.addFilter(only_errors)
    ours.setLevel(logging.ERROR)
    try:
        yield
    finally:
        ours.setLevel(level)
        for handler in handlers:
            handler.removeFilter(only_errors)


@contextlib.contextmanager
def verbose_logs() -> Iterator[None]:
    """``--verbose``: Bastion's debug records, and Ray's start-up notices with them
    (`bastion.launcher.ensure_ray` lets them through at this level)."""
    ours = logging.getLogger("bastion")
    level = ours.level
    ours.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        ours.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with verbose_logs() if args.verbose else quiet_logs():
            return args.handler(args)
    except KeyboardInterrupt:
        if sys.stderr.isatty():
            print(file=sys.stderr)  # end the progress line that ^C interrupted
        _say("interrupted")
        return EXIT_INTERRUPTED
    except ConnectionError as exc:  # Ray could not reach the cluster
        if args.verbose:
            traceback.print_exc()
        _say(f"cannot reach the Ray cluster at {getattr(args, 'address', None)}: {exc}; "
             "check --address")
        return EXIT_USAGE
    except (UsageError, TopologyError, StorageError, UnstorableValueError) as exc:
        if args.verbose:
            traceback.print_exc()
        _say(str(exc))
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
