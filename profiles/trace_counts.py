"""Trace counters: the guard metrics of docs/criteria.md counted over the event schema of
`hotloop.profiles.trace_schema` (a Kineto or Nsight Systems trace read by `hotloop.profiles.kineto_reader` /
`hotloop.profiles.nsight_reader`), for the whole trace and per training step.

What each count is (one flag per event, `event_flags`):

- kernels: kind kernel.
- kernels_grid1: kernels with grid == (1, 1, 1).
- memcpy_dtod_events: memcpy with copy_kind DtoD (Kineto `Memcpy DtoD (Device -> Device)`, Nsight copyKind 8).
- memcpy_kernels: kernels named `memcpy*` (e.g. `memcpy128`): a D2D copy captured into a CUDA graph runs as a
  kernel, not as a memcpy (seen on the H200).
- memset_events: kind memset (Kineto `gpu_memset`, Nsight CUPTI_ACTIVITY_KIND_MEMSET).
- fill_kernels: kernels whose name contains "fill" in any case (`zero_()`/`fill_()` run a FillFunctor kernel,
  not a memset).
- graph_launches: runtime/driver calls cudaGraphLaunch / cuGraphLaunch.
- kernels_in_graphs: kernels whose correlation id is that of a graph launch (a replay's kernels share it).
- <api>_calls (SYNC_COLUMNS): runtime/driver calls of each API in SYNC_APIS.

API names are compared after dropping CUPTI's per-thread-default-stream suffix `_ptsz` / `_ptds`.

Damaged events (`hotloop.profiles.trace_anomalies`: ts 0, negative durations, unmatched correlations, ...) are
counted, not absorbed: every event with a clear meaning counts (a kernel of ts 0 still counts, in the step that
launched it); `count_totals` says how many anomalies the trace holds, `count_per_step` which steps hold them, and a
step range whose end was never written (negative or non-finite dur) runs to the end of its thread's events.

Source: the counts of tests/data/traces/README.md (made independently over the same "ph": "X" events), HTA
`hta/analyzers/cuda_kernel_analysis.py` for the analyser-returns-DataFrame style.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hotloop.profiles.trace_anomalies import anomaly_reasons, api_names, count_anomalies, join_reasons, valid_time

SYNC_APIS = (
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaDeviceSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuCtxSynchronize",
)
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")
COUNT_COLUMNS = (
    "kernels",
    "kernels_grid1",
    "memcpy_dtod_events",
    "memcpy_kernels",
    "memset_events",
    "fill_kernels",
    "graph_launches",
    "kernels_in_graphs",
)
SYNC_COLUMNS = tuple(f"{api}_calls" for api in SYNC_APIS)
PROFILER_STEP = r"ProfilerStep#\d+"  # torch.profiler schedule step ranges
_API_KINDS = ("runtime", "driver")


def event_flags(df: pd.DataFrame) -> pd.DataFrame:
    """Boolean DataFrame, one row per event of `df` (same index), columns COUNT_COLUMNS + SYNC_COLUMNS: whether
    the event counts towards each metric (definitions in the module docstring)."""
    kernel = df["kind"].eq("kernel")
    api = api_names(df)
    grid1 = df[["grid_x", "grid_y", "grid_z"]].eq(1).fillna(False).all(axis=1)
    launch = api.isin(GRAPH_LAUNCH_APIS)
    graph_corr = df.loc[launch, "correlation"].dropna()
    flags = {
        "kernels": kernel,
        "kernels_grid1": kernel & grid1,
        "memcpy_dtod_events": df["kind"].eq("memcpy") & df["copy_kind"].eq("DtoD"),
        "memcpy_kernels": kernel & df["name"].str.startswith("memcpy"),
        "memset_events": df["kind"].eq("memset"),
        "fill_kernels": kernel & df["name"].str.contains("fill", case=False, regex=False),
        "graph_launches": launch,
        "kernels_in_graphs": kernel & df["correlation"].isin(graph_corr).fillna(False).astype(bool),
    }
    flags.update({col: api.eq(name) for col, name in zip(SYNC_COLUMNS, SYNC_APIS)})
    return pd.DataFrame(flags, index=df.index).astype(bool)


def count_totals(df: pd.DataFrame) -> dict:
    """Whole-trace counts: {kernels, kernels_grid1, memcpy_dtod_events, memcpy_kernels, memset_events,
    fill_kernels, graph_launches, kernels_in_graphs: int, sync_calls: {API name: int}, anomalies: {...}}.

    `sync_calls` lists only the SYNC_APIS that occur (count > 0), as tests/data/traces/README.md's table does;
    an empty dict means no host sync call. `anomalies`: `hotloop.profiles.trace_anomalies.count_anomalies`
    ({"events", "counts", "reasons", "window_edge"}); the counts above include anomalous events (each still says
    what ran). `df` is a trace in the `hotloop.profiles.trace_schema` schema.
    """
    sums = event_flags(df).sum()
    totals = {col: int(sums[col]) for col in COUNT_COLUMNS}
    totals["sync_calls"] = {api: int(sums[col]) for api, col in zip(SYNC_APIS, SYNC_COLUMNS) if sums[col]}
    totals["anomalies"] = count_anomalies(df)
    return totals


def step_ranges(df: pd.DataFrame, step_range_name: str = "step", domain: str | None = None) -> pd.DataFrame:
    """The CPU-side step ranges of a trace: DataFrame with columns step (0, 1, ... in start order), range_name,
    start_us, dur_us (float64, us), anomaly (str: what is wrong with the range event itself, "" when nothing:
    `hotloop.profiles.trace_anomalies.anomaly_reasons`); empty if there are none.

    Step ranges are user_annotation rows (record_function / NVTX ranges) named `step_range_name` (and, if `domain`
    is given, in that NVTX domain: hotloop's ranges are "step" in domain "hotloop"); if there are none, torch.profiler
    schedule ranges named "ProfilerStep#N". A range with no valid end (dur negative or not finite: the end was never
    written) runs to the end of its thread's last event with a valid time (same pid and tid; the trace's last event
    if the thread has no other), so the calls it holds still count in it; its anomaly says so. Source:
    torch.profiler's ProfilerStep#N record_function; Nsight NVTX_EVENTS push/pop ranges.
    """
    return step_ranges_from(choose_step_range_events(df, step_range_name, domain), lambda rows: _thread_ends(df, rows))


def choose_step_range_events(
    df: pd.DataFrame, step_range_name: str = "step", domain: str | None = None
) -> pd.DataFrame:
    """The events of `df` that are its step ranges (the rule of `step_ranges`): the user_annotation rows named
    `step_range_name` (in NVTX domain `domain` when given), else those named ProfilerStep#N; rows of df, in its
    order. Any part of df that holds all of these rows gives the same rows."""
    ranges = df["kind"].eq("user_annotation")
    named = ranges & df["name"].eq(step_range_name)
    if domain is not None:
        named &= df["domain"].eq(domain)
    return df[named] if named.any() else df[ranges & df["name"].str.fullmatch(PROFILER_STEP)]


def step_ranges_from(chosen: pd.DataFrame, thread_ends) -> pd.DataFrame:
    """`step_ranges` of the range events `chosen` (from `choose_step_range_events`, in the trace's start order).
    `thread_ends(rows)`: for the rows of `chosen` with no valid end, the latest end among the valid events of each
    one's thread, else of the trace (a float64 Series on rows' index; `_thread_ends` for a whole frame, the kept
    per-thread maxima for the streaming path of `hotloop.profiles.trace_stream`)."""
    out = chosen[["name", "start_us", "dur_us"]].rename(columns={"name": "range_name"})
    out["anomaly"] = anomaly_reasons(chosen).astype(str) if len(chosen) else pd.Series(dtype=str)
    no_end = ~np.isfinite(out["dur_us"]) | out["dur_us"].lt(0)
    if no_end.any():
        out.loc[no_end, "dur_us"] = thread_ends(chosen[no_end]) - out.loc[no_end, "start_us"]
        out.loc[no_end, "dur_us"] = out.loc[no_end, "dur_us"].clip(lower=0)
        out.loc[no_end, "anomaly"] += " (end read as its thread's last event)"
    out = out.sort_values("start_us", kind="stable", ignore_index=True)
    out.insert(0, "step", np.arange(len(out)))
    return out[["step", "range_name", "start_us", "dur_us", "anomaly"]]


def _thread_ends(df: pd.DataFrame, rows: pd.DataFrame) -> pd.Series:
    """Per row of `rows` (events of `df`): the latest end among the other events of its pid and tid that have a
    valid time, else among all of df's valid events (NaN when there is none)."""
    ok = valid_time(df)
    ends = (df["start_us"] + df["dur_us"]).where(ok)
    trace_end = ends.max()
    out = {}
    for i, row in rows.iterrows():
        same = df["pid"].eq(row["pid"]) & df["tid"].eq(row["tid"]) & ok
        same[i] = False
        out[i] = ends[same].max() if same.any() else trace_end
    return pd.Series(out, dtype="float64")


