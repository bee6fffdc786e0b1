"""Per-step metrics of every docs/criteria.md criterion that a trace can show, from the event schema of
`hotloop.profiles.trace_schema` (Kineto or Nsight, read by `hotloop.profiles.kineto_reader` / `hotloop.profiles.nsight_reader`).

Steps and whole-trace counts come from `hotloop.profiles.trace_counts` (a GPU event belongs to the step that launched it,
through its correlation id; a graph replay's kernels through their cudaGraphLaunch). Per-step columns, summed over
the events of a step (`STEP_COLUMNS` lists the metric columns):

- the counts of `trace_counts.event_flags` (kernels, kernels_grid1, memcpy_dtod_events, memcpy_kernels,
  memset_events, fill_kernels, graph_launches, kernels_in_graphs, <sync API>_calls);
- blocking_memcpy_calls: runtime/driver calls `cudaMemcpy*` / `cuMemcpy*` without "Async" (they return only
  after the copy); pageable_async_copies: memcpy events whose name says "Pageable" (Kineto: "Memcpy DtoH (Device ->
  Pageable)") launched by an async call that is not followed, as the next CUDA call of its thread, by a
  synchronize call: a non_blocking copy that the driver makes synchronous. A pageable copy that is followed by a
  sync call (torch's blocking copies, `.item()`: cudaMemcpyAsync + cudaStreamSynchronize) is already counted
  through that call. Kineto only: Nsight memcpy names do not say Pageable;
- stream_sync_calls = cudaStreamSynchronize + cuStreamSynchronize calls ("no stream sync");
  event_sync_calls = cudaEventSynchronize + cudaDeviceSynchronize + cuEventSynchronize + cuCtxSynchronize calls +
  blocking_memcpy_calls + pageable_async_copies ("no event sync");
- d2d_copies = memcpy_dtod_events + memcpy_kernels (a D2D copy captured in a CUDA graph runs as a `memcpy*`
  kernel on the H200); memsets = memset_events + fill_kernels (`zero_()` is a FillFunctor kernel);
- spectral_norm_launches: kernels of the spectral-norm phase;
- fwd_gemms, fwd_gemms_not_tf32, bwd_gemms, bwd_gemms_tf32: GEMM kernels of the forward / backward phases
  (`gemm_precision`);
- gpu_kernel_us (sum of kernel durations), gpu_busy_us (length of the union of kernel intervals, all streams),
  gpu_span_us (first kernel start to last kernel end);
- ddqn_kernel_us, ddqn_overlap_us, ddqn_overlap_ratio: kernel time of the Double-DQN forward phase, the part of it
  that runs at the same time as online-forward kernels of another stream, and their ratio (NaN without both).

Damaged steps (`hotloop.profiles.trace_anomalies`): a step holding an anomalous event (a kernel of ts 0 or dur 0,
a negative duration, a launch with no GPU event, a step range whose end was never written, ...) keeps its counts
(every event with a clear meaning is counted where it belongs; a range with no valid end runs to its thread's last
event), but its timing columns (names ending _us / _ms / _s / _ratio, `hotloop.guards.baselines.is_count`) are
left out of the medians, so of the baseline comparison too, and `StepMetrics.timing_note` says which steps and
why. The interval metrics of every step use only events with a valid time (start > 0, dur >= 0, both finite).

Phases (`kernel_phases`): a caller's map {kernel-name regex or callable: phase} first (first match wins; needed for
graph replays, whose inner record_function ranges are not replayed), else the innermost enclosing Kineto
`gpu_user_annotation` range (record_function around eager work) on the same device and stream, ignoring step ranges.
Which phase names are forward / backward / spectral norm / online / DDQN forward: `PhaseRoles`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import numpy as np
import pandas as pd

from hotloop.guards.baselines import is_count
from hotloop.profiles.trace_anomalies import count_anomalies, valid_time
from hotloop.profiles.trace_counts import (COUNT_COLUMNS, PROFILER_STEP, SYNC_COLUMNS, api_names, assign_steps, event_flags,
                                 step_anomalies, step_ranges)

TF32, FP32, GEMM = "tf32", "fp32", "gemm"
PRECISIONS = (TF32, FP32, GEMM, "")
STREAM_SYNC_APIS = ("cudaStreamSynchronize", "cuStreamSynchronize")
EVENT_SYNC_APIS = ("cudaEventSynchronize", "cudaDeviceSynchronize", "cuEventSynchronize", "cuCtxSynchronize")
_SYNC_APIS = STREAM_SYNC_APIS + EVENT_SYNC_APIS
_GPU_KINDS = ("kernel", "memcpy", "memset")
_LOW_PRECISION = re.compile(r"bf16|f16|fp16|half|int8|e4m3|e5m2|fp8")
STEP_COLUMNS = ("stream_sync_calls", "event_sync_calls", "blocking_memcpy_calls", "pageable_async_copies",
                "d2d_copies", "memsets", "spectral_norm_launches", "fwd_gemms", "fwd_gemms_not_tf32", "bwd_gemms",
                "bwd_gemms_tf32", "gpu_kernel_us", "gpu_busy_us", "gpu_span_us", "ddqn_kernel_us",
                "ddqn_overlap_us", "ddqn_overlap_ratio")
ANOMALY_COLUMNS = ("anomalies", "anomaly")
"""Last per-step columns: the step's anomalous events (int) and what they are (str, "" for a clean step)."""
TIMING_NOTE_STEPS = 10
"""How many damaged steps `timing_note` names before summing up the rest."""
PhaseRule = str | Callable[[pd.DataFrame], pd.Series]


