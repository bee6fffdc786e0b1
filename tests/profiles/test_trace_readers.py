"""Trace readers and counters against real traces: the exact counts of tests/data/traces/README.md (made by an
independent script over all "ph": "X" events), per-step attribution, the schema both readers share, and each
documented read error; the trace anomalies (hotloop.profiles.trace_anomalies) each flagged and named, window edges
apart, and a step range with no valid end running to its thread's last event."""

import functools
import gzip
import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from hotloop.profiles.kineto_reader import read_kineto
from hotloop.profiles.nsight_reader import COPY_KINDS, read_nsight_sqlite
from hotloop.profiles.trace_anomalies import ANOMALY_COLUMNS, anomaly_flags, anomaly_reasons, describe_anomalies
from hotloop.profiles.trace_counts import SYNC_COLUMNS, assign_steps, count_per_step, count_totals, step_ranges
from hotloop.profiles.trace_schema import COLUMNS, TraceReadError, TraceReadWarning, event_frame

TRACES = Path(__file__).parents[1] / "data" / "traces"
NSYS = TRACES / "h200" / "nsys_matmul_nvtx.sqlite"
PROBE = TRACES / "h200" / "probe_eager_graph_twostream.json.gz"

D, E, S = "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamSynchronize"
# file: (kernels, grid==(1,1,1), DtoD memcpy, memsets, sync API calls, graph launches, kernels in them) -- the
# README's table row by row.
README_COUNTS = {
    "kineto-public/triton_example_triton_example.json.gz": (1, 1, 0, 0, {D: 1}, 0, 0),
    "kineto-public/critical_path_cuda_event_sync_event_sync_trace.json.gz": (4, 3, 0, 0, {D: 1, E: 1, S: 1}, 0, 0),
    "kineto-public/critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz": (3, 0, 0, 3, {D: 1}, 0, 0),
    "kineto-public/critical_path_alexnet.json.gz": (79, 0, 0, 3, {D: 5, S: 16}, 0, 0),
    "kineto-public/nccl_parser_config_nccl_data.json.gz": (2700, 432, 960, 114, {D: 1, E: 24}, 0, 0),
    "kineto-public/trace_diff_test_test.json.gz": (9876, 1374, 4645, 900, {D: 1, S: 60}, 12, 4464),
    "h200/probe_eager_graph_twostream.json.gz": (17, 2, 1, 0, {D: 5}, 1, 7),
    # README: 11 kernels; the rest read from the file with plain sqlite3 queries.
    "h200/nsys_matmul_nvtx.sqlite": (11, 0, 0, 5, {D: 5}, 0, 0),
}


@functools.cache
def _read(rel: str) -> pd.DataFrame:
    path = TRACES / rel
    return read_nsight_sqlite(path) if path.suffix == ".sqlite" else read_kineto(path)


def trace(rel: str) -> pd.DataFrame:
    return _read(rel).copy()


@pytest.mark.parametrize("rel", sorted(README_COUNTS))
def test_totals_are_exactly_the_readmes(rel):
    kernels, grid1, dtod, memsets, syncs, launches, in_graphs = README_COUNTS[rel]
    t = count_totals(trace(rel))
    assert (t["kernels"], t["kernels_grid1"], t["memcpy_dtod_events"], t["memset_events"]) == (
        kernels,
        grid1,
        dtod,
        memsets,
    )
    assert t["sync_calls"] == syncs
    assert (t["graph_launches"], t["kernels_in_graphs"]) == (launches, in_graphs)


def test_h200_probe_graph_replay_carries_a_memcpy128_kernel_and_a_fill_kernel():
    df = trace("h200/probe_eager_graph_twostream.json.gz")
    t = count_totals(df)
    assert (t["memcpy_kernels"], t["fill_kernels"]) == (1, 2)  # fill: the eager zero_() and its replayed copy
    launch = df[df["name"].eq("cudaGraphLaunch")]
    assert len(launch) == 1
    in_graph = df[df["kind"].eq("kernel") & df["correlation"].eq(launch["correlation"].iloc[0])]
    assert len(in_graph) == 7
    assert "memcpy128" in set(in_graph["name"])
    assert in_graph["name"].str.contains("FillFunctor").sum() == 1
    assert in_graph["stream"].nunique() == 1 and not in_graph["grid_x"].isna().any()


