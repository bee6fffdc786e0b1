"""Per-step guard metrics: exact counts on the real traces of tests/data/traces (the H200 probe: phases, TF32/FP32
GEMMs, D2D copy, zero_, grid (1,1,1) reduce, graph replay with memcpy128, two overlapping streams), hand-built
traces for what the real ones lack, and the GEMM-precision name rules.

`TraceBuilder` and `learner_trace` are imported by test_guard.py (same folder, pytest's rootdir sys.path entry)."""

import contextlib
import functools
from pathlib import Path

import pandas as pd
import pytest

from hotloop.guards.baselines import KERNEL_US_PREFIX, is_count
from hotloop.guards.step_metrics import (
    FP32,
    GEMM,
    HIT_MARK,
    NO_PHASE,
    OUTSIDE_LABEL,
    TF32,
    WINDOW_RANGE,
    PhaseRoles,
    event_phases,
    gemm_precision,
    kernel_phases,
    kernel_times,
    phase_coverage,
    step_metrics,
)
from hotloop.profiles.kineto_reader import read_kineto
from hotloop.profiles.nsight_reader import read_nsight_sqlite
from hotloop.profiles.trace_schema import event_frame

TRACES = Path(__file__).parents[1] / "data" / "traces"
PROBE = TRACES / "h200" / "probe_eager_graph_twostream.json.gz"
TF32_H200 = (
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>"
    "(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)"
)
FP32_H200 = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_"
    "execute_kernel__5x_cublas"
)


@functools.cache
def _read(path: Path) -> pd.DataFrame:
    return read_nsight_sqlite(path) if path.suffix == ".sqlite" else read_kineto(path)


def trace(path: Path) -> pd.DataFrame:
    return _read(path).copy()


class TraceBuilder:
    """Hand-built traces in the trace schema: CPU step ranges, CUDA calls (1 us apart on thread "1", from 1 us: a
    timestamp <= 0 is a trace anomaly), and GPU activity linked to its call by correlation id, optionally inside a
    gpu_user_annotation phase range."""

    def __init__(self):
        self.rows, self.t, self.corr = [], 1.0, 0

    @contextlib.contextmanager
    def step(self, name="step"):
        """A CPU-side range (user_annotation, thread "1") named `name` around what the block adds: a step range, a
        phase range (record_function / NVTX: `b.step("env_step")`) or the guarded window's (WINDOW_RANGE)."""
        start = self.t
        self.t += 1
        yield
        self.rows.append(dict(name=name, kind="user_annotation", start_us=start, dur_us=self.t - start, tid="1"))
        self.t += 1

    def call(self, name, kind="runtime"):
        self.corr += 1
        self.rows.append(dict(name=name, kind=kind, start_us=self.t, dur_us=0.5, correlation=self.corr, tid="1"))
        self.t += 1
        return self.corr

    def gpu(
        self,
        name,
        start,
        dur=10.0,
        kind="kernel",
        stream=7,
        phase=None,
        grid=(64, 1, 1),
        launch="cudaLaunchKernel",
        copy_kind="",
    ):
        corr = self.call(launch)
        dims = dict(zip(("grid_x", "grid_y", "grid_z"), grid)) if kind == "kernel" else {}
        self.rows.append(
            dict(
                name=name,
                kind=kind,
                start_us=start,
                dur_us=dur,
                stream=stream,
                device=0,
                correlation=corr,
                pid="0",
                tid=str(stream),
                copy_kind=copy_kind,
                **dims,
            )
        )
        if phase:
            self.rows.append(dict(name=phase, kind="annotation", start_us=start, dur_us=dur, pid="0", tid=str(stream)))
        return corr

    def frame(self):
        cols = {c: [r.get(c) for r in self.rows] for c in {k for r in self.rows for k in r}}
        for c in ("copy_kind", "pid", "name"):
            cols[c] = [v or "" for v in cols.get(c, [None] * len(self.rows))]
        return event_frame(cols)


SGEMM = "ampere_sgemm_128x64_nn"
TF32_SM90 = (
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_"
    "kernel__5x_cublas"
)


