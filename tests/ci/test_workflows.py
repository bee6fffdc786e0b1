"""The CI gate's CPU-side parts: the GitHub Actions workflow (validated against GitHub's workflow schema by check-jsonschema, two identical copies) and
ci/gate.sh run end to end on the CPU -- a passing dry run, injected failures printed last, and the GPU-runner
path (GPU name -> baseline slug, --baseline only when the gate has it) with stub `nvidia-smi` and `hotloop`.

Not marked smoke/perf on purpose: ci/gate.sh runs `pytest -m "smoke or perf"`, and these tests run ci/gate.sh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = [REPO / "ci" / "workflows" / "gpu-gate.yml", REPO / ".github" / "workflows" / "gpu-gate.yml"]
GATE = REPO / "ci" / "gate.sh"
TINY_GATE = "--set learner_steps_per_epoch=20 --set learning_starts=64 --set batch_size=32 --set eval_episodes=2"


def _lint(*files: Path) -> subprocess.CompletedProcess:
    """Validate workflow files against GitHub's workflow JSON schema (check-jsonschema's vendored copy: no
    network). Without check-jsonschema installed: a failure under CI (CI set: .ci/run installs it), else a skip
    (e.g. a GPU runner set up without the dev extras)."""
    if importlib.util.find_spec("check_jsonschema") is None:
        why = "check-jsonschema is not installed (pip install -e '.[dev]')"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_both_workflow_files_pass_the_workflow_schema():
    result = _lint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validation done" in result.stdout


def test_the_lint_does_check_them(tmp_path):
    """The lint is real: a job without `runs-on`, or a misspelt key, fails it."""
    broken = tmp_path / "gpu-gate.yml"
    broken.write_text(re.sub(r"\n\s+runs-on:[^\n]*", "", WORKFLOWS[0].read_text(), count=1))
    result = _lint(broken)
    assert result.returncode != 0, result.stdout
    misspelt = tmp_path / "misspelt.yml"
    misspelt.write_text(WORKFLOWS[0].read_text().replace("permissions:", "permission:", 1))
    assert _lint(misspelt).returncode != 0


@pytest.mark.smoke
def test_the_two_workflow_copies_are_identical():
    assert WORKFLOWS[1].read_bytes() == WORKFLOWS[0].read_bytes(), (
        "edit ci/workflows/gpu-gate.yml, then copy it to .github/workflows/gpu-gate.yml"
    )


def test_workflow_pins_actions_and_keeps_artifacts():
    text = WORKFLOWS[0].read_text()
    uses = re.findall(r"uses:\s*(\S+)", text)
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses
    assert "runs-on: [self-hosted, linux, x64, gpu-h100]" in text
    assert re.search(r"^permissions:\n  contents: read\n", text, re.M)
    assert re.search(r"^concurrency:\n  group: .*github\.ref", text, re.M)
    assert "bash ci/gate.sh || rc=$?" in text and "run: bash .ci/run" in text
    assert (
        'echo "exit-code=$rc" >> "$GITHUB_OUTPUT"' in text
        and '5) echo "::error title=ci/gate.sh exit 5::the gate crashed: internal error, not a regression' in text
    )
    assert text.count("actions/upload-artifact@") == 2 and text.count("if: always()") == 2
    assert 'python-version: "3.11"' in text


# --- ci/gate.sh end to end --------------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTLOOP_", "GITHUB_"))}
    env.update(HOTLOOP_PYTHON=sys.executable, HOTLOOP_SKIP_INSTALL="1", HOTLOOP_DEVICE="cpu", HOTLOOP_EPOCHS="1")
    env.update(extra)
    return env


def _gate(env: dict[str, str], timeout: float = 240) -> tuple[int, list[str]]:
    result = subprocess.run(
        ["bash", str(GATE)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    return result.returncode, result.stdout.rstrip("\n").splitlines()


def _test_file(tmp_path: Path, passing: bool) -> Path:
    path = tmp_path / ("test_ci_passing.py" if passing else "test_ci_injected.py")
    body = "assert True" if passing else 'assert 1 + 1 == 3, "injected failure"'
    path.write_text(f"import pytest\n\n\n@pytest.mark.smoke\ndef test_{path.stem[5:]}():\n    {body}\n")
    return path


def test_gate_sh_dry_run_on_cpu_passes_and_writes_the_summary(tmp_path):
    run, step_summary = tmp_path / "run", tmp_path / "step_summary.md"
    rc, out = _gate(
        _env(
            HOTLOOP_RUN_DIR=str(run),
            HOTLOOP_GATE_ARGS=TINY_GATE,
            GITHUB_STEP_SUMMARY=str(step_summary),
            HOTLOOP_PYTEST_ARGS=f"-p no:cacheprovider {_test_file(tmp_path, True)}",
        )
    )
    assert rc == 0, "\n".join(out[-40:])
    assert out[-1] == "ci/gate.sh: PASS"
    summary = (run / "summary.md").read_text()
    assert summary.startswith("## hotloop CI gate: PASS")
    assert "### Criteria (verdicts)" in summary and "| epoch 1 without hang" in summary and "| PASS " in summary
    assert "### Per-epoch table" in summary and re.search(r"^\|\s+epoch \|\s+learner_steps \|", summary, re.M)
    assert "| baseline | none (a CPU dry run compares against no baseline" in summary
    assert step_summary.read_text().strip() == summary.strip()
    suite = ET.parse(run / "junit.xml").getroot()
    assert sum(int(s.get("tests")) for s in suite.iter("testsuite")) == 1
    assert (run / "gate" / "criteria.csv").is_file() and (run / "gate.log").is_file()


def test_gate_sh_fails_on_a_failed_test_and_a_hang_with_the_failing_rows_last(tmp_path):
    run = tmp_path / "run"
    rc, out = _gate(
        _env(
            HOTLOOP_RUN_DIR=str(run),
            HOTLOOP_GATE_ARGS="--set learner_steps_per_epoch=100000 --epoch-timeout 0.05",
            HOTLOOP_PYTEST_ARGS=f"-p no:cacheprovider {_test_file(tmp_path, False)}",
        )
    )
    assert rc == 3, "\n".join(out[-40:])  # a hang outranks a failed test
    tail = out[-5:]
    assert tail[0] == "ci/gate.sh: FAIL (exit 3); the failing rows:", "\n".join(out[-40:])
    assert tail[1].startswith("--- pytest (exit 1): tests failed: 0 passed, 1 failed")
    assert re.match(
        r"\s+FAILED .*test_ci_injected\.py::test_ci_injected - AssertionError: injected failure$", tail[2]
    ), tail[2]
    assert tail[3] == "--- hotloop gate (exit 3): hang (watchdog)"
    assert re.match(r"\s+hotloop: HANG: epoch 1 did not finish within 0.05 s; last phase entered: ", tail[4])
    summary = (run / "summary.md").read_text()
    assert summary.startswith("## hotloop CI gate: FAIL (exit 3)") and "### Failing" in summary
    assert "_no criteria table: the gate did not finish" in summary and (run / "junit.xml").is_file()


STUB_HOTLOOP = r"""
import csv, json, sys
from pathlib import Path
args = sys.argv[1:]
if args[:2] == ["gate", "--help"]:
    print("usage: hotloop gate [--baseline PATH] [--out DIR]\n\noptions:\n  --baseline PATH  per-GPU baseline")
    sys.exit(0)