@pytest.mark.smoke
def test_nsys_five_step_ranges_each_launch_two_kernels_a_memset_and_a_device_sync():
    df = trace("h200/nsys_matmul_nvtx.sqlite")
    steps = count_per_step(df, "step", domain="hotloop")
    assert list(steps["range_name"]) == ["step"] * 5
    assert list(steps["kernels"]) == [2] * 5  # a matmul and a sum per step; the 11th kernel (randn) is before
    assert list(steps["memset_events"]) == [1] * 5
    assert list(steps["cudaDeviceSynchronize_calls"]) == [1] * 5
    assert steps[["kernels_grid1", "memcpy_dtod_events", "graph_launches", *SYNC_COLUMNS[:2]]].eq(0).all().all()
    assert count_per_step(df, "step", domain="not-hotloop").empty


def test_nsight_reader_names_and_kinds():
    df = trace("h200/nsys_matmul_nvtx.sqlite")
    nvtx = df[df["kind"].eq("user_annotation")]
    assert list(nvtx["name"]) == ["step"] * 5 and set(nvtx["domain"]) == {"hotloop"}
    assert (df["name"].eq("cudaDeviceSynchronize") & df["kind"].eq("runtime")).sum() == 5  # _v3020 dropped
    assert (df["name"].eq("cuLaunchKernel") & df["kind"].eq("driver")).sum() == 5
    assert df.loc[df["kind"].eq("kernel"), "name"].str.startswith("void ").all()  # demangled, as in Kineto
    assert df["start_us"].is_monotonic_increasing
    with sqlite3.connect(NSYS) as con:
        ns = con.execute("SELECT MIN(start), MAX(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    kernels = df[df["kind"].eq("kernel")]
    assert kernels["start_us"].min() == pytest.approx(ns[0] / 1e3)
    assert (kernels["start_us"] + kernels["dur_us"]).max() == pytest.approx(ns[1] / 1e3)


def test_profiler_steps_of_a_training_loop_each_hold_the_same_work():
    nccl = trace("kineto-public/nccl_parser_config_nccl_data.json.gz")
    steps = count_per_step(nccl)
    assert list(steps["range_name"]) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    assert steps.drop(columns=["step", "range_name", "start_us", "dur_us"]).nunique().eq(1).all()
    assert steps["kernels"].sum() == 2700  # every kernel of the README's count was launched inside a step
    diff = count_per_step(trace("kineto-public/trace_diff_test_test.json.gz"))
    assert len(diff) == 6  # the README's 12 graph launches / 4464 graph kernels: 2 launches, 744 kernels a step
    assert list(diff["graph_launches"]) == [2] * 6 and list(diff["kernels_in_graphs"]) == [744] * 6


def test_no_step_ranges_gives_an_empty_table_with_the_count_columns():
    steps = count_per_step(trace("h200/probe_eager_graph_twostream.json.gz"))
    assert steps.empty and {"kernels", "cudaDeviceSynchronize_calls"} <= set(steps.columns)


def _x(name, cat, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _write_trace(path, events):
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_steps_attribution_by_launch_and_record_function_step_preferred(tmp_path):
    k = dict(grid=[1, 1, 1], block=[32, 1, 1], stream=7, device=0)
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 1000),
        _x("step", "user_annotation", 10, 100),
        _x("step", "user_annotation", 200, 100),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 5, correlation=1),
        _x("k_eager", "kernel", 400, 10, correlation=1, **k),  # runs after its step ended: still step 0
        _x("cudaGraphLaunch", "cuda_runtime", 210, 5, correlation=2),
        _x("memcpy128", "kernel", 420, 1, correlation=2, **k),
        _x("fill_kernel", "kernel", 430, 1, correlation=2, **k),
        _x("cudaStreamSynchronize_ptsz", "cuda_runtime", 250, 5, correlation=3),
        _x("cudaDeviceSynchronize", "cuda_runtime", 500, 5, correlation=4),  # inside no "step" range
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 20, "cat": "ac2g", "name": "flow"},
    ]
    df = read_kineto(_write_trace(tmp_path / "t.json", events))
    ranges = step_ranges(df)
    assert list(ranges["range_name"]) == ["step", "step"]
    assert assign_steps(df, ranges)[df["name"].eq("k_eager")].tolist() == [0]
    steps = count_per_step(df).set_index("step")
    assert steps["kernels"].tolist() == [1, 2]
    assert steps["kernels_in_graphs"].tolist() == [0, 2]
    assert steps["memcpy_kernels"].tolist() == [0, 1] and steps["fill_kernels"].tolist() == [0, 1]
    assert steps["cudaStreamSynchronize_calls"].tolist() == [0, 1]
    assert steps["cudaDeviceSynchronize_calls"].tolist() == [0, 0]
    assert count_totals(df)["sync_calls"] == {S: 1, D: 1}
    assert list(count_per_step(df, "no-such-range")["range_name"]) == ["ProfilerStep#1"]