def learner_trace(steps=3, fault=None):
    """A clean synthetic learner step (online forward TF32 on stream 7, DDQN forward TF32 on stream 9 overlapping
    it, FP32 backward, one fused spectral-norm kernel, one zero_ fill), or the same with one `fault` injected."""
    b = TraceBuilder()
    for k in range(steps):
        g = 1000.0 * (k + 1)
        with b.step():
            b.gpu("spectral_norm_fused_kernel", g, phase="spectral_norm")
            if fault == "spectral norm split":
                b.gpu("spectral_norm_fused_kernel", g + 10, phase="spectral_norm")
            b.gpu(SGEMM if fault == "forward FP32" else TF32_H200, g + 20, 20, phase="forward")
            serial = fault == "DDQN serialized"
            b.gpu(TF32_SM90, g + (40 if serial else 25), 20, stream=7 if serial else 9, phase="ddqn_forward")
            b.gpu(TF32_H200 if fault == "backward TF32" else FP32_H200, g + 60, 30, phase="backward")
            b.gpu("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >", g + 95, 1)
            if fault == "stream sync":
                b.call("cudaStreamSynchronize")
            if fault == "event sync":
                b.call("cudaEventSynchronize")
            if fault == "device sync (driver)":
                b.call("cuCtxSynchronize", kind="driver")
            if fault == "blocking cudaMemcpy":
                b.gpu("Memcpy DtoH (Device -> Pinned)", g + 100, 1, "memcpy", launch="cudaMemcpy", copy_kind="DtoH")
            if fault == "pageable non_blocking copy":
                b.gpu(
                    "Memcpy DtoH (Device -> Pageable)", g + 100, 1, "memcpy", launch="cudaMemcpyAsync", copy_kind="DtoH"
                )
            if fault == "D2D copy":
                b.gpu(
                    "Memcpy DtoD (Device -> Device)", g + 100, 1, "memcpy", launch="cudaMemcpyAsync", copy_kind="DtoD"
                )
            if fault == "D2D copy in a graph":
                b.gpu("memcpy128", g + 100, 1, launch="cudaGraphLaunch")
            if fault == "grid (1,1,1) kernel":
                b.gpu("reduce_kernel", g + 100, 1, grid=(1, 1, 1))
            if fault == "memset":
                b.gpu("Memset (Device)", g + 100, 1, "memset", launch="cudaMemsetAsync")
    return b.frame()


ROLES_PROBE = PhaseRoles(
    forward=("phase_tf32_mm",),
    backward=("phase_fp32_mm",),
    spectral_norm="phase_triton",
    online_forward="stream_a",
    ddqn_forward="stream_b",
)
PROBE_STREAMS = {(lambda d: d["stream"].eq(25)): "stream_a", (lambda d: d["stream"].eq(29)): "stream_b"}


def test_h200_probe_whole_trace_counts_are_exact():
    m = step_metrics(trace(PROBE), step_range_name=None, roles=ROLES_PROBE, phases=PROBE_STREAMS)
    row = m.per_step.iloc[0]
    assert len(m.per_step) == 1 and row["range_name"] == "trace"
    # 17 kernel events, one of them the graph's memcpy128 copy node: a copy (d2d_copies), not a kernel
    expected = dict(
        kernels=16,
        kernels_grid1=2,
        d2d_copies=2,
        memcpy_dtod_events=1,
        memcpy_kernels=1,
        memsets=2,
        fill_kernels=2,
        memset_events=0,
        event_sync_calls=5,
        cudaDeviceSynchronize_calls=5,
        stream_sync_calls=0,
        blocking_memcpy_calls=0,
        pageable_async_copies=0,
        graph_launches=1,
        kernels_in_graphs=6,
        spectral_norm_launches=1,
        fwd_gemms=1,
        fwd_gemms_not_tf32=0,
        bwd_gemms=2,
        bwd_gemms_tf32=0,
    )
    assert {k: int(row[k]) for k in expected} == expected
    assert m.evidence["no_d2d_weight_sync"] == [
        "Memcpy DtoD (Device -> Device) in phase_d2d x1",
        "memcpy128 in graph_replay x1",
    ]  # evidence names the phase
    assert [e.split("<")[0] for e in m.evidence["no_single_block_kernels"]] == ["void at::native::reduce_kernel"]
    assert m.medians["kernels"] == 16.0


def test_h200_probe_gemm_precision_per_phase():
    m = step_metrics(trace(PROBE), step_range_name=None, roles=ROLES_PROBE, phases=PROBE_STREAMS)
    per_phase = m.gemms.groupby(["phase", "precision"])["kernels"].sum().to_dict()
    assert per_phase == {
        ("phase_tf32_mm", TF32): 1,
        ("phase_fp32_mm", FP32): 2,
        ("graph_replay", TF32): 1,
        ("graph_replay", FP32): 2,
        ("stream_a", FP32): 1,
        ("stream_b", FP32): 1,
    }
    swapped = PhaseRoles(forward=("phase_fp32_mm",), backward=("phase_tf32_mm",))  # mutation: roles reversed
    row = step_metrics(trace(PROBE), step_range_name=None, roles=swapped).per_step.iloc[0]
    assert (row["fwd_gemms_not_tf32"], row["bwd_gemms_tf32"]) == (2, 1)


def test_h200_probe_two_streams_overlap_fraction():
    df = trace(PROBE)
    m = step_metrics(df, step_range_name=None, roles=ROLES_PROBE, phases=PROBE_STREAMS)
    k = df[df["kind"].eq("kernel")]
    a, b = k[k["stream"].eq(25)].iloc[0], k[k["stream"].eq(29)].iloc[0]
    overlap = a["start_us"] + a["dur_us"] - b["start_us"]  # b starts while a runs and ends after it
    row = m.per_step.iloc[0]
    assert 0 < overlap < b["dur_us"]
    assert row["ddqn_kernel_us"] == pytest.approx(b["dur_us"])
    assert row["ddqn_overlap_ratio"] == pytest.approx(overlap / b["dur_us"]) and row["ddqn_overlap_ratio"] > 0.19
    assert m.medians["ddqn_overlap_ratio"] == pytest.approx(row["ddqn_overlap_ratio"])


