"""The seed's success criteria in one declarative table, and the verdicts a run gets against it.

Each row (`Criterion`) names the per-step metric column it is judged on (`column`, plus `hook_column` for the sync
hooks; columns of hotloop.guards.step_metrics / hotloop.guards.guard), the phases it applies to (`phases`, resolved
by hotloop.guards.step_metrics.PhaseRoles.scope), how the steps are aggregated (`aggregate`), the comparison and
limit, the trace field or hook the column counts (`trace_field`), the evidence the verdict prints (`evidence`) and
why. docs/criteria.md's table mirrors these rows (tests/guards/test_criteria_table.py checks it). A row whose metric
the guarded window cannot measure has `measured_by` naming what does (the gate fills it in, or shows "not measured
here"); a row with comparison "report" has no limit: it is measured and shown, and never passes or fails a run.

Completion queries (`torch.cuda.Event.query` / `Stream.query`, `cudaEventQuery` / `cudaStreamQuery`) are no syncs,
but a host that queries until the GPU is done waits exactly as a sync does. A row with `query_column` judges, beside
its syncs, the queries beyond its `query_allowance`: {phase: queries allowed per run of that phase}, the loop's own
legitimate ones. hotloop's loop makes one kind: the non-blocking readback's `AsyncReadback.publish` queries the event
of the one buffer it writes (trainer/readback.py), READBACK_QUERIES_PER_PUBLISH = 1 per run of `readback_publish`,
which runs every `log_interval` iterations (hotloop.trainer.loop.loop_periods): 1 / log_interval per iteration, K //
log_interval or one more in a window of K iterations. Every other query (another phase, a second query in the same
publication, outside every step) is a polling query (hotloop.guards.step_metrics.polling_flags).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import pandas as pd

_OPS = {"==": operator.eq, "<=": operator.le, ">": operator.gt, "<": operator.lt, ">=": operator.ge}
REPORT = "report"
"""The comparison of a reported row: no limit."""
AGGREGATES = ("worst step", "all steps", "median over steps")
"""How a row's per-step values become its measured value: the worst step (for phases "every": the worst of the
steps and the window's "outside steps" bucket), a yes/no over all steps, the median over the undamaged steps."""


@dataclass(frozen=True)
class Criterion:
    """One success criterion: `measured <comparison> limit` must hold over the guarded window.

    name: the row's name. column: the per-step metric column it is judged on (None for a row measured outside the
    window). comparison: one of ==, <=, >, <, >= or REPORT. limit: the bound (None for REPORT). why: the reason.
    phases: a PhaseRoles.scope name ("every": every phase and the events outside steps; "learner", "env",
    "spectral_norm", "gemms", "ddqn") or a tuple of phase names: the events the column counts, and the phases that
    must have run in the window for the row to be measured. hook_column: the per-step sync-hook column judged
    beside `column` (max of the two per step). aggregate: one of AGGREGATES. trace_field: the trace field / hook /
    tool the column counts. evidence: what the verdict's evidence lists. measured_by: for a row the guarded window
    does not measure, what does (else None)."""

    name: str
    column: str | None
    comparison: str
    limit: float | str | None
    why: str
    phases: str | tuple[str, ...] = "every"
    hook_column: str | None = None
    aggregate: str = "worst step"
    trace_field: str = ""
    evidence: str = ""
    measured_by: str | None = None
    query_column: str | None = None
    query_hook_column: str | None = None
    query_allowance: tuple[tuple[str, int], ...] = ()

    @property
    def metric(self) -> str:
        """The column(s) judged: "column / hook_column", each "+ query column" when the row judges polling queries
        too (the per-step value is the sum); "" for none."""
        trace = " + ".join(c for c in (self.column, self.query_column) if c)
        hook = " + ".join(c for c in (self.hook_column, self.query_hook_column) if c)
        return " / ".join(c for c in (trace, hook) if c)

    @property
    def allowance_text(self) -> str:
        """The completion queries the row allows, e.g. "allowed completion queries: 1 per readback_publish"; ""
        for a row without an allowance."""
        if not self.query_allowance:
            return ""
        return "allowed completion queries: " + ", ".join(f"{n} per {p}" for p, n in self.query_allowance)

    @property
    def limit_text(self) -> str:
        """"<comparison> <limit>", or "none (reported)" for a REPORT row."""
        return "none (reported)" if self.comparison == REPORT else f"{self.comparison} {self.limit}"

    def check(self, measured: float | str) -> bool:
        """True when `measured` meets the limit; ValueError for an unknown comparison or a REPORT row (no limit)."""
        if self.comparison not in _OPS:
            raise ValueError(f"criterion {self.name!r}: comparison {self.comparison!r} has no limit to check")
        return bool(_OPS[self.comparison](measured, self.limit))


