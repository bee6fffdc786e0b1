"""Per-epoch tables as pandas DataFrames, and the run folder they are written to (CSV + markdown).

Columns follow the unit-in-the-name convention of HTA's analysers (`hta/analyzers/cuda_kernel_analysis.py`):
wall_s in seconds, *_per_s per second of wall time; loss, q_mean and mean_return_100 in the environment's reward units.

Optional columns (OPTIONAL_COLUMNS, present only when the rows provide them), from the issue's table:
- gpu_ms_per_step: milliseconds of the device stream's timeline per learner step, from two CUDA events recorded
  at the epoch's start and at the end of its learner loop (hotloop.profiles.epoch_timer.EpochTimer); NaN off CUDA.
- kernels_per_step, syncs_per_step: kernel launches and host syncs per learner step; NaN unless a guard measured
  them (hotloop.profiles.trace_counts).
- TELEMETRY_COLUMNS, NVML samples taken at epoch end, outside the hot loop (hotloop.profiles.telemetry): sm_clock_mhz,
  mem_clock_mhz (current clocks, MHz), power_w (board power, W), temp_c (GPU temperature, deg C),
  clocks_event_reasons (why clocks are below max, decoded names joined by "+", "none" for no reason),
  gpu_mem_used_gib (device memory used by all processes, GiB); NaN ("" for the reasons) without NVML.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from hotloop.profiles.durable_files import fsync_dir

EPOCH_COLUMNS = [
    "epoch",
    "learner_steps",
    "env_steps",
    "wall_s",
    "learner_steps_per_s",
    "env_steps_per_s",
    "loss",
    "q_mean",
    "mean_return_100",
    "epsilon",
]
TELEMETRY_COLUMNS = ["sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c", "clocks_event_reasons", "gpu_mem_used_gib"]
OPTIONAL_COLUMNS = ["gpu_ms_per_step", "kernels_per_step", "syncs_per_step", *TELEMETRY_COLUMNS]
TEXT_COLUMNS = ("clocks_event_reasons",)
"""The per-epoch columns that hold text; every other column a run writes holds numbers."""
INTEGER_COLUMNS = ("epoch", "learner_steps", "env_steps", "episodes", "metrics_step", "best_epoch")
"""Columns of whole numbers (>= 0; epoch >= 1). epoch, learner_steps and env_steps are never empty; best_epoch is
empty until the first evaluation (hotloop.guards.run.run_training)."""
_REQUIRED = ("epoch", "learner_steps", "env_steps")
_NUMERIC = (*EPOCH_COLUMNS, *OPTIONAL_COLUMNS, "grad_norm", "eval_return", "episodes", "metrics_step", "best_epoch")


def epoch_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """DataFrame of per-epoch rows: the EPOCH_COLUMNS first, in order, then the OPTIONAL_COLUMNS the rows have
    (in that order), then any other columns in row order.

    Raises ValueError naming the missing columns if a row lacks one of EPOCH_COLUMNS.
    """
    df = pd.DataFrame(list(rows))
    missing = [c for c in EPOCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"per-epoch rows lack columns {missing}")
    optional = [c for c in OPTIONAL_COLUMNS if c in df.columns]
    return df[EPOCH_COLUMNS + optional + [c for c in df.columns if c not in EPOCH_COLUMNS + optional]]


def check_epoch_rows(df: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Validate a per-epoch table read back from a run folder (`pd.read_csv` of its epochs.csv, `path`) before
    anything uses it; returns it with the checked columns as numbers (float64, or int64 where whole and never
    empty).

    Checked, for the columns a run writes as numbers (EPOCH_COLUMNS, OPTIONAL_COLUMNS but TEXT_COLUMNS, grad_norm,
    eval_return, episodes, metrics_step, best_epoch, head_norm_*; other columns are kept as read): every cell a
    number or empty (NaN); in INTEGER_COLUMNS a whole, finite number >= 0 (epoch >= 1), and epoch, learner_steps and
    env_steps never empty. Raises ValueError naming the file, the row (1 = the first row after the header), the
    field and the value ("<path>: row 3, field 'epoch': 'two' is not a number; ..."); a missing EPOCH_COLUMNS
    column is named too."""
    missing = [c for c in EPOCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (a per-epoch table written by hotloop has {EPOCH_COLUMNS})")
    df = df.copy()
    for col in [c for c in df.columns if c in _NUMERIC and c not in TEXT_COLUMNS or str(c).startswith("head_norm_")]:
        raw = df[col]
        values = pd.to_numeric(raw.where(~raw.map(lambda v: isinstance(v, bool)), "bool"), errors="coerce")
        values = values.astype("float64")
        problem = None
        if col in INTEGER_COLUMNS:
            low = 1 if col == "epoch" else 0
            whole = values.isna() | ((values == values.round()) & (values >= low) & values.abs().lt(2**53))
        else:
            whole = pd.Series(True, index=values.index)
        bad = (raw.notna() & values.isna()) | ~whole | (values.isna() if col in _REQUIRED else False)
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            value = raw.iloc[row]
            value = value.item() if hasattr(value, "item") else value  # a numpy scalar shown as a number
            if pd.isna(value):
                problem = "empty, and every row of a run's table has it"
            elif pd.isna(values.iloc[row]):
                problem = f"{value!r} is not a number"
            else:
                problem = f"{value!r} is not a whole number >= {1 if col == 'epoch' else 0}"
            raise ValueError(
                f"{path}: row {row + 1}, field {col!r}: {problem}; the file was changed or damaged: "
                f"restore it or start a new run"
            )
        df[col] = values.astype("int64") if col in INTEGER_COLUMNS and values.notna().all() else values
    return df


def solved_at(df: pd.DataFrame, threshold: float = 475.0) -> dict[str, float] | None:
    """Where a run of per-epoch rows (`epoch_frame` / epochs.csv) first reached a mean_return_100 >= threshold
    (475: CartPole-v1's "solved"): the epoch, and the learner steps, env steps and wall seconds summed over the
    epochs up to and including it; None if no epoch reached it."""
    hit = df.index[df.mean_return_100 >= threshold]
    if len(hit) == 0:
        return None
    upto = df.loc[: hit[0]]
    return {
        "epoch": int(upto.epoch.iloc[-1]),
        "learner_steps": int(upto.learner_steps.sum()),
        "env_steps": int(upto.env_steps.sum()),
        "wall_s": float(upto.wall_s.sum()),
    }


def new_run_dir(root: str | Path = "runs", prefix: str = "") -> Path:
    """Create and return root/<prefix><UTC timestamp>/ (suffixed -2, -3, ... if it exists; never reuses a
    folder); `root` relative to the working directory unless absolute."""
    stamp = prefix + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    root = Path(root)
    path, n = root / stamp, 1
    while True:
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            n += 1
            path = root / f"{stamp}-{n}"


def write_table(df: pd.DataFrame, run_dir: Path, stem: str) -> list[Path]:
    """Write `df` as run_dir/<stem>.csv and run_dir/<stem>.md (GitHub markdown); returns both paths.

    Each file is replaced atomically: both are first written to temp files in run_dir (`.<stem>.csv.<random>.tmp`,
    `.<stem>.md.<random>.tmp`; hotloop.profiles.run_lock.TEMP_GLOB) and fsynced, then renamed over the old ones
    (os.replace, atomic on POSIX) and the folder fsynced; a process killed at any point leaves each file whole,
    old or new, never a torn row (a kill between the two renames: the new CSV with the old markdown). On an error
    the temp files are removed and the files not yet renamed are left untouched; the error (OSError from the file
    system, or what pandas raised) passes through. Sources: POSIX rename(2), Python os.replace."""
    run_dir = Path(run_dir)
    csv, md = run_dir / f"{stem}.csv", run_dir / f"{stem}.md"
    texts = [(csv, df.to_csv(index=False)), (md, df.to_markdown(index=False, floatfmt=".4g") + "\n")]
    temps: list[str] = []
    try:
        for path, text in texts:
            fd, tmp = _create_temp(path)
            temps.append(tmp)
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for (path, _), tmp in zip(texts, temps):
            os.replace(tmp, path)
    except BaseException:
        for tmp in temps:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    fsync_dir(run_dir)
    return [csv, md]


def _create_temp(path: Path) -> tuple[int, str]:
    """Create `.<name>.<8 hex>.tmp` next to `path` (O_EXCL; mode 0666 less the umask, as a plain open would make
    the file); returns (fd, its path)."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue


def format_table(df: pd.DataFrame) -> str:
    """Console text of a table (4 significant digits for floats), without the columns that are empty (all NaN),
    e.g. the GPU telemetry of a CPU run; the CSV and markdown files keep every column."""
    return df.dropna(axis=1, how="all").to_string(index=False, float_format=lambda v: f"{v:.4g}")
