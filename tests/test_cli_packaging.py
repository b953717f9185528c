"""What a new user's checkout promises around the command line: `make demo` installs
only what the demo needs while `make test` (what CI runs) installs the test extras too;
the files a run leaves behind are ignored by git; the documentation links nothing
outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def make_plan(target: str, tmp_path: Path) -> str:
    """The commands ``make TARGET`` would run on a fresh machine (``-n``: nothing runs;
    a virtual environment that does not exist yet, so every install step shows)."""
    done = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_without_test_extras_and_make_test_with_them(tmp_path):
    demo, test = make_plan("demo", tmp_path), make_plan("test", tmp_path)
    assert "pip install -q -e ." in demo and "bastion run examples/wordcount.py" in demo
    assert "[test" not in demo, demo
    assert "pip install -q -e '.[test]'" in test and "pytest -q" in test
    # and CI goes through `make test`
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("path", ["drill-report.html", "drill-report-coordinated.html",
                                  ".bastion/jobs/wordcount-1234/events/job-master"])
def test_what_a_run_leaves_behind_is_ignored_by_git(path):
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT,
                          timeout=30)
    if done.returncode == 128:
        pytest.skip("not a git checkout")
    assert done.returncode == 0, f"{path} is not git-ignored"


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_documentation_links_nothing_outside_the_repository(doc):
    text = (ROOT / doc).read_text()
    targets = re.findall(r"\]\(([^)]+)\)", text)
    assert doc != "README.md" or "docs/architecture.md" in targets
    for target in targets:
        assert "://" not in target, f"{doc} links outside the repository: {target}"
        path = (ROOT / doc).parent / target.split("#")[0]
        assert path.resolve().is_relative_to(ROOT), f"{doc}: {target} leaves the repository"
        assert path.exists(), f"{doc}: {target} does not exist"
    # nor by naming a path next to the checkout, as it once named ../shared/DESIGN.md
    assert "../" not in text.replace("](../", "]("), f"{doc} names a path outside the repo"
