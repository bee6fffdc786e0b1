"""`hotloop train --nproc N`: a data-parallel run over torch.distributed (hotloop.trainer.distributed), launched by
torchrun, one process per rank.

The launching process (`launch`) checks --nproc (`check_nproc`), then runs
`python -m torch.distributed.run --standalone --nproc-per-node N --local-ranks-filter 0 -m hotloop.guards.cli train
... --out RUN_DIR` (torchrun's own module; only rank 0's console output is shown) and returns torchrun's exit code.
Every rank joins the process group from torchrun's environment (`join`: gloo on the CPU, NCCL on cuda:LOCAL_RANK)
and trains the same epochs: rank 0 in RUN_DIR (the run's tables, checkpoints and config.json, as a one-process run
writes them), rank R > 0 in RUN_DIR/rank<R>/ (`rank_folder`: its own table, of its own actors' episodes, and its
error.log if it fails). After the epochs each rank profiles `trace_steps` loop iterations and writes its Kineto trace
trace_rank<R>.json.gz into its folder (`rank_trace_hook`; `hotloop inspect RUN_DIR` compares the ranks).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from hotloop.profiles.rank_traces import rank_trace_name, write_rank_trace
from hotloop.trainer.distributed import RankInfo, init_from_env, rank_info
from hotloop.trainer.loop import Trainer


def check_nproc(nproc: object, device: torch.device) -> int:
    """--nproc: an int >= 1 and, on a CUDA device, at most the GPUs this host has (one GPU per process); returns it.
    ValueError naming --nproc otherwise."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be an int >= 1, got {nproc!r}")
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {nproc}: one GPU per process, and this host has {torch.cuda.device_count()}")
    return nproc


def torchrun_command(nproc: int, train_args: list[str]) -> list[str]:
    """The torchrun command line that runs `hotloop train <train_args>` on `nproc` ranks of this host (standalone
    rendezvous on a free port; only rank 0's console output shown)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--local-ranks-filter=0",
        "-m",
        "hotloop.guards.cli",
        "train",
        *train_args,
    ]


def launch(nproc: int, train_args: list[str]) -> int:
    """Run `torchrun_command(nproc, train_args)` and return its exit code (0 when every rank ended with 0; torchrun
    gives 1 when a rank failed, after naming it)."""
    return subprocess.run(torchrun_command(nproc, train_args), check=False).returncode


def join(device: torch.device) -> tuple[torch.device, RankInfo]:
    """Join the run's process group (hotloop.trainer.distributed.init_from_env); returns this rank's device
    (cuda:LOCAL_RANK, or the CPU) and its RankInfo. ValueError outside torchrun."""
    device = init_from_env(device)
    return device, rank_info()


def rank_folder(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` writes: the run folder for rank 0, run_dir/rank<R>/ for the others."""
    return run_dir if rank == 0 else run_dir / f"rank{rank}"


def rank_trace_hook(folder: Path, steps: int, info: RankInfo) -> Callable[[Trainer], Path | None]:
    """An `after_epochs` callback for hotloop.guards.run.run_training: profile `steps` loop iterations
    (Trainer.iterate, CPU and CUDA activity) and write them as folder/trace_rank<R>.json.gz with this rank in the
    trace's metadata (hotloop.profiles.rank_traces.write_rank_trace); returns the file, or None when steps is 0.
    Every rank must run it with the same `steps` (each iteration holds the gradient all-reduce)."""

    def hook(trainer: Trainer) -> Path | None:
        if steps == 0:
            return None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if trainer.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            trainer.iterate(steps)
            if trainer.device.type == "cuda":
                torch.cuda.synchronize(trainer.device)
        return write_rank_trace(prof, folder / rank_trace_name(info.rank), info.rank, info.world_size, info.backend)

    return hook
