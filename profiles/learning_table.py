"""The learning report's table: how each training run of N seeds x learners learned, from its per-epoch table.

One row per run (`learning_row`), from the run folder's epochs.csv (hotloop.profiles.epoch_table; units as there):
- seed, learner, device, epochs: what ran (given by the caller);
- steps_to_475, env_steps_to_475, wall_s_to_475: learner steps, env steps and epoch wall seconds summed over the
  epochs up to and including the first with mean_return_100 >= 475 (CartPole-v1's "solved" bar: `solved_at`); NaN
  when never reached. An epoch's wall_s holds what runs inside it, the first epoch's CUDA graph captures included,
  but not the process setup nor the greedy evaluation after each epoch;
- process_wall_s: the run's process from start to exit (setup and evaluations included; given by the caller);
- best: the highest mean_return_100; last3_mean: the mean of the last three epochs' mean_return_100 (fewer when the
  run is shorter); final_eval: the last epoch's greedy eval_return; best_epoch: the epoch best.pt holds (NaN without
  evaluation);
- solved (reached 475), held (last3_mean >= HELD_BAR: no late collapse).

`summary` gives the per-learner counts the learning issue's acceptance reads: runs, solved, held, and the median of
wall_s_to_475 and process_wall_s over the solved runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from hotloop.profiles.epoch_table import solved_at

SOLVED_BAR = 475.0
"""CartPole-v1's solved threshold on the mean return of the last 100 episodes (Gymnasium's CartPole-v1 spec)."""
HELD_BAR = 450.0
"""A run whose last three epochs average at least this has not collapsed (the learning issue's bar)."""
LEARNING_COLUMNS = [
    "seed",
    "learner",
    "device",
    "epochs",
    "steps_to_475",
    "env_steps_to_475",
    "wall_s_to_475",
    "process_wall_s",
    "best",
    "last3_mean",
    "final_eval",
    "best_epoch",
    "solved",
    "held",
    "status",
]


def learning_row(
    table: pd.DataFrame, *, seed: int, learner: str, device: str, process_wall_s: float = math.nan, status: str = "ok"
) -> dict:
    """The LEARNING_COLUMNS row of one run from its per-epoch table `table` (epochs.csv as a DataFrame; an empty
    one for a run that wrote no epoch). process_wall_s: the run's process start-to-exit seconds (NaN if unknown);
    status: "ok", or what went wrong (a crash's exit code), kept in the row. Raises ValueError naming the missing
    columns when `table` lacks epoch, learner_steps, env_steps, wall_s or mean_return_100."""
    need = ["epoch", "learner_steps", "env_steps", "wall_s", "mean_return_100"]
    missing = [c for c in need if c not in table.columns]
    if missing and len(table.columns):
        raise ValueError(f"per-epoch table lacks columns {missing}")
    row = dict(
        seed=seed,
        learner=learner,
        device=device,
        epochs=len(table),
        steps_to_475=math.nan,
        env_steps_to_475=math.nan,
        wall_s_to_475=math.nan,
        process_wall_s=process_wall_s,
        best=math.nan,
        last3_mean=math.nan,
        final_eval=math.nan,
        best_epoch=math.nan,
        solved=False,
        held=False,
        status=status,
    )
    if not len(table):
        return row
    hit = solved_at(table, SOLVED_BAR)
    if hit is not None:
        row.update(
            steps_to_475=hit["learner_steps"],
            env_steps_to_475=hit["env_steps"],
            wall_s_to_475=hit["wall_s"],
            solved=True,
        )
    ret = table["mean_return_100"]
    row.update(
        best=float(ret.max()),
        last3_mean=float(ret.tail(3).mean()),
        final_eval=float(table["eval_return"].iloc[-1]) if "eval_return" in table else math.nan,
        best_epoch=float(table["best_epoch"].iloc[-1]) if "best_epoch" in table else math.nan,
    )
    row["held"] = bool(row["last3_mean"] >= HELD_BAR)
    return row


def learning_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """DataFrame of `learning_row` rows in LEARNING_COLUMNS order, sorted by learner then seed."""
    df = pd.DataFrame(list(rows), columns=LEARNING_COLUMNS)
    return df.sort_values(["learner", "seed"], kind="stable").reset_index(drop=True)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per learner and device: runs, solved, held (counts of `learning_frame` rows), median_wall_s_to_475 and
    median_process_wall_s over the solved runs (NaN when none solved)."""
    rows = []
    for (learner, device), g in df.groupby(["learner", "device"], sort=True):
        solved = g[g["solved"].astype(bool)]
        rows.append(
            dict(
                learner=learner,
                device=device,
                runs=len(g),
                solved=int(len(solved)),
                held=int(g["held"].astype(bool).sum()),
                median_wall_s_to_475=float(solved["wall_s_to_475"].median()) if len(solved) else math.nan,
                median_process_wall_s=(float(solved["process_wall_s"].median()) if len(solved) else math.nan),
            )
        )
    return pd.DataFrame(
        rows, columns=["learner", "device", "runs", "solved", "held", "median_wall_s_to_475", "median_process_wall_s"]
    )
