"""The wheel: one top-level name (`hotloop`), every code module in it, the baselines as package data, no committed
results, the console script and the pytest11 entry point; installed (not editable) and imported from another
folder, the gate's lookup finds the installed baseline (GPU name stubbed).

Built from a copy of the tracked files with `pip wheel --no-build-isolation --no-deps` (setuptools from the dev
extra), so the checkout gets no build/ or egg-info folder."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from test_layout import PACKAGE_DATA, ROOT, _modules

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs a git checkout (the wheel is built from the tracked files)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                          "-w", str(dist), str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    (path,) = dist.glob("hotloop-*.whl")
    return path


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def _read(wheel: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(suffix)]
        return z.read(name).decode()


def test_the_wheel_holds_hotloop_only_with_every_module_and_no_results(wheel):
    names = _names(wheel)
    assert _read(wheel, ".dist-info/top_level.txt").split() == ["hotloop"]
    assert {n.split("/")[0] for n in names} == {"hotloop", wheel.name.split("-")[0] + "-" +
                                                wheel.name.split("-")[1] + ".dist-info"}
    data = [n for n in names if n.startswith("hotloop/") and not n.endswith(".py")]  # no results, no scripts
    assert data and all(any(fnmatch.fnmatch(n, f"hotloop/{p}") for p in PACKAGE_DATA) for n in data), data
    expected = {"hotloop/" + str(p.relative_to(ROOT)) for p in _modules(ROOT).values()}
    assert expected - set(names) == set()  # a new subpackage missing from pyproject's list fails here
    assert "hotloop/guards/baseline_files/nvidia-h200.json" in names


def test_the_wheel_declares_the_command_and_the_pytest_plugin(wheel):
    entry = _read(wheel, ".dist-info/entry_points.txt")
    assert "[console_scripts]\nhotloop = hotloop.guards.cli:main" in entry
    assert "[pytest11]\nhotloop = hotloop.guards.pytest_plugin" in entry


def test_installed_from_the_wheel_it_imports_and_finds_its_baseline_from_another_folder(wheel, tmp_path):
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                          str(site), str(wheel)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    code = ("import hotloop.guards.guard, hotloop.guards.gate as g; "
            "p = g.default_baseline(gpu_name='NVIDIA H200'); "
            "print(hotloop.guards.guard.__file__); print(p); print(p.is_file())")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    module, baseline, exists = run.stdout.split()
    assert module.startswith(str(site)) and baseline == str(site / "hotloop/guards/baseline_files/nvidia-h200.json")
    assert exists == "True"
