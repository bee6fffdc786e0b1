"""`hotloop mutate` (`python -m hotloop.guards.mutate`): the source-level mutation suite of `hotloop gate`.

A mutant is a small patch a developer could commit (ci/mutants/<id>.patch, listed with the criterion it must fail
in ci/mutants/mutants.toml, whose header gives the fields). Unlike the wrapper faults of hotloop.guards.faults,
which wrap exactly the guarded call, a mutant lands wherever the edit would really be: the loop body, the actor,
the readback, the progress callback, inside a kernel with its name kept, every step or every N steps. The suite
measures what the gate sees of the whole loop: mutation score = killed / total.

What `run_suite` does, in this order (nothing runs on the GPU before the first two checks pass):
1. reads the manifest (`load_manifest`; a bad entry is a usage error, exit 2, naming it);
2. copies the checkout (`copy_checkout`: the files git tracks (`git ls-files --cached`), as they are in the
   working tree, so uncommitted changes to tracked files come along and untracked files (a .venv inside a clone)
   do not; without git, the tree less build outputs, virtual environments and .gitignore's plain patterns) to a
   temporary folder, printing what it copied (N files, M MB), and checks that every selected patch applies to it
   (`git apply --check`, else `patch --dry-run`); one that does not is a usage error (exit 2) naming it;
3. runs the gate on the clean copy, once per distinct argument list of the selected mutants: each must PASS
   (exit 0), else the suite stops with exit 4 and no score (a tree that already fails has nothing to kill); with
   --self-baseline it first writes a baseline of the clean copy into the output folder (BASELINE_REPEATS repeats,
   so that its timings carry their run-to-run spread) and judges the clean check and the mutants against it (the
   committed baseline may predate a change of the window or the epoch metrics);
4. runs each mutant in its own copy (the clean one with the patch applied), `--jobs N` at a time (default 3,
   sharing one GPU), each as `python -m hotloop.guards.cli gate ARGS --out <out>/runs/<id>` started in that copy;
   mutants marked `exclusive`, and every mutant whose expected criterion is a timing one (TIMING_CRITERIA: "epoch
   throughput", "kernel time"), run one at a time after the others, alone on the GPU (a timing mutant is never
   run in parallel and then re-run: its contended run could only be thrown away, "Timing under a shared GPU");
5. writes mutants.csv / mutants.md (and clean.csv) in the output folder and prints the table and the score.

Importing the copy. hotloop installs through a package-dir mapping (pyproject.toml: hotloop.kernels -> kernels/,
...), so the copy's folders are not importable as `hotloop.*` from a plain PYTHONPATH. Each copy gets an import
root (`import_root`): <copy>.site/hotloop/<pkg> -> <copy>/<folder>, symlinks, no __init__.py (hotloop is a namespace
package), first on PYTHONPATH; PathFinder then finds the copy's packages before the installed ones (an editable
install's finder comes after it on sys.meta_path; a regular install's hotloop/ is a later sys.path entry), and
importlib.resources reads the copy's guards/baseline_files/ through the link. Before a copy's gate runs, a subprocess
with the same interpreter, environment and working folder checks that every hotloop subpackage of its
pyproject.toml (kernels, profiles, trainer, guards, probes, the data-only docs) and the baselines folder resolve
inside the copy (`verify_imports`); a copy that imports anything else is an internal error.

Verdicts (`verdict`): "killed" only when the gate exits 1 and the expected row FAILs in that run (a criteria.csv
row for a criterion; an `epoch_*` row of baseline.csv for "epoch throughput", hotloop.guards.baselines.
compare_epochs; a `kernel_us:*` row for "kernel time", the per-kernel timings), or when it exits 3 for an expected
"hang"; exit 0 is "survived"; exit 1 without the expected row (or 3 when a criterion was expected) is "wrong
criterion: <what failed>"; any other exit (70 internal error, 2, a signal) is "crashed"; a gate that outlives
--timeout is killed by the runner and recorded as "timed out". A timing row counts only in a run that was alone on
the GPU ("Timing under a shared GPU" below).

Timing under a shared GPU (issue 36 item 3). N gates on one GPU slow each other: at the default preset each of 4
parallel gates ran at about half its epoch throughput, so every timing row (the epoch_* rows, "epoch throughput";
the kernel_us:* rows, "kernel time"; every other baseline.csv row of kind "timing", e.g. dur_us, gpu_span_us,
ddqn_overlap_ratio: `is_timing_row`) FAILed whatever the mutant did, while the clean check ran alone. So the
runner records, on its own monotonic clock, the interval of every gate process it starts (`GpuLedger`: from just
before the process starts to just after it ends, the clean runs included) and calls a run "alone" when no other
gate of the suite ran during any part of it (no overlapping interval), else "parallel". The rule:
- counts and criteria (criteria.csv FAILs, the count rows of baseline.csv: syncs, launches, copies, memsets, ...;
  the watchdog's exit 3) are judged in every run, alone or parallel;
- timing rows are judged only in a run that was alone: in a parallel run they are dropped before the verdict, so
  they can neither kill (an expected timing row) nor name a "wrong criterion"; a parallel run whose exit 1 came
  from timing rows only reads "survived" (its counts passed), or "timing not judged (parallel)" when its expected
  criterion is a timing (step 4's scheduling keeps that from happening);
- the ledger sees this suite's gates only: another process on the GPU (a second suite, a training run) is not
  seen, so run the suite on a GPU of its own;
- a baseline of the clean tree measured under the same parallel load is not implemented: the timing mutants are
  judged alone, against the clean tree's alone baseline (--self-baseline) or the committed one.
The `judgement` column (`judgement`) says per mutant: "killed by a count/criterion", "killed by timing (alone)",
"timing not judged (parallel)" (a parallel run, not killed, some of whose timing rows FAILed and were dropped), else
the verdict itself (survived, wrong criterion: X, crashed, timed out); the `ran` column says "alone" or "parallel".
The score line (`score_line`) gives the kills both ways and the number of parallel runs whose timing was not
judged; `--jobs 1` runs every gate alone, so every row is judged in full.

Exit codes of the runner: 0 the suite ran (and the score is >= --min-score when given); 1 the score is below
--min-score; 2 bad usage, manifest or patch (found before anything runs); 4 the clean tree does not pass the gate
(no score); 70 internal error.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hotloop.guards.baselines import EPOCH_PREFIX, EPOCH_THROUGHPUT, KERNEL_TIME, KERNEL_US_PREFIX, is_count
from hotloop.guards.criteria import CRITERIA, PYTEST, RANKS, WATCHDOG, id_of, judged_by
from hotloop.guards.criteria import label as criterion_label
from hotloop.guards.watchdog import HANG_EXIT_CODE

_LIMITS = ("==", "<=", ">", "<", ">=")
HANG = "hang"
"""The expected criterion of a mutant the watchdog must stop (gate exit 3)."""
GATE_CRITERIA = tuple(c.id for c in CRITERIA if c.judge != PYTEST and c.comparison in _LIMITS)
"""The ids of the criteria rows the gate judges: those with a limit (a reported row never FAILs; the smoke suite is
`pytest -m smoke`, not the gate)."""
RANK_CRITERIA = tuple(c.id for c in judged_by(RANKS))
"""The ids of the rows only `hotloop gate --nproc N` measures (not measured in the one-process gate a mutant runs):
their mutation tests are the one-rank faults of hotloop.guards.fault_list (`--inject extra_collective`, run by
tests/guards/test_gate_nproc.py), not a ci/mutants/ patch."""
HANG_IDS = tuple(c.id for c in judged_by(WATCHDOG))
"""The ids of the watchdog's rows ("epoch 1 without hang"): a mutant naming one expects HANG."""
EXPECTABLE = (*GATE_CRITERIA, EPOCH_THROUGHPUT, KERNEL_TIME, HANG)
"""What a mutant may name as its criterion: a criterion id (HANG_IDS read as "hang"), a timing or "hang"."""
KILLED, SURVIVED, CRASHED, TIMED_OUT, WRONG = "killed", "survived", "crashed", "timed out", "wrong criterion"
TIMING_CRITERIA = (EPOCH_THROUGHPUT, KERNEL_TIME)
"""The expected criteria that are timings: judged only in a gate run alone on the GPU (module docstring)."""
NOT_JUDGED = "timing not judged (parallel)"
"""Verdict of a timing mutant whose run was parallel and FAILed timing rows only; also the `judgement` of any
parallel run, not killed, whose timing FAILs were dropped."""
BY_COUNT, BY_TIMING = "killed by a count/criterion", "killed by timing (alone)"
"""The `judgement` of a kill: by a criteria.csv row, a count row or the watchdog (exit 3); by a timing row of a run
that was alone on the GPU."""
ALONE, PARALLEL = "alone", "parallel"
"""The `ran` column: no other gate of the suite ran during any part of this run, or one did (GpuLedger)."""
USAGE, BELOW_MIN_SCORE, CLEAN_FAILED, INTERNAL = 2, 1, 4, 70
BASELINE_REPEATS = 5
"""Repeats of the guarded window in the --self-baseline run. One repeat records no spread, so each timing would be
held to +5% of a single run: a one-repeat baseline failed the clean tree on the H200 (results/h200/mutation/
README.md; then on the host step time dur_us, which is reported only since: guards/baselines.py)."""
DEFAULT_MANIFEST = Path("ci") / "mutants" / "mutants.toml"
PACKAGE_DIRS = {
    "kernels": "kernels",
    "profiles": "profiles",
    "trainer": "trainer",
    "guards": "guards",
    "probes": "probes",
    "docs": "docs",
}
"""hotloop.<key> -> folder of the checkout, when pyproject.toml does not say (its [tool.setuptools.package-dir])."""
NOT_COPIED = {".git", "__pycache__", ".pytest_cache", "build", "dist", ".whl", ".nsyslibs", ".abtrees"}
"""Folder names left out of a copy made without git (build outputs, caches); also *.egg-info and the top-level
runs/ (the run folders)."""
RESULT_COLUMNS = [
    "mutant",
    "file",
    "expected criterion",
    "verdict",
    "judgement",
    "ran",
    "exit code",
    "failed criteria",
    "wall_s",
    "depends",
]
_ID = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_KEYS = {"id", "patch", "file", "criterion", "what", "where", "period", "depends", "args", "exclusive"}
_REQUIRED = ("id", "patch", "file", "criterion", "what")
_RUNNER_OPTIONS = ("--out", "--inject", "--update-baseline", "--resume")
"""Gate options a mutant's args may not hold: the runner sets the run folder; the others change what is judged."""
_BASELINE_OPTIONS = ("--baseline", "--baseline-dir", "--no-baseline")


