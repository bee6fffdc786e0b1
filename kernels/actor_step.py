"""The fused actor step: one vectorized env step of the hotloop trainer in two launches around the sum tree's insert.

One vectorized env step (trainer/actor.py's `DeviceActor`) = counter-based uniforms and the decayed epsilon, the
online net's greedy actions over the N observations, epsilon-greedy, the env physics with autoreset, the replay
insert (observation, action, reward, next observation, terminal) and the episode returns. Three launches in all:

- `actor_step` (`_actor_step_kernel`, one program per BLOCK_N envs): the uniforms u[n, c] = Philox(seed + t,
  n * W + c) (Salmon et al. 2011; the stream `hotloop.kernels.replay_batch.batch_uniforms` writes, W = 1 + D +
  env uniforms per env) and epsilon(t) = eps_start + (eps_end - eps_start) * min(1, t / decay) (Mnih et al. 2015);
  the greedy action per branch from the flat dueling branching net (trainer/flat_net.py's layout: every hidden layer
  relu(g * (x W^T) + b), then the dueling heads Q_d = V + A_d - mean A_d; Wang et al. 2016, Tavakoli et al. 2018)
  as TF32 dots on operands rounded to TF32 (the learner's forward placement, kernels/linear.py), the activations
  staged per program through a scratch buffer (rows of one program only: a barrier orders them) -- kernels/acting.py's
  `hidden_layers` and `greedy_actions`, which the greedy evaluation's kernel shares; epsilon-greedy
  (explore where u[n, 0] < epsilon, branch d's random action floor(u[n, 1 + d] * A)); the env step with autoreset
  (CartPole-v1 with Gymnasium's operations in Gymnasium's order, trainer/envs/cartpole.py, each rounded as the eager
  torch op on the GPU: kernels/acting.py's `cartpole_dynamics`; or the synthetic tanh
  recurrence, trainer/envs/synthetic.py, its products in IEEE FP32); the transition written to the replay's ring at
  slot (pos + n) % capacity; the new observation over the old; the running episode returns, with each finished
  episode's return and a done flag left for the commit.
- the new leaves' max priority: `hotloop.kernels.segment_tree.tree_insert` (its own launch, `_tree_insert_kernel`).
- `actor_commit` (`_actor_commit_kernel`, >= 2 programs): the finished returns scattered into the episode ring in
  env order (each program sums the done flags before its block: the ring slots of
  `hotloop.trainer.episodes.EpisodeReturns.update`, deterministic), then the counters (t += 1, pos = (pos + N) %
  capacity, finished += episodes ended) advanced by the program that takes the last ticket of an acq_rel atomic
  counter (every other program has read them by then), which resets the ticket for the next step.

No launch reads a device value on the host; every grid has >= 2 programs. The plain-torch reference is the
actor's own eager step (`DeviceActor.reference_step`: the stock torch ops it was before); tests/kernels/
test_actor_step.py checks the two against each other on fresh random input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotloop.kernels._common import check_tensor, interpreting
from hotloop.kernels.acting import RESET_BOUND, RESET_SPAN, ActingNet, cartpole_dynamics, greedy_actions, hidden_layers
from hotloop.kernels.dependent_launch import gdc_prologue, pdl_kwargs

ENV_CARTPOLE, ENV_SYNTHETIC = 0, 1
"""The env kinds the fused step simulates (the `ENV` constexpr)."""


@triton.jit
def _uniform(key, n, W: tl.constexpr, col):
    """u[n, col] of the actor's uniform table: Philox(key, n * W + col) (int32 offsets, as batch_uniforms')."""
    return tl.rand(key, n * W + col)


@triton.jit
def _cartpole_step(obs_ptr, n, mask_n, a0, key, W: tl.constexpr, D: tl.constexpr, TORCH_CUDA: tl.constexpr):
    """CartPole-v1 from the observation columns at obs_ptr (rows n, 4 floats each) under actions a0
    (kernels/acting.py's `cartpole_dynamics`). Returns (next state's 4 columns, terminated, the 4 reset columns
    drawn from the env's uniforms)."""
    x = tl.load(obs_ptr + n * 4, mask=mask_n, other=0.0)
    x_dot = tl.load(obs_ptr + n * 4 + 1, mask=mask_n, other=0.0)
    theta = tl.load(obs_ptr + n * 4 + 2, mask=mask_n, other=0.0)
    theta_dot = tl.load(obs_ptr + n * 4 + 3, mask=mask_n, other=0.0)
    nxt, terminated = cartpole_dynamics(x, x_dot, theta, theta_dot, a0, TORCH_CUDA)
    fresh = (
        _uniform(key, n, W, 1 + D) * RESET_SPAN - RESET_BOUND,
        _uniform(key, n, W, 2 + D) * RESET_SPAN - RESET_BOUND,
        _uniform(key, n, W, 3 + D) * RESET_SPAN - RESET_BOUND,
        _uniform(key, n, W, 4 + D) * RESET_SPAN - RESET_BOUND,
    )
    return nxt, terminated, fresh


@triton.jit
def _actor_step_kernel(
    t_ptr,
    pos_ptr,
    eps_ptr,
    seed,
    eps_start,
    eps_end,
    eps_decay,
    w_ptr,
    table_ptr,
    num_layers,
    out_w,
    out_b,
    out_g,
    H,
    scratch_ptr,
    MAXW,
    obs_ptr,
    state_ptr,
    elapsed_ptr,
    time_limit,
    start_ptr,
    a_ptr,
    b_ptr,
    c_ptr,
    r_obs_ptr,
    r_action_ptr,
    r_reward_ptr,
    r_next_ptr,
    r_term_ptr,
    capacity,
    running_ptr,
    ended_ptr,
    done_ptr,
    N,
    OBS: tl.constexpr,
    D: tl.constexpr,
    A: tl.constexpr,
    W: tl.constexpr,
    ENV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_O: tl.constexpr,
    TORCH_CUDA: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < N
    t = tl.load(t_ptr)
    key = seed + t
    eps = eps_start + (eps_end - eps_start) * tl.minimum(t.to(tl.float32) / eps_decay, 1.0)
    if pid == 0:
        tl.store(eps_ptr, eps)
    slot = (tl.load(pos_ptr) + n) % capacity
    o = tl.arange(0, BLOCK_O)
    mask_o = o < OBS
    m_no = mask_n[:, None] & mask_o[None, :]

    # the observation: into the replay's slot and the forward's input (scratch[1]); not kept in registers (the
    # env reloads it: few live tiles, no spills)
    obs = tl.load(obs_ptr + n[:, None] * OBS + o[None, :], mask=m_no, other=0.0)
    tl.store(r_obs_ptr + slot[:, None] * OBS + o[None, :], obs, mask=m_no)
    tl.store(scratch_ptr + N * MAXW + n[:, None] * MAXW + o[None, :], obs, mask=m_no)
    tl.debug_barrier()

    # acting: the net's greedy actions, then epsilon-greedy
    last = hidden_layers(w_ptr, table_ptr, num_layers, scratch_ptr, n, mask_n, N, MAXW, BLOCK_N, BLOCK_R, BLOCK_K, True)
    greedy = greedy_actions(
        w_ptr,
        out_w,
        out_b,
        out_g,
        scratch_ptr + last * N * MAXW,
        n,
        mask_n,
        MAXW,
        H,
        D,
        A,
        BLOCK_N,
        BLOCK_J,
        BLOCK_K,
        BLOCK_D,
        True,
    )
    dcol = tl.arange(0, BLOCK_D)
    mask_d = dcol < D
    explore = _uniform(key, n, W, 0) < eps
    u_act = _uniform(key, n[:, None], W, 1 + dcol[None, :])
    action = tl.where(explore[:, None], (u_act * A).to(tl.int64), greedy)
    tl.store(r_action_ptr + slot[:, None] * D + dcol[None, :], action, mask=mask_n[:, None] & mask_d[None, :])

    # the env step, with autoreset; the transition's rest, the new observation
    elapsed = tl.load(elapsed_ptr + n, mask=mask_n, other=0) + 1
    truncated = elapsed >= time_limit
    if ENV == 0:
        a0 = tl.sum(tl.where((dcol == 0)[None, :], action, 0), axis=1)
        nxt, terminated, fresh = _cartpole_step(obs_ptr, n, mask_n, a0, key, W, D, TORCH_CUDA)
        reward = tl.full((BLOCK_N,), 1.0, tl.float32)
        done = terminated | truncated
        for c in tl.static_range(4):
            tl.store(r_next_ptr + slot * 4 + c, nxt[c], mask=mask_n)
            new = tl.where(done, fresh[c], nxt[c])
            tl.store(obs_ptr + n * 4 + c, new, mask=mask_n)
            tl.store(state_ptr + n * 4 + c, new, mask=mask_n)
    else:  # the synthetic recurrence (trainer/envs/synthetic.py): obs' = tanh(obs A + onehot(a) B + 0.1 noise)
        obs = tl.load(obs_ptr + n[:, None] * OBS + o[None, :], mask=m_no, other=0.0)
        tc = tl.arange(0, BLOCK_J)
        cmat = tl.load(
            c_ptr + o[:, None] * (D * A) + tc[None, :], mask=mask_o[:, None] & (tc < D * A)[None, :], other=0.0
        )
        logits = tl.dot(obs, cmat, input_precision="ieee")
        reward = tl.zeros((BLOCK_N,), tl.float32)
        for d in tl.static_range(D):
            sel = ((tc >= d * A) & (tc < (d + 1) * A))[None, :]
            lg = tl.where(sel, logits, -float("inf"))
            top = tl.max(lg, axis=1)
            best = tl.min(tl.where(sel & (lg == top[:, None]), tc[None, :], BLOCK_J), axis=1) - d * A
            a_d = tl.sum(tl.where((dcol == d)[None, :], action, 0), axis=1)
            reward += (a_d == best).to(tl.float32)
        reward = reward / D
        terminated = tl.zeros((BLOCK_N,), tl.int1)
        done = truncated
        # the next observation 16 columns at a time (few live tiles: no register spills)
        for c0 in tl.static_range(0, BLOCK_O, 16):
            oc = c0 + tl.arange(0, 16)
            mask_c = oc < OBS
            m_nc = mask_n[:, None] & mask_c[None, :]
            amat = tl.load(a_ptr + o[:, None] * OBS + oc[None, :], mask=mask_o[:, None] & mask_c[None, :], other=0.0)
            z = tl.dot(obs, amat, input_precision="ieee")
            for d in tl.static_range(D):
                a_d = tl.sum(tl.where((dcol == d)[None, :], action, 0), axis=1)
                ok = (a_d >= 0) & (a_d < A)
                z += tl.load(
                    b_ptr + (d * A + a_d)[:, None] * OBS + oc[None, :],
                    mask=(mask_n & ok)[:, None] & mask_c[None, :],
                    other=0.0,
                )
            u1 = _uniform(key, n[:, None], W, 1 + D + oc[None, :])
            u2 = _uniform(key, n[:, None], W, 1 + D + OBS + oc[None, :])
            z += 0.1 * (tl.sqrt(-2.0 * tl.log(1.0 - u1)) * tl.cos(6.283185307179586 * u2))
            nxt = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)  # tanh(z), saturating to +-1 without inf / inf
            tl.store(r_next_ptr + slot[:, None] * OBS + oc[None, :], nxt, mask=m_nc)
            start = tl.load(start_ptr + n[:, None] * OBS + oc[None, :], mask=m_nc, other=0.0)
            new = tl.where(done[:, None], start, nxt)
            tl.store(obs_ptr + n[:, None] * OBS + oc[None, :], new, mask=m_nc)
            tl.store(state_ptr + n[:, None] * OBS + oc[None, :], new, mask=m_nc)
    tl.store(r_reward_ptr + slot, reward, mask=mask_n)
    tl.store(r_term_ptr + slot, terminated.to(tl.float32), mask=mask_n)
    tl.store(elapsed_ptr + n, tl.where(done, 0, elapsed), mask=mask_n)
    ret = tl.load(running_ptr + n, mask=mask_n, other=0.0) + reward.to(tl.float64)
    tl.store(ended_ptr + n, ret, mask=mask_n)
    tl.store(running_ptr + n, tl.where(done, 0.0, ret), mask=mask_n)
    tl.store(done_ptr + n, done.to(tl.int32), mask=mask_n)


@triton.jit
def _actor_commit_kernel(
    done_ptr,
    ended_ptr,
    ring_ptr,
    finished_ptr,
    t_ptr,
    pos_ptr,
    ticket_ptr,
    N,
    capacity,
    ring_capacity,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_prologue(GDC)
    pid = tl.program_id(0)
    before = tl.zeros((BLOCK,), tl.int32)
    total = tl.zeros((BLOCK,), tl.int32)
    for c0 in range(0, N, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        flag = tl.load(done_ptr + c, mask=c < N, other=0)
        total += flag
        before += tl.where(c < pid * BLOCK, flag, 0)
    n = pid * BLOCK + tl.arange(0, BLOCK)
    mask = n < N
    flag = tl.load(done_ptr + n, mask=mask, other=0)
    finished = tl.load(finished_ptr)
    slot = (finished + tl.sum(before, axis=0) + tl.cumsum(flag, axis=0) - 1) % ring_capacity
    tl.store(ring_ptr + slot, tl.load(ended_ptr + n, mask=mask, other=0.0), mask=mask & (flag != 0))
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:  # every other program has read the counters: advance them
        tl.store(finished_ptr, finished + tl.sum(total, axis=0))
        tl.store(t_ptr, tl.load(t_ptr) + 1)
        tl.store(pos_ptr, (tl.load(pos_ptr) + N) % capacity)
        tl.store(ticket_ptr, 0)


@dataclass(frozen=True)
class ActorBuffers:
    """The device state one fused actor step reads and writes (all on one CUDA device, or the CPU under
    TRITON_INTERPRET=1; N envs, obs_dim O, D branches).

    t, pos: 0-dim int64 counters (vector steps taken; the replay's write position). epsilon: 0-dim float32 (written).
    obs: (N, O) float32, acted on and overwritten with the next observation. state: (N, O) float32, the env's own
    copy of the observation (CartPole's state, the synthetic env's obs), written with obs. elapsed: (N,) int64.
    start: (N, O) float32, the synthetic env's restart observations (CartPole: any float32 tensor, unread).
    env_a (O, O), env_b (D A, O), env_c (O, D A): the synthetic env's matrices (CartPole: unread).
    replay_obs, replay_next_obs (C, O) float32, replay_action (C, D) int64, replay_reward, replay_terminated (C,)
    float32: the ring. running (N,) float64, ended (N,) float64, done (N,) int32: the returns and their hand-over
    to the commit. ring (R + 1,) float64 and finished (0-dim int64): `EpisodeReturns`' ring (R = its capacity) and
    count. ticket: 0-dim int32, zero between steps. scratch: (2, N, max_width) float32.
    """

    t: torch.Tensor
    pos: torch.Tensor
    epsilon: torch.Tensor
    obs: torch.Tensor
    state: torch.Tensor
    elapsed: torch.Tensor
    start: torch.Tensor
    env_a: torch.Tensor
    env_b: torch.Tensor
    env_c: torch.Tensor
    replay_obs: torch.Tensor
    replay_action: torch.Tensor
    replay_reward: torch.Tensor
    replay_next_obs: torch.Tensor
    replay_terminated: torch.Tensor
    running: torch.Tensor
    ended: torch.Tensor
    done: torch.Tensor
    ring: torch.Tensor
    finished: torch.Tensor
    ticket: torch.Tensor
    scratch: torch.Tensor


def _blocks(n: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_R, BLOCK_K, num_warps): at seed scale 32 envs a program (8192 -> 256 programs) with 128-row
    tiles, the fastest of the H200 sweep (results/h200/experiments/actor_kernel_parts.py: 202 us against 589 with
    64 envs, whose tiles spilled); 16 for small N (64 CartPoles -> 4 programs); wide row tiles on the
    interpreter, which runs programs serially."""
    if interpreting():
        return 16, 128, 64, 4
    return (32, 128, 32, 4) if n >= 4096 else (16, 64, 32, 4)


def _check(net: ActingNet, weights: torch.Tensor, buf: ActorBuffers, env: int, time_limit: int) -> tuple[int, ...]:
    """Validate the arguments of `actor_step`; return (N, O, D, C)."""
    if env not in (ENV_CARTPOLE, ENV_SYNTHETIC):
        raise ValueError(f"env must be ENV_CARTPOLE (0) or ENV_SYNTHETIC (1), got {env!r}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, int) or time_limit < 1:
        raise ValueError(f"time_limit must be an int >= 1, got {time_limit!r}")
    check_tensor("weights", weights, dtype=torch.float32, shape=(net.numel,))
    dev = weights.device
    check_tensor("table", net.table, dtype=torch.int64, ndim=2, device=dev)
    n, o = check_tensor("obs", buf.obs, dtype=torch.float32, ndim=2, device=dev).shape
    d = net.branches
    if env == ENV_CARTPOLE and (o, d, net.actions) != (4, 1, 2):
        raise ValueError(f"CartPole needs obs_dim 4 and one branch of 2 actions, got {o}, {d} x {net.actions}")
    cap = check_tensor("replay_obs", buf.replay_obs, dtype=torch.float32, shape=(None, o), device=dev).shape[0]
    if n > cap:
        raise ValueError(f"the fused step writes each env's transition once: N = {n} envs > capacity {cap}")
    for name, dtype, shape in (
        ("t", torch.int64, ()),
        ("pos", torch.int64, ()),
        ("epsilon", torch.float32, ()),
        ("state", torch.float32, (n, o)),
        ("elapsed", torch.int64, (n,)),
        ("replay_action", torch.int64, (cap, d)),
        ("replay_reward", torch.float32, (cap,)),
        ("replay_next_obs", torch.float32, (cap, o)),
        ("replay_terminated", torch.float32, (cap,)),
        ("running", torch.float64, (n,)),
        ("ended", torch.float64, (n,)),
        ("done", torch.int32, (n,)),
        ("ring", torch.float64, (None,)),
        ("finished", torch.int64, ()),
        ("ticket", torch.int32, ()),
        ("scratch", torch.float32, (2, n, net.max_width)),
    ):
        check_tensor(name, getattr(buf, name), dtype=dtype, shape=shape, device=dev)
    if env == ENV_SYNTHETIC:
        t = d * net.actions
        for name, shape in (("start", (n, o)), ("env_a", (o, o)), ("env_b", (t, o)), ("env_c", (o, t))):
            check_tensor(name, getattr(buf, name), dtype=torch.float32, shape=shape, device=dev)
    return n, o, d, cap


def actor_step(
    net: ActingNet,
    weights: torch.Tensor,
    buf: ActorBuffers,
    seed: int,
    eps_start: float,
    eps_end: float,
    eps_decay: float,
    env: int,
    time_limit: int,
    tiles: tuple[int, int, int, int] | None = None,
) -> None:
    """The fused acting + env + replay-storage + returns part of one vectorized env step (`_actor_step_kernel`,
    max(2, ceil(N / BLOCK_N)) programs: never a single block, even for N <= BLOCK_N), reading t and pos.

    Args:
        net: the flat net's offsets (`ActingNet.from_layout`).
        weights: (P,) float32 parameters the actor acts with (the learner's TF32-rounded snapshot; biases and gains
            are read from it too).
        buf: the `ActorBuffers`.
        seed: the Philox key base (python int >= 0; the key is seed + t).
        eps_start, eps_end, eps_decay: the epsilon schedule (eps_decay > 0, in vector steps).
        env: ENV_CARTPOLE or ENV_SYNTHETIC. time_limit: CartPole's max_episode_steps / the synthetic episode_length.
        tiles: (BLOCK_N, BLOCK_R, BLOCK_K, num_warps) instead of the defaults (`_blocks`), powers of two >= 16
            (num_warps: 1, 2, 4 or 8), for tuning.
    Raises ValueError (naming the argument) for a wrong dtype, shape or device, N > replay capacity, a CartPole
    net that is not 4 -> one branch of 2 actions, seed < 0, eps_decay <= 0, an unknown env, time_limit < 1 or bad
    tiles; nothing is launched then.
    """
    n, o, d, cap = _check(net, weights, buf, env, time_limit)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if not (isinstance(eps_decay, (int, float)) and eps_decay > 0):
        raise ValueError(f"eps_decay must be a number > 0, got {eps_decay!r}")
    block_n, block_r, block_k, warps = _blocks(n) if tiles is None else tiles
    if any(b < 16 or b & (b - 1) for b in (block_n, block_r, block_k)) or warps not in (1, 2, 4, 8):
        raise ValueError(f"tiles must be three powers of two >= 16 and num_warps in 1, 2, 4, 8, got {tiles!r}")
    uniforms = 1 + d + (4 if env == ENV_CARTPOLE else 2 * o)
    _actor_step_kernel[(max(2, triton.cdiv(n, block_n)),)](
        buf.t,
        buf.pos,
        buf.epsilon,
        seed,
        float(eps_start),
        float(eps_end),
        float(eps_decay),
        weights,
        net.table,
        net.table.shape[0],
        net.out_w,
        net.out_b,
        net.out_g,
        net.head_hidden,
        buf.scratch,
        net.max_width,
        buf.obs,
        buf.state,
        buf.elapsed,
        time_limit,
        buf.start,
        buf.env_a,
        buf.env_b,
        buf.env_c,
        buf.replay_obs,
        buf.replay_action,
        buf.replay_reward,
        buf.replay_next_obs,
        buf.replay_terminated,
        cap,
        buf.running,
        buf.ended,
        buf.done,
        n,
        OBS=o,
        D=d,
        A=net.actions,
        W=uniforms,
        ENV=env,
        BLOCK_N=block_n,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        BLOCK_J=max(16, triton.next_power_of_2(1 + d * net.actions)),
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_O=max(16, triton.next_power_of_2(o)),
        TORCH_CUDA=not interpreting(),
        num_warps=warps,
        **pdl_kwargs(),
    )


def actor_commit(buf: ActorBuffers) -> None:
    """The episode ring scatter and the counters' advance of one vectorized env step (`_actor_commit_kernel`,
    max(2, ceil(N / 1024)) programs): after `actor_step` and the tree insert, which read t and pos.
    Raises ValueError for a wrong buffer (as `actor_step`)."""
    n = check_tensor("done", buf.done, dtype=torch.int32, ndim=1).shape[0]
    dev = buf.done.device
    for name, dtype, shape in (
        ("ended", torch.float64, (n,)),
        ("ring", torch.float64, (None,)),
        ("finished", torch.int64, ()),
        ("t", torch.int64, ()),
        ("pos", torch.int64, ()),
        ("ticket", torch.int32, ()),
    ):
        check_tensor(name, getattr(buf, name), dtype=dtype, shape=shape, device=dev)
    cap = buf.replay_reward.shape[0]
    block = 1024 if n > 2048 else max(16, triton.next_power_of_2(triton.cdiv(n, 2)))
    _actor_commit_kernel[(max(2, triton.cdiv(n, block)),)](
        buf.done,
        buf.ended,
        buf.ring,
        buf.finished,
        buf.t,
        buf.pos,
        buf.ticket,
        n,
        cap,
        buf.ring.shape[0] - 1,
        BLOCK=block,
        **pdl_kwargs(),
    )
