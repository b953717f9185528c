"""The DSL is typed: a type checker catches a topology fed the wrong records before
the job runs, and the types change nothing at run time.

`Stream[T]`, `KeyedStream[K, V]`, `WindowedStream[K, V]` and `Source[T]` are generic
(`bastion.topology`, module docstring), so mypy follows a record's type from a source
through ``map``, ``key_by``, ``reduce`` … to the sink. These tests run mypy as a
subprocess, as a user's CI would:

- over the DSL modules and ``examples/`` with ``--strict``: zero errors;
- over the whole package with mypy's defaults: zero errors besides a planted one;
- over a deliberately mistyped topology: each mistake reported, on its line, with the
  message a user would read (so the check is shown able to fail), and nothing else;
- over a correctly typed topology, whose ``assert_type`` lines pin the types the DSL
  infers, which then runs through ``bn.run`` on the session's Ray and gives the
  outputs plain Python computes.

The mypy configuration is the one below (`MYPY_CONFIG`): ``strict`` everywhere it
checks, ``follow_imports = silent`` so that modules outside the DSL (the runtime, Ray)
are read for their types but not reported, and one relaxation: ``bastion/__init__.py``
re-exports its public names lazily (under ``TYPE_CHECKING``, with a computed
``__all__``), which ``--strict``'s ``no_implicit_reexport`` would refuse as
``bn.Topology``; that module is allowed implicit re-exports. The mypy cache lives in a
per-session temporary directory: the first check reads Ray's annotations (~10 s on two
cores), the others reuse them.
"""

from __future__ import annotations

import collections
import re
import runpy
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bastion as bn
from bastion.topology import KeyedStream, Stream, WindowedStream

ROOT = Path(__file__).resolve().parent.parent

#: What test_the_dsl_and_the_examples_pass_mypy_strict checks with ``--strict``.
DSL_MODULES = ["bastion/topology.py", "bastion/sources.py", "bastion/sinks.py",
               "bastion/windows.py", "bastion/aggregations.py"]

MYPY_CONFIG = f"""\
[mypy]
strict = True
follow_imports = silent
mypy_path = {ROOT}
# the lines of an error, for the tests to match expected errors to
show_column_numbers = False
show_error_codes = True

[mypy-bastion]
implicit_reexport = True
"""

_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<message>.*)$")


def _mypy_available() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: it is in the test extra "
                    "(pip install -e '.[test]')")


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory):
    """Run mypy with `MYPY_CONFIG` on paths; return ``(exit code, errors, output)``,
    errors being ``(file name, line, message)`` triples."""
    _mypy_available()
    home = tmp_path_factory.mktemp("mypy")
    config = home / "mypy.ini"
    config.write_text(MYPY_CONFIG)

    def check(*paths: str | Path) -> tuple[int, list[tuple[str, int, str]], str]:
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(config),
             "--cache-dir", str(home / "cache"), *map(str, paths)],
            cwd=ROOT, capture_output=True, text=True, timeout=240)
        output = done.stdout + done.stderr
        errors = [(Path(m["file"]).name, int(m["line"]), m["message"])
                  for m in map(_ERROR.match, output.splitlines()) if m]
        return done.returncode, errors, output

    return check


def test_the_dsl_and_the_examples_pass_mypy_strict(mypy):
    examples = sorted((ROOT / "examples").glob("*.py"))
    assert len(examples) >= 3, examples
    code, errors, output = mypy(*DSL_MODULES, *examples)
    assert (code, errors) == (0, []), output
    assert f"no issues found in {len(DSL_MODULES) + len(examples)} source files" in output


