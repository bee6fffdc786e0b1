"""The seed's success criteria: one registry entry per criterion, looked up by its short stable id, and the
verdicts a run gets against them.

Each entry (`Criterion`) has an id (`no_stream_sync`: what code, faults, mutants and tables key on), a title (for
display only: no code compares titles; tests/guards/test_criteria_ids.py scans guards/ for that), the per-step
metric column it is judged on (`column`, plus `hook_column` for the sync hooks; columns of
hotloop.guards.step_metrics / hotloop.guards.guard), the phases it applies to (`phases`, resolved by
hotloop.guards.step_metrics.PhaseRoles.scope), how the steps are aggregated (`aggregate`), the comparison and limit,
the function that judges it (`judge`, one of JUDGES: the guarded window's count judge, the precision probe, the DDQN
overlap, the loop census, the hang watchdog or pytest), what it sees and does not see (`sees`), the evidence the
verdict prints (`evidence`) and why. docs/criteria.md's table is `markdown_table()` of these entries, and `hotloop
criteria` prints `criteria_frame()` (tests/guards/test_criteria_table.py checks the docs). A row whose metric the
guarded window cannot measure has `measured_by` naming what does (the gate fills it in, or shows "not measured
here"); a row with comparison "report" has no limit: it is measured and shown, and never passes or fails a run.

A new trace-count criterion is one entry here (its id, title, column, phases, limit), its counter (the per-event
column in hotloop.guards.step_metrics' `_event_metrics`, read from Kineto and Nsight traces alike), its mutant
(ci/mutants/) and its test: the guard judges it, the gate prints it and its evidence names its events without
another line of code (tests/guards/test_criteria_ids.py adds one as a fixture).

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
import re
from dataclasses import dataclass

import pandas as pd

_OPS = {"==": operator.eq, "<=": operator.le, ">": operator.gt, "<": operator.lt, ">=": operator.ge}
REPORT = "report"
"""The comparison of a reported row: no limit."""
AGGREGATES = ("worst step", "all steps", "median over steps")
"""How a row's per-step values become its measured value: the worst step (for phases "every": the worst of the
steps and the window's "outside steps" bucket), a yes/no over all steps, the median over the undamaged steps."""
COUNT, PRECISION, OVERLAP, LOOP_CENSUS, WATCHDOG, PYTEST, RANKS = (
    "window count",
    "precision probe",
    "overlap median",
    "loop sync census",
    "hang watchdog",
    "pytest",
    "rank collectives",
)
JUDGES = (COUNT, PRECISION, OVERLAP, LOOP_CENSUS, WATCHDOG, PYTEST, RANKS)
"""The functions that judge a row (`Criterion.judge`): COUNT, the guarded window's worst step of its trace column and
hook column (hotloop.guards.guard.evaluate); PRECISION, the float64 precision probe of the step's GEMMs
(hotloop.guards.gate.judge_precision; the window's kernel names as evidence only); OVERLAP, the median DDQN overlap
ratio over the undamaged steps (hotloop.guards.guard); LOOP_CENSUS, the sync census of the epochs' loop
(hotloop.guards.gate.judge_loop_syncs); WATCHDOG, the hang watchdog of epoch 1 (hotloop.guards.gate.judge_hang);
PYTEST, `pytest -m smoke` (not run by the gate); RANKS, the collectives per step of every rank's guarded window in
`hotloop gate --nproc N` (hotloop.guards.data_parallel.judge_ranks; not measured in a one-process gate)."""
_ID = re.compile(r"^[a-z][a-z0-9_]*$")
SCOPE_TEXT = {
    "every": "`every` phase + outside steps",
    "gemms": "`gemms`: forward, ddqn_forward / backward",
    "ddqn": "`ddqn`: ddqn_forward vs forward",
    "env": "`env`: env_step",
}
"""The phases cell of docs/criteria.md for a scope name whose phases need saying (others: the name in backticks)."""


