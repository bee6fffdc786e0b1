"""The hotloop trainer's DeviceActor (trainer/actor.py): its env step equals the same step done by hand from its
uniforms, its randomness is keyed by the device counter only, its replay writes follow the device position, and on
a GPU its captured graph replays the eager step exactly."""

import copy
import types

import pytest
import torch

from hotloop.trainer.actor import DeviceActor, capturable
from hotloop.trainer.config import preset
from hotloop.trainer.envs import CartPoleVec, GymnasiumVecEnv, SyntheticBatchEnv
from hotloop.trainer.loop import Trainer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the Triton interpreter (tests/conftest.py)
TINY = dict(
    learner="hotloop",
    trunk_hidden=(16,),
    head_hidden=16,
    batch_size=16,
    learner_steps_per_epoch=2,
    learning_starts=32,
    num_envs=8,
    eval_episodes=0,
    replay_capacity=64,
    log_interval=1,
    epochs=2,
)


def _trainer(env="cartpole", **kw):
    return Trainer(preset("cartpole", **{**TINY, "env": env, **kw}, device=DEVICE))


@pytest.mark.parametrize("env", ["cartpole", "synthetic"])
def test_a_step_is_the_epsilon_greedy_env_step_done_by_hand_from_its_uniforms(env):
    tr = _trainer(env, **({"obs_dim": 6, "action_nvec": (3, 3)} if env == "synthetic" else {}))
    actor = tr.actor
    assert actor is not None and capturable(tr.env)
    for _ in range(5):  # some steps in, with episodes ending (CartPole) and the ring wrapping later
        tr.env_step()
    limit = getattr(tr.env, "max_episode_steps", getattr(tr.env, "episode_length", None))
    tr.env.elapsed_steps[0] = limit - 1  # env 0's episode ends in the checked step (final_obs != the reset obs)
    obs0, env0, returns0 = tr.obs.clone(), copy.deepcopy(tr.env), copy.deepcopy(tr.returns)
    pos0, t0, n = int(tr.replay.pos_t), int(actor.t), tr.cfg.num_envs
    actor.epsilon.fill_(float("nan"))
    tr.env_step()
    eps = float(actor.epsilon)
    actor.uniforms.fill_(float("nan"))
    u = actor.uniforms_at(t0).clone()
    assert torch.isfinite(u).all() and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert eps == pytest.approx(tr.epsilon.value(t0 * n), abs=1e-6)  # the device schedule is the host's
    d = len(tr.env.action_nvec)
    nvec = torch.tensor(tr.env.action_nvec, device=DEVICE)
    greedy = tr.learner.acting.greedy(actor.acting_weights, obs0)
    want_actions = torch.where(u[:, :1] < eps, (u[:, 1 : 1 + d] * nvec).long(), greedy)
    res = env0.step(want_actions, u[:, 1 + d :])
    assert not torch.equal(res.obs[0], res.final_obs[0])
    slots = (pos0 + torch.arange(n, device=DEVICE)) % tr.replay.capacity
    assert torch.equal(tr.replay.obs[slots], obs0)
    assert torch.equal(tr.replay.action[slots], want_actions)
    # CartPole: the same float32 operations in the same order, bit for bit on the interpreter (on the GPU
    # Triton's sin/cos and torch's may round differently); the synthetic env's tanh and log within rounding
    exact = env == "cartpole" and DEVICE == "cpu"
    tol = dict(rtol=0, atol=0) if exact else dict(rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(tr.replay.next_obs[slots], res.final_obs, **tol)
    assert torch.equal(tr.replay.reward[slots], res.reward)
    assert torch.equal(tr.replay.terminated[slots], res.terminated.float())
    torch.testing.assert_close(tr.obs, res.obs, **tol)
    returns0.update(res.reward, res.terminated | res.truncated)  # env 0's episode is recorded as finished
    for name in ("running", "finished"):
        assert torch.equal(getattr(tr.returns, name), getattr(returns0, name)), name
    assert torch.equal(tr.returns.ring[:-1], returns0.ring[:-1])  # the last slot: update's spare (never read)
    assert int(actor.t) == t0 + 1 and tr.env_steps == (t0 + 1) * n
    assert int(tr.replay.pos_t) == tr.replay.pos == (pos0 + n) % tr.replay.capacity


def test_the_randomness_depends_on_the_seed_and_the_counter_only():
    a, b, c = _trainer(), _trainer(), _trainer(seed=2)
    for tr in (a, b, c):
        for _ in range(3):
            tr.env_step()
    assert torch.equal(a.replay.obs, b.replay.obs) and torch.equal(a.replay.action, b.replay.action)
    assert not torch.equal(a.replay.action, c.replay.action)
    assert torch.equal(a.actor.uniforms_at(2), b.actor.uniforms_at(2))
    assert not torch.equal(a.actor.uniforms_at(2).clone(), c.actor.uniforms_at(2))
    assert not torch.equal(a.actor.uniforms_at(2).clone(), a.actor.uniforms_at(1))
    state = {k: v.clone() for k, v in (("obs", a.obs), ("state", a.env.state), ("el", a.env.elapsed_steps))}
    actions = a.replay.action.clone()
    a.actor._body()  # counter 3
    a.actor.t.sub_(1)  # replaying counter 3 from the same state draws 3's numbers again: the same actions
    a.replay.pos_t.sub_(8)
    a.obs.copy_(state["obs"]), a.env.state.copy_(state["state"]), a.env.elapsed_steps.copy_(state["el"])
    first = a.replay.action.clone()
    a.actor._body()
    assert torch.equal(a.replay.action, first) and not torch.equal(first, actions)


def test_only_capturable_envs_get_an_actor():
    assert capturable(CartPoleVec(2)) and capturable(SyntheticBatchEnv(2, obs_dim=3, action_nvec=(2,)))
    pytest.importorskip("gymnasium")
    gym_env = GymnasiumVecEnv("CartPole-v1", num_envs=2)
    assert not capturable(gym_env)
    tr = _trainer()
    with pytest.raises(ValueError, match="GymnasiumVecEnv is not capturable"):
        DeviceActor(tr.learner, gym_env, tr.replay, tr.returns, tr.obs, 0, 1.0, 0.1, 10.0)
    with pytest.raises(ValueError, match=r"obs must be \(8, 4\) float32"):
        DeviceActor(tr.learner, tr.env, tr.replay, tr.returns, tr.obs[:4], 0, 1.0, 0.1, 10.0)
    assert _trainer(learner="reference").actor is None


@pytest.mark.gpu
def test_the_captured_actor_replays_the_eager_step_exactly():
    eager, graphed = _trainer(), _trainer()
    for tr in (eager, graphed):
        tr.env_step()  # the first step is eager in both (it compiles the kernels)
    for _ in range(21):
        graphed.env_step()  # the first captures, then every one replays the graph
        eager.actor.step()  # the same work launched eagerly (the trainer would capture)
    assert graphed.actor.graph is not None and eager.actor.graph is None
    torch.cuda.synchronize()
    for name in ("obs", "action", "reward", "next_obs", "terminated"):
        assert torch.equal(getattr(graphed.replay, name), getattr(eager.replay, name)), name
    assert torch.equal(graphed.replay.tree.nodes, eager.replay.tree.nodes)
    assert torch.equal(graphed.obs, eager.obs) and int(graphed.actor.t) == int(eager.actor.t) == 22
    assert graphed.replay.pos == eager.replay.pos == int(graphed.replay.pos_t)
    assert graphed.returns.count() == eager.returns.count()


def _instrument(tr):
    """Pretend the trainer is on CUDA and record, at each capture, how many eager actor steps this process ran."""
    log = {"eager": 0, "captured_after": []}
    body = tr.actor._body

    def counted_body():
        log["eager"] += 1
        body()

    tr.actor._body = counted_body
    tr.actor.capture = lambda: log["captured_after"].append(log["eager"])  # no graph is set: steps stay eager
    tr.device = types.SimpleNamespace(type="cuda")  # only env_step's capture condition reads it here
    return log


def test_capture_waits_for_an_eager_step_in_this_process_also_after_a_restore():
    fresh = _trainer()
    log = _instrument(fresh)
    fresh.env_step()
    fresh.env_step()
    assert log["captured_after"] == [1]
    tensors, meta = _trainer_after_an_epoch().checkpoint_state()
    resumed = _trainer()
    resumed.restore({k: v.clone() for k, v in tensors.items()}, meta)
    log = _instrument(resumed)
    resumed.env_step()  # env_steps > 0 already, but nothing compiled the actor's kernels in this process yet
    resumed.env_step()
    assert log["captured_after"] == [1]
    with pytest.raises(RuntimeError, match="run one eager step"):
        _trainer().actor.capture()


def _trainer_after_an_epoch():
    tr = _trainer()
    tr.run_epoch(1)
    return tr


def test_the_step_after_a_restore_continues_the_run():
    from hotloop.trainer.resume import ENV_RESEED

    a = _trainer_after_an_epoch()
    tensors, meta = a.checkpoint_state()
    c = _trainer()
    c.restore({k: v.clone() for k, v in tensors.items()}, meta)
    a.obs.copy_(a.env.reset(seed=a.cfg.seed + ENV_RESEED * meta["epoch"]))  # the env reset restore does
    a.returns.running.zero_()
    for _ in range(10):  # wraps the 64-slot ring
        a.env_step()
        c.env_step()
        assert int(a.actor.t) == int(c.actor.t) and float(a.actor.epsilon) == float(c.actor.epsilon)
        for name in ("obs", "action", "reward", "next_obs", "terminated"):
            assert torch.equal(getattr(a.replay, name), getattr(c.replay, name)), name
        assert (a.replay.pos, a.replay.size, int(a.replay.pos_t)) == (c.replay.pos, c.replay.size, int(c.replay.pos_t))


def test_bad_input_is_refused_with_its_name():
    tr = _trainer()
    with pytest.raises(AttributeError):
        tr.obs = tr.env.reset()  # the actor reads the buffer by address: update it in place
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match="eps_decay_steps must be a finite number >= 0"):
            DeviceActor(tr.learner, tr.env, tr.replay, tr.returns, tr.obs, 0, 1.0, 0.1, bad)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        DeviceActor(tr.learner, tr.env, tr.replay, tr.returns, tr.obs, -1, 1.0, 0.1, 10.0)
    actions = torch.zeros(8, 1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="uniforms must be floating"):
        tr.env.step(actions, torch.zeros(8, 4, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        tr.replay.note_added(-1)


@pytest.mark.parametrize("env", ["cartpole", "synthetic"])
def test_the_actor_in_the_learner_step_equals_the_learner_step_then_the_env_step(env):
    """actor_in_step: one iteration = the learner step (which samples first) with the env step inside it; the
    state after k iterations is bit for bit that of the loop run as learner step, then env step."""
    shape = {"obs_dim": 6, "action_nvec": (3, 3)} if env == "synthetic" else {}
    inside, outside = _trainer(env, actor_in_step=True, **shape), _trainer(env, **shape)
    assert inside.actor_in_step and not outside.actor_in_step and inside.learner.actor is not None
    for tr in (inside, outside):
        tr.prefill()
    inside.iterate(6)
    for _ in range(6):
        outside.learner_step()
        outside.env_step()
    assert inside.env_steps == outside.env_steps and inside.learner_steps == outside.learner_steps == 6
    for name in ("obs", "action", "reward", "next_obs", "terminated"):
        assert torch.equal(getattr(inside.replay, name), getattr(outside.replay, name)), name
    assert torch.equal(inside.replay.tree.nodes, outside.replay.tree.nodes)
    assert torch.equal(inside.learner.nets, outside.learner.nets) and torch.equal(inside.obs, outside.obs)
    assert (inside.replay.pos, inside.replay.size) == (outside.replay.pos, outside.replay.size)
    assert int(inside.actor.t) == int(outside.actor.t) and inside.returns.count() == outside.returns.count()


def test_the_actor_stays_outside_the_step_where_the_fused_step_cannot_run():
    assert not _trainer(actor_in_step=True, env_steps_per_update=2).actor_in_step
    assert not _trainer(actor_in_step=True, learner="reference").actor_in_step
    with pytest.raises(RuntimeError, match="captured already"):
        tr = _trainer()
        tr.learner.graph = object()
        tr.learner.attach_actor(tr.actor.launch_main, tr.actor.launch_tail)
