"""The fence between Bastion's public API and its internals (issue 38, item 3).

Public is exactly the ``__all__`` of the modules in `bastion._apidoc.PUBLIC_MODULES`;
everything else is internal and may change without notice (the rule is written in
``bastion/__init__.py`` and at the top of docs/api.md). These tests keep the fence
standing:

- every name in every public ``__all__`` resolves (``bastion.__all__`` too, through its
  lazy loader) and is documented — a docstring of its own, or for a constant or type
  alias a ``#:`` comment — and no public signature names a private type;
- docs/api.md is what ``python -m bastion._apidoc`` prints now, and that output is the
  same under any hash seed;
- a test that touches a private name of Bastion — imports it, reads or patches
  ``something._name`` where Bastion defines ``_name``, subclasses and calls
  ``super()._name`` — carries the ``internal`` marker, so ``pytest -m "not internal"``
  runs exactly the tests that hold the public API to its word.

Each check is also fed a deliberately broken input (a synthetic module, a stale page,
a hash-seed-dependent rendering, an unmarked test's source) and must complain.

These tests exercise `bastion._apidoc`, itself internal, so the module is marked too.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bastion
from bastion import _apidoc

pytestmark = pytest.mark.internal

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "docs" / "api.md"


# --- every public name exists, is documented, and exposes no private type -----------

@pytest.mark.parametrize("module_name", _apidoc.PUBLIC_MODULES)
def test_every_public_name_exists_is_documented_and_exposes_no_private_type(module_name):
    module = importlib.import_module(module_name)
    assert _apidoc.fence_problems(module) == []


def test_every_name_of_bastion_all_resolves_through_the_lazy_loader():
    # in a fresh interpreter: a name already loaded by another test would hide a
    # broken entry of the lazy table
    code = ("import bastion\n"
            "for name in bastion.__all__:\n"
            "    assert getattr(bastion, name) is not None, name\n"
            "print(len(bastion.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(bastion.__all__) > 20


PLANTED = '''
"""A planted module: one sound name and one of each mistake the fence refuses."""
from __future__ import annotations
from dataclasses import dataclass


class _Hidden:
    """A private class."""


class Base:
    """A documented base."""


class Inherits(Base):
    pass


@dataclass
class Record:
    value: int


def sound(x: int, spec: Base | None = None) -> Base:
    """Documented, and its types are public."""
    return Base()


def undocumented(x: int) -> int:
    return x


def leaks(x: _Hidden) -> None:
    """Takes a private type."""


def leaks_in_return() -> "list[_Hidden]":
    """Returns a private type."""
    return []


class Holder:
    """A public class whose method leaks."""

    def get(self) -> _Hidden:
        """The hidden thing."""
        return _Hidden()


#: Seconds, documented the way constants are.
DOCUMENTED_CONSTANT = 1.0
UNDOCUMENTED_ALIAS = int | str

__all__ = ["sound", "undocumented", "missing", "leaks", "leaks_in_return", "Holder",
           "Inherits", "Record", "DOCUMENTED_CONSTANT", "UNDOCUMENTED_ALIAS"]
'''


def _planted_module(tmp_path, monkeypatch, source: str = PLANTED, name: str = "planted"):
    # inside the bastion package's namespace, as a real public module would be: the
    # private-type check judges objects by the module that defines them
    (tmp_path / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(f"bastion.{name}", tmp_path / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, f"bastion.{name}", module)
    spec.loader.exec_module(module)
    return module


def test_the_fence_check_names_each_planted_mistake_and_nothing_else(tmp_path, monkeypatch):
    module = _planted_module(tmp_path, monkeypatch)
    problems = _apidoc.fence_problems(module)
    assert sorted(p.split(":")[0] for p in problems) == sorted([
        "bastion.planted.undocumented",                 # no docstring
        "bastion.planted.missing",                      # in __all__, not defined
        "bastion.planted.leaks",                        # parameter of a private type
        "bastion.planted.leaks_in_return",              # ... in a string annotation
        "bastion.planted.Holder.get",                   # a public class's method
        "bastion.planted.Inherits",                     # a docstring inherited only
        "bastion.planted.Record",                       # dataclass's generated line only
        "bastion.planted.UNDOCUMENTED_ALIAS",           # an alias with no #: comment
    ]), problems
    assert "does not resolve" in next(p for p in problems if ".missing:" in p)
    assert "_Hidden" in next(p for p in problems if ".leaks:" in p)


def test_an_evaluated_annotation_naming_a_private_type_is_reported(tmp_path, monkeypatch):
    # without ``from __future__ import annotations`` the annotation is the class itself
    source = ('"""Evaluated."""\nclass _Hidden:\n    """Private."""\n\n\n'
              'def f(x: "list[int]", y: list[_Hidden]) -> None:\n    """F."""\n\n\n'
              'def g(x: int) -> int:\n    """G."""\n    return x\n\n\n__all__ = ["f", "g"]\n')
    module = _planted_module(tmp_path, monkeypatch, source, name="planted_evaluated")
    assert _apidoc.fence_problems(module) == [
        "bastion.planted_evaluated.f: y is annotated with private type "
        "'bastion.planted_evaluated._Hidden'"]


def test_a_module_without_all_has_no_public_api(tmp_path, monkeypatch):
    module = _planted_module(tmp_path, monkeypatch, '"""No list."""\ndef f():\n    """F."""\n',
                             name="planted_no_all")
    assert _apidoc.fence_problems(module) == ["bastion.planted_no_all: no __all__"]


def test_a_lazy_export_that_does_not_resolve_is_reported(tmp_path, monkeypatch):
    # the mechanism bastion/__init__.py uses, with one entry pointing at nothing
    package = tmp_path / "planted_lazy"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent('''
        """A planted lazy package."""
        from bastion.storage.lazy import lazy_exports
        _EXPORTS = {"real": ("Real", "Ghost")}
        __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
        __all__ = ["Ghost", "Real"]
        '''))
    (package / "real.py").write_text('class Real:\n    """Here."""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("planted_lazy")
    try:
        problems = _apidoc.fence_problems(module)
    finally:
        for name in ("planted_lazy", "planted_lazy.real"):
            sys.modules.pop(name, None)
    assert len(problems) == 1 and problems[0].startswith("planted_lazy.Ghost: in __all__ but "
                                                         "does not resolve"), problems


# --- docs/api.md: generated, deterministic, up to date ------------------------------

def _render_in_subprocess(seed: int, code: str = "import bastion._apidoc as a, sys; "
                          "sys.stdout.write(a.render())", path: Path | None = None) -> str:
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def rendered() -> tuple[str, str]:
    """The page, rendered in two interpreters with different hash seeds."""
    return _render_in_subprocess(0), _render_in_subprocess(4242)


def test_the_generated_page_is_the_same_under_any_hash_seed(rendered):
    first, second = rendered
    assert _apidoc.first_difference(first, second) is None
    assert first.count("\n### `") > 100  # every public name has its entry


def test_a_rendering_that_depends_on_the_hash_seed_is_caught(tmp_path):
    # a set's order comes from the hash seed: the comparison above must see it
    (tmp_path / "planted_sets.py").write_text(
        '"""Planted."""\n#: Names, as a set.\nNAMES = frozenset({"alpha", "beta", "gamma", '
        '"delta", "epsilon", "zeta", "eta", "theta"})\n__all__ = ["NAMES"]\n')
    code = ("import importlib, sys, bastion._apidoc as a; "
            "sys.stdout.write(a.render_module(importlib.import_module('planted_sets')))")
    first = _render_in_subprocess(0, code, tmp_path)
    second = _render_in_subprocess(4242, code, tmp_path)
    assert "NAMES = frozenset(" in first
    difference = _apidoc.first_difference(first, second)
    assert difference is not None and difference.startswith("line ")


def _staleness(committed: str, generated: str) -> str | None:
    difference = _apidoc.first_difference(committed, generated)
    if difference is None:
        return None
    return (f"docs/api.md is stale ({difference}); regenerate it with "
            f"`{_apidoc.COMMAND}` and commit it")


def test_the_committed_page_is_what_the_generator_prints_now(rendered):
    message = _staleness(API_PAGE.read_text(), rendered[0])
    assert message is None, message


def test_a_stale_page_fails_and_names_the_command(rendered):
    stale = rendered[0].replace("Bastion API reference", "Bastion API reference (old)", 1)
    message = _staleness(stale, rendered[0])
    assert message is not None and _apidoc.COMMAND in message and "line 1:" in message
    assert _staleness(rendered[0][:-200], rendered[0]) is not None  # a truncated page


# --- tests of internals are marked as such ------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def bastion_private_names(package: Path = ROOT / "bastion") -> frozenset[str]:
    """Every private name Bastion defines outside a function body: modules' and
    classes' functions, classes, assignments and imports (``_frame_records_c``), and
    every ``x._name = ...`` attribute (``self._server``)."""
    names: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not in_function:
                    names.add(child.name)
                visit(child, in_function or not isinstance(child, ast.ClassDef))
                continue
            if not in_function:
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    names.add(child.id)
                elif isinstance(child, ast.alias):
                    names.add((child.asname or child.name).split(".")[0])
            if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store):
                names.add(child.attr)
            visit(child, in_function)

    for path in sorted(package.rglob("*.py")):
        visit(ast.parse(path.read_text()), False)
    return frozenset(name for name in names if _private(name))


_SETTERS = {"setattr", "delattr", "object"}  # setattr, monkeypatch.setattr, patch.object


def _direct_touches(node: ast.AST, private_names: frozenset[str]) -> list[str]:
    """The private names of Bastion that the code under ``node`` touches itself."""
    found = []
    for n in ast.walk(node):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "bastion":
            found += [f"{n.module}.{a.name}" for a in n.names if _private(a.name)]
            if any(_private(part) for part in (n.module or "").split(".")):
                found.append(n.module or "")
        elif isinstance(n, ast.Import):
            found += [a.name for a in n.names if a.name.split(".")[0] == "bastion"
                      and any(_private(part) for part in a.name.split("."))]
        elif isinstance(n, ast.Attribute) and n.attr in private_names and not (
                isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
            found.append(f"{ast.unparse(n.value)}.{n.attr}")
        elif isinstance(n, ast.Call):
            function = n.func.attr if isinstance(n.func, ast.Attribute) else \
                getattr(n.func, "id", "")
            for arg in n.args:
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    continue
                if function in _SETTERS and arg.value in private_names:
                    found.append(f"{function}(..., {arg.value!r})")
                elif (function in _SETTERS | {"patch"} and arg.value.startswith("bastion.")
                      and _private(arg.value.rsplit(".", 1)[-1])):
                    found.append(f"{function}({arg.value!r})")
    return found


def _carries_marker(node: ast.AST) -> bool:
    """``@pytest.mark.internal`` on a function or class, or ``pytestmark`` holding it
    in a module's or a class's body."""
    decorators = getattr(node, "decorator_list", [])
    if any("mark.internal" in ast.unparse(d) for d in decorators):
        return True
    return any(isinstance(s, ast.Assign) and "mark.internal" in ast.unparse(s.value)
               and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
               for s in getattr(node, "body", []))


def unmarked_internal_tests(source: str, private_names: frozenset[str]) -> list[str]:
    """The tests in ``source`` that touch a private name of Bastion — in their own
    body or decorators, or through a module-level helper, fixture or name they use,
    followed as far as it goes — without carrying the ``internal`` marker."""
    tree = ast.parse(source)
    if _carries_marker(tree):
        return []
    touches: dict[str, list[str]] = {}
    uses: dict[str, set[str]] = {}
    problems = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        else:
            bound = []
        found = _direct_touches(node, private_names)
        if not bound and found:
            problems.append(f"line {node.lineno}: touches {sorted(set(found))} outside "
                            "any test: mark the module (pytestmark)")
        for name in bound:
            if isinstance(node, ast.ImportFrom):  # only what this name itself brings in
                touches[name] = [f for f in found if f.endswith(f".{name}")
                                 or any(a.asname == name and f.endswith(f".{a.name}")
                                        for a in node.names)]
            else:
                touches[name] = found
            uses[name] = _names_used(node) - {name}

    def reached(name: str, seen: set[str]) -> list[str]:
        out = list(touches.get(name, []))
        for used in sorted(uses.get(name, ())):
            if used in touches and used not in seen:
                seen.add(used)
                out += reached(used, seen)
        return out

    def check(label: str, node: ast.AST, own: list[str], used: set[str]) -> None:
        found = own + [t for name in sorted(used) if name in touches
                       for t in reached(name, {name})]
        if found and not _carries_marker(node):
            problems.append(f"{label}: touches {sorted(set(found))} without "
                            "@pytest.mark.internal")

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            check(node.name, node, touches[node.name], uses[node.name])
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test") \
                and not _carries_marker(node):
            for method in node.body:
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and method.name.startswith("test"):
                    check(f"{node.name}.{method.name}", method,
                          _direct_touches(method, private_names), _names_used(method))
    return problems


def _names_used(node: ast.AST) -> set[str]:
    """Names a definition reads, and the parameters it takes (fixtures by name)."""
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    for n in ast.walk(node):
        if isinstance(n, ast.arguments):
            used |= {a.arg for a in n.posonlyargs + n.args + n.kwonlyargs}
    return used


@pytest.fixture(scope="module")
def private_names() -> frozenset[str]:
    return bastion_private_names()


def test_every_test_that_touches_a_private_name_of_bastion_is_marked_internal(private_names):
    problems = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        problems += [f"{path.relative_to(ROOT)}: {problem}"
                     for problem in unmarked_internal_tests(path.read_text(), private_names)]
    assert problems == []


def test_the_internal_marker_is_registered():
    # an unregistered marker is a warning, and a typo in it would mark nothing
    text = (ROOT / "pyproject.toml").read_text()
    assert any(line.strip().startswith('"internal:') for line in text.splitlines())


PLANTED_TESTS = '''
import pytest
from bastion.runtime import priority
from bastion.protocols.acks import AcksTask, _channel_salt


def _helper():
    return priority._may_return_to(0)


def test_unmarked_direct():
    assert priority._may_return_to(0) in (True, False)


@pytest.mark.internal
def test_marked_direct():
    assert priority._may_return_to(0) in (True, False)


def test_through_a_helper():
    assert _helper() in (True, False)


def test_through_an_imported_private_name():
    assert _channel_salt


def test_patches_a_private_name(monkeypatch):
    monkeypatch.setattr(priority, "_may_return_to", lambda nice: False)


def test_public_only(monkeypatch):
    handle = object()
    assert AcksTask and getattr(handle, "_actor_id", None) is None


class TestGroup:
    def test_reads_a_private_attribute(self, server):
        server._server.close()

    def test_its_own_private_helper(self):
        self._server = None


priority._may_return_to(0)
'''


def test_the_marker_check_names_each_unmarked_touch_and_nothing_else(private_names):
    assert {"_may_return_to", "_channel_salt", "_server"} <= private_names
    assert "_actor_id" not in private_names  # Ray's, not ours
    problems = unmarked_internal_tests(PLANTED_TESTS, private_names)
    labels = sorted(p.split(":")[0] for p in problems)
    assert labels == sorted(["test_unmarked_direct", "test_through_a_helper",
                             "test_through_an_imported_private_name",
                             "test_patches_a_private_name",
                             "TestGroup.test_reads_a_private_attribute",
                             f"line {PLANTED_TESTS.splitlines().index('priority._may_return_to(0)') + 1}"]
                            ), problems
    # marking the module marks every test in it
    marked = PLANTED_TESTS.replace("import pytest\n", "import pytest\n"
                                   "pytestmark = [pytest.mark.slow, pytest.mark.internal]\n", 1)
    assert unmarked_internal_tests(marked, private_names) == []


def test_a_private_module_import_is_a_touch(private_names):
    source = ("from bastion.runtime import _columns\n\n\n"
              "def test_native():\n    assert _columns\n")
    assert [p.split(":")[0] for p in unmarked_internal_tests(source, private_names)] \
        == ["test_native"]


def test_the_rule_is_written_where_users_look():
    # bastion's docstring and the page say what public and internal mean
    for text in (bastion.__doc__ or "", API_PAGE.read_text()):
        text = " ".join(text.split())  # a phrase may be broken across lines
        assert "__all__" in text and "without notice" in text
        for internal in ("bastion.runtime", "bastion.scheduler", "bastion.connectors",
                         "bastion.spark_jobs"):
            assert internal in text, internal


def test_private_name_scan_reads_a_planted_package(tmp_path):
    (tmp_path / "mod.py").write_text(textwrap.dedent('''
        try:
            from ._native import frame as _frame_c
        except ImportError:
            _frame_c = None
        _LIMIT = 3
        class Server:
            _kind = "x"
            def start(self):
                self._server = 1
                _local = 2
            def _serve(self):
                pass
        '''))
    assert bastion_private_names(tmp_path) == {"_frame_c", "_LIMIT", "_kind", "_server",
                                               "_serve"}

