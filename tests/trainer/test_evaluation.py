"""Greedy evaluation on the device (trainer/evaluation.py, issue 37 item 2): the device path's and the fused path's
(kernels/greedy_eval.py: CartPole with the hotloop learner's flat net, one launch) per-env returns equal the eager
reference loop's bit for bit (both learners, CartPole and the synthetic env, episodes that end at
different times, time limits that are no multiple of the chunk, max_steps that cut the episodes short); it reads the
host once per evaluation where the reference reads every 50 steps; on a GPU its captured graph gives the same
returns as the reference, captured once and replayed for every later evaluation, and the trainer's evaluator of the
hotloop learner on CartPole is the fused one."""

from __future__ import annotations

import math

import pytest
import torch

from hotloop.guards import sync_hooks
from hotloop.guards.sync_hooks import SyncHooks
from hotloop.trainer.config import preset
from hotloop.trainer.envs import CartPoleVec, GymnasiumVecEnv, SyntheticBatchEnv
from hotloop.trainer.evaluation import GreedyEvaluator, chunk_plan, episode_horizon, evaluate_reference
from hotloop.trainer.loop import Trainer
from hotloop.trainer.step import HotLearner

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (tests/conftest.py)
SMALL = dict(
    trunk_hidden=(16,),
    head_hidden=8,
    num_envs=4,
    eval_episodes=0,
    replay_capacity=64,
    batch_size=16,
    learning_starts=16,
    spectral_norm=False,
)
POLICY_SEED = {"hotloop": 4, "reference": 0}
"""Random weights whose greedy CartPole episodes (time limit 25, env seed 5, eval seed 3) end at different times:
some terminate early, some run to the limit (asserted in the test)."""


def _learner(kind: str, env: str = "cartpole", device: str = DEVICE):
    cfg = (
        preset("cartpole", learner=kind, device=device, **SMALL)
        if env == "cartpole"
        else preset("seed-scale", learner=kind, device=device, obs_dim=6, action_nvec=(3, 3), **SMALL)
    )
    return Trainer(cfg).learner


@torch.no_grad()
def _randomize(learner, seed: int):
    """Random weights (a fixed CPU generator) with the first layer scaled up, so the greedy action depends on the
    observation (the initial weights act nearly constantly); gains 1."""
    g = torch.Generator().manual_seed(seed)
    if isinstance(learner, HotLearner):
        lay, params = learner.layout, learner.params
        params.copy_(torch.randn(params.shape, generator=g))
        for x in lay.layers:
            x.views(params)[2].fill_(1.0)
        lay.out_views(params)[2].fill_(1.0)
        lay.layers[0].views(params)[0].mul_(30)
    else:
        for p in learner.online.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
        learner.online.trunk[0].weight.mul_(30)
    return learner


def test_chunk_plan_and_horizon():
    assert chunk_plan(25, 25, 10) == (3, 0)  # at the limit: the last chunk reaches past it (masked steps)
    assert chunk_plan(20, 25, 10) == (2, 0)
    assert chunk_plan(13, 25, 10) == (1, 3)  # max_steps cut short: the rest as single steps
    assert chunk_plan(0, 25, 10) == (0, 0) and chunk_plan(7, 25, 10) == (0, 7)
    with pytest.raises(ValueError, match="chunk_plan"):
        chunk_plan(5, 0, 10)
    assert episode_horizon(CartPoleVec(2, max_episode_steps=37)) == 37
    assert episode_horizon(SyntheticBatchEnv(2, obs_dim=3, action_nvec=(2,), episode_length=11)) == 11


@pytest.mark.parametrize("kind", ["hotloop", "reference"])
def test_device_path_returns_equal_the_reference_on_cartpole(kind):
    learner = _randomize(_learner(kind), POLICY_SEED[kind])
    env = CartPoleVec(16, device=DEVICE, seed=5, max_episode_steps=25)
    ev = GreedyEvaluator(env, learner.greedy, chunk_steps=10, device_path=True)  # 25 = 3 chunks, 5 steps masked
    seen = []
    for seed in (3, 11):
        got = ev.returns(seed).clone()
        want = evaluate_reference(env, learner.greedy, seed)
        assert got.dtype == torch.float64 and torch.equal(got, want), (seed, got.tolist(), want.tolist())
        seen.append(got)
        assert ev.evaluate(seed) == want.mean().item()
    seen = torch.cat(seen)
    if DEVICE == "cpu":  # the weights' episodes (a GPU's TF32 forward may act otherwise: no claim there)
        assert seen.min() < 25 and seen.max() == 25, "want episodes that end early and ones cut by the limit"
        assert len(set(seen.tolist())) >= 3
    # max_steps below the limit: 1 chunk + 3 single steps, the running episodes' partial returns
    assert torch.equal(ev.returns(3, max_steps=13).clone(), evaluate_reference(env, learner.greedy, 3, 13))
    assert torch.equal(ev.returns(3, max_steps=0), torch.zeros(16, dtype=torch.float64, device=DEVICE))