class UsageError(ValueError):
    """Bad manifest, patch or option: exit 2, before anything runs."""


@dataclass(frozen=True)
class Mutant:
    """One manifest entry: `patch` resolved against the manifest's folder, `args` the gate's arguments."""

    id: str
    patch: Path
    file: str
    criterion: str
    what: str
    args: tuple[str, ...]
    where: str = ""
    period: str = ""
    depends: str = ""
    exclusive: bool = False


@dataclass
class GateRun:
    """What one gate run left: exit code (None when the runner stopped it at its timeout), wall seconds, the FAIL
    rows (`failed_rows`), where its run folder and log are, and the other gate runs of the suite that ran during
    any part of it (`overlapped`, from the GpuLedger; empty: it ran alone on the GPU)."""

    returncode: int | None
    wall_s: float
    failed: list[str]
    run_dir: Path
    log: Path
    imports: dict = field(default_factory=dict)
    overlapped: list[str] = field(default_factory=list)

    @property
    def alone(self) -> bool:
        """Whether no other gate of the suite ran during any part of this run (its timing rows are judged)."""
        return not self.overlapped


class GpuLedger:
    """The intervals of the suite's gate processes on the runner's monotonic clock (thread-safe): `begin` just
    before a gate process starts, `end` just after it has ended; `end` returns the names of the other runs whose
    interval overlaps this one's. That answer is final when the run ends: a run that starts later cannot overlap
    it, and every run that started before its end and has not ended yet overlaps it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[list] = []  # [name, start, end or None]

    def begin(self, name: str) -> int:
        """Record that gate run `name` starts now; returns its token for `end`."""
        with self._lock:
            self._runs.append([name, time.monotonic(), None])
            return len(self._runs) - 1

    def end(self, token: int) -> list[str]:
        """Record that run `token` ended now; returns the names of the runs that overlapped it (sorted)."""
        with self._lock:
            self._runs[token][2] = time.monotonic()
            return self._overlapping(token)

    def overlapping(self, token: int) -> list[str]:
        """The names of the other runs whose interval overlaps run `token`'s so far (a run not ended yet lasts
        until now)."""
        with self._lock:
            return self._overlapping(token)

    def _overlapping(self, token: int) -> list[str]:
        _, start, end = self._runs[token]
        end = math.inf if end is None else end
        return sorted(
            name for i, (name, s, e) in enumerate(self._runs) if i != token and s < end and (e is None or e > start)
        )


# ---------------------------------------------------------------------------------------------------- manifest


def load_manifest(path: str | Path) -> list[Mutant]:
    """The mutants of a manifest (TOML: [defaults] args = [...], then [[mutant]] tables; ci/mutants/mutants.toml's
    header lists the fields). Raises UsageError listing every problem, each naming its mutant: unreadable TOML, no
    mutants, a missing or unknown field, an id that is not [a-z0-9_] or not unique, a patch file that does not
    exist, a criterion not in EXPECTABLE, args that are not a list of strings or that hold a runner-owned option
    (--out, --inject, --update-baseline, --resume), exclusive not a boolean."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the manifest: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    defaults = doc.get("defaults", {})
    problems = []
    base_args = defaults.get("args", []) if isinstance(defaults, dict) else None
    if not _str_list(base_args):
        problems.append("[defaults] args must be a list of strings")
        base_args = []
    entries = doc.get("mutant")
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path}: no [[mutant]] entries")
    mutants, seen = [], set()
    for n, entry in enumerate(entries, 1):
        name = entry.get("id") if isinstance(entry, dict) and isinstance(entry.get("id"), str) else f"#{n}"
        bad = _entry_problems(entry, path.parent, base_args, seen)
        problems += [f"mutant {name}: {p}" for p in bad]
        if not bad:
            seen.add(entry["id"])
            crit = HANG if entry["criterion"] in HANG_IDS else entry["criterion"]
            mutants.append(
                Mutant(
                    entry["id"],
                    path.parent / entry["patch"],
                    entry["file"],
                    crit,
                    entry["what"],
                    tuple(entry.get("args", base_args)),
                    entry.get("where", ""),
                    entry.get("period", ""),
                    entry.get("depends", ""),
                    entry.get("exclusive", False),
                )
            )
    if problems:
        raise UsageError(f"{path}: " + "; ".join(problems))
    return mutants


