"""Per-GPU baselines of the per-step metrics, and the noise-aware comparison of a run against one.

A baseline file is `guards/baseline_files/<gpu-name-slug>.json` for the cartpole preset and
`<gpu-name-slug>--<preset>.json` for another (`baseline_path`; "NVIDIA H200" -> nvidia-h200.json,
nvidia-h200--seed-scale.json), written deliberately by `write_baseline` (`hotloop gate --update-baseline`)::

    {"schema": 1, "gpu": "NVIDIA H200", "config": {the run's Config fields},
     "metrics": {"gpu_span_us": {"kind": "timing", "values": [R values], "median": m, "spread": s}, ...},
     "epoch_metrics": {"steady": true, "epochs": [2, 3, ...],
                       "metrics": {"learner_steps_per_s": {"kind": "timing", "values": [one per epoch], ...},
                                   "gpu_ms_per_step": {...}}}}

`values` holds one value per repeat (R repeats of the guarded steps on that GPU; each value is that repeat's median
over its K steps, `GuardReport.medians`); `median` and `spread` are written for readers and recomputed on load.
NaN is stored as null. "config" (optional) is the configuration the baseline was measured with (device and
learner resolved): a run whose configuration differs in a field that shapes the guarded step (`config_mismatch`,
on the step identities hotloop.guards.gate.step_identity builds) is not compared with it (a CartPole baseline says nothing
about a seed-scale step, a GPU baseline nothing about a CPU run).

Comparison (`compare`): a run is R' repeats of the same metrics.

- Structural counts (`is_count`: syncs, grid (1,1,1) kernels, D2D copies, memsets, spectral-norm launches,
  non-TF32 forward / TF32 backward GEMMs, kernels per step) are deterministic: every repeat must equal the
  baseline's median exactly.
- Every other metric is a timing (or a ratio of timings) and fails only when the run's statistic is worse than the
  baseline's by more than max(threshold, k x spread). The threshold is an expression (`parse_threshold`), default
  "median:+5%" (lower is better) or "median:-5%" for *_per_s and *_ratio metrics (higher is better).

- Reported, not compared (`REPORTED_ONLY`, each with its reason): ddqn_overlap_us and ddqn_overlap_ratio, how much
  of the Double-DQN forward ran beside the online one. That is a scheduling outcome, not a cost: on the H200 the
  ratio ranged 0.22-0.93 over 10 repeats of two commits with unchanged streams (the baselines recorded at a30c915
  and b5d7f03: results/h200/gate/), so 5 repeats give no tolerance that holds, and more overlap is better while
  "_us" reads lower-is-better. The gate's criterion "DDQN overlapped" (> 0) catches the fault they stand for (the
  forward serialized: guards/faults.py ddqn_serial), and the time it costs shows in gpu_busy_us. A
  run that measured them in the baseline but not now (NaN: e.g. the DDQN kernels no longer assigned to their phase)
  still FAILs.
  Also dur_us, the host-side step range: in the profiled window of a GPU-bound loop it is the host's own cost when
  it runs ahead and the GPU's when a full launch queue holds it, and the profiler's overhead moves between the two.
  Five clean gates of one H200 call at 927902a gave 463, 288, 161, 161, 282 us per iteration against a baseline
  median of 274 (its own repeats at 021d63f up to 373; the H200 baseline before: 241, 150, 250, 222, 258), so no
  tolerance from 5 repeats holds (the first of those five FAILed a clean tree). A host regression large enough to
  matter makes the loop host-bound and fails the epoch throughput (below); in 61 kills of three mutation runs
  (results/h200/mutation/mutants.csv) dur_us never killed a mutant that nothing else did.
  Also gpu_span_us, first kernel start to last kernel end per step: it holds the GPU's waits for the host, so where
  the step is host-bound it is as multimodal as dur_us, across processes rather than steps: four of 22 clean gates on
  an H100 on 2026-12-05 (cartpole, results/h200/gate/clean5/h100_false_alarms/) read +25% to +37% in every window
  of the process (two more windows in the same process read the same) with gpu_busy_us unchanged. gpu_busy_us
  (slower kernels) and the epoch throughput (a slower loop) guard what it stood for; no mutant of ci/mutants names
  it.
  Also memcpy_dtod_events and memcpy_kernels, the two forms of a D2D copy: a copy node of a CUDA graph runs as a
  `memcpy*` kernel in one run and as a DtoD memcpy in another (the H200 showed 4 per step of each for the same
  actor graph, the gate's CLI run against the perf tests' run); their sum, d2d_copies, is compared exactly.
- Thresholds of their own (`THRESHOLDS`): ddqn_kernel_us, the Double-DQN forward's kernel time, "median:+20%": its
  kernels share the SMs with the online chain's as far as they overlap, so their time grows with the overlap
  ratio (H200, 927902a: 10.9 us at ratio 0.85 against the baseline's 10.3 at 0.24, +5.8%, with every baseline
  repeat equal: MAD 0). +10% raised a false alarm on a clean tree (H100, 1094b79, 2026-12-06, `hotloop mutate`'s
  spectral-norm clean check: the baseline's own 5 repeats 10.7-12.4 us, median 11.06, MAD spread 0.26; the run
  12.27 us, +11.0%, at overlap ratio 0.83: results/h200/mutation/README.md). A slower Double-DQN forward
  also moves gpu_kernel_us and its kernels' own kernel_us rows.

Per-kernel timings (KERNEL_US_PREFIX + kernel name, hotloop.guards.step_metrics.kernel_times): each kernel's GPU
time per guarded step (the median over the steps that ran it, scaled by their share), so that one kernel slowed
down inside (a tile, a warp count, a grid, an extra pass) fails the gate though the step's total moves less than its
5%: a kernel of 4% of the step made twice as slow moves the total by 4%.
Rule KERNEL_THRESHOLD, "median:+10%", or 3 x MAD spread, or KERNEL_FLOOR_US (1 us), whichever is largest. Its
evidence (results/h200/gate/clean5/kernel_timings/): against a baseline of the cartpole preset recorded in an earlier
H200 call, 4 clean gates (and 4 more against one of their own call) moved no kernel of >= 8 us by more than 0.9% and
no smaller kernel by more than 0.35 us; a seed-scale clean gate moved none by more than 1.2%. Two kernels slowed
inside moved theirs by 11-16% (1.3-3.0 us), which +25% let pass. Older seed-scale data (results/h200/ab/tf32_rounding/kernels.csv) saw a Double-DQN forward kernel,
which shares the SMs with the online chain as far as they overlap, move 14% between calls: a false alarm this rule
may raise at seed scale, where re-recording the baseline on the runner is the remedy.
A kernel only in the run is new ("-": not in baseline); one only in the baseline FAILs as any missing metric does
(a renamed kernel: re-record the baseline).

Renamed columns: a per-step column the gate no longer computes (`RETIRED`, e.g. learner_kernels_grid1 since "no
single-block kernels" judges kernels_grid1 over every phase) is shown beside an old baseline with verdict "-" and
its rule saying so, not FAILed; the column that replaced it (or a new one: env_kernels, env_kernels_per_env_step)
is "not in baseline" ("-") until the baseline is re-recorded.

Epoch throughput (`epoch_metrics`, `compare_epochs`): the per-epoch table (hotloop.profiles.epoch_table) is compared
too, so that a regression of the whole loop (acting, env stepping, readback, logging: work outside the guarded
steps) fails the gate even when no structural count moves. EPOCH_METRICS are learner_steps_per_s (higher is better,
"median:-5%"), gpu_ms_per_step (lower is better, "median:+5%"), and the whole epoch beyond its loop: epoch_total_s
("median:+5%", the epoch's main-thread wall time, hotloop.profiles.run_timeline) and epoch_overhead_s (epoch_total_s
- wall_s: evaluation, best-policy file, table writes, the checkpoint's main-thread share; "median:+25%" or
EPOCH_FLOORS_S["epoch_overhead_s"], and each of those phases apart, EPOCH_PHASE_METRICS: "median:+25%" or
its EPOCH_FLOORS_S, so that a checkpoint made blocking again or an evaluation back to eager steps with host syncs
fails though the loop did not move), one value per steady-state epoch: every epoch but
the first, which compiles the kernels and captures the CUDA graphs (a 1-epoch run has only that one, flagged not
steady: `EpochMetrics.steady`). They are stored under "epoch_metrics" (optional: a file written before it loads,
and `compare_epochs` then reports "epoch throughput: no baseline values (rewrite with --update-baseline)") and
compared by the same rule as the step timings: median of the run's steady epochs against the median of the
baseline's, worse by more than max(5%, 3 x MAD spread of the baseline's epochs) FAILs. Both are timings whatever
their names say (`gpu_ms_per_step` does not end in a TIMING_SUFFIX); the rows are named EPOCH_PREFIX + metric
("epoch_learner_steps_per_s"), so they sit apart from the step metrics in one table. A side whose epochs are not
steady is not compared (verdict "-"): the first epoch's time is mostly compilation.

Spread statistic: the baseline's run-to-run spread is the scaled median absolute deviation of its R repeat values,
1.4826 x median(|x - median(x)|). Justification: R is small (about 5) and GPU timings are skewed by rare slow
repeats (clock ramp, a neighbour process); the MAD ignores up to half of the repeats being outliers (breakdown point
50%, versus 0% for the standard deviation and 25% for the IQR, which with 5 values also depends on the
interpolation rule), so one slow repeat does not widen the tolerance; the 1.4826 factor makes it estimate the
standard deviation under Gaussian noise, so k = 3 reads as "3 sigma". When the repeats agree exactly the MAD is 0
and the percentage threshold alone applies. Sources: pytest-benchmark's `--benchmark-compare-fail` expressions
(`src/pytest_benchmark/utils.py`, parse_compare_fail); Hampel (1974) for the MAD's breakdown point.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hotloop.profiles.durable_files import write_text_atomic
from hotloop.profiles.input_files import MAX_BASELINE_BYTES, InputFileError, file_kind, read_input_bytes
from hotloop.profiles.run_lock import LOCK_FILE, RunFolderLocked, check_not_held

TIMING_SUFFIXES = ("_us", "_ms", "_s", "_ratio")
"""A metric whose name ends with one of these is a timing (or a ratio of timings); every other metric is a count."""


REPORTED_ONLY = {
    "ddqn_overlap_us": "reported only: varies with the streams' scheduling; criterion 'DDQN overlapped' guards it",
    "ddqn_overlap_ratio": "reported only: varies with the streams' scheduling; criterion 'DDQN overlapped' guards it",
    "dur_us": "reported only: the host's step time under the profiler is multimodal; epoch throughput guards it",
    "gpu_span_us": "reported only: it holds the GPU's waits for the host, multimodal across processes where the "
    "step is host-bound; gpu_busy_us and epoch throughput guard it",
    "memcpy_dtod_events": "reported only: the driver runs a graph's D2D copy as either; d2d_copies is compared",
    "memcpy_kernels": "reported only: the driver runs a graph's D2D copy as either; d2d_copies is compared",
}
"""Metrics `compare` shows next to the baseline without a verdict, each with the rule text it prints (module
docstring says why)."""
RETIRED = {
    "learner_kernels_grid1": "retired: 'no single-block kernels' judges kernels_grid1 over every phase (issue 35); "
    "re-record the baseline",
}
"""Metrics the gate measured once and no longer does (a column renamed or dropped), each with the rule text
`compare` prints: one of these in the baseline but not in the run is shown with verdict "-" (not a FAIL, as any
other metric missing from the run is), so that a baseline recorded before the change still compares; the metric
that took its place is "not in baseline" until the baseline is re-recorded."""
THRESHOLDS = {
    "ddqn_kernel_us": "median:+20%",
    "epoch_overhead_s": "median:+25%",
    "evaluate_s": "median:+25%",
    "checkpoint_s": "median:+25%",
    "best_policy_s": "median:+25%",
    "table_s": "median:+25%",
}
"""Metrics whose default threshold is not `default_threshold`'s (module docstring, "Thresholds of their own")."""


