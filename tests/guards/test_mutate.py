"""guards/mutate.py, the source-level mutation suite (CPU): every patch of ci/mutants applies to this checkout and
yields valid Python, the suite spans every criterion, a copy imports itself through its import root, the verdict
logic on stubbed gate results, the whole run on a stub gate (clean first, then each mutant), timing rows judged
only in a gate that ran alone on the GPU (issue 36 item 3), and bad manifests or patches are exit 2 before anything
runs."""

from __future__ import annotations

import ast
import difflib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hotloop.guards import mutate
from hotloop.guards.mutate import (
    ALONE,
    BY_COUNT,
    BY_TIMING,
    CLEAN_FAILED,
    CRASHED,
    EXPECTABLE,
    GATE_CRITERIA,
    HANG,
    KILLED,
    NOT_JUDGED,
    PARALLEL,
    RANK_CRITERIA,
    SURVIVED,
    TIMED_OUT,
    USAGE,
    GpuLedger,
    UsageError,
    apply_patch,
    check_patches,
    copy_checkout,
    failed_rows,
    gate_env,
    import_root,
    is_timing_row,
    judgement,
    load_manifest,
    patched_files,
    run_suite,
    verdict,
    verify_imports,
)

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "ci" / "mutants" / "mutants.toml"
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git (git apply)")


# ------------------------------------------------------------------------------------ the suite as committed


def test_the_manifest_reads_and_spans_every_criterion():
    mutants = load_manifest(MANIFEST)
    assert len(mutants) >= 15
    covered = {m.criterion for m in mutants}
    # the rank rows are measured by `hotloop gate --nproc N` only: their faults (--inject extra_collective) test them
    assert covered >= (set(GATE_CRITERIA) - {"no_hang", *RANK_CRITERIA}) | {"epoch throughput", HANG}, covered
    assert covered <= set(EXPECTABLE)
    files = {m.file for m in mutants}  # spread over the loop, the actor, the readback, the CLI run, the kernels
    assert {
        "trainer/loop.py",
        "trainer/actor.py",
        "trainer/readback.py",
        "trainer/step.py",
        "guards/run.py",
        "kernels/linear.py",
        "kernels/fused_adam.py",
    } <= files
    assert all(m.patch.is_file() and m.what and m.depends for m in mutants)


@needs_git
def test_every_patch_applies_to_the_current_checkout(tmp_path):
    """The suite's honesty as code moves: a patch that no longer applies must be placed again in the new code."""
    mutants = load_manifest(MANIFEST)
    clean = copy_checkout(ROOT, tmp_path / "clean")
    assert check_patches(mutants, clean) == []
    for m in mutants:  # applied for real, each alone, to a tree holding its file: valid Python, really changed
        assert patched_files(m.patch) == [m.file], m.id
        tree = tmp_path / m.id
        (tree / m.file).parent.mkdir(parents=True)
        shutil.copy2(clean / m.file, tree / m.file)
        assert apply_patch(m.patch, tree) is None, m.id
        text = (tree / m.file).read_text()
        assert text != (clean / m.file).read_text(), m.id
        ast.parse(text, f"{m.id}:{m.file}")


# ----------------------------------------------------------------------------------------------- import root


