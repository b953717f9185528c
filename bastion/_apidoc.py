"""The fence between Bastion's public API and its internals, and the page that shows it.

Bastion's public API is exactly the ``__all__`` of the modules in `PUBLIC_MODULES`:
a name listed there keeps its meaning from one release to the next, or changes with a
note in the changelog. Everything else — other modules (``bastion.runtime``,
``bastion.scheduler``, ``bastion.connectors``, ``bastion.spark_jobs``, the protocol
implementations under ``bastion.protocols``), names left out of an ``__all__``, and any
name that starts with ``_`` — is *internal*: it may change or disappear without notice,
and a test that reaches for it says so (the ``internal`` pytest marker).

This module renders that API as ``docs/api.md``, from the docstrings themselves, so the
page cannot drift from the code (a test regenerates it and compares)::

    python -m bastion._apidoc > docs/api.md

Per public module: the first paragraph of its docstring, then each ``__all__`` name with
its signature and docstring, and for a class its public methods and properties. A
name a module re-exports from another public module is shown once, where it is
defined, and only pointed to elsewhere.

It also holds the checks the fence test runs, written against any module object so a
test can feed them a deliberately broken one: `fence_problems` (every ``__all__`` name
exists and is documented; no public signature names a private type). The output must
be the same in every run — no memory addresses, no set orders from the hash seed — or
the staleness test would fail at random; `render` scrubs addresses, and a test renders
under two hash seeds to catch the rest.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import re
import sys
import types
from typing import Any, Iterator

#: The modules whose ``__all__`` is Bastion's public API, in the order docs/api.md
#: shows them. Chosen from what README.md and docs/ tell a user to import or call:
#: ``bn.*`` (the package), the DSL's building blocks (``bn.sources``, ``bn.sinks``,
#: ``bn.windows``, ``bn.aggregations``, ``bn.faults``, codecs, errors), the drivers
#: (``bn.run``, ``bn.drill``, ``bn.tune``, and the drill report page that ``bastion
#: drill --html`` writes), lineage ids (``bastion.lineage.format_id``), protocol
#: options (``bn.CecPolicy``) and the store (``bastion.storage.open_store``,
#: ``prune_jobs``). `bastion.io_interfaces` is internal: its two public classes are
#: re-exported as ``bn.sources.SourceReader`` and ``bn.sinks.SinkWriter``.
PUBLIC_MODULES = (
    "bastion",
    "bastion.topology",
    "bastion.sources",
    "bastion.sinks",
    "bastion.windows",
    "bastion.aggregations",
    "bastion.codecs",
    "bastion.errors",
    "bastion.faults",
    "bastion.options",
    "bastion.launcher",
    "bastion.drills",
    "bastion.report",
    "bastion.tuning",
    "bastion.lineage",
    "bastion.protocols",
    "bastion.storage",
)

#: The command that regenerates docs/api.md; the staleness test names it.
COMMAND = "python -m bastion._apidoc > docs/api.md"

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # in reprs of defaults: differs every run


# --- documentation -----------------------------------------------------------------

def own_doc(obj: Any) -> str | None:
    """``obj``'s own docstring, cleaned, or None: not one inherited from a base class
    (`inspect.getdoc` would borrow it) nor the ``Name(field=...)`` line `dataclasses`
    writes for an undocumented class."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
        return None
    return inspect.cleandoc(doc)


