"""Timing confirmation in the gate's check (hotloop.guards.gate.CONFIRM_WINDOWS): a timing of the guarded window that
fails the baseline is re-measured in up to two more windows and judged by the best one; a transient stall of one
window passes, a slowdown of every window fails; counts are not re-judged by best-of."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from hotloop.guards.baselines import load_baseline, write_baseline
from hotloop.guards.gate import CONFIRM_WINDOWS, _baseline_step, confirm_timings, failing_timings


def _window(span_us: float, kernels: float = 24.0) -> SimpleNamespace:
    """A guarded window's report as the comparison reads it: per-step medians (and no timing note)."""
    return SimpleNamespace(medians={"gpu_span_us": span_us, "gpu_busy_us": 95.0, "kernels": kernels},
                           timing_note="", window={}, per_step=pd.DataFrame({"anomaly": [""] * 3}))


def _baseline(tmp_path):
    spans = [99.0, 100.0, 101.0, 100.5, 99.5]  # MAD ~0.7 us: the +5% rule decides (105 us)
    path = write_baseline(tmp_path / "b.json", {"gpu_span_us": spans, "gpu_busy_us": [95.0] * 5,
                                                "kernels": [24.0] * 5}, gpu="NVIDIA H100 80GB HBM3")
    return path, load_baseline(path)


def test_a_window_that_stalled_once_is_confirmed_by_the_next_and_passes(tmp_path, capsys):
    """The H100 clean gate of 2026-12-05: gpu_span_us 124.5 us vs 99.95 us, gpu_busy_us unchanged (the host
    stalled, not the GPU); the next window measures the step as the baseline did."""
    path, loaded = _baseline(tmp_path)
    first = [_window(124.5)]
    assert failing_timings(first, loaded) == ["gpu_span_us"]
    later = iter([_window(100.2), _window(100.1)])
    confirmations = confirm_timings(first, loaded, lambda: next(later))
    assert len(confirmations) == 1 and "timing confirmation 1/2: gpu_span_us" in capsys.readouterr().out
    table = _baseline_step(first, path, False, tmp_path, {}, _epochs_none(), confirmations)
    assert table.empty  # nothing fails: gpu_span_us judged by its best window
    row = _read(tmp_path).loc["gpu_span_us"]
    assert row.run == 100.2 and row.verdict == "PASS" and row.rule.endswith("; run: best of 2")


def test_a_regression_fails_every_confirmation_and_the_gate(tmp_path, capsys):
    """A slower step (e.g. a sleep in it: every window) fails all CONFIRM_WINDOWS + 1 windows."""
    path, loaded = _baseline(tmp_path)
    first = [_window(124.5)]
    confirmations = confirm_timings(first, loaded, lambda: _window(123.0))
    assert len(confirmations) == CONFIRM_WINDOWS
    failed = _baseline_step(first, path, False, tmp_path, {}, _epochs_none(), confirmations)
    assert failed["metric"].tolist() == ["gpu_span_us"] and failed["run"].tolist() == [123.0]


def test_no_confirmation_without_a_failing_timing_and_counts_are_never_best_of(tmp_path):
    path, loaded = _baseline(tmp_path)
    assert confirm_timings([_window(101.0)], loaded, lambda: 1 / 0) == []  # measure is never called
    # a count that moved fails whatever the windows' timings: no confirmation is asked for a count, and a later
    # window with the baseline's count does not hide the first
    assert failing_timings([_window(101.0, kernels=25.0)], loaded) == []
    failed = _baseline_step([_window(101.0, kernels=25.0)], path, False, tmp_path, {}, _epochs_none(),
                            [_window(101.0)])
    assert failed["metric"].tolist() == ["kernels"]


def _epochs_none():
    """A per-epoch table of one epoch: its epoch rows are "-" (not steady), so only the window's rows judge."""
    return pd.DataFrame({"epoch": [1], "learner_steps": [1000], "wall_s": [0.1], "learner_steps_per_s": [1e4]})


def _read(run_dir):
    return pd.read_csv(run_dir / "baseline.csv").set_index("metric")
