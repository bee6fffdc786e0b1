"""The reference trainer's pieces on a CUDA device (skipped with the reason on CPU-only machines)."""

import pytest
import torch

from hotloop.trainer.config import preset
from hotloop.trainer.envs import CartPoleVec
from hotloop.trainer.loop import Trainer

pytestmark = pytest.mark.gpu


def test_cartpole_vec_on_cuda_matches_cpu():
    # One-step parity from shared states (the two devices' reset generators draw different numbers, and float64
    # sin/cos may differ in the last bit, which a trajectory amplifies), every step for 300 steps.
    gpu = CartPoleVec(64, device="cuda", dtype=torch.float64)
    cpu = CartPoleVec(64, device="cpu", dtype=torch.float64)
    gpu.reset(seed=3)
    cpu.reset(seed=3)
    ends = 0
    for t in range(300):
        cpu.set_state(gpu.state.cpu(), gpu.elapsed_steps.cpu())
        a = torch.randint(0, 2, (64, 1), generator=torch.Generator().manual_seed(t))
        rg, rc = gpu.step(a.cuda()), cpu.step(a)
        torch.testing.assert_close(rg.final_obs.cpu(), rc.final_obs, rtol=0, atol=1e-12)
        assert torch.equal(rg.terminated.cpu(), rc.terminated) and torch.equal(rg.truncated.cpu(), rc.truncated)
        ends += int(rc.terminated.sum())
    assert ends > 0


@pytest.mark.smoke
def test_trainer_epoch_on_cuda():
    # log_interval 10: the hotloop learner's loss reaches the host through the readback every 10 steps
    cfg = preset("cartpole", device="cuda", epochs=1, learner_steps_per_epoch=50, learning_starts=256, log_interval=10)
    stats = Trainer(cfg).run_epoch(1)
    assert stats.learner_steps == 50 and stats.env_steps > 0 and stats.loss == stats.loss
    assert stats.metrics_step > 0  # the loss came from a finished readback, stamped with its learner step


@pytest.mark.smoke
def test_seed_scale_epoch_on_cuda():
    cfg = preset("seed-scale", device="cuda", epochs=1, learner_steps_per_epoch=5)
    stats = Trainer(cfg).run_epoch(1)
    assert stats.learner_steps == 5 and stats.env_steps == 8192 * 6
