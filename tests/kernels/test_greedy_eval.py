"""The fused greedy evaluation (kernels/greedy_eval.py) against its plain-torch reference, the eager evaluation
`evaluate_reference` (trainer/evaluation.py), on fresh random weights whose greedy CartPole episodes end at different
times (some terminate early, some run to the limit), with N a multiple of the block and not, and outputs poisoned
first. On the CPU (the Triton interpreter: dot sums in numpy's order, numpy's cos and sin) the returns must be equal
wherever the reference's trajectory stays clear of ties (no two Q values nor a state and a termination threshold
within a margin that rounding could cross); on a GPU they must be equal bit for bit, every env."""

from __future__ import annotations

import pytest
import torch

from hotloop.kernels.acting import ActingNet
from hotloop.kernels.greedy_eval import EVAL_BLOCK_N, EVAL_TILES, greedy_eval
from hotloop.trainer.config import preset
from hotloop.trainer.envs import CartPoleVec
from hotloop.trainer.envs.cartpole import THETA_THRESHOLD, X_THRESHOLD
from hotloop.trainer.evaluation import evaluate_reference
from hotloop.trainer.loop import Trainer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NET = dict(
    learner="hotloop",
    trunk_hidden=(16,),
    head_hidden=8,
    num_envs=4,
    eval_episodes=0,
    replay_capacity=64,
    batch_size=16,
    learning_starts=16,
    spectral_norm=False,
)
MARGIN = 1e-4
"""Relative gap under which two Q values, or a state and a termination threshold, count as tied on the CPU (the
kernel's and the reference's float32 sums differ in their last bits; their trajectories drift by ~1e-6 over an
episode of the test's length)."""


@torch.no_grad()
def _learner(seed: int, device: str = DEVICE, scale: float = 30.0, **kw):
    """The hotloop learner with random weights (a fixed CPU generator), the first layer scaled up so that the greedy
    action depends on the observation; gains 1 (tests/trainer/test_evaluation.py's `_randomize`)."""
    learner = Trainer(preset("cartpole", device=device, **{**NET, **kw})).learner
    g = torch.Generator().manual_seed(seed)
    lay, params = learner.layout, learner.params
    params.copy_(torch.randn(params.shape, generator=g))
    for x in lay.layers:
        x.views(params)[2].fill_(1.0)
    lay.out_views(params)[2].fill_(1.0)
    lay.layers[0].views(params)[0].mul_(scale)
    return learner


@torch.no_grad()
def _clear_of_ties(env: CartPoleVec, learner, seed: int, steps: int) -> torch.Tensor:
    """(N,) bool: the envs whose reference trajectory (reset with `seed`, `steps` steps) never comes within MARGIN of
    a tie while its first episode runs: between its two Q values, or between its state and a termination
    threshold."""
    obs = env.reset(seed=seed)
    clear = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    running = clear.clone()
    for _ in range(steps):
        q = learner.acting.q(learner.params, obs)[:, 0]
        gap = (q[:, 0] - q[:, 1]).abs() <= MARGIN * q.abs().amax(dim=1).clamp_min(1e-30)
        res = env.step(q.argmax(dim=1, keepdim=True))
        edge = ((res.final_obs[:, 0].abs() - X_THRESHOLD).abs() <= MARGIN * X_THRESHOLD) | (
            (res.final_obs[:, 2].abs() - THETA_THRESHOLD).abs() <= MARGIN * THETA_THRESHOLD
        )
        clear &= ~(running & (gap | edge))
        running &= ~(res.terminated | res.truncated)
        obs = res.obs
    return clear


def _run(
    learner, env: CartPoleVec, seed: int, steps: int, block_n: int = EVAL_BLOCK_N, tiles=EVAL_TILES
) -> torch.Tensor:
    n = env.num_envs
    net = ActingNet.from_layout(learner.layout, env.device)
    total = torch.full((n,), float("nan"), dtype=torch.float64, device=env.device)
    scratch = torch.full((2, n, net.max_width), float("nan"), device=env.device)
    return greedy_eval(net, learner.params, env.reset(seed=seed).clone(), steps, total, scratch, block_n, tiles)


