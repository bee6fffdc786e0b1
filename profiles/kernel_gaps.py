"""The kernel-gap table of a trace (issue 38, "The learner step's launch gaps"): per step, the kernels in start order,
the GPU idle time between consecutive kernels, the gap on each kernel's own stream, and each kernel's occupancy
(programs / SMs); aggregated over the steps that ran the same kernel sequence.

Input: a trace in the `hotloop.profiles.trace_schema` schema (a Kineto trace read by
`hotloop.profiles.kineto_reader` or `hotloop.profiles.inspect_cmd.read_trace`; an Nsight SQLite export works too).
Steps are those of `hotloop.profiles.trace_counts.step_ranges` (user ranges named `step_range_name`, else
ProfilerStep#N), and a kernel belongs to the step that launched it (`trace_counts.assign_steps`: through its
correlation id, a replayed graph's kernels through their cudaGraphLaunch), as every other per-step count of hotloop.

Definitions (all times microseconds, on the trace's clock):

- The critical path, simply: the kernels of one device ordered by start time (stable: ties keep the trace's order).
  No dependency graph is built: on one GPU, a kernel that starts while no other runs is on the critical path by
  construction, and the time when no kernel runs at all is time the step could only have lost.
- idle_gap_us before kernel i (position k > 0 of its step): max(0, start(i) - max end of every kernel that started
  before it), every kernel of the trace on that device counted (the other streams, the other steps, the kernels
  outside every step): the time when NO kernel ran, an idle GPU. Overlap with another stream closes the gap. The
  first kernel of a step has none (NaN): what lies before it is between the steps, not in them. Over a step the
  idle gaps add up to its span minus the time some kernel ran (the union of the kernel intervals).
- stream_gap_us before kernel i: start(i) - end of the previous kernel on its own stream (same device and stream)
  in the same step, not clipped; NaN for the first kernel of its stream in the step. A launch gap on a stream that
  another stream overlaps shows here and not in idle_gap_us. In a CUDA graph replay the "stream" is the one its
  nodes were captured on, and nodes without a dependency between them may overlap on it: a small negative value
  there is that overlap (seen in the H200 seed-scale trace of tests/data/nsys_seed_scale/, down to -1 us), not a
  reading error.
- programs: grid x * y * z (Kineto `args.grid`; NA when the trace has no grid); occupancy = programs / SMs, with SMs
  a parameter (DEFAULT_SMS = 132, the H100 / H200 SXM; `sm_count()` reads the local GPU's, `sms_from_trace()` the
  count a Kineto trace records in its deviceProperties). It is programs per SM, one wave when >= 1, not the
  resident-block occupancy of the CUDA occupancy calculator: a kernel with occupancy < 1 ("under one wave",
  programs < SMs) leaves SMs empty for its whole duration.
- Only kernels count (kind "kernel"; a CUDA graph's D2D copy that runs as a `memcpy*` kernel included): a gap that
  holds a memcpy or memset event is idle for this table.

Aggregation (`gap_table`): steps are grouped by their kernel sequence, the (name, stream, programs) of every kernel
in start order; each distinct sequence is reported apart ("sequence" 0 is the one most steps ran, then by number of
steps, then by first step), never mixed. Per sequence, one row per position k: name, stream, programs, occupancy,
under_one_wave (1 when programs < SMs), and the medians over its steps of dur_us, idle_gap_us and stream_gap_us;
then a summary row (position NA, name SUMMARY_NAME): span_us (first kernel start to last kernel end), dur_us (the
sum of kernel time), idle_gap_us (the sum of idle gaps), stream_gap_us (the sum of same-stream gaps), each the
median over the steps of the per-step value, and under_one_wave (the number of kernels with programs < SMs).

Damaged steps (`hotloop.profiles.trace_anomalies`: a kernel with no valid time, a launch with no GPU event, ...)
are left out of the table (their sequence or timing cannot be trusted), as are steps that launched no kernel; the
table's `attrs` name both. Memory: the frame of the trace (`read_trace` keeps only the counted kinds), not a
stream: the gap of a kernel needs the kernels before it.
"""

from __future__ import annotations

import gzip
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from hotloop.profiles.input_files import InputFileError, open_input
from hotloop.profiles.trace_anomalies import valid_time
from hotloop.profiles.trace_counts import assign_steps, step_anomalies, step_ranges
from hotloop.profiles.trace_schema import TraceReadError

