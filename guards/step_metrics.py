"""Per-step metrics of every docs/criteria.md criterion that a trace can show, from the event schema of
`hotloop.profiles.trace_schema` (Kineto or Nsight, read by `hotloop.profiles.kineto_reader` /
`hotloop.profiles.nsight_reader`).

Steps and whole-trace counts come from `hotloop.profiles.trace_counts` (a GPU event belongs to the step that launched
it, through its correlation id; a graph replay's kernels through their cudaGraphLaunch). Per-step columns, summed over
the events of a step (`STEP_COLUMNS` lists the metric columns):

- the counts of `trace_counts.event_flags` (kernels, kernels_grid1, memcpy_dtod_events, memcpy_kernels,
  memset_events, fill_kernels, graph_launches, kernels_in_graphs, <sync API>_calls), except that a `memcpy*`
  kernel counts as a copy only (memcpy_kernels, d2d_copies), not in kernels, kernels_grid1 or kernels_in_graphs: it
  is a CUDA graph's D2D copy node, which the driver runs as a kernel or as a DtoD memcpy from one run to the next;
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
- in `StepMetrics.medians` only (no per_step column: the names differ per program): KERNEL_US_PREFIX + kernel name,
  each kernel's GPU time per undamaged step (`kernel_times`: a median, scaled by the share of steps that ran it;
  hotloop.guards.baselines, "Per-kernel timings");
- ddqn_kernel_us, ddqn_overlap_us, ddqn_overlap_ratio: kernel time of the Double-DQN forward phase, the part of it
  that runs at the same time as online-forward kernels of another stream, and their ratio (NaN without both).

Damaged steps (`hotloop.profiles.trace_anomalies`): a step holding an anomalous event (a kernel of ts 0 or dur 0,
a negative duration, a launch with no GPU event, a step range whose end was never written, ...) keeps its counts
(every event with a clear meaning is counted where it belongs; a range with no valid end runs to its thread's last
event), but its timing columns (names ending _us / _ms / _s / _ratio, `hotloop.guards.baselines.is_count`) are
left out of the medians, so of the baseline comparison too, and `StepMetrics.timing_note` says which steps and
why. The interval metrics of every step use only events with a valid time (start > 0, dur >= 0, both finite).

- learner_d2d_copies, learner_memsets (`SCOPED_COLUMNS`): the same counts over the events of the learner's phases
  and those of the step in no phase range (`PhaseRoles.learner`; every event of the step when it is None);
  env_kernels, env_kernels_grid1: the kernels (copy kernels excluded, as in kernels) and the grid (1,1,1) kernels
  of the env phases (`PhaseRoles.env`); env_kernels_per_env_step = env_kernels / PhaseRoles.env_steps_per_update
  (float: the kernels one vectorized env step launches, when the step's env phase ran that many; `PER_ENV_STEP`).
  The grid (1,1,1) kernels of every phase are kernels_grid1 (judged over every phase and the outside-steps bucket).

Phases (`event_phases`): every event gets a phase (its innermost phase range) and a path (all its enclosing phase
ranges, outermost first). A phase range is a CPU `user_annotation` (record_function / NVTX) or a GPU
`gpu_user_annotation`, except the step ranges, the guarded window's range (WINDOW_RANGE), the sync-hook markers
(HIT_MARK) and torch's own ranges, whose names hold "#" (ProfilerStep#N, Optimizer.step#Adam.step). A CUDA call
(and a hook marker) takes the phase ranges of its thread that enclose its start (a thread with no phase ranges, e.g.
autograd's, those of the thread with the most, by time). A GPU event (kernel, memcpy, memset): a caller's map
{kernel-name regex or callable: phase} first (first match wins; needed for graph replays, whose inner
record_function ranges are not replayed; with `rule_phases`, only for events launched inside one of those phases,
so that another graph's kernels of the same names, e.g. the actor's forward in env_step, keep their own phase),
else the innermost enclosing `gpu_user_annotation` on the same device and stream, else the phase of the CPU call
that launched it (its correlation id: a cudaGraphLaunch's replayed kernels take the phase range around the
launch). Which phase names are forward / backward / spectral norm / online / DDQN forward / learner / env:
`PhaseRoles`.

Completion queries (`QUERY_COLUMNS`, not in the medians: the criterion judges them against its allowance, and a
query that runs once per `log_interval` steps has a median of 0): completion_queries counts the runtime/driver calls
QUERY_CALLS (cudaEventQuery, cudaStreamQuery, cuEventQuery, cuStreamQuery) made on the loop's threads (those that
opened a step range) outside every torch operator (`cpu_op` range): a query never waits, but a host calling it until
the GPU is done does. Left out, and named in the evidence only: queries inside a torch operator (the CUDA caching
allocator queries the events of blocks freed on another stream inside `aten::empty*`: bookkeeping, one query per
event) and on other threads (NCCL's watchdog thread queries its work events; it does not hold the loop).
polling_queries: those beyond the allowance (`polling_flags`: {phase: queries per run},
hotloop.guards.criteria.query_allowance: the readback's one query per `readback_publish`), counted into "no event sync".
query_host_us: the host time inside the counted queries (their CPU durations): a report, not a verdict (the Python loop
around the queries of a spin is not in it; the sync hooks' spans are, hotloop.guards.guard).

The window (WINDOW_RANGE, or first step start to last step end when the trace has no such range): events inside it
but outside every step range (a call by its start, a GPU event by its launching call) are counted in an "outside
steps" bucket (`StepMetrics.outside`, same columns as a step). Which phases ran in which step
(`StepMetrics.phase_steps`: a phase range starting in the step, or a GPU event of that phase launched in it) and
the kernels and sync calls of each phase (`StepMetrics.phase_counts`) give the phase coverage table
(`phase_coverage`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import numpy as np
import pandas as pd

from hotloop.guards.baselines import KERNEL_US_PREFIX, is_count
from hotloop.guards.criteria import CRITERIA, OVERLAP, PRECISION, judged_by, query_allowance
from hotloop.profiles.trace_anomalies import count_anomalies, valid_time
from hotloop.profiles.trace_counts import (
    COUNT_COLUMNS,
    SYNC_COLUMNS,
    api_names,
    assign_steps,
    choose_step_range_events,
    event_flags,
    step_anomalies,
    step_ranges,
)

TF32, FP32, GEMM = "tf32", "fp32", "gemm"
PRECISIONS = (TF32, FP32, GEMM, "")
STREAM_SYNC_APIS = ("cudaStreamSynchronize", "cuStreamSynchronize")
EVENT_SYNC_APIS = ("cudaEventSynchronize", "cudaDeviceSynchronize", "cuEventSynchronize", "cuCtxSynchronize")
_SYNC_APIS = STREAM_SYNC_APIS + EVENT_SYNC_APIS
QUERY_CALLS = ("cudaEventQuery", "cudaStreamQuery", "cuEventQuery", "cuStreamQuery")
"""Runtime/driver completion queries: they return at once, done or not; a host calling them until done waits."""
QUERY_COLUMNS = ("completion_queries", "polling_queries", "query_host_us")
"""Per-step trace columns of the completion queries (module docstring), after SCOPED_COLUMNS; not in the medians."""
_GPU_KINDS = ("kernel", "memcpy", "memset")
_API_KINDS = ("runtime", "driver")
_LOW_PRECISION = re.compile(r"bf16|f16|fp16|half|int8|e4m3|e5m2|fp8")
STEP_COLUMNS = (
    "stream_sync_calls",
    "event_sync_calls",
    "blocking_memcpy_calls",
    "pageable_async_copies",
    "d2d_copies",
    "memsets",
    "spectral_norm_launches",
    "fwd_gemms",
    "fwd_gemms_not_tf32",
    "bwd_gemms",
    "bwd_gemms_tf32",
    "gpu_kernel_us",
    "gpu_busy_us",
    "gpu_span_us",
    "ddqn_kernel_us",
    "ddqn_overlap_us",
    "ddqn_overlap_ratio",
)
SCOPED_COLUMNS = (
    "learner_d2d_copies",
    "learner_memsets",
    "env_kernels",
    "env_kernels_grid1",
    "env_kernels_per_env_step",
)
"""Per-step columns over the learner's (PhaseRoles.learner) or the env's (PhaseRoles.env) phases only: counts, and
env_kernels_per_env_step (float), env_kernels divided by PhaseRoles.env_steps_per_update (`PER_ENV_STEP`)."""
PER_ENV_STEP = {"env_kernels_per_env_step": "env_kernels"}
"""Per-step column -> the count column it is made of: that count divided by PhaseRoles.env_steps_per_update, the
vectorized env steps one loop iteration runs. A criterion on such a column names the events of the count column as
its evidence and gives the count column's window total (hotloop.guards.guard.evaluate)."""
WINDOW_RANGE = "guard_window"
"""Name of the range around the guarded window (hotloop.guards.guard.GuardWindow opens it)."""
HIT_MARK = "hotloop_sync_hit#"
"""Prefix of the zero-length range hotloop.guards.guard puts in the trace right after a sync-hook hit, numbered by
the hit's index (`hotloop_sync_hit#3`): it places the hit in its step and phase."""
QUERY_MARK = "hotloop_query_hit#"
"""Prefix of the zero-length range hotloop.guards.guard puts in the trace right after a hooked completion query (a
`SyncHooks.queries` entry), numbered by the query's index: it places the query in its step and phase."""
OUTSIDE = -1
"""Step bucket of the events inside the window but outside every step range."""
OUTSIDE_LABEL, NO_PHASE = "(outside steps)", "(no phase)"
"""Coverage rows of the events outside every step, and of those in a step but in no phase range."""
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
    learner: tuple[str, ...] | None = None
    """Phases of the learner step: an event of a step counts for the learner-side criteria (D2D copies, memsets)
    when one of its enclosing phases is one of these, or when it is in no phase range at all (loop code between the
    phases: nothing but the learner should launch there, e.g. an op added after the learner step, as
    hotloop.guards.faults injects it). None: every event of a step (a step of your own is all learner). hotloop's
    trainer: hotloop.trainer.loop.learner_phases."""
    env: tuple[str, ...] = ("env_step",)
    """Phases of the env step: their kernels per vectorized env step are limited ("env kernels per env step"); their
    grid (1,1,1) kernels count in "no single-block kernels" as every phase's do."""
    env_steps_per_update: int = 1
    """Vectorized env steps the env phases run in one step (loop iteration): hotloop's trainer runs
    cfg.env_steps_per_update of them in its one env_step range. env_kernels_per_env_step divides the step's env
    kernels by it. An int >= 1 (ValueError otherwise)."""

    def __post_init__(self) -> None:
        n = self.env_steps_per_update
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"PhaseRoles.env_steps_per_update must be an int >= 1, got {n!r}")

    def scope(self, name: str | tuple[str, ...]) -> tuple[str, ...] | None:
        """The phase names a criterion's `phases` (hotloop.guards.criteria.Criterion) stand for: "every" -> None
        (every phase, and outside steps), "learner" -> `learner` (None when unset: every event of a step), "env" ->
        `env`, "spectral_norm" -> (spectral_norm,), "gemms" -> forward + backward, "ddqn" -> (ddqn_forward,
        online_forward); a tuple is taken as the phase names. Raises ValueError for another name."""
        if isinstance(name, tuple):
            return name
        scopes = {
            "every": None,
            "learner": self.learner,
            "env": self.env,
            "spectral_norm": (self.spectral_norm,),
            "gemms": self.forward + self.backward,
            "ddqn": (self.ddqn_forward, self.online_forward),
        }
        if name not in scopes:
            raise ValueError(f"unknown phase scope {name!r}; known: {sorted(scopes)} or a tuple of phase names")
        return scopes[name]


