"""`hotloop mutate`: the source-level mutation suite of `hotloop gate` (hotloop.guards.mutate, whose docstring is the
reference). Its options and handler stay in that module, which is also a command of its own (`python -m
hotloop.guards.mutate`, ci/mutants/README.md); this module wires it into `hotloop`."""

from __future__ import annotations

import argparse

from hotloop.guards.mutate import add_mutate_args, run_mutate


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `mutate` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    p = sub.add_parser(
        "mutate",
        help="run the source-level mutation suite of the gate (ci/mutants)",
        description="Apply each patch of ci/mutants to its own copy of the checkout, run the gate "
        "from it and score it: killed only when the gate fails the mutant's criterion. "
        "Exit 0 scored, 1 below --min-score, 2 bad manifest or patch, 4 the clean tree "
        "fails, 70 internal error.",
    )
    add_mutate_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run `hotloop mutate` for parsed `args` (hotloop.guards.mutate.run_mutate); returns its exit code."""
    return run_mutate(args)