DEFAULT_SMS = 132
"""Streaming multiprocessors of an H100 / H200 SXM (NVIDIA Hopper whitepaper: 132 SMs on the SXM5 parts)."""
SUMMARY_NAME = "(step total)"
"""The `name` of a sequence's summary row."""
KERNEL_COLUMNS = (
    "step",
    "position",
    "name",
    "device",
    "stream",
    "start_us",
    "dur_us",
    "programs",
    "occupancy",
    "idle_gap_us",
    "stream_gap_us",
    "anomaly",
)
"""Columns of `step_kernels`: one row per kernel inside a step."""
GAP_COLUMNS = (
    "sequence",
    "steps",
    "first_step",
    "position",
    "name",
    "stream",
    "programs",
    "occupancy",
    "under_one_wave",
    "dur_us",
    "idle_gap_us",
    "stream_gap_us",
    "span_us",
)
"""Columns of `gap_table` (module docstring)."""
_NAME_WIDTH = 72
"""Characters of a kernel name in the console table (the CSV keeps the whole name)."""


class KernelGapError(ValueError):
    """The trace has nothing to make a gap table of (no kernels, no such step range, ...); the message says what."""


def sm_count(device=None) -> int:
    """The SMs of CUDA device `device` (index, torch.device or None: the current one) when torch sees a GPU
    (`torch.cuda.get_device_properties(device).multi_processor_count`), else DEFAULT_SMS; DEFAULT_SMS too for a
    device that is not a GPU (a CPU run's table on a machine that has one)."""
    import torch

    if not torch.cuda.is_available() or (
        isinstance(device, (str, torch.device)) and torch.device(device).type != "cuda"
    ):
        return DEFAULT_SMS
    if device is None:
        device = torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def sms_from_trace(path: str | Path, head_bytes: int = 1 << 20) -> int | None:
    """The SM count a Kineto trace records (torch.profiler writes "deviceProperties": [{..., "numSms": N}] before
    its events), read from the first `head_bytes` of its text (plain or gzip); None when it says none, when its
    devices differ, or when the file is not such a trace (the table's reader names the problem then)."""
    try:
        with open_input(path, "trace") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            head = gzip.GzipFile(fileobj=raw).read(head_bytes) if gz else raw.read(head_bytes)
    except (InputFileError, OSError, EOFError):
        return None
    at = head.find(b'"deviceProperties"')
    if at < 0:
        return None
    found = {int(n) for n in re.findall(rb'"numSms"\s*:\s*(\d+)', head[at:])}
    return found.pop() if len(found) == 1 else None