KERNEL_US_PREFIX = "kernel_us:"
"""Prefix of the per-kernel timings: "kernel_us:<kernel name>", the kernel's GPU time per guarded step (us)."""
KERNEL_THRESHOLD = "median:+10%"
"""The per-kernel timings' rule (module docstring, "Per-kernel timings")."""
KERNEL_TIME = "kernel time"
"""What a mutant names when a per-kernel timing row (KERNEL_US_PREFIX) of the baseline comparison must FAIL."""
KERNEL_FLOOR_US = 1.0
"""The least worsening a per-kernel timing is allowed, in us: a launch-bound kernel of 2-4 us moves by a few tenths."""


def is_count(metric: str) -> bool:
    """True for structural counts (kernels, syncs, copies, memsets, launches, GEMMs, hook hits: compared exactly),
    False for timings and ratios (names ending in TIMING_SUFFIXES, e.g. gpu_span_us, learner_steps_per_s, and the
    per-kernel timings, KERNEL_US_PREFIX + name)."""
    return not (metric.endswith(TIMING_SUFFIXES) or metric.startswith(KERNEL_US_PREFIX))


MAD_TO_SIGMA = 1.4826
STATISTICS = {"median": np.nanmedian, "mean": np.nanmean, "min": np.nanmin, "max": np.nanmax}
SCHEMA = 1
COMPARE_COLUMNS = ["metric", "kind", "statistic", "baseline", "run", "delta", "allowed", "spread", "rule", "verdict"]
_THRESHOLD = re.compile(r"^(?P<stat>[a-z]+):(?P<sign>[+-]?)(?P<amount>(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)(?P<pct>%?)$")


