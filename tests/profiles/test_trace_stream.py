"""The streaming count path of `hotloop inspect` (hotloop.profiles.trace_stream.count_frames over iter_kineto
frames) against the in-memory one (trace_counts.count_totals / count_per_step over the whole frame): the same
events counted, totals, anomalies and per-step table (values and dtypes) on every trace of tests/data/traces/, on
a synthetic trace (plain and gzip), on shuffled random traces full of anomalies and ties (frames of 1 event and
up), on frames with non-finite times; the printed report, text and --json, byte for byte; and the memory it keeps
per event."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hotloop.profiles.inspect_cmd import COUNTED_KINDS, count_trace, format_file, read_trace, step_records
from hotloop.profiles.kineto_reader import iter_kineto
from hotloop.profiles.trace_counts import count_per_step, count_totals
from hotloop.profiles.trace_schema import event_frame
from hotloop.profiles.trace_stream import count_frames
from lab.trace_synth import write_trace

TRACES = Path(__file__).parents[1] / "data" / "traces"
ALL_TRACES = sorted(p.relative_to(TRACES).as_posix() for p in TRACES.glob("**/*") if p.suffix in (".gz", ".sqlite"))
STEP_OPTIONS = [("step", None), ("nosuch", None), ("step", "hotloop"), ("ProfilerStep#5", None)]


def assert_same(got, df: pd.DataFrame, step_range_name="step", domain=None):
    """`got` (a TraceCounts) is what the in-memory path gives for frame `df`."""
    assert got.events == len(df)
    assert got.totals == count_totals(df)
    pd.testing.assert_frame_equal(got.steps, count_per_step(df, step_range_name, domain))


@pytest.mark.parametrize("rel", ALL_TRACES)
@pytest.mark.parametrize("step_range_name,domain", STEP_OPTIONS)
def test_every_test_trace_counts_the_same_streamed_and_in_memory(rel, step_range_name, domain):
    path = TRACES / rel
    df = read_trace(path)
    assert_same(count_trace(path, step_range_name, domain), df, step_range_name, domain)
    if path.suffix == ".gz":  # many small frames: every frame boundary case of a real trace
        frames = iter_kineto(path, kinds=COUNTED_KINDS, batch_events=97)
    else:  # an Nsight export is one frame in inspect; cut it into parts here
        frames = (df.iloc[i : i + 50] for i in range(0, len(df), 50))
    assert_same(count_frames(frames, step_range_name, domain), df, step_range_name, domain)


@pytest.mark.parametrize("rel", ALL_TRACES)
def test_the_printed_report_is_the_in_memory_one_byte_for_byte(rel, capsys):
    from hotloop.guards.cli import main

    path = str(TRACES / rel)
    df = read_trace(path)
    totals, steps = count_totals(df), count_per_step(df)
    assert main(["inspect", path]) == 0
    assert capsys.readouterr().out == format_file(path, len(df), totals, steps) + "\n"
    assert main(["inspect", "--json", path, path + ".missing"]) == 2
    doc = {
        "files": {path: {"totals": totals, "steps": step_records(steps) if len(steps) else None}},
        "errors": {path + ".missing": "cannot read: No such file or directory"},
    }
    assert capsys.readouterr().out == json.dumps(doc, indent=2) + "\n"


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_synthetic_trace_counts_the_same(tmp_path, suffix):
    path = tmp_path / f"synth{suffix}"
    summary = write_trace(path, 40_000)
    df = read_trace(path)
    got = count_trace(path)
    assert_same(got, df)
    assert got.totals["kernels"] == summary.kernels and len(got.steps) > 20
    assert_same(count_frames(iter_kineto(path, kinds=COUNTED_KINDS, batch_events=3001)), df)


def _x(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


_APIS = [
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaGraphLaunch",
    "cudaStreamSynchronize",
    "cudaStreamSynchronize_ptds",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaStreamBeginCapture",
    "cudaStreamEndCapture",
    "cudaLaunchCooperativeKernel",
]
_KERNELS = ["gemm", "memcpy128", "void at::native::FillFunctor<float>", "reduce_kernel"]


def _random_events(rng: random.Random, gpu=True, cpu=True) -> list[dict]:
    """A damaged trace: ranges (some with no end, some overlapping, on two threads), calls of every counted kind
    of API (duplicate, missing and out-of-window correlation ids; ts 0 / < 0; dur < 0; stream captures), GPU
    events (orphans, ts 0 dur 0, dur 0, grid (1, 1, 1) or none), GPU ranges with dur < 0, cpu_ops; integer
    times from a small range, so that many events tie."""
    events, corr = [], 100
    range_name = rng.choice(["step", "ProfilerStep#{}"])
    for k in range(rng.randint(0, 7)):
        ts = 1000 + 100 * k + rng.choice([0, 0, 3])
        dur = rng.choice([90, 90, 120, -ts, 0])
        events.append(_x("user_annotation", range_name.format(k), ts, dur, tid=rng.choice([1, 1, 2])))
        if rng.random() < 0.3:
            events.append(_x("user_annotation", f"ProfilerStep#{k}", ts + rng.choice([0, 1]), 50))
    for _ in range(rng.randint(0, 60) if cpu else 0):
        api = rng.choice(_APIS)
        corr = rng.choice([corr + 1, corr + 1, corr + 1, corr, 5])  # new, duplicate, below every GPU event's
        ts = rng.choice([0, -3]) if rng.random() < 0.05 else rng.randint(990, 1800)
        args = {} if rng.random() < 0.05 else {"correlation": corr}
        tid = rng.choice([1, 1, 2, 3])
        cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
        events.append(_x(cat, api, ts, rng.choice([2, 2, 0, -1]), tid=tid, **args))
        if gpu and "correlation" in args and rng.random() < 0.85 and ("Launch" in api or "Mem" in api):
            for _ in range(rng.choice([1, 1, 3]) if api == "cudaGraphLaunch" else 1):
                gts, gdur = (0, 0) if rng.random() < 0.05 else (ts + rng.randint(0, 300), rng.choice([3, 3, 0]))
                if api == "cudaMemcpyAsync":
                    events.append(
                        _x(
                            "gpu_memcpy",
                            rng.choice(["Memcpy DtoD (Device -> Device)", "Memcpy HtoD (Pageable -> Device)"]),
                            gts,
                            gdur,
                            pid=0,
                            tid=7,
                            correlation=corr,
                            bytes=64,
                            stream=7,
                            device=0,
                        )
                    )
                elif api == "cudaMemsetAsync":
                    events.append(_x("gpu_memset", "Memset (Device)", gts, gdur, pid=0, tid=7, correlation=corr))
                else:
                    grid = rng.choice([[1, 1, 1], [8, 1, 1], None])
                    events.append(
                        _x(
                            "kernel",
                            rng.choice(_KERNELS),
                            gts,
                            gdur,
                            pid=0,
                            tid=rng.choice([7, 8]),
                            correlation=corr,
                            stream=7,
                            device=0,
                            **({"grid": grid, "block": [32, 1, 1]} if grid else {}),
                        )
                    )
    for _ in range(rng.randint(0, 4) if gpu else 0):  # orphans: before the calls, mid-trace, without an id
        args = rng.choice([{"correlation": 1}, {"correlation": corr + 1000}, {}, {"correlation": 150}])
        events.append(_x("kernel", "orphan", rng.randint(1000, 1500), 2, pid=0, tid=7, **args))
    for k in range(rng.choice([0, 0, 1, 2]) if cpu else 0):  # launched after the GPU side stopped recording
        events.append(_x("cuda_runtime", "cudaLaunchKernel", rng.randint(1000, 1800), 2, correlation=corr + 2000 + k))
    for _ in range(rng.randint(0, 3)):
        events.append(_x("gpu_user_annotation", "fwd", rng.randint(1000, 1500), rng.choice([5, -2]), pid=0, tid=7))
        events.append(_x("cpu_op", "aten::mm", rng.randint(1000, 1500), rng.choice([5, -2])))
    rng.shuffle(events)
    return events


@pytest.mark.parametrize("seed", range(40))
def test_shuffled_random_damaged_traces_count_the_same_in_frames_of_any_size(tmp_path, seed):
    rng = random.Random(seed)
    events = _random_events(rng, gpu=seed % 10 != 3, cpu=seed % 10 != 7)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    df = read_trace(path)
    for step_range_name in ("step", "nosuch"):
        for batch in (1, 7, 10**6):
            got = count_frames(iter_kineto(path, kinds=COUNTED_KINDS, batch_events=batch), step_range_name)
            assert_same(got, df, step_range_name)


def test_the_random_traces_hold_what_they_are_meant_to_test(tmp_path):
    """The generator above reaches the cases: anomalies of every kind, window edges, captured launches, ranges
    with no end, steps holding anomalies (else the equality test would prove little)."""
    seen, edges, damaged_steps, no_end, captured = set(), set(), 0, 0, 0
    for seed in range(40):
        path = tmp_path / f"t{seed}.json"
        events = _random_events(random.Random(seed))
        path.write_text(json.dumps({"traceEvents": events}))
        got = count_trace(path)
        seen |= {c for c, n in got.totals["anomalies"]["counts"].items() if n}
        edges |= {k for k, n in got.totals["anomalies"]["window_edge"].items() if n}
        if len(got.steps):
            damaged_steps += int(got.steps["anomalies"].gt(0).sum())
            no_end += int(got.steps["anomaly"].str.contains("end read as its thread's last event").sum())
        captured += any(e["name"] == "cudaStreamBeginCapture" for e in events)
    assert seen == {"ts_not_positive", "dur_negative", "gpu_dur_zero", "gpu_without_launch", "launch_without_gpu"}
    assert edges == {"gpu_launched_before_trace", "launches_after_gpu_trace"}
    assert damaged_steps > 20 and no_end > 5 and captured > 20


def test_an_empty_trace_counts_nothing(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    got = count_trace(path)
    assert_same(got, read_trace(path))
    assert got.events == 0 and got.steps.empty and got.totals["kernels"] == 0


def test_frames_with_non_finite_times_count_the_same():
    """Kineto JSON cannot hold NaN/Infinity times (a TraceReadError), other frames can: the streaming counter
    takes any schema frames, split anywhere."""
    t, nan, inf = 1.7e12, float("nan"), float("inf")
    rows = [
        ("ProfilerStep#1", "user_annotation", t, 100.0, None, "1"),
        ("cudaLaunchKernel", "runtime", t + 1, 1.0, 1, "1"),
        ("k0", "kernel", 0.0, 0.0, 1, "7"),
        ("ProfilerStep#2", "user_annotation", t + 200, nan, None, "1"),
        ("cudaLaunchKernel", "runtime", t + 201, inf, 2, "1"),
        ("k5", "kernel", t + 209, nan, 2, "7"),
        ("cudaStreamSynchronize", "runtime", nan, 1.0, 3, "1"),
        ("cudaLaunchKernel", "runtime", t + 220, 1.0, 4, "2"),
        ("ProfilerStep#3", "user_annotation", t + 150, -5.0, None, "3"),  # no valid event on its thread: trace end
        ("fwd", "annotation", t + 9, -3.0, None, "7"),
    ]
    df = event_frame(
        {c: [r[i] for r in rows] for i, c in enumerate(("name", "kind", "start_us", "dur_us", "correlation", "tid"))}
    )
    for size in (1, 3, len(df)):
        assert_same(count_frames(df.iloc[i : i + size] for i in range(0, len(df), size)), df)
    steps = count_frames([df]).steps
    assert steps["anomaly"].str.contains("end read as its thread's last event").sum() == 2


def _frames(n_frames: int, calls: int = 5000):
    """Frames of `calls` cudaLaunchKernel calls and their kernels each, made one at a time; a step every 50 calls."""
    corr, ranges = np.arange(calls), calls // 50
    for f in range(n_frames):
        t = 1e12 + f * calls * 10 + corr * 10.0
        c = f * calls + corr + 1
        yield event_frame(
            {
                "name": pd.Series(["cudaLaunchKernel"] * calls + ["gemm"] * calls + ["step"] * ranges, dtype="str"),
                "kind": pd.Series(["runtime"] * calls + ["kernel"] * calls + ["user_annotation"] * ranges),
                "start_us": np.r_[t, t + 5, t[::50] - 1],
                "dur_us": np.r_[np.full(2 * calls, 2.0), np.full(ranges, 499.0)],
                "correlation": pd.array(np.r_[c, c, np.zeros(ranges, int)], dtype="Int64"),
                "tid": pd.Series(["1"] * calls + ["7"] * calls + ["1"] * ranges, dtype="str"),
            }
        )


def _peak(n_frames: int) -> tuple[int, object]:
    tracemalloc.start()
    try:
        got = count_frames(_frames(n_frames))
        return tracemalloc.get_traced_memory()[1], got
    finally:
        tracemalloc.stop()


def test_memory_kept_grows_by_tens_of_bytes_per_event_not_with_the_frame():
    """Four times the events: the peak grows by the ~25 bytes kept per call and ~10 per GPU event (plus the final
    sorts and the per-step table), far under the ~150 bytes per event of the whole frame and ~300 of its pandas
    analysis, and the one-frame working set does not grow at all."""
    small, _ = _peak(4)
    big, got = _peak(16)
    assert got.totals["kernels"] == 80_000 and len(got.steps) == 1600 and got.steps["kernels"].eq(50).all()
    per_event = (big - small) / (12 * 10_000)
    assert per_event < 80, per_event