def step_anomalies(
    df: pd.DataFrame, ranges: pd.DataFrame, steps: pd.Series, flags: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per step range (rows aligned with `ranges`, from `step_ranges`): anomalies (int64, the anomalous events
    `steps` (from `assign_steps`) puts in that step, the range event itself included) and anomaly (str, their
    reasons joined: `hotloop.profiles.trace_anomalies.join_reasons`; "" for a clean step). A step with an anomaly
    is damaged: its counts still hold every event with a clear meaning, its timing does not.
    `flags`: `anomaly_flags(df)` if computed already."""
    reasons = anomaly_reasons(df, flags).astype(object)
    held = steps.notna() & reasons.ne("")
    pieces = pd.concat(
        [
            pd.DataFrame({"step": ranges["step"].to_numpy(), "reason": ranges["anomaly"].astype(object).to_numpy()}),
            pd.DataFrame({"step": steps[held].astype("int64").to_numpy(), "reason": reasons[held].to_numpy()}),
        ],
        ignore_index=True,
    )
    pieces = pieces[pieces["reason"].ne("")]
    grouped = pieces.groupby("step")["reason"]
    counts = grouped.size().reindex(ranges["step"], fill_value=0).astype("int64")
    text = grouped.agg(join_reasons).reindex(ranges["step"], fill_value="").astype(object)
    return pd.DataFrame({"anomalies": counts.to_numpy(), "anomaly": text.to_numpy()})


def assign_steps(df: pd.DataFrame, ranges: pd.DataFrame) -> pd.Series:
    """Per event of `df` (same index), the `step` of `ranges` (from `step_ranges`) it belongs to, Int64, NA outside.

    CUDA runtime/driver calls belong to the step whose range contains their start time (the latest-starting range
    that began at or before the call and has not ended; ranges are assumed not to nest, and calls of all threads
    count, so a backward thread's launches join their step). GPU activity (kernel, memcpy, memset) belongs to the
    step of the call with the same correlation id, i.e. where it was launched, not where it ran; replayed graph
    kernels share their cudaGraphLaunch's correlation id. Other rows get NA, and so do calls with no valid start
    (ts <= 0 or not finite: their place in time is unknown; `count_totals` still counts them) and the GPU
    activity they launched.
    """
    steps = pd.Series(pd.NA, index=df.index, dtype="Int64")
    if ranges.empty:
        return steps
    calls = df["kind"].isin(_API_KINDS)
    call_step = steps_at(ranges, df.loc[calls, "start_us"].to_numpy("float64"))
    steps[calls] = pd.Series(call_step, index=df.index[calls]).where(call_step >= 0).astype("Int64")
    launched = df.loc[calls, ["correlation"]].assign(step=steps[calls]).dropna().drop_duplicates("correlation")
    gpu = df["kind"].isin(("kernel", "memcpy", "memset"))
    steps[gpu] = df.loc[gpu, "correlation"].map(launched.set_index("correlation")["step"]).astype("Int64")
    return steps


def steps_at(ranges: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """The `step` of `ranges` (from `step_ranges`) holding each time of `t` (the start of a CUDA call), as
    `assign_steps` places calls: the latest-starting range that began at or before it and has not ended; -1 for
    none and for a time that is not a valid start (<= 0 or not finite). int64, one per time."""
    t = np.asarray(t, dtype="float64")
    if ranges.empty:
        return np.full(len(t), -1, np.int64)
    starts, ends = ranges["start_us"].to_numpy("float64"), (ranges["start_us"] + ranges["dur_us"]).to_numpy("float64")
    i = np.searchsorted(starts, t, side="right") - 1
    with np.errstate(invalid="ignore"):  # a call with no valid start (ts <= 0, NaN) is in no step
        inside = (i >= 0) & (t <= ends[np.maximum(i, 0)]) & np.isfinite(t) & (t > 0)
    return np.where(inside, ranges["step"].to_numpy()[np.maximum(i, 0)], -1).astype(np.int64)


def count_per_step(df: pd.DataFrame, step_range_name: str = "step", domain: str | None = None) -> pd.DataFrame:
    """Per-step counts: one row per step range (see `step_ranges`), columns step, range_name, start_us, dur_us,
    then COUNT_COLUMNS and SYNC_COLUMNS (int64 counts of the events `assign_steps` puts in that step), then
    anomalies and anomaly (`step_anomalies`: the step's anomalous events and what they are; "" when clean).

    Empty (with these columns) when the trace has no step ranges. Events outside every step (warm-up, set-up)
    count only in `count_totals`.
    """
    ranges = step_ranges(df, step_range_name, domain)
    flags = event_flags(df)
    steps = assign_steps(df, ranges)
    counts = flags.groupby(steps).sum().astype("int64")
    counts = counts.reindex(ranges["step"], fill_value=0).reset_index(drop=True)
    return pd.concat([ranges.drop(columns="anomaly"), counts, step_anomalies(df, ranges, steps)], axis=1)
