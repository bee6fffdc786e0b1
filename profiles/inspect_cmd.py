"""`hotloop inspect FILE... [--json] [--step-range NAME] [--domain NAME]`: the guard counts of trace files.

Each FILE is a Kineto (torch.profiler) JSON trace, plain or gzipped, or an Nsight Systems SQLite export; the
format is told by the file's first bytes (SQLite's header, else JSON). Prints, per file, the whole-trace counts
of `hotloop.profiles.trace_counts.count_totals` and, when the trace has step ranges, the per-step table of
`count_per_step`. Exit 0 when every file was read, 2 when any could not be (each such error goes to stderr,
naming the file; the other files are still reported).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from hotloop.profiles.trace_counts import COUNT_COLUMNS, count_per_step, count_totals
from hotloop.profiles.epoch_table import format_table
from hotloop.profiles.kineto_reader import read_kineto
from hotloop.profiles.nsight_reader import SQLITE_MAGIC, read_nsight_sqlite
from hotloop.profiles.trace_schema import TraceReadError

UNREADABLE_INPUT = 2


def add_inspect_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `inspect` subcommand to a `parser.add_subparsers()` object; returns its parser."""
    p = subparsers.add_parser(
        "inspect", help="count kernels, syncs, memcpys, memsets and graph launches in trace files",
        description="Read Kineto JSON traces (.json, .json.gz) and Nsight Systems SQLite exports and print the "
                    "guard counts per file, and per step when the trace has step ranges.",
        epilog="exit codes: 0 all files read, 2 a file could not be read (named on stderr)")
    p.add_argument("files", nargs="+", metavar="FILE", help="Kineto trace JSON (plain or gzipped) or nsys .sqlite")
    p.add_argument("--json", action="store_true",
                   help='print {"files": {FILE: {"totals": {...}, "steps": [...] or null}}} instead of tables')
    p.add_argument("--step-range", default="step", metavar="NAME",
                   help="name of the step ranges (record_function / NVTX); default 'step', else ProfilerStep#N")
    p.add_argument("--domain", metavar="NAME", help="NVTX domain the step ranges must be in (default: any)")
    return p


def read_trace(path: str | Path) -> pd.DataFrame:
    """A trace file in the `hotloop.profiles.trace_schema` schema: Nsight SQLite by its header, else Kineto JSON.

    Raises TraceReadError naming the file when it cannot be read.
    """
    try:
        with open(path, "rb") as f:
            is_sqlite = f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError as exc:
        raise TraceReadError(path, f"cannot read: {exc.strerror or exc}") from None
    if not is_sqlite and Path(path).suffix in (".sqlite", ".db"):
        raise TraceReadError(path, "named like an Nsight SQLite export but has no SQLite header (empty or not a "
                                   "database); export one with `nsys export --type sqlite`")
    return read_nsight_sqlite(path) if is_sqlite else read_kineto(path)


def run_inspect(args: argparse.Namespace) -> int:
    """Run `hotloop inspect` for parsed `args` (files, json, step_range, domain); returns the exit code."""
    report: dict[str, dict] = {}
    failed = False
    for path in args.files:
        try:
            df = read_trace(path)
        except TraceReadError as exc:
            print(f"hotloop inspect: error: {exc}", file=sys.stderr)
            report[path] = {"error": exc.problem, "totals": None, "steps": None}
            failed = True
            continue
        steps = count_per_step(df, args.step_range, args.domain)
        if not len(steps) and (args.step_range != "step" or args.domain):
            print(f"hotloop inspect: note: {path}: no step ranges named {args.step_range!r}"
                  + (f" in domain {args.domain!r}" if args.domain else "") + ": totals only", file=sys.stderr)
        report[path] = {"totals": count_totals(df), "steps": step_records(steps) if len(steps) else None}
        if not args.json:
            print(format_file(path, len(df), report[path]["totals"], steps))
    if args.json:
        print(json.dumps({"files": report}, indent=2))
    return UNREADABLE_INPUT if failed else 0


def step_records(steps: pd.DataFrame) -> list[dict]:
    """Per-step counts as JSON-ready dicts (numpy scalars turned into Python numbers), one per step row."""
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in steps.to_dict(orient="records")]


def format_file(path: str, n_events: int, totals: dict, steps: pd.DataFrame) -> str:
    """The text `hotloop inspect` prints for one trace: a header, the whole-file counts table (`totals` as
    hotloop.profiles.trace_counts.count_totals returns it) and, when `steps` has rows, the per-step counts table."""
    rows = [(col, totals[col]) for col in COUNT_COLUMNS]
    rows += [(f"sync_calls {api}", n) for api, n in totals["sync_calls"].items()] or [("sync_calls", 0)]
    lines = [f"== {path} ({n_events} events)", format_table(pd.DataFrame(rows, columns=["count", "events"]))]
    if len(steps):
        steps = steps.drop(columns="start_us")
        shown = steps.loc[:, (steps != 0).any(axis=0) | steps.columns.isin(["step", "kernels"])]
        lines += [f"\nper step ({len(steps)} step range{'s' * (len(steps) != 1)}; all-zero count columns left out)", format_table(shown)]
    return "\n".join(lines) + "\n"
