"""`hotloop report RUN [RUN2] [--markdown]`: print a run's per-epoch table, or compare two runs (the tables:
hotloop.profiles.report, read_epochs and compare_runs).

RUN is a run folder holding epochs.csv (as `hotloop train`/`gate` write it) or such a CSV file itself. With RUN2,
prints per numeric column the median over epochs of each run and their ratio RUN2/RUN1. Exit 0 when printed, 2 when
an input cannot be used (the error names the path and the problem; nothing is printed to stdout or written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hotloop.profiles.epoch_table import format_table
from hotloop.profiles.report import ReportInputError, compare_runs, read_epochs

BAD_INPUT = 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `report` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "report",
        help="print a run's per-epoch table, or compare two runs (medians and ratios)",
        description="Print the per-epoch table of a run folder (its epochs.csv), or with RUN2 the median of every "
        "numeric column over epochs in both runs and the ratio RUN2/RUN1.",
        epilog="exit codes: 0 printed, 2 a run folder or its epochs.csv could not be used (named on stderr)",
    )
    p.add_argument("run", type=Path, metavar="RUN", help="run folder (with epochs.csv) or an epochs CSV file")
    p.add_argument("run2", type=Path, nargs="?", metavar="RUN2", help="second run to compare against RUN")
    p.add_argument("--markdown", action="store_true", help="print GitHub markdown instead of plain text")
    return p


def run(args: argparse.Namespace) -> int:
    """Run `hotloop report` for parsed `args` (run, run2, markdown); returns the exit code (0, or 2 bad input)."""
    try:
        tables = [read_epochs(p) for p in (args.run, args.run2) if p is not None]
    except ReportInputError as exc:
        print(f"hotloop report: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    show = (
        (lambda df: df.dropna(axis=1, how="all").to_markdown(index=False, floatfmt=".4g"))
        if args.markdown
        else format_table
    )
    if len(tables) == 1:
        print(f"Per-epoch table of {args.run} ({len(tables[0])} epochs)\n" + show(tables[0]))
        return 0
    print(
        f"RUN1 {args.run} ({len(tables[0])} epochs) vs RUN2 {args.run2} ({len(tables[1])} epochs): "
        "medians over epochs\n" + show(compare_runs(*tables))
    )
    return 0