def _entry_problems(entry: object, folder: Path, base_args: list[str], seen: set[str]) -> list[str]:
    if not isinstance(entry, dict):
        return ["not a table"]
    out = [f"missing field {k!r}" for k in _REQUIRED if k not in entry]
    out += [f"unknown field {k!r} (fields: {', '.join(sorted(_KEYS))})" for k in sorted(set(entry) - _KEYS)]
    for k in ("id", "patch", "file", "criterion", "what", "where", "period", "depends"):
        if k in entry and not isinstance(entry[k], str):
            out.append(f"{k!r} must be a string")
    if out:
        return out
    if not _ID.match(entry["id"]):
        out.append("id must be lower-case letters, digits and _")
    if entry["id"] in seen:
        out.append("id is not unique")
    if not (folder / entry["patch"]).is_file():
        out.append(f"patch file {folder / entry['patch']} does not exist")
    if entry["criterion"] not in EXPECTABLE:
        out.append(f"criterion {entry['criterion']!r} is not one of {list(EXPECTABLE)}")
    args = entry.get("args", base_args)
    if not _str_list(args):
        out.append("args must be a list of strings")
    else:
        owned = [a for a in args if a.split("=")[0] in _RUNNER_OPTIONS]
        if owned:
            out.append(f"args may not hold {owned} (the runner sets the run folder; a mutant is judged as it is)")
    if not isinstance(entry.get("exclusive", False), bool):
        out.append("exclusive must be true or false")
    return out


def _str_list(x: object) -> bool:
    return isinstance(x, list) and all(isinstance(a, str) for a in x)


# ---------------------------------------------------------------------------------------------- copies, patches


def checkout_root(start: str | Path = ".") -> Path:
    """The git top level above `start`, else `start` itself (resolved)."""
    start = Path(start).resolve()
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=start, capture_output=True, text=True)
    except OSError:
        return start
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else start


def checkout_files(root: Path, leave_out: Sequence[Path] = ()) -> list[str]:
    """Paths (relative, POSIX) of the checkout's files as the working tree has them: the files git tracks
    (`git ls-files --cached`: uncommitted changes to them come along, tracked files deleted in the working tree are
    left out, untracked files are not copied even when no .gitignore pattern covers them, e.g. a .venv inside a
    clone); without git (or outside a repository), every file but NOT_COPIED folders, *.egg-info, runs/,
    virtual environments (a folder holding pyvenv.cfg) and what root/.gitignore's plain patterns match. Paths under
    `leave_out` (absolute folders, e.g. the runner's own output folder) are left out. Raises nothing of its own
    (OSError from walking the tree passes through)."""
    root = Path(root).resolve()
    skip = [Path(p).resolve() for p in leave_out]
    files = _git_files(root, "--cached")
    if files is None:
        ignored = _ignore_patterns(root)
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            rel = here.relative_to(root)
            dirnames[:] = [
                d
                for d in dirnames
                if d not in NOT_COPIED
                and not d.endswith(".egg-info")
                and (rel / d).as_posix() != "runs"
                and not (here / d / "pyvenv.cfg").exists()
                and not _ignored((rel / d).as_posix(), ignored)
            ]
            files += [(rel / f).as_posix() for f in filenames if not _ignored((rel / f).as_posix(), ignored)]
        files.sort()
    keep = []
    for rel in files:
        p = root / rel
        if (p.is_file() or p.is_symlink()) and not any(_under(p.resolve(), s) for s in skip):
            keep.append(rel)
    return keep


