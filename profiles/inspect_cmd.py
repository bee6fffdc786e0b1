"""`hotloop inspect FILE... [--json] [--step-range NAME] [--domain NAME]`: the guard counts of trace files.

Each FILE is a Kineto (torch.profiler) JSON trace, plain or gzipped, or an Nsight Systems SQLite export; the
format is told by the file's first bytes (SQLite's header, else JSON). Prints, per file, the whole-trace counts
of `hotloop.profiles.trace_counts.count_totals`, a "trace anomalies:" line (`hotloop.profiles.trace_anomalies`:
events with ts 0, negative durations, unmatched correlations, ...; counted, not absorbed) and, when the trace has
step ranges, the per-step table of `count_per_step` with the steps that hold anomalies named under it.

One bad file does not lose the others: any error while reading or counting one file (TraceReadError, OSError,
a RecursionError or ValueError of a parser, ...) is that file's error. Each goes to stderr as
"hotloop inspect: error: FILE: PROBLEM"; the other files are still reported, and with --json stdout stays one
valid JSON document: {"files": {FILE: {"totals": ..., "steps": ...}} for the files read, plus "errors": {FILE:
PROBLEM} when any could not be.

Exit codes: 0 every file read; 2 any file could not be; 141 stdout was closed early (e.g. `hotloop inspect ... |
head`): the rest of the output is dropped quietly, without a traceback, and the exit code is the one a shell
reports for a process killed by SIGPIPE (128 + 13), as `cat` or `yes` give there, so a pipeline under
`set -o pipefail` still sees that the output was cut. (Python ignores SIGPIPE and raises BrokenPipeError instead;
the handling is the one of the Python docs, "Note on SIGPIPE" in the signal module: point stdout at devnull so
that the interpreter's final flush cannot fail again.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from hotloop.profiles.trace_anomalies import describe_anomalies
from hotloop.profiles.trace_counts import COUNT_COLUMNS, count_per_step, count_totals
from hotloop.profiles.epoch_table import format_table
from hotloop.profiles.kineto_reader import read_kineto
from hotloop.profiles.nsight_reader import SQLITE_MAGIC, read_nsight_sqlite
from hotloop.profiles.trace_schema import TraceReadError

UNREADABLE_INPUT = 2
BROKEN_PIPE = 141
"""Exit code when stdout was closed before everything was written: 128 + SIGPIPE (13), as a shell reports it."""
STEP_NOTES = 10
"""How many steps with anomalies the text form names under the per-step table."""


def add_inspect_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `inspect` subcommand to a `parser.add_subparsers()` object; returns its parser."""
    p = subparsers.add_parser(
        "inspect", help="count kernels, syncs, memcpys, memsets and graph launches in trace files",
        description="Read Kineto JSON traces (.json, .json.gz) and Nsight Systems SQLite exports and print the "
                    "guard counts per file, and per step when the trace has step ranges.",
        epilog="exit codes: 0 all files read, 2 a file could not be read (named on stderr; the others are still "
               "reported), 141 stdout closed early (e.g. piped into head)")
    p.add_argument("files", nargs="+", metavar="FILE", help="Kineto trace JSON (plain or gzipped) or nsys .sqlite")
    p.add_argument("--json", action="store_true",
                   help='print {"files": {FILE: {"totals": {...}, "steps": [...] or null}}} instead of tables, '
                        'plus "errors": {FILE: PROBLEM} when a file could not be read')
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
    """Run `hotloop inspect` for parsed `args` (files, json, step_range, domain); returns the exit code: 0, or
    UNREADABLE_INPUT (2) when a file could not be read or counted, or BROKEN_PIPE (141) when stdout was closed
    early (then stdout is pointed at devnull, so nothing more is written and no traceback is printed).
    Module docstring: what is printed where."""
    try:
        code = _run_inspect(args)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return BROKEN_PIPE
    return code