@pytest.mark.parametrize("num_envs,limit,block_n", [(70, 25, 64), (64, 20, 64), (5, 25, 16), (40, 25, 16)])
def test_the_fused_evaluation_equals_the_reference_on_random_weights(num_envs, limit, block_n):
    learner = _learner(4)
    env = CartPoleVec(num_envs, device=DEVICE, seed=5, max_episode_steps=limit)
    got = _run(learner, env, 3, limit, block_n)
    want = evaluate_reference(env, learner.greedy, 3)
    assert got.dtype == torch.float64 and not bool(got.isnan().any()), "an env's return was not written"
    if DEVICE == "cpu":  # these weights' episodes (a GPU's TF32 forward may act otherwise: no claim there)
        assert bool(want.min() < limit) and bool(want.max() == limit), "want episodes that end early and at the limit"
        clear = _clear_of_ties(env, learner, 3, limit)
        assert int(clear.sum()) >= num_envs - max(1, num_envs // 8), "ties in most envs: the comparison saw little"
        assert torch.equal(got[clear], want[clear]), (got.tolist(), want.tolist())
    else:
        assert torch.equal(got, want), (got.tolist(), want.tolist())


FIRST_TILES = (64, 32, 16, 3)
"""The first default tiling (kernels/greedy_eval.py's EVAL_TILES docstring): 60 dependent iterations per step at
cartpole-fast, where EVAL_TILES takes 10."""

WIDE_NET = dict(trunk_hidden=(80, 72), head_hidden=40)
"""Layers wider than every tile of FIRST_TILES and narrower than EVAL_TILES': each tiling splits them otherwise."""


@pytest.mark.parametrize("tiles", [EVAL_TILES, FIRST_TILES, (16, 64, 32, 2)])
def test_every_tiling_equals_the_reference(tiles):
    # K = 80 and 72 span 3 and 1 column tiles of 32 and 128, rows 80 span 2 and 1 row tiles; the heads' K = 40
    learner = _learner(6, scale=10.0, **WIDE_NET)  # seed 6: 21 of 40 episodes reach the limit
    env = CartPoleVec(40, device=DEVICE, seed=5, max_episode_steps=25)
    got = _run(learner, env, 3, 25, 16, tiles)
    want = evaluate_reference(env, learner.greedy, 3)
    clear = _clear_of_ties(env, learner, 3, 25) if DEVICE == "cpu" else torch.ones_like(want, dtype=torch.bool)
    assert bool(want.min() < 25) and bool(want.max() == 25), "want episodes that end early and at the limit"
    assert int(clear.sum()) >= 35 and torch.equal(got[clear], want[clear]), (got.tolist(), want.tolist())


def test_the_operands_are_rounded_as_the_learners_forward_rounds_them(hardware_tf32):
    # Hopper's TF32 dots emulated on the interpreter: the reference's forward and the kernel round their operands
    learner = _learner(4)
    env = CartPoleVec(70, device=DEVICE, seed=5, max_episode_steps=25)
    got = _run(learner, env, 11, 25)
    want = evaluate_reference(env, learner.greedy, 11)
    assert hardware_tf32["tf32"] > 0
    clear = _clear_of_ties(env, learner, 11, 25)
    assert int(clear.sum()) >= 70 - 70 // 8 and torch.equal(got[clear], want[clear]), (got.tolist(), want.tolist())


def test_max_steps_cuts_the_episodes_and_zero_steps_returns_zeros():
    learner = _learner(4)
    env = CartPoleVec(24, device=DEVICE, seed=5, max_episode_steps=25)
    got = _run(learner, env, 3, 9)
    want = evaluate_reference(env, learner.greedy, 3, max_steps=9)
    clear = torch.ones_like(want, dtype=torch.bool)
    if DEVICE == "cpu":
        assert bool((want == 9).any()), "some episodes still run at step 9"
        clear = _clear_of_ties(env, learner, 3, 9)
    assert torch.equal(got[clear], want[clear])
    assert torch.equal(_run(learner, env, 3, 0), torch.zeros(24, dtype=torch.float64, device=DEVICE))


def _args(learner, n: int = 8):
    net = ActingNet.from_layout(learner.layout, torch.device(DEVICE))
    return dict(
        net=net,
        weights=learner.params,
        obs=torch.zeros(n, 4, device=DEVICE),
        steps=10,
        total=torch.zeros(n, dtype=torch.float64, device=DEVICE),
        scratch=torch.zeros(2, n, net.max_width, device=DEVICE),
    )


@pytest.mark.parametrize(
    "name,bad,match",
    [
        ("weights", lambda a: a["weights"].double(), "weights"),
        ("obs", lambda a: torch.zeros(8, 6, device=DEVICE), "obs"),
        ("obs", lambda a: torch.zeros(0, 4, device=DEVICE), "obs"),
        ("obs", lambda a: torch.zeros(4, 8, device=DEVICE).t(), "obs"),
        ("total", lambda a: a["total"].float(), "total"),
        ("total", lambda a: torch.zeros(7, dtype=torch.float64, device=DEVICE), "total"),
        ("scratch", lambda a: a["scratch"][:1], "scratch"),
        ("steps", lambda a: -1, "steps"),
        ("steps", lambda a: 2.5, "steps"),
        ("block_n", lambda a: 48, "block_n"),
        ("block_n", lambda a: 8, "block_n"),
        ("tiles", lambda a: (64, 32, 16), "tiles"),
        ("tiles", lambda a: (64, 48, 16, 3), "tiles"),
        ("tiles", lambda a: (64, 32, 16, 0), "tiles"),
        ("tiles", lambda a: (64, 32, 16, 5), "tiles"),
        ("tiles", lambda a: [64, 32, 16, 3], "tiles"),
    ],
)
def test_bad_inputs_are_refused_by_name_before_any_launch(name, bad, match):
    args = _args(_learner(4))
    args[name] = bad(args)  # tiles: not in _args, the default's place taken
    before = args["total"].clone()
    with pytest.raises(ValueError, match=match):
        greedy_eval(**args)
    assert torch.equal(args["total"], before)


def test_a_net_that_is_not_cartpoles_is_refused():
    learner = Trainer(
        preset("seed-scale", device=DEVICE, obs_dim=4, action_nvec=(3, 3), **{**NET, "learner": "hotloop"})
    ).learner
    with pytest.raises(ValueError, match="CartPole"):
        greedy_eval(**_args(learner))


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [30.0, 3.0])
def test_the_fused_evaluation_equals_the_reference_bit_for_bit_on_the_gpu(scale):
    # CartPole-v1's limit of 500, 300 envs (5 programs of 64), two weight scales: long episodes and short ones
    learner = _learner(4, "cuda", scale)
    env = CartPoleVec(300, device="cuda", seed=5)
    for seed in (3, 11):
        got = _run(learner, env, seed, 500).clone()
        want = evaluate_reference(env, learner.greedy, seed)
        assert torch.equal(got, want), (seed, int((got != want).sum()), (got - want).abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [EVAL_TILES, FIRST_TILES])
def test_both_tilings_equal_the_reference_bit_for_bit_at_cartpole_fast_width_on_the_gpu(tiles):
    # the cartpole-fast net (trunk 256-256, heads 64): 10 dependent iterations per step at EVAL_TILES, 60 at FIRST_TILES
    fast = preset("cartpole-fast")
    learner = _learner(4, "cuda", 3.0, trunk_hidden=fast.trunk_hidden, head_hidden=fast.head_hidden)
    env = CartPoleVec(300, device="cuda", seed=5)
    for seed in (3, 11):
        got = _run(learner, env, seed, 500, tiles=tiles).clone()
        want = evaluate_reference(env, learner.greedy, seed)
        assert torch.equal(got, want), (seed, int((got != want).sum()), (got - want).abs().max().item())
