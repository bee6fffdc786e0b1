"""Guard any training loop: profile a window of K consecutive steps under torch.profiler and `SyncHooks`, measure
the docs/criteria.md criteria per step, and return a verdict table with the window's phase coverage.

Two forms, one window (`GuardWindow`):

- `guard_steps(step_fn, steps=K, warmup=W)` calls `step_fn()` W times unprofiled, then K times profiled, each in
  one `record_function("step")` range;
- `with guard_window(steps=K, warmup=W) as window:` around a loop you already run, either with `with window.step():`
  around each step (the window opens the step ranges; the first W are warm-up, unprofiled; steps after the K-th
  run unguarded), or, with warmup=0, around code that opens its own `record_function(step_range)` ranges (exactly
  K of them): hotloop's `Trainer.iterate(K)` opens one "step" range per loop iteration, and `hotloop gate`
  guards it this way. `window.report` is the GuardReport, once the `with` block has ended.

Inside the window (a `record_function(WINDOW_RANGE)` range from the window's start to its end), every event outside a
step range (the loop's own code between steps) is counted in an "outside steps" bucket: a sync there FAILs the sync
criteria. Completion queries (`Event.query` / `Stream.query` through the hooks, cudaEventQuery / cudaStreamQuery in the
trace) are counted per step apart from the syncs; those beyond the criteria's allowance
(hotloop.guards.criteria.query_allowance: the loop's own, e.g. one per readback publication) are polling queries, a host
wait without a sync call, and FAIL "no event sync" with their call sites. CPU + CUDA activities are profiled when the
loop runs on CUDA; the trace is exported, read back with `hotloop.profiles.kineto_reader`, measured by
`hotloop.guards.step_metrics` and judged against each row of `hotloop.guards.criteria.CRITERIA`. A sync-hook hit leaves
a zero-length marker range (HIT_MARK) in the trace, which places it in its step and phase. Nothing here is specific to
hotloop's trainer: phases come from the loop's own `record_function` ranges or from a `phases` map of kernel names;
`periods` ({phase: every how many steps it runs}) says which phases the window must hold: a criterion whose phases did
not run in it is "not measured (phase X not in window)", never PASS (`default_window_steps` gives a K that holds them
all).

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

             criterion                 id   limit verdict                                                 status
        no stream sync     no_stream_sync    == 0       -                               not applicable (no CUDA)
         no event sync      no_event_sync    == 0       -                               not applicable (no CUDA)
    no D2D weight sync no_d2d_weight_sync    == 0       -                                 not measured (no CUDA)
                   ...
  epoch 1 without hang            no_hang  == yes       - not measured here: hotloop.guards.watchdog.HangWatchdog

A host sync waits for a device: on the CPU there is none to find, so the sync rows are "not applicable" (the
`loss.item()` there reads host memory), not PASS; their hooks still FAIL a CUDA sync API the step calls.

On CUDA the trace side is measured too. The `loss.item()` line reads a CUDA tensor, so the hook records it with
this line as its call site and the trace shows its cudaStreamSynchronize: "no stream sync" is expected to FAIL
with source "both". The other rows depend on the kernels torch picks for this step (a small reduction may run as a
grid (1,1,1) kernel; the "forward" matmuls are FP32 unless torch.backends.cuda.matmul.allow_tf32 is set); rows
whose phases the step does not have (spectral_norm, ddqn_forward, env_step) say "not measured (...)".

The same loop guarded in place (tests/guards/test_guard_window.py runs it)::

    from hotloop.guards.guard import guard_window

    with guard_window(steps=5, warmup=2) as window:
        for i in range(100):
            with window.step():            # steps 2..6 are guarded; the others run as they are
                my_step()
    print(window.report.coverage)          # which phases ran in how many steps, their kernels and syncs
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hotloop.guards.criteria import (
    COUNT,
    CRITERIA,
    OVERLAP,
    PRECISION,
    REPORT,
    Criterion,
    query_allowance,
    verdict_table,
)
from hotloop.guards.step_metrics import (
    HIT_MARK,
    OUTSIDE_LABEL,
    PER_ENV_STEP,
    QUERY_MARK,
    WINDOW_RANGE,
    PhaseRoles,
    PhaseRule,
    StepMetrics,
    phase_coverage,
    polling_flags,
    step_metrics,
)
from hotloop.guards.sync_hooks import SyncHooks, spin_spans
from hotloop.profiles.kineto_reader import read_kineto

TRACE_COLUMNS = {c.id: c.column for c in CRITERIA if c.column and c.judge == COUNT}
"""criterion id -> the per-step trace column it is judged on (worst step); the TF32 and DDQN rows are judged apart."""
HOOK_COLUMNS = {c.id: c.hook_column for c in CRITERIA if c.hook_column}
"""criterion id -> the per-step sync-hook column judged beside its trace column."""
QUERY_HOOK_COLUMNS = ("completion_query_hook_hits", "polling_query_hook_hits", "query_wait_us")
"""Per-step columns of the hooked completion queries (`with_query_counts`): all of them, the polling ones (beyond the
allowance: hotloop.guards.step_metrics.polling_flags) and the host time of their polling runs (us,
hotloop.guards.sync_hooks.spin_spans; reported, not judged). Not in the medians (hotloop.guards.step_metrics'
QUERY_COLUMNS say why)."""
NO_CUDA = "not measured (no CUDA)"
NOT_APPLICABLE = "not applicable (no CUDA)"
"""Status of a sync row (a row with a hook column) on a run without CUDA whose hooks saw no sync: a host sync waits
for a device, so on the CPU there is none to find and a count of 0 is no verdict (verdict "-", never PASS). A hook
hit there (a CUDA API called from a CPU run) is still measured and FAILs."""
VERDICT_COLUMNS = [
    "id",
    "criterion",
    "measured",
    "limit",
    "verdict",
    "status",
    "source",
    "worst_step",
    "total",
    "phases",
    "evidence",
    "metric",
    "why",
]
"""The verdict table's columns: id (the criterion's id), criterion (its title, for display), ..."""
MIN_WINDOW_STEPS = 20
"""The smallest default window (`default_window_steps`)."""


def default_window_steps(periods: Mapping[str, int] | None = None, minimum: int = MIN_WINDOW_STEPS) -> int:
    """K = max(minimum, the longest period of `periods` ({phase: period in steps})): K consecutive steps hold every
    phase of period P <= K at least once (any P consecutive step counts hold a multiple of P).
    Raises ValueError for a period < 1 or minimum < 1."""
    periods = dict(periods or {})
    bad = {p: v for p, v in periods.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad or minimum < 1:
        raise ValueError(f"periods must be ints >= 1 and minimum >= 1, got {bad or periods}, minimum={minimum}")
    return max(minimum, *periods.values()) if periods else minimum


@dataclass
class GuardReport:
    """What a guarded window measured.

    verdicts: one row per CRITERIA row, columns VERDICT_COLUMNS: measured (the worst step for counts (for rows of
    phases "every": the worst of the steps and the outside-steps bucket), median over steps for the overlap ratio,
    "yes"/"no" for TF32), limit ("== 0"), verdict (PASS / FAIL / "-" when not measured or reported only), status
    ("measured", "reported", or "not measured (<why>)"), source (hook / trace / both: the ways that saw the fault
    when it failed, else the ways that measured it), worst_step (the step index, or "(outside steps)", where the
    measured count was seen; "" when 0; a per-env-step row's measured value is a float when the division leaves a
    fraction), total (the count over the whole window: steps + outside; for a per-env-step row the env kernels,
    undivided: hotloop.guards.step_metrics.PER_ENV_STEP), phases (the phases the row judged), evidence (call sites,
    API and kernel names with their phase and counts over the window).
    per_step: `StepMetrics.per_step` plus stream_sync_hook_hits and event_sync_hook_hits, then QUERY_HOOK_COLUMNS.
    medians: its medians (timings over the undamaged steps only: hotloop.guards.step_metrics; the completion-query
    columns left out). hits: `SyncHooks.frame()` plus phase (str) and outside (bool), each hit placed by its marker.
    queries: `SyncHooks.query_frame()` placed the same way (`attribute_queries`: phase, path, outside) plus polling
    (bool: beyond the allowance) and wait_us (the spin span it starts, us: sync_hooks.spin_spans). gemms:
    `StepMetrics.gemms`. cuda: whether the CUDA side was profiled. anomalies: `StepMetrics.anomalies`. timing_note:
    `StepMetrics.timing_note`. coverage: `hotloop.guards.step_metrics.phase_coverage` (phase, period, steps, first_step,
    kernels, sync_calls,
    sync_hook_hits, status). window: {"steps", "warmup", "step_range", "form" ("window.step()" or "own step
    ranges"), "periods", "longest_period", "missing" (periods phases that ran in no step), "window_s" (seconds the
    profiled window ran), "analysis_s" (seconds to stop the profiler and export, read and judge its trace: stop_s +
    export_s + read_s + judge_s), "events" (trace events read), "queries" (`query_summary`)}. outside: the
    outside-steps bucket's counts (`StepMetrics.outside` plus the hook columns).
    """

    verdicts: pd.DataFrame
    per_step: pd.DataFrame
    medians: dict[str, float]
    hits: pd.DataFrame
    gemms: pd.DataFrame
    cuda: bool
    anomalies: dict = field(default_factory=dict)
    timing_note: str = ""
    coverage: pd.DataFrame = field(default_factory=pd.DataFrame)
    window: dict = field(default_factory=dict)
    outside: dict = field(default_factory=dict)
    queries: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def failed(self) -> list[str]:
        """Ids of the criteria that failed."""
        return list(self.verdicts.loc[self.verdicts["verdict"].eq("FAIL"), "id"])

    def to_json(self, path: str | Path, extra: Mapping | None = None) -> Path:
        """Write {"cuda", "verdicts", "per_step", "medians", "hits", "gemms", "anomalies", "timing_note", "window",
        "coverage", "outside", "queries"} (tables as lists of records, NaN as null) and the `extra` keys to `path`;
        returns it as a Path."""

        def records(df: pd.DataFrame) -> list[dict]:
            return json.loads(df.to_json(orient="records"))

        doc = {
            "cuda": self.cuda,
            "verdicts": records(self.verdicts),
            "per_step": records(self.per_step),
            "medians": json.loads(pd.Series(self.medians, dtype="float64").to_json()),
            "hits": records(self.hits),
            "gemms": records(self.gemms),
            "anomalies": self.anomalies,
            "timing_note": self.timing_note,
            "window": self.window,
            "coverage": records(self.coverage),
            "outside": self.outside,
            "queries": records(self.queries),
            **(extra or {}),
        }
        path = Path(path)
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        return path

    def __str__(self) -> str:
        """The verdict table: title, id, measured, limit, verdict, status, source."""
        return self.verdicts[["criterion", "id", "measured", "limit", "verdict", "status", "source"]].to_string(
            index=False
        )


class _MarkedHooks(SyncHooks):
    """SyncHooks that, right after a hooked call that recorded hit n, open and close a `record_function` named
    HIT_MARK + n (QUERY_MARK + n after completion query n): the trace then shows where the hit happened (its step
    and phase ranges), whoever opened them. Built on SyncHooks' `_wrap` / `_wrap_query`
    (hotloop.guards.sync_hooks)."""

    def _wrap(self, original, api: str, criterion: str):
        return self._marked(original, super()._wrap(original, api, criterion), "hits", HIT_MARK)

    def _wrap_query(self, original, api: str):
        return self._marked(original, super()._wrap_query(original, api), "queries", QUERY_MARK)

    def _marked(self, original, hooked, records: str, mark: str):
        """`hooked`, then (outside any hooked call) a record_function `mark` + n when it recorded entry n of the
        list attribute `records` ("hits" or "queries") on this thread."""
        local = self._local

        @functools.wraps(original)
        def marked(*args, **kwargs):
            found = getattr(self, records)
            before = len(found)
            try:
                return hooked(*args, **kwargs)
            finally:
                if len(found) > before and getattr(local, "depth", 0) == 0:
                    me = threading.current_thread().name
                    n = next((i for i in range(before, len(found)) if found[i].thread == me), before)
                    local.depth = 1  # the marker itself is never a hit
                    try:
                        with record_function(f"{mark}{n}"):
                            pass
                    finally:
                        local.depth = 0

        return marked


class GuardWindow:
    """A guarded window of `steps` consecutive steps of a loop; use it through `guard_window`.

    Args:
        steps: K, the steps profiled and judged (>= 1).
        warmup: W, steps run before the window unprofiled (>= 0); with W > 0 the loop must call `window.step()`
            around each step (the window starts at the (W+1)-th).
        step_range: name of the step ranges: opened by `window.step()`, else by the guarded code itself (which must
            then open exactly K of them inside the window and none nested).
        phases, rule_phases, roles, gemm_registry: see `hotloop.guards.step_metrics.step_metrics`.
        periods: {phase: period in steps} of the loop's phases (e.g. hotloop.trainer.loop.loop_periods): shown in
            the coverage table; a criterion applying to a phase of `periods` that ran in no step of the window is
            "not measured (phase X not in window)" unless it already FAILs.
        trace_path: where to keep the Kineto trace (a temporary file, deleted, if None).
        cuda: whether the loop runs on a CUDA device, so that the CUDA side is profiled and the trace criteria
            judged (default torch.cuda.is_available()); with CUDA the device is synchronized just before the
            window, outside the hooks.
    Raises ValueError for steps < 1 or warmup < 0.
    """

    def __init__(
        self,
        steps: int,
        warmup: int = 0,
        *,
        step_range: str = "step",
        phases: Mapping[PhaseRule, str] | None = None,
        rule_phases: tuple[str, ...] | None = None,
        roles: PhaseRoles = PhaseRoles(),
        gemm_registry: Mapping[str, str] | None = None,
        periods: Mapping[str, int] | None = None,
        trace_path: str | Path | None = None,
        cuda: bool | None = None,
    ) -> None:
        if steps < 1 or warmup < 0:
            raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
        self.steps, self.warmup, self.step_range = steps, warmup, step_range
        self.phases, self.rule_phases, self.roles, self.gemm_registry = phases, rule_phases, roles, gemm_registry
        self.periods = dict(periods or {})
        self.trace_path = trace_path
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self._report: GuardReport | None = None
        self._calls = 0  # window.step() calls so far
        self._entered = False
        self._profiling = False  # between _start and _stop
        self._started = False
        self._window_s = self._stop_s = 0.0

    def __enter__(self) -> GuardWindow:
        if self._entered:
            raise RuntimeError("a GuardWindow can be entered once")
        self._entered = True
        if self.warmup == 0:
            self._start()
        return self

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Context around one step of the loop: warm-up steps run as they are, then the window's K steps each
        inside a `record_function(step_range)` range (the window starts before the first), then the window ends;
        later steps run as they are. Raises RuntimeError outside the `with guard_window(...)` block."""
        if not self._entered or self._report is not None:
            raise RuntimeError("window.step() is used inside `with guard_window(...) as window:`")
        k = self._calls
        self._calls += 1
        g = k - self.warmup
        if g < 0 or g >= self.steps:
            yield
            return
        if not self._started:
            self._start()
        self._hooks.step = g
        try:
            with record_function(self.step_range):
                yield
        finally:
            self._hooks.step = None
        if g == self.steps - 1:
            self._stop()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._profiling:
            self._stop()
        if exc_type is not None:
            return False
        if not self._started:
            raise RuntimeError(
                f"guard_window(warmup={self.warmup}): the window never started; with warmup > 0 "
                f"call window.step() around each step ({self.warmup} + {self.steps} times)"
            )
        if self._calls and self._calls - self.warmup < self.steps:
            raise RuntimeError(
                f"guard_window: {max(0, self._calls - self.warmup)} of {self.steps} guarded steps "
                f"ran ({self._calls} window.step() calls, warmup {self.warmup})"
            )
        self._report = self._analyse()
        return False

    @property
    def report(self) -> GuardReport:
        """The GuardReport; RuntimeError before the `with` block ended (or when it raised)."""
        if self._report is None:
            raise RuntimeError("window.report is there once the `with guard_window(...)` block has ended")
        return self._report

    def _start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=activities)
        self._prof.__enter__()
        self._hooks = _MarkedHooks()
        try:
            self._hooks.__enter__()
            self._range = record_function(WINDOW_RANGE)
            self._range.__enter__()
        except BaseException:
            self._hooks.__exit__(None, None, None)
            self._prof.__exit__(None, None, None)
            raise
        self._started = self._profiling = True
        self._t0 = time.perf_counter()

    def _stop(self) -> None:
        self._profiling = False
        self._window_s = time.perf_counter() - self._t0
        try:
            self._range.__exit__(None, None, None)
        finally:
            try:
                self._hooks.__exit__(None, None, None)  # before the profiler's exit, which synchronizes on CUDA
            finally:
                t = time.perf_counter()
                self._prof.__exit__(None, None, None)
                self._stop_s = time.perf_counter() - t

    def _analyse(self) -> GuardReport:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "trace.json"  # read back uncompressed; the kept copy is written apart
            self._prof.export_chrome_trace(str(raw))
            if self.trace_path is not None:
                _keep(raw, Path(self.trace_path))
            t1 = time.perf_counter()
            events = read_kineto(raw)
            t2 = time.perf_counter()
            metrics = step_metrics(
                events,
                step_range_name=self.step_range,
                phases=self.phases,
                roles=self.roles,
                gemm_registry=self.gemm_registry,
                rule_phases=self.rule_phases,
            )
        n = len(metrics.per_step)
        if n != self.steps:
            form = (
                "window.step() opens them: does the loop open its own"
                if self._calls
                else "the guarded code must open exactly that many: does it open more, or nest its own"
            )
            raise RuntimeError(
                f"the trace holds {n} {self.step_range!r} ranges for {self.steps} guarded steps; "
                f"{form} {self.step_range!r} ranges? pass another step_range"
            )
        hits = attribute_hits(self._hooks.frame(), metrics.markers)
        queries = attribute_queries(self._hooks.query_frame(), metrics.query_markers)
        per_step, queries = with_query_counts(with_hook_counts(metrics.per_step, hits), queries, metrics)
        medians = {**metrics.medians, **{c: float(per_step[c].median()) for c in HOOK_COLUMNS.values()}}
        verdicts = evaluate(metrics, hits, self.cuda, self.roles, periods=self.periods, queries=queries)
        coverage = phase_coverage(metrics, hits, self.periods, self.steps, queries)
        missing = [p for p in self.periods if p not in set(metrics.phase_steps["phase"])]
        window = {
            "steps": self.steps,
            "warmup": self.warmup,
            "step_range": self.step_range,
            "form": "window.step()" if self._calls else "own step ranges",
            "periods": self.periods,
            "longest_period": max(self.periods.values(), default=None),
            "missing": missing,
            "window_s": round(self._window_s, 6),
            "analysis_s": round(self._stop_s + time.perf_counter() - t0, 6),
            "stop_s": round(self._stop_s, 6),
            "export_s": round(t1 - t0, 6),
            "read_s": round(t2 - t1, 6),
            "judge_s": round(time.perf_counter() - t2, 6),
            "events": len(events),
            "queries": query_summary(per_step, metrics, queries, self.cuda),
        }
        return GuardReport(
            verdicts,
            per_step,
            medians,
            hits,
            metrics.gemms,
            self.cuda,
            metrics.anomalies,
            metrics.timing_note,
            coverage,
            window,
            outside_counts(metrics, hits, queries),
            queries,
        )


