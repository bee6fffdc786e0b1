"""Any Gymnasium environment with a Box observation and a Discrete/MultiDiscrete action, as a `VecEnv`.

The N copies run on the host in `gymnasium.vector.SyncVectorEnv` with `AutoresetMode.SAME_STEP` (an ended episode
is reset inside the same `step`, its last observation reported in `info["final_obs"]`); this class only converts
between NumPy arrays and torch tensors on `device`. Meant for correctness checks and small runs, not the hot loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hotloop.trainer.envs.base import StepResult


def _import_gymnasium() -> Any:
    """Import gymnasium, or raise ImportError saying how to install it."""
    try:
        import gymnasium
    except ImportError as exc:
        raise ImportError("GymnasiumVecEnv needs gymnasium: pip install hotloop[gym]") from exc
    return gymnasium


class GymnasiumVecEnv:
    """N Gymnasium environments stepped through `SyncVectorEnv` (same-step auto-reset); implements `VecEnv`.

    Args:
        env: a Gymnasium env id (made `num_envs` times with `gymnasium.make(env, **make_kwargs)`, so registered
            wrappers such as TimeLimit apply) or a sequence of zero-argument factories, one per environment.
        num_envs: N; required with an env id, optional (must equal the number of factories) with factories.
        device: where every returned tensor lives.
        dtype: floating dtype of obs and final_obs.
        seed: used by the first `reset()` that is given no seed of its own (None: unseeded).
        **make_kwargs: passed to `gymnasium.make` (env id only).

    Attributes:
        num_envs, device, dtype.
        obs_dim: the flattened size of the Box observation (observations are reshaped to (N, obs_dim)).
        action_nvec: (n,) for Discrete(n); tuple(nvec) for a one-dimensional MultiDiscrete(nvec). Action i of a
            branch is sent to the env as `start + i` (Gymnasium spaces may start at a nonzero value).

    Raises:
        ImportError: gymnasium is not installed.
        ValueError: dtype not floating; num_envs missing, < 1 or inconsistent with the factories; make_kwargs
            given with factories; the observation space is not a Box; the action space is not Discrete or
            one-dimensional MultiDiscrete (the message names the env and the space).
    """

    def __init__(
        self,
        env: str | Sequence[Callable[[], Any]],
        num_envs: int | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = None,
        **make_kwargs: Any,
    ) -> None:
        gym = _import_gymnasium()
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {dtype}")
        if isinstance(env, str):
            if num_envs is None or num_envs < 1:
                raise ValueError(f"num_envs must be >= 1 for env id {env!r}, got {num_envs}")
            env_fns = [lambda: gym.make(env, **make_kwargs)] * num_envs
        else:
            env_fns = list(env)
            if make_kwargs:
                raise ValueError(f"make_kwargs {sorted(make_kwargs)} only apply to an env id, not to factories")
            if not env_fns or (num_envs is not None and num_envs != len(env_fns)):
                raise ValueError(f"num_envs ({num_envs}) must equal the number of env factories ({len(env_fns)}) >= 1")
        self._vec = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        try:
            self._read_spaces(gym, env)
        except ValueError:
            self._vec.close()
            raise
        self.num_envs = self._vec.num_envs
        self.device = torch.empty(0, device=device).device
        self.dtype = dtype
        self._pending_seed = seed

    def _read_spaces(self, gym: Any, env: Any) -> None:
        """Set obs_dim, action_nvec and the action offset from the single-env spaces, or raise ValueError."""
        obs_space, act_space = self._vec.single_observation_space, self._vec.single_action_space
        first = self._vec.envs[0]
        name = env if isinstance(env, str) else (first.spec.id if first.spec is not None else type(first).__name__)
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"{name}: observation space must be a Box, got {obs_space}")
        if isinstance(act_space, gym.spaces.Discrete):
            self.action_nvec = (int(act_space.n),)
            self._action_start = np.array([act_space.start], dtype=np.int64)
        elif isinstance(act_space, gym.spaces.MultiDiscrete) and act_space.nvec.ndim == 1:
            self.action_nvec = tuple(int(n) for n in act_space.nvec)
            self._action_start = act_space.start.astype(np.int64)
        else:
            raise ValueError(f"{name}: action space must be Discrete or one-dimensional MultiDiscrete, got {act_space}")
        self._discrete = isinstance(act_space, gym.spaces.Discrete)
        self.obs_dim = int(np.prod(obs_space.shape))

    def _to_tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(obs).reshape(self.num_envs, self.obs_dim), device=self.device).to(self.dtype)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset all N environments (`seed` seeds env i with seed + i, as SyncVectorEnv does).

        Returns obs: (N, obs_dim) `dtype` on `device`.
        """
        if seed is None:
            seed, self._pending_seed = self._pending_seed, None
        obs, _ = self._vec.reset(seed=seed)
        return self._to_tensor(obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step all N environments; ended episodes are reset in this step.

        Args:
            actions: (N, len(action_nvec)) integer tensor (or (N,) with one branch), any device; values of branch b
                in [0, action_nvec[b]).

        Returns:
            StepResult: obs and final_obs (N, obs_dim) `dtype`, reward (N,) float32, terminated and truncated (N,)
            bool, all on `device`. final_obs is `info["final_obs"]` where an episode ended, obs elsewhere.

        Raises:
            ValueError: actions not an integer tensor, of the wrong shape, or out of range (checked on the host copy,
                which this adapter needs anyway).
        """
        branches = len(self.action_nvec)
        if not isinstance(actions, torch.Tensor) or actions.dtype.is_floating_point or actions.dtype == torch.bool:
            raise ValueError(f"actions must be an integer tensor, got {getattr(actions, 'dtype', type(actions))}")
        if tuple(actions.shape) != (self.num_envs, branches) and not (
            branches == 1 and tuple(actions.shape) == (self.num_envs,)
        ):
            raise ValueError(f"actions must have shape ({self.num_envs}, {branches}), got {tuple(actions.shape)}")
        host = actions.detach().cpu().numpy().astype(np.int64).reshape(self.num_envs, branches)
        if ((host < 0) | (host >= np.array(self.action_nvec))).any():
            raise ValueError(f"actions out of range for action_nvec {self.action_nvec}")
        host = host + self._action_start
        obs, reward, terminated, truncated, info = self._vec.step(host[:, 0] if self._discrete else host)
        final_obs = np.array(obs, copy=True)
        if "_final_obs" in info:  # present only on steps where some episode ended
            ended = info["_final_obs"]
            final_obs[ended] = np.stack(info["final_obs"][ended])
        return StepResult(
            obs=self._to_tensor(obs),
            reward=torch.as_tensor(reward, dtype=torch.float32, device=self.device),
            terminated=torch.as_tensor(terminated, dtype=torch.bool, device=self.device),
            truncated=torch.as_tensor(truncated, dtype=torch.bool, device=self.device),
            final_obs=self._to_tensor(final_obs),
        )

    def close(self) -> None:
        """Close the underlying environments."""
        self._vec.close()