Path(sys.argv[0]).with_name("argv.json").write_text(json.dumps(args))
if "--sleep" in args:
    print("stub gate running", flush=True)
    import time; time.sleep(120)
out = Path(args[args.index("--out") + 1])
out.mkdir(parents=True)
if "--crash" in args:  # what hotloop.guards.cli does on an unexpected exception
    (out / "error.log").write_text("Traceback (most recent call last):\n  ...\nRuntimeError: stub crash\n")
    print(f"hotloop gate: internal error: RuntimeError: stub crash (full traceback in {out / 'error.log'})",
          file=sys.stderr)
    sys.exit(70)
if "--killed" in args:  # the OOM killer's SIGKILL, as a shell reports it
    sys.exit(137)
rows = [dict(id="no_stream_sync", criterion="no stream sync", metric="syncs, per step", limit="== 0", measured="3",
             status="measured", verdict="FAIL", why="stalls"),
        dict(id="no_hang", criterion="epoch 1 without hang", metric="m", limit="== yes", measured="yes",
             status="measured", verdict="PASS", why="w")]
with (out / "criteria.csv").open("w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
(out / "criteria.md").write_text("| criterion | verdict |\n|:--|:--|\n| no stream sync | FAIL |\n")
(out / "epochs.md").write_text("|   epoch |   learner_steps |\n|--:|--:|\n|   1 |   20 |\n")
(out / "baseline_compare.csv").write_text("metric,baseline,run,allowed,verdict\n"
                                          "learner_steps_per_s,1000,800,-50,FAIL\nkernels,12,12,0,PASS\n")
print("FAILED: no stream sync")
sys.exit(0 if "--lie" in args else 1)
"""

# More lines than a pipe holds (~2 MB): a reader that stops after the first line kills the stub with SIGPIPE every
# time, as a real nvidia-smi on a several-GPU machine is killed some of the time.
STUB_NVIDIA_SMI = """#!/usr/bin/env bash
case "$*" in
  *name,driver_version*) line="NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB" ;;
  *) line="NVIDIA H100 80GB HBM3" ;;
