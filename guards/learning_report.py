"""`hotloop learning`: train N seeds with each learner and write the learning table (the learning issue's report).

Each (learner, seed) is one `hotloop train` process (`python -m hotloop.guards.cli train --preset P --seed S
--device D --set learner=L ...`) in <out>/runs/<learner>_s<seed>/, so that one run's crash, hang or CUDA state
cannot touch another and its wall time is the process's own. The hotloop learner's runs go one at a time on
`--device` (default auto: CUDA when present); the reference learner's on `--reference-device` (default cpu),
`--jobs` of them at a time, each with one CPU thread when jobs > 1 (OMP_NUM_THREADS=1), beside the GPU runs.
After all ran: <out>/learning.csv + .md (hotloop.profiles.learning_table: one row per run) and summary.csv + .md
(per learner: runs, solved, held, median seconds to 475), printed too.

Exit codes: 0 every run finished (whatever it learned: the table says), 1 a run crashed or timed out (its row
says which), 2 bad input (before anything runs), 70 internal error.
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

from hotloop.profiles.epoch_table import format_table, write_table
from hotloop.profiles.learning_table import learning_frame, learning_row, summary

LEARNERS = ("hotloop", "reference")
USAGE, RUN_FAILED, INTERNAL = 2, 1, 70


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
            raise ValueError(f"--seeds {text!r}: {part!r} is not a seed or a range LO-HI (e.g. 1-10 or 1,3,7)") \
                from None
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
        raise ValueError("--learners hotloop needs a CUDA device (its Triton kernels run on the GPU); "
                         + ("this machine has none" if not cuda else f"--device is {args.device}")
                         + ": use --device cuda, or --learners reference")
    if args.jobs < 1 or not args.run_timeout > 0:
        raise ValueError(f"--jobs must be >= 1 and --run-timeout > 0, got {args.jobs}, {args.run_timeout}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise ValueError(f"--out {args.out} must be a new or empty folder")
    seeds = parse_seeds(args.seeds)
    # each learner's device as the table should name it: "auto" resolves to CUDA when present, as `train` does
    def named(device: str | None) -> str:
        return device if device not in (None, "auto") else ("cuda" if cuda else "cpu")

    devices = {"hotloop": named(args.device), "reference": named(args.reference_device)}
    return [LearningRun(l, s, devices[l], args.out / "runs" / f"{l}_s{s}") for l in learners for s in seeds]


def run_one(run: LearningRun, args: argparse.Namespace, threads: int | None) -> dict:
    """Train `run` in its own process; returns its learning_table row (status "ok", "exit N" or "timed out after
    T s"; the log is <run_dir>.log)."""
    cmd = [sys.executable, "-m", "hotloop.guards.cli", "train", "--preset", args.preset, "--seed", str(run.seed),
           "--device", run.device, "--set", f"learner={run.learner}", "--no-progress", "--out", str(run.run_dir)]
    for text in args.overrides:
        cmd += ["--set", text]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    start = time.perf_counter()
    with open(f"{run.run_dir}.log", "w") as log:
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=args.run_timeout).returncode
            status = "ok" if code == 0 else f"exit {code}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {args.run_timeout:g} s"
    wall = time.perf_counter() - start
    table = run.run_dir / "epochs.csv"
    frame = pd.read_csv(table) if table.is_file() else pd.DataFrame()
    return learning_row(frame, seed=run.seed, learner=run.learner, device=run.device, process_wall_s=wall,
                        status=status)


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


def add_learning_parser(sub) -> argparse.ArgumentParser:
    """Add the `learning` subcommand to the `hotloop` CLI's subparsers (hotloop.guards.cli.build_parser)."""
    p = sub.add_parser("learning", help="train N seeds with each learner and write the learning table",
                       description="Train each seed with each learner (one `hotloop train` process per run) and "
                                   "write learning.csv/.md (steps, env steps and seconds to a mean return of 475, "
                                   "best, last-3-epochs mean, final greedy eval) and summary.csv/.md. Exit 0 all "
                                   "runs finished, 1 a run crashed or timed out, 2 bad input, 70 internal error.")
    p.add_argument("--preset", default="cartpole-fast", help="preset to train (default cartpole-fast)")
    p.add_argument("--seeds", default="1-10", help="seeds: 1-10, 1,3,7 or a mix (default 1-10)")
    p.add_argument("--learners", help="comma-separated: hotloop, reference (default both with CUDA, else reference)")
    p.add_argument("--device", help="device of the hotloop learner's runs (default auto)")
    p.add_argument("--reference-device", default="cpu", help="device of the reference learner's runs (default cpu)")
    p.add_argument("--jobs", type=int, default=1, help="reference runs at a time, one CPU thread each when > 1")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run (repeatable)")
    p.add_argument("--run-timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="a run longer than this is stopped and recorded as timed out (default 1800)")
    p.add_argument("--out", type=Path, help="report folder, new or empty (default runs/learning-<UTC "
                                            "timestamp>/ under the working directory)")
    return p


def run_learning(args: argparse.Namespace) -> int:
    """`hotloop learning`: returns the exit code (module docstring)."""
    import torch

    from hotloop.trainer.config import parse_override, preset

    try:
        overrides = dict(parse_override(text) for text in args.overrides)
        chosen = sorted({"learner", "seed", "device"} & set(overrides))
        if chosen:
            raise ValueError(f"--set {chosen}: chosen by the report itself (--learners, --seeds, --device)")
        preset(args.preset, **overrides)  # the runs' config, validated (ValueError naming the field)
        args.out = args.out or Path("runs") / time.strftime("learning-%Y%m%dT%H%M%SZ", time.gmtime())
        runs = plan_runs(args, torch.cuda.is_available())
    except ValueError as exc:
        print(f"hotloop learning: error: {exc}", file=sys.stderr)
        return USAGE
    try:
        table, totals = run_report(runs, args)
    except Exception as exc:  # noqa: BLE001 - the contract: an unexpected error is 70
        print(f"hotloop learning: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return INTERNAL
    print(format_table(table) + "\n\n" + format_table(totals) + f"\n\nlearning tables in {args.out}")
    return 0 if table["status"].eq("ok").all() else RUN_FAILED