def test_h200_probe_phases_from_gpu_annotations():
    df = trace(PROBE)
    phase = kernel_phases(df)
    by_name = lambda n: set(phase[df["name"].eq(n)])  # noqa: E731
    assert by_name("seg_add") == {"phase_triton", "graph_replay"}
    assert by_name("Memcpy DtoD (Device -> Device)") == {"phase_d2d"}
    assert by_name("memcpy128") == {"graph_replay"}
    assert set(phase[df["kind"].eq("kernel") & df["stream"].isin([25, 29])]) == {"two_streams"}
    assert (phase[~df["kind"].isin(["kernel", "memcpy", "memset"])] == "").all()
    named = kernel_phases(df, {"seg_add": "tree", r"s1688gemm": "fwd"})  # the caller's map wins over annotations
    assert set(named[df["name"].eq("seg_add")]) == {"tree"} and (named == "fwd").sum() == 2
    with pytest.raises(ValueError, match="not a valid regex"):
        step_metrics(df, step_range_name=None, phases={"(": "x"})


def test_public_traces_per_step_sync_counts():
    diff = step_metrics(trace(TRACES / "kineto-public" / "trace_diff_test_test.json.gz")).per_step
    assert list(diff["stream_sync_calls"]) == [10] * 6  # the 60 DtoH .item() copies: cudaMemcpyAsync + sync
    assert list(diff["pageable_async_copies"]) == [0] * 6  # each pageable copy is followed by its sync
    assert list(diff["d2d_copies"]) == [768] * 6 and list(diff["kernels_grid1"]) == [202] * 6
    nccl = step_metrics(trace(TRACES / "kineto-public" / "nccl_parser_config_nccl_data.json.gz")).per_step
    assert list(nccl["event_sync_calls"]) == [8] * 3 and list(nccl["cudaEventSynchronize_calls"]) == [8] * 3
    alex = step_metrics(trace(TRACES / "kineto-public" / "critical_path_alexnet.json.gz"), step_range_name=None)
    row = alex.per_step.iloc[0]
    assert (row["stream_sync_calls"], row["event_sync_calls"], row["pageable_async_copies"]) == (16, 5, 0)


def test_nsight_steps_and_gemm():
    m = step_metrics(trace(TRACES / "h200" / "nsys_matmul_nvtx.sqlite"), domain="hotloop")
    assert list(m.per_step["event_sync_calls"]) == [1] * 5 and list(m.per_step["memsets"]) == [1] * 5
    assert list(m.per_step["kernels"]) == [2] * 5
    assert set(m.gemms["precision"]) == {FP32} and m.gemms["kernels"].sum() == 5
    assert (m.per_step["gpu_kernel_us"] <= m.per_step["gpu_span_us"] + 1e-6).all()


def test_clean_learner_trace_per_step():
    m = step_metrics(learner_trace(steps=3))
    ps = m.per_step
    assert list(ps["range_name"]) == ["step"] * 3
    assert ps[["stream_sync_calls", "event_sync_calls", "d2d_copies", "kernels_grid1"]].eq(0).all().all()
    assert list(ps["memsets"]) == [1] * 3 and list(ps["spectral_norm_launches"]) == [1] * 3
    assert list(ps["fwd_gemms"]) == [2] * 3 and ps["fwd_gemms_not_tf32"].eq(0).all()
    assert list(ps["bwd_gemms"]) == [1] * 3 and ps["bwd_gemms_tf32"].eq(0).all()
    assert list(ps["ddqn_overlap_ratio"]) == [pytest.approx(15 / 20)] * 3  # ddqn 25..45 vs online 20..40
    assert list(ps["gpu_kernel_us"]) == [81.0] * 3
    assert list(ps["gpu_busy_us"]) == [10 + 25 + 30 + 1] * 3 and list(ps["gpu_span_us"]) == [96.0] * 3
    assert m.medians["gpu_busy_us"] == 66.0


@pytest.mark.parametrize(
    "fault, column, evidence",
    [
        ("stream sync", "stream_sync_calls", "cudaStreamSynchronize x3"),
        ("event sync", "event_sync_calls", "cudaEventSynchronize x3"),
        ("device sync (driver)", "event_sync_calls", "cuCtxSynchronize x3"),
        ("blocking cudaMemcpy", "blocking_memcpy_calls", "cudaMemcpy x3"),
        ("pageable non_blocking copy", "pageable_async_copies", "Memcpy DtoH (Device -> Pageable) x3"),
        ("D2D copy", "d2d_copies", "Memcpy DtoD (Device -> Device) x3"),
        ("D2D copy in a graph", "d2d_copies", "memcpy128 x3"),
        ("grid (1,1,1) kernel", "kernels_grid1", "reduce_kernel x3"),
    ],
)
def test_each_injected_fault_counts_once_per_step(fault, column, evidence):
    clean, faulty = step_metrics(learner_trace()), step_metrics(learner_trace(fault=fault))
    assert list(faulty.per_step[column] - clean.per_step[column]) == [1, 1, 1]
    assert evidence in sum(faulty.evidence.values(), [])