def _comment_doc(module: types.ModuleType, name: str) -> str | None:
    """How a constant or a type alias, which has no docstring of its own, is
    documented in ``module``'s source: ``#:`` comment lines directly above ``name =
    ...``, or a string literal directly below it (both are Sphinx's conventions)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return None
    lines = source.splitlines()
    body = ast.parse(source).body
    for position, node in enumerate(body):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        above: list[str] = []
        row = node.lineno - 2
        while row >= 0 and lines[row].strip().startswith("#:"):
            above.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        if above:
            return " ".join(above)
        below = body[position + 1] if position + 1 < len(body) else None
        if (isinstance(below, ast.Expr) and isinstance(below.value, ast.Constant)
                and isinstance(below.value.value, str) and below.value.value.strip()):
            return inspect.cleandoc(below.value.value)
        return None
    return None


def _is_data(obj: Any) -> bool:
    return not (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj))


def doc_of(module: types.ModuleType, name: str, obj: Any) -> str | None:
    """What documents ``module.name``: its own docstring, or for a data name (a
    constant, a type alias) the ``#:`` comment above its assignment."""
    if _documented_in_source(name, obj):
        return _comment_doc(module, name)
    return own_doc(obj)


def _documented_in_source(name: str, obj: Any) -> bool:
    """Is ``name`` a constant or a type alias (``A | B``, ``Literal[...]``,
    ``RecordId = tuple``)? The object's own docstring, if any, says nothing about what
    the name means, so the source must."""
    if inspect.ismodule(obj):
        return False
    return _is_data(obj) or getattr(obj, "__name__", name) != name


def first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph, on one line."""
    if not doc:
        return ""
    return " ".join(doc.split("\n\n", 1)[0].split())


# --- signatures ---------------------------------------------------------------------

class _Source(str):
    """An annotation as written in the source: shown bare, not as a quoted string."""

    def __repr__(self) -> str:
        return str(self)


def _bare(annotation: Any) -> Any:
    if isinstance(annotation, str):  # ``from __future__ import annotations``, or "Name"
        return _Source(annotation.strip("'\""))
    return annotation


def signature(obj: Any) -> str:
    """``obj``'s signature as source text (annotations as written), without memory
    addresses; empty when it has none (a builtin, a data name)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    sig = sig.replace(
        parameters=[p.replace(annotation=_bare(p.annotation)) for p in sig.parameters.values()],
        return_annotation=_bare(sig.return_annotation))
    return _ADDRESS.sub("", str(sig))


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties ``cls`` itself defines, in source order."""
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = getattr(cls, name)  # bound: its signature has no ``cls``
        if inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, property):
            yield name, value


def _private_part(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def _private_object(obj: Any) -> bool:
    """Is ``obj`` a class or function of Bastion's that lives under a private name?"""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or not (module == "bastion" or module.startswith("bastion.")):
        return False
    return _private_part(module) or (isinstance(qualname, str) and _private_part(qualname))


def _private_names(annotation: Any, namespace: dict[str, Any]) -> list[str]:
    """The private type names an annotation mentions. A string annotation is parsed
    and each dotted name resolved in the function's module; a name that resolves is
    judged by what it is (``_windows.WindowSpec`` is a public type under a private
    alias), one that does not (imported only for a type checker) by how it is spelled."""
    if annotation is inspect.Parameter.empty:
        return []
    if not isinstance(annotation, str):  # evaluated: judge it and its arguments
        found = []
        if _private_object(annotation):
            found.append(f"{annotation.__module__}.{getattr(annotation, '__qualname__', '?')}")
        for arg in getattr(annotation, "__args__", None) or ():
            found += _private_names(arg, namespace)
        return found
    try:
        tree = ast.parse(annotation, mode="eval")
    except SyntaxError:
        return []
    found = []
    inner_nodes = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if id(node) in inner_nodes:  # a part of a dotted name, judged with the whole
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += _private_names(node.value, namespace)  # "Name" quoted inside
            continue
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                parts.insert(0, inner.attr)
                inner = inner.value
            if not isinstance(inner, ast.Name):
                continue
            chain = [inner.id, *parts]
        elif isinstance(node, ast.Name):
            chain = [node.id]
        else:
            continue
        value: Any = namespace.get(chain[0], getattr(builtins, chain[0], _MISSING))
        for part in chain[1:]:
            value = getattr(value, part, _MISSING) if value is not _MISSING else _MISSING
        dotted = ".".join(chain)
        if value is _MISSING:
            if chain[-1].startswith("_") and not chain[-1].startswith("__"):
                found.append(dotted)
        elif _private_object(value) or (not inspect.ismodule(value)
                                        and chain[-1].startswith("_")
                                        and not chain[-1].startswith("__")):
            found.append(dotted)
    return found