@dataclass(frozen=True)
class PhaseRoles:
    """Which phase names play which part in the criteria. Defaults: the phase names hotloop's ranges use
    (profiles/ranges.py: forward, ddqn_forward, backward, spectral_norm); another step names its own."""

    forward: tuple[str, ...] = ("forward", "ddqn_forward")
    """Phases whose GEMMs must all be TF32 ("TF32 forward only")."""
    backward: tuple[str, ...] = ("backward",)
    """Phases whose GEMMs must not be TF32."""
    spectral_norm: str = "spectral_norm"
    """Phase whose kernels are counted as spectral-norm launches."""
    online_forward: str = "forward"
    """Phase the Double-DQN forward should overlap with."""
    ddqn_forward: str = "ddqn_forward"
    """The Double-DQN (target) forward phase, run on a second stream."""


@dataclass
class StepMetrics:
    """Result of `step_metrics`.

    per_step: one row per step: step, range_name, start_us, dur_us (the CPU step range), the event_flags counts
    (trace_counts.COUNT_COLUMNS, SYNC_COLUMNS), then STEP_COLUMNS, then ANOMALY_COLUMNS (anomalies: int, anomaly:
    str; a step with anomaly != "" is damaged). medians: {column: median (float)} of every numeric column but step,
    start_us and anomalies: counts over all steps, timings (`hotloop.guards.baselines.is_count` False) over the
    undamaged steps only (NaN when every step is damaged).
    evidence: {criterion name: ["<name> x<count over all steps>", ...]} naming the events behind each trace metric;
    "DDQN overlapped" (a timing) ends with `timing_note` when there is one.
    gemms: GEMM kernels inside steps: columns phase ("" if none), precision, name, kernels (count).
    anomalies: `hotloop.profiles.trace_anomalies.count_anomalies` of the whole trace.
    timing_note: "" or which steps' timing was left out and why, e.g. "timing of steps 3, 7 left out: kernel with
    ts 0, dur 0 (steps 3, 7)".
    """

    per_step: pd.DataFrame
    medians: dict[str, float]
    evidence: dict[str, list[str]]
    gemms: pd.DataFrame
    anomalies: dict = field(default_factory=dict)
    timing_note: str = ""


