"""guards/pytest_plugin.py: the markers' skip without CUDA (in a child pytest run), and `assert_criteria` /
`failing_rows` on a verdict table with an injected stream sync (a synthetic learner trace, so this runs on CPU)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from test_step_metrics import learner_trace

from hotloop.guards.guard import GuardReport, evaluate, guard_steps
from hotloop.guards.pytest_plugin import NO_CUDA_REASON, failing_rows
from hotloop.guards.step_metrics import step_metrics
from hotloop.guards.sync_hooks import SyncHooks

pytest_plugins = ["pytester"]


def _report(fault=None) -> GuardReport:
    metrics = step_metrics(learner_trace(fault=fault))
    hits = SyncHooks().frame()
    return GuardReport(evaluate(metrics, hits, cuda=True), metrics.per_step, metrics.medians, hits, metrics.gemms, True)


@pytest.mark.smoke
def test_assert_criteria_fails_naming_the_criterion_and_its_evidence(assert_criteria):
    assert_criteria(_report())  # the clean trace passes
    faulty = _report("stream sync")
    rows = failing_rows(faulty)
    assert (
        len(rows) == 1
        and rows[0].startswith("no stream sync [no_stream_sync]: measured")
        and "cudaStreamSynchronize" in rows[0]
    )
    with pytest.raises(pytest.fail.Exception, match="criteria failed:\nno stream sync \\[no_stream_sync\\]: measured"):
        assert_criteria(faulty)
    assert_criteria(faulty, only=["no_single_block_kernels"])  # only the named criteria are judged
    with pytest.raises(ValueError, match="not criteria ids of this report: \\['no such row'\\]"):
        failing_rows(faulty, only=["no such row"])
    with pytest.raises(ValueError, match="names no criterion"):
        failing_rows(faulty, only=[])
    assert failing_rows(faulty, only="no_stream_sync") == rows  # one id as a str
    # A named criterion this run could not measure fails too: it would otherwise pass having measured nothing.
    unmeasured = failing_rows(faulty, only=["no_hang", "no_single_block_kernels"])
    assert unmeasured == ["epoch 1 without hang [no_hang]: not measured here: hotloop.guards.watchdog.HangWatchdog"]


def test_guard_fixture_is_guard_steps(guard):
    assert guard is guard_steps


def test_the_plugin_is_a_pytest11_entry_point_and_inert_until_used():
    import subprocess
    import sys
    from importlib.metadata import entry_points

    found = [ep.value for ep in entry_points(group="pytest11") if ep.name == "hotloop"]
    assert found == ["hotloop.guards.pytest_plugin"]
    code = (
        "import sys, hotloop.guards.pytest_plugin; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('hotloop.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['hotloop.guards', 'hotloop.guards.pytest_plugin']"


def test_gpu_and_perf_tests_skip_with_the_reason_without_cuda(pytester):
    if torch.cuda.is_available():
        pytest.skip("checks the skip on a machine without CUDA")
    # no conftest: the installed pytest11 entry point loads the plugin, as in any project that installs hotloop
    pytester.makepyfile(
        textwrap.dedent("""
        import pytest

        @pytest.mark.gpu
        def test_g():
            raise AssertionError("must not run")

        @pytest.mark.perf
        def test_p(guard, assert_criteria):
            raise AssertionError("must not run")

        @pytest.mark.smoke
        def test_s():
            pass

        @pytest.mark.parametrize("device", ["cpu", "gpu"])  # "gpu" here is a keyword, not the marker: runs
        def test_unmarked(device):
            pass
    """)
    )
    result = pytester.runpytest("-rs", "--strict-markers")
    result.assert_outcomes(passed=3, skipped=2)
    result.stdout.fnmatch_lines([f"*{NO_CUDA_REASON}*"])
