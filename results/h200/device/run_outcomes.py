"""The learning outcomes of a folder of training runs, one row per run folder <name>_s<seed>/epochs.csv (the names
the device scripts give them: learning_trees.sh's <tree>_s<seed>, device_run_hot.sh learning_wide's hot_s<seed>),
as hotloop.profiles.learning_table's `learning_row` computes them (reached 475 = solved, best, last-3-epochs mean,
final greedy eval, held), without the wall times (the runs shared one GPU). Prints the table and writes
RUNS_DIR/outcomes.csv.
Usage: python run_outcomes.py RUNS_DIR, with hotloop importable."""
import sys
from pathlib import Path

import pandas as pd

from hotloop.profiles.learning_table import learning_frame, learning_row

OUTCOME_COLUMNS = ["seed", "learner", "epochs", "best", "last3_mean", "final_eval", "solved", "held"]


def outcomes(root: Path) -> pd.DataFrame:
    """The OUTCOME_COLUMNS frame of every root/<name>_s<seed>/epochs.csv, by name then seed (learner = name)."""
    rows = []
    for f in root.glob("*_s*/epochs.csv"):
        name, seed = f.parent.name.rsplit("_s", 1)
        rows.append(learning_row(pd.read_csv(f), seed=int(seed), learner=name, device="cuda"))
    return learning_frame(rows).sort_values(["learner", "seed"])[OUTCOME_COLUMNS]


if __name__ == "__main__":
    root = Path(sys.argv[1])
    table = outcomes(root)
    table.to_csv(root / "outcomes.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