def test_pageable_copy_followed_by_a_sync_is_counted_through_the_sync_only():
    b = TraceBuilder()
    with b.step():
        b.gpu("Memcpy DtoH (Device -> Pageable)", 10, 1, "memcpy", launch="cudaMemcpyAsync_ptsz", copy_kind="DtoH")
        b.call("cuStreamSynchronize", kind="driver")
        b.gpu("Memcpy DtoH (Device -> Pageable)", 20, 1, "memcpy", launch="cudaMemcpyAsync", copy_kind="DtoH")
    row = step_metrics(b.frame()).per_step.iloc[0]
    assert (row["stream_sync_calls"], row["pageable_async_copies"], row["event_sync_calls"]) == (1, 1, 1)


def test_serialized_ddqn_forward_has_zero_overlap():
    m = step_metrics(learner_trace(fault="DDQN serialized"))
    assert list(m.per_step["ddqn_overlap_ratio"]) == [0.0] * 3
    no_ddqn = step_metrics(learner_trace(), roles=PhaseRoles(ddqn_forward="absent"))
    assert no_ddqn.per_step["ddqn_overlap_ratio"].isna().all()


def test_overlap_on_the_same_stream_does_not_count():
    """Kernels of one stream that overlap in time (programmatic dependent launch lets the next start early) are
    not the two-stream concurrency the criterion asks for; another stream's part of the same window is."""
    b = TraceBuilder()
    with b.step():
        b.gpu(TF32_H200, 100, 20, stream=7, phase="forward")
        b.gpu(TF32_SM90, 110, 20, stream=7, phase="ddqn_forward")  # overlaps the online kernel by 10 us, same stream
        b.gpu(TF32_H200, 125, 10, stream=9, phase="forward")  # 5 us of the DDQN kernel, on another stream
    row = step_metrics(b.frame()).per_step.iloc[0]
    assert (row["ddqn_kernel_us"], row["ddqn_overlap_us"], row["ddqn_overlap_ratio"]) == (20.0, 5.0, 0.25)


def test_phase_rules_by_name_for_graph_replays():
    b = TraceBuilder()
    with b.step():
        for i in range(3):  # a replay: no annotations, all kernels share one cudaGraphLaunch correlation
            b.rows.append(
                dict(
                    name=f"sn_power_iter_{i}",
                    kind="kernel",
                    start_us=10 + i,
                    dur_us=1,
                    stream=7,
                    correlation=1,
                    pid="0",
                    tid="7",
                    grid_x=8,
                    grid_y=1,
                    grid_z=1,
                )
            )
        b.call("cudaGraphLaunch")
    m = step_metrics(b.frame(), phases={r"^sn_": "spectral_norm"})
    assert list(m.per_step["spectral_norm_launches"]) == [3]
    assert list(m.per_step["kernels_in_graphs"]) == [3]


def test_no_step_ranges_gives_empty_per_step_and_nan_medians():
    m = step_metrics(trace(PROBE))
    assert m.per_step.empty and pd.isna(m.medians["kernels"])


@pytest.mark.parametrize(
    "name, expected",
    [
        (TF32_H200, TF32),  # seen on the H200 (DESIGN.md)
        (FP32_H200, FP32),  # seen on the H200 (DESIGN.md)
        (TF32_SM90, TF32),
        ("sm80_xmma_gemm_tf32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", TF32),
        ("cutlass_80_tensorop_tf32_s1688gemm_tf32_256x128_16x3_nt_align4", TF32),
        ("ampere_sgemm_128x64_nn", FP32),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(...)", FP32),
        ("my_gemm_fp32_kernel", FP32),
        ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8", GEMM),
        ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", GEMM),  # s1688 with fp16 data: not TF32
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", GEMM),
        ("gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>", GEMM),
        ("triton_tem_fused_addmm_relu_0", GEMM),
        ("triton_poi_fused_add_0", ""),
        ("void at::native::reduce_kernel<512, 1>", ""),
        ("memcpy128", ""),
        ("fp32_to_half_kernel", ""),
    ],
)
def test_gemm_precision_name_rules(name, expected):
    assert gemm_precision(name) == expected


def test_gemm_registry_for_triton_kernels():
    registry = {"triton_tem_fused_addmm_*": TF32, "my_dot_kernel": FP32, "seg_add": ""}
    assert gemm_precision("triton_tem_fused_addmm_relu_0", registry) == TF32
    assert gemm_precision("my_dot_kernel", registry) == FP32
    assert gemm_precision("triton_tem_fused_mm_1", registry) == GEMM  # unregistered template: unknown precision
    with pytest.raises(ValueError, match="precisions must be one of"):
        gemm_precision("x", {"x": "fp16"})


def test_a_kernel_with_ts_0_and_dur_0_is_counted_flagged_and_left_out_of_the_timing_medians():
    """Issue 22 item 5: Kineto writes a kernel whose CUPTI timestamps were not taken as ts 0, dur 0; on real clocks
    (~1.6e15 us) it made one step's gpu_span_us 1.6e15 and the median 8e14, a "regression" to any baseline."""
    b = TraceBuilder()
    for k in range(3):
        g = 1.6e15 + 1000.0 * k
        with b.step():
            b.gpu(TF32_H200, g + 20, 20, phase="forward")
            if k == 1:
                b.gpu("void at::native::vectorized_elementwise_kernel<4>", 0.0, 0.0)  # the damaged event
    m = step_metrics(b.frame())
    ps = m.per_step
    assert list(ps["kernels"]) == [1, 2, 1]  # still counted, in the step that launched it
    assert list(ps["gpu_span_us"]) == [20.0, 20.0, 20.0]  # intervals from events with a valid time only
    assert m.medians["gpu_span_us"] == 20.0 and m.medians["kernels"] == 1.0
    assert list(ps["anomaly"]) == ["", "kernel with ts 0, dur 0", ""] and list(ps["anomalies"]) == [0, 1, 0]
    assert m.timing_note == "timing of step 1 left out: kernel with ts 0, dur 0 (step 1)"
    assert m.evidence["ddqn_overlapped"][-1] == m.timing_note
    assert m.anomalies["counts"]["ts_not_positive"] == 1 and m.anomalies["counts"]["gpu_dur_zero"] == 1


