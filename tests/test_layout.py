"""The package layout a reader can see: one import name (`hotloop.*`, never a bare `trainer`/`kernels`/`guards`/
`profiles`/`probes`), layers that import downward only (the rules of each package's `__init__` docstring), no import
cycle, the probes and benches out of the learner step's imports, the committed results in results/ and the lab code
in results/lab/ outside every package (no records in a package folder but its listed package data; nothing of results/ or
results/lab/ shipped; no hotloop module imports lab), and no citation of the workshop folder outside the repo.

Each check is a function over a source tree, run on this checkout and on a small tree with the forbidden edit
written in, where it must report it."""

from __future__ import annotations

import ast
import fnmatch
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "profiles", "trainer", "guards")
"""The code folders, installed as hotloop.<folder>; the order is the layering of their library modules, lowest
first (guards' probes, composition modules and commands sit above its harness library: PROBES, COMPOSITION,
COMMANDS)."""
RESULTS = "results"
"""The committed results (records and the scripts that made them): a top-level folder, outside every package."""
LAB = "results/lab"
"""The lab code (probes, benches, experiment kernels run from a checkout, imported as `lab.*` with results/ on the
path): inside results/, outside every package, not shipped; it may import hotloop, and no hotloop module imports it."""
OUTSIDE = (RESULTS,)
"""The top-level folders that no package holds or is in, and that the wheel does not ship (the lab code with them)."""
PACKAGE_DATA = ("guards/baseline_files/*.json", "docs/*.md")
"""The only files of a package folder that are not Python modules (pyproject.toml's package-data, as paths): the
baselines, and docs/ (hotloop.docs, a data-only package: the output cites the installed docs, profiles/docs.py)."""
ALLOWED = {
    "kernels": {"kernels"},
    "profiles": {"profiles", "kernels"},
    "trainer": {"trainer", "kernels", "profiles"},
    "guards": {"guards", "profiles"},
    "probes": {"kernels", "profiles", "trainer", "guards"},
}
"""Layer (a package, or PROBES' "probes") -> the hotloop packages its modules may import (itself included)."""
PROBES = "guards.probes"
"""The probes and benches, a folder (guards/probes/): the precision probe, the bench variants, `hotloop bench`'s
library. They may import the trainer, the kernels, profiles and the harness library; the harness library, the
trainer and the layers below import none of them; the composition modules and the commands may."""
COMMANDS = "guards.commands"
"""The application layer, a folder (guards/commands/): the `hotloop` command, one module per subcommand. Its modules
may import every package; nothing outside it imports it but SHIM (hotloop.guards' docstring)."""
COMPOSITION = {
    "guards.gate",
    "guards.run",
    "guards.faults",
    "guards.mutate",
    "guards.learning_report",
    "guards.data_parallel",
}
"""The layer between the commands and the harness library: the modules of guards/ that compose the guards with the
trainer, the kernels and the probes. They may import every package but COMMANDS; the other modules of guards/ (the
harness library) and the probes import none of them."""
SHIM = "guards.cli"
"""hotloop.guards.cli, the command's stable name (console script, `python -m`): it only re-exports COMMANDS' main."""


