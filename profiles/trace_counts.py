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
Source: the counts of tests/data/traces/README.md (made independently over the same "ph": "X" events), HTA
`hta/analyzers/cuda_kernel_analysis.py` for the analyser-returns-DataFrame style.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SYNC_APIS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cuStreamSynchronize",
             "cuEventSynchronize", "cuCtxSynchronize")
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")
COUNT_COLUMNS = ("kernels", "kernels_grid1", "memcpy_dtod_events", "memcpy_kernels", "memset_events",
                 "fill_kernels", "graph_launches", "kernels_in_graphs")
SYNC_COLUMNS = tuple(f"{api}_calls" for api in SYNC_APIS)
PROFILER_STEP = r"ProfilerStep#\d+"  # torch.profiler schedule step ranges
_API_KINDS = ("runtime", "driver")


def api_names(df: pd.DataFrame) -> pd.Series:
    """Per event: the CUDA API name of runtime/driver rows without a `_ptsz`/`_ptds` suffix, "" for other rows."""
    is_api = df["kind"].isin(_API_KINDS)
    return df["name"].where(is_api, "").str.replace(r"_pt(sz|ds)$", "", regex=True)


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
    fill_kernels, graph_launches, kernels_in_graphs: int, sync_calls: {API name: int}}.

    `sync_calls` lists only the SYNC_APIS that occur (count > 0), as tests/data/traces/README.md's table does;
    an empty dict means no host sync call. `df` is a trace in the `hotloop.profiles.trace_schema` schema.
    """
    sums = event_flags(df).sum()
    totals = {col: int(sums[col]) for col in COUNT_COLUMNS}
    totals["sync_calls"] = {api: int(sums[col]) for api, col in zip(SYNC_APIS, SYNC_COLUMNS) if sums[col]}
    return totals


def step_ranges(df: pd.DataFrame, step_range_name: str = "step", domain: str | None = None) -> pd.DataFrame:
    """The CPU-side step ranges of a trace: DataFrame with columns step (0, 1, ... in start order), range_name,
    start_us, dur_us; empty if there are none.

    Step ranges are user_annotation rows (record_function / NVTX ranges) named `step_range_name` (and, if `domain`
    is given, in that NVTX domain: hotloop's ranges are "step" in domain "hotloop"); if there are none, torch.profiler
    schedule ranges named "ProfilerStep#N". Source: torch.profiler's ProfilerStep#N record_function; Nsight
    NVTX_EVENTS push/pop ranges.
    """
    ranges = df["kind"].eq("user_annotation")
    named = ranges & df["name"].eq(step_range_name)
    if domain is not None:
        named &= df["domain"].eq(domain)
    chosen = df[named] if named.any() else df[ranges & df["name"].str.fullmatch(PROFILER_STEP)]
    out = chosen[["name", "start_us", "dur_us"]].rename(columns={"name": "range_name"})
    out = out.sort_values("start_us", kind="stable", ignore_index=True)
    out.insert(0, "step", np.arange(len(out)))
    return out


def assign_steps(df: pd.DataFrame, ranges: pd.DataFrame) -> pd.Series:
    """Per event of `df` (same index), the `step` of `ranges` (from `step_ranges`) it belongs to, Int64, NA outside.

    CUDA runtime/driver calls belong to the step whose range contains their start time (the latest-starting range
    that began at or before the call and has not ended; ranges are assumed not to nest, and calls of all threads
    count, so a backward thread's launches join their step). GPU activity (kernel, memcpy, memset) belongs to the
    step of the call with the same correlation id, i.e. where it was launched, not where it ran; replayed graph
    kernels share their cudaGraphLaunch's correlation id. Other rows get NA.
    """
    steps = pd.Series(pd.NA, index=df.index, dtype="Int64")
    if ranges.empty:
        return steps
    calls = df["kind"].isin(_API_KINDS)
    t = df.loc[calls, "start_us"].to_numpy()
    starts, ends = ranges["start_us"].to_numpy(), (ranges["start_us"] + ranges["dur_us"]).to_numpy()
    i = np.searchsorted(starts, t, side="right") - 1
    inside = (i >= 0) & (t <= ends[np.maximum(i, 0)])
    call_step = pd.Series(ranges["step"].to_numpy()[np.maximum(i, 0)], index=df.index[calls]).where(inside)
    steps[calls] = call_step.astype("Int64")
    launched = df.loc[calls, ["correlation"]].assign(step=steps[calls]).dropna().drop_duplicates("correlation")
    gpu = df["kind"].isin(("kernel", "memcpy", "memset"))
    steps[gpu] = df.loc[gpu, "correlation"].map(launched.set_index("correlation")["step"]).astype("Int64")
    return steps


def count_per_step(df: pd.DataFrame, step_range_name: str = "step", domain: str | None = None) -> pd.DataFrame:
    """Per-step counts: one row per step range (see `step_ranges`), columns step, range_name, start_us, dur_us,
    then COUNT_COLUMNS and SYNC_COLUMNS (int64 counts of the events `assign_steps` puts in that step).

    Empty (with these columns) when the trace has no step ranges. Events outside every step (warm-up, set-up)
    count only in `count_totals`.
    """
    ranges = step_ranges(df, step_range_name, domain)
    flags = event_flags(df)
    counts = flags.groupby(assign_steps(df, ranges)).sum().astype("int64")
    counts = counts.reindex(ranges["step"], fill_value=0).reset_index(drop=True)
    return pd.concat([ranges, counts], axis=1)