READBACK_QUERIES_PER_PUBLISH = 1
"""Completion queries one `AsyncReadback.publish` makes: it queries the event of the buffer it is about to write,
once (trainer/readback.py, `_completed(target)`); tests/guards/test_criteria_table.py counts them with a fake event."""
READBACK_ALLOWANCE = (("readback_publish", READBACK_QUERIES_PER_PUBLISH),)
"""The loop's legitimate completion queries: READBACK_QUERIES_PER_PUBLISH per run of the readback_publish phase (every
`log_interval` iterations)."""
_SYNC_EVIDENCE = ("hook call sites (api at file:line in phase xN) and trace API names (in phase, or outside steps, "
                  "xN) over the window")
CRITERIA: tuple[Criterion, ...] = (
    Criterion("no stream sync", "stream_sync_calls", "==", 0, "a stream sync stalls the host on the GPU every step",
              hook_column="stream_sync_hook_hits",
              trace_field="cuda_runtime/cuda_driver calls cudaStreamSynchronize, cuStreamSynchronize; hooks "
                          "Stream.synchronize, Tensor.item/.cpu/.tolist/.numpy/__bool__ on CUDA tensors",
              evidence=_SYNC_EVIDENCE),
    Criterion("no event sync", "event_sync_calls", "==", 0,
              "any of these blocks the host until the GPU drains, and so does a host polling until it is done",
              hook_column="event_sync_hook_hits", query_column="polling_queries",
              query_hook_column="polling_query_hook_hits", query_allowance=READBACK_ALLOWANCE,
              trace_field="calls cudaEventSynchronize, cudaDeviceSynchronize, cuEventSynchronize, cuCtxSynchronize, "
                          "blocking cudaMemcpy*/cuMemcpy*, pageable non_blocking copies; hooks torch.cuda.synchronize, "
                          "torch.accelerator.synchronize, Event.synchronize; polling: completion queries "
                          "(cudaEventQuery, cudaStreamQuery, cuEventQuery, cuStreamQuery on the loop's thread outside "
                          "torch ops; hooks Event.query, Stream.query) beyond the allowance",
              evidence=_SYNC_EVIDENCE + "; polling query call sites (api at file:line in phase xN, not ready xM), "
                                        "completion queries and allowed ones, host time in queries per iteration"),
    Criterion("no D2D weight sync", "learner_d2d_copies", "==", 0,
              "weights are views of one flat buffer; copying them wastes bandwidth and launches", phases="learner",
              trace_field="gpu_memcpy events of kind DtoD + kernels named memcpy* (a copy inside a graph)",
              evidence="copy names in their phase xN"),
    Criterion("spectral norm fused", "spectral_norm_launches", "<=", 1,
              "one fused launch normalizes all weight matrices", phases="spectral_norm",
              trace_field="kernels of phase spectral_norm (by name in a replay, else the enclosing range)",
              evidence="kernel names xN"),
    Criterion("no single-block kernels", "kernels_grid1", "==", 0,
              "a one-block kernel leaves 131 of 132 SMs idle", phases="every",
              trace_field="kernel args.grid == [1, 1, 1]", evidence="kernel names in their phase xN"),
    Criterion("memsets only where needed", "learner_memsets", "<=", 1,
              "accumulators are initialized inside the kernels that use them", phases="learner",
              trace_field="gpu_memset events + kernels named *fill* (zero_() is a FillFunctor kernel)",
              evidence="memset / fill kernel names in their phase xN"),
    Criterion("TF32 forward only", "fwd_gemms_not_tf32 + bwd_gemms_tf32", "==", "yes",
              "TF32 tensor cores where accuracy allows, FP32-accurate gradients", phases="gemms",
              aggregate="all steps",
              trace_field="the float64 precision probe of the step's GEMMs (hotloop.probes.precision_probe); the "
                          "forward / backward GEMM kernels classed by name (gemm_precision) as evidence only",
              evidence="each product's normwise error and class, MMA instruction counts, the names (not judged)"),
    Criterion("DDQN overlapped", "ddqn_overlap_ratio", ">", 0, "the second stream hides the Double-DQN forward",
              phases="ddqn", aggregate="median over steps",
              trace_field="intervals of ddqn_forward kernels overlapping forward kernels on another stream",
              evidence="the two phases' kernels per stream xN; the timing note of damaged steps"),
    Criterion("env kernels per env step", "env_kernels_per_env_step", "<=", 3,
              "the fused actor runs a vectorized env step in at most 3 launches (act, tree insert, commit); "
              "every extra launch is paid on every env step", phases="env",
              trace_field="kernels of the env phases in the step / the env steps it ran (PhaseRoles."
                          "env_steps_per_update: cfg.env_steps_per_update)",
              evidence="kernel names in their phase xN, env_steps_per_update, the env's grid (1,1,1) kernels "
                       "(env_kernels_grid1) over the window"),
    Criterion("no sync in the epochs' loop", None, "==", 0,
              "a sync every N iterations stalls the loop though the guarded window may hold none", phases=(),
              aggregate="all steps",
              query_allowance=READBACK_ALLOWANCE,
              trace_field="the sync hooks and torch's sync debug warnings over Trainer.iterate in every epoch after "
                          "the first, pageable non_blocking copies made from Python included (C++-made ones: the "
                          "window's trace sees those); polling: the hooked Event.query / Stream.query calls beyond "
                          "the allowance, per iteration and phase",
              evidence="call sites (api or 'sync debug warning' at file:line xN) and their iterations' period",
              measured_by="hotloop.guards.loop_syncs.LoopSyncCensus over the gate's epochs"),
    Criterion("epoch 1 without hang", None, "==", "yes",
              "a hang (e.g. the seed's tree race) must fail fast with stacks, not time out CI", phases=(),
              aggregate="all steps", trace_field="HangWatchdog around every epoch", evidence="",
              measured_by="hotloop.guards.watchdog.HangWatchdog"),
    Criterion("smoke suite", None, "==", "pass", "every part works end to end", phases=(), aggregate="all steps",
              trace_field="pytest -m smoke", measured_by="pytest -m smoke (not run by the gate)"),
)


