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


def find_rank_traces(folder: str | os.PathLike) -> dict[int, Path]:
    """{rank: file} of the rank traces (RANK_TRACE) anywhere under `folder`, by rank. ValueError naming the folder
    when it holds none, or the files when two hold the same rank."""
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
        raise ValueError(f"{folder}: no rank traces (trace_rank<R>.json or .json.gz) in it")
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
