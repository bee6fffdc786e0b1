"""CartPole-v1 as N batched tensor environments (Gymnasium's dynamics, stepped with torch on any device).

The physics, constants, termination test, reward and reset distribution are those of Gymnasium's
`gymnasium/envs/classic_control/cartpole.py` (itself Sutton's `pole.c`, the cart-pole of Barto, Sutton & Anderson,
"Neuronlike adaptive elements that can solve difficult learning control problems", 1983), with the time limit of
`gymnasium.wrappers.TimeLimit` as `gymnasium.make("CartPole-v1")` applies it.
"""

from __future__ import annotations

import math

import torch

from hotloop.trainer.envs.base import StepResult, check_uniforms

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds per step (explicit Euler)
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_BOUND = 0.05


class CartPoleVec:
    """N CartPole-v1 environments stepped as one batch, with auto-reset; implements `VecEnv`.

    Args:
        num_envs: N >= 1.
        device: where the state and every returned tensor live (any torch device).
        dtype: torch.float32 or torch.float64 (float64 reproduces Gymnasium's float64 state to rounding).
        max_episode_steps: the time limit (500 for CartPole-v1).
        seed: seeds the environment's own `torch.Generator` (on `device`), which draws every reset state;
            None seeds it nondeterministically. `reset(seed)` re-seeds it.

    Attributes:
        num_envs, obs_dim (4), action_nvec ((2,)), device, dtype, max_episode_steps.
        step_uniforms: 4, the uniforms per environment a capturable `step` takes (`step(actions, uniforms)`).
        state: (N, 4) `dtype` on `device` — x, x_dot, theta, theta_dot; None before the first `reset`.
        elapsed_steps: (N,) int64 on `device`, steps taken in the current episode.

    Semantics, matching `gymnasium.make("CartPole-v1")` step by step:
        - reward is 1.0 on every step, the terminating step included.
        - terminated: |x| > 2.4 or |theta| > 12 degrees after the step.
        - truncated: `elapsed_steps >= max_episode_steps` after the step, exactly as `TimeLimit` sets it, which does
          NOT look at `terminated`: a step that terminates at the limit has both flags True (treat terminated as
          winning: no bootstrap).
        - an episode that ended is reset in the same step to a state uniform in [-0.05, 0.05)^4 from the
          generator; `final_obs` holds the real post-step state, `obs` the new one.

    Raises:
        ValueError: bad num_envs, dtype or max_episode_steps; bad actions or state (see `step`, `set_state`).
        RuntimeError: `step` before `reset` (or `set_state`).
    """

    obs_dim = 4
    action_nvec = (2,)
    step_uniforms = 4

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        max_episode_steps: int = 500,
        seed: int | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.num_envs = num_envs
        self.device = torch.empty(0, device=device).device  # canonical form, e.g. cuda -> cuda:0
        self.dtype = dtype
        self.max_episode_steps = max_episode_steps
        self._generator = torch.Generator(device=self.device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self.state: torch.Tensor | None = None
        self.elapsed_steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    @property
    def generator(self) -> torch.Generator:
        """The env's own generator on `device`, which draws every reset state of a `step` without uniforms: a CUDA
        graph that captures such a step registers it (trainer/evaluation.py)."""
        return self._generator

    def _random_states(self, uniforms: torch.Tensor | None = None) -> torch.Tensor:
        """(N, 4) `dtype` states uniform in [-0.05, 0.05), from `uniforms` (N, 4) in [0, 1) or the env's generator."""
        if uniforms is None:
            uniforms = torch.rand(self.num_envs, 4, generator=self._generator, device=self.device, dtype=self.dtype)
        return uniforms.to(self.dtype) * (2 * RESET_BOUND) - RESET_BOUND

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset all N environments (re-seeding the generator first when `seed` is given).

        Returns obs: (N, 4) `dtype` on `device` (a copy of `state`). `state` keeps its address once it exists (a
        captured step stays valid).
        """
        if seed is not None:
            self._generator.manual_seed(seed)
        if self.state is None:
            self.state = self._random_states()
        else:
            self.state.copy_(self._random_states())
        self.elapsed_steps.zero_()
        return self.state.clone()

    def set_state(self, state: torch.Tensor, elapsed_steps: torch.Tensor | None = None) -> None:
        """Overwrite the state (N, 4) (cast to `dtype`, moved to `device`) and, if given, `elapsed_steps` (N,).

        Raises:
            ValueError: `state` is not (N, 4), or `elapsed_steps` is not (N,).
        """
        if tuple(state.shape) != (self.num_envs, 4):
            raise ValueError(f"state must have shape ({self.num_envs}, 4), got {tuple(state.shape)}")
        if elapsed_steps is not None and tuple(elapsed_steps.shape) != (self.num_envs,):
            raise ValueError(f"elapsed_steps must have shape ({self.num_envs},), got {tuple(elapsed_steps.shape)}")
        if self.state is None:
            self.state = state.to(device=self.device, dtype=self.dtype).clone()
        else:
            self.state.copy_(state)
        if elapsed_steps is not None:
            self.elapsed_steps.copy_(elapsed_steps)

    def _check_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Validate `actions` and return them as (N,).

        Values are range-checked only on CPU, where the check costs no device sync; on other devices a value other
        than 1 pushes left, as Gymnasium's `force = force_mag if action == 1 else -force_mag` would.
        """
        if not isinstance(actions, torch.Tensor) or actions.dtype != torch.int64:
            raise ValueError(f"actions must be an int64 tensor, got {getattr(actions, 'dtype', type(actions))}")
        if tuple(actions.shape) not in ((self.num_envs, 1), (self.num_envs,)):
            raise ValueError(
                f"actions must have shape ({self.num_envs}, 1) or ({self.num_envs},), got {tuple(actions.shape)}"
            )
        if actions.device != self.device:
            raise ValueError(f"actions must be on {self.device}, got {actions.device}")
        actions = actions.reshape(self.num_envs)
        if self.device.type == "cpu" and bool(((actions < 0) | (actions > 1)).any()):
            raise ValueError("actions must be 0 or 1 for CartPole")
        return actions

    def step(self, actions: torch.Tensor, uniforms: torch.Tensor | None = None) -> StepResult:
        """Step all N environments one tick (Euler, tau = 0.02) and auto-reset the ones whose episode ended.

        Args:
            actions: (N, 1) or (N,) int64 on `device`; 1 pushes right, 0 pushes left.
            uniforms: optional (N, 4) floats in [0, 1) on `device` that draw the reset states instead of the env's
                generator. With them the step reads no generator and updates `state` and `elapsed_steps` in place
                (as it always does), so a CUDA graph can capture it (trainer/actor.py).

        Returns:
            StepResult with obs and final_obs (N, 4) `dtype`, reward (N,) float32, terminated and truncated (N,) bool;
            all on `device`. No host sync on non-CPU devices.

        Raises:
            ValueError: actions not an int64 tensor, of the wrong shape, on the wrong device, or (on CPU only) not in
                {0, 1}; uniforms not a floating (N, 4) tensor on `device`.
            RuntimeError: called before `reset`.
        """
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        actions = self._check_actions(actions)
        check_uniforms(self, uniforms)
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(actions == 1, FORCE_MAG, -FORCE_MAG).to(self.dtype)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        # Same operations in the same order as gymnasium's CartPoleEnv.step.
        temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        next_state = torch.stack(
            (x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc), dim=1
        )

        nx, ntheta = next_state[:, 0], next_state[:, 2]
        terminated = (nx < -X_THRESHOLD) | (nx > X_THRESHOLD) | (ntheta < -THETA_THRESHOLD) | (ntheta > THETA_THRESHOLD)
        elapsed = self.elapsed_steps + 1
        truncated = elapsed >= self.max_episode_steps
        done = terminated | truncated

        self.state.copy_(torch.where(done.unsqueeze(1), self._random_states(uniforms), next_state))
        self.elapsed_steps.copy_(torch.where(done, 0, elapsed))
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return StepResult(self.state.clone(), reward, terminated, truncated, next_state)
