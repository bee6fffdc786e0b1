"""`hotloop gate`: run a preset under the per-epoch timer and hang watchdog, print and write its tables.

Exit codes: 0 every measured criterion passed, 1 a criterion failed, 2 bad usage or input (raised by the CLI),
3 hang (the watchdog ends the process).
"""

from __future__ import annotations

import json
from pathlib import Path

from guards.criteria import verdict_table
from profiles.epoch_table import format_table, write_table
from trainer.config import Config
from trainer.run import run_training


def run_gate(cfg: Config, run_dir: Path, epoch_limit_s: float, show_progress: bool = True) -> int:
    """Run the gate; prints the per-epoch table and the criteria table, writes them under `run_dir`
    (epochs.csv/.md, criteria.csv/.md, criteria.json). Returns the exit code (0 pass, 1 fail)."""
    epochs = run_training(cfg, run_dir, epoch_limit_s, show_progress)
    # Reaching this line means every epoch finished under the watchdog (it exits 3 otherwise).
    verdicts = verdict_table({"epoch 1 without hang": "yes"})
    write_table(verdicts, run_dir, "criteria")
    (run_dir / "criteria.json").write_text(json.dumps(verdicts.to_dict(orient="records"), indent=2) + "\n")
    print("\nPer-epoch table\n" + format_table(epochs))
    print("\nCriteria (../shared/DESIGN.md)\n" + format_table(verdicts[["criterion", "limit", "measured",
                                                                        "status", "verdict"]]))
    failed = verdicts[verdicts.verdict == "FAIL"]
    print(f"\nrun folder: {run_dir}")
    if len(failed):
        print("FAILED: " + ", ".join(failed.criterion))
        return 1
    print(f"PASS ({(verdicts.status == 'measured').sum()} measured, "
          f"{(verdicts.status != 'measured').sum()} not yet measured)")
    return 0