def gemm_precision(name: str, registry: Mapping[str, str] | None = None) -> str:
    """Precision class of a kernel by its name: "tf32", "fp32", "gemm" (a GEMM of another or unknown precision), or
    "" (not a GEMM). Rules, in order (names compared lower-cased):

    1. `registry`: {exact name or fnmatch glob: precision}, first match; for Triton GEMMs, whose names do not say
       whether tl.dot ran in TF32 (e.g. {"triton_tem_fused_addmm_*": "tf32"}).
    2. contains "tf32" (cuBLAS `sm80_xmma_gemm_tf32*`, `sm90_xmma_gemm_f32f32_tf32f32*`, CUTLASS `*_tf32_*`): tf32.
    3. contains bf16/f16/fp16/half/int8/e4m3/e5m2/fp8: "gemm" if a GEMM name, else "".
    4. contains "s1688gemm" (CUTLASS `cutlass_80_tensorop_s1688gemm*`: FP32 data on the TF32 m16n8k8 MMA; seen for
       TF32 matmuls on the H200): tf32.
    5. no "tensorop" and ("sgemm", or "gemm" with "ffma" or "fp32") (`sm80_xmma_gemm_f32f32*ffma*` seen for FP32 on
       the H200, `ampere_sgemm_*`, `cutlass_80_simt_sgemm*`): fp32.
    6. contains "gemm" or "gemv", or starts with "triton_tem_" (an Inductor GEMM template): "gemm"; else "".

    Raises ValueError for a registry precision not in PRECISIONS. Source: docs/h200_facts.md (kernel names read
    on the H200); cuBLAS/CUTLASS kernel naming (s = FP32 accumulate, 1688 = m16n8k8 MMA, ffma = CUDA-core FMA).
    """
    registry = registry or {}
    bad = {p: v for p, v in registry.items() if v not in PRECISIONS}
    if bad:
        raise ValueError(f"gemm registry: precisions must be one of {PRECISIONS}, got {bad}")
    for pattern, precision in registry.items():
        if fnmatchcase(name, pattern):
            return precision
    n = name.lower()
    is_gemm = "gemm" in n or "gemv" in n or n.startswith("triton_tem_")
    if "tf32" in n:
        return TF32
    if _LOW_PRECISION.search(n):
        return GEMM if is_gemm else ""
    if "s1688gemm" in n:
        return TF32
    if "tensorop" not in n and ("sgemm" in n or ("gemm" in n and ("ffma" in n or "fp32" in n))):
        return FP32
    return GEMM if is_gemm else ""


def kernel_phases(df: pd.DataFrame, phases: Mapping[PhaseRule, str] | None = None,
                  ignore: tuple[str, ...] = ("step",)) -> pd.Series:
    """Per event of `df` (same index, str): the phase of each GPU activity row (kernel, memcpy, memset), "" for
    other rows and for GPU rows in no phase.

    `phases`: {rule: phase}; a rule is a regex searched in the event name or a callable taking `df` and returning
    a boolean Series on its index (e.g. `lambda d: d["stream"].eq(29)`); the first rule (mapping order) that matches
    a GPU row wins. Rows no rule matches take the name of the innermost (latest-starting, then shortest) Kineto
    `gpu_user_annotation` (kind annotation) on the same pid (device) and tid (stream) whose span [start, end) holds
    the row's start (a kernel starting just as the previous phase's last kernel ends is not in that phase);
    annotations named in `ignore` or `ProfilerStep#N` are not phases.
    """
    gpu = df["kind"].isin(_GPU_KINDS)
    out = pd.Series("", index=df.index, dtype=object)
    ann = df[df["kind"].eq("annotation") & ~df["name"].isin(ignore) & ~df["name"].str.fullmatch(PROFILER_STEP)]
    if len(ann) and gpu.any():
        ev = df.loc[gpu, ["start_us", "pid", "tid"]].assign(row=df.index[gpu])
        spans = ann[["name", "start_us", "dur_us", "pid", "tid"]].rename(columns={"start_us": "a_start"})
        m = ev.merge(spans, on=["pid", "tid"])
        m = m[(m["a_start"] <= m["start_us"]) & (m["start_us"] < m["a_start"] + m["dur_us"])]
        m = m.sort_values(["a_start", "dur_us"], ascending=[False, True], kind="stable").drop_duplicates("row")
        out.loc[m["row"].to_numpy()] = m["name"].to_numpy()
    claimed = ~gpu
    for rule, phase in (phases or {}).items():
        match = rule(df).fillna(False).astype(bool) if callable(rule) else df["name"].str.contains(_regex(rule))
        hit = ~claimed & match
        out[hit] = phase
        claimed |= hit
    return out


