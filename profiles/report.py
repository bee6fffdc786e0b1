"""The tables of `hotloop report RUN [RUN2]` (the command: hotloop.guards.commands.report): a run's per-epoch table
(`read_epochs`: a run folder holding epochs.csv, as `hotloop train`/`gate` write it, or such a CSV file itself) and
the comparison of two runs (`compare_runs`: per numeric column the median over epochs of each run and their ratio
RUN2/RUN1).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hotloop.profiles.epoch_table import EPOCH_COLUMNS

COMPARE_COLUMNS = ["column", "run1_median", "run2_median", "run2_run1_ratio"]


class ReportInputError(ValueError):
    """A run's per-epoch table could not be used; the message names the path and the problem."""


def read_epochs(run: str | Path) -> pd.DataFrame:
    """The per-epoch table of `run` (a folder holding epochs.csv, or the CSV file itself).

    Raises ReportInputError naming the path for: a missing path, a folder without epochs.csv, a file that cannot
    be read or parsed as CSV, a table without rows, a missing EPOCH_COLUMNS column or a non-numeric one.
    """
    run = Path(run)
    csv = run / "epochs.csv" if run.is_dir() else run
    if not run.exists():
        raise ReportInputError(f"{run}: no such run folder or file")
    if not csv.is_file():
        raise ReportInputError(f"{run}: no epochs.csv in this folder")
    try:
        df = pd.read_csv(csv)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ReportInputError(f"{csv}: not a readable CSV ({type(exc).__name__}: {exc})") from None
    missing = [c for c in EPOCH_COLUMNS if c not in df.columns]
    if missing:
        raise ReportInputError(f"{csv}: missing columns {missing}")
    if df.empty:
        raise ReportInputError(f"{csv}: no epoch rows")
    bad = [c for c in EPOCH_COLUMNS if not pd.api.types.is_numeric_dtype(df[c])]
    if bad:
        raise ReportInputError(f"{csv}: non-numeric values in columns {bad}")
    return df


def compare_runs(run1: pd.DataFrame, run2: pd.DataFrame) -> pd.DataFrame:
    """COMPARE_COLUMNS per numeric column of either table except `epoch` (run1's order, then run2's new ones):
    the median over epochs in each run (NaN where a run lacks the column) and run2_median / run1_median (inf for
    a zero run1 median, NaN for 0/0 or a missing side)."""
    numeric = [
        c
        for c in dict.fromkeys([*run1.columns, *run2.columns])
        if c != "epoch" and all(c not in t or pd.api.types.is_numeric_dtype(t[c]) for t in (run1, run2))
    ]
    med1 = pd.Series({c: run1[c].median() if c in run1 else float("nan") for c in numeric}, dtype="float64")
    med2 = pd.Series({c: run2[c].median() if c in run2 else float("nan") for c in numeric}, dtype="float64")
    return pd.DataFrame(
        {
            "column": numeric,
            "run1_median": med1.values,
            "run2_median": med2.values,
            "run2_run1_ratio": (med2 / med1).values,
        }
    )