def _diff(rel: str, before: str, after: str) -> str:
    """A git-style unified diff of file `rel` from text `before` to `after`."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    return f"diff --git a/{rel} b/{rel}\n" + "".join(lines)


@needs_git
def test_a_copy_imports_itself_through_its_import_root(tmp_path):
    source = (ROOT / "guards" / "watchdog.py").read_text()
    assert source.count("\nHANG_EXIT_CODE = 3\n") == 1
    patch = tmp_path / "watchdog.patch"  # a mutant of a constant the subprocess can print
    patch.write_text(
        _diff(
            "guards/watchdog.py",
            source,
            source.replace("\nHANG_EXIT_CODE = 3\n", "\nHANG_EXIT_CODE = 33  # the mutant's copy\n"),
        )
    )
    tree = copy_checkout(ROOT, tmp_path / "copy")
    assert apply_patch(patch, tree) is None
    site = import_root(tree)
    paths = verify_imports(tree, site)
    for name in ("kernels", "profiles", "trainer", "guards"):
        assert Path(paths[name]).is_relative_to(tree.resolve()), paths
    assert paths["baselines"] == str((tree / "guards" / "baseline_files").resolve())
    probe = (
        "from importlib import resources\nfrom hotloop.guards.watchdog import HANG_EXIT_CODE\n"
        "print(HANG_EXIT_CODE, (resources.files('hotloop.guards') / 'baseline_files' / 'nvidia-h200.json')"
        ".is_file())"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=gate_env(site), capture_output=True, text=True)
    assert run.stdout.split() == ["33", "True"], run.stderr  # the copy's constant, the copy's package data
    plain = subprocess.run([sys.executable, "-c", probe], cwd=tree, capture_output=True, text=True)
    assert plain.stdout.split()[0] == "3"  # without the import root: the installed hotloop, not the copy
    with pytest.raises(RuntimeError, match="does not import itself"):
        verify_imports(tree, tmp_path / "empty-site")  # nothing on the path points at the copy


def test_the_copy_leaves_out_the_output_folder_and_build_outputs(tmp_path):
    root = tmp_path / "tree"  # no .git: the walk
    for rel in (
        "kernels/a.py",
        "guards/__pycache__/x.pyc",
        "hotloop.egg-info/PKG-INFO",
        "runs/r/x",
        "out/mutants.csv",
        "README.md",
        ".venv/pyvenv.cfg",
        "env2/pyvenv.cfg",
        "cache/x.bin",
        "k/y.log",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    (root / ".gitignore").write_text("# build outputs\n/cache/\n*.log\n!keep.log\n")
    assert mutate.checkout_files(root, leave_out=[root / "out"]) == [".gitignore", "README.md", "kernels/a.py"]


@needs_git
def test_a_copy_holds_what_git_tracks_as_the_working_tree_has_it_and_no_untracked_files(tmp_path, capsys):
    """Issue 41 item 8: a .venv inside a clone (untracked, not in .gitignore) was copied into every mutant's copy."""
    root = tmp_path / "clone"
    for rel in ("kernels/a.py", "README.md", "gone.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("committed\n")
    (root / ".gitignore").write_text("*.log\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], cwd=root, check=True)
    (root / "kernels" / "a.py").write_text("changed, not committed\n")  # a working-tree change: copied as it is
    (root / "gone.py").unlink()  # deleted in the working tree: not copied
    for rel in (".venv/pyvenv.cfg", ".venv/lib/big.bin", "notes.txt", "build.log"):  # untracked / ignored
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x" * 1000)
    assert mutate.checkout_files(root) == [".gitignore", "README.md", "kernels/a.py"]
    copy = copy_checkout(root, tmp_path / "copy")
    assert (copy / "kernels" / "a.py").read_text() == "changed, not committed\n"
    assert not (copy / ".venv").exists() and not (copy / "notes.txt").exists()
    line = mutate.copy_summary(root, copy)
    assert line.startswith("copied 3 files (0.0 MB) of ") and "the files git tracks" in line, line
    assert "3 untracked files not copied (.venv/lib/big.bin, .venv/pyvenv.cfg, notes.txt" in line, line
    (root / "m").mkdir()  # the runner says it: one line before anything runs
    manifest = _manifest(root / "m", [_entry("a", "no_stream_sync", "1 no_stream_sync")])
    subprocess.run(["git", "add", "m"], cwd=root, check=True)
    (root / "guards").mkdir()
    (root / "guards" / "stub_gate.txt").write_text(_stub_state("0"))
    subprocess.run(["git", "add", "guards"], cwd=root, check=True)
    assert mutate.main(["--manifest", str(manifest), "--root", str(root), "--check"]) == 0
    assert "hotloop mutate: copied 6 files (" in capsys.readouterr().out


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "0"])
def test_a_timeout_that_is_not_a_finite_positive_number_is_exit_2_before_anything_runs(
    tmp_path, monkeypatch, capsys, timeout
):
    """Issue 41 item 8: --timeout nan passed the `> 0` check (the clean tree then "did not pass the gate")."""
    root = _stub_checkout(tmp_path)
    monkeypatch.setenv("STUB_CALLS", str(tmp_path / "calls.txt"))
    manifest = _manifest(tmp_path / "mutants", [_entry("a", "no_stream_sync", "1 no_stream_sync")])
    code = mutate.main(
        ["--manifest", str(manifest), "--root", str(root), "--out", str(tmp_path / "out"), "--timeout", timeout]
    )
    err = capsys.readouterr().err
    assert code == USAGE and "--timeout a finite number > 0" in err and timeout in err, err
    assert not (tmp_path / "calls.txt").exists() and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------- verdicts


