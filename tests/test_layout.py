"""The package layout a reader can see: one import name (`hotloop.*`, never a bare `trainer`/`kernels`/`guards`/
`profiles`), layers that import downward only (the rules of each package's `__init__` docstring), the bench
harness out of the learner step's imports, and no citation of the workshop folder outside the repo.

Each check is a function over a source tree, run on this checkout and on a small tree with the forbidden edit
written in, where it must report it."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "profiles", "trainer", "guards")
"""The code folders, installed as hotloop.<folder>; the order is the layering, lowest first."""
DATA_DIRS = ("profiles/h200", "profiles/cpu")
"""Committed results inside profiles/: data, not code."""
ALLOWED = {"kernels": {"kernels"}, "profiles": {"profiles", "kernels"}, "trainer": {"trainer", "kernels", "profiles"},
           "guards": {"guards", "profiles"}}
"""Package -> the hotloop packages its modules may import (itself included)."""
COMPOSITION = {"guards.gate", "guards.run", "guards.bench", "guards.faults", "guards.cli", "guards.mutate",
               "guards.learning_report"}
"""The modules that compose the guards with the trainer (hotloop.guards' docstring): they may import everything."""


def _modules(root: Path, folders=PACKAGES) -> dict[str, Path]:
    """'pkg.mod' -> file of every Python module under `folders` of `root` (data folders left out)."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root)
            if any(rel.is_relative_to(d) for d in DATA_DIRS):
                continue
            found[".".join(rel.with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import statement in `path`, those inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)]
            if node.module.split(".")[0] == "hotloop":  # `from hotloop.x import y`: y may be a module
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def bare_imports(root: Path, folders=(*PACKAGES, "tests", "ci")) -> list[str]:
    """'file:line imports X' for each import of a bare trainer/kernels/guards/profiles module under `folders`."""
    bad = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for line, name in _imports(path):
                if name.split(".")[0] in PACKAGES:
                    bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


def layer_violations(root: Path) -> list[str]:
    """'file:line: pkg.mod imports hotloop.X' for each import that goes against ALLOWED / COMPOSITION."""
    bad = []
    for module, path in _modules(root).items():
        package = module.split(".")[0]
        allowed = set(PACKAGES) if module in COMPOSITION else ALLOWED[package]
        lines = {}  # one report per import statement
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] == "hotloop" and len(parts) > 1 and parts[1] in PACKAGES and parts[1] not in allowed:
                lines.setdefault(line, f"{path.relative_to(root)}:{line}: {module} imports {name}")
        bad += lines.values()
    return bad


def reached_from(root: Path, start: str) -> set[str]:
    """Every hotloop module (as 'pkg.mod') that importing `start` ('pkg.mod') imports, directly or not."""
    modules, seen, todo = _modules(root), set(), [start]
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        for _, name in _imports(modules[module]):
            if name.startswith("hotloop."):
                parts = name.split(".")[1:]
                todo += [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return seen & set(modules)


def test_no_module_imports_a_bare_package_name():
    assert bare_imports(ROOT) == []


def test_layers_import_downward_only():
    assert layer_violations(ROOT) == []


def test_the_learner_step_does_not_reach_the_bench_harness():
    reached = reached_from(ROOT, "trainer.step")
    assert "trainer.step" in reached and "kernels.linear" in reached  # the walk follows imports
    assert not reached & {"trainer.bench_variants", "guards.bench", "profiles.kernel_bench"}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("module,line", [
    ("kernels/td_loss.py", "from hotloop.trainer.losses import td_loss"),
    ("kernels/segment_tree.py", "def f():\n    from hotloop.profiles.provenance import commit_id\n"),
    ("profiles/inspect_cmd.py", "from hotloop.guards.trace_counts import count_totals"),
    ("profiles/ranges.py", "import hotloop.trainer.config"),
    ("trainer/loop.py", "from hotloop.guards.watchdog import HangWatchdog"),
    ("guards/guard.py", "from hotloop import trainer"),
    ("guards/step_metrics.py", "from hotloop.trainer.step import PHASE_RULES"),
])
def test_a_forbidden_import_is_reported(tmp_path, module, line):
    root = _tree(tmp_path, {module: f"import torch\n{line}\n", "guards/gate.py": "import hotloop.trainer.loop\n"})
    bad = layer_violations(root)
    assert [b.split(":")[0] for b in bad] == [module], bad


def test_a_bare_import_is_reported_in_code_and_tests(tmp_path):
    root = _tree(tmp_path, {"trainer/a.py": "def f():\n    import kernels.linear\n",
                            "tests/test_b.py": "from guards.guard import guard_steps\n",
                            "guards/c.py": "from hotloop.guards import guard\nimport profiles_extra\n"})
    assert bare_imports(root) == ["trainer/a.py:2 imports kernels.linear", "tests/test_b.py:1 imports guards.guard"]


def test_a_bench_import_in_the_learner_step_is_reported(tmp_path):
    root = _tree(tmp_path, {"trainer/step.py": "from hotloop.trainer import flat_net\n",
                            "trainer/flat_net.py": "def f():\n    from hotloop.trainer.bench_variants import Variant\n",
                            "trainer/bench_variants.py": ""})
    assert "trainer.bench_variants" in reached_from(root, "trainer.step")


def _shared_citations(root: Path) -> list[str]:
    """Lines of the product's tracked files (everything but the data folders) that cite the workshop folder beside
    the checkout, which a clone or an install does not have."""
    out = subprocess.run(["git", "grep", "-n", "-F", "../" + "shared", "--", ".", *(f":!{d}" for d in DATA_DIRS)],
                         cwd=root, capture_output=True, text=True)
    return out.stdout.splitlines()


def test_the_product_cites_nothing_outside_the_repo():
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (git grep over the tracked files)")
    assert _shared_citations(ROOT) == []


def test_a_citation_outside_the_repo_is_reported_outside_the_data_folders(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    cite = "see ../" + "shared/DESIGN.md\n"
    root = _tree(tmp_path, {"guards/x.py": f"# {cite}", "profiles/h200/notes.md": cite, "README.md": "ok\n"})
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    assert _shared_citations(root) == [f"guards/x.py:1:# {cite.strip()}"]