CONFIG_FIELDS_IGNORED = ("epochs", "seed", "eval_episodes")
"""Config fields a baseline may differ in from the run: they do not change what a guarded learner step launches
(run length, random seed, evaluation after the epochs)."""


class BaselineError(ValueError):
    """A baseline file could not be read; the message names the file. Attributes: `path`, `problem`."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = str(path), problem


@dataclass(frozen=True)
class Threshold:
    """A parsed threshold: fail when `sign` x (run - baseline) of `statistic` exceeds `amount` (percent of the
    baseline's statistic if `percent`, else in the metric's own unit). sign +1: an increase is worse (times);
    sign -1: a decrease is worse (rates, ratios)."""

    statistic: str
    sign: int
    amount: float
    percent: bool

    def allowed(self, base: float) -> float:
        """The allowed worsening for baseline statistic `base`, in the metric's unit."""
        return self.amount * abs(base) / 100 if self.percent else self.amount


def parse_threshold(expr: str) -> Threshold:
    """Parse "STAT:[+|-]AMOUNT[%]", e.g. "median:+5%", "min:+20" (us for a *_us metric), "median:-5%".

    STAT is one of median, mean, min, max (applied to the R repeat values of run and baseline alike); the sign says
    which direction is worse ("+", the default as in pytest-benchmark: an increase); AMOUNT is a non-negative
    number, a percentage of the baseline with "%". Raises ValueError naming the expression and the grammar.
    """
    m = _THRESHOLD.match(expr.strip()) if isinstance(expr, str) else None
    if not m or m["stat"] not in STATISTICS:
        raise ValueError(
            f"threshold {expr!r}: expected STAT:[+|-]AMOUNT[%] with STAT one of {sorted(STATISTICS)} "
            "and AMOUNT a non-negative number, e.g. 'median:+5%' or 'min:+20'"
        )
    return Threshold(m["stat"], -1 if m["sign"] == "-" else 1, float(m["amount"]), m["pct"] == "%")