def _run_folder(path: Path, failed: list[str] = (), regressions: list[str] = ()) -> Path:
    path.mkdir(parents=True)
    pd.DataFrame(
        {"criterion": list(GATE_CRITERIA), "verdict": ["FAIL" if c in failed else "PASS" for c in GATE_CRITERIA]}
    ).to_csv(path / "criteria.csv", index=False)
    if regressions:
        pd.DataFrame({"metric": ["kernels", *regressions], "verdict": ["PASS", *["FAIL"] * len(regressions)]}).to_csv(
            path / "baseline.csv", index=False
        )
    return path


def test_failed_rows_read_criteria_and_baseline_tables(tmp_path):
    run = _run_folder(
        tmp_path / "a", ["no_stream_sync", "no_single_block_kernels"], ["epoch_learner_steps_per_s", "kernels_grid1"]
    )
    assert failed_rows(run) == [
        "no_stream_sync",
        "no_single_block_kernels",
        "epoch throughput",
        "regression kernels_grid1",
    ]
    assert failed_rows(tmp_path / "nothing") == []  # a hang or a crash writes no table
    slow = _run_folder(tmp_path / "b", [], ["kernel_us:_fwd_online_tf32_gemm_kernel"])
    assert failed_rows(slow) == ["kernel time", "regression kernel_us:_fwd_online_tf32_gemm_kernel"]
    assert verdict("kernel time", 1, failed_rows(slow)) == KILLED


@pytest.mark.parametrize(
    "expected, rc, failed, want",
    [
        ("no_stream_sync", 1, ["no_stream_sync", "no_single_block_kernels"], KILLED),  # other FAILs beside it: killed
        ("no_stream_sync", 0, [], SURVIVED),
        (
            "no_stream_sync",
            1,
            ["no_single_block_kernels", "regression kernels"],
            "wrong criterion: no_single_block_kernels",
        ),
        ("no_stream_sync", 1, ["regression dur_us"], "wrong criterion: regression dur_us"),
        ("no_stream_sync", 1, [], "wrong criterion: nothing FAILed in the run folder"),
        ("no_stream_sync", 70, ["no_stream_sync"], CRASHED),  # an internal error is never a kill
        ("no_stream_sync", 2, [], CRASHED),
        ("no_stream_sync", -9, [], CRASHED),
        ("no_stream_sync", 3, [], "wrong criterion: hang"),
        ("no_stream_sync", None, [], TIMED_OUT),
        (HANG, 3, [], KILLED),
        ("no_hang", 3, [], KILLED),
        (HANG, 1, ["no_event_sync"], "wrong criterion: no_event_sync"),
        (HANG, 0, [], SURVIVED),
        (HANG, 70, [], CRASHED),
        ("epoch throughput", 1, ["epoch throughput", "regression kernels"], KILLED),
        ("epoch throughput", 1, ["regression graph_launches"], "wrong criterion: regression graph_launches"),
    ],
)
def test_verdicts_on_stubbed_gate_results(expected, rc, failed, want):
    assert verdict(expected, rc, failed) == want


def test_timing_rows_are_told_from_count_rows():
    for row in (
        "epoch throughput",
        "kernel time",
        "regression dur_us",
        "regression gpu_span_us",
        "regression kernel_us:_fwd_online_tf32_gemm_kernel",
        "regression ddqn_overlap_ratio",
    ):
        assert is_timing_row(row), row
    for row in (
        "no_stream_sync",
        "ddqn_overlapped",
        "no_loop_sync",
        "regression kernels_grid1",
        "regression d2d_copies",
        "regression stream_sync_calls",
        "hang",
    ):
        assert not is_timing_row(row), row


SLOW = ["epoch throughput", "regression dur_us"]  # what contention FAILs in every parallel gate


