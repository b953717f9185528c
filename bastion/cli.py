"""The ``bastion`` command line.

``bastion run FILE`` loads a Python file that builds a `Topology` (a module-level
variable; name it ``topology`` when the file has several), runs it with a live
progress line, and prints a summary: throughput, latency percentiles, per-operator
record counts, dead letters, and the first committed records of each sink.

``bastion drill FILE --kill OP[:I]@S ...`` runs a recovery drill (`bastion.drills`):
a failure-free reference and a faulty run, with a progress line for each, then a
summary table, the first lost / duplicated / corrupted records with their lineage
ids, and a self-contained HTML report. Its exit code is the verdict, so scripts and
CI can act on it:

====  ===================================================================
code  meaning
====  ===================================================================
0     exactly-once: every fault landed; nothing lost, duplicated, corrupted
1     violated: a record was lost, duplicated or corrupted
2     usage error: bad arguments, no faults, a fault target that does not exist
3     inconclusive: nothing violated, but a fault did not land (the job ended
      first, nothing to kill) — the drill proved nothing
4     the drill could not run (a topology error, a job that failed)
====  ===================================================================
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bastion.errors import BastionError
from bastion.topology import Topology


def load_topology(path: str) -> Topology:
    """The topology defined by the Python file at ``path``."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"bastion: no such file: {path}")
    name = file.stem.replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"bastion: cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so its functions can be shipped to the workers
    spec.loader.exec_module(module)
    if isinstance(getattr(module, "topology", None), Topology):
        return module.topology
    found = [v for v in vars(module).values() if isinstance(v, Topology)]
    if len(found) != 1:
        raise SystemExit(f"bastion: {path} defines {len(found)} Topology objects; "
                         "name the one to run `topology`")
    return found[0]


class ProgressLine:
    """Rewrites one terminal line with records read and written and the current rate.

    A drill makes several runs; progress that names its run (``"run"``) starts a new
    line for each, and the rate restarts with it."""

    def __init__(self, stream: Any = None):
        self.stream = stream if stream is not None else sys.stderr  # as it is now
        self.last: tuple[float, int] | None = None
        self.run: str | None = None
        self.enabled = self.stream.isatty()

    def __call__(self, progress: dict[str, Any]) -> None:
        run = progress.get("run")
        if run != self.run:
            self.close()
            self.run, self.last = run, None
        now, read = time.monotonic(), progress["source_records"]
        rate = 0.0
        if self.last is not None and now > self.last[0]:
            rate = (read - self.last[1]) / (now - self.last[0])
        self.last = (now, read)
        label = f"{run}: " if run else ""
        line = (f"{label}[{progress['phase']:>7}] {progress['elapsed_s']:6.1f} s  "
                f"in {read:>12,}  out {progress['sink_records']:>12,}  {rate:>12,.0f} rec/s")
        if self.enabled:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.last is not None:
            self.stream.write("\n")
            self.stream.flush()
        self.last = None