_MISSING = object()


def _signature_problems(where: str, fn: Any) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    namespace = getattr(inspect.unwrap(fn), "__globals__", None) or (vars(module) if module else {})
    problems = []
    annotated = [(p.name, p.annotation) for p in sig.parameters.values()]
    annotated.append(("return", sig.return_annotation))
    for what, annotation in annotated:
        for name in _private_names(annotation, namespace):
            problems.append(f"{where}: {what} is annotated with private type {name!r}")
    return problems


# --- the fence checks ---------------------------------------------------------------

def fence_problems(module: types.ModuleType) -> list[str]:
    """What is wrong with ``module``'s public API, one line each: an ``__all__`` name
    that does not resolve, one without documentation, a public signature (of a name,
    or of a public class's methods and properties) that names a private type."""
    name_of = module.__name__
    exported = getattr(module, "__all__", None)
    if exported is None:
        return [f"{name_of}: no __all__"]
    problems = []
    for name in exported:
        try:
            obj = getattr(module, name)
        except Exception as error:  # noqa: BLE001 - any failure to resolve is the finding
            problems.append(f"{name_of}.{name}: in __all__ but does not resolve ({error!r})")
            continue
        home = _home(module, name, obj)
        if not doc_of(home, name, obj):
            problems.append(f"{name_of}.{name}: no docstring")
        if inspect.isclass(obj):
            problems += _signature_problems(f"{name_of}.{name}", obj)
            for member, value in members(obj):
                fn = value.fget if isinstance(value, property) else value
                if fn is not None:
                    problems += _signature_problems(f"{name_of}.{name}.{member}", fn)
        elif callable(obj) and not inspect.ismodule(obj):
            problems += _signature_problems(f"{name_of}.{name}", obj)
    return problems


def _home(module: types.ModuleType, name: str, obj: Any) -> types.ModuleType:
    """The module that defines ``name`` (where a data name's ``#:`` comment is)."""
    if not _documented_in_source(name, obj):
        return module
    for candidate in _lazy_source(module, name):
        return candidate
    return module


def _lazy_source(module: types.ModuleType, name: str) -> Iterator[types.ModuleType]:
    exports = getattr(module, "_EXPORTS", {})
    for relative, names in exports.items():
        if name in names:
            yield importlib.import_module(f".{relative}", module.__name__)


# --- the page -----------------------------------------------------------------------

def _defined_in(obj: Any) -> str | None:
    module = getattr(obj, "__module__", None)
    return module if isinstance(module, str) else None


def _shown_elsewhere(module_name: str, name: str, obj: Any,
                     public: dict[str, set[str]]) -> str | None:
    """The public module that documents ``obj`` in full, if it is not this one: the
    module that defines it if that is public, else the first public module (in page
    order, the package ``bastion`` last) that lists it — one owner, so two modules
    that re-export each other's names never both point away."""
    if inspect.ismodule(obj):
        return obj.__name__ if obj.__name__ in public else None
    home = _defined_in(obj)
    if home in public and name in public[home]:
        owner = home
    else:
        listing = [m for m in public if m != "bastion" and name in public[m]
                   and getattr(sys.modules[m], name, None) is obj]
        owner = listing[0] if listing else module_name
    return owner if owner != module_name else None


