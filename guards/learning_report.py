"""The runs of `hotloop learning` (the command: hotloop.guards.commands.learning): train N seeds with each learner and
write the learning table (the learning issue's report).

Each (learner, seed) is one `hotloop train` process (`python -m hotloop.guards.cli train --preset P --seed S
--device D --set learner=L ...`) in <out>/runs/<learner>_s<seed>/, so that one run's crash, hang or CUDA state
cannot touch another and its wall time is the process's own. The hotloop learner's runs go one at a time on
`--device` (default auto: CUDA when present); the reference learner's on `--reference-device` (default cpu),
`--jobs` of them at a time, each with one CPU thread when jobs > 1 (OMP_NUM_THREADS=1), beside the GPU runs.
After all ran: <out>/learning.csv + .md (hotloop.profiles.learning_table: one row per run) and summary.csv + .md
(per learner: runs, solved, held, median seconds to 475), printed too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hotloop.profiles.epoch_table import write_table
from hotloop.profiles.learning_table import learning_frame, learning_row, summary

LEARNERS = ("hotloop", "reference")


@dataclass(frozen=True)
class LearningRun:
    """One training process of the report: learner kind, seed, device string, its run folder."""

    learner: str
    seed: int
    device: str
    run_dir: Path


def parse_seeds(text: str) -> list[int]:
    """Seeds from "1-10", "1,3,7" or a mix ("1-3,9"): sorted, unique, each >= 0. ValueError naming --seeds for
    anything else (an empty list, a reversed range, a non-integer)."""
    seeds: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                seeds.update(range(lo, hi + 1))
            else:
                seeds.add(int(part))
        except ValueError:
            raise ValueError(
                f"--seeds {text!r}: {part!r} is not a seed or a range LO-HI (e.g. 1-10 or 1,3,7)"
            ) from None
    if not seeds or min(seeds) < 0:
        raise ValueError(f"--seeds {text!r}: give at least one seed, each >= 0")
    return sorted(seeds)


def plan_runs(args: argparse.Namespace, cuda: bool) -> list[LearningRun]:
    """The runs `args` asks for, validated before any starts: learners from --learners (default: both when `cuda`,
    else the reference only: the hotloop learner needs CUDA), seeds from --seeds, --jobs >= 1, --run-timeout > 0,
    --out new or empty. Raises ValueError naming the option."""
    learners = [x.strip() for x in (args.learners or ("hotloop,reference" if cuda else "reference")).split(",")]
    bad = [x for x in learners if x not in LEARNERS]
    if bad or not learners:
        raise ValueError(f"--learners: {bad or learners} not in {list(LEARNERS)}")
    if "hotloop" in learners and (not cuda or (args.device or "auto").split(":")[0] not in ("auto", "cuda")):
        raise ValueError(
            "--learners hotloop needs a CUDA device (its Triton kernels run on the GPU); "
            + ("this machine has none" if not cuda else f"--device is {args.device}")
            + ": use --device cuda, or --learners reference"
        )
    if args.jobs < 1 or not args.run_timeout > 0:
        raise ValueError(f"--jobs must be >= 1 and --run-timeout > 0, got {args.jobs}, {args.run_timeout}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise ValueError(f"--out {args.out} must be a new or empty folder")
    seeds = parse_seeds(args.seeds)

    # each learner's device as the table should name it: "auto" resolves to CUDA when present, as `train` does
    def named(device: str | None) -> str:
        return device if device not in (None, "auto") else ("cuda" if cuda else "cpu")

    devices = {"hotloop": named(args.device), "reference": named(args.reference_device)}
    return [LearningRun(lr, s, devices[lr], args.out / "runs" / f"{lr}_s{s}") for lr in learners for s in seeds]


def run_one(run: LearningRun, args: argparse.Namespace, threads: int | None) -> dict:
    """Train `run` in its own process; returns its learning_table row (status "ok", "exit N" or "timed out after
    T s"; the log is <run_dir>.log)."""
    cmd = [
        sys.executable,
        "-m",
        "hotloop.guards.cli",
        "train",
        "--preset",
        args.preset,
        "--seed",
        str(run.seed),
        "--device",
        run.device,
        "--set",
        f"learner={run.learner}",
        "--no-progress",
        "--out",
        str(run.run_dir),
    ]
    for text in args.overrides:
        cmd += ["--set", text]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    start = time.perf_counter()
    with open(f"{run.run_dir}.log", "w") as log:
        try:
            code = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=args.run_timeout
            ).returncode
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {args.run_timeout:g} s"
    wall = time.perf_counter() - start
    table = run.run_dir / "epochs.csv"
    frame = pd.read_csv(table) if table.is_file() else pd.DataFrame()
    return learning_row(
        frame, seed=run.seed, learner=run.learner, device=run.device, process_wall_s=wall, status=status
    )


def run_report(runs: list[LearningRun], args: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every run (hotloop ones one at a time, reference ones `args.jobs` at a time, both pools together), then
    write and return (learning table, summary) to args.out."""
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    gpu = [r for r in runs if r.learner == "hotloop"]
    cpu = [r for r in runs if r.learner != "hotloop"]
    threads = 1 if args.jobs > 1 else None
    with ThreadPoolExecutor(1) as gpu_pool, ThreadPoolExecutor(args.jobs) as cpu_pool:
        futures = [gpu_pool.submit(run_one, r, args, None) for r in gpu]
        futures += [cpu_pool.submit(run_one, r, args, threads) for r in cpu]
        rows = [f.result() for f in futures]
    table = learning_frame(rows)
    totals = summary(table)
    write_table(table, args.out, "learning")
    write_table(totals, args.out, "summary")
    return table, totals