def table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None,
          numbers: bool = True) -> str:
    """Aligned columns; the first is left-aligned, the others right-aligned as
    numbers, or left-aligned too when they hold text (``numbers=False``)."""
    cells = [list(map(str, r)) for r in ([header] if header else []) + list(rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 or not numbers else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in cells]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    import bastion as bn

    topology = load_topology(args.file)
    progress = ProgressLine()
    try:
        result = bn.run(topology, protocol=args.protocol, address=args.address,
                        duration_s=args.duration, buffer_timeout_ms=args.buffer_timeout_ms,
                        chaining=not args.no_chaining, fail_fast=args.fail_fast,
                        progress=progress)
    except BastionError as exc:
        progress.close()
        print(f"bastion: {exc}", file=sys.stderr)
        return 1
    progress.close()
    m = result.metrics
    print(f"\njob {result.job_id}: {result.plan.splitlines()[0]}")
    print(table(m.summary_rows()))
    print()
    print(table([(name, f"{c.records_in:,}", f"{c.records_out:,}")
                 for name, c in m.operators.items()], header=("operator", "in", "out")))
    for sink, values in result.outputs.items():
        print(f"\n{sink}: {len(values):,} committed records"
              + (", first ones:" if values else ""))
        for value in values[: args.show]:
            print(f"  {value!r}")
    if result.dead_letters:
        print(f"\ndead letters: {len(result.dead_letters):,}, first ones:")
        for letter in result.dead_letters[: args.show]:
            print(f"  {letter.operator}[{letter.index}] {letter.reason}: {letter.value!r} "
                  f"({letter.error})")
    return 0


def _parse_kill(text: str) -> Any:
    import bastion as bn

    try:
        target, at = text.rsplit("@", 1)
        op, _, index = target.partition(":")
        return bn.faults.KillInstance(op, int(index or 0), at=float(at))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--kill {text!r}: expected OPERATOR[:INDEX]@SECONDS, e.g. count:0@2.5") from None


def _parse_kill_node(text: str) -> Any:
    import bastion as bn

    try:
        node, at = text.rsplit("@", 1)
        return bn.faults.KillNode(int(node) if node.isdigit() else node, at=float(at))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--kill-node {text!r}: expected NODE@SECONDS (NODE: a position among the "
            f"live Ray nodes, or a node id), e.g. 0@2.5") from None


EXIT_OK, EXIT_VIOLATED, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_FAILED = 0, 1, 2, 3, 4
_EXIT_CODES = {"exactly-once": EXIT_OK, "violated": EXIT_VIOLATED,
               "inconclusive": EXIT_INCONCLUSIVE}


def drill_exit_code(report: Any) -> int:
    """The exit code of ``bastion drill`` for a drill's verdict."""
    return _EXIT_CODES[report.verdict]


def print_drill(report: Any, show: int, stream: Any = None) -> None:
    """The drill's summary table, then the first violations with their ids."""
    stream = stream or sys.stdout
    print(table(report.summary_rows(), numbers=False), file=stream)
    for kind, total, items in (("lost", report.lost, report.lost_examples),
                               ("duplicated", report.duplicated, report.duplicated_examples),
                               ("corrupted", report.corrupted, report.corrupted_examples)):
        if items and show > 0:
            print(f"\nfirst {min(show, len(items))} of {total:,} {kind} records:",
                  file=stream)
            for violation in items[:show]:
                print(f"  {report.describe(violation)}", file=stream)


def _random_kills(args: argparse.Namespace) -> Any:
    import bastion as bn

    try:
        first, last = (float(x) for x in args.between.split(","))
    except ValueError:
        raise ValueError(f"--between {args.between!r}: expected FIRST,LAST in seconds, "
                         "e.g. 1,4") from None
    if not 0 <= first <= last:
        raise ValueError(f"--between {args.between!r}: need 0 <= FIRST <= LAST")
    return bn.faults.RandomKills(args.random_kills, (first, last))


def cmd_drill(args: argparse.Namespace) -> int:
    import bastion as bn
    from bastion.report import write_html

    topology = load_topology(args.file)
    faults = list(args.kill) + list(args.kill_node)
    progress = ProgressLine()
    try:
        if args.random_kills:
            faults.append(_random_kills(args))
        if not faults:
            raise ValueError("a drill needs faults: --kill OP[:I]@S, --kill-node N@S or "
                             "--random-kills N")
        report = bn.drill(topology, protocol=args.protocol, faults=faults, seed=args.seed,
                          checkpoint_interval=args.checkpoint_interval,
                          storage=args.storage, address=args.address, progress=progress)
    except ValueError as exc:  # bad arguments, a fault target that does not exist
        progress.close()
        print(f"bastion: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BastionError as exc:
        progress.close()
        print(f"bastion: {exc}", file=sys.stderr)
        return EXIT_FAILED
    progress.close()
    print_drill(report, args.show)
    page = write_html(report, args.html, title=f"Drill: {topology.name} ({args.protocol})")
    print(f"\nreport: {page}")
    return drill_exit_code(report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bastion",
                                     description="Fault-tolerant stream processing on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a topology file and print a summary")
    run.add_argument("file", help="Python file that builds a bastion Topology")
    run.add_argument("--duration", type=float, default=None, metavar="S",
                     help="seconds to run unbounded sources for")
    run.add_argument("--address", default=None,
                     help="Ray cluster to use (ray://head:10001 or auto); default: local")
    run.add_argument("--buffer-timeout-ms", type=float, default=5.0, metavar="N",
                     help="longest time a record waits in an output buffer (default 5)")
    run.add_argument("--protocol", default="none", help="fault-tolerance protocol")
    run.add_argument("--no-chaining", action="store_true",
                     help="run every operator as its own task")
    run.add_argument("--fail-fast", action="store_true",
                     help="stop at the first user-function error")
    run.add_argument("--show", type=int, default=5, metavar="N",
                     help="committed records to print per sink (default 5)")
    run.set_defaults(handler=cmd_run)

    drill = sub.add_parser(
        "drill", help="kill processes mid-run and verify exactly-once",
        description="Run FILE failure-free and with faults, compare the committed records "
                    "by lineage id, print a summary and write an HTML report.",
        epilog="exit codes: 0 exactly-once, 1 violated (lost/duplicated/corrupted "
               "records), 2 usage error, 3 inconclusive (a fault did not land), "
               "4 the drill could not run")
    drill.add_argument("file", help="Python file that builds a bastion Topology")
    drill.add_argument("--protocol", default="coordinated")
    drill.add_argument("--checkpoint-interval", type=float, default=1.0, metavar="S")
    drill.add_argument("--kill", type=_parse_kill, action="append", default=[],
                       metavar="OP[:I]@S", help="kill instance I of OP at S seconds")
    drill.add_argument("--kill-node", type=_parse_kill_node, action="append", default=[],
                       metavar="NODE@S", help="kill every process of the job on a Ray node")
    drill.add_argument("--random-kills", type=int, default=0, metavar="N")
    drill.add_argument("--between", default="1,3", metavar="FIRST,LAST",
                       help="window for random kills, seconds (default 1,3)")
    drill.add_argument("--seed", type=int, default=0)
    drill.add_argument("--storage", default="local://.bastion")
    drill.add_argument("--address", default=None)
    drill.add_argument("--html", default="drill-report.html", metavar="PATH",
                       help="where to write the HTML report (default drill-report.html)")
    drill.add_argument("--show", type=int, default=5, metavar="N",
                       help="violations to print per kind (default 5)")
    drill.set_defaults(handler=cmd_drill)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
