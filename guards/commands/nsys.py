"""`hotloop nsys [--out DIR] [--step-range NAME] [--domain NAME] -- CMD...`: profile a command under Nsight Systems
(hotloop.profiles.nsys_cmd: which nsys, the recording and its export) and print the guard counts of the recording,
as `hotloop inspect` prints them, plus a table of NVTX ranges.

Output folder (--out, default runs/nsys-<UTC timestamp>/ under the working directory; refused unless new or
empty): report.sqlite, counts.json (`{"files": {"<folder>/report.sqlite": {"totals": {...}, "steps": [...] or
null}}}`, the keys of `hotloop inspect --json`) and ranges.csv (`range_gpu_time`).

Exit codes: 0 profiled, exported and counted; 1 the profiled command exited non-zero (the report, if nsys wrote
one, is still exported, counted and written) or nsys / its importer / the export failed; 2 bad usage or input: no
CMD, a non-empty --out, no nsys found, or an export without CUDA kernels (e.g. CMD launched none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from hotloop.profiles import nsys_cmd
from hotloop.profiles.docs import doc_ref
from hotloop.profiles.epoch_table import format_table, new_run_dir
from hotloop.profiles.inspect_cmd import format_file, read_trace, step_records
from hotloop.profiles.nsys_cmd import ProfileFailed, find_nsys, profile, range_gpu_time
from hotloop.profiles.trace_counts import count_per_step, count_totals
from hotloop.profiles.trace_schema import TraceReadError

COMMAND_FAILED, USAGE_ERROR = 1, 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `nsys` subcommand to the `hotloop` parser's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "nsys",
        help="profile a command under Nsight Systems; print its guard counts and NVTX-range GPU time",
        usage="hotloop nsys [-h] [--out DIR] [--step-range NAME] [--domain NAME] -- CMD...",
        description="Run CMD under `nsys profile -t cuda,nvtx` (nsys from PATH, else the nsys bundled with Nsight "
        f"Compute: {doc_ref('nsight.md')}), export the report to SQLite, print the whole-trace and "
        "per-step counts as `hotloop inspect` does and the GPU kernel time per NVTX range; write "
        "report.sqlite, counts.json (the keys of `hotloop inspect --json`) and ranges.csv into --out.",
        epilog="exit codes: 0 ok, 1 the profiled command (or nsys) failed (whatever was recorded is still "
        "reported), 2 bad usage or input (no CMD, non-empty --out, no nsys, no CUDA kernels recorded)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="output folder (default: runs/nsys-<UTC timestamp>/); must be new or empty",
    )
    p.add_argument(
        "--step-range",
        default="step",
        metavar="NAME",
        help="name of the NVTX step ranges (default 'step', else ProfilerStep#N)",
    )
    p.add_argument(
        "--domain",
        default="hotloop",
        metavar="NAME",
        help="NVTX domain of the step ranges (default 'hotloop', profiles/ranges.py's; '' is the "
        "default domain, which torch.cuda.nvtx uses)",
    )
    p.add_argument("cmd", nargs="*", metavar="CMD", help="the command to profile, after `--`")
    return p


def run(args: argparse.Namespace) -> int:
    """Run `hotloop nsys` for parsed `args` (cmd, out, step_range, domain); returns the exit code (module
    docstring). Errors go to stderr as `hotloop nsys: error: ...`; nothing is written before the usage checks
    pass. The nsys found: hotloop.profiles.nsys_cmd.find_nsys, searching its NSIGHT_COMPUTE_ROOTS as they are at
    call time; the importer's libraries: its `libs_dir()`."""

    def error(message: str, code: int) -> int:
        print(f"hotloop nsys: error: {message}", file=sys.stderr)
        return code

    if not args.cmd:
        return error(
            "no command to profile; usage: hotloop nsys [--out DIR] [--step-range NAME] [--domain NAME] -- CMD...",
            USAGE_ERROR,
        )
    if args.out is not None and args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        return error(
            f"--out {args.out} exists and is not an empty folder; choose a new folder (nothing there is overwritten)",
            USAGE_ERROR,
        )
    try:
        route = find_nsys(None, nsys_cmd.NSIGHT_COMPUTE_ROOTS)
    except ValueError as exc:
        return error(str(exc), USAGE_ERROR)
    try:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
        out = args.out or new_run_dir(prefix="nsys-")
    except OSError as exc:
        return error(f"cannot create the output folder {args.out or 'runs/'}: {exc.strerror or exc}", USAGE_ERROR)
    print(f"hotloop nsys: {route.describe()}; output folder {out}", file=sys.stderr)
    code = 0
    try:
        sqlite = profile(list(args.cmd), out, route)
    except ProfileFailed as exc:
        print(f"hotloop nsys: error: {exc}" + ("; reporting what was recorded" if exc.sqlite else ""), file=sys.stderr)
        if exc.sqlite is None:
            return COMMAND_FAILED
        sqlite, code = exc.sqlite, COMMAND_FAILED
    try:
        df = read_trace(sqlite)
    except TraceReadError as exc:
        return error(f"{exc} (the report is kept in {out})", code or USAGE_ERROR)
    steps = count_per_step(df, args.step_range, args.domain)
    if not len(steps):
        _note_no_steps(df, sqlite, args.step_range, args.domain)
    key = str(sqlite)
    counts = {"totals": count_totals(df), "steps": step_records(steps) if len(steps) else None}
    print(format_file(key, len(df), counts["totals"], steps))
    table = range_gpu_time(df)
    print(
        f"NVTX ranges ({len(table)}; GPU time = kernels launched inside the range)\n"
        + (format_table(table) if len(table) else "(none)")
    )
    (out / "counts.json").write_text(json.dumps({"files": {key: counts}}, indent=2) + "\n")
    table.to_csv(out / "ranges.csv", index=False)
    print(f"\nnsys folder: {out}")
    return code


def _note_no_steps(df: pd.DataFrame, path: Path, name: str, domain: str | None) -> None:
    """stderr note as `hotloop inspect` gives it, plus the domains where ranges of that name do exist."""
    named = df[df["kind"].eq("user_annotation") & df["name"].eq(name)]
    elsewhere = sorted(set(named["domain"]))
    hint = f" (there are {name!r} ranges in domain(s) {elsewhere}: pass --domain)" if elsewhere else ""
    print(
        f"hotloop nsys: note: {path}: no step ranges named {name!r}"
        + (f" in domain {domain!r}" if domain is not None else "")
        + f": totals only{hint}",
        file=sys.stderr,
    )
