"""Per-epoch tables as pandas DataFrames, and the run folder they are written to (CSV + markdown).

Columns follow the unit-in-the-name convention (../shared/CONVENTIONS.md item 7): wall_s in seconds,
*_per_s per second of wall time; loss, q_mean and mean_return_100 in the environment's reward units.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

EPOCH_COLUMNS = ["epoch", "learner_steps", "env_steps", "wall_s", "learner_steps_per_s", "env_steps_per_s",
                 "loss", "q_mean", "mean_return_100", "epsilon"]


def epoch_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """DataFrame of per-epoch rows: the EPOCH_COLUMNS first, in order, then any extra columns.

    Raises ValueError naming the missing columns if a row lacks one of EPOCH_COLUMNS.
    """
    df = pd.DataFrame(list(rows))
    missing = [c for c in EPOCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"per-epoch rows lack columns {missing}")
    return df[EPOCH_COLUMNS + [c for c in df.columns if c not in EPOCH_COLUMNS]]


def new_run_dir(root: str | Path = "profiles/runs") -> Path:
    """Create and return root/<UTC timestamp>/ (suffixed -2, -3, ... if it exists; never reuses a folder)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    root = Path(root)
    path, n = root / stamp, 1
    while True:
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            n += 1
            path = root / f"{stamp}-{n}"


def write_table(df: pd.DataFrame, run_dir: Path, stem: str) -> list[Path]:
    """Write `df` as run_dir/<stem>.csv and run_dir/<stem>.md (GitHub markdown); returns both paths."""
    csv, md = run_dir / f"{stem}.csv", run_dir / f"{stem}.md"
    df.to_csv(csv, index=False)
    md.write_text(df.to_markdown(index=False, floatfmt=".4g") + "\n")
    return [csv, md]


def format_table(df: pd.DataFrame) -> str:
    """Console text of a table (4 significant digits for floats)."""
    return df.to_string(index=False, float_format=lambda v: f"{v:.4g}")