# Every line marked ``# E: text`` must get an error containing ``text``; no other line
# may get one (the correct lines around the mistakes show the checker is not merely
# refusing everything).
MISTYPED = '''\
from typing import assert_type

import bastion as bn
from bastion.topology import Stream

topo = bn.Topology("mistyped")
words = topo.source("words", bn.sources.Collection(["to", "be", "or"]))
nums = topo.source("nums", bn.sources.Generator(lambda k: k * 10, count=5))


def parse(n: int) -> int:
    return n + 1


class LengthSum:  # an aggregation of str values
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: str) -> int:
        return acc + len(value)

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, acc: int) -> int:
        return acc


words.map("upper", str.upper).sink("fine", bn.sinks.Collect())
counts = words.key_by(lambda w: w).reduce("r", lambda acc, w: acc + w, initial=0)  # E: Unsupported operand types for + ("int" and "str")
words.map("parse", parse)  # E: Argument 2 to "map" of "Stream" has incompatible type "Callable[[int], int]"; expected "Callable[[str], int]"
nums.map("parse-nums", parse).sink("fine-too", bn.sinks.Collect())
words.filter("short", lambda w: w < 3)  # E: Unsupported operand types for < ("str" and "int")
nums.flat_map("digits", lambda n: n)  # E: Incompatible return value type (got "int", expected "Iterable[Never]")
by_num = nums.key_by(lambda n: n)
words.key_by(lambda w: w).join(by_num, "j", window=bn.windows.Tumbling(1))  # E: Argument 1 to "join" of "KeyedStream" has incompatible type "KeyedStream[int, int]"; expected "KeyedStream[str, int]"
words.key_by(len).stateful_map("s", lambda st, w: st + len(w), initial=0)  # E: Incompatible return value type (got "int", expected "tuple[int, Never]")
nums.key_by(lambda n: n % 2).window(bn.windows.Count(2)).aggregate("a", LengthSum())  # E: Argument 2 to "aggregate" of "WindowedStream" has incompatible type "LengthSum"
words.key_by(len).window(bn.windows.Count(2)).aggregate("b", LengthSum).sink("ok", bn.sinks.Collect())
topo.source("late", bn.sources.Collection([1, 2]), timestamp=lambda n: n.ts)  # E: "int" has no attribute "ts"
assert_type(counts, Stream[tuple[str, str]])  # E: Expression is of type "Stream[tuple[str, int]]", not "Stream[tuple[str, str]]"
words.union(nums, name="u").map("u-len", len)  # E: Argument 2 to "map" of "Stream" has incompatible type "Callable[[Sized], int]"; expected "Callable[[str | int], int]"
words.sink("out", [])  # E: Argument 2 to "sink" of "Stream" has incompatible type "list[Never]"; expected "Sink"
'''



def assert_reports_each_marked_error(mypy, path, source: str) -> None:
    """mypy over ``source`` (written to ``path``) reports, on each line marked
    ``# E: text``, an error containing that text, and no error anywhere else."""
    path.write_text(source)
    expected = {number: line.split("# E: ", 1)[1]
                for number, line in enumerate(source.splitlines(), 1) if "# E: " in line}
    code, errors, output = mypy(path)
    assert code == 1, output
    reported: dict[int, list[str]] = collections.defaultdict(list)
    for file, line, message in errors:
        assert file == path.name, output
        reported[line].append(message)
    for line, text in expected.items():
        assert any(text in message for message in reported[line]), (
            f"line {line}: expected an error containing {text!r}, got {reported[line]}")
    unexpected = {line: messages for line, messages in reported.items() if line not in expected}
    assert not unexpected, output


def test_a_mistyped_topology_fails_the_check_on_each_mistake(mypy, tmp_path):
    assert_reports_each_marked_error(mypy, tmp_path / "mistyped.py", MISTYPED)


