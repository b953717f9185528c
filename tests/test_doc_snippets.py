"""Every shell and Python snippet of README.md and docs/*.md runs, as written (but for
the generated docs/api.md, whose blocks are signatures).

A fenced block tagged ``sh``, ``bash``, ``console`` or ``python`` is a snippet; any
other (``text``, ``yaml``, untagged) is prose. Each snippet runs in a working directory
of its own — ``examples/``, ``tests/``, ``deploy/`` and ``.venv`` linked from the
repository, so ``.venv/bin/bastion run examples/wordcount.py`` works as typed and the
default ``--storage local://.bastion`` lands in that directory — with ``.venv/bin`` first
on ``PATH``. A shell snippet runs under ``bash -e -o pipefail`` (every command must
succeed: a drill that is not exactly-once fails it); a Python snippet runs in this
process, on the session's Ray, in a namespace holding ``bn`` (``import bastion as bn``).
``bastion run``, ``drill`` and ``tune`` in a shell snippet join that Ray too (the
snippet's ``.venv/bin/bastion`` adds ``--address`` when the command has none): a Ray of
their own would cost each 5-20 s of two shared cores.

HTML comments on the lines right before a block (invisible on a rendered page) say how
to run it:

- ``<!-- not run: REASON -->``: the block is not run. Use it sparingly, for what needs
  a real multi-host cluster, docker, or would run the suite itself; a reason is
  required.
- ``<!-- setup: CODE -->``: run CODE first (Python for a Python block, shell for a
  shell block), e.g. to define the ``sentences`` a snippet leaves to the reader.
- ``<!-- slow -->``: the test is marked ``slow`` (it runs jobs of several seconds).

A ``text`` block right after a shell snippet is its expected output. Every line of it
must appear in what the snippet printed (stdout and stderr), in order, trailing blanks
aside; a ``<!-- compare: REGEX -->`` comment before the ``text`` block limits that to
the expected lines REGEX matches (the deterministic ones: counts and verdicts, not
timings), compared with runs of blanks collapsed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv"
# docs/api.md is generated from the docstrings (`bastion._apidoc`): its blocks are
# signatures, not snippets to run, and tests/test_api_fence.py checks it is current.
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md")
                                    if p.name != "api.md")]
RUN_LANGS = {"sh", "bash", "console", "python"}
SHELL_LANGS = {"sh", "bash", "console"}
LINKED = ("examples", "tests", "deploy", "benchmarks")
TIMEOUT_S = 420

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
COMMENT = re.compile(r"^\s*<!--\s*(not run|setup|slow|compare)\s*(?::\s*(.*?))?\s*-->\s*$",
                     re.S)


@dataclass
class Snippet:
    path: str
    line: int                    # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None = None
    setup: str = ""
    slow: bool = False
    expected: str | None = None  # the text block that follows a shell snippet
    compare: str | None = None   # regex: which expected lines are compared
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def _comments_before(lines: list[str], i: int) -> list[tuple[str, str | None]]:
    """The marker comments on the lines right above line index ``i`` (a comment may
    span several lines), nearest last; blank lines end the run."""
    found: list[tuple[str, str | None]] = []
    j = i - 1
    while j >= 0 and lines[j].strip().endswith("-->"):
        k = j
        while k >= 0 and "<!--" not in lines[k]:
            k -= 1
        if k < 0:
            break
        text = "\n".join(lines[k:j + 1])
        match = COMMENT.match(text)
        if not match:
            break
        found.insert(0, (match.group(1), match.group(2)))
        j = k - 1
    return found


def extract(text: str, path: str = "<doc>") -> list[Snippet]:
    """The fenced blocks of a Markdown text in a run language, with their markers and
    the expected output that follows a shell block."""
    lines = text.splitlines()
    blocks = []  # (start index, lang, code, end index)
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match:
            indent, lang = match.group(1), match.group(2).lower()
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise ValueError(f"{path}:{i + 1}: a code fence that is never closed")
            body = [line[len(indent):] if line.startswith(indent) else line
                    for line in lines[i + 1:j]]
            blocks.append((i, lang, "\n".join(body) + "\n", j))
            i = j + 1
        else:
            i += 1
    snippets: list[Snippet] = []
    for n, (start, lang, code, end) in enumerate(blocks):
        if lang not in RUN_LANGS:
            continue
        snippet = Snippet(path, start + 1, lang, code)
        for kind, value in _comments_before(lines, start):
            if kind == "not run":
                if not value:
                    raise ValueError(f"{snippet.id}: <!-- not run --> needs a reason")
                snippet.not_run = value
            elif kind == "setup":
                snippet.setup += (value or "") + "\n"
            elif kind == "slow":
                snippet.slow = True
            else:
                raise ValueError(f"{snippet.id}: <!-- {kind} --> belongs before an "
                                 "expected-output block")
        if lang in SHELL_LANGS and n + 1 < len(blocks):
            nxt_start, nxt_lang, nxt_code, _ = blocks[n + 1]
            between = re.sub(r"<!--.*?-->", "", "\n".join(lines[end + 1:nxt_start]),
                             flags=re.S)
            if nxt_lang == "text" and not between.strip():
                snippet.expected = nxt_code
                for kind, value in _comments_before(lines, nxt_start):
                    if kind == "compare":
                        snippet.compare = value
        snippets.append(snippet)
    return snippets


def all_snippets() -> list[Snippet]:
    found = []
    for doc in DOCS:
        found += extract(doc.read_text(), str(doc.relative_to(REPO)))
    return found


# ---- running one -------------------------------------------------------------------

# `bastion run|drill|tune` join the test session's Ray instead of starting one each
# (a Ray start costs 5-20 s of two shared cores); the command is otherwise the one typed.
JOIN = """#!/bin/sh
case "$1" in
  run|drill|tune)
    case " $* " in
      *" --address"*|*" --scenario "*|*" --help "*|*" -h "*) ;;
      *) set -- "$@" --address {address} ;;
    esac ;;
