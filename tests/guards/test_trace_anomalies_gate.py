"""Damaged trace events (issue 22 item 5) through the verdicts and the gate's baseline comparison: a step holding
a trace anomaly keeps its counts but its timing is left out of the criteria medians and of the baseline comparison,
and the criteria evidence, guard.json and the gate's baseline table say so. Synthetic traces on real-looking clocks
(~1.6e15 us, where one kernel of ts 0 makes a span of 1.6e15 us)."""

import json

import pandas as pd
import pytest
from test_step_metrics import TF32_H200, TF32_SM90, TraceBuilder

from hotloop.guards.baselines import KERNEL_US_PREFIX, load_baseline, write_baseline
from hotloop.guards.gate import _baseline_step
from hotloop.guards.guard import GuardReport, evaluate
from hotloop.guards.step_metrics import step_metrics
from hotloop.guards.sync_hooks import SyncHooks

EPOCHS = pd.DataFrame({"epoch": [1, 2], "learner_steps_per_s": [900.0, 1000.0], "gpu_ms_per_step": [1.1, 1.0]})
"""A two-epoch table: the baseline files here hold no epoch metrics, so its rows are reported, not compared."""

CLOCK = 1.6e15
NO_HITS = SyncHooks().frame()


def overlap_trace(serial_steps=(), damaged_steps=(), steps=2):
    """`steps` learner-like steps on the H200's clock: an online forward on stream 7 and a DDQN forward on stream 9
    overlapping it by 15 of its 20 us (ratio 0.75), or run after it in `serial_steps` (ratio 0); in
    `damaged_steps` one more kernel launched with Kineto's unset times (ts 0, dur 0)."""
    b = TraceBuilder()
    b.t = CLOCK - 100.0
    for k in range(steps):
        g = CLOCK + 1000.0 * k
        with b.step():
            b.gpu(TF32_H200, g + 20, 20, phase="forward")
            b.gpu(TF32_SM90, g + (40 if k in serial_steps else 25), 20, stream=9, phase="ddqn_forward")
            if k in damaged_steps:
                b.gpu("void at::native::vectorized_elementwise_kernel<4>", 0.0, 0.0)
    return b.frame()


def report(frame) -> GuardReport:
    m = step_metrics(frame)
    return GuardReport(
        evaluate(m, NO_HITS, cuda=True), m.per_step, m.medians, NO_HITS, m.gemms, True, m.anomalies, m.timing_note
    )


def test_the_overlap_criterion_is_judged_on_the_undamaged_steps_and_says_so():
    verdicts = evaluate(step_metrics(overlap_trace(serial_steps={1}, damaged_steps={1})), NO_HITS, cuda=True)
    row = verdicts.set_index("id").loc["ddqn_overlapped"]
    assert row["measured"] == 0.75  # step 1 (ratio 0, damaged) left out; with it the median would be 0.375
    assert row["evidence"].endswith("timing of step 1 left out: kernel with ts 0, dur 0 (step 1)")


def test_every_step_damaged_leaves_the_overlap_not_measured():
    verdicts = evaluate(step_metrics(overlap_trace(damaged_steps={0, 1})), NO_HITS, cuda=True).set_index("id")
    row = verdicts.loc["ddqn_overlapped"]
    assert row["verdict"] == "-" and row["status"].startswith("not measured (timing of every step left out")


def test_guard_json_carries_the_anomalies_and_the_timing_note(tmp_path):
    doc = json.loads(report(overlap_trace(damaged_steps={1})).to_json(tmp_path / "guard.json").read_text())
    assert doc["anomalies"]["counts"]["ts_not_positive"] == 1
    assert doc["timing_note"] == "timing of step 1 left out: kernel with ts 0, dur 0 (step 1)"
    assert [s["anomaly"] for s in doc["per_step"]] == ["", "kernel with ts 0, dur 0"]


