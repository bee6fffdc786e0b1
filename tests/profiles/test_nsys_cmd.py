"""`hotloop nsys -- CMD...` on the CPU: a fake `nsys` (and a fake QdstrmImporter) written into tmp_path runs the
command and "exports" the real H200 export tests/data/traces/h200/nsys_matmul_nvtx.sqlite (5 NVTX `step` ranges in
domain hotloop, 11 kernels: tests/data/traces/README.md). What is checked: the route chosen (PATH first, else the
bundled Nsight Compute nsys + importer with .nsyslibs on LD_LIBRARY_PATH), the nsys arguments, the printed counts
(identical to `hotloop inspect` on the same file), the three files, exit codes 0/1/2, the temp folder removed."""

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from hotloop.guards.cli import main
from hotloop.profiles import nsys_cmd
from hotloop.profiles.nsight_reader import read_nsight_sqlite
from hotloop.profiles.nsys_cmd import NsysRoute, find_nsys, range_gpu_time

EXPORT = Path(__file__).parents[1] / "data" / "traces" / "h200" / "nsys_matmul_nvtx.sqlite"
HI = [sys.executable, "-c", "print('hi')"]

FAKE_NSYS = f"""#!{sys.executable}
import json, os, shutil, subprocess, sys
from pathlib import Path
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"tool": "nsys", "exe": sys.argv[0], "argv": argv}}) + "\\n")
if argv[0] == "profile":
    base = argv[argv.index("-o") + 1]
    cmd = argv[argv.index("--force-overwrite") + 2:]
    rc = subprocess.run(cmd).returncode
    Path(base + (".qdstrm" if os.environ.get("FAKE_QDSTRM") else ".nsys-rep")).write_bytes(b"raw")
    sys.exit(rc)
if argv[0] == "export":
    assert argv[1:4] == ["--type", "sqlite", "-o"] and Path(argv[5]).is_file(), argv
    shutil.copy({str(EXPORT)!r}, argv[4])
    sys.exit(0)
sys.exit(99)
"""

FAKE_IMPORTER = f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"tool": "importer", "argv": sys.argv[1:],
                           "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}}) + "\\n")
raw = Path(sys.argv[sys.argv.index("-i") + 1])
assert raw.suffix == ".qdstrm" and raw.is_file()
if not os.environ.get("FAKE_IMPORTER_FAILS"):
    raw.with_suffix(".nsys-rep").write_bytes(b"rep")
