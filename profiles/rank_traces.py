"""Kineto traces of a data-parallel run, one per rank: their names and metadata, finding them in a folder, and the
cross-rank spread of their counts (`hotloop inspect FOLDER`).

Each rank writes trace_rank<R>.json.gz (`rank_trace_name`) with {"rank", "world_size", "backend"} in the trace's
"distributedInfo" metadata (the key Kineto itself writes when torch.distributed is initialized; set here so that it
is there whatever the profiler wrote). `hotloop inspect` told a folder finds every trace_rank<R>.json(.gz) under it
(`find_rank_traces`), counts each and prints per count the value of every rank and their spread
(`rank_spread`: min, max, max - min, max / median): ranks running the same step should count the same kernels,
syncs and graph launches, so a spread above 0 names the count that differs between ranks.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

RANK_TRACE = re.compile(r"^trace_rank(\d+)\.json(\.gz)?$")
"""File names of rank traces: trace_rank<R>.json, plain or gzipped."""


def rank_trace_name(rank: int) -> str:
    """The file name of rank `rank`'s trace: trace_rank<R>.json.gz. ValueError for a rank that is not an int >= 0."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    return f"trace_rank{rank}.json.gz"


def write_rank_trace(prof, path: str | os.PathLike, rank: int, world_size: int, backend: str) -> Path:
    """Export the finished torch.profiler.profile `prof` as a gzipped Kineto JSON trace at `path` (written to a
    temporary file in the same folder, then renamed), with "distributedInfo" = {"backend", "rank", "world_size"}
    in its metadata; returns the path. ValueError for a rank outside [0, world_size)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
        trace["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world_size}
        packed = Path(tmp) / path.name
        with gzip.open(packed, "wt") as f:
            json.dump(trace, f)
        os.replace(packed, path)
    return path


GATE_RANK_FOLDER = re.compile(r"^rank(\d+)$")
"""A rank's folder of a data-parallel run (hotloop.guards.data_parallel.rank_folder: rank R > 0 in <run>/rank<R>/)."""


def _gate_rank_traces(folder: Path) -> dict[int, Path]:
    """{rank: file} of a `hotloop gate --nproc N` run folder: each rank's gate keeps its guarded window's trace as
    trace.json(.gz) in its own folder (rank 0: the run folder, rank R: rank<R>/); {} when there is no rank<R>/
    folder holding one."""

    def trace_in(d: Path) -> Path | None:
        return next((d / n for n in ("trace.json.gz", "trace.json") if (d / n).is_file()), None)

    found = {
        int(m.group(1)): t
        for d in sorted(folder.iterdir())
        if d.is_dir() and (m := GATE_RANK_FOLDER.match(d.name)) and (t := trace_in(d)) is not None
    }
    if found and (zero := trace_in(folder)) is not None:
        found[0] = zero
    return found


def find_rank_traces(folder: str | os.PathLike) -> dict[int, Path]:
    """{rank: file} of the rank traces (RANK_TRACE) anywhere under `folder`, by rank; without any, the traces of a
    `hotloop gate --nproc N` run folder (`_gate_rank_traces`). ValueError naming the folder when it holds none, or
    the files when two hold the same rank."""
    found: dict[int, Path] = {}
    for path in sorted(Path(folder).rglob("trace_rank*")):
        m = RANK_TRACE.match(path.name)
        if m is None or not path.is_file():
            continue
        rank = int(m.group(1))
        if rank in found:
            raise ValueError(f"{folder}: two traces of rank {rank}: {found[rank]} and {path}")
        found[rank] = path
    if not found:
        found = _gate_rank_traces(Path(folder))
    if not found:
        raise ValueError(
            f"{folder}: no rank traces (trace_rank<R>.json or .json.gz, or a gate --nproc folder's trace.json.gz "
            "beside rank<R>/trace.json.gz) in it"
        )
    return dict(sorted(found.items()))


