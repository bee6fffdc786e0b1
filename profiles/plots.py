"""PNG plots of a per-epoch table (matplotlib's Agg canvas; no pyplot, no global backend switch). matplotlib is
imported by `plot_epochs` itself, so that importing this module (as hotloop.guards.run does) costs no start-up."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PLOT_COLUMNS = ["epoch", "learner_steps", "wall_s", "learner_steps_per_s"]
"""Columns `plot_epochs` needs; gpu_ms_per_step and sm_clock_mhz are drawn when present and not all NaN."""


def plot_epochs(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a two-panel PNG of a per-epoch table (hotloop.profiles.epoch_table) to `path` and return it.

    Top: step time in ms per learner step vs epoch: wall (wall_s / learner_steps * 1000) and gpu_ms_per_step.
    Bottom: learner_steps_per_s vs epoch. Both panels: sm_clock_mhz on a second y axis.
    Raises ValueError naming the missing columns if `df` lacks one of PLOT_COLUMNS, or if it has no rows.
    """
    missing = [c for c in PLOT_COLUMNS if c not in df.columns]
    if missing or df.empty:
        raise ValueError(f"plot_epochs: table lacks columns {missing}" if missing else "plot_epochs: no rows")
    from matplotlib.figure import Figure  # here, not at the top: a run imports matplotlib (~0.4 s) only to plot

    fig = Figure(figsize=(8, 6), layout="constrained")
    step_ax, rate_ax = fig.subplots(2, 1, sharex=True)
    step_ax.plot(df.epoch, df.wall_s / df.learner_steps * 1e3, "o-", label="wall ms/step")
    if "gpu_ms_per_step" in df and df.gpu_ms_per_step.notna().any():
        step_ax.plot(df.epoch, df.gpu_ms_per_step, "s-", label="GPU ms/step (CUDA events)")
    step_ax.set_ylabel("ms per learner step")
    step_ax.legend(loc="upper left")
    rate_ax.plot(df.epoch, df.learner_steps_per_s, "o-", color="tab:green")
    rate_ax.set_ylabel("learner steps/s")
    rate_ax.set_xlabel("epoch")
    if "sm_clock_mhz" in df and df.sm_clock_mhz.notna().any():
        for ax in (step_ax, rate_ax):
            clock = ax.twinx()
            clock.plot(df.epoch, df.sm_clock_mhz, "--", color="tab:gray")
            clock.set_ylabel("SM clock (MHz)", color="tab:gray")
    fig.suptitle("per-epoch step time and throughput")
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