def test_a_ts0_kernel_is_no_regression_against_the_baseline_and_the_table_says_why(tmp_path, capsys):
    """Before: the damaged step's gpu_span_us (1.6e15 us) entered the median (8e14 us), a FAIL against any
    baseline. Now the comparison uses the undamaged steps and the table's note names the left-out step."""
    clean = report(overlap_trace(steps=3))
    base = write_baseline(tmp_path / "cpu.json", {m: [v] for m, v in clean.medians.items()})
    damaged = report(overlap_trace(steps=3, damaged_steps={1}))
    assert damaged.medians["gpu_span_us"] == clean.medians["gpu_span_us"] == 25.0  # 20..45 us of each step
    assert damaged.medians["gpu_busy_us"] == clean.medians["gpu_busy_us"]
    failing = _baseline_step([damaged], base, False, tmp_path, {}, EPOCHS)
    table = pd.read_csv(tmp_path / "baseline.csv", keep_default_na=False).set_index("metric")
    busy = clean.medians["gpu_busy_us"]
    assert table.loc["gpu_busy_us", "verdict"] == "PASS" and float(table.loc["gpu_busy_us", "run"]) == busy
    note = "repeat 1: timing of step 1 left out: kernel with ts 0, dur 0 (step 1)"
    assert table.loc["gpu_busy_us", "note"] == note and table.loc["kernels", "note"] == ""
    assert f"\nnote: {note}" in capsys.readouterr().out
    assert failing.empty
    assert list(damaged.per_step["kernels"]) == [2, 3, 2]  # the counts still count every event with a meaning


def test_no_timing_at_all_is_not_compared_rather_than_failed(tmp_path):
    clean = report(overlap_trace())
    base = write_baseline(tmp_path / "cpu.json", {m: [v] for m, v in clean.medians.items()})
    broken = report(overlap_trace(damaged_steps={0, 1}))
    assert pd.isna(broken.medians["gpu_span_us"])
    _baseline_step([broken], base, False, tmp_path, {}, EPOCHS)
    table = pd.read_csv(tmp_path / "baseline.csv", keep_default_na=False).set_index("metric")
    timing = [m for m in load_baseline(base).metrics if m.endswith("_us") and m not in ("ddqn_overlap_us",)]
    assert set(table.loc[timing, "verdict"]) == {"-"}
    assert table.loc["gpu_span_us", "rule"].startswith("not compared: the timing of every guarded step was left out")
    assert table.loc["gpu_span_us", "note"].startswith("repeat 1: timing of every step (2) left out")


@pytest.mark.parametrize("repeats", [1, 2])
def test_a_clean_run_has_an_empty_note_column(tmp_path, repeats):
    clean = report(overlap_trace())
    base = write_baseline(tmp_path / "cpu.json", {m: [v] for m, v in clean.medians.items()})
    assert _baseline_step([clean] * repeats, base, False, tmp_path, {}, EPOCHS).empty
    table = pd.read_csv(tmp_path / "baseline.csv", keep_default_na=False)
    assert set(table["note"]) == {""} and set(table["verdict"]) <= {"PASS", "-"}


def test_a_repeat_with_every_step_damaged_does_not_drop_the_other_repeats_kernel_timings(tmp_path):
    """The per-kernel timings exist only where some step was undamaged: the metrics compared are the union over the
    repeats, so repeat 1 (all damaged, no kernel_us keys) does not make repeat 2's kernel rows "missing from run"."""
    clean = report(overlap_trace())
    base = write_baseline(tmp_path / "cpu.json", {m: [v] for m, v in clean.medians.items()})
    broken = report(overlap_trace(damaged_steps={0, 1}))
    kernel_rows = [m for m in clean.medians if m.startswith(KERNEL_US_PREFIX)]
    assert kernel_rows and not any(m.startswith(KERNEL_US_PREFIX) for m in broken.medians)
    failing = _baseline_step([broken, clean], base, False, tmp_path, {}, EPOCHS)
    table = pd.read_csv(tmp_path / "baseline.csv", keep_default_na=False).set_index("metric")
    assert set(table.loc[kernel_rows, "verdict"]) == {"PASS"}, table.loc[kernel_rows]
    assert list(failing["metric"]) == ["kernels"]  # the damaged repeat's extra (ts 0) kernel, counted as it should