def step_kernels(
    df: pd.DataFrame,
    step_range_name: str = "step",
    domain: str | None = None,
    *,
    sms: int = DEFAULT_SMS,
    device: int | None = None,
    fallback: bool = True,
) -> pd.DataFrame:
    """One row per kernel launched inside a step of trace `df` (schema frame), columns KERNEL_COLUMNS, in (step,
    start) order: step (int), position (0, 1, ... in the step's start order), name, device, stream (Int64),
    start_us, dur_us (float64, us), programs (Int64: grid x*y*z), occupancy (programs / `sms`), idle_gap_us,
    stream_gap_us (us, module docstring), anomaly (str: the step's anomalies, "" when the step is clean).

    Steps: `trace_counts.step_ranges(df, step_range_name, domain)`; with `fallback` False a trace without ranges
    named `step_range_name` is an error instead of falling back to ProfilerStep#N. `device`: the CUDA device
    whose kernels are read; None: the trace's only one. Kernels without a valid time are left out (their step is
    damaged: anomaly says so).

    Raises KernelGapError for: no kernel in the trace, kernels of several devices and no `device`, no step range
    (of that name), no kernel launched inside a step; ValueError for `sms` < 1.
    """
    if isinstance(sms, bool) or not isinstance(sms, (int, np.integer)) or sms < 1:
        raise ValueError(f"sms must be an int >= 1, got {sms!r}")
    kernel = df["kind"].eq("kernel")
    if not kernel.any():
        raise KernelGapError("no kernels in the trace (a CPU-only trace, or one profiled without CUDA activities)")
    devices = sorted(int(d) for d in df.loc[kernel, "device"].dropna().unique())
    if device is None and len(devices) > 1:
        raise KernelGapError(f"kernels of several devices {devices}: the gap table reads one (pass device)")
    if device is not None:
        kernel &= df["device"].eq(device).fillna(False).astype(bool)
        if not kernel.any():
            raise KernelGapError(f"no kernels on device {device} (the trace's kernels are on {devices})")
    ranges_named = df["kind"].eq("user_annotation") & df["name"].eq(step_range_name)
    if domain is not None:
        ranges_named &= df["domain"].eq(domain)
    if not fallback and not ranges_named.any():
        raise KernelGapError(f"no step ranges named {step_range_name!r}" + (f" in domain {domain!r}" if domain else ""))
    ranges = step_ranges(df, step_range_name, domain)
    if ranges.empty:
        names = df.loc[df["kind"].eq("user_annotation"), "name"].value_counts()
        seen = ", ".join(f"{n!r} x{c}" for n, c in names.head(8).items())
        raise KernelGapError(
            f"no step ranges named {step_range_name!r}"
            + (f" in domain {domain!r}" if domain else "")
            + " nor ProfilerStep#N ranges: the table is per step"
            + (f" (the trace's ranges, most frequent first: {seen}; pass one as --step-range)" if seen else "")
        )
    steps = assign_steps(df, ranges)
    anomaly = step_anomalies(df, ranges, steps)["anomaly"].set_axis(ranges["step"].to_numpy())
    timed = kernel & valid_time(df)
    k = df.loc[timed, ["name", "device", "stream", "start_us", "dur_us", "grid_x", "grid_y", "grid_z"]].copy()
    k["step"] = steps[timed]
    k = k.sort_values("start_us", kind="stable")
    start, end = k["start_us"].to_numpy("float64"), (k["start_us"] + k["dur_us"]).to_numpy("float64")
    before = np.concatenate(([-np.inf], np.maximum.accumulate(end)[:-1]))  # max end of the kernels started before
    k["idle_gap_us"] = np.maximum(0.0, start - before)
    k["end_us"] = end
    k = k[k["step"].notna()].copy()
    if k.empty:
        raise KernelGapError(
            f"no kernel was launched inside the {len(ranges)} step range(s) named "
            f"{ranges['range_name'].iloc[0]!r} (the kernels run outside the steps)"
        )
    k["step"] = k["step"].astype("int64")
    k = k.sort_values(["step", "start_us"], kind="stable")
    k["position"] = k.groupby("step").cumcount().astype("int64")
    k.loc[k["position"].eq(0), "idle_gap_us"] = np.nan
    stream_key = [k["step"], k["device"].fillna(-1), k["stream"].fillna(-1)]
    k["stream_gap_us"] = k["start_us"] - k.groupby(stream_key)["end_us"].shift(1)
    grid = k[["grid_x", "grid_y", "grid_z"]]
    k["programs"] = (grid["grid_x"] * grid["grid_y"] * grid["grid_z"]).astype("Int64")
    k["occupancy"] = k["programs"].astype("Float64").astype("float64") / float(sms)
    k["anomaly"] = k["step"].map(anomaly).fillna("").astype(str)
    out = k[list(KERNEL_COLUMNS)].reset_index(drop=True)
    out.attrs = {"sms": int(sms)}
    return out