def _run_inspect(args: argparse.Namespace) -> int:
    report: dict[str, dict] = {}
    errors: dict[str, str] = {}
    for path in args.files:
        try:
            df = read_trace(path)
            steps = count_per_step(df, args.step_range, args.domain)
            totals = count_totals(df)
        except BrokenPipeError:
            raise
        except Exception as exc:  # noqa: BLE001 -- any failure of one file is that file's error (module docstring)
            errors[path] = file_error(exc)
            print(f"hotloop inspect: error: {path}: {errors[path]}", file=sys.stderr)
            continue
        if not len(steps) and (args.step_range != "step" or args.domain):
            print(f"hotloop inspect: note: {path}: no step ranges named {args.step_range!r}"
                  + (f" in domain {args.domain!r}" if args.domain else "") + ": totals only", file=sys.stderr)
        report[path] = {"totals": totals, "steps": step_records(steps) if len(steps) else None}
        if not args.json:
            print(format_file(path, len(df), totals, steps))
    if args.json:
        print(json.dumps({"files": report} | ({"errors": errors} if errors else {}), indent=2))
    return UNREADABLE_INPUT if errors else 0


def file_error(exc: BaseException) -> str:
    """The problem text `hotloop inspect` reports for a file whose reading or counting raised `exc` (without the
    file name): a TraceReadError's `problem`; "cannot read: <strerror>" for an OSError; for a RecursionError
    "cannot parse: nested too deeply for the JSON parser (RecursionError: ...)"; else "cannot read:
    <ExceptionType>: <message>"."""
    if isinstance(exc, TraceReadError):
        return exc.problem
    if isinstance(exc, OSError):
        return f"cannot read: {exc.strerror or exc}"
    if isinstance(exc, RecursionError):
        return f"cannot parse: nested too deeply for the JSON parser (RecursionError: {exc})"
    return f"cannot read: {type(exc).__name__}: {exc}"


def _stdout_to_devnull() -> None:
    """Point the stdout file descriptor at os.devnull (after a BrokenPipeError), so the interpreter's last flush of
    what is still buffered cannot raise again; a stdout without a descriptor (a test's capture) is left alone."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def step_records(steps: pd.DataFrame) -> list[dict]:
    """Per-step counts as JSON-ready dicts (numpy scalars turned into Python numbers), one per step row."""
    return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in steps.to_dict(orient="records")]


def format_file(path: str, n_events: int, totals: dict, steps: pd.DataFrame) -> str:
    """The text `hotloop inspect` prints for one trace: a header, the whole-file counts table (`totals` as
    hotloop.profiles.trace_counts.count_totals returns it), a "trace anomalies: ..." line (when `totals` has
    "anomalies": `hotloop.profiles.trace_anomalies.describe_anomalies`) and, when `steps` (a `count_per_step`
    table) has rows, the per-step counts table, then the steps holding anomalies with what they hold (the first
    STEP_NOTES)."""
    rows = [(col, totals[col]) for col in COUNT_COLUMNS]
    rows += [(f"sync_calls {api}", n) for api, n in totals["sync_calls"].items()] or [("sync_calls", 0)]
    lines = [f"== {path} ({n_events} events)", format_table(pd.DataFrame(rows, columns=["count", "events"]))]
    if "anomalies" in totals:
        lines.append(f"trace anomalies: {describe_anomalies(totals['anomalies'])}")
    if len(steps):
        notes = steps.loc[steps["anomaly"].ne(""), ["step", "anomaly"]] if "anomaly" in steps else steps.iloc[:0]
        steps = steps.drop(columns=[c for c in ("start_us", "anomaly") if c in steps])
        shown = steps.loc[:, (steps != 0).any(axis=0) | steps.columns.isin(["step", "kernels"])]
        lines += [f"\nper step ({len(steps)} step range{'s' * (len(steps) != 1)}; all-zero count columns left out)", format_table(shown)]
        if len(notes):
            named = " | ".join(f"step {int(r.step)}: {r.anomaly}" for r in notes.iloc[:STEP_NOTES].itertuples())
            more = len(notes) - STEP_NOTES
            lines.append(f"steps with anomalies ({len(notes)}; their timing is not comparable): {named}"
                         + (f" | +{more} more" if more > 0 else ""))
    return "\n".join(lines) + "\n"
