"""What `hotloop inspect FILE...` reads and counts (the command: hotloop.guards.commands.inspect): the guard counts
of trace files, and how they are printed.

Each FILE is a Kineto (torch.profiler) JSON trace, plain or gzipped, or an Nsight Systems SQLite export; the
format is told by the file's first bytes (SQLite's header, else JSON). Prints, per file, the whole-trace counts
of `hotloop.profiles.trace_counts.count_totals`, a "trace anomalies:" line (`hotloop.profiles.trace_anomalies`:
events with ts 0, negative durations, unmatched correlations, ...; counted, not absorbed) and, when the trace has
step ranges, the per-step table of `count_per_step` with the steps that hold anomalies named under it.

Memory does not follow the file: a Kineto trace is read as a stream of frames (`iter_kineto`) and counted frame
by frame (`hotloop.profiles.trace_stream.count_frames`: the same totals, steps and anomalies as the in-memory
functions, keeping ~25 bytes per CUDA call and ~10 per GPU event), so a 5 GB trace peaks at a few hundred MB
(results/cpu/trace_read_bench/README.md, "hotloop inspect"). An Nsight SQLite export is read whole and counted
the same way, as one frame.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from hotloop.profiles.epoch_table import format_table
from hotloop.profiles.input_files import InputFileError, open_input
from hotloop.profiles.kineto_reader import iter_kineto, read_kineto
from hotloop.profiles.nsight_reader import SQLITE_MAGIC, read_nsight_sqlite
from hotloop.profiles.trace_anomalies import describe_anomalies
from hotloop.profiles.trace_counts import COUNT_COLUMNS
from hotloop.profiles.trace_schema import TraceReadError
from hotloop.profiles.trace_stream import TraceCounts, count_frames

STEP_NOTES = 10
"""How many steps with anomalies the text form names under the per-step table."""
TABLE_CHUNK = 8192
"""Rows of the per-step table formatted at a time (`table_parts`)."""

COUNTED_KINDS = ("kernel", "memcpy", "memset", "runtime", "driver", "annotation", "user_annotation")
"""The event kinds the counts read (GPU activity, CUDA API calls, ranges). A Kineto trace is read keeping only
these: its cpu_op and python_function events, most of a real training trace, are dropped while it is parsed, so
memory follows the GPU and CUDA-API events, not the file (results/cpu/trace_read_bench/README.md)."""


def _is_sqlite(path: str | Path) -> bool:
    """Whether `path` starts with SQLite's header; TraceReadError naming the file when it cannot be read, is not a
    regular file (a FIFO, a device, a folder: refused without reading or waiting for a FIFO's writer,
    hotloop.profiles.input_files.open_input), or is named like an SQLite export (.sqlite, .db) without the
    header."""
    try:
        with open_input(path, "trace") as f:
            is_sqlite = f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except InputFileError as exc:
        raise TraceReadError(path, exc.problem) from None
    except OSError as exc:
        raise TraceReadError(path, f"cannot read: {exc.strerror or exc}") from None
    if not is_sqlite and Path(path).suffix in (".sqlite", ".db"):
        raise TraceReadError(
            path,
            "named like an Nsight SQLite export but has no SQLite header (empty or not a "
            "database); export one with `nsys export --type sqlite`",
        )
    return is_sqlite


def _nsight_counted(path: str | Path) -> pd.DataFrame:
    df = read_nsight_sqlite(path)
    return df[df["kind"].isin(COUNTED_KINDS)].reset_index(drop=True)


def read_trace(path: str | Path) -> pd.DataFrame:
    """A trace file in the `hotloop.profiles.trace_schema` schema, COUNTED_KINDS only: Nsight SQLite by its header,
    else Kineto JSON (streamed, `read_kineto(kinds=COUNTED_KINDS)`). The whole frame: `hotloop inspect` itself
    counts `trace_frames` instead.

    Raises TraceReadError naming the file when it cannot be read.
    """
    return _nsight_counted(path) if _is_sqlite(path) else read_kineto(path, kinds=COUNTED_KINDS)


def trace_frames(path: str | Path) -> Iterator[pd.DataFrame]:
    """The COUNTED_KINDS events of a trace file as schema frames in file order: Kineto JSON (plain or gzip) as
    `iter_kineto(path, kinds=COUNTED_KINDS)` frames (memory bounded whatever the size), an Nsight SQLite export
    (told by its header) as one frame. Raises TraceReadError naming the file, when iterated, where `read_trace`
    would raise it."""
    if _is_sqlite(path):
        yield _nsight_counted(path)
    else:
        yield from iter_kineto(path, kinds=COUNTED_KINDS)


def count_trace(path: str | Path, step_range_name: str = "step", domain: str | None = None) -> TraceCounts:
    """What `hotloop inspect` reports for one file: `count_frames(trace_frames(path), ...)` (events counted, the
    totals of `trace_counts.count_totals` and the `trace_counts.count_per_step` table, in bounded memory)."""
    return count_frames(trace_frames(path), step_range_name, domain)


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


def stdout_to_devnull() -> None:
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
    return [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in steps.to_dict(orient="records")
    ]


class StepRecords:
    """A per-step table (`count_per_step`) as the JSON list of `step_records`, made `chunk` rows at a time while
    `write_json` writes it: the list of dicts of a 100k-step trace would take more memory than its counting."""

    def __init__(self, steps: pd.DataFrame, chunk: int = 2048) -> None:
        self.steps, self.chunk = steps, chunk

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[dict]:
        for i in range(0, len(self.steps), self.chunk):
            yield from step_records(self.steps.iloc[i : i + self.chunk])


def write_json(obj, write, level: int = 0) -> None:
    """Write `obj` as `json.dumps(obj, indent=2)` would print it, through `write` (str -> None), piece by piece:
    dicts that hold dicts or StepRecords are walked, a StepRecords is written record by record, everything else
    is one `json.dumps(..., indent=2)` indented to its place (JSON text has no raw newline inside a value)."""
    pad = "\n" + "  " * level
    if isinstance(obj, dict) and obj and any(isinstance(v, (dict, StepRecords)) for v in obj.values()):
        write("{")
        for i, (key, value) in enumerate(obj.items()):
            write(("," if i else "") + pad + "  " + json.dumps(key) + ": ")
            write_json(value, write, level + 1)
        write(pad + "}")
    elif isinstance(obj, StepRecords):
        if not len(obj):
            write("[]")
            return
        sep = "[" + pad + "  "
        for record in obj:
            write(sep + json.dumps(record, indent=2).replace("\n", pad + "  "))
            sep = "," + pad + "  "
        write(pad + "]")
    else:
        write(json.dumps(obj, indent=2).replace("\n", pad))


def format_file(path: str, n_events: int, totals: dict, steps: pd.DataFrame) -> str:
    """The text `hotloop inspect` prints for one trace: a header, the whole-file counts table (`totals` as
    hotloop.profiles.trace_counts.count_totals returns it), a "trace anomalies: ..." line (when `totals` has
    "anomalies": `hotloop.profiles.trace_anomalies.describe_anomalies`) and, when `steps` (a `count_per_step`
    table) has rows, the per-step counts table, then the steps holding anomalies with what they hold (the first
    STEP_NOTES). `format_file_parts` gives the same text in pieces."""
    return "".join(format_file_parts(path, n_events, totals, steps))


def format_file_parts(
    path: str, n_events: int, totals: dict, steps: pd.DataFrame, chunk: int = TABLE_CHUNK
) -> Iterator[str]:
    """`format_file`'s text in pieces (joined, they are it): the per-step table `chunk` rows at a time
    (`table_parts`), so that printing the table of a 100k-step trace never holds pandas' formatting of all of it."""
    rows = [(col, totals[col]) for col in COUNT_COLUMNS]
    rows += [(f"sync_calls {api}", n) for api, n in totals["sync_calls"].items()] or [("sync_calls", 0)]
    lines = [f"== {path} ({n_events} events counted)", format_table(pd.DataFrame(rows, columns=["count", "events"]))]
    if "anomalies" in totals:
        lines.append(f"trace anomalies: {describe_anomalies(totals['anomalies'])}")
    if not len(steps):
        yield "\n".join(lines) + "\n"
        return
    notes = steps.loc[steps["anomaly"].ne(""), ["step", "anomaly"]] if "anomaly" in steps else steps.iloc[:0]
    steps = steps.drop(columns=[c for c in ("start_us", "anomaly") if c in steps])
    shown = steps.loc[:, (steps != 0).any(axis=0) | steps.columns.isin(["step", "kernels"])]
    lines.append(f"\nper step ({len(steps)} step range{'s' * (len(steps) != 1)}; all-zero count columns left out)")
    sep = "\n".join(lines) + "\n"
    for part in table_parts(shown, chunk):
        yield sep + part
        sep = "\n"
    if len(notes):
        named = " | ".join(f"step {int(r.step)}: {r.anomaly}" for r in notes.iloc[:STEP_NOTES].itertuples())
        more = len(notes) - STEP_NOTES
        yield (
            f"\nsteps with anomalies ({len(notes)}; their timing is not comparable): {named}"
            + (f" | +{more} more" if more > 0 else "")
        )
    yield "\n"


def _float_text(v: float) -> str:
    return f"{v:.4g}"  # as hotloop.profiles.epoch_table.format_table writes floats


def table_parts(df: pd.DataFrame, chunk: int = TABLE_CHUNK) -> Iterator[str]:
    """`format_table(df)` in pieces of `chunk` rows; joined with "\n" they are its text (tests/profiles/
    test_trace_stream.py checks it). Each column gets its width over the whole table first (the widest of its
    header and values, each chunk formatted column by column), then every chunk is formatted with those widths
    (`col_space`), the header with the first only."""
    if len(df) <= chunk:
        yield format_table(df)
        return
    df = df.dropna(axis=1, how="all")
    widths = dict.fromkeys(df.columns, 0)
    for i in range(0, len(df), chunk):
        part = df.iloc[i : i + chunk]
        for col in df.columns:
            text = part[[col]].to_string(index=False, float_format=_float_text)
            widths[col] = max(widths[col], max(map(len, text.split("\n"))))
    for i in range(0, len(df), chunk):
        yield df.iloc[i : i + chunk].to_string(index=False, header=i == 0, float_format=_float_text, col_space=widths)