def default_threshold(metric: str) -> str:
    """THRESHOLDS' expression for the metrics it names; KERNEL_THRESHOLD for the per-kernel timings; else
    "median:-5%" for higher-is-better metrics (names ending _per_s or _ratio) and "median:+5%" for the others."""
    if metric in THRESHOLDS:
        return THRESHOLDS[metric]
    if metric.startswith(KERNEL_US_PREFIX):
        return KERNEL_THRESHOLD
    return "median:-5%" if metric.endswith(("_per_s", "_ratio")) else "median:+5%"


def mad_spread(values: Sequence[float]) -> float:
    """1.4826 x median(|x - median(x)|) of the non-NaN `values` (0.0 for one value, NaN for none)."""
    x = np.asarray(values, dtype="float64")
    x = x[~np.isnan(x)]
    if not len(x):
        return float("nan")
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


DEFAULT_PRESET = "cartpole"
"""The preset whose baseline file carries no preset suffix (the gate's default run)."""


def baseline_path(gpu_name: str, root: str | Path = "guards/baseline_files", preset: str | None = None) -> Path:
    """root/<slug>.json for the default preset (`preset` None or DEFAULT_PRESET), else root/<slug>--<preset>.json;
    slug = the GPU name lower-cased with each run of non-alphanumerics as "-" ("NVIDIA H200" -> "nvidia-h200";
    preset "seed-scale" -> nvidia-h200--seed-scale.json). Raises ValueError for a GPU name with no letter or digit,
    or a preset name that is not lower-case letters, digits and "-"."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    if not slug:
        raise ValueError(f"GPU name {gpu_name!r} has no letters or digits to name a baseline file")
    if preset is None or preset == DEFAULT_PRESET:
        return Path(root) / f"{slug}.json"
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", preset):
        raise ValueError(f"preset {preset!r} cannot name a baseline file: lower-case letters, digits and '-' only")
    return Path(root) / f"{slug}--{preset}.json"


@dataclass(frozen=True)
class Baseline:
    """A loaded baseline: `gpu` name, `metrics` {metric: [one value per repeat]} (NaN where not measured), the
    `config` it was measured with (a Config.to_dict(); None in a file written without one) and `epochs`, its
    per-epoch throughput (`EpochMetrics`; None in a file written before baselines held it)."""

    gpu: str
    metrics: dict[str, list[float]]
    config: dict | None = None
    epochs: EpochMetrics | None = None


EPOCH_PHASE_METRICS = ("evaluate_s", "checkpoint_s", "best_policy_s", "table_s")
"""The per-epoch table's columns of the phases outside the loop (hotloop.profiles.run_timeline.EPOCH_TIME_COLUMNS:
the main thread's seconds in each), judged one by one so that one phase's regression is not lost in the sum's
noise: a checkpoint written on the main thread again adds ~10-60 ms to `checkpoint_s` (main-thread share 1-3 ms
when the background writer takes it, H100 cartpole-fast, results/h200/whole_run/epochs_fast_warm.csv), less than
epoch_overhead_s's floor on a fast host."""
EPOCH_METRICS = ("learner_steps_per_s", "gpu_ms_per_step", "epoch_total_s", "epoch_overhead_s") + EPOCH_PHASE_METRICS
"""Per-epoch values compared with the baseline, one per epoch: columns of the per-epoch table (hotloop.profiles.
epoch_table) but epoch_overhead_s, which `epoch_metrics` derives (epoch_total_s - wall_s: the epoch's evaluation,
best-policy file, table writes and the main thread's share of its checkpoint, hotloop.profiles.run_timeline), and
each of those phases apart (EPOCH_PHASE_METRICS)."""
EPOCH_BEST_OF = ("learner_steps_per_s", "gpu_ms_per_step")
"""The epoch metrics of the loop itself, judged by the run's best steady epoch (`compare_epochs`)."""
EPOCH_FLOORS_S = {
    "epoch_overhead_s": 0.02,
    "evaluate_s": 0.01,
    "checkpoint_s": 0.005,
    "best_policy_s": 0.01,
    "table_s": 0.01,
}
"""The least worsening each time outside the loop is allowed, in seconds (the median over the steady epochs, so one
slow epoch does not move it). Clean H100 cartpole-fast epochs (results/h200/whole_run/epochs_fast_warm.csv):
evaluate_s 46.1-46.5 ms, checkpoint_s 1.1-2.6 ms (24 ms once, at the last epoch's wait), table_s 5-15 ms growing
with the table (57 ms once: an fsync), best_policy_s 0 or 3-5 ms; the sum moves by a few ms from run to run. A
blocking checkpoint or an evaluation back to eager steps with host syncs adds tens of ms at the cartpole preset and
seconds at seed scale (results/h200/whole_run/)."""
EPOCH_PREFIX = "epoch_"
"""`compare_epochs` names its rows EPOCH_PREFIX + metric, apart from the guarded steps' metrics."""
EPOCH_THROUGHPUT = "epoch throughput"
"""What the epoch rows guard, as the gate and the mutation suite name it (ci/mutants/mutants.toml)."""
NO_EPOCH_BASELINE = "epoch throughput: no baseline values (rewrite with --update-baseline)"
"""The rule of `compare_epochs`'s rows when the baseline holds no epoch metrics (a file written before it did)."""