def _entry(module_name: str, name: str, obj: Any, doc: str | None,
           public: dict[str, set[str]]) -> list[str]:
    lines = [f"### `{module_name}.{name}`", ""]
    elsewhere = _shown_elsewhere(module_name, name, obj, public)
    if inspect.ismodule(obj):
        lines += [f"Module: see [`{obj.__name__}`](#{_anchor(obj.__name__)}). "
                  f"{first_paragraph(obj.__doc__)}", ""]
        return lines
    kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "data"
    sig = signature(obj) if kind != "data" else ""
    if kind == "data":
        lines += ["```python", f"{name} = {_ADDRESS.sub('', repr(obj))}", "```", ""]
    else:
        prefix = "class " if kind == "class" else ""
        lines += ["```python", f"{prefix}{name}{sig}", "```", ""]
    if elsewhere:
        lines += [f"{first_paragraph(doc)} See [`{elsewhere}.{name}`](#{_anchor(f'{elsewhere}.{name}')}).", ""]
        return lines
    lines += [doc or "*(undocumented)*", ""]
    if inspect.isclass(obj):
        for member, value in members(obj):
            if isinstance(value, property):
                head = f"{member}  (property)"
                member_doc = own_doc(value.fget) if value.fget else None
            else:
                head = f"{member}{signature(value)}"
                member_doc = own_doc(value)
            lines += [f"- `{head}`", ""]
            if member_doc:
                lines += ["  " + line if line else "" for line in member_doc.splitlines()]
                lines.append("")
    return lines


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading ``title`` (in backticks): lower case, dots dropped."""
    return re.sub(r"[^a-z0-9_ -]", "", title.lower()).replace(" ", "-")


def render_module(module: types.ModuleType, public: dict[str, set[str]] | None = None) -> str:
    """One module's section of the page: its first paragraph, then its ``__all__``."""
    public = public if public is not None else {module.__name__: set(getattr(module, "__all__", ()))}
    lines = [f"## `{module.__name__}`", "", first_paragraph(module.__doc__), ""]
    for name in sorted(getattr(module, "__all__", ())):
        obj = getattr(module, name)
        lines += _entry(module.__name__, name, obj, doc_of(_home(module, name, obj), name, obj), public)
    return "\n".join(lines)


_PREAMBLE = f"""# Bastion API reference

<!-- Generated from the docstrings by `{COMMAND}`; do not edit by hand.
     tests/test_api_fence.py fails when this file is stale. -->

**What is public.** The names listed in the `__all__` of the modules below, and nothing
else: `bastion` (imported as `bn`) and the modules it opens onto. A public name keeps
its meaning from one release to the next, or changes with a note in the changelog.

**What is internal.** Everything else: the modules `bastion.runtime`,
`bastion.scheduler`, `bastion.connectors`, `bastion.spark_jobs`, `bastion.bench`,
`bastion.io_interfaces`, `bastion.cli` (its interface is the `bastion` command, not
its functions), the protocol implementations under `bastion.protocols`, any name a
public module does not list in its `__all__`, and any name that starts with `_`.
Internal means *may change or disappear without notice*; tests that use internals
carry the `internal` pytest marker, so `pytest -m "not internal"` runs only what the
public API promises.
"""


def render(modules: tuple[str, ...] = PUBLIC_MODULES) -> str:
    """The whole page, docs/api.md."""
    loaded = [importlib.import_module(name) for name in modules]
    public = {m.__name__: set(getattr(m, "__all__", ())) for m in loaded}
    sections = [_PREAMBLE, "## Contents", ""]
    sections += [f"- [`{m.__name__}`](#{_anchor(m.__name__)})" for m in loaded]
    sections.append("")
    sections += [render_module(m, public) for m in loaded]
    return "\n".join(sections).rstrip() + "\n"


def first_difference(expected: str, actual: str) -> str | None:
    """Where two renderings of the page part, as ``line N: 'a' != 'b'``; None when
    they are the same."""
    if expected == actual:
        return None
    old, new = expected.splitlines(), actual.splitlines()
    for number, (a, b) in enumerate(zip(old, new), start=1):
        if a != b:
            return f"line {number}: {a!r} != {b!r}"
    return f"line {min(len(old), len(new)) + 1}: one ends, the other goes on"


def main(argv: list[str] | None = None) -> int:
    """Print docs/api.md to standard output."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