def test_timing_medians_use_only_undamaged_steps_and_counts_use_all():
    b = TraceBuilder()
    for k in range(4):
        with b.step():
            b.gpu(TF32_H200, 1000.0 * (k + 1), 10.0 * (k + 1))
            if k >= 2:
                b.gpu("lost_kernel", 0.0, 0.0)
    m = step_metrics(b.frame())
    assert m.medians["gpu_kernel_us"] == 15.0  # steps 0 and 1 (10 and 20 us); 2 and 3 are damaged
    assert m.medians["kernels"] == 1.5  # counts over every step: 1, 1, 2, 2
    assert m.timing_note == "timing of steps 2, 3 left out: kernel with ts 0, dur 0 (steps 2, 3)"
    all_bad = step_metrics(b.frame(), step_range_name=None)  # one whole-trace step, damaged
    assert pd.isna(all_bad.medians["gpu_span_us"]) and all_bad.medians["kernels"] == 6.0
    assert all_bad.timing_note.startswith("timing of every step (1) left out: kernel with ts 0, dur 0 x2")
    assert all_bad.per_step["start_us"].iloc[0] > 0  # the whole-trace span starts at the first valid time


def test_a_step_range_with_a_negative_duration_still_holds_its_launch_and_sync():
    """Issue 22 item 5: a step range whose end was never written (dur = 0 - start) held a launch and a
    cudaStreamSynchronize that were counted in no step (sync count 0). The range runs to its thread's last event."""
    b = TraceBuilder()
    for k in range(3):
        with b.step():
            b.gpu(TF32_H200, 1000.0 * (k + 1), 20)
            b.call("cudaStreamSynchronize")
    df = b.frame()
    second = df.index[df["kind"].eq("user_annotation")][1]
    df.loc[second, "dur_us"] = -df.loc[second, "start_us"]
    m = step_metrics(df)
    ps = m.per_step
    assert list(ps["stream_sync_calls"]) == [1, 1, 1] and list(ps["kernels"]) == [1, 1, 1]
    assert list(ps["anomaly"] != "") == [False, True, False]
    assert ps["anomaly"].iloc[1] == "range 'step' with dur < 0 (end read as its thread's last event)"
    assert m.medians["dur_us"] == ps["dur_us"].iloc[0]  # the repaired range's duration is a guess: left out


def test_a_launch_without_its_kernel_damages_the_step_but_a_captured_launch_does_not():
    b = TraceBuilder()
    with b.step():
        b.call("cudaStreamBeginCapture_v2")
        b.call("cudaLaunchKernel")  # recorded into a graph: runs nothing
        b.call("cudaStreamEndCapture")
        b.gpu(TF32_H200, 1000, 20)
    with b.step():
        b.call("cudaLaunchKernel_ptsz")  # its kernel is missing although later kernels were recorded
        b.gpu(TF32_H200, 2000, 20)
    m = step_metrics(b.frame())
    assert list(m.per_step["anomaly"]) == ["", "cudaLaunchKernel with no GPU event"]
    assert m.anomalies["counts"]["launch_without_gpu"] == 1


# --- phases from CPU ranges, the window's outside-steps bucket, learner / env scopes -------------------------------


def test_calls_take_their_innermost_cpu_phase_and_gpu_events_their_launching_calls():
    b = TraceBuilder()
    with b.step():
        with b.step("update"):
            with b.step("optimizer"):
                b.call("cudaStreamSynchronize")
                b.gpu("adam_kernel", 100)  # no gpu_user_annotation: the launch call's phase
            with b.step("Optimizer.step#Adam.step"):  # torch's own range ("#"): not a phase
                b.gpu("adam_step_kernel", 120)
        b.gpu("tail_kernel", 140)  # in the step, in no phase
    df = b.frame()
    ev = event_phases(df)
    by_name = {
        n: (ph, path) for n, ph, path in zip(df["name"], ev["phase"], ev["path"]) if n not in ("cudaLaunchKernel",)
    }
    assert by_name["cudaStreamSynchronize"] == ("optimizer", ("update", "optimizer"))
    assert by_name["adam_kernel"] == ("optimizer", ("update", "optimizer"))
    assert by_name["adam_step_kernel"] == ("update", ("update",))
    assert by_name["tail_kernel"] == ("", ())
    assert by_name["step"] == ("", ())  # ranges themselves get no phase


