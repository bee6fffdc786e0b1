"""Trace anomalies: events of the `hotloop.profiles.trace_schema` frame whose recorded time or link cannot be taken
at face value. They are counted and named, not absorbed: the readers keep every event as the profiler wrote it,
and the analysers (`hotloop.profiles.trace_counts`, `hotloop.guards.step_metrics`) count what has a clear meaning
and leave the timing of a damaged step out of medians and baseline comparisons.

Anomalies (`anomaly_flags`, one boolean column each, ANOMALY_COLUMNS):

- ts_not_positive: start_us <= 0 (finite). Both profilers put events on a clock that is far from 0 (Kineto:
  microseconds on the host's clock, ~1e12-1e15; Nsight: since the session start, after the CUDA setup), so 0 is an
  unset timestamp: CUPTI leaves a record's start/end at 0 when it could not take them, and Kineto writes such a
  kernel as ts 0, dur 0 (seen: one made a step's gpu_span_us 1.6e15 us).
- dur_negative: dur_us < 0 (finite), e.g. a range whose end was never written (end 0 - start).
- gpu_dur_zero: a kernel, memcpy or memset with dur_us == 0: GPU work takes time, so an unset end. (A CPU event of
  dur 0 is not an anomaly: integer-microsecond traces write sub-microsecond calls as 0, e.g. 8452 runtime calls of
  tests/data/traces/kineto-public/trace_diff_test_test.json.gz.)
- time_not_finite: start_us or dur_us NaN or infinite (JSON `NaN`/`Infinity`).
- gpu_without_launch: a kernel/memcpy/memset whose correlation id is NA or that of no runtime/driver call, while
  the trace's CPU side was recording when it was launched (its correlation id is above the lowest of the trace's
  CUDA calls).
- launch_without_gpu: a kernel or graph launch call (cudaLaunchKernel*, cuLaunchKernel*, cu(da)LaunchCooperative
  Kernel*, cudaGraphLaunch, cuGraphLaunch; `_ptsz`/`_ptds` dropped) with no GPU event of its correlation id, while
  the GPU side was still recording (its correlation id is below the highest of the trace's GPU events), and not
  inside a stream capture on its thread (between cu(da)StreamBeginCapture* and cu(da)StreamEndCapture*, where
  launches are recorded into a graph and run nothing). Copy and memset calls are not checked: a 0-byte
  cudaMemsetAsync launches no GPU work (seen in critical_path_alexnet.json.gz and nccl_parser_config_nccl_data.json.gz).

Window edges (`window_edges`) are not anomalies: CUPTI correlation ids grow with every CUDA call of a process, so a
GPU event whose id is below every recorded call's was launched before the trace's CPU side started (614 of them in
trace_diff_test_test.json.gz: warm-up kernels that ran inside the window), and a launch whose id is above every GPU
event's ran after the GPU side stopped. A trace with no CUDA calls at all (GPU side only) or no GPU events at all
(CPU side only) has only edges.

Sources: the CUPTI Activity API (correlation ids shared by an API record and the activity it launched, monotonic
per process; start/end timestamps of CUpti_ActivityKernel*); Kineto's Chrome-trace export; HTA
`hta/common/trace_parser.py` for keeping parse and analysis apart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

GPU_KINDS = ("kernel", "memcpy", "memset")
API_KINDS = ("runtime", "driver")
ANOMALY_COLUMNS = (
    "ts_not_positive",
    "dur_negative",
    "gpu_dur_zero",
    "time_not_finite",
    "gpu_without_launch",
    "launch_without_gpu",
)
BAD_TIME_COLUMNS = ("ts_not_positive", "dur_negative", "time_not_finite")
"""The anomalies that make an event's own interval unusable (an event with dur 0 still has a place in time)."""
LAUNCH_API = r"^cu(?:da)?(?:Launch(?:Cooperative)?Kernel|GraphLaunch)"
"""Kernel and graph launch calls (after dropping `_ptsz`/`_ptds`): each must show GPU activity."""
_CAPTURE_BEGIN, _CAPTURE_END = r"^cu(?:da)?StreamBeginCapture", r"^cu(?:da)?StreamEndCapture"
EDGE_KEYS = ("gpu_launched_before_trace", "launches_after_gpu_trace")
_PROBLEMS = {
    "ts_not_positive": None,
    "dur_negative": "dur < 0",
    "gpu_dur_zero": "dur 0",
    "time_not_finite": "non-finite ts/dur",
    "gpu_without_launch": "no launching call",
    "launch_without_gpu": "no GPU event",
}
_NAME_WIDTH = 60