def query_allowance(criteria: tuple[Criterion, ...] = CRITERIA) -> dict[str, int]:
    """{phase: completion queries allowed per run of it} over the rows of `criteria` that judge queries (the largest
    where two rows name one phase): what hotloop.guards.step_metrics, hotloop.guards.guard and
    hotloop.guards.loop_syncs treat as the loop's own queries."""
    out: dict[str, int] = {}
    for c in criteria:
        for phase, n in c.query_allowance:
            out[phase] = max(n, out.get(phase, 0))
    return out


def verdict_table(measurements: dict[str, float | str],
                  criteria: tuple[Criterion, ...] = CRITERIA) -> pd.DataFrame:
    """Verdicts of all `criteria` for the `measurements` given (criterion name -> measured value).

    Returns a DataFrame with columns criterion, metric, limit, measured, status ("measured", "reported" for a
    REPORT row, "not yet measured"), verdict ("PASS" / "FAIL" / "-": not measured, or a REPORT row), why.
    ValueError if a measurement names no criterion."""
    unknown = sorted(set(measurements) - {c.name for c in criteria})
    if unknown:
        raise ValueError(f"measurements for unknown criteria {unknown}")
    rows = []
    for c in criteria:
        has = c.name in measurements
        value = measurements.get(c.name, "")
        report = c.comparison == REPORT
        status = ("reported" if report else "measured") if has else "not yet measured"
        verdict = ("PASS" if c.check(value) else "FAIL") if has and not report else "-"
        rows.append(dict(criterion=c.name, metric=c.metric, limit=c.limit_text, measured=value, status=status,
                         verdict=verdict, why=c.why))
    return pd.DataFrame(rows)