# A topology as a user would write it, with each stream's type pinned by assert_type
# (an error for mypy if the DSL inferred anything else, Any included); its expected
# outputs are in test_a_correctly_typed_topology_checks_and_runs.
TYPED_JOB = '''\
from typing import assert_type

import bastion as bn
from bastion.topology import KeyedStream, Stream, WindowedStream

LINES = ["the cat sat on the mat", "a dog", "the dog sat", "cat and dog and cat"]
MORE = ["an owl"]
ORDERS = [(i, 10.0 * i) for i in range(6)]
PAYMENTS = [(i, "card" if i % 2 else "cash") for i in range(0, 6, 2)]

topology = bn.Topology("typed-dsl")
lines = topology.source("lines", bn.sources.Collection(LINES))
assert_type(lines, Stream[str])
more = topology.source("more", bn.sources.Generator(lambda k: MORE[k], count=len(MORE)))
assert_type(more, Stream[str])
everything = lines.union(more, name="all")
assert_type(everything, Stream[str])
words = everything.flat_map("split", str.split, parallelism=2)
assert_type(words, Stream[str])
by_word = words.key_by(lambda w: w)
assert_type(by_word, KeyedStream[str, str])
counts = by_word.reduce("running-count", lambda acc, w: acc + 1, initial=0, parallelism=2)
assert_type(counts, Stream[tuple[str, int]])
counts.sink("counts", bn.sinks.Collect())

lengths = words.filter("long", lambda w: len(w) > 2).map("length-of", len)
assert_type(lengths, Stream[int])
lengths.sink("lengths", bn.sinks.Collect())

longest = words.key_by(lambda w: w[0]).stateful_map(
    "longest-so-far", lambda best, w: (max(best, len(w)), (w[0], max(best, len(w)))), initial=0)
assert_type(longest, Stream[tuple[str, int]])
longest.sink("longest", bn.sinks.Collect())

windows = words.key_by(len).window(bn.windows.Count(2))
assert_type(windows, WindowedStream[int, str])
pairs = windows.aggregate("count-pairs", bn.aggregations.Count)
assert_type(pairs, Stream[tuple[int, float, float, int]])
pairs.sink("pairs", bn.sinks.Collect())

orders = topology.source("orders", bn.sources.Collection(ORDERS), timestamp=lambda o: o[1])
payments = topology.source("payments", bn.sources.Collection(PAYMENTS),
                           timestamp=lambda p: float(p[0]))
matched = orders.key_by(lambda o: o[0]).join(payments.key_by(lambda p: p[0]), "match",
                                             window=bn.windows.Tumbling(1000))
assert_type(matched, Stream[tuple[int, tuple[int, float], tuple[int, str]]])
matched.map("summary", lambda m: (m[0], m[1][1], m[2][1])).sink("matched", bn.sinks.Collect())
'''


