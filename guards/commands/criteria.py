"""`hotloop criteria [--markdown]`: print the criteria the gate judges, from their registry
(hotloop.guards.criteria.CRITERIA): id, title, metric, limit, phases and what judges each; with --markdown,
docs/criteria.md's criteria table (hotloop.guards.criteria.markdown_table, the text that file holds). Exit 0.
"""

from __future__ import annotations

import argparse

from hotloop.guards.criteria import criteria_frame, markdown_table
from hotloop.profiles.epoch_table import format_table


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `criteria` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "criteria",
        help="print the criteria the gate judges (id, title, metric, limit, phases)",
        description="Print the criteria registry the gate judges against: each criterion's id (what faults, mutants "
        "and pytest's assert_criteria name), title, metric columns, limit, phases and what judges it.",
        epilog="exit codes: 0 printed",
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print docs/criteria.md's criteria table (every column: sources, evidence, why)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Run `hotloop criteria` for parsed `args` (markdown); returns 0."""
    print(markdown_table() if args.markdown else format_table(criteria_frame()))
    return 0