sys.exit(1 if os.environ.get("FAKE_IMPORTER_FAILS") else 0)
"""


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _log(tmp_path: Path) -> list[dict]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def env(tmp_path, monkeypatch):
    """No nsys anywhere (PATH = an empty folder, no Nsight Compute root), temp files in tmp_path/tmp, a log of the
    fake tools' calls at tmp_path/calls.jsonl, $HOTLOOP_NSYS_LIBS at tmp_path/repo/.nsyslibs."""
    for d in ("empty", "tmp", "repo", "opt"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(nsys_cmd, "NSIGHT_COMPUTE_ROOTS", (tmp_path / "opt",))
    monkeypatch.setenv(nsys_cmd.LIBS_ENV, str(tmp_path / "repo" / ".nsyslibs"))
    return tmp_path


@pytest.fixture
def path_nsys(env, monkeypatch):
    """A fake nsys first on PATH."""
    _script(env / "bin" / "nsys", FAKE_NSYS)
    monkeypatch.setenv("PATH", f"{env / 'bin'}{os.pathsep}{env / 'empty'}")
    return env / "bin" / "nsys"


def _bundled(root: Path, version: str = "2025.3.1") -> tuple[Path, Path]:
    host = root / version / "host"
    return (
        _script(host / "target-linux-x64" / "nsys", FAKE_NSYS),
        _script(host / "linux-desktop-glibc_2_11_3-x64" / "QdstrmImporter", FAKE_IMPORTER),
    )


def _inspect(capsys, *argv) -> str:
    assert main(["inspect", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.smoke
def test_profiles_exports_and_prints_the_counts_hotloop_inspect_prints(path_nsys, env, capsys):
    out = env / "run"
    assert main(["nsys", "--out", str(out), "--", *HI]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["counts.json", "ranges.csv", "report.sqlite"]
    report = str(out / "report.sqlite")
    assert _inspect(capsys, report) in printed  # the same per-file totals and per-step table, verbatim
    # the numbers of tests/data/traces/README.md (11 kernels, 5 `step` ranges) and of `hotloop inspect`
    assert "kernels      11" in printed and "per step (5 step ranges" in printed
    assert "sync_calls cudaDeviceSynchronize       5" in printed and "NVTX ranges (1;" in printed
    counts = json.loads((out / "counts.json").read_text())
    assert counts == json.loads(_inspect(capsys, "--json", "--domain", "hotloop", report))
    assert counts["files"][report]["totals"]["kernels"] == 11
    assert [s["kernels"] for s in counts["files"][report]["steps"]] == [2] * 5
    ranges = pd.read_csv(out / "ranges.csv")
    assert ranges[["domain", "name", "count", "kernels"]].values.tolist() == [["hotloop", "step", 5, 10]]
    profile, export = _log(env)
    assert profile["argv"] == [
        "profile",
        "-t",
        "cuda,nvtx",
        "-s",
        "none",
        "--cpuctxsw=none",
        "--cuda-graph-trace=node",
        "-o",
        profile["argv"][8],
        "--force-overwrite",
        "true",
        *HI,
    ]
    base = Path(profile["argv"][8])
    assert base.parent.parent == env / "tmp" and not base.parent.exists()  # raw report in tmp, then removed
    assert export["argv"] == ["export", "--type", "sqlite", "-o", report, str(base) + ".nsys-rep"]
    assert list((env / "tmp").iterdir()) == []


def test_a_failing_command_exits_1_and_what_was_recorded_is_still_reported(path_nsys, env, capsys):
    out = env / "run"
    assert main(["nsys", "--out", str(out), "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 1
    captured = capsys.readouterr()
    assert "exited with status 3" in captured.err and "reporting what was recorded" in captured.err
    assert sorted(p.name for p in out.iterdir()) == ["counts.json", "ranges.csv", "report.sqlite"]
    assert "per step (5 step ranges" in captured.out
    assert list((env / "tmp").iterdir()) == []


def test_bundled_route_when_nsys_is_not_on_path_runs_the_importer_with_nsyslibs(env, capsys, monkeypatch):
    (env / "repo" / ".nsyslibs").mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/lib")
    _bundled(env / "opt", "2025.9.0")
    nsys, importer = _bundled(env / "opt", "2025.10.1")  # newest version first (numerically)
    assert find_nsys(None, [env / "opt"]) == NsysRoute(nsys, importer, env / "repo" / ".nsyslibs")
    out = env / "run"
    assert main(["nsys", "--out", str(out), "--", *HI]) == 0
    assert "per step (5 step ranges" in capsys.readouterr().out
    assert (out / "report.sqlite").read_bytes() == EXPORT.read_bytes()
    monkeypatch.setenv("FAKE_QDSTRM", "1")  # bundled nsys leaves only the raw .qdstrm (docs/nsight.md)
    out2 = env / "run2"
    assert main(["nsys", "--out", str(out2), "--", *HI]) == 0
    calls = _log(env)[2:]
    assert [c["tool"] for c in calls] == ["nsys", "importer", "nsys"] and calls[0]["exe"] == str(nsys)
    raw = calls[0]["argv"][8] + ".qdstrm"
    assert calls[1]["argv"] == ["-i", raw]
    assert calls[1]["LD_LIBRARY_PATH"] == f"{env / 'repo' / '.nsyslibs'}{os.pathsep}/usr/local/lib"
    assert calls[2]["argv"][-1] == calls[0]["argv"][8] + ".nsys-rep"
    assert sorted(p.name for p in out2.iterdir()) == ["counts.json", "ranges.csv", "report.sqlite"]
    assert list((env / "tmp").iterdir()) == []


def test_a_failing_importer_exits_1_naming_nsyslibs(env, capsys, monkeypatch):
    _bundled(env / "opt")
    monkeypatch.setenv("FAKE_QDSTRM", "1")
    monkeypatch.setenv("FAKE_IMPORTER_FAILS", "1")
    assert main(["nsys", "--out", str(env / "run"), "--", *HI]) == 1
    err = capsys.readouterr().err
    assert "QdstrmImporter" in err and ".nsyslibs" in err and "docs/nsight.md" in err
    assert list((env / "run").iterdir()) == [] and list((env / "tmp").iterdir()) == []


def test_path_nsys_is_preferred_over_the_bundled_one(path_nsys, env):
    _bundled(env / "opt")
    assert find_nsys(None, [env / "opt"]) == NsysRoute(path_nsys)


def test_no_nsys_anywhere_exits_2_naming_both_routes(env, capsys):
    assert main(["nsys", "--out", str(env / "run"), "--", *HI]) == 2
    err = capsys.readouterr().err
    assert "`nsys` is not on PATH" in err and "Nsight Compute" in err and str(env / "opt") in err
    assert "docs/nsight.md" in err and "Install Nsight Systems" in err
    assert not (env / "run").exists() and _log(env) == []
    with pytest.raises(ValueError, match="not on PATH"):
        find_nsys(None, [env / "opt"])


def test_a_non_empty_out_exits_2_and_nothing_is_overwritten(path_nsys, env, capsys):
    out = env / "run"
    out.mkdir()
    (out / "report.sqlite").write_text("mine")
    assert main(["nsys", "--out", str(out), "--", *HI]) == 2
    assert "is not an empty folder" in capsys.readouterr().err
    assert (out / "report.sqlite").read_text() == "mine" and len(list(out.iterdir())) == 1 and _log(env) == []


@pytest.mark.parametrize("argv", [["nsys"], ["nsys", "--"], ["nsys", "--out", "x", "--"]])
def test_no_command_exits_2_with_usage(path_nsys, env, capsys, argv):
    assert main(argv) == 2
    assert "no command to profile; usage: hotloop nsys" in capsys.readouterr().err and _log(env) == []


def test_range_gpu_time_of_the_real_export():
    df = read_nsight_sqlite(EXPORT)
    table = range_gpu_time(df)
    assert table[["domain", "name", "count"]].values.tolist() == [["hotloop", "step", 5]]
    ranges = df[df["kind"].eq("user_annotation")]
    assert table.loc[0, "cpu_total_us"] == pytest.approx(ranges["dur_us"].sum())
    assert table.loc[0, "cpu_median_us"] == pytest.approx(ranges["dur_us"].median())
    # per range, by brute force: kernels whose launching call (same correlation) starts inside the range
    calls, kernels = df[df["kind"].isin(["runtime", "driver"])], df[df["kind"].eq("kernel")]
    per_range = []
    for r in ranges.itertuples():
        inside = calls[calls["start_us"].between(r.start_us, r.start_us + r.dur_us) & calls["tid"].eq(r.tid)]
        per_range.append(kernels.loc[kernels["correlation"].isin(inside["correlation"]), "dur_us"])
    assert [len(k) for k in per_range] == [2] * 5 and all(k.sum() > 0 for k in per_range)
    assert table.loc[0, "kernels"] == 10  # the 11th kernel ran before the first step
    assert table.loc[0, "gpu_kernel_us"] == pytest.approx(sum(k.sum() for k in per_range))
    one_each = pd.concat([range_gpu_time(df.drop(ranges.index.drop(i))) for i in ranges.index])
    assert one_each["count"].tolist() == [1] * 5 and (one_each["gpu_kernel_us"] > 0).all()


def test_range_gpu_time_counts_ranges_per_thread_and_nested_ranges_inclusively():
    from hotloop.profiles.trace_schema import event_frame

    rows = [  # (name, kind, start, dur, tid, correlation)
        ("outer", "user_annotation", 0, 100, "1", None),
        ("inner", "user_annotation", 10, 20, "1", None),
        ("other", "user_annotation", 0, 100, "2", None),
        ("cudaLaunchKernel", "runtime", 15, 1, "1", 7),
        ("cudaLaunchKernel", "runtime", 50, 1, "1", 8),
        ("k7", "kernel", 20, 3, "", 7),
        ("k8", "kernel", 60, 5, "", 8),
        ("k9", "kernel", 61, 9, "", 9),
        ("cudaLaunchKernel", "runtime", 200, 1, "1", 9),
    ]
    df = event_frame(
        {
            "name": [r[0] for r in rows],
            "kind": [r[1] for r in rows],
            "start_us": [r[2] for r in rows],
            "dur_us": [r[3] for r in rows],
            "tid": [r[4] for r in rows],
            "pid": ["p"] * len(rows),
            "correlation": [r[5] for r in rows],
        }
    )
    table = range_gpu_time(df).set_index("name")
    assert table.loc["outer", ["kernels", "gpu_kernel_us"]].tolist() == [2, 8.0]
    assert table.loc["inner", ["kernels", "gpu_kernel_us"]].tolist() == [1, 3.0]
    assert table.loc["other", ["kernels", "gpu_kernel_us"]].tolist() == [0, 0.0]  # launches were on thread 1
    assert range_gpu_time(df[df["kind"].ne("user_annotation")]).empty