@dataclass
class StepMetrics:
    """Result of `step_metrics`.

    per_step: one row per step: step, range_name, start_us, dur_us (the CPU step range), the event_flags counts
    (trace_counts.COUNT_COLUMNS, SYNC_COLUMNS), then STEP_COLUMNS, SCOPED_COLUMNS, QUERY_COLUMNS, any other counter
    of `_event_metrics`, then ANOMALY_COLUMNS (anomalies: int, anomaly: str; a step with anomaly != "" is damaged). medians: {column: median (float)} of every numeric column but step,
    start_us and anomalies: counts over all steps, timings (`hotloop.guards.baselines.is_count` False) over the
    undamaged steps only (NaN when every step is damaged).
    evidence: {criterion id: ["<name> x<count over all steps>", ...]} naming the events behind each trace metric;
    the OVERLAP row ("DDQN overlapped", a timing) ends with `timing_note` when there is one.
    gemms: GEMM kernels inside steps: columns phase ("" if none), precision, name, kernels (count).
    anomalies: `hotloop.profiles.trace_anomalies.count_anomalies` of the whole trace.
    timing_note: "" or which steps' timing was left out and why, e.g. "timing of steps 3, 7 left out: kernel with
    ts 0, dur 0 (steps 3, 7)".
    outside: {column: count} of the "outside steps" bucket (the summed per-step count columns over the events inside
    the window and outside every step; zeros when there are none).
    window: {"start_us", "end_us" (float, the trace's clock), "source": "range" (WINDOW_RANGE) | "steps" (first
    step start to last step end) | "trace" (no steps) | "none"}.
    phase_steps: unique (step, phase) pairs: the phases that ran in each step (step int, phase str).
    phase_counts: per (phase, outside: bool) over the window's events: kernels, sync_calls (stream_sync_calls +
    event_sync_calls) (int64); phase "" for events in no phase.
    markers: the sync-hook markers (HIT_MARK) in the trace: hit (int, the hit's index), step (Int64: NA outside
    every step), outside (bool: inside the window, outside every step), phase (str).
    query_markers: the same for the completion-query markers (QUERY_MARK; hit = the query's index in
    SyncHooks.queries), plus path (tuple of str: the phase ranges around it, outermost first).
    phase_runs: per (step, phase): runs (int), the phase ranges (CPU side) of that name that started in the step:
    what a per-run query allowance multiplies (`polling_flags`).
    """

    per_step: pd.DataFrame
    medians: dict[str, float]
    evidence: dict[str, list[str]]
    gemms: pd.DataFrame
    anomalies: dict = field(default_factory=dict)
    timing_note: str = ""
    outside: dict[str, float] = field(default_factory=dict)
    window: dict = field(default_factory=dict)
    phase_steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": [], "phase": []}))
    phase_counts: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame({"phase": [], "outside": [], "kernels": [], "sync_calls": []})
    )
    markers: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame({"hit": [], "step": [], "outside": [], "phase": []})
    )
    query_markers: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame({"hit": [], "step": [], "outside": [], "phase": [], "path": []})
    )
    phase_runs: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": [], "phase": [], "runs": []}))


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


