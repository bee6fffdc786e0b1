"""`hotloop report RUN [RUN2] [--markdown]`: print a run's per-epoch table, or compare two runs.

RUN is a run folder holding epochs.csv (as `hotloop train`/`gate` write it) or such a CSV file itself. With RUN2,
prints per numeric column the median over epochs of each run and their ratio RUN2/RUN1. Exit 0 when printed, 2 when
an input cannot be used (the error names the path and the problem; nothing is printed to stdout or written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from hotloop.profiles.epoch_table import EPOCH_COLUMNS, format_table

BAD_INPUT = 2
COMPARE_COLUMNS = ["column", "run1_median", "run2_median", "run2_run1_ratio"]


class ReportInputError(ValueError):
    """A run's per-epoch table could not be used; the message names the path and the problem."""


def add_report_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `report` subcommand to a `parser.add_subparsers()` object; returns its parser."""
    p = subparsers.add_parser(
        "report", help="print a run's per-epoch table, or compare two runs (medians and ratios)",
        description="Print the per-epoch table of a run folder (its epochs.csv), or with RUN2 the median of every "
                    "numeric column over epochs in both runs and the ratio RUN2/RUN1.",
        epilog="exit codes: 0 printed, 2 a run folder or its epochs.csv could not be used (named on stderr)")
    p.add_argument("run", type=Path, metavar="RUN", help="run folder (with epochs.csv) or an epochs CSV file")
    p.add_argument("run2", type=Path, nargs="?", metavar="RUN2", help="second run to compare against RUN")
    p.add_argument("--markdown", action="store_true", help="print GitHub markdown instead of plain text")
    return p


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
    numeric = [c for c in dict.fromkeys([*run1.columns, *run2.columns])
               if c != "epoch" and all(c not in t or pd.api.types.is_numeric_dtype(t[c]) for t in (run1, run2))]
    med1 = pd.Series({c: run1[c].median() if c in run1 else float("nan") for c in numeric}, dtype="float64")
    med2 = pd.Series({c: run2[c].median() if c in run2 else float("nan") for c in numeric}, dtype="float64")
    return pd.DataFrame({"column": numeric, "run1_median": med1.values, "run2_median": med2.values,
                         "run2_run1_ratio": (med2 / med1).values})


def run_report(args: argparse.Namespace) -> int:
    """Run `hotloop report` for parsed `args` (run, run2, markdown); returns the exit code (0, or 2 bad input)."""
    try:
        tables = [read_epochs(p) for p in (args.run, args.run2) if p is not None]
    except ReportInputError as exc:
        print(f"hotloop report: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    show = (lambda df: df.dropna(axis=1, how="all").to_markdown(index=False, floatfmt=".4g")) if args.markdown \
        else format_table
    if len(tables) == 1:
        print(f"Per-epoch table of {args.run} ({len(tables[0])} epochs)\n" + show(tables[0]))
        return 0
    print(f"RUN1 {args.run} ({len(tables[0])} epochs) vs RUN2 {args.run2} ({len(tables[1])} epochs): "
          "medians over epochs\n" + show(compare_runs(*tables)))
    return 0
