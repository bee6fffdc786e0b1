"""The fused actor step (kernels/actor_step.py) against its plain-torch reference, `DeviceActor.reference_step`
(trainer/actor.py): from the same state, on fresh random input (random weights, observations, episode clocks and
running returns), with every output poisoned first, one step of each must leave the same replay storage and sum
tree, observations, env state, episode returns and counters; with episodes ending by termination and by the time
limit (autoreset) and the replay's ring wrapping around. On the CPU this runs the Triton interpreter."""

import math

import pytest
import torch

from hotloop.kernels.acting import CARTPOLE_CONSTANTS, ActingNet
from hotloop.kernels.actor_step import ENV_CARTPOLE, ActorBuffers, actor_commit, actor_step
from hotloop.trainer.config import preset
from hotloop.trainer.envs import cartpole
from hotloop.trainer.loop import Trainer

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEED = 20261205  # fixed: the draws must not depend on PYTHONHASHSEED (a test that fails one run in six is no test)
TF32_TIE = 2.0**-8  # two Q values this close (relative to the env's largest |Q|) are tied under TF32 rounding
TINY = dict(
    learner="hotloop",
    trunk_hidden=(32, 16),
    head_hidden=16,
    batch_size=16,
    learner_steps_per_epoch=2,
    learning_starts=0,
    eval_episodes=0,
    log_interval=1,
    epochs=1,
)


def _trainer(env: str, num_envs: int, capacity: int, **kw) -> Trainer:
    shape = {"obs_dim": 12, "action_nvec": (3, 3, 3)} if env == "synthetic" else {}
    return Trainer(
        preset(
            "cartpole", **{**TINY, **shape, **kw}, env=env, num_envs=num_envs, replay_capacity=capacity, device=DEVICE
        )
    )


def _state(tr: Trainer) -> dict[str, torch.Tensor]:
    """Every tensor a step reads or writes, by name (live tensors)."""
    rp, ret, env = tr.replay, tr.returns, tr.env
    out = {
        "obs": tr.obs,
        "elapsed": env.elapsed_steps,
        "t": tr.actor.t,
        "pos": rp.pos_t,
        "eps": tr.actor.epsilon,
        "r_obs": rp.obs,
        "r_action": rp.action,
        "r_reward": rp.reward,
        "r_next": rp.next_obs,
        "r_term": rp.terminated,
        "nodes": rp.tree.nodes,
        "max": rp.tree.max_value,
        "running": ret.running,
        "ring": ret.ring,
        "finished": ret.finished,
    }
    out["state"] = env.state if hasattr(env, "state") else env._obs
    return out