def kernel_phases(
    df: pd.DataFrame,
    phases: Mapping[PhaseRule, str] | None = None,
    ignore: tuple[str, ...] = ("step",),
    rule_phases: tuple[str, ...] | None = None,
) -> pd.Series:
    """Per event of `df` (same index, str): the phase of each GPU activity row (kernel, memcpy, memset), "" for
    other rows and for GPU rows in no phase (`event_phases`'s phase, GPU rows only).

    `phases`: {rule: phase}; a rule is a regex searched in the event name or a callable taking `df` and returning
    a boolean Series on its index (e.g. `lambda d: d["stream"].eq(29)`); the first rule (mapping order) that matches
    a GPU row wins (with `rule_phases`, only rows launched inside one of those phases are matched). Rows no rule
    matches take the name of the innermost (latest-starting, then shortest) Kineto `gpu_user_annotation` (kind
    annotation) on the same pid (device) and tid (stream) whose span [start, end) holds the row's start (a kernel
    starting just as the previous phase's last kernel ends is not in that phase), else the phase of the CPU call
    that launched it; ranges named in `ignore`, WINDOW_RANGE, HIT_MARK markers and names holding "#"
    (`ProfilerStep#N`, torch's own ranges) are not phases. Raises ValueError for a rule that is not a valid regex.
    """
    ph = event_phases(df, phases, ignore, rule_phases)["phase"]
    return ph.where(df["kind"].isin(_GPU_KINDS), "")


def is_phase_range(df: pd.DataFrame, ignore: tuple[str, ...] = ("step",)) -> pd.Series:
    """Per event of `df`: whether it is a phase range (kind user_annotation on the CPU, annotation on the GPU)
    whose name is not in `ignore`, not WINDOW_RANGE, not a HIT_MARK marker and holds no "#" (ProfilerStep#N,
    Optimizer.step#Adam.step: torch's own ranges)."""
    out = df["kind"].isin(("user_annotation", "annotation"))
    names = df.loc[out, "name"].astype(str)
    out[out] = ~names.isin((*ignore, WINDOW_RANGE)) & ~names.str.contains("#", regex=False)
    return out


