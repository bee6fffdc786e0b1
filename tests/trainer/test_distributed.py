"""trainer/distributed.py: data-parallel learners over gloo on the CPU (ranks spawned by torch.multiprocessing), and
over NCCL with one rank on the GPU (the all-reduce captured in the learner's graph).

The reference check: N ranks, each learning from its own shard of one batch, must end where one process learning
from the whole batch ends (the averaged gradient of equal shards of a batch-mean loss is the whole batch's gradient;
float tolerance: the sums are ordered differently), and with bit-identical parameters on every rank.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hotloop.trainer.config import Config, preset
from hotloop.trainer.distributed import (
    AVG_BACKENDS,
    BACKENDS,
    RANK_SEED_STRIDE,
    GradientAverager,
    average_gradients,
    backend_for,
    broadcast_,
    init_from_env,
    rank_info,
    rank_seed,
    teardown,
)
from hotloop.trainer.learner import DQNLearner
from hotloop.trainer.replay import PrioritizedReplay
from hotloop.trainer.step import HotLearner

OBS_DIM, NVEC, SHARD, STEPS = 6, (3, 2), 16, 5
REF_CFG = Config(
    trunk_hidden=(16, 16),
    head_hidden=8,
    spectral_norm=True,
    cql_weight=0.1,
    diversity_weight=0.05,
    max_grad_norm=0.5,
    lr=1e-2,
    target_update_interval=2,
    tau=0.5,
)
"""Small net; every loss term on (CQL, diversity), a clip that binds, a target update within the 5 steps."""


def _batch(step: int, rows: int) -> tuple[torch.Tensor, ...]:
    """Step `step`'s whole batch of `rows` transitions (the same on every rank: seeded by the step)."""
    g = torch.Generator().manual_seed(1000 + step)
    return (
        torch.randn(rows, OBS_DIM, generator=g),
        torch.stack([torch.randint(0, n, (rows,), generator=g) for n in NVEC], dim=1),
        torch.randn(rows, generator=g),
        torch.randn(rows, OBS_DIM, generator=g),
        (torch.rand(rows, generator=g) < 0.2).float(),
        torch.rand(rows, generator=g) + 0.5,
    )


def _flat(learner: DQNLearner) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in learner.state_tensors()])