def api_names(df: pd.DataFrame) -> pd.Series:
    """Per event (str, same index): the CUDA API name of runtime/driver rows without a `_ptsz`/`_ptds` suffix,
    "" for other rows. Source: CUPTI's per-thread-default-stream API variants (cudaLaunchKernel_ptsz, ...)."""
    is_api = df["kind"].isin(API_KINDS)
    return df["name"].where(is_api, "").astype(str).str.replace(r"_pt(sz|ds)$", "", regex=True)


def valid_time(df: pd.DataFrame) -> pd.Series:
    """Per event (bool, same index): its interval [start_us, start_us + dur_us] can be used, i.e. finite start > 0
    and finite dur >= 0 (none of BAD_TIME_COLUMNS)."""
    start, dur = df["start_us"].to_numpy("float64"), df["dur_us"].to_numpy("float64")
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(start) & np.isfinite(dur) & (start > 0) & (dur >= 0)
    return pd.Series(ok, index=df.index)


def _in_capture(df: pd.DataFrame, api: pd.Series) -> pd.Series:
    """Per event: a CUDA call made while its thread had a stream capture open (begin calls minus end calls > 0)."""
    calls = df.loc[api.ne(""), ["pid", "tid", "start_us"]].assign(api=api[api.ne("")])
    if calls.empty:
        return pd.Series(False, index=df.index)
    calls = calls.sort_values(["pid", "tid", "start_us"], kind="stable")
    delta = calls["api"].str.contains(_CAPTURE_BEGIN).astype(int) - calls["api"].str.contains(_CAPTURE_END).astype(int)
    depth_before = delta.groupby([calls["pid"], calls["tid"]], observed=True).cumsum() - delta
    return pd.Series(depth_before.gt(0), index=calls.index).reindex(df.index, fill_value=False)


def _unmatched(df: pd.DataFrame, api: pd.Series) -> tuple[pd.Series, pd.Series, pd.Series, pd.Series]:
    """(gpu_without_launch, launch_without_gpu, GPU window edge, launch window edge): boolean Series on df's index."""
    corr = df["correlation"]
    gpu = df["kind"].isin(GPU_KINDS)
    gpu_ids = corr[gpu].dropna()
    call_ids = corr[df["kind"].isin(API_KINDS)].dropna()
    gpu_lone = gpu & ~corr.isin(set(call_ids.tolist())).fillna(False).astype(bool)
    gpu_edge = gpu_lone & (corr.lt(call_ids.min()).fillna(False).astype(bool) if len(call_ids) else True)
    launch = api.str.contains(LAUNCH_API) & ~_in_capture(df, api)
    launch_lone = launch & ~corr.isin(set(gpu_ids.tolist())).fillna(False).astype(bool)
    launch_edge = launch_lone & (corr.gt(gpu_ids.max()).fillna(False).astype(bool) if len(gpu_ids) else True)
    return gpu_lone & ~gpu_edge, launch_lone & ~launch_edge, gpu_edge, launch_edge


def anomaly_flags(df: pd.DataFrame) -> pd.DataFrame:
    """Boolean DataFrame, one row per event of `df` (same index), columns ANOMALY_COLUMNS (definitions in the
    module docstring). `df` is a trace in the `hotloop.profiles.trace_schema` schema."""
    start, dur = df["start_us"].astype("float64"), df["dur_us"].astype("float64")
    finite = np.isfinite(start) & np.isfinite(dur)
    gpu = df["kind"].isin(GPU_KINDS)
    api = api_names(df)
    gpu_lone, launch_lone, _, _ = _unmatched(df, api)
    flags = {
        "ts_not_positive": finite & start.le(0),
        "dur_negative": finite & dur.lt(0),
        "gpu_dur_zero": gpu & finite & dur.eq(0),
        "time_not_finite": ~finite,
        "gpu_without_launch": gpu_lone,
        "launch_without_gpu": launch_lone,
    }
    return pd.DataFrame(flags, index=df.index).astype(bool)