class EpochMetrics(dict):
    """{metric: [one value per epoch]} of EPOCH_METRICS (a dict, as `compare` takes), with `epochs` (the epoch
    numbers the values come from, in order) and `steady` (False when they include the first epoch, which compiles
    and captures: a 1-epoch run)."""

    def __init__(self, values: Mapping[str, Sequence[float]], epochs: Sequence[int], steady: bool) -> None:
        super().__init__({m: [float(v) for v in vs] for m, vs in values.items()})
        self.epochs = [int(e) for e in epochs]
        self.steady = bool(steady)

    def __repr__(self) -> str:
        return f"EpochMetrics({dict(self)!r}, epochs={self.epochs!r}, steady={self.steady!r})"


def epoch_metrics(table: pd.DataFrame) -> EpochMetrics:
    """The steady-state EPOCH_METRICS of a per-epoch table (hotloop.profiles.epoch_table.epoch_frame, epochs.csv):
    {"learner_steps_per_s": [...], "gpu_ms_per_step": [...], "epoch_total_s": [...], "epoch_overhead_s": [...]},
    one value per epoch, in row order; epoch_overhead_s = epoch_total_s - wall_s (what the epoch spent outside its
    loop).

    Steady state: with >= 2 epochs the first row is left out (the first epoch of a process compiles the Triton
    kernels and captures the CUDA graphs: in the H200 clean runs of results/h200/gate/clean.log its learner
    throughput was 1% to 69% of the second epoch's) and `steady` is True; a 1-epoch table gives its one epoch with `steady` False.
    The table's first row is taken as the process's first epoch (true of the gate, which never resumes).
    gpu_ms_per_step is NaN where the table lacks it (a CPU run writes NaN: no CUDA events), epoch_total_s and
    epoch_overhead_s where the table has no epoch_total_s (written before runs recorded it). Raises ValueError for
    an empty table or one without `epoch` / `learner_steps_per_s`."""
    missing = [c for c in ("epoch", "learner_steps_per_s") if c not in table.columns]
    if missing:
        raise ValueError(f"epoch_metrics: the per-epoch table lacks columns {missing}")
    if not len(table):
        raise ValueError("epoch_metrics: the per-epoch table has no rows")
    steady = len(table) >= 2
    rows = table.iloc[1:] if steady else table

    def column(m: str) -> list[float]:
        if m == "epoch_overhead_s" and m not in rows.columns:
            return [t - w for t, w in zip(column("epoch_total_s"), column("wall_s"))]
        return (
            pd.to_numeric(rows[m], errors="coerce").astype("float64").tolist()
            if m in rows.columns
            else [math.nan] * len(rows)
        )

    values = {m: column(m) for m in EPOCH_METRICS}
    return EpochMetrics(values, rows["epoch"].tolist(), steady)