@pytest.mark.parametrize(
    "expected, rc, failed, alone, want, how",
    [
        # a timing-only failure: a kill (or a wrong criterion) alone, not judged in parallel
        ("epoch throughput", 1, SLOW, True, KILLED, BY_TIMING),
        ("epoch throughput", 1, SLOW, False, NOT_JUDGED, NOT_JUDGED),
        ("kernel time", 1, ["kernel time", "regression kernel_us:k"], True, KILLED, BY_TIMING),
        ("kernel time", 1, ["kernel time", "regression kernel_us:k"], False, NOT_JUDGED, NOT_JUDGED),
        ("no_stream_sync", 1, SLOW, True, "wrong criterion: epoch throughput", "wrong criterion: epoch throughput"),
        ("no_stream_sync", 1, SLOW, False, SURVIVED, NOT_JUDGED),
        # counts and criteria count in a parallel run too; its timing FAILs beside them name nothing
        ("no_stream_sync", 1, ["no_stream_sync", *SLOW], False, KILLED, BY_COUNT),
        ("no_stream_sync", 1, ["no_stream_sync"], False, KILLED, BY_COUNT),
        ("epoch throughput", 1, ["no_event_sync", *SLOW], False, "wrong criterion: no_event_sync", NOT_JUDGED),
        (
            "no_stream_sync",
            1,
            ["regression kernels_grid1", "regression dur_us"],
            False,
            "wrong criterion: regression kernels_grid1",
            NOT_JUDGED,
        ),
        (
            "no_stream_sync",
            1,
            ["regression kernels_grid1", "regression dur_us"],
            True,
            "wrong criterion: regression kernels_grid1, regression dur_us",
            "wrong criterion: regression kernels_grid1, regression dur_us",
        ),
        (
            "no_stream_sync",
            1,
            [],
            False,
            "wrong criterion: nothing FAILed in the run folder",
            "wrong criterion: nothing FAILed in the run folder",
        ),
        (HANG, 3, [], False, KILLED, BY_COUNT),  # the watchdog's exit 3 counts always
        ("no_stream_sync", 70, ["no_stream_sync", *SLOW], False, CRASHED, CRASHED),  # a crash is never a kill
        ("epoch throughput", None, [], False, TIMED_OUT, TIMED_OUT),
        ("epoch throughput", 0, [], False, SURVIVED, SURVIVED),
    ],
)
def test_timing_rows_count_only_in_a_run_alone(expected, rc, failed, alone, want, how):
    said = verdict(expected, rc, failed, alone)
    assert said == want
    assert judgement(expected, said, failed, alone) == how


