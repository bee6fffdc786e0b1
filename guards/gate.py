"""`hotloop gate`: run a preset under the per-epoch timer and hang watchdog, then guard K steady-state learner
steps (hotloop.guards.guard.guard_steps: sync hooks + profiler trace) and judge every criterion of docs/criteria.md.

The guarded step: with the hotloop learner, `Trainer.learner_step` (the captured learner step: sampling, both
forwards, loss, backward, optimizer, spectral norm, priority update), its kernels assigned to phases by name
(hotloop.trainer.step.PHASE_RULES); env stepping is not part of it (a vectorized env of 8 CartPoles runs tiny eager ops,
single-block kernels by nature). With the reference learner, `Trainer.train_step` (env steps + learner step).

Exit codes: 0 every measured criterion passed, 1 a criterion or a baseline regression failed, 2 bad usage or input
(raised by the CLI, before training), 3 hang (the watchdog ends the process), 70 internal error (an unexpected
exception: the CLI saves its traceback as <run folder>/error.log; hotloop.guards.cli.report_internal_error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import pandas as pd
import torch

from hotloop.guards.baselines import Baseline, baseline_path, compare, config_mismatch, load_baseline, write_baseline
from hotloop.guards.faults import check_request
from hotloop.guards.faults import inject as inject_fault
from hotloop.guards.guard import GuardReport, guard_steps
from hotloop.profiles.epoch_table import format_table, write_table
from hotloop.profiles.provenance import device_name
from hotloop.trainer.config import ENV_SHAPE_FIELDS, Config, env_shape_fields
from hotloop.trainer.loop import Trainer, learner_kind, resolve_device
from hotloop.guards.run import run_training
from hotloop.trainer.step import PHASE_RULES

GUARD_STEP_RANGE = "guard_step"
"""Range name around each guarded step (the trainer opens "step" ranges itself)."""
TRACE_FILE = "trace.json.gz"
"""The first repeat's Kineto trace in the gate's run folder (gzipped Chrome trace JSON)."""


BASELINES_DIR = Path(str(resources.files("hotloop.profiles") / "baselines"))
"""The installed baselines (package data of hotloop.profiles, read with importlib.resources; in a checkout,
profiles/baselines/), wherever the command is started from."""


def default_baseline(folder: str | Path | None = None, gpu_name: str | None = None) -> Path | None:
    """`folder`/<gpu-name-slug>.json (folder: BASELINES_DIR when None) for `gpu_name` (default: the name of this
    machine's CUDA device 0); None when no name is given and there is no CUDA. The file need not exist.
    Raises ValueError for a GPU name with no letter or digit (hotloop.guards.baselines.baseline_path)."""
    if gpu_name is None:
        if not torch.cuda.is_available():
            return None
        gpu_name = torch.cuda.get_device_name(0)
    return baseline_path(gpu_name, BASELINES_DIR if folder is None else folder)


def run_config(cfg: Config) -> dict:
    """The configuration a baseline records for a run of `cfg` on this machine: cfg.to_dict() with device and
    learner resolved ("auto" -> what the run used: hotloop.trainer.loop.resolve_device, learner_kind)."""
    device = resolve_device(cfg.device)
    return {**cfg.to_dict(), "device": str(device), "learner": learner_kind(cfg, device)}


def step_identity(config: Mapping, gpu: str) -> dict:
    """What shapes a guarded step, from a configuration dict (a baseline's "config", or `run_config`) and the GPU
    name ("cpu" for a CPU run; "" = unknown, left out): the config with device reduced to its type (cpu / cuda;
    "auto" resolved on this machine), learner "auto" resolved for that type (hotloop on cuda, reference elsewhere),
    the ENV_SHAPE_FIELDS the env does not read dropped (hotloop.trainer.config.env_shape_fields), plus "gpu"."""
    ident = dict(config)
    if "device" in ident:
        ident["device"] = resolve_device("auto").type if ident["device"] == "auto" else \
            torch.device(ident["device"]).type
    if ident.get("learner") == "auto" and "device" in ident:
        ident["learner"] = "hotloop" if ident["device"] == "cuda" else "reference"
    for f in set(ENV_SHAPE_FIELDS) - set(env_shape_fields(ident.get("env"))):
        ident.pop(f, None)
    return ident | ({"gpu": gpu} if gpu else {})


def baseline_mismatch(baseline: Baseline, cfg: Config) -> list[str] | None:
    """How a run of `cfg` on this machine differs from what `baseline` was measured with
    (hotloop.guards.baselines.config_mismatch of the two `step_identity`s, the GPU included); None when the baseline
    records no configuration (a file written before baselines did), [] when they agree."""
    if baseline.config is None:
        return None
    run = run_config(cfg)
    return config_mismatch(step_identity(baseline.config, baseline.gpu),
                           step_identity(run, device_name(torch.device(run["device"]))), Config().to_dict())


def run_gate(cfg: Config, run_dir: Path, epoch_limit_s: float, show_progress: bool = True, guard_steps_n: int = 20,
             guard_warmup: int = 3, repeats: int = 1, baseline: Path | None = None,
             update_baseline: bool = False, inject: str | None = None) -> int:
    """Run the gate; prints the per-epoch table and the criteria verdicts, writes under `run_dir` epochs.csv/.md,
    criteria.csv/.md/.json (the verdicts), guard.json (the first repeat's per-step counts, hook hits, GEMMs) and
    trace.json.gz (the first repeat's Kineto trace: `hotloop inspect` reads it, Perfetto shows it).

    The guarded window (`guard_steps_n` steps after `guard_warmup`) is repeated `repeats` times; a criterion fails
    if it fails in any repeat. With a `baseline` file (hotloop.guards.baselines), the repeats' per-step medians are compared
    with it (baseline.csv/.md, verdict per metric) and any FAIL fails the gate; with `update_baseline` the repeats
    are written as the new baseline instead (deliberately, never implicitly).
    `inject`: a hotloop.guards.faults fault name, injected after the epochs and before the guarded steps (mutation test
    of the gate: it must then FAIL that fault's criterion); never together with update_baseline.
    Returns the exit code (0 pass, 1 a criterion or a baseline comparison failed). Raises ValueError, before
    training, for an unknown fault, inject together with update_baseline, inject on a device that is not CUDA or
    a learner fault with the reference learner (hotloop.guards.faults.check_request; the CLI checks the same
    before it makes the run folder and turns it into exit 2)."""
    device = resolve_device(cfg.device)
    check_request(inject, update_baseline, device=device, learner=learner_kind(cfg, device))

    def guard(trainer: Trainer) -> list[GuardReport]:
        if inject is not None:
            fault = inject_fault(trainer, inject)
            print(f"\ninjected fault {fault.name!r}: {fault.what}; expect FAIL of {fault.criterion!r}")
        hot = trainer.learner_kind == "hotloop"
        step, phases = (trainer.learner_step, PHASE_RULES) if hot else (trainer.train_step, None)
        return [guard_steps(step, steps=guard_steps_n, warmup=guard_warmup, step_range=GUARD_STEP_RANGE,
                            phases=phases, trace_path=run_dir / TRACE_FILE if r == 0 else None,
                            cuda=trainer.device.type == "cuda")
                for r in range(repeats)]

    epochs, reports = run_training(cfg, run_dir, epoch_limit_s, show_progress, after_epochs=guard)
    report = reports[0]
    verdicts = report.verdicts.copy()
    for other in reports[1:]:
        worse = other.verdicts.verdict.eq("FAIL").to_numpy() & ~verdicts.verdict.eq("FAIL").to_numpy()
        verdicts.loc[worse] = other.verdicts.loc[worse].to_numpy()
    # Reaching this line means every epoch finished under the watchdog (it exits 3 otherwise).
    hang = verdicts.criterion.eq("epoch 1 without hang")
    verdicts.loc[hang, ["measured", "verdict", "status", "source"]] = ["yes", "PASS", "measured", "watchdog"]
    write_table(verdicts, run_dir, "criteria")
    (run_dir / "criteria.json").write_text(json.dumps(verdicts.to_dict(orient="records"), indent=2) + "\n")
    report.to_json(run_dir / "guard.json")
    regressions = _baseline_step(reports, baseline, update_baseline, run_dir, run_config(cfg))
    print("\nPer-epoch table\n" + format_table(epochs))
    print(f"\nCriteria (docs/criteria.md), {guard_steps_n} guarded steps after the epochs\n"
          + format_table(verdicts[["criterion", "measured", "limit", "verdict", "status", "source"]]))
    failed = verdicts[verdicts.verdict == "FAIL"]
    print(f"\nrun folder: {run_dir} (its Kineto trace per step: hotloop inspect --step-range {GUARD_STEP_RANGE} "
          f"{run_dir / TRACE_FILE})")
    if len(failed) or len(regressions):
        for _, row in failed.iterrows():
            print(f"FAIL {row.criterion}: measured {row.measured} (limit {row.limit}); {row.evidence}")
        for _, row in regressions.iterrows():
            print(f"FAIL regression {row.metric}: run {row.run:g} vs baseline {row.baseline:g} ({row.rule})")
        return 1
    measured = verdicts.status.eq("measured").sum()
    print(f"PASS ({measured} measured, {len(verdicts) - measured} not measured here)")
    return 0


def _baseline_step(reports: list[GuardReport], baseline: Path | None, update: bool, run_dir: Path,
                   config: dict) -> pd.DataFrame:
    """Write (with `config`, a `run_config`) or compare the baseline; returns the failing comparison rows (empty when none or no
    baseline).

    The repeats' medians leave out the timing of damaged steps (steps holding a trace anomaly:
    hotloop.guards.step_metrics), so those steps are out of the comparison; the written table (baseline.csv/.md) has
    a `note` column saying so on the timing rows ("repeat 1: timing of steps 3, 7 left out: kernel with ts 0 ..."),
    and the note is printed under the table. When every guarded step of every repeat is damaged there is no timing
    to compare: those rows get verdict "-" and a rule saying why, instead of a FAIL for a missing value."""
    if baseline is None:
        return pd.DataFrame()
    metrics = {m: [r.medians.get(m, float("nan")) for r in reports] for m in reports[0].medians}
    note = "; ".join(f"repeat {i + 1}: {r.timing_note}" for i, r in enumerate(reports) if r.timing_note)
    if update:
        write_baseline(baseline, metrics, gpu=device_name(torch.device(config["device"])), config=config)
        print(f"\nbaseline written: {baseline} ({len(reports)} repeats, {len(metrics)} metrics)"
              + (f"\nnote: {note}" if note else ""))
        return pd.DataFrame()
    table = compare(metrics, load_baseline(baseline))
    timing = table["kind"].eq("timing")
    table["note"] = ""
    table.loc[timing, "note"] = note
    if all(_every_step_damaged(r) for r in reports):
        lost = timing & table["run"].isna() & table["verdict"].eq("FAIL")
        table.loc[lost, ["verdict", "rule"]] = ["-", "not compared: the timing of every guarded step was left out "
                                                     "(trace anomalies, see note)"]
    write_table(table, run_dir, "baseline")
    print(f"\nBaseline comparison ({baseline})\n" + format_table(table.drop(columns="note"))
          + (f"\nnote: {note}" if note else ""))
    return table[table.verdict == "FAIL"]


def _every_step_damaged(report: GuardReport) -> bool:
    """Whether every guarded step of `report` holds a trace anomaly (its per_step "anomaly" column is never "")."""
    anomaly = report.per_step.get("anomaly")
    return anomaly is not None and len(anomaly) > 0 and bool(anomaly.ne("").all())