def compare_epochs(table: pd.DataFrame | EpochMetrics, baseline: Baseline, *, k: float = 3.0) -> pd.DataFrame:
    """Compare a run's per-epoch table (or its `epoch_metrics`) with the baseline's epoch metrics: one row per
    EPOCH_METRICS metric, named EPOCH_PREFIX + metric, in COMPARE_COLUMNS (as `compare`: append them to its table).

    All are timings: the run's statistic of its steady epochs vs the baseline's median, FAIL when worse by more than
    max(threshold, k x MAD spread[, floor]) (learner_steps_per_s: a drop; the others: a rise; thresholds:
    `default_threshold`, the floors of the times outside the loop EPOCH_FLOORS_S), PASS otherwise, "-" when the
    baseline value is NaN (e.g. measured on a CPU). The run's statistic: for the loop's metrics (EPOCH_BEST_OF) the
    best steady epoch (`best_of`: one loop slowed by a transient stall beside it, e.g. a background checkpoint write
    that took 0.12 s instead of 0.02 s in an H100 clean gate of 2026-12-05, does not fail the gate; a regression of
    the loop slows every epoch's), for the time outside the loop the median (the main thread's own work, e.g. a
    checkpoint made blocking, which adds ~0.03 s to some epochs only). Without epoch metrics in the baseline every
    row is "-" with rule NO_EPOCH_BASELINE. When either side is not steady (a 1-epoch run: its only epoch compiles and captures)
    the rows are "-" and the rule says which side and why: use >= 2 epochs on both."""
    run = table if isinstance(table, EpochMetrics) else epoch_metrics(table)
    base = baseline.epochs
    rows = []
    for metric in EPOCH_METRICS:
        name = EPOCH_PREFIX + metric
        if base is None or metric not in base:
            rows.append(_blank_row(name, NO_EPOCH_BASELINE))
            continue
        row = _compare_one(
            name,
            run.get(metric),
            base[metric],
            parse_threshold(default_threshold(metric)),
            k,
            count=False,
            run_best=metric in EPOCH_BEST_OF,
        )
        row["rule"] = f"{EPOCH_THROUGHPUT}: {row['rule']}" if row["rule"] else EPOCH_THROUGHPUT
        unsteady = [side for side, m in (("run", run), ("baseline", base)) if not m.steady]
        if unsteady:
            row.update(
                verdict="-",
                rule=f"{EPOCH_THROUGHPUT}: not compared: the {' and the '.join(unsteady)} "
                f"had one epoch only, which compiles and captures (use >= 2 epochs)",
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def _blank_row(metric: str, rule: str) -> dict:
    return dict(
        metric=metric,
        kind="timing",
        statistic="median",
        baseline=math.nan,
        run=math.nan,
        delta=math.nan,
        allowed=math.nan,
        spread=math.nan,
        rule=rule,
        verdict="-",
    )


_UNKNOWN = object()  # config_mismatch: a field neither side nor the defaults give a value for


def config_mismatch(baseline_config: Mapping, run_config: Mapping, defaults: Mapping | None = None) -> list[str]:
    """The fields in which `run_config` differs from `baseline_config` (both Config.to_dict()-like, e.g. the step
    identities of hotloop.guards.gate.step_identity), outside CONFIG_FIELDS_IGNORED, as "field: baseline B, run R"
    strings, sorted by field. Empty when they agree.

    Fields on one side only (a baseline written before a field existed, or after one was removed) are read as
    that field's value in `defaults` (Config().to_dict(): what a run without the field did); a field with no
    default to read is skipped, since nothing says what the run without it did."""
    defaults = defaults or {}
    out = []
    for f in sorted((set(baseline_config) | set(run_config)) - set(CONFIG_FIELDS_IGNORED)):
        sides = [side[f] if f in side else defaults.get(f, _UNKNOWN) for side in (baseline_config, run_config)]
        if _UNKNOWN not in sides and sides[0] != sides[1]:
            out.append(f"{f}: baseline {sides[0]!r}, run {sides[1]!r}")
    return out


def check_baseline_target(path: str | Path) -> None:
    """Refuse a destination of `write_baseline` whose writing would lose someone's data; checked by `hotloop gate
    --update-baseline` before anything is trained, and by `write_baseline` again before it writes.

    Raises ValueError "<path> cannot be written: <why>" when `path` (symlinks followed) lies in a run folder that
    another live hotloop process holds (a folder above it with hotloop.profiles.run_lock.LOCK_FILE, probed with
    run_lock.check_not_held; the holder's pid named), is not a regular file (a FIFO, a device, a folder), or is an
    existing file that is not a hotloop baseline (`load_baseline` refuses it: a config JSON, another run's
    epochs.csv, ...; the reason named). A missing file, an empty one (nothing to lose) and a baseline pass:
    rewriting a baseline is what --update-baseline is for. Whether the file can be written at all is the
    caller's check (hotloop.guards.commands.checks.check_writable)."""
    target = Path(os.path.realpath(path))
    for folder in target.parents:
        if (folder / LOCK_FILE).exists():
            try:
                check_not_held(folder)
            except RunFolderLocked as exc:
                who = f"pid {exc.pid}" if exc.pid is not None else "a process whose pid could not be read"
                raise ValueError(
                    f"{path} cannot be written: it lies in the run folder {folder}, which another "
                    f"hotloop run holds ({who}); nothing in a live run's folder is overwritten: "
                    f"choose another path"
                ) from None
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return  # a missing file, or one that cannot be looked at: the caller's writability check says why
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} cannot be written: it is {file_kind(mode)}, not a baseline file")
    try:
        load_baseline(target)
    except BaselineError as exc:
        try:
            if not read_input_bytes(target, "baseline", MAX_BASELINE_BYTES):
                return  # an empty file: nothing to lose
        except InputFileError:
            pass
        raise ValueError(
            f"{path} cannot be written: it exists and is not a hotloop baseline ({exc.problem}); "
            f"--update-baseline replaces only a baseline file: remove it first or choose another "
            f"path"
        ) from None


def write_baseline(
    path: str | Path,
    metrics: Mapping[str, Sequence[float]],
    gpu: str = "",
    config: Mapping | None = None,
    epochs: EpochMetrics | None = None,
) -> Path:
    """Write `metrics` ({metric: R repeat values}) as a baseline file (format in the module docstring), with the
    run's `config` (a JSON-ready Config.to_dict()) and its per-epoch throughput `epochs` (`epoch_metrics` of its
    per-epoch table) when given, creating parent folders and replacing any previous baseline; returns the path.
    The file is replaced atomically (hotloop.profiles.durable_files.write_text_atomic: a temp file in the same
    folder, fsync, os.replace; a symlink's target is replaced): a reader or a kill sees the old baseline or the new
    one whole. Raises ValueError for no metrics or a metric without values or with a non-numeric value (epoch
    metrics too), and for a destination `check_baseline_target` refuses (a file that is not a baseline, a live
    run's folder); OSError from the file system."""
    if not metrics:
        raise ValueError("write_baseline: no metrics")
    doc = _metric_entries(metrics, is_count)
    check_baseline_target(path)
    path = Path(path)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    head = {"schema": SCHEMA, "gpu": gpu} | ({"config": dict(config)} if config is not None else {})
    tail = {}
    if epochs is not None:
        tail["epoch_metrics"] = {
            "steady": bool(getattr(epochs, "steady", True)),
            "epochs": [int(e) for e in getattr(epochs, "epochs", [])],
            "metrics": _metric_entries(epochs, lambda m: False),
        }
    write_text_atomic(target, json.dumps(head | {"metrics": doc} | tail, indent=2) + "\n")
    return path


