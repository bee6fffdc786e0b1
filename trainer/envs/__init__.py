"""Batched environments (the `VecEnv` protocol) and `make_env`, the factory the trainer builds them with."""

from __future__ import annotations

from typing import Any

import torch

from hotloop.trainer.envs.base import StepResult, VecEnv
from hotloop.trainer.envs.cartpole import CartPoleVec
from hotloop.trainer.envs.gym_adapter import GymnasiumVecEnv
from hotloop.trainer.envs.synthetic import SyntheticBatchEnv

__all__ = ["CartPoleVec", "GymnasiumVecEnv", "StepResult", "SyntheticBatchEnv", "VecEnv", "make_env"]

ENV_NAMES = ("cartpole", "synthetic", "gym:<EnvId>")


def make_env(
    name: str, num_envs: int, device: str | torch.device = "cpu", seed: int | None = None, **kw: Any
) -> VecEnv:
    """Build a `VecEnv` of `num_envs` environments on `device` by name.

    Args:
        name: "cartpole" (`CartPoleVec`), "synthetic" (`SyntheticBatchEnv`), or "gym:<EnvId>" (`GymnasiumVecEnv`
            over `gymnasium.make(EnvId)`, e.g. "gym:CartPole-v1").
        num_envs: N.
        device: where the env's tensors live.
        seed: passed to the constructor, so the first `reset()` is reproducible (SyntheticBatchEnv: None means 0).
        **kw: further constructor arguments (e.g. dtype, max_episode_steps, obs_dim, action_nvec, episode_length).

    Returns the env, not yet reset.

    Raises:
        ValueError: unknown name (the message lists the valid ones), or whatever the constructor raises.
    """
    if name == "cartpole":
        return CartPoleVec(num_envs, device=device, seed=seed, **kw)
    if name == "synthetic":
        return SyntheticBatchEnv(num_envs, device=device, seed=0 if seed is None else seed, **kw)
    if name.startswith("gym:") and len(name) > len("gym:"):
        return GymnasiumVecEnv(name[len("gym:") :], num_envs=num_envs, device=device, seed=seed, **kw)
    raise ValueError(f"unknown env name {name!r}; valid names: {', '.join(ENV_NAMES)}")