esac
for _ in $(seq 50000); do echo "$line"; done
"""


def _stub_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(STUB_NVIDIA_SMI)
    (bindir / "nvidia-smi").chmod(0o755)
    (tmp_path / "stub_hotloop.py").write_text(STUB_HOTLOOP)
    env = _env(
        HOTLOOP_DEVICE="cuda",
        HOTLOOP_RUN_DIR=str(tmp_path / "run"),
        HOTLOOP_CLI=f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'stub_hotloop.py'))}",
        HOTLOOP_PYTEST_ARGS=f"-p no:cacheprovider {_test_file(tmp_path, True)}",
        **extra,
    )
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_gate_sh_on_a_gpu_runner_passes_the_baseline_and_prints_fail_rows_last(tmp_path):
    step_summary = tmp_path / "step_summary.md"
    rc, out = _gate(_stub_env(tmp_path, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(step_summary)), timeout=120)
    assert rc == 1, "\n".join(out[-40:])
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--baseline") + 1] == "guards/baseline_files/nvidia-h100-80gb-hbm3.json"
    assert argv[argv.index("--device") + 1] == "cuda" and "--epochs" in argv
    assert out[-4:] == [
        "ci/gate.sh: FAIL (exit 1); the failing rows:",
        "--- criteria (verdict FAIL)",
        "  FAIL no stream sync [no_stream_sync]: measured 3, limit == 0",
        "  FAIL learner_steps_per_s: baseline=1000, run=800, allowed=-50  [baseline_compare.csv]",
    ], "\n".join(out[-12:])
    annotations = [i for i, line in enumerate(out) if line.startswith("::error title=criteria (verdict FAIL)::")]
    assert len(annotations) == 2 and annotations[-1] < len(out) - 4
    summary = step_summary.read_text()
    assert "| GPU | NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB |" in summary
    assert "baseline | guards/baseline_files/nvidia-h100-80gb-hbm3.json" in summary
    assert not any("does not exist" in line for line in out)  # the H100's cartpole baseline ships with hotloop


def test_gate_sh_takes_each_presets_own_baseline(tmp_path):
    """The seed-scale preset's baseline is <slug>--seed-scale.json, as hotloop.guards.baselines.baseline_path names
    it (the cartpole one, <slug>.json, in the test above); the workflow runs both presets."""
    _, out = _gate(_stub_env(tmp_path, HOTLOOP_PRESET="seed-scale"), timeout=120)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--baseline") + 1] == "guards/baseline_files/nvidia-h100-80gb-hbm3--seed-scale.json"
    # none recorded on an H100 for seed-scale yet: said before the gate runs
    assert any("baseline guards/baseline_files/nvidia-h100-80gb-hbm3--seed-scale.json does not exist" in x for x in out)
    assert argv[argv.index("--preset") + 1] == "seed-scale"
    assert '\'["cartpole", "seed-scale"]\'' in WORKFLOWS[0].read_text()


def test_gate_sh_never_passes_with_a_fail_row_even_if_the_gate_exits_0(tmp_path):
    rc, out = _gate(_stub_env(tmp_path, HOTLOOP_GATE_ARGS="--lie"), timeout=120)
    assert rc == 1 and out[-1].endswith("[baseline_compare.csv]"), "\n".join(out[-20:])
    assert not any(line.startswith("::error") for line in out)  # only under GitHub Actions


def test_gate_sh_stopped_by_the_runner_still_writes_the_summary(tmp_path):
    """A cancelled job (SIGTERM to the process group while the gate runs): exit 143, summary names the step."""
    env = _stub_env(tmp_path, HOTLOOP_GATE_ARGS="--sleep")
    proc = subprocess.Popen(
        ["bash", str(GATE)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    gate_log, deadline = tmp_path / "run" / "gate.log", time.monotonic() + 90
    while not (gate_log.is_file() and "stub gate running" in gate_log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, "the stub gate never started"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=60)[0].rstrip("\n").splitlines()
    assert proc.returncode == 143, "\n".join(out[-20:])
    assert out[-4] == "ci/gate.sh: FAIL (exit 143); the failing rows:", "\n".join(out[-20:])
    assert out[-3] == "--- gate interrupted (ci/gate.sh was stopped)"
    assert out[-2].startswith("  + hotloop gate --preset cartpole") and out[-1] == "  stub gate running"
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "| stopped early | ci/gate.sh stopped before its end (exit 143) |" in summary
    assert "| hotloop gate | - | interrupted |" in summary


def test_gate_sh_refuses_a_run_folder_that_is_not_empty(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "criteria.csv").write_text("stale\n")
    rc, out = _gate(_env(HOTLOOP_RUN_DIR=str(tmp_path / "run")), timeout=60)
    assert rc == 2 and "is not empty" in out[-1]


def test_gate_sh_reports_a_crashed_gate_as_a_crash_not_a_regression(tmp_path):
    """gate exit 70 (internal error) -> ci/gate.sh exit 5, "the gate crashed: internal error, see .../error.log";
    a gate killed by a signal -> 5 as well; neither is ever "a criterion or regression failed"."""
    rc, out = _gate(_stub_env(tmp_path, HOTLOOP_GATE_ARGS="--crash"), timeout=120)
    run = tmp_path / "run"
    assert rc == 5, "\n".join(out[-20:])
    assert f"ci/gate.sh: the gate crashed: internal error, see {run}/gate/error.log" in out
    assert out[-3:] == [
        "ci/gate.sh: FAIL (exit 5); the failing rows:",
        f"--- hotloop gate (exit 70): the gate crashed: internal error, see {run}/gate/error.log",
        f"  hotloop gate: internal error: RuntimeError: stub crash (full traceback in {run}/gate/error.log)",
    ], "\n".join(out[-12:])
    assert not any("a criterion or regression failed" in line for line in out)
    summary = (run / "summary.md").read_text()
    assert "## hotloop CI gate: FAIL (exit 5)" in summary and "| hotloop gate | 70 | the gate crashed" in summary


def test_gate_sh_reports_a_killed_gate_as_a_crash(tmp_path):
    rc, out = _gate(_stub_env(tmp_path, HOTLOOP_GATE_ARGS="--killed"), timeout=120)
    assert rc == 5, "\n".join(out[-20:])
    assert any(line.startswith("ci/gate.sh: the gate crashed: exit 137") for line in out)
    assert out[-2].startswith("--- hotloop gate (exit 137): the gate crashed: exit 137 (killed by a signal")
    assert not any("a criterion or regression failed" in line for line in out)


CRASHING_CLI = """
import sys