def test_phase_rules_apply_only_inside_rule_phases():
    """The actor graph's forward kernels share the learner's names (`_fwd_online_*`): launched in env_step they stay
    env_step; the same names launched in the learner's update are assigned by the name rules."""
    b = TraceBuilder()
    with b.step():
        with b.step("env_step"):
            b.gpu("_fwd_online_actor_kernel", 100, launch="cudaGraphLaunch")
        with b.step("update"):
            b.gpu("_fwd_online_kernel", 200, launch="cudaGraphLaunch")
            b.gpu("memcpy128", 220, launch="cudaGraphLaunch")  # matches no rule: the launch's phase
    df = b.frame()
    rules = {r"_fwd_online_": "forward"}
    scoped = kernel_phases(df, rules, rule_phases=("update", "forward"))
    names = dict(zip(df["name"], scoped))
    assert (names["_fwd_online_actor_kernel"], names["_fwd_online_kernel"], names["memcpy128"]) == (
        "env_step",
        "forward",
        "update",
    )
    unscoped = dict(zip(df["name"], kernel_phases(df, rules)))
    assert unscoped["_fwd_online_actor_kernel"] == "forward"  # mutation: without the scope the actor is "learner"


def test_events_between_steps_inside_the_window_are_counted_outside_steps():
    b = TraceBuilder()
    with b.step(WINDOW_RANGE):
        for k in range(2):
            with b.step():
                b.gpu("k", 100.0 * (k + 1))
            b.call("cudaStreamSynchronize")  # the loop's own code between steps
            b.gpu("between", 100.0 * (k + 1) + 50, grid=(1, 1, 1))
    b.call("cudaDeviceSynchronize")  # after the window (the profiler's own): in no bucket
    m = step_metrics(b.frame())
    assert list(m.per_step["stream_sync_calls"]) == [0, 0] and list(m.per_step["kernels"]) == [1, 1]
    assert m.outside["stream_sync_calls"] == 2 and m.outside["kernels_grid1"] == 2 and m.outside["kernels"] == 2
    assert m.outside["event_sync_calls"] == 0 and m.window["source"] == "range"
    assert "cudaStreamSynchronize (outside steps) x2" in m.evidence["no_stream_sync"]
    no_range = b.frame()
    no_range = no_range[no_range["name"].ne(WINDOW_RANGE)]
    m2 = step_metrics(no_range)  # the window is then first step start .. last step end: one gap
    assert m2.window["source"] == "steps" and m2.outside["stream_sync_calls"] == 1


def test_learner_and_env_scopes_and_the_env_kernels_per_env_step():
    b = TraceBuilder()
    for k in range(2):
        with b.step():
            with b.step("env_step"):
                b.gpu("env_reset", 100.0 * (k + 1), grid=(1, 1, 1))
                b.gpu("Memset (Device)", 100.0 * (k + 1) + 5, 1, "memset", launch="cudaMemsetAsync")
            with b.step("update"):
                b.gpu("reduce_kernel", 100.0 * (k + 1) + 20, grid=(1, 1, 1)) if k == 1 else None
            with b.step("readback_publish"):  # neither the learner's nor the env's
                b.gpu("publish_kernel", 100.0 * (k + 1) + 40, grid=(1, 1, 1))
            if k == 0:  # in the step, in no phase range: the learner's
                b.gpu("added_after_the_learner_step", 100.0 * (k + 1) + 60, grid=(1, 1, 1))
    df = b.frame()
    scoped = step_metrics(df, roles=PhaseRoles(learner=("update",))).per_step
    assert list(scoped["kernels_grid1"]) == [3, 3]  # every phase's, the env's and readback_publish's included
    assert list(scoped["env_kernels_grid1"]) == [1, 1] and list(scoped["learner_memsets"]) == [0, 0]
    assert list(scoped["env_kernels"]) == [1, 1] and list(scoped["env_kernels_per_env_step"]) == [1.0, 1.0]
    everything = step_metrics(df).per_step  # no learner phases given: every event of a step is the learner's
    assert list(everything["learner_memsets"]) == [1, 1]
    two = step_metrics(df, roles=PhaseRoles(learner=("update",), env_steps_per_update=2))
    assert list(two.per_step["env_kernels_per_env_step"]) == [0.5, 0.5] and two.medians["env_kernels"] == 1.0
    assert "learner_kernels_grid1" not in scoped  # retired: "no_single_block_kernels" judges kernels_grid1
    assert two.evidence["env_kernels_per_env_step"] == [
        "env_reset in env_step x2",
        "env_steps_per_update 2",
        "env_kernels_grid1 2 over the window",
    ]


def _graph_copy_step(as_kernel: bool) -> pd.DataFrame:
    """Two steps replaying one env graph with a compute kernel and a D2D copy node, the copy run as a `memcpy32_post`
    kernel (grid (1,1,1), as the H200's driver ran the actor graph's copies in the gate) or as a DtoD memcpy."""
    b = TraceBuilder()
    for k in range(2):
        with b.step():
            with b.step("env_step"):
                b.gpu("env_step_kernel", 100.0 * (k + 1), grid=(1, 1, 1), launch="cudaGraphLaunch")
                if as_kernel:
                    b.gpu("memcpy32_post", 100.0 * (k + 1) + 20, 1, grid=(1, 1, 1), launch="cudaGraphLaunch")
                else:
                    b.gpu(
                        "Memcpy DtoD (Device -> Device)",
                        100.0 * (k + 1) + 20,
                        1,
                        "memcpy",
                        launch="cudaGraphLaunch",
                        copy_kind="DtoD",
                    )
    return b.frame()


