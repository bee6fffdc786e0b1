"""`hotloop gate`: run a preset under the per-epoch timer and hang watchdog, then guard K steady-state learner
steps (guards.guard.guard_steps: sync hooks + profiler trace) and judge every criterion of ../shared/DESIGN.md.

Exit codes: 0 every measured criterion passed, 1 a criterion failed, 2 bad usage or input (raised by the CLI),
3 hang (the watchdog ends the process).
"""

from __future__ import annotations

import json
from pathlib import Path

from guards.guard import GuardReport, guard_steps
from profiles.epoch_table import format_table, write_table
from trainer.config import Config
from trainer.loop import Trainer
from trainer.run import run_training

GUARD_STEP_RANGE = "guard_step"
"""Range name around each guarded step (the trainer opens "step" ranges itself)."""


def run_gate(cfg: Config, run_dir: Path, epoch_limit_s: float, show_progress: bool = True, guard_steps_n: int = 20,
             guard_warmup: int = 3) -> int:
    """Run the gate; prints the per-epoch table and the criteria verdicts, writes under `run_dir` epochs.csv/.md,
    criteria.csv/.md/.json (the verdicts) and guard.json (the guarded steps' per-step counts, hook hits, GEMMs).
    Returns the exit code (0 pass, 1 a criterion failed)."""

    def guard(trainer: Trainer) -> GuardReport:
        return guard_steps(trainer.train_step, steps=guard_steps_n, warmup=guard_warmup,
                           step_range=GUARD_STEP_RANGE)

    epochs, report = run_training(cfg, run_dir, epoch_limit_s, show_progress, after_epochs=guard)
    verdicts = report.verdicts.copy()
    # Reaching this line means every epoch finished under the watchdog (it exits 3 otherwise).
    hang = verdicts.criterion.eq("epoch 1 without hang")
    verdicts.loc[hang, ["measured", "verdict", "status", "source"]] = ["yes", "PASS", "measured", "watchdog"]
    write_table(verdicts, run_dir, "criteria")
    (run_dir / "criteria.json").write_text(json.dumps(verdicts.to_dict(orient="records"), indent=2) + "\n")
    report.to_json(run_dir / "guard.json")
    print("\nPer-epoch table\n" + format_table(epochs))
    print(f"\nCriteria (../shared/DESIGN.md), {guard_steps_n} guarded steps after the epochs\n"
          + format_table(verdicts[["criterion", "measured", "limit", "verdict", "status", "source"]]))
    failed = verdicts[verdicts.verdict == "FAIL"]
    print(f"\nrun folder: {run_dir}")
    if len(failed):
        for _, row in failed.iterrows():
            print(f"FAIL {row.criterion}: measured {row.measured} (limit {row.limit}); {row.evidence}")
        return 1
    measured = verdicts.status.eq("measured").sum()
    print(f"PASS ({measured} measured, {len(verdicts) - measured} not measured here)")
    return 0
