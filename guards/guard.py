"""Guard any training step: run it under torch.profiler and `SyncHooks`, measure the docs/criteria.md criteria per
step, and return a verdict table.

`guard_steps(step_fn, steps=K, warmup=W)` calls `step_fn()` W times unprofiled, then K times under torch.profiler
(CPU + CUDA activities when CUDA is available) with one `record_function("step")` range per step and `SyncHooks`
active, exports the trace to a file, reads it back with `hotloop.profiles.kineto_reader`, computes `hotloop.guards.step_metrics`
and judges each row of `hotloop.guards.criteria.CRITERIA`. Nothing in it is specific to hotloop's trainer: phases come from
the step's own `record_function` ranges or from a `phases` map of kernel names.

Example: guard your own training step (run as a test in tests/guards/test_guard.py)::

    import torch
    from hotloop.guards.guard import guard_steps

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 16, device=dev), torch.randn(256, 1, device=dev)

    def my_step():
        with torch.profiler.record_function("forward"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # a host read-back: a stream sync on CUDA

    report = guard_steps(my_step, steps=5, warmup=2)
    print(report)               # the verdict table
    report.to_json("verdicts.json")

On a machine without CUDA the table reads (abridged)::

                    criterion measured   limit verdict                                          status source
               no stream sync        0    == 0    PASS                                        measured   hook
                no event sync        0    == 0    PASS                                        measured   hook
           no D2D weight sync             == 0       -                          not measured (no CUDA)
                          ...
         epoch 1 without hang           == yes       - not measured here: hotloop.guards.watchdog.HangWatchdog

On CUDA the trace side is measured too. The `loss.item()` line reads a CUDA tensor, so the hook records it with
this line as its call site and the trace shows its cudaStreamSynchronize: "no stream sync" is expected to FAIL
with source "both". The other rows depend on the kernels torch picks for this step (a small reduction may run as a
grid (1,1,1) kernel; the "forward" matmuls are FP32 unless torch.backends.cuda.matmul.allow_tf32 is set); rows
whose phases the step does not have (spectral_norm, ddqn_forward) say "not measured (...)".
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hotloop.guards.criteria import CRITERIA, verdict_table
from hotloop.guards.step_metrics import PhaseRoles, PhaseRule, StepMetrics, step_metrics
from hotloop.guards.sync_hooks import EVENT_SYNC, STREAM_SYNC, SyncHooks
from hotloop.profiles.kineto_reader import read_kineto

# criterion -> the per-step trace column it is judged on (worst step); TF32 and DDQN rows are judged apart.
TRACE_COLUMNS = {STREAM_SYNC: "stream_sync_calls", EVENT_SYNC: "event_sync_calls", "no D2D weight sync": "d2d_copies",
                 "spectral norm fused": "spectral_norm_launches", "no single-block kernels": "kernels_grid1",
                 "memsets only where needed": "memsets"}
HOOK_COLUMNS = {STREAM_SYNC: "stream_sync_hook_hits", EVENT_SYNC: "event_sync_hook_hits"}
NO_CUDA = "not measured (no CUDA)"
VERDICT_COLUMNS = ["criterion", "measured", "limit", "verdict", "status", "source", "evidence", "metric", "why"]


@dataclass
class GuardReport:
    """What `guard_steps` measured.

    verdicts: one row per CRITERIA row, columns VERDICT_COLUMNS: measured (worst step for counts, median over steps
    for the overlap ratio, "yes"/"no" for TF32), limit ("== 0"), verdict (PASS / FAIL / "-" when not measured),
    status ("measured" or "not measured (<why>)"), source (hook / trace / both: the ways that saw the fault when it
    failed, else the ways that measured it), evidence (call sites, API and kernel names with counts over all steps).
    per_step: `StepMetrics.per_step` plus stream_sync_hook_hits and event_sync_hook_hits. medians: its medians
    (timings over the undamaged steps only: hotloop.guards.step_metrics). hits: `SyncHooks.frame()`. gemms:
    `StepMetrics.gemms`. cuda: whether the CUDA side was profiled. anomalies: `StepMetrics.anomalies` (the trace's
    anomalies, hotloop.profiles.trace_anomalies.count_anomalies). timing_note: `StepMetrics.timing_note` ("" or
    which steps' timing was left out and why).
    """

    verdicts: pd.DataFrame
    per_step: pd.DataFrame
    medians: dict[str, float]
    hits: pd.DataFrame
    gemms: pd.DataFrame
    cuda: bool
    anomalies: dict = field(default_factory=dict)
    timing_note: str = ""

    @property
    def failed(self) -> list[str]:
        """Names of the criteria that failed."""
        return list(self.verdicts.loc[self.verdicts["verdict"].eq("FAIL"), "criterion"])

    def to_json(self, path: str | Path) -> Path:
        """Write {"cuda", "verdicts", "per_step", "medians", "hits", "gemms", "anomalies", "timing_note"} (tables
        as lists of records, NaN as null) to `path`; returns it as a Path."""
        def records(df: pd.DataFrame) -> list[dict]:
            return json.loads(df.to_json(orient="records"))
        doc = {"cuda": self.cuda, "verdicts": records(self.verdicts), "per_step": records(self.per_step),
               "medians": json.loads(pd.Series(self.medians, dtype="float64").to_json()),
               "hits": records(self.hits), "gemms": records(self.gemms), "anomalies": self.anomalies,
               "timing_note": self.timing_note}
        path = Path(path)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return path

    def __str__(self) -> str:
        return self.verdicts[VERDICT_COLUMNS[:6]].to_string(index=False)


def guard_steps(step_fn: Callable[[], object], steps: int = 20, warmup: int = 3, *,
                phases: Mapping[PhaseRule, str] | None = None, roles: PhaseRoles = PhaseRoles(),
                gemm_registry: Mapping[str, str] | None = None, step_range: str = "step",
                trace_path: str | Path | None = None, cuda: bool | None = None) -> GuardReport:
    """Run `step_fn()` `warmup` times, then `steps` times profiled and hooked, and judge the criteria.

    `step_fn`: any zero-argument callable doing one training step (its result is ignored). `phases`, `roles`,
    `gemm_registry`: see `hotloop.guards.step_metrics`. `step_range`: name of the record_function range put around each
    step; it must not be opened inside `step_fn` (hotloop's own trainer opens "step" ranges, profiles/ranges.py:
    guard it with e.g. step_range="guard_step"). `trace_path`: where to keep the Kineto trace (a temporary file that
    is deleted if None). `cuda`: whether the step runs on a CUDA device, so that the CUDA side is profiled and the
    trace criteria judged (default torch.cuda.is_available(); pass False for a CPU step on a GPU machine). With
    CUDA, the device is synchronized after warm-up, outside the hooks.
    Raises ValueError for steps < 1 or warmup < 0, RuntimeError if the trace does not hold exactly `steps` step
    ranges (e.g. `step_fn` opened its own `step_range` ranges); exceptions of `step_fn` propagate (hooks restored).
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    for _ in range(warmup):
        step_fn()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with SyncHooks() as hooks:  # closed before the profiler's exit, which calls torch.cuda.synchronize()
            for k in range(steps):
                hooks.step = k
                with record_function(step_range):
                    step_fn()
            hooks.step = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(trace_path) if trace_path is not None else Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        metrics = step_metrics(read_kineto(path), step_range_name=step_range, phases=phases, roles=roles,
                               gemm_registry=gemm_registry)
    if len(metrics.per_step) != steps:
        raise RuntimeError(f"the trace holds {len(metrics.per_step)} {step_range!r} ranges for {steps} guarded steps;"
                           f" does step_fn open its own {step_range!r} ranges? pass another step_range")
    hits = hooks.frame()
    per_step = with_hook_counts(metrics.per_step, hits)
    medians = {**metrics.medians, **{c: float(per_step[c].median()) for c in HOOK_COLUMNS.values()}}
    return GuardReport(evaluate(metrics, hits, cuda, roles), per_step, medians, hits, metrics.gemms, cuda,
                       metrics.anomalies, metrics.timing_note)


def with_hook_counts(per_step: pd.DataFrame, hits: pd.DataFrame) -> pd.DataFrame:
    """A copy of `per_step` (with a step column) plus the HOOK_COLUMNS: hook hits (`SyncHooks.frame()`) per step
    and criterion (int64; hits outside steps are not counted)."""
    out = per_step.copy()
    for criterion, col in HOOK_COLUMNS.items():
        counts = hits[hits["criterion"].eq(criterion)].groupby("step").size()
        out[col] = out["step"].map(counts).fillna(0).astype("int64")
    return out


def evaluate(metrics: StepMetrics, hits: pd.DataFrame, cuda: bool, roles: PhaseRoles = PhaseRoles()) -> pd.DataFrame:
    """The verdict table (GuardReport.verdicts, columns VERDICT_COLUMNS) from step metrics, the hook hits
    (`SyncHooks.frame()`, steps numbered as metrics.per_step) and whether the trace has a CUDA side. Without CUDA
    only the sync rows are measured (by the hooks); the others get status NO_CUDA. "DDQN overlapped" (a timing)
    is the median over the undamaged steps (`hotloop.guards.step_metrics`: a step holding a trace anomaly); when
    every step is damaged it is not measured, and its status says why."""
    per_step = with_hook_counts(metrics.per_step, hits)
    measured, status, source, evidence = {}, {}, {}, dict(metrics.evidence)
    for criterion, col in TRACE_COLUMNS.items():
        hook_col = HOOK_COLUMNS.get(criterion)
        trace = per_step[col] if cuda else pd.Series(0, index=per_step.index)
        hook = per_step[hook_col] if hook_col else pd.Series(0, index=per_step.index)
        if not cuda and hook_col is None:
            status[criterion] = NO_CUDA
            continue
        if criterion == "spectral norm fused" and not trace.sum():
            status[criterion] = f"not measured (no {roles.spectral_norm!r} phase kernels)"
            continue
        measured[criterion] = int((trace.combine(hook, max)).max())
        ways = ["hook"] * bool(hook_col) + ["trace"] * cuda
        seen = ["hook"] * bool(hook.sum()) + ["trace"] * bool(trace.sum())
        source[criterion] = _ways(seen or ways)
        if hook_col:
            sites = hits.loc[hits["criterion"].eq(criterion)].groupby(["api", "site"], sort=False).size()
            evidence[criterion] = ([f"hook: {api} at {site} x{n}" for (api, site), n in sites.items()]
                                   + [f"trace: {e}" for e in evidence.get(criterion, []) if cuda])
    _judge_tf32(per_step, cuda, roles, measured, status, source)
    _judge_overlap(per_step, cuda, roles, measured, status, source)
    table = verdict_table(measured)
    not_here = {c.name: f"not measured here: {c.measured_by}" for c in CRITERIA if c.measured_by}
    table["status"] = [status.get(c, not_here.get(c, s)) for c, s in zip(table["criterion"], table["status"])]
    table["source"] = table["criterion"].map(source).fillna("")
    table["evidence"] = table["criterion"].map(lambda c: "; ".join(evidence.get(c, [])) if c in measured else "")
    return table[VERDICT_COLUMNS]


def _judge_tf32(per_step, cuda, roles, measured, status, source) -> None:
    name = "TF32 forward only"
    if not cuda:
        status[name] = NO_CUDA
    elif not (per_step["fwd_gemms"].sum() + per_step["bwd_gemms"].sum()):
        status[name] = f"not measured (no GEMM kernels in phases {roles.forward + roles.backward})"
    else:
        ok = not (per_step["fwd_gemms_not_tf32"].sum() or per_step["bwd_gemms_tf32"].sum())
        measured[name], source[name] = "yes" if ok else "no", "trace"


def _judge_overlap(per_step, cuda, roles, measured, status, source) -> None:
    name = "DDQN overlapped"
    clean = per_step["anomaly"].eq("") if "anomaly" in per_step else pd.Series(True, index=per_step.index)
    ratio = per_step.loc[clean, "ddqn_overlap_ratio"].median()
    if not cuda:
        status[name] = NO_CUDA
    elif len(per_step) and not clean.any():
        status[name] = "not measured (timing of every step left out: trace anomalies)"
    elif pd.isna(ratio):
        status[name] = f"not measured (needs kernels of phases {roles.ddqn_forward!r} and {roles.online_forward!r})"
    else:
        measured[name], source[name] = round(float(ratio), 4), "trace"


def _ways(ways: list[str]) -> str:
    return "both" if len(ways) == 2 else ways[0]