def window_edges(df: pd.DataFrame) -> dict[str, int]:
    """{gpu_launched_before_trace, launches_after_gpu_trace: int}: the unmatched events that are window edges,
    not anomalies (module docstring)."""
    _, _, gpu_edge, launch_edge = _unmatched(df, api_names(df))
    return dict(zip(EDGE_KEYS, (int(gpu_edge.sum()), int(launch_edge.sum()))))


def _subject(kind: str, name: str, api: str) -> str:
    short = name if len(name) <= _NAME_WIDTH else name[: _NAME_WIDTH - 3] + "..."
    if kind in GPU_KINDS:
        return kind
    if kind in API_KINDS:
        return api or short
    label = {"user_annotation": "range", "annotation": "GPU range", "cpu_op": "op"}.get(kind, "event")
    return f"{label} {short!r}"


def anomaly_reasons(df: pd.DataFrame, flags: pd.DataFrame | None = None) -> pd.Series:
    """Per event (str, same index): "" for a clean event, else what is wrong with it, e.g. "kernel with ts 0, dur 0",
    "range 'step' with dur < 0", "cudaLaunchKernel with no GPU event". `flags`: `anomaly_flags(df)` if computed
    already."""
    flags = anomaly_flags(df) if flags is None else flags
    out = pd.Series("", index=df.index, dtype=object)
    bad = flags.any(axis=1)
    if not bad.any():
        return out
    rows = df.loc[bad]
    api = api_names(rows)
    for i, row_flags in flags.loc[bad].iterrows():
        problems = []
        for col in ANOMALY_COLUMNS:
            if row_flags[col]:
                problems.append(_PROBLEMS[col] or ("ts 0" if rows.at[i, "start_us"] == 0 else "ts < 0"))
        out[i] = f"{_subject(str(rows.at[i, 'kind']), str(rows.at[i, 'name']), api[i])} with {', '.join(problems)}"
    return out


def count_anomalies(df: pd.DataFrame, max_reasons: int = 10) -> dict:
    """The anomalies of trace `df`, JSON-ready: {"events": int (events with any anomaly), "counts": {column of
    ANOMALY_COLUMNS: int} (an event may count in several), "reasons": {reason: int} (`anomaly_reasons`, the
    `max_reasons` most frequent, then by name), "window_edge": {EDGE_KEYS: int} (`window_edges`, not anomalies)}."""
    flags = anomaly_flags(df)
    reasons = anomaly_reasons(df, flags)
    top = reasons[reasons.ne("")].value_counts()
    top = sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:max_reasons]
    return {
        "events": int(flags.any(axis=1).sum()),
        "counts": {c: int(flags[c].sum()) for c in ANOMALY_COLUMNS},
        "reasons": {r: int(n) for r, n in top},
        "window_edge": window_edges(df),
    }


def describe_anomalies(anomalies: dict) -> str:
    """One line for people from a `count_anomalies` dict: "none", or e.g. "2 events: kernel with ts 0, dur 0 x1;
    cudaLaunchKernel with no GPU event x1", plus the window edges when there are any (said not to be anomalies).
    Events beyond the reasons listed are summed as "; and N more"."""
    n = anomalies["events"]
    text = (
        "none"
        if not n
        else f"{n} event{'s' * (n != 1)}: " + "; ".join(f"{r} x{k}" for r, k in anomalies["reasons"].items())
    )
    listed = sum(anomalies["reasons"].values())
    if listed < n:
        text += f"; and {n - listed} more"
    edges = anomalies.get("window_edge", {})
    notes = []
    if edges.get("gpu_launched_before_trace"):
        notes.append(f"{edges['gpu_launched_before_trace']} GPU events launched before the trace's first CUDA call")
    if edges.get("launches_after_gpu_trace"):
        notes.append(f"{edges['launches_after_gpu_trace']} launches after the trace's last GPU event")
    return text + (f" (window edges, not anomalies: {'; '.join(notes)})" if notes else "")


def join_reasons(reasons: pd.Series) -> str:
    """The distinct non-empty `reasons` (from `anomaly_reasons`) of a group of events, most frequent first, with
    " xN" where one occurs N > 1 times, joined by "; "; "" when there are none."""
    counts = reasons[reasons.ne("")].value_counts()
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "; ".join(r if n == 1 else f"{r} x{n}" for r, n in ordered)
