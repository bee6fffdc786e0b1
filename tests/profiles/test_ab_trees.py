"""results/h200/device/ab_trees.sh: the trees the device part `ab` compares (one per commit), made in a fresh clone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    dst = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(dst)], check=True)
    return dst


def _run(repo: Path, *specs: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "results" / "h200" / "device" / "ab_trees.sh"), *specs],
        cwd=repo,
        capture_output=True,
        text=True,
    )


def test_makes_one_tree_per_commit_with_its_id(clone: Path) -> None:
    res = _run(clone, "a=HEAD", "b=HEAD")
    assert res.returncode == 0, res.stderr
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
    ).stdout.strip()
    for name in ("a", "b"):
        tree = clone / ".abtrees" / name
        assert (tree / "COMMIT").read_text().strip() == head
        assert (tree / "kernels" / "linear.py").is_file() and (tree / "tests" / "conftest.py").is_file()
        assert not (tree / "results").exists()  # results stay out of the trees


@pytest.mark.parametrize(
    "spec,message",
    [("noequals", "want NAME=REF"), ("bad/name=HEAD", "want NAME=REF"), ("x=no-such-ref", "is not a commit")],
)
def test_bad_spec_exits_2_and_keeps_the_trees(clone: Path, spec: str, message: str) -> None:
    assert _run(clone, "keep=HEAD").returncode == 0
    res = _run(clone, "new=HEAD", spec)
    assert res.returncode == 2 and message in res.stderr
    assert sorted(p.name for p in (clone / ".abtrees").iterdir()) == ["keep"]


def test_a_name_given_twice_is_refused(clone: Path) -> None:
    res = _run(clone, "a=HEAD", "a=HEAD")
    assert res.returncode == 2 and "given twice" in res.stderr