def test_plain_and_gzipped_kineto_json_read_the_same(tmp_path):
    plain = tmp_path / "probe.pt.trace.json"
    plain.write_bytes(gzip.decompress(PROBE.read_bytes()))
    pd.testing.assert_frame_equal(read_kineto(plain), trace("h200/probe_eager_graph_twostream.json.gz"))


def test_kineto_and_nsight_frames_have_the_same_schema():
    kineto, nsight = trace("h200/probe_eager_graph_twostream.json.gz"), trace("h200/nsys_matmul_nvtx.sqlite")
    assert list(kineto.columns) == list(nsight.columns) == list(COLUMNS)
    assert kineto.dtypes.equals(nsight.dtypes)
    memcpy = kineto[kineto["kind"].eq("memcpy")].iloc[0]
    assert (memcpy["copy_kind"], memcpy["bytes"], memcpy["stream"]) == ("DtoD", 4194304.0, 7)


def _nsys_db(path, with_kernel_table=True):
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO StringIds VALUES (1, 'memcpy128'), (2, 'cudaMemcpyAsync_v3020'), (3, 'cuLaunchKernel');
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
            correlationId INT, nameId INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (1000, 2000, 0, 16777217, 5, 2), (3000, 4000, 1, 16777217, 6, 3);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, streamId INT, correlationId INT,
            globalPid INT, bytes INT, copyKind INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (2500, 2600, 0, 7, 5, 16777216, 64, 8),
                                                      (2700, 2800, 0, 7, 5, 16777216, 64, 1);
    """)
    if with_kernel_table:
        con.executescript("""
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, streamId INT,
                correlationId INT, globalPid INT, demangledName INT, shortName INT, gridX INT, gridY INT, gridZ INT,
                blockX INT, blockY INT, blockZ INT);
            INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (4500, 4600, 0, 7, 6, 16777216, 1, 1, 1, 1, 1, 128, 1, 1);
        """)
    con.commit()
    con.close()
    return path


def test_nsight_memcpy_copy_kind_runtime_names_and_driver_calls(tmp_path):
    df = read_nsight_sqlite(_nsys_db(tmp_path / "mini.sqlite"))
    assert list(df["name"]) == ["cudaMemcpyAsync", "Memcpy DtoD", "Memcpy HtoD", "cuLaunchKernel", "memcpy128"]
    assert list(df["kind"]) == ["runtime", "memcpy", "memcpy", "driver", "kernel"]
    assert list(df["pid"]) == ["1"] * 5 and df.loc[0, "tid"] == "1"
    assert df.loc[1, "dur_us"] == pytest.approx(0.1) and df.loc[1, "bytes"] == 64.0
    t = count_totals(df)
    assert (t["memcpy_dtod_events"], t["memcpy_kernels"], t["kernels_grid1"]) == (1, 1, 1)


def test_copy_kinds_match_the_exports_own_enum_table():
    with sqlite3.connect(NSYS) as con:
        enum = dict(con.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"))
    assert {i: COPY_KINDS[i].replace(" ", "_").upper() for i in enum} == {
        i: name.removeprefix("CUDA_MEMCPY_KIND_") for i, name in enum.items()
    }


def test_raw_control_character_in_a_string_is_read_leniently_with_a_warning(tmp_path):
    path = tmp_path / "ctrl.json"
    good = json.dumps({"traceEvents": [_x("PLACEHOLDER", "cpu_op", 0, 1)]})
    path.write_text(good.replace("PLACEHOLDER", "aten::add\t(raw tab)"))
    with pytest.warns(TraceReadWarning, match=r"ctrl\.json: 1 JSON value.*raw control characters"):
        df = read_kineto(path)
    assert df["name"].tolist() == ["aten::add\t(raw tab)"]


def _truncated_gzip(tmp_path):
    data = PROBE.read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    return path


def _file(name, text):
    def make(tmp_path):
        path = tmp_path / name
        path.write_text(text)
        return path

    return make


@pytest.mark.parametrize(
    "make,reader,match",
    [
        (_truncated_gzip, read_kineto, "truncated gzip"),
        (_file("bad.json", '{"traceEvents": [{"ph": "i"},]}'), read_kineto, "invalid JSON at line 1 column 30: Exp"),
        (_file("cut.json", '{"traceEvents": [{"ph": "X"'), read_kineto, "invalid JSON at line 1 column 28: Exp"),
        (_file("none.json", '{"schemaVersion": 1}'), read_kineto, 'no "traceEvents" list'),
        (_file("array.json", "[]"), read_kineto, "does not start with '{'"),
        (
            _file(
                "nodur.json", json.dumps({"traceEvents": [_x("a", "cpu_op", 0, 1), {"ph": "X", "name": "b", "ts": 1}]})
            ),
            read_kineto,
            r"traceEvents\[1\] \(ph 'X'\): missing field 'dur'",
        ),
        (lambda d: d / "missing.json", read_kineto, "No such file"),
        (lambda d: d / "missing.sqlite", read_nsight_sqlite, "No such file"),
        (
            lambda d: _nsys_db(d / "nokernels.sqlite", with_kernel_table=False),
            read_nsight_sqlite,
            "no table CUPTI_ACTIVITY_KIND_KERNEL",
        ),
        (_file("k.json", '{"traceEvents": []}'), read_nsight_sqlite, "not an SQLite database"),
    ],
)
def test_read_errors_name_the_file_and_the_problem(tmp_path, make, reader, match):
    path = make(tmp_path)
    with pytest.raises(TraceReadError, match=match) as exc:
        reader(path)
    assert str(exc.value).startswith(f"{path}: ") and isinstance(exc.value, ValueError)


# Trace anomalies (hotloop.profiles.trace_anomalies): counted, not absorbed; events kept where their meaning is clear.


@pytest.mark.parametrize("rel", sorted(README_COUNTS))
def test_the_real_traces_hold_no_anomalies(rel):
    anomalies = count_totals(trace(rel))["anomalies"]
    assert anomalies["events"] == 0 and set(anomalies["counts"].values()) == {0}
    assert describe_anomalies(anomalies).startswith("none")


def test_gpu_events_launched_before_the_trace_began_are_a_window_edge_not_an_anomaly():
    df = trace("kineto-public/trace_diff_test_test.json.gz")
    anomalies = count_totals(df)["anomalies"]
    # 614 kernels/copies/memsets whose correlation ids are below every recorded call's: launched in the warm-up
    assert anomalies["window_edge"] == {"gpu_launched_before_trace": 614, "launches_after_gpu_trace": 0}
    assert anomalies["counts"]["gpu_without_launch"] == 0
    assert describe_anomalies(anomalies) == (
        "none (window edges, not anomalies: 614 GPU events launched before the trace's first CUDA call)"
    )


def test_a_negative_duration_step_range_runs_to_its_threads_last_event(tmp_path):
    """Issue 22 item 5 at the counting layer: the step whose range has dur = 0 - start (its end never written)
    holds its launch and its cudaStreamSynchronize (before: counted in no step, sync count 0)."""
    t = 1.7e12
    k = dict(grid=[64, 1, 1], block=[128, 1, 1], stream=7, device=0)
    events = [
        _x("ProfilerStep#1", "user_annotation", t, 100),
        _x("cudaLaunchKernel", "cuda_runtime", t + 10, 5, correlation=1),
        _x("k", "kernel", t + 20, 10, correlation=1, **k),
        _x("ProfilerStep#2", "user_annotation", t + 200, -(t + 200)),  # unset end
        _x("cudaLaunchKernel", "cuda_runtime", t + 210, 5, correlation=2),
        _x("k", "kernel", t + 220, 10, correlation=2, **k),
        _x("cudaStreamSynchronize", "cuda_runtime", t + 240, 30, correlation=3),
    ]
    df = read_kineto(_write_trace(tmp_path / "t.json", events))
    ranges = step_ranges(df)
    assert list(ranges["dur_us"]) == [100.0, 70.0]  # to the sync's end: the last event of thread 1
    steps = count_per_step(df)
    assert list(steps["cudaStreamSynchronize_calls"]) == [0, 1] and list(steps["kernels"]) == [1, 1]
    assert list(steps["anomalies"]) == [0, 1]
    assert steps["anomaly"].iloc[1] == "range 'ProfilerStep#2' with dur < 0 (end read as its thread's last event)"


def test_each_anomaly_is_flagged_and_named():
    t = 1.7e12
    rows = [
        dict(name="cudaLaunchKernel", kind="runtime", start_us=t, dur_us=1, correlation=1, tid="1"),
        dict(name="k0", kind="kernel", start_us=0.0, dur_us=0.0, correlation=1, tid="7"),  # Kineto's unset times
        dict(name="cudaLaunchKernel", kind="runtime", start_us=t + 1, dur_us=1, correlation=2, tid="1"),  # lost kernel
        dict(name="k_orphan", kind="kernel", start_us=t + 5, dur_us=2, correlation=3, tid="7"),  # no call, mid-trace
        dict(name="cudaMemsetAsync", kind="runtime", start_us=t + 6, dur_us=1, correlation=4, tid="1"),  # 0 bytes: ok
        dict(name="cudaLaunchKernel", kind="runtime", start_us=t + 7, dur_us=1, correlation=5, tid="1"),
        dict(name="k5", kind="kernel", start_us=t + 9, dur_us=float("nan"), correlation=5, tid="7"),
        dict(name="aten::mm", kind="cpu_op", start_us=t + 8, dur_us=0.0, tid="1"),  # sub-us CPU op: not an anomaly
        dict(name="fwd", kind="annotation", start_us=t + 9, dur_us=-3.0, tid="7"),
        dict(name="cudaLaunchKernel", kind="runtime", start_us=t + 20, dur_us=1, correlation=9, tid="1"),  # edge
    ]
    df = event_frame(
        {
            c: [r.get(c, "" if c in ("name", "tid") else None) for r in rows]
            for c in ("name", "kind", "start_us", "dur_us", "correlation", "tid")
        }
    )
    flags = anomaly_flags(df)
    by_name = {n: [c for c in ANOMALY_COLUMNS if f[c]] for n, (_, f) in zip(df["name"], flags.iterrows())}
    assert by_name["k0"] == ["ts_not_positive", "gpu_dur_zero"]
    assert by_name["k_orphan"] == ["gpu_without_launch"] and by_name["k5"] == ["time_not_finite"]
    assert by_name["aten::mm"] == [] and by_name["cudaMemsetAsync"] == [] and by_name["fwd"] == ["dur_negative"]
    launches = flags.loc[df["name"].eq("cudaLaunchKernel"), "launch_without_gpu"].tolist()
    assert launches == [False, True, False, False]  # the last one ran after the GPU side stopped: a window edge
    reasons = set(anomaly_reasons(df, flags)) - {""}
    assert reasons == {
        "kernel with ts 0, dur 0",
        "cudaLaunchKernel with no GPU event",
        "kernel with no launching call",
        "kernel with non-finite ts/dur",
        "GPU range 'fwd' with dur < 0",
    }
    totals = count_totals(df)
    assert totals["kernels"] == 3 and totals["anomalies"]["events"] == 5
    assert totals["anomalies"]["window_edge"] == {"gpu_launched_before_trace": 0, "launches_after_gpu_trace": 1}


def test_a_call_with_no_valid_start_is_in_no_step_but_still_counted():
    t = 1.7e12
    df = event_frame(
        {
            "name": ["step", "cudaStreamSynchronize", "cudaStreamSynchronize"],
            "kind": ["user_annotation", "runtime", "runtime"],
            "start_us": [t, 0.0, t + 1],
            "dur_us": [10.0, 1.0, 1.0],
            "tid": ["1", "1", "1"],
        }
    )
    steps = count_per_step(df)
    assert list(steps["cudaStreamSynchronize_calls"]) == [1] and list(steps["anomalies"]) == [0]
    assert count_totals(df)["sync_calls"] == {S: 2} and count_totals(df)["anomalies"]["events"] == 1