def test_a_graph_copy_counts_the_same_as_a_memcpy_kernel_or_a_dtod_memcpy():
    from hotloop.guards.baselines import Baseline, compare

    roles = PhaseRoles(learner=("update",), env=("env_step",))
    kernel_form = step_metrics(_graph_copy_step(True), roles=roles)
    memcpy_form = step_metrics(_graph_copy_step(False), roles=roles)
    for m in (kernel_form, memcpy_form):
        row = m.per_step.iloc[0]
        assert (row["kernels"], row["kernels_grid1"], row["env_kernels_grid1"], row["d2d_copies"]) == (1, 1, 1, 1)
    assert (kernel_form.medians["memcpy_kernels"], memcpy_form.medians["memcpy_dtod_events"]) == (1.0, 1.0)
    counts = {k: [v] for k, v in memcpy_form.medians.items() if is_count(k)}
    base = Baseline(gpu="test", metrics={k: [v] for k, v in kernel_form.medians.items() if is_count(k)})
    table = compare(counts, base).set_index("metric")
    assert not table.verdict.eq("FAIL").any(), table[table.verdict.eq("FAIL")]
    assert table.loc["d2d_copies", "verdict"] == "PASS"  # the sum is still compared exactly
    assert table.loc["memcpy_kernels", "verdict"] == "-" and table.loc["memcpy_dtod_events", "verdict"] == "-"
    counts["d2d_copies"] = [2.0]  # one more copy in either form still fails
    assert compare(counts, base).set_index("metric").loc["d2d_copies", "verdict"] == "FAIL"


def test_loop_code_in_no_phase_range_counts_for_the_learner():
    """A kernel launched in the step but outside every phase range (an op added after the learner step, as the
    gate's injected faults do) is judged as the learner's; outside the window's steps it is not."""
    b = TraceBuilder()
    with b.step(WINDOW_RANGE):
        with b.step():
            with b.step("update"):
                b.gpu("_fwd_online_kernel", 100)
            b.gpu("memcpy128", 130, launch="cudaGraphLaunch")  # a D2D copy in a graph, in no phase
            b.gpu("one_element_add", 140, grid=(1, 1, 1))
        b.gpu("between_steps_add", 200, grid=(1, 1, 1))
    ps = step_metrics(b.frame(), roles=PhaseRoles(learner=("update",))).per_step
    assert (ps["learner_d2d_copies"].iloc[0], ps["kernels_grid1"].iloc[0]) == (1, 1)


def test_phase_steps_coverage_and_markers():
    b = TraceBuilder()
    with b.step(WINDOW_RANGE):
        for k in range(4):
            with b.step():
                with b.step("env_step"):
                    b.gpu("env_kernel", 100.0 * (k + 1))
                if k % 2 == 1:
                    with b.step("readback_publish"):
                        b.call("cudaStreamSynchronize")
                        with b.step(f"{HIT_MARK}{k}"):
                            pass
                b.gpu("_tree_update_kernel", 100.0 * (k + 1) + 50, launch="cudaGraphLaunch")
            with b.step(f"{HIT_MARK}{10 + k}"):  # a hit between steps
                pass
    m = step_metrics(b.frame(), phases={r"_tree_update": "priority_update"})
    assert set(map(tuple, m.phase_steps.to_numpy())) == {
        *((k, "env_step") for k in range(4)),
        *((k, "priority_update") for k in range(4)),
        (1, "readback_publish"),
        (3, "readback_publish"),
    }
    mk = m.markers.set_index("hit")
    assert list(mk.loc[[1, 3], "phase"]) == ["readback_publish"] * 2 and list(mk.loc[[1, 3], "step"]) == [1, 3]
    between = [10, 11, 12, 13]
    assert mk.loc[between, "outside"].all() and mk.loc[between, "step"].isna().all()
    assert not mk.loc[[1, 3], "outside"].any()
    periods = {"env_step": 1, "readback_publish": 2, "target_update": 100}
    cov = phase_coverage(m, periods=periods).set_index("phase")
    assert list(cov.index) == ["env_step", "readback_publish", "target_update", "priority_update"]
    assert list(cov["steps"]) == [4, 2, 0, 4] and list(cov["first_step"]) == [0, 1, pd.NA, 0]
    assert cov.loc["readback_publish", "sync_calls"] == 2 and cov.loc["env_step", "kernels"] == 4
    assert cov.loc["target_update", "status"] == "not in window (period 100 > window 4)"
    assert list(cov["period"]) == [1, 2, 100, pd.NA]
    assert NO_PHASE not in cov.index and OUTSIDE_LABEL not in cov.index  # nothing there to show