esac
exec {real} "$@"
"""


def workdir(tmp_path: Path, ray_address: str | None = None) -> Path:
    """A working directory that looks like the repository's top to a snippet. With
    ``ray_address``, its ``.venv`` is the repository's but for a ``bastion`` that
    joins that Ray."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for name in LINKED:
        (work / name).symlink_to(REPO / name)
    if ray_address is None:
        (work / ".venv").symlink_to(VENV)
        return work
    venv = work / ".venv"
    (venv / "bin").mkdir(parents=True)
    for entry in VENV.iterdir():
        if entry.name != "bin":
            (venv / entry.name).symlink_to(entry)
    for entry in (VENV / "bin").iterdir():
        if entry.name != "bastion":
            (venv / "bin" / entry.name).symlink_to(entry)
    join = venv / "bin" / "bastion"
    join.write_text(JOIN.format(address=ray_address, real=VENV / "bin" / "bastion"))
    join.chmod(0o755)
    return work


def snippet_env(cwd: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{cwd / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # a driver joining a Ray on 127.0.0.1 keeps it there (ray-project/ray#59110)
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    return env


def run_shell(snippet: Snippet, cwd: Path, timeout_s: float = TIMEOUT_S) -> str:
    """Run a shell snippet; its output (stdout then stderr). Fails the test when a
    command fails or the output does not show what the document shows."""
    script = "set -e -o pipefail\n" + snippet.setup + snippet.code
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=snippet_env(cwd),
                          capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"{snippet.id}: exit {done.returncode}\n--- script\n{script}"
                    f"--- output (last 4000 characters)\n{output[-4000:]}", pytrace=False)
    if snippet.expected is not None:
        check_output(snippet, output)
    return output


def _squash(line: str) -> str:
    return " ".join(line.split())


def check_output(snippet: Snippet, output: str) -> None:
    """Every (compared) expected line appears in the output, in order."""
    wanted = [line.rstrip() for line in snippet.expected.splitlines() if line.strip()]
    got = [line.rstrip() for line in output.splitlines()]
    if snippet.compare is not None:
        pattern = re.compile(snippet.compare)
        wanted = [_squash(line) for line in wanted if pattern.search(line)]
        got = [_squash(line) for line in got]
        if not wanted:
            pytest.fail(f"{snippet.id}: <!-- compare: {snippet.compare} --> matches no "
                        "expected line", pytrace=False)
    at = 0
    for line in wanted:
        try:
            at = got.index(line, at) + 1
        except ValueError:
            pytest.fail(f"{snippet.id}: the document shows\n  {line}\nbut the snippet "
                        f"printed (from there on, the last 80 lines)\n"
                        + "\n".join(got[at:][-80:]), pytrace=False)


def run_python(snippet: Snippet, cwd: Path) -> dict:
    """Run a Python snippet in this process, in ``cwd``; its namespace."""
    namespace: dict = {"__name__": "__doc_snippet__"}
    old = Path.cwd()
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))
    try:
        exec(compile("import bastion as bn\n" + snippet.setup, f"{snippet.id} (setup)",
                     "exec"), namespace)
        exec(compile(snippet.code, snippet.id, "exec"), namespace)
    finally:
        sys.path.remove(str(cwd))
        os.chdir(old)
    return namespace