import hotloop.trainer.loop as loop
from hotloop.guards.cli import main


def crash(self, epoch):
    raise RuntimeError("injected crash in epoch %d" % epoch)


loop.Trainer.run_epoch = crash
sys.exit(main(sys.argv[1:]))
"""


def test_gate_sh_with_the_real_cli_crashing_points_at_its_error_log(tmp_path):
    """The real `hotloop gate`, its epoch raising: exit 70 with error.log in the gate's folder; ci/gate.sh exit 5."""
    run = tmp_path / "run"
    (tmp_path / "crashing_cli.py").write_text(CRASHING_CLI)
    rc, out = _gate(
        _env(
            HOTLOOP_RUN_DIR=str(run),
            HOTLOOP_GATE_ARGS=TINY_GATE,
            HOTLOOP_CLI=f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'crashing_cli.py'))}",
            HOTLOOP_PYTEST_ARGS=f"-p no:cacheprovider {_test_file(tmp_path, True)}",
        )
    )
    assert rc == 5, "\n".join(out[-40:])
    assert out[-2] == f"--- hotloop gate (exit 70): the gate crashed: internal error, see {run}/gate/error.log"
    assert out[-1].startswith("  hotloop gate: internal error: RuntimeError: injected crash in epoch 1 (raised at ")
    assert out[-1].endswith(f"in crash; full traceback in {run}/gate/error.log)")
    assert "RuntimeError: injected crash in epoch 1" in (run / "gate" / "error.log").read_text()
    assert not any("a criterion or regression failed" in line for line in out)


def test_gate_sh_documents_the_same_codes_as_ci_readme():
    """The codes table at the top of ci/gate.sh and the one in ci/README.md name the same codes."""
    header = GATE.read_text().split("set -euo pipefail")[0]
    codes = re.findall(r"^#   (\d+)  ", header.split("# Exit code")[1], re.M)
    readme = (REPO / "ci" / "README.md").read_text()
    table = re.findall(r"^\| (\d+) \| ", readme, re.M)
    assert codes == table == ["0", "1", "2", "3", "4", "5"]
    assert "the gate crashed: internal error, see <run>/gate/error.log" in header
    assert "the gate crashed: internal error, see `<run>/gate/error.log`" in readme
