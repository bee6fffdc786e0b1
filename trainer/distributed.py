"""Data-parallel learners over torch.distributed: one all-reduce of the flat gradient per learner step.

N ranks, one process and one device each (launched by torchrun: `hotloop train --nproc N`, hotloop.guards.commands.
train). Every rank runs its own actors and replay shard, seeded by its rank (`rank_seed`), samples its own batch
of `batch_size` transitions and runs the same learner step; the gradient is averaged over the ranks with ONE
all-reduce, after the backward and before grad-norm, clip and Adam (`GradientAverager`), so every rank applies the
same update and the parameters stay identical (the initial ones are broadcast from rank 0: `broadcast_`). With
equal shard sizes and a loss that is a mean over the batch, the averaged gradient is the gradient of the loss over
the concatenated batch of world_size x batch_size transitions (tests/trainer/test_distributed.py checks it).

The transport is torch.distributed's: NCCL for CUDA devices, gloo for the CPU (`BACKENDS`). NCCL has
ReduceOp.AVG (since NCCL 2.10); gloo's all_reduce does not support AVG, so there it is SUM and a division by the
world size. On CUDA the all-reduce is captured into the learner step's CUDA graph (NCCL >= 2.9 supports capture
when every rank captures the same collective in the same stream order; one GPU per process); graphs must be
destroyed before the process group (`teardown`), or the exit can hang.
Source: PyTorch DistributedDataParallel's gradient averaging (torch/nn/parallel/distributed.py, the reducer's
bucket all-reduce divided by the world size) and its initial parameter broadcast from rank 0.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS = {"cuda": "nccl", "cpu": "gloo"}
"""Device type -> the torch.distributed backend its ranks talk over."""
AVG_BACKENDS = ("nccl",)
"""Backends whose all_reduce takes ReduceOp.AVG; the others (gloo) get SUM then a division by the world size."""
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
"""The environment variables torchrun sets in every process it starts (with MASTER_ADDR, MASTER_PORT)."""


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the run: `rank` in [0, world_size), `local_rank` (its GPU on the host), the
    `world_size` and the `backend` ("nccl", "gloo"; "" when no process group is initialized)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""


def launched_by_torchrun() -> bool:
    """Whether this process was started by torchrun (every variable of TORCHRUN_ENV is set)."""
    return all(name in os.environ for name in TORCHRUN_ENV)


def backend_for(device: torch.device) -> str:
    """The backend for `device`'s type (BACKENDS); ValueError naming the device for another type."""
    if device.type not in BACKENDS:
        raise ValueError(f"device {device}: data-parallel runs need cuda or cpu")
    return BACKENDS[device.type]


def init_from_env(device: torch.device) -> torch.device:
    """Initialize the default process group from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT: the env:// method) with the backend of `device` (`backend_for`), unless one is
    initialized already; returns this rank's device: cuda:LOCAL_RANK for a CUDA `device` (one GPU per process;
    made the current device), `device` itself on the CPU. Raises ValueError when the environment lacks a variable
    of TORCHRUN_ENV, or a CUDA rank's LOCAL_RANK has no GPU."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        raise ValueError(
            f"no torchrun environment: {', '.join(missing)} not set (launch with `hotloop train --nproc N` or torchrun)"
        )
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local_rank} has no GPU: this host has {torch.cuda.device_count()}")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend_for(device), **kwargs)
    return device


def rank_info() -> RankInfo:
    """This process's RankInfo: from the default process group when one is initialized, else rank 0 of 1."""
    if not dist.is_initialized():
        return RankInfo()
    return RankInfo(
        dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), str(dist.get_backend())
    )


RANK_SEED_STRIDE = 2**24
"""Seeds of consecutive ranks are this far apart: the Philox streams of the learner's sampler and of the actor are
keyed seed + step (hotloop.kernels.replay_batch.CounterUniforms, trainer/actor.py), so with seeds one apart rank 1
would draw at step t the uniforms rank 0 draws at step t + 1; with this stride they meet only after 2**24 steps, and
the actor's offset (2**40) stays clear of 65,536 ranks' learner streams."""


def rank_seed(seed: int) -> int:
    """The seed of this rank's actors, env, replay and sampler: seed + rank x RANK_SEED_STRIDE (seed itself for rank 0
    and without a process group), so every rank collects and samples different transitions; the learner's initial
    parameters are broadcast from rank 0 instead."""
    return seed + rank_info().rank * RANK_SEED_STRIDE


class GradientAverager:
    """Average a flat gradient buffer over the ranks of the default process group, in place, with ONE all-reduce:
    ReduceOp.AVG where the backend has it (NCCL), else SUM then a division by the world size (gloo has no AVG).
    No host sync: the collective is launched on the current stream (on CUDA it can be captured into a graph).

    Raises RuntimeError when no process group is initialized."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("GradientAverager needs an initialized process group (init_from_env)")
        info = rank_info()
        self.world_size, self.backend = info.world_size, info.backend
        self.uses_avg = info.backend in AVG_BACKENDS

    def __call__(self, flat_grad: torch.Tensor) -> None:
        """Replace `flat_grad` (a contiguous float tensor, the same shape on every rank, on the rank's device) by its
        mean over the ranks. ValueError for a non-contiguous tensor (the all-reduce would not write it in place)."""
        if not flat_grad.is_contiguous():
            raise ValueError("flat_grad must be contiguous (one buffer, reduced in place)")
        if self.uses_avg:
            dist.all_reduce(flat_grad, op=dist.ReduceOp.AVG)
            return
        dist.all_reduce(flat_grad, op=dist.ReduceOp.SUM)
        if self.world_size > 1:
            flat_grad.div_(self.world_size)


def averager_if_initialized() -> GradientAverager | None:
    """A GradientAverager when a process group is initialized (world size 1 included: it runs the same path),
    else None (a single-process run: no collective)."""
    return GradientAverager() if dist.is_initialized() else None


def average_gradients(flat_grad: torch.Tensor) -> None:
    """Average `flat_grad` over the ranks in place (one all-reduce, GradientAverager); RuntimeError without a
    process group."""
    GradientAverager()(flat_grad)


@torch.no_grad()
def broadcast_(tensors: Iterable[torch.Tensor], src: int = 0) -> None:
    """Overwrite each of `tensors` (on this rank's device, the same shapes on every rank) with rank `src`'s, one
    broadcast each; a no-op without a process group."""
    if not dist.is_initialized():
        return
    for t in tensors:
        dist.broadcast(t, src)


def teardown(*graph_owners: object) -> None:
    """End the process group cleanly: drop the CUDA graphs of `graph_owners` first (each owner's `graph` attribute
    set to None and collected: a graph holding a captured NCCL collective must be destroyed before its
    communicator, or the exit can hang), then a barrier and destroy_process_group. A no-op without a group."""
    for owner in graph_owners:
        if getattr(owner, "graph", None) is not None:
            owner.graph = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
