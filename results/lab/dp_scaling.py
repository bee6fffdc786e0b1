"""Data-parallel scaling of `hotloop train` runs on one host: iteration time and scaling efficiency per world size.

`PYTHONPATH=results python -m lab.dp_scaling ONE_DIR [N=DIR ...] [--csv OUT.csv]`

ONE_DIR is a one-process run folder (`hotloop train`, no --nproc), each N=DIR a `hotloop train --nproc N` run
folder of the same preset (rank 0 writes DIR/epochs.csv; hotloop.guards.data_parallel.rank_folder). From each
epochs.csv the epochs after the first (the first compiles kernels and captures graphs) give the medians of
learner_steps_per_s (one rank's learner steps per second: every rank steps in lockstep, each on its own batch) and
of the iteration time, wall_s / learner_steps in ms (the loop's time per learner step: env step, learner step
and, on N ranks, the all-reduce). The table's rows: world size, epochs used, iteration_ms, learner_steps_per_s,
total_steps_per_s (x N: batches per second over all ranks) and efficiency (total_steps_per_s / the one-process
run's: 1.0 is linear scaling). Issue 39 (multi-GPU acceptance: iteration time and scaling efficiency).

Prints the table; with --csv writes it. Raises SystemExit naming the folder or argument when a folder has no
epochs.csv, fewer than 2 epochs, or an N=DIR argument is malformed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

COLUMNS = ["world_size", "run_dir", "epochs", "iteration_ms", "learner_steps_per_s", "total_steps_per_s", "efficiency"]


def steady(run_dir: Path) -> tuple[int, float, float]:
    """(epochs used, median iteration ms, median learner steps/s) over run_dir/epochs.csv's epochs after the first.
    SystemExit naming the folder when it has no epochs.csv or fewer than 2 epochs."""
    path = Path(run_dir) / "epochs.csv"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no epochs.csv (a hotloop train run folder)")
    table = pd.read_csv(path)
    rest = table[table["epoch"] > table["epoch"].min()]
    if rest.empty:
        raise SystemExit(f"{run_dir}: {len(table)} epoch(s); the scaling needs 2 or more (the first compiles)")
    iteration_ms = 1e3 * rest["wall_s"] / rest["learner_steps"]
    return len(rest), float(iteration_ms.median()), float(rest["learner_steps_per_s"].median())


def scaling(one: Path, runs: dict[int, Path]) -> pd.DataFrame:
    """The table (module docstring) of the one-process run `one` and the data-parallel runs {world size: folder}."""
    rows = []
    for n, folder in [(1, one), *sorted(runs.items())]:
        epochs, iteration_ms, per_rank = steady(folder)
        rows.append(
            dict(
                world_size=n,
                run_dir=str(folder),
                epochs=epochs,
                iteration_ms=round(iteration_ms, 4),
                learner_steps_per_s=round(per_rank, 1),
                total_steps_per_s=round(per_rank * n, 1),
            )
        )
    table = pd.DataFrame(rows, columns=COLUMNS[:-1])
    table["efficiency"] = (table["total_steps_per_s"] / table.loc[0, "total_steps_per_s"]).round(3)
    return table


def _world_run(text: str) -> tuple[int, Path]:
    """N=DIR -> (N, DIR); argparse's error for anything else."""
    n, sep, folder = text.partition("=")
    if not sep or not n.isdigit() or int(n) < 1 or not folder:
        raise argparse.ArgumentTypeError(f"expected N=DIR with N an int >= 1, got {text!r}")
    return int(n), Path(folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("one_dir", type=Path, help="the one-process run folder")
    ap.add_argument("runs", nargs="*", type=_world_run, help="N=DIR: a hotloop train --nproc N run folder")
    ap.add_argument("--csv", type=Path)
    a = ap.parse_args(argv)
    table = scaling(a.one_dir, dict(a.runs))
    print(table.to_string(index=False))
    if a.csv:
        table.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
