"""A synthetic batched environment for performance runs at realistic shapes, entirely on device.

Not a published benchmark: a fixed random nonlinear dynamical system (a tanh recurrence, the form of an
echo-state / random RNN map) driven by the actions, with a reward a learner can discover.
"""

from __future__ import annotations

import math

import torch

from hotloop.trainer.envs.base import StepResult, check_uniforms

NOISE_STD = 0.1
SPECTRAL_SCALE = 0.9  # A ~ 0.9 * N(0, 1/obs_dim): spectral radius about 0.9, so observations neither die nor saturate


class SyntheticBatchEnv:
    """N copies of a random action-driven dynamical system; implements `VecEnv`.

    Dynamics, with one-hot actions onehot(a) of length sum(action_nvec) (one block per branch):
        obs' = tanh(obs @ A + onehot(a) @ B + 0.1 * noise),  noise ~ N(0, I)
        reward = mean over branches b of [a_b == argmax_j (obs @ C)_{b, j}]    (in [0, 1])
    so the best action is a fixed function of the observation. A, B, C are drawn once from `seed` on a CPU
    generator (the same on every device); noise and start states come from the env's generator on `device`.
    Episodes never terminate and all truncate together every `episode_length` steps, when each restarts from the
    start observation (U(-1, 1)^obs_dim) it drew at the last `reset` — no per-step random draws for restarts;
    `final_obs` holds the observation before the restart.

    Args:
        num_envs: N >= 1.
        obs_dim: observation length >= 1.
        action_nvec: sizes of the action branches, each >= 1.
        episode_length: the time limit, >= 1.
        device: where all state and every returned tensor live.
        seed: fixes A, B, C and seeds the env's generator; `reset(seed)` re-seeds only the generator.

    Attributes:
        num_envs, obs_dim, action_nvec, episode_length, device.
        elapsed_steps: (N,) int64 on `device`.
        step_uniforms: 2 * obs_dim, the uniforms per environment a capturable `step` takes (`step(actions,
            uniforms)`: the noise by the Box-Muller transform, Box & Muller 1958).

    Raises:
        ValueError: a size argument out of range; bad actions (see `step`).
        RuntimeError: `step` before `reset`.
    """

    def __init__(
        self,
        num_envs: int,
        obs_dim: int = 64,
        action_nvec: tuple[int, ...] = (4, 4, 4, 4),
        episode_length: int = 1000,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if obs_dim < 1:
            raise ValueError(f"obs_dim must be >= 1, got {obs_dim}")
        if len(action_nvec) < 1 or min(action_nvec) < 1:
            raise ValueError(f"action_nvec must be a non-empty tuple of sizes >= 1, got {action_nvec}")
        if episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}")
        self.num_envs = num_envs
        self.obs_dim = obs_dim
        self.step_uniforms = 2 * obs_dim
        self.action_nvec = tuple(int(n) for n in action_nvec)
        self.episode_length = episode_length
        self.device = torch.empty(0, device=device).device

        params = torch.Generator().manual_seed(seed)
        total = sum(self.action_nvec)
        scale = SPECTRAL_SCALE / math.sqrt(obs_dim)
        self._A = (torch.randn(obs_dim, obs_dim, generator=params) * scale).to(self.device)
        self._B = torch.randn(total, obs_dim, generator=params).to(self.device)
        self._C = torch.randn(obs_dim, total, generator=params).to(self.device)
        self._nvec = torch.tensor(self.action_nvec, device=self.device)
        self._offsets = torch.cumsum(self._nvec, 0) - self._nvec
        self._columns = torch.arange(total, device=self.device)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._obs: torch.Tensor | None = None
        self.elapsed_steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    @property
    def generator(self) -> torch.Generator:
        """The env's own generator on `device`, which draws the start states at `reset` and the noise of a `step`
        without uniforms: a CUDA graph that captures such a step registers it (trainer/evaluation.py)."""
        return self._generator

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Restart all N episodes (re-seeding the generator first when `seed` is given).

        Returns obs: (N, obs_dim) float32 on `device`. The state keeps its address once it exists (a captured step
        stays valid).
        """
        if seed is not None:
            self._generator.manual_seed(seed)
        start = torch.rand(self.num_envs, self.obs_dim, generator=self._generator, device=self.device) * 2 - 1
        if self._obs is None:
            self._start, self._obs = start, start.clone()
        else:
            self._start.copy_(start)
            self._obs.copy_(start)
        self.elapsed_steps.zero_()
        return self._obs.clone()

    def _check_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Validate `actions` and return them as (N, branches).

        Values are range-checked only on CPU (free there); elsewhere an out-of-range value of a branch selects no
        B row and never earns that branch's reward, with no host sync.
        """
        branches = len(self.action_nvec)
        if not isinstance(actions, torch.Tensor) or actions.dtype != torch.int64:
            raise ValueError(f"actions must be an int64 tensor, got {getattr(actions, 'dtype', type(actions))}")
        if tuple(actions.shape) != (self.num_envs, branches) and not (
            branches == 1 and tuple(actions.shape) == (self.num_envs,)
        ):
            raise ValueError(f"actions must have shape ({self.num_envs}, {branches}), got {tuple(actions.shape)}")
        if actions.device != self.device:
            raise ValueError(f"actions must be on {self.device}, got {actions.device}")
        actions = actions.reshape(self.num_envs, branches)
        if self.device.type == "cpu" and bool(((actions < 0) | (actions >= self._nvec)).any()):
            raise ValueError(f"actions out of range for action_nvec {self.action_nvec}")
        return actions

    def step(self, actions: torch.Tensor, uniforms: torch.Tensor | None = None) -> StepResult:
        """Advance all N systems one step; no host sync off CPU.

        Args:
            actions: (N, len(action_nvec)) int64 on `device` (or (N,) with one branch).
            uniforms: optional (N, 2 * obs_dim) floats in [0, 1) on `device` that make the noise (Box-Muller: the
                first obs_dim columns are u1, the rest u2) instead of the env's generator. With them the step reads
                no generator and updates the state in place (as it always does), so a CUDA graph can capture it.

        Returns:
            StepResult: obs and final_obs (N, obs_dim) float32, reward (N,) float32, terminated (always False) and
            truncated (N,) bool, all on `device`.

        Raises:
            ValueError: actions not int64, of the wrong shape, on the wrong device, or (CPU only) out of range;
                uniforms not a floating (N, 2 * obs_dim) tensor on `device`.
            RuntimeError: called before `reset`.
        """
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        actions = self._check_actions(actions)
        check_uniforms(self, uniforms)
        valid = (actions >= 0) & (actions < self._nvec)
        column = torch.where(valid, actions + self._offsets, -1)  # -1 matches no column
        onehot = (column.unsqueeze(2) == self._columns).any(1).float()  # (N, sum(nvec))

        best = torch.stack([block.argmax(1) for block in (self._obs @ self._C).split(self.action_nvec, 1)], 1)
        reward = (actions == best).float().mean(1)

        if uniforms is None:
            noise = torch.randn(self.num_envs, self.obs_dim, generator=self._generator, device=self.device)
        else:
            u1, u2 = uniforms.float().split(self.obs_dim, 1)
            # 1 - u1 is in (0, 1] for u1 in [0, 1): the log is finite
            noise = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2.0 * math.pi * u2)
        next_obs = torch.tanh(self._obs @ self._A + onehot @ self._B + NOISE_STD * noise)
        elapsed = self.elapsed_steps + 1
        truncated = elapsed >= self.episode_length
        self._obs.copy_(torch.where(truncated.unsqueeze(1), self._start, next_obs))
        self.elapsed_steps.copy_(torch.where(truncated, 0, elapsed))
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return StepResult(self._obs.clone(), reward, terminated, truncated, next_obs)