def gap_table(kernels: pd.DataFrame, sms: int | None = None) -> pd.DataFrame:
    """The aggregated kernel-gap table (columns GAP_COLUMNS; module docstring) of `step_kernels`'s rows: per
    distinct kernel sequence of the undamaged steps, one row per position and a summary row. `sms`: for
    under_one_wave; default the count `step_kernels` was given (its attrs), else DEFAULT_SMS.

    `attrs`: sms, steps (the steps in the table), damaged_steps (left out: {step: anomaly}), sequences.
    Raises KernelGapError when every step with kernels is damaged.
    """
    sms = int(kernels.attrs.get("sms", DEFAULT_SMS) if sms is None else sms)
    damaged = kernels.loc[kernels["anomaly"].ne(""), ["step", "anomaly"]].drop_duplicates("step")
    clean = kernels[kernels["anomaly"].eq("")]
    if clean.empty:
        raise KernelGapError(
            f"every step with kernels is damaged ({len(damaged)} steps; e.g. step {damaged['step'].iloc[0]}: "
            f"{damaged['anomaly'].iloc[0]}): no timing to tabulate"
        )
    key = clean["name"] + "\0" + clean["stream"].astype(str) + "\0" + clean["programs"].astype(str)
    signature = key.groupby(clean["step"]).agg(tuple)
    groups = signature.groupby(signature).apply(lambda s: list(s.index))
    ordered = sorted(groups.tolist(), key=lambda steps: (-len(steps), steps[0]))
    parts = []
    for seq, members in enumerate(ordered):
        rows = clean[clean["step"].isin(members)]
        per_pos = rows.groupby("position", sort=True)
        first = rows[rows["step"].eq(members[0])].set_index("position")
        table = pd.DataFrame(
            {
                "sequence": seq,
                "steps": len(members),
                "first_step": members[0],
                "position": first.index.to_numpy(),
                "name": first["name"].to_numpy(),
                "stream": first["stream"].to_numpy(),
                "programs": first["programs"].to_numpy(),
                "occupancy": first["occupancy"].to_numpy(),
                "under_one_wave": (first["programs"] < sms).astype("Int64").to_numpy(),
                "dur_us": per_pos["dur_us"].median().to_numpy(),
                "idle_gap_us": per_pos["idle_gap_us"].median().to_numpy(),
                "stream_gap_us": per_pos["stream_gap_us"].median().to_numpy(),
                "span_us": np.nan,
            }
        )
        per_step = rows.assign(end_us=rows["start_us"] + rows["dur_us"]).groupby("step")
        span = per_step["end_us"].max() - per_step["start_us"].min()
        summary = {
            "sequence": seq,
            "steps": len(members),
            "first_step": members[0],
            "position": pd.NA,
            "name": SUMMARY_NAME,
            "stream": pd.NA,
            "programs": pd.NA,
            "occupancy": np.nan,
            "under_one_wave": int(table["under_one_wave"].fillna(0).sum()),
            "dur_us": float(per_step["dur_us"].sum().median()),
            "idle_gap_us": float(per_step["idle_gap_us"].sum().median()),
            "stream_gap_us": float(per_step["stream_gap_us"].sum().median()),
            "span_us": float(span.median()),
        }
        parts += [table, pd.DataFrame([summary])]
    out = pd.concat(parts, ignore_index=True)
    out = out.astype(
        {
            "sequence": "int64",
            "steps": "int64",
            "first_step": "int64",
            "position": "Int64",
            "name": "str",
            "stream": "Int64",
            "programs": "Int64",
            "occupancy": "float64",
            "under_one_wave": "Int64",
            "dur_us": "float64",
            "idle_gap_us": "float64",
            "stream_gap_us": "float64",
            "span_us": "float64",
        }
    )[list(GAP_COLUMNS)]
    out.attrs = {
        "sms": int(sms),
        "steps": int(clean["step"].nunique()),
        "damaged_steps": dict(zip(damaged["step"].astype(int), damaged["anomaly"])),
        "sequences": len(ordered),
    }
    return out


def kernel_gap_table(
    df: pd.DataFrame,
    step_range_name: str = "step",
    domain: str | None = None,
    *,
    sms: int = DEFAULT_SMS,
    device: int | None = None,
    fallback: bool = True,
) -> pd.DataFrame:
    """`gap_table(step_kernels(df, ...), sms)`: the kernel-gap table of trace frame `df` (arguments and errors:
    `step_kernels`, `gap_table`)."""
    return gap_table(step_kernels(df, step_range_name, domain, sms=sms, device=device, fallback=fallback))


def summary_line(table: pd.DataFrame) -> str:
    """One line for a gap table's main sequence (0): "<n> kernels/step, idle <x> us/step of a <span> us span
    (kernels <k> us, same-stream gaps <g> us), <u> kernels under one wave (< <sms> SMs)", plus the number of other
    sequences and damaged steps when there are any."""
    main = table[table["sequence"].eq(0)]
    total = main[main["name"].eq(SUMMARY_NAME)].iloc[0]
    n = int(main["position"].notna().sum())
    line = (
        f"{n} kernels/step, idle {total['idle_gap_us']:.1f} us/step of a {total['span_us']:.1f} us span "
        f"(kernels {total['dur_us']:.1f} us, same-stream gaps {total['stream_gap_us']:.1f} us), "
        f"{int(total['under_one_wave'])} kernels under one wave (< {table.attrs.get('sms', DEFAULT_SMS)} SMs)"
    )
    others = int(table["sequence"].max())
    damaged = len(table.attrs.get("damaged_steps", {}))
    if others:
        line += f"; {others} other kernel sequence(s) in {int(total['steps'])} of {table.attrs.get('steps')} steps"
    if damaged:
        line += f"; {damaged} damaged step(s) left out"
    return line