def _regex(rule: str) -> re.Pattern:
    try:
        return re.compile(rule)
    except re.error as exc:
        raise ValueError(f"phase rule {rule!r} is not a valid regex: {exc}") from None


def step_metrics(df: pd.DataFrame, *, step_range_name: str | None = "step", domain: str | None = None,
                 phases: Mapping[PhaseRule, str] | None = None, roles: PhaseRoles = PhaseRoles(),
                 gemm_registry: Mapping[str, str] | None = None) -> StepMetrics:
    """Per-step metrics (module docstring) of trace `df` (`hotloop.profiles.trace_schema` schema).

    Steps: the ranges of `trace_counts.step_ranges(df, step_range_name, domain)` (ProfilerStep#N if no range has
    that name); `step_range_name=None` makes the whole trace one step (range_name "trace"). Events outside every
    step are not counted. `phases`, `roles`: see `kernel_phases`, `PhaseRoles`; `gemm_registry`: see
    `gemm_precision`. Times are microseconds on the trace's clock (the whole-trace step spans the events with a
    valid time). An empty per_step (no step ranges) gives NaN medians. Damaged steps: module docstring. Raises
    ValueError for a bad registry precision or regex.
    """
    if step_range_name is None:
        timed = df[valid_time(df)]
        start, end = timed["start_us"].min(), (timed["start_us"] + timed["dur_us"]).max()
        ranges = pd.DataFrame({"step": [0], "range_name": ["trace"], "start_us": [start], "dur_us": [end - start],
                               "anomaly": [""]})
        steps = pd.Series(0, index=df.index, dtype="Int64")
    else:
        ranges = step_ranges(df, step_range_name, domain)
        steps = assign_steps(df, ranges)
    phase = kernel_phases(df, phases, ignore=(step_range_name or "",))
    kernel = df["kind"].eq("kernel")
    names = df["name"].where(kernel, "")
    precision = names.map({n: gemm_precision(n, gemm_registry) for n in names.unique()})
    ev = _event_metrics(df, phase, precision, roles)
    per_step = ev.groupby(steps).sum().reindex(ranges["step"], fill_value=0).reset_index(drop=True)
    timed = kernel & valid_time(df)
    per_step = pd.concat([ranges.drop(columns="anomaly"), per_step,
                          _interval_metrics(df[timed], phase, steps, roles, ranges),
                          step_anomalies(df, ranges, steps)], axis=1)
    per_step = per_step[["step", "range_name", "start_us", "dur_us", *COUNT_COLUMNS, *SYNC_COLUMNS, *STEP_COLUMNS,
                         *ANOMALY_COLUMNS]]
    clean = per_step["anomaly"].eq("")
    cols = [c for c in per_step.columns if c not in ("step", "range_name", "start_us", *ANOMALY_COLUMNS)]
    medians = {c: float(per_step[c][clean | is_count(c)].median()) if len(per_step) else float("nan") for c in cols}
    in_step = steps.notna()
    gemm = kernel & precision.ne("") & in_step
    gemms = (pd.DataFrame({"phase": phase[gemm], "precision": precision[gemm], "name": df.loc[gemm, "name"]})
             .value_counts(sort=False).rename("kernels").reset_index())
    note = timing_note(per_step)
    evidence = _evidence(df[in_step], ev[in_step], phase[in_step], precision[in_step], roles)
    if note:
        evidence["DDQN overlapped"].append(note)
    return StepMetrics(per_step, medians, evidence, gemms, count_anomalies(df), note)


