"""Tests of hotloop.trainer.envs: CartPoleVec parity with Gymnasium's CartPole-v1, the Gymnasium adapter, the synthetic env,
make_env, and every ValueError path."""

from __future__ import annotations

import math
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from hotloop.trainer.envs import CartPoleVec, GymnasiumVecEnv, StepResult, SyntheticBatchEnv, VecEnv, make_env

THETA_LIMIT = 12 * 2 * math.pi / 360


def _policy(state: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Actions for 8 envs: 0-3 uniformly random (end on the angle), 4-5 a balancing state-feedback controller with 5%
    random actions (reach the 500-step limit), 6-7 an angle controller biased to one side, so the cart runs off the
    track (end on x)."""
    gains = np.array([[0, 0, 0, 0]] * 4 + [[1, 1.5, 20, 3]] * 2 + [[0, 0, 10, 1]] * 2, dtype=np.float64)
    bias = np.array([0, 0, 0, 0, 0, 0, -0.2, 0.2])
    eps = np.array([1, 1, 1, 1, 0.05, 0.05, 0.05, 0.05])
    actions = ((gains * state).sum(1) + bias > 0).astype(np.int64)
    explore = rng.random(8) < eps
    actions[explore] = rng.integers(0, 2, explore.sum())
    return actions


def test_cartpole_parity_with_gymnasium():
    """12,000 env-steps against gymnasium.make("CartPole-v1") (TimeLimit included), float64.

    Torch's and NumPy's cos/sin differ in the last ulp for ~0.1% of inputs, and an open-loop CartPole trajectory
    amplifies that (measured: ~3e-4 apart after a 500-step episode), so before each step the Gymnasium env is put in
    CartPoleVec's exact state: every step checks the one-step map, flags and reward from identical states.
    """
    n, steps = 8, 1500
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    vec = CartPoleVec(n, dtype=torch.float64, seed=0)
    vec.reset()
    rng = np.random.default_rng(0)
    ends = {"x": 0, "theta": 0, "truncated": 0}
    for _ in range(steps):
        state = vec.state.numpy().copy()
        actions = _policy(state, rng)
        res = vec.step(torch.from_numpy(actions).unsqueeze(1))
        for i, env in enumerate(envs):
            env.unwrapped.state = state[i].copy()  # Gymnasium keeps the state as a float64 ndarray of shape (4,)
            obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            np.testing.assert_allclose(res.final_obs[i].numpy(), env.unwrapped.state, rtol=0, atol=1e-12)
            np.testing.assert_allclose(res.final_obs[i].float().numpy(), obs, rtol=0, atol=1e-6)
            assert res.reward[i].item() == reward
            assert res.terminated[i].item() == terminated
            assert res.truncated[i].item() == truncated
            if terminated or truncated:
                x, theta = obs[0], obs[2]
                ends["truncated"] += truncated
                ends["x"] += terminated and abs(x) > 2.4
                ends["theta"] += terminated and abs(theta) > THETA_LIMIT
                env.reset()
                assert res.obs[i].abs().max() <= 0.05 and not torch.equal(res.obs[i], res.final_obs[i])
            else:
                assert torch.equal(res.obs[i], res.final_obs[i])
    assert all(count > 0 for count in ends.values()), ends


def test_cartpole_termination_at_time_limit_sets_both_flags_like_gymnasium():
    """TimeLimit sets truncated from the step count alone, so terminating on step 500 gives both flags."""
    state = np.array([0.0, 0.0, 0.2, 1.0])  # the pole passes 12 degrees on this step
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.unwrapped.state = state.copy()
    env._elapsed_steps = 499
    _, _, terminated, truncated, _ = env.step(1)
    vec = CartPoleVec(1, dtype=torch.float64, seed=0)
    vec.reset()
    vec.set_state(torch.from_numpy(state).unsqueeze(0), torch.tensor([499]))
    res = vec.step(torch.ones(1, 1, dtype=torch.int64))
    assert (terminated, truncated) == (True, True)
    assert (res.terminated.item(), res.truncated.item()) == (True, True)
    assert vec.elapsed_steps.item() == 0


def test_cartpole_auto_reset_final_obs_and_reset_bounds():
    vec = CartPoleVec(4, seed=1)
    obs = vec.reset()
    assert obs.shape == (4, 4) and obs.dtype == torch.float32 and obs.abs().max() <= 0.05
    assert vec.device == torch.device("cpu") and vec.obs_dim == 4 and vec.action_nvec == (2,)
    vec.set_state(
        torch.tensor([[2.39, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4]), torch.tensor([0, 0, 498, 0])
    )
    res = vec.step(torch.ones(4, dtype=torch.int64))
    assert isinstance(res, StepResult)
    assert res.terminated.tolist() == [True, False, False, False]
    assert not res.truncated.any()
    assert res.final_obs[0, 0] > 2.4  # the real post-step observation
    assert res.obs[0].abs().max() <= 0.05 and torch.equal(res.obs[0], vec.state[0])
    assert torch.equal(res.obs[1:], res.final_obs[1:])
    assert vec.elapsed_steps.tolist() == [0, 1, 499, 1]
    res = vec.step(torch.zeros(4, 1, dtype=torch.int64))
    assert res.truncated.tolist() == [False, False, True, False] and vec.elapsed_steps[2] == 0
    assert res.obs[2].abs().max() <= 0.05 and not torch.equal(res.obs[2], res.final_obs[2])
    assert res.reward.dtype == torch.float32 and torch.all(res.reward == 1.0)


def _rollout(vec, steps: int, seed: int) -> list[torch.Tensor]:
    """The reset obs, then every StepResult's tensors, under fixed random actions."""
    out = [vec.reset(seed=seed)]
    gen = torch.Generator().manual_seed(123)
    for _ in range(steps):
        shape = (vec.num_envs, len(vec.action_nvec))
        actions = torch.stack([torch.randint(0, n, shape[:1], generator=gen) for n in vec.action_nvec], 1)
        res = vec.step(actions.reshape(shape))
        out += list(res)  # obs, reward, terminated, truncated, final_obs
    return out


@pytest.mark.smoke
def test_cartpole_seeded_reproducibility():
    a = _rollout(CartPoleVec(16), 200, seed=7)
    b = _rollout(CartPoleVec(16), 200, seed=7)
    c = _rollout(CartPoleVec(16), 200, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert torch.equal(a[0], CartPoleVec(16, seed=7).reset())  # constructor seed == reset seed


def test_envs_satisfy_vecenv_protocol():
    for env in (CartPoleVec(2), SyntheticBatchEnv(2, obs_dim=3, action_nvec=(2,))):
        assert isinstance(env, VecEnv)


def test_gym_adapter_discrete_cartpole():
    env = GymnasiumVecEnv("CartPole-v1", num_envs=3, seed=0)
    assert isinstance(env, VecEnv)
    assert (env.obs_dim, env.action_nvec, env.num_envs) == (4, (2,), 3)
    obs = env.reset()
    assert obs.shape == (3, 4) and obs.dtype == torch.float32
    ended = 0
    for _ in range(60):
        res = env.step(torch.ones(3, 1, dtype=torch.int64))  # always push right: the pole falls in ~10 steps
        assert res.reward.dtype == torch.float32 and res.terminated.dtype == torch.bool
        done = res.terminated | res.truncated
        ended += int(done.sum())
        assert torch.equal(res.obs[~done], res.final_obs[~done])
        assert torch.all(res.final_obs[done, 2].abs() > THETA_LIMIT)  # the fallen pole, not the reset state
        assert torch.all(res.obs[done].abs() <= 0.05)
    assert ended > 0
    env.step(torch.zeros(3, dtype=torch.int64))  # (N,) accepted with one branch
    first = GymnasiumVecEnv("CartPole-v1", num_envs=3, seed=0).reset()
    assert torch.equal(first, obs)
    env.close()


class _TwoBranchEnv(gym.Env):
    """Box(2, 3) observation, MultiDiscrete([3, 2]) action; the obs records the last action; ends after 3 steps,
    terminating if the last action was (2, 1) and truncating otherwise."""

    observation_space = gym.spaces.Box(-10, 10, (2, 3), dtype=np.float32)
    action_space = gym.spaces.MultiDiscrete([3, 2])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((2, 3), dtype=np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        obs = np.full((2, 3), self.t, dtype=np.float32)
        obs[0, :2] = action
        done = self.t == 3
        return obs, float(action.sum()), done and tuple(action) == (2, 1), done and tuple(action) != (2, 1), {}


def test_gym_adapter_multidiscrete():
    env = GymnasiumVecEnv([_TwoBranchEnv, _TwoBranchEnv], device="cpu", dtype=torch.float64)
    assert (env.num_envs, env.obs_dim, env.action_nvec) == (2, 6, (3, 2))
    assert env.reset(seed=0).shape == (2, 6)
    actions = torch.tensor([[2, 1], [0, 1]])
    for _ in range(2):
        res = env.step(actions)
        assert torch.equal(res.obs, res.final_obs) and not (res.terminated | res.truncated).any()
    res = env.step(actions)
    assert res.obs.dtype == torch.float64 and res.obs.shape == (2, 6)
    assert res.terminated.tolist() == [True, False] and res.truncated.tolist() == [False, True]
    assert res.final_obs.tolist() == [[2, 1, 3, 3, 3, 3], [0, 1, 3, 3, 3, 3]]
    assert torch.all(res.obs == 0) and res.reward.tolist() == [3.0, 1.0]
    env.close()


class _OffsetDiscreteEnv(gym.Env):
    """Box(1) observation echoing the action of a Discrete(3, start=-1) action space."""

    observation_space = gym.spaces.Box(-5, 5, (1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        return np.array([action], dtype=np.float32), 0.0, False, False, {}


def test_gym_adapter_maps_actions_from_zero_to_the_space_start():
    env = GymnasiumVecEnv([_OffsetDiscreteEnv] * 3)
    env.reset(seed=0)
    assert env.action_nvec == (3,)
    assert env.step(torch.tensor([[0], [1], [2]])).obs.flatten().tolist() == [-1.0, 0.0, 1.0]
    env.close()


def test_synthetic_shapes_truncation_and_determinism():
    env = SyntheticBatchEnv(5, obs_dim=8, action_nvec=(3, 2), episode_length=4, seed=3)
    assert (env.num_envs, env.obs_dim, env.action_nvec) == (5, 8, (3, 2))
    a = _rollout(env, 9, seed=3)
    assert a[0].shape == (5, 8) and a[0].dtype == torch.float32
    results = [StepResult(*a[1 + 5 * k : 6 + 5 * k]) for k in range(9)]
    for k, res in enumerate(results):
        assert res.obs.shape == res.final_obs.shape == (5, 8) and res.reward.shape == (5,)
        assert res.reward.dtype == torch.float32 and res.truncated.dtype == res.terminated.dtype == torch.bool
        assert not res.terminated.any() and torch.all((res.reward >= 0) & (res.reward <= 1))
        assert res.truncated.tolist() == [k % 4 == 3] * 5
        if k % 4 == 3:
            assert torch.equal(res.obs, a[0]) and not torch.equal(res.obs, res.final_obs)
        else:
            assert torch.equal(res.obs, res.final_obs)
    b = _rollout(SyntheticBatchEnv(5, obs_dim=8, action_nvec=(3, 2), episode_length=4, seed=3), 9, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = _rollout(SyntheticBatchEnv(5, obs_dim=8, action_nvec=(3, 2), episode_length=4, seed=4), 9, seed=3)
    assert not torch.equal(a[1], c[1])  # different dynamics


def test_synthetic_reward_pays_the_best_action():
    env = SyntheticBatchEnv(4, obs_dim=6, action_nvec=(3, 2), seed=0)
    obs, nvec = env.reset(seed=0), torch.tensor([3, 2])
    for step in range(4):
        best = torch.stack([block.argmax(1) for block in (obs @ env._C).split((3, 2), 1)], 1)
        res = env.step(best if step % 2 == 0 else (best + 1) % nvec)
        assert torch.all(res.reward == (1.0 if step % 2 == 0 else 0.0))
        obs = res.obs


def test_make_env():
    assert isinstance(make_env("cartpole", 3, seed=0), CartPoleVec)
    synthetic = make_env("synthetic", 2, "cpu", 1, obs_dim=5, action_nvec=(2,))
    assert isinstance(synthetic, SyntheticBatchEnv) and synthetic.obs_dim == 5
    gym_env = make_env("gym:CartPole-v1", 2, seed=0)
    assert isinstance(gym_env, GymnasiumVecEnv) and gym_env.reset().shape == (2, 4)
    gym_env.close()
    assert torch.equal(make_env("cartpole", 3, seed=5).reset(), make_env("cartpole", 3, seed=5).reset())


def test_gym_adapter_missing_gymnasium(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    with pytest.raises(ImportError, match=r"pip install hotloop\[gym\]"):
        GymnasiumVecEnv("CartPole-v1", num_envs=1)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: CartPoleVec(0), "num_envs must be >= 1"),
        (lambda: CartPoleVec(2, dtype=torch.float16), "dtype must be torch.float32 or torch.float64"),
        (lambda: CartPoleVec(2, max_episode_steps=0), "max_episode_steps must be >= 1"),
        (lambda: SyntheticBatchEnv(0), "num_envs must be >= 1"),
        (lambda: SyntheticBatchEnv(2, obs_dim=0), "obs_dim must be >= 1"),
        (lambda: SyntheticBatchEnv(2, action_nvec=()), "action_nvec must be a non-empty"),
        (lambda: SyntheticBatchEnv(2, action_nvec=(2, 0)), "action_nvec must be a non-empty"),
        (lambda: SyntheticBatchEnv(2, episode_length=0), "episode_length must be >= 1"),
        (lambda: GymnasiumVecEnv("CartPole-v1"), "num_envs must be >= 1 for env id 'CartPole-v1'"),
        (lambda: GymnasiumVecEnv("CartPole-v1", num_envs=2, dtype=torch.int64), "dtype must be a floating dtype"),
        (lambda: GymnasiumVecEnv([_TwoBranchEnv], num_envs=2), r"num_envs \(2\) must equal the number of env"),
        (lambda: GymnasiumVecEnv([], num_envs=None), r"num_envs \(None\) must equal the number of env"),
        (lambda: GymnasiumVecEnv([_TwoBranchEnv], max_episode_steps=3), "make_kwargs .* only apply to an env id"),
        (lambda: GymnasiumVecEnv("Pendulum-v1", num_envs=1), r"Pendulum-v1: action space must be .*got Box"),
        (lambda: GymnasiumVecEnv("Blackjack-v1", num_envs=1), r"Blackjack-v1: observation space must be a Box"),
        (lambda: make_env("atari", 2), r"unknown env name 'atari'; valid names: cartpole, synthetic, gym:<EnvId>"),
        (lambda: make_env("gym:", 2), r"unknown env name 'gym:'"),
    ],
)
def test_constructor_value_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def _cartpole():
    env = CartPoleVec(2)
    env.reset(seed=0)
    return env


def _synthetic():
    env = SyntheticBatchEnv(2, obs_dim=3, action_nvec=(3, 2))
    env.reset()
    return env


def _gym_cartpole():
    env = GymnasiumVecEnv("CartPole-v1", num_envs=2)
    env.reset(seed=0)
    return env


def _gym_two_branch():
    env = GymnasiumVecEnv([_TwoBranchEnv, _TwoBranchEnv])
    env.reset(seed=0)
    return env


@pytest.mark.parametrize(
    ("make", "call", "match"),
    [
        (_cartpole, lambda e: e.step(torch.ones(2, 1)), "actions must be an int64 tensor, got torch.float32"),
        (_cartpole, lambda e: e.step(np.ones((2, 1), dtype=np.int64)), "actions must be an int64 tensor"),
        (_cartpole, lambda e: e.step(torch.ones(2, 1, dtype=torch.int32)), "actions must be an int64 tensor"),
        (_cartpole, lambda e: e.step(torch.ones(3, 1, dtype=torch.int64)), r"actions must have shape \(2, 1\)"),
        (_cartpole, lambda e: e.step(torch.ones(2, 2, dtype=torch.int64)), r"actions must have shape \(2, 1\)"),
        (_cartpole, lambda e: e.step(torch.full((2, 1), 2)), "actions must be 0 or 1"),
        (_cartpole, lambda e: e.step(torch.full((2,), -1)), "actions must be 0 or 1"),
        (_cartpole, lambda e: e.step(torch.ones(2, 1, dtype=torch.int64, device="meta")), "actions must be on cpu"),
        (_cartpole, lambda e: e.set_state(torch.zeros(2, 3)), r"state must have shape \(2, 4\)"),
        (_cartpole, lambda e: e.set_state(torch.zeros(2, 4), torch.zeros(3)), r"elapsed_steps must have shape \(2,\)"),
        (_synthetic, lambda e: e.step(torch.ones(2, 2)), "actions must be an int64 tensor"),
        (_synthetic, lambda e: e.step(torch.ones(2, dtype=torch.int64)), r"actions must have shape \(2, 2\)"),
        (_synthetic, lambda e: e.step(torch.ones(2, 2, dtype=torch.int64, device="meta")), "actions must be on cpu"),
        (_synthetic, lambda e: e.step(torch.tensor([[0, 2], [0, 0]])), r"out of range for action_nvec \(3, 2\)"),
        (_gym_cartpole, lambda e: e.step(torch.ones(2, 1)), "actions must be an integer tensor"),
        (_gym_cartpole, lambda e: e.step(torch.ones(2, 2, dtype=torch.int64)), r"actions must have shape \(2, 1\)"),
        (_gym_cartpole, lambda e: e.step(torch.full((2, 1), 2)), r"out of range for action_nvec \(2,\)"),
        (_gym_two_branch, lambda e: e.step(torch.ones(2, dtype=torch.int64)), r"actions must have shape \(2, 2\)"),
        (_gym_two_branch, lambda e: e.step(torch.tensor([[3, 0], [0, 0]])), r"out of range for action_nvec \(3, 2\)"),
    ],
)
def test_step_value_errors(make, call, match):
    with pytest.raises(ValueError, match=match):
        call(make())


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="call reset"):
        CartPoleVec(1).step(torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="call reset"):
        SyntheticBatchEnv(1).step(torch.zeros(1, 4, dtype=torch.int64))


def test_cartpole_step_with_uniforms_resets_from_them_in_place():
    env = CartPoleVec(3, seed=0)
    env.reset()
    state, elapsed = env.state, env.elapsed_steps
    env.set_state(torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.39, 5.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    u = torch.rand(3, env.step_uniforms, generator=torch.Generator().manual_seed(1))
    gen_state = env._generator.get_state()
    res = env.step(torch.tensor([1, 1, 0]), u)
    assert res.terminated.tolist() == [False, True, False]
    assert torch.equal(res.obs[1], u[1] * 0.1 - 0.05)  # the ended episode restarts from the given uniforms
    assert torch.equal(res.obs[[0, 2]], res.final_obs[[0, 2]])
    assert torch.equal(env._generator.get_state(), gen_state)  # no draw from the env's own generator
    assert env.state is state and env.elapsed_steps is elapsed  # updated in place (a captured step stays valid)
    env.reset(seed=4)
    assert env.state is state
    with pytest.raises(ValueError, match=r"uniforms must have shape \(3, 4\)"):
        env.step(torch.tensor([1, 1, 0]), u[:, :2])


def test_synthetic_step_with_uniforms_makes_box_muller_noise_in_place():
    env = SyntheticBatchEnv(4000, obs_dim=3, action_nvec=(2,), seed=0)
    obs = env.reset()
    state = env._obs
    u = torch.rand(4000, env.step_uniforms, generator=torch.Generator().manual_seed(2))
    actions = torch.zeros(4000, 1, dtype=torch.int64)
    gen_state = env._generator.get_state()
    res = env.step(actions, u)
    noise = torch.sqrt(-2 * torch.log1p(-u[:, :3])) * torch.cos(2 * math.pi * u[:, 3:])
    onehot = torch.zeros(4000, 2)
    onehot[:, 0] = 1
    want = torch.tanh(obs @ env._A + onehot @ env._B + 0.1 * noise)
    torch.testing.assert_close(res.final_obs, want, rtol=1e-6, atol=1e-6)
    assert abs(float(noise.mean())) < 0.05 and abs(float(noise.std()) - 1.0) < 0.05  # standard normal
    assert torch.equal(env._generator.get_state(), gen_state) and env._obs is state
    with pytest.raises(ValueError, match=r"uniforms must have shape \(4000, 6\)"):
        env.step(actions, u[:, :3])