def event_phases(
    df: pd.DataFrame,
    phases: Mapping[PhaseRule, str] | None = None,
    ignore: tuple[str, ...] = ("step",),
    rule_phases: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Per event of `df` (same index): phase (str: its innermost phase range, "" for none) and path (tuple of str:
    its enclosing phase ranges, outermost first, ending with `phase`), by the rules of the module docstring, for
    CUDA calls (runtime, driver), HIT_MARK markers and GPU rows; other rows get "" and (). `phases`, `ignore`:
    see `kernel_phases`; `rule_phases`: the phases inside which the `phases` rules apply (None: everywhere).
    Ranges are assumed to nest on each thread. Raises ValueError for a rule that is not a valid regex."""
    # paths are tuples of different lengths: kept in a plain list by position and put into an object Series at the
    # end (a list of tuples assigned through a mask is turned into a 2-D array by some pandas versions)
    phase = pd.Series("", index=df.index, dtype=object)
    paths: list[tuple[str, ...]] = [()] * len(df)
    ranges = is_phase_range(df, ignore)
    cpu_ranges = df[ranges & df["kind"].eq("user_annotation")]
    calls = df["kind"].isin(_API_KINDS) | _markers(df)
    if calls.any():
        for pos, enclosing in zip(np.flatnonzero(calls.to_numpy()), _enclosing(df[calls], cpu_ranges)):
            paths[pos] = enclosing
        phase[calls] = [paths[pos][-1] if paths[pos] else "" for pos in np.flatnonzero(calls.to_numpy())]
    gpu = df["kind"].isin(_GPU_KINDS)
    if not gpu.any():
        return pd.DataFrame({"phase": phase, "path": _object_series(paths, df.index)})
    # the launching call's path, through the correlation id
    is_launch = (df["kind"].isin(_API_KINDS) & df["correlation"].notna()).to_numpy()
    launch_pos = np.flatnonzero(is_launch)
    launch_corr = df["correlation"].to_numpy()[launch_pos]
    first = ~pd.Series(launch_corr).duplicated().to_numpy()
    by_corr = _object_series([paths[pos] for pos in launch_pos[first]], launch_corr[first])
    launch_path = [lp if isinstance(lp, tuple) else () for lp in df.loc[gpu, "correlation"].map(by_corr)]
    annotated = _gpu_annotation(df, gpu, df[ranges & df["kind"].eq("annotation")])
    base = [a or (lp[-1] if lp else "") for a, lp in zip(annotated, launch_path)]
    gpu_path = [lp + ((a,) if a and (not lp or lp[-1] != a) else ()) for a, lp in zip(annotated, launch_path)]
    rule = pd.Series("", index=df.index[gpu], dtype=object)
    claimed = pd.Series(False, index=df.index[gpu])
    if phases:
        eligible = (
            pd.Series(True, index=claimed.index)
            if rule_phases is None
            else pd.Series([bool(set(gp) & set(rule_phases)) for gp in gpu_path], index=claimed.index)
        )
        sub = df[gpu]
        for r, name in phases.items():
            match = r(df).fillna(False).astype(bool)[gpu] if callable(r) else sub["name"].str.contains(_regex(r))
            hit = ~claimed & eligible & match
            rule[hit] = name
            claimed |= hit
    phase[gpu] = [r or b for r, b in zip(rule, base)]
    for pos, r, gp in zip(np.flatnonzero(gpu.to_numpy()), rule, gpu_path):
        paths[pos] = gp + ((r,) if r and (not gp or gp[-1] != r) else ())
    return pd.DataFrame({"phase": phase, "path": _object_series(paths, df.index)})


def _object_series(values: list, index) -> pd.Series:
    """An object Series holding `values` (tuples of any lengths) as they are, one per index entry."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return pd.Series(arr, index=index, dtype=object)


def _markers(df: pd.DataFrame, prefixes: tuple[str, ...] = (HIT_MARK, QUERY_MARK)) -> pd.Series:
    out = df["kind"].eq("user_annotation")
    out[out] = df.loc[out, "name"].astype(str).str.startswith(prefixes)
    return out


def _gpu_annotation(df: pd.DataFrame, gpu: pd.Series, ann: pd.DataFrame) -> list[str]:
    """Per GPU row of `df` (`gpu` mask, in order): the innermost `ann` range (Kineto gpu_user_annotation) on the
    same pid and tid whose [start, end) holds the row's start, "" for none."""
    out = pd.Series("", index=df.index[gpu], dtype=object)
    if len(ann):
        ev = df.loc[gpu, ["start_us", "pid", "tid"]].assign(row=df.index[gpu])
        spans = ann[["name", "start_us", "dur_us", "pid", "tid"]].rename(columns={"start_us": "a_start"})
        m = ev.merge(spans, on=["pid", "tid"])
        m = m[(m["a_start"] <= m["start_us"]) & (m["start_us"] < m["a_start"] + m["dur_us"])]
        m = m.sort_values(["a_start", "dur_us"], ascending=[False, True], kind="stable").drop_duplicates("row")
        out.loc[m["row"].to_numpy()] = m["name"].to_numpy()
    return list(out)


def _enclosing(targets: pd.DataFrame, ranges: pd.DataFrame) -> list[tuple[str, ...]]:
    """Per row of `targets` (in order): the names of the `ranges` (CPU phase ranges) of its pid and tid that hold
    its start, outermost first; a thread with no ranges uses the ranges of the thread that has the most (by time:
    e.g. autograd's thread launching a backward). A range with no valid end (dur < 0 or not finite) runs to the
    end of the trace."""
    out: dict[object, tuple[str, ...]] = {}
    if ranges.empty:
        return [()] * len(targets)
    ends = ranges["start_us"] + ranges["dur_us"]
    ends = ends.where(np.isfinite(ranges["dur_us"]) & ranges["dur_us"].ge(0), np.inf)
    r = ranges.assign(end=ends)
    threads = {key: g for key, g in r.groupby(["pid", "tid"], sort=False)}
    main = max(threads, key=lambda key: len(threads[key]))
    for key, t in targets.groupby(["pid", "tid"], sort=False):
        g = threads.get(key, threads[main]).sort_values(["start_us", "end"], ascending=[True, False], kind="stable")
        starts, stops, names = g["start_us"].to_numpy(), g["end"].to_numpy(), g["name"].to_numpy()
        times = t["start_us"].to_numpy("float64")
        stack: list[int] = []
        ri = 0
        for j in np.argsort(times, kind="stable"):
            x = times[j]
            if not np.isfinite(x):
                out[t.index[j]] = ()
                continue
            while ri < len(starts) and starts[ri] <= x:
                stack = [k for k in stack if stops[k] > starts[ri]]
                stack.append(ri)
                ri += 1
            stack = [k for k in stack if stops[k] > x]
            out[t.index[j]] = tuple(str(names[k]) for k in stack)
    return [out[i] for i in targets.index]


def _regex(rule: str) -> re.Pattern:
    try:
        return re.compile(rule)
    except re.error as exc:
        raise ValueError(f"phase rule {rule!r} is not a valid regex: {exc}") from None


def step_metrics(
    df: pd.DataFrame,
    *,
    step_range_name: str | None = "step",
    domain: str | None = None,
    phases: Mapping[PhaseRule, str] | None = None,
    roles: PhaseRoles = PhaseRoles(),
    gemm_registry: Mapping[str, str] | None = None,
    rule_phases: tuple[str, ...] | None = None,
    allowance: Mapping[str, int] | None = None,
) -> StepMetrics:
    """Per-step metrics (module docstring) of trace `df` (`hotloop.profiles.trace_schema` schema).

    Steps: the ranges of `trace_counts.step_ranges(df, step_range_name, domain)` (ProfilerStep#N if no range has
    that name); `step_range_name=None` makes the whole trace one step (range_name "trace"). Events outside every
    step are not counted in a step; those inside the window (WINDOW_RANGE, else first step start to last step
    end) are counted in `StepMetrics.outside`. `phases`, `rule_phases`, `roles`: see `event_phases`,
    `PhaseRoles`; `gemm_registry`: see `gemm_precision`; `allowance`: {phase: completion queries allowed per run}
    (default hotloop.guards.criteria.query_allowance()). Times are microseconds on the trace's clock (the
    whole-trace step spans the events with a valid time). An empty per_step (no step ranges) gives NaN medians.
    Damaged steps: module docstring. Raises ValueError for a bad registry precision or regex.
    """
    if step_range_name is None:
        timed = df[valid_time(df)]
        start, end = timed["start_us"].min(), (timed["start_us"] + timed["dur_us"]).max()
        ranges = pd.DataFrame(
            {"step": [0], "range_name": ["trace"], "start_us": [start], "dur_us": [end - start], "anomaly": [""]}
        )
        steps = pd.Series(0, index=df.index, dtype="Int64")
    else:
        ranges = step_ranges(df, step_range_name, domain)
        steps = assign_steps(df, ranges)
    ev_phase = event_phases(df, phases, ignore=(step_range_name or "",), rule_phases=rule_phases)
    phase, path = ev_phase["phase"], ev_phase["path"]
    window = _window(df, ranges, step_range_name)
    bucket = _buckets(df, steps, ranges, window)
    kernel = df["kind"].eq("kernel")
    names = df["name"].where(kernel, "")
    precision = names.map({n: gemm_precision(n, gemm_registry) for n in names.unique()})
    query, in_op = _queries(df, step_range_name, domain)
    ev = _event_metrics(df, phase, path, precision, roles, query)
    in_step = bucket.notna() & bucket.ge(0)
    runs = _phase_runs(df, bucket, step_range_name)
    allowance = query_allowance() if allowance is None else dict(allowance)
    ev["polling_queries"] = 0
    if query.any():  # in call order: the first queries of a phase run are its allowed ones
        order = df.loc[query, "start_us"].sort_values(kind="stable").index
        ev.loc[order, "polling_queries"] = polling_flags(bucket[order], path[order], runs, allowance).astype("int64")
    per_step = ev[in_step].groupby(bucket[in_step]).sum().reindex(ranges["step"], fill_value=0)
    per_step = per_step.reset_index(drop=True)
    timed = kernel & valid_time(df)
    per_step = pd.concat(
        [
            ranges.drop(columns="anomaly"),
            per_step,
            _interval_metrics(df[timed], phase, steps, roles, ranges),
            step_anomalies(df, ranges, steps),
        ],
        axis=1,
    )
    for ratio, count in PER_ENV_STEP.items():  # divided per step (exact for integers), never summed as fractions
        per_step[ratio] = per_step[count].astype("float64") / roles.env_steps_per_update
    known = [
        "step",
        "range_name",
        "start_us",
        "dur_us",
        *COUNT_COLUMNS,
        *SYNC_COLUMNS,
        *STEP_COLUMNS,
        *SCOPED_COLUMNS,
        *QUERY_COLUMNS,
    ]
    counters = [c for c in ev.columns if c not in known]  # a counter `_event_metrics` alone adds, summed per step
    per_step = per_step[[*known, *counters, *ANOMALY_COLUMNS]]
    clean = per_step["anomaly"].eq("")
    cols = [
        c for c in per_step.columns if c not in ("step", "range_name", "start_us", *ANOMALY_COLUMNS, *QUERY_COLUMNS)
    ]
    medians = {c: float(per_step[c][clean | is_count(c)].median()) if len(per_step) else float("nan") for c in cols}
    medians |= kernel_times(df, ev["kernels"].astype(bool) & valid_time(df), bucket, per_step["step"][clean])
    gemm = kernel & precision.ne("") & in_step
    gemms = (
        pd.DataFrame({"phase": phase[gemm], "precision": precision[gemm], "name": df.loc[gemm, "name"]})
        .value_counts(sort=False)
        .rename("kernels")
        .reset_index()
    )
    note = timing_note(per_step)
    in_window = bucket.notna()
    outside_ev = bucket.eq(OUTSIDE).fillna(False).astype(bool)
    outside = {c: float(ev.loc[outside_ev, c].sum()) for c in ev.columns if c != "gpu_kernel_us"}
    evidence = _evidence(
        df[in_window],
        ev[in_window],
        phase[in_window],
        precision[in_window],
        roles,
        outside_ev[in_window],
        (query & ~in_op)[in_window],
        in_op[in_window],
    )
    for c in judged_by(OVERLAP) if note else ():  # a timing row says which steps' timing was left out
        evidence[c.id].append(note)
    return StepMetrics(
        per_step,
        medians,
        evidence,
        gemms,
        count_anomalies(df),
        note,
        outside,
        window,
        _phase_steps(df, phase, bucket, step_range_name),
        _phase_counts(ev, phase, bucket),
        _marker_frame(df, bucket, phase),
        _marker_frame(df, bucket, phase, QUERY_MARK, path),
        runs,
    )


def _queries(df: pd.DataFrame, step_range_name: str | None, domain: str | None) -> tuple[pd.Series, pd.Series]:
    """(counted, in_op), bool Series on df's index: QUERY_CALLS calls on the loop's threads (the pid/tid of the step
    range events; every thread when there are none, or with step_range_name None) outside every `cpu_op` of their
    thread (counted), and QUERY_CALLS calls inside one (in_op: a torch operator's own, e.g. the caching allocator's)."""
    api = api_names(df)
    query = api.isin(QUERY_CALLS)
    none = pd.Series(False, index=df.index)
    if not query.any():
        return none, none
    key = df["pid"].astype(str) + "/" + df["tid"].astype(str)
    if step_range_name is not None:
        steps = choose_step_range_events(df, step_range_name, domain)
        if len(steps):
            query &= key.isin(set(key[steps.index]))
    in_op = none.copy()
    ops = df[df["kind"].eq("cpu_op") & valid_time(df)]
    op_key = key[ops.index]
    for k in key[query].unique():
        mine = ops[op_key.eq(k)]
        if mine.empty:
            continue
        order = np.argsort(mine["start_us"].to_numpy("float64"), kind="stable")
        starts = mine["start_us"].to_numpy("float64")[order]
        ends = np.maximum.accumulate((mine["start_us"] + mine["dur_us"]).to_numpy("float64")[order])
        rows = query & key.eq(k)
        t = df.loc[rows, "start_us"].to_numpy("float64")
        i = np.searchsorted(starts, t, side="right") - 1
        in_op[rows] = (i >= 0) & (ends[np.maximum(i, 0)] > t)
    return query & ~in_op, api.isin(QUERY_CALLS) & in_op


def polling_flags(steps: pd.Series, paths: pd.Series, runs: pd.DataFrame, allowance: Mapping[str, int]) -> np.ndarray:
    """Per completion query (rows in call order): whether it is a polling query, beyond the loop's own.

    `steps`: each query's step (an int; NA, None or OUTSIDE (< 0) outside every step); `paths`: the phase ranges
    around it (tuples, outermost first); `runs`: `StepMetrics.phase_runs` (step, phase, runs); `allowance`: {phase:
    queries allowed per run of it}. A query in a step whose innermost enclosing phase of `allowance` is P is allowed
    while the step's queries in P so far (this one included) are at most allowance[P] x the runs of P in the step;
    every other query (no allowance phase around it, the step's allowance spent, or outside every step) is polling.
    The first queries in call order are the allowed ones: the readback's own query comes first in its phase, a spin
    added after it is polling. Returns a bool array."""
    have = {(int(s), str(p)): int(n) for s, p, n in zip(runs["step"], runs["phase"], runs["runs"])}
    used: dict[tuple[int, str], int] = {}
    out = np.ones(len(steps), dtype=bool)
    for i, (s, path) in enumerate(zip(steps.tolist(), paths.tolist())):
        if s is None or s is pd.NA or (isinstance(s, float) and np.isnan(s)) or int(s) < 0:
            continue
        phase = next((p for p in reversed(tuple(path or ())) if p in allowance), None)
        if phase is None:
            continue
        key = (int(s), phase)
        used[key] = used.get(key, 0) + 1
        out[i] = used[key] > allowance[phase] * have.get(key, 0)
    return out


def _phase_runs(df: pd.DataFrame, bucket: pd.Series, step_range_name: str | None) -> pd.DataFrame:
    """Per (step, phase): runs, the CPU phase ranges of that name starting in the step."""
    rng = (
        is_phase_range(df, (step_range_name or "",))
        & df["kind"].eq("user_annotation")
        & ~_markers(df)
        & bucket.notna()
        & bucket.ge(0).fillna(False).astype(bool)
    )
    frame = pd.DataFrame({"step": bucket[rng].astype("int64"), "phase": df.loc[rng, "name"].astype(str)})
    return (
        frame.groupby(["step", "phase"], as_index=False, sort=True)
        .size()
        .rename(columns={"size": "runs"})
        .astype({"step": "int64", "runs": "int64"})
    )


def _window(df: pd.DataFrame, ranges: pd.DataFrame, step_range_name: str | None) -> dict:
    """The window's span: the first WINDOW_RANGE range, else first step start to last step end."""
    win = df[df["kind"].eq("user_annotation") & df["name"].eq(WINDOW_RANGE)]
    if len(win):
        start, dur = float(win["start_us"].iloc[0]), float(win["dur_us"].iloc[0])
        end = start + dur if np.isfinite(dur) and dur >= 0 else float(_trace_end(df))
        return {"start_us": start, "end_us": end, "source": "range"}
    if step_range_name is None:
        return {
            "start_us": float(ranges["start_us"].iloc[0]),
            "end_us": float((ranges["start_us"] + ranges["dur_us"]).iloc[0]),
            "source": "trace",
        }
    if ranges.empty:
        return {"start_us": float("nan"), "end_us": float("nan"), "source": "none"}
    ends = ranges["start_us"] + ranges["dur_us"]
    return {"start_us": float(ranges["start_us"].min()), "end_us": float(ends.max()), "source": "steps"}


def _trace_end(df: pd.DataFrame) -> float:
    ok = valid_time(df)
    return (df["start_us"] + df["dur_us"])[ok].max()


def _buckets(df: pd.DataFrame, steps: pd.Series, ranges: pd.DataFrame, window: dict) -> pd.Series:
    """Per event (Int64): its step; OUTSIDE for a call, marker, phase range or GPU event (by its launching call)
    inside the window and outside every step; NA for the rest. Markers and phase ranges get their step by start."""
    out = steps.copy()
    cpu_ranges = df["kind"].eq("user_annotation") & ~df["name"].isin((WINDOW_RANGE,))
    if len(ranges) and cpu_ranges.any() and not (steps.notna().all()):
        t = df.loc[cpu_ranges, "start_us"].to_numpy("float64")
        out[cpu_ranges] = _steps_at(t, ranges)
    lo, hi = window["start_us"], window["end_us"]
    if not np.isfinite(lo):
        return out
    calls = df["kind"].isin(_API_KINDS) | cpu_ranges
    t = df["start_us"]
    inside = calls & out.isna() & t.ge(lo) & t.le(hi) & t.gt(0)
    out[inside] = OUTSIDE
    launched = df[df["kind"].isin(_API_KINDS) & df["correlation"].notna()]
    launched = launched[~launched["correlation"].duplicated()]
    outside_corr = launched.loc[out[launched.index].eq(OUTSIDE).fillna(False).astype(bool), "correlation"]
    gpu = df["kind"].isin(_GPU_KINDS) & df["correlation"].isin(outside_corr).fillna(False).astype(bool)
    out[gpu & out.isna()] = OUTSIDE
    return out


def _steps_at(t: np.ndarray, ranges: pd.DataFrame) -> pd.array:
    """Int64 step of `ranges` holding each time of `t` (the latest-starting range begun at or before it and not
    ended), NA for none (as trace_counts.assign_steps places calls)."""
    starts = ranges["start_us"].to_numpy("float64")
    ends = (ranges["start_us"] + ranges["dur_us"]).to_numpy("float64")
    i = np.searchsorted(starts, t, side="right") - 1
    with np.errstate(invalid="ignore"):
        inside = (i >= 0) & (t <= ends[np.maximum(i, 0)]) & np.isfinite(t) & (t > 0)
    vals = pd.Series(ranges["step"].to_numpy()[np.maximum(i, 0)], dtype="Int64")
    return vals.where(pd.Series(inside)).array


def _phase_steps(df: pd.DataFrame, phase: pd.Series, bucket: pd.Series, step_range_name: str | None) -> pd.DataFrame:
    """Unique (step, phase) pairs: a phase range starting in the step, or a GPU event of that phase launched in
    it."""
    in_step = bucket.notna() & bucket.ge(0)
    rng = is_phase_range(df, (step_range_name or "",)) & df["kind"].eq("user_annotation") & ~_markers(df)
    gpu = df["kind"].isin(_GPU_KINDS) & phase.ne("")
    pairs = pd.concat(
        [
            pd.DataFrame({"step": bucket[rng & in_step], "phase": df.loc[rng & in_step, "name"]}),
            pd.DataFrame({"step": bucket[gpu & in_step], "phase": phase[gpu & in_step]}),
        ]
    )
    pairs = pairs.astype({"step": "int64", "phase": str}).drop_duplicates()
    return pairs.sort_values(["step", "phase"], kind="stable", ignore_index=True)


def _phase_counts(ev: pd.DataFrame, phase: pd.Series, bucket: pd.Series) -> pd.DataFrame:
    """Per (phase, outside) over the window's events: kernels, sync_calls, queries (completion_queries)."""
    w = bucket.notna()
    frame = pd.DataFrame(
        {
            "phase": phase[w].astype(str),
            "outside": bucket[w].eq(OUTSIDE).astype(bool),
            "kernels": ev.loc[w, "kernels"],
            "sync_calls": ev.loc[w, "stream_sync_calls"] + ev.loc[w, "event_sync_calls"],
            "queries": ev.loc[w, "completion_queries"],
        }
    )
    frame = frame[frame["kernels"].gt(0) | frame["sync_calls"].gt(0) | frame["queries"].gt(0)]
    cols = ["kernels", "sync_calls", "queries"]
    return frame.groupby(["phase", "outside"], as_index=False, sort=True)[cols].sum().astype({c: "int64" for c in cols})


def _marker_frame(
    df: pd.DataFrame, bucket: pd.Series, phase: pd.Series, prefix: str = HIT_MARK, path: pd.Series | None = None
) -> pd.DataFrame:
    """The markers named `prefix` + n (HIT_MARK, or QUERY_MARK with `path`): hit, step (NA outside steps), outside,
    phase (and path, the enclosing phase ranges, when `path` is given)."""
    m = _markers(df, (prefix,))
    hit = df.loc[m, "name"].str.slice(len(prefix)).astype("int64")
    b = bucket[m]
    out = pd.DataFrame(
        {
            "hit": hit.to_numpy(),
            "step": b.where(b.ge(0)).astype("Int64").to_numpy(),
            "outside": b.eq(OUTSIDE).fillna(False).astype(bool).to_numpy(),
            "phase": phase[m].astype(str).to_numpy(),
        }
    )
    if path is not None:
        out["path"] = _object_series(list(path[m]), out.index)
    return out


def phase_coverage(
    metrics: StepMetrics,
    hits: pd.DataFrame | None = None,
    periods: Mapping[str, int] | None = None,
    steps: int | None = None,
    queries: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The phase coverage table of a guarded window: one row per phase (the `periods` phases first, in their
    order, then the others that ran, by first step), then NO_PHASE (events in a step but in no phase range) and
    OUTSIDE_LABEL (events inside the window, outside every step), the last two only when they hold a kernel or a
    sync.

    Columns: phase; period (Int64: the loop's period of the phase, `periods`, e.g.
    hotloop.trainer.loop.loop_periods; NA for a phase not in it); steps (int: steps of the window it ran in,
    `StepMetrics.phase_steps`); first_step
    (Int64, NA when it never ran); kernels, sync_calls (trace: stream_sync_calls + event_sync_calls), sync_hook_hits
    (`hits`, a SyncHooks.frame() with phase and outside columns, as hotloop.guards.guard attributes them), queries
    (trace: completion_queries) and query_hook_hits (`queries`, SyncHooks.query_frame() placed likewise) over the
    window; status: "ran", "not in window" (a `periods` phase that ran in no step; "(period P > window K)" added
    when its period exceeds `steps`, the window's steps, default len(metrics.per_step)), "in steps" / "outside
    steps" for the last two rows."""
    k = len(metrics.per_step) if steps is None else steps
    periods = dict(periods or {})
    ps = metrics.phase_steps
    ran = ps.groupby("phase")["step"].agg(["nunique", "min"]) if len(ps) else pd.DataFrame(columns=["nunique", "min"])
    counts = metrics.phase_counts
    hits = hits if hits is not None else pd.DataFrame({"step": pd.Series(dtype="Int64")})
    h_phase = hits["phase"].astype(str) if "phase" in hits else pd.Series("", index=hits.index, dtype=str)
    h_out = hits["outside"].astype(bool) if "outside" in hits else hits["step"].isna()
    queries = queries if queries is not None else pd.DataFrame({"step": pd.Series(dtype="Int64")})
    q_phase = queries["phase"].astype(str) if "phase" in queries else pd.Series("", index=queries.index, dtype=str)
    q_out = queries["outside"].astype(bool) if "outside" in queries else queries["step"].isna()
    if "queries" not in counts:
        counts = counts.assign(queries=0)
    others = [p for p in ran.sort_values("min", kind="stable").index if p not in periods]
    rows = []
    for p in [*periods, *others]:
        c = counts[counts["phase"].eq(p)]
        n = int(ran.loc[p, "nunique"]) if p in ran.index else 0
        late = f" (period {periods[p]} > window {k})" if p in periods and periods[p] > k else ""
        rows.append(
            dict(
                phase=p,
                period=periods.get(p, pd.NA),
                steps=n,
                first_step=int(ran.loc[p, "min"]) if n else pd.NA,
                kernels=int(c["kernels"].sum()),
                sync_calls=int(c["sync_calls"].sum()),
                sync_hook_hits=int(h_phase.eq(p).sum()),
                queries=int(c["queries"].sum()),
                query_hook_hits=int(q_phase.eq(p).sum()),
                status="ran" if n else "not in window" + late,
            )
        )
    no_phase = counts[counts["phase"].eq("") & ~counts["outside"]]
    outside = counts[counts["outside"]]
    for label, c, nh, nq, status in (
        (NO_PHASE, no_phase, int((h_phase.eq("") & ~h_out).sum()), int((q_phase.eq("") & ~q_out).sum()), "in steps"),
        (OUTSIDE_LABEL, outside, int(h_out.sum()), int(q_out.sum()), "outside steps"),
    ):
        if c["kernels"].sum() or c["sync_calls"].sum() or c["queries"].sum() or nh or nq:
            rows.append(
                dict(
                    phase=label,
                    period=pd.NA,
                    steps=0,
                    first_step=pd.NA,
                    kernels=int(c["kernels"].sum()),
                    sync_calls=int(c["sync_calls"].sum()),
                    sync_hook_hits=nh,
                    queries=int(c["queries"].sum()),
                    query_hook_hits=nq,
                    status=status,
                )
            )
    cols = [
        "phase",
        "period",
        "steps",
        "first_step",
        "kernels",
        "sync_calls",
        "sync_hook_hits",
        "queries",
        "query_hook_hits",
        "status",
    ]
    return pd.DataFrame(rows, columns=cols).astype({"first_step": "Int64", "period": "Int64"})


def timing_note(per_step: pd.DataFrame, max_steps: int = TIMING_NOTE_STEPS) -> str:
    """ "" when no step of `per_step` (a StepMetrics.per_step: columns step, anomaly) is damaged, else which steps'
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

    head = (
        f"timing of every step ({len(per_step)}) left out"
        if len(damaged) == len(per_step)
        else f"timing of {named(damaged['step'])} left out"
    )
    by_reason = damaged.groupby("anomaly", sort=False)["step"]
    return head + ": " + " | ".join(f"{reason} ({named(steps)})" for reason, steps in by_reason)


def _in_scope(path: pd.Series, scope: tuple[str, ...] | None) -> pd.Series:
    """Per event: whether one of its enclosing phases (`path`) is in `scope` (None: every event)."""
    if scope is None:
        return pd.Series(True, index=path.index)
    wanted = set(scope)
    has = path.map(len).gt(0).to_numpy()
    out = np.zeros(len(path), dtype=bool)
    out[has] = [bool(wanted.intersection(p)) for p in path[has]]
    return pd.Series(out, index=path.index)


def _event_metrics(
    df: pd.DataFrame,
    phase: pd.Series,
    path: pd.Series,
    precision: pd.Series,
    roles: PhaseRoles,
    query: pd.Series | None = None,
) -> pd.DataFrame:
    """One row per event: the 0/1 (or us) contributions of that event to each summed per-step column. The one place
    a trace-count criterion's counter goes (Kineto and Nsight traces both arrive here in the trace schema): a
    column added here is summed per step, named in the per-step table and, when a criterion's column, judged and
    given its events as evidence (tests/guards/test_criteria_ids.py)."""
    flags = event_flags(df)
    api = api_names(df)
    # a `memcpy*` kernel is a D2D copy node of a CUDA graph that the driver ran as a kernel (on one run it runs so,
    # on another as a DtoD memcpy: the H200 showed both for the same graph): a copy (d2d_copies), never a kernel
    copy_kernel = flags["memcpy_kernels"]
    for col in ("kernels", "kernels_grid1", "kernels_in_graphs"):
        flags[col] &= ~copy_kernel
    kernel = df["kind"].eq("kernel") & ~copy_kernel
    out = flags.astype("int64")
    called = api.ne("")
    blocking = pd.Series(False, index=df.index)
    blocking[called] = api[called].str.match(r"cu(da)?Memcpy") & ~api[called].str.contains("Async")
    out["blocking_memcpy_calls"] = blocking.astype("int64")
    out["pageable_async_copies"] = _pageable_async_copies(df, api).astype("int64")
    out["stream_sync_calls"] = api.isin(STREAM_SYNC_APIS).astype("int64")
    out["event_sync_calls"] = (
        api.isin(EVENT_SYNC_APIS).astype("int64") + out["blocking_memcpy_calls"] + out["pageable_async_copies"]
    )
    out["d2d_copies"] = out["memcpy_dtod_events"] + out["memcpy_kernels"]
    out["memsets"] = out["memset_events"] + out["fill_kernels"]
    out["spectral_norm_launches"] = (kernel & phase.eq(roles.spectral_norm)).astype("int64")
    is_gemm = kernel & precision.ne("")
    fwd, bwd = is_gemm & phase.isin(roles.forward), is_gemm & phase.isin(roles.backward)
    out["fwd_gemms"], out["fwd_gemms_not_tf32"] = fwd.astype("int64"), (fwd & precision.ne(TF32)).astype("int64")
    out["bwd_gemms"], out["bwd_gemms_tf32"] = bwd.astype("int64"), (bwd & precision.eq(TF32)).astype("int64")
    unphased = path.map(len).eq(0)  # loop code in a step outside every phase range: judged as the learner's
    learner = (_in_scope(path, roles.learner) | unphased).astype("int64")
    env = _in_scope(path, roles.env).astype("int64")
    out["learner_d2d_copies"] = out["d2d_copies"] * learner
    out["learner_memsets"] = out["memsets"] * learner
    out["env_kernels"] = out["kernels"] * env
    out["env_kernels_grid1"] = out["kernels_grid1"] * env
    out["gpu_kernel_us"] = df["dur_us"].where(kernel & valid_time(df), 0.0)
    query = pd.Series(False, index=df.index) if query is None else query
    out["completion_queries"] = query.astype("int64")
    out["query_host_us"] = df["dur_us"].where(query & valid_time(df), 0.0)
    return out


def kernel_times(df: pd.DataFrame, kernel: pd.Series, bucket: pd.Series, steps: pd.Series) -> dict[str, float]:
    """{KERNEL_US_PREFIX + name: the kernel's GPU time per step (us)} over `steps` (the undamaged steps' numbers),
    from the events where `kernel` (a bool Series on df's index: kernels with a valid time, copy kernels excluded)
    holds and whose step (`bucket`) is one of `steps`: the median over the steps that ran the kernel of its summed
    time in the step (two layers' launches of one kernel add up), times the share of `steps` that ran it. A median,
    so that one stalled launch (H200 traces hold a few 2.5 ms instances of 20-40 us kernels) moves nothing; times the
    share, so that a kernel of a periodic phase (every 100 steps) counts by its share. {} when there is no such step."""
    if not len(steps):
        return {}
    picked = kernel & bucket.isin(steps.tolist()).fillna(False).astype(bool)
    per_step = df.loc[picked].assign(step=bucket[picked]).groupby(["name", "step"], observed=True)["dur_us"].sum()
    out = {}
    for name, times in per_step.groupby(level="name", observed=True):
        out[f"{KERNEL_US_PREFIX}{name}"] = float(times.median()) * len(times) / len(steps)
    return out


def _pageable_async_copies(df: pd.DataFrame, api: pd.Series) -> pd.Series:
    """Per event: a "Pageable" memcpy launched by an async memcpy call whose thread's next CUDA call is no sync."""
    calls = df[api.ne("")].assign(api=api).sort_values(["pid", "tid", "start_us"], kind="stable")
    next_api = calls.groupby(["pid", "tid"], observed=True)["api"].shift(-1)
    unsynced = calls["api"].str.contains("Memcpy") & calls["api"].str.contains("Async") & ~next_api.isin(_SYNC_APIS)
    corr = calls.loc[unsynced, "correlation"].dropna()
    pageable = df["kind"].eq("memcpy") & df["name"].str.contains("Pageable", regex=False)
    return pageable & df["correlation"].isin(corr).fillna(False).astype(bool)


def _interval_metrics(
    kernels: pd.DataFrame, phase: pd.Series, steps: pd.Series, roles: PhaseRoles, ranges: pd.DataFrame
) -> pd.DataFrame:
    """Per step (rows aligned with `ranges`): gpu_busy_us, gpu_span_us and the DDQN overlap columns, over the
    `kernels` given (the caller passes those with a valid time)."""
    rows = []
    k = kernels.assign(
        end=kernels["start_us"] + kernels["dur_us"], phase=phase[kernels.index], step=steps[kernels.index]
    )
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
        rows.append(
            {
                "gpu_busy_us": sum((e - b for b, e in _union(g["start_us"], g["end"])), 0.0),
                "gpu_span_us": float(g["end"].max() - g["start_us"].min()) if len(g) else 0.0,
                "ddqn_kernel_us": ddqn_us,
                "ddqn_overlap_us": overlap_us,
                "ddqn_overlap_ratio": overlap_us / ddqn_us if both and ddqn_us > 0 else np.nan,
            }
        )
    return pd.DataFrame(
        rows, columns=["gpu_busy_us", "gpu_span_us", "ddqn_kernel_us", "ddqn_overlap_us", "ddqn_overlap_ratio"]
    )


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


def _evidence(
    df: pd.DataFrame,
    ev: pd.DataFrame,
    phase: pd.Series,
    precision: pd.Series,
    roles: PhaseRoles,
    outside: pd.Series,
    query: pd.Series | None = None,
    in_op: pd.Series | None = None,
) -> dict[str, list[str]]:
    """{criterion: ["<name>[ in <phase>][ (outside steps)] x<count>", ...]} over the window's events `df` (event
    metrics `ev`; `outside`: the events outside every step), for each CRITERIA row whose column is an event
    metric (a PER_ENV_STEP column: its count column's events, then "env_steps_per_update <n>" and
    "env_kernels_grid1 <count> over the window"), and the TF32 / DDQN rows. A row that judges polling queries
    (`query_column`) also names the counted completion queries (`query`) in their phase, "(polling xP)" when P of
    them are beyond the allowance, and the queries inside torch operators (`in_op`) as "not judged"."""

    def named(mask: pd.Series, label: pd.Series | None = None) -> list[str]:
        counts = (where if label is None else label)[mask].map(_short).value_counts(sort=True)
        return [f"{name} x{n}" for name, n in counts.items()]

    # astype(str) everywhere: with pandas 3's Arrow strings an empty object Series would be a null-typed array
    ph = phase.astype(str)
    where = (
        df["name"].astype(str)
        + pd.Series(np.where(ph.ne(""), " in " + ph, ""), index=df.index).astype(str)
        + pd.Series(np.where(outside, " " + OUTSIDE_LABEL, ""), index=df.index).astype(str)
    )
    fwd, bwd = ev["fwd_gemms"].eq(1), ev["bwd_gemms"].eq(1)
    bad = ev["fwd_gemms_not_tf32"].eq(1) | ev["bwd_gemms_tf32"].eq(1)
    gemm_label = (
        pd.Series(np.where(bad, "FAIL ", ""), index=df.index).astype(str)
        + ph
        + ": "
        + precision.astype(str)
        + " "
        + df["name"].astype(str)
    )
    ddqn = df["kind"].eq("kernel") & phase.isin([roles.ddqn_forward, roles.online_forward])
    out = {
        c.id: named(ev[PER_ENV_STEP.get(c.column, c.column)].gt(0))
        for c in CRITERIA
        if PER_ENV_STEP.get(c.column, c.column) in ev.columns
    }
    n = roles.env_steps_per_update
    for c in CRITERIA:  # a per-env-step row also says its divisor and the env's grid (1,1,1) kernels
        if c.column in PER_ENV_STEP:
            grid1 = int(ev["env_kernels_grid1"].sum())
            out[c.id] += [f"env_steps_per_update {n}", f"env_kernels_grid1 {grid1} over the window"]
    query = pd.Series(False, index=df.index) if query is None else query
    in_op = pd.Series(False, index=df.index) if in_op is None else in_op
    for c in CRITERIA:  # the completion queries, by name and phase; the polling ones counted apart
        if c.query_column:
            polls = ev["polling_queries"].gt(0) if "polling_queries" in ev else pd.Series(False, index=df.index)
            counts = where[query].map(_short).value_counts(sort=True)
            polling = where[query & polls].map(_short).value_counts()
            out[c.id] += [
                f"{name} x{n}" + (f" (polling x{polling[name]})" if name in polling else "")
                for name, n in counts.items()
            ]
            out[c.id] += [
                f"{name} inside a torch op x{n} (not judged)"
                for name, n in df.loc[in_op, "name"].map(_short).value_counts().items()
            ]
    for c in judged_by(PRECISION):  # the GEMMs by their name's class: evidence only (the probe decides)
        out[c.id] = named(bad, gemm_label) + named((fwd | bwd) & ~bad, gemm_label)
    for c in judged_by(OVERLAP):
        out[c.id] = named(ddqn, ph + " stream " + df["stream"].astype(str) + ": " + df["name"].astype(str))
    return out


def _short(name: str, width: int = 120) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