def run_snippet(snippet: Snippet, tmp_path: Path, ray_address: str | None = None) -> None:
    cwd = workdir(tmp_path, ray_address)
    if snippet.lang in SHELL_LANGS:
        run_shell(snippet, cwd)
    else:
        run_python(snippet, cwd)


# ---- the documents' snippets ---------------------------------------------------------

SNIPPETS = all_snippets()


def _params(lang_shell: bool):
    params = []
    for s in SNIPPETS:
        if (s.lang in SHELL_LANGS) != lang_shell:
            continue
        marks = [pytest.mark.slow] if s.slow else []
        if s.not_run:
            marks.append(pytest.mark.skip(reason=f"not run: {s.not_run}"))
        params.append(pytest.param(s, id=s.id, marks=marks))
    return params


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("snippet", _params(lang_shell=True))
def test_shell_snippet_runs_as_documented(snippet, tmp_path, ray_session):
    import ray

    run_snippet(snippet, tmp_path, ray.get_runtime_context().gcs_address)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("snippet", _params(lang_shell=False))
def test_python_snippet_runs(snippet, tmp_path, ray_session):
    run_snippet(snippet, tmp_path)


def test_the_documents_have_snippets_and_few_are_not_run():
    """The extractor finds the documents' snippets, and not running one stays the
    exception, each with its reason."""
    assert len(SNIPPETS) >= 15
    not_run = [s for s in SNIPPETS if s.not_run]
    assert len(not_run) * 5 <= len(SNIPPETS) * 2, [s.id for s in not_run]  # at most 40%
    assert any(s.expected for s in SNIPPETS if not s.not_run)


def test_no_recipe_ends_processes_by_name():
    """`pkill -f` / `killall` end other users' processes on a shared machine, and a bare
    `ray stop` every Ray of the user: teardown uses the pids a recipe recorded."""
    for s in SNIPPETS:
        for line in s.code.splitlines():
            code = line.split("#", 1)[0]
            assert not re.search(r"\b(pkill|killall)\b", code), f"{s.id}: {line}"
            assert not re.search(r"\bray stop\b", code), f"{s.id}: {line}"


# ---- the checker checks --------------------------------------------------------------

BROKEN = """
Prose.

```bash
echo one
false
echo never
```

<!-- not run: shown only -->
```sh
exit 1
```

```python
raise RuntimeError("a broken snippet")
```

```bash
printf 'verdict: exactly-once\\nrecords 798\\n'
```

```text
verdict: exactly-once
records 481
```

<!-- setup: x = 2 -->
```python
assert x == 2
```

```yaml
not: run
```

```bash
printf 'took 1.23 s\\nrecords   798\\n'
```

<!-- compare: ^records -->
```text
took 9.99 s
records 798
```
"""


def test_the_extractor_sees_blocks_markers_and_expected_output():
    found = extract(BROKEN, "broken.md")
    assert [s.lang for s in found] == ["bash", "sh", "python", "bash", "python", "bash"]
    assert found[1].not_run == "shown only"
    assert found[3].expected == "verdict: exactly-once\nrecords 481\n"
    assert found[4].setup.strip() == "x = 2"
    assert found[5].compare == "^records"
    assert found[0].expected is None


def test_a_broken_shell_snippet_fails(tmp_path):
    snippet = extract(BROKEN, "broken.md")[0]
    with pytest.raises(pytest.fail.Exception, match="exit 1"):
        run_snippet(snippet, tmp_path)


def test_a_broken_python_snippet_fails(tmp_path):
    snippet = extract(BROKEN, "broken.md")[2]
    with pytest.raises(RuntimeError, match="a broken snippet"):
        run_snippet(snippet, tmp_path)


def test_output_that_differs_from_the_document_fails(tmp_path):
    snippet = extract(BROKEN, "broken.md")[3]
    with pytest.raises(pytest.fail.Exception, match="records 481"):
        run_snippet(snippet, tmp_path)


def test_compared_lines_ignore_timings_and_spacing(tmp_path):
    found = extract(BROKEN, "broken.md")
    run_snippet(found[4], tmp_path / "a")   # the setup defined x
    run_snippet(found[5], tmp_path / "b")   # timing differs, count matches
    found[5].expected = found[5].expected.replace("798", "797")
    with pytest.raises(pytest.fail.Exception, match="records 797"):
        run_snippet(found[5], tmp_path / "c")


def test_a_not_run_marker_needs_a_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        extract("<!-- not run -->\n```bash\ntrue\n```\n")
