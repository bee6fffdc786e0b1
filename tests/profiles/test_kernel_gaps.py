"""The kernel-gap table (profiles/kernel_gaps.py, issue 38) on hand-built Kineto traces with known gaps: exact idle
and same-stream gaps on two streams (the idle gap counts the other stream's kernels: a formula that ignored them
fails here), occupancy, the summary row, a step with another kernel sequence reported apart, damaged steps left
out; `hotloop inspect --gaps` prints the table and writes its CSV, and bad input exits 2 naming the input.

Timings are drawn afresh each run (a random seed, printed on failure through the test id's `seed`), so no
constant can pass for a computed value; every duration and gap is > 0."""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hotloop.guards.commands.inspect import add_parser as add_inspect_parser
from hotloop.guards.commands.inspect import run as run_inspect
from hotloop.profiles.kernel_gaps import (
    DEFAULT_SMS,
    GAP_COLUMNS,
    KERNEL_COLUMNS,
    SUMMARY_NAME,
    KernelGapError,
    gap_table,
    kernel_gap_table,
    sms_from_trace,
    step_kernels,
    summary_line,
)
from hotloop.profiles.kineto_reader import read_kineto

BASE = 1_790_857_026_000.0
"""A Kineto-like clock (us): far from 0, as real traces are (a float step of ~2.4e-4 us here: the layouts' design
gaps hold to 1e-3, the values computed from the written times exactly)."""
SEED = random.SystemRandom().randrange(2**32)
SMS = 132
# name, stream, grid: the sequence every "regular" step runs (stream 7 the main stream, 13 a side stream).
SEQUENCE = (
    ("gemm_a", 7, (64, 1, 1)),  # 64 programs: under one wave
    ("side_fwd", 13, (4, 2, 1)),  # 8 programs
    ("gemm_b", 7, (2, 96, 1)),  # 192 programs: 1.45 waves
    ("reduce", 7, (132, 1, 1)),  # exactly one wave: not under
    ("tail", 13, (1, 1, 1)),  # 1 program
)


def _step_layout(rng: np.random.Generator, t0: float) -> tuple[list[tuple[float, float]], dict]:
    """(start, dur) of SEQUENCE's five kernels from GPU time t0, and the gaps they were built with:
    k0 on stream 7; k1 on 13 starts inside k0 and ends after k2 (by `e`); k2 on 7 starts `g_s` after k0 ends (while
    k1 runs: no idle time); k3 on 7 starts `g_idle` after k1 ends (the GPU idle); k4 on 13 `g2` after k3 ends."""
    u = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
    d0, g_s, d2, e, d3, g_idle, g2, d4 = u(8, 20), u(1, 4), u(5, 15), u(1, 3), u(6, 12), u(2, 6), u(1, 5), u(1, 3)
    s0 = t0
    s1 = s0 + d0 * u(0.3, 0.7)
    s2 = (s0 + d0) + g_s
    end1 = (s2 + d2) + e
    d1 = end1 - s1
    s3 = (s1 + d1) + g_idle
    s4 = (s3 + d3) + g2
    kernels = [(s0, d0), (s1, d1), (s2, d2), (s3, d3), (s4, d4)]
    return kernels, {"g_s": g_s, "g_idle": g_idle, "g2": g2}


