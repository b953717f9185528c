"""Imports point one way: the layers of `bastion` (DESIGN §3) checked on the source.

The test reads every module under ``bastion/`` with `ast` — nothing is imported, so
an import inside a function or under ``TYPE_CHECKING`` counts like any other — and
fails on an arrow that points the wrong way:

- nothing under ``runtime/`` names a concrete protocol: it may import the registry
  (``bastion.protocols``) and the seam (``bastion.protocols.base``), nothing else of
  ``bastion.protocols``;
- a protocol reaches the runtime only through the seam: of ``bastion.runtime`` it
  imports the wire types of ``bastion.runtime.records`` and nothing else, and nothing
  that drives a job (launcher, drills, command line, scheduler, the package root);
- the scheduler imports no protocol module, and nothing above the runtime: not the
  launcher, the drills, the command line, the front of tuning (``bastion.tuning``),
  the reports and benchmarks, or the package root (``import bastion``, ``from bastion
  import run``) — what drives a real job reaches the scheduler through an interface it
  defines (`bastion.scheduler.tuning.Profiler`, which ``bastion.tuning`` fills with
  ``bastion.run``);
- the connectors do not import the descriptions that open them (``bastion.sinks``,
  ``bastion.sources``): both sides import the interfaces of ``bastion.io_interfaces``
  (`SinkWriter`, `SourceReader`, `LogDescription`), which import nothing of ours, so
  description → connector → interfaces is no circle;
- storage imports nothing of ours outside ``bastion.storage``;
- the Spark jobs (``bastion.spark_jobs``) read the store and nothing else of a running
  engine: storage, the wire types of ``bastion.runtime.records`` and the event-log
  format of ``bastion.runtime.events``, the recovery-time definitions of
  ``bastion.runtime.recovery_times`` (the figures every command reports), and the
  CEC control-tuple format and
  reconstruction of ``bastion.protocols.eventual`` (pure logic the Spark job must share
  with the in-process recovery) — their Python workers must not load Ray, the
  runtime or the drills;
- the descriptions — the DSL (``topology``, ``windows``, ``aggregations``, ``codecs``,
  ``errors``), the sources and sinks a topology names and their reader/writer
  interfaces (``io_interfaces``), and the faults a drill names —
  import, at module level, nothing that runs a job or does I/O: not the runtime, the
  scheduler, the protocols, the connectors, storage (but for the root error class in
  ``bastion.storage.errors``), the launcher, the drills or the command line. Only
  module-level imports count for this rule: a sink's ``open`` imports its connector
  when a job runs, and building a topology must not.

It also checks that a protocol touches nothing of its task or job master beyond the
seam (`TaskContext`, `MasterContext`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "bastion"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_level(tree: ast.AST):
    """The nodes of ``tree`` that run when the module is imported: everything but the
    bodies of functions (class bodies and ``if TYPE_CHECKING:`` blocks count)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def is_module(name: str, root: Path) -> bool:
    """Whether ``name`` (``bastion.x.y``) is a module or package of the tree at ``root``."""
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path, root: Path, only_module_level: bool = False) -> set[str]:
    """Every ``bastion`` module a file imports (with ``only_module_level``: at import
    time); ``from bastion import x`` names ``bastion.x`` (a submodule, or an attribute
    of the package: both are arrows) and, when ``x`` is an attribute rather than a
    submodule, the package itself (``from bastion import run`` uses the package root;
    ``from bastion import faults`` only the module ``bastion.faults``)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in module_level(tree) if only_module_level else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names]
            found.update(names)
            if not all(is_module(name, root) for name in names):
                found.add(target)
    return {m for m in found if m == "bastion" or m.startswith("bastion.")}


def graph(root: Path = PACKAGE, only_module_level: bool = False) -> dict[str, set[str]]:
    return {module_name(p, root): imports_of(p, root, only_module_level)
            for p in sorted(root.rglob("*.py"))}


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# What runs above the runtime and drives jobs: the scheduler imports none of it.
ABOVE_RUNTIME = ("bastion.launcher", "bastion.drills", "bastion.cli", "bastion.tuning",
                 "bastion.report", "bastion.bench")


def above_runtime(target: str) -> bool:
    """Whether ``target`` is a module above the runtime, or the package root (whose
    names are the launcher's, the drills' and the tuning's)."""
    return target == "bastion" or any(under(target, p) for p in ABOVE_RUNTIME)


def wrong_arrows(modules: dict[str, set[str]]) -> list[str]:
    concrete_protocols = [m for m in modules if under(m, "bastion.protocols")
                          and m not in ("bastion.protocols", "bastion.protocols.base")]
    # lineage ids and window specs are descriptions of records and state, not engine
    # internals: CEC reads a record's source position from its id, and which windows
    # it can split into parts from the spec; the durable codec's byte format is a
    # format as the wire types are: CEC's reader cuts the runs its writer packs
    protocol_may_use = ("bastion.protocols", "bastion.runtime.records", "bastion.storage",
                        "bastion.errors", "bastion.topology", "bastion.lineage",
                        "bastion.windows", "bastion.runtime.durable")
    # bastion.protocols.eventual: the CEC control-tuple format and the reconstruction,
    # pure logic over log records; the Spark reconstruction must run that very code
    # bastion.runtime.recovery_times: what a recovery time is, pure logic over events
    # and progress points; analyze must report the figures drill and tune report
    spark_jobs_may_use = ("bastion.spark_jobs", "bastion.storage", "bastion.runtime.records",
                          "bastion.runtime.events", "bastion.runtime.recovery_times",
                          "bastion.protocols.eventual")
    wrong = []
    for module, imported in modules.items():
        for target in sorted(imported):
            why = None
            if under(module, "bastion.runtime") and any(under(target, p)
                                                         for p in concrete_protocols):
                why = "the runtime names a concrete protocol (use the registry)"
            elif under(module, "bastion.scheduler") and above_runtime(target):
                why = ("the scheduler imports what drives a job (define an interface "
                       "that the layer above fills)")
            elif under(module, "bastion.connectors") and any(
                    under(target, p) for p in ("bastion.sinks", "bastion.sources")):
                why = ("a connector imports the description that opens it, a circle "
                       "(import bastion.io_interfaces)")
            elif module == "bastion.io_interfaces":
                why = ("the interfaces between descriptions and connectors import "
                       "nothing of ours")
            elif under(module, "bastion.protocols") and not any(
                    under(target, p) for p in protocol_may_use):
                why = "a protocol reaches past the seam"
            elif under(module, "bastion.scheduler") and under(target, "bastion.protocols"):
                why = "the scheduler imports a protocol module"
            elif under(module, "bastion.storage") and not under(target, "bastion.storage"):
                why = "storage imports something of ours"
            elif under(module, "bastion.spark_jobs") and not any(
                    under(target, p) for p in spark_jobs_may_use):
                why = "a Spark job imports more than the store and the event format"
            if why:
                wrong.append(f"{module} -> {target}: {why}")
    return wrong


DESCRIPTIONS = ("bastion.topology", "bastion.windows", "bastion.aggregations",
                "bastion.codecs", "bastion.errors", "bastion.sources", "bastion.sinks",
                "bastion.io_interfaces", "bastion.faults")
RUNS_OR_DOES_IO = ("bastion.runtime", "bastion.scheduler", "bastion.protocols",
                   "bastion.connectors", "bastion.storage", "bastion.launcher",
                   "bastion.drills", "bastion.cli", "bastion.report")


def wrong_description_arrows(modules: dict[str, set[str]]) -> list[str]:
    """Module-level imports of a description module that load what runs a job or does
    I/O (``modules``: a graph of module-level imports)."""
    wrong = []
    for module in DESCRIPTIONS:
        for target in sorted(modules[module]):
            if any(under(target, p) for p in RUNS_OR_DOES_IO) and not under(
                    target, "bastion.storage.errors"):
                wrong.append(f"{module} -> {target}: a description imports what runs a "
                             "job or does I/O")
    return wrong


def all_wrong_arrows(root: Path = PACKAGE) -> list[str]:
    return (wrong_arrows(graph(root))
            + wrong_description_arrows(graph(root, only_module_level=True)))


def test_every_import_points_the_right_way():
    modules = graph()
    assert "bastion.runtime.instance" in modules and "bastion.protocols.base" in modules
    assert all(m in modules for m in DESCRIPTIONS)
    assert all_wrong_arrows() == []


def test_a_description_may_open_its_connector_inside_a_method():
    """A sink's ``open`` runs in a worker when the job runs: the import there is not
    part of building a topology, and the rule must not count it."""
    everything, at_import = graph(), graph(only_module_level=True)
    assert "bastion.connectors.logs" in everything["bastion.sinks"]
    assert "bastion.connectors.logs" not in at_import["bastion.sinks"]


@pytest.mark.parametrize("module,line", [
    ("runtime/job.py", "from bastion.protocols.coordinated import Barrier"),
    ("runtime/instance.py", "from bastion.protocols import uncoordinated"),
    ("protocols/cic.py", "from bastion.runtime.instance import Task"),
    ("protocols/coordinated.py", "from ..runtime import channel"),
    ("scheduler/__init__.py", "import bastion.protocols.base"),
    ("storage/log.py", "from bastion.runtime.records import Batch"),
    ("topology.py", "from bastion.runtime.plan import build_plan"),
    ("windows.py", "import bastion.launcher"),
    ("sinks.py", "from bastion.storage import open_store"),
    ("sources.py", "from bastion.connectors.logs import LogSourceReader"),
    ("errors.py", "from bastion.storage.store import ObjectStore"),
    ("faults.py", "from bastion.scheduler import placement"),
    ("spark_jobs/analyze.py", "from bastion.drills import fault_outcomes"),
    ("spark_jobs/reconstruct.py", "from bastion.protocols.coordinated import Barrier"),
])
def test_a_wrong_arrow_is_found(tmp_path, module, line):
    """The check itself can fail: a copy of the package with one wrong import added."""
    copy = planted(tmp_path, module, line)
    found = all_wrong_arrows(copy)
    assert found and all(f.startswith(module_name(copy / module, copy) + " -> ")
                         for f in found)


def planted(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the package under ``tmp_path`` with ``line`` (source text, perhaps a
    whole function) appended to ``module``; returns the copy's root."""
    import shutil

    copy = tmp_path / "bastion"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return copy


@pytest.mark.parametrize("module,line,target", [
    # the scheduler reaches nothing above the runtime: at module level, inside a
    # function (the tuner's old ``from bastion.launcher import run``), under
    # TYPE_CHECKING, relative, or through the package root
    ("scheduler/tuning.py", "from bastion.launcher import run", "bastion.launcher.run"),
    ("scheduler/tuning.py", "def _outcomes():\n    from bastion.drills import fault_outcomes",
     "bastion.drills.fault_outcomes"),
    ("scheduler/retune.py", "import typing\nif typing.TYPE_CHECKING:\n"
     "    from bastion.tuning import TuningResult", "bastion.tuning.TuningResult"),
    ("scheduler/pool.py", "import bastion.cli", "bastion.cli"),
    ("scheduler/placement.py", "from ..drills import drill", "bastion.drills.drill"),
    ("scheduler/detector.py", "import bastion as bn", "bastion"),
    ("scheduler/recovery.py", "def _tune():\n    from bastion import tune", "bastion"),
    ("scheduler/catchup.py", "from bastion.report import write_report", "bastion.report"),
    # a connector imports the interfaces, never the description that opens it
    ("connectors/logs.py", "from bastion.sources import Log", "bastion.sources.Log"),
    ("connectors/files.py", "from ..sinks import SinkWriter", "bastion.sinks.SinkWriter"),
    ("connectors/__init__.py", "def _lazy():\n    import bastion.sinks", "bastion.sinks"),
    # the interfaces import nothing of ours: not storage, not a description
    ("io_interfaces.py", "from bastion.storage import open_store",
     "bastion.storage.open_store"),
    ("io_interfaces.py", "def _kind():\n    from bastion.sources import Log",
     "bastion.sources.Log"),
])
def test_a_wrong_arrow_is_reported_naming_the_module_and_the_import(tmp_path, module, line,
                                                                     target):
    """Each rule of the scheduler's, the connectors' and the interfaces' can fail: a
    copy of the package with one offending import planted is reported, by the module
    that imports and the name it imports, and nothing else is."""
    copy = planted(tmp_path, module, line)
    found = all_wrong_arrows(copy)
    name = module_name(copy / module, copy)
    assert any(f.startswith(f"{name} -> {target}: ") for f in found), found
    assert all(f.startswith(f"{name} -> ") for f in found), found


@pytest.mark.parametrize("module,line", [
    ("scheduler/injector.py", "from bastion import faults"),   # a module, not the root
    ("scheduler/tuning.py", "def _plan():\n    from bastion.runtime.plan import build_plan"),
    ("scheduler/tuning.py", "from bastion.sources import Generator"),   # a description
    ("connectors/logs.py", "from bastion.io_interfaces import SourceReader"),
    ("sinks.py", "def _open():\n    from bastion.connectors.files import FileWriter"),
])
def test_an_arrow_that_points_down_is_not_reported(tmp_path, module, line):
    """The new rules are no blanket ban: the scheduler may import the runtime and the
    descriptions (and ``from bastion import faults`` names the module, not the root),
    a connector the interfaces, and a description its connector inside a method."""
    assert all_wrong_arrows(planted(tmp_path, module, line)) == []


def seam_members(cls: type) -> set[str]:
    members = {n for klass in cls.__mro__ for n in vars(klass) if not n.startswith("__")}
    return members | {n for klass in cls.__mro__ for n in getattr(klass, "__annotations__", {})}


def reached_through(tree: ast.AST, name: str) -> set[str]:
    """Attributes read or written on ``name`` or ``self.name`` in a module."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == name) or (
                isinstance(owner, ast.Attribute) and owner.attr == name
                and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            found.add(node.attr)
    return found


def test_protocols_use_nothing_of_a_task_or_master_but_the_seam():
    """A protocol half holds its context as ``task`` / ``master`` (``self.task``,
    ``self.master``): everything it touches there is declared by the seam."""
    from bastion.protocols.base import MasterContext, TaskContext

    used = {}
    for path in sorted((PACKAGE / "protocols").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for name, seam in (("task", TaskContext), ("master", MasterContext)):
            beyond = reached_through(tree, name) - seam_members(seam)
            if beyond:
                used[f"{path.name}: {name}"] = sorted(beyond)
    assert used == {}
