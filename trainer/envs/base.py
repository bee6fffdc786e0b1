"""The batched environment interface every hotloop environment implements.

All environments step N copies at once as tensors on one device (GPU-resident when the device is CUDA), so
the trainer never moves per-environment data through Python. Actions are integer tensors with one column per
action branch (a Discrete(n) action space is one branch of size n; MultiDiscrete(nvec) is len(nvec) branches).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch


class StepResult(NamedTuple):
    """What `VecEnv.step` returns; every tensor is on the environment's device.

    Fields:
        obs: (N, obs_dim) float, the observation to act on next (already reset where an episode ended).
        reward: (N,) float32, the reward of the step just taken.
        terminated: (N,) bool, the episode reached a terminal state (no bootstrapping from `final_obs`).
        truncated: (N,) bool, the episode was cut by a time limit (bootstrap from `final_obs`). Both flags can be
            set on one step (Gymnasium's TimeLimit sets truncated at the limit regardless): terminated wins.
        final_obs: (N, obs_dim) float, the observation the step really led to, before any auto-reset; equal to
            `obs` where neither flag is set. Use it as s' in the replay buffer.
    """

    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    final_obs: torch.Tensor


@runtime_checkable
class VecEnv(Protocol):
    """N environments stepped as one batch of tensors (auto-reset on termination or truncation).

    Attributes:
        num_envs: N.
        obs_dim: length of one flat observation.
        action_nvec: sizes of the action branches, e.g. (2,) for CartPole.
        device: where every tensor it returns lives.
    """

    num_envs: int
    obs_dim: int
    action_nvec: tuple[int, ...]
    device: torch.device

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset all N environments; returns obs (N, obs_dim)."""
        ...

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step all N environments with `actions` (N, len(action_nvec)) int64; returns a `StepResult`."""
        ...


def check_uniforms(env: VecEnv, uniforms: torch.Tensor | None) -> None:
    """Raise ValueError unless `uniforms` is None or a floating (env.num_envs, env.step_uniforms) tensor on env.device
    (the random numbers a capturable env's `step(actions, uniforms)` takes; their values, in [0, 1), are not read
    on the host)."""
    if uniforms is None:
        return
    want = (env.num_envs, env.step_uniforms)
    if not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != want:
        raise ValueError(f"uniforms must have shape {want}, got {tuple(getattr(uniforms, 'shape', ()))}")
    if not uniforms.dtype.is_floating_point or uniforms.device != env.device:
        raise ValueError(f"uniforms must be floating on {env.device}, got {uniforms.dtype} on {uniforms.device}")