def _trace(
    path: Path, steps: list[list[tuple[str, int, tuple, float, float]]], range_name="ProfilerStep#{i}", gz=False
):
    """A Kineto JSON trace: per step a CPU range (user_annotation) on thread 1 holding one cudaLaunchKernel per
    kernel (correlation ids shared with the kernels), and the kernels on the GPU (pid 0, tid = stream), each
    (name, stream, grid, start, dur). Steps are 1000 us apart on the host clock."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ]
    corr = 100
    for i, kernels in enumerate(steps):
        cpu0 = BASE + 1000.0 * i
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": range_name.format(i=i),
                "pid": 1,
                "tid": 1,
                "ts": cpu0,
                "dur": 900.5,
            }
        )
        for j, (name, stream, grid, start, dur) in enumerate(kernels):
            corr += 1
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": cpu0 + 3.25 + 7.5 * j,
                    "dur": 4.75,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": name,
                    "pid": 0,
                    "tid": stream,
                    "ts": start,
                    "dur": dur,
                    "args": {
                        "correlation": corr,
                        "stream": stream,
                        "device": 0,
                        "grid": list(grid),
                        "block": [128, 1, 1],
                    },
                }
            )
    doc = {"deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": SMS}], "traceEvents": events}
    text = json.dumps(doc)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def _regular_steps(rng, n):
    """n steps of SEQUENCE with fresh timings; returns (steps for `_trace`, [(kernels, gaps)] per step)."""
    steps, layouts = [], []
    for i in range(n):
        kernels, gaps = _step_layout(rng, BASE + 1000.0 * i + 40.0 + float(rng.uniform(0, 5)))
        steps.append([(name, stream, grid, s, d) for (name, stream, grid), (s, d) in zip(SEQUENCE, kernels)])
        layouts.append((kernels, gaps))
    return steps, layouts


def _expected(kernels):
    """Per position: (idle gap, same-stream gap) by the definitions, written out from the layout."""
    end = [s + d for s, d in kernels]
    (s0, _), (s1, _), (s2, _), (s3, _), (s4, _) = kernels
    idle = [np.nan, max(0.0, s1 - end[0]), max(0.0, s2 - max(end[0], end[1])), s3 - max(end[:3]), s4 - max(end[:4])]
    stream = [np.nan, np.nan, s2 - end[0], s3 - end[2], s4 - end[1]]
    return idle, stream


@pytest.fixture
def rng():
    return np.random.default_rng(SEED)


def test_two_steps_on_two_streams_give_the_exact_gaps_occupancy_and_summary(tmp_path, rng):
    steps, layouts = _regular_steps(rng, 2)
    df = read_kineto(_trace(tmp_path / "t.json", steps))
    kernels = step_kernels(df, sms=SMS)
    assert list(kernels.columns) == list(KERNEL_COLUMNS) and len(kernels) == 10, f"seed {SEED}"
    for i, (layout, gaps) in enumerate(layouts):
        rows = kernels[kernels["step"].eq(i)]
        idle, stream = _expected(layout)
        assert list(rows["position"]) == [0, 1, 2, 3, 4]
        np.testing.assert_allclose(rows["idle_gap_us"], idle, rtol=0, atol=1e-9, err_msg=f"seed {SEED}")
        np.testing.assert_allclose(rows["stream_gap_us"], stream, rtol=0, atol=1e-9, err_msg=f"seed {SEED}")
        # the layout's own numbers: k1 and k2 start while another kernel runs, k3 and k4 after idle time
        assert rows["idle_gap_us"].iloc[1] == 0 and rows["idle_gap_us"].iloc[2] == 0
        assert rows["idle_gap_us"].iloc[3] == pytest.approx(gaps["g_idle"], abs=1e-3)
        assert rows["idle_gap_us"].iloc[4] == pytest.approx(gaps["g2"], abs=1e-3)
        assert rows["stream_gap_us"].iloc[2] == pytest.approx(gaps["g_s"], abs=1e-3)
        assert rows["stream_gap_us"].iloc[3] > rows["idle_gap_us"].iloc[3]  # k1 covered part of stream 7's gap
    table = gap_table(kernels, sms=SMS)
    assert list(table.columns) == list(GAP_COLUMNS) and len(table) == 6 and table.attrs["steps"] == 2
    per_pos, total = table.iloc[:5], table.iloc[5]
    assert list(per_pos["name"]) == [n for n, _, _ in SEQUENCE] and list(per_pos["stream"]) == [7, 13, 7, 7, 13]
    assert list(per_pos["programs"]) == [64, 8, 192, 132, 1]
    np.testing.assert_allclose(per_pos["occupancy"], [64 / 132, 8 / 132, 192 / 132, 1.0, 1 / 132])
    assert list(per_pos["under_one_wave"]) == [1, 1, 0, 0, 1]
    expected = [_expected(layout) for layout, _ in layouts]
    np.testing.assert_allclose(  # the median of two steps is their mean
        per_pos["idle_gap_us"], np.mean([e[0] for e in expected], axis=0), atol=1e-9, err_msg=f"seed {SEED}"
    )
    np.testing.assert_allclose(per_pos["stream_gap_us"], np.mean([e[1] for e in expected], axis=0), atol=1e-9)
    np.testing.assert_allclose(per_pos["dur_us"], np.mean([[d for _, d in k] for k, _ in layouts], axis=0))
    assert total["name"] == SUMMARY_NAME and pd.isna(total["position"]) and total["under_one_wave"] == 3
    spans = [max(s + d for s, d in k) - k[0][0] for k, _ in layouts]
    busy = [sum(d for _, d in k) for k, _ in layouts]
    idles = [g["g_idle"] + g["g2"] for _, g in layouts]
    assert total["span_us"] == pytest.approx(np.mean(spans), abs=1e-6)
    assert total["dur_us"] == pytest.approx(np.mean(busy), abs=1e-6)
    assert total["idle_gap_us"] == pytest.approx(np.mean(idles), abs=1e-3), f"seed {SEED}"
    line = summary_line(table)
    assert line.startswith("5 kernels/step, idle ") and "3 kernels under one wave (< 132 SMs)" in line


def test_the_idle_gap_sums_to_the_span_less_the_busy_union(tmp_path, rng):
    """Whatever the layout (random kernels on three streams, overlapping freely), a step's idle gaps add up to
    its span minus the union of its kernel intervals: the time no kernel ran."""
    kernels, t = [], BASE + 50.0
    for j in range(12):
        t += float(rng.uniform(-6, 8))
        kernels.append(
            (f"k{j}", int(rng.choice([7, 13, 21])), (int(rng.integers(1, 300)), 1, 1), t, float(rng.uniform(0.5, 9)))
        )
    df = read_kineto(_trace(tmp_path / "t.json", [sorted(kernels, key=lambda k: k[3])]))
    rows = step_kernels(df)
    intervals = sorted((s, s + d) for *_, s, d in kernels)
    union, (lo, hi) = 0.0, intervals[0]
    for s, e in intervals[1:]:
        if s > hi:
            union, lo, hi = union + hi - lo, s, e
        else:
            hi = max(hi, e)
    union += hi - lo
    span = max(e for _, e in intervals) - intervals[0][0]
    assert rows["idle_gap_us"].sum() == pytest.approx(span - union, abs=1e-6), f"seed {SEED}"
    table = gap_table(rows)
    assert table.iloc[-1]["idle_gap_us"] == pytest.approx(span - union, abs=1e-6)


def test_an_idle_gap_that_ignored_the_other_stream_would_differ(tmp_path, rng):
    """The same-stream gap alone (or the gap to the previous kernel in start order) is not the idle time: here
    stream 13's kernel covers all of stream 7's gap, so the GPU was never idle between k0 and k2."""
    d0, gap, d2 = (float(rng.uniform(3, 9)) for _ in range(3))
    s0 = BASE + 40.0
    s1 = s0 + d0 / 2
    s2 = s0 + d0 + gap
    d1 = (s2 + d2 / 2) - s1  # k1 runs from the middle of k0 to the middle of k2
    steps = [[("k0", 7, (8, 1, 1), s0, d0), ("k1", 13, (8, 1, 1), s1, d1), ("k2", 7, (8, 1, 1), s2, d2)]]
    rows = step_kernels(read_kineto(_trace(tmp_path / "t.json", steps)))
    assert list(rows["idle_gap_us"].fillna(-1)) == [-1, 0.0, 0.0]
    assert rows["stream_gap_us"].iloc[2] == pytest.approx(gap, abs=1e-3) and gap > 0


def test_a_step_with_another_kernel_sequence_is_reported_apart(tmp_path, rng):
    steps, layouts = _regular_steps(rng, 4)
    odd = steps[2]
    steps[2] = [odd[0], odd[1], ("gemm_b_split", 7, (2, 48, 1), *odd[2][3:]), odd[3], odd[4]]
    df = read_kineto(_trace(tmp_path / "t.json", steps))
    table = kernel_gap_table(df, sms=SMS)
    assert table.attrs["sequences"] == 2 and table.attrs["steps"] == 4
    main, other = table[table["sequence"].eq(0)], table[table["sequence"].eq(1)]
    assert (main["steps"] == 3).all() and (main["first_step"] == 0).all() and len(main) == 6
    assert (other["steps"] == 1).all() and (other["first_step"] == 2).all()
    assert "gemm_b_split" not in set(main["name"]) and other.iloc[2]["name"] == "gemm_b_split"
    assert other.iloc[2]["programs"] == 96 and other.iloc[-1]["under_one_wave"] == 4
    idle3 = [_expected(layouts[i][0])[0][3] for i in (0, 1, 3)]  # the odd step is in no median of sequence 0
    assert main.iloc[3]["idle_gap_us"] == pytest.approx(np.median(idle3), abs=1e-9), f"seed {SEED}"
    assert "1 other kernel sequence(s) in 3 of 4 steps" in summary_line(table)


def test_a_damaged_step_is_left_out_and_named(tmp_path, rng):
    steps, _ = _regular_steps(rng, 3)
    name, stream, grid, start, _ = steps[1][3]
    steps[1][3] = (name, stream, grid, start, 0)  # a kernel of dur 0: an unset end (trace_anomalies)
    table = kernel_gap_table(read_kineto(_trace(tmp_path / "t.json", steps)))
    assert table.attrs["steps"] == 2 and list(table.attrs["damaged_steps"]) == [1]
    assert (table["steps"] == 2).all() and table.attrs["sequences"] == 1
    assert "1 damaged step(s) left out" in summary_line(table)


def test_step_range_by_name_and_kernels_outside_steps(tmp_path, rng):
    steps, _ = _regular_steps(rng, 2)
    path = _trace(tmp_path / "t.json", steps, range_name="bench_step")
    df = read_kineto(path)
    assert kernel_gap_table(df, "bench_step").attrs["steps"] == 2
    with pytest.raises(KernelGapError, match="no step ranges named 'step' nor ProfilerStep#N") as err:
        kernel_gap_table(df, "step")
    assert "the trace's ranges, most frequent first: 'bench_step' x2" in str(err.value)  # what to pass instead
    with pytest.raises(KernelGapError, match="no step ranges named 'nosuch'"):
        kernel_gap_table(read_kineto(_trace(tmp_path / "p.json", steps)), "nosuch", fallback=False)
    assert kernel_gap_table(read_kineto(_trace(tmp_path / "p.json", steps)), "nosuch").attrs["steps"] == 2


def test_bad_inputs_are_kernel_gap_errors(tmp_path):
    cpu_only = tmp_path / "cpu.json"
    cpu_only.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": BASE, "dur": 3.5}
                ]
            }
        )
    )
    with pytest.raises(KernelGapError, match="no kernels in the trace"):
        step_kernels(read_kineto(cpu_only))
    with pytest.raises(ValueError, match="sms must be an int >= 1"):
        step_kernels(read_kineto(cpu_only), sms=0)


def test_sms_come_from_the_trace_header(tmp_path, rng):
    steps, _ = _regular_steps(rng, 1)
    assert sms_from_trace(_trace(tmp_path / "t.json.gz", steps, gz=True)) == SMS
    plain = tmp_path / "none.json"
    plain.write_text('{"traceEvents": []}')
    assert sms_from_trace(plain) is None and sms_from_trace(tmp_path / "missing.json") is None


def inspect(*argv):
    parser = argparse.ArgumentParser(prog="hotloop")
    add_inspect_parser(parser.add_subparsers(dest="command", required=True))
    return run_inspect(parser.parse_args(["inspect", *argv]))


def test_cli_prints_the_table_and_writes_the_csv(tmp_path, rng, capsys):
    steps, layouts = _regular_steps(rng, 3)
    trace = str(_trace(tmp_path / "t.json.gz", steps, gz=True))
    csv = tmp_path / "gaps.csv"
    assert inspect("--gaps", "--csv", str(csv), trace) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert f"== kernel gaps of {trace}: 3 steps, 1 kernel sequence(s), occupancy = programs / 132 SMs" in out
    assert "sequence 0: 3 step(s) (first step 0), 5 kernels" in out and "gemm_b" in out and "idle_gap_us" in out
    assert f"kernel-gap table written to {csv}" in out and captured.err == ""
    written = pd.read_csv(csv)
    assert list(written.columns) == list(GAP_COLUMNS) and len(written) == 6
    assert written["programs"].iloc[:5].tolist() == [64, 8, 192, 132, 1]
    idle3 = np.median([_expected(k)[0][3] for k, _ in layouts])
    assert written["idle_gap_us"].iloc[3] == pytest.approx(idle3, abs=1e-6), f"seed {SEED}"
    assert inspect("--gaps", "--sms", "66", trace) == 0
    assert "occupancy = programs / 66 SMs" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case,problem",
    [
        ("missing", "cannot read: No such file"),
        ("cpu_only", "no kernels in the trace"),
        ("no_range", "no step ranges named 'nosuch'"),
        ("not_json", "does not start with '{'"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_input(tmp_path, rng, capsys, case, problem):
    steps, _ = _regular_steps(rng, 1)
    path = tmp_path / f"{case}.json"
    argv = ["--gaps"]
    if case == "cpu_only":
        path.write_text(
            json.dumps(
                {
                    "traceEvents": [
                        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": BASE, "dur": 3.5}
                    ]
                }
            )
        )
    elif case == "no_range":
        _trace(path, steps)
        argv += ["--step-range", "nosuch"]
    elif case == "not_json":
        path.write_text("this is not a trace")
    captured_code = inspect(*argv, str(path))
    captured = capsys.readouterr()
    assert captured_code == 2 and captured.out == ""
    assert captured.err.startswith(f"hotloop inspect: error: {path}: ") and problem in captured.err, captured.err


def test_cli_gaps_reads_one_trace(tmp_path, rng, capsys):
    steps, _ = _regular_steps(rng, 1)
    a, b = _trace(tmp_path / "a.json", steps), _trace(tmp_path / "b.json", steps)
    assert inspect("--gaps", str(a), str(b)) == 2
    assert "--gaps reads one trace" in capsys.readouterr().err
    assert inspect("--csv", str(tmp_path / "x.csv"), str(a)) == 2
    assert "--csv and --sms need --gaps" in capsys.readouterr().err
    assert inspect("--sms", "100", str(a)) == 2
    assert "--csv and --sms need --gaps" in capsys.readouterr().err
    assert inspect("--gaps", "--json", str(a)) == 2
    assert "not --json" in capsys.readouterr().err
    assert inspect("--gaps", "--sms", "0", str(a)) == 2
    assert "--sms must be >= 1" in capsys.readouterr().err
    assert DEFAULT_SMS == 132


SEED_SCALE = Path(__file__).parents[1] / "data" / "nsys_seed_scale"


def test_the_seed_scale_learner_step_reads_alike_from_kineto_and_nsight():
    """The H200 recordings of one seed-scale configuration (tests/data/nsys_seed_scale/README.md): the gate's
    Kineto trace of 20 guarded steps and the Nsight export of 100 `update` ranges give one kernel sequence of the
    same 24 kernels (streams, programs; the tools demangle names apart, so the names are compared up to their
    template arguments), the same 6 kernels under one wave, and per-step spans and idle times that agree."""
    from hotloop.profiles.inspect_cmd import read_trace

    kineto = kernel_gap_table(read_trace(SEED_SCALE / "kineto_trace.json.gz"), "guard_step", fallback=False)
    nsight = kernel_gap_table(read_trace(SEED_SCALE / "report.sqlite"), "update", fallback=False)
    assert (kineto.attrs["steps"], nsight.attrs["steps"]) == (20, 100)
    assert kineto.attrs["sequences"] == nsight.attrs["sequences"] == 1 and len(kineto) == len(nsight) == 25
    base = lambda t: t["name"].str.replace(r"^void ", "", regex=True).str.split("<").str[0]  # noqa: E731
    assert base(kineto).tolist() == base(nsight).tolist()
    for col in ("stream", "programs", "under_one_wave"):
        assert kineto[col].fillna(-1).tolist() == nsight[col].fillna(-1).tolist(), col
    k, n = kineto.iloc[-1], nsight.iloc[-1]
    assert k["under_one_wave"] == 6 and k["span_us"] == pytest.approx(n["span_us"], rel=0.02)
    assert 0 < k["idle_gap_us"] < 5 and 0 < n["idle_gap_us"] < 5  # a graph replay: ~2 us idle per ~670 us step
    assert k["dur_us"] > k["span_us"]  # the online and Double-DQN forwards overlap on two streams


def test_a_trace_without_grids_has_no_occupancy(tmp_path, rng):
    steps, _ = _regular_steps(rng, 2)
    path = _trace(tmp_path / "t.json", steps)
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        e.get("args", {}).pop("grid", None)
    path.write_text(json.dumps(doc))
    table = kernel_gap_table(read_kineto(path))
    kernels = table[table["position"].notna()]
    assert kernels["programs"].isna().all() and kernels["occupancy"].isna().all()
    assert kernels["under_one_wave"].isna().all() and table.iloc[-1]["under_one_wave"] == 0
    assert table.attrs["sequences"] == 1 and kernels["idle_gap_us"].iloc[1:].notna().all()


def test_sm_count_of_a_cpu_device_on_a_machine_with_a_gpu(monkeypatch):
    """A CPU run's gap table on a GPU machine uses DEFAULT_SMS: the GPU's properties are never asked for a CPU device."""
    import torch

    from hotloop.profiles.kernel_gaps import DEFAULT_SMS, sm_count

    def no_properties(device=None):
        raise AssertionError(f"asked the GPU properties of {device}")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_properties)
    assert sm_count(torch.device("cpu")) == DEFAULT_SMS and sm_count("cpu") == DEFAULT_SMS