@pytest.mark.parametrize("kind", ["hotloop", "reference"])
def test_device_path_returns_equal_the_reference_on_the_synthetic_env(kind):
    # the synthetic env draws its noise from its generator at every step: it moves the returns, and the device
    # path must draw exactly what the reference draws
    learner = _randomize(_learner(kind, "synthetic"), 1)
    env = SyntheticBatchEnv(8, obs_dim=6, action_nvec=(3, 3), episode_length=12, device=DEVICE, seed=9)
    ev = GreedyEvaluator(env, learner.greedy, chunk_steps=5, device_path=True)  # 12 = 3 chunks, 3 steps masked
    for seed in (2, 7):
        got = ev.returns(seed).clone()
        want = evaluate_reference(env, learner.greedy, seed)
        assert torch.equal(got, want), (seed, got.tolist(), want.tolist())
        assert len(set(got.tolist())) > 1 or DEVICE != "cpu"  # returns that differ between the copies
    assert torch.equal(ev.returns(2, max_steps=7).clone(), evaluate_reference(env, learner.greedy, 2, 7))


def test_the_trainer_evaluates_through_its_evaluator():
    tr = Trainer(preset("cartpole", learner="reference", device="cpu", **{**SMALL, "eval_episodes": 6}))
    ev = tr.evaluator
    assert ev is not None and tr.eval_env is ev.env and ev.env.num_envs == 6
    assert not ev.device_path  # on the CPU the reference's early stop is the cheaper path (host reads are free)
    assert math.isnan(ev.last_s) and math.isnan(ev.capture_s)
    value = tr.evaluate(seed=5)
    assert value == evaluate_reference(ev.env, tr.learner.greedy, 5).mean().item()
    assert ev.last_s > 0 and ev.times_s == [ev.last_s]
    forced = GreedyEvaluator(ev.env, tr.learner.greedy, device_path=True)
    assert forced.evaluate(5) == value and forced.graph is None and math.isnan(forced.capture_s)
    assert forced.eager_chunks == 10  # cartpole's limit 500 in 10 chunks of 50, none captured on the CPU
    off = Trainer(preset("cartpole", learner="reference", device="cpu", **SMALL))
    assert off.evaluator is None and off.eval_env is None and math.isnan(off.evaluate(1))


def test_what_cannot_run_on_the_device_is_refused_or_falls_back():
    learner = _learner("reference", device="cpu")
    env = CartPoleVec(4, seed=1, max_episode_steps=20)
    with pytest.raises(ValueError, match="capture needs a CUDA env"):
        GreedyEvaluator(env, learner.greedy, capture=True)
    with pytest.raises(ValueError, match="chunk_steps"):
        GreedyEvaluator(env, learner.greedy, chunk_steps=0)
    ev = GreedyEvaluator(env, learner.greedy, device_path=True)
    with pytest.raises(ValueError, match="max_steps"):
        ev.evaluate(1, max_steps=-1)
    with pytest.raises(ValueError, match="seed"):
        ev.evaluate(1.5)
    with pytest.raises(RuntimeError, match="does not capture"):
        ev.capture()
    pytest.importorskip("gymnasium")

    gym_env = GymnasiumVecEnv("CartPole-v1", num_envs=3)
    with pytest.raises(ValueError, match="GymnasiumVecEnv cannot run the device evaluation"):
        GreedyEvaluator(gym_env, learner.greedy, device_path=True)
    fallback = GreedyEvaluator(gym_env, learner.greedy)
    assert not fallback.device_path and fallback.total is None
    assert fallback.evaluate(4) == evaluate_reference(gym_env, learner.greedy, 4).mean().item()


def _reads(hooks: SyncHooks) -> list[str]:
    """The hooks' read-backs ("api at file:line") outside the envs, whose CPU-only action range checks (a bool() of a
    CPU tensor per step, free on the CPU and skipped on a GPU: `_check_actions` in trainer/envs/) are no device
    read."""
    return [f"{h.api} at {h.site}" for h in hooks.hits if "/trainer/envs/" not in h.site]