def timing_note(per_step: pd.DataFrame, max_steps: int = TIMING_NOTE_STEPS) -> str:
    """"" when no step of `per_step` (a StepMetrics.per_step: columns step, anomaly) is damaged, else which steps'
    timing was left out of the medians and why: "timing of steps 3, 7 left out: kernel with ts 0, dur 0 (steps 3,
    7)", each distinct reason (a step's reasons joined by "; ") with its steps, groups joined by " | "; at most
    `max_steps` steps are named per list, the rest counted ("+N more"). Every step damaged: "timing of every step
    (N) left out: ...". Raises KeyError without those columns."""
    damaged = per_step[per_step["anomaly"].ne("")]
    if damaged.empty:
        return ""

    def named(steps: pd.Series) -> str:
        shown = ", ".join(str(int(s)) for s in steps.iloc[:max_steps])
        more = len(steps) - max_steps
        return f"step{'s' * (len(steps) != 1)} {shown}" + (f" +{more} more" if more > 0 else "")

    head = (f"timing of every step ({len(per_step)}) left out" if len(damaged) == len(per_step)
            else f"timing of {named(damaged['step'])} left out")
    by_reason = damaged.groupby("anomaly", sort=False)["step"]
    return head + ": " + " | ".join(f"{reason} ({named(steps)})" for reason, steps in by_reason)


def _event_metrics(df: pd.DataFrame, phase: pd.Series, precision: pd.Series, roles: PhaseRoles) -> pd.DataFrame:
    """One row per event: the 0/1 (or us) contributions of that event to each summed per-step column."""
    flags = event_flags(df)
    api = api_names(df)
    kernel = df["kind"].eq("kernel")
    out = flags.astype("int64")
    out["blocking_memcpy_calls"] = (api.str.match(r"cu(da)?Memcpy") & ~api.str.contains("Async")).astype("int64")
    out["pageable_async_copies"] = _pageable_async_copies(df, api).astype("int64")
    out["stream_sync_calls"] = api.isin(STREAM_SYNC_APIS).astype("int64")
    out["event_sync_calls"] = (api.isin(EVENT_SYNC_APIS).astype("int64") + out["blocking_memcpy_calls"]
                               + out["pageable_async_copies"])
    out["d2d_copies"] = out["memcpy_dtod_events"] + out["memcpy_kernels"]
    out["memsets"] = out["memset_events"] + out["fill_kernels"]
    out["spectral_norm_launches"] = (kernel & phase.eq(roles.spectral_norm)).astype("int64")
    is_gemm = kernel & precision.ne("")
    fwd, bwd = is_gemm & phase.isin(roles.forward), is_gemm & phase.isin(roles.backward)
    out["fwd_gemms"], out["fwd_gemms_not_tf32"] = fwd.astype("int64"), (fwd & precision.ne(TF32)).astype("int64")
    out["bwd_gemms"], out["bwd_gemms_tf32"] = bwd.astype("int64"), (bwd & precision.eq(TF32)).astype("int64")
    out["gpu_kernel_us"] = df["dur_us"].where(kernel & valid_time(df), 0.0)
    return out


def _pageable_async_copies(df: pd.DataFrame, api: pd.Series) -> pd.Series:
    """Per event: a "Pageable" memcpy launched by an async memcpy call whose thread's next CUDA call is no sync."""
    calls = df[api.ne("")].assign(api=api).sort_values(["pid", "tid", "start_us"], kind="stable")
    next_api = calls.groupby(["pid", "tid"], observed=True)["api"].shift(-1)
    unsynced = calls["api"].str.contains("Memcpy") & calls["api"].str.contains("Async") & ~next_api.isin(_SYNC_APIS)
    corr = calls.loc[unsynced, "correlation"].dropna()
    pageable = df["kind"].eq("memcpy") & df["name"].str.contains("Pageable", regex=False)
    return pageable & df["correlation"].isin(corr).fillna(False).astype(bool)