def _randomize(tr: Trainer, gen: torch.Generator, env: str) -> None:
    """Fresh random weights, observations, clocks (some at the time limit), running returns, positions."""
    n, lay, cap = tr.cfg.num_envs, tr.learner.layout, tr.replay.capacity
    tr.learner.params.copy_(lay.init_params(gen) * 3)
    tr.learner.round_weights(tr.learner.nets, tr.learner.nets_tf32)
    if env == "cartpole":  # near the edges too: some terminate in this step
        obs = (torch.rand(n, 4, generator=gen) * 2 - 1) * torch.tensor([2.5, 2.0, 0.22, 2.0])
    else:
        obs = torch.rand(n, tr.env.obs_dim, generator=gen) * 2 - 1
        tr.env._start.copy_(torch.rand(n, tr.env.obs_dim, generator=gen) * 2 - 1)
    tr.obs.copy_(obs)
    _state(tr)["state"].copy_(obs)
    limit = tr.env.max_episode_steps if env == "cartpole" else tr.env.episode_length
    tr.env.elapsed_steps.copy_(torch.randint(0, limit, (n,), generator=gen))
    tr.env.elapsed_steps[: max(1, n // 8)] = limit - 1  # truncated in this step
    tr.returns.running.copy_(torch.rand(n, generator=gen, dtype=torch.float64) * 100)
    tr.returns.finished.fill_(int(torch.randint(0, 500, (), generator=gen)))
    tr.replay.pos_t.fill_(cap - n // 2)  # the ring wraps inside this step
    tr.replay.tree.max_value.fill_(1.5)
    tr.actor.t.fill_(int(torch.randint(0, 40, (), generator=gen)))


def _poison(tr: Trainer) -> None:
    """What the step writes, poisoned (the replay's slots, the ring, the actor's hand-over buffers)."""
    rp = tr.replay
    for t in (rp.obs, rp.next_obs, rp.reward, rp.terminated, tr.returns.ring, tr.actor.epsilon):
        t.fill_(float("nan"))
    rp.action.fill_(-7)
    if tr.actor.fused is not None:
        tr.actor.fused.ended.fill_(float("nan"))
        tr.actor.fused.done.fill_(-3)
        tr.actor.fused.scratch.fill_(float("nan"))


@pytest.mark.parametrize(
    "env,num_envs,capacity,tiles",
    [
        ("cartpole", 40, 64, None),
        ("cartpole", 8, 8, None),
        ("synthetic", 24, 40, None),
        ("synthetic", 72, 96, (32, 128, 32, 4)),  # the seed-scale tiles (kernels/actor_step.py `_blocks`)
        ("cartpole", 40, 64, (16, 64, 32, 4)),
    ],
)  # the small-N tiles of the GPU
def test_the_fused_step_equals_the_reference_step_on_random_input(env, num_envs, capacity, tiles, seed=None):
    tr = _trainer(env, num_envs, capacity, batch_size=min(16, capacity))
    assert tr.actor is not None and tr.actor.fused is not None
    tr.actor.tiles = tiles
    gen = torch.Generator().manual_seed(SEED if seed is None else seed)
    for trial in range(2):
        _randomize(tr, gen, env)
        _poison(tr)
        before = {k: v.clone() for k, v in _state(tr).items()}
        q = tr.learner.acting.q(tr.actor.acting_weights, tr.obs).clone()
        tr.actor.reference_step()
        want = {k: v.clone() for k, v in _state(tr).items()}
        for k, v in _state(tr).items():
            v.copy_(before[k])
        tr.actor._body()
        got = _state(tr)
        # the actions: equal except where the reference's two best Q values are within the fused forward's TF32
        # rounding of each other (operands rounded to 10 mantissa bits at every layer: relative 2**-11 each)
        top2 = q.topk(2, dim=2).values if q.shape[2] > 1 else None
        tied = TF32_TIE * q.abs().amax(dim=(1, 2))
        slots = (before["pos"] + torch.arange(num_envs, device=DEVICE)) % capacity
        differ = (got["r_action"][slots] != want["r_action"][slots]).any(1)
        if bool(differ.any()):
            gap = (top2[..., 0] - top2[..., 1]).min(1).values
            assert bool((gap[differ] < tied[differ]).all()), f"trial {trial}: actions differ where Q is not tied"
            keep = ~differ
        else:
            keep = torch.ones(num_envs, dtype=torch.bool, device=DEVICE)
        assert int(keep.sum()) >= num_envs - max(1, num_envs // 16), "ties in most envs: the comparison saw little"
        for k in ("t", "pos", "eps", "max", "finished"):
            assert torch.equal(got[k], want[k]), k
        for k in ("r_obs", "r_action", "r_term", "r_reward"):
            assert torch.equal(got[k][slots[keep]], want[k][slots[keep]]), k
        for k in ("r_next",):
            torch.testing.assert_close(got[k][slots[keep]], want[k][slots[keep]], rtol=2e-6, atol=2e-6)
        for k in ("obs", "state"):
            torch.testing.assert_close(got[k][keep], want[k][keep], rtol=2e-6, atol=2e-6)
        assert torch.equal(got["elapsed"], want["elapsed"])
        # an env whose (tied) action differs earns another reward: its running return and ring entry may differ
        torch.testing.assert_close(got["running"][keep], want["running"][keep], rtol=0, atol=0)
        torch.testing.assert_close(got["nodes"], want["nodes"], rtol=1e-6, atol=1e-6)
        untouched = torch.ones(capacity, dtype=torch.bool, device=DEVICE)
        untouched[slots] = False
        assert bool(got["r_obs"][untouched].isnan().all()), "a slot outside the step's was written"
        ring, want_ring = got["ring"][:-1], want["ring"][:-1]  # the last slot: the reference's spare (unread)
        assert torch.equal(ring.isnan(), want_ring.isnan())
        written = ~want_ring.isnan()
        assert int(written.sum()) >= 1, "no episode ended: the autoreset path went unchecked"
        ended_differ = int((differ & (want["elapsed"] == 0)).sum()) if bool(differ.any()) else 0
        assert int((ring[written] != want_ring[written]).sum()) <= ended_differ, "the ring's returns differ"
        if ended_differ == 0:
            torch.testing.assert_close(ring[written], want_ring[written], rtol=0, atol=0)


def test_the_cartpole_constants_are_the_env_modules():
    assert CARTPOLE_CONSTANTS == (
        cartpole.GRAVITY,
        cartpole.MASSPOLE,
        cartpole.TOTAL_MASS,
        cartpole.LENGTH,
        cartpole.POLEMASS_LENGTH,
        cartpole.FORCE_MAG,
        cartpole.TAU,
        cartpole.THETA_THRESHOLD,
        cartpole.X_THRESHOLD,
        2 * cartpole.RESET_BOUND,
        cartpole.RESET_BOUND,
    )


def test_the_commit_advances_the_counters_once_and_fills_the_ring_in_env_order():
    n = 37
    dev = torch.device(DEVICE)
    done = (torch.rand(n) < 0.4).to(torch.int32).to(dev)
    done[0] = 1
    ended = torch.rand(n, dtype=torch.float64).to(dev)
    ring = torch.full((50 + 1,), float("nan"), dtype=torch.float64, device=dev)
    z = torch.zeros((), dtype=torch.int64, device=dev)
    buf = ActorBuffers(
        t=z.clone().fill_(5),
        pos=z.clone().fill_(60),
        epsilon=z,
        obs=z,
        state=z,
        elapsed=z,
        start=z,
        env_a=z,
        env_b=z,
        env_c=z,
        replay_obs=z,
        replay_action=z,
        replay_reward=torch.zeros(64, device=dev),
        replay_next_obs=z,
        replay_terminated=z,
        running=z,
        ended=ended,
        done=done,
        ring=ring,
        finished=z.clone().fill_(45),
        ticket=torch.zeros((), dtype=torch.int32, device=dev),
        scratch=z,
    )
    actor_commit(buf)
    k = int(done.sum())
    want = torch.full_like(ring, float("nan"))
    want[(45 + torch.arange(k, device=dev)) % 50] = ended[done.bool()]
    assert torch.equal(ring.isnan(), want.isnan()) and torch.equal(ring[~ring.isnan()], want[~want.isnan()])
    assert (int(buf.t), int(buf.pos), int(buf.finished), int(buf.ticket)) == (6, (60 + n) % 64, 45 + k, 0)


def _bad(name: str):
    def make(tr: Trainer):
        buf = tr.actor.fused
        fields = {f: getattr(buf, f) for f in buf.__dataclass_fields__}
        fields[name] = fields[name].to(torch.float64) if fields[name].dtype != torch.float64 else fields[name].float()
        return ActorBuffers(**fields)

    return make


@pytest.mark.parametrize("name", ["obs", "replay_action", "running", "done", "ticket", "scratch"])
def test_a_buffer_of_the_wrong_dtype_is_refused_by_name_before_any_launch(name):
    tr = _trainer("cartpole", 8, 16)
    buf = _bad(name)(tr)
    before = tr.replay.obs.clone()
    with pytest.raises(ValueError, match=name):
        actor_step(tr.actor.net, tr.actor.acting_weights, buf, 1, 1.0, 0.1, 10.0, ENV_CARTPOLE, 500)
    assert torch.equal(tr.replay.obs, before)


def test_bad_scalars_are_refused():
    tr = _trainer("cartpole", 8, 16)
    a = tr.actor
    with pytest.raises(ValueError, match="seed"):
        actor_step(a.net, a.acting_weights, a.fused, -1, 1.0, 0.1, 10.0, ENV_CARTPOLE, 500)
    with pytest.raises(ValueError, match="eps_decay"):
        actor_step(a.net, a.acting_weights, a.fused, 1, 1.0, 0.1, 0.0, ENV_CARTPOLE, 500)
    with pytest.raises(ValueError, match="time_limit"):
        actor_step(a.net, a.acting_weights, a.fused, 1, 1.0, 0.1, 10.0, ENV_CARTPOLE, 0)
    with pytest.raises(ValueError, match="env"):
        actor_step(a.net, a.acting_weights, a.fused, 1, 1.0, 0.1, 10.0, 5, 500)
    assert math.isfinite(float(a.t))
    assert isinstance(ActingNet.from_layout(tr.learner.layout, tr.device).max_width, int)


@pytest.mark.parametrize("tiles", [(8, 64, 32, 4), (16, 48, 32, 4), (16, 64, 32, 3)])
def test_bad_tiles_are_refused(tiles):
    tr = _trainer("cartpole", 8, 16)
    a = tr.actor
    with pytest.raises(ValueError, match="tiles"):
        actor_step(a.net, a.acting_weights, a.fused, 1, 1.0, 0.1, 10.0, ENV_CARTPOLE, 500, tiles)