@pytest.mark.usefixtures("ray_session")
def test_a_correctly_typed_topology_checks_and_runs(mypy, tmp_path):
    path = tmp_path / "typed_job.py"
    path.write_text(TYPED_JOB)
    code, errors, output = mypy(path)
    assert (code, errors) == (0, []), output

    job = runpy.run_path(str(path))
    result = bn.run(job["topology"])
    lines, more = job["LINES"], job["MORE"]
    words = [w for line in lines + more for w in line.split()]

    # reduce: every running count, ending at each word's count
    counts = collections.Counter(words)
    per_word = collections.defaultdict(list)
    for word, count in result.outputs["counts"]:
        per_word[word].append(count)
    assert {w: sorted(c) for w, c in per_word.items()} == {
        w: list(range(1, n + 1)) for w, n in counts.items()}
    # filter + map
    assert sorted(result.outputs["lengths"]) == sorted(len(w) for w in words if len(w) > 2)
    # stateful_map: per first letter, the longest word so far; its last value per
    # letter is the longest of all (order within a letter depends on arrival)
    longest: dict[str, int] = {}
    for letter, best in result.outputs["longest"]:
        assert best >= longest.get(letter, 0)
        longest[letter] = best
    assert longest == {letter: max(len(w) for w in words if w[0] == letter)
                       for letter in {w[0] for w in words}}
    # Count(2) windows per word length: one per full pair, each counting 2
    by_length = collections.Counter(len(w) for w in words)
    pairs = collections.Counter(key for key, _, _, n in result.outputs["pairs"] if n == 2)
    assert len(result.outputs["pairs"]) == sum(pairs.values())
    assert pairs == {length: n // 2 for length, n in by_length.items() if n >= 2}
    # join: every order with a payment of its id
    assert sorted(result.outputs["matched"]) == sorted(
        (i, amount, method) for i, amount in job["ORDERS"]
        for j, method in job["PAYMENTS"] if i == j)


def test_the_types_change_nothing_at_run_time():
    """Generic bases only: isinstance works on the plain classes, a stream is not
    subscripted at run time (no ``__orig_class__``), and a topology pickles for Ray
    actors (cloudpickle) as before."""
    from ray import cloudpickle

    topo = bn.Topology("plain")
    src = topo.source("src", bn.sources.Collection([1, 2, 3]))
    keyed = src.key_by(lambda x: x % 2)
    summed = keyed.reduce("sum", lambda acc, x: acc + x, initial=0)
    summed.sink("out", bn.sinks.Collect())
    windowed = keyed.window(bn.windows.Count(2))
    assert isinstance(src, Stream) and isinstance(keyed, Stream)
    assert isinstance(keyed, KeyedStream) and isinstance(windowed, WindowedStream)
    assert type(summed) is Stream and not hasattr(summed, "__orig_class__")
    assert isinstance(bn.sources.Collection([1]), bn.sources.Source)
    assert isinstance(bn.aggregations.Count(), bn.aggregations.Aggregation)
    assert not isinstance(object(), bn.aggregations.Aggregation)

    copy = cloudpickle.loads(cloudpickle.dumps(topo))
    assert list(copy.nodes) == ["src", "sum", "out"]
    assert copy.nodes["sum"].params["fn"](5, 2) == 7
    assert copy.nodes["sum"].inputs[0].key_fn(3) == 1
    assert copy.nodes["src"].params["source"].items == [1, 2, 3]
    copy.validate()


def test_py_typed_ships_with_the_package(tmp_path):
    """PEP 561: without ``bastion/py.typed`` in the installed package a type checker
    ignores bastion's annotations (every stream becomes Any). setuptools copies into
    a build only the package data pyproject.toml names, so build the package (a copy
    of the checkout: the build writes its metadata beside the sources) and look."""
    assert (ROOT / "bastion" / "py.typed").is_file()
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "bastion", checkout / "bastion",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    done = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
         "-d", str(tmp_path / "built")], cwd=checkout, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "built" / "bastion" / "topology.py").is_file()
    assert (tmp_path / "built" / "bastion" / "py.typed").is_file()

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(dep.startswith("mypy") for dep in
               pyproject["project"]["optional-dependencies"]["test"])


#: The whole package, as `test_the_whole_package_passes_mypy` checks it: mypy's
#: defaults (the DSL modules are held to ``--strict`` above; the internals are typed
#: where a type says something), third-party modules without stubs skipped.
PACKAGE_CONFIG = """\
[mypy]
ignore_missing_imports = True
show_error_codes = True
"""


def test_the_whole_package_passes_mypy(tmp_path):
    """Every module under ``bastion/`` type-checks; checked in the same run as a
    planted mistake, which must be the one error reported — the check can fail."""
    _mypy_available()
    config = tmp_path / "mypy.ini"
    config.write_text(PACKAGE_CONFIG)
    planted = tmp_path / "planted.py"
    planted.write_text("import bastion as bn\n\nwrong: int = bn.Topology('t')\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config),
         "--cache-dir", str(tmp_path / "cache"), "bastion", str(planted)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    errors = [(Path(m["file"]).name, int(m["line"]), m["message"])
              for m in map(_ERROR.match, output.splitlines()) if m]
    assert errors == [("planted.py", 3, 'Incompatible types in assignment (expression has '
                       'type "Topology", variable has type "int")  [assignment]')], output
