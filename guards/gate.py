"""`hotloop gate`: run a preset under the per-epoch timer and hang watchdog, then guard K consecutive iterations of
the training loop itself (`Trainer.iterate`, the loop body `run_epoch` runs) and judge every criterion of
docs/criteria.md.

The guarded window (`guard_loop`): W unprofiled warm-up iterations, then `Trainer.iterate(K)` inside
hotloop.guards.guard.guard_window, whose step ranges are the loop's own "step" ranges (one per iteration: env steps
through the actor graph or eagerly, replay insert, learner step, the periodic readback publication or target update,
the progress callback). K defaults to max(20, the longest period of the loop's periodic phases:
hotloop.trainer.loop.loop_periods), so every periodic phase runs in the window; the coverage table says which phases
ran in how many steps. Kernels get their phase from the ranges around their launch, and the hotloop learner's graph
kernels by name (hotloop.trainer.step.PHASE_RULES, applied inside the learner's phases only:
hotloop.trainer.loop.learner_phases); the learner-side criteria (D2D copies, memsets) judge the learner's phases,
the sync and single-block criteria every phase and the loop code between steps, and the env's kernels per env step
(cfg.env_steps_per_update of them per iteration) the env_step phase. Beyond the window, the loop of every epoch
after the first runs under a hotloop.guards.loop_syncs.LoopSyncCensus (the sync hooks and torch's sync debug
warnings; --no-loop-census turns it off), so that a sync every N iterations that the K iterations never hold still
FAILs "no sync in the epochs' loop"; and under a hotloop.guards.loop_structure.LoopStructureCensus (the ATen ops,
Triton launches and phase ranges of the same span; --no-structure-census turns it off), so that a D2D copy, a memset
or a grid (1,1,1) launch every N iterations that the window never holds FAILs the window's own row ("no D2D weight
sync", "memsets only where needed", "no single-block kernels"), naming its period and call site
(`judge_loop_structure`; the streams in structure_census.csv).

Exit codes: 0 every measured criterion passed, 1 a criterion or a baseline regression failed, 2 bad usage or input
(raised by the CLI, before training), 3 hang (the watchdog ends the process), 70 internal error (an unexpected
exception: the CLI saves its traceback as <run folder>/error.log;
hotloop.guards.commands.errors.report_internal_error; or the watchdog's own thread failed: it ends the process rather
than let the run go on unguarded). On a run without CUDA
the sync rows are "not applicable (no CUDA)" (hotloop.guards.guard.NOT_APPLICABLE) and the trace rows "not measured
(no CUDA)": verdict "-", neither PASS nor FAIL; the closing "PASS (...)" line counts them apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd
import torch

from hotloop.guards.baselines import (
    KERNEL_US_PREFIX,
    Baseline,
    baseline_path,
    compare,
    compare_epochs,
    config_mismatch,
    epoch_metrics,
    load_baseline,
    write_baseline,
)
from hotloop.guards.criteria import LOOP_CENSUS, PRECISION, WATCHDOG, judged_by, label
from hotloop.guards.faults import check_request
from hotloop.guards.faults import inject as inject_fault
from hotloop.guards.guard import MIN_WINDOW_STEPS, GuardReport, default_window_steps, guard_window
from hotloop.guards.loop_structure import CensusGroup, LoopStructureCensus, census_criteria
from hotloop.guards.loop_syncs import LoopSyncCensus
from hotloop.guards.run import run_training
from hotloop.guards.step_metrics import PhaseRoles
from hotloop.profiles.docs import doc_ref
from hotloop.profiles.epoch_table import format_table, write_table
from hotloop.profiles.provenance import device_name
from hotloop.trainer import loop as loop_module
from hotloop.trainer.config import ENV_SHAPE_FIELDS, Config, env_shape_fields
from hotloop.trainer.device_choice import learner_kind, resolve_device
from hotloop.trainer.distributed import launched_by_torchrun, rank_info
from hotloop.trainer.loop import STEP_RANGE, Trainer, learner_phases, loop_periods
from hotloop.trainer.step import PHASE_RULES

TRACE_FILE = "trace.json.gz"
"""The first repeat's Kineto trace in the gate's run folder (gzipped Chrome trace JSON)."""


BASELINES_DIR = Path(str(resources.files("hotloop.guards") / "baseline_files"))
"""The installed baselines (package data of hotloop.guards, read with importlib.resources; in a checkout,
guards/baseline_files/), wherever the command is started from."""


def default_baseline(
    folder: str | Path | None = None, gpu_name: str | None = None, preset: str | None = None
) -> Path | None:
    """The baseline file of `preset` (None: the default, cartpole) for `gpu_name` (default: the name of this
    machine's CUDA device 0) in `folder` (BASELINES_DIR when None): hotloop.guards.baselines.baseline_path,
    <gpu-name-slug>.json or <gpu-name-slug>--<preset>.json. None when no name is given and there is no CUDA. The
    file need not exist. Raises ValueError for a GPU name with no letter or digit or an unusable preset name."""
    if gpu_name is None:
        if not torch.cuda.is_available():
            return None
        gpu_name = torch.cuda.get_device_name(0)
    return baseline_path(gpu_name, BASELINES_DIR if folder is None else folder, preset)


ONE_REPEAT_NOTE = (
    "a baseline of one repeat has no spread, so each timing is then held to +5% of one run; GPU "
    "timings vary by about that between runs: record with --repeats 5"
)
"""Printed under "baseline written" when the baseline holds one repeat (guards/baselines.py: the timing rule is
median +5% or 3 x the repeats' MAD spread)."""


GUARD_WINDOW = "loop"
"""What a baseline's per-step medians were measured over, recorded in its config as "guard_window": "loop" = K
iterations of the training loop (Trainer.iterate, `guard_loop`)."""
LEGACY_WINDOW = "learner_step"
"""The window of a baseline written before it recorded one: 20 calls of Trainer.learner_step, which held neither
the env step nor the periodic work, so its counts are not comparable: such a baseline mismatches (re-record it)."""


def run_config(cfg: Config) -> dict:
    """The configuration a baseline records for a run of `cfg` on this machine: cfg.to_dict() with device and
    learner resolved ("auto" -> what the run used: hotloop.trainer.device_choice.resolve_device, learner_kind), and the
    guarded window's kind ("guard_window": GUARD_WINDOW)."""
    device = resolve_device(cfg.device)
    return {**cfg.to_dict(), "device": str(device), "learner": learner_kind(cfg, device), "guard_window": GUARD_WINDOW}


def step_identity(config: Mapping, gpu: str) -> dict:
    """What shapes a guarded step, from a configuration dict (a baseline's "config", or `run_config`) and the GPU
    name ("cpu" for a CPU run; "" = unknown, left out): the config with device reduced to its type (cpu / cuda;
    "auto" resolved on this machine), learner "auto" resolved for that type (hotloop on cuda, reference elsewhere),
    the ENV_SHAPE_FIELDS the env does not read dropped (hotloop.trainer.config.env_shape_fields), plus "gpu"."""
    ident = dict(config)
    if "device" in ident:
        ident["device"] = (
            resolve_device("auto").type if ident["device"] == "auto" else torch.device(ident["device"]).type
        )
    if ident.get("learner") == "auto" and "device" in ident:
        ident["learner"] = "hotloop" if ident["device"] == "cuda" else "reference"
    for f in set(ENV_SHAPE_FIELDS) - set(env_shape_fields(ident.get("env"))):
        ident.pop(f, None)
    return ident | ({"gpu": gpu} if gpu else {})


def baseline_mismatch(baseline: Baseline, cfg: Config) -> list[str] | None:
    """How a run of `cfg` on this machine differs from what `baseline` was measured with
    (hotloop.guards.baselines.config_mismatch of the two `step_identity`s, the GPU included); None when the baseline
    records no configuration (a file written before baselines did), [] when they agree. A baseline that records
    no "guard_window" was measured over LEGACY_WINDOW and differs in it from every run now."""
    if baseline.config is None:
        return None
    run = run_config(cfg)
    return config_mismatch(
        step_identity(baseline.config, baseline.gpu),
        step_identity(run, device_name(torch.device(run["device"]))),
        {**Config().to_dict(), "guard_window": LEGACY_WINDOW},
    )


def window_size(cfg: Config, kind: str, steps: int | None = None) -> tuple[int, dict[str, int], str]:
    """(K, periods, why): the guarded window's loop iterations for a run of `cfg` with learner `kind` ("hotloop" /
    "reference"), the loop's phase periods (hotloop.trainer.loop.loop_periods) and a line saying how K was chosen:
    `steps` when given (--guard-steps; phases of a longer period may then be missing from the window), else
    max(MIN_WINDOW_STEPS, the longest period) (hotloop.guards.guard.default_window_steps). Raises ValueError for
    steps < 1 or an unknown learner kind."""
    periods = loop_periods(cfg, kind)
    longest = max(periods, key=periods.get)
    if steps is None:
        k = default_window_steps(periods)
        return (
            k,
            periods,
            (
                f"K = max({MIN_WINDOW_STEPS}, longest period {periods[longest]} ({longest})) = {k}: "
                f"every periodic phase runs in the window"
            ),
        )
    if steps < 1:
        raise ValueError(f"the window needs steps >= 1, got {steps}")
    late = [f"{p} (every {n})" for p, n in periods.items() if n > steps]
    return (
        steps,
        periods,
        (
            f"K = --guard-steps {steps}"
            + (f"; longer periods: {', '.join(late)} may be missing from the window" if late else "")
        ),
    )


def guard_loop(
    trainer: Trainer, steps: int | None = None, warmup: int = 3, trace_path: str | Path | None = None
) -> GuardReport:
    """Guard `steps` (default: `window_size`) consecutive iterations of `trainer`'s training loop: `warmup`
    unprofiled `trainer.iterate` iterations, then `trainer.iterate(K)` inside hotloop.guards.guard.guard_window, its
    step ranges the loop's own (STEP_RANGE), its periods the loop's (loop_periods), the learner's phases
    (learner_phases) as PhaseRoles.learner and cfg.env_steps_per_update (the vectorized env steps of one
    iteration's env_step range) as PhaseRoles.env_steps_per_update; with the hotloop learner, PHASE_RULES name the
    graph kernels launched inside the learner's phases. The trainer's counters advance by warmup + K iterations.
    `trace_path`: where to keep the Kineto trace. Returns the GuardReport; RuntimeError if the trace does not hold K
    step ranges."""
    kind = trainer.learner_kind
    k, periods, _ = window_size(trainer.cfg, kind, steps)
    hot = kind == "hotloop"
    trainer.iterate(warmup)
    with guard_window(
        k,
        0,
        step_range=STEP_RANGE,
        phases=PHASE_RULES if hot else None,
        rule_phases=learner_phases(kind) if hot else None,
        roles=PhaseRoles(learner=learner_phases(kind), env_steps_per_update=trainer.cfg.env_steps_per_update),
        periods=periods,
        trace_path=trace_path,
        cuda=trainer.device.type == "cuda",
    ) as window:
        trainer.iterate(k)
    report = window.report
    report.window["warmup"] = warmup  # loop iterations run unprofiled just before the window
    return report


@dataclass(frozen=True)
class GateOptions:
    """How `run_gate` runs (`hotloop gate` builds it from its options: hotloop.guards.commands.gate).

    epoch_limit_s (float): each epoch must finish within it, else the hang watchdog stops the process (exit 3;
    hotloop.guards.run.run_training). show_progress (bool): the progress bar.
    The guarded window (`guard_loop`: `guard_steps` loop iterations, None: `window_size`'s default, after
    `guard_warmup`) is repeated `repeats` times; a criterion fails if it fails in any repeat. With a `baseline` file
    (hotloop.guards.baselines), the repeats' per-step medians are compared
    with it (baseline.csv/.md, verdict per metric) and any FAIL fails the gate; with `update_baseline` the repeats
    are written as the new baseline instead (deliberately, never implicitly).
    `loop_census` (default on): also run the epochs under a hotloop.guards.loop_syncs.LoopSyncCensus and judge "no
    sync in the epochs' loop" by it (off: that row is not measured, LOOP_CENSUS_OFF).
    `structure_census` (default on): also run the same span under a
    hotloop.guards.loop_structure.LoopStructureCensus and let structural work the window never held FAIL the
    window's D2D, memset and single-block rows (`judge_loop_structure`; off: their `census` column says
    STRUCTURE_CENSUS_OFF); its streams go to structure_census.csv/.md, its cost to guard.json ("structure_census")
    and the output. `census_overhead_pairs` > 0: before the guarded windows, time Trainer.iterate(K) without and
    with the censuses that many times each (`census_overhead`; it moves the window later by 3 x (1 + pairs) x K
    iterations) and print the overhead per iteration.
    `inject`: a hotloop.guards.faults fault name, injected after the epochs and before the guarded steps (mutation
    test of the gate: it must then FAIL that fault's criterion); never together with update_baseline (a one-rank
    fault, hotloop.guards.fault_list.Fault.one_rank, needs the ranks of `hotloop gate --nproc N`).
    `hang_record`: where the hang watchdog writes its JSON record if it stops the process (a rank of `hotloop gate
    --nproc N`: its folder's hotloop.guards.data_parallel.HANG_RECORD; None: none)."""

    epoch_limit_s: float
    show_progress: bool = True
    guard_steps: int | None = None
    guard_warmup: int = 3
    repeats: int = 1
    baseline: Path | None = None
    update_baseline: bool = False
    inject: str | None = None
    loop_census: bool = True
    structure_census: bool = True
    census_overhead_pairs: int = 0
    hang_record: Path | None = None


def run_gate(cfg: Config, run_dir: Path, options: GateOptions) -> int:
    """Run the gate; prints the per-epoch table, the window size, the phase coverage table and the criteria
    verdicts, the gate's wall time and the share spent profiling; writes under `run_dir` epochs.csv/.md,
    criteria.csv/.md/.json (the verdicts), coverage.csv/.md (the first repeat's phase coverage), guard.json (the
    first repeat's per-step counts, hook hits, GEMMs, window, coverage, outside-steps counts, and "gate": wall_s,
    profiling_s, window_s, analysis_s, repeats) and trace.json.gz (the first repeat's Kineto trace: `hotloop
    inspect --step-range step` reads it, Perfetto shows it).

    How: `options` (GateOptions: the watchdog's limit, the window, its repeats, the baseline, the censuses, an
    injected fault).
    Returns the exit code (0 pass, 1 a criterion or a baseline comparison failed). Raises ValueError, before
    training, for an unknown fault, inject together with update_baseline, inject on a device that is not CUDA or
    a learner fault with the reference learner (hotloop.guards.faults.check_request; `hotloop gate` checks the
    same before it makes the run folder and turns it into exit 2)."""
    started = time.perf_counter()
    device = resolve_device(cfg.device)
    kind = learner_kind(cfg, device)
    check_request(
        options.inject,
        options.update_baseline,
        device=device,
        learner=kind,
        spectral_norm=cfg.spectral_norm,
        world_size=rank_info().world_size,
        grouped_forward=cfg.grouped_forward,
    )
    k, _, why_k = window_size(cfg, kind, options.guard_steps)

    overhead: dict = {}

    def guard(trainer: Trainer) -> list[GuardReport]:
        if options.census_overhead_pairs > 0:
            overhead.update(census_overhead(trainer, k, options.census_overhead_pairs))
        if options.inject is not None:
            fault = inject_fault(trainer, options.inject)
            print(f"\ninjected fault {fault.name!r}: {fault.what}; expect FAIL of {label(fault.criterion)}")
        reports = [
            guard_loop(trainer, k, options.guard_warmup, trace_path=run_dir / TRACE_FILE if r == 0 else None)
            for r in range(options.repeats)
        ]
        return reports, precision_evidence(trainer)  # after the guarded windows, never inside them

    census = LoopSyncCensus(cuda=device.type == "cuda", loop=loop_module) if options.loop_census else None
    structure = (
        LoopStructureCensus(cuda=device.type == "cuda", step_range=STEP_RANGE) if options.structure_census else None
    )
    group = CensusGroup([census, structure]) if census is not None or structure is not None else None
    watched: dict[str, bool] = {}
    epochs, (reports, precision) = run_training(
        cfg,
        run_dir,
        options.epoch_limit_s,
        options.show_progress,
        after_epochs=guard,
        loop_census=group,
        watched=watched,
        hang_record=options.hang_record,
    )
    report = reports[0]
    verdicts = report.verdicts.copy()
    for other in reports[1:]:
        worse = other.verdicts.verdict.eq("FAIL").to_numpy() & ~verdicts.verdict.eq("FAIL").to_numpy()
        verdicts.loc[worse] = other.verdicts.loc[worse].to_numpy()
    judge_precision(verdicts, *precision)
    judge_loop_syncs(verdicts, census)
    streams = judge_loop_structure(verdicts, structure, k, learner_phases(kind))
    judge_hang(verdicts, watched)
    if streams is not None:
        write_table(streams, run_dir, STRUCTURE_FILE)
    write_table(verdicts, run_dir, "criteria")
    (run_dir / "criteria.json").write_text(json.dumps(verdicts.to_dict(orient="records"), indent=2) + "\n")
    write_table(report.coverage, run_dir, "coverage")
    regressions = _baseline_step(reports, options.baseline, options.update_baseline, run_dir, run_config(cfg), epochs)
    window_s = sum(r.window.get("window_s", 0.0) for r in reports)
    analysis_s = sum(r.window.get("analysis_s", 0.0) for r in reports)
    wall_s = time.perf_counter() - started
    timing = {
        "wall_s": round(wall_s, 3),
        "profiling_s": round(window_s + analysis_s, 3),
        "window_s": round(window_s, 3),
        "analysis_s": round(analysis_s, 3),
        "repeats": options.repeats,
        "window_steps": k,
    }
    structure_cost = structure.cost() if structure is not None and structure.epochs else {}
    report.to_json(
        run_dir / "guard.json",
        extra={"gate": timing, "structure_census": {**structure_cost, "census_overhead": overhead}},
    )
    missing = report.window.get("missing", [])
    print("\nPer-epoch table\n" + format_table(epochs))
    print(
        f"\nGuarded window: {k} loop iterations (Trainer.iterate, one 'step' range each) after "
        f"{options.guard_warmup} warm-up, {options.repeats} repeat{'s' * (options.repeats != 1)}; {why_k}"
    )
    print(
        "Phase coverage (phase: its period in iterations, the window steps it ran in, its kernels and syncs)\n"
        + format_table(report.coverage)
        + (
            f"\nnot in the window: {', '.join(missing)}: the criteria that apply to "
            f"{'them' if len(missing) > 1 else 'it'} are not measured"
            if missing
            else ""
        )
    )
    print(
        f"\nCriteria (hotloop criteria; {doc_ref('criteria.md')}), {k} guarded steps after the epochs\n"
        + format_table(verdicts[["criterion", "id", "measured", "limit", "verdict", "status", "source", "worst_step"]])
    )
    print(structure_text(verdicts, structure, structure_cost, k) + (f"\n{overhead_text(overhead)}" if overhead else ""))
    failed = verdicts[verdicts.verdict == "FAIL"]
    print(
        f"\nrun folder: {run_dir} (its Kineto trace per step: hotloop inspect --step-range {STEP_RANGE} "
        f"{run_dir / TRACE_FILE})"
    )
    share = (window_s + analysis_s) / wall_s if wall_s > 0 else float("nan")
    parts = {key: sum(r.window.get(f"{key}_s", 0.0) for r in reports) for key in ("stop", "export", "read", "judge")}
    print(
        f"gate wall time {wall_s:.1f} s, of which profiling {window_s + analysis_s:.1f} s ({share:.1%}): the "
        f"guarded window {window_s:.1f} s + trace analysis {analysis_s:.1f} s (profiler stop {parts['stop']:.1f}, "
        f"export {parts['export']:.1f}, "
        f"read {parts['read']:.1f}, judge {parts['judge']:.1f}; {report.window.get('events', 0)} events)"
    )
    if len(failed) or len(regressions):
        for _, row in failed.iterrows():
            print(f"FAIL {row.criterion} [{row.id}]: measured {row.measured} (limit {row.limit}); {row.evidence}")
        for _, row in regressions.iterrows():
            print(f"FAIL regression {row.metric}: run {row.run:g} vs baseline {row.baseline:g} ({row.rule})")
        return 1
    counts = verdicts.status.value_counts()
    measured, reported = int(counts.get("measured", 0)), int(counts.get("reported", 0))
    na = int(verdicts.status.str.startswith("not applicable").sum())  # CPU: the sync rows (hotloop.guards.guard)
    # a rank of `hotloop gate --nproc N`: its own window only; the launcher's verdict over the ranks comes last
    ranked = launched_by_torchrun()
    print(
        (f"rank {rank_info().rank}: its own window " if ranked else "")
        + f"PASS ({measured} measured, {reported} reported, {len(verdicts) - measured - reported - na} not measured"
        + (f", {na} not applicable (no CUDA)" if na else "")
        + ")"
        + ("; the verdict over the ranks follows" if ranked else "")
    )
    return 0


def _baseline_step(
    reports: list[GuardReport], baseline: Path | None, update: bool, run_dir: Path, config: dict, epochs: pd.DataFrame
) -> pd.DataFrame:
    """Write (with `config`, a `run_config`, and the steady-state epoch throughput of the per-epoch table `epochs`:
    hotloop.guards.baselines.epoch_metrics) or compare the baseline; returns the failing comparison rows (empty when
    none or no baseline). The comparison covers the guarded window's per-step medians and the epochs' learner
    steps/s and GPU ms per step (`compare_epochs`, the same noise-aware rule): a throughput drop fails the gate even
    when no count moves.

    The repeats' medians leave out the timing of damaged steps (steps holding a trace anomaly:
    hotloop.guards.step_metrics), so those steps are out of the comparison; the written table (baseline.csv/.md) has
    a `note` column saying so on the timing rows ("repeat 1: timing of steps 3, 7 left out: kernel with ts 0 ..."),
    and the note is printed under the table. When every guarded step of every repeat is damaged there is no timing
    to compare: those rows get verdict "-" and a rule saying why, instead of a FAIL for a missing value."""
    if baseline is None:
        return pd.DataFrame()
    names = sorted({m for r in reports for m in r.medians})  # a repeat whose steps were all damaged has no kernel_us
    metrics = {m: [r.medians.get(m, float("nan")) for r in reports] for m in names}
    note = "; ".join(f"repeat {i + 1}: {r.timing_note}" for i, r in enumerate(reports) if r.timing_note)
    if update:
        write_baseline(
            baseline,
            metrics,
            gpu=device_name(torch.device(config["device"])),
            config=config,
            epochs=epoch_metrics(epochs),
        )
        print(
            f"\nbaseline written: {baseline} ({len(reports)} repeats, {len(metrics)} metrics)"
            + (f"\nnote: {note}" if note else "")
            + (f"\nnote: {ONE_REPEAT_NOTE}" if len(reports) == 1 else "")
        )
        return pd.DataFrame()
    loaded = load_baseline(baseline)
    table = compare(metrics, loaded)
    timing = table["kind"].eq("timing")
    table["note"] = ""
    table.loc[timing, "note"] = note
    if all(_every_step_damaged(r) for r in reports):
        lost = timing & table["run"].isna() & table["verdict"].eq("FAIL")
        table.loc[lost, ["verdict", "rule"]] = [
            "-",
            "not compared: the timing of every guarded step was left out (trace anomalies, see note)",
        ]
    table = pd.concat([table, compare_epochs(epochs, loaded).assign(note="")], ignore_index=True)
    write_table(table, run_dir, "baseline")
    kernel = table["metric"].str.startswith(KERNEL_US_PREFIX)
    failing = table["verdict"].eq("FAIL")
    compared = int((kernel & table["verdict"].isin(["PASS", "FAIL"])).sum())
    per_kernel = (
        f"{compared} compared, {int((kernel & failing).sum())} FAIL (shown above; every row in baseline.csv)"
        if compared
        else "none compared: the baseline holds none (re-record it with --update-baseline)"
    )
    print(
        f"\nBaseline comparison ({baseline})\n"
        + format_table(table[~kernel | failing].drop(columns="note"))
        + f"\nper-kernel timings ({KERNEL_US_PREFIX}*): {per_kernel}"
        + (f"\nnote: {note}" if note else "")
    )
    return table[table.verdict == "FAIL"]


def _every_step_damaged(report: GuardReport) -> bool:
    """Whether every guarded step of `report` holds a trace anomaly (its per_step "anomaly" column is never "")."""
    anomaly = report.per_step.get("anomaly")
    return anomaly is not None and len(anomaly) > 0 and bool(anomaly.ne("").all())


HANG_PERIOD = "epoch 1"
"""The watchdog period (hotloop.guards.run.run_training arms each epoch as "epoch N") the WATCHDOG row judges."""


def _rows(verdicts: pd.DataFrame, judge: str) -> pd.Series:
    """Which rows of `verdicts` (column id) are of criteria judged by `judge` (hotloop.guards.criteria.JUDGES)."""
    return verdicts["id"].isin([c.id for c in judged_by(judge)])


def judge_hang(verdicts: pd.DataFrame, watched: Mapping[str, bool]) -> None:
    """Fill the WATCHDOG row of `verdicts` ("epoch 1 without hang"; in place) from the watchdog's record `watched`
    (HangWatchdog.watched, as run_training fills it): PASS ("yes", source "watchdog") only when epoch 1 finished
    with the watchdog's thread alive from its start to its end; FAIL ("no") when the thread was not alive all
    through it (a run that goes on unguarded: the watchdog exits 70 first, so this is a last line of defence);
    verdict "-" and "not measured (...)" when epoch 1 did not run under the watchdog (e.g. a resumed run)."""
    row = _rows(verdicts, WATCHDOG)
    alive = watched.get(HANG_PERIOD)
    cells = ["measured", "verdict", "status", "source", "evidence"]
    if alive is None:
        verdicts.loc[row, cells] = ["", "-", f"not measured ({HANG_PERIOD} did not run under the watchdog)", "", ""]
    elif alive:
        verdicts.loc[row, cells] = [
            "yes",
            "PASS",
            "measured",
            "watchdog",
            f"{HANG_PERIOD} finished under the hang watchdog, alive from its start to its end",
        ]
    else:
        verdicts.loc[row, cells] = [
            "no",
            "FAIL",
            "measured",
            "watchdog",
            f"the hang watchdog was not alive for the whole of {HANG_PERIOD}: a hang there would not have been stopped",
        ]


LOOP_CENSUS_OFF = "not measured (off: hotloop gate --no-loop-census)"


def judge_loop_syncs(verdicts: pd.DataFrame, census: LoopSyncCensus | None) -> None:
    """Fill the LOOP_CENSUS row of `verdicts` ("no sync in the epochs' loop"; in place) from the run's `census`:
    measured = the loop's host syncs over the epochs after the first, PASS at 0, the call sites as evidence, source
    "census"; verdict "-" and status "not applicable (no CUDA)" without CUDA, "not measured (...)" where the census
    watched no epoch (one epoch) or there was none (LOOP_CENSUS_OFF)."""
    row = _rows(verdicts, LOOP_CENSUS)
    measured, text = census.verdict() if census is not None else (None, LOOP_CENSUS_OFF)
    if measured is None:
        verdicts.loc[row, ["verdict", "status"]] = ["-", text]
        return
    verdicts["measured"] = verdicts["measured"].astype(object)  # counts beside "yes"/"no" (a str column refuses)
    verdicts.loc[row, ["measured", "verdict", "status", "source", "evidence"]] = [
        measured,
        "PASS" if measured == 0 else "FAIL",
        "measured",
        "census",
        text,
    ]


STRUCTURE_FILE = "structure_census"
"""The structure census's streams in the gate's run folder: structure_census.csv/.md (hotloop.guards.loop_structure.
STREAM_COLUMNS)."""
STRUCTURE_CENSUS_OFF = "off (hotloop gate --no-structure-census)"
CENSUS_COLUMN = "census"
"""The criteria table's column holding the structure census's word on the rows it judges ("" on the others)."""


def judge_loop_structure(
    verdicts: pd.DataFrame, census: LoopStructureCensus | None, window_steps: int, learner: tuple[str, ...] | None
) -> pd.DataFrame | None:
    """Let the structure census judge the window's D2D, memset and single-block rows of `verdicts` (in place; the
    rows whose columns hotloop.guards.loop_structure.KIND_COLUMNS names) and return its streams
    (LoopStructureCensus.new_work; None when there is no census or it watched no epoch).

    Adds the column CENSUS_COLUMN ("" on other rows): "PASS: none new in the loop of epochs 2-3 (N iterations)",
    "FAIL: <streams>", "not applicable (no CUDA)", "not measured (...)" or STRUCTURE_CENSUS_OFF. When the census
    finds streams the window never held (`added`: the most one iteration holds), the row is judged on the window's
    worst step plus `added` (the window's value is 0 when it measured none): over the limit, the row FAILs
    (measured that sum, status "measured", source + "census", the census's streams first in the evidence, with
    their period, call site, op and phase), whatever the window said; within it (a memset row with room under its
    limit), the row keeps the window's verdict and the column says so. A clean census leaves the row as the
    window judged it (not measured stays not measured)."""
    verdicts[CENSUS_COLUMN] = ""
    rows = census_criteria()
    if census is None:
        for c in rows.values():
            verdicts.loc[verdicts["id"].eq(c.id), CENSUS_COLUMN] = STRUCTURE_CENSUS_OFF
        return None
    verdicts["measured"] = verdicts["measured"].astype(object)
    for id_, (added, text) in census.judge(window_steps, learner).items():
        row = verdicts["id"].eq(id_)
        if added is None or added == 0:
            verdicts.loc[row, CENSUS_COLUMN] = text if added is None else f"PASS: {text}"
            continue
        c = next(c for c in rows.values() if c.id == id_)
        window = verdicts.loc[row, "measured"].iloc[0]
        base = window if isinstance(window, (int, float)) and not pd.isna(window) else 0
        total = base + added
        if c.check(total):
            verdicts.loc[row, CENSUS_COLUMN] = f"within the limit ({base} in the window's worst step + {added}): {text}"
            continue
        old_source, old_evidence = verdicts.loc[row, "source"].iloc[0], verdicts.loc[row, "evidence"].iloc[0]
        verdicts.loc[row, ["measured", "verdict", "status", "source", "evidence", CENSUS_COLUMN]] = [
            total,
            "FAIL",
            "measured",
            "+".join(s for s in (old_source, "census") if s),
            f"census of {census.span_text()}, not in the {window_steps}-iteration window: {text}"
            + (f"; window: {old_evidence}" if old_evidence else ""),
            f"FAIL: {text}",
        ]
    return census.new_work(window_steps, learner) if census.epochs else None


def structure_text(verdicts: pd.DataFrame, census: LoopStructureCensus | None, cost: Mapping, window_steps: int) -> str:
    """The gate's lines on the structure census: its span, one line per row it judges, and its cost."""
    if census is None:
        return f"\nStructure census: {STRUCTURE_CENSUS_OFF}"
    span = f"the loop of {census.span_text()}" if census.epochs else "the loop of the epochs after the first"
    head = (
        f"\nStructure census (D2D copies, memsets / fills, grid (1,1,1) launches per iteration in {span}, beyond "
        f"the {window_steps}-iteration window; {doc_ref('criteria.md')})"
    )
    lines = [
        f"  {c.title}: {verdicts.loc[verdicts['id'].eq(c.id), CENSUS_COLUMN].iloc[0]}"
        for c in census_criteria().values()
    ]
    if cost:
        lines.append(
            f"  cost: {cost['ops']} ATen ops, {cost['launches']} Triton launches, {cost['ranges']} phase "
            f"ranges seen over {cost['span_s']:.2f} s of loop; estimated {cost['estimated_s'] * 1e3:.1f} ms "
            f"({cost['estimated_ratio']:.2%}) at {cost['range_ns']:.0f} ns per range, {cost['op_ns']:.0f} ns "
            f"per op on this host (measured on the device: hotloop gate --census-overhead)"
        )
    return "\n".join([head, *lines])


def census_overhead(trainer: Trainer, steps: int, pairs: int = 5) -> dict:
    """Time `trainer.iterate(steps)` with no census, with the structure census alone and with both censuses
    (hotloop.guards.loop_syncs.LoopSyncCensus + LoopStructureCensus, as the gate runs its epochs), `pairs` times
    each, the order of the modes reversed every other time, after one unmeasured iterate(steps) per mode (one-time
    costs); each timing from a device synchronize before to one after (CUDA), so it holds the GPU's work. The
    censuses count the trainer's device's tensors (on the CPU too: there a measure of the hooks' host cost, the
    reference learner's every op passing through them).
    Returns {"steps", "pairs", "us_per_iteration": {mode: median}, "overhead_ratio": {mode: median / none's - 1}}.
    Advances the trainer by 3 x (1 + pairs) x steps iterations. Raises ValueError for steps or pairs < 1."""
    if steps < 1 or pairs < 1:
        raise ValueError(f"census_overhead: steps and pairs must be >= 1, got {steps} and {pairs}")
    device = trainer.device
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def censuses(mode: str) -> CensusGroup | None:
        if mode == "none":
            return None
        made = [LoopStructureCensus(cuda=True, device_type=device.type, step_range=STEP_RANGE)]
        if mode == "both":
            made.insert(0, LoopSyncCensus(cuda=cuda, loop=loop_module))
        group = CensusGroup(made)
        group.begin(0)  # each census leaves out the first epoch it is given
        group.end()
        return group

    modes = ("none", "structure", "both")
    groups = {m: censuses(m) for m in modes}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for p in range(-1, pairs):  # p = -1: one unmeasured run per mode
        for mode in modes if p % 2 == 0 else modes[::-1]:
            group = groups[mode]
            sync()
            start = time.perf_counter()
            if group is not None:
                group.begin(p + 1)
            try:
                trainer.iterate(steps)
            finally:
                if group is not None:
                    group.end()
            sync()
            if p >= 0:
                times[mode].append((time.perf_counter() - start) / steps * 1e6)
    med = {m: float(pd.Series(v).median()) for m, v in times.items()}
    return {
        "steps": steps,
        "pairs": pairs,
        "us_per_iteration": {m: round(v, 2) for m, v in med.items()},
        "overhead_ratio": {m: round(med[m] / med["none"] - 1, 4) for m in modes if m != "none"},
    }


def overhead_text(overhead: Mapping) -> str:
    """One line: the census overhead per loop iteration (`census_overhead`)."""
    us, ratio = overhead["us_per_iteration"], overhead["overhead_ratio"]
    return (
        f"Census overhead (hotloop gate --census-overhead: {overhead['pairs']} x {overhead['steps']} iterations "
        f"per mode after the epochs, device-synchronized, medians): no census {us['none']:.1f} us/iteration; "
        f"structure census {us['structure']:.1f} us ({ratio['structure']:+.1%}); both censuses (sync + "
        f"structure, as the gate's epochs run) {us['both']:.1f} us ({ratio['both']:+.1%})"
    )


def precision_evidence(trainer: Trainer) -> tuple[str, list[str]]:
    """The precision probe's (verdict, evidence lines) for the trained learner (hotloop.guards.probes.precision_probe: the
    step's own GEMM kernels on the run's parameters and a batch from its replay, against float64): PASS / FAIL /
    "not measured (...)". Only the hotloop learner's kernels are probed; for the reference learner the verdict is
    "not measured (the precision probe covers the hotloop learner's kernels)"."""
    if trainer.learner_kind != "hotloop":
        return "not measured (the precision probe covers the hotloop learner's kernels)", []
    from hotloop.guards.probes.precision_probe import precision_verdict, probe_precision, replay_batch

    return precision_verdict(probe_precision(trainer.learner, replay_batch(trainer.learner)))


def judge_precision(verdicts: pd.DataFrame, verdict: str, lines: list[str]) -> None:
    """Set the PRECISION row of `verdicts` ("TF32 forward only"; in place) from the probe: PASS -> measured "yes",
    FAIL -> "no" (source "probe"), otherwise not measured with the probe's reason. The kernel-name classification
    the trace gave stays in the evidence only ("names: ..."): names decide nothing."""
    row = _rows(verdicts, PRECISION)
    if not row.any():
        return
    names = verdicts.loc[row, "evidence"].iloc[0]
    named = verdicts.loc[row, "measured"].iloc[0]
    evidence = "; ".join([*lines, f"names (not judged): {named or '-'}{': ' + names if names else ''}"])
    if verdict in ("PASS", "FAIL"):
        verdicts.loc[row, ["measured", "verdict", "status", "source", "evidence"]] = [
            "yes" if verdict == "PASS" else "no",
            verdict,
            "measured",
            "probe",
            evidence,
        ]
    else:
        verdicts.loc[row, ["measured", "verdict", "status", "source", "evidence"]] = ["", "-", verdict, "", evidence]