def _keep(raw: Path, path: Path) -> None:
    """Copy the exported trace `raw` to `path`, gzipped (level 1: torch's own .gz export uses level 9, several
    seconds for a window of 100 CPU-profiled steps) when `path` ends with .gz."""
    if path.suffix == ".gz":
        with raw.open("rb") as src, gzip.open(path, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    else:
        shutil.copyfile(raw, path)


def guard_window(steps: int, warmup: int = 0, **kwargs) -> GuardWindow:
    """`with guard_window(steps=K, warmup=W, step_range="step", ...) as window:` guards K steps of a loop run in
    the block; `window.report` is the GuardReport after it. Keyword arguments and errors: `GuardWindow`."""
    return GuardWindow(steps, warmup, **kwargs)


def guard_steps(
    step_fn: Callable[[], object],
    steps: int = 20,
    warmup: int = 3,
    *,
    phases: Mapping[PhaseRule, str] | None = None,
    roles: PhaseRoles = PhaseRoles(),
    gemm_registry: Mapping[str, str] | None = None,
    step_range: str = "step",
    trace_path: str | Path | None = None,
    cuda: bool | None = None,
    periods: Mapping[str, int] | None = None,
    rule_phases: tuple[str, ...] | None = None,
) -> GuardReport:
    """Run `step_fn()` `warmup` times, then `steps` times profiled and hooked, and judge the criteria (a
    `guard_window` with `window.step()` around each call).

    `step_fn`: any zero-argument callable doing one training step (its result is ignored). `phases`, `roles`,
    `gemm_registry`, `rule_phases`: see `hotloop.guards.step_metrics`; `periods`, `trace_path`, `cuda`: see
    `GuardWindow`. `step_range`: name of the record_function range put around each step; it must not be opened
    inside `step_fn` (hotloop's own trainer opens "step" ranges in `Trainer.iterate`: guard the loop itself with
    `guard_window`, or pass e.g. step_range="guard_step").
    Raises ValueError for steps < 1 or warmup < 0, RuntimeError if the trace does not hold exactly `steps` step
    ranges (e.g. `step_fn` opened its own `step_range` ranges); exceptions of `step_fn` propagate (hooks restored).
    """
    with guard_window(
        steps,
        warmup,
        phases=phases,
        roles=roles,
        gemm_registry=gemm_registry,
        step_range=step_range,
        trace_path=trace_path,
        cuda=cuda,
        periods=periods,
        rule_phases=rule_phases,
    ) as window:
        for _ in range(warmup + steps):
            with window.step():
                step_fn()
    return window.report


def attribute_hits(hits: pd.DataFrame, markers: pd.DataFrame) -> pd.DataFrame:
    """`hits` (SyncHooks.frame(), in call order: hit n is row n) with each hit placed by its marker
    (`StepMetrics.markers`): step (Int64, NA outside every step), phase (str) and outside (bool: inside the window,
    outside every step); a hit with no marker keeps its own step, phase "" and outside = step is NA."""
    out = hits.reset_index(drop=True).copy()
    out["phase"] = pd.Series("", index=out.index, dtype=object)
    out["outside"] = out["step"].isna().astype(bool)
    if len(out) and len(markers):
        m = markers.drop_duplicates("hit").set_index("hit")
        m = m[m.index.isin(out.index)]
        idx = m.index.to_numpy()
        out.loc[idx, "step"] = m["step"].to_numpy()
        out.loc[idx, "phase"] = m["phase"].to_numpy()
        out.loc[idx, "outside"] = m["outside"].to_numpy()
    return out.astype({"step": "Int64", "outside": bool})


def attribute_queries(queries: pd.DataFrame, markers: pd.DataFrame) -> pd.DataFrame:
    """`queries` (SyncHooks.query_frame(), in call order: query n is row n) placed by their QUERY_MARK markers
    (`StepMetrics.query_markers`) as `attribute_hits` places the sync hits: step (Int64), phase (str), outside
    (bool), plus path (tuple of str: the phase ranges around the query, the marker's, else its own `phases`)."""
    out = attribute_hits(queries, markers)
    own = out["phases"] if "phases" in out else pd.Series([()] * len(out), index=out.index, dtype=object)
    path = [tuple(p) if isinstance(p, tuple) else () for p in own]
    if len(out) and len(markers) and "path" in markers:
        m = markers.drop_duplicates("hit").set_index("hit")["path"]
        path = [tuple(m[i]) if i in m.index else p for i, p in zip(out.index, path)]
    out["phase"] = [ph or (p[-1] if p else "") for ph, p in zip(out["phase"], path)]
    out["path"] = pd.Series(path, index=out.index, dtype=object)
    return out


def _placed_queries(queries: pd.DataFrame | None) -> pd.DataFrame:
    """`queries` (a SyncHooks.query_frame(), placed or not) with phase, outside and path columns; an empty frame
    with the query columns when None."""
    if queries is None:
        queries = pd.DataFrame(
            {
                "step": pd.Series(dtype="Int64"),
                "api": pd.Series(dtype=object),
                "site": pd.Series(dtype=object),
                "function": pd.Series(dtype=object),
                "thread": pd.Series(dtype=object),
                "ready": pd.Series(dtype=bool),
                "start_s": pd.Series(dtype="float64"),
                "dur_s": pd.Series(dtype="float64"),
                "phases": pd.Series(dtype=object),
            }
        )
    out = _placed(queries)
    if "path" not in out:
        out = out.copy()
        own = out["phases"] if "phases" in out else pd.Series([()] * len(out), index=out.index, dtype=object)
        out["path"] = pd.Series([tuple(p) if isinstance(p, tuple) else () for p in own], index=out.index, dtype=object)
    return out


def with_query_counts(
    per_step: pd.DataFrame,
    queries: pd.DataFrame | None,
    metrics: StepMetrics,
    allowance: Mapping[str, int] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(a copy of `per_step` plus the QUERY_HOOK_COLUMNS, the queries plus polling (bool) and wait_us (float)) from
    the hooked completion queries `queries` (`attribute_queries`; None: none), each judged by
    hotloop.guards.step_metrics.polling_flags against `allowance` (default hotloop.guards.criteria.query_allowance())
    per run of its phases in its step (`metrics.phase_runs`); every query outside the steps is polling. wait_us:
    hotloop.guards.sync_hooks.spin_spans in microseconds."""
    out = per_step.copy()
    q = _placed_queries(queries).copy()
    allowance = query_allowance() if allowance is None else allowance
    where = q["step"].astype("Int64").where(~q["outside"].astype(bool), -1)
    q["polling"] = polling_flags(where, q["path"], metrics.phase_runs, allowance) if len(q) else np.zeros(0, bool)
    q["wait_us"] = spin_spans(q) * 1e6 if len(q) else pd.Series(dtype="float64")
    placed = q[q["step"].notna() & ~q["outside"].astype(bool)]
    by_step = placed.groupby(placed["step"].astype("int64"))
    out["completion_query_hook_hits"] = out["step"].map(by_step.size()).fillna(0).astype("int64")
    out["polling_query_hook_hits"] = out["step"].map(by_step["polling"].sum()).fillna(0).astype("int64")
    out["query_wait_us"] = out["step"].map(by_step["wait_us"].sum()).fillna(0.0).astype("float64")
    return out, q


def query_summary(
    per_step: pd.DataFrame,
    metrics: StepMetrics,
    queries: pd.DataFrame | None,
    cuda: bool,
    allowance: Mapping[str, int] | None = None,
) -> dict:
    """The window's completion queries, steps and outside-steps bucket together: {"trace": the counted trace queries
    (hotloop.guards.step_metrics.QUERY_COLUMNS; None without CUDA), "hook": the hooked ones, "polling_trace",
    "polling_hook": those beyond the allowance, "allowed": what the allowance grants over the window (per-run
    queries x the runs of each allowance phase), "allowance": {phase: queries per run}, "query_host_us_per_step":
    the trace's host time inside the counted queries per step (None without CUDA), "query_wait_us_per_step": the
    hooks' spin spans per step}. `queries`: as `with_query_counts` returns them. A report: "no event sync" judges
    the polling ones."""
    allowance = query_allowance() if allowance is None else dict(allowance)
    runs = metrics.phase_runs
    allowed = int(sum(n * int(runs.loc[runs["phase"].eq(p), "runs"].sum()) for p, n in allowance.items()))
    q = _placed_queries(queries)
    out = metrics.outside
    steps = max(len(per_step), 1)

    def trace(col: str) -> float | None:
        return float(per_step[col].sum() + out.get(col, 0.0)) if cuda and col in per_step else None

    host = trace("query_host_us")
    return {
        "trace": None if trace("completion_queries") is None else int(trace("completion_queries")),
        "hook": len(q),
        "polling_trace": None if trace("polling_queries") is None else int(trace("polling_queries")),
        "polling_hook": int(q["polling"].sum()) if "polling" in q else 0,
        "allowed": allowed,
        "allowance": allowance,
        "query_host_us_per_step": None if host is None else round(host / steps, 3),
        "query_wait_us_per_step": round(float(q["wait_us"].sum()) / steps, 3) if "wait_us" in q else 0.0,
    }


def _placed(hits: pd.DataFrame) -> pd.DataFrame:
    """`hits` with phase and outside columns (a bare SyncHooks.frame(): phase "", outside = step is NA)."""
    if "phase" in hits and "outside" in hits:
        return hits
    out = hits.copy()
    out["phase"] = pd.Series("", index=out.index, dtype=object)
    out["outside"] = out["step"].isna().astype(bool)
    return out


def with_hook_counts(per_step: pd.DataFrame, hits: pd.DataFrame) -> pd.DataFrame:
    """A copy of `per_step` (with a step column) plus the HOOK_COLUMNS: hook hits (`SyncHooks.frame()`) per step
    and criterion (int64; hits outside steps are counted in `outside_counts`, not here)."""
    out = per_step.copy()
    for criterion, col in HOOK_COLUMNS.items():
        counts = hits[hits["criterion"].eq(criterion)].groupby("step").size()
        out[col] = out["step"].map(counts).fillna(0).astype("int64")
    return out


def outside_counts(metrics: StepMetrics, hits: pd.DataFrame, queries: pd.DataFrame | None = None) -> dict[str, float]:
    """The outside-steps bucket: `metrics.outside` plus, per HOOK_COLUMNS column, the hits outside every step, and
    the hooked queries outside every step (completion_query_hook_hits, polling_query_hook_hits: all of them are
    polling there, query_wait_us)."""
    hits = _placed(hits)
    out = dict(metrics.outside)
    for criterion, col in HOOK_COLUMNS.items():
        out[col] = float((hits["criterion"].eq(criterion) & hits["outside"]).sum())
    q = _placed_queries(queries)
    outside = q[q["outside"]]
    out["completion_query_hook_hits"] = float(len(outside))
    out["polling_query_hook_hits"] = float(len(outside))
    out["query_wait_us"] = float(outside["wait_us"].sum()) if "wait_us" in outside else 0.0
    return out


def _not_in_window(names: list[str]) -> str:
    return f"not measured (phase{'s' * (len(names) > 1)} {', '.join(names)} not in window)"


def evaluate(
    metrics: StepMetrics,
    hits: pd.DataFrame,
    cuda: bool,
    roles: PhaseRoles = PhaseRoles(),
    *,
    periods: Mapping[str, int] | None = None,
    criteria: tuple[Criterion, ...] = CRITERIA,
    queries: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The verdict table (GuardReport.verdicts, columns VERDICT_COLUMNS) from step metrics, the hook hits
    (`SyncHooks.frame()`, steps numbered as metrics.per_step; with phase and outside columns when placed by
    `attribute_hits`; hits with no step are outside steps) and whether the trace has a CUDA side.

    Each row of `criteria` is judged on its column over the events of its phases (`PhaseRoles.scope`): the worst
    step (rows of phases "every" also the outside-steps bucket), hook and trace counts joined per step by max (a
    row with a query column: syncs + polling queries on each side, `queries` being the hooked completion queries,
    SyncHooks.query_frame() placed by `attribute_queries`, their allowance the rows'); a
    per-env-step row (env_kernels_per_env_step) on its per-step ratio, its total the env kernels of the window.
    Without CUDA the rows with no hook column get status NO_CUDA, and the sync rows (with a hook column) are
    NOT_APPLICABLE (verdict "-") unless the hooks saw a sync, which FAILs them.
    Coverage: a phase of `periods` that ran in no step (`StepMetrics.phase_steps`) and that a row applies to
    (phases "every": all of them), or a row none of whose phases ran, makes the row "not measured (phase X not in
    window)" unless it FAILs on what was measured (a FAIL names the missing phases in its evidence). "DDQN
    overlapped" (a timing) is the median over the undamaged steps (`hotloop.guards.step_metrics`: a step holding a
    trace anomaly); when every step is damaged it is not measured, and its status says why. Raises ValueError for
    a row's unknown phase scope."""
    hits = _placed(hits)
    allowance = query_allowance(criteria)
    per_step, queries = with_query_counts(with_hook_counts(metrics.per_step, hits), queries, metrics, allowance)
    outside = outside_counts(metrics, hits, queries)
    ran = set(metrics.phase_steps["phase"])
    missing = [p for p in (periods or {}) if p not in ran]
    measured, status, source, evidence = {}, {}, {}, dict(metrics.evidence)
    worst, total, judged = {}, {}, {}
    zeros = pd.Series(0, index=per_step.index)
    for c in criteria:
        if c.measured_by:
            continue
        scope = roles.scope(c.phases)
        every = c.phases == "every"
        judged[c.id] = (
            "every phase + outside steps"
            if every
            else ", ".join(scope)
            if scope is not None
            else "every phase of a step"
        )
        lacking = [p for p in missing if scope is None or p in scope]
        absent = [] if scope is None or set(scope) & ran else list(scope)
        if c.judge in _JUDGES:
            _JUDGES[c.judge](c.id, per_step, cuda, roles, measured, status, source, lacking)
            continue
        if not cuda and c.hook_column is None:
            status[c.id] = NO_CUDA
            continue
        trace = (per_step[c.column] + (per_step[c.query_column] if c.query_column else 0)) if cuda else zeros
        hook = (per_step[c.hook_column] if c.hook_column else zeros) + (
            per_step[c.query_hook_column] if c.query_hook_column else 0
        )
        values = [_number(v) for v in trace.combine(hook, max)]
        labels = [str(s) for s in per_step["step"]]
        out_trace = outside.get(c.column, 0) + (outside.get(c.query_column, 0) if c.query_column else 0)
        out_hook = (outside.get(c.hook_column, 0) if c.hook_column else 0) + (
            outside.get(c.query_hook_column, 0) if c.query_hook_column else 0
        )
        if every:
            values.append(_number(max(out_trace if cuda else 0, out_hook)))
            labels.append(OUTSIDE_LABEL)
        value = max(values, default=0)
        fails = c.comparison != REPORT and not c.check(value)
        if not fails and (lacking or absent):
            status[c.id] = _not_in_window(lacking or absent)
            continue
        if not cuda and not fails:  # no device to wait for: 0 syncs on a CPU run is no verdict
            status[c.id] = NOT_APPLICABLE
            continue
        measured[c.id] = value
        worst[c.id] = labels[values.index(value)] if value else ""
        count = PER_ENV_STEP.get(c.column)  # a ratio row's total: the count it divides (an int, as the others)
        total[c.id] = int(per_step[count].sum()) if count and cuda else sum(values)
        ways = ["hook"] * bool(c.hook_column) + ["trace"] * cuda
        seen = ["hook"] * bool(sum(hook) + (out_hook if every else 0)) + ["trace"] * bool(
            cuda and (sum(trace) + (out_trace if every else 0))
        )
        source[c.id] = _ways(seen or ways)
        rows = evidence.get(c.id, []) if cuda else []
        if c.hook_column:
            mine = hits[hits["criterion"].eq(c.id)]
            place = pd.Series(
                [
                    (f" in {p}" if isinstance(p, str) and p else "") + (f" {OUTSIDE_LABEL}" if o else "")
                    for p, o in zip(mine["phase"], mine["outside"])
                ],
                index=mine.index,
                dtype=object,
            )
            sites = mine.assign(place=place).groupby(["api", "site", "place"], sort=False).size()
            rows = [f"hook: {api} at {site}{where} x{n}" for (api, site, where), n in sites.items()] + [
                f"trace: {e}" for e in rows
            ]
        if c.query_column or c.query_hook_column:
            rows += _query_evidence(c, queries, per_step, metrics, cuda, periods)
        if fails and lacking:
            rows = [*rows, f"also {_not_in_window(lacking)[len('not measured (') : -1]}"]
        evidence[c.id] = rows
    table = verdict_table(measured, criteria)
    not_here = {c.id: f"not measured here: {c.measured_by}" for c in criteria if c.measured_by}
    table["status"] = [status.get(c, not_here.get(c, s)) for c, s in zip(table["id"], table["status"])]
    table["source"] = table["id"].map(lambda c: source.get(c, ""))
    table["worst_step"] = table["id"].map(lambda c: worst.get(c, ""))
    table["total"] = pd.array([total.get(c) for c in table["id"]], dtype="Int64")
    table["phases"] = table["id"].map(lambda c: judged.get(c, ""))
    table["evidence"] = table["id"].map(lambda c: "; ".join(evidence.get(c, [])) if c in measured else "")
    return table[VERDICT_COLUMNS]


def _query_evidence(
    c: Criterion,
    queries: pd.DataFrame,
    per_step: pd.DataFrame,
    metrics: StepMetrics,
    cuda: bool,
    periods: Mapping[str, int] | None,
) -> list[str]:
    """The completion-query lines of row `c`'s evidence ([] when the window made none): the hooked queries by call
    site and place, the polling ones first ("polling", with how many returned not ready), then one summary line:
    the counts (trace, hooks), what the row's allowance granted over the window (per run x the runs of its phases,
    and their periods), the polling ones, and the host time in queries per step (reported, not judged)."""
    s = query_summary(per_step, metrics, queries, cuda, dict(c.query_allowance))
    if not s["hook"] and not s["trace"]:
        return []
    q = queries
    rows = []
    if len(q):
        place = pd.Series(
            [
                (f" in {p}" if isinstance(p, str) and p else "") + (f" {OUTSIDE_LABEL}" if o else "")
                for p, o in zip(q["phase"], q["outside"])
            ],
            index=q.index,
            dtype=object,
        )
        g = (
            q.assign(place=place, not_ready=~q["ready"].astype(bool))
            .groupby(["polling", "api", "site", "place"], sort=False)["not_ready"]
            .agg(["size", "sum"])
        )
        for (poll, api, site, where), (n, nr) in sorted(g.iterrows(), key=lambda kv: not kv[0][0]):
            rows.append(f"hook: {api} at {site}{where} x{n} {'polling' if poll else 'allowed'}, {nr} not ready")
    runs = metrics.phase_runs
    grants = []
    for phase, n in c.query_allowance:
        k = int(runs.loc[runs["phase"].eq(phase), "runs"].sum())
        every = (periods or {}).get(phase)
        grants.append(f"{n} per {phase} x {k} run{'s' * (k != 1)}" + (f", every {every} steps" if every else ""))

    def dash(v: object) -> object:
        return "-" if v is None else v

    rows.append(
        f"completion queries {dash(s['trace'])} (trace) / {s['hook']} (hooks), allowed "
        f"{s['allowed']} ({'; '.join(grants) or 'none'}), polling {dash(s['polling_trace'])} / "
        f"{s['polling_hook']}; host time in queries {dash(s['query_host_us_per_step'])} us per step (trace), "
        f"spin spans {s['query_wait_us_per_step']} us per step (hooks)"
    )
    return rows


def _judge_tf32(name, per_step, cuda, roles, measured, status, source, lacking=()) -> None:
    """Row `name` (a PRECISION row) from the window: "yes" when no forward GEMM kernel is named other than TF32 and
    no backward one TF32 (the gate's precision probe then decides: hotloop.guards.gate.judge_precision)."""
    ok = not (per_step["fwd_gemms_not_tf32"].sum() or per_step["bwd_gemms_tf32"].sum())
    if not cuda:
        status[name] = NO_CUDA
    elif not (per_step["fwd_gemms"].sum() + per_step["bwd_gemms"].sum()):
        status[name] = f"not measured (no GEMM kernels in phases {roles.forward + roles.backward})"
    elif ok and lacking:
        status[name] = _not_in_window(list(lacking))
    else:
        measured[name], source[name] = "yes" if ok else "no", "trace"


def _judge_overlap(name, per_step, cuda, roles, measured, status, source, lacking=()) -> None:
    """Row `name` (an OVERLAP row): the median DDQN overlap ratio over the undamaged steps."""
    clean = per_step["anomaly"].eq("") if "anomaly" in per_step else pd.Series(True, index=per_step.index)
    ratio = per_step.loc[clean, "ddqn_overlap_ratio"].median()
    if not cuda:
        status[name] = NO_CUDA
    elif len(per_step) and not clean.any():
        status[name] = "not measured (timing of every step left out: trace anomalies)"
    elif pd.isna(ratio):
        status[name] = f"not measured (needs kernels of phases {roles.ddqn_forward!r} and {roles.online_forward!r})"
    elif ratio > 0 and lacking:
        status[name] = _not_in_window(list(lacking))
    else:
        measured[name], source[name] = round(float(ratio), 4), "trace"


_JUDGES = {PRECISION: _judge_tf32, OVERLAP: _judge_overlap}
"""The window's judges of the rows that are no worst-step count (Criterion.judge); every COUNT row is judged by
`evaluate` itself."""


def _number(v: float) -> int | float:
    """A per-step value as the verdict shows it: an int when whole (counts), else the float (a per-env-step ratio
    such as 3.5)."""
    v = float(v)
    return int(v) if v.is_integer() else v


def _ways(ways: list[str]) -> str:
    return "both" if len(ways) == 2 else ways[0]