@dataclass(frozen=True)
class Criterion:
    """One success criterion: `measured <comparison> limit` must hold over the guarded window.

    id: the short stable id (lower-case letters, digits, _) every lookup uses. title: the name shown to a reader
    (display only). column: the per-step metric column it is judged on (None for a row measured outside the
    window). comparison: one of ==, <=, >, <, >= or REPORT. limit: the bound (None for REPORT). why: the reason.
    phases: a PhaseRoles.scope name ("every": every phase and the events outside steps; "learner", "env",
    "spectral_norm", "gemms", "ddqn") or a tuple of phase names: the events the column counts, and the phases that
    must have run in the window for the row to be measured. hook_column: the per-step sync-hook column judged
    beside `column` (max of the two per step). aggregate: one of AGGREGATES. sees: what the row counts, from which
    trace field / hook / tool, and what it does not see (markdown; docs/criteria.md's "source of truth" cell).
    evidence: what the verdict's evidence lists. measured_by: for a row the guarded window does not measure, what
    does (else None). query_column / query_hook_column / query_allowance: the polling queries judged beside the
    syncs and the queries allowed per run of a phase. judge: one of JUDGES.
    Raises ValueError for a malformed id, an unknown judge or aggregate."""

    id: str
    title: str
    column: str | None
    comparison: str
    limit: float | str | None
    why: str
    phases: str | tuple[str, ...] = "every"
    hook_column: str | None = None
    aggregate: str = "worst step"
    sees: str = ""
    evidence: str = ""
    measured_by: str | None = None
    query_column: str | None = None
    query_hook_column: str | None = None
    query_allowance: tuple[tuple[str, int], ...] = ()
    judge: str = COUNT

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.match(self.id):
            raise ValueError(f"criterion id {self.id!r}: must be lower-case letters, digits and _")
        if self.judge not in JUDGES:
            raise ValueError(f"criterion {self.id}: judge {self.judge!r} is not one of {JUDGES}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"criterion {self.id}: aggregate {self.aggregate!r} is not one of {AGGREGATES}")

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
    def label(self) -> str:
        """ "title [id]": how a table shows the row."""
        return f"{self.title} [{self.id}]"

    @property
    def phases_text(self) -> str:
        """docs/criteria.md's phases cell: SCOPE_TEXT's words for a scope, else the scope in backticks, the phase
        names of a tuple, "-" for a row measured outside the window."""
        if self.measured_by:
            return "-"
        if isinstance(self.phases, tuple):
            return ", ".join(f"`{p}`" for p in self.phases) or "-"
        return SCOPE_TEXT.get(self.phases, f"`{self.phases}`")

    @property
    def limit_text(self) -> str:
        """ "<comparison> <limit>", or "none (reported)" for a REPORT row."""
        return "none (reported)" if self.comparison == REPORT else f"{self.comparison} {self.limit}"

    def check(self, measured: float | str) -> bool:
        """True when `measured` meets the limit; ValueError for an unknown comparison or a REPORT row (no limit)."""
        if self.comparison not in _OPS:
            raise ValueError(f"criterion {self.id}: comparison {self.comparison!r} has no limit to check")
        return bool(_OPS[self.comparison](measured, self.limit))


READBACK_QUERIES_PER_PUBLISH = 1
"""Completion queries one `AsyncReadback.publish` makes: it queries the event of the buffer it is about to write,
once (trainer/readback.py, `_completed(target)`); tests/guards/test_criteria_table.py counts them with a fake event."""
READBACK_ALLOWANCE = (("readback_publish", READBACK_QUERIES_PER_PUBLISH),)
"""The loop's legitimate completion queries: READBACK_QUERIES_PER_PUBLISH per run of the readback_publish phase (every
`log_interval` iterations)."""
CRITERIA: tuple[Criterion, ...] = (
    Criterion(
        "no_stream_sync",
        "no stream sync",
        "stream_sync_calls",
        "==",
        0,
        "a host read-back stalls the host on the GPU every step",
        hook_column="stream_sync_hook_hits",
        sees="Kineto `cuda_runtime`/`cuda_driver` calls `cudaStreamSynchronize`, `cuStreamSynchronize`; hooks "
        "`torch.cuda.Stream.synchronize`, `Tensor.item/.cpu/.tolist/.numpy/__bool__` on CUDA tensors",
        evidence="hook call sites (api at file:line in phase xN), trace API names in their phase or outside steps",
    ),
    Criterion(
        "no_event_sync",
        "no event sync",
        "event_sync_calls",
        "==",
        0,
        "each blocks the host until the GPU drains (sync-debug mode misses two of them); a host polling until "
        "the GPU is done waits the same, with no sync call",
        hook_column="event_sync_hook_hits",
        query_column="polling_queries",
        query_hook_column="polling_query_hook_hits",
        query_allowance=READBACK_ALLOWANCE,
        sees="calls `cudaEventSynchronize`, `cudaDeviceSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize`, "
        "blocking `cudaMemcpy*`/`cuMemcpy*`, non_blocking copies to pageable memory (Kineto `Memcpy ... "
        "Pageable` not followed by a sync); hooks `torch.cuda.synchronize`, `torch.accelerator."
        "synchronize`, `torch.cuda.Event.synchronize`; plus polling queries: completion queries (calls "
        "`cudaEventQuery`, `cudaStreamQuery`, `cuEventQuery`, `cuStreamQuery` on the loop's thread "
        "outside torch ops; hooks `torch.cuda.Event.query`, `torch.cuda.Stream.query`) beyond the "
        "allowance, allowed completion queries: 1 per readback_publish (`READBACK_QUERIES_PER_PUBLISH`; "
        'every `log_interval` iterations: see "Polling waits")',
        evidence="as above, and the queries' call sites (`polling` or `allowed`, how many not ready), the counts "
        "against the allowance, the host time in queries per step",
    ),
    Criterion(
        "no_d2d_weight_sync",
        "no D2D weight sync",
        "learner_d2d_copies",
        "==",
        0,
        "weights are views of one flat buffer; a copy wastes bandwidth and launches",
        phases="learner",
        sees="`gpu_memcpy` events of kind DtoD + kernels named `memcpy*` (a D2D copy captured in a graph); "
        "Nsight `CUPTI_ACTIVITY_KIND_MEMCPY` copyKind 8",
        evidence="copy names in their phase",
    ),
    Criterion(
        "spectral_norm_fused",
        "spectral norm fused",
        "spectral_norm_launches",
        "<=",
        1,
        "one fused launch normalizes every weight matrix",
        phases="spectral_norm",
        sees="kernels of phase `spectral_norm` (by kernel name in a replay, else the enclosing range)",
        evidence="kernel names",
    ),
    Criterion(
        "no_single_block_kernels",
        "no single-block kernels",
        "kernels_grid1",
        "==",
        0,
        "a one-block kernel leaves 131 of 132 SMs idle",
        phases="every",
        sees="kernels with `args.grid` == [1,1,1] (a `memcpy*` copy kernel excluded); Nsight gridX,Y,Z",
        evidence="kernel names in their phase or outside steps",
    ),
    Criterion(
        "memsets_only_where_needed",
        "memsets only where needed",
        "learner_memsets",
        "<=",
        1,
        "accumulators are initialized inside the kernels that use them",
        phases="learner",
        sees="`gpu_memset` events + kernels named `*fill*` (`zero_()` is a FillFunctor kernel); Nsight "
        "`CUPTI_ACTIVITY_KIND_MEMSET`",
        evidence="memset / fill kernel names in their phase",
    ),
    Criterion(
        "tf32_forward_only",
        "TF32 forward only",
        "fwd_gemms_not_tf32 + bwd_gemms_tf32",
        "==",
        "yes",
        "TF32 tensor cores where accuracy allows, FP32-accurate gradients",
        phases="gemms",
        aggregate="all steps",
        judge=PRECISION,
        sees="the float64 precision probe of the step's GEMMs (`hotloop.guards.probes.precision_probe`, below); the "
        "forward / backward GEMM kernels classed by name (`gemm_precision`) as evidence only",
        evidence="each product's normwise error and class, MMA instruction counts, the names (not judged)",
    ),
    Criterion(
        "ddqn_overlapped",
        "DDQN overlapped",
        "ddqn_overlap_ratio",
        ">",
        0,
        "the second stream hides the Double-DQN forward",
        phases="ddqn",
        aggregate="median over steps",
        judge=OVERLAP,
        sees="intervals of `ddqn_forward` kernels overlapping `forward` kernels on another stream",
        evidence="the two phases' kernels per stream; the damaged steps' timing note",
    ),
    Criterion(
        "env_kernels_per_env_step",
        "env kernels per env step",
        "env_kernels_per_env_step",
        "<=",
        3,
        "the fused actor runs a vectorized env step in at most 3 launches (act, tree insert, commit); every "
        "extra launch is paid on every env step",
        phases="env",
        sees="kernels of the env phases in the step (copy kernels excluded) / `PhaseRoles.env_steps_per_update` "
        "(the gate: `cfg.env_steps_per_update`)",
        evidence="kernel names in their phase; `env_steps_per_update`; `env_kernels_grid1` over the window",
    ),
    Criterion(
        "no_loop_sync",
        "no sync in the epochs' loop",
        None,
        "==",
        0,
        "a sync or a polling wait every N iterations stalls the loop though the guarded window may hold none",
        phases=(),
        aggregate="all steps",
        query_allowance=READBACK_ALLOWANCE,
        judge=LOOP_CENSUS,
        sees="on by default (`hotloop gate --no-loop-census` turns it off): `hotloop.guards.loop_syncs."
        "LoopSyncCensus`: the sync hooks and torch's sync debug warnings (\"called a synchronizing CUDA "
        "operation\") over `Trainer.iterate` of every epoch after the first, from the epoch's start to its "
        "readback phase, outside the guarded window (CUDA only; counted: pageable non_blocking `copy_`/"
        "`to`/`cuda` calls made from Python, and polling queries: the hooked `Event.query` / "
        "`Stream.query` calls beyond the allowance per iteration and phase, allowed completion queries: 1 "
        "per readback_publish; not seen: such copies made inside C++, `torch.Event`/`torch.Stream` syncs "
        "and queries, queries made from C++; guards/loop_syncs.py)",
        evidence="call sites (api or `sync debug warning` at file:line xN, `polling:` api at file:line in phase "
        'xN) and the iterations they ran in with their period ("every 300 iterations (iterations 300, '
        '600, 900 of epochs 2-3)")',
        measured_by="hotloop.guards.loop_syncs.LoopSyncCensus over the gate's epochs",
    ),
    Criterion(
        "one_all_reduce_per_step",
        "one all-reduce per learner step",
        None,
        "==",
        1,
        "data-parallel ranks average the gradient with ONE all-reduce of the flat buffer per learner step; a "
        "missing one lets the ranks diverge, and any other collective makes every rank wait for the slowest, "
        "every step",
        phases=(),
        judge=RANKS,
        sees="`hotloop gate --nproc N` (N > 1) only: each rank's guarded-window trace "
        "(`hotloop.profiles.rank_traces.step_collectives`): the CPU-side collective ops (`c10d::allreduce_`, "
        "`c10d::broadcast_`, `c10d::barrier`, `_c10d_functional::*`, ...) and the NCCL kernels launched from "
        "the step (`ncclDevKernel_*`, or `oneRankReduce` at world size 1: a collective replayed in a CUDA graph), per "
        "kind, the larger of the two; "
        "judged on the worst step of the worst rank: exactly 1 all-reduce and no other kind (the measured value "
        "is that step's collectives); not seen: collectives outside the step ranges, a backend called below "
        "c10d",
        evidence="the ranks that fail, each with its worst step's all-reduces and other collectives (kind xN)",
        measured_by="hotloop gate --nproc N: every rank's guarded window (one process: not measured)",
    ),
    Criterion(
        "no_hang",
        "epoch 1 without hang",
        None,
        "==",
        "yes",
        "a hang must fail fast with all stacks, not time out CI",
        phases=(),
        aggregate="all steps",
        judge=WATCHDOG,
        sees="`hotloop.guards.watchdog.HangWatchdog` around every epoch",
        measured_by="hotloop.guards.watchdog.HangWatchdog",
    ),
    Criterion(
        "smoke_suite",
        "smoke suite",
        None,
        "==",
        "pass",
        "every part works end to end",
        phases=(),
        aggregate="all steps",
        judge=PYTEST,
        sees="`pytest -m smoke` (not run by the gate)",
        measured_by="pytest -m smoke (not run by the gate)",
    ),
)
"""The registry: every criterion, in the order the tables show them."""
_BY_ID = {c.id: c for c in CRITERIA}
if len(_BY_ID) != len(CRITERIA):
    raise ValueError(f"criteria ids are not unique: {[c.id for c in CRITERIA]}")


def criterion(id_: str, criteria: tuple[Criterion, ...] = CRITERIA) -> Criterion:
    """The entry of `criteria` whose id is `id_`. Raises ValueError naming the unknown id and the known ones."""
    for c in criteria:
        if c.id == id_:
            return c
    raise ValueError(f"unknown criterion id {id_!r}; known: {', '.join(c.id for c in criteria)}")


def judged_by(judge: str, criteria: tuple[Criterion, ...] = CRITERIA) -> tuple[Criterion, ...]:
    """The entries of `criteria` whose `judge` is `judge` (one of JUDGES; ValueError for another)."""
    if judge not in JUDGES:
        raise ValueError(f"judge {judge!r} is not one of {JUDGES}")
    return tuple(c for c in criteria if c.judge == judge)


def id_of(text: str, criteria: tuple[Criterion, ...] = CRITERIA) -> str:
    """The id `text` names: an id as it is, a title (criteria.csv / mutants.toml files written before ids) mapped to
    its id, anything else (a baseline row, "epoch throughput") returned unchanged. For reading old files only: code
    keys on ids."""
    if any(c.id == text for c in criteria):
        return text
    return next((c.id for c in criteria if c.title == text), text)


def label(text: str, criteria: tuple[Criterion, ...] = CRITERIA) -> str:
    """ "title [id]" for a criterion id, `text` unchanged for anything else (a timing row, "hang")."""
    return next((c.label for c in criteria if c.id == text), text)


def query_allowance(criteria: tuple[Criterion, ...] = CRITERIA) -> dict[str, int]:
    """{phase: completion queries allowed per run of it} over the rows of `criteria` that judge queries (the largest
    where two rows name one phase): what hotloop.guards.step_metrics, hotloop.guards.guard and
    hotloop.guards.loop_syncs treat as the loop's own queries."""
    out: dict[str, int] = {}
    for c in criteria:
        for phase, n in c.query_allowance:
            out[phase] = max(n, out.get(phase, 0))
    return out


def verdict_table(measurements: dict[str, float | str], criteria: tuple[Criterion, ...] = CRITERIA) -> pd.DataFrame:
    """Verdicts of all `criteria` for the `measurements` given (criterion id -> measured value).

    Returns a DataFrame with columns id, criterion (the title), metric, limit, measured, status ("measured",
    "reported" for a REPORT row, "not yet measured"), verdict ("PASS" / "FAIL" / "-": not measured, or a REPORT
    row), why. ValueError if a measurement names no criterion id."""
    unknown = sorted(set(measurements) - {c.id for c in criteria})
    if unknown:
        raise ValueError(f"measurements for unknown criteria {unknown}")
    rows = []
    for c in criteria:
        has = c.id in measurements
        value = measurements.get(c.id, "")
        report = c.comparison == REPORT
        status = ("reported" if report else "measured") if has else "not yet measured"
        verdict = ("PASS" if c.check(value) else "FAIL") if has and not report else "-"
        rows.append(
            dict(
                id=c.id,
                criterion=c.title,
                metric=c.metric,
                limit=c.limit_text,
                measured=value,
                status=status,
                verdict=verdict,
                why=c.why,
            )
        )
    return pd.DataFrame(rows)


TABLE_COLUMNS = ["id", "criterion", "metric", "limit", "phases", "judged by"]
"""The columns of `criteria_frame` (`hotloop criteria`)."""


def criteria_frame(criteria: tuple[Criterion, ...] = CRITERIA) -> pd.DataFrame:
    """One row per entry of `criteria`: id, criterion (the title), metric, limit, phases (the scope name or phase
    names; "-" for a row measured outside the window), judged by (`measured_by` when set, else `judge`)."""
    rows = [
        dict(
            id=c.id,
            criterion=c.title,
            metric=c.metric or "-",
            limit=c.limit_text,
            phases="-" if c.measured_by else ", ".join(c.phases) if isinstance(c.phases, tuple) else c.phases,
            **{"judged by": c.measured_by or c.judge},
        )
        for c in criteria
    ]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


MARKDOWN_HEADER = (
    "| id | criterion | metric (per step) | phases | aggregate | limit | source of truth (trace field / "
    "hook) | evidence | why |"
)


def markdown_table(criteria: tuple[Criterion, ...] = CRITERIA) -> str:
    """docs/criteria.md's criteria table (header, separator, one line per entry; no trailing newline): id, title,
    metric columns in backticks ("-" for none), `phases_text`, aggregate ("-" for a row measured outside the
    window), limit, `sees`, `evidence` ("-" for none), why. `hotloop criteria --markdown` prints it."""
    lines = [MARKDOWN_HEADER, "|" + "---|" * MARKDOWN_HEADER.count(" | ") + "---|"]
    for c in criteria:
        metric = (
            " / ".join(" + ".join(f"`{x}`" for x in side.split(" + ")) for side in c.metric.split(" / "))
            if c.metric and c.query_column
            else (f"`{c.column}` / `{c.hook_column}`" if c.hook_column else f"`{c.column}`" if c.column else "-")
        )
        cells = [
            f"`{c.id}`",
            c.title,
            metric,
            c.phases_text,
            "-" if c.measured_by else c.aggregate,
            c.limit_text,
            c.sees or "-",
            c.evidence or "-",
            c.why,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
