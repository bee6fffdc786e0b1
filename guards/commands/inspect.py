"""`hotloop inspect FILE... [--json] [--step-range NAME] [--domain NAME]`: the guard counts of trace files, as
hotloop.profiles.inspect_cmd reads and counts them (its docstring: the formats, the anomalies, the memory).

A FILE that is a folder stands for the rank traces of a data-parallel run under it (trace_rank<R>.json.gz of
`hotloop train --nproc N`, or a `hotloop gate --nproc N` folder's trace.json.gz beside rank<R>/trace.json.gz;
hotloop.profiles.rank_traces): each is reported as a file, then a "ranks of FOLDER" table gives per count the
value of every rank and the cross-rank spread (min, max, max - min, max / median); with --json it is under
"ranks": {FOLDER: [{"count": ..., "rank0": ..., ..., "spread": ...}, ...]}. A folder without rank traces is that
folder's error.

One bad file does not lose the others: any error while reading or counting one file (TraceReadError, OSError,
a RecursionError or ValueError of a parser, ...) is that file's error. Each goes to stderr as
"hotloop inspect: error: FILE: PROBLEM"; the other files are still reported, and with --json stdout stays one
valid JSON document: {"files": {FILE: {"totals": ..., "steps": ...}} for the files read, plus "errors": {FILE:
PROBLEM} when any could not be.

`--gaps [--csv PATH] [--sms N] TRACE` prints the kernel-gap table of one trace instead of its counts
(hotloop.profiles.kernel_gaps.inspect_gaps: per step position the kernel, programs / SMs, the GPU idle gap and the
same-stream gap before it), and writes it as CSV with --csv; no kernels, no such step range, a file that cannot be
read: its error, exit 2.

Exit codes: 0 every file read; 2 any file could not be; 141 stdout was closed early (e.g. `hotloop inspect ... |
head`): the rest of the output is dropped quietly, without a traceback, and the exit code is the one a shell
reports for a process killed by SIGPIPE (128 + 13), as `cat` or `yes` give there, so a pipeline under
`set -o pipefail` still sees that the output was cut. (Python ignores SIGPIPE and raises BrokenPipeError instead;
the handling is the one of the Python docs, "Note on SIGPIPE" in the signal module: point stdout at devnull so
that the interpreter's final flush cannot fail again.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hotloop.guards.commands.errors import BROKEN_PIPE
from hotloop.profiles.epoch_table import format_table
from hotloop.profiles.inspect_cmd import (
    StepRecords,
    count_trace,
    file_error,
    format_file_parts,
    stdout_to_devnull,
    step_records,
    write_json,
)
from hotloop.profiles.kernel_gaps import inspect_gaps
from hotloop.profiles.rank_traces import find_rank_traces, rank_spread

UNREADABLE_INPUT = 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `inspect` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "inspect",
        help="count kernels, syncs, memcpys, memsets and graph launches in trace files",
        description="Read Kineto JSON traces (.json, .json.gz) and Nsight Systems SQLite exports and print the "
        "guard counts per file, and per step when the trace has step ranges.",
        epilog="exit codes: 0 all files read, 2 a file could not be read (named on stderr; the others are still "
        "reported), 141 stdout closed early (e.g. piped into head)",
    )
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="Kineto trace JSON (plain or gzipped) or nsys .sqlite; or a folder of rank traces "
        "(trace_rank<R>.json.gz, or a gate --nproc folder: per-rank counts and their spread)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"files": {FILE: {"totals": {...}, "steps": [...] or null}}} instead of tables, '
        'plus "errors": {FILE: PROBLEM} when a file could not be read',
    )
    p.add_argument(
        "--step-range",
        default="step",
        metavar="NAME",
        help="name of the step ranges (record_function / NVTX); default 'step', else ProfilerStep#N",
    )
    p.add_argument("--domain", metavar="NAME", help="NVTX domain the step ranges must be in (default: any)")
    p.add_argument(
        "--gaps",
        action="store_true",
        help="instead of the counts, the kernel-gap table of ONE trace (hotloop.profiles.kernel_gaps): per step "
        "position the kernel, its stream, programs / SMs, and the median duration, GPU idle gap and same-stream "
        "gap before it; a summary row per kernel sequence",
    )
    p.add_argument("--csv", metavar="PATH", help="with --gaps: also write the table as CSV to PATH")
    p.add_argument(
        "--sms", type=int, metavar="N", help="with --gaps: SMs for the occupancy (default: the trace's, else 132)"
    )
    return p


def run(args: argparse.Namespace) -> int:
    """Run `hotloop inspect` for parsed `args` (files, json, step_range, domain); returns the exit code: 0, or
    UNREADABLE_INPUT (2) when a file could not be read or counted, or BROKEN_PIPE (141) when stdout was closed
    early (then stdout is pointed at devnull, so nothing more is written and no traceback is printed).
    Module docstring: what is printed where."""
    try:
        code = _inspect_gaps(args) if args.gaps or args.csv or args.sms is not None else _inspect_files(args)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()
        return BROKEN_PIPE
    return code


def _inspect_gaps(args: argparse.Namespace) -> int:
    """`--gaps [--csv PATH] [--sms N] TRACE`: hotloop.profiles.kernel_gaps.inspect_gaps of the one file; 2 for
    usage errors (several files, --csv or --sms without --gaps, --gaps with --json, --sms < 1)."""
    problem = (
        "--csv and --sms need --gaps"
        if not args.gaps
        else "--gaps prints a table (--csv PATH writes it), not --json"
        if args.json
        else "--gaps reads one trace"
        if len(args.files) != 1
        else "--sms must be >= 1"
        if args.sms is not None and args.sms < 1
        else ""
    )
    if problem:
        print(f"hotloop inspect: error: {problem}", file=sys.stderr)
        return UNREADABLE_INPUT
    return inspect_gaps(args.files[0], args.step_range, args.domain, sms=args.sms, csv=args.csv)


def _inspect_files(args: argparse.Namespace) -> int:
    """Count and print each of args.files (module docstring); returns 0, or UNREADABLE_INPUT when any could not be
    read. A BrokenPipeError of stdout propagates."""
    report: dict[str, dict] = {}
    errors: dict[str, str] = {}
    ranks: dict[str, list[dict]] = {}
    for path in args.files:
        if not Path(path).is_dir():
            _inspect_one(path, args, report, errors)
            continue
        try:
            traces = find_rank_traces(path)
        except ValueError as exc:
            errors[path] = str(exc)  # it names the folder
            print(f"hotloop inspect: error: {errors[path]}", file=sys.stderr)
            continue
        totals = {
            rank: t for rank, file in traces.items() if (t := _inspect_one(str(file), args, report, errors)) is not None
        }
        if not totals:
            continue
        table = rank_spread(totals)
        ranks[path] = step_records(table)
        if not args.json:
            sys.stdout.write(
                f"== ranks of {path} ({len(totals)} of {len(traces)} rank traces read; spread = max - "
                f"min over the ranks)\n{format_table(table)}\n\n"
            )
    if args.json:
        write_json(
            {"files": report} | ({"ranks": ranks} if ranks else {}) | ({"errors": errors} if errors else {}),
            sys.stdout.write,
        )
        sys.stdout.write("\n")
    return UNREADABLE_INPUT if errors else 0


def _inspect_one(path: str, args: argparse.Namespace, report: dict[str, dict], errors: dict[str, str]) -> dict | None:
    """Count and (without --json) print one trace file into `report`, or its problem into `errors`; returns its
    totals (None when it could not be read). A BrokenPipeError of stdout propagates."""
    try:
        counts = count_trace(path, args.step_range, args.domain)
        steps, totals = counts.steps, counts.totals
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 -- any failure of one file is that file's error (module docstring)
        errors[path] = file_error(exc)
        print(f"hotloop inspect: error: {path}: {errors[path]}", file=sys.stderr)
        return None
    if not len(steps) and (args.step_range != "step" or args.domain):
        print(
            f"hotloop inspect: note: {path}: no step ranges named {args.step_range!r}"
            + (f" in domain {args.domain!r}" if args.domain else "")
            + ": totals only",
            file=sys.stderr,
        )
    report[path] = {"totals": totals, "steps": StepRecords(steps) if len(steps) else None}
    if not args.json:
        for part in format_file_parts(path, counts.events, totals, steps):
            sys.stdout.write(part)
        sys.stdout.write("\n")
    return totals