def _git_files(root: Path, *which: str) -> list[str] | None:
    """`git ls-files -z WHICH` in `root` (sorted, unique), or None when `root` is not a git checkout's top level
    or git is missing or fails."""
    if not (root / ".git").exists() or not shutil.which("git"):
        return None
    out = subprocess.run(["git", "ls-files", "-z", *which], cwd=root, capture_output=True)
    if out.returncode != 0:
        return None
    return sorted(set(p for p in out.stdout.decode(errors="surrogateescape").split("\0") if p))


def copy_summary(root: str | Path, dest: str | Path) -> str:
    """One line saying what `copy_checkout` copied from `root` to `dest`: the number of files and their size in MB,
    what was selected (git's tracked files, or the walk without git), and how many untracked files git does not
    ignore were left out (they must be `git add`ed to reach the copies). Raises OSError from walking `dest`."""
    root, dest = Path(root).resolve(), Path(dest)
    count, size = 0, 0
    for dirpath, _, filenames in os.walk(dest):
        for f in filenames:
            count += 1
            size += os.lstat(os.path.join(dirpath, f)).st_size
    untracked = _git_files(root, "--others", "--exclude-standard")
    how = (
        "the files git tracks, as the working tree has them"
        if untracked is not None
        else "not a git checkout: every file but build outputs, virtual environments and .gitignore's patterns"
    )
    line = f"copied {count} files ({size / 1e6:.1f} MB) of {root} ({how})"
    if untracked:
        line += (
            f"; {len(untracked)} untracked files not copied ({', '.join(untracked[:3])}"
            f"{', ...' if len(untracked) > 3 else ''}: git add them to include them)"
        )
    return line


def _ignore_patterns(root: Path) -> list[str]:
    """The plain patterns of root/.gitignore (comments, blank lines and negations left out; "/" at the ends
    stripped), for a copy made without git."""
    try:
        lines = (root / ".gitignore").read_text().splitlines()
    except OSError:
        return []
    return [t.strip().strip("/") for t in lines if t.strip() and not t.lstrip().startswith(("#", "!"))]


def _ignored(rel: str, patterns: Sequence[str]) -> bool:
    """Whether `rel` (POSIX, relative to the root) or its last part matches one of the .gitignore `patterns`."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, p) or ("/" not in p and fnmatch.fnmatchcase(name, p)) for p in patterns)


def copy_checkout(root: str | Path, dest: str | Path, leave_out: Sequence[Path] = ()) -> Path:
    """Copy the checkout's files (`checkout_files`) to `dest` (created; must not exist); returns dest
    (`copy_summary` says what was copied). Raises FileExistsError when `dest` exists; OSError from copying."""
    root, dest = Path(root).resolve(), Path(dest)
    dest.mkdir(parents=True)
    for rel in checkout_files(root, leave_out):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target, follow_symlinks=False)
    return dest


def _git_env(folder: Path) -> dict:
    """An environment in which git run in `folder` finds no repository above it (git apply then patches the folder
    as plain files, whatever repository the folder sits in)."""
    return {**os.environ, "GIT_CEILING_DIRECTORIES": str(Path(folder).resolve().parent)}


def apply_patch(patch: Path, tree: Path, check: bool = False) -> str | None:
    """Apply `patch` (a unified diff with a/ b/ prefixes) to `tree`, or only check that it applies (`check`);
    None on success, else the tool's message. git apply when git is installed, else patch -p1."""
    patch = Path(patch).resolve()
    if shutil.which("git"):
        cmd = ["git", "apply", *(["--check"] if check else []), str(patch)]
    else:
        cmd = ["patch", "-p1", "--batch", "--forward", *(["--dry-run"] if check else []), "-i", str(patch)]
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=_git_env(tree))
    return None if out.returncode == 0 else (out.stderr or out.stdout).strip() or f"exit {out.returncode}"


def patched_files(patch: Path) -> list[str]:
    """The files a unified diff changes (its `+++ b/<path>` lines)."""
    return [
        line[6:].split("\t")[0].strip() for line in Path(patch).read_text().splitlines() if line.startswith("+++ b/")
    ]


def check_patches(mutants: Sequence[Mutant], tree: Path) -> list[str]:
    """Problems ("<id>: ...") of the mutants' patches against `tree`: a patch that does not apply, or that does
    not change the file its entry names. Empty when every patch applies."""
    problems = []
    for m in mutants:
        files = patched_files(m.patch)
        if m.file not in files:
            problems.append(f"{m.id}: {m.patch.name} does not change {m.file} (it changes {files or 'nothing'})")
            continue
        err = apply_patch(m.patch, tree, check=True)
        if err:
            problems.append(f"{m.id}: {m.patch.name} does not apply to the checkout: {' '.join(err.split())}")
    return problems


# ------------------------------------------------------------------------------------------------ import root