def _modules(root: Path, folders=PACKAGES) -> dict[str, Path]:
    """'pkg.mod' -> file of every Python module under `folders` of `root`."""
    found = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            found[".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes inside an `if TYPE_CHECKING:` block: never executed, annotations only."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imports(path: Path, runtime_only: bool = False) -> list[tuple[int, str]]:
    """(line, dotted module) of every import statement in `path`, those inside functions included; with
    `runtime_only`, those under `if TYPE_CHECKING:` left out."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)]
            if node.module.split(".")[0] == "hotloop":  # `from hotloop.x import y`: y may be a module
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def bare_imports(root: Path, folders=(*PACKAGES, LAB, "tests", "ci")) -> list[str]:
    """'file:line imports X' for each import of a bare trainer/kernels/guards/profiles/probes module under
    `folders`."""
    bad = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for line, name in _imports(path):
                if name.split(".")[0] in PACKAGES:
                    bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


def _in(module: str, package: str) -> bool:
    """Whether the dotted `module` is `package` or inside it."""
    return module == package or module.startswith(package + ".")


def layer(module: str) -> str:
    """The layer of 'pkg.mod': "commands" (the folder COMMANDS), "composition" (COMPOSITION), "shim" (SHIM), else
    its package ("guards": the harness library)."""
    if _in(module, COMMANDS):
        return "commands"
    if _in(module, PROBES):
        return "probes"
    return "composition" if module in COMPOSITION else "shim" if module == SHIM else module.split(".")[0]


def layer_violations(root: Path) -> list[str]:
    """'file:line: pkg.mod imports hotloop.X' for each import that goes against the layers: a package's modules
    import only the packages ALLOWED to it, the commands and the composition modules every package; nothing but
    the commands and the shim imports the commands; no module but the commands and the composition modules (the
    harness library, the probes) imports a composition module."""
    bad = []
    for module, path in _modules(root).items():
        kind = layer(module)
        allowed = (
            set(PACKAGES)
            if kind in ("commands", "composition")
            else ALLOWED["probes" if kind == "probes" else module.split(".")[0]]
        )
        lines = {}  # one report per import statement
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "hotloop" or len(parts) < 2 or parts[1] not in PACKAGES:
                continue
            target = ".".join(parts[1:])
            if (
                parts[1] not in allowed
                or (_in(target, COMMANDS) and kind not in ("commands", "shim"))
                or (kind not in ("commands", "composition") and target in COMPOSITION)
                or (kind == "guards" and _in(target, PROBES))
            ):
                lines.setdefault(line, f"{path.relative_to(root)}:{line}: {module} imports {name}")
        bad += lines.values()
    return bad


def lab_imports(root: Path) -> list[str]:
    """'file:line imports X' for each import of the lab code (`lab`, `lab.*`) by a module of the packages: the
    wheel does not ship results/lab/, so an installed hotloop that imported it would fail."""
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for path in _modules(root).values()
        for line, name in _imports(path)
        if name.split(".")[0] == LAB.rsplit("/", 1)[-1]
    ]


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


def import_graph(root: Path) -> dict[str, set[str]]:
    """'pkg.mod' -> the hotloop modules it imports (module-level and inside functions; not those under
    `if TYPE_CHECKING:`, which never run). `from hotloop.a import b` imports a.b when b is a module, else a. A
    package's `__init__` is an edge only where it is imported by name (it runs before any of its submodules, whose
    import of a sibling is therefore no cycle through it)."""
    modules = _modules(root)
    graph = {}
    for module, path in modules.items():
        names = {
            name.removeprefix("hotloop.")
            for _, name in _imports(path, runtime_only=True)
            if name.startswith("hotloop.")
        }
        graph[module] = {n for n in names if n in modules and n != module}
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """Each import cycle among the modules of the packages, as the sorted modules of one strongly connected
    component of `import_graph` (Tarjan's algorithm, iterative); empty when the imports form a DAG."""
    graph = import_graph(root)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(cycles)


def _product_files(root: Path) -> list[str]:
    """The checkout's files (tracked, and untracked ones that .gitignore does not match), relative, POSIX."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(n for n in set(out.stdout.split("\0")) if n and (root / n).is_file())


def records_in_packages(root: Path) -> list[str]:
    """Files under a package folder that are neither a Python module nor PACKAGE_DATA: results, tables, notes,
    scripts (they belong in results/)."""
    return [
        name
        for name in _product_files(root)
        if name.split("/")[0] in PACKAGES
        and not name.endswith(".py")
        and not any(fnmatch.fnmatch(name, pattern) for pattern in PACKAGE_DATA)
    ]


def results_shipped(root: Path) -> list[str]:
    """What would put results/ or results/lab/ (OUTSIDE) into the wheel or a package into them, read from
    root/pyproject.toml: package discovery that is not an explicit list, a package whose folder is one of them,
    inside one or holding one, or package data (as paths) that is not PACKAGE_DATA."""
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    if not isinstance(setup.get("packages"), list):
        return [f"[tool.setuptools] packages is {setup.get('packages')!r}, not an explicit list"]
    folders, bad = setup.get("package-dir", {}), []
    for package in setup["packages"]:
        parent = next(
            (p for p in sorted(folders, key=len, reverse=True) if package == p or package.startswith(p + ".")), None
        )
        folder = Path(folders[parent], *package[len(parent) :].split(".")[1:]) if parent else Path(*package.split("."))
        for outside in OUTSIDE:
            if folder.is_relative_to(outside) or Path(outside).is_relative_to(folder):
                bad.append(f"package {package} is the folder {folder.as_posix()}, which holds or is in {outside}/")
    for package, patterns in setup.get("package-data", {}).items():
        for pattern in patterns:
            path = f"{folders.get(package, package.replace('.', '/'))}/{pattern}"
            if path not in PACKAGE_DATA:
                bad.append(f"package data {path} of {package} is not in PACKAGE_DATA")
    return bad


def test_no_module_imports_a_bare_package_name():
    assert bare_imports(ROOT) == []


def test_layers_import_downward_only():
    assert layer_violations(ROOT) == []


def test_the_learner_step_does_not_reach_the_probes():
    reached = reached_from(ROOT, "trainer.step")
    assert "trainer.step" in reached and "kernels.linear" in reached  # the walk follows imports
    assert {"guards.probes.bench_variants", "guards.probes.bench", "guards.probes.precision_probe"} <= set(
        _modules(ROOT)
    )
    assert not {m for m in reached if _in(m, PROBES)}


def test_no_module_of_the_packages_imports_the_lab_code():
    assert (ROOT / LAB / "kernel_bench.py").is_file() and not (ROOT / LAB / "kernel_bench.py").is_relative_to(
        ROOT / "profiles"
    )
    assert lab_imports(ROOT) == []


def test_a_lab_import_is_reported(tmp_path):
    root = _tree(
        tmp_path,
        {
            "guards/probes/a.py": "def f():\n    from lab.precision_variants import variant_matmul\n",
            "kernels/b.py": "import lab\n",
            "results/lab/c.py": "from hotloop.kernels import linear\n",
        },
    )
    assert lab_imports(root) == ["kernels/b.py:1 imports lab", "guards/probes/a.py:2 imports lab.precision_variants"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "module,line",
    [
        ("kernels/td_loss.py", "from hotloop.trainer.losses import td_loss"),
        ("kernels/segment_tree.py", "def f():\n    from hotloop.profiles.provenance import commit_id\n"),
        ("profiles/inspect_cmd.py", "from hotloop.guards.trace_counts import count_totals"),
        ("profiles/ranges.py", "import hotloop.trainer.config"),
        ("trainer/loop.py", "from hotloop.guards.watchdog import HangWatchdog"),
        ("guards/guard.py", "from hotloop import trainer"),
        ("guards/step_metrics.py", "from hotloop.trainer.step import PHASE_RULES"),
        ("guards/guard.py", "from hotloop.guards.commands.main import main"),
        ("guards/run.py", "def f():\n    from hotloop.guards.commands import checks\n"),
        ("profiles/report.py", "import hotloop.guards.commands.report"),
        ("guards/step_metrics.py", "from hotloop.guards import gate"),
        ("guards/baselines.py", "from hotloop.guards.run import run_training"),
        ("trainer/loop.py", "from hotloop.guards.probes.bench import run_bench"),
        ("guards/guard.py", "import hotloop.guards.probes.bench_variants"),
        ("guards/probes/bench.py", "from hotloop.guards.gate import run_gate"),
        ("guards/probes/precision_probe.py", "def f():\n    from hotloop.guards.commands import gate\n"),
    ],
)
def test_a_forbidden_import_is_reported(tmp_path, module, line):
    root = _tree(tmp_path, {module: f"import torch\n{line}\n", "guards/gate.py": "import hotloop.trainer.loop\n"})
    bad = layer_violations(root)
    assert [b.split(":")[0] for b in bad] == [module], bad


def test_the_layers_of_guards_are_its_folders_and_the_composition_modules():
    modules = _modules(ROOT)
    assert {layer(m) for m in modules if m.startswith("guards")} == {
        "guards",
        "probes",
        "composition",
        "commands",
        "shim",
    }
    assert COMPOSITION <= set(modules) and SHIM in modules  # the known set names modules that exist
    commands = {m.removeprefix(COMMANDS + ".") for m in modules if _in(m, COMMANDS)}
    assert {"train", "gate", "bench", "inspect", "report", "nsys", "mutate", "learning", "main"} <= commands
    doc = ast.get_docstring(ast.parse((ROOT / "guards" / "__init__.py").read_text()))
    assert (
        "guards/commands/" in doc
        and "guards/probes/" in doc
        and all(m.removeprefix("guards.") in doc for m in COMPOSITION)
    )


def test_the_probes_may_import_the_trainer_and_the_harness_library(tmp_path):
    root = _tree(
        tmp_path,
        {
            "guards/probes/bench.py": "from hotloop.trainer.config import Config\n"
            "from hotloop.guards.guard import guard_steps\n"
            "import hotloop.kernels.linear, hotloop.profiles.provenance\n",
            "guards/faults.py": "from hotloop.guards.probes.bench_variants import tf32_matmuls\n",
        },
    )
    assert layer_violations(root) == []


def test_the_commands_and_composition_modules_may_import_everything(tmp_path):
    root = _tree(
        tmp_path,
        {
            "guards/commands/train.py": "from hotloop.trainer.loop import Trainer\nimport hotloop.kernels.linear\n"
            "from hotloop.guards import gate\nfrom hotloop.guards.commands import checks\n",
            "guards/commands/checks.py": "from hotloop.profiles.run_lock import acquire\n",
            "guards/cli.py": "from hotloop.guards.commands.main import main\n",
            "guards/gate.py": "import hotloop.trainer.loop\nfrom hotloop.guards import run, guard\n",
            "guards/run.py": "from hotloop.kernels import linear\n",
            "guards/guard.py": "import hotloop.profiles.ranges\n",
        },
    )
    assert layer_violations(root) == []


def test_a_bare_import_is_reported_in_code_and_tests(tmp_path):
    root = _tree(
        tmp_path,
        {
            "trainer/a.py": "def f():\n    import kernels.linear\n",
            "tests/test_b.py": "from guards.guard import guard_steps\n",
            "guards/c.py": "from hotloop.guards import guard\nimport profiles_extra\n",
        },
    )
    assert bare_imports(root) == ["trainer/a.py:2 imports kernels.linear", "tests/test_b.py:1 imports guards.guard"]


def test_a_bench_import_in_the_learner_step_is_reported(tmp_path):
    root = _tree(
        tmp_path,
        {
            "trainer/step.py": "from hotloop.trainer import flat_net\n",
            "trainer/flat_net.py": "def f():\n    from hotloop.guards.probes.bench_variants import Variant\n",
            "guards/probes/bench_variants.py": "",
        },
    )
    assert "guards.probes.bench_variants" in reached_from(root, "trainer.step")


def _shared_citations(root: Path) -> list[str]:
    """Lines of the product's tracked files (everything but results/) that cite the workshop folder beside the
    checkout, which a clone or an install does not have."""
    out = subprocess.run(
        ["git", "grep", "-n", "-F", "../" + "shared", "--", ".", f":!{RESULTS}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return out.stdout.splitlines()


def test_the_product_cites_nothing_outside_the_repo():
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (git grep over the tracked files)")
    assert _shared_citations(ROOT) == []


def test_a_citation_outside_the_repo_is_reported_outside_the_results(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    cite = "see ../" + "shared/DESIGN.md\n"
    root = _tree(tmp_path, {"guards/x.py": f"# {cite}", "results/h200/notes.md": cite, "README.md": "ok\n"})
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    assert _shared_citations(root) == [f"guards/x.py:1:# {cite.strip()}"]


def test_the_imports_form_no_cycle():
    graph = import_graph(ROOT)
    assert "trainer.device_choice" in graph["trainer.resume"] and "trainer.resume" in graph["trainer.loop"]
    assert "trainer.loop" in graph["guards.probes.bench_variants"]  # an import inside a function is an edge
    assert import_cycles(ROOT) == []


@pytest.mark.parametrize(
    "files,cycles",
    [
        (
            {
                "trainer/a.py": "from hotloop.trainer.b import f\n",
                "trainer/b.py": "def f():\n    from hotloop.trainer.a import g\n",
            },
            [["trainer.a", "trainer.b"]],
        ),
        (
            {
                "kernels/x.py": "import hotloop.profiles.y\n",
                "profiles/y.py": "from hotloop.profiles import z\n",
                "profiles/z.py": "from hotloop.kernels import x\n",
                "guards/w.py": "import hotloop.kernels.x\n",
            },
            [["kernels.x", "profiles.y", "profiles.z"]],
        ),
        (
            {
                "trainer/a.py": "from hotloop.trainer.b import f\n",  # an annotation-only import back: no cycle
                "trainer/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hotloop.trainer.a import A\n",
            },
            [],
        ),
    ],
)
def test_an_import_cycle_is_reported(tmp_path, files, cycles):
    assert import_cycles(_tree(tmp_path, files)) == cycles


def _git_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = _tree(tmp_path, files)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


def test_no_package_folder_holds_records():
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the checkout's files)")
    assert records_in_packages(ROOT) == []


def test_records_in_a_package_folder_are_reported(tmp_path):
    root = _git_tree(
        tmp_path,
        {
            "kernels/a.py": "",
            "guards/baseline_files/gpu.json": "{}",
            "guards/notes.csv": "x\n",
            "profiles/h200/README.md": "# runs\n",
            "profiles/h200/device/run.sh": "echo\n",
            "results/h200/bench.csv": "x\n",
            "trainer/__pycache__/a.pyc": "",
            ".gitignore": "__pycache__/\n",
        },
    )
    assert records_in_packages(root) == ["guards/notes.csv", "profiles/h200/README.md", "profiles/h200/device/run.sh"]


def test_results_and_lab_are_outside_every_package_and_not_shipped():
    assert (ROOT / RESULTS).is_dir() and not (ROOT / RESULTS / "__init__.py").exists()
    assert (ROOT / LAB).is_dir() and not set(OUTSIDE) & set(PACKAGES)
    assert results_shipped(ROOT) == []


_PYPROJECT = """[tool.setuptools]
packages = {packages}

[tool.setuptools.package-dir]
"hotloop.guards" = "guards"
{extra_dir}
[tool.setuptools.package-data]
"hotloop.guards" = [{data}]
"""


@pytest.mark.parametrize(
    "packages,extra_dir,data,reported",
    [
        ('["hotloop.guards"]', "", '"baseline_files/*.json"', []),
        (
            "{find = {}}",
            "",
            '"baseline_files/*.json"',
            ["[tool.setuptools] packages is {'find': {}}, not an explicit list"],
        ),
        (
            '["hotloop.guards", "hotloop.results"]',
            '"hotloop.results" = "results"\n',
            '"baseline_files/*.json"',
            ["package hotloop.results is the folder results, which holds or is in results/"],
        ),
        (
            '["hotloop.guards", "hotloop.h200"]',
            '"hotloop.h200" = "results/h200"\n',
            '"baseline_files/*.json"',
            ["package hotloop.h200 is the folder results/h200, which holds or is in results/"],
        ),
        (
            '["hotloop.guards"]',
            "",
            '"baseline_files/*.json", "../results/*.csv"',
            ["package data guards/../results/*.csv of hotloop.guards is not in PACKAGE_DATA"],
        ),
        (
            '["hotloop.guards", "hotloop.lab"]',
            '"hotloop.lab" = "results/lab"\n',
            '"baseline_files/*.json"',
            ["package hotloop.lab is the folder results/lab, which holds or is in results/"],
        ),
    ],
)
def test_a_pyproject_that_would_ship_results_is_reported(tmp_path, packages, extra_dir, data, reported):
    root = _tree(tmp_path, {"pyproject.toml": _PYPROJECT.format(packages=packages, extra_dir=extra_dir, data=data)})
    assert results_shipped(root) == reported
