"""The one event schema that both trace readers produce, and the error they raise.

`hotloop.profiles.kineto_reader.read_kineto` (torch.profiler / Kineto Chrome-trace JSON) and
`hotloop.profiles.nsight_reader.read_nsight_sqlite` (Nsight Systems SQLite export) each return a pandas DataFrame with
exactly these columns (COLUMNS), in this order, with these dtypes (parse apart from analyse: HTA
`hta/common/trace_parser.py`; the analysers in `profiles/trace_counts.py` read only this schema):

- name (str): kernel / API / op / range name as the profiler wrote it. Nsight: the demangled kernel name, and
  CUDA runtime API names without Nsight's `_vNNNN` version suffix, so that they read as in Kineto.
- kind (category of KINDS): kernel, memcpy, memset (GPU activity); runtime, driver (a CUDA runtime / driver API
  call on a CPU thread); annotation (a range on the GPU timeline: Kineto `gpu_user_annotation`); cpu_op (an ATen
  op); user_annotation (a CPU-side range: `record_function`, `ProfilerStep#N`, an NVTX push/pop or start/end
  range); other (everything else, e.g. Kineto cuda_sync, overhead, python_function).
- start_us, dur_us (float64): start and duration in microseconds, on the source's clock (Kineto `ts`/`dur`;
  Nsight `start`/`end` ns / 1000).
- bytes (float64): bytes copied or set (memcpy, memset); NaN where not applicable.
- copy_kind (str): memcpy direction as Kineto spells it: HtoD, DtoH, DtoD, HtoH, PtoP, HtoA, AtoH, AtoA, AtoD,
  DtoA, Unknown (Nsight also UVM HtoD, UVM DtoH, UVM DtoD); "" for every other kind.
- grid_x, grid_y, grid_z / block_x, block_y, block_z (Int64): kernel grid (blocks) and block (threads)
  dimensions; NA for non-kernels.
- stream, device (Int64): CUDA stream id and device index of GPU activity; NA for CPU rows.
- correlation (Int64): CUPTI correlation id; an API call and the GPU activity it launched share it (all kernels
  of one CUDA graph replay share their cudaGraphLaunch's); NA if absent.
- external_id (Int64): Kineto `External id` (links a cpu_op to the calls it made); NA for Nsight.
- pid, tid (str): process and thread as the source names them. Kineto: `pid`/`tid` verbatim (on GPU rows Kineto
  puts the device and the stream there). Nsight: the OS pid/tid decoded from globalTid/globalPid (tid "" on GPU
  rows).
- domain (str): NVTX domain name of an Nsight NVTX range; "" for the default domain and for all Kineto rows.

Row order: by start_us (stable). There is no per-row "range" column: which step an event belongs to is analysis,
done by `hotloop.profiles.trace_counts.assign_steps`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

KINDS = ("kernel", "memcpy", "memset", "runtime", "driver", "annotation", "cpu_op", "user_annotation", "other")
KIND_DTYPE = pd.CategoricalDtype(list(KINDS))
_INT = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "stream", "device", "correlation", "external_id")
COLUMNS: dict[str, object] = {
    "name": "str",
    "kind": KIND_DTYPE,
    "start_us": "float64",
    "dur_us": "float64",
    "bytes": "float64",
    "copy_kind": "str",
    **{c: "Int64" for c in _INT},
    "pid": "str",
    "tid": "str",
    "domain": "str",
}
_FILL = {"name": "", "copy_kind": "", "pid": "", "tid": "", "domain": "", "bytes": float("nan")}


class TraceReadError(ValueError):
    """A trace file could not be read; the message names the file and the problem.

    Attributes: `path` (the file as given) and `problem` (the message without the path).
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class TraceReadWarning(UserWarning):
    """A trace was read, but leniently (e.g. raw control characters inside JSON strings); the message says how."""


def event_frame(columns: Mapping[str, Sequence | pd.Series]) -> pd.DataFrame:
    """The schema DataFrame from per-column data (lists, arrays or Series of equal length).

    Columns missing from `columns` are filled (NA for Int64, NaN for floats, "" for strings); `start_us` and
    `dur_us` are required. Rows are sorted by start_us (stable). Raises ValueError for a column not in COLUMNS or
    a `kind` value not in KINDS.

    A column given as a Series of its schema dtype (`kind` as a Series of KIND_DTYPE) is taken as it is, without
    a copy (copy-on-write keeps the caller's Series safe), and a frame already in start_us order is not sorted
    again: the big-trace reader (`hotloop.profiles.kineto_reader`) builds its columns that way so that memory
    peaks at one frame, not two.
    """
    unknown = set(columns) - set(COLUMNS)
    if unknown:
        raise ValueError(f"columns not in the trace schema: {sorted(unknown)}")
    n = len(columns["start_us"])
    data = {}
    for col, dtype in COLUMNS.items():
        values = columns[col] if col in columns else [_FILL.get(col)] * n
        if col == "kind" and isinstance(values, pd.Series) and values.dtype == KIND_DTYPE:
            series = values
        else:
            series = pd.Series(values, dtype=dtype if col != "kind" else "str")
            if col == "kind":
                bad = set(series.unique()) - set(KINDS)
                if bad:
                    raise ValueError(f"kind values not in {KINDS}: {sorted(bad)}")
                series = series.astype(KIND_DTYPE)
        data[col] = series.reset_index(drop=True)
    frame = pd.DataFrame(data, copy=False)
    if frame["start_us"].is_monotonic_increasing:
        return frame
    return frame.sort_values("start_us", kind="stable", ignore_index=True)
