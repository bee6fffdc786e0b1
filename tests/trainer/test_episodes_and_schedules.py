import math

import pytest
import torch

from hotloop.trainer.config import preset
from hotloop.trainer.episodes import EpisodeReturns
from hotloop.trainer.loop import Trainer
from hotloop.trainer.schedules import LinearSchedule


def test_linear_schedule_values():
    s = LinearSchedule(1.0, 0.05, 100)
    assert [s.value(t) for t in (0, 50, 100, 1000)] == pytest.approx([1.0, 0.525, 0.05, 0.05])
    assert LinearSchedule(1.0, 0.1, 0).value(0) == 0.1
    with pytest.raises(ValueError, match="duration must be >= 0"):
        LinearSchedule(1.0, 0.1, -1)


def test_trainer_epsilon_really_decays():
    cfg = preset(
        "cartpole",
        epochs=2,
        learner_steps_per_epoch=50,
        learning_starts=64,
        num_envs=4,
        batch_size=32,
        eps_start=1.0,
        eps_end=0.05,
        eps_decay_fraction=1.0,
    )
    t = Trainer(cfg)
    total = 2 * 50 * 4 + 64
    assert t.epsilon.value(0) == 1.0
    assert t.epsilon.value(total / 2) == pytest.approx(0.525)
    first = t.run_epoch(1).epsilon
    second = t.run_epoch(2).epsilon
    assert 1.0 > first > second == pytest.approx(0.05)


def test_episode_returns_ring():
    r = EpisodeReturns(num_envs=3, device=torch.device("cpu"), window=4)
    assert math.isnan(r.mean())
    ones = torch.ones(3)
    r.update(ones, torch.tensor([False, False, False]))
    r.update(ones, torch.tensor([True, False, True]))  # returns 2, 2
    assert (r.count(), r.mean()) == (2, 2.0)
    r.update(2 * ones, torch.tensor([True, True, True]))  # returns 2, 4, 2
    assert r.count() == 5
    assert r.mean() == pytest.approx((2 + 2 + 4 + 2) / 4)  # last four: drops the first finished
    r.update(ones, torch.tensor([True, True, True]))  # three returns of 1
    assert r.mean() == pytest.approx((2 + 1 + 1 + 1) / 4)


def test_epsilon_greedy_mixes_greedy_and_uniform_actions():
    import torch

    from hotloop.trainer.learner import epsilon_greedy

    nvec = torch.tensor([2, 5, 3])
    greedy = torch.stack([torch.full((4000,), v) for v in (1, 4, 0)], dim=1)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(epsilon_greedy(greedy, nvec, 0.0, gen), greedy)
    rand = epsilon_greedy(greedy, nvec, 1.0, gen)
    for d, n in enumerate(nvec.tolist()):
        assert set(rand[:, d].tolist()) == set(range(n))  # every action of every branch, none out of range
    half = epsilon_greedy(greedy, nvec, 0.5, gen)
    explored = (half != greedy).any(dim=1).float().mean().item()
    # an explored row differs from the greedy one with prob 1 - 1/(2*5*3)
    assert abs(explored - 0.5 * (1 - 1 / 30)) < 0.03
