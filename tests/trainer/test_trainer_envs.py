"""The reference trainer runs on every kind of environment: Gymnasium (Discrete), synthetic (MultiDiscrete)."""

import math

import pytest

from hotloop.trainer.config import preset
from hotloop.trainer.loop import Trainer

SMALL = dict(
    device="cpu",
    epochs=1,
    learner_steps_per_epoch=30,
    learning_starts=64,
    batch_size=32,
    trunk_hidden=(16,),
    head_hidden=8,
    eval_episodes=2,
    replay_capacity=4096,
)


def test_trains_on_a_gymnasium_env():
    pytest.importorskip("gymnasium")
    trainer = Trainer(preset("cartpole", env="gym:CartPole-v1", num_envs=4, **SMALL))
    stats = trainer.run_epoch(1)
    assert stats.learner_steps == 30 and stats.env_steps == 4 * 30 + 64
    assert math.isfinite(stats.loss) and stats.episodes > 0


def test_trains_on_the_synthetic_branching_env():
    trainer = Trainer(
        preset("seed-scale", num_envs=16, obs_dim=12, action_nvec=(3, 4), **{**SMALL, "eval_episodes": 0})
    )
    assert trainer.env.action_nvec == (3, 4) and len(trainer.learner.online.weight_matrices()) == 1 + 2 + 2 * 2
    stats = trainer.run_epoch(1)
    assert stats.env_steps == 16 * 30 + 64 and math.isfinite(stats.loss) and math.isnan(stats.eval_return)