def _init(rank: int, world: int, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _reference_rank(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    assert rank_info().world_size == world and rank_info().rank == rank and rank_seed(5) == 5 + rank * RANK_SEED_STRIDE
    x = torch.full((7,), float(rank + 1))
    average_gradients(x)  # gloo: SUM, then / world
    torch.save(x, Path(out) / f"avg{rank}.pt")
    torch.manual_seed(rank)  # different initial weights on every rank: the broadcast must make them rank 0's
    learner = DQNLearner(REF_CFG, OBS_DIM, NVEC, torch.device("cpu"), grad_sync=GradientAverager())
    broadcast_(learner.state_tensors())
    for step in range(STEPS):
        batch = _batch(step, SHARD * world)
        learner.update(*(t[rank * SHARD : (rank + 1) * SHARD] for t in batch))
    torch.save(_flat(learner), Path(out) / f"rank{rank}.pt")
    teardown()


def _spawn(fn, world: int, tmp_path: Path, *args) -> list[torch.Tensor]:
    mp.spawn(fn, args=(world, str(tmp_path / "store"), str(tmp_path), *args), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_reference_learner_ranks_equal_one_process_on_the_whole_batch(world, tmp_path):
    ranks = _spawn(_reference_rank, world, tmp_path)
    assert "gloo" not in AVG_BACKENDS and BACKENDS["cpu"] == "gloo"
    for r in range(world):
        assert torch.equal(torch.load(tmp_path / f"avg{r}.pt"), torch.full((7,), (world + 1) / 2))
    torch.manual_seed(0)  # rank 0's initial weights
    single = DQNLearner(REF_CFG, OBS_DIM, NVEC, torch.device("cpu"))
    start = _flat(single).clone()
    for step in range(STEPS):
        single.update(*_batch(step, SHARD * world))
    for r in range(1, world):
        assert torch.equal(ranks[r], ranks[0]), f"rank {r}'s parameters differ from rank 0's"
    assert not torch.allclose(ranks[0], start)  # it learned
    torch.testing.assert_close(ranks[0], _flat(single), rtol=1e-4, atol=2e-5)


def _hot_rank(rank: int, world: int, store: str, out: str) -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _init(rank, world, store)
    cfg = preset(
        "seed-scale",
        batch_size=8,
        trunk_hidden=(8, 8),
        head_hidden=8,
        obs_dim=4,
        action_nvec=(2, 2),
        replay_capacity=64,
        seed=rank_seed(3),
    )
    rp = PrioritizedReplay(
        cfg.replay_capacity,
        cfg.obs_dim,
        2,
        alpha=cfg.per_alpha,
        eps=cfg.per_eps,
        device=torch.device("cpu"),
        use_kernels=True,
    )
    g = torch.Generator().manual_seed(cfg.seed)  # each rank's own replay shard
    n = 40
    rp.add(
        torch.randn(n, cfg.obs_dim, generator=g),
        torch.randint(0, 2, (n, 2), generator=g),
        torch.randn(n, generator=g),
        torch.randn(n, cfg.obs_dim, generator=g),
        torch.rand(n, generator=g) < 0.1,
    )
    hot = HotLearner(cfg, cfg.obs_dim, (2, 2), torch.device("cpu"), rp, grad_sync=GradientAverager())
    broadcast_(hot.state_tensors())
    hot.sync_rounded()
    start = hot.params.clone()
    for _ in range(2):
        hot.step()
    assert not torch.equal(hot.params, start)
    torch.save(torch.cat([hot.nets.reshape(-1), hot.adam.state_dict()["exp_avg"]]), Path(out) / f"rank{rank}.pt")
    torch.save(hot.idx.clone(), Path(out) / f"idx{rank}.pt")
    teardown(hot)


@pytest.mark.slow  # ~35 s: both ranks compile the step's kernels in the Triton interpreter
def test_hot_learner_ranks_stay_identical(tmp_path):
    ranks = _spawn(_hot_rank, 2, tmp_path)
    assert torch.equal(ranks[0], ranks[1])
    # each rank sampled its own batch (its sampler seeded by its rank), yet the parameters agree bit for bit
    assert not torch.equal(torch.load(tmp_path / "idx0.pt"), torch.load(tmp_path / "idx1.pt"))


def test_without_a_process_group_one_rank_and_clear_errors():
    assert not dist.is_initialized()
    assert rank_info().world_size == 1 and rank_seed(7) == 7
    with pytest.raises(RuntimeError, match="process group"):
        GradientAverager()
    with pytest.raises(ValueError, match="device meta"):
        backend_for(torch.device("meta"))
    learner = DQNLearner(REF_CFG, OBS_DIM, NVEC, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="no grad_sync"):
        learner.sync_gradients()


def test_init_from_env_names_the_missing_torchrun_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE, LOCAL_RANK not set"):
        init_from_env(torch.device("cpu"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gpu
def test_nccl_world_one_all_reduce_captured_in_the_learner_graph(monkeypatch):
    """World size 1 over NCCL: the averaged step (the all-reduce inside the captured graph) replays and ends where
    the same learner without a process group ends (an average over one rank is the gradient itself)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    device = init_from_env(torch.device("cuda"))
    runs, learners = [], []
    try:
        for sync in (GradientAverager(), None):
            cfg = preset(
                "seed-scale",
                batch_size=64,
                trunk_hidden=(64, 64),
                head_hidden=32,
                obs_dim=12,
                action_nvec=(3, 3),
                replay_capacity=512,
                seed=1,
            )
            rp = PrioritizedReplay(
                cfg.replay_capacity,
                cfg.obs_dim,
                2,
                alpha=cfg.per_alpha,
                eps=cfg.per_eps,
                device=device,
                use_kernels=True,
            )
            g = torch.Generator().manual_seed(0)
            n = 400
            rows = (
                torch.randn(n, cfg.obs_dim, generator=g),
                torch.randint(0, 3, (n, 2), generator=g),
                torch.randn(n, generator=g),
                torch.randn(n, cfg.obs_dim, generator=g),
                torch.rand(n, generator=g) < 0.1,
            )
            rp.add(*(t.to(device) for t in rows))
            hot = HotLearner(cfg, cfg.obs_dim, (3, 3), device, rp, grad_sync=sync)
            learners.append(hot)
            hot.capture()
            for _ in range(STEPS):
                hot.step()
            torch.cuda.synchronize()
            assert hot.graph is not None
            runs.append(hot.params.clone())
        # the weight-gradient kernels add with fp32 atomics, and Adam divides each entry by its own running RMS: an
        # entry whose gradient is at rounding level can step by up to lr either way (tests/trainer/
        # test_hot_learner.py), so two runs may differ by 2 lr per step there
        torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=2 * STEPS * cfg.lr)
        assert float((runs[0] - runs[1]).abs().median()) < 1e-4  # most entries agree to rounding
    finally:
        teardown(*learners)
