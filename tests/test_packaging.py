"""The wheel: one top-level name (`hotloop`), every code module in it, the baselines and the docs as package data,
no committed results and no lab code, the console script and the pytest11 entry point; installed (not editable)
and run from an empty folder as a new user would, the gate's lookup finds the installed baseline (GPU name
stubbed), the output cites the installed docs (the gate's criteria header, `hotloop nsys`), and `hotloop mutate
--manifest` runs this checkout's suite (its --check).

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
from test_layout import LAB, PACKAGE_DATA, ROOT, _modules

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(),
    reason="needs a git checkout (the wheel is built from the tracked files)",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
    )
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
    assert {n.split("/")[0] for n in names} == {
        "hotloop",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }
    data = [n for n in names if n.startswith("hotloop/") and not n.endswith(".py")]  # no results, no scripts
    assert data and all(any(fnmatch.fnmatch(n, f"hotloop/{p}") for p in PACKAGE_DATA) for n in data), data
    expected = {"hotloop/" + str(p.relative_to(ROOT)) for p in _modules(ROOT).values()}
    assert expected - set(names) == set()  # a new subpackage missing from pyproject's list fails here
    assert "hotloop/guards/baseline_files/nvidia-h200.json" in names
    assert {"hotloop/docs/criteria.md", "hotloop/docs/nsight.md"} <= set(names)


def test_the_wheel_ships_no_lab_code_and_no_results(wheel):
    names = _names(wheel)
    assert (ROOT / LAB / "kernel_bench.py").is_file() and (ROOT / "results").is_dir()
    shipped = [n for n in names if n.split("/")[1] in ("lab", "results") or "/lab/" in n or "/results/" in n]
    assert shipped == []
    lab = {p.stem for p in (ROOT / LAB).glob("*.py")} - {"__init__"}
    assert {"kernel_bench", "split_gemm_probe", "trace_synth", "precision_variants"} <= lab
    assert not [n for n in names if n.endswith(".py") and Path(n).stem in lab]  # no lab module under another name


def test_the_wheel_declares_the_command_and_the_pytest_plugin(wheel):
    entry = _read(wheel, ".dist-info/entry_points.txt")
    assert "[console_scripts]\nhotloop = hotloop.guards.cli:main" in entry
    assert "[pytest11]\nhotloop = hotloop.guards.pytest_plugin" in entry


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel installed (not editable, no dependencies) into a folder of its own: put it first on PYTHONPATH."""
    site = tmp_path_factory.mktemp("site")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return site


def _run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` with the installed wheel first on the path."""
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_installed_from_the_wheel_it_imports_and_finds_its_baseline_from_another_folder(site, tmp_path):
    code = (
        "import hotloop.guards.guard, hotloop.guards.gate as g; "
        "p = g.default_baseline(gpu_name='NVIDIA H200'); "
        "print(hotloop.guards.guard.__file__); print(p); print(p.is_file())"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    module, baseline, exists = run.stdout.split()
    assert module.startswith(str(site)) and baseline == str(site / "hotloop/guards/baseline_files/nvidia-h200.json")
    assert exists == "True"


def test_installed_and_run_from_an_empty_folder_the_gate_cites_the_installed_criteria(site, tmp_path):
    """Issue 40 item 6: a new user's gate (the wheel, an empty folder) cites a criteria table it has."""
    empty = tmp_path / "empty"
    empty.mkdir()
    run = _run_installed(
        site,
        empty,
        "-m",
        "hotloop.guards.cli",
        "gate",
        "--epochs",
        "1",
        "--set",
        "learner_steps_per_epoch=20",
        "--no-baseline",
        "--no-progress",
        "--out",
        str(tmp_path / "g"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    criteria = site / "hotloop" / "docs" / "criteria.md"
    assert f"\nCriteria (hotloop criteria; {criteria}), " in run.stdout and criteria.is_file()
    assert "docs/criteria.md" not in run.stdout.replace(str(criteria), "")  # no citation of a checkout's file


def test_installed_hotloop_nsys_points_to_the_installed_nsight_doc(site, tmp_path):
    run = _run_installed(site, tmp_path, "-m", "hotloop.guards.cli", "nsys", "--", "true")
    nsight = site / "hotloop" / "docs" / "nsight.md"
    if run.returncode != 2 or "no Nsight Systems found" not in run.stderr:
        pytest.skip(f"Nsight Systems is installed here (exit {run.returncode}): the error path is not reached")
    assert f"the bundled route of {nsight} " in run.stderr and nsight.is_file()


def test_installed_hotloop_mutate_runs_the_suite_of_the_checkout_its_manifest_names(site, tmp_path):
    manifest = ROOT / "ci" / "mutants" / "mutants.toml"
    run = _run_installed(site, tmp_path, "-m", "hotloop.guards.cli", "mutate", "--manifest", str(manifest), "--check")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"every patch applies to {ROOT}" in run.stdout
    none = _run_installed(site, tmp_path, "-m", "hotloop.guards.cli", "mutate", "--check")
    assert none.returncode == 2 and "no mutant manifest at" in none.stderr and "--manifest PATH" in none.stderr