@pytest.fixture
def cpu_tensors_sync(monkeypatch):
    """The hooks count read-backs of CPU tensors as if they were CUDA ones (as tests/guards/test_loop_syncs.py)."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(sync_hooks, "is_device_sync", lambda t: isinstance(t, torch.Tensor))


def test_the_device_path_reads_the_host_once_per_evaluation(cpu_tensors_sync):
    learner = _learner("reference", "synthetic")
    env = SyntheticBatchEnv(4, obs_dim=6, action_nvec=(3, 3), episode_length=120, device=DEVICE, seed=3)
    device = GreedyEvaluator(env, learner.greedy, chunk_steps=50, device_path=True)
    device.evaluate(1)  # the first evaluation: on a GPU it captures (the capture synchronizes), not counted
    with SyncHooks() as hooks:
        for seed in (2, 3):
            device.evaluate(seed)
    reads = _reads(hooks)
    assert len(reads) == 2 and all(r.startswith("torch.Tensor.item at ") and "evaluation.py" in r for r in reads), reads
    # the counter sees the per-50-steps check: the reference reads at steps 50, 100 and 150 (its first episodes end
    # at 120), then its mean
    with SyncHooks() as hooks:
        evaluate_reference(env, learner.greedy, 2).mean().item()
    reads = _reads(hooks)
    assert len(reads) == 4 and sum("__bool__ at" in r and "evaluation.py" in r for r in reads) == 3, reads


def test_a_per_50_steps_check_in_the_device_path_would_be_counted(cpu_tensors_sync, monkeypatch):
    learner = _learner("reference", "synthetic")
    env = SyntheticBatchEnv(4, obs_dim=6, action_nvec=(3, 3), episode_length=120, device=DEVICE, seed=3)
    ev = GreedyEvaluator(env, learner.greedy, chunk_steps=50, device_path=True, capture=False)
    real = GreedyEvaluator._chunk

    def checking_chunk(self):  # the old early stop brought back: a host read per chunk of 50
        real(self)
        bool(self.running.any())

    monkeypatch.setattr(GreedyEvaluator, "_chunk", checking_chunk)
    with SyncHooks() as hooks:
        ev.evaluate(2)
    assert len(_reads(hooks)) == 4  # 3 chunks + the mean: what the test above would fail on


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["hotloop", "reference"])
@pytest.mark.parametrize("env_name", ["cartpole", "synthetic"])
def test_the_captured_evaluation_equals_the_reference_on_the_gpu(kind, env_name):
    learner = _randomize(_learner(kind, env_name, "cuda"), POLICY_SEED[kind])
    env = (
        CartPoleVec(64, device="cuda", seed=5, max_episode_steps=37)
        if env_name == "cartpole"
        else SyntheticBatchEnv(64, obs_dim=6, action_nvec=(3, 3), episode_length=37, device="cuda", seed=9)
    )
    ev = GreedyEvaluator(env, learner.greedy, chunk_steps=10)  # 37 = 4 chunks, 3 steps masked
    assert ev.device_path and ev.use_graph
    for i, seed in enumerate((3, 11, 12, 13)):
        got = ev.returns(seed).clone()
        if i == 0:  # the first evaluation: one eager chunk, the capture, three replays
            assert ev.graph is not None and ev.eager_chunks == 1 and ev.capture_s > 0
        want = evaluate_reference(env, learner.greedy, seed)
        assert torch.equal(got, want), (seed, (got - want).abs().max().item())
    assert ev.eager_chunks == 1  # captured once, replayed ever since
    assert torch.equal(ev.returns(3, max_steps=23).clone(), evaluate_reference(env, learner.greedy, 3, 23))
    with SyncHooks() as hooks:
        value = ev.evaluate(12)
    assert [h.api for h in hooks.hits] == ["torch.Tensor.item"], hooks.frame()
    assert value == evaluate_reference(env, learner.greedy, 12).mean().item()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["hotloop", "reference"])
def test_the_trainer_evaluates_on_the_device_on_the_gpu(kind):
    # the hotloop learner's CartPole evaluation: the fused kernel, one launch; the reference learner's: the graph
    tr = Trainer(preset("cartpole", learner=kind, device="cuda", **{**SMALL, "eval_episodes": 32}))
    ev = tr.evaluator
    assert ev.device_path and ev.horizon == 500 and ev.fused == (kind == "hotloop") and ev.use_graph != ev.fused
    first = tr.evaluate(seed=7)
    assert (ev.graph is None) == ev.fused and (ev.capture_s > 0) != ev.fused and len(ev.times_s) == 1
    with SyncHooks() as hooks:
        again = tr.evaluate(seed=7)
    assert again == first == evaluate_reference(ev.env, tr.learner.greedy, 7).mean().item()
    assert [h.api for h in hooks.hits] == ["torch.Tensor.item"] and len(ev.times_s) == 2


def _flat(learner) -> tuple:
    return learner.layout, learner.params


def test_the_fused_path_returns_equal_the_eager_paths(num_envs=70):  # 2 programs of 64, the second part full
    # on the CPU the kernel runs on the Triton interpreter; these weights' episodes stay clear of Q ties and of the
    # termination thresholds' rounding (tests/kernels/test_greedy_eval.py checks that margin): equal bit for bit
    learner = _randomize(_learner("hotloop"), POLICY_SEED["hotloop"])
    env = CartPoleVec(num_envs, device=DEVICE, seed=5, max_episode_steps=25)
    fused = GreedyEvaluator(env, learner.greedy, flat=_flat(learner), fused=True)
    chunked = GreedyEvaluator(env, learner.greedy, chunk_steps=10, device_path=True, fused=False)
    assert fused.fused and not fused.use_graph and fused.obs is None and not chunked.fused
    for seed in (3, 11):
        fused.total.fill_(float("nan"))
        got = fused.returns(seed).clone()
        want = evaluate_reference(env, learner.greedy, seed)
        assert torch.equal(got, want), (seed, got.tolist(), want.tolist())
        assert fused.evaluate(seed) == want.mean().item()
    assert chunked.evaluate(11) == fused.evaluate(11)
    if DEVICE == "cpu":  # these weights' episodes (a GPU's TF32 forward may act otherwise: no claim there)
        assert bool(got.min() < 25) and bool(got.max() == 25), "want episodes that end early and ones the limit cut"
    assert torch.equal(fused.returns(3, max_steps=13).clone(), evaluate_reference(env, learner.greedy, 3, 13))
    assert fused.graph is None and fused.eager_chunks == 0 and math.isnan(fused.capture_s)


def test_the_fused_path_reads_the_host_once_per_evaluation(cpu_tensors_sync):
    learner = _randomize(_learner("hotloop"), POLICY_SEED["hotloop"])
    env = CartPoleVec(8, device=DEVICE, seed=5, max_episode_steps=25)
    ev = GreedyEvaluator(env, learner.greedy, flat=_flat(learner), fused=True)
    ev.evaluate(1)  # the first: compiles the kernel
    with SyncHooks() as hooks:
        for seed in (2, 3):
            ev.evaluate(seed)
    reads = _reads(hooks)
    assert len(reads) == 2 and all(r.startswith("torch.Tensor.item at ") and "evaluation.py" in r for r in reads), reads


def test_the_fused_path_is_chosen_where_it_can_run():
    learner = _learner("hotloop", device="cpu")
    cartpole = CartPoleVec(4, seed=1, max_episode_steps=20)
    assert not GreedyEvaluator(cartpole, learner.greedy, flat=_flat(learner)).fused  # the CPU: the reference path
    with pytest.raises(ValueError, match="cannot run the fused evaluation"):
        GreedyEvaluator(cartpole, learner.greedy, fused=True)  # no flat net (the reference learner's)
    with pytest.raises(ValueError, match="cannot run the fused evaluation"):
        GreedyEvaluator(CartPoleVec(4, dtype=torch.float64), learner.greedy, flat=_flat(learner), fused=True)
    synthetic = _learner("hotloop", "synthetic", device="cpu")
    env = SyntheticBatchEnv(4, obs_dim=6, action_nvec=(3, 3), episode_length=12, seed=9)
    with pytest.raises(ValueError, match="SyntheticBatchEnv cannot run the fused evaluation"):
        GreedyEvaluator(env, synthetic.greedy, flat=_flat(synthetic), fused=True)
    tr = Trainer(preset("cartpole", learner="hotloop", device="cpu", **{**SMALL, "eval_episodes": 6}))
    assert tr.evaluator.flat[0] is tr.learner.layout and tr.evaluator.flat[1] is tr.learner.params
    ref = Trainer(preset("cartpole", learner="reference", device="cpu", **{**SMALL, "eval_episodes": 6}))
    assert ref.evaluator.flat is None and not ref.evaluator.fused