def _interval_metrics(kernels: pd.DataFrame, phase: pd.Series, steps: pd.Series, roles: PhaseRoles,
                      ranges: pd.DataFrame) -> pd.DataFrame:
    """Per step (rows aligned with `ranges`): gpu_busy_us, gpu_span_us and the DDQN overlap columns, over the
    `kernels` given (the caller passes those with a valid time)."""
    rows = []
    k = kernels.assign(end=kernels["start_us"] + kernels["dur_us"], phase=phase[kernels.index],
                       step=steps[kernels.index])
    groups = dict(list(k.groupby("step")))
    for s in ranges["step"]:
        g = groups.get(s, k.iloc[:0])
        ddqn, online = g[g["phase"].eq(roles.ddqn_forward)], g[g["phase"].eq(roles.online_forward)]
        ddqn_us = overlap_us = 0.0
        for stream, d in ddqn.groupby("stream"):
            mine = _union(d["start_us"], d["end"])
            other = online[online["stream"].ne(stream).fillna(True)]
            ddqn_us += sum((e - b for b, e in mine), 0.0)
            overlap_us += _intersection_us(mine, _union(other["start_us"], other["end"]))
        both = len(ddqn) and len(online)
        rows.append({"gpu_busy_us": sum((e - b for b, e in _union(g["start_us"], g["end"])), 0.0),
                     "gpu_span_us": float(g["end"].max() - g["start_us"].min()) if len(g) else 0.0,
                     "ddqn_kernel_us": ddqn_us, "ddqn_overlap_us": overlap_us,
                     "ddqn_overlap_ratio": overlap_us / ddqn_us if both and ddqn_us > 0 else np.nan})
    return pd.DataFrame(rows, columns=["gpu_busy_us", "gpu_span_us", "ddqn_kernel_us", "ddqn_overlap_us",
                                       "ddqn_overlap_ratio"])


def _union(starts: pd.Series, ends: pd.Series) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the given [start, end] intervals."""
    merged: list[list[float]] = []
    for b, e in sorted(zip(starts.tolist(), ends.tolist())):
        if merged and b <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([b, e])
    return [(b, e) for b, e in merged]


def _intersection_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _evidence(df: pd.DataFrame, ev: pd.DataFrame, phase: pd.Series, precision: pd.Series,
              roles: PhaseRoles) -> dict[str, list[str]]:
    """{criterion: ["<name> x<count>", ...]} over the in-step events `df` (event metrics `ev`)."""
    def named(mask: pd.Series, label: pd.Series | None = None) -> list[str]:
        counts = (df["name"] if label is None else label)[mask].map(_short).value_counts(sort=True)
        return [f"{name} x{n}" for name, n in counts.items()]

    fwd, bwd = ev["fwd_gemms"].eq(1), ev["bwd_gemms"].eq(1)
    bad = ev["fwd_gemms_not_tf32"].eq(1) | ev["bwd_gemms_tf32"].eq(1)
    # astype(str) everywhere: with pandas 3's Arrow strings an empty object Series would be a null-typed array
    gemm_label = (pd.Series(np.where(bad, "FAIL ", ""), index=df.index).astype(str) + phase.astype(str) + ": "
                  + precision.astype(str) + " " + df["name"].astype(str))
    ddqn = df["kind"].eq("kernel") & phase.isin([roles.ddqn_forward, roles.online_forward])
    return {
        "no stream sync": named(ev["stream_sync_calls"].gt(0)),
        "no event sync": named(ev["event_sync_calls"].gt(0)),
        "no D2D weight sync": named(ev["d2d_copies"].gt(0)),
        "spectral norm fused": named(ev["spectral_norm_launches"].gt(0)),
        "no single-block kernels": named(ev["kernels_grid1"].gt(0)),
        "memsets only where needed": named(ev["memsets"].gt(0)),
        "TF32 forward only": named(bad, gemm_label) + named((fwd | bwd) & ~bad, gemm_label),
        "DDQN overlapped": named(ddqn, phase.astype(str) + " stream " + df["stream"].astype(str) + ": "
                                 + df["name"].astype(str)),
    }


def _short(name: str, width: int = 120) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."