def _metric_entries(metrics: Mapping[str, Sequence[float]], counts) -> dict:
    """{metric: {"kind", "values", "median", "spread"}} of a baseline file; ValueError for an empty or non-numeric
    metric."""
    doc = {}
    for name, values in sorted(metrics.items()):
        try:
            x = [float(v) for v in values]
        except (TypeError, ValueError):
            raise ValueError(f"write_baseline: metric {name!r} has a non-numeric value in {values!r}") from None
        if not x:
            raise ValueError(f"write_baseline: metric {name!r} has no values")
        doc[name] = {
            "kind": "count" if counts(name) else "timing",
            "values": [_null(v) for v in x],
            "median": _null(_stat(np.nanmedian, x)),
            "spread": _null(mad_spread(x)),
        }
    return doc


def load_baseline(path: str | Path) -> Baseline:
    """Read a baseline file. Raises BaselineError (a ValueError) naming the file for: a missing or unreadable file,
    invalid JSON (line and column), text that is not UTF-8, a number too long to parse, arrays/objects nested too
    deep for the parser (a RecursionError, reported as "nested too deep"), another schema version, a "config"
    that is not an object, or a metric whose "values" is not a non-empty list of numbers or nulls; an
    "epoch_metrics" (optional) that is not {"steady": bool, "epochs": [ints], "metrics": {...}} with metrics as
    above; a path that is not a regular file (a FIFO, a device such as /dev/zero, a folder) or a file larger than
    MAX_BASELINE_BYTES (16 MiB, stated in the message): read through hotloop.profiles.input_files.read_input_bytes,
    which never blocks and never reads more than that."""
    try:
        doc = json.loads(read_input_bytes(path, "baseline", MAX_BASELINE_BYTES).decode("utf-8"))
    except InputFileError as exc:
        if exc.missing:
            raise BaselineError(
                path, "no such baseline file; write one with `hotloop gate --update-baseline`"
            ) from None
        raise BaselineError(path, exc.problem) from None
    except OSError as exc:
        raise BaselineError(path, f"cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(path, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise BaselineError(
            path,
            "nested too deep to read (JSON arrays/objects nested beyond the parser's limit; "
            "a baseline is at most four levels deep)",
        ) from None
    except ValueError as exc:  # UnicodeDecodeError, a number beyond the int digit limit
        raise BaselineError(path, f"cannot read: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("metrics"), dict):
        raise BaselineError(path, f'not a baseline: expected an object with "schema": {SCHEMA} and a "metrics" object')
    config = doc.get("config")
    if config is not None and not isinstance(config, dict):
        raise BaselineError(path, '"config" must be an object (the Config fields the baseline was measured with)')
    metrics = _read_metrics(path, doc["metrics"], "metric")
    epochs = None
    if "epoch_metrics" in doc:
        ep = doc["epoch_metrics"]
        if not (
            isinstance(ep, dict)
            and isinstance(ep.get("metrics"), dict)
            and type(ep.get("steady")) is bool
            and isinstance(ep.get("epochs", []), list)
            and all(type(e) is int for e in ep.get("epochs", []))
        ):
            raise BaselineError(
                path,
                '"epoch_metrics" must be an object {"steady": true|false, "epochs": [epoch '
                'numbers], "metrics": {metric: {"values": [...]}}}',
            )
        epochs = EpochMetrics(_read_metrics(path, ep["metrics"], "epoch metric"), ep.get("epochs", []), ep["steady"])
    return Baseline(str(doc.get("gpu", "")), metrics, config, epochs)


def _read_metrics(path: str | Path, entries: Mapping, what: str) -> dict[str, list[float]]:
    """{metric: values} of a baseline file's metrics object; BaselineError naming the metric for bad values."""
    metrics = {}
    for name, entry in entries.items():
        values = entry.get("values") if isinstance(entry, dict) else None
        if not (isinstance(values, list) and values and all(v is None or type(v) in (int, float) for v in values)):
            raise BaselineError(path, f'{what} {name!r}: "values" must be a non-empty list of numbers or nulls')
        try:
            metrics[name] = [math.nan if v is None else float(v) for v in values]
        except OverflowError:
            raise BaselineError(path, f"{what} {name!r}: a value is too large for a float") from None
    return metrics


def compare(
    run_metrics: Mapping[str, Sequence[float]],
    baseline: Baseline,
    *,
    thresholds: Mapping[str, str] | None = None,
    k: float = 3.0,
) -> pd.DataFrame:
    """Compare a run ({metric: R repeat values}) with `baseline`; one row per metric of either, sorted by name.

    Columns (COMPARE_COLUMNS): metric; kind ("count" when `is_count`, else "timing"); statistic; baseline and run
    (that statistic of each side's values; for counts the baseline's median and the run value farthest from it);
    delta (run - baseline); allowed (worsening allowed: 0 for counts, max(threshold, k x spread) for timings);
    spread (`mad_spread` of the baseline's values); rule; verdict: PASS, FAIL, or "-" (metric only in the run, not
    measured in the baseline, or a measured REPORTED_ONLY metric, whatever its value, or a RETIRED metric only in
    the baseline: its rule says so). Any other metric only in the baseline (or with no run values), or NaN in the
    run but not in the baseline, FAILs.
    `thresholds`: {metric: expression} overriding `default_threshold`; parsed before comparing (ValueError);
    REPORTED_ONLY metrics get no verdict whatever their threshold.
    """
    rules = {
        m: parse_threshold((thresholds or {}).get(m, default_threshold(m)))
        for m in set(run_metrics) | set(baseline.metrics)
    }
    rows = []
    for metric in sorted(rules):
        rows.append(_compare_one(metric, run_metrics.get(metric), baseline.metrics.get(metric), rules[metric], k))
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


def best_of(values: Sequence[float], rule: Threshold) -> float:
    """The best of a run's timing values under `rule`: the lowest where a rise is worse (sign +1: times), the highest
    where a drop is worse (sign -1: rates); NaN values left out, NaN when all are. A transient stall beside the loop
    (a slow background write) slows one epoch; a regression of the loop slows every one, so the best still shows
    it (`compare_epochs`, EPOCH_BEST_OF)."""
    return _stat(np.nanmin if rule.sign > 0 else np.nanmax, values)


def _compare_one(
    metric: str,
    run: Sequence[float] | None,
    base: Sequence[float] | None,
    rule: Threshold,
    k: float,
    count: bool | None = None,
    run_best: bool = False,
) -> dict:
    count = is_count(metric) if count is None else count
    row = dict(
        metric=metric,
        kind="count" if count else "timing",
        statistic="median" if count else rule.statistic,
        baseline=math.nan,
        run=math.nan,
        delta=math.nan,
        allowed=0.0 if count else math.nan,
        spread=mad_spread(base) if base else math.nan,
        rule="",
        verdict="-",
    )
    if base is None or not run:
        if base is not None and run is None and metric in RETIRED:
            return {**row, "baseline": _stat(np.nanmedian, base), "rule": RETIRED[metric]}
        return {
            **row,
            "rule": "not in baseline" if base is None else "missing from run",
            "verdict": "-" if base is None else "FAIL",
        }
    stat = STATISTICS[row["statistic"]]
    b = _stat(stat, base)
    if count and metric in REPORTED_ONLY:
        r = _stat(stat, run)
        return {**row, "baseline": b, "run": r, "delta": r - b, "verdict": "-", "rule": REPORTED_ONLY[metric]}
    if count:
        worst = max(run, key=lambda v: abs(v - b) if not math.isnan(v) else math.inf)
        return {
            **row,
            "baseline": b,
            "run": worst,
            "delta": worst - b,
            "rule": "exact",
            "verdict": "-" if math.isnan(b) else ("PASS" if worst == b else "FAIL"),
        }
    best = run_best and metric not in REPORTED_ONLY
    r = best_of(run, rule) if best else _stat(stat, run)
    if metric in REPORTED_ONLY:  # no verdict on the value; a run that cannot measure it still FAILs
        missing = math.isnan(r) and not math.isnan(b)
        return {
            **row,
            "baseline": b,
            "run": r,
            "delta": r - b,
            "verdict": "FAIL" if missing else "-",
            "rule": REPORTED_ONLY[metric] + ("; not measured in the run" if missing else ""),
        }
    epoch_floor = EPOCH_FLOORS_S.get(metric.removeprefix(EPOCH_PREFIX), 0.0) if metric.startswith(EPOCH_PREFIX) else 0.0
    floor, unit = (
        (KERNEL_FLOOR_US, "us")
        if metric.startswith(KERNEL_US_PREFIX)
        else (epoch_floor, "s")
        if epoch_floor
        else (0.0, "")
    )
    allowed = max(rule.allowed(b), k * row["spread"], floor) if not math.isnan(b) else math.nan
    sign = "-" if rule.sign < 0 else "+"
    text = (
        f"{rule.statistic}:{sign}{rule.amount:g}{'%' if rule.percent else ''} or {k:g} x MAD spread"
        + (f" or {floor:g} {unit}" if floor else "")
        + (f"; run: best of {len(run)}" if best else "")
    )
    verdict = "-" if math.isnan(b) else ("FAIL" if math.isnan(r) or rule.sign * (r - b) > allowed else "PASS")
    return {**row, "baseline": b, "run": r, "delta": r - b, "allowed": allowed, "rule": text, "verdict": verdict}


def _stat(stat, values: Sequence[float]) -> float:
    x = np.asarray(values, dtype="float64")
    return float(stat(x)) if (~np.isnan(x)).any() else math.nan


def _null(v: float) -> float | None:
    return None if math.isnan(v) else v
