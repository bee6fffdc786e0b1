"""`hotloop learning`: train N seeds with each learner and write the learning table (hotloop.guards.learning_report,
whose docstring says how the runs are made).

Exit codes: 0 every run finished (whatever it learned: the table says), 1 a run crashed or timed out (its row
says which), 2 bad input (before anything runs), 70 internal error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hotloop.guards.learning_report import plan_runs, run_report
from hotloop.profiles.epoch_table import format_table
from hotloop.trainer.config import parse_override, preset

USAGE, RUN_FAILED, INTERNAL = 2, 1, 70


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `learning` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    p = sub.add_parser(
        "learning",
        help="train N seeds with each learner and write the learning table",
        description="Train each seed with each learner (one `hotloop train` process per run) and "
        "write learning.csv/.md (steps, env steps and seconds to a mean return of 475, "
        "best, last-3-epochs mean, final greedy eval) and summary.csv/.md. Exit 0 all "
        "runs finished, 1 a run crashed or timed out, 2 bad input, 70 internal error.",
    )
    p.add_argument("--preset", default="cartpole-fast", help="preset to train (default cartpole-fast)")
    p.add_argument("--seeds", default="1-10", help="seeds: 1-10, 1,3,7 or a mix (default 1-10)")
    p.add_argument("--learners", help="comma-separated: hotloop, reference (default both with CUDA, else reference)")
    p.add_argument("--device", help="device of the hotloop learner's runs (default auto)")
    p.add_argument("--reference-device", default="cpu", help="device of the reference learner's runs (default cpu)")
    p.add_argument("--jobs", type=int, default=1, help="reference runs at a time, one CPU thread each when > 1")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for every run (repeatable)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="a run longer than this is stopped and recorded as timed out (default 1800)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="report folder, new or empty (default runs/learning-<UTC timestamp>/ under the working directory)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    """`hotloop learning`: returns the exit code (module docstring)."""
    import torch

    try:
        overrides = dict(parse_override(text) for text in args.overrides)
        chosen = sorted({"learner", "seed", "device"} & set(overrides))
        if chosen:
            raise ValueError(f"--set {chosen}: chosen by the report itself (--learners, --seeds, --device)")
        preset(args.preset, **overrides)  # the runs' config, validated (ValueError naming the field)
        args.out = args.out or Path("runs") / time.strftime("learning-%Y%m%dT%H%M%SZ", time.gmtime())
        runs = plan_runs(args, torch.cuda.is_available())
    except ValueError as exc:
        print(f"hotloop learning: error: {exc}", file=sys.stderr)
        return USAGE
    try:
        table, totals = run_report(runs, args)
    except Exception as exc:  # noqa: BLE001 - the contract: an unexpected error is 70
        print(f"hotloop learning: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return INTERNAL
    print(format_table(table) + "\n\n" + format_table(totals) + f"\n\nlearning tables in {args.out}")
    return 0 if table["status"].eq("ok").all() else RUN_FAILED