def package_dirs(tree: Path) -> dict[str, str]:
    """{subpackage: folder} of hotloop in `tree`'s pyproject.toml ([tool.setuptools.package-dir] "hotloop.X" =
    "folder"), else PACKAGE_DIRS."""
    try:
        mapping = tomllib.loads((Path(tree) / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return dict(PACKAGE_DIRS)
    found = {k.split(".", 1)[1]: v for k, v in mapping.items() if k.startswith("hotloop.") and k.count(".") == 1}
    return found or dict(PACKAGE_DIRS)


def import_root(tree: Path, site: Path | None = None) -> Path:
    """Make (and return) an import root for `tree`: site/hotloop/<pkg> -> tree/<folder> symlinks for every
    `package_dirs` entry (site: <tree>.site beside it by default). Put it first on PYTHONPATH (`gate_env`)."""
    tree = Path(tree).resolve()
    site = Path(site) if site is not None else tree.with_name(tree.name + ".site")
    pkg = site / "hotloop"
    pkg.mkdir(parents=True, exist_ok=True)
    for name, folder in package_dirs(tree).items():
        link = pkg / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(tree / folder, target_is_directory=True)
    return site


def gate_env(site: Path) -> dict:
    """The environment of a copy's subprocesses: `site` first on PYTHONPATH."""
    old = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": str(site) + (os.pathsep + old if old else ""), "PYTHONDONTWRITEBYTECODE": "1"}


_PROBE = """
import importlib, json, sys
from importlib import resources
from pathlib import Path
def where(name):  # a data-only package (hotloop.docs) is a namespace package: no __file__, its first folder
    mod = importlib.import_module("hotloop." + name)
    return str(Path(mod.__file__ or next(iter(mod.__path__))).resolve())
out = {m: where(m) for m in sys.argv[1:]}
out["baselines"] = str(Path(str(resources.files("hotloop.guards") / "baseline_files")).resolve())
print(json.dumps(out))
"""


def verify_imports(tree: Path, site: Path, python: str = sys.executable) -> dict[str, str]:
    """Check, in a subprocess with `gate_env(site)` started in `tree` (as the gate will be), that hotloop's
    subpackages and the baselines folder (importlib.resources) resolve inside `tree`; returns {name: resolved
    path}. Raises RuntimeError naming what resolves elsewhere (or the subprocess's error)."""
    tree = Path(tree).resolve()
    names = sorted(package_dirs(tree))
    out = subprocess.run([python, "-c", _PROBE, *names], cwd=tree, env=gate_env(site), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"import check in {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
    paths = json.loads(out.stdout.strip().splitlines()[-1])
    outside = {k: v for k, v in paths.items() if not _under(Path(v), tree)}
    if outside:
        raise RuntimeError(f"the copy {tree} does not import itself: {outside}")
    return paths


def _under(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


# ------------------------------------------------------------------------------------------------------ verdicts


def failed_rows(run_dir: Path) -> list[str]:
    """What FAILed in a gate run folder: the criteria.csv rows with verdict FAIL (criterion ids, table order; a
    criteria.csv written before ids, with titles only, is read through hotloop.guards.criteria.id_of),
    then "epoch throughput" if an epoch_* row of baseline.csv FAILs, "kernel time" if a kernel_us:* row does
    (KERNEL_US_PREFIX), then "regression <metric>" for every FAIL row of baseline.csv but the epoch_* ones. Empty
    when neither file exists (a hang or a crash writes none)."""
    out = []
    crit = Path(run_dir) / "criteria.csv"
    if crit.is_file():
        df = pd.read_csv(crit)
        out += [id_of(str(x)) for x in df.loc[df["verdict"].eq("FAIL"), "id" if "id" in df else "criterion"]]
    base = Path(run_dir) / "baseline.csv"
    if base.is_file():
        df = pd.read_csv(base)
        failing = df.loc[df["verdict"].eq("FAIL"), "metric"].astype(str)
        if failing.str.startswith(EPOCH_PREFIX).any():
            out.append(EPOCH_THROUGHPUT)
        if failing.str.startswith(KERNEL_US_PREFIX).any():
            out.append(KERNEL_TIME)
        out += [f"regression {m}" for m in failing if not m.startswith(EPOCH_PREFIX)]
    return out


def is_timing_row(row: str) -> bool:
    """Whether a FAIL row as `failed_rows` names it is a timing: "epoch throughput" (the epoch_* rows), "kernel
    time" (kernel_us:*), or "regression <metric>" of a timing metric (hotloop.guards.baselines.is_count false: the
    rule that writes baseline.csv's `kind` column, e.g. dur_us, gpu_span_us, ddqn_overlap_ratio). Criteria rows
    and count regressions (kernels, kernels_grid1, d2d_copies, ...) are not."""
    if row in TIMING_CRITERIA:
        return True
    return row.startswith("regression ") and not is_count(row[len("regression ") :])


def verdict(expected: str, returncode: int | None, failed: Sequence[str], alone: bool = True) -> str:
    """The verdict of one mutant run (module docstring): killed / survived / crashed / timed out / "wrong
    criterion: X" / NOT_JUDGED from the expected criterion, the gate's exit code (None: stopped at the runner's
    timeout), its FAIL rows (`failed_rows`) and whether it ran alone on the GPU. A parallel run (`alone` false)
    is judged on its count and criterion rows only: its timing rows (`is_timing_row`) are dropped first, so they
    never kill and never name a wrong criterion; its exit 1 with timing FAILs only is "survived", or NOT_JUDGED
    for an expected timing criterion. A crash is never a kill, whatever FAILed before it."""
    hang = expected in (HANG, *HANG_IDS)
    if returncode is None:
        return TIMED_OUT
    if returncode == 0:
        return SURVIVED
    if returncode == HANG_EXIT_CODE:
        return KILLED if hang else f"{WRONG}: hang"
    if returncode == 1:
        judged = list(failed) if alone else [f for f in failed if not is_timing_row(f)]
        if not hang and expected in judged:
            return KILLED
        if failed and not judged:  # parallel, and only timing rows FAILed: the contention, not the gate
            return NOT_JUDGED if expected in TIMING_CRITERIA else SURVIVED
        criteria = [f for f in judged if not f.startswith("regression ")]
        named = criteria or judged
        return f"{WRONG}: {', '.join(named) if named else 'nothing FAILed in the run folder'}"
    return CRASHED


def judgement(expected: str, verdict_: str, failed: Sequence[str], alone: bool = True) -> str:
    """The `judgement` column of a mutant (module docstring): BY_COUNT or BY_TIMING for a kill (by its expected
    criterion: a timing kill needs a run alone); NOT_JUDGED for a parallel run, not killed, not crashed or timed
    out, some of whose timing rows FAILed (dropped); else the verdict itself."""
    if verdict_ == KILLED:
        return BY_TIMING if expected in TIMING_CRITERIA else BY_COUNT
    if not alone and verdict_ not in (CRASHED, TIMED_OUT) and any(is_timing_row(f) for f in failed):
        return NOT_JUDGED
    return verdict_


# ---------------------------------------------------------------------------------------------------- running


def gate_command(args: Sequence[str], run_dir: Path, python: str = sys.executable) -> list[str]:
    """The gate invocation of one run: python -m hotloop.guards.cli gate ARGS --out RUN_DIR."""
    return [python, "-m", "hotloop.guards.cli", "gate", *args, "--out", str(run_dir)]


def run_gate_in(
    tree: Path,
    site: Path,
    args: Sequence[str],
    run_dir: Path,
    log: Path,
    timeout_s: float,
    python: str = sys.executable,
    ledger: GpuLedger | None = None,
) -> GateRun:
    """Verify the copy's imports, then run the gate from `tree` (stdout + stderr to `log`) and read its run folder.
    With a `ledger`, the gate process's interval is recorded in it (named after the run folder) and the runs that
    overlapped it come back in GateRun.overlapped; without one the run counts as alone."""
    imports = verify_imports(tree, site, python)
    log.parent.mkdir(parents=True, exist_ok=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = gate_command(args, run_dir, python)
    start = time.monotonic()
    token = ledger.begin(Path(run_dir).name) if ledger is not None else None
    overlapped: list[str] = []
    try:
        with open(log, "w") as fh:
            fh.write(f"$ cd {tree} && PYTHONPATH={site} {shlex.join(cmd)}\n")
            fh.flush()
            proc = subprocess.Popen(
                cmd, cwd=tree, env=gate_env(site), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the gate's own process group only (start_new_session)
                proc.wait()
                rc = None
                fh.write(f"\nhotloop mutate: stopped after {timeout_s:g} s (--timeout)\n")
    finally:
        if token is not None:
            overlapped = ledger.end(token)
    wall = time.monotonic() - start
    if overlapped:
        with open(log, "a") as fh:
            fh.write(f"\nhotloop mutate: ran in parallel with {', '.join(overlapped)}: timing rows not judged\n")
    return GateRun(rc, wall, failed_rows(run_dir), run_dir, log, imports, overlapped)


def _result_row(m: Mutant, run: GateRun) -> dict:
    said = verdict(m.criterion, run.returncode, run.failed, run.alone)
    return {
        "mutant": m.id,
        "file": m.file,
        "expected criterion": criterion_label(m.criterion),
        "verdict": said,
        "judgement": judgement(m.criterion, said, run.failed, run.alone),
        "ran": ALONE if run.alone else PARALLEL,
        "exit code": "" if run.returncode is None else run.returncode,
        "failed criteria": ", ".join(run.failed),
        "wall_s": round(run.wall_s, 1),
        "depends": m.depends,
    }


def run_suite(
    manifest: Path,
    root: Path,
    out: Path,
    jobs: int = 3,
    only: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    timeout_s: float = 900.0,
    keep: bool = False,
    check_only: bool = False,
    python: str = sys.executable,
    self_baseline: bool = False,
) -> tuple[int, pd.DataFrame | None]:
    """Run the suite (module docstring); returns (exit code, the results table or None when nothing was scored).

    `self_baseline`: before each clean check, write a baseline of the clean tree (`gate ARGS --update-baseline
    --baseline <out>/baselines/<clean>.json`), then run the clean check and that arg set's mutants against it, so
    that the suite never depends on the committed baseline being current (the epoch-throughput mutants need a
    baseline holding epoch metrics). Every gate process is recorded in a GpuLedger; each mutant's row says whether
    it ran alone and judges its timing rows only then (module docstring, "Timing under a shared GPU").

    Raises UsageError (exit 2) for a bad manifest, an unknown --only id, `jobs` < 1, a `timeout_s` that is not a
    finite number > 0 (nan, inf), a patch that does not apply, or `self_baseline` with args that choose a baseline
    themselves, before anything runs."""
    mutants = load_manifest(manifest)
    if only:
        unknown = sorted(set(only) - {m.id for m in mutants})
        if unknown:
            raise UsageError(f"--only: no mutant {unknown} in {manifest}")
        mutants = [m for m in mutants if m.id in set(only)]
    if jobs < 1 or not math.isfinite(timeout_s) or timeout_s <= 0:  # nan passes `<= 0`; inf never times out
        raise UsageError(f"--jobs must be >= 1 and --timeout a finite number > 0, got {jobs} and {timeout_s}")
    if self_baseline:
        chosen = sorted({a.split("=")[0] for m in mutants for a in (*m.args, *extra_args)} & set(_BASELINE_OPTIONS))
        if chosen:
            raise UsageError(f"--self-baseline: the gate arguments already choose a baseline ({chosen})")
    out = Path(out).resolve()
    work = Path(tempfile.mkdtemp(prefix="hotloop-mutate-"))
    try:
        clean = copy_checkout(root, work / "clean", leave_out=[out])
        print(f"hotloop mutate: {copy_summary(root, clean)}; each mutant runs in a copy of it", flush=True)
        problems = check_patches(mutants, clean)
        if problems:
            raise UsageError(
                "patches that do not apply (fix or re-place them; nothing was run): " + "; ".join(problems)
            )
        print(f"hotloop mutate: {len(mutants)} mutants, every patch applies to {root}")
        if check_only:
            return 0, None
        taken = (
            [d.name for d in sorted((out / "runs").glob("*")) if d.is_dir() and any(d.iterdir())]
            if (out / "runs").is_dir()
            else []
        )
        if taken:
            raise UsageError(f"{out} already holds runs ({', '.join(taken)}): give a new --out")
        out.mkdir(parents=True, exist_ok=True)
        site = import_root(clean)
        ledger = GpuLedger()  # every gate process of the suite: which ran alone on the GPU
        arg_sets = list(dict.fromkeys(tuple(m.args) + tuple(extra_args) for m in mutants))
        effective, clean_rows = {}, []  # arg set -> the arguments its runs get (+ the suite's own baseline)
        for i, args in enumerate(arg_sets):
            label = "clean" if len(arg_sets) == 1 else f"clean_{i + 1}"
            runs = []
            if self_baseline:
                own = out / "baselines" / f"{label}.json"
                runs.append(
                    (
                        f"{label}_baseline",
                        (*args, "--update-baseline", "--repeats", str(BASELINE_REPEATS), "--baseline", str(own)),
                    )
                )
                effective[args] = (*args, "--baseline", str(own))
            else:
                effective[args] = args
            runs.append((label, effective[args]))
            for name, run_args in runs:
                print(f"hotloop mutate: clean tree: gate {shlex.join(run_args)}", flush=True)
                run = run_gate_in(
                    clean, site, run_args, out / "runs" / name, out / "logs" / f"{name}.log", timeout_s, python, ledger
                )
                clean_rows.append(
                    {
                        "run": name,
                        "args": shlex.join(run_args),
                        "exit code": run.returncode,
                        "failed criteria": ", ".join(run.failed),
                        "wall_s": round(run.wall_s, 1),
                    }
                )
                if run.returncode != 0:
                    break
        clean_table = pd.DataFrame(clean_rows)
        clean_table.to_csv(out / "clean.csv", index=False)
        if (clean_table["exit code"] != 0).any():
            print(
                "hotloop mutate: the clean tree does not pass the gate: no score (logs in "
                f"{out / 'logs'})\n" + clean_table.to_string(index=False),
                file=sys.stderr,
            )
            return CLEAN_FAILED, None

        def one(m: Mutant) -> dict:
            tree = work / m.id
            shutil.copytree(clean, tree, symlinks=True)
            err = apply_patch(m.patch, tree)
            if err:  # checked above; a failure here is the runner's own problem
                raise RuntimeError(f"{m.id}: {m.patch.name} stopped applying: {err}")
            args = effective[tuple(m.args) + tuple(extra_args)]
            run = run_gate_in(
                tree,
                import_root(tree),
                args,
                out / "runs" / m.id,
                out / "logs" / f"{m.id}.log",
                timeout_s,
                python,
                ledger,
            )
            if not keep:
                shutil.rmtree(tree, ignore_errors=True)
                shutil.rmtree(tree.with_name(tree.name + ".site"), ignore_errors=True)
            row = _result_row(m, run)
            print(
                f"hotloop mutate: {m.id}: {row['verdict']} ({row['judgement']}; exit {row['exit code']}, "
                f"{row['wall_s']} s, ran {row['ran']})",
                flush=True,
            )
            with lock:  # the tables so far, rewritten after each mutant: a suite stopped midway keeps its verdicts
                rows[m.id] = row
                write_results(
                    pd.DataFrame([rows[k.id] for k in mutants if k.id in rows], columns=RESULT_COLUMNS),
                    out,
                    pending=len(mutants) - len(rows),
                )
            return row

        rows, lock = {}, threading.Lock()
        alone = [m for m in mutants if runs_alone(m)]
        shared = [m for m in mutants if not runs_alone(m)]
        timed = [m.id for m in alone if not m.exclusive]
        if timed:
            print(
                f"hotloop mutate: {', '.join(timed)}: judged by a timing row, so run alone after the others", flush=True
            )
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, shared))
        for m in alone:
            one(m)
        table = pd.DataFrame([rows[m.id] for m in mutants], columns=RESULT_COLUMNS)
        write_results(table, out)
        return 0, table
    finally:
        if keep:
            print(f"hotloop mutate: copies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def runs_alone(m: Mutant) -> bool:
    """Whether the runner runs mutant `m` alone on the GPU, after the parallel ones: marked `exclusive`, or
    expecting a timing criterion (TIMING_CRITERIA), which a contended run cannot judge."""
    return m.exclusive or m.criterion in TIMING_CRITERIA


def score(table: pd.DataFrame) -> tuple[int, int]:
    """(killed, total) of a results table."""
    return int(table["verdict"].eq(KILLED).sum()), len(table)


def score_parts(table: pd.DataFrame) -> dict[str, int]:
    """The score both ways: {"killed", "total", "by count" (BY_COUNT), "by timing" (BY_TIMING), "not judged"
    (NOT_JUDGED: parallel runs whose timing FAILs were dropped), "parallel" (runs that were not alone)} of a
    results table (`judgement` and `ran` columns; a table without them counts every kill as by a count)."""
    killed, total = score(table)
    how = table["judgement"] if "judgement" in table else table["verdict"].map({KILLED: BY_COUNT})
    ran = table["ran"] if "ran" in table else pd.Series([ALONE] * len(table), dtype=object)
    return {
        "killed": killed,
        "total": total,
        "by count": int(how.eq(BY_COUNT).sum()),
        "by timing": int(how.eq(BY_TIMING).sum()),
        "not judged": int(how.eq(NOT_JUDGED).sum()),
        "parallel": int(ran.eq(PARALLEL).sum()),
    }


def score_line(table: pd.DataFrame) -> str:
    """ "mutation score: K/T killed (P%): A by a count/criterion, B by timing (alone); timing not judged for N
    parallel runs (of M run in parallel)" (`score_parts`)."""
    s = score_parts(table)
    return (
        f"mutation score: {s['killed']}/{s['total']} killed ({100 * s['killed'] / max(s['total'], 1):.0f}%): "
        f"{s['by count']} by a count/criterion, {s['by timing']} by timing (alone); timing not judged for "
        f"{s['not judged']} parallel runs (of {s['parallel']} run in parallel)"
    )


def write_results(table: pd.DataFrame, out: Path, pending: int = 0) -> list[Path]:
    """mutants.csv and mutants.md (the table and the score line, `score_line`; with `pending` mutants still to
    run, the line says so and scores the finished ones) in `out`; returns both paths."""
    line = score_line(table)
    if pending:
        line += f" so far; {pending} mutants not finished"
    csv, md = Path(out) / "mutants.csv", Path(out) / "mutants.md"
    table.to_csv(csv, index=False)
    md.write_text(table.to_markdown(index=False) + f"\n\n{line}\n")
    return [csv, md]


# --------------------------------------------------------------------------------------------------------- CLI


def add_mutate_args(p: argparse.ArgumentParser) -> None:
    """Add the options of `hotloop mutate` (and of `python -m hotloop.guards.mutate`) to the parser `p`."""
    p.add_argument(
        "--manifest",
        type=Path,
        help=f"the manifest (default <checkout>/{DEFAULT_MANIFEST}); from an "
        "installed hotloop, point it at any checkout's",
    )
    p.add_argument(
        "--root",
        type=Path,
        help="the checkout to copy (default: the git top level of the folder of "
        "--manifest when given, else of the current folder)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="output folder: mutants.csv/.md, clean.csv, runs/<id>/, logs/<id>.log "
        "(default runs/mutate-<UTC timestamp>/ under the checkout)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=3,
        metavar="N",
        help="mutants run at a time on the GPU (default 3); timing rows count only in a gate that ran "
        "alone: exclusive mutants and those expecting a timing criterion run alone after the "
        "others; --jobs 1 judges every run in full",
    )
    p.add_argument("--only", action="append", default=[], metavar="ID[,ID...]", help="run these mutants only")
    p.add_argument(
        "--gate-args",
        default="",
        metavar="ARGS",
        help="extra gate arguments for every run, the clean ones too (one shell-quoted string)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="a gate run longer than this is stopped and recorded as 'timed out' (default 900)",
    )
    p.add_argument(
        "--self-baseline",
        action="store_true",
        help="write a baseline of the clean tree first (<out>/baselines/) and judge the clean check and "
        "the mutants against it, instead of the committed one",
    )
    p.add_argument("--min-score", type=float, metavar="F", help="exit 1 when killed / total is below F (0..1)")
    p.add_argument("--check", action="store_true", help="only check the manifest and that every patch applies")
    p.add_argument("--list", action="store_true", help="print the manifest's mutants and exit")
    p.add_argument("--keep", action="store_true", help="keep the temporary copies (their folder is printed)")


def suite_paths(root: Path | None, manifest: Path | None, cwd: Path | None = None) -> tuple[Path, Path]:
    """The (checkout, manifest) a `hotloop mutate` run uses: --root, else the checkout holding --manifest (its git
    top level: the patches name that tree's files), else the git top level of `cwd` (default: the working folder);
    the manifest: --manifest, else <checkout>/ci/mutants/mutants.toml. Works the same from an installed wheel: the
    suite copies the checkout and runs its code, never the installed package's. Raises UsageError when the manifest
    is not a file, naming the path and the options that choose it."""
    if root is not None:
        root = Path(root).resolve()
    elif manifest is not None:
        root = checkout_root(Path(manifest).resolve().parent)
    else:
        root = checkout_root(cwd or ".")
    manifest = Path(manifest).resolve() if manifest is not None else root / DEFAULT_MANIFEST
    if not manifest.is_file():
        raise UsageError(
            f"no mutant manifest at {manifest}: run from a hotloop checkout (its {DEFAULT_MANIFEST}) "
            f"or pass --manifest PATH (and --root CHECKOUT when the manifest lies outside it)"
        )
    return root, manifest


def run_mutate(args: argparse.Namespace) -> int:
    """`hotloop mutate`: returns the exit code (module docstring)."""
    try:
        root, manifest = suite_paths(args.root, args.manifest)
        only = [i for part in args.only for i in part.split(",") if i]
        if args.list:
            mutants = load_manifest(manifest)
            print(
                pd.DataFrame(
                    [
                        {
                            "mutant": m.id,
                            "file": m.file,
                            "expected criterion": criterion_label(m.criterion),
                            "runs": ALONE if runs_alone(m) else PARALLEL,
                            "depends": m.depends,
                            "what": m.what,
                        }
                        for m in mutants
                    ]
                ).to_string(index=False)
            )
            return 0
        if args.min_score is not None and not 0 <= args.min_score <= 1:
            raise UsageError(f"--min-score must be within 0..1, got {args.min_score}")
        try:
            extra = shlex.split(args.gate_args)
        except ValueError as exc:
            raise UsageError(f"--gate-args: {exc}") from None
        if any(a.split("=")[0] in _RUNNER_OPTIONS for a in extra):
            raise UsageError(f"--gate-args may not hold {list(_RUNNER_OPTIONS)}")
        out = args.out or root / "runs" / time.strftime("mutate-%Y%m%dT%H%M%SZ", time.gmtime())
        code, table = run_suite(
            manifest,
            root,
            out,
            args.jobs,
            only,
            extra,
            args.timeout,
            args.keep,
            args.check,
            self_baseline=args.self_baseline,
        )
    except UsageError as exc:
        print(f"hotloop mutate: error: {exc}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        print("\nhotloop mutate: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the contract: an unexpected error is 70, never "a score"
        print(f"hotloop mutate: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return INTERNAL
    if table is None:
        return code
    killed, total = score(table)
    print("\n" + table.drop(columns="depends").to_string(index=False))
    print(f"\n{score_line(table)}; tables in {out}")
    if args.min_score is not None and killed / max(total, 1) < args.min_score:
        return BELOW_MIN_SCORE
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m hotloop.guards.mutate [options]`: the same options and exit codes as `hotloop mutate`."""
    parser = argparse.ArgumentParser(prog="python -m hotloop.guards.mutate", description=__doc__.splitlines()[0])
    add_mutate_args(parser)
    return run_mutate(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