def test_the_ledger_says_which_runs_overlapped(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(mutate.time, "monotonic", lambda: clock[0])
    ledger = GpuLedger()

    def at(t: float, call, *args):
        clock[0] = t
        return call(*args)

    a = at(0, ledger.begin, "a")
    b = at(5, ledger.begin, "b")
    assert at(8, ledger.overlapping, a) == ["b"]  # b still runs
    assert at(10, ledger.end, a) == ["b"]
    assert at(15, ledger.end, b) == ["a"]
    c = at(15, ledger.begin, "c")  # starts as b ends: touching is not overlapping
    assert at(20, ledger.end, c) == []
    d = at(20, ledger.begin, "d")
    e = at(21, ledger.begin, "e")
    assert at(22, ledger.end, e) == ["d"] and at(22, ledger.end, d) == ["e"]


# ------------------------------------------------------------------------ the runner on a stub gate (no GPU)

STUB_GATE = """\
import sys, os, pathlib
argv = sys.argv[1:]
if argv[:1] == ["-c"]:  # the runner's import check: the real interpreter
    os.execv(sys.executable, [sys.executable, *argv])
assert argv[:3] == ["-m", "hotloop.guards.cli", "gate"], argv
out = pathlib.Path(argv[argv.index("--out") + 1])
out.mkdir(parents=True)
if "--update-baseline" in argv:
    pathlib.Path(argv[argv.index("--baseline") + 1]).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(argv[argv.index("--baseline") + 1]).write_text("{}")
with open(os.environ["STUB_CALLS"], "a") as f:
    f.write(pathlib.Path.cwd().name + " " + " ".join(argv[3:argv.index("--out")]) + "\\n")
barrier = os.environ.get("STUB_BARRIER")  # mutant gates wait here until STUB_BARRIER_N of them have started
if barrier and pathlib.Path.cwd().name != "clean":
    import time
    here = pathlib.Path(barrier)
    here.mkdir(exist_ok=True)
    here.joinpath(pathlib.Path.cwd().name).touch()
    t0 = time.monotonic()
    while len(list(here.iterdir())) < int(os.environ["STUB_BARRIER_N"]):
        if time.monotonic() - t0 > 30:
            sys.exit(99)  # never met: reads "crashed"
        time.sleep(0.02)
state = [t for t in pathlib.Path("guards/stub_gate.txt").read_text().splitlines() if not t.startswith("#")][0]
rc, _, failed = state.partition(" ")
crit = ["no_stream_sync", "no_event_sync", "ddqn_overlapped"]
out.joinpath("criteria.csv").write_text("criterion,verdict\\n" + "".join(
    f"{c},{'FAIL' if c in failed.split(',') else 'PASS'}\\n" for c in crit))
metrics = [m for m in failed.split(",") if m not in crit and m.replace("_", "a").replace(":", "a").isalnum()]
if metrics:  # baseline rows: epoch_*, kernel_us:*, dur_us (timings) or kernels_grid1 (a count)
    out.joinpath("baseline.csv").write_text("metric,verdict\\n" + "".join(f"{m},FAIL\\n" for m in metrics))
sys.exit(int(rc))
"""


def _stub_checkout(tmp_path: Path, clean: str = "0") -> Path:
    root = tmp_path / "checkout"
    for pkg in ("kernels", "profiles", "trainer", "guards"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text(f'"""{pkg}"""\n')
    (root / "guards" / "stub_gate.txt").write_text(_stub_state(clean))
    (root / "pyproject.toml").write_text(
        "[tool.setuptools.package-dir]\n"
        + "".join(f'"hotloop.{p}" = "{p}"\n' for p in ("kernels", "profiles", "trainer", "guards"))
    )
    stub = tmp_path / "stub-python"
    stub.write_text(f"#!{sys.executable}\n" + STUB_GATE)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return root


def _stub_state(state: str) -> str:
    """The stub gate's file: its exit code and the rows it FAILs ("1 no_stream_sync,ddqn_overlapped"; a name that is
    not a criterion is a FAIL row of baseline.csv: "1 epoch_learner_steps_per_s,dur_us")."""
    return f"# the stub gate's exit code, then the criteria it FAILs\n{state}\n# end\n"


def _patch(text_before: str, text_after: str) -> str:
    return _diff("guards/stub_gate.txt", _stub_state(text_before), _stub_state(text_after))


def _manifest(folder: Path, entries: list[dict], defaults: str = '["--device", "cuda"]') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"[defaults]\nargs = {defaults}\n"]
    for e in entries:
        if "after" in e:
            (folder / f"{e['id']}.patch").write_text(_patch(e.pop("before", "0"), e.pop("after")))
        lines.append("[[mutant]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in e.items()))
    path = folder / "mutants.toml"
    path.write_text("\n".join(lines))
    return path


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return '"' + str(v).replace('"', '\\"') + '"'


def _entry(id: str, criterion: str, after: str, **extra) -> dict:
    return {
        "id": id,
        "patch": f"{id}.patch",
        "file": "guards/stub_gate.txt",
        "criterion": criterion,
        "what": f"stub {id}",
        "depends": "none",
        "after": after,
        **extra,
    }


@needs_git
def test_the_runner_scores_each_mutant_after_a_clean_pass(tmp_path, monkeypatch):
    root = _stub_checkout(tmp_path)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("STUB_CALLS", str(calls))
    manifest = _manifest(
        tmp_path / "mutants",
        [
            _entry("sync_item", "no_stream_sync", "1 no_stream_sync,ddqn_overlapped"),
            _entry("other_row", "no_event_sync", "1 ddqn_overlapped"),
            _entry("unseen", "no_stream_sync", "0 (an edit the gate does not see)"),
            _entry("crash", "no_event_sync", "70 no_event_sync"),
            _entry("spin", "hang", "3", args=["--device", "cuda", "--epoch-timeout", "5"], exclusive=True),
        ],
    )
    code, table = run_suite(manifest, root, tmp_path / "out", jobs=2, python=str(tmp_path / "stub-python"))
    assert code == 0
    got = dict(zip(table["mutant"], table["verdict"]))
    assert got == {
        "sync_item": KILLED,
        "other_row": "wrong criterion: ddqn_overlapped",
        "unseen": SURVIVED,
        "crash": CRASHED,
        "spin": KILLED,
    }
    assert list(table.columns) == mutate.RESULT_COLUMNS
    assert table.set_index("mutant").loc["sync_item", "failed criteria"] == "no_stream_sync, ddqn_overlapped"
    assert table.set_index("mutant").loc["sync_item", "judgement"] == BY_COUNT
    assert table.set_index("mutant").loc["spin", "ran"] == ALONE  # exclusive: no other gate ran beside it
    assert mutate.score(table) == (2, 5)
    runs = calls.read_text().splitlines()
    # the clean tree ran first, once per distinct argument list, before any mutant; each mutant in its own copy
    assert runs[:2] == ["clean --device cuda", "clean --device cuda --epoch-timeout 5"]
    assert sorted(r.split()[0] for r in runs[2:]) == ["crash", "other_row", "spin", "sync_item", "unseen"]
    assert runs[-1].startswith("spin")  # exclusive: alone, after the shared ones
    out = tmp_path / "out"
    assert (
        out / "mutants.csv"
    ).is_file() and "mutation score: 2/5 killed (40%): 2 by a count/criterion, 0 by timing (alone)" in (
        out / "mutants.md"
    ).read_text()
    assert pd.read_csv(out / "clean.csv")["exit code"].tolist() == [0, 0]
    assert (root / "guards" / "stub_gate.txt").read_text() == _stub_state("0")  # the checkout is never patched
    with pytest.raises(UsageError, match="already holds runs"):  # a second suite never mixes into the first's
        run_suite(manifest, root, out, python=str(tmp_path / "stub-python"))


@needs_git
def test_self_baseline_writes_the_clean_trees_baseline_and_judges_against_it(tmp_path, monkeypatch):
    root = _stub_checkout(tmp_path)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("STUB_CALLS", str(calls))
    manifest = _manifest(tmp_path / "mutants", [_entry("a", "no_stream_sync", "1 no_stream_sync")])
    out = tmp_path / "out"
    code, table = run_suite(manifest, root, out, python=str(tmp_path / "stub-python"), self_baseline=True)
    own = out / "baselines" / "clean.json"
    assert code == 0 and table["verdict"].tolist() == [KILLED] and own.is_file()
    assert calls.read_text().splitlines() == [
        f"clean --device cuda --update-baseline --repeats 5 --baseline {own}",
        f"clean --device cuda --baseline {own}",
        f"a --device cuda --baseline {own}",
    ]
    chooses = _manifest(tmp_path / "m2", [_entry("b", "no_stream_sync", "1", args=["--no-baseline"])])
    with pytest.raises(UsageError, match="already choose a baseline"):
        run_suite(chooses, root, out, python=str(tmp_path / "stub-python"), self_baseline=True)


def _barrier(monkeypatch, tmp_path: Path, n: int) -> None:
    """The stub's mutant gates wait until `n` of them have started: the first `n` surely run in parallel."""
    monkeypatch.setenv("STUB_BARRIER", str(tmp_path / "barrier"))
    monkeypatch.setenv("STUB_BARRIER_N", str(n))


@needs_git
def test_timing_fails_of_parallel_runs_are_not_judged_and_timing_mutants_run_alone(tmp_path, monkeypatch):
    """Issue 36 item 3: gates in parallel on one GPU FAIL their timing rows whatever the mutant does."""
    root = _stub_checkout(tmp_path)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("STUB_CALLS", str(calls))
    _barrier(monkeypatch, tmp_path, 2)
    manifest = _manifest(
        tmp_path / "mutants",
        [
            _entry("slow_epochs", "epoch throughput", "1 epoch_learner_steps_per_s,dur_us"),  # not marked exclusive
            _entry("contended", "no_stream_sync", "1 epoch_learner_steps_per_s,dur_us"),  # timing FAILs only
            _entry("sync_and_slow", "no_event_sync", "1 no_event_sync,epoch_learner_steps_per_s,dur_us"),
        ],
    )
    out = tmp_path / "out"
    code, table = run_suite(manifest, root, out, jobs=2, python=str(tmp_path / "stub-python"))
    assert code == 0
    got = table.set_index("mutant")[["verdict", "judgement", "ran"]].to_dict("index")
    assert got == {
        "slow_epochs": {"verdict": KILLED, "judgement": BY_TIMING, "ran": ALONE},  # re-placed: run alone
        "contended": {"verdict": SURVIVED, "judgement": NOT_JUDGED, "ran": PARALLEL},  # not a kill
        "sync_and_slow": {"verdict": KILLED, "judgement": BY_COUNT, "ran": PARALLEL},  # a count kill counts
    }
    runs = [r.split()[0] for r in calls.read_text().splitlines()]
    assert runs[0] == "clean" and sorted(runs[1:3]) == ["contended", "sync_and_slow"] and runs[3] == "slow_epochs"
    line = (
        "mutation score: 2/3 killed (67%): 1 by a count/criterion, 1 by timing (alone); timing not judged for 1 "
        "parallel runs (of 2 run in parallel)"
    )
    assert mutate.score_line(table) == line and line in (out / "mutants.md").read_text()
    written = pd.read_csv(out / "mutants.csv").set_index("mutant")
    assert written.loc["contended", "judgement"] == NOT_JUDGED and written.loc["slow_epochs", "ran"] == ALONE
    assert "ran in parallel with sync_and_slow: timing rows not judged" in (out / "logs" / "contended.log").read_text()


@needs_git
@pytest.mark.parametrize("jobs, want", [(1, (KILLED, BY_TIMING, ALONE)), (2, (NOT_JUDGED, NOT_JUDGED, PARALLEL))])
def test_the_same_timing_failure_kills_alone_and_is_not_judged_in_parallel(tmp_path, monkeypatch, jobs, want):
    """The scheduling set aside (runs_alone false for all): the ledger alone decides whether a timing row counts."""
    root = _stub_checkout(tmp_path)
    monkeypatch.setenv("STUB_CALLS", str(tmp_path / "calls.txt"))
    if jobs > 1:
        _barrier(monkeypatch, tmp_path, 2)
    monkeypatch.setattr(mutate, "runs_alone", lambda m: False)
    manifest = _manifest(
        tmp_path / "mutants",
        [
            _entry("slow_epochs", "epoch throughput", "1 epoch_learner_steps_per_s"),
            _entry("slow_kernel", "kernel time", "1 kernel_us:_fwd_gemm,dur_us"),
        ],
    )
    code, table = run_suite(manifest, root, tmp_path / "out", jobs=jobs, python=str(tmp_path / "stub-python"))
    assert code == 0
    for _, row in table.iterrows():
        assert (row["verdict"], row["judgement"], row["ran"]) == want, row["mutant"]
    assert mutate.score(table) == ((2 if jobs == 1 else 0), 2)


def test_the_cli_prints_the_score_both_ways(tmp_path, monkeypatch, capsys):
    table = pd.DataFrame(
        [
            {"mutant": "a", "verdict": KILLED, "judgement": BY_COUNT, "ran": PARALLEL},
            {"mutant": "b", "verdict": KILLED, "judgement": BY_TIMING, "ran": ALONE},
            {"mutant": "c", "verdict": SURVIVED, "judgement": NOT_JUDGED, "ran": PARALLEL},
            {"mutant": "d", "verdict": SURVIVED, "judgement": SURVIVED, "ran": ALONE},
        ],
        columns=mutate.RESULT_COLUMNS,
    )
    monkeypatch.setattr(mutate, "run_suite", lambda *a, **k: (0, table))
    (tmp_path / "ci" / "mutants").mkdir(parents=True)
    (tmp_path / "ci" / "mutants" / "mutants.toml").write_text("")  # the default manifest must exist
    assert mutate.main(["--root", str(tmp_path), "--out", str(tmp_path / "out"), "--min-score", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert (
        "mutation score: 2/4 killed (50%): 1 by a count/criterion, 1 by timing (alone); timing not judged for 1 "
        "parallel runs (of 2 run in parallel); tables in"
    ) in printed
    assert mutate.main(["--root", str(tmp_path), "--out", str(tmp_path / "out"), "--min-score", "0.6"]) == 1


@needs_git
def test_no_score_when_the_clean_tree_fails(tmp_path, monkeypatch):
    root = _stub_checkout(tmp_path, clean="1 no_stream_sync")
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("STUB_CALLS", str(calls))
    manifest = _manifest(
        tmp_path / "mutants", [_entry("a", "no_event_sync", "1 no_event_sync", before="1 no_stream_sync")]
    )
    code, table = run_suite(manifest, root, tmp_path / "out", python=str(tmp_path / "stub-python"))
    assert (code, table) == (CLEAN_FAILED, None)
    assert calls.read_text().split() == ["clean", "--device", "cuda"]  # no mutant ran


# ------------------------------------------------------------------------------- bad input: exit 2, nothing run


@pytest.mark.parametrize(
    "entry, problem",
    [
        ({"criterion": "no stream synk"}, "criterion 'no stream synk' is not one of"),
        ({"id": "Bad-Id"}, "id must be lower-case"),
        ({"patch": "missing.patch"}, "missing.patch does not exist"),
        ({"args": ["--device", "cuda", "--out", "x"]}, "args may not hold \\['--out'\\]"),
        ({"args": "--device cuda"}, "args must be a list of strings"),
        ({"exclusive": "yes"}, "exclusive must be true or false"),
        ({"criterion": None}, "missing field 'criterion'"),
        ({"criteria": "no_stream_sync"}, "unknown field 'criteria'"),
    ],
)
def test_a_bad_manifest_entry_is_exit_2_naming_it_before_anything_runs(tmp_path, monkeypatch, capsys, entry, problem):
    root = _stub_checkout(tmp_path)
    monkeypatch.setenv("STUB_CALLS", str(tmp_path / "calls.txt"))
    good = _entry("fine", "no_stream_sync", "1 no_stream_sync")
    bad = _entry("broken", "no_event_sync", "1 no_event_sync")
    bad = {k: v for k, v in {**bad, **entry}.items() if v is not None}
    manifest = _manifest(tmp_path / "mutants", [good, bad])
    with pytest.raises(UsageError, match=problem):
        load_manifest(manifest)
    code = mutate.main(["--manifest", str(manifest), "--root", str(root), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == USAGE and "mutant " in err and problem.replace("\\", "").split("'")[0] in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "calls.txt").exists()


def test_duplicate_ids_and_an_empty_manifest_are_usage_errors(tmp_path):
    manifest = _manifest(tmp_path / "m", [_entry("twice", "no_stream_sync", "1"), _entry("twice", "hang", "3")])
    with pytest.raises(UsageError, match="mutant twice: id is not unique"):
        load_manifest(manifest)
    (tmp_path / "empty.toml").write_text("[defaults]\nargs = []\n")
    with pytest.raises(UsageError, match="no \\[\\[mutant\\]\\] entries"):
        load_manifest(tmp_path / "empty.toml")
    (tmp_path / "broken.toml").write_text("[[mutant]\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load_manifest(tmp_path / "broken.toml")


@needs_git
def test_a_patch_that_does_not_apply_is_exit_2_naming_it_before_anything_runs(tmp_path, monkeypatch, capsys):
    root = _stub_checkout(tmp_path)
    monkeypatch.setenv("STUB_CALLS", str(tmp_path / "calls.txt"))
    manifest = _manifest(
        tmp_path / "mutants",
        [
            _entry("fine", "no_stream_sync", "1 no_stream_sync"),
            _entry("stale", "no_event_sync", "1 no_event_sync", before="code that moved"),
        ],
    )
    code = mutate.main(["--manifest", str(manifest), "--root", str(root), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == USAGE and "stale: stale.patch does not apply" in err and "fine:" not in err
    assert not (tmp_path / "calls.txt").exists() and not (tmp_path / "out").exists()
    assert mutate.main(["--manifest", str(manifest), "--root", str(root), "--only", "fine", "--check"]) == 0
    assert mutate.main(["--manifest", str(manifest), "--root", str(root), "--only", "nosuch", "--check"]) == USAGE


@needs_git
def test_the_suite_finds_its_checkout_from_the_manifest_or_the_working_folder(tmp_path):
    """Issue 40 item 6: from an installed wheel, `hotloop mutate --manifest PATH` runs any checkout's suite; the
    checkout is the one holding the manifest unless --root says otherwise."""
    repo = tmp_path / "repo"
    (repo / "ci" / "mutants").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    manifest = repo / "ci" / "mutants" / "mutants.toml"
    manifest.write_text("")
    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    assert mutate.suite_paths(None, manifest, cwd=elsewhere) == (repo.resolve(), manifest.resolve())
    assert mutate.suite_paths(None, None, cwd=repo / "ci") == (repo.resolve(), manifest.resolve())
    assert mutate.suite_paths(elsewhere, manifest, cwd=repo) == (elsewhere.resolve(), manifest.resolve())
    with pytest.raises(UsageError, match=r"no mutant manifest at .*empty/ci/mutants/mutants.toml.*--manifest PATH"):
        mutate.suite_paths(None, None, cwd=elsewhere)
    with pytest.raises(UsageError, match="no mutant manifest at .*nosuch.toml"):
        mutate.suite_paths(None, repo / "nosuch.toml")


def test_the_cli_without_a_manifest_is_exit_2_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mutate, "checkout_root", lambda start=".": Path(start).resolve())  # no git above tmp_path
    assert mutate.main(["--check"]) == USAGE
    assert "no mutant manifest at" in capsys.readouterr().err