def format_gaps(table: pd.DataFrame, source: str = "") -> str:
    """Console text of a gap table: a header (source, SMs, steps), then per sequence a line (`summary_line` style)
    and its per-position table (floats to 4 significant digits, kernel names cut to _NAME_WIDTH characters)."""
    attrs = table.attrs
    head = f"== kernel gaps{f' of {source}' if source else ''}: {attrs.get('steps')} steps, "
    head += f"{attrs.get('sequences')} kernel sequence(s), occupancy = programs / {attrs.get('sms')} SMs"
    parts = [head]
    damaged = attrs.get("damaged_steps", {})
    if damaged:
        listed = ", ".join(f"{s}" for s in list(damaged)[:10]) + (", ..." if len(damaged) > 10 else "")
        parts.append(f"damaged steps left out ({len(damaged)}; their timing is not comparable): {listed}")
    for seq, rows in table.groupby("sequence", sort=True):
        total = rows[rows["name"].eq(SUMMARY_NAME)].iloc[0]
        kernels = rows[rows["position"].notna()].copy()
        parts.append(
            f"\nsequence {seq}: {int(total['steps'])} step(s) (first step {int(total['first_step'])}), "
            f"{len(kernels)} kernels; per step (medians): span {total['span_us']:.4g} us, kernel time "
            f"{total['dur_us']:.4g} us, idle {total['idle_gap_us']:.4g} us, same-stream gaps "
            f"{total['stream_gap_us']:.4g} us; {int(total['under_one_wave'])} kernels under one wave"
        )
        kernels["name"] = kernels["name"].map(_short)
        shown = kernels[
            ["position", "name", "stream", "programs", "occupancy", "dur_us", "idle_gap_us", "stream_gap_us"]
        ]
        parts.append(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return "\n".join(parts) + "\n"


def _short(name: str, width: int = _NAME_WIDTH) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def inspect_gaps(
    path: str,
    step_range_name: str = "step",
    domain: str | None = None,
    *,
    sms: int | None = None,
    csv: str | Path | None = None,
    read: Callable[[str], pd.DataFrame] | None = None,
    write: Callable[[str], object] | None = None,
    error: Callable[[str], object] | None = None,
) -> int:
    """`hotloop inspect --gaps TRACE`: read `path` (`read`, default `hotloop.profiles.inspect_cmd.read_trace`),
    print `format_gaps` of its kernel-gap table through `write` (default sys.stdout.write;
    `error` sys.stderr.write), and write it as CSV to `csv` when given.
    `sms`: default the trace's own count (`sms_from_trace`), else DEFAULT_SMS. The step ranges fall back to
    ProfilerStep#N only for the default name "step". Returns 0, or 2 with "hotloop inspect: error: PATH: PROBLEM"
    through `error` when the trace cannot be read, has no kernels or no such step range, or the CSV cannot be
    written. A BrokenPipeError of `write` propagates."""
    from hotloop.profiles.inspect_cmd import file_error, read_trace

    read = read or read_trace
    write = write or sys.stdout.write
    error = error or sys.stderr.write
    try:
        count = sms if sms is not None else sms_from_trace(path) or DEFAULT_SMS
        table = kernel_gap_table(read(path), step_range_name, domain, sms=count, fallback=step_range_name == "step")
    except (KernelGapError, TraceReadError, OSError, ValueError, RecursionError) as exc:
        problem = str(exc) if isinstance(exc, KernelGapError) else file_error(exc)
        error(f"hotloop inspect: error: {path}: {problem}\n")
        return 2
    write(format_gaps(table, path))
    if csv is not None:
        try:
            table.to_csv(csv, index=False)
        except OSError as exc:
            error(f"hotloop inspect: error: {csv}: cannot write the CSV: {exc.strerror or exc}\n")
            return 2
        write(f"\nkernel-gap table written to {csv}\n")
    return 0