def test_per_kernel_times_are_median_us_per_undamaged_step_by_name():
    """Each kernel name's time per step: the median over the steps that ran it of its summed time in the step, times
    the share of steps that ran it (a kernel of a periodic phase, here in step 1 only, counts by its share); one
    stalled launch moves nothing; copy kernels (memcpy*) and damaged steps are left out."""
    b = TraceBuilder()
    for k in range(5):
        g = 10_000.0 * (k + 1)
        with b.step():
            b.gpu("gemm_a", g, 2500.0 if k == 2 else 10.0 + k)  # 10, 11, (a 2.5 ms stall), 13, (14: damaged)
            b.gpu("gemm_a", g + 3000, 5.0)  # the same kernel twice per step (two layers)
            if k == 1:
                b.gpu("readback_kernel", g + 3040, 8.0)
            b.gpu("memcpy128", g + 3060, 3.0, launch="cudaGraphLaunch")
            if k == 4:
                b.gpu("lost_kernel", 0.0, 0.0)
    m = step_metrics(b.frame())
    times = {name: us for name, us in m.medians.items() if name.startswith(KERNEL_US_PREFIX)}
    assert times == {
        f"{KERNEL_US_PREFIX}gemm_a": pytest.approx((16 + 18) / 2),  # median of 15, 16, 2505, 18
        f"{KERNEL_US_PREFIX}readback_kernel": pytest.approx(8 / 4),
    }, times
    assert not is_count(f"{KERNEL_US_PREFIX}gemm_a")
    assert (
        kernel_times(
            b.frame(), pd.Series(False, index=b.frame().index), pd.Series(dtype="Int64"), pd.Series([], dtype="int64")
        )
        == {}
    )


def polling_trace() -> pd.DataFrame:
    """A window of 3 steps with completion queries (imported by test_guard_polling.py): step 1 publishes once with
    the readback's own query and a spin of 3 more; step 2 publishes with one query and polls the stream once in
    "progress"; a query between the steps; one inside a torch op (the caching allocator's: not judged); one on
    another thread (not the loop's: not counted)."""
    b = TraceBuilder()
    with b.step(WINDOW_RANGE):
        for k in range(3):
            with b.step():
                with b.step("env_step"):
                    b.gpu("env_kernel", 100.0 * (k + 1))
                if k == 1:
                    with b.step("readback_publish"):
                        for _ in range(4):
                            b.call("cudaEventQuery")
                if k == 2:
                    with b.step("readback_publish"):
                        b.call("cudaEventQuery")
                    with b.step("progress"):
                        b.call("cudaStreamQuery_ptsz")
                    start = b.t
                    b.call("cudaEventQuery")
                    b.rows.append(
                        dict(name="aten::empty_strided", kind="cpu_op", start_us=start - 0.25, dur_us=1.0, tid="1")
                    )
        b.call("cudaEventQuery")
        b.rows.append(dict(name="cudaEventQuery", kind="runtime", start_us=b.t - 0.5, dur_us=0.5, tid="99"))
    return b.frame()


def test_completion_queries_beyond_the_allowance_are_polling():
    m = step_metrics(polling_trace(), allowance={"readback_publish": 1})
    ps = m.per_step
    assert list(ps["completion_queries"]) == [0, 4, 2] and list(ps["polling_queries"]) == [0, 3, 1]
    assert list(ps["query_host_us"]) == [0.0, 2.0, 1.0]  # 0.5 us per counted call
    assert (m.outside["completion_queries"], m.outside["polling_queries"]) == (1.0, 1.0)
    assert set(m.phase_runs.itertuples(index=False, name=None)) >= {
        (1, "readback_publish", 1),
        (2, "readback_publish", 1),
        (2, "progress", 1),
    }
    assert "completion_queries" not in m.medians and "query_host_us" not in m.medians
    evidence = m.evidence["no_event_sync"]
    assert "cudaEventQuery in readback_publish x5 (polling x3)" in evidence
    assert "cudaStreamQuery_ptsz in progress x1 (polling x1)" in evidence
    assert f"cudaEventQuery {OUTSIDE_LABEL} x1 (polling x1)" in evidence
    assert "cudaEventQuery inside a torch op x1 (not judged)" in evidence
    cov = phase_coverage(m).set_index("phase")
    assert (cov.loc["readback_publish", "queries"], cov.loc["progress", "queries"]) == (5, 1)
    assert cov.loc[OUTSIDE_LABEL, "queries"] == 1 and cov.loc["env_step", "queries"] == 0
    none = step_metrics(polling_trace(), allowance={})  # no allowance: every counted query is polling
    assert list(none.per_step["polling_queries"]) == [0, 4, 2]
    assert list(step_metrics(learner_trace()).per_step["completion_queries"]) == [0, 0, 0]


def test_polling_flags_allow_the_first_queries_of_each_run():
    from hotloop.guards.step_metrics import OUTSIDE, polling_flags

    runs = pd.DataFrame({"step": [0, 1], "phase": ["readback_publish", "readback_publish"], "runs": [1, 2]})
    steps = pd.Series([0, 0, 1, 1, 1, 2, OUTSIDE, None], dtype="Int64")
    paths = pd.Series(
        [
            ("readback_publish",),
            ("readback_publish", "inner"),
            ("readback_publish",),
            ("readback_publish",),
            ("readback_publish",),
            ("readback_publish",),
            (),
            (),
        ],
        dtype=object,
    )
    flags = polling_flags(steps, paths, runs, {"readback_publish": 1})
    # step 0: one run, the second query polls (its innermost allowance phase is readback_publish); step 1: two
    # runs allow two; step 2: no run there; outside the steps and with no step: polling
    assert flags.tolist() == [False, True, False, False, True, True, True, True]