def rank_spread(totals: Mapping[int, Mapping[str, object]]) -> pd.DataFrame:
    """The cross-rank table of `totals` ({rank: a trace's count_totals}, hotloop.profiles.trace_counts): one row
    per numeric count (sync_calls flattened to "sync_calls <api>"), a column rank<R> per rank, then min, max,
    spread (max - min) and max_over_median (max / median; NaN where the median is 0). ValueError for no ranks."""
    if not totals:
        raise ValueError("rank_spread: no ranks")
    flat: dict[int, dict[str, float]] = {}
    for rank, counts in totals.items():
        row = {k: float(v) for k, v in counts.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for api, n in dict(counts.get("sync_calls", {})).items():
            row[f"sync_calls {api}"] = float(n)
        flat[rank] = row
    table = pd.DataFrame({f"rank{r}": pd.Series(row) for r, row in sorted(flat.items())}).fillna(0.0)
    ranks = table.columns
    median = table[ranks].median(axis=1)
    table["min"], table["max"] = table[ranks].min(axis=1), table[ranks].max(axis=1)
    table["spread"] = table["max"] - table["min"]
    table["max_over_median"] = (table["max"] / median).where(median != 0)
    return table.rename_axis("count").reset_index()


# ---------------------------------------------------------------------------------- a rank's guarded window


COLLECTIVE_OP = re.compile(r"^(?:c10d|_c10d_functional|c10d_functional)::([A-Za-z_]+?)_?$")
"""A collective or point-to-point call as the CPU side of a Kineto trace shows it: the dispatcher op
`c10d::allreduce_`, `c10d::broadcast_`, `c10d::barrier`, `c10d::send`, ... (torch.distributed's functions), or a
functional collective `_c10d_functional::all_reduce` (DTensor, torch.compile); group 1 is the op."""
NCCL_KERNEL = re.compile(r"^(?:nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)|.*oneRankReduce)")
"""An NCCL kernel on the GPU timeline (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`, `ncclKernel_Broadcast_...`): how a
collective replayed inside a CUDA graph shows up, with no CPU-side c10d op in that step. On a one-rank communicator
NCCL runs a reducing collective whose op needs arithmetic (ReduceOp.AVG: PreMulSum) as its own kernel instead,
`oneRankReduce<FuncPreMulSum<float>>` (NVIDIA/nccl src/onerank.cu; its name in the trace is the mangled
`__nv_static_..._onerank_cu_..._oneRankReduceI13FuncPreMulSumIfEEEvPvS3_mmb`, read on an H100 with torch 2.11's
NCCL); on one rank all-reduce, reduce and reduce-scatter are that same scaled copy, so it reads as an all-reduce
(`collective_kind`). A SUM all-reduce on one rank launches no kernel at all (in place, nothing to do)."""
BACKEND_SPAN = re.compile(r"^(?:gloo|nccl):[a-z_]+$")
"""The backend's own range of a collective (`gloo:all_reduce`, `nccl:all_reduce`): on gloo it runs on a worker thread
from the call until every rank has taken part, so it holds the time this rank waited for the others."""
HOST_READ_OP = "aten::_local_scalar_dense"
"""The ATen op every host read of one tensor value goes through (`.item()`, `float(t)`, `bool(t)`, `int(t)`): on a
CUDA tensor a copy to the host and a stream sync (hotloop.guards.sync_hooks), on a CPU tensor a read of host
memory."""
CPU_READ_ALLOWANCE = ("env_step", "Optimizer.step#")
"""Ranges (exact names, or prefixes ending in '#') whose host reads a CPU rank's loop makes by design and
`step_collectives` does not count as unexpected: the CPU env takes host actions in `env_step` (one read per env step),
and torch.optim's Adam reads its host step counter inside `Optimizer.step#Adam.step` (one per parameter; on any
device that counter lives on the host, so it is never a device sync)."""


def collective_kind(name: str) -> str | None:
    """The collective a trace event name is ("allreduce", "broadcast", "barrier", "allgather", "send", ...: lower
    case, underscores dropped, so that `c10d::allreduce_`, `_c10d_functional::all_reduce` and
    `ncclDevKernel_AllReduce_Sum_f32_RING_LL` all read "allreduce", as does NCCL's one-rank reduce kernel, see
    NCCL_KERNEL); None for any other name."""
    m = COLLECTIVE_OP.match(name)
    if m is None:
        k = NCCL_KERNEL.match(name)
        if k is None:
            return None
        return k.group("op").lower() if k.group("op") else "allreduce"  # no op: NCCL's one-rank reduce
    kind = m.group(1).lower().replace("_", "")
    return kind[:-4] if kind.endswith("base") else kind  # _allgather_base_, _reduce_scatter_base_


def _allowed_read(names: list[str]) -> bool:
    """Whether a host read inside the ranges `names` is one of CPU_READ_ALLOWANCE's."""
    for allowed in CPU_READ_ALLOWANCE:
        for n in names:
            if (allowed.endswith("#") and n.startswith(allowed)) or n == allowed:
                return True
    return False


def step_collectives(events: pd.DataFrame, step_range: str = "step") -> pd.DataFrame:
    """Per step of a guarded window's trace (`events`: hotloop.profiles.trace_schema's frame, e.g. read_kineto of the
        gate's trace.json.gz; steps = the `step_range` ranges in time order, numbered from 0), one row: step, step_us
        (the range's wall time), wait_us (the time inside the backend's collective spans, BACKEND_SPAN, clipped to the
        step: time this rank waited for the others or moved data), busy_us (step_us - wait_us: the rank's own work),
        collectives (int: the collective calls of the step, every kind), allreduce (int: of them all-reduces), other
        (str: the other kinds, "broadcast x1, barrier x2"; "" when none) and host_reads (int: HOST_READ_OP events in
        the step outside CPU_READ_ALLOWANCE's ranges) with read_in (str: the innermost range around each of them,
    "step x1": a read in the loop body outside every phase range; "" when none).

        A collective is counted once per call: per kind, the larger of its CPU-side ops in the step (COLLECTIVE_OP, on
        any thread, started inside the step range) and its NCCL kernels launched from the step (NCCL_KERNEL, placed
        by their launch's correlation id), so an eager NCCL call (one op, one kernel) counts 1, and so does one
        replayed in a CUDA graph (no op, one kernel). Columns in this order; an empty frame when there is no step
        range. ValueError when events lacks a schema column."""
    need = {"name", "kind", "start_us", "dur_us", "correlation", "tid"}
    if not need <= set(events.columns):
        raise ValueError(f"step_collectives: events lack {sorted(need - set(events.columns))}")
    cols = ["step", "step_us", "wait_us", "busy_us", "collectives", "allreduce", "other", "host_reads", "read_in"]
    steps = events[events["name"].eq(step_range) & events["kind"].astype(str).eq("user_annotation")]
    steps = steps.sort_values("start_us")
    if steps.empty:
        return pd.DataFrame(columns=cols)
    names = events["name"].astype(str)
    kinds = events["kind"].astype(str)
    ops = events[
        kinds.isin(["cpu_op", "user_annotation", "other"]) & names.map(lambda n: COLLECTIVE_OP.match(n) is not None)
    ]
    spans = events[kinds.eq("user_annotation") & names.str.match(BACKEND_SPAN.pattern)]
    kernels = events[kinds.eq("kernel") & names.str.match(NCCL_KERNEL.pattern)]
    launches = events[kinds.isin(["runtime", "driver"]) & events["correlation"].notna()]
    launch_at = dict(zip(launches["correlation"].astype("int64"), launches["start_us"]))
    kernel_at = kernels.assign(
        at=[launch_at.get(int(c), float("nan")) if pd.notna(c) else float("nan") for c in kernels["correlation"]]
    )
    reads = events[names.eq(HOST_READ_OP)]
    ranges = events[kinds.eq("user_annotation")]
    rows = []
    for i, (start, dur, tid) in enumerate(zip(steps["start_us"], steps["dur_us"], steps["tid"])):
        end = start + dur
        inside = ops[(ops["start_us"] >= start) & (ops["start_us"] < end)]
        cpu = inside["name"].map(collective_kind).value_counts().to_dict()
        on_gpu = kernel_at[(kernel_at["at"] >= start) & (kernel_at["at"] < end)]["name"].map(collective_kind)
        gpu = on_gpu.value_counts().to_dict()
        counts = {k: max(cpu.get(k, 0), gpu.get(k, 0)) for k in sorted(set(cpu) | set(gpu))}
        s = spans[(spans["start_us"] < end) & (spans["start_us"] + spans["dur_us"] > start)]
        wait = float(sum(min(e, end) - max(b, start) for b, e in zip(s["start_us"], s["start_us"] + s["dur_us"])))
        wait = min(wait, float(dur))
        r = reads[(reads["start_us"] >= start) & (reads["start_us"] < end) & reads["tid"].eq(tid)]
        unexpected, where = 0, []
        for t0 in r["start_us"]:
            around = ranges[
                (ranges["start_us"] <= t0) & (ranges["start_us"] + ranges["dur_us"] >= t0) & ranges["tid"].eq(tid)
            ]
            if not _allowed_read(list(around["name"].astype(str))):
                unexpected += 1
                where.append(str(around.sort_values("dur_us")["name"].iloc[0]) if len(around) else "?")
        rows.append(
            dict(
                step=i,
                step_us=float(dur),
                wait_us=wait,
                busy_us=float(dur) - wait,
                collectives=int(sum(counts.values())),
                allreduce=int(counts.get("allreduce", 0)),
                other=", ".join(f"{k} x{n}" for k, n in counts.items() if k != "allreduce"),
                host_reads=unexpected,
                read_in=", ".join(f"{n} x{where.count(n)}" for n in dict.fromkeys(where)),
            )
        )
    return pd.DataFrame(rows, columns=cols)
